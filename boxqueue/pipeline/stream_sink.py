"""Writing a stream: ``df.writeStream.format("boxqueue").option("tube", ...)`` (or ``space``).

Each micro-batch's rows become tasks (as ``box.queue.put``: :class:`writers.TubeRows`) or tuples
(REPLACE: :class:`writers.SpaceRows`), and a batch Spark runs again after a failure writes
nothing twice. Spark runs a batch again with the same id and the same input; each Spark task
(one partition of the batch) therefore writes its rows in chunks, each chunk in **one write
together with a mark** (writer, batch id, partition, digest of the partition's rows, chunk) that
``boxqueue.put_many`` / ``boxqueue.replace_many`` find on a second run and then skip:

* the writer is Spark's query id (kept in the checkpoint, the same after a restart; option
  ``writerId`` overrides it) with the target, the batch id and the partition come from Spark;
* the digest sums a hash of every row, so it does not depend on the order the rows arrive in;
  rows go to chunks by their hash too (in arrival order within a chunk), so a second run with
  the same rows makes the same chunks; a second run with other rows (its source lost some) has
  another digest and writes them all: at least once, never a chunk skipped that it had not written;
* a partition of at most ``chunkRows`` rows is one chunk: one write, in arrival order.

When Spark commits batch N on the driver, the marks of the batches before N are deleted (Spark
never runs those again). Every call goes to the replica set's leader and is repeated where its
outcome is unknown (``leader.py``): the mark makes the repeat harmless.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from boxqueue.pipeline.connect import SpaceInfo
from boxqueue.pipeline.errors import BoxqueueSourceError
from boxqueue.pipeline.leader import LeaderCalls
from boxqueue.pipeline.options import SourceOptions, StreamOptions
from boxqueue.pipeline.writers import SpaceRows, TubeRows

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 * 1024 * 1024  # a chunk's rows, packed, at most (the server takes 16 MiB a request)
_QUERY_ID = "sql.streaming.queryId"  # what Spark tells a task of a streaming query
_BATCH_ID = "streaming.sql.batchId"


@dataclass
class BatchWritten(WriterCommitMessage):
    """What one Spark task of a batch wrote (the driver sums them and forgets old marks)."""

    writer: str
    rows: int
    chunks_written: int
    chunks_skipped: int


def _fingerprint(row: list[Any]) -> tuple[int, int]:
    """A row's hash (the same in every process) and its packed size."""
    packed = msgpack.packb(row, default=repr, use_bin_type=True)
    return int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "big"), len(packed)


def chunked(rows: list[list[Any]], chunk_rows: int) -> tuple[int, list[list[list[Any]]]]:
    """The partition's digest and its chunks: one chunk when it is small enough, else rows
    spread over chunks by their hash (in arrival order within each)."""
    prints = [_fingerprint(row) for row in rows]
    digest = (sum(h for h, _size in prints) + len(rows)) % (1 << 64)
    size = sum(size for _h, size in prints)
    count = max(math.ceil(len(rows) / chunk_rows), math.ceil(size / CHUNK_BYTES), 1)
    if count == 1:
        return digest, [rows]
    chunks: list[list[list[Any]]] = [[] for _ in range(count)]
    for row, (fingerprint, _size) in zip(rows, prints, strict=True):
        chunks[fingerprint % count].append(row)
    return digest, chunks


class MarkedWriter(DataSourceStreamArrowWriter):
    """What the tube and space sinks share: marks, chunks, the commit."""

    function = ""
    target = ""

    def __init__(self, opts: SourceOptions, stream: StreamOptions) -> None:
        self.opts = opts
        self.stream = stream

    def _rows(self, batch: pa.RecordBatch) -> Iterator[list[Any]]:
        raise NotImplementedError

    def _args(self, chunk: list[list[Any]], mark: list[Any]) -> list[Any]:
        raise NotImplementedError

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BatchWritten:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch_id = context.getLocalProperty(_BATCH_ID) if context is not None else None
        query_id = self.stream.writer_id or (context.getLocalProperty(_QUERY_ID) if context is not None else None)
        if context is None or batch_id is None or not query_id:
            raise BoxqueueSourceError("the boxqueue stream sink runs in a streaming query's tasks only")
        writer = f"{query_id}/{self.target}"
        rows = [row for batch in iterator for row in self._rows(batch)]
        written = skipped = 0
        if rows:
            digest, chunks = chunked(rows, self.stream.chunk_rows)
            calls = LeaderCalls(self.opts)
            try:
                for number, chunk in enumerate(chunks):
                    if not chunk:
                        continue
                    mark = [writer, int(batch_id), context.partitionId(), digest, number]
                    what = (f"{self.function} into {self.target} (batch {batch_id}, partition "
                            f"{context.partitionId()}, chunk {number} of {len(chunks)})")
                    answer = calls.call(self.function, self._args(chunk, mark), what)
                    written, skipped = (written + 1, skipped) if answer[0] is not None else (written, skipped + 1)
            finally:
                calls.close()
        return BatchWritten(writer, len(rows), written, skipped)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Forget the marks of the batches before this one: Spark never runs them again."""
        writers = {m.writer for m in messages if isinstance(m, BatchWritten)}
        if not writers or batchId == 0:
            return
        calls = LeaderCalls(self.opts)
        try:
            for writer in writers:
                calls.call("boxqueue.forget_marks", [writer, batchId], f"forgetting the marks of {writer}")
        except BoxqueueSourceError as exc:  # they only take room; the next commit tries again
            log.warning("%s", exc)
        finally:
            calls.close()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Chunks written stay, with their marks: Spark runs the batch again and they are skipped."""


class TubeStreamWriter(MarkedWriter):
    """Each row a task of the tube (columns as for batch tube writes: ``writers.TubeRows``)."""

    function = "boxqueue.put_many"

    def __init__(self, opts: SourceOptions, stream: StreamOptions, queue_space: SpaceInfo, schema: StructType) -> None:
        super().__init__(opts, stream)
        if opts.unique:
            raise BoxqueueSourceError("option unique is for batch writes: a stream's writes are made once by their marks")
        self.space_id = queue_space.id
        self.tube = opts.tube
        self.target = f"{queue_space.name}/{opts.tube}"
        self.planned = TubeRows(schema)

    def _rows(self, batch: pa.RecordBatch) -> Iterator[list[Any]]:
        return self.planned.rows(batch)

    def _args(self, chunk: list[list[Any]], mark: list[Any]) -> list[Any]:
        return [self.space_id, self.tube, chunk, mark]


class SpaceStreamWriter(MarkedWriter):
    """Each row a tuple REPLACEd into the space (columns as for batch writes: ``writers.SpaceRows``)."""

    function = "boxqueue.replace_many"

    def __init__(self, opts: SourceOptions, stream: StreamOptions, space: SpaceInfo, schema: StructType) -> None:
        super().__init__(opts, stream)
        self.space_id = space.id
        self.target = space.name
        self.planned = SpaceRows(space, schema)

    def _rows(self, batch: pa.RecordBatch) -> Iterator[list[Any]]:
        return self.planned.tuples(batch)

    def _args(self, chunk: list[list[Any]], mark: list[Any]) -> list[Any]:
        return [self.space_id, chunk, mark]
