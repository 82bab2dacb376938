"""The LMDB environment: one directory, one named database per index plus a few of our own.

Durability follows ``wal.mode``:

* ``fsync`` — every commit is flushed (data and meta pages) before it returns; a reply is sent only
  after the commit that holds its write (see :mod:`storage.commit`);
* ``write`` — commits are written to the file but not flushed: a killed process loses nothing, a
  crashed machine may lose the last commits;
* ``none`` — no promise is made; today it behaves like ``write`` (LMDB's write-in-place map
  measured slower here: page faults on every newly touched page).

Reads on the event loop share one read transaction that is replaced after each commit
(:meth:`Storage.reader`), so a read costs no transaction set-up.

LMDB runs without its lock file (``lock=False``): the group committer begins a transaction on the
event loop and commits it in a worker thread, which LMDB's writer mutex does not allow. What the
locks gave is kept by construction: a ``flock`` on ``boxqueue.lock`` keeps a second process out;
the committer is the only writer; and a read transaction is always replaced by one on the newest
snapshot before it is used after a commit, so the writer never reuses a page a reader still needs
(LMDB reuses only pages freed before the previous transaction).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import lmdb

WAL_MODES = ("fsync", "write", "none")


class StorageError(Exception):
    """LMDB failed (disk full, map full, corruption); callers report it as a write failure."""


class Storage:
    """Owns the LMDB environment and the read transaction used on the event loop thread."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        wal_mode: str = "fsync",
        map_size: int = 1 << 40,
        max_dbs: int = 4096,
    ) -> None:
        if wal_mode not in WAL_MODES:
            raise ValueError(f"wal mode must be one of {', '.join(WAL_MODES)}")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.wal_mode = wal_mode
        self._lock_file = open(self.path / "boxqueue.lock", "a+b")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise StorageError(f"{self.path} is in use by another boxqueue process") from None
        try:
            self.env = lmdb.open(
                str(self.path),
                map_size=map_size,
                max_dbs=max_dbs,
                max_readers=512,
                sync=wal_mode == "fsync",
                metasync=wal_mode == "fsync",
                readahead=False,
                lock=False,
            )
        except lmdb.Error as exc:
            self._lock_file.close()
            raise StorageError(f"cannot open LMDB environment in {self.path}: {exc}") from exc
        self._dbs: dict[bytes, object] = {}
        self._reader: lmdb.Transaction | None = None
        self._reader_generation = -1
        self.generation = 0  # bumped by every commit; readers renew when it moves

    # -- databases ---------------------------------------------------------------------------

    def db(self, name: bytes, txn: lmdb.Transaction | None = None, create: bool = True):
        """The handle of the named database ``name``, opening (and creating) it when needed.

        Without ``txn`` LMDB opens it in a write transaction of its own: only do that before the
        group committer runs (at start), since nothing else may write while it does.
        """
        handle = self._dbs.get(name)
        if handle is None:
            handle = self.env.open_db(name, txn=txn, create=create)
            self._dbs[name] = handle
        return handle

    def forget_db(self, name: bytes) -> None:
        self._dbs.pop(name, None)

    # -- reading -----------------------------------------------------------------------------

    def reader(self) -> lmdb.Transaction:
        """A read transaction showing everything committed so far.

        Valid until the caller next yields to the event loop; never keep it across an ``await``.
        """
        txn = self._reader
        if txn is None:
            txn = self._reader = self.env.begin(buffers=False)
            self._reader_generation = self.generation
        elif self._reader_generation != self.generation:
            txn.abort()
            txn = self._reader = self.env.begin(buffers=False)
            self._reader_generation = self.generation
        return txn

    def committed(self) -> None:
        """Note that a commit happened, so the next :meth:`reader` sees it."""
        self.generation += 1

    # -- life --------------------------------------------------------------------------------

    def sync(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.abort()
            self._reader = None
        self.env.close()
        self._lock_file.close()
