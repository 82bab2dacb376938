"""LMDB writes in place (``writemap``): the disk space under the pages a write adds is allocated
before the write begins, so that a full disk fails the write with an error instead of killing
the process with SIGBUS when LMDB touches a page that has no block.

Here the one fault is made by ``posix_fallocate`` failing with ENOSPC, so that the reserve's
arithmetic is seen exactly; the data file, its sizes and the writes are real. A disk that really
fills (a tmpfs, as root) is tests/integration/test_full_disk.py's.
"""

import errno
import os
import struct

import pytest
import trio

from boxqueue.storage import environment
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import DISK_REFILL, DISK_RESERVE, Storage, StorageError

ROW = b"x" * 2000
ROWS_PER_WRITE = 500  # about 1 MB of pages a write


class Rejected(Exception):
    pass


def put_rows(storage: Storage, first: int):
    def write(txn):
        db = storage.db(b"rows", txn=txn)
        for i in range(first, first + ROWS_PER_WRITE):
            txn.put(struct.pack(">Q", i), ROW, db=db)

    return write


def row_count(storage: Storage) -> int:
    db = storage.db(b"rows", create=False)
    with storage.env.begin() as txn:
        return txn.stat(db)["entries"]


def test_the_data_file_is_sparse_and_the_reserve_is_allocated(tmp_path):
    storage = Storage(tmp_path / "data", "none", map_size=1 << 34)
    try:
        stat = os.stat(tmp_path / "data" / "data.mdb")
        assert stat.st_size == 1 << 34  # as large as the map...
        allocated = storage.allocated_bytes()
        assert allocated == stat.st_blocks * 512
        assert storage.used_bytes() + DISK_REFILL <= allocated < 1 << 30  # ...but only the reserve is taken
    finally:
        storage.close()


async def test_writes_keep_the_reserve_ahead_and_a_full_disk_fails_them_cleanly(tmp_path, monkeypatch):
    storage = Storage(tmp_path / "data", "fsync", checkpoint_interval_s=3600)
    committer = GroupCommitter(storage, rejections=(Rejected,))
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        # Growing by more than the reserve: it is topped up as the data grows.
        written = 0
        while storage.used_bytes() < DISK_RESERVE + (8 << 20):
            await committer.write(put_rows(storage, written))
            written += ROWS_PER_WRITE
            assert storage.allocated_bytes() >= storage.used_bytes()
        assert storage.allocated_bytes() >= DISK_RESERVE + (8 << 20)

        # The disk is full: the reserve cannot be topped up. Writes go on while what is left of
        # it lasts, then fail before LMDB touches a page; the pages in use never outgrow the
        # blocks under them.
        refused: list[int] = []

        def no_space(fd: int, offset: int, length: int) -> None:
            refused.append(offset + length)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(environment.os, "posix_fallocate", no_space)
        with pytest.raises(StorageError, match="no disk space") as failed:
            for _ in range(2 * DISK_RESERVE // (1 << 20)):
                await committer.write(put_rows(storage, written))
                written += ROWS_PER_WRITE
                assert storage.allocated_bytes() >= storage.used_bytes()
        assert "No space left on device" in str(failed.value)
        assert refused
        assert row_count(storage) == written  # the refused write left nothing behind
        assert storage.allocated_bytes() >= storage.used_bytes()

        # Room again: writes go on, and nothing acknowledged was lost.
        monkeypatch.undo()
        await committer.write(put_rows(storage, written))
        written += ROWS_PER_WRITE
        assert row_count(storage) == written
        nursery.cancel_scope.cancel()
    storage.close()
    reopened = Storage(tmp_path / "data", "fsync")
    try:
        assert row_count(reopened) == written
    finally:
        reopened.close()
