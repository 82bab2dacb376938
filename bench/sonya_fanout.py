#!/usr/bin/env python3
"""Sonya fan-out: one sender, many concurrent listeners, delivery latency.

Starts boxqueue with a [sonya] section in a temporary directory on free loopback ports, opens
``--listeners`` WebSocket or long-poll listeners on one (queue, id), then sends ``--messages``
messages, one every ``--interval`` seconds, each carrying its send time. Every listener records
when each message reached it; the report is the delivery latency (receive time minus the time
just before the send request) over all (listener, message) pairs, p50/p99/max, and how many
deliveries were missing or duplicated (there should be none: long-poll listeners resume with
``sequence=<last + 1>``).

The listeners run in one asyncio process (websockets / httpx) on the same machine as the
server, so the figures include the client's own work on the shared CPUs.

    .venv/bin/python bench/sonya_fanout.py --mode ws --listeners 1000
    .venv/bin/python bench/sonya_fanout.py --mode longpoll --listeners 1000 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import websockets

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir: Path, wal: str) -> tuple[subprocess.Popen, int]:
    http_port, iproto_port = free_port(), free_port()
    config = workdir / "boxqueue.toml"
    config.write_text(
        f'data_dir = "data"\n[iproto]\nlisten = "127.0.0.1:{iproto_port}"\n[wal]\nmode = "{wal}"\n'
        f'[sonya]\nlisten = "127.0.0.1:{http_port}"\nmax_key_updates = 100\nlongpoll_max_wait_s = 60\n'
    )
    log = open(workdir / "server.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(config)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
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
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def ws_listener(url: str, count: int, out: list[tuple[int, float]], ready: asyncio.Event, opened: list[int]) -> None:
    async with websockets.connect(url, max_queue=None, open_timeout=120, ping_interval=None) as ws:
        opened[0] += 1
        if opened[0] == opened[1]:
            ready.set()
        for _ in range(count):
            frame = await ws.recv()
            now = time.time()
            m = json.loads(frame)
            out.append((m["sequence"], now - m["payload"]["t"]))


async def longpoll_listener(port: int, path: str, count: int, out: list[tuple[int, float]], start_seq: int) -> None:
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
                out.append((m["sequence"], now - m["payload"]["t"]))
                next_seq = m["sequence"] + 1
    finally:
        writer.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args: argparse.Namespace, port: int, server_pid: int) -> dict:
    base = f"http://127.0.0.1:{port}"
    results: list[list[tuple[int, float]]] = [[] for _ in range(args.listeners)]
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        assert (await client.post("/queue/create/bench")).status_code == 201
        # A first message, so long-poll listeners can start from sequence 2 without a race.
        await client.post("/queue/send/bench", json={"id": "k", "payload": {"t": time.time()}})
        ready = asyncio.Event()
        opened = [0, args.listeners]
        tasks = []
        for i in range(args.listeners):
            if args.mode == "ws":
                url = f"ws://127.0.0.1:{port}/queue/listen/ws/bench/k"
                tasks.append(asyncio.create_task(ws_listener(url, args.messages, results[i], ready, opened)))
            else:
                tasks.append(asyncio.create_task(
                    longpoll_listener(port, "/queue/listen/longpoll/bench/k", args.messages, results[i], 2)
                ))
        if args.mode == "ws":
            await asyncio.wait_for(ready.wait(), 300)
        else:
            await asyncio.sleep(max(2.0, args.listeners / 500))  # let the polls reach the server
        t0 = time.monotonic()
        server_cpu0, client_cpu0 = cpu_seconds(server_pid), time.process_time()
        async with httpx.AsyncClient(base_url=base, timeout=60) as sender:
            for _ in range(args.messages):
                r = await sender.post("/queue/send/bench", json={"id": "k", "payload": {"t": time.time()}})
                assert r.json()["success"], r.text
                await asyncio.sleep(args.interval)
        done, pending = await asyncio.wait(tasks, timeout=120)
        for t in pending:
            t.cancel()
        for t in done:
            if t.exception() is not None:
                print("listener failed:", repr(t.exception()), file=sys.stderr)
        elapsed = time.monotonic() - t0
        server_cpu, client_cpu = cpu_seconds(server_pid) - server_cpu0, time.process_time() - client_cpu0
    latencies = [lat for r in results for _, lat in r]
    expected = list(range(2, 2 + args.messages))
    missing = sum(len(set(expected) - {s for s, _ in r}) for r in results)
    duplicated = sum(len(r) - len({s for s, _ in r}) for r in results)
    return {
        "mode": args.mode,
        "listeners": args.listeners,
        "messages": args.messages,
        "deliveries": len(latencies),
        "missing": missing,
        "duplicated": duplicated,
        "p50_ms": round(percentile(latencies, 50) * 1000, 1) if latencies else None,
        "p99_ms": round(percentile(latencies, 99) * 1000, 1) if latencies else None,
        "max_ms": round(max(latencies) * 1000, 1) if latencies else None,
        "seconds": round(elapsed, 1),
        "server_cpu_s": round(server_cpu, 1),
        "client_cpu_s": round(client_cpu, 1),
        "wal": args.wal,
        "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["ws", "longpoll"], default="ws")
    parser.add_argument("--listeners", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between sends")
    parser.add_argument("--wal", default="fsync", choices=["fsync", "write", "none"])
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(Path(tmp), args.wal)
        try:
            result = asyncio.run(run(args, port, proc.pid))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["missing"] == 0 and result["duplicated"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
