"""What a Spark stream needs of the engine (``boxqueue/pipeline/streaming.py`` is the other side):

* **batches of tasks under claims the stream names** (:meth:`Streams.claim_batch`): a micro-batch's
  offset names its claims, so the driver, its executors and a driver restarted from its
  checkpoint all reach the same tasks while the claims hold; a claim that lapses returns its
  tasks to ready (delivered again, never lost). Read by claim (:meth:`Streams.claim_tasks`),
  acknowledged by claim (:meth:`Streams.ack_batch`: its tasks deleted);
* **writes marked with the batch that made them** (:meth:`Streams.put_marked`,
  :meth:`Streams.replace_marked`): the tasks or tuples and a mark naming (writer, batch, partition,
  digest of the partition's rows, chunk) go in one write, and a mark already written means the
  chunk is there already, so a batch Spark runs again writes nothing twice. The marks of batches
  Spark will never run again are forgotten (:meth:`Streams.forget_marks`).

A claim here is the engine's claim (:class:`tubes.tube.Claim`, Zaqar's): durable, renewable, its
tasks taken with its holder as their cid; a listed one, whose record lists its tasks, so that a
claim of N tasks is one write.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from boxqueue.errcodes import BoxError
from boxqueue.spaces.msgpack_values import pack_flat
from boxqueue.spaces.space import REPLACE, Space, decode_tuple
from boxqueue.tubes.engine_base import (
    CLAIM_RECORDS,
    SINK_MARKS,
    BatchError,
    now_us,
)
from boxqueue.tubes.kinds import TubeKind
from boxqueue.tubes.monitors import Monitors
from boxqueue.tubes.task import Task
from boxqueue.tubes.tube import Claim, Tube

# A mark's key: (writer, batch, partition, digest, chunk).
Mark = list[Any]
ITERATOR_EQ = 0


class Streams(Monitors):
    if TYPE_CHECKING:  # what this part calls of the others (QueueEngine composes them all)
        from boxqueue.spaces.later import Later
        from boxqueue.tubes.engine_base import QueueSpace

        async def _open_records(self) -> None: ...

        def listed_claim(self, space_id: int, tube_name: str, claim_id: str, *, ttl: int, limit: int,
                         created: tuple[int, int] | None = None) -> Later[int]: ...

        def present_claim(self, space_id: int, tube_name: str, claim_id: str) -> Claim | None: ...

        def live_claim(self, space_id: int, tube_name: str, claim_id: str) -> Claim | None: ...

        def claimed_tasks(self, space_id: int, tube_name: str, claim: Claim) -> list[Task]: ...

        def renew_claim(self, space_id: int, tube_name: str, claim_id: str, *, ttl: int, grace: int
                        ) -> Later[bool]: ...

        def new_puts(self, queue_space: QueueSpace, tube: Tube,
                     items: list[tuple[int, int | None, int | None, Any, list[Any]]]) -> list[tuple[Task, list[Any]]]: ...

    _marking: set[tuple[Any, ...]]  # marks being written (QueueEngine sets it)

    # -- the source's batches ------------------------------------------------------------------

    async def claim_batch(self, space_id: int, tube_name: str, claim_id: str, *, limit: int, ttl: int,
                          created: tuple[int, int] | None = None) -> int:
        """How many tasks claim ``claim_id`` holds: made now with up to ``limit`` free tasks
        (created in the range ``created``, if given) unless it exists already, as it does when a
        driver asks again after a restart or a lost answer. 0 if nothing is free, or if that claim
        lapsed and its tube's monitor has not ended it yet (it will)."""
        await self._open_records()
        claim = self.present_claim(space_id, tube_name, claim_id)
        if claim is not None:
            return len(claim.tasks) if claim.expires > now_us() else 0
        return await self.listed_claim(space_id, tube_name, claim_id, ttl=ttl, limit=limit, created=created)

    def claim_tasks(self, space_id: int, tube_name: str, claim_id: str, after: int, limit: int) -> list[bytes]:
        """The stored tuples of the live tasks claim ``claim_id`` holds, created after ``after``,
        in creation order, at most ``limit`` (none once the claim has lapsed)."""
        claim = self.live_claim(space_id, tube_name, claim_id)
        if claim is None:
            return []
        wanted = [task for task in self.claimed_tasks(space_id, tube_name, claim) if task.created > after]
        return self.stored_of_claim(self.queue_space(space_id), wanted[:limit], claim)

    async def renew_batch(self, space_id: int, tube_name: str, claim_ids: Iterable[str], ttl: int) -> int:
        """The claims that live get ``ttl`` from now, where less than half of it is left (a
        renewal moves every task a claim holds in memory, and writes the claim's record); how many
        live."""
        live = 0
        for claim_id in claim_ids:
            claim = self.live_claim(space_id, tube_name, claim_id)
            if claim is None:
                continue
            live += 1
            if claim.expires - now_us() < ttl // 2:
                await self.renew_claim(space_id, tube_name, claim_id, ttl=ttl, grace=0)
        return live

    async def ack_batch(self, space_id: int, tube_name: str, claim_ids: Iterable[str]) -> int:
        """The tasks the claims hold are deleted with the claims, one write a claim (a claim that
        lapsed but is not ended yet too: its batch is done with them); how many tasks."""
        queue_space = self.queue_space(space_id)
        pending = []
        for claim_id in claim_ids:
            claim = self.present_claim(space_id, tube_name, claim_id)
            if claim is None:
                continue
            tube = self.tubes[(space_id, tube_name)]
            held = claim.tasks
            # In the order they were claimed (a listed claim's; by id otherwise): their LMDB
            # entries lie together, in creation order, as their ids do.
            order = sorted(held) if claim.listed is None else [i for i in claim.listed if i in held]
            tasks = [tube.tasks[i] for i in order]
            tube.unplace_claim(claim)
            record = self._record_write(CLAIM_RECORDS, None, [space_id, tube_name, claim.id])

            def put_back(tube: Any = tube, claim: Claim = claim) -> None:
                tube.place_claim(claim)

            pending.append((len(tasks), self._batch(queue_space, tube, deletes=tasks, records=[record],
                                                    undo_extra=put_back)))
        acked = 0
        error: BaseException | None = None
        for count, later in pending:
            try:
                await later
                acked += count
            except BaseException as exc:  # every write is awaited, the first error is raised
                error = error or exc
        if error is not None:
            raise error
        return acked

    # -- the sink's marked writes --------------------------------------------------------------

    def _marked(self, mark: Mark) -> bool:
        """Whether ``mark`` is written, or being written."""
        key = tuple(mark[:5])
        return key in self._marking or self._records[SINK_MARKS].get(0, list(key)) is not None

    async def put_marked(self, space_id: int, tube_name: str, items: list[tuple[int, int | None, int | None, int, list[Any]]],
                         mark: Mark | None, kind: TubeKind | None = None) -> int | None:
        """Tasks ``(delay, ttl, ttr, pri, data)`` (box.queue's units and stored priority), put in
        one write with ``mark``; None, and nothing written, if that mark is written already."""
        await self._open_records()
        queue_space = self.queue_space(space_id)
        if mark is not None and self._marked(mark):
            return None
        tube = self._tube(queue_space, tube_name)
        records, options = self._adopt(queue_space, tube, kind)
        tube.pending += 1  # a numbered tube's ids handed out here count as taken (Tube.next_number)
        try:
            inserts = self.new_puts(queue_space, tube, items)
        finally:
            tube.pending -= 1
        if mark is not None:
            records.append(self._record_write(SINK_MARKS, [*mark[:5], len(items), now_us()], []))
        return await self._with_mark(mark, lambda: self._batch(queue_space, tube, inserts=inserts, records=records),
                                     len(items), options, tube)

    async def replace_marked(self, space: Space, tuples: list[list[Any]], mark: Mark | None) -> int | None:
        """REPLACE every tuple into ``space`` in one write with ``mark``; None, and nothing
        written, if that mark is written already. Every tuple is checked before anything is."""
        await self._open_records()
        if mark is not None and self._marked(mark):
            return None
        writes = []
        for row, fields in enumerate(tuples):
            try:
                writes.append(space.prepare_put(pack_flat(fields), fields, REPLACE))
            except BoxError as exc:
                raise BoxError(exc.code, message=f"row {row}: {exc.message}", error_type=exc.error_type) from None
        if mark is not None:
            writes.append(self._record_write(SINK_MARKS, [*mark[:5], len(tuples), now_us()], []))

        def write(txn: Any) -> None:
            try:
                for fn in writes:
                    fn(txn)
            except BoxError as exc:  # part of it written: the committer must roll back
                raise BatchError(f"a write into space {space.name!r} failed: {exc.message}") from exc

        async def submit() -> None:
            await self.committer.write(write)

        return await self._with_mark(mark, submit, len(tuples), None, None)

    async def _with_mark(self, mark: Mark | None, write: Any, count: int, options: dict[str, Any] | None,
                         tube: Any) -> int:
        key = None if mark is None else tuple(mark[:5])
        if key is not None:
            self._marking.add(key)
        try:
            await write()
        finally:
            if key is not None:
                self._marking.discard(key)
        if tube is not None and options is not None and tube.options is None and not tube.dropped:
            tube.options = options
        return count

    async def forget_marks(self, writer: str, below_batch: int) -> int:
        """Delete the marks of ``writer``'s batches before ``below_batch`` (Spark runs none of
        them again once it commits that batch); how many."""
        await self._open_records()
        marks = self._records[SINK_MARKS]
        doomed = []
        for raw in marks.pairs(0, ITERATOR_EQ, [writer]):
            fields = decode_tuple(raw)
            if fields[1] < below_batch:
                doomed.append(fields[:5])
        if not doomed:
            return 0
        writes = [self._record_write(SINK_MARKS, None, key) for key in doomed]

        def write(txn: Any) -> None:
            for fn in writes:
                fn(txn)

        await self.committer.write(write)
        return len(doomed)
