"""The write-ahead log's own thread: one OS thread for the group committer's appends and flushes.

``trio.to_thread.run_sync`` costs, per call, a capacity limiter, a hand-off to a cached worker
thread (which names itself with two ``prctl`` calls), and the outcome's trip back through the
event loop's wake-up socket. The committer makes one such call per durable group. One long-lived
thread fed by a queue, answering through the trio token, does the same with one hand-off each way.

The thread is owned by a task (:meth:`LogThread.run`, started in the committer's nursery): started
there and joined when that task is cancelled, so nothing outlives its owner.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import outcome
import trio

__all__ = ["LogThread"]


class LogThread:
    """Runs functions one at a time in its own thread; :meth:`call` awaits one."""

    def __init__(self, name: str = "boxqueue-log") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Any] | None] = queue.SimpleQueue()
        self._token: trio.lowlevel.TrioToken | None = None
        self._running = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the thread and keep it until cancelled; then let it finish what it was given and
        join it."""
        self._token = trio.lowlevel.current_trio_token()
        thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
        thread.start()
        self._running = True
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._running = False
            self._jobs.put(None)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(thread.join)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the thread: its result, or its exception raised here. Not cancellable
        (as ``trio.to_thread.run_sync`` by default): what the thread started, it finishes. In a
        worker thread of trio's when the log thread is not running (before :meth:`run`, after it)."""
        if not self._running:
            return await trio.to_thread.run_sync(fn, *args)
        self._jobs.put((fn, args, trio.lowlevel.current_task()))
        return await trio.lowlevel.wait_task_rescheduled(_not_abortable)

    def _serve(self) -> None:
        token = self._token
        assert token is not None
        reschedule = trio.lowlevel.reschedule
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, task = job
            token.run_sync_soon(reschedule, task, outcome.capture(fn, *args))


def _not_abortable(_raise_cancel: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED
