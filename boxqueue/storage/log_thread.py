"""The write-ahead log's own thread: one OS thread for the group committer's appends and flushes.

``trio.to_thread.run_sync`` costs, per call, a capacity limiter, a hand-off to a cached worker
thread (which names itself with two ``prctl`` calls), and the outcome's trip back through the
event loop's wake-up socket. The committer makes one such call per durable group. One long-lived
thread fed by a queue, answering through an eventfd the caller polls, does the same with one
hand-off each way.

The thread is owned by a task (:meth:`LogThread.run`, started in the committer's nursery): started
there and joined when that task is cancelled, so nothing outlives its owner.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import outcome
import trio

__all__ = ["LogThread"]

CLOSE_WAIT_S = 10.0  # at the end, how long an answer the thread gave may wait for its caller


class LogThread:
    """Runs functions one at a time in its own thread; :meth:`call` awaits one.

    The thread says a function is done through an eventfd the caller waits on with
    ``trio.lowlevel.wait_readable``: the event loop's poll makes the caller runnable at once.
    Through the trio token (``run_sync_soon``), trio's entry-queue task would run first and
    reschedule the caller one batch of tasks later; with clients sending one request at a time
    that batch is the other connections' requests, and each group's answers waited for it."""

    def __init__(self, name: str = "boxqueue-log") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._done_fd = -1
        self._done: outcome.Outcome[Any] | None = None
        self._free = trio.Semaphore(1, max_value=1)  # one call at a time: the thread answers through one eventfd
        self._running = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the thread and keep it until cancelled; then let it finish what it was given and
        join it."""
        self._done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
        thread.start()
        self._running = True
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._running = False
            self._jobs.put(None)
            answered = False
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(thread.join)
                # A call handed over before the end is answered through the eventfd: its caller
                # reads it before it is closed (bounded, should that caller be gone).
                with trio.move_on_after(CLOSE_WAIT_S):
                    await self._free.acquire()
                    answered = True
            trio.lowlevel.notify_closing(self._done_fd)
            os.close(self._done_fd)
            self._done_fd = -1
            if answered:
                self._free.release()

    @property
    def running(self) -> bool:
        return self._running

    def start(self, fn: Callable[..., Any], *args: Any) -> None:
        """Hand ``fn(*args)`` to the running thread now; :meth:`result` awaits it. Raises
        ``trio.WouldBlock`` while another call's result is awaited (the committer's calls hold
        its log lock, so its own never meet)."""
        if not self._running:
            raise RuntimeError("the log thread is not running")
        self._free.acquire_nowait()
        self._jobs.put((fn, args))

    async def result(self) -> Any:
        """The result of what :meth:`start` handed over, or its exception raised here. Not
        cancellable (as ``trio.to_thread.run_sync`` by default): what the thread started, it
        finishes."""
        try:
            with trio.CancelScope(shield=True):
                await trio.lowlevel.wait_readable(self._done_fd)
            os.eventfd_read(self._done_fd)
            done, self._done = self._done, None
        finally:
            self._free.release()
        assert done is not None  # set by the thread before it wrote the eventfd
        return done.unwrap()

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the thread, once the calls before it are answered. In a worker thread
        of trio's when the log thread is not running (before :meth:`run`, after it)."""
        if not self._running:
            return await trio.to_thread.run_sync(fn, *args)
        await self._free.acquire()
        if not self._running:  # it stopped while this call waited its turn
            self._free.release()
            return await trio.to_thread.run_sync(fn, *args)
        self._jobs.put((fn, args))
        return await self.result()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args = job
            self._done = outcome.capture(fn, *args)
            os.eventfd_write(self._done_fd, 1)
