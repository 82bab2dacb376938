#!/usr/bin/env python3
"""Rows/s of the Spark data source: write, then read back, N rows of a two-field space.

Starts a boxqueue server of its own (a temporary directory, a free loopback port) and a local
Spark session, then times four jobs end to end, as a user would see them, ``--runs`` times each
(the first run of a job in a session pays for the JVM's warm-up and the Python workers' start):

* write: ``spark.range(N)`` as (id, payload) into the space, mode append (REPLACE, batch_size rows
  a request);
* read: the whole space through the ``noop`` sink (every column materialised, nothing kept);
* tube: ``--tube-rows`` rows into a tube (box.queue.put's semantics, batch_size rows a request), and
  the server's CPU time a row;
* stream: ``--stream-tasks`` tasks put into a tube, then ``spark.readStream`` of the tube into the
  ``noop`` sink with Trigger.AvailableNow: tasks over the query's time, the batches' own rate
  and where their time went (durationMs) from StreamingQueryProgress, and the server's CPU time a
  task (0 to skip).

    .venv/bin/python bench/spark_pipeline.py --master 'local[2]'      # 1,000,000 rows
    .venv/bin/python bench/spark_pipeline.py --rows 200000 --partitions 4 --wal write

Each time includes Spark's job start-up; see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.serverproc import ServerProcess  # noqa: E402

SPACES = """
[[space]]
id = 0
name = "queue"
format = [
  { name = "id", type = "string" }, { name = "tube", type = "string" },
  { name = "status", type = "string" }, { name = "event", type = "unsigned" },
  { name = "ipri", type = "unsigned" }, { name = "pri", type = "unsigned" },
  { name = "cid", type = "unsigned" }, { name = "created", type = "unsigned" },
  { name = "ttl", type = "unsigned" }, { name = "ttr", type = "unsigned" },
  { name = "cbury", type = "unsigned" }, { name = "ctaken", type = "unsigned" },
]
indexes = [
  { name = "task_id", type = "TREE", unique = true, parts = [[0, "string"]] },
  { name = "tube_status", type = "TREE", unique = false, parts = [
    [1, "string"], [2, "string"], [4, "unsigned"], [5, "unsigned"],
  ] },
  { name = "tube_event", type = "TREE", unique = false, parts = [[1, "string"], [3, "unsigned"]] },
]

[[space]]
id = 700
name = "bench"
format = [{ name = "id", type = "unsigned" }, { name = "payload", type = "string" }]
indexes = [{ name = "primary", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] }]
"""


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tube-rows", type=int, default=200_000)
    parser.add_argument("--stream-tasks", type=int, default=500_000)
    parser.add_argument("--max-tasks", default="100000", help="option maxTasksPerTrigger of the stream")
    parser.add_argument("--per-partition", default="25000", help="option tasksPerPartition of the stream")
    parser.add_argument("--runs", type=int, default=2, help="times each job runs in the one session")
    parser.add_argument("--partitions", type=int, default=2, help="Spark partitions for writing and reading")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--wal", default="fsync", choices=("fsync", "write", "none"))
    parser.add_argument("--depth", default="512", help="option pipeline_depth")
    parser.add_argument("--batch-size", default="1000", help="option batch_size")
    parser.add_argument("--json", help="also write the results to this file")
    return parser.parse_args()


def timed(what: str, rows: int, job) -> dict:
    started = time.perf_counter()
    extra = job() or {}
    seconds = time.perf_counter() - started
    result = {"job": what, "rows": rows, "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds), **extra}
    shown = "".join(f", {k} {v}" for k, v in extra.items())
    print(f"{what:>6}: {rows:>9,} rows in {seconds:7.2f} s = {rows / seconds:>9,.0f} rows/s{shown}", flush=True)
    return result


def fill_tube(uri: str, tube: str, count: int) -> None:
    import tarantool

    host, port = uri.split(":")
    conn = tarantool.Connection(host, int(port))
    for first in range(0, count, 10_000):
        rows = [[0, 0, 0, 0, f"task-{i}"] for i in range(first, min(count, first + 10_000))]
        conn.call("boxqueue.put_many", [0, tube, rows])
    conn.close()


checkpoints: list[str] = []  # the streams' checkpoint folders, removed at the end


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tube_write(tasks, uri: str, tube: str, args: argparse.Namespace, server_pid: int) -> dict:
    """The frame's rows put into ``tube``; the server's CPU time a row (µs) over the job."""
    cpu_before = cpu_seconds(server_pid)
    (tasks.write.format("boxqueue").option("uri", uri).option("tube", tube)
     .option("pipeline_depth", args.depth).option("batch_size", args.batch_size).mode("append").save())
    return {"server_us_a_row": round((cpu_seconds(server_pid) - cpu_before) * 1e6 / args.tube_rows, 1)}


def stream(spark, uri: str, tube: str, args: argparse.Namespace, server_pid: int) -> dict:
    """The tube read as a stream into noop until empty; the batches' own rate from their progress,
    and the server's CPU time a task (µs) over the query."""
    cpu_before = cpu_seconds(server_pid)
    checkpoint = tempfile.mkdtemp(prefix="spark-bench-checkpoint-")
    checkpoints.append(checkpoint)
    query = (spark.readStream.format("boxqueue").option("uri", uri).option("tube", tube)
             .option("maxTasksPerTrigger", args.max_tasks).option("tasksPerPartition", args.per_partition).load()
             .writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    rates = [round(p["processedRowsPerSecond"]) for p in batches]
    # Where a batch's time went (durationMs, summed over the batches): latestOffset is the
    # driver's claims (and the ack of the batch before), addBatch the executors' reads.
    phases = {key: sum(p["durationMs"].get(key, 0) for p in batches)
              for key in ("triggerExecution", "latestOffset", "addBatch", "commitOffsets", "walCommit")}
    tasks = sum(p["numInputRows"] for p in batches)
    server_us = round((cpu_seconds(server_pid) - cpu_before) * 1e6 / max(tasks, 1), 1)
    return {"batches": len(batches), "batch_rates": rates, "ms": phases, "server_us_a_task": server_us}


def main() -> int:
    args = parse()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from boxqueue.pipeline.spark import register

    workdir = Path(tempfile.mkdtemp(prefix="spark-bench-"))  # (about 900 MB after a default run)
    server = ServerProcess(workdir, extra_config=SPACES,
                           wal_mode=args.wal, read_only=False)
    server.start()
    spark = (
        SparkSession.builder.master(args.master).appName("boxqueue pipeline bench")
        .config("spark.ui.enabled", "false").config("spark.driver.memory", "2g").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    uri = f"127.0.0.1:{server.port}"
    results = []
    try:
        for run in range(args.runs):
            frame = spark.range(args.rows, numPartitions=args.partitions).selectExpr(
                "id", "concat('payload-', id) as payload")
            results.append(timed("write", args.rows, lambda frame=frame: (
                frame.write.format("boxqueue").option("uri", uri).option("space", "bench")
                .option("pipeline_depth", args.depth).option("batch_size", args.batch_size).mode("append").save())))
            source = (spark.read.format("boxqueue").option("uri", uri).option("space", "bench")
                      .option("partitions", str(args.partitions)).option("batch_size", args.batch_size))
            results.append(timed("read", args.rows, lambda source=source: (
                source.load().write.format("noop").mode("overwrite").save())))
            if args.tube_rows:
                tasks = spark.range(args.tube_rows, numPartitions=args.partitions).selectExpr(
                    "concat('task-', id) as payload")
                results.append(timed("tube", args.tube_rows, lambda tasks=tasks, run=run: tube_write(
                    tasks, uri, f"bench{run}", args, server.proc.pid)))
            if args.stream_tasks:
                fill_tube(uri, f"events{run}", args.stream_tasks)
                results.append(timed("stream", args.stream_tasks, lambda run=run: stream(
                    spark, uri, f"events{run}", args, server.proc.pid)))
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        for checkpoint in checkpoints:
            shutil.rmtree(checkpoint, ignore_errors=True)
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()},
        "options": vars(args),
        "results": results,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
