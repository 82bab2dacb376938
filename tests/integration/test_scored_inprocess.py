"""Deckard's queues in the engine, run inside the test's trio loop (the real server, real LMDB),
for what needs a hand on the internals: memory against storage, a flush racing an add, a
failing write. The operations are the ones the Deckard facade makes."""

from __future__ import annotations

import math
import random
import time

import pytest
import trio
import trio.lowlevel

from boxqueue.config import load_config
from boxqueue.process import Server
from boxqueue.spaces.space import decode_tuple
from boxqueue.storage.environment import StorageError
from boxqueue.tubes.engine import QueueEngine
from boxqueue.tubes.ordering import READY_ORDER, task_key
from boxqueue.tubes.task import TUBE_LAYOUT, Task


@pytest.fixture
async def running(tmp_path, nursery):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n[wal]\nmode = "none"\n'
        '[deckard]\nlisten = "127.0.0.1:0"\n'
    )
    server = Server(load_config(cfg), handle_signals=False)
    await nursery.start(server.run)
    yield server
    server.stop()


def keys_of(ordering) -> list:
    """The take-order keys of a tube's ready ordering (it holds the tasks)."""
    return [task_key(READY_ORDER, task) for task in ordering]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def add_item(queue: str, message_id: str, score: float | None = None, ttl_ms: int = 3_600_000) -> tuple:
    score = float(now_ms()) if score is None else min(max(score, 0.0), 2.0**53)
    return (queue, message_id, score, (now_ms() + ttl_ms) * 1000, {"description": "desc"}, [""])


def memory_image(engine: QueueEngine, sid: int) -> dict[tuple[str, str], list]:
    return {(t.tube, t.id): t.header() for tube in engine.tubes_of(sid) for t in tube.tasks.values()}


def stored_image(engine: QueueEngine, sid: int) -> dict[tuple[str, str], list]:
    out = {}
    for raw in engine.queue_space(sid).space.pairs(0, 2, []):
        t = Task.from_fields(decode_tuple(raw), TUBE_LAYOUT)
        out[(t.tube, t.id)] = t.header()
    return out


async def settle(engine: QueueEngine, sid: int, queue: str, message_id: str, *, nack: bool, score: float | None,
                 lock_ms: int) -> bool:
    """What the facade's Ack/Nack does."""
    def diagnostics(attrs: dict) -> None:
        attrs["nacks" if nack else "acks"] = attrs.get("nacks" if nack else "acks", 0) + 1

    if lock_ms > 0:
        unlock = score if score is not None else (0.0 if nack else None)
        return await engine.settle(sid, queue, message_id, pri=None, delay=lock_ms * 1000, unlock_pri=unlock,
                                   attrs=diagnostics)
    pri = score if score is not None else (0.0 if nack else float(now_ms()))
    return await engine.settle(sid, queue, message_id, pri=pri, attrs=diagnostics)


async def test_memory_matches_storage_after_random_operations_and_a_rebuild(running):
    """Every in-memory change is the stored one: after a random mix of operations the orderings
    equal what a fresh rebuild from LMDB gives."""
    engine: QueueEngine = running.engine
    sid = running.deckard_space.id
    rng = random.Random(5)
    names = ["a", "b::1", "b::2"]
    for _step in range(400):
        queue = rng.choice(names)
        ids = [f"m{rng.randrange(30)}" for _ in range(rng.randrange(1, 4))]
        op = rng.randrange(7)
        if op == 0:
            await engine.upsert(sid, [add_item(queue, i, rng.choice([None, rng.uniform(-5, 50)])) for i in ids])
        elif op == 1:
            await engine.take_many(sid, queue, rng.randrange(1, 5), rng.choice([5, 60_000]) * 1000)
        elif op == 2:
            await settle(engine, sid, queue, ids[0], nack=rng.random() < 0.5, score=rng.choice([None, 3.0]),
                         lock_ms=rng.choice([0, 5, 60_000]))
        elif op == 3:
            await engine.remove(sid, queue, ids)
        elif op == 4:
            limit = rng.choice([0, -1, 5, 20])
            if limit:
                await engine.set_limit(sid, queue, max(limit, 0))
        elif op == 5:
            await engine.untake(sid, queue, ids)
        else:
            await trio.sleep(0.01)  # let monitors release short locks and deadlines
    await trio.sleep(0.05)
    assert memory_image(engine, sid) == stored_image(engine, sid)
    rebuilt = QueueEngine(engine.catalog, engine.kinds)
    async with trio.open_nursery() as nursery:
        await nursery.start(rebuilt.run)
        assert memory_image(rebuilt, sid) == memory_image(engine, sid)
        for name in names:
            tube = engine.existing_tube(sid, name)
            if tube is not None:
                again = rebuilt.tube(sid, name)
                assert keys_of(again.ready) == keys_of(tube.ready)
                assert again.limit == tube.limit
        nursery.cancel_scope.cancel()


async def test_an_add_naming_a_held_message_twice_refreshes_it_once(running):
    """A batch's changes move their tasks through the orderings together, unless a task comes
    twice (one Add naming an existing id twice): then one at a time, and the task is there once."""
    engine: QueueEngine = running.engine
    sid = running.deckard_space.id
    await engine.upsert(sid, [add_item("twice", "m", 2.0), add_item("twice", "n", 1.0)])
    assert await engine.upsert(sid, [add_item("twice", "m", ttl_ms=5_000), add_item("twice", "m", ttl_ms=9_000),
                                     add_item("twice", "n", ttl_ms=7_000)]) == (0, 3)
    tube = engine.existing_tube(sid, "twice")
    assert [t.id for t in tube.ready] == ["n", "m"] and len(tube.timeline) == 2
    assert memory_image(engine, sid) == stored_image(engine, sid)
    assert (tube.tasks["m"].created + tube.tasks["m"].ttl) // 1000 > now_ms() + 8_000  # the last one named


async def test_a_flush_racing_an_add_leaves_memory_and_storage_agreeing(running, nursery):
    engine: QueueEngine = running.engine
    sid = running.deckard_space.id

    async def flush() -> None:
        for tube in engine.tubes_of(sid):
            await engine.drop_tube(sid, tube.name)

    for round_ in range(20):
        nursery.start_soon(engine.upsert, sid, [add_item("race", f"r{round_}-{i}") for i in range(3)])
        if round_ % 2:
            await trio.lowlevel.checkpoint()
        await flush()
        await trio.sleep(0.01)
        assert memory_image(engine, sid) == stored_image(engine, sid)


async def test_a_failing_write_leaves_memory_as_it_was(running, monkeypatch):
    """A storage fault (disk full) cannot be caused for real here, so the committer is made to
    fail: the pull fails, the message stays pullable; a failing ack leaves it taken."""
    engine: QueueEngine = running.engine
    sid = running.deckard_space.id
    await engine.upsert(sid, [add_item("f", "m", 1.0)])
    committer = engine.committer
    real_submit = committer.submit

    def failing(fn, done, **kwargs):
        done(None, StorageError("disk full (simulated)"))

    monkeypatch.setattr(committer, "submit", failing)
    with pytest.raises(StorageError):
        await engine.take_many(sid, "f", 1, 60_000_000)
    tube = engine.existing_tube(sid, "f")
    task = tube.tasks["m"]
    assert task.status == "r" and keys_of(tube.ready) == [(127, 1.0, task.created, "m")]
    monkeypatch.setattr(committer, "submit", real_submit)
    [(_pulled, _raw)] = await engine.take_many(sid, "f", 1, 60_000_000)
    monkeypatch.setattr(committer, "submit", failing)
    with pytest.raises(StorageError):
        await settle(engine, sid, "f", "m", nack=False, score=None, lock_ms=0)
    task = tube.tasks["m"]
    assert (task.status, task.attrs.get("acks", 0)) == ("t", 0)
    monkeypatch.setattr(committer, "submit", real_submit)
    assert memory_image(engine, sid) == stored_image(engine, sid)


async def test_queues_without_messages_or_limits_are_forgotten(running):
    """Memory stays bounded by what is stored: names only looked at, emptied or unlimited leave
    nothing behind."""
    engine: QueueEngine = running.engine
    sid = running.deckard_space.id
    for i in range(50):
        name = f"transient{i}"
        engine.existing_tube(sid, name)
        await engine.take_many(sid, name, 1, 1_000_000, -math.inf, math.inf)
        await engine.set_limit(sid, name, 3)
        await engine.set_limit(sid, name, 0)
        await engine.upsert(sid, [add_item(name, "m")])
        await trio.sleep(0.002)  # its monitor is asleep until the message expires
        await engine.remove(sid, name, ["m"])
    await trio.sleep(0.05)  # monitors of emptied queues end
    assert not [t.name for t in engine.tubes_of(sid) if t.name.startswith("transient")]
