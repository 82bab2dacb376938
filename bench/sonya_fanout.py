#!/usr/bin/env python3
"""Sonya fan-out: one sender, many concurrent listeners, delivery latency.

Starts boxqueue with a [sonya] section in a temporary directory on free loopback ports, opens
``--listeners`` WebSocket or long-poll listeners on one (queue, id), then sends ``--messages``
messages, one every ``--interval`` seconds, each carrying its send time. Every listener records
when each message reached it; the report is the delivery latency (receive time minus the time
just before the send request) over all (listener, message) pairs, p50/p99/max, and how many
deliveries were missing or duplicated (there should be none: long-poll listeners resume with
``sequence=<last + 1>``).

The listeners run in ``--client-procs`` asyncio processes on the same machine as the server, so
the figures include the clients' own work on the shared CPUs. WebSocket listeners use the
websockets library (``--client websockets``) or a minimal frame reader (``--client raw``, far less
client CPU per frame); long-polls always use a minimal HTTP/1.1 loop. Besides the latency from the
send, the report has the *spread*: each receipt's time after the first receipt of the same message
(the fan-out alone, without the send request and its commit), and the server's CPU time per
delivery, which depends least on other load.

    .venv/bin/python bench/sonya_fanout.py --mode ws --listeners 1000
    .venv/bin/python bench/sonya_fanout.py --mode ws --client raw --client-procs 2
    .venv/bin/python bench/sonya_fanout.py --mode longpoll --listeners 1000 --json out.json
    .venv/bin/python bench/sonya_fanout.py --server-root ../main   # another checkout's server
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import websockets

ROOT = Path(__file__).resolve().parent.parent
# The server as ``boxqueue serve`` starts it, with a map that valgrind can reserve (it refuses
# the default 1 TiB), as bench/handle_cost.py does.
CALLGRIND_LAUNCH = (
    "import functools, sys; from boxqueue import cli, process; from storage.environment import Storage; "
    "process.Storage = functools.partial(Storage, map_size=1 << 30); sys.exit(cli.main(sys.argv[1:]))"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    workdir: Path, wal: str, profile: str | None = None, root: Path = ROOT, callgrind: Path | None = None
) -> tuple[subprocess.Popen, int]:
    http_port, iproto_port = free_port(), free_port()
    config = workdir / "boxqueue.toml"
    config.write_text(
        f'data_dir = "data"\n[iproto]\nlisten = "127.0.0.1:{iproto_port}"\n[wal]\nmode = "{wal}"\n'
        f'[sonya]\nlisten = "127.0.0.1:{http_port}"\nmax_key_updates = 100\nlongpoll_max_wait_s = 60\n'
    )
    log = open(workdir / "server.log", "ab")  # noqa: SIM115 - handed to the server process
    interpreter = sys.executable if root == ROOT else str(root / ".venv" / "bin" / "python")
    python = [interpreter] + (["-m", "cProfile", "-o", str(Path(profile).resolve())] if profile else [])
    command = ["-m", "boxqueue.cli", "serve", "--config", str(config)]
    if callgrind is not None:
        python = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind}", *python]
        command = ["-c", CALLGRIND_LAUNCH, "serve", "--config", str(config)]
    proc = subprocess.Popen(
        python + command,
        cwd=root, stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + (300 if callgrind is not None else 30)
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", http_port), timeout=1):
                return proc, http_port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("server did not start")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# A receipt: (sequence, time the listener got it, time just before its send request).
Receipt = tuple[int, float, float]


async def ws_listener(url: str, count: int, out: list[Receipt], opened: asyncio.Queue) -> None:
    """A listener on the websockets library (permessage-deflate offered, as by default)."""
    async with websockets.connect(url, max_queue=None, open_timeout=120, ping_interval=None) as ws:
        opened.put_nowait(None)
        for _ in range(count):
            frame = await ws.recv()
            now = time.time()
            m = json.loads(frame)
            out.append((m["sequence"], now, m["payload"]["t"]))


class RawWsListener(asyncio.Protocol):
    """A listener on a bare asyncio connection with a minimal RFC 6455 reader (server frames
    only: unmasked, unfragmented text frames, optionally compressed as permessage-deflate); it
    offers permessage-deflate as browsers do. Far less client CPU per frame than a full library,
    so the figures measure the server more than the client."""

    def __init__(self, path: str, port: int, count: int, out: list[Receipt], opened: asyncio.Queue, deflate: bool) -> None:
        self.request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\nSec-WebSocket-Version: 13\r\n"
            + ("Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n" if deflate else "")
            + "\r\n"
        ).encode()
        self.count, self.out, self.opened = count, out, opened
        self.buffer = bytearray()
        self.upgraded = False
        self.inflater: zlib._Decompress | None = None  # kept across messages with context takeover
        self.fresh_inflater = True  # server_no_context_takeover: a new one per message
        self.done = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("closed before every message arrived"))

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            del buf[:end + 4]
            if not head.startswith(b"http/1.1 101"):
                self.done.set_exception(ConnectionError(head.split(b"\r\n")[0].decode()))
                self.transport.close()
                return
            self.upgraded = True
            if b"permessage-deflate" in head:
                self.inflater = zlib.decompressobj(-15)
                self.fresh_inflater = b"server_no_context_takeover" in head
            self.opened.put_nowait(None)
        while len(buf) >= 2:
            first, length, at = buf[0], buf[1] & 0x7F, 2
            if length == 126:
                if len(buf) < 4:
                    return
                length, at = int.from_bytes(buf[2:4], "big"), 4
            elif length == 127:
                if len(buf) < 10:
                    return
                length, at = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < at + length:
                return
            payload = bytes(buf[at:at + length])
            del buf[:at + length]
            if first & 0x0F != 1:  # a close (or anything else): this bench expects none
                self.transport.close()
                return
            if first & 0x40:
                if self.fresh_inflater:
                    self.inflater = zlib.decompressobj(-15)
                payload = self.inflater.decompress(payload + b"\x00\x00\xff\xff")
            now = time.time()
            m = json.loads(payload)
            self.out.append((m["sequence"], now, m["payload"]["t"]))
            if len(self.out) == self.count:
                self.done.set_result(None)
                self.transport.close()
                return


async def raw_ws_listener(port: int, path: str, count: int, out: list[Receipt], opened: asyncio.Queue, deflate: bool) -> None:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: RawWsListener(path, port, count, out, opened, deflate), "127.0.0.1", port)
    await proto.done


async def longpoll_listener(port: int, path: str, count: int, out: list[Receipt], start_seq: int) -> None:
    """A keep-alive HTTP/1.1 long-poll loop on a raw connection (a full client library costs
    more CPU per poll than the server does, which would measure the client)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    next_seq = start_seq
    try:
        while len(out) < count:
            writer.write(f"GET {path}?sequence={next_seq} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length)
            now = time.time()
            for m in json.loads(body):
                out.append((m["sequence"], now, m["payload"]["t"]))
                next_seq = m["sequence"] + 1
    finally:
        writer.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def listen(args: argparse.Namespace, port: int, listeners: int, ready: Callable[[], None]) -> tuple[list[list[Receipt]], float]:
    """Open ``listeners`` listeners, call ``ready`` once all are listening, collect every
    receipt; also the CPU seconds this process spent from ready to the end."""
    results: list[list[Receipt]] = [[] for _ in range(listeners)]
    opened: asyncio.Queue = asyncio.Queue()
    tasks = []
    for i in range(listeners):
        if args.mode == "longpoll":
            coro = longpoll_listener(port, "/queue/listen/longpoll/bench/k", args.messages, results[i], 2)
        elif args.client == "raw":
            coro = raw_ws_listener(port, "/queue/listen/ws/bench/k", args.messages, results[i], opened, args.deflate)
        else:
            coro = ws_listener(f"ws://127.0.0.1:{port}/queue/listen/ws/bench/k", args.messages, results[i], opened)
        tasks.append(asyncio.create_task(coro))
    if args.mode == "longpoll":
        await asyncio.sleep(max(2.0, listeners / 500))  # let the polls reach the server
    else:
        for _ in range(listeners):
            await asyncio.wait_for(opened.get(), 300)
    ready()
    cpu0 = time.process_time()
    done, pending = await asyncio.wait(tasks, timeout=args.messages * args.interval + 120)
    for t in pending:
        t.cancel()
    for t in done:
        if t.exception() is not None:
            print("listener failed:", repr(t.exception()), file=sys.stderr)
    return results, time.process_time() - cpu0


def client_process(args: argparse.Namespace, port: int, listeners: int, pipe: Connection) -> None:
    """One of ``--client-procs`` listener processes: reports ready, then its receipts."""
    results, cpu = asyncio.run(listen(args, port, listeners, lambda: pipe.send("ready")))
    pipe.send((results, cpu))


async def send_messages(args: argparse.Namespace, base: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=60) as sender:
        for _ in range(args.messages):
            r = await sender.post("/queue/send/bench", json={"id": "k", "payload": {"t": time.time()}})
            assert r.json()["success"], r.text
            await asyncio.sleep(args.interval)


def run(args: argparse.Namespace, port: int, server_pid: int) -> dict:
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=120) as client:
        assert client.post("/queue/create/bench").status_code == 201
        # A first message, so long-poll listeners can start from sequence 2 without a race.
        client.post("/queue/send/bench", json={"id": "k", "payload": {"t": time.time()}})
    shares = [args.listeners // args.client_procs + (i < args.listeners % args.client_procs) for i in range(args.client_procs)]
    context = multiprocessing.get_context("fork")
    pipes, procs = [], []
    for share in shares:
        ours, theirs = context.Pipe()
        proc = context.Process(target=client_process, args=(args, port, share, theirs), daemon=True)
        proc.start()
        pipes.append(ours)
        procs.append(proc)
    for pipe in pipes:
        if not pipe.poll(300) or pipe.recv() != "ready":
            raise RuntimeError("listeners did not open")
    t0 = time.monotonic()
    server_cpu0 = cpu_seconds(server_pid)
    asyncio.run(send_messages(args, base))
    results: list[list[Receipt]] = []
    client_cpu = 0.0
    for pipe in pipes:
        if not pipe.poll(args.messages * args.interval + 180):
            raise RuntimeError("a listener process did not report")
        got, cpu = pipe.recv()
        results += got
        client_cpu += cpu
    elapsed = time.monotonic() - t0
    server_cpu = cpu_seconds(server_pid) - server_cpu0
    for proc in procs:
        proc.join(10)
    if args.receipts:
        Path(args.receipts).write_text(json.dumps(results))
    latencies = [got - sent for r in results for _, got, sent in r]
    first: dict[int, float] = {}
    for r in results:
        for seq, got, _ in r:
            first[seq] = min(got, first.get(seq, got))
    spreads = [got - first[seq] for r in results for seq, got, _ in r]
    expected = set(range(2, 2 + args.messages))
    missing = sum(len(expected - {s for s, _, _ in r}) for r in results)
    duplicated = sum(len(r) - len({s for s, _, _ in r}) for r in results)
    out_of_order = sum(1 for r in results if [s for s, _, _ in r] != sorted(s for s, _, _ in r))

    def ms(values: list[float], p: float) -> float | None:
        return round(percentile(values, p) * 1000, 1) if values else None

    return {
        "mode": args.mode,
        "client": "raw" if args.mode == "longpoll" else args.client,
        "deflate_offered": args.mode == "ws" and (args.client == "websockets" or args.deflate),
        "client_procs": args.client_procs,
        "listeners": args.listeners,
        "messages": args.messages,
        "deliveries": len(latencies),
        "missing": missing,
        "duplicated": duplicated,
        "listeners_out_of_order": out_of_order,
        "p50_ms": ms(latencies, 50),
        "p99_ms": ms(latencies, 99),
        "max_ms": round(max(latencies) * 1000, 1) if latencies else None,
        "spread_p50_ms": ms(spreads, 50),
        "spread_p99_ms": ms(spreads, 99),
        "seconds": round(elapsed, 1),
        "server_cpu_s": round(server_cpu, 2),
        "server_cpu_us_per_delivery": round(server_cpu / len(latencies) * 1e6, 1) if latencies else None,
        "client_cpu_s": round(client_cpu, 2),
        "wal": args.wal,
        "cpus": os.cpu_count(),
        "loadavg_1min_before": args.loadavg_before,
    }


def run_once(args: argparse.Namespace, callgrind: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(Path(tmp), args.wal, args.profile, args.server_root.resolve(), callgrind)
        try:
            args.loadavg_before = round(os.getloadavg()[0], 2)
            return run(args, port, proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120 if callgrind is not None else 20)
            except subprocess.TimeoutExpired:
                proc.kill()


def instructions_per_delivery(args: argparse.Namespace) -> dict:
    """Two runs under callgrind that differ only in the number of messages: the difference in
    the server's instructions, per extra delivery (the sends and commits of the extra messages
    included, each shared by every listener). Independent of the machine's load."""
    totals, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for messages in (args.messages, 2 * args.messages):
            args.messages = messages
            out = Path(tmp) / f"callgrind.{messages}"
            results.append(run_once(args, out))
            summary = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
            if summary is None:
                raise RuntimeError("no callgrind summary")
            totals.append(int(summary.group(1)))
    extra = results[1]["deliveries"] - results[0]["deliveries"]
    return {
        **results[1],
        "p50_ms": None, "p99_ms": None, "max_ms": None, "spread_p50_ms": None, "spread_p99_ms": None,
        "callgrind_instructions": totals,
        "server_instructions_per_delivery": round((totals[1] - totals[0]) / extra) if extra else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["ws", "longpoll"], default="ws")
    parser.add_argument("--listeners", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between sends")
    parser.add_argument("--wal", default="fsync", choices=["fsync", "write", "none"])
    parser.add_argument("--client", choices=["websockets", "raw"], default="websockets",
                        help="WebSocket listeners on the websockets library, or on a minimal raw reader")
    parser.add_argument("--no-deflate", dest="deflate", action="store_false",
                        help="raw client: do not offer permessage-deflate")
    parser.add_argument("--client-procs", type=int, default=1, help="listener processes")
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--receipts", help="write every listener's receipts (sequence, got, sent) here")
    parser.add_argument("--profile", help="run the server under cProfile and write its stats here")
    parser.add_argument("--server-root", type=Path, default=ROOT,
                        help="the checkout whose server runs (with its own .venv), to compare versions")
    parser.add_argument("--callgrind", action="store_true",
                        help="run the server under valgrind's callgrind twice (--messages, then twice as many)"
                             " and report its instructions per extra delivery")
    args = parser.parse_args()
    result = instructions_per_delivery(args) if args.callgrind else run_once(args)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["missing"] == 0 and result["duplicated"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
