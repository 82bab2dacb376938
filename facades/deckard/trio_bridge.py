"""Calls from the gRPC server's asyncio thread into the trio engine, without holding a thread.

grpcio's asyncio server runs on an event loop of its own, in one dedicated thread; the engine
lives on trio's loop. A handler does ``await bridge.call(fn, *args)``: that creates an asyncio
future, asks trio (``TrioToken.run_sync_soon``, safe from any thread) to start ``fn(*args)`` as a
task in a nursery the facade owns, and awaits the future, so the asyncio loop keeps serving
other calls. The trio task hands its result or exception back with
``loop.call_soon_threadsafe``. If the asyncio side is cancelled (the client went away or its
deadline passed), the trio task is cancelled too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


class BridgeClosed(RuntimeError):
    """The trio side has stopped taking calls (the server is shutting down)."""


class TrioBridge:
    """Starts trio tasks in ``nursery`` on behalf of coroutines running on asyncio loops."""

    def __init__(self, nursery: trio.Nursery, token: trio.lowlevel.TrioToken) -> None:
        self._nursery = nursery
        self._token = token
        self._closed = False

    def close(self) -> None:
        """Refuse new calls (called on the trio side before the nursery is cancelled)."""
        self._closed = True

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` on trio; must be awaited on an asyncio loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        scope = trio.CancelScope()

        def start() -> None:  # on the trio thread
            if self._closed:
                _hand_back(loop, future, error=BridgeClosed("the server is shutting down"))
                return
            self._nursery.start_soon(self._run, loop, future, scope, fn, args)

        try:
            self._token.run_sync_soon(start)
        except trio.RunFinishedError:
            raise BridgeClosed("the server is shutting down") from None
        try:
            return await future
        except asyncio.CancelledError:
            try:
                self._token.run_sync_soon(scope.cancel)
            except trio.RunFinishedError:
                pass
            raise

    async def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
        scope: trio.CancelScope,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
    ) -> None:
        with scope:
            try:
                result = await fn(*args)
            except trio.Cancelled:
                _hand_back(loop, future, error=BridgeClosed("the call was cancelled"))
                raise
            except Exception as exc:
                _hand_back(loop, future, error=exc)
                return
            _hand_back(loop, future, result=result)


def _hand_back(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    *,
    result: Any = None,
    error: BaseException | None = None,
) -> None:
    """Complete ``future`` on its own loop; nothing to do if it is gone or already cancelled."""

    def complete() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(complete)
    except RuntimeError:  # the loop is closed: nobody waits for this answer any more
        pass
