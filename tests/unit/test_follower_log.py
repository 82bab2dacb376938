"""A follower logs the leader's records before it applies them (GroupCommitter.log_replicated).

It acknowledges a record once its log holds it, flushed; LMDB gets the record afterwards. So
whatever holds the log must keep what LMDB lacks: a checkpoint taken meanwhile, a close, and the
next start must replay it. The leader's records here are real ones: a leader's storage writes
them and its log is read back.
"""

import shutil
import struct

import pytest
import trio

from boxqueue.storage import redo
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import WAL_DIR, Storage, StorageError
from boxqueue.storage.wal import LogReader, list_segments


class Rejected(Exception):
    pass


def key(i: int) -> bytes:
    return struct.pack(">Q", i)


def rows_of(storage: Storage) -> dict[int, bytes]:
    db = storage.db(b"kv", create=False)
    with storage.env.begin() as txn:
        return {struct.unpack(">Q", k)[0]: v for k, v in txn.cursor(db=db)}


async def leader_records(path, groups: int) -> list[tuple[int, int, bytes, list]]:
    """``groups`` records of a leader, ten rows each, as a follower's stream brings them."""
    storage = Storage(path, "fsync", checkpoint_interval_s=3600)
    committer = GroupCommitter(storage, rejections=(Rejected,))
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        for group in range(groups):
            def write(txn, group=group):
                db = storage.db(b"kv", txn=txn)
                for i in range(group * 10, group * 10 + 10):
                    txn.put(key(i), b"row %d" % i, db=db)

            await committer.write(write)
        nursery.cancel_scope.cancel()
    records = [(lsn, term, payload, redo.decode(payload))
               for lsn, term, payload in LogReader(path / WAL_DIR, 0).records()]
    storage.close()
    assert [r[0] for r in records] == list(range(1, groups + 1))
    return records


def lmdb_pages(storage: Storage) -> bytes:
    """LMDB's file up to its last page (the file is as large as the map, sparse, past it)."""
    with open(storage.path / "data.mdb", "rb") as file:
        return file.read(storage.used_bytes())


def expected_rows(groups: int) -> dict[int, bytes]:
    return {i: b"row %d" % i for i in range(groups * 10)}


async def test_records_are_durable_once_logged_and_a_restart_applies_what_lmdb_lacks(tmp_path):
    records = await leader_records(tmp_path / "leader", 3)
    storage = Storage(tmp_path / "follower", "fsync", checkpoint_interval_s=3600)
    committer = GroupCommitter(storage, rejections=(Rejected,))  # its commit loop is not running
    answers: list[BaseException | None] = []
    await committer.log_replicated(records, lambda _result, error: answers.append(error))
    # In the log and flushed: what the follower acknowledges. LMDB does not have them yet.
    assert (storage.logged_lsn, storage.synced_lsn, storage.lsn) == (3, 3, 0)
    assert storage.logged_term == records[-1][1]
    assert answers == []
    # A checkpoint meanwhile starts a new segment after the log's last record and keeps the
    # segment that holds them (LMDB's position would have named the segment being written).
    await committer.checkpoint()
    assert [first for first, _path in list_segments(storage.path / WAL_DIR)] == [1, 4]
    storage.close()  # keeps the log: LMDB lacks what it holds
    again = Storage(tmp_path / "follower", "fsync", checkpoint_interval_s=3600)
    try:
        assert again.replayed == 3
        assert (again.lsn, again.logged_lsn) == (3, 3)
        assert rows_of(again) == expected_rows(3)
    finally:
        again.close()


async def test_logged_records_are_applied_and_a_crash_after_a_checkpoint_loses_none(tmp_path):
    records = await leader_records(tmp_path / "leader", 6)
    data = tmp_path / "follower"
    storage = Storage(data, "fsync", checkpoint_interval_s=3600)
    committer = GroupCommitter(storage, rejections=(Rejected,))
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        applied = trio.Event()
        answers: list[BaseException | None] = []

        def done(_result, error):
            answers.append(error)
            if len(answers) == 3:
                applied.set()

        await committer.log_replicated(records[:3], done)
        with trio.fail_after(10):
            await applied.wait()
        assert answers == [None, None, None] and storage.lsn == 3
        assert rows_of(storage) == expected_rows(3)
        nursery.cancel_scope.cancel()
    # The next three logged and not applied (no commit loop runs now), a checkpoint, then the
    # machine crashes: LMDB's file as the checkpoint flushed it, next to the log as it is.
    idle = GroupCommitter(storage, rejections=(Rejected,))
    await idle.log_replicated(records[3:], lambda _result, _error: None)
    assert (storage.lsn, storage.logged_lsn) == (3, 6)
    await idle.checkpoint()
    lmdb_file = lmdb_pages(storage)
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "data.mdb").write_bytes(lmdb_file)
    shutil.copytree(data / WAL_DIR, crashed / WAL_DIR)
    storage.close()
    recovered = Storage(crashed, "fsync", checkpoint_interval_s=3600)
    try:
        assert (recovered.replayed, recovered.lsn) == (3, 6)
        assert rows_of(recovered) == expected_rows(6)
    finally:
        recovered.close()


async def test_records_that_do_not_follow_the_log_are_refused_and_not_logged(tmp_path):
    records = await leader_records(tmp_path / "leader", 3)
    storage = Storage(tmp_path / "follower", "fsync", checkpoint_interval_s=3600)
    committer = GroupCommitter(storage, rejections=(Rejected,))
    try:
        assert storage.log is not None
        size = storage.log.size
        with pytest.raises(StorageError, match="does not follow"):
            await committer.log_replicated(records[1:], lambda _result, _error: None)
        assert (storage.logged_lsn, storage.synced_lsn, storage.log.size) == (0, 0, size)
        await committer.log_replicated(records[:1], lambda _result, _error: None)
        assert storage.logged_lsn == 1
    finally:
        storage.close()


async def test_a_leader_write_never_takes_an_lsn_the_log_holds_already(tmp_path):
    """Records logged and not applied (an incarnation that ended without applying them, which
    the committer's final drain prevents) must not be overwritten by a write of this node's own:
    it is refused, and the log keeps the leader's records."""
    records = await leader_records(tmp_path / "leader", 3)
    storage = Storage(tmp_path / "follower", "fsync", checkpoint_interval_s=3600)
    await GroupCommitter(storage, rejections=(Rejected,)).log_replicated(records, lambda _result, _error: None)
    committer = GroupCommitter(storage, rejections=(Rejected,))  # a new incarnation's, without them

    def write(txn):
        txn.put(key(99), b"mine", db=storage.db(b"mine", txn=txn))

    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        with pytest.raises(StorageError, match="the log holds records up to 3, LMDB up to 0"):
            await committer.write(write)
        nursery.cancel_scope.cancel()
    assert (storage.lsn, storage.logged_lsn) == (0, 3)
    storage.close()  # keeps the log
    again = Storage(tmp_path / "follower", "fsync", checkpoint_interval_s=3600)
    try:
        assert (again.replayed, again.lsn) == (3, 3)
        assert rows_of(again) == expected_rows(3)
    finally:
        again.close()
