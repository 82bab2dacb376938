"""Network namespaces for the fault suite: one per host on a bridge, and the network nemeses.

A :class:`Topology` is a bridge in the root namespace holding the first address of a private
``10.x.y.0/24`` (unique per run), and one namespace per host, each with a veth on the bridge, its
own address and its loopback up. Clients stay in the root namespace and reach every host by its
address; a host's processes are started inside its namespace with ``ip netns exec``.

Nemeses on the network: partitions are nftables rules inside the hosts' namespaces (a table of
our own in each, dropping by address in input and output, so both directions of a cut are
dropped on both sides), and a slow link is a ``tbf`` qdisc on both ends of a host's veth (the
kernel here has no netem).

Everything created carries a run-unique prefix, ``bqf<pid in hex>-<run number>``; the process
that owns a run holds a lock file (``/run/boxqueue-faults/<pid>.lock``) while it lives, so a new
run removes what earlier runs left behind (their namespaces, the processes still inside them,
their links and tmpfs mounts) only when their owner is gone, never a live run of another
engineer.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "bqf"
LOCK_DIR = Path("/run/boxqueue-faults")
TABLE = "bqfaults"  # the nftables table inside each host's namespace
_runs = itertools.count()
_lock_fd: int | None = None


def unavailable_reason() -> str | None:
    """Why this machine cannot run the fault suite, or None if it can."""
    if os.geteuid() != 0:
        return "the fault suite needs root (network namespaces, nftables, tmpfs mounts)"
    for tool in ("ip", "nft", "tc", "mount"):
        if shutil.which(tool) is None:
            return f"the fault suite needs `{tool}`, which is not on the PATH"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` is not available: {probe.stderr.strip()}"
    return None


def run(*args: str, check: bool = True, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """One command, its output kept for the error; ``check``: fail loudly on a non-zero exit."""
    done = subprocess.run(list(args), capture_output=True, text=True, input=input_text)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


# -- ownership and stale runs ---------------------------------------------------------------------


def _hold_lock() -> None:
    """This process owns runs named after its pid while it holds this lock (released at exit)."""
    global _lock_fd
    if _lock_fd is not None:
        return
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    path = LOCK_DIR / f"{os.getpid()}.lock"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _lock_fd = fd
    atexit.register(path.unlink, missing_ok=True)


def _owner_alive(pid: int) -> bool:
    """Whether the run owner ``pid`` still holds its lock (a reused pid does not)."""
    if pid == os.getpid():
        return True
    path = LOCK_DIR / f"{pid}.lock"
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _owner_of(name: str) -> int | None:
    """The pid a run's object is named after: every name is ``bqf<pid in hex>-<run>...``."""
    m = re.match(rf"^{PREFIX}([0-9a-f]+)-", name)
    return int(m.group(1), 16) if m else None


def remove_stale() -> list[str]:
    """Removes what runs whose owner is gone left behind; returns what it removed."""
    removed: list[str] = []
    dead = lambda name: (pid := _owner_of(name)) is not None and not _owner_alive(pid)  # noqa: E731
    for line in Path("/proc/mounts").read_text().splitlines():
        source, target = line.split()[:2]
        if dead(source):
            run("umount", "-l", target, check=False)
            removed.append(f"mount {target}")
    for ns in _namespaces():
        if dead(ns):
            _kill_inside(ns)
            run("ip", "netns", "del", ns, check=False)
            removed.append(f"netns {ns}")
    links = run("ip", "-o", "link", "show", check=False).stdout
    for name in re.findall(r"^\d+: ([^:@]+)[:@]", links, re.M):
        if dead(name):
            run("ip", "link", "del", name, check=False)
            removed.append(f"link {name}")
    for lock in LOCK_DIR.glob("*.lock"):
        if lock.stem.isdigit() and not _owner_alive(int(lock.stem)):
            lock.unlink(missing_ok=True)
    return removed


def _namespaces() -> list[str]:
    out = run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_inside(ns: str) -> None:
    pids = run("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGCONT)
            os.kill(int(pid), signal.SIGKILL)


# -- the topology --------------------------------------------------------------------------------


@dataclass
class Host:
    """One namespace on the bridge: ``name`` is the suite's name for it (``n1``, ``e1``)."""

    name: str
    netns: str
    address: str
    veth_root: str  # the bridge's end, in the root namespace
    veth_inside: str = "eth0"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]


def _free_subnet(seed: int) -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that no interface of this machine is in (other runs' bridges included)."""
    used = run("ip", "-o", "-4", "addr", "show", check=False).stdout
    taken = {ipaddress.ip_interface(a).network for a in re.findall(r"inet (\S+)", used)}
    for i in range(4096):
        n = (seed * 7919 + i * 104729) % (200 * 250)
        net = ipaddress.ip_network(f"10.{20 + n // 250}.{n % 250}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError("no free 10.x.y.0/24 for the fault suite's bridge")


@dataclass
class Topology:
    """The bridge and one namespace per host; :meth:`close` (or ``with``) removes everything."""

    host_names: list[str]
    run_id: str = field(init=False)
    subnet: ipaddress.IPv4Network = field(init=False)
    bridge: str = field(init=False)
    bridge_address: str = field(init=False)
    hosts: dict[str, Host] = field(init=False, default_factory=dict)
    _cuts: set[frozenset[str]] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        _hold_lock()
        remove_stale()
        number = next(_runs) % 16
        self.run_id = f"{os.getpid():x}-{number:x}"
        self.namespace_prefix = f"{PREFIX}{self.run_id}-"
        self.subnet = _free_subnet(os.getpid() * 16 + number)
        addresses = list(self.subnet.hosts())
        self.bridge = f"{PREFIX}{self.run_id}b"
        self.bridge_address = str(addresses[0])
        atexit.register(self.close)
        try:
            run("ip", "link", "add", self.bridge, "type", "bridge")
            run("ip", "addr", "add", f"{self.bridge_address}/{self.subnet.prefixlen}", "dev", self.bridge)
            run("ip", "link", "set", self.bridge, "up")
            for index, name in enumerate(self.host_names):
                self._add_host(index, name, str(addresses[10 + index]))
        except BaseException:
            self.close()
            raise

    def _add_host(self, index: int, name: str, address: str) -> None:
        host = Host(name, f"{self.namespace_prefix}{name}", address, f"{PREFIX}{self.run_id}h{index}")
        self.hosts[name] = host
        peer = f"{host.veth_root}p"
        run("ip", "netns", "add", host.netns)
        run("ip", "link", "add", host.veth_root, "type", "veth", "peer", "name", peer)
        run("ip", "link", "set", host.veth_root, "master", self.bridge)
        run("ip", "link", "set", host.veth_root, "up")
        run("ip", "link", "set", peer, "netns", host.netns)
        ns = ["ip", "-n", host.netns]
        run(*ns, "link", "set", peer, "name", host.veth_inside)
        run(*ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", host.veth_inside)
        run(*ns, "link", "set", host.veth_inside, "up")
        run(*ns, "link", "set", "lo", "up")
        self._write_rules(host, set())

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kills what still runs inside, deletes the namespaces and the links. Idempotent."""
        for host in self.hosts.values():
            if host.netns in _namespaces():
                _kill_inside(host.netns)
                run("ip", "netns", "del", host.netns, check=False)
            run("ip", "link", "del", host.veth_root, check=False)
        if self.bridge:
            run("ip", "link", "del", self.bridge, check=False)
        self.hosts = {}
        self.bridge = ""
        atexit.unregister(self.close)

    # -- partitions ------------------------------------------------------------------------------

    def _write_rules(self, host: Host, blocked: Iterable[str]) -> None:
        """Replaces ``host``'s rules, atomically: drop everything to and from ``blocked``."""
        addresses = sorted({self.hosts[b].address for b in blocked})
        drops = ""
        if addresses:
            listed = ", ".join(addresses)
            drops = (f"add rule inet {TABLE} input ip saddr {{ {listed} }} drop\n"
                     f"add rule inet {TABLE} output ip daddr {{ {listed} }} drop\n")
        script = (f"table inet {TABLE} {{}}\n"
                  f"delete table inet {TABLE}\n"
                  f"table inet {TABLE} {{\n"
                  "  chain input { type filter hook input priority 0; policy accept; }\n"
                  "  chain output { type filter hook output priority 0; policy accept; }\n"
                  "}\n" + drops)
        run(*host.command(["nft", "-f", "-"]), input_text=script)

    def _apply(self) -> None:
        for name, host in self.hosts.items():
            blocked = {other for cut in self._cuts if name in cut for other in cut if other != name}
            self._write_rules(host, blocked)

    def cut(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Adds cuts between pairs of hosts (both directions, on both sides)."""
        for a, b in pairs:
            if a != b:
                self._cuts.add(frozenset((a, b)))
        self._apply()

    def isolate(self, name: str) -> None:
        """``name`` reaches no other host (clients in the root namespace still reach it)."""
        self.cut((name, other) for other in self.hosts if other != name)

    def cut_from(self, name: str, others: Iterable[str]) -> None:
        """``name`` cut from ``others`` only."""
        self.cut((name, other) for other in others)

    def heal(self) -> None:
        """Every cut removed, every slow link restored."""
        self._cuts.clear()
        self._apply()
        for host in self.hosts.values():
            self.fast(host.name)

    def cuts(self) -> list[tuple[str, str]]:
        return sorted(tuple(sorted(c)) for c in self._cuts)  # type: ignore[misc]

    # -- slow links ------------------------------------------------------------------------------

    def slow(self, name: str, rate: str = "64kbit", latency: str = "300ms", burst: str = "4kb") -> None:
        """Both directions of ``name``'s link through a token bucket of ``rate``."""
        host = self.hosts[name]
        tbf = ["tbf", "rate", rate, "burst", burst, "latency", latency]
        run(*host.command(["tc", "qdisc", "replace", "dev", host.veth_inside, "root", *tbf]))
        run("tc", "qdisc", "replace", "dev", host.veth_root, "root", *tbf)

    def fast(self, name: str) -> None:
        host = self.hosts[name]
        run(*host.command(["tc", "qdisc", "del", "dev", host.veth_inside, "root"]), check=False)
        run("tc", "qdisc", "del", "dev", host.veth_root, "root", check=False)

    def mount_source(self, what: str) -> str:
        """A run-unique source name for a mount (found again by :func:`remove_stale`)."""
        return f"{self.namespace_prefix}{what}"
