"""The ``boxqueue`` data source for Spark 4's Python Data Source API.

    from boxqueue.pipeline.spark import register
    register(spark)
    spark.read.format("boxqueue").option("uri", "127.0.0.1:33020").option("space", "queue").load()
    df.write.format("boxqueue").option("space", "jobs_archive").mode("append").save()
    df.write.format("boxqueue").option("tube", "emails").option("queue_space", "0").save()
    spark.readStream.format("boxqueue").option("tube", "events").load()     # stream_source.py
    stream.writeStream.format("boxqueue").option("tube", "totals").start()  # stream_sink.py

Options: ``uri`` (host:port, default 127.0.0.1:33020), ``user``, ``password``, ``space`` or
``tube`` with ``queue_space`` (name or id, default 0) and ``unique``; tuning: ``batch_size``
(tuples per select, default 1000), ``partitions`` (read ranges; default one per
``rows_per_partition`` = 250,000 rows), ``pipeline_depth`` (write requests in flight per task,
default 512), ``connect_timeout`` (seconds, default 10), ``pushdown`` (default false: see
``PushdownSpaceReader`` for why, and for the Spark setting it needs).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType
from tarantool.error import DatabaseError

from boxqueue.pipeline.connect import (
    SpaceInfo,
    check_queue_space,
    describe_database_error,
    describe_space,
    open_connection,
)
from boxqueue.pipeline.errors import BoxqueueSourceError
from boxqueue.pipeline.field_types import read_schema
from boxqueue.pipeline.leader import LeaderCalls
from boxqueue.pipeline.options import (
    SourceOptions,
    StreamOptions,
    parse_options,
    parse_stream_options,
)
from boxqueue.pipeline.space_reader import PushdownSpaceReader, SpaceReader, describe
from boxqueue.pipeline.stream_sink import SpaceStreamWriter, TubeStreamWriter
from boxqueue.pipeline.stream_source import STREAM_SCHEMA, TubeStreamReader
from boxqueue.pipeline.writers import SpaceWriter, TubeWriter

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"  # needed by option pushdown=true


class BoxqueueDataSource(DataSource):
    """Spaces of a boxqueue (or Tarantool) server as DataFrames, and DataFrames as tuples or tasks."""

    @classmethod
    def name(cls) -> str:
        return "boxqueue"

    @cached_property
    def opts(self) -> SourceOptions:
        """The options, parsed once (Spark's ``__init__`` must not be overridden)."""
        return parse_options(self.options)

    @cached_property
    def space_info(self) -> SpaceInfo:
        """The space's format and primary key, read once on the driver."""
        return describe(self.opts)

    @cached_property
    def stream_opts(self) -> StreamOptions:
        return parse_stream_options(self.options)

    def schema(self) -> StructType:
        if self.opts.tube:  # a stream of tasks (a batch read of a tube is refused by reader())
            return STREAM_SCHEMA
        return read_schema(self.space_info)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.opts.tube:
            raise BoxqueueSourceError(
                "a tube cannot be read as a batch: read its queue space with option 'space', or the tube "
                "as a stream with spark.readStream")
        pushdown = str(self.options.get("pushdown", "false")).strip().lower() in ("true", "1", "yes")
        kind = PushdownSpaceReader if pushdown else SpaceReader
        return kind(self.opts, self.space_info, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = self.opts
        if not opts.space and not opts.tube:
            raise BoxqueueSourceError("writing needs option 'space' or option 'tube'")
        conn = open_connection(opts)
        try:
            if opts.tube:
                queue_space = describe_space(conn, opts.queue_space, opts.uri)
                check_queue_space(conn, queue_space, opts.unique)
                writer: DataSourceWriter = TubeWriter(opts, queue_space, schema)
                if overwrite:
                    self._call(conn, "box.queue.truncate", [queue_space.id, opts.tube],
                               f"truncating tube '{opts.tube}'")
                return writer
            assert opts.space  # a space or a tube, checked above
            space = describe_space(conn, opts.space, opts.uri)
            writer = SpaceWriter(opts, space, schema)
            if overwrite:
                self._call(conn, f"box.space.{space.name}:truncate", [], f"truncating space '{space.name}'")
            return writer
        finally:
            conn.close()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if not self.opts.tube:
            raise BoxqueueSourceError("a stream reads a tube: give option 'tube' (and 'queue_space')")
        return TubeStreamReader(self.opts, self.stream_opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        opts = self.opts
        if overwrite:
            raise BoxqueueSourceError("the boxqueue stream sink appends: use outputMode append (Spark refuses update for Python sinks), not complete")
        if not opts.space and not opts.tube:
            raise BoxqueueSourceError("writing needs option 'space' or option 'tube'")
        # Spark asks for a writer every micro-batch: the space is described by whichever member
        # leads now (a server restarting or a failover under way is waited for).
        calls = LeaderCalls(opts)
        try:
            if opts.tube:
                def queue_space(conn: Any) -> SpaceInfo:
                    space = describe_space(conn, opts.queue_space, opts.uri)
                    check_queue_space(conn, space, False)
                    return space

                described = calls.with_leader(queue_space, "describing the queue space")
                return TubeStreamWriter(opts, self.stream_opts, described, schema)
            name = opts.space
            assert name
            space = calls.with_leader(lambda conn: describe_space(conn, name, opts.uri), "describing the space")
            return SpaceStreamWriter(opts, self.stream_opts, space, schema)
        finally:
            calls.close()

    @staticmethod
    def _call(conn: Any, function: str, args: list[Any], what: str) -> None:
        try:
            conn.call(function, args)
        except DatabaseError as exc:
            raise describe_database_error(exc, what) from None


def register(spark: Any) -> None:
    """Make ``format("boxqueue")`` available in this Spark session."""
    spark.dataSource.register(BoxqueueDataSource)
