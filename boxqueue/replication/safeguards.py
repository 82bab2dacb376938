"""Test-only switches that turn one of the replica set's safeguards off, for the fault suite's
negative control (tests/faults): a run with one off must be caught by a checker, which proves the
checkers can fail. Read once from ``BOXQUEUE_UNSAFE`` (names separated by commas or spaces); never
set in production, and logged loudly when set.

* ``no-fence``: a leader keeps acting as the leader when it cannot renew its etcd lease (it
  neither fences itself by its clock nor steps down when a renewal fails), so a deposed leader may
  answer "done" after a successor took over;
* ``no-quorum``: a leader confirms a write as soon as it holds it itself, whatever the quorum.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

KNOWN = frozenset({"no-fence", "no-quorum"})
OFF = frozenset(os.environ.get("BOXQUEUE_UNSAFE", "").replace(",", " ").split())
if OFF:
    log.critical("replica set safeguards turned OFF for a test: %s (BOXQUEUE_UNSAFE)", ", ".join(sorted(OFF)))
    unknown = OFF - KNOWN
    if unknown:
        raise SystemExit(f"BOXQUEUE_UNSAFE: unknown safeguards {sorted(unknown)}; known: {sorted(KNOWN)}")


def off(name: str) -> bool:
    """Whether the safeguard ``name`` is turned off (see the module docstring)."""
    assert name in KNOWN, name
    return name in OFF
