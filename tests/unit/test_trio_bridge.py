"""The asyncio-to-trio bridge, with a real asyncio loop in a real thread (as the gRPC server runs)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from facades.deckard.trio_bridge import BridgeClosed, TrioBridge


async def on_asyncio_thread(main):
    """Run ``main()`` on a fresh asyncio loop in a worker thread; its result."""
    return await trio.to_thread.run_sync(lambda: asyncio.run(main()))


async def test_a_call_runs_on_trio_and_returns_its_result(nursery):
    bridge = TrioBridge(nursery, trio.lowlevel.current_trio_token())
    trio_thread = threading.get_ident()

    async def where(x: int) -> tuple[int, int]:
        await trio.sleep(0)
        trio.lowlevel.current_task()  # raises unless on trio
        return threading.get_ident(), x * 2

    async def main():
        return threading.get_ident(), await bridge.call(where, 21)

    caller, (callee, value) = await on_asyncio_thread(main)
    assert callee == trio_thread != caller
    assert value == 42


async def test_exceptions_come_back_to_the_caller(nursery):
    bridge = TrioBridge(nursery, trio.lowlevel.current_trio_token())

    async def fails() -> None:
        await trio.sleep(0)
        raise ValueError("engine said no")

    async def main():
        with pytest.raises(ValueError, match="engine said no"):
            await bridge.call(fails)
        return True

    assert await on_asyncio_thread(main)


async def test_waiting_calls_do_not_hold_the_asyncio_thread(nursery):
    """200 calls wait on trio at once, all started from one asyncio thread: none blocks it."""
    bridge = TrioBridge(nursery, trio.lowlevel.current_trio_token())
    release = trio.Event()
    waiting = 0
    all_waiting = trio.Event()

    async def wait_then(x: int) -> int:
        nonlocal waiting
        waiting += 1
        if waiting == 200:
            all_waiting.set()
        await release.wait()
        return x

    async def main():
        return await asyncio.gather(*(bridge.call(wait_then, i) for i in range(200)))

    async def releaser():
        await all_waiting.wait()
        release.set()

    nursery.start_soon(releaser)
    with trio.fail_after(20):
        assert await on_asyncio_thread(main) == list(range(200))


async def test_cancelling_the_asyncio_side_cancels_the_trio_task(nursery):
    bridge = TrioBridge(nursery, trio.lowlevel.current_trio_token())
    started = threading.Event()
    cancelled = trio.Event()

    async def forever() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    async def main():
        task = asyncio.ensure_future(bridge.call(forever))
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return True

    assert await on_asyncio_thread(main)
    with trio.fail_after(5):
        await cancelled.wait()


async def test_a_closed_bridge_refuses_calls(nursery):
    bridge = TrioBridge(nursery, trio.lowlevel.current_trio_token())
    bridge.close()
    ran = []

    async def never() -> None:
        ran.append(True)

    async def main():
        with pytest.raises(BridgeClosed):
            await bridge.call(never)
        return True

    assert await on_asyncio_thread(main)
    assert ran == []


async def test_shutting_down_the_owning_nursery_fails_calls_in_flight():
    """Calls still running when the facade's nursery is cancelled end with BridgeClosed."""
    outcome = []
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as calls:
            bridge = TrioBridge(calls, trio.lowlevel.current_trio_token())
            started = threading.Event()

            async def forever() -> None:
                started.set()
                await trio.sleep_forever()

            async def main():
                try:
                    await bridge.call(forever)
                except BridgeClosed as exc:
                    outcome.append(str(exc))

            async def cancel_when_started():
                while not started.is_set():
                    await trio.sleep(0.005)
                calls.cancel_scope.cancel()

            outer.start_soon(cancel_when_started)
            await on_asyncio_thread(main)
    assert outcome == ["the call was cancelled"]
