"""A replica set in network namespaces: etcd (one member or three) and three boxqueue members.

Each process runs in its host's namespace (:mod:`tests.faults.netns`) and listens on that host's
address; the members are configured as ``tests/integration/replica_fixtures.py`` configures its
loopback cluster (the same spaces and users), with ``[zaqar]`` on every member, a register space
``reg`` for the linearizability workload, and each member's data directory on a small tmpfs of
its own (:mod:`tests.faults.disk`), so that any member's disk can be filled.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tarantool

from tests.etcdproc import ETCD_BINARY
from tests.faults.disk import SmallDisk
from tests.faults.netns import Host, Topology
from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.integration.replica_fixtures import CLUSTER_SPACES, REPLICATOR
from tests.serverproc import ROOT

IPROTO_PORT = 3301
ZAQAR_PORT = 8888
ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380
ETCD_PREFIX = "/boxqueue/faults"

# The register workload's space: one row a key, and a unique (k, v) index a compare-and-set
# updates through (tests/faults/workloads/register.py).
REGISTER_SPACE = """
[[space]]
id = 513
name = "reg"
format = [{ name = "k", type = "unsigned" }, { name = "v", type = "unsigned" }]
indexes = [
  { name = "pk", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] },
  { name = "kv", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }, { field = 1, type = "unsigned" }] },
]
"""


def _wait_for_greeting(host: str, port: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    import socket

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                s.settimeout(2)
                data = b""
                while len(data) < 128:
                    chunk = s.recv(128 - len(data))
                    if not chunk:
                        break
                    data += chunk
                if len(data) == 128:
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise RuntimeError(f"no greeting from {host}:{port} after {timeout} s: {last}")


@dataclass
class Process:
    """A process in a host's namespace; start/stop/kill/pause it as often as needed."""

    host: Host
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def log_path(self) -> Path:
        return self.workdir / "output.log"

    def spawn(self, argv: list[str], env: dict[str, str]) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- started {time.strftime('%H:%M:%S')}: {' '.join(argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.host.command(argv), cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        self.paused = False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.proc is not None and self.paused:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """kill -9 (a paused process too)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        self.paused = False

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""


@dataclass
class EtcdMember(Process):
    name: str = "e1"
    cluster: str = ""  # --initial-cluster
    token: str = "bqfaults"  # --initial-cluster-token: the same for every member of one cluster

    @property
    def endpoint(self) -> str:
        return f"{self.host.address}:{ETCD_CLIENT_PORT}"

    def start(self) -> None:
        client, peer = f"http://{self.endpoint}", f"http://{self.host.address}:{ETCD_PEER_PORT}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        self.spawn([str(ETCD_BINARY), "--name", self.name, "--data-dir", str(self.workdir / "data"),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", self.cluster or f"{self.name}={peer}",
                    "--initial-cluster-state", "new", "--initial-cluster-token", self.token], env)

    def healthy(self) -> bool:
        conn = http.client.HTTPConnection(self.host.address, ETCD_CLIENT_PORT, timeout=2)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            return response.status == 200 and json.loads(response.read()).get("health") == "true"
        except (OSError, ValueError):
            return False
        finally:
            conn.close()


@dataclass
class Member(Process):
    name: str = "n1"
    config: str = ""
    disk: SmallDisk | None = None
    unsafe: str | None = None  # BOXQUEUE_UNSAFE, the negative control's switch

    @property
    def config_path(self) -> Path:
        return self.workdir / "boxqueue.toml"

    @property
    def address(self) -> tuple[str, int]:
        return self.host.address, IPROTO_PORT

    @property
    def zaqar_url(self) -> str:
        return f"http://{self.host.address}:{ZAQAR_PORT}"

    def start(self) -> None:
        self.config_path.write_text(self.config)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("BOXQUEUE_UNSAFE", None)
        if self.unsafe:
            env["BOXQUEUE_UNSAFE"] = self.unsafe
        self.spawn([sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(self.config_path)], env)

    def wait_ready(self, timeout: float) -> None:
        try:
            _wait_for_greeting(self.host.address, IPROTO_PORT, self.proc, timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"member {self.name}: {exc}\n--- its log ---\n{self.log()}") from None

    def connect(self, timeout: float = 2.0) -> tarantool.Connection:
        return tarantool.Connection(self.host.address, IPROTO_PORT, connect_now=True,
                                    socket_timeout=timeout, connection_timeout=timeout)

    def info(self) -> dict[str, Any] | None:
        """``box.info``, or None when it does not answer (stopped, paused, starting)."""
        if not self.running() or self.paused:
            return None
        try:
            conn = self.connect()
        except Exception:
            return None
        try:
            return conn.call("box.info").data[0]
        except Exception:
            return None
        finally:
            conn.close()


@dataclass
class FaultCluster:
    topology: Topology
    workdir: Path
    etcd_size: int = 1
    lease_ttl_s: int = 2
    heartbeat_s: float = 0.3
    synchro_timeout_s: float = 3.0
    unsafe: str | None = None
    disk_mb: int = 256
    members: dict[str, Member] = field(init=False, default_factory=dict)
    etcds: dict[str, EtcdMember] = field(init=False, default_factory=dict)

    MEMBER_NAMES = ("n1", "n2", "n3")

    @staticmethod
    def host_names(etcd_size: int) -> list[str]:
        return [*FaultCluster.MEMBER_NAMES, *(f"e{i + 1}" for i in range(etcd_size))]

    def __post_init__(self) -> None:
        hosts = self.topology.hosts
        peers = ",".join(f"e{i + 1}=http://{hosts[f'e{i + 1}'].address}:{ETCD_PEER_PORT}" for i in range(self.etcd_size))
        for i in range(self.etcd_size):
            name = f"e{i + 1}"
            self.etcds[name] = EtcdMember(hosts[name], self.workdir / name, name=name, cluster=peers,
                                          token=self.topology.mount_source("etcd"))
        for name in self.MEMBER_NAMES:
            workdir = self.workdir / name
            disk = SmallDisk(workdir / "data", self.topology.mount_source(f"{name}-data"), self.disk_mb)
            self.members[name] = Member(hosts[name], workdir, name=name, config=self._config(name),
                                        disk=disk, unsafe=self.unsafe)

    def _config(self, name: str) -> str:
        hosts = self.topology.hosts
        peers = ", ".join(f'{{ name = "{n}", uri = "{hosts[n].address}:{IPROTO_PORT}" }}' for n in self.MEMBER_NAMES)
        endpoints = ", ".join(f'"{e.endpoint}"' for e in self.etcds.values())
        address = hosts[name].address
        return (
            'data_dir = "data"\n'
            f'[iproto]\nlisten = "{address}:{IPROTO_PORT}"\n'
            '[wal]\nmode = "fsync"\n'
            f"{CLUSTER_SPACES}{QUEUE_SPACE_0}{REGISTER_SPACE}\n"
            f'[zaqar]\nlisten = "{address}:{ZAQAR_PORT}"\n'
            "[replication]\n"
            f'name = "{name}"\npeers = [{peers}]\n'
            f'user = "{REPLICATOR[0]}"\npassword = "{REPLICATOR[1]}"\n'
            f"synchro_quorum = 2\nsynchro_timeout_s = {self.synchro_timeout_s}\nheartbeat_s = {self.heartbeat_s}\n"
            "[replication.etcd]\n"
            f'endpoints = [{endpoints}]\nprefix = "{ETCD_PREFIX}"\nlease_ttl_s = {self.lease_ttl_s}\n'
        )

    # -- life ------------------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> None:
        for etcd in self.etcds.values():
            etcd.start()
        self.wait_etcd_healthy(timeout)
        for member in self.members.values():
            assert member.disk is not None
            member.disk.mount()
            member.start()
        for member in self.members.values():
            member.wait_ready(timeout)
        self.wait_for_leader(timeout)

    def wait_etcd_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(e.healthy() for e in self.etcds.values()):
                return
            time.sleep(0.2)
        raise RuntimeError("etcd not healthy:\n" + "\n".join(f"--- {n} ---\n{e.log()}" for n, e in self.etcds.items()))

    def stop(self) -> None:
        for member in self.members.values():
            try:
                member.stop()
            except Exception:
                member.kill()
        for etcd in self.etcds.values():
            try:
                etcd.stop()
            except Exception:
                etcd.kill()
        for member in self.members.values():
            if member.disk is not None:
                member.disk.unmount()

    # -- who leads -------------------------------------------------------------------------------

    def infos(self) -> dict[str, dict[str, Any] | None]:
        return {name: member.info() for name, member in self.members.items()}

    def leader(self) -> str | None:
        """The member that leads and says so, if exactly one does."""
        leading = [n for n, i in self.infos().items() if i is not None and not i["ro"]]
        return leading[0] if len(leading) == 1 else None

    def wait_for_leader(self, timeout: float = 60.0, other_than: str | None = None) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and leader != other_than:
                return leader
            time.sleep(0.1)
        for member in self.members.values():  # what each awaits, into its log (boxqueue/task_tree.py)
            if member.proc is not None and member.proc.poll() is None and not member.paused:
                member.proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        raise RuntimeError(f"no leader after {timeout} s:\n" + "\n".join(
            f"--- {n} ---\n{m.log(8000)}" for n, m in self.members.items()))

    def on_leader(self, action: Callable[[tarantool.Connection], Any], timeout: float = 90.0) -> Any:
        """``action`` on a fresh connection to the leader, again until it succeeds (setup steps)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = self.members[self.wait_for_leader(max(deadline - time.monotonic(), 1))].connect(timeout=10)
                try:
                    return action(conn)
                finally:
                    conn.close()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def followers(self, leader: str) -> list[str]:
        return [n for n in self.members if n != leader]

    def names_by_host(self) -> dict[str, str]:
        return {m.host.address: n for n, m in self.members.items()}

    def zaqar_urls(self) -> dict[str, str]:
        return {n: m.zaqar_url for n, m in self.members.items()}

    def addresses(self) -> list[dict[str, Any]]:
        return [{"host": m.host.address, "port": IPROTO_PORT} for m in self.members.values()]

    # -- the data after healing --------------------------------------------------------------------

    def snapshot(self, name: str) -> dict[str, list[Any]]:
        """Every row of every space that is not a system one, by space name, sorted."""
        conn = self.members[name].connect(timeout=30)
        try:
            spaces = conn.select(281, [], limit=10**6)  # _vspace
            data: dict[str, list[Any]] = {}
            for row in spaces:
                space_id, space_name = row[0], row[2]
                if str(space_name).startswith("_"):
                    continue
                rows = conn.select(space_id, [], limit=10**8)
                data[str(space_name)] = sorted((list(r) for r in rows), key=repr)
            return data
        finally:
            conn.close()

    def converge(self, timeout: float = 120.0) -> tuple[dict[str, dict[str, list[Any]]], str]:
        """Waits until every member answers at the leader's LSN, then reads every member's data
        (read again if an LSN moved meanwhile). Returns the data and a note of what was not met
        (empty when converged): the checker of equality reports the differences."""
        deadline = time.monotonic() + timeout
        note = ""
        data: dict[str, dict[str, list[Any]]] = {}
        while time.monotonic() < deadline:
            infos = self.infos()
            lsns = {n: i["lsn"] for n, i in infos.items() if i is not None}
            leaders = [n for n, i in infos.items() if i is not None and not i["ro"]]
            if len(lsns) == len(self.members) and len(set(lsns.values())) == 1 and len(leaders) == 1:
                try:
                    data = {n: self.snapshot(n) for n in self.members}
                except Exception as exc:
                    note = f"reading the data failed: {exc!r}"
                    time.sleep(0.5)
                    continue
                after = {n: (i or {}).get("lsn") for n, i in self.infos().items()}
                if after == lsns:
                    return data, ""
                note = f"LSNs moved while reading: {lsns} -> {after}"
            else:
                note = f"not converged: LSNs {lsns}, leaders {leaders}"
            time.sleep(0.5)
        if not data:
            data = {}
            for n in self.members:
                try:
                    data[n] = self.snapshot(n)
                except Exception as exc:
                    note += f"; {n} unreadable: {exc!r}"
        return data, note
