"""Group commit: many concurrent writes, one LMDB transaction, one flush.

A write is a function of the write transaction. :meth:`GroupCommitter.write` (or :meth:`submit`,
with a callback) queues it; the committer task takes everything queued, runs it in one transaction
on the event loop and commits. In ``fsync`` mode the commit, which writes and flushes the pages,
runs in a worker thread while the event loop keeps serving reads and queueing the next batch, so
the batch grows with the load and one flush covers many writes. A reply is sent only once the
commit holding its write has returned.

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

import logging
import time
from collections.abc import Callable
from typing import Any

import lmdb
import trio

from measures import BATCH_BOUNDS, Histogram
from storage.environment import Storage, StorageError

log = logging.getLogger(__name__)

WriteFn = Callable[[lmdb.Transaction], Any]


# Called on the event loop once the write is durable (error None) or has failed (result None).
Done = Callable[[Any, BaseException | None], None]


class _Write:
    __slots__ = ("fn", "after_commit", "exclusive", "result", "error", "done")

    def __init__(self, fn: WriteFn, after_commit: Callable[[Any], None] | None, exclusive: bool, done: Done):
        self.fn = fn
        self.after_commit = after_commit
        self.exclusive = exclusive
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = done


class GroupCommitter:
    """Runs queued writes in shared transactions; owned by the server's nursery (:meth:`run`)."""

    def __init__(
        self,
        storage: Storage,
        rejections: tuple[type[BaseException], ...] = (),
        max_batch: int = 4096,
    ) -> None:
        self._storage = storage
        self._rejections = rejections
        self._max_batch = max_batch
        self._pending: list[_Write] = []
        self._wakeup = trio.Event()
        self._in_thread = storage.wal_mode == "fsync"
        self._closed = False
        self.batches = 0
        self.writes = 0
        self.batch_sizes = Histogram(BATCH_BOUNDS)  # writes per commit
        self.commit_seconds = Histogram()  # from a batch's start to its commit returning (flush included)

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

    def submit(
        self,
        fn: WriteFn,
        done: Done,
        *,
        after_commit: Callable[[Any], None] | None = None,
        exclusive: bool = False,
    ) -> None:
        """Queue ``fn`` without waiting: ``done(result, error)`` runs on the event loop once the
        commit holding it returns. This is what the iproto connection uses, so a write costs no
        task of its own."""
        if self._closed:
            raise StorageError("storage is closed")
        self._pending.append(_Write(fn, after_commit, exclusive, done))
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                if not self._pending:
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                batch = self._next_batch()
                with trio.CancelScope(shield=True):
                    await self._commit(batch)
        finally:
            self._closed = True
            with trio.CancelScope(shield=True):
                while self._pending:
                    await self._commit(self._next_batch())

    def _next_batch(self) -> list[_Write]:
        pending = self._pending
        if pending[0].exclusive:
            batch, rest = pending[:1], pending[1:]
        else:
            end = 0
            limit = min(len(pending), self._max_batch)
            while end < limit and not pending[end].exclusive:
                end += 1
            batch, rest = pending[:end], pending[end:]
        self._pending = rest
        return batch

    async def _commit(self, batch: list[_Write]) -> None:
        started = time.perf_counter()
        try:
            txn = self._apply(batch)
            if txn is None:
                await self._one_by_one(batch)
            else:
                await self._flush(txn)
        except BaseException as exc:  # the commit itself failed: nothing of the batch is durable
            for item in batch:
                if item.error is None:
                    item.error = _as_storage_error(exc)
        self._storage.committed()
        self.batches += 1
        self.writes += len(batch)
        self.batch_sizes.observe(len(batch))
        self.commit_seconds.observe(time.perf_counter() - started)
        for item in batch:
            if item.error is None and item.after_commit is not None:
                try:
                    item.after_commit(item.result)
                except Exception:
                    log.exception("after-commit hook failed")
        for item in batch:
            try:
                item.done(item.result, item.error)
            except Exception:
                log.exception("write completion callback failed")

    def _apply(self, batch: list[_Write]) -> lmdb.Transaction | None:
        """Run the batch in a new transaction; None if a write failed half-way (rolled back)."""
        txn = self._storage.env.begin(write=True)
        try:
            for item in batch:
                try:
                    item.result = item.fn(txn)
                except self._rejections as exc:
                    item.error = exc
        except Exception:
            txn.abort()
            log.exception("a write failed half-way; retrying the batch one write at a time")
            return None
        return txn

    async def _flush(self, txn: lmdb.Transaction) -> None:
        """Commit; in fsync mode the commit (page writes and flushes) runs in a worker thread, which
        takes the GIL once at the end instead of competing for it on every call."""
        try:
            if self._in_thread:
                await trio.to_thread.run_sync(txn.commit)
            else:
                txn.commit()
        except lmdb.Error as exc:
            raise StorageError(f"commit failed: {exc}") from exc

    async def _one_by_one(self, batch: list[_Write]) -> None:
        env = self._storage.env
        for item in batch:
            item.result = item.error = None
            txn = env.begin(write=True)
            try:
                item.result = item.fn(txn)
            except self._rejections as exc:
                item.error = exc
                txn.abort()
                continue
            except Exception as exc:
                item.error = _as_storage_error(exc)
                txn.abort()
                continue
            try:
                await self._flush(txn)
            except StorageError as exc:
                item.error = exc


def _refuse_cancel(_raise_cancel: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


def _as_storage_error(exc: BaseException) -> BaseException:
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, lmdb.Error):
        return StorageError(str(exc))
    return exc
