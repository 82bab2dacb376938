"""A leader's limbo (``boxqueue.replication.quorum``) over a real group committer and LMDB.

Every answer is a promise: "done" only once ``size`` members hold a write and the lease is sound;
a write that no quorum confirms in time is answered ER_SYNC_QUORUM_TIMEOUT with an unknown
outcome and stays in the log (nothing is rolled back: a later leader may keep it); writes still
queued then, which never reached the log, fail for certain (ER_READONLY). The followers are the
test: it acknowledges for them, as a relay would on their rows.
"""

from __future__ import annotations

import math

import pytest
import trio

from boxqueue.errcodes import ER, BoxError
from boxqueue.replication.quorum import Quorum
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import Storage


@pytest.fixture
def storage(tmp_path):
    s = Storage(tmp_path / "data", "fsync")
    yield s
    s.close()


def put(storage: Storage, key: bytes, value: bytes = b"v"):
    def write(txn):
        txn.put(key, value, db=storage.db(b"t", txn=txn))
        return key

    return write


def read(storage: Storage, key: bytes):
    """A write that changes nothing: it reads ``key`` inside the write transaction."""

    def write(txn):
        return txn.get(key, db=storage.db(b"t", txn=txn))

    return write


def stored(storage: Storage, key: bytes) -> bytes | None:
    with storage.env.begin() as txn:
        return txn.get(key, db=storage.db(b"t"))


class Outcome:
    """A write submitted in the background, and how it was answered."""

    def __init__(self) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self.answered = trio.Event()

    def done(self, result: object, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self.answered.set()


def submit(committer: GroupCommitter, fn) -> Outcome:
    outcome = Outcome()
    committer.submit(fn, outcome.done)
    return outcome


class Lease:
    def __init__(self) -> None:
        self.valid = True

    def __call__(self) -> bool:
        return self.valid


async def running(nursery: trio.Nursery, storage: Storage, size: int, timeout_s: float = 30.0,
                  lease: Lease | None = None, lost_after_s: float = math.inf,
                  ) -> tuple[GroupCommitter, Quorum, list[str]]:
    committer = GroupCommitter(storage, rejections=(BoxError,))
    await nursery.start(committer.run)
    stalls: list[str] = []

    async def on_stall(why: str) -> None:
        stalls.append(why)

    quorum = Quorum(committer, size, timeout_s, lease or Lease(), on_stall=on_stall, lost_after_s=lost_after_s)
    committer.quorum = quorum
    await nursery.start(quorum.run)
    return committer, quorum, stalls


async def test_a_write_is_answered_once_a_quorum_holds_it(storage):
    async with trio.open_nursery() as nursery:
        committer, quorum, _stalls = await running(nursery, storage, size=2)
        first = submit(committer, put(storage, b"a"))
        await trio.sleep(0.3)
        assert not first.answered.is_set()  # durable here, but one member is not a quorum
        assert stored(storage, b"a") == b"v" and quorum.own == storage.lsn
        quorum.ack("f1", storage.lsn - 1)  # a follower behind it confirms nothing of it
        await trio.sleep(0.05)
        assert not first.answered.is_set()
        quorum.ack("f1", storage.lsn)
        with trio.fail_after(2):
            await first.answered.wait()
        assert first.error is None and first.result == b"a"
        nursery.cancel_scope.cancel()


async def test_nothing_is_confirmed_while_the_lease_is_in_doubt(storage):
    lease = Lease()
    async with trio.open_nursery() as nursery:
        committer, quorum, _stalls = await running(nursery, storage, size=2, lease=lease)
        lease.valid = False
        write = submit(committer, put(storage, b"a"))
        with trio.fail_after(2):
            while quorum.own == 0:
                await trio.sleep(0.01)
        quorum.ack("f1", storage.lsn)
        await trio.sleep(0.3)
        assert not write.answered.is_set()  # a quorum holds it, but a successor may exist
        lease.valid = True  # renewed: answered at the next look, with no follower saying more
        with trio.fail_after(2):
            await write.answered.wait()
        assert write.error is None
        nursery.cancel_scope.cancel()


async def test_quorum_one_still_asks_the_lease(storage):
    lease = Lease()
    async with trio.open_nursery() as nursery:
        committer, _quorum, _stalls = await running(nursery, storage, size=1, lease=lease)
        assert (await committer.write(put(storage, b"a"))) == b"a"
        lease.valid = False
        write = submit(committer, put(storage, b"b"))
        await trio.sleep(0.3)
        assert not write.answered.is_set()
        lease.valid = True
        with trio.fail_after(2):
            await write.answered.wait()
        assert write.error is None
        nursery.cancel_scope.cancel()


async def test_a_stall_answers_unknown_keeps_the_write_and_refuses_what_never_reached_the_log(storage):
    async with trio.open_nursery() as nursery:
        committer, quorum, stalls = await running(nursery, storage, size=2, timeout_s=0.5)
        waiting = submit(committer, put(storage, b"a"))
        with trio.fail_after(2):
            await waiting.answered.wait()
        assert isinstance(waiting.error, BoxError) and waiting.error.code == ER.SYNC_QUORUM_TIMEOUT
        assert "outcome is unknown" in waiting.error.message
        assert stalls and "no quorum of 2" in stalls[0]
        assert stored(storage, b"a") == b"v"  # not taken back: a later leader may keep it
        with pytest.raises(BoxError) as refused:  # nothing more is taken
            committer.submit(put(storage, b"b"), lambda _r, _e: None)
        assert refused.value.code == ER.READONLY
        quorum.ack("f1", storage.lsn)  # a late acknowledgement confirms nothing any more
        assert quorum.confirmed == 0
        nursery.cancel_scope.cancel()


async def test_abandoning_refuses_the_writes_still_queued(storage):
    """Writes queued behind a group being flushed never reach the log once the leader gives up:
    they fail for certain; the group being flushed is answered unknown once durable."""
    async with trio.open_nursery() as nursery:
        committer, quorum, _stalls = await running(nursery, storage, size=2)
        flushed = submit(committer, put(storage, b"a"))
        with trio.fail_after(2):
            while storage.lsn == 0:  # in LMDB: being flushed, or waiting for the quorum
                await trio.sleep(0.001)
        queued = [submit(committer, put(storage, b"q%d" % i)) for i in range(3)]
        quorum.abandon("this node no longer leads")  # (the commit loop has not run meanwhile)
        with trio.fail_after(2):
            for outcome in (flushed, *queued):
                await outcome.answered.wait()
        codes = [(o.error.code if isinstance(o.error, BoxError) else o.error) for o in queued]
        assert codes == [ER.READONLY] * 3
        assert all(stored(storage, b"q%d" % i) is None for i in range(3))
        assert isinstance(flushed.error, BoxError) and flushed.error.code == ER.SYNC_QUORUM_TIMEOUT
        assert stored(storage, b"a") == b"v"
        nursery.cancel_scope.cancel()


async def test_a_write_that_changes_nothing_waits_for_what_it_read(storage):
    """An answer that read a write no quorum holds yet waits for that write's confirmation:
    otherwise it could report a value a later leader never has (a dirty read)."""
    async with trio.open_nursery() as nursery:
        committer, quorum, _stalls = await running(nursery, storage, size=2)
        written = submit(committer, put(storage, b"a", b"1"))
        with trio.fail_after(2):
            while quorum.own == 0:
                await trio.sleep(0.01)
        seen = submit(committer, read(storage, b"a"))
        await trio.sleep(0.3)
        assert not written.answered.is_set() and not seen.answered.is_set()
        quorum.ack("f1", storage.lsn)
        with trio.fail_after(2):
            await seen.answered.wait()
        assert seen.error is None and seen.result == b"1"
        # with everything confirmed and the lease sound, a read is answered at once
        assert (await committer.write(read(storage, b"a"))) == b"1"
        nursery.cancel_scope.cancel()


async def test_a_leader_whose_followers_fall_silent_gives_up_without_any_write(storage):
    async with trio.open_nursery() as nursery:
        _committer, quorum, stalls = await running(nursery, storage, size=2, timeout_s=0.6,
                                                   lost_after_s=0.2)
        for _ in range(10):  # heard from every 0.1 s: present
            quorum.heard("f1")
            await trio.sleep(0.1)
        assert not stalls
        with trio.fail_after(3):
            while not stalls:
                await trio.sleep(0.05)
        assert "fewer than 1 followers heard from" in stalls[0]
        assert quorum.abandoned is not None
        nursery.cancel_scope.cancel()


async def test_a_write_that_changes_nothing_once_the_leader_gave_up_is_answered(storage):
    """A group applied while the leader gives up must not wait for a confirmation nobody will
    give (its writer, a facade's request, would hang, and with it the incarnation's end)."""
    async with trio.open_nursery() as nursery:
        committer, quorum, _stalls = await running(nursery, storage, size=2)
        submit(committer, put(storage, b"a"))
        with trio.fail_after(2):
            while quorum.own == 0:
                await trio.sleep(0.01)
        quorum.abandon("this node no longer leads")
        committer.refuse_writes(None)  # as if it had been queued before: it reaches the commit loop
        seen = submit(committer, read(storage, b"a"))
        with trio.fail_after(2):
            await seen.answered.wait()
        assert isinstance(seen.error, BoxError) and seen.error.code == ER.SYNC_QUORUM_TIMEOUT
        nursery.cancel_scope.cancel()
