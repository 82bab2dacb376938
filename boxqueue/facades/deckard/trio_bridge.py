"""Calls from grpcio's pool threads into the trio engine.

grpcio's thread-pool server runs each call's handler on a thread of its pool; the engine lives on
trio's loop. A handler calls ``bridge.call(fn, *args)``: the bridge asks trio
(``TrioToken.run_sync_soon``, safe from any thread) to run ``fn(*args)`` and blocks the pool
thread on a queue until the answer is handed back. Most engine calls return a
:class:`spaces.later.Later` (settled from their commit), so they need no trio task at all; a call
that returns a coroutine is awaited in a task of the nursery the facade owns.

The hop costs 90-110 us of CPU per call (``bench/grpc_servers.py``, 2026-11-27: a bare echo on
the thread-pool server 291-300 us per call, through this hop 397-404 us; on grpcio's asyncio
server 243-257 us, with a hop to trio 334-344 us; purerpc on trio 326-333 us). Which server
Deckard moves to is issue 19's open design decision; see docs/performance.md, "Where the time
still goes".
"""

from __future__ import annotations

import inspect
import queue
from collections.abc import Awaitable, Callable
from typing import Any

import trio


class BridgeClosed(RuntimeError):
    """The trio side has stopped taking calls (the server is shutting down)."""


class TrioBridge:
    """Runs engine calls on trio on behalf of threads that are not trio's."""

    def __init__(self, nursery: trio.Nursery, token: trio.lowlevel.TrioToken) -> None:
        self._nursery = nursery
        self._token = token
        self._closed = False

    def close(self) -> None:
        """Refuse new calls (called on the trio side before the nursery is cancelled)."""
        self._closed = True

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` run on trio, waited for (its Later settled, its coroutine awaited);
        called from a thread that is not trio's, which it blocks until then."""
        answer: queue.SimpleQueue[tuple[Any, BaseException | None]] = queue.SimpleQueue()

        def hand_back(value: Any, error: BaseException | None) -> None:
            answer.put((value, error))

        def start() -> None:  # on the trio thread
            if self._closed:
                hand_back(None, BridgeClosed("the server is shutting down"))
                return
            try:
                result = fn(*args)
            except BaseException as exc:
                hand_back(None, exc)
                return
            then = getattr(result, "then", None)  # the engine's Later: settled by its commit
            if then is not None:
                then(hand_back)
            elif inspect.isawaitable(result):
                try:
                    self._nursery.start_soon(self._await, result, hand_back)
                except RuntimeError:  # the nursery is closed: the server is stopping
                    _close(result)
                    hand_back(None, BridgeClosed("the server is shutting down"))
            else:
                hand_back(result, None)

        try:
            self._token.run_sync_soon(start)
        except trio.RunFinishedError:
            raise BridgeClosed("the server is shutting down") from None
        value, error = answer.get()
        if error is not None:
            raise error
        return value

    @staticmethod
    async def _await(awaitable: Awaitable[Any], hand_back: Callable[[Any, BaseException | None], None]) -> None:
        try:
            value = await awaitable
        except trio.Cancelled:
            hand_back(None, BridgeClosed("the call was cancelled"))
            raise
        except Exception as exc:
            hand_back(None, exc)
            return
        hand_back(value, None)


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()
