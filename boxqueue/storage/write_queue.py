"""The group committer's queue of writes, and the loops that run and answer a group of them.

Every write of every API passes through :meth:`WriteQueue.submit` once and through
:meth:`WriteQueue.apply` and :meth:`WriteQueue.finish` once, so these are compiled with Cython
(``write_queue.pxd``); the committer's coroutines stay in :mod:`boxqueue.storage.commit` (trio needs task
roots to be Python coroutines). The wake-up of the commit loop is an event it makes when it has
nothing to do, so a write queued while a group is being committed costs no event at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cython

from boxqueue.storage.environment import StorageError

if TYPE_CHECKING:
    import trio

log = logging.getLogger("boxqueue.storage.commit")

# Called on the event loop once the write is durable (error None) or has failed (result None).
Done = Callable[[Any, BaseException | None], None]


@cython.cclass
class Write:
    """One queued write: ``fn(txn)``, its hook and completion callback, and how it went."""

    def __init__(self, fn: Callable[[Any], Any], after_commit: Callable[[Any], None] | None,
                 exclusive: bool, done: Done) -> None:
        self.fn = fn
        self.after_commit = after_commit
        self.exclusive = exclusive
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = done
        self.lsn = 0  # a replicated record's own LSN (logged already; grouped with the next ones), else 0
        self.term = 0  # ... and its term
        self.local = False  # this node's own metadata: committed unlogged and flushed, never replicated


@cython.cclass
class WriteQueue:
    """Writes waiting for the next group. ``wakeup``: the event the idle commit loop waits on
    (None while it is busy); ``rejections``: the exceptions a write raises having written nothing."""

    def __init__(self, rejections: tuple[type[BaseException], ...]) -> None:
        self.pending: list[Write] = []
        self.closed = False
        self.wakeup: trio.Event | None = None
        self.rejections = rejections

    def submit(
        self,
        fn: Callable[[Any], Any],
        done: Done,
        *,
        after_commit: Callable[[Any], None] | None = None,
        exclusive: bool = False,
    ) -> None:
        """Queue ``fn``; ``done(result, error)`` runs on the event loop once its group is committed."""
        if self.closed:
            raise StorageError("storage is closed")
        self.pending.append(Write(fn, after_commit, exclusive, done))
        wakeup = self.wakeup
        if wakeup is not None:
            self.wakeup = None
            wakeup.set()

    def submit_local(self, fn: Callable[[Any], Any], done: Done) -> None:
        """Queue a write of this node's own metadata, alone in its group."""
        if self.closed:
            raise StorageError("storage is closed")
        item: Write = Write(fn, None, True, done)
        item.local = True
        self.pending.append(item)
        wakeup = self.wakeup
        if wakeup is not None:
            self.wakeup = None
            wakeup.set()

    @cython.locals(end=cython.Py_ssize_t, limit=cython.Py_ssize_t, item=Write)
    def next_batch(self, max_batch: cython.Py_ssize_t) -> list:
        """The next group: the first write alone if it is exclusive, else every write up to the
        next exclusive one (at most ``max_batch``). Records received from the leader are
        exclusive of client writes but share a group with the records that follow them, so a
        follower that falls behind catches up with one flush for many records."""
        pending = self.pending
        item = pending[0]
        if item.exclusive:
            end = 1
            if item.lsn:
                limit = min(len(pending), max_batch)
                while end < limit:
                    item = pending[end]
                    if not item.lsn:
                        break
                    end += 1
        else:
            end = 0
            limit = min(len(pending), max_batch)
            while end < limit:
                item = pending[end]
                if item.exclusive:
                    break
                end += 1
        batch = pending[:end]
        self.pending = pending[end:]
        return batch

    @cython.locals(item=Write)
    def apply(self, txn: Any, batch: list) -> bool:
        """Run the batch's writes in ``txn``; False if one failed half-way (the caller rolls the
        transaction back), having logged why."""
        rejections = self.rejections
        try:
            for item in batch:
                try:
                    item.result = item.fn(txn)
                except rejections as exc:
                    item.error = exc
        except Exception:
            log.exception("a write failed half-way; retrying the batch one write at a time")
            return False
        return True

    @cython.locals(item=Write)
    def finish(self, batch: list) -> None:
        """The batch is durable (or failed): hooks run in commit order, then writers are answered."""
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
