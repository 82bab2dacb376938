"""Export a space to Parquet: one file per key range, written by the executors in parallel.

    spark-submit boxqueue/pipeline/examples/export_space.py --space queue --output /data/queue.parquet
    python -m pipeline.examples.export_space --space jobs_archive --output out.parquet --partitions 8
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession

from boxqueue.pipeline.spark import register


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="127.0.0.1:33020")
    parser.add_argument("--space", required=True, help="a space name or id")
    parser.add_argument("--output", required=True, help="the Parquet folder to write (replaced)")
    parser.add_argument("--partitions", help="key ranges to read in parallel (default: by size)")
    parser.add_argument("--user")
    parser.add_argument("--password")
    return parser.parse_args(argv)


def export(spark: SparkSession, args: argparse.Namespace) -> None:
    reader = spark.read.format("boxqueue").option("uri", args.uri).option("space", args.space)
    if args.partitions:
        reader = reader.option("partitions", args.partitions)
    if args.user:
        reader = reader.option("user", args.user).option("password", args.password or "")
    reader.load().write.mode("overwrite").parquet(args.output)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    spark = SparkSession.builder.appName(f"boxqueue: export {args.space}").getOrCreate()
    register(spark)
    export(spark, args)
    print(f"exported space {args.space!r} to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
