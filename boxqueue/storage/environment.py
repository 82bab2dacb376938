"""The LMDB environment: one directory, one named database per index plus a few of our own.

Durability follows ``wal.mode``:

* ``fsync`` — every group of writes is appended to the write-ahead log (:mod:`boxqueue.storage.wal`,
  ``<data_dir>/wal/``) and the log is flushed before any of its writers is answered; LMDB is
  committed without flushing and flushed by checkpoints in the background. The LSN of the last
  group is kept in LMDB (database ``_wal``) in the same transaction as the group's data, so
  recovery at start replays the log past it;
* ``write`` — no log: commits are written to the file but not flushed: a killed process loses
  nothing, a crashed machine may lose the last commits;
* ``none`` — no promise is made; it behaves like ``write``.

LMDB writes in place (``writemap``): a commit's pages are already in the file's shared map, so a
commit writes nothing through ``pwrite`` (2026-11-27, random inserts: 3.7-4.0 -> 1.6-1.8 us a put;
pipelined replaces in ``wal none``: 6.0 -> 4.3 us of server CPU each). Two things come with it. The
file is extended (sparsely) to the map size when opened. And a page of the map that the disk has no
room for would kill the process (SIGBUS) instead of failing the write: so disk space is kept
allocated ahead of LMDB's last page (:meth:`Storage.ensure_room`, ``DISK_RESERVE``), and a group
that finds no room for the reserve fails with an error before LMDB touches a page.

Whatever the mode, a log left by an earlier run is replayed when the environment opens, LMDB is
flushed and the log deleted; closing flushes LMDB too.

Reads on the event loop share one read transaction that is replaced when a group is answered
(:meth:`Storage.reader`, :meth:`Storage.committed`), so a read costs no transaction set-up and
sees no group before it is durable.

LMDB runs without its lock file (``lock=False``): the group committer begins a transaction on the
event loop and commits it in a worker thread, which LMDB's writer mutex does not allow. What the
locks gave is kept by construction: a ``flock`` on ``boxqueue.lock`` keeps a second process out;
the committer is the only writer; and a read transaction is always replaced by one on the newest
snapshot before it is used after a commit, so the writer never reuses a page a reader still needs
(LMDB reuses only pages freed before the previous transaction).
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb

from boxqueue.storage import redo
from boxqueue.storage.wal import LogReader, WalError, WriteAheadLog, list_segments

log = logging.getLogger(__name__)

WAL_MODES = ("fsync", "write", "none")
WAL_DIR = "wal"
# This node's own database: where its log stands, and its own metadata (instance uuid, session
# ids, a copy in progress). It is never replicated: every write to it goes around the log.
LOCAL_DB = b"_wal"
_WAL_DB = LOCAL_DB
_LSN_KEY = b"lsn"
_TERM_KEY = b"term"  # the term of the record at ``lsn``
_LSN = struct.Struct("<Q")
_REPLAY_CHUNK = 256  # log records per LMDB transaction during recovery
# Disk space kept allocated past LMDB's last page (see the module's docstring), topped up to
# DISK_RESERVE whenever less than DISK_REFILL is left: a group that grows the data by more than
# DISK_REFILL on a disk about to fill is the one case the reserve does not cover.
DISK_RESERVE = 64 << 20
DISK_REFILL = 32 << 20
# When the reserve cannot be topped up (the disk is full), writes go on while at least this much of
# what is allocated is left ahead of LMDB's pages (acks and deletes drain a full disk), then fail
# with ER_WAL_IO until there is room again. A group that grows the data by more than this, on a
# full disk, is the case the rule does not cover.
DISK_TIGHT = 16 << 20


def _allocated_from_start(fd: int) -> int:
    """How far from its start the data file is allocated: the room an earlier run reserved ahead
    of LMDB's pages, which a restart on a full disk needs no more space for. The file's blocks
    are one run from its start (:meth:`Storage.ensure_room` allocates from there, and LMDB writes
    only inside what it allocated), so their count tells where the run ends (SEEK_HOLE cannot:
    ext4 and tmpfs report blocks allocated but never written as holes). A megabyte is kept back
    for the blocks a file system counts for itself."""
    st = os.fstat(fd)
    return max(min(st.st_blocks * 512, st.st_size) - (1 << 20), 0)


class StorageError(Exception):
    """LMDB failed (disk full, map full, corruption); callers report it as a write failure.
    ``no_space``: the disk had no room (the write may succeed once there is)."""

    def __init__(self, message: str, *, no_space: bool = False) -> None:
        super().__init__(message)
        self.no_space = no_space


class Storage:
    """Owns the LMDB environment, the write-ahead log (``fsync`` mode) and the read transaction
    used on the event loop thread.

    ``lsn`` is the LSN of the last group committed to LMDB (its log record may not be flushed
    yet); ``logged_lsn`` and ``logged_term`` the last record the log holds (a follower logs the
    leader's records before it applies them, so it may be ahead of ``lsn``; this node's position
    in elections and subscriptions); ``synced_lsn`` the last one whose log record is flushed,
    what this node may tell a leader it holds durably; ``log`` the write-ahead log the group
    committer appends to (``None`` unless ``wal_mode`` is ``fsync``). A checkpoint is due every
    ``checkpoint_interval_s`` seconds, or when the log's current segment exceeds
    ``checkpoint_bytes``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        wal_mode: str = "fsync",
        map_size: int = 1 << 40,
        max_dbs: int = 4096,
        checkpoint_interval_s: float = 5.0,
        checkpoint_bytes: int = 16 << 20,
    ) -> None:
        if wal_mode not in WAL_MODES:
            raise ValueError(f"wal mode must be one of {', '.join(WAL_MODES)}")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.wal_mode = wal_mode
        self.checkpoint_interval_s = checkpoint_interval_s
        self.checkpoint_bytes = checkpoint_bytes
        self._lock_file = open(self.path / "boxqueue.lock", "a+b")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise StorageError(f"{self.path} is in use by another boxqueue process") from None
        try:
            # Never flushed by a commit: the log (fsync mode) or nothing (write, none) stands for
            # it, and checkpoints and close() flush.
            self.env = lmdb.open(
                str(self.path),
                map_size=map_size,
                max_dbs=max_dbs,
                max_readers=512,
                # The shared reader is renewed once per group (Storage.committed): a spare
                # transaction makes that a renew. Without one (py-lmdb 3's default is 0) each
                # renewal allocates and zeroes a transaction sized for max_dbs, about 200 KB.
                max_spare_txns=1,
                sync=False,
                metasync=False,
                readahead=False,
                lock=False,
                writemap=True,
            )
        except lmdb.Error as exc:
            self._lock_file.close()
            raise StorageError(f"cannot open LMDB environment in {self.path}: {exc}") from exc
        self._page_bytes = self.env.stat()["psize"]
        self._room_until = 0  # the file is allocated up to here (by this process's reckoning)
        self.no_room_since: float | None = None  # since when the reserve could not be topped up
        self._data_fd = -1
        self._dbs: dict[bytes, Any] = {}
        self.names: dict[Any, bytes | None] = {None: None}  # handle -> name, for redo records
        # Database name -> what to tell when a replayed record writes it (key) or empties it
        # (None): the rooms above keep things in memory over some databases (spaces/index_views.py).
        self.watched: dict[bytes, Callable[[Any, bytes | None], None]] = {}
        self._opened: list[bytes] = []  # databases opened in the write transaction under way
        self._reader: lmdb.Transaction | None = None
        self.generation = 0  # bumped by every commit
        self.log: WriteAheadLog | None = None
        self.term = 0  # the replica set's term this node's own records are written in (0: alone)
        try:
            self._data_fd = os.open(self.path / "data.mdb", os.O_RDWR | os.O_CLOEXEC)
            self._room_until = _allocated_from_start(self._data_fd)
            try:
                self.ensure_room()
            except StorageError as exc:  # a full disk: start, serve reads, refuse writes until room
                log.warning("%s; writes fail with ER_WAL_IO until there is room again", exc)
            self._wal_db = self.db(_WAL_DB)
            with self.env.begin() as txn:
                raw = txn.get(_LSN_KEY, db=self._wal_db)
                raw_term = txn.get(_TERM_KEY, db=self._wal_db)
            self.lsn = 0 if raw is None else _LSN.unpack(raw)[0]
            self.last_term = 0 if raw_term is None else _LSN.unpack(raw_term)[0]
            self.replayed = self._recover()
            self.synced_lsn = self.lsn  # recovery flushed LMDB: everything it holds is on disk
            self.logged_lsn, self.logged_term = self.lsn, self.last_term
            if wal_mode == "fsync":
                self.log = WriteAheadLog(self.path / WAL_DIR, self.lsn + 1)
        except (WalError, OSError, lmdb.Error, ValueError, StorageError) as exc:
            self.env.close()
            if self._data_fd >= 0:
                os.close(self._data_fd)
            self._lock_file.close()
            raise StorageError(f"cannot recover {self.path}: {exc}") from exc

    # -- the write-ahead log -----------------------------------------------------------------

    def note_lsn(self, txn: lmdb.Transaction, lsn: int, term: int = 0) -> None:
        """Record in ``txn`` (the group's own transaction) that it holds log record ``lsn``, of
        ``term``."""
        txn.put(_LSN_KEY, _LSN.pack(lsn), db=self._wal_db)
        if term != self.last_term or lsn == 1:
            txn.put(_TERM_KEY, _LSN.pack(term), db=self._wal_db)
        self.last_term = term

    @property
    def local_db(self) -> Any:
        """The handle of this node's own database (see :data:`LOCAL_DB`)."""
        return self._wal_db

    def reset_log(self, lsn: int, term: int) -> None:
        """After a fresh copy: LMDB holds everything up to record ``lsn`` of ``term``, and the log
        starts again after it (its old segments are another history). The caller has written
        ``lsn`` with :meth:`note_lsn` and flushed LMDB."""
        self.lsn = self.synced_lsn = self.logged_lsn = lsn
        self.last_term = self.logged_term = term
        if self.log is not None:
            self.log.retire()
            self.log = WriteAheadLog(self.path / WAL_DIR, lsn + 1)

    def _recover(self) -> int:
        """Replay the log past ``self.lsn``, flush LMDB and delete the log's segments. Returns the
        number of records replayed."""
        directory = self.path / WAL_DIR
        reader = LogReader(directory, self.lsn)
        if not reader.segments:
            return 0
        replayed = 0
        txn: lmdb.Transaction | None = None
        try:
            for lsn, term, payload in reader.records():
                if txn is None:
                    self.ensure_room()
                    txn = self.env.begin(write=True)
                redo.replay(txn, redo.decode(payload), self._open_for_replay)
                self.note_lsn(txn, lsn, term)
                replayed += 1
                if replayed % _REPLAY_CHUNK == 0:
                    txn.commit()
                    txn = None
            if txn is not None:
                txn.commit()
                txn = None
        finally:
            if txn is not None:
                txn.abort()
        if reader.torn is not None:
            log.warning("write-ahead log ends in a torn record, dropped: %s", reader.torn)
        if replayed:
            log.info("replayed %d write-ahead log records, LSN %d to %d", replayed, self.lsn + 1, reader.last_lsn)
        self.lsn = reader.last_lsn
        self.env.sync(True)
        for _first, segment in list_segments(directory):  # LMDB now holds and has flushed it all
            segment.unlink(missing_ok=True)
        return replayed

    def _open_for_replay(self, name: bytes | None, txn: lmdb.Transaction, create: bool) -> Any:
        try:
            return self.env.open_db(name, txn=txn, create=create)
        except lmdb.NotFoundError:
            return None

    # -- disk space --------------------------------------------------------------------------

    def ensure_room(self) -> None:
        """Keep disk space allocated for at least ``DISK_REFILL`` bytes past LMDB's last page
        (topped up to ``DISK_RESERVE``), so that the pages the next write transaction adds to the
        map have blocks under them. Call before beginning one. Raises :class:`StorageError` when
        the disk has no room for the reserve: the write fails, nothing of it reaches the map."""
        used = self.used_bytes()
        if used + DISK_REFILL <= self._room_until:
            return
        until = used + DISK_RESERVE
        # Past what was reserved before only (all of it the first time, before any write): the
        # pages there are not LMDB's yet, so not even glibc's fallback for file systems without
        # fallocate (which writes a zero byte into each block that reads as zero) can race with
        # a commit under way in the log's thread.
        start = self._room_until
        try:
            os.posix_fallocate(self._data_fd, start, until - start)
        except OSError as exc:
            if self.no_room_since is None:
                self.no_room_since = time.monotonic()
                log.warning("no disk space to top up LMDB's reserve (%s): %d MB of it left",
                            exc.strerror, (self._room_until - used) >> 20)
            if used + DISK_TIGHT <= self._room_until:
                return  # what is left of the reserve covers this group
            raise StorageError(f"no disk space for LMDB's data file ({exc.strerror})", no_space=True) from exc
        self._room_until = until
        if self.no_room_since is not None:
            log.info("disk space for LMDB's reserve again: writes go on")
            self.no_room_since = None

    def used_bytes(self) -> int:
        """LMDB's pages up to the last one in use, in bytes: where the file's meaningful part ends."""
        return (self.env.info()["last_pgno"] + 1) * self._page_bytes

    def allocated_bytes(self) -> int:
        """Disk space the data file takes (its blocks; its size is the map's, as a sparse file)."""
        return os.fstat(self._data_fd).st_blocks * 512

    # -- databases ---------------------------------------------------------------------------

    def db(self, name: bytes, txn: Any = None, create: bool = True):
        """The handle of the named database ``name``, opening (and creating) it when needed.

        Without ``txn`` LMDB opens it in a write transaction of its own: only do that before the
        group committer runs (at start), since nothing else may write while it does. ``txn`` may
        be the :class:`storage.redo.RedoTxn` a write was given; the creation is then logged.
        """
        handle = self._dbs.get(name)
        if handle is None:
            if isinstance(txn, redo.RedoTxn):
                handle = self.env.open_db(name, txn=txn.txn, create=create)
                if create:
                    txn.created(name)
            else:
                handle = self.env.open_db(name, txn=txn, create=create)
            self._dbs[name] = handle
            self.names[handle] = name
            if txn is not None:
                self._opened.append(name)
        return handle

    def txn_ended(self, committed: bool) -> None:
        """The write transaction ended: the handles opened in it stay valid if it committed; if
        it was aborted LMDB closed them, and they are forgotten here."""
        if not committed:
            for name in self._opened:
                self.forget_db(name)
        self._opened = []

    def existing_db(self, name: bytes) -> Any:
        """The handle of the named database ``name`` if this process has opened it, else None
        (:meth:`storage.commit.GroupCommitter.open_db` opens one: LMDB takes a new handle only
        from a write transaction that commits)."""
        return self._dbs.get(name)

    def open_logged(self, name: bytes | None, txn: Any, create: bool) -> Any:
        """A database's handle for replaying records into ``txn`` (a :class:`storage.redo.RedoTxn`,
        whose log names it): None when ``create`` is false and it does not exist."""
        if name is None:
            return None
        if not create and name not in self._dbs:
            raw = txn.txn if isinstance(txn, redo.RedoTxn) else txn
            try:
                self.env.open_db(name, txn=raw, create=False)
            except lmdb.NotFoundError:
                return None
        return self.db(name, txn=txn, create=create)

    def forget_db(self, name: bytes) -> None:
        handle = self._dbs.pop(name, None)
        if handle is not None:
            self.names.pop(handle, None)

    # -- reading -----------------------------------------------------------------------------

    def reader(self) -> lmdb.Transaction:
        """A read transaction showing everything committed so far.

        Valid until the caller next yields to the event loop; never keep it across an ``await``.
        """
        txn = self._reader
        if txn is None:
            txn = self._reader = self.env.begin(buffers=False)
        return txn

    def committed(self) -> None:
        """Note that a commit happened: the shared reader moves to the newest snapshot now, not
        at its next use, by when a later group may be in LMDB but not yet durable."""
        self.generation += 1
        if self._reader is not None:
            self._reader.abort()
            self._reader = self.env.begin(buffers=False)

    # -- life --------------------------------------------------------------------------------

    def sync(self) -> None:
        """Flush LMDB (data and meta pages): every commit so far is on disk."""
        self.env.sync(True)

    def close(self) -> None:
        """Flush LMDB, delete the log it makes redundant, close. A log that holds records LMDB
        does not (a follower's, logged and not applied) is kept: the next start replays it."""
        if self._reader is not None:
            self._reader.abort()
            self._reader = None
        try:
            self.env.sync(True)
            if self.log is not None:
                if self.logged_lsn > self.lsn:
                    log.warning("the write-ahead log holds records up to %d, LMDB up to %d: kept for the "
                                "next start to replay", self.logged_lsn, self.lsn)
                    self.log.close()
                else:
                    self.log.retire()
        except (OSError, lmdb.Error):
            log.exception("flushing LMDB at close failed; the write-ahead log is kept")
            if self.log is not None:
                self.log.close()
        self.log = None
        self.env.close()
        os.close(self._data_fd)
        self._lock_file.close()
