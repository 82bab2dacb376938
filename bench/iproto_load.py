#!/usr/bin/env python3
"""Pipelined iproto load generator: boxqueue side by side with a real Tarantool.

Every measurement opens ``--connections`` raw TCP connections, spread over a few
worker processes, and keeps ``--inflight`` requests outstanding on each.  Request
bytes are encoded in advance; only the 8-byte sync is spliced in.  The sync is
the request's slot number on its connection, so responses are matched by sync
(servers may answer out of order) and each slot's send time gives the latency.

See bench/README.md for usage and the meaning of the columns.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import queue
import random
import selectors
import shlex
import shutil
import signal
import socket
import string
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import msgpack

BENCH_DIR = Path(__file__).resolve().parent
TARANTOOL_INIT = BENCH_DIR / "tarantool_init.lua"

GREETING_SIZE = 128
SPACE_ID = 512
PAYLOAD_SIZE = 32
CALL_FUNCTION = "box.session.id"

# Request codes and body keys (specs/iproto.md §2, §3).
REQ_SELECT = 1
REQ_REPLACE = 3
REQ_CALL = 10
REQ_EVAL = 8
REQ_PING = 64
KEY_SPACE, KEY_INDEX, KEY_LIMIT, KEY_OFFSET, KEY_ITERATOR = 0x10, 0x11, 0x12, 0x13, 0x14
KEY_KEY, KEY_TUPLE, KEY_FUNCTION_NAME = 0x20, 0x21, 0x22
KEY_EXPR = 0x27
# eval: a chunk that only runs Lua; eval_get: one box call from Lua (a primary-key get).
EVAL_CHUNKS = {"eval": "return ...", "eval_get": "return box.space.bench:get(...)"}
KEY_ERROR_24 = 0x31
ITER_EQ = 0
CODE_CHUNK = 0x80  # box.session.push: not the final answer

OPS = ("ping", "select", "replace", "call", "eval", "eval_get")
WAL_MODES = ("fsync", "write", "none")
TARGETS = ("ours", "tarantool")

# The request header is always {0: type, 1: sync} with the sync as uint64 (0xCF).
HEADER_SIZE = 13  # 82 00 <type> 01 cf <8 bytes>
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
# Real Tarantool's response header: 83 00 ce <code u32> 01 cf <sync u64> 05 ce <schema u32>.
TARANTOOL_HEADER = struct.Struct(">BBBIBBQ")


# --------------------------------------------------------------------------- encoding


def encode_prefix(request_type: int, body: bytes) -> bytes:
    """Length prefix plus header up to (not including) the 8 sync bytes."""
    return (
        b"\xce" + U32.pack(HEADER_SIZE + len(body)) + bytes((0x82, 0x00, request_type, 0x01, 0xCF))
    )


def encode_request(request_type: int, body: bytes, sync: int) -> bytes:
    return encode_prefix(request_type, body) + U64.pack(sync) + body


def payload(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=PAYLOAD_SIZE))


def ping_body() -> bytes:
    return msgpack.packb({})


def select_body(key: int) -> bytes:
    return msgpack.packb(
        {
            KEY_SPACE: SPACE_ID,
            KEY_INDEX: 0,
            KEY_LIMIT: 1,
            KEY_OFFSET: 0,
            KEY_ITERATOR: ITER_EQ,
            KEY_KEY: [key],
        }
    )


def replace_body(key: int, value: str) -> bytes:
    return msgpack.packb({KEY_SPACE: SPACE_ID, KEY_TUPLE: [key, value]})


def call_body() -> bytes:
    return msgpack.packb({KEY_FUNCTION_NAME: CALL_FUNCTION, KEY_TUPLE: []})


def request_pool(op: str, rows: int, seed: str, size: int = 4096) -> list[tuple[bytes, bytes]]:
    """(prefix, body) pairs for one op; random keys are drawn once, here."""
    rng = random.Random(seed)
    if op == "ping":
        bodies = [ping_body()]
        code = REQ_PING
    elif op == "call":
        bodies = [call_body()]
        code = REQ_CALL
    elif op in EVAL_CHUNKS:
        bodies = [msgpack.packb({KEY_EXPR: EVAL_CHUNKS[op], KEY_TUPLE: [rng.randint(1, rows)]}) for _ in range(size)]
        code = REQ_EVAL
    elif op == "select":
        bodies = [select_body(rng.randint(1, rows)) for _ in range(size)]
        code = REQ_SELECT
    elif op == "replace":
        bodies = [replace_body(rng.randint(1, rows), payload(rng)) for _ in range(size)]
        code = REQ_REPLACE
    else:
        raise ValueError(f"unknown op {op!r}")
    return [(encode_prefix(code, body), body) for body in bodies]


# --------------------------------------------------------------------------- decoding


def decode_generic(packet: bytes | memoryview) -> tuple[int, int, dict[Any, Any]]:
    """(code, sync, body) of one response, header and body maps after the length."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(packet)
    header = unpacker.unpack()
    try:
        body = unpacker.unpack()
    except msgpack.OutOfData:
        body = {}
    if not isinstance(header, dict):
        raise ProtocolError(f"response header is not a map: {header!r}")
    return int(header.get(0, -1)), int(header.get(1, -1)), body if isinstance(body, dict) else {}


class ProtocolError(Exception):
    pass


def split_responses(data: bytes, sink: list[tuple[int, int, int, int]]) -> int:
    """Append (code, sync, start, end) for every complete response; return bytes used.

    start..end is the packet after its 5-byte length prefix.  Tarantool's fixed
    header layout is decoded with one struct call; any other layout goes through msgpack.
    """
    n = len(data)
    pos = 0
    unpack_u32 = U32.unpack_from
    unpack_header = TARANTOOL_HEADER.unpack_from
    while n - pos >= 5:
        if data[pos] != 0xCE:
            raise ProtocolError(f"response length prefix starts with 0x{data[pos]:02x}, not 0xce")
        start = pos + 5
        end = start + unpack_u32(data, pos + 1)[0]
        if end > n:
            break
        if end - start >= 17:
            m, k0, t0, code, k1, t1, sync = unpack_header(data, start)
            if m != 0x83 or k0 != 0 or t0 != 0xCE or k1 != 1 or t1 != 0xCF:
                code, sync, _ = decode_generic(data[start:end])
        else:
            code, sync, _ = decode_generic(data[start:end])
        sink.append((code, sync, start, end))
        pos = end
    return pos


def error_message(code: int, packet: bytes) -> str:
    try:
        _, _, body = decode_generic(packet)
        message = body.get(KEY_ERROR_24, "")
    except Exception as exc:
        message = f"<undecodable error body: {exc}>"
    return f"0x{code:x} {message}"


# --------------------------------------------------------------------------- workers


@dataclass
class WorkerSpec:
    host: str
    port: int
    op: str
    connections: int
    inflight: int
    rows: int
    seed: str
    warmup_s: float
    duration_s: float


@dataclass
class WorkerResult:
    ok: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    latencies_ns: bytes = b""  # array('q') of in-window latencies
    failure: str | None = None
    cpu_busy: float = 0.0  # this process's CPU time / wall time while it generated load


@dataclass
class _Conn:
    sock: socket.socket
    sent: list[int]
    buf: bytes = b""
    cursor: int = 0


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise ConnectionError("server closed the connection")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def connect(host: str, port: int, timeout: float = 10.0) -> socket.socket:
    """Connect and consume the 128-byte greeting."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    greeting = recv_exactly(sock, GREETING_SIZE)
    if not greeting.startswith(b"Tarantool "):
        sock.close()
        raise ProtocolError(f"unexpected greeting {greeting[:64]!r}")
    return sock


def run_worker(spec: WorkerSpec, socks: list[socket.socket], start_at: float) -> WorkerResult:
    """Drive the connected sockets until the window closes; start_at is a time.monotonic()."""
    result = WorkerResult()
    pool = request_pool(spec.op, spec.rows, spec.seed)
    pool_size = len(pool)
    syncs = [U64.pack(slot) for slot in range(spec.inflight)]
    conns = [
        _Conn(sock, [0] * spec.inflight, cursor=i * 997 % pool_size) for i, sock in enumerate(socks)
    ]

    delay = start_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    t_begin = time.monotonic_ns()
    cpu_begin = time.process_time()
    win_start = t_begin + int(spec.warmup_s * 1e9)
    win_end = win_start + int(spec.duration_s * 1e9)

    selector = selectors.DefaultSelector()
    for conn in conns:
        # Blocking sockets: recv only runs when epoll says readable, and sendall
        # of at most `inflight` small requests never fills the socket buffer.
        conn.sock.settimeout(None)
        selector.register(conn.sock, selectors.EVENT_READ, conn)
        parts: list[bytes] = []
        for slot in range(spec.inflight):
            prefix, body = pool[conn.cursor]
            conn.cursor = (conn.cursor + 1) % pool_size
            parts += (prefix, syncs[slot], body)
        now = time.monotonic_ns()
        for slot in range(spec.inflight):
            conn.sent[slot] = now
        conn.sock.sendall(b"".join(parts))

    latencies = array("q")
    record = latencies.append
    ok = errors = 0
    inflight = spec.inflight
    open_conns = len(conns)
    responses: list[tuple[int, int, int, int]] = []
    monotonic_ns = time.monotonic_ns

    while open_conns:
        now = monotonic_ns()
        if now >= win_end:
            break
        for key, _ in selector.select((win_end - now) / 1e9):
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
            in_window = win_start <= t < win_end
            sent = conn.sent
            parts = []
            for code, sync, start, end in responses:
                if code == CODE_CHUNK:
                    continue
                if not 0 <= sync < inflight:
                    raise ProtocolError(f"response with unknown sync {sync}")
                if code:
                    errors += 1  # warmup included: any error flags the row
                    if len(result.error_samples) < 5:
                        result.error_samples.append(error_message(code, data[start:end]))
                elif in_window:
                    ok += 1
                    record(t - sent[sync])
                prefix, body = pool[conn.cursor]
                conn.cursor = (conn.cursor + 1) % pool_size
                parts += (prefix, syncs[sync], body)
            if parts:
                t_send = monotonic_ns()
                for code, sync, _, _ in responses:
                    if code != CODE_CHUNK:
                        sent[sync] = t_send
                try:
                    conn.sock.sendall(b"".join(parts))
                except OSError as exc:
                    selector.unregister(conn.sock)
                    open_conns -= 1
                    result.failure = result.failure or f"send failed: {exc}"

    selector.close()
    for conn in conns:
        conn.sock.close()
    result.ok = ok
    result.errors = errors
    result.latencies_ns = latencies.tobytes()
    result.cpu_busy = (time.process_time() - cpu_begin) / max(
        1e-9, (monotonic_ns() - t_begin) / 1e9
    )
    return result


def _worker_entry(spec: WorkerSpec, barrier: Any, start_at: Any, results: Any) -> None:
    try:
        conns = [connect(spec.host, spec.port) for _ in range(spec.connections)]
        barrier.wait(timeout=60)
        results.put(run_worker(spec, conns, start_at.value))
    except BaseException as exc:
        barrier.abort()
        results.put(WorkerResult(failure=f"{type(exc).__name__}: {exc}"))


# --------------------------------------------------------------------------- measurement


@dataclass
class Measurement:
    target: str
    op: str
    wal: str
    rps: float
    p50_ms: float
    p99_ms: float
    ok: int
    errors: int
    error_samples: list[str]
    failure: str | None
    connections: int
    inflight: int
    procs: int
    gen_cpu: float  # mean CPU busy fraction of the generator processes
    duration_s: float
    # The server's CPU time (all its threads, user + system) per successful response over the
    # measured window, and the system (kernel) part of it: less dependent on other load than rps.
    server_us: float = float("nan")
    server_sys_us: float = float("nan")

    @property
    def flagged(self) -> bool:
        return bool(self.errors or self.failure)


def percentile(sorted_values: Sequence[int], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[index])


def split_evenly(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def process_cpu(pid: int | None) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and all its threads so far; NaN if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError, TypeError):
        return float("nan"), float("nan")
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def measure(
    target: str, port: int, op: str, wal: str, args: argparse.Namespace, server_pid: int | None = None
) -> Measurement:
    ctx = get_context("fork")
    procs = max(1, min(args.procs, args.connections))
    specs = [
        WorkerSpec(
            host="127.0.0.1",
            port=port,
            op=op,
            connections=n,
            inflight=args.inflight,
            rows=args.rows,
            seed=f"{target}-{op}-{wal}-{i}",
            warmup_s=args.warmup,
            duration_s=args.duration,
        )
        for i, n in enumerate(split_evenly(args.connections, procs))
    ]
    barrier = ctx.Barrier(len(specs) + 1)
    start_at = ctx.Value("d", 0.0)
    results_queue = ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker_entry, args=(spec, barrier, start_at, results_queue), daemon=True
        )
        for spec in specs
    ]
    for worker in workers:
        worker.start()
    start_at.value = time.monotonic() + 0.5  # time for every worker to connect
    with contextlib.suppress(Exception):
        barrier.wait(timeout=60)
    window_start = start_at.value + args.warmup
    time.sleep(max(0.0, window_start - time.monotonic()))
    cpu_before = process_cpu(server_pid)
    time.sleep(max(0.0, window_start + args.duration - time.monotonic()))
    cpu_after = process_cpu(server_pid)
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

    latencies = array("q")
    for result in results:
        latencies.frombytes(result.latencies_ns)
    ordered = sorted(latencies)
    failures = [r.failure for r in results if r.failure]
    answered = max(1, sum(r.ok for r in results))
    user_s, sys_s = (after - before for after, before in zip(cpu_after, cpu_before, strict=True))
    return Measurement(
        target=target,
        op=op,
        wal=wal,
        rps=sum(r.ok for r in results) / args.duration,
        p50_ms=percentile(ordered, 0.50) / 1e6,
        p99_ms=percentile(ordered, 0.99) / 1e6,
        ok=sum(r.ok for r in results),
        errors=sum(r.errors for r in results),
        error_samples=sorted({s for r in results for s in r.error_samples})[:5],
        failure="; ".join(sorted(set(failures))) or None,
        connections=args.connections,
        inflight=args.inflight,
        procs=len(specs),
        gen_cpu=sum(r.cpu_busy for r in results) / len(results),
        duration_s=args.duration,
        server_us=(user_s + sys_s) * 1e6 / answered,
        server_sys_us=sys_s * 1e6 / answered,
    )


# --------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SyncClient:
    """A plain one-connection client for readiness probes and preloading."""

    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.sock = connect("127.0.0.1", port, timeout=timeout)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batch(self, requests: Iterable[tuple[int, bytes]]) -> list[tuple[int, dict[Any, Any]]]:
        """Send (type, body) requests pipelined; return (code, body) in request order."""
        packets = [encode_request(code, body, sync) for sync, (code, body) in enumerate(requests)]
        self.sock.sendall(b"".join(packets))
        answers: dict[int, tuple[int, dict[Any, Any]]] = {}
        found: list[tuple[int, int, int, int]] = []
        while len(answers) < len(packets):
            chunk = self.sock.recv(1 << 18)
            if not chunk:
                raise ConnectionError("server closed the connection")
            data = self.buf + chunk
            found.clear()
            used = split_responses(data, found)
            self.buf = data[used:]
            for code, sync, start, end in found:
                if code != CODE_CHUNK:
                    answers[sync] = (code, decode_generic(data[start:end])[2])
        return [answers[sync] for sync in range(len(packets))]


class Server:
    """One server process in its own temporary directory."""

    def __init__(self, target: str, wal: str, args: argparse.Namespace) -> None:
        self.target = target
        self.wal = wal
        self.port = free_port()
        # --metrics: boxqueue also serves /metrics and the dashboard (scraped by Scraper)
        self.metrics_port = free_port() if target == "ours" and getattr(args, "metrics", False) else None
        self.tmp = Path(tempfile.mkdtemp(prefix=f"iproto-bench-{target}-{wal}-"))
        self.log_path = self.tmp / "server.log"
        self.command, self.env = self._command(args)
        self.proc: subprocess.Popen[bytes] | None = None

    def _command(self, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        if self.target == "tarantool":
            env.update(
                BENCH_PORT=str(self.port),
                BENCH_WAL_MODE=self.wal,
                BENCH_WORK_DIR=str(self.tmp),
                BENCH_MEMTX_MEMORY=str(args.memtx_memory),
            )
            return [args.tarantool_bin, str(TARANTOOL_INIT)], env
        config = self.tmp / "bench.toml"
        config.write_text(
            f"""data_dir = "data"

[iproto]
listen = "127.0.0.1:{self.port}"

[wal]
mode = "{self.wal}"

[[space]]
id = {SPACE_ID}
name = "bench"
format = [{{ name = "id", type = "unsigned" }}, {{ name = "payload", type = "string" }}]
indexes = [
  {{ name = "primary", type = "TREE", unique = true, parts = [{{ field = 0, type = "unsigned" }}] }},
]
"""
            + (f'\n[metrics]\nlisten = "127.0.0.1:{self.metrics_port}"\n' if self.metrics_port else "")
        )
        script = Path(sys.executable).parent / "boxqueue"
        if script.exists():
            return [str(script), "serve", "--config", str(config)], env
        return [sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(config)], env

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                cwd=self.tmp,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                message = (
                    f"{self.target} exited with code {self.proc.returncode} while starting\n"
                    f"{self.log_tail()}"
                )
                self.stop()
                raise RuntimeError(message)
            try:
                with SyncClient(self.port, timeout=5.0) as client:
                    [(code, body)] = client.batch([(REQ_SELECT, select_body(0))])
                if code == 0:
                    return
                last_error = RuntimeError(
                    f"probe select failed: 0x{code:x} {body.get(KEY_ERROR_24)}"
                )
            except (OSError, ProtocolError) as exc:
                last_error = exc
            time.sleep(0.1)
        message = f"{self.target} not ready after {timeout:.0f}s: {last_error}\n{self.log_tail()}"
        self.stop()
        raise RuntimeError(message)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join("    " + line for line in text[-lines:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def preload(port: int, rows: int, batch: int = 512) -> None:
    """REPLACE rows 1..rows (id, ~32-byte payload) through one pipelined connection."""
    rng = random.Random(rows)
    with SyncClient(port) as client:
        for first in range(1, rows + 1, batch):
            ids = range(first, min(first + batch, rows + 1))
            answers = client.batch((REQ_REPLACE, replace_body(i, payload(rng))) for i in ids)
            bad = [(code, body) for code, body in answers if code]
            if bad:
                code, body = bad[0]
                raise RuntimeError(
                    f"preload: {len(bad)} errors, first: 0x{code:x} {body.get(KEY_ERROR_24)}"
                )


# --------------------------------------------------------------------------- reporting


def machine_info() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def result_row(m: Measurement) -> list[str]:
    status = "FAILED" if m.failure else "ERRORS" if m.errors else "ok"
    return [
        m.target,
        m.op,
        m.wal,
        f"{m.rps:,.0f}",
        f"{m.p50_ms:.3f}",
        f"{m.p99_ms:.3f}",
        str(m.errors),
        f"{m.gen_cpu:.0%}",
        f"{m.server_us:.2f} ({m.server_sys_us:.2f})",
        status,
    ]


def comparisons(results: Sequence[Measurement]) -> list[dict[str, Any]]:
    by_key = {(m.target, m.op, m.wal): m for m in results}
    out = []
    for m in results:
        if m.target != "ours":
            continue
        theirs = by_key.get(("tarantool", m.op, m.wal))
        if theirs is None:
            continue

        out.append(
            {
                "op": m.op,
                "wal": m.wal,
                "rps_ratio": ratio(m.rps, theirs.rps),
                "p50_ratio": ratio(m.p50_ms, theirs.p50_ms),
                "p99_ratio": ratio(m.p99_ms, theirs.p99_ms),
                "flagged": m.flagged or theirs.flagged,
            }
        )
    return out


def ratio(ours: float, theirs: float) -> float | None:
    return ours / theirs if theirs and ours == ours and theirs == theirs else None


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value:.2f}x"


def print_report(results: Sequence[Measurement], failures: dict[str, str]) -> None:
    headers = ["target", "op", "wal", "rps", "p50 ms", "p99 ms", "errors", "gen cpu", "srv us/req (sys)", "status"]
    print()
    if results:
        print(format_table(headers, [result_row(m) for m in results]))
    else:
        print("(no results)")
    for m in results:
        if m.flagged:
            detail = m.failure or ", ".join(m.error_samples)
            print(f"  ! {m.target} {m.op} {m.wal}: {m.errors} errors; {detail}")
    for target, why in failures.items():
        print(f"  ! {target} did not run: {why.splitlines()[0] if why else why}")
    comps = comparisons(results)
    if comps:
        print("\nours / tarantool (rps > 1x is faster; latency < 1x is faster)")
        rows = [
            [
                c["op"],
                c["wal"],
                fmt_ratio(c["rps_ratio"]),
                fmt_ratio(c["p50_ratio"]),
                fmt_ratio(c["p99_ratio"]),
                "flagged" if c["flagged"] else "",
            ]
            for c in comps
        ]
        print(format_table(["op", "wal", "rps", "p50", "p99", ""], rows))


# --------------------------------------------------------------------------- main


def parse_list(value: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in allowed]
    if unknown or not items:
        raise argparse.ArgumentTypeError(f"{what}: choose from {','.join(allowed)}, got {value!r}")
    return list(dict.fromkeys(items))


def build_parser() -> argparse.ArgumentParser:
    have_tarantool = shutil.which("tarantool") is not None
    parser = argparse.ArgumentParser(
        description="Pipelined iproto load: boxqueue vs Tarantool (see bench/README.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--target",
        choices=("ours", "tarantool", "both"),
        default="both" if have_tarantool else "ours",
        help="which server(s) to start and measure",
    )
    parser.add_argument("--connections", type=int, default=16, help="TCP connections")
    parser.add_argument(
        "--inflight", type=int, default=16, help="requests in flight per connection"
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per row")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of load before measuring"
    )
    parser.add_argument(
        "--ops",
        type=lambda v: parse_list(v, OPS, "--ops"),
        default=["ping", "select", "replace", "call"],
        help="comma-separated subset of " + ",".join(OPS),
    )
    parser.add_argument(
        "--wal",
        type=lambda v: parse_list(v, WAL_MODES, "--wal"),
        default=list(WAL_MODES),
        help="WAL modes for replace; the other ops run once, in the first mode listed",
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=max(1, os.cpu_count() or 1),
        help="load generator processes (connections are spread over them)",
    )
    parser.add_argument("--rows", type=int, default=100_000, help="rows preloaded into space 512")
    parser.add_argument("--metrics", action="store_true",
                        help="boxqueue serves [metrics] and /metrics is scraped during the run")
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes (--metrics)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--tarantool-bin", default=shutil.which("tarantool") or "tarantool")
    parser.add_argument(
        "--memtx-memory", type=int, default=256 * 1024 * 1024, help=argparse.SUPPRESS
    )
    return parser


def plan(ops: Sequence[str], wal_modes: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(wal mode, ops) per server start: everything in the first mode, then replace only."""
    steps = [(wal_modes[0], [op for op in OPS if op in ops])]
    if "replace" in ops:
        steps += [(wal, ["replace"]) for wal in wal_modes[1:]]
    return [(wal, step_ops) for wal, step_ops in steps if step_ops]


class Scraper:
    """GETs /metrics every ``interval`` seconds in a thread, as Prometheus would, while the load
    runs; reports how many scrapes there were and how long they took."""

    def __init__(self, port: int | None, interval: float) -> None:
        self.port = port
        self.interval = interval
        self.times: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import urllib.request

        url = f"http://127.0.0.1:{self.port}/metrics"
        while not self._stop.wait(self.interval):
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(url, timeout=30) as response:
                    response.read()
            except OSError:
                self.failures += 1
                continue
            self.times.append(time.perf_counter() - t0)

    def __enter__(self) -> Scraper:
        if self.port is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.port is not None:
            self._stop.set()
            self._thread.join(timeout=60)
            mean = 1000 * sum(self.times) / len(self.times) if self.times else float("nan")
            print(f"[scraper] {len(self.times)} scrapes of /metrics, {mean:.1f} ms each on average, "
                  f"{self.failures} failed", flush=True)


def run_target(target: str, args: argparse.Namespace, results: list[Measurement]) -> None:
    for wal, ops in plan(args.ops, args.wal):
        print(f"[{target}] starting server, wal={wal}", flush=True)
        with Server(target, wal, args) as server, Scraper(server.metrics_port, args.scrape_interval):
            if {"select", "replace", "eval_get"} & set(ops):
                t0 = time.monotonic()
                preload(server.port, args.rows)
                print(
                    f"[{target}] preloaded {args.rows:,} rows in {time.monotonic() - t0:.1f}s",
                    flush=True,
                )
            for op in ops:
                m = measure(target, server.port, op, wal, args, server.proc.pid if server.proc else None)
                results.append(m)
                note = (
                    ""
                    if not m.flagged
                    else f"  ({m.errors} errors{'; ' + m.failure if m.failure else ''})"
                )
                print(
                    f"[{target}] {op:<7} wal={wal:<5} {m.rps:>10,.0f} rps  "
                    f"p50 {m.p50_ms:.3f} ms  p99 {m.p99_ms:.3f} ms{note}",
                    flush=True,
                )
                if server.proc is not None and server.proc.poll() is not None:
                    raise RuntimeError(f"{target} exited during {op}\n{server.log_tail()}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.connections < 1 or args.inflight < 1 or args.duration <= 0 or args.warmup < 0:
        print("connections and inflight must be >= 1, duration > 0, warmup >= 0", file=sys.stderr)
        return 2
    targets = list(TARGETS) if args.target == "both" else [args.target]
    command_line = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv)
    machine = machine_info()
    print(
        f"machine: {machine['cpu_count']} CPUs, {machine['cpu_model']}, {machine['platform']}, "
        f"Python {machine['python']}"
    )
    print(f"command: {command_line}")
    print(
        f"load: {args.connections} connections x {args.inflight} in flight, "
        f"{min(args.procs, args.connections)} processes, warmup {args.warmup:g}s, "
        f"duration {args.duration:g}s",
        flush=True,
    )

    results: list[Measurement] = []
    failures: dict[str, str] = {}
    for target in targets:
        try:
            run_target(target, args, results)
        except Exception as exc:
            failures[target] = str(exc)
            print(f"[{target}] FAILED: {exc}", flush=True)

    print_report(results, failures)
    if args.json:
        report = {
            "command": command_line,
            "machine": machine,
            "settings": {
                "connections": args.connections,
                "inflight": args.inflight,
                "procs": min(args.procs, args.connections),
                "warmup_s": args.warmup,
                "duration_s": args.duration,
                "rows": args.rows,
            },
            "results": [asdict(m) | {"flagged": m.flagged} for m in results],
            "comparison": comparisons(results),
            "failures": failures,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    flagged = failures or any(m.flagged for m in results)
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
