"""Memory per queued task and restart time, measured as an operator would (issue 36).

For each target, one server in a temporary directory (``wal`` mode ``write`` by default):
``--tasks`` ready tasks of ``--payload`` bytes are put over iproto, pipelined (boxqueue:
``box.queue.put`` into space 0; Tarantool: tarantool/queue's ``queue.tube.t:put`` on a ``fifottl``
tube, as ``bench/queue_cycle.py`` starts it). The process's anonymous memory (``RssAnon`` in
``/proc/PID/status``) is read after a warm-up of ``--warmup`` tasks and after the rest, and the
growth divided by the tasks between. Then the server is stopped (SIGTERM) and started again on the
same directory, timed to its first served answer (a SELECT) and to statistics that count every
task.

    .venv/bin/python bench/queue_memory.py --target both --queue-module ../shared/anchors/queue

Prints one row per target and their ratios; ``--json FILE`` writes them too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from iproto_load import KEY_ERROR_24, REQ_CALL, SyncClient, machine_info
from queue_cycle import QueueServer, call_body, put_body, queue_statistics


def rss_anon(pid: int) -> int:
    """Anonymous resident memory of ``pid``, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc status")


def put_tasks(port: int, count: int, payload: int, target: str, batch: int = 2000) -> None:
    body = put_body(payload, target)
    with SyncClient(port, timeout=120.0) as client:
        done = 0
        while done < count:
            n = min(batch, count - done)
            answers = client.batch([(REQ_CALL, body)] * n)
            bad = [(code, answer) for code, answer in answers if code]
            if bad:
                code, answer = bad[0]
                raise RuntimeError(f"put failed: 0x{code:x} {answer.get(KEY_ERROR_24)}")
            done += n


def stored_tasks(port: int, target: str) -> int | None:
    """The tasks the server holds: box.queue's space 0, or tarantool/queue's statistics."""
    if target != "ours":
        return queue_statistics(port, target).total
    with SyncClient(port, timeout=60.0) as client:
        [(code, body)] = client.batch([(REQ_CALL, call_body("box.space.queue:len", []))])
    return body.get(0x30, [None])[0] if code == 0 else None


def data_bytes(root: Path) -> int:
    """Bytes the server's files take on disk (allocated blocks, not sparse sizes)."""
    total = 0
    for path in root.rglob("*"):
        if path.is_file() and path.name != "server.log":
            total += path.stat().st_blocks * 512
    return total


def measure(target: str, args: argparse.Namespace) -> dict[str, Any]:
    server = QueueServer(target, args.wal, args)
    server.start(timeout=60.0)
    try:
        if target == "ours":
            with SyncClient(server.port) as client:  # the tube exists before the warm-up counts
                client.batch([(REQ_CALL, call_body("box.queue.statistics", [0]))])
        put_tasks(server.port, args.warmup, args.payload, target)
        assert server.proc is not None
        before = rss_anon(server.proc.pid)
        started = time.perf_counter()
        put_tasks(server.port, args.tasks, args.payload, target)
        put_s = time.perf_counter() - started
        time.sleep(1.0)
        after = rss_anon(server.proc.pid)
        disk = data_bytes(server.tmp)
        total = args.warmup + args.tasks
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=120)
        started = time.perf_counter()
        server.start(timeout=600.0)
        restart_s = time.perf_counter() - started
        # Then until the statistics count every task (the engine may still be recovering them).
        # (box.queue's statistics start empty in a new process, as 1.5's do: the space is counted.)
        while True:
            found = stored_tasks(server.port, target)
            if found == total:
                break
            if time.perf_counter() - started > 600:
                raise RuntimeError(f"{target}: {found} tasks after the restart, not {total}")
            time.sleep(0.05)
        counted_s = time.perf_counter() - started
        if args.show_log:
            print(f"[{target}] server log of the restart:\n{server.log_tail(args.show_log)}")
        return {
            "target": target,
            "tasks": total,
            "heap_bytes_per_task": (after - before) / args.tasks,
            "rss_anon_mb": after / 2**20,
            "disk_bytes_per_task": disk / total,
            "put_tasks_per_s": args.tasks / put_s,
            "restart_s": restart_s,
            "tasks_counted_s": counted_s,
        }
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=("ours", "tarantool", "both"), default="ours")
    parser.add_argument("--tasks", type=int, default=1_000_000, help="tasks measured (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=20_000)
    parser.add_argument("--payload", type=int, default=100, help="bytes of task data")
    parser.add_argument("--wal", default="write", choices=("fsync", "write", "none"))
    parser.add_argument("--tarantool-bin", default="tarantool")
    parser.add_argument("--queue-module", type=Path, help="the folder holding tarantool/queue's queue/init.lua")
    parser.add_argument("--memtx-memory", type=int, default=2 * 1024**3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--show-log", type=int, default=0, metavar="LINES",
                        help="print the last LINES lines of each server's log after its restart")
    args = parser.parse_args()
    args.metrics = False
    targets = ("ours", "tarantool") if args.target == "both" else (args.target,)
    if "tarantool" in targets and args.queue_module is None:
        parser.error("--queue-module is needed for Tarantool")
    rows = [measure(target, args) for target in targets]
    print(f"{'target':<10} {'tasks':>9} {'heap B/task':>12} {'RssAnon MB':>11} {'disk B/task':>12} "
          f"{'puts/s':>9} {'restart s':>10} {'counted s':>10}")
    for row in rows:
        print(f"{row['target']:<10} {row['tasks']:>9,} {row['heap_bytes_per_task']:>12,.0f} {row['rss_anon_mb']:>11,.0f} "
              f"{row['disk_bytes_per_task']:>12,.0f} {row['put_tasks_per_s']:>9,.0f} {row['restart_s']:>10.2f} "
              f"{row['tasks_counted_s']:>10.2f}")
    if len(rows) == 2:
        ours, theirs = rows
        print(f"heap per task, ours / Tarantool: {ours['heap_bytes_per_task'] / theirs['heap_bytes_per_task']:.2f}x; "
              f"restart: {ours['restart_s']:.2f} s against {theirs['restart_s']:.2f} s")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "machine": machine_info(),
                                         "pid": os.getpid(), "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
