"""Count a tube's events in time windows, continuously, into another tube.

Each task of the source tube is an event: its first data field names it (``"click"``, say), its
creation time places it in a window. Once a window is over (the newest event seen is more than
``--watermark`` past its end), a task ``[window start, window end, event, count]`` per event of
that window goes into the target tube, once (Spark's append output mode). The source's tasks are
acked once their batch is committed; a restart from the same ``--checkpoint`` goes on where it
stopped, and counts nothing twice.

    spark-submit --master 'local[2]' boxqueue/pipeline/examples/event_windows.py \\
        --source events --target event_counts --checkpoint /tmp/event_windows

``--available-now`` stops once the tasks there were at the start are counted.
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from boxqueue.pipeline.spark import register


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="127.0.0.1:33020", help="the server (host:port,host:port for a replica set)")
    parser.add_argument("--queue-space", default="0", help="the queue space of both tubes, by name or id")
    parser.add_argument("--source", required=True, help="the tube of events")
    parser.add_argument("--target", required=True, help="the tube the counts go to")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint folder")
    parser.add_argument("--window", default="1 minute", help="the windows' length, as Spark reads it")
    parser.add_argument("--watermark", default="10 seconds", help="how late an event may come for its window")
    parser.add_argument("--max-tasks", default="100000", help="tasks a micro-batch takes at most")
    parser.add_argument("--shuffle-partitions", default="4", help="partitions of the counts (kept in the checkpoint)")
    parser.add_argument("--available-now", action="store_true", help="stop once the events there now are counted")
    return parser.parse_args(argv)


def counts(events: DataFrame, window: str, watermark: str) -> DataFrame:
    """(window start, window end, event, count) of a stream of tasks, for the windows that are over."""
    windowed = (events.withWatermark("created", watermark)
                .groupBy(F.window("created", window).alias("w"), F.col("value").alias("event")).count())
    return windowed.select(
        F.date_format("w.start", "yyyy-MM-dd'T'HH:mm:ss").alias("window_start"),
        F.date_format("w.end", "yyyy-MM-dd'T'HH:mm:ss").alias("window_end"),
        "event",
        "count",
    )


def start(spark: SparkSession, args: argparse.Namespace) -> StreamingQuery:
    events = (
        spark.readStream.format("boxqueue")
        .option("uri", args.uri)
        .option("queue_space", args.queue_space)
        .option("tube", args.source)
        .option("maxTasksPerTrigger", args.max_tasks)
        .load()
    )
    writer = (
        counts(events, args.window, args.watermark).writeStream.format("boxqueue")
        .option("uri", args.uri)
        .option("queue_space", args.queue_space)
        .option("tube", args.target)
        .option("checkpointLocation", args.checkpoint)
        .outputMode("append")
    )
    return writer.trigger(availableNow=True).start() if args.available_now else writer.start()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    spark = SparkSession.builder.appName(f"boxqueue: windows of {args.source}").getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.shuffle.partitions", args.shuffle_partitions)  # Spark's 200 is for clusters
    register(spark)
    query = start(spark, args)
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
