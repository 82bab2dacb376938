"""A fresh copy of the leader's data, for a follower that joins empty or whose log went elsewhere.

The copy is read in short read transactions, a few hundred kilobytes each, not in one long
snapshot: LMDB runs without its lock table here (``boxqueue.storage.environment``), so a read transaction
kept across commits could see pages the writer reuses. Such a "fuzzy" copy is consistent once the
follower replays the log from the LSN the leader held when the copy began: every record is made of
blind writes (put this value, delete this key, drop this database), so a key read before or after
a record's change ends up as the last record that touched it says (the same reasoning as a
PostgreSQL base backup and the log replayed over it). The relay keeps those records
(``History.reading``) until the follower subscribes after the copy.

On the follower, the copy replaces all of its data but its own database (``LOCAL_DB``: where its
log stands, its uuid). It is marked in progress there before anything is removed and unmarked with
the new position at the end, so a follower killed during a copy takes a fresh one at its next start.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lmdb
import msgpack

from boxqueue.storage import redo
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import LOCAL_DB, Storage

COPY_MARK = b"copy in progress"
CHUNK_BYTES = 512 * 1024


def database_names(storage: Storage) -> list[bytes]:
    """The named databases to copy: every one but this node's own."""
    names = []
    with storage.env.begin() as txn:
        for key, _value in txn.cursor():
            if key != LOCAL_DB:
                names.append(key)
    return names


def read_chunks(storage: Storage, most_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The copy, as redo payloads of CREATE and PUT operations of about ``most_bytes`` each. Each
    chunk is read in a transaction of its own, opened and closed before the chunk is yielded, so a
    consumer may await between chunks."""
    for name in database_names(storage):
        handle = _handle(storage, name)
        if handle is None:
            continue
        after: bytes | None = None
        first = True
        while True:
            ops: list[Any] = [redo.CREATE, name, None, None] if first else []
            first = False
            size = 0
            last = None
            with storage.env.begin() as txn:
                cursor = txn.cursor(handle)
                found = cursor.set_range(after) if after is not None else cursor.first()
                if found and after is not None and cursor.key() == after:
                    found = cursor.next()
                while found:
                    key, value = cursor.key(), cursor.value()
                    ops += (redo.PUT, name, key, value)
                    size += len(key) + len(value) + 16
                    last = key
                    if size >= most_bytes:
                        break
                    found = cursor.next()
                done = not found
            if ops:
                yield msgpack.packb(ops, use_bin_type=True)
            if done or last is None:
                break
            after = last


def _handle(storage: Storage, name: bytes) -> Any:
    """The database's handle (the reader opened every one first: :func:`open_all`)."""
    return storage.existing_db(name)


async def open_all(storage: Storage, committer: GroupCommitter) -> None:
    """Open every database to copy, so that :func:`read_chunks` finds their handles."""
    for name in database_names(storage):
        await committer.open_db(name)


class CopyWriter:
    """The follower's side: wipe, take the chunks, set the new position."""

    def __init__(self, storage: Storage, committer: GroupCommitter) -> None:
        self.storage = storage
        self.committer = committer

    async def begin(self) -> None:
        """Mark the copy in progress, then empty every database but this node's own. Emptied, not
        deleted: the handles this process holds (the catalogue's, every space's) stay valid, where
        a deleted database's handle could come to name another one."""
        storage = self.storage
        names = database_names(storage)

        def wipe(txn: lmdb.Transaction) -> None:
            txn.put(COPY_MARK, b"1", db=storage.local_db)
            for name in names:
                handle = storage.env.open_db(name, txn=txn, create=False)
                txn.drop(handle, delete=False)

        await self.committer.write_local(wipe)

    async def chunk(self, payload: bytes) -> None:
        ops = redo.decode(payload)
        storage = self.storage

        def apply(txn: lmdb.Transaction) -> None:
            redo.replay(txn, ops, lambda name, t, create: storage.open_logged(name, t, create),
                        storage.forget_db)

        await self.committer.write_local(apply)

    async def end(self, lsn: int, term: int) -> None:
        """The copy holds the leader's data as of record ``lsn`` (of ``term``): note it, unmark
        the copy, start the log again after it."""
        storage = self.storage

        def position(txn: lmdb.Transaction) -> None:
            storage.note_lsn(txn, lsn, term)
            txn.delete(COPY_MARK, db=storage.local_db)

        await self.committer.write_local(position)
        await self.committer.reset_log(lsn, term)


def copy_in_progress(storage: Storage) -> bool:
    """A copy was interrupted: this node's data is incomplete until it takes a fresh one."""
    with storage.env.begin() as txn:
        return txn.get(COPY_MARK, db=storage.local_db) is not None
