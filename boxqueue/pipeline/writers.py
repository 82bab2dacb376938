"""Writing a DataFrame: tuples into a space (REPLACE) or tasks into a tube (as box.queue.put).

Rows go ``batch_size`` to a request, ``boxqueue.replace_many`` or ``boxqueue.put_many`` (each
request one write on the server), a few requests in flight per Spark task; ``put_unique`` (option
``unique``) goes a row to a request, up to ``pipeline_depth`` in flight. REPLACE is idempotent per
row and ``put_unique`` returns the ready task with the same first data field instead of adding
one, so a Spark task that fails and runs again duplicates nothing with them. Nothing is
transactional across requests: a failed job leaves the rows its tasks wrote (``abort`` cannot
take them back), and running it again completes it.

:class:`SpaceRows` and :class:`TubeRows` turn Arrow batches into what the server stores; the
streaming sink (``stream_sink.py``) uses them too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    ByteType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NullType,
    ShortType,
    StructType,
)
from tarantool.request import RequestCall

from boxqueue.pipeline.connect import SpaceInfo, open_connection
from boxqueue.pipeline.errors import BoxqueueSourceError
from boxqueue.pipeline.field_types import TAIL_COLUMN, check_fits, column_values
from boxqueue.pipeline.options import SourceOptions
from boxqueue.pipeline.pipelined import PipelinedRequests

TASK_OPTIONS = ("delay", "ttl", "ttr", "pri")
BULK_IN_FLIGHT = 4  # replace_many / put_many requests in flight per Spark task
_NUMERIC = (ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType, DecimalType, NullType)


@dataclass
class WrittenRows(WriterCommitMessage):
    """What one task wrote (the driver sums these)."""

    rows: int


def _tail(value: str | None) -> list[Any]:
    if value is None:
        return []
    try:
        fields = json.loads(value)
    except ValueError as exc:
        raise BoxqueueSourceError(f"column {TAIL_COLUMN} must hold a JSON array, got {value!r}: {exc}") from None
    if not isinstance(fields, list):
        raise BoxqueueSourceError(f"column {TAIL_COLUMN} must hold a JSON array, got {value!r}")
    return fields


class SpaceRows:
    """Columns matched to a space's fields by name (``_tail`` appended); batches to tuples."""

    def __init__(self, space: SpaceInfo, schema: StructType) -> None:
        self.space = space
        self.schema = schema
        self.targets: list[int | None] = []  # the field of each column; None: the _tail
        self.field_types: list[str] = []
        self._plan()

    def _plan(self) -> None:
        space = self.space
        position = 0  # without a format, columns other than _tail go to fields 0, 1, 2...
        for column in self.schema.fields:
            if column.name == TAIL_COLUMN:
                self.targets.append(None)
                self.field_types.append("any")
                continue
            if not space.fields:
                self.targets.append(position)
                self.field_types.append("any")
                position += 1
                continue
            number = space.field_named(column.name)
            if number is None:
                names = ", ".join(f.name for f in space.fields)
                raise BoxqueueSourceError(
                    f"column '{column.name}' is not a field of space '{space.name}' (fields: {names})"
                )
            field = space.fields[number]
            check_fits(column, field.type, f"field '{field.name}' of space '{space.name}'")
            self.targets.append(number)
            self.field_types.append(field.type)
        given = {t for t in self.targets if t is not None}
        missing = [f for n, f in enumerate(space.fields) if n not in given and not f.nullable]
        if missing:
            names = ", ".join(f"'{f.name}' ({f.type})" for f in missing)
            raise BoxqueueSourceError(f"space '{space.name}' needs a column for field {names}")

    def tuples(self, batch: pa.RecordBatch) -> Iterator[list[Any]]:
        columns = [
            column_values(batch.column(i), column.dataType, field_type)
            for i, (column, field_type) in enumerate(zip(self.schema.fields, self.field_types, strict=True))
        ]
        width = len(self.space.fields) or sum(1 for target in self.targets if target is not None)
        targets = self.targets
        for values in zip(*columns, strict=True):
            stored: list[Any] = [None] * width
            tail: list[Any] = []
            for target, value in zip(targets, values, strict=True):
                if target is None:
                    tail = _tail(value)
                else:
                    stored[target] = value
            if tail:
                stored.extend(tail)
            yield stored


class TubeRows:
    """Columns ``delay``, ``ttl``, ``ttr`` and ``pri`` (seconds, box.queue's priority; 0 or null:
    the default) are a task's options, every other column a data field in column order; batches
    to rows ``[delay, ttl, ttr, pri, data...]`` (box.queue.put's arguments after the tube)."""

    def __init__(self, schema: StructType, unique: bool = False) -> None:
        self.schema = schema
        self.option_columns: dict[str, int] = {}
        self.data_columns: list[int] = []
        for position, column in enumerate(schema.fields):
            name = column.name.lower()
            if name in TASK_OPTIONS:
                if not isinstance(column.dataType, _NUMERIC):
                    raise BoxqueueSourceError(
                        f"column '{column.name}' ({column.dataType.simpleString()}) is a task's "
                        f"{name} in seconds and must be numeric"
                    )
                self.option_columns[name] = position
            else:
                self.data_columns.append(position)
        if unique and not self.data_columns:
            raise BoxqueueSourceError("option unique (put_unique) needs at least one data column")

    def rows(self, batch: pa.RecordBatch) -> Iterator[list[Any]]:
        fields = self.schema.fields
        zeros = [0] * batch.num_rows
        options = [
            zeros if name not in self.option_columns else [
                0 if value is None else (float(value) if not isinstance(value, int) else value)
                for value in batch.column(self.option_columns[name]).to_pylist()
            ]
            for name in TASK_OPTIONS
        ]
        data = [column_values(batch.column(i), fields[i].dataType, "any") for i in self.data_columns]
        for values in zip(*options, *data, strict=True):  # (a row a zip: a column a list, made once)
            yield list(values)


def row_of(message: str, first: int) -> str:
    """A server's "row N: ..." of a request that began at row ``first``, as the task's row."""
    match = re.search(r"\brow (\d+): ", message)
    if match is None:
        return f"{message} (a request of the rows from {first})"
    return f"row {first + int(match.group(1))} of this task: {message[match.end():]}"


class SpaceWriter(DataSourceArrowWriter):
    """REPLACE every row into a space; columns go to the format fields of the same name."""

    def __init__(self, opts: SourceOptions, space: SpaceInfo, schema: StructType) -> None:
        self.opts = opts
        self.space = space
        self.schema = schema
        self.planned = SpaceRows(space, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenRows:
        conn = open_connection(self.opts, raise_errors=False)
        name = self.space.name

        def describe(first: Any, message: str, code: int) -> BoxqueueSourceError:
            return BoxqueueSourceError(f"replace into space '{name}' failed at {row_of(message, first)} (error {code})")

        pipe = PipelinedRequests(conn, BULK_IN_FLIGHT, describe)
        rows = 0
        chunk: list[list[Any]] = []
        try:
            for batch in iterator:
                for stored in self.planned.tuples(batch):
                    chunk.append(stored)
                    if len(chunk) >= self.opts.batch_size:
                        pipe.send(RequestCall(conn, "boxqueue.replace_many", [self.space.id, chunk], call_16=False), rows)
                        rows += len(chunk)
                        chunk = []
            if chunk:
                pipe.send(RequestCall(conn, "boxqueue.replace_many", [self.space.id, chunk], call_16=False), rows)
                rows += len(chunk)
            pipe.finish()
        finally:
            conn.close()
        return WrittenRows(rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every row is already durable on the server when its task ends: nothing to do."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Rows already replaced stay; running the job again replaces them with the same values."""


class TubeWriter(DataSourceArrowWriter):
    """Rows as tasks (:class:`TubeRows`): ``batch_size`` rows a ``boxqueue.put_many``, or one
    ``box.queue.put_unique`` a row with option unique."""

    def __init__(self, opts: SourceOptions, queue_space: SpaceInfo, schema: StructType) -> None:
        self.opts = opts
        self.queue_space = queue_space
        self.schema = schema
        self.planned = TubeRows(schema, opts.unique)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenRows:
        conn = open_connection(self.opts, raise_errors=False)
        unique = self.opts.unique
        function = "box.queue.put_unique" if unique else "boxqueue.put_many"
        tube = self.opts.tube
        space_id = self.queue_space.id

        def describe(first: Any, message: str, code: int) -> BoxqueueSourceError:
            where = f"row {first} of this task: {message}" if unique else row_of(message, first)
            return BoxqueueSourceError(f"{function} into tube '{tube}' failed at {where} (error {code})")

        pipe = PipelinedRequests(conn, self.opts.pipeline_depth if unique else BULK_IN_FLIGHT, describe)
        rows = 0
        chunk: list[list[Any]] = []
        try:
            for batch in iterator:
                for row in self.planned.rows(batch):
                    if unique:
                        pipe.send(RequestCall(conn, function, [space_id, tube, *row], call_16=False), rows)
                        rows += 1
                        continue
                    chunk.append(row)
                    if len(chunk) >= self.opts.batch_size:
                        pipe.send(RequestCall(conn, function, [space_id, tube, chunk], call_16=False), rows)
                        rows += len(chunk)
                        chunk = []
            if chunk:
                pipe.send(RequestCall(conn, function, [space_id, tube, chunk], call_16=False), rows)
                rows += len(chunk)
            pipe.finish()
        finally:
            conn.close()
        return WrittenRows(rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task is already durable on the server when its Spark task ends: nothing to do."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Tasks already put stay; with option unique, running the job again adds no duplicates."""
