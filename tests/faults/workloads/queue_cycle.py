"""put → take → ack over iproto, the loop the box.queue and tarantool/queue workloads share.

Every put carries a payload of its own (``<prefix>-<client>-<n>``), which names the task in the
history and in the members' data whatever its id (tarantool/queue numbers tasks, and a number
may come again once its task is gone). A client puts one task, takes one (any client's), and
acks what it took; the checker is :func:`tests.faults.checkers.queue`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tests.faults import checkers
from tests.faults.cluster import FaultCluster
from tests.faults.history import History
from tests.faults.workloads import payloads_held
from tests.faults.workloads.leader_following import IprotoClient, TrackedMesh

Request = Callable[[TrackedMesh], Any]


class QueueCycle:
    name = ""
    prefix = ""
    take_timeout_s = 0.5

    def __init__(self, clients: int = 2, pause_s: float = 0.01) -> None:
        self.clients = clients
        self.pause_s = pause_s

    # what a queue API says, in its words
    def put(self, payload: str) -> Request:
        raise NotImplementedError

    def take(self) -> Request:
        raise NotImplementedError

    def taken(self, data: list[Any]) -> tuple[Any, str] | None:
        """(task id, payload) of a take's answer, None when it gave nothing."""
        raise NotImplementedError

    def ack(self, task_id: Any) -> Request:
        raise NotImplementedError

    def spaces(self) -> tuple[str, ...]:
        """The spaces holding this queue's tasks."""
        raise NotImplementedError

    def setup(self, cluster: FaultCluster) -> None:
        pass

    def client(self, index: int, history: History, cluster: FaultCluster, stop: threading.Event) -> None:
        client = IprotoClient(history, f"{self.name}-{index}", self.name, cluster.addresses(),
                              cluster.names_by_host())
        n = 0
        try:
            while not stop.is_set():
                n += 1
                client.perform("put", f"{self.prefix}-{index}-{n}", self.put(f"{self.prefix}-{index}-{n}"))
                got: list[tuple[Any, str]] = []

                def took(data: list[Any], got: list[tuple[Any, str]] = got) -> list[str]:
                    task = self.taken(data)
                    if task is None:
                        return []
                    got.append(task)
                    return [task[1]]

                client.perform("take", None, self.take(), took)
                for task_id, payload in got:
                    client.perform("ack", payload, self.ack(task_id), lambda data, i=task_id: i)
                time.sleep(self.pause_s)
        finally:
            client.close()

    def finish(self, history: History, cluster: FaultCluster) -> None:
        pass

    def check(self, history: History, data: Mapping[str, Mapping[str, list[Any]]]) -> list[checkers.Verdict]:
        final = {member: payloads_held((row for s in self.spaces() for row in spaces.get(s, [])), self.prefix)
                 for member, spaces in data.items()}
        return [checkers.queue(history.of(self.name), final, f"{self.name}: put/take/ack")]
