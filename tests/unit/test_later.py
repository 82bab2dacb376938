"""boxqueue.spaces.later.Later: settled once, one consumer, maps in place, awaitable from trio."""

from __future__ import annotations

import pytest
import trio

from boxqueue.spaces.later import Later


def test_then_before_and_after_settling():
    seen: list[tuple[object, object]] = []
    early: Later[int] = Later()
    early.then(lambda v, e: seen.append((v, e)))
    assert seen == []
    early.settle(1)
    late = Later.done(2)
    late.then(lambda v, e: seen.append((v, e)))
    assert seen == [(1, None), (2, None)]


def test_settled_once_and_one_consumer():
    later: Later[int] = Later()
    later.settle(1)
    with pytest.raises(RuntimeError):
        later.settle(2)
    later.then(lambda v, e: None)
    with pytest.raises(RuntimeError):
        later.then(lambda v, e: None)


def test_maps_apply_in_order_and_errors_pass_through():
    later: Later[int] = Later()
    mapped = later.map(lambda v: v + 1).map(lambda v: v * 10)
    assert mapped is later  # in place: no second object per call
    got: list[tuple[object, object]] = []
    mapped.then(lambda v, e: got.append((v, e)))
    later.settle(1)
    assert got == [(20, None)]

    failing: Later[int] = Later()
    failing.map(lambda v: 1 // v).map(lambda v: pytest.fail("not reached"))
    caught: list[BaseException | None] = []
    failing.then(lambda v, e: caught.append(e))
    failing.settle(0)
    assert isinstance(caught[0], ZeroDivisionError)

    erred: Later[int] = Later()
    erred.map(lambda v: pytest.fail("an error is not mapped"))
    erred.settle(None, KeyError("k"))
    passed: list[tuple[object, BaseException | None]] = []
    erred.then(lambda v, e: passed.append((v, e)))
    assert passed[0][0] is None and isinstance(passed[0][1], KeyError)


def test_map_of_a_settled_later():
    done = Later.done(3).map(lambda v: v * 2)
    got: list[object] = []
    done.then(lambda v, e: got.append(v))
    assert got == [6]


async def test_await_waits_for_settle_and_raises_errors():
    later: Later[str] = Later()
    failing: Later[str] = Later()

    async def settle_soon() -> None:
        await trio.sleep(0.01)
        later.settle("ok")
        failing.settle(None, ValueError("bad"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(settle_soon)
        assert await later == "ok"
        with pytest.raises(ValueError, match="bad"):
            await failing
    assert await Later.done(5) == 5
