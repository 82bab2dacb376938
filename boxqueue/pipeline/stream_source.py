"""Reading a tube as a stream: ``spark.readStream.format("boxqueue").option("tube", ...)``.

A tube is not a log that can be read again from an offset, so an offset here names **claims**
(the engine's durable claims, ``boxqueue/tubes/streams.py``): the offset that ends micro-batch
``seq`` of stream ``stream`` names the claims ``<stream>.<seq>.0`` to ``<stream>.<seq>.<claims-1>``,
each holding up to ``tasksPerPartition`` tasks and read by one Spark partition. So:

* ``latestOffset`` (the driver) claims up to the read limit (``maxTasksPerTrigger``) of free tasks
  under the next batch's claims, and returns the offset naming them, or its start when nothing
  was free. Asked again for the same batch (a driver restarted before it logged the offset), it
  gets the same claims back: their ids are made from the stream and the batch;
* ``partitions`` renews the batch's claims (a replayed batch after a restart finds them alive
  while ``claimTtl`` lasts) and gives one partition a claim; ``read`` (an executor) returns the
  tasks a claim holds, the same ones however often it is run;
* ``commit`` acks the claims: their tasks are deleted. Spark commits a batch's offset only after
  its next batch is planned, so ``latestOffset`` and ``partitions`` ack their start too: every
  batch Spark has committed is acked by the next call, whatever was killed in between.
* the server's work of a batch overlaps the executors' reads: ``latestOffset`` claims its batch
  (or finds it claimed), then, on a thread of its own (its own connection), acks its start and
  claims the batch after it ahead, while the executors read this one; the next
  ``latestOffset`` waits for that work (and raises its error) before it goes on. A claim made
  ahead is named like any (the next batch's ids), so the next ``latestOffset``, or a restarted
  driver's, finds it; a driver killed before the ack is done leaves it to the restarted
  driver's ``partitions``, which acks its start. A query stopped holds its last planned batch
  and the one claimed ahead (Spark ends the reader's process without calling ``stop``): a
  restart from its checkpoint reads both, or they lapse after ``claimTtl``.

A claim that lapses (a batch longer than ``claimTtl``, a driver away longer than that) returns its
tasks to ready: they are delivered again, never lost. Every call goes to the replica set's leader
(``leader.py``).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from boxqueue.pipeline.errors import BoxqueueSourceError
from boxqueue.pipeline.field_types import to_text
from boxqueue.pipeline.leader import LeaderCalls
from boxqueue.pipeline.options import SourceOptions, StreamOptions

STREAM_SCHEMA = StructType([
    StructField("id", StringType(), False),
    StructField("tube", StringType(), False),
    StructField("priority", DoubleType(), True),
    StructField("created", TimestampType(), False),
    StructField("expires", TimestampType(), True),
    StructField("deliveries", LongType(), False),
    StructField("value", StringType(), True),
    StructField("data", StringType(), False),
])
_F_CREATED, _F_PRI, _F_TTL, _F_CTAKEN = 7, 5, 8, 11
_LAST_SHOWN_US = int((dt.datetime(9999, 12, 31, tzinfo=dt.UTC) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC))
                     / dt.timedelta(microseconds=1))  # later expiries are shown as null (never)
_NO_LIMIT = 1 << 62
VSPACE, VSPACE_BY_NAME = 281, 2


class ClaimPartition(InputPartition):
    """One claim of a micro-batch: the tasks one Spark task reads."""

    def __init__(self, space_id: int, tube: str, claim: str) -> None:
        super().__init__(claim)
        self.space_id = space_id
        self.tube = tube
        self.claim = claim


def claim_ids(offset: dict[str, Any]) -> list[str]:
    """The claims an offset names."""
    stream, seq, claims = offset.get("stream", ""), offset.get("seq", 0), offset.get("claims", 0)
    return [f"{stream}.{seq}.{n}" for n in range(claims)] if stream else []


def tasks_batch(rows: list[list[Any]], data_at: int, kind: str, arrow_schema: pa.Schema) -> pa.RecordBatch:
    """Stored task tuples as one Arrow batch of :data:`STREAM_SCHEMA`."""
    box_queue = kind == "box.queue"  # its priority is stored inverted (128 - pri)
    data = [row[data_at:] for row in rows]
    created = [row[_F_CREATED] for row in rows]
    expires = [c + row[_F_TTL] for c, row in zip(created, rows, strict=True)]
    columns = [
        [row[0] for row in rows],
        [row[1] for row in rows],
        [float(128 - row[_F_PRI]) if box_queue else float(row[_F_PRI]) for row in rows],
        created,
        [e if e <= _LAST_SHOWN_US else None for e in expires],
        [row[_F_CTAKEN] for row in rows],
        [to_text(fields[0]) if fields else None for fields in data],
        [to_text(fields) for fields in data],
    ]
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=field.type) for values, field in zip(columns, arrow_schema, strict=True)],
        schema=arrow_schema)


class TubeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The offsets, partitions and reads of one streaming query over one tube."""

    def __init__(self, opts: SourceOptions, stream: StreamOptions) -> None:
        if not opts.tube:
            raise BoxqueueSourceError("a stream reads a tube: give option 'tube' (and 'queue_space')")
        self.opts = opts
        self.stream = stream
        self.tube: str = opts.tube
        self._calls: LeaderCalls | None = None
        self._space_id: int | None = None
        self._upto: int | None = None  # Trigger.AvailableNow: tasks created by then, no later ones
        # The background thread (see the module's docstring), with its connection and the work
        # in flight, and the claims acked last (which later calls need not ack again).
        self._background: ThreadPoolExecutor | None = None
        self._background_calls: LeaderCalls | None = None
        self._working: Future[None] | None = None
        self._acked: list[str] = []

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_calls", "_background", "_background_calls", "_working"):
            state[name] = None  # a connection or a thread stays in the process that opened it
        return state

    # -- the driver ------------------------------------------------------------------------

    def _call(self, function: str, args: list[Any], what: str) -> list[Any]:
        return self._connection().call(function, args, what)

    def _connection(self) -> LeaderCalls:
        """The driver's calls to the leader (opened on first use)."""
        if self._calls is None:
            self._calls = LeaderCalls(self.opts)
        return self._calls

    def space_id(self) -> int:
        """The queue space's id (the stream's procedures take ids), looked up once."""
        if self._space_id is None:
            self._space_id = self._connection().with_leader(self._look_up_space, "looking up the queue space")
        return self._space_id

    def _look_up_space(self, conn: Any) -> int:
        space = self.opts.queue_space
        if space.isdigit():
            return int(space)
        found = conn.select(VSPACE, [space], index=VSPACE_BY_NAME).data
        if not found:
            raise BoxqueueSourceError(f"space '{space}' does not exist at {self.opts.uri}")
        return int(found[0][0])

    def initialOffset(self) -> dict[str, Any]:
        after = time.time_ns() // 1000 if self.stream.latest else 0
        return {"stream": "", "seq": 0, "claims": 0, "tasks": 0, "after": after}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.stream.max_tasks_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self._upto = time.time_ns() // 1000

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Claim the next batch's tasks (up to ``limit``); ``start`` itself when none are free.
        The batch ``start`` ends is committed by Spark: it is acked after the claims, on the
        background thread, which then claims the batch after this one ahead (at once, here,
        when nothing was claimed)."""
        self._settle_background()
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else _NO_LIMIT
        stream = start.get("stream") or uuid.uuid4().hex
        seq = int(start.get("seq", 0)) + 1
        after = int(start.get("after", 0))
        claims, tasks = self._claim_batch(self._connection(), stream, seq, after, budget)
        if not claims:
            self._ack(start)
            return start
        self._meanwhile(start, stream, seq + 1, after, budget)
        return {"stream": stream, "seq": seq, "claims": claims, "tasks": tasks, "after": after}

    def _claim_batch(self, calls: LeaderCalls, stream: str, seq: int, after: int, budget: int) -> tuple[int, int]:
        """The claims of batch ``seq``, made now or found made: how many, and their tasks."""
        claims = tasks = 0
        space_id = self.space_id()
        while tasks < budget:
            wanted = min(self.stream.tasks_per_partition, budget - tasks)
            claim = f"{stream}.{seq}.{claims}"
            args = [space_id, self.tube, claim, wanted, self.stream.claim_ttl, after, self._upto]
            held = calls.call("boxqueue.stream_claim", args, f"claiming tasks of tube '{self.tube}'")[0]
            if not held:
                break
            claims += 1
            tasks += held
            if held < wanted:
                break  # nothing more is free now
        return claims, tasks

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        ids = claim_ids(end)
        if not ids or end == start:
            return []
        self._ack(start)
        space_id = self.space_id()
        self._call("boxqueue.stream_renew", [space_id, self.tube, ids, self.stream.claim_ttl],
                   f"renewing the claims of tube '{self.tube}'")
        return [ClaimPartition(space_id, self.tube, claim) for claim in ids]

    def commit(self, end: dict[str, Any]) -> None:
        self._ack(end)

    def _ack(self, offset: dict[str, Any]) -> None:
        ids = claim_ids(offset)
        if ids and ids != self._acked:
            self._call("boxqueue.stream_ack", [self.space_id(), self.tube, ids],
                       f"acknowledging the tasks of tube '{self.tube}'")
            self._acked = ids

    def _meanwhile(self, start: dict[str, Any], stream: str, ahead: int, after: int, budget: int) -> None:
        """On the background thread (nothing in flight there: see _settle_background): ack
        ``start``'s claims, then claim batch ``ahead``'s tasks (its ``latestOffset`` finds them)."""
        ids = claim_ids(start)
        if ids == self._acked:
            ids = []
        if self._background is None:
            self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="boxqueue-stream")
            self._background_calls = LeaderCalls(self.opts)
        calls = self._background_calls
        assert calls is not None
        space_id = self.space_id()

        def work() -> None:
            if ids:
                calls.call("boxqueue.stream_ack", [space_id, self.tube, ids],
                           f"acknowledging the tasks of tube '{self.tube}'")
            self._claim_batch(calls, stream, ahead, after, budget)

        self._working = self._background.submit(work)
        if ids:
            self._acked = ids  # (one that fails raises in _settle_background, before anything else)

    def _settle_background(self) -> None:
        """Wait for the work in flight; its error, if it failed, is raised here."""
        working, self._working = self._working, None
        if working is not None:
            working.result()

    def stop(self) -> None:
        try:
            self._settle_background()
        finally:
            if self._background is not None:
                self._background.shutdown(wait=True)
                self._background = None
            for calls in (self._calls, self._background_calls):
                if calls is not None:
                    calls.close()
            self._calls = self._background_calls = None

    # -- the executors -----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ClaimPartition)
        arrow_schema = to_arrow_schema(STREAM_SCHEMA, timezone="UTC")
        page = self.stream.tasks_per_partition
        calls = LeaderCalls(self.opts)
        after = 0
        try:
            while True:
                data_at, kind, rows = calls.call(
                    "boxqueue.stream_read", [partition.space_id, partition.tube, partition.claim, after, page],
                    f"reading claim {partition.claim} of tube '{partition.tube}'")
                if rows:
                    yield tasks_batch(rows, data_at, kind, arrow_schema)
                if len(rows) < page:
                    return
                after = rows[-1][_F_CREATED]
        finally:
            calls.close()
