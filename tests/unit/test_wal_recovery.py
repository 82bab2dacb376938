"""Storage with the write-ahead log, in process: groups logged, checkpoints, recovery by replay.

A killed process leaves LMDB's unflushed commits in the page cache, so a kill -9 test alone never
needs the log. Here the crash of a machine is imitated instead: LMDB's file as it was at a
checkpoint (everything later never reached the disk) next to the log as it is, and the storage
opened on that must replay the log to get every acknowledged write back.
"""

import shutil
import struct

import pytest
import trio

from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import WAL_DIR, Storage, StorageError
from boxqueue.storage.wal import FILE_MAGIC, HEADER_SIZE, list_segments


class Rejected(Exception):
    pass


def key(i: int) -> bytes:
    return struct.pack(">Q", i)


def put_rows(storage: Storage, name: bytes, rows: range):
    def write(txn):
        db = storage.db(name, txn=txn)
        for i in rows:
            txn.put(key(i), b"row %d" % i, db=db)
        return len(rows)

    return write


def rows_of(storage: Storage, name: bytes) -> dict[int, bytes]:
    db = storage.db(name, create=False)
    with storage.env.begin() as txn:
        return {struct.unpack(">Q", k)[0]: v for k, v in txn.cursor(db=db)}


def lmdb_pages(storage: Storage) -> bytes:
    """LMDB's file up to its last page (the file is as large as the map, sparse, past it)."""
    with open(storage.path / "data.mdb", "rb") as file:
        return file.read(storage.used_bytes())


def crash_image(source, target, lmdb_file: bytes) -> None:
    """``target``: LMDB as saved in ``lmdb_file``, the log as it is now in ``source``."""
    target.mkdir()
    (target / "data.mdb").write_bytes(lmdb_file)
    shutil.copytree(source / WAL_DIR, target / WAL_DIR)


async def test_groups_are_logged_and_replayed_after_a_crash(tmp_path):
    data = tmp_path / "data"
    storage = Storage(data, "fsync", checkpoint_interval_s=3600)
    committer = GroupCommitter(storage, rejections=(Rejected,))
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        await committer.write(put_rows(storage, b"first", range(100)))
        await committer.checkpoint()
        assert [lsn for lsn, _ in list_segments(data / WAL_DIR)] == [storage.lsn + 1]
        at_checkpoint = lmdb_pages(storage)
        # After the checkpoint: concurrent writes (several groups), a new database (DDL), a drop.
        async with trio.open_nursery() as writers:
            for part in range(10):
                writers.start_soon(committer.write, put_rows(storage, b"first", range(100 + part * 50, 150 + part * 50)))
        await committer.write(put_rows(storage, b"second", range(5)), exclusive=True)

        def drop_some(txn):
            db = storage.db(b"first")
            for i in range(0, 50):
                txn.delete(key(i), db=db)

        await committer.write(drop_some)
        expected_first, expected_second = rows_of(storage, b"first"), rows_of(storage, b"second")
        last_lsn = storage.lsn
        crash_image(data, tmp_path / "crashed", at_checkpoint)
        nursery.cancel_scope.cancel()
    storage.close()
    assert list_segments(data / WAL_DIR) == []  # a clean close leaves no log behind
    assert len(expected_first) == 550 and len(expected_second) == 5

    recovered = Storage(tmp_path / "crashed", "fsync")
    try:
        assert recovered.replayed == last_lsn - 1  # every group after the checkpoint's
        assert recovered.lsn == last_lsn
        assert rows_of(recovered, b"first") == expected_first
        assert rows_of(recovered, b"second") == expected_second
        # Recovery flushed LMDB and started the log afresh.
        assert [lsn for lsn, _ in list_segments(tmp_path / "crashed" / WAL_DIR)] == [last_lsn + 1]
    finally:
        recovered.close()
    again = Storage(tmp_path / "crashed", "write")  # a second start replays nothing
    try:
        assert again.replayed == 0 and rows_of(again, b"first") == expected_first
    finally:
        again.close()


async def test_a_group_of_rejected_writes_is_not_logged(tmp_path):
    storage = Storage(tmp_path, "fsync", checkpoint_interval_s=3600)
    committer = GroupCommitter(storage, rejections=(Rejected,))

    def reject(txn):
        raise Rejected()

    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        await committer.write(put_rows(storage, b"t", range(3)))
        lsn, size = storage.lsn, storage.log.size
        with pytest.raises(Rejected):
            await committer.write(reject)
        assert (storage.lsn, storage.log.size) == (lsn, size)
        nursery.cancel_scope.cancel()
    storage.close()


async def test_checkpoints_follow_the_size_threshold_and_keep_the_log_short(tmp_path):
    storage = Storage(tmp_path, "fsync", checkpoint_interval_s=3600, checkpoint_bytes=4096)
    committer = GroupCommitter(storage)
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        for start in range(0, 2000, 100):
            await committer.write(put_rows(storage, b"t", range(start, start + 100)))
            await trio.sleep(0.01)
        with trio.fail_after(10):
            while committer.checkpoints < 3:
                await trio.sleep(0.01)
        segments = list_segments(tmp_path / WAL_DIR)
        assert 1 <= len(segments) <= 2  # the current one, and one a checkpoint may be flushing
        nursery.cancel_scope.cancel()
    storage.close()


async def test_write_mode_keeps_no_log(tmp_path):
    storage = Storage(tmp_path, "write")
    committer = GroupCommitter(storage)
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        await committer.write(put_rows(storage, b"t", range(10)))
        assert storage.log is None and storage.lsn == 0
        assert list_segments(tmp_path / WAL_DIR) == []
        nursery.cancel_scope.cancel()
    storage.close()


def test_a_damaged_log_stops_the_start_with_a_clear_error(tmp_path):
    wal_dir = tmp_path / WAL_DIR
    storage = Storage(tmp_path, "fsync")
    storage.close()

    async def two_groups():
        s = Storage(tmp_path, "fsync", checkpoint_interval_s=3600)
        c = GroupCommitter(s)
        async with trio.open_nursery() as nursery:
            await nursery.start(c.run)
            await c.write(put_rows(s, b"t", range(10)))
            await c.write(put_rows(s, b"t", range(10, 20)))
            shutil.copytree(wal_dir, tmp_path / "saved")  # the log before the clean close
            nursery.cancel_scope.cancel()
        s.close()

    trio.run(two_groups)
    shutil.rmtree(wal_dir)
    shutil.copytree(tmp_path / "saved", wal_dir)
    [(_, segment)] = list_segments(wal_dir)
    data = bytearray(segment.read_bytes())
    data[len(FILE_MAGIC) + HEADER_SIZE] ^= 0xFF  # the first record's payload: the second follows
    segment.write_bytes(bytes(data))
    with pytest.raises(StorageError, match="damaged record"):
        Storage(tmp_path, "fsync")
    assert segment.exists()  # nothing deleted: the log is kept for whoever repairs it
