#!/usr/bin/env python3
"""Tasks/s of each step a Spark stream asks of the server, without Spark: put_many, stream_claim,
stream_read and stream_ack, one connection, one call at a time, in a box.queue space (the 1.5
layout, four LMDB indexes) and in a tarantool/queue tube (the tube layout, one index).

Starts a server of its own (a temporary directory, a free loopback port).

    .venv/bin/python bench/stream_phases.py                   # 200,000 tasks, wal fsync
    .venv/bin/python bench/stream_phases.py --tasks 100000 --chunk 5000 --wal write

The source's own rate is bounded by 1 / (1/claim + 1/read + 1/ack), a tube write's by put_many's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tarantool  # noqa: E402

from tests.integration.queue_fixtures import QUEUE_SPACE_0  # noqa: E402
from tests.serverproc import ServerProcess  # noqa: E402


def phases(conn: tarantool.Connection, space: int, tube: str, tasks: int, chunk: int) -> dict[str, int]:
    spent = dict.fromkeys(("put_many", "claim", "read", "ack"), 0.0)
    for first in range(0, tasks, chunk):
        rows = [[0, 0, 0, 0, f"task-{i}"] for i in range(first, min(tasks, first + chunk))]
        started = time.perf_counter()
        conn.call("boxqueue.put_many", [space, tube, rows])
        spent["put_many"] += time.perf_counter() - started
    for batch in range(tasks // chunk + 1):
        claim = f"bench.{batch}.0"
        started = time.perf_counter()
        held = conn.call("boxqueue.stream_claim", [space, tube, claim, chunk, 300]).data[0]
        spent["claim"] += time.perf_counter() - started
        if not held:
            break
        started = time.perf_counter()
        conn.call("boxqueue.stream_read", [space, tube, claim, 0, chunk])
        spent["read"] += time.perf_counter() - started
        started = time.perf_counter()
        conn.call("boxqueue.stream_ack", [space, tube, [claim]])
        spent["ack"] += time.perf_counter() - started
    rates = {name: round(tasks / seconds) for name, seconds in spent.items()}
    rates["source"] = round(tasks / (spent["claim"] + spent["read"] + spent["ack"]))
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=10_000, help="tasks a call (a claim, a put_many)")
    parser.add_argument("--wal", default="fsync", choices=("fsync", "write", "none"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="stream-phases-"))
    server = ServerProcess(workdir, extra_config=QUEUE_SPACE_0,
                           wal_mode=args.wal, read_only=False)
    server.start()
    try:
        conn = tarantool.Connection("127.0.0.1", server.port)
        conn.eval("queue.create_tube(..., 'fifo')", ["jobs"])
        tube_space = conn.eval("return box.space.jobs.id").data[0]
        for what, space, tube in (("box.queue space", 0, "bench"), ("tarantool/queue tube", tube_space, "jobs")):
            rates = phases(conn, space, tube, args.tasks, args.chunk)
            print(f"{what:>21}: " + ", ".join(f"{name} {rate:,}/s" for name, rate in rates.items()), flush=True)
        conn.close()
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
