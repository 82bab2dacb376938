"""A Spark driver of its own for the streaming tests (test_spark_streaming.py kills it with kill -9):
one query that moves a tube's tasks (their first data field) into another tube, from a checkpoint.

    python -m tests.integration.stream_driver --uri HOST:PORT --source S --target T --checkpoint DIR
        [--available-now] [--max-tasks N] [--per-partition N] [--claim-ttl S]

Runs until killed, or with ``--available-now`` until the source has nothing left that was put
before it started. Prints ``started`` once the query runs and ``batch N rows M`` after each batch.
"""

from __future__ import annotations

import argparse
import sys

from tests.integration.spark_fixtures import spark_session


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uri", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--max-tasks", default="10000")
    parser.add_argument("--per-partition", default="5000")
    parser.add_argument("--claim-ttl", default="300")
    args = parser.parse_args(argv)

    from boxqueue.pipeline.spark import register

    spark = spark_session()
    register(spark)
    tasks = (spark.readStream.format("boxqueue").option("uri", args.uri).option("tube", args.source)
             .option("queue_space", "0").option("maxTasksPerTrigger", args.max_tasks)
             .option("tasksPerPartition", args.per_partition).option("claimTtl", args.claim_ttl).load())
    writer = (tasks.selectExpr("value").writeStream.format("boxqueue").option("uri", args.uri)
              .option("tube", args.target).option("queue_space", "0").option("checkpointLocation", args.checkpoint))
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="0 seconds")
    query = writer.start()
    print("started", flush=True)
    seen = -1
    while query.isActive:
        progress = query.lastProgress
        if progress is not None and progress["batchId"] != seen:
            seen = progress["batchId"]
            print(f"batch {seen} rows {progress['numInputRows']}", flush=True)
        query.awaitTermination(0.5)
    query.awaitTermination()  # raises what ended it, if anything did
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
