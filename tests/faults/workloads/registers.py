"""A register per key: read, write and compare-and-set through stored Lua functions.

Space ``reg`` {k, v} with a unique (k, v) index (tests/faults/cluster.py). A write replaces the
row; a compare-and-set updates it through the (k, v) index, so it applies only while the row
holds the expected value (a tuple back: it applied; nil: it did not, an ok-false); a read is an
UPDATE that changes nothing, which the server answers only once a quorum holds everything it
could have seen (a plain select on the leader may show writes not yet confirmed). A handful of
keys at a time, small values, several clients on every key; the checker is
:func:`tests.faults.checkers.registers`. After healing every key is read once more through the
leader, so that the final state is part of the history.

The keys in use change every ``key_span_s`` (key = generation * 100 + slot), as Jepsen's
independent keys do: every key's history stays short, which keeps the search for a
linearization small, since each unknown operation doubles what it may have to try.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from typing import Any

from tests.faults import checkers
from tests.faults.cluster import FaultCluster
from tests.faults.history import History
from tests.faults.workloads.leader_following import IprotoClient

FUNCTIONS = {
    "faults_reg_read": "function(k) local t = box.space.reg:update(k, {}) if t == nil then return nil end return t[2] end",
    "faults_reg_write": "function(k, v) box.space.reg:replace{k, v} return true end",
    "faults_reg_cas": "function(k, old, new) "
                      "return box.space.reg.index.kv:update({k, old}, {{'=', 2, new}}) ~= nil end",
}
VALUES = 5  # values 0..4


def _value(data: list[Any]) -> Any:
    return data[0] if data else None


class Registers:
    name = "register"

    def __init__(self, keys: int = 3, clients: int = 6, pause_s: float = 0.02, seed: int = 0,
                 key_span_s: float = 4.0) -> None:
        self.slots = keys
        self.clients = clients
        self.pause_s = pause_s
        self.seed = seed
        self.key_span_s = key_span_s
        self.started = time.monotonic()
        self.used: set[int] = set()

    def keys(self) -> list[int]:
        generation = int((time.monotonic() - self.started) / self.key_span_s)
        keys = [generation * 100 + slot for slot in range(1, self.slots + 1)]
        self.used.update(keys)
        return keys

    def setup(self, cluster: FaultCluster) -> None:
        script = "\n".join(f"box.schema.func.create('{name}', {{body = [[{body}]], if_not_exists = true}})"
                           for name, body in FUNCTIONS.items())
        cluster.on_leader(lambda c: c.eval(script))
        self.started = time.monotonic()

    def client(self, index: int, history: History, cluster: FaultCluster, stop: threading.Event) -> None:
        rng = random.Random(f"{self.seed}-{index}")
        client = IprotoClient(history, f"register-{index}", self.name, cluster.addresses(), cluster.names_by_host())
        try:
            while not stop.is_set():
                self.one(client, rng)
                time.sleep(rng.uniform(0, 2 * self.pause_s))
        finally:
            client.close()

    def one(self, client: IprotoClient, rng: random.Random) -> None:
        key = rng.choice(self.keys())
        roll = rng.random()
        if roll < 0.4:
            client.perform("read", key, lambda c: c.call("faults_reg_read", [key]), _value)
        elif roll < 0.7:
            v = rng.randrange(VALUES)
            client.perform("write", (key, v), lambda c: c.call("faults_reg_write", [key, v]))
        else:
            old, new = rng.randrange(VALUES), rng.randrange(VALUES)
            client.perform("cas", (key, old, new), lambda c: c.call("faults_reg_cas", [key, old, new]),
                           lambda data: bool(_value(data)))

    def finish(self, history: History, cluster: FaultCluster) -> None:
        """Every key read once more, until a read is answered."""
        client = IprotoClient(history, "register-final", self.name, cluster.addresses(), cluster.names_by_host())
        try:
            for key in sorted(self.used):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    op = client.perform("read", key, lambda c, k=key: c.call("faults_reg_read", [k]), _value)
                    if op.type == "ok":
                        break
                    time.sleep(0.3)
        finally:
            client.close()

    def check(self, history: History, data: Mapping[str, Mapping[str, list[Any]]]) -> list[checkers.Verdict]:
        return [checkers.registers(history.of(self.name))]
