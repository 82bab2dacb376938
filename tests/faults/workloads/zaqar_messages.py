"""Zaqar v1.1: post a message, claim one, delete what was claimed (with its claim).

A follower answers 503 naming the leader in ``X-Boxqueue-Leader``, which the client follows
(:class:`ZaqarClient`). Each message's body carries a payload of its own; a post is a put, a
claim a take, a delete an ack for :func:`tests.faults.checkers.queue`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import httpx

from tests.faults import checkers
from tests.faults.cluster import FaultCluster
from tests.faults.history import History
from tests.faults.workloads import payloads_held
from tests.faults.workloads.leader_following import ZaqarClient

QUEUE = "faults"
PROJECT = "faults"
CLAIM = {"ttl": 60, "grace": 60}  # the smallest: a claim whose delete went unanswered frees its message in a minute


class ZaqarMessages:
    name = "zaqar"
    prefix = "zq"

    def __init__(self, clients: int = 2, pause_s: float = 0.01) -> None:
        self.clients = clients
        self.pause_s = pause_s

    def setup(self, cluster: FaultCluster) -> None:
        deadline = time.monotonic() + 60
        while True:
            url = cluster.members[cluster.wait_for_leader()].zaqar_url
            try:
                r = httpx.put(f"{url}/v1.1/queues/{QUEUE}", trust_env=False, timeout=10,
                              headers={"Client-ID": str(uuid.uuid4()), "X-Project-Id": PROJECT})
                if r.status_code in (201, 204):
                    return
                why = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                why = repr(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot create the Zaqar queue: {why}")
            time.sleep(0.3)

    def client(self, index: int, history: History, cluster: FaultCluster, stop: threading.Event) -> None:
        client = ZaqarClient(history, f"zaqar-{index}", cluster.zaqar_urls(), PROJECT, str(uuid.uuid4()))
        messages = f"/v1.1/queues/{QUEUE}/messages"
        n = 0
        try:
            while not stop.is_set():
                n += 1
                payload = f"{self.prefix}-{index}-{n}"
                client.perform("put", payload, "POST", messages,
                               json={"messages": [{"ttl": 3600, "body": {"p": payload}}]})
                claimed: list[tuple[str, str, str]] = []  # (payload, message id, claim id)

                def took(r: httpx.Response, claimed: list[tuple[str, str, str]] = claimed) -> list[str]:
                    if r.status_code == 204:
                        return []
                    claim_id = r.headers["location"].rsplit("/", 1)[-1]
                    for message in r.json()["messages"]:
                        claimed.append((message["body"]["p"], message["id"], claim_id))
                    return [p for p, _, _ in claimed]

                client.perform("take", None, "POST", f"/v1.1/queues/{QUEUE}/claims?limit=1", json=CLAIM, result=took)
                for payload_taken, message_id, claim_id in claimed:
                    client.perform("ack", payload_taken, "DELETE", f"{messages}/{message_id}?claim_id={claim_id}")
                time.sleep(self.pause_s)
        finally:
            client.close()

    def finish(self, history: History, cluster: FaultCluster) -> None:
        pass

    def check(self, history: History, data: Mapping[str, Mapping[str, list[Any]]]) -> list[checkers.Verdict]:
        # the messages of queues on no pool are tasks of space "zaqar" (config: zaqar.space)
        final = {member: payloads_held(spaces.get("zaqar", []), self.prefix) for member, spaces in data.items()}
        return [checkers.queue(history.of(self.name), final, "zaqar: post/claim/delete")]
