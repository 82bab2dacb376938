"""Writing a DataFrame: tuples into a space (REPLACE) or tasks into a tube (box.queue.put).

Both are idempotent per row, so a Spark task that fails and runs again does not duplicate data:
REPLACE overwrites the tuple with the same primary key, and ``put_unique`` (option ``unique``)
returns the ready task with the same first data field instead of adding one. Nothing is
transactional across rows: a failed job leaves the rows its tasks wrote (``abort`` cannot take
them back), and running it again completes it.

Each task writes over its own connection with up to ``pipeline_depth`` requests in flight.
"""

from __future__ import annotations

import json
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
from tarantool.request import RequestCall, RequestReplace

from boxqueue.pipeline.connect import SpaceInfo, open_connection
from boxqueue.pipeline.errors import BoxqueueSourceError
from boxqueue.pipeline.field_types import TAIL_COLUMN, check_fits, column_values
from boxqueue.pipeline.options import SourceOptions
from boxqueue.pipeline.pipelined import PipelinedRequests

TASK_OPTIONS = ("delay", "ttl", "ttr", "pri")
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


class SpaceWriter(DataSourceArrowWriter):
    """REPLACE every row into a space; columns go to the format fields of the same name."""

    def __init__(self, opts: SourceOptions, space: SpaceInfo, schema: StructType) -> None:
        self.opts = opts
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

    def _tuples(self, batch: pa.RecordBatch) -> Iterator[list[Any]]:
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

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenRows:
        conn = open_connection(self.opts, raise_errors=False)
        name = self.space.name

        def describe(row: Any, message: str, code: int) -> BoxqueueSourceError:
            return BoxqueueSourceError(f"replace into space '{name}' failed at row {row} of this task: {message} (error {code})")

        pipe = PipelinedRequests(conn, self.opts.pipeline_depth, describe)
        row = 0
        try:
            for batch in iterator:
                for stored in self._tuples(batch):
                    pipe.send(RequestReplace(conn, self.space.id, stored), row)
                    row += 1
            pipe.finish()
        finally:
            conn.close()
        return WrittenRows(row)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every row is already durable on the server when its task ends: nothing to do."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Rows already replaced stay; running the job again replaces them with the same values."""


class TubeWriter(DataSourceArrowWriter):
    """One ``box.queue.put`` (or ``put_unique``) per row: delay/ttl/ttr/pri columns, the rest data."""

    def __init__(self, opts: SourceOptions, queue_space: SpaceInfo, schema: StructType) -> None:
        self.opts = opts
        self.queue_space = queue_space
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
        if opts.unique and not self.data_columns:
            raise BoxqueueSourceError("option unique (put_unique) needs at least one data column")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenRows:
        conn = open_connection(self.opts, raise_errors=False)
        function = "box.queue.put_unique" if self.opts.unique else "box.queue.put"
        tube = self.opts.tube

        def describe(row: Any, message: str, code: int) -> BoxqueueSourceError:
            return BoxqueueSourceError(f"{function} into tube '{tube}' failed at row {row} of this task: {message} (error {code})")

        pipe = PipelinedRequests(conn, self.opts.pipeline_depth, describe)
        fields = self.schema.fields
        row = 0
        try:
            for batch in iterator:
                options = {
                    name: batch.column(i).to_pylist() for name, i in self.option_columns.items()
                }
                data = [column_values(batch.column(i), fields[i].dataType, "any") for i in self.data_columns]
                for n in range(batch.num_rows):
                    args: list[Any] = [self.queue_space.id, tube]
                    for name in TASK_OPTIONS:
                        value = options[name][n] if name in options else None
                        args.append(0 if value is None else (float(value) if not isinstance(value, int) else value))
                    args.extend(column[n] for column in data)
                    pipe.send(RequestCall(conn, function, args, call_16=False), row)
                    row += 1
            pipe.finish()
        finally:
            conn.close()
        return WrittenRows(row)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task is already durable on the server when its Spark task ends: nothing to do."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Tasks already put stay; with option unique, running the job again adds no duplicates."""
