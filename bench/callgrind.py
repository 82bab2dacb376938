"""Instructions a Python script runs, counted by valgrind's callgrind (for bench/handle_cost.py and
bench/apply_cost.py: a count that does not depend on the machine's noise)."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def instructions(script: str, args: list[str]) -> int:
    """Instructions callgrind collects while ``script`` runs with ``args`` (hash seed fixed, so
    that two runs of the same work count alike)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, script, *args],
        capture_output=True, text=True, env=env, check=True,
    )
    match = re.search(r"Collected : (\d+)", proc.stderr)
    if match is None:
        raise RuntimeError(proc.stderr[-2000:])
    return int(match.group(1))
