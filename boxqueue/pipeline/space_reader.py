"""Reading a space: planned on the driver as key ranges, each read by one executor task.

A range is read as one stream of selects on the primary index, ``batch_size`` tuples each (the
first from the range's lower end, the next ones GT the last key seen), until a tuple lies past the
range's upper end. Each batch becomes one Arrow record batch, so an executor holds at most one
batch of tuples at a time and the driver never sees the data.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType
from tarantool.error import DatabaseError

from boxqueue.pipeline import key_ranges
from boxqueue.pipeline.connect import (
    SpaceInfo,
    describe_database_error,
    describe_space,
    open_connection,
)
from boxqueue.pipeline.errors import BoxqueueSourceError
from boxqueue.pipeline.field_types import TAIL_COLUMN, read_converter, to_text
from boxqueue.pipeline.key_ranges import ITERATOR_GT, ITERATOR_LE, KeyRange
from boxqueue.pipeline.options import SourceOptions


def _column_sources(schema: StructType, space: SpaceInfo) -> list[int | None]:
    """For each column, the tuple field it reads (None: the ``_tail`` of extra fields)."""
    sources: list[int | None] = []
    position = 0  # without a format, columns other than _tail are fields 0, 1, 2...
    for column in schema.fields:
        if column.name == TAIL_COLUMN:
            sources.append(None)
            continue
        if not space.fields:
            sources.append(position)
            position += 1
            continue
        number = space.field_named(column.name)
        if number is None:
            names = ", ".join(f.name for f in space.fields)
            raise BoxqueueSourceError(
                f"column '{column.name}' is not a field of space '{space.name}' (fields: {names})"
            )
        sources.append(number)
    return sources


class TuplesToArrow:
    """Turns a batch of stored tuples into one Arrow record batch of the read schema."""

    def __init__(self, schema: StructType, space: SpaceInfo) -> None:
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.sources = _column_sources(schema, space)
        self.converters = [read_converter(column.dataType) for column in schema.fields]
        self.width = len(space.fields) or sum(1 for source in self.sources if source is not None)
        self.space = space

    def batch(self, rows: list[list[Any]]) -> pa.RecordBatch:
        arrays = []
        for column, source, convert in zip(self.arrow_schema, self.sources, self.converters, strict=True):
            if source is None:
                width = self.width
                values = [to_text(row[width:]) if len(row) > width else None for row in rows]
            else:
                values = [row[source] if len(row) > source else None for row in rows]
                if convert is not None:
                    values = [None if v is None else self._convert(convert, v, column.name) for v in values]
            arrays.append(self._array(values, column))
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    def _convert(self, convert: Any, value: Any, name: str) -> Any:
        try:
            return convert(value)
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise self._unfit(name, value, exc) from None

    def _array(self, values: list[Any], column: pa.Field) -> pa.Array:
        try:
            return pa.array(values, type=column.type)
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
            for value in values:  # name the value that does not fit
                try:
                    pa.array([value], type=column.type)
                except (pa.ArrowException, OverflowError, TypeError, ValueError):
                    raise self._unfit(column.name, value, exc) from None
            raise

    def _unfit(self, name: str, value: Any, exc: Exception) -> BoxqueueSourceError:
        return BoxqueueSourceError(
            f"field '{name}' of space '{self.space.name}' holds {value!r}, which its Spark column "
            f"cannot take ({exc}); read it as a string with .schema(...)"
        )


class SpaceReader(DataSourceReader):
    """Plans key ranges on the driver; reads one range per task on the executors."""

    def __init__(self, opts: SourceOptions, space: SpaceInfo, schema: StructType) -> None:
        self.opts = opts
        self.space = space
        self.schema = schema
        _column_sources(schema, space)  # refuse unknown columns at planning time
        self.whole = KeyRange()

    def first_key_column(self) -> str | None:
        first = self.space.pk_fields[0]
        if first < len(self.space.fields):
            return self.space.fields[first].name
        return None

    def narrow(self, filters: list[Filter]) -> list[Filter]:
        """Apply comparisons on the first primary-key column; return the filters left to Spark."""
        column = self.first_key_column()
        if column is None or self.space.pk_kind != "tree":
            return list(filters)
        self.whole, rest = key_ranges.narrow(list(filters), column, self.space.pk_types[0])
        return rest

    def partitions(self) -> list[InputPartition]:
        if self.whole.empty:
            return [self.whole]
        key_type = self.space.pk_types[0]
        if self.space.pk_kind != "tree" or key_type not in key_ranges.NUMERIC_KEYS + key_ranges.SAMPLED_KEYS:
            return [self.whole]
        conn = open_connection(self.opts.reading())
        try:
            return self._plan(conn, key_type)
        except DatabaseError as exc:
            raise describe_database_error(exc, f"planning the read of space '{self.space.name}'") from None
        finally:
            conn.close()

    def _plan(self, conn: Any, key_type: str) -> list[InputPartition]:
        rows = conn.call(f"box.space.{self.space.name}:len").data[0]
        count = key_ranges.partition_count(rows, self.opts.partitions, self.opts.rows_per_partition)
        if count <= 1 or rows == 0:
            return [self.whole]
        first = self.space.pk_fields[0]
        if key_type in key_ranges.NUMERIC_KEYS:
            key, iterator = self.whole.start()
            low = conn.select(self.space.id, key, index=0, iterator=iterator, limit=1).data
            high_key = [] if self.whole.upper is None else [self.whole.upper.value]
            high = conn.select(self.space.id, high_key, index=0, iterator=ITERATOR_LE, limit=1).data
            if not low or not high:
                return [self.whole]
            points = key_ranges.interpolated_points(low[0][first], high[0][first], count, key_type)
        elif self.whole.lower is None and self.whole.upper is None:
            points = []
            for i in range(1, count):
                sample = conn.select(self.space.id, [], index=0, iterator=key_ranges.ITERATOR_ALL,
                                     offset=rows * i // count, limit=1).data
                if sample and (not points or sample[0][first] > points[-1]):
                    points.append(sample[0][first])
        else:
            points = []  # a narrowed string range is read as one range
        return list(key_ranges.split(self.whole, points))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KeyRange)
        if partition.empty:
            return
        to_arrow = TuplesToArrow(self.schema, self.space)
        opts = self.opts.reading(zlib.crc32(repr(partition).encode()))  # partitions spread over read_from
        conn = open_connection(opts)
        try:
            yield from self._read_range(conn, partition, to_arrow)
        except DatabaseError as exc:
            raise describe_database_error(exc, f"reading space '{self.space.name}' at {opts.uri}") from None
        finally:
            conn.close()

    def _read_range(self, conn: Any, partition: KeyRange, to_arrow: TuplesToArrow) -> Iterator[pa.RecordBatch]:
        key, iterator = partition.start()
        first = self.space.pk_fields[0]
        pk_fields = self.space.pk_fields
        limit = self.opts.batch_size
        while True:
            rows = conn.select(self.space.id, key, index=0, iterator=iterator, limit=limit).data
            kept = rows
            done = len(rows) < limit
            if partition.upper is not None:
                for position, row in enumerate(rows):
                    if partition.above_upper(row[first]):
                        kept, done = rows[:position], True
                        break
            if kept:
                yield to_arrow.batch(kept)
            if done:
                return
            last = rows[-1]
            key, iterator = [last[f] for f in pk_fields], ITERATOR_GT


class PushdownSpaceReader(SpaceReader):
    """A space reader that takes Spark's filters: ``option("pushdown", "true")``.

    Off by default because of how Spark 4.3 plans Python data sources: the ranges planned for a
    DataFrame are kept with it, and a query with pushed filters replaces them, so a later query on
    the *same* DataFrame without those filters still reads only the narrowed ranges (measured:
    ``df.filter("id >= 90").count()`` then ``df.count()`` gives 10 of 100). With pushdown on, load a
    fresh DataFrame for each filtered query. It also needs
    ``spark.sql.python.filterPushdown.enabled`` (Spark refuses the reader otherwise).
    """

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        return self.narrow(filters)


def describe(opts: SourceOptions) -> SpaceInfo:
    """Connect once on the driver and describe the space the options name."""
    if not opts.space:
        raise BoxqueueSourceError("reading needs option 'space' (a space name or id)")
    reading = opts.reading()
    conn = open_connection(reading)
    try:
        return describe_space(conn, opts.space, reading.uri)
    finally:
        conn.close()
