"""Bulk-load a Parquet or CSV file into a tube: one task per row.

Columns named delay, ttl, ttr and pri (seconds, and the put priority) set each task's options;
every other column becomes a data field of the task, in column order. With ``--unique`` the load
uses put_unique, so running it again after a failure does not enqueue a row twice (the first data
column is what makes a task unique).

    spark-submit boxqueue/pipeline/examples/load_tube.py --input tasks.parquet --tube emails
    python -m pipeline.examples.load_tube --input tasks.csv --format csv --tube emails --unique
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession

from boxqueue.pipeline.spark import register


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="a Parquet or CSV file or folder")
    parser.add_argument("--format", choices=("parquet", "csv"), default=None,
                        help="the input's format (default: from the file name, else parquet)")
    parser.add_argument("--uri", default="127.0.0.1:33020")
    parser.add_argument("--tube", required=True)
    parser.add_argument("--queue-space", default="0", help="the queue space, by name or id")
    parser.add_argument("--unique", action="store_true", help="put_unique: no duplicates on a rerun")
    parser.add_argument("--replace-tube", action="store_true", help="truncate the tube first")
    parser.add_argument("--user")
    parser.add_argument("--password")
    return parser.parse_args(argv)


def load(spark: SparkSession, args: argparse.Namespace) -> int:
    """Read the input and put its rows into the tube; returns how many rows were read."""
    kind = args.format or ("csv" if args.input.rstrip("/").endswith(".csv") else "parquet")
    reader = spark.read.option("header", "true").option("inferSchema", "true") if kind == "csv" else spark.read
    frame = reader.format(kind).load(args.input)
    writer = (
        frame.write.format("boxqueue")
        .option("uri", args.uri)
        .option("tube", args.tube)
        .option("queue_space", args.queue_space)
        .option("unique", str(args.unique).lower())
        .mode("overwrite" if args.replace_tube else "append")
    )
    if args.user:
        writer = writer.option("user", args.user).option("password", args.password or "")
    writer.save()
    return frame.count()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    spark = SparkSession.builder.appName(f"boxqueue: load {args.tube}").getOrCreate()
    register(spark)
    rows = load(spark, args)
    print(f"loaded {rows} rows from {args.input} into tube {args.tube!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
