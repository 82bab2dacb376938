"""A replica set for the tests: a real etcd and three (or more) real servers on loopback."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import tarantool

from tests.etcdproc import EtcdProcess, free_ports
from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.serverproc import ServerProcess

REPLICATOR = ("replicator", "repl-secret")

CLUSTER_SPACES = """
[guest]
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[users]]
name = "replicator"
password = "repl-secret"
grants = [{ privileges = ["read"], object_type = "universe" }]

[[space]]
id = 512
name = "kv"
format = [{ name = "id", type = "unsigned" }, { name = "v", type = "any", is_nullable = true }]
indexes = [{ name = "pk", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] }]
"""


@dataclass
class Cluster:
    workdir: Path
    size: int = 3
    quorum: int | None = None
    lease_ttl_s: int = 2
    heartbeat_s: float = 0.3
    synchro_timeout_s: float = 3.0
    extra: str = ""
    facades: bool = False  # Zaqar, Sonya and Deckard on every node (ports in facade_ports)
    wal_config: str = ""  # more [wal] keys
    etcd: EtcdProcess = field(init=False)
    nodes: dict[str, ServerProcess] = field(init=False)

    def __post_init__(self) -> None:
        self.etcd = EtcdProcess(self.workdir / "etcd")
        ports = free_ports(self.size)
        self.names = [f"n{i + 1}" for i in range(self.size)]
        self.ports = dict(zip(self.names, ports, strict=True))
        self.facade_ports: dict[str, dict[str, int]] = {}
        self.nodes = {name: self._node(name) for name in self.names}

    def _peers(self) -> str:
        return ", ".join(f'{{ name = "{n}", uri = "127.0.0.1:{p}" }}' for n, p in self.ports.items())

    def _node(self, name: str) -> ServerProcess:
        quorum = f"synchro_quorum = {self.quorum}\n" if self.quorum is not None else ""
        facades = ""
        if self.facades:
            zaqar, sonya, deckard = free_ports(3)
            self.facade_ports[name] = {"zaqar": zaqar, "sonya": sonya, "deckard": deckard}
            facades = (f'[zaqar]\nlisten = "127.0.0.1:{zaqar}"\n[sonya]\nlisten = "127.0.0.1:{sonya}"\n'
                       f'[deckard]\nlisten = "127.0.0.1:{deckard}"\n')
        config = (
            f"{CLUSTER_SPACES}{QUEUE_SPACE_0}{self.extra}\n{facades}"
            "[replication]\n"
            f'name = "{name}"\n'
            f"peers = [{self._peers()}]\n"
            f'user = "{REPLICATOR[0]}"\npassword = "{REPLICATOR[1]}"\n'
            f"{quorum}synchro_timeout_s = {self.synchro_timeout_s}\nheartbeat_s = {self.heartbeat_s}\n"
            "[replication.etcd]\n"
            f'endpoints = ["{self.etcd.endpoint}"]\nprefix = "/boxqueue/test"\nlease_ttl_s = {self.lease_ttl_s}\n'
        )
        return ServerProcess(self.workdir / name, extra_config=config, wal_mode="fsync", read_only=False,
                             port=self.ports[name], wal_config=self.wal_config)

    def add_node(self, name: str) -> ServerProcess:
        """A new member (every node's peers list is rewritten; restart them to take it)."""
        self.names.append(name)
        self.ports[name] = free_ports(1)[0]
        self.nodes[name] = self._node(name)
        for n in self.names:
            self.nodes[n].workdir.mkdir(parents=True, exist_ok=True)
            self.nodes[n].write_config()
        return self.nodes[name]

    def start(self, timeout: float = 60.0) -> None:
        self.etcd.start()
        for node in self.nodes.values():
            node.launch()
        for node in self.nodes.values():
            node.wait_ready(timeout)
        self.wait_for_leader(timeout=timeout)

    def stop(self) -> None:
        for node in self.nodes.values():
            try:
                node.stop()
            except Exception:
                node.kill()
        self.etcd.stop()

    def connect(self, name: str, **kwargs) -> tarantool.Connection:
        return tarantool.Connection("127.0.0.1", self.ports[name], **kwargs)

    def info(self, name: str) -> dict | None:
        """``box.info`` of a node, or None if it does not answer."""
        node = self.nodes[name]
        if node.proc is None or node.proc.poll() is not None:
            return None
        try:  # a stopped process accepts connections and never answers: time out
            conn = self.connect(name, connect_now=True, socket_timeout=2, connection_timeout=2)
        except Exception:
            return None
        try:
            return conn.call("box.info").data[0]
        except Exception:
            return None
        finally:
            conn.close()

    def rows(self, name: str, space: str = "kv") -> list[list]:
        """Every tuple of a space on a node, sorted (a new connection each time)."""
        conn = self.connect(name, socket_timeout=5, connection_timeout=2)
        try:
            return sorted(list(t) for t in conn.select(space, [], limit=10**7))
        finally:
            conn.close()

    def leader(self) -> str | None:
        """The node that leads and says so, if exactly one does."""
        leading = [n for n in self.names if (i := self.info(n)) is not None and not i["ro"]]
        return leading[0] if len(leading) == 1 else None

    def wait_for_leader(self, timeout: float = 30.0, other_than: str | None = None) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and leader != other_than:
                return leader
            time.sleep(0.2)
        raise AssertionError(f"no leader after {timeout} s:\n" + "\n".join(
            f"--- {n} ---\n{self.nodes[n].log()[-3000:]}" for n in self.names))

    def followers(self, leader: str) -> list[str]:
        return [n for n in self.names if n != leader]

    def wait_until(self, check, timeout: float = 20.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except Exception as exc:  # a node restarting, say
                last = exc
            time.sleep(0.1)
        raise AssertionError(f"{what or 'condition'} not met after {timeout} s ({last})")
