#!/usr/bin/env python3
"""box.queue put -> take -> ack cycle over iproto, end to end, and the same cycle on a real
Tarantool running tarantool/queue (``--target tarantool|both --queue-module DIR``: a ``fifottl``
tube ``t`` called as ``queue.tube.t:put/take/ack``; the module is loaded from DIR with
``package.path``). ``--api module`` calls boxqueue the module's way too (the target
``ours-module``: the same tube, the same calls), ``--api both`` runs both APIs on boxqueue.

``--producers`` connections keep ``--producer-inflight`` CALLs of ``box.queue.put``
outstanding each.  ``--consumers`` connections keep ``--consumer-inflight`` slots
busy each: a slot sends ``box.queue.take``, acks the task it gets on the same
connection, then sends the next take.  Connections are spread over ``--procs``
worker processes that run an epoll loop over raw sockets; request bytes are
built in advance and responses are parsed only as far as needed (code, sync and,
for a take, the raw bytes of the task id, which are spliced into the ack).

The headline is tasks/s: acks answered with code 0 in the measured window.
Producers are held back while more than ``--max-backlog`` tasks are put but not
acked, so a server that takes slower than it puts shows a growing backlog and a
``held`` share rather than an ever longer queue.

See bench/README.md for usage and the meaning of the columns.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import selectors
import shlex
import socket
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from multiprocessing.sharedctypes import RawArray
from pathlib import Path
from typing import Any

import msgpack
from iproto_load import (
    CODE_CHUNK,
    KEY_ERROR_24,
    KEY_FUNCTION_NAME,
    KEY_TUPLE,
    REQ_CALL,
    U64,
    ProtocolError,
    Server,
    SyncClient,
    connect,
    decode_generic,
    encode_prefix,
    error_message,
    format_table,
    machine_info,
    parse_list,
    percentile,
    split_evenly,
    split_responses,
)

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_CONFIG = ROOT / "conf" / "boxqueue.toml"
TARANTOOL_QUEUE_INIT = Path(__file__).resolve().parent / "tarantool_queue_init.lua"
TARANTOOL_TUBE = "t"
TARGETS = ("ours", "tarantool", "both")

QUEUE_SPACE = 0
TUBE = "bench"
WAL_MODES = ("fsync", "write", "none")
KEY_DATA = 0x30

# Our server and Tarantool answer with the header 83 00 ce <code> 01 cf <sync> 05 ce <schema>:
# 22 bytes, so the body of a packet starting at `start` begins at start + 22.
HEADER_BYTES = 22
SCHEMA_KEY_AT = 17


# --------------------------------------------------------------------------- requests


def call_body(function: str, args: list[Any]) -> bytes:
    return msgpack.packb({KEY_FUNCTION_NAME: function, KEY_TUPLE: args})


def module_api(target: str) -> bool:
    """Whether the target is called with tarantool/queue's API: Tarantool, or boxqueue serving
    the same API (``--api module``: the target ``ours-module``)."""
    return target in ("tarantool", "ours-module")


def put_body(payload_size: int, target: str = "ours") -> bytes:
    """box.queue.put(0, tube, delay, ttl, ttr, pri, data): 0 means the default for each;
    with the module's API, queue.tube.t:put(data)."""
    if module_api(target):
        return call_body(f"queue.tube.{TARANTOOL_TUBE}:put", ["x" * payload_size])
    return call_body("box.queue.put", [QUEUE_SPACE, TUBE, 0, 0, 0, 0, "x" * payload_size])


def take_body(timeout_s: float, target: str = "ours") -> bytes:
    if module_api(target):
        return call_body(f"queue.tube.{TARANTOOL_TUBE}:take", [timeout_s])
    return call_body("box.queue.take", [QUEUE_SPACE, TUBE, timeout_s])


def ack_head(target: str = "ours") -> bytes:
    """The ack's map and argument array up to the id; the id's raw msgpack follows:
    box.queue.ack(0, id), or queue.tube.t:ack(id)."""
    if module_api(target):
        function, head_args = f"queue.tube.{TARANTOOL_TUBE}:ack", b"\x91"
    else:
        function, head_args = "box.queue.ack", b"\x92" + msgpack.packb(QUEUE_SPACE)
    return b"\x82" + msgpack.packb(KEY_FUNCTION_NAME) + msgpack.packb(function) + msgpack.packb(KEY_TUPLE) + head_args


ACK_HEAD = ack_head()


def ack_packet(task_id: bytes, sync: bytes, head: bytes = ACK_HEAD) -> bytes:
    body = head + task_id
    return encode_prefix(REQ_CALL, body) + sync + body


def task_id_of(data: bytes, start: int, end: int) -> bytes | None:
    """Raw msgpack of the task id in a take answer (``[[id, tube, 'taken', data...]]``).

    None when the take timed out (``[]``).  The usual layout is read in place; anything else
    is decoded with msgpack.
    """
    body = start + HEADER_BYTES
    if (
        end - body >= 3
        and data[start + SCHEMA_KEY_AT] == 0x05
        and data[start + SCHEMA_KEY_AT + 1] == 0xCE
        and data[body] == 0x81
        and data[body + 1] == KEY_DATA
    ):
        count = data[body + 2]
        if count == 0x90:
            return None
        if count == 0x91 and 0x91 <= data[body + 3] <= 0x9F and end - body > 5:
            at = body + 4
            tag = data[at]
            if tag == 0xD9:
                return data[at : at + 2 + data[at + 1]]
            if 0xA0 <= tag <= 0xBF:
                return data[at : at + 1 + (tag & 0x1F)]
            if tag <= 0x7F:  # tarantool/queue's ids are unsigned integers
                return data[at : at + 1]
            if 0xCC <= tag <= 0xCF:
                return data[at : at + 1 + (1 << (tag - 0xCC))]
    answer = decode_generic(data[start:end])[2].get(KEY_DATA) or []
    if not answer:
        return None
    if not isinstance(answer[0], list) or not answer[0]:
        raise ProtocolError(f"take answered {answer!r}, not [[id, tube, status, ...]]")
    return msgpack.packb(answer[0][0])


# --------------------------------------------------------------------------- workers


@dataclass
class WorkerSpec:
    index: int
    host: str
    port: int
    producers: int
    consumers: int
    producer_inflight: int
    consumer_inflight: int
    payload: int
    take_timeout_s: float
    max_backlog: int
    warmup_s: float
    duration_s: float
    target: str = "ours"


@dataclass
class WorkerResult:
    acks: int = 0  # acks answered with code 0 inside the window
    puts: int = 0  # puts answered with code 0 inside the window
    takes: int = 0  # takes answered with a task inside the window
    empty_takes: int = 0  # takes that timed out inside the window
    errors: int = 0  # non-zero codes, warmup included
    error_samples: list[str] = field(default_factory=list)
    take_ns: bytes = b""  # array('q') of in-window latencies
    put_ns: bytes = b""
    ack_ns: bytes = b""
    puts_at_start: int = 0  # puts/acks answered with code 0 before the window opened
    acks_at_start: int = 0
    puts_total: int = 0  # ... before the window closed
    acks_total: int = 0
    held_s: float = 0.0  # window time during which some producer slot waited for the backlog
    oldest_pending_ms: float = 0.0  # oldest unanswered put or ack when the window closed
    failure: str | None = None
    cpu_busy: float = 0.0


@dataclass
class _Conn:
    sock: socket.socket
    producer: bool
    sent: list[int]  # send time per sync
    pending: list[bool]  # sync in flight
    idle: list[int] = field(default_factory=list)  # producer slots held back by the backlog
    buf: bytes = b""


class Worker:
    """One generator process: an epoll loop over its producer and consumer connections."""

    def __init__(self, spec: WorkerSpec, socks: list[socket.socket], counters: Any) -> None:
        self.spec = spec
        self.counters = counters  # RawArray('q'): [2*i] puts ok, [2*i+1] acks ok, per worker
        self.result = WorkerResult()
        self.take_ns = array("q")
        self.put_ns = array("q")
        self.ack_ns = array("q")
        # Each request is head (length and header up to the sync) + sync + body.
        self.put_body = put_body(spec.payload, spec.target)
        self.put_head = encode_prefix(REQ_CALL, self.put_body)
        self.ack_head = ack_head(spec.target)
        self.take_body = take_body(spec.take_timeout_s, spec.target)
        self.take_head = encode_prefix(REQ_CALL, self.take_body)
        width = max(spec.producer_inflight, 2 * spec.consumer_inflight)
        self.syncs = [U64.pack(sync) for sync in range(width)]
        self.conns: list[_Conn] = []
        for i, sock in enumerate(socks):
            producer = i < spec.producers
            slots = spec.producer_inflight if producer else 2 * spec.consumer_inflight
            self.conns.append(_Conn(sock, producer, [0] * slots, [False] * slots))
        self.puts_ok = 0  # since the start, warmup included
        self.acks_ok = 0
        self.win_start = self.win_end = 0  # the measured window, monotonic ns; set by run()

    # -- helpers -------------------------------------------------------------------------------

    def backlog_full(self) -> bool:
        """True while the put-but-not-acked tasks of all workers reach --max-backlog."""
        if self.spec.max_backlog <= 0:
            return False
        counters = self.counters
        counters[2 * self.spec.index] = self.puts_ok
        counters[2 * self.spec.index + 1] = self.acks_ok
        backlog = sum(counters[0::2]) - sum(counters[1::2])
        return backlog >= self.spec.max_backlog

    def error(self, code: int, packet: bytes) -> None:
        self.result.errors += 1
        if len(self.result.error_samples) < 5:
            self.result.error_samples.append(error_message(code, packet))

    # -- the loop ------------------------------------------------------------------------------

    def run(self, start_at: float) -> WorkerResult:
        spec = self.spec
        result = self.result
        delay = start_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        monotonic_ns = time.monotonic_ns
        t_begin = monotonic_ns()
        cpu_begin = time.process_time()
        self.win_start = win_start = t_begin + int(spec.warmup_s * 1e9)
        self.win_end = win_end = win_start + int(spec.duration_s * 1e9)

        selector = selectors.DefaultSelector()
        for conn in self.conns:
            # Blocking sockets: recv only runs when epoll says readable, and one batch of
            # at most a few dozen small requests never fills the socket buffer.
            conn.sock.settimeout(None)
            selector.register(conn.sock, selectors.EVENT_READ, conn)
            if conn.producer:
                conn.idle = list(range(spec.producer_inflight))
            else:
                self.send(
                    conn, [self.take(conn, slot, t_begin) for slot in range(spec.consumer_inflight)]
                )

        open_conns = len(self.conns)
        responses: list[tuple[int, int, int, int]] = []
        window_marked = False
        last = t_begin
        while open_conns:
            now = monotonic_ns()
            if now >= win_end:
                break
            if not window_marked and now >= win_start:
                window_marked = True
                result.puts_at_start, result.acks_at_start = self.puts_ok, self.acks_ok
            full = self.backlog_full()
            held = False
            for conn in self.conns:
                if conn.producer and conn.idle:
                    if full:
                        held = True
                    else:
                        slots, conn.idle = conn.idle, []
                        self.send(conn, [self.put(conn, slot, now) for slot in slots])
            if held and now > win_start:
                result.held_s += (now - max(last, win_start)) / 1e9
            last = now
            timeout = (win_end - now) / 1e9
            if held:
                timeout = min(timeout, 0.001)  # poll the other workers' acks
            for key, _ in selector.select(timeout):
                conn = key.data
                try:
                    chunk = conn.sock.recv(1 << 18)
                except OSError as exc:
                    chunk = b""
                    result.failure = result.failure or f"recv failed: {exc}"
                t = monotonic_ns()
                if not chunk:
                    selector.unregister(conn.sock)
                    open_conns -= 1
                    result.failure = result.failure or "server closed a connection"
                    continue
                data = conn.buf + chunk if conn.buf else chunk
                responses.clear()
                used = split_responses(data, responses)
                conn.buf = data[used:]
                if conn.producer:
                    parts = self.on_put_answers(conn, data, responses, t, full)
                else:
                    parts = self.on_consumer_answers(conn, data, responses, t)
                if parts and not self.send(conn, parts):
                    selector.unregister(conn.sock)
                    open_conns -= 1

        end = monotonic_ns()
        if not window_marked:
            result.puts_at_start, result.acks_at_start = self.puts_ok, self.acks_ok
        oldest = 0
        for conn in self.conns:
            take_slots = 0 if conn.producer else spec.consumer_inflight
            for sync, busy in enumerate(conn.pending):
                if busy and sync >= take_slots:  # a take may rightly wait for its timeout
                    oldest = max(oldest, end - conn.sent[sync])
        result.oldest_pending_ms = oldest / 1e6
        selector.close()
        for conn in self.conns:
            conn.sock.close()
        result.puts_total, result.acks_total = self.puts_ok, self.acks_ok
        result.take_ns = self.take_ns.tobytes()
        result.put_ns = self.put_ns.tobytes()
        result.ack_ns = self.ack_ns.tobytes()
        result.cpu_busy = (time.process_time() - cpu_begin) / max(1e-9, (end - t_begin) / 1e9)
        return result

    # -- requests ------------------------------------------------------------------------------

    def put(self, conn: _Conn, slot: int, now: int) -> bytes:
        conn.sent[slot] = now
        conn.pending[slot] = True
        return self.put_head + self.syncs[slot] + self.put_body

    def take(self, conn: _Conn, slot: int, now: int) -> bytes:
        conn.sent[slot] = now
        conn.pending[slot] = True
        return self.take_head + self.syncs[slot] + self.take_body

    def ack(self, conn: _Conn, slot: int, task_id: bytes, now: int) -> bytes:
        sync = self.spec.consumer_inflight + slot
        conn.sent[sync] = now
        conn.pending[sync] = True
        return ack_packet(task_id, self.syncs[sync], self.ack_head)

    def send(self, conn: _Conn, parts: list[bytes]) -> bool:
        try:
            conn.sock.sendall(b"".join(parts))
        except OSError as exc:
            self.result.failure = self.result.failure or f"send failed: {exc}"
            return False
        return True

    # -- answers -------------------------------------------------------------------------------

    def on_put_answers(
        self,
        conn: _Conn,
        data: bytes,
        responses: list[tuple[int, int, int, int]],
        t: int,
        backlog_full: bool,
    ) -> list[bytes]:
        in_window = self.win_start <= t < self.win_end
        sent, pending = conn.sent, conn.pending
        parts: list[bytes] = []
        for code, sync, start, end in responses:
            if code == CODE_CHUNK:
                continue
            if not 0 <= sync < len(sent) or not pending[sync]:
                raise ProtocolError(f"put answer with unexpected sync {sync}")
            pending[sync] = False
            if code:
                self.error(code, data[start:end])
            else:
                self.puts_ok += 1
                if in_window:
                    self.result.puts += 1
                    self.put_ns.append(t - sent[sync])
            if backlog_full:
                conn.idle.append(sync)
            else:
                parts.append(self.put(conn, sync, t))
        return parts

    def on_consumer_answers(
        self, conn: _Conn, data: bytes, responses: list[tuple[int, int, int, int]], t: int
    ) -> list[bytes]:
        in_window = self.win_start <= t < self.win_end
        takes = self.spec.consumer_inflight
        sent, pending = conn.sent, conn.pending
        result = self.result
        parts: list[bytes] = []
        for code, sync, start, end in responses:
            if code == CODE_CHUNK:
                continue
            if not 0 <= sync < len(sent) or not pending[sync]:
                raise ProtocolError(f"consumer answer with unexpected sync {sync}")
            pending[sync] = False
            if sync < takes:  # a take
                task_id = None if code else task_id_of(data, start, end)
                if code:
                    self.error(code, data[start:end])
                elif task_id is None:
                    if in_window:
                        result.empty_takes += 1
                else:
                    if in_window:
                        result.takes += 1
                        self.take_ns.append(t - sent[sync])
                    parts.append(self.ack(conn, sync, task_id, t))
                    continue
                parts.append(self.take(conn, sync, t))
            else:  # an ack; its slot takes again
                if code:
                    self.error(code, data[start:end])
                else:
                    self.acks_ok += 1
                    if in_window:
                        result.acks += 1
                        self.ack_ns.append(t - sent[sync])
                parts.append(self.take(conn, sync - takes, t))
        return parts


def _worker_entry(
    spec: WorkerSpec, barrier: Any, start_at: Any, counters: Any, results: Any
) -> None:
    try:
        socks = [connect(spec.host, spec.port) for _ in range(spec.producers + spec.consumers)]
        barrier.wait(timeout=60)
        results.put(Worker(spec, socks, counters).run(start_at.value))
    except BaseException as exc:
        barrier.abort()
        results.put(WorkerResult(failure=f"{type(exc).__name__}: {exc}"))


# --------------------------------------------------------------------------- sequential consumers


@dataclass
class SequentialSpec:
    index: int
    port: int
    clients: int  # threads in this process, one connection each
    payload: int
    take_timeout_s: float
    warmup_s: float
    duration_s: float
    target: str = "ours"


def _sequential_calls(target: str) -> tuple[tuple[str, list[Any]], tuple[str, list[Any]], str, list[Any]]:
    """(put function and arguments before the data, take function and arguments, ack function,
    ack arguments before the id), as an application calls them with the connector."""
    if module_api(target):
        tube = f"queue.tube.{TARANTOOL_TUBE}"
        return (f"{tube}:put", []), (f"{tube}:take", []), f"{tube}:ack", []
    return ("box.queue.put", [QUEUE_SPACE, TUBE, 0, 0, 0, 0]), ("box.queue.take", [QUEUE_SPACE, TUBE]), \
        "box.queue.ack", [QUEUE_SPACE]


def _sequential_client(spec: SequentialSpec, conn: Any, start_ns: int, out: dict[str, Any], lock: Any) -> None:
    """One application consumer: put, take, ack, one after the other, until the window closes."""
    (put_fn, put_args), (take_fn, take_args), ack_fn, ack_args = _sequential_calls(spec.target)
    data = "x" * spec.payload
    win_start = start_ns + int(spec.warmup_s * 1e9)
    win_end = win_start + int(spec.duration_s * 1e9)
    put_ns, take_ns, ack_ns = array("q"), array("q"), array("q")
    cycles = puts_total = acks_total = errors = empty = 0
    samples: list[str] = []
    monotonic_ns = time.monotonic_ns
    while True:
        t0 = monotonic_ns()
        if t0 >= win_end:
            break
        try:
            conn.call(put_fn, [*put_args, data])
            puts_total += 1
            t1 = monotonic_ns()
            taken = conn.call(take_fn, [*take_args, spec.take_timeout_s]).data
            t2 = monotonic_ns()
            if not taken or not taken[0]:
                empty += 1
                continue
            conn.call(ack_fn, [*ack_args, taken[0][0]])
            acks_total += 1
            t3 = monotonic_ns()
        except Exception as exc:
            errors += 1
            if len(samples) < 5:
                samples.append(f"{type(exc).__name__}: {exc}")
            continue
        if t0 >= win_start:
            cycles += 1
            put_ns.append(t1 - t0)
            take_ns.append(t2 - t1)
            ack_ns.append(t3 - t2)
    with lock:
        out["cycles"] += cycles
        out["puts_total"] += puts_total
        out["acks_total"] += acks_total
        out["errors"] += errors
        out["empty"] += empty
        out["samples"] += samples
        out["put_ns"] += put_ns.tobytes()
        out["take_ns"] += take_ns.tobytes()
        out["ack_ns"] += ack_ns.tobytes()


def _sequential_entry(spec: SequentialSpec, barrier: Any, start_at: Any, results: Any) -> None:
    """A generator process: ``spec.clients`` threads, each a `tarantool` connector client."""
    import threading

    import tarantool

    try:
        conns = [tarantool.Connection("127.0.0.1", spec.port) for _ in range(spec.clients)]
        barrier.wait(timeout=60)
        out: dict[str, Any] = {"cycles": 0, "puts_total": 0, "acks_total": 0, "errors": 0, "empty": 0,
                               "samples": [], "put_ns": b"", "take_ns": b"", "ack_ns": b""}
        lock = threading.Lock()
        delay = start_at.value - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        start_ns = time.monotonic_ns()
        cpu0 = time.process_time()
        threads = [threading.Thread(target=_sequential_client, args=(spec, c, start_ns, out, lock))
                   for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["cpu_busy"] = (time.process_time() - cpu0) / (spec.warmup_s + spec.duration_s)
        for c in conns:
            c.close()
        results.put(out)
    except BaseException as exc:
        barrier.abort()
        results.put({"failure": f"{type(exc).__name__}: {exc}"})


def measure_sequential(
    port: int, wal: str, args: argparse.Namespace, server_pid: int | None = None, target: str = "ours"
) -> Measurement:
    """``args.sequential`` clients, each cycling put -> take -> ack with the `tarantool` connector,
    one call at a time; tasks/s = cycles completed in the window, CPU per task = per cycle."""
    ctx = get_context("fork")
    procs = max(1, min(args.procs, args.sequential))
    clients = split_evenly(args.sequential, procs)
    specs = [SequentialSpec(i, port, clients[i], args.payload, args.take_timeout, args.warmup, args.duration, target)
             for i in range(procs)]
    barrier = ctx.Barrier(procs + 1)
    start_at = ctx.Value("d", 0.0)
    results_queue = ctx.Queue()
    workers = [ctx.Process(target=_sequential_entry, args=(spec, barrier, start_at, results_queue), daemon=True)
               for spec in specs]
    for worker in workers:
        worker.start()
    start_at.value = time.monotonic() + 0.5
    with contextlib.suppress(Exception):
        barrier.wait(timeout=60)
    server_cpu_s = 0.0
    if server_pid is not None:
        time.sleep(max(0.0, start_at.value + args.warmup - time.monotonic()))
        cpu_begin = process_cpu_s(server_pid)
        time.sleep(max(0.0, start_at.value + args.warmup + args.duration - time.monotonic()))
        server_cpu_s = process_cpu_s(server_pid) - cpu_begin
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.warmup + args.duration + 60
    while len(results) < len(workers):
        try:
            results.append(results_queue.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            results += [{"failure": "a worker process died"}] * (len(workers) - len(results))
    for worker in workers:
        worker.join(timeout=10)
    failures = sorted({r["failure"] for r in results if "failure" in r})
    ok = [r for r in results if "failure" not in r]
    put_p50, put_p99 = quantiles_ms([r["put_ns"] for r in ok])
    take_p50, take_p99 = quantiles_ms([r["take_ns"] for r in ok])
    ack_p50, ack_p99 = quantiles_ms([r["ack_ns"] for r in ok])
    cycles = sum(r["cycles"] for r in ok)
    backlog = sum(r["puts_total"] - r["acks_total"] for r in ok)
    return Measurement(
        wal=wal, target=target, tasks_per_s=cycles / args.duration, puts_per_s=cycles / args.duration,
        take_p50_ms=take_p50, take_p99_ms=take_p99, takes=cycles, empty_takes=sum(r["empty"] for r in ok),
        put_p50_ms=put_p50, put_p99_ms=put_p99, ack_p50_ms=ack_p50, ack_p99_ms=ack_p99,
        acks=cycles, puts=cycles, backlog_start=0, backlog_end=backlog, held=0.0, oldest_pending_ms=0.0,
        errors=sum(r["errors"] for r in ok), error_samples=sorted({x for r in ok for x in r["samples"]})[:5],
        failure="; ".join(failures) or None, gen_cpu=sum(r["cpu_busy"] for r in ok) / max(1, len(ok)),
        server_cpu_us_per_task=server_cpu_s * 1e6 / cycles if cycles and server_pid else 0.0,
        procs=procs, duration_s=args.duration, client_backlog_final=backlog,
    )


# --------------------------------------------------------------------------- measurement


@dataclass
class QueueStats:
    total: int | None = None
    ready: int | None = None
    taken: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Measurement:
    wal: str
    target: str
    tasks_per_s: float  # acks with code 0 in the window / duration
    puts_per_s: float
    take_p50_ms: float
    take_p99_ms: float
    takes: int
    empty_takes: int
    put_p50_ms: float
    put_p99_ms: float
    ack_p50_ms: float
    ack_p99_ms: float
    acks: int
    puts: int
    backlog_start: int  # put-but-not-acked tasks when the window opened, as the clients saw it
    backlog_end: int
    held: float  # share of the window in which producers waited for the backlog, mean over procs
    oldest_pending_ms: float
    errors: int
    error_samples: list[str]
    failure: str | None
    gen_cpu: float
    server_cpu_us_per_task: float
    procs: int
    duration_s: float
    client_backlog_final: int = 0  # puts ok - acks ok over the whole run
    server: QueueStats = field(default_factory=QueueStats)
    server_mismatch: str | None = None

    @property
    def flagged(self) -> bool:
        return bool(self.errors or self.failure or self.server_mismatch or self.server.error)


def quantiles_ms(raw: Sequence[bytes]) -> tuple[float, float]:
    values = array("q")
    for chunk in raw:
        values.frombytes(chunk)
    ordered = sorted(values)
    return percentile(ordered, 0.50) / 1e6, percentile(ordered, 0.99) / 1e6


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    port: int, wal: str, args: argparse.Namespace, server_pid: int | None = None, target: str = "ours"
) -> Measurement:
    ctx = get_context("fork")
    procs = max(1, min(args.procs, args.producers + args.consumers))
    producers = split_evenly(args.producers, procs)
    consumers = split_evenly(args.consumers, procs)
    specs = [
        WorkerSpec(
            index=i,
            host="127.0.0.1",
            port=port,
            producers=producers[i],
            consumers=consumers[i],
            producer_inflight=args.producer_inflight,
            consumer_inflight=args.consumer_inflight,
            payload=args.payload,
            take_timeout_s=args.take_timeout,
            max_backlog=args.max_backlog,
            warmup_s=args.warmup,
            duration_s=args.duration,
            target=target,
        )
        for i in range(procs)
    ]
    counters = RawArray("q", 2 * procs)
    barrier = ctx.Barrier(procs + 1)
    start_at = ctx.Value("d", 0.0)
    results_queue = ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker_entry,
            args=(spec, barrier, start_at, counters, results_queue),
            daemon=True,
        )
        for spec in specs
    ]
    for worker in workers:
        worker.start()
    start_at.value = time.monotonic() + 0.5  # time for every worker to connect
    with contextlib.suppress(Exception):
        barrier.wait(timeout=60)
    server_cpu_s = 0.0
    if server_pid is not None:  # the server's CPU over the measured window, sampled from here
        time.sleep(max(0.0, start_at.value + args.warmup - time.monotonic()))
        cpu_begin = process_cpu_s(server_pid)
        time.sleep(max(0.0, start_at.value + args.warmup + args.duration - time.monotonic()))
        server_cpu_s = process_cpu_s(server_pid) - cpu_begin
    results: list[WorkerResult] = []
    deadline = time.monotonic() + args.warmup + args.duration + 60
    while len(results) < len(workers):
        try:
            results.append(results_queue.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            results += [WorkerResult(failure="a worker process died")] * (
                len(workers) - len(results)
            )
    for worker in workers:
        worker.join(timeout=10)

    take_p50, take_p99 = quantiles_ms([r.take_ns for r in results])
    put_p50, put_p99 = quantiles_ms([r.put_ns for r in results])
    ack_p50, ack_p99 = quantiles_ms([r.ack_ns for r in results])
    failures = sorted({r.failure for r in results if r.failure})
    acks = sum(r.acks for r in results)
    puts = sum(r.puts for r in results)
    return Measurement(
        wal=wal,
        target=target,
        tasks_per_s=acks / args.duration,
        puts_per_s=puts / args.duration,
        take_p50_ms=take_p50,
        take_p99_ms=take_p99,
        takes=sum(r.takes for r in results),
        empty_takes=sum(r.empty_takes for r in results),
        put_p50_ms=put_p50,
        put_p99_ms=put_p99,
        ack_p50_ms=ack_p50,
        ack_p99_ms=ack_p99,
        acks=acks,
        puts=puts,
        backlog_start=sum(r.puts_at_start - r.acks_at_start for r in results),
        backlog_end=sum(r.puts_total - r.acks_total for r in results),
        held=sum(r.held_s for r in results) / len(results) / args.duration,
        oldest_pending_ms=max(r.oldest_pending_ms for r in results),
        errors=sum(r.errors for r in results),
        error_samples=sorted({s for r in results for s in r.error_samples})[:5],
        failure="; ".join(failures) or None,
        gen_cpu=sum(r.cpu_busy for r in results) / len(results),
        server_cpu_us_per_task=server_cpu_s * 1e6 / acks if acks and server_pid else 0.0,
        procs=procs,
        duration_s=args.duration,
        client_backlog_final=sum(r.puts_total - r.acks_total for r in results),
    )


# --------------------------------------------------------------------------- server


def queue_space_toml(config: Path = SHIPPED_CONFIG) -> str:
    """The ``[[space]]`` block of the shipped config: from its header to the next table."""
    lines = config.read_text().splitlines()
    begin = next(i for i, line in enumerate(lines) if line.strip() == "[[space]]")
    end = next(
        (
            i
            for i in range(begin + 1, len(lines))
            if lines[i].startswith("[") and lines[i].strip() != "[[space]]"
        ),
        len(lines),
    )
    while end > begin and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1  # the comment that introduces the next table
    block = "\n".join(lines[begin:end])
    if f"id = {QUEUE_SPACE}" not in block:
        raise RuntimeError(f"{config}: no [[space]] with id = {QUEUE_SPACE}")
    return block + "\n"


class QueueServer(Server):
    """iproto_load's boxqueue server (space 512 for its readiness probe) plus the queue space;
    or Tarantool with tarantool/queue loaded from ``--queue-module``."""

    def _command(self, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
        command, env = super()._command(args)
        if self.target == "tarantool":
            env["BENCH_QUEUE_DIR"] = str(Path(args.queue_module).resolve())
            return [args.tarantool_bin, str(TARANTOOL_QUEUE_INIT)], env
        config = self.tmp / "bench.toml"
        config.write_text(config.read_text() + "\n" + queue_space_toml())
        return command, env


def create_module_tube(port: int) -> None:
    """The tube ``t`` of type fifottl on boxqueue, as tarantool_queue_init.lua makes it on
    Tarantool. Over CALL, create_tube answers that its tube object cannot be encoded (as the
    module does): the tube exists all the same."""
    with SyncClient(port, timeout=10.0) as client:
        [(code, body)] = client.batch([(REQ_CALL, call_body("queue.create_tube", [TARANTOOL_TUBE, "fifottl"]))])
    if code and "unsupported Lua type" not in str(body.get(KEY_ERROR_24)):
        raise RuntimeError(f"queue.create_tube failed: 0x{code:x} {body.get(KEY_ERROR_24)}")


def queue_statistics(port: int, target: str = "ours") -> QueueStats:
    """box.queue.statistics(0, tube) as tasks.* counts (the flat list becomes a dict); on
    Tarantool, queue.statistics('t')."""
    function, args = ("box.queue.statistics", [QUEUE_SPACE, TUBE])
    if module_api(target):
        function, args = ("queue.statistics", [TARANTOOL_TUBE])
    with SyncClient(port, timeout=10.0) as client:
        [(code, body)] = client.batch([(REQ_CALL, call_body(function, args))])
    if code:
        return QueueStats(error=f"statistics failed: 0x{code:x} {body.get(KEY_ERROR_24)}")
    if module_api(target):
        data = body.get(KEY_DATA) or [{}]
        tasks = (data[0] or {}).get("tasks", {}) if data and isinstance(data[0], dict) else {}
        return QueueStats(total=tasks.get("total"), ready=tasks.get("ready"), taken=tasks.get("taken"),
                          raw={f"tasks.{k}": v for k, v in tasks.items()})
    data = body.get(KEY_DATA) or [[]]
    flat = data[0] if data and isinstance(data[0], list) else data
    prefix = f"space{QUEUE_SPACE}.{TUBE}."
    raw = {str(k).removeprefix(prefix): v for k, v in zip(flat[0::2], flat[1::2], strict=False)}
    return QueueStats(
        total=raw.get("tasks.total"),
        ready=raw.get("tasks.ready"),
        taken=raw.get("tasks.taken"),
        raw=raw,
    )


def settled_statistics(port: int, timeout: float = 5.0, target: str = "ours") -> QueueStats:
    """Statistics once the closed consumers' tasks are released and late puts are in."""
    deadline = time.monotonic() + timeout
    previous = queue_statistics(port, target)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        stats = queue_statistics(port, target)
        if stats.error or (stats.raw == previous.raw and not stats.taken):
            return stats
        previous = stats
    return previous


def check_server(m: Measurement, args: argparse.Namespace) -> None:
    """The server's task count must match puts - acks, up to the requests cut off at the end."""
    total = m.server.total
    if total is None:
        return
    low = m.client_backlog_final - args.consumers * args.consumer_inflight  # acks not read
    high = m.client_backlog_final + args.producers * args.producer_inflight  # puts not read
    if not low <= total <= high:
        m.server_mismatch = (
            f"server holds {total} tasks, clients expect {m.client_backlog_final} "
            f"(allowed {low}..{high})"
        )
    elif m.server.taken and m.target != "tarantool":  # tarantool/queue frees them after its session ttr
        m.server_mismatch = f"{m.server.taken} tasks still taken after every consumer left"


# --------------------------------------------------------------------------- reporting


def result_row(m: Measurement) -> list[str]:
    status = "FAILED" if m.failure else "ERRORS" if m.errors else "MISMATCH" if m.flagged else "ok"
    return [
        m.target,
        m.wal,
        f"{m.tasks_per_s:,.0f}",
        f"{m.puts_per_s:,.0f}",
        f"{m.take_p50_ms:.2f}",
        f"{m.take_p99_ms:.2f}",
        f"{m.empty_takes:,}",
        f"{m.put_p50_ms:.2f}",
        f"{m.put_p99_ms:.2f}",
        f"{m.backlog_start:,}",
        f"{m.backlog_end:,}",
        f"{m.held:.0%}",
        str(m.errors),
        f"{m.gen_cpu:.0%}",
        f"{m.server_cpu_us_per_task:.0f}",
        status,
    ]


HEADERS = [
    "target", "wal", "tasks/s", "puts/s", "take p50", "take p99", "empty takes", "put p50", "put p99",
    "backlog start", "backlog end", "held", "errors", "gen cpu", "server cpu us/task", "status",
]  # fmt: skip


def describe(m: Measurement) -> str:
    s = m.server
    server = (
        s.error
        if s.error
        else f"server queue after the run: total {s.total}, ready {s.ready}, taken {s.taken}"
    )
    return (
        f"[{m.target} wal={m.wal}] {m.tasks_per_s:,.0f} tasks/s, {m.puts_per_s:,.0f} puts/s, "
        f"take p50 {m.take_p50_ms:.2f} ms p99 {m.take_p99_ms:.2f} ms "
        f"({m.empty_takes} empty), put p50 {m.put_p50_ms:.2f} ms p99 {m.put_p99_ms:.2f} ms, "
        f"ack p50 {m.ack_p50_ms:.2f} ms p99 {m.ack_p99_ms:.2f} ms, "
        f"backlog {m.backlog_start} -> {m.backlog_end}, held {m.held:.0%}, {m.errors} errors\n"
        f"[{m.target} wal={m.wal}] {server}; clients: {m.client_backlog_final} put and not acked"
    )


def print_report(
    results: Sequence[Measurement], failures: dict[str, str], args: argparse.Namespace
) -> None:
    print()
    print(format_table(HEADERS, [result_row(m) for m in results]) if results else "(no results)")
    print("(latencies in ms; tasks/s = acks answered with code 0 in the window)")
    for m in results:
        if m.failure:
            print(f"  ! wal={m.wal}: {m.failure}")
        if m.errors:
            print(f"  ! wal={m.wal}: {m.errors} errors: {'; '.join(m.error_samples)}")
        if m.server_mismatch:
            print(f"  ! wal={m.wal}: {m.server_mismatch}")
        if m.server.error:
            print(f"  ! wal={m.wal}: {m.server.error}")
        if m.oldest_pending_ms > 5000:
            print(
                f"  ! wal={m.wal}: a put or ack went unanswered for {m.oldest_pending_ms:,.0f} ms"
            )
        growth = m.backlog_end - m.backlog_start
        if growth > args.consumers * args.consumer_inflight:  # more than takes in flight explain
            print(
                f"  - wal={m.wal}: ready tasks piled up: the backlog grew {m.backlog_start:,} -> "
                f"{m.backlog_end:,} ({growth / m.duration_s:+,.0f}/s); producers are faster "
                f"than consumers, so tasks/s, not puts/s, is the rate"
            )
        elif m.held > 0.05:
            print(
                f"  - wal={m.wal}: producers were held back {m.held:.0%} of the window by "
                f"--max-backlog {args.max_backlog}: they could put faster than tasks were "
                f"taken and acked, so puts/s follows tasks/s"
            )
        if m.gen_cpu > 0.9:
            print(f"  - wal={m.wal}: generator CPU {m.gen_cpu:.0%}: it may be the limit")
    for wal, why in failures.items():
        print(f"  ! {wal} did not run: {why.splitlines()[0] if why else why}")
    pairs = comparisons(results)
    if pairs:
        print("\nours / tarantool in the same run (tasks/s; server CPU per task):")
        for wal, ratio, cpu_ratio in pairs:
            print(f"  wal={wal}: {ratio:.2f}x tasks/s, {cpu_ratio:.2f}x server CPU per task")


def comparisons(results: Sequence[Measurement]) -> list[tuple[str, float, float]]:
    """(wal, tasks/s ratio, server CPU per task ratio) of ours against Tarantool."""
    out = []
    for m in results:
        if m.target == "tarantool":
            continue
        for t in results:
            if t.target == "tarantool" and t.wal == m.wal and t.tasks_per_s and t.server_cpu_us_per_task:
                out.append((m.wal, m.tasks_per_s / t.tasks_per_s, m.server_cpu_us_per_task / t.server_cpu_us_per_task))
    return out


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="box.queue put -> take -> ack cycle over iproto (see bench/README.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--producers", type=int, default=16, help="producer connections")
    parser.add_argument("--consumers", type=int, default=16, help="consumer connections")
    parser.add_argument(
        "--producer-inflight", type=int, default=8, help="puts outstanding per producer"
    )
    parser.add_argument(
        "--consumer-inflight", type=int, default=8, help="take/ack slots per consumer"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument(
        "--wal",
        type=lambda v: parse_list(v, WAL_MODES, "--wal"),
        default=["fsync"],
        help="WAL mode(s), comma-separated: one server and one row each",
    )
    parser.add_argument("--payload", type=int, default=64, help="bytes of task data")
    parser.add_argument(
        "--take-timeout", type=float, default=1.0, help="timeout argument of every take, seconds"
    )
    parser.add_argument(
        "--max-backlog",
        type=int,
        default=1000,
        help="hold producers back while this many tasks are put and not acked (0: never)",
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=max(1, os.cpu_count() or 1),
        help="load generator processes; producers and consumers are spread over them",
    )
    parser.add_argument(
        "--target", choices=TARGETS, default="ours",
        help="boxqueue, Tarantool with tarantool/queue (needs --queue-module), or both, one after the other",
    )
    parser.add_argument(
        "--api", choices=("box.queue", "module", "both"), default="box.queue",
        help="the API boxqueue is called with: box.queue (1.5), tarantool/queue's (the tube t, fifottl, "
             "as on Tarantool: target ours-module), or both, one after the other",
    )
    parser.add_argument(
        "--queue-module", type=Path,
        help="folder holding tarantool/queue's queue/init.lua (e.g. ../shared/anchors/tarantool-queue)",
    )
    parser.add_argument("--tarantool-bin", default="tarantool", help="the reference server")
    parser.add_argument("--memtx-memory", type=int, default=512 * 1024 * 1024, help="Tarantool's memtx arena, bytes")
    parser.add_argument(
        "--sequential", type=int, default=0,
        help="instead of the pipelined load: this many clients (threads over --procs processes), each "
             "with the `tarantool` connector calling put, take and ack one after another, as most "
             "applications consume; tasks/s and CPU per task are per cycle",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (
        min(args.producers, args.consumers, args.producer_inflight, args.consumer_inflight) < 1
        or args.duration <= 0
        or args.warmup < 0
        or args.payload < 0
        or args.take_timeout < 0
        or args.procs < 1
    ):
        print(
            "producers, consumers and inflights must be >= 1, duration > 0, "
            "warmup, payload and take timeout >= 0",
            file=sys.stderr,
        )
        return 2
    if args.sequential < 0:
        print("--sequential must be >= 0", file=sys.stderr)
        return 2
    if args.sequential:  # one request at a time per client: the server's bounds checks follow
        args.producers = args.consumers = args.sequential
        args.producer_inflight = args.consumer_inflight = 1
    command_line = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv)
    machine = machine_info()
    procs = min(args.procs, args.producers + args.consumers)
    print(
        f"machine: {machine['cpu_count']} CPUs, {machine['cpu_model']}, {machine['platform']}, "
        f"Python {machine['python']}"
    )
    print(f"command: {command_line}")
    if args.sequential:
        print(f"load: {args.sequential} sequential clients (tarantool connector: put, take, ack, one at a "
              f"time each) over {procs} processes, payload {args.payload} B, "
              f"warmup {args.warmup:g}s, duration {args.duration:g}s", flush=True)
    else:
        print(
            f"load: {args.producers} producers x {args.producer_inflight} puts, "
            f"{args.consumers} consumers x {args.consumer_inflight} take/ack slots, "
            f"{procs} processes, payload {args.payload} B, max backlog {args.max_backlog}, "
            f"warmup {args.warmup:g}s, duration {args.duration:g}s",
            flush=True,
        )

    ours = {"box.queue": ["ours"], "module": ["ours-module"], "both": ["ours", "ours-module"]}[args.api]
    targets = {"ours": ours, "tarantool": ["tarantool"], "both": [*ours, "tarantool"]}[args.target]
    if "tarantool" in targets and (args.queue_module is None or not (args.queue_module / "queue" / "init.lua").exists()):
        print("--target tarantool needs --queue-module DIR with DIR/queue/init.lua", file=sys.stderr)
        return 2
    results: list[Measurement] = []
    failures: dict[str, str] = {}
    for wal in args.wal:
        for target in targets:
            print(f"[{target} wal={wal}] starting server", flush=True)
            try:
                with QueueServer(target, wal, args) as server:
                    if target == "ours-module":
                        create_module_tube(server.port)
                    pid = server.proc.pid if server.proc else None
                    m = (measure_sequential if args.sequential else measure)(server.port, wal, args, pid, target)
                    if server.proc is not None and server.proc.poll() is not None:
                        raise RuntimeError(f"server exited during the run\n{server.log_tail()}")
                    try:
                        m.server = settled_statistics(server.port, target=target)
                    except (OSError, ProtocolError) as exc:
                        m.server = QueueStats(error=f"statistics failed: {exc}")
                    check_server(m, args)
                    results.append(m)
                    print(describe(m), flush=True)
            except Exception as exc:
                failures[f"{target} wal={wal}"] = str(exc)
                print(f"[{target} wal={wal}] FAILED: {exc}", flush=True)

    print_report(results, failures, args)
    if args.json:
        report = {
            "command": command_line,
            "machine": machine,
            "settings": {
                "producers": args.producers,
                "consumers": args.consumers,
                "producer_inflight": args.producer_inflight,
                "consumer_inflight": args.consumer_inflight,
                "procs": procs,
                "payload": args.payload,
                "take_timeout_s": args.take_timeout,
                "max_backlog": args.max_backlog,
                "warmup_s": args.warmup,
                "duration_s": args.duration,
                "sequential": args.sequential,
            },
            "results": [asdict(m) | {"flagged": m.flagged} for m in results],
            "comparison": [{"wal": w, "tasks_ratio": r, "server_cpu_ratio": c} for w, r, c in comparisons(results)],
            "failures": failures,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 1 if failures or any(m.flagged for m in results) else 0


if __name__ == "__main__":
    sys.exit(main())
