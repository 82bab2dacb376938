#!/usr/bin/env python3
"""Zaqar v1.1 post -> claim -> delete cycle over HTTP, end to end (messages/s).

Starts a boxqueue server (wal fsync by default) with the Zaqar facade in a temporary directory,
then runs ``--clients`` concurrent HTTP clients spread over ``--procs`` worker processes. Each
client repeats: POST ``--batch`` messages to its queue, claim them (``limit=--batch``), DELETE
each with its claim id. The headline is messages deleted per second in the measured window,
with p50/p99 of the whole cycle.

    .venv/bin/python bench/zaqar_cycle.py --clients 16 --seconds 10

``--url`` drives an already running server instead (no boxqueue is started), for instance real
OpenStack Zaqar started by ``bench/real_zaqar.sh``:

    .venv/bin/python bench/zaqar_cycle.py --url http://127.0.0.1:8888 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from multiprocessing import get_context
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.serverproc import ServerProcess, free_port


async def client_loop(base: str, queue: str, batch: int, until: float, warmup_end: float) -> tuple[int, list[float]]:
    headers = {"Client-ID": str(uuid.uuid4()), "X-Project-ID": "bench"}
    done, cycles = 0, []
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as c:
        msgs = {"messages": [{"body": {"n": i, "payload": "x" * 64}, "ttl": 300} for i in range(batch)]}
        while time.monotonic() < until:
            started = time.monotonic()
            r = await c.post(f"/v1.1/queues/{queue}/messages", json=msgs)
            r.raise_for_status()
            r = await c.post(f"/v1.1/queues/{queue}/claims?limit={batch}", json={"ttl": 60, "grace": 60})
            if r.status_code != 201:
                continue
            for m in r.json()["messages"]:
                d = await c.delete(m["href"])
                if d.status_code != 204:
                    raise RuntimeError(f"delete answered {d.status_code}: {d.text}")
                if started >= warmup_end:
                    done += 1
            if started >= warmup_end:
                cycles.append(time.monotonic() - started)
    return done, cycles


def worker(base: str, clients: int, offset: int, batch: int, until: float, warmup_end: float, out) -> None:
    async def main() -> None:
        results: list[tuple[int, list[float]]] = []

        async def one(i: int) -> None:
            results.append(await client_loop(base, f"bench{offset + i}", batch, until, warmup_end))

        async with trio.open_nursery() as nursery:
            for i in range(clients):
                nursery.start_soon(one, i)
        out.put((sum(d for d, _ in results), [c for _, cs in results for c in cs]))

    trio.run(main)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(base: str, args: argparse.Namespace, server_pid: int | None = None) -> tuple[list[tuple[int, list[float]]], float | None]:
    """Run the client processes against ``base``; each one's (deleted, cycle times), and the
    server's CPU seconds over the measured window when its pid is given."""
    ctx = get_context("spawn")
    out = ctx.Queue()
    start = time.monotonic() + 1.0  # let the workers start
    warmup_end = start + args.warmup
    until = warmup_end + args.seconds
    per = [args.clients // args.procs + (1 if i < args.clients % args.procs else 0) for i in range(args.procs)]
    procs, offset = [], 0
    for n in per:
        p = ctx.Process(target=worker, args=(base, n, offset, args.batch, until, warmup_end, out))
        p.start()
        procs.append(p)
        offset += n
    cpu = None
    if server_pid is not None:
        time.sleep(max(0.0, warmup_end - time.monotonic()))
        cpu0 = _cpu_s(server_pid)
        time.sleep(max(0.0, until - time.monotonic()))
        cpu = _cpu_s(server_pid) - cpu0
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return results, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--batch", type=int, default=1, help="messages per post and claim")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--wal", default="fsync", choices=["fsync", "write", "none"])
    parser.add_argument("--json", type=Path, help="write the result here too")
    parser.add_argument("--url", help="drive this Zaqar endpoint (http://host:port) instead of starting boxqueue")
    args = parser.parse_args()
    cpu = None
    if args.url:
        results, _ = run_load(args.url.rstrip("/"), args)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            http_port = free_port()
            server = ServerProcess(Path(tmp), extra_config=f'[zaqar]\nlisten = "127.0.0.1:{http_port}"\n',
                                   wal_mode=args.wal, read_only=False)
            server.start()
            try:
                results, cpu = run_load(f"http://127.0.0.1:{http_port}", args, server.proc.pid if server.proc else None)
            finally:
                server.stop()
    done = sum(d for d, _ in results)
    cycles = sorted(c for _, cs in results for c in cs)
    result = {
        "clients": args.clients, "batch": args.batch, **({"url": args.url} if args.url else {"wal": args.wal}),
        "seconds": args.seconds,
        "messages_per_s": round(done / args.seconds, 1),
        "cycle_p50_ms": round(statistics.median(cycles) * 1000, 1) if cycles else None,
        "cycle_p99_ms": round(cycles[int(len(cycles) * 0.99) - 1] * 1000, 1) if cycles else None,
        **({"server_cpu_us_per_message": round(cpu * 1e6 / done)} if cpu is not None and done else {}),
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
