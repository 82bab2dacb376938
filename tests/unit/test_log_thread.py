"""The write-ahead log's thread: calls run there in order, answers and errors come back, and the
thread ends with the task that owns it."""

from __future__ import annotations

import threading

import pytest
import trio

from boxqueue.storage.log_thread import LogThread


def test_calls_run_in_the_thread_in_order_and_errors_come_back() -> None:
    seen: list[tuple[int, str]] = []

    def note(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i * 10

    def fail() -> None:
        raise OSError("disk gone")

    async def main() -> threading.Thread:
        lt = LogThread(name="test-log")
        async with trio.open_nursery() as nursery:
            await nursery.start(lt.run)
            answers = [await lt.call(note, i) for i in range(5)]
            assert answers == [0, 10, 20, 30, 40]
            with pytest.raises(OSError, match="disk gone"):
                await lt.call(fail)
            assert await lt.call(note, 5) == 50  # the thread survives a failed call
            (thread,) = [t for t in threading.enumerate() if t.name == "test-log"]
            nursery.cancel_scope.cancel()
        return thread

    thread = trio.run(main)
    assert seen == [(i, "test-log") for i in range(6)]
    assert not thread.is_alive()  # joined when its owner was cancelled


def test_concurrent_callers_each_get_their_own_answer() -> None:
    async def main() -> dict[int, int]:
        lt = LogThread()
        answers: dict[int, int] = {}

        async def ask(i: int) -> None:
            answers[i] = await lt.call(lambda: i * i)

        async with trio.open_nursery() as nursery:
            await nursery.start(lt.run)
            async with trio.open_nursery() as callers:
                for i in range(50):
                    callers.start_soon(ask, i)
            nursery.cancel_scope.cancel()
        return answers

    assert trio.run(main) == {i: i * i for i in range(50)}


def test_a_call_is_not_cancelled_half_way() -> None:
    """What the thread started, it finishes, and its caller hears the answer."""
    release = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "done"

    async def main() -> str:
        lt = LogThread()
        async with trio.open_nursery() as nursery:
            await nursery.start(lt.run)
            with trio.move_on_after(0.05):
                threading.Timer(0.2, release.set).start()
                answer = await lt.call(slow)
            nursery.cancel_scope.cancel()
        return answer

    assert trio.run(main) == "done"


def test_without_its_thread_a_call_runs_in_a_worker_thread() -> None:
    async def main() -> str:
        return await LogThread(name="never-started").call(lambda: threading.current_thread().name)

    name = trio.run(main)
    assert name not in ("never-started", threading.main_thread().name)


def test_a_call_handed_over_now_is_answered_to_whoever_awaits_it() -> None:
    """The committer hands a group to the thread as soon as it is applied (``start``) and its
    flusher task awaits the answer (``result``); meanwhile no other call may be handed over."""
    began = threading.Event()
    release = threading.Event()

    def flush(n: int) -> int:
        began.set()
        release.wait(5)
        return n + 1

    async def main() -> tuple[int, bool, int]:
        lt = LogThread()
        async with trio.open_nursery() as nursery:
            await nursery.start(lt.run)
            lt.start(flush, 41)
            await trio.to_thread.run_sync(began.wait, 5)  # the thread is on it before anyone awaits
            refused = False
            try:
                lt.start(flush, 0)
            except trio.WouldBlock:
                refused = True
            answers: list[int] = []

            async def flusher() -> None:
                answers.append(await lt.result())

            nursery.start_soon(flusher)
            release.set()
            later = await lt.call(lambda: 7)  # waits for the first answer, then runs
            nursery.cancel_scope.cancel()
        return answers[0], refused, later

    assert trio.run(main) == (42, True, 7)


def test_an_answer_given_as_the_thread_ends_still_reaches_its_caller() -> None:
    """The thread's owner is cancelled while a call handed over is still running: the thread
    finishes it, and its caller reads the answer before the eventfd is closed."""
    release = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "flushed"

    async def main() -> list[str]:
        lt = LogThread()
        answers: list[str] = []

        async def flusher() -> None:
            with trio.CancelScope(shield=True):
                await trio.sleep(0.2)  # reads the answer only after the owner began to close
                answers.append(await lt.result())

        async with trio.open_nursery() as outer, trio.open_nursery() as owner:
            await owner.start(lt.run)
            lt.start(slow)
            outer.start_soon(flusher)
            threading.Timer(0.05, release.set).start()
            owner.cancel_scope.cancel()
        return answers

    assert trio.run(main) == ["flushed"]
