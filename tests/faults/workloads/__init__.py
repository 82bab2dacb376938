"""The fault suite's workloads: concurrent clients in the root namespace, each recording every
operation it invokes and how it ended into the run's history.

Each workload module has a class with ``name``, ``clients`` (how many client threads),
``setup(cluster)`` (on the leader, before the clients start), ``client(index, history,
cluster, stop)`` (one client's loop, until ``stop`` is set), ``finish(history, cluster)`` (after
healing: operations that read the final state through the leader, where the workload has any)
and ``check(history, data)`` (the checkers, over the history and every member's data).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tests.faults.checkers import Verdict
    from tests.faults.cluster import FaultCluster
    from tests.faults.history import History


class Workload(Protocol):
    name: str
    clients: int

    def setup(self, cluster: FaultCluster) -> None: ...

    def client(self, index: int, history: History, cluster: FaultCluster, stop: threading.Event) -> None: ...

    def finish(self, history: History, cluster: FaultCluster) -> None: ...

    def check(self, history: History, data: Mapping[str, Mapping[str, list[Any]]]) -> list[Verdict]: ...


def payloads_held(rows: Iterable[Any], prefix: str) -> set[str]:
    """The payloads (``<prefix>-<client>-<n>``) anywhere in ``rows``, whatever their layout."""
    pattern = re.compile(re.escape(prefix) + r"-\d+-\d+")
    found: set[str] = set()
    for row in rows:
        found.update(pattern.findall(repr(row)))
    return found
