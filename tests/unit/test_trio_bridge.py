"""The thread-to-trio bridge, called from real threads (as grpcio's pool threads call it)."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.lowlevel

from boxqueue.facades.deckard.trio_bridge import BridgeClosed, TrioBridge
from boxqueue.spaces.later import Later


async def on_thread(fn):
    """Run ``fn()`` on a worker thread (not trio's); its result."""
    return await trio.to_thread.run_sync(fn)


async def test_a_call_runs_on_trio_and_returns_its_result(nursery):
    bridge = TrioBridge(nursery, trio.lowlevel.current_trio_token())
    trio_thread = threading.get_ident()

    async def where(x: int) -> tuple[int, int]:
        await trio.lowlevel.checkpoint()
        trio.lowlevel.current_task()  # raises unless on trio
        return threading.get_ident(), x * 2

    caller, (callee, value) = await on_thread(lambda: (threading.get_ident(), bridge.call(where, 21)))
    assert callee == trio_thread != caller
    assert value == 42


async def test_a_later_is_waited_for_without_a_task(nursery):
    """An engine call that returns a Later answers when it settles."""
    bridge = TrioBridge(nursery, trio.lowlevel.current_trio_token())
    later: Later[int] = Later()

    def engine_call() -> Later[int]:
        trio.lowlevel.current_trio_token()  # raises unless on trio
        return later

    async def settle_soon() -> None:
        await trio.sleep(0.05)
        later.settle(7)

    nursery.start_soon(settle_soon)
    assert await on_thread(lambda: bridge.call(engine_call)) == 7


async def test_exceptions_come_back_to_the_caller(nursery):
    bridge = TrioBridge(nursery, trio.lowlevel.current_trio_token())

    async def fails() -> None:
        await trio.lowlevel.checkpoint()
        raise ValueError("engine said no")

    def failed_later() -> Later[None]:
        later: Later[None] = Later()
        later.settle(None, KeyError("gone"))
        return later

    def call_both() -> list[str]:
        seen = []
        for fn in (fails, failed_later):
            try:
                bridge.call(fn)
            except Exception as exc:
                seen.append(type(exc).__name__)
        return seen

    assert await on_thread(call_both) == ["ValueError", "KeyError"]


async def test_waiting_calls_hold_only_their_own_threads(nursery):
    """40 threads wait on trio at once; trio keeps running and answers them all."""
    bridge = TrioBridge(nursery, trio.lowlevel.current_trio_token())
    release = trio.Event()
    waiting = 0
    all_waiting = trio.Event()

    async def wait_then(x: int) -> int:
        nonlocal waiting
        waiting += 1
        if waiting == 40:
            all_waiting.set()
        await release.wait()
        return x

    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await trio.to_thread.run_sync(bridge.call, wait_then, i, limiter=trio.CapacityLimiter(1))

    with trio.fail_after(20):
        async with trio.open_nursery() as callers:
            for i in range(40):
                callers.start_soon(one, i)
            await all_waiting.wait()
            release.set()
    assert results == {i: i for i in range(40)}


async def test_a_closed_bridge_refuses_calls(nursery):
    bridge = TrioBridge(nursery, trio.lowlevel.current_trio_token())
    bridge.close()
    ran = []

    async def never() -> None:
        ran.append(True)

    def call() -> None:
        with pytest.raises(BridgeClosed):
            bridge.call(never)

    await on_thread(call)
    assert ran == []


async def test_shutting_down_the_owning_nursery_fails_calls_in_flight():
    """Calls still running when the facade's nursery is cancelled end with BridgeClosed."""
    outcome = []
    async with trio.open_nursery() as outer, trio.open_nursery() as calls:
        bridge = TrioBridge(calls, trio.lowlevel.current_trio_token())
        started = threading.Event()

        async def forever() -> None:
            started.set()
            await trio.sleep_forever()

        def call() -> None:
            try:
                bridge.call(forever)
            except BridgeClosed as exc:
                outcome.append(str(exc))

        async def cancel_when_started():
            while not started.is_set():
                await trio.sleep(0.005)
            calls.cancel_scope.cancel()

        outer.start_soon(cancel_when_started)
        await on_thread(call)
    assert outcome == ["the call was cancelled"]
