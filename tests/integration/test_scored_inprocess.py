"""Scored tubes run inside the test's trio loop (the real server, real LMDB), for what needs a
hand on their internals: memory against storage, a flush racing an add, a failing write."""

from __future__ import annotations

import random

import pytest
import trio

from boxqueue.config import load_config
from boxqueue.process import Server
from storage.environment import StorageError
from tubes.scored import NewMessage, ScoredQueues, now_ms
from tubes.scored_message import ScoredMessage


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


def new(queue: str, message_id: str, score: float | None = None, ttl_ms: int = 3_600_000) -> NewMessage:
    return NewMessage(queue, message_id, score, now_ms() + ttl_ms, ["desc", "", {}, {}])


def memory_image(queues: ScoredQueues) -> dict[tuple[str, str], list]:
    return {(m.queue, m.id): m.header() for t in queues.tubes.values() for m in t.messages.values()}


def stored_image(queues: ScoredQueues) -> dict[tuple[str, str], list]:
    from spaces.space import decode_tuple

    space = queues.catalog.by_name["deckard_messages"]
    out = {}
    for raw in space.pairs(0, 2, []):
        m = ScoredMessage.from_fields(decode_tuple(raw))
        out[(m.queue, m.id)] = m.header()
    return out


async def test_memory_matches_storage_after_random_operations_and_a_rebuild(running):
    """Every in-memory change is the stored one: after a random mix of operations the orderings
    equal what a fresh rebuild from LMDB gives."""
    queues: ScoredQueues = running.scored
    rng = random.Random(5)
    names = ["a", "b::1", "b::2"]
    for step in range(400):
        queue = rng.choice(names)
        ids = [f"m{rng.randrange(30)}" for _ in range(rng.randrange(1, 4))]
        op = rng.randrange(7)
        if op == 0:
            await queues.add([new(queue, i, rng.choice([None, rng.uniform(-5, 50)])) for i in ids])
        elif op == 1:
            await queues.pull(queue, rng.randrange(1, 5), -float("inf"), float("inf"), rng.choice([5, 60_000]))
        elif op == 2:
            await queues.settle(queue, ids[0], nack=rng.random() < 0.5, score=rng.choice([None, 3.0]),
                                lock_ms=rng.choice([0, 5, 60_000]), breakpoint=str(step))
        elif op == 3:
            await queues.remove(queue, ids)
        elif op == 4:
            await queues.set_limit(queue, rng.choice([0, -1, 5, 20]))
        elif op == 5:
            await queues.unpull(queue, ids)
        else:
            await trio.sleep(0.01)  # let monitors release short locks and deadlines
    await trio.sleep(0.05)
    assert memory_image(queues) == stored_image(queues)
    rebuilt = ScoredQueues(queues.catalog)
    async with trio.open_nursery() as nursery:
        await nursery.start(rebuilt.run)
        assert memory_image(rebuilt) == memory_image(queues)
        for name in names:
            if name in queues.tubes:
                assert list(rebuilt.tube(name).active) == list(queues.tubes[name].active)
                assert rebuilt.tube(name).limit == queues.tubes[name].limit
        nursery.cancel_scope.cancel()


async def test_a_flush_racing_an_add_leaves_memory_and_storage_agreeing(running, nursery):
    queues: ScoredQueues = running.scored
    for round_ in range(20):
        nursery.start_soon(queues.add, [new("race", f"r{round_}-{i}") for i in range(3)])
        if round_ % 2:
            await trio.sleep(0)
        await queues.flush()
        await trio.sleep(0.01)
        assert memory_image(queues) == stored_image(queues)


async def test_a_failing_write_leaves_memory_as_it_was(running, monkeypatch):
    """A storage fault (disk full) cannot be caused for real here, so the committer is made to
    fail once: the pull fails, the message stays pullable; a failing ack leaves it processing."""
    queues: ScoredQueues = running.scored
    await queues.add([new("f", "m", 1.0)])
    real_write = queues.committer.write

    async def failing(fn, **kwargs):
        raise StorageError("disk full (simulated)")

    monkeypatch.setattr(queues.committer, "write", failing)
    with pytest.raises(StorageError):
        await queues.pull("f", 1, -float("inf"), float("inf"), 60_000)
    assert queues.tubes["f"].messages["m"].state == "a" and list(queues.tubes["f"].active) == [(1.0, queues.tubes["f"].messages["m"].seq, "m")]
    monkeypatch.setattr(queues.committer, "write", real_write)
    [(pulled, _raw)] = await queues.pull("f", 1, -float("inf"), float("inf"), 60_000)
    monkeypatch.setattr(queues.committer, "write", failing)
    with pytest.raises(StorageError):
        await queues.settle("f", "m", nack=False, score=None, lock_ms=0, breakpoint="x")
    message = queues.tubes["f"].messages["m"]
    assert (message.state, message.acks, message.breakpoint) == ("p", 0, "")
    monkeypatch.setattr(queues.committer, "write", real_write)
    assert memory_image(queues) == stored_image(queues)


async def test_queues_without_messages_or_limits_are_forgotten(running):
    """Memory stays bounded by what is stored: names only looked at, emptied or unlimited leave
    nothing behind."""
    queues: ScoredQueues = running.scored
    for i in range(50):
        name = f"transient{i}"
        queues.count(name)
        await queues.pull(name, 1, -float("inf"), float("inf"), 1000)
        await queues.set_limit(name, 3)
        await queues.set_limit(name, -1)
        await queues.add([new(name, "m")])
        await trio.sleep(0.002)  # its monitor is asleep until the message expires
        await queues.remove(name, ["m"])
    await trio.sleep(0.05)  # monitors of emptied queues end
    assert not [name for name in queues.tubes if name.startswith("transient")]
