"""A per-tube report from a queue space: task counts by status and age percentiles.

Reads the queue space (in key ranges, in parallel) and aggregates on the executors; only the
report, one row per tube, reaches the driver. Ages are seconds since each task was created.

    spark-submit boxqueue/pipeline/examples/tube_report.py --space queue
    python -m pipeline.examples.tube_report --space queue --output report.csv
"""

from __future__ import annotations

import argparse
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from boxqueue.pipeline.spark import register

STATUSES = {"r": "ready", "d": "delayed", "t": "taken", "b": "buried", "*": "done"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="127.0.0.1:33020")
    parser.add_argument("--space", default="queue", help="the queue space, by name or id")
    parser.add_argument("--output", help="also write the report as CSV to this folder")
    parser.add_argument("--user")
    parser.add_argument("--password")
    return parser.parse_args(argv)


def report(spark: SparkSession, args: argparse.Namespace, now_us: int | None = None) -> DataFrame:
    """One row per tube: total, a count per status, and age p50/p90/p99 in seconds."""
    now_us = now_us if now_us is not None else time.time_ns() // 1000
    reader = spark.read.format("boxqueue").option("uri", args.uri).option("space", args.space)
    if args.user:
        reader = reader.option("user", args.user).option("password", args.password or "")
    tasks = reader.load().select(
        "tube",
        "status",
        ((F.lit(now_us) - F.col("created")) / 1_000_000).alias("age_s"),
    )
    counts = [F.sum(F.when(F.col("status") == letter, 1).otherwise(0)).alias(name)
              for letter, name in STATUSES.items()]
    ages = F.percentile_approx("age_s", [0.5, 0.9, 0.99], 10_000)
    return (
        tasks.groupBy("tube")
        .agg(F.count("*").alias("tasks"), *counts, ages.alias("ages"))
        .select(
            "tube", "tasks", *STATUSES.values(),
            F.round(F.col("ages")[0], 3).alias("age_p50_s"),
            F.round(F.col("ages")[1], 3).alias("age_p90_s"),
            F.round(F.col("ages")[2], 3).alias("age_p99_s"),
        )
        .orderBy("tube")
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    spark = SparkSession.builder.appName("boxqueue: tube report").getOrCreate()
    register(spark)
    result = report(spark, args)
    if args.output:
        result.write.mode("overwrite").option("header", "true").csv(args.output)
    result.show(truncate=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
