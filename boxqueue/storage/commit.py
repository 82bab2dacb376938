"""Group commit: many concurrent writes, one LMDB transaction, one flush.

A write is a function of the write transaction. :meth:`GroupCommitter.write` (or :meth:`submit`,
with a callback) queues it; the committer task takes everything queued, runs it in one transaction
on the event loop and commits. A reply is sent only once the commit holding its write is durable
as the mode says, and readers see a group only then (:meth:`Storage.committed`).

In ``fsync`` mode the write functions get a :class:`storage.redo.RedoTxn`, which notes every
change; the group's changes become one record of the write-ahead log (:mod:`boxqueue.storage.wal`). A
thread of its own (:mod:`boxqueue.storage.log_thread`) appends the record and commits LMDB (without
flushing it); then the log is flushed with one ``fdatasync`` in that thread while the event loop keeps serving reads, and,
when many writes wait, applies the next batch; the batch grows with the load and one flush covers many writes. A background checkpoint (:meth:`checkpoint`)
switches the log to a new segment, flushes LMDB and deletes the segments LMDB now holds. In
``write`` and ``none`` modes there is no log and no flush: the commit runs on the event loop.

The transaction is begun on the event loop thread and committed in a worker thread. LMDB's own
writer lock would forbid that (a mutex must be released by the thread that took it), so the
environment is opened without LMDB's locks and :class:`storage.environment.Storage` guarantees
what they guaranteed: one writer (this committer) and one process (a lock file).

A write either completes or raises one of the ``rejections`` given to the committer, in which case
it must have written nothing (it validates before it writes). Any other exception means a write
may be half done, so the whole batch is rolled back and each write is run again in a transaction
of its own: the faulty one fails alone.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import lmdb
import trio

from boxqueue.measures import BATCH_BOUNDS, Histogram
from boxqueue.storage import redo
from boxqueue.storage.environment import Storage, StorageError
from boxqueue.storage.log_thread import LogThread
from boxqueue.storage.redo import RedoTxn
from boxqueue.storage.wal import encode_record
from boxqueue.storage.write_queue import Done, Write, WriteQueue

log = logging.getLogger(__name__)

WriteFn = Callable[[lmdb.Transaction], Any]
# Writes waiting when LMDB has a group for the commit loop to apply the next group during the
# group's flush. Fewer, and the next group waits for the flush and takes what came meanwhile:
# with 16 sequential clients that cut the server's CPU per queue cycle by 15-20%
# (docs/performance.md); the pipelined cycle, where hundreds of writes wait, keeps its overlap,
# and so does a leader that feeds followers.
EARLY_NEXT_GROUP = 32
__all__ = ["Done", "GroupCommitter", "WriteFn"]


class GroupCommitter:
    """Runs queued writes in shared transactions; owned by the server's nursery (:meth:`run`),
    which also owns the checkpoints of the write-ahead log."""

    def __init__(
        self,
        storage: Storage,
        rejections: tuple[type[BaseException], ...] = (),
        max_batch: int = 4096,
    ) -> None:
        self._storage = storage
        self._rejections = rejections
        self._max_batch = max_batch
        self._queue = WriteQueue(rejections)
        # ``submit(fn, done, *, after_commit=None, exclusive=False)``: queue ``fn`` without
        # waiting; ``done(result, error)`` runs on the event loop once the commit holding it
        # returns (StorageError once the committer has stopped). This is what the iproto
        # connection and the engine use, so a write costs no task of its own, and no Python
        # frame: it is the compiled queue's own method.
        self.submit: Callable[..., None] = self._queue.submit
        self._log = storage.log
        self._log_thread = LogThread()  # appends and flushes each group (fsync mode)
        self._names = storage.names
        # Held from a group's append until it is flushed and answered, or by a checkpoint's
        # switch of segments (a semaphore: the flusher task releases what the committer took).
        self._log_free = trio.Semaphore(1)
        self._flushing: tuple[Any, ...] | None = None  # the group handed to the flusher
        self._flush_wanted = trio.Event()
        self._checkpoint_due = trio.Event()
        self._checkpointed_lsn = storage.lsn
        # Since when groups fail for lack of disk space (None: the last one did not): a leader
        # that cannot write steps aside for one that can (boxqueue.replication.leading).
        self.no_space_since: float | None = None
        self.batches = 0
        self.writes = 0
        self.checkpoints = 0
        self.batch_sizes = Histogram(BATCH_BOUNDS)  # writes per commit
        self.commit_seconds = Histogram()  # from a batch's start to its answer (the log's flush included)
        # -- replication (the ``replication`` room sets these) --
        # Called on the event loop with (lsn, term, payload) of each logged record once LMDB has
        # it (before its flush): what a leader streams to its followers.
        self.feed: Callable[[int, int, bytes], None] | None = None
        # A leader waiting for a quorum (``boxqueue.replication.quorum``): told of each of its
        # own groups once durable here (``durable(lsn)``), and asked whether a group that changed
        # nothing may be answered (``holds_back(lsn)``: what it read may not be confirmed yet);
        # it answers with :meth:`confirm`, or :meth:`settle_unknown` once it gives up. Groups
        # wait in ``_awaiting`` meanwhile, as (the LSN to confirm, the writes, when begun).
        self.quorum: Any = None
        self._awaiting: deque[tuple[int, list[Write], float]] = deque()
        # The lowest LSN the log must keep for followers that are behind (None: no need).
        self.keep_from: Callable[[], int | None] | None = None
        # Called before and after each group's callbacks run (the iproto server sends the
        # answers they wrote at the end: boxqueue/iproto/group_sends.py).
        self.around_answers: tuple[Callable[[], None], Callable[[], None]] | None = None

    def refuse_writes(self, error: Callable[[], BaseException] | None) -> None:
        """From now on :meth:`submit` (and so :meth:`write`) raises ``error()`` at once, before
        anything is queued; None: writes are taken again. A follower of a replica set refuses
        every write this way, below every caller; its replication applier writes through
        :meth:`log_replicated`, which is never refused."""
        if error is None:
            self.submit = self._queue.submit
            return

        def refused(fn: WriteFn, done: Done, *, after_commit: Callable[[Any], None] | None = None,
                    exclusive: bool = False) -> None:
            raise error()

        self.submit = refused

    @property
    def refusing(self) -> bool:
        return self.submit is not self._queue.submit

    async def log_replicated(self, records: list[tuple[int, int, bytes, list[redo.Op]]], done: Done) -> None:
        """Log records received from the leader, each ``(lsn, term, payload, its operations)``,
        and flush them; then queue them to be applied to LMDB (taken even while client writes
        are refused), ``done(None, error)`` once each is. A follower acknowledges a record as
        soon as this returns: the apply is not waited for, since a restart replays the log past
        LMDB's position. So once the records are logged they are queued whatever happens to the
        caller (shielded), and ``done`` must treat a failed apply as fatal: the leader counts a
        record this node would not hold.

        Raises :class:`StorageError`, having logged none of them, when the log cannot take them:
        the disk has no room (for the log, or for LMDB's reserve, which their apply must find),
        the committer has stopped, or they do not follow the log's last record."""
        storage = self._storage
        log_free = self._log_free
        with trio.CancelScope(shield=True):
            try:  # (without a pass of the scheduler when it is free, as it mostly is on a follower)
                log_free.acquire_nowait()
            except trio.WouldBlock:
                await log_free.acquire()
            try:
                if self._queue.closed:
                    raise StorageError("storage is closed")
                lsn = storage.logged_lsn
                for record in records:
                    lsn += 1
                    if record[0] != lsn:
                        raise StorageError(f"replicated record {record[0]} does not follow this log's last record "
                                           f"{lsn - 1}")
                storage.ensure_room()
                data = b"".join([encode_record(lsn, payload, term) for lsn, term, payload, _ops in records])
                log_thread = self._log_thread
                if log_thread.running:  # free: the committer's calls hold _log_free
                    log_thread.start(self._append_replicated, data, lsn, records[-1][1])
                    await log_thread.result()
                else:
                    await log_thread.call(self._append_replicated, data, lsn, records[-1][1])
                queue = self._queue
                for lsn, term, _payload, ops in records:
                    item = Write(_Replay(storage, ops), None, True, done)
                    item.lsn, item.term = lsn, term
                    queue.pending.append(item)  # (past a closed queue too: the final drain takes it)
                wakeup = queue.wakeup
                if wakeup is not None:
                    queue.wakeup = None
                    wakeup.set()
            finally:
                log_free.release()
        if self._log is not None and self._log.size >= storage.checkpoint_bytes:
            self._checkpoint_due.set()

    def _append_replicated(self, record: bytes, lsn: int, term: int) -> None:
        """In the log thread: append a follower's records (see :meth:`log_replicated`) and flush."""
        wal = self._log
        assert wal is not None  # a replica set's members run in fsync mode
        try:
            wal.append(record)
        except OSError as exc:
            raise StorageError(f"cannot write the write-ahead log: {exc}",
                               no_space=exc.errno in (errno.ENOSPC, errno.EDQUOT)) from exc
        storage = self._storage
        storage.logged_term = term
        storage.logged_lsn = lsn
        try:
            wal.sync()
        except OSError as exc:  # as in _write_group: whether they reached the disk is unknown
            self.fatal(f"the write-ahead log could not be flushed: {exc}")
        storage.synced_lsn = lsn

    async def reset_log(self, lsn: int, term: int) -> None:
        """After a fresh copy (see :meth:`storage.environment.Storage.reset_log`), between groups."""
        async with self._log_free if self._log is not None else _nothing():
            await trio.to_thread.run_sync(self._storage.reset_log, lsn, term)
            self._log = self._storage.log
            self._checkpointed_lsn = lsn

    async def write_local(self, fn: WriteFn) -> Any:
        """:meth:`submit_local`, awaited: ``fn``'s result once it is flushed."""
        waiter = trio.lowlevel.current_task()
        outcome: list[Any] = []

        def done(result: Any, error: BaseException | None) -> None:
            outcome.extend((result, error))
            trio.lowlevel.reschedule(waiter)

        self.submit_local(fn, done)
        await trio.lowlevel.wait_task_rescheduled(_refuse_cancel)
        result, error = outcome
        if error is not None:
            raise error
        return result

    async def open_db(self, name: bytes) -> Any:
        """The handle of the named database ``name`` if it exists (opened in a write transaction
        of its own, which LMDB needs for a handle to outlive it), else None."""
        handle = self._storage.existing_db(name)
        if handle is not None:
            return handle
        storage = self._storage

        def open_existing(txn: lmdb.Transaction) -> Any:
            try:
                return storage.db(name, txn=txn, create=False)
            except lmdb.NotFoundError:
                return None

        return await self.write_local(open_existing)

    def submit_local(self, fn: WriteFn, done: Done) -> None:
        """Queue a write of this node's own metadata (not replicated, not in the log): committed
        alone and LMDB flushed before ``done``; taken even while client writes are refused."""
        self._queue.submit_local(fn, done)

    # -- a leader's quorum -------------------------------------------------------------------

    def confirm(self, lsn: int) -> None:
        """A quorum holds every group up to ``lsn``: answer them."""
        awaiting = self._awaiting
        while awaiting and awaiting[0][0] <= lsn:
            _lsn, batch, started = awaiting.popleft()
            self._finish(batch, started)

    @property
    def awaiting(self) -> int:
        """Groups committed here that wait for a quorum."""
        return len(self._awaiting)

    def oldest_awaiting(self) -> int | None:
        return self._awaiting[0][0] if self._awaiting else None

    def settle_unknown(self, error: BaseException) -> None:
        """The leader gives up on the waiting groups: no quorum confirmed them, yet a future leader
        may keep them, so their writers hear ``error`` (an unknown outcome), the last group
        first, so that each writer's own undo (the engine puts its memory back) sees the state
        its write left. Nothing is taken back: the incarnation that holds them ends."""
        awaiting = self._awaiting
        while awaiting:
            _lsn, batch, started = awaiting.pop()
            for item in batch:
                item.error = error
            self._finish(list(reversed(batch)), started)

    def drop_pending(self, error: BaseException) -> None:
        """Refuse, with ``error``, every client write queued but not yet applied: none of them
        reached the log, so they failed for certain. Records from the leader and this node's own
        metadata stay queued."""
        queue = self._queue
        dropped = [item for item in queue.pending if not item.lsn and not item.local]
        if not dropped:
            return
        queue.pending = [item for item in queue.pending if item.lsn or item.local]
        for item in dropped:
            item.error = error
        self._finish(dropped, time.perf_counter())

    async def write(
        self,
        fn: WriteFn,
        *,
        after_commit: Callable[[Any], None] | None = None,
        exclusive: bool = False,
    ) -> Any:
        """Run ``fn(txn)`` in the next batch; return its result once it is durable.

        ``after_commit(result)`` runs on the event loop right after the commit, in commit order,
        before any writer is woken. ``exclusive`` writes (schema changes) get a batch of their own.
        Cancelling the caller does not withdraw a queued write.
        """
        waiter = trio.lowlevel.current_task()
        outcome: list[Any] = []

        def done(result: Any, error: BaseException | None) -> None:
            outcome.extend((result, error))
            trio.lowlevel.reschedule(waiter)

        self.submit(fn, done, after_commit=after_commit, exclusive=exclusive)
        # An uncancellable wait (the write happens anyway, and callers rely on hearing how it
        # went), without the cost of a shielded cancel scope on every write.
        await trio.lowlevel.wait_task_rescheduled(_refuse_cancel)
        result, error = outcome
        if error is not None:
            raise error
        return result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self._log is not None:
                # What was written before the committer ran (the catalogue's start-up writes)
                # went to LMDB unlogged: flush it before any logged group depends on it.
                await trio.to_thread.run_sync(self._storage.sync)
                await nursery.start(self._log_thread.run)
                nursery.start_soon(self._flusher)
                nursery.start_soon(self._checkpoints)
            task_status.started()
            try:
                await self._commit_loop()
            finally:
                self._stop_flusher()
                nursery.cancel_scope.cancel()
                log.info(
                    "group commit: %d writes in %d groups, %d checkpoints", self.writes, self.batches, self.checkpoints
                )

    async def _commit_loop(self) -> None:
        queue = self._queue
        try:
            while True:
                if not queue.pending:
                    wakeup = queue.wakeup = trio.Event()
                    await wakeup.wait()
                    continue
                batch = queue.next_batch(self._max_batch)
                with trio.CancelScope(shield=True):
                    await self._commit(batch)
        finally:
            queue.closed = True
            queue.wakeup = None
            with trio.CancelScope(shield=True):
                while True:
                    while queue.pending:
                        await self._commit(queue.next_batch(self._max_batch))
                    if self._log is None:
                        break
                    async with self._log_free:  # the last group's flush and replies ...
                        pass
                    if not queue.pending:  # ... and the records a follower logged meanwhile
                        break
                # What still waits for a quorum is not acknowledged: its writers hear that its
                # outcome is unknown (the leader's part normally says so before the committer stops).
                if self._awaiting and self.quorum is not None:
                    self.quorum.abandon("the server stopped before a quorum confirmed the write")

    async def _commit(self, batch: list[Write]) -> None:
        """Apply and commit ``batch``; answer it, or (a logged group) leave that to the flusher."""
        started = time.perf_counter()
        try:
            first = batch[0]
            # Records of the leader had the reserve checked before they were logged
            # (log_replicated): the rest of it is theirs to use.
            if not first.lsn:
                self._storage.ensure_room()
            if first.local:
                await self._commit_local(first)
            else:
                txn = self._apply(batch)
                if txn is None:
                    batch = await self._one_by_one(batch, started)
                elif type(txn) is not RedoTxn:
                    self._commit_unlogged(txn)
                elif await self._log_group(txn, batch, started, forced=first.lsn != 0):
                    # One pass of the scheduler before the next batch is taken: the requests
                    # read in it join that batch. With 16 sequential consumers a group grew from
                    # 8.4 to 12.1 writes, and the server's CPU per cycle fell by about a fifth.
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    return
        except BaseException as exc:  # the commit itself failed: nothing of the batch is durable
            if isinstance(exc, StorageError) and exc.no_space and self.no_space_since is None:
                self.no_space_since = time.monotonic()
            for item in batch:
                if item.error is None:
                    item.error = _as_storage_error(exc)
        self._finish(batch, started)

    def _finish(self, batch: list[Write], started: float) -> None:
        """The batch is durable (or failed): readers see it, hooks run, writers are answered."""
        self._storage.committed()
        self.batches += 1
        self.writes += len(batch)
        self.batch_sizes.observe(len(batch))
        self.commit_seconds.observe(time.perf_counter() - started)
        around = self.around_answers
        if around is None:
            self._queue.finish(batch)
            return
        around[0]()
        try:
            self._queue.finish(batch)
        finally:
            around[1]()

    def _begin(self) -> Any:
        """A write transaction: a redo-noting one when there is a log, which also keeps what
        undoes it while a quorum must confirm it."""
        txn = self._storage.env.begin(write=True)
        if self._log is None:
            return txn
        return RedoTxn(txn, self._names)

    async def _commit_local(self, item: Write) -> None:
        """This node's own metadata: unlogged, committed and flushed alone."""
        txn = self._storage.env.begin(write=True)
        try:
            item.result = item.fn(txn)
        except BaseException as exc:
            self._abort(txn)
            item.error = _as_storage_error(exc)
            return
        async with self._log_free if self._log is not None else _nothing():
            self._commit_unlogged(txn)
            await trio.to_thread.run_sync(self._storage.sync)

    def _apply(self, batch: list[Write]) -> Any:
        """Run the batch in a new transaction; None if a write failed half-way (rolled back)."""
        txn = self._begin()
        if not self._queue.apply(txn, batch):
            self._abort(txn)
            return None
        return txn

    # -- the logged path (fsync mode) ----------------------------------------------------------
    #
    # A group goes through three steps: applied on the event loop (its RedoTxn); then, in the
    # log thread (handed over by the commit loop once applied, its answer awaited by the flusher
    # task), appended to the log and committed to LMDB (without flushing LMDB), and the log
    # flushed. When LMDB has the group and at least EARLY_NEXT_GROUP writes wait (or followers
    # are fed), the thread tells the event loop (``committed``) at once, which applies the next
    # batch while the flush runs; otherwise the loop hears it with the flush. The next group's
    # append waits for that flush and the replies (``_log_free``), so groups are answered in order, and readers, which move on only when a group is answered,
    # never see a group that is not on disk. A checkpoint's switch of segments takes
    # ``_log_free`` too.

    async def _log_group(
        self, txn: RedoTxn, batch: list[Write], started: float = 0.0, *, alone: bool = False,
        forced: bool = False,
    ) -> bool:
        """Hand a group to the flusher and return once LMDB has it (or it failed); True if the
        flusher answers it. ``alone``: append, commit and flush here, and let the caller answer.
        ``forced``: records received from the leader, in the log already (:meth:`log_replicated`)."""
        raw = txn.txn
        if forced:
            self._commit_logged(raw, batch)
            return False
        if not txn.ops:  # nothing changed: nothing to log. What the writes read must be durable.
            async with self._log_free:
                self._commit_unlogged(raw)
            # ... and, on a leader waiting for quorums, confirmed: a write that found nothing to
            # change (a compare-and-set that did not match, an update with no operations) is
            # answered as a read of everything before it, which a quorum must hold first.
            quorum = self.quorum
            if quorum is not None and not alone and quorum.holds_back(self._storage.lsn):
                self._awaiting.append((self._storage.lsn, batch, started))
                quorum.waiting(self._storage.lsn)
                return True
            return False
        storage = self._storage
        if storage.logged_lsn != storage.lsn:
            # Records of a leader this node followed are logged and not applied yet: this
            # group's record would take an LSN the log holds already.
            self._abort(raw)
            raise StorageError(f"the log holds records up to {storage.logged_lsn}, LMDB up to {storage.lsn}")
        lsn = storage.lsn + 1
        term = storage.term
        payload = txn.encode()
        fed = [(lsn, term, payload)]
        record = encode_record(lsn, payload, term)
        storage.note_lsn(raw, lsn, term)
        await self._log_free.acquire()
        if alone:
            try:
                await self._log_thread.call(self._write_group, raw, record, lsn, term, None)
            finally:
                self._log_free.release()
            self._fed(fed)
            return False
        committed = trio.Event()
        token = trio.lowlevel.current_trio_token()
        queue = self._queue

        def in_lmdb() -> None:
            committed.set()
            self._fed(fed)  # followers get it while it is flushed here

        def in_lmdb_now() -> None:
            # In the log thread. Told early, the commit loop applies the next group while this
            # one is flushed; worth it only when many writes wait: else the writes that arrive
            # during the flush make the next group bigger, and a group's fixed cost is shared by
            # more of them. Followers are always told early: they flush while this node does.
            if self.feed is not None or len(queue.pending) >= EARLY_NEXT_GROUP:
                token.run_sync_soon(in_lmdb)

        # The thread starts on the group now; the flusher awaits it and answers the group.
        # (Handed over by the flusher, the group waited for the rest of the scheduler's batch,
        # the other connections' requests, before its flush began.)
        early = self._log_thread.running
        if early:
            self._log_thread.start(self._write_group, raw, record, lsn, term, in_lmdb_now)
        self._flushing = (raw, record, lsn, term, batch, committed, started, in_lmdb, in_lmdb_now, early)
        self._flush_wanted.set()
        await committed.wait()
        return True

    @staticmethod
    def fatal(why: str) -> None:
        """Stop the process now, answering nothing more (see where it is called). A staticmethod
        so that a test can put something else in its place."""
        log.critical("stopping at once: %s", why)
        logging.shutdown()
        os._exit(70)  # EX_SOFTWARE

    def _fed(self, records: list[tuple[int, int, bytes]]) -> None:
        """Tell the replication feed of a group's records: (lsn, term, payload) each."""
        if self.feed is not None:
            for lsn, term, payload in records:
                try:
                    self.feed(lsn, term, payload)
                except Exception:
                    log.exception("the replication feed failed on record %d", lsn)

    def _write_group(
        self, raw: lmdb.Transaction, record: bytes, lsn: int, term: int, committed: Callable[[], None] | None
    ) -> None:
        """In a worker thread: write the record, commit LMDB, say so (``committed``, which must
        be safe to call from a thread), flush the log. A group that fails to commit takes its
        record back out."""
        wal = self._log
        assert wal is not None  # only groups of a logged mode are written
        start = wal.size
        try:
            wal.append(record)
        except OSError as exc:
            self._abort(raw)
            raise StorageError(f"cannot write the write-ahead log: {exc}",
                               no_space=exc.errno in (errno.ENOSPC, errno.EDQUOT)) from exc
        try:
            raw.commit()
            self._storage.txn_ended(True)
        except lmdb.Error as exc:
            self._storage.txn_ended(False)
            try:
                wal.cut_back(start)
            except OSError as cut:
                # The record stays in the log, so a restart would replay a write its writers
                # were told failed: no answer may be given at all.
                self.fatal(f"cannot take a failed group out of the write-ahead log: {cut}")
            raise StorageError(f"commit failed: {exc}") from exc
        storage = self._storage
        storage.logged_term = term
        storage.logged_lsn = storage.lsn = lsn
        if committed is not None:
            committed()
        try:
            wal.sync()
        except OSError as exc:
            # Whether the record reached the disk is unknown, LMDB already holds the group, and
            # followers may have it: neither "done" nor "failed" would be true. As PostgreSQL
            # does after a failed fsync, stop at once: the writers see their connection end.
            self.fatal(f"the write-ahead log could not be flushed: {exc}")
        self._storage.synced_lsn = lsn

    async def _flusher(self) -> None:
        """Writes, commits and flushes each group handed to it, then answers it. Shielded: it
        stops when the commit loop says so (:meth:`_stop_flusher`), after its last group."""
        with trio.CancelScope(shield=True):
            while True:
                await self._flush_wanted.wait()
                self._flush_wanted = trio.Event()
                group = self._flushing
                self._flushing = None
                if group is None:
                    return
                raw, record, lsn, term, batch, committed, started, in_lmdb, in_lmdb_now, early = group
                failed = False
                try:
                    if early:
                        await self._log_thread.result()
                    else:
                        await self._log_thread.call(self._write_group, raw, record, lsn, term, in_lmdb_now)
                except BaseException as exc:
                    failed = True
                    if isinstance(exc, StorageError) and exc.no_space and self.no_space_since is None:
                        self.no_space_since = time.monotonic()
                    for item in batch:
                        if item.error is None:
                            item.error = _as_storage_error(exc)
                if not failed:
                    self.no_space_since = None
                if not committed.is_set() and self._storage.lsn >= lsn:
                    in_lmdb()  # LMDB has the group (its LSN is noted), and the loop was not told early
                committed.set()  # (already, unless the group failed before LMDB had it)
                if not failed and self.quorum is not None:
                    self._awaiting.append((lsn, batch, started))
                    self.quorum.durable(lsn)
                else:
                    self._finish(batch, started)
                self._log_free.release()
                if self._log is not None and self._log.size >= self._storage.checkpoint_bytes:
                    self._checkpoint_due.set()

    def _stop_flusher(self) -> None:
        self._flushing = None
        self._flush_wanted.set()

    async def _one_by_one(self, batch: list[Write], started: float) -> list[Write]:
        """Each write of a batch that failed half-way in a group of its own; returns the writes
        to answer now (a leader's logged ones wait for its quorum instead)."""
        answer_now = []
        for item in batch:
            item.result = item.error = None
            txn = self._begin()
            try:
                item.result = item.fn(txn)
            except self._rejections as exc:
                item.error = exc
                self._abort(txn)
                answer_now.append(item)
                continue
            except Exception as exc:
                item.error = _as_storage_error(exc)
                self._abort(txn)
                answer_now.append(item)
                continue
            try:
                if type(txn) is RedoTxn:
                    before = self._storage.lsn
                    await self._log_group(txn, [item], alone=True, forced=item.lsn != 0)
                    quorum = self.quorum
                    if quorum is not None and item.lsn == 0:
                        lsn = self._storage.lsn
                        if lsn > before:
                            self._awaiting.append((lsn, [item], started))
                            quorum.durable(lsn)
                            continue
                        if quorum.holds_back(lsn):  # it changed nothing: a read of what is before it
                            self._awaiting.append((lsn, [item], started))
                            quorum.waiting(lsn)
                            continue
                else:
                    self._commit_unlogged(txn)
            except StorageError as exc:
                item.error = exc
            answer_now.append(item)
        return answer_now

    def _abort(self, txn: Any) -> None:
        (txn.txn if isinstance(txn, RedoTxn) else txn).abort()
        self._storage.txn_ended(False)

    def _commit_logged(self, raw: lmdb.Transaction, batch: list[Write]) -> None:
        """Commit records of the leader that the log holds already (on the event loop: LMDB is
        not flushed here, so the commit is short)."""
        storage = self._storage
        lsn = storage.lsn
        for item in batch:
            lsn += 1
            if item.lsn != lsn:
                self._abort(raw)
                raise StorageError(f"replicated record {item.lsn} does not follow LMDB's last record {lsn - 1}")
        storage.note_lsn(raw, lsn, batch[-1].term)
        self._commit_unlogged(raw)
        storage.lsn = lsn

    def _commit_unlogged(self, txn: lmdb.Transaction) -> None:
        try:
            txn.commit()
        except lmdb.Error as exc:
            self._storage.txn_ended(False)
            raise StorageError(f"commit failed: {exc}") from exc
        self._storage.txn_ended(True)

    # -- checkpoints -------------------------------------------------------------------------

    async def _checkpoints(self) -> None:
        interval = self._storage.checkpoint_interval_s
        while True:
            with trio.move_on_after(interval):
                await self._checkpoint_due.wait()
            self._checkpoint_due = trio.Event()
            if self._storage.lsn > self._checkpointed_lsn:
                try:
                    await self.checkpoint()
                except (OSError, lmdb.Error):
                    log.exception("checkpoint failed; the write-ahead log is kept and it will be tried again")

    async def checkpoint(self) -> None:
        """Switch the log to a new segment, flush LMDB, delete the segments it made redundant.

        Groups go on committing meanwhile (LMDB's flush covers at least every group committed
        before the switch); only the switch waits for the group being flushed.
        """
        wal = self._log
        if wal is None:
            return
        async with self._log_free:
            # LMDB's flush below covers at least ``target``; a follower's log may hold more
            # (records logged and not applied yet), which the segment switched from keeps.
            target = self._storage.lsn
            await trio.to_thread.run_sync(wal.rotate, self._storage.logged_lsn + 1)
        await trio.to_thread.run_sync(self._storage.sync)
        keep = self.keep_from() if self.keep_from is not None else None
        async with self._log_free:
            await trio.to_thread.run_sync(wal.discard_through, target if keep is None else min(target, keep - 1))
        self._checkpointed_lsn = target
        self.checkpoints += 1


class _Replay:
    """The write of a record received from the leader: its operations replayed into the group's
    bare transaction (the record is in the log as it came; nothing is noted again)."""

    __slots__ = ("storage", "ops")

    def __init__(self, storage: Storage, ops: list[redo.Op]) -> None:
        self.storage = storage
        self.ops = ops

    def __call__(self, txn: RedoTxn) -> None:
        storage = self.storage
        redo.replay(txn.txn, self.ops, storage.open_logged, storage.forget_db, storage.watched)


class _nothing:
    """An async context manager that does nothing (no log to hold)."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None




def _refuse_cancel(_raise_cancel: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


def _as_storage_error(exc: BaseException) -> BaseException:
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, lmdb.Error):
        return StorageError(str(exc))
    return exc
