#!/usr/bin/env python3
"""Deckard Add -> Pull -> Ack cycle over gRPC, end to end.

Starts boxqueue with the Deckard facade in a temporary directory (wal fsync unless told), then
runs ``--clients`` concurrent clients spread over ``--procs`` processes; each client is a
coroutine on a grpc.aio channel of its own that loops: Add one message to the shared queue, Pull
one message from it, Ack what it pulled. A Pull that finds nothing (another client took the
message) is retried and counted as empty. The headline is cycles/s: Acks answered with
success in the measured window; latencies are of whole cycles.

Then, on the same server (unless ``--no-box-queue``), the box.queue cycle with as many sequential
clients of its own protocol (bench/queue_cycle.py's ``--sequential`` clients: the `tarantool`
connector calling put, take and ack one after another), and the ratio of the two cycles' server
CPU (box.queue's over Deckard's: issue 19's measure of Deckard's pace).

    .venv/bin/python bench/deckard_cycle.py [--clients 16] [--duration 10] [--wal fsync]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _clients(port: int, count: int, queue: str, start_at: float, measure_from: float, stop_at: float) -> dict:
    import grpc

    from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
    from boxqueue.facades.deckard.generated import deckard_service_pb2_grpc as pb_grpc

    latencies: list[float] = []
    done = empty = errors = 0

    async def client(n: int) -> None:
        nonlocal done, empty, errors
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.DeckardStub(channel)
            await channel.channel_ready()
            while time.time() < start_at:
                await asyncio.sleep(0.01)
            i = 0
            while (now := time.time()) < stop_at:
                i += 1
                try:
                    await stub.Add(pb.AddRequest(messages=[
                        pb.AddMessage(id=f"{os.getpid()}-{n}-{i}", queue=queue, string_payload="payload " * 8)
                    ]))
                    while True:
                        pulled = (await stub.Pull(pb.PullRequest(queue=queue, amount=1))).messages
                        if pulled:
                            break
                        empty += 1
                    acked = await stub.Ack(pb.AckRequest(queue=queue, id=pulled[0].id, removeMessage=True))
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                if now >= measure_from and acked.success:
                    done += 1
                    latencies.append(time.time() - now)

    await asyncio.gather(*(client(n) for n in range(count)))
    return {"done": done, "empty": empty, "errors": errors, "latencies": latencies}


def _worker(args: tuple) -> dict:
    return asyncio.run(_clients(*args))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--wal", default="fsync", choices=("fsync", "write", "none"))
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--no-box-queue", action="store_true",
        help="skip the box.queue cycle on the same server (16 sequential `tarantool` connector clients)",
    )
    args = parser.parse_args()
    box_queue = None

    with tempfile.TemporaryDirectory(prefix="deckard-bench-") as workdir:
        iproto, grpc_port = free_port(), free_port()
        config = Path(workdir) / "boxqueue.toml"
        from queue_cycle import measure_sequential, queue_space_toml

        config.write_text(
            f'data_dir = "data"\n[iproto]\nlisten = "127.0.0.1:{iproto}"\n[wal]\nmode = "{args.wal}"\n'
            f'[deckard]\nlisten = "127.0.0.1:{grpc_port}"\n\n{queue_space_toml()}'
        )
        log = open(Path(workdir) / "server.log", "wb")  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(config), "--log-level", "WARNING"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            import grpc

            channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
            grpc.channel_ready_future(channel).result(timeout=60)
            channel.close()
            start_at = time.time() + 1.0
            measure_from = start_at + args.warmup
            stop_at = measure_from + args.duration
            per_proc = [args.clients // args.procs + (1 if i < args.clients % args.procs else 0) for i in range(args.procs)]
            jobs = [(grpc_port, n, "bench::cycle", start_at, measure_from, stop_at) for n in per_proc if n]
            with get_context("spawn").Pool(len(jobs)) as pool:
                pending = pool.map_async(_worker, jobs)
                time.sleep(max(0.0, measure_from - time.time()))
                cpu_begin = process_cpu_s(server.pid)
                time.sleep(max(0.0, stop_at - time.time()))
                server_cpu_s = process_cpu_s(server.pid) - cpu_begin
                results = pending.get(timeout=args.duration + args.warmup + 120)
            if not args.no_box_queue:
                box_queue = measure_sequential(iproto, args.wal, argparse.Namespace(
                    sequential=args.clients, procs=args.procs, payload=64, take_timeout=1.0,
                    warmup=args.warmup, duration=args.duration,
                ), server.pid)
        finally:
            server.terminate()
            server.wait(30)
            log.close()

    latencies = sorted(x for r in results for x in r["latencies"])
    done = sum(r["done"] for r in results)

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")

    summary = {
        "clients": args.clients,
        "procs": args.procs,
        "wal": args.wal,
        "duration_s": args.duration,
        "cycles_per_s": done / args.duration,
        "cycle_p50_ms": pct(0.50),
        "cycle_p99_ms": pct(0.99),
        "empty_pulls": sum(r["empty"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "server_cpu_us_per_cycle": server_cpu_s * 1e6 / done if done else float("nan"),
        "cpus": os.cpu_count(),
    }
    if box_queue is not None:
        summary["box_queue_cycles_per_s"] = box_queue.tasks_per_s
        summary["box_queue_server_cpu_us_per_cycle"] = box_queue.server_cpu_us_per_task
        summary["box_queue_errors"] = box_queue.errors + (1 if box_queue.failure else 0)
        summary["cpu_ratio_box_queue_over_deckard"] = (
            box_queue.server_cpu_us_per_task / summary["server_cpu_us_per_cycle"]
        )
    print(
        f"{summary['cycles_per_s']:.0f} Add+Pull+Ack cycles/s with {args.clients} clients (wal {args.wal}); "
        f"cycle p50 {summary['cycle_p50_ms']:.1f} ms, p99 {summary['cycle_p99_ms']:.1f} ms; "
        f"{summary['empty_pulls']} empty pulls, {summary['errors']} errors; "
        f"server CPU {summary['server_cpu_us_per_cycle']:.0f} us per cycle"
    )
    if box_queue is not None:
        print(
            f"box.queue put+take+ack on the same server, {args.clients} sequential `tarantool` connector clients: "
            f"{box_queue.tasks_per_s:.0f} cycles/s, server CPU {box_queue.server_cpu_us_per_task:.0f} us per cycle"
            f"{'; FAILED: ' + box_queue.failure if box_queue.failure else ''}; "
            f"box.queue's CPU per cycle over Deckard's: {summary['cpu_ratio_box_queue_over_deckard']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0 if summary["errors"] == 0 and not summary.get("box_queue_errors") else 1


if __name__ == "__main__":
    sys.exit(main())
