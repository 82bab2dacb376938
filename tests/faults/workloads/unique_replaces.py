"""Unique replaces into space ``kv``: every key is written once, by one client; the checker asks
whether every acknowledged key is on every member and no key answered "failed" is on any."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from tests.faults import checkers
from tests.faults.cluster import FaultCluster
from tests.faults.history import History
from tests.faults.workloads.leader_following import IprotoClient

KV_SPACE = 512
KEY_SPAN = 10**9  # client i writes keys i * KEY_SPAN + n


class UniqueReplaces:
    name = "kv"

    def __init__(self, clients: int = 3, pause_s: float = 0.004) -> None:
        self.clients = clients
        self.pause_s = pause_s  # between a client's writes: the other workloads need the CPU too

    def setup(self, cluster: FaultCluster) -> None:
        pass

    def client(self, index: int, history: History, cluster: FaultCluster, stop: threading.Event) -> None:
        client = IprotoClient(history, f"kv-{index}", self.name, cluster.addresses(), cluster.names_by_host())
        try:
            key = (index + 1) * KEY_SPAN
            while not stop.is_set():
                key += 1
                client.perform("replace", key, lambda c, k=key: c.replace(KV_SPACE, [k, "v"]))
                time.sleep(self.pause_s)
        finally:
            client.close()

    def finish(self, history: History, cluster: FaultCluster) -> None:
        pass

    def check(self, history: History, data: Mapping[str, Mapping[str, list[Any]]]) -> list[checkers.Verdict]:
        final = {member: {row[0] for row in spaces.get("kv", [])} for member, spaces in data.items()}
        return [checkers.unique_writes(history.of(self.name), final, "kv: unique replaces")]
