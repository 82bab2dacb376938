"""The write-ahead log: an append-only, checksummed file of redo records in front of LMDB.

In ``fsync`` mode every group of writes is one record, appended and flushed with one
``fdatasync`` before any of its writers is answered; LMDB is then committed without flushing and
is flushed in the background by checkpoints (:mod:`boxqueue.storage.commit`). The log lives in the data
directory, ``<data_dir>/wal/``, as segments named by the first LSN they hold
(``00000000000000000042.wal``).

Segment layout: the 8 bytes :data:`FILE_MAGIC`, then records, each

====== ======= ===============================================================
bytes  type    meaning
====== ======= ===============================================================
4      bytes   :data:`RECORD_MAGIC`
4      u32 le  payload length
8      u64 le  LSN (log sequence number: one per group, consecutive)
8      u64 le  term: the replica set's leadership term the record was written in
               (0 on a single node)
4      u32 le  CRC-32 (zlib) of the 24 bytes above and the payload
n      bytes   payload: the group's redo operations (:mod:`boxqueue.storage.redo`)
====== ======= ===============================================================

Records written before the term was added (:data:`RECORD_MAGIC_V1`: no term field, a 16-byte
prefix) are still read, as term 0.

A segment is zero-filled ahead of its records (:data:`PREALLOCATE_BYTES` at a time), and records
overwrite the zeros: a flush then carries the record's data alone, where an append that grows the
file also makes the file system journal its new size on every ``fdatasync`` (about half of a small
group's flush, measured). Zeros after the last record are that room, not damage; a segment that is
no longer appended to is cut to its records.

Reading (:class:`LogReader`) stops at the first record that is short, has a bad magic, length
or checksum. If no valid record follows it anywhere in the log, it is the torn tail of an append
that never completed (a kill or a crash during the write; its writers were never answered) and the
log ends cleanly there. If a valid record does follow, the damage is in the middle of the log,
where acknowledged writes live, and reading fails with :class:`WalCorruption`. LSNs must be
consecutive across segments; a gap is corruption too.

Checkpoints (:meth:`WriteAheadLog.rotate` then :meth:`WriteAheadLog.discard_through`): switch
appends to a new segment, flush LMDB, then delete every segment wholly at or below the LSN LMDB
held when the switch happened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

FILE_MAGIC = b"BQWAL\x00\x00\x01"
RECORD_MAGIC = b"BQr\x02"
RECORD_MAGIC_V1 = b"BQr\x01"
_PREFIX = struct.Struct("<4sIQQ")  # magic, payload length, lsn, term: what the CRC covers first
_PREFIX_V1 = struct.Struct("<4sIQ")  # magic, payload length, lsn
_MAGIC_HEAD = RECORD_MAGIC[:3]  # both versions begin with it
_CRC = struct.Struct("<I")
HEADER_SIZE = _PREFIX.size + _CRC.size
HEADER_SIZE_V1 = _PREFIX_V1.size + _CRC.size
MAX_PAYLOAD = 1 << 30
SUFFIX = ".wal"
PREALLOCATE_BYTES = 1 << 20  # zeros written ahead of the records at a time
_ZEROS = bytes(PREALLOCATE_BYTES)

Entry = tuple[int, int, memoryview]  # (LSN, term, payload) of one record


class WalError(Exception):
    """The log cannot be used (unreadable directory, a segment that is not ours)."""


class WalCorruption(WalError):
    """The log is damaged where acknowledged writes live: replay would lose or invent data."""


def encode_record(lsn: int, payload: bytes, term: int = 0) -> bytes:
    """One framed record."""
    prefix = _PREFIX.pack(RECORD_MAGIC, len(payload), lsn, term)
    return prefix + _CRC.pack(zlib.crc32(payload, zlib.crc32(prefix))) + payload


def segment_name(first_lsn: int) -> str:
    return f"{first_lsn:020d}{SUFFIX}"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """The segments in ``directory``, oldest first, as (first LSN, path)."""
    found: list[tuple[int, Path]] = []
    if not directory.is_dir():
        return found
    for entry in directory.iterdir():
        stem = entry.name[: -len(SUFFIX)]
        if entry.name.endswith(SUFFIX) and len(stem) == 20 and stem.isdigit():
            found.append((int(stem), entry))
    found.sort()
    return found


def parse_records(data: bytes | memoryview, offset: int) -> tuple[list[Entry], int, str | None]:
    """The valid records of ``data`` from ``offset`` on, as (LSN, term, payload); the offset where
    they end; and, if that is not the end of ``data``, what is wrong there."""
    view = memoryview(data)
    size = len(view)
    records: list[Entry] = []
    while offset < size:
        problem = _check_record(view, offset)
        if problem is not None:
            if _zeros_from(data, offset):  # room made ahead of the records: the segment ends here
                return records, offset, None
            return records, offset, problem
        if view[offset : offset + 4] == RECORD_MAGIC:
            _magic, length, lsn, term = _PREFIX.unpack_from(view, offset)
            start = offset + HEADER_SIZE
        else:
            _magic, length, lsn = _PREFIX_V1.unpack_from(view, offset)
            term, start = 0, offset + HEADER_SIZE_V1
        records.append((lsn, term, view[start : start + length]))
        offset = start + length
    return records, offset, None


def _zeros_from(data: bytes | memoryview, offset: int) -> bool:
    """Whether everything from ``offset`` to the end is zero bytes (counted in place when ``data``
    is bytes, as a segment read from its file is: no copy of the rest of the segment)."""
    if isinstance(data, bytes):
        return data.count(0, offset) == len(data) - offset
    rest = data[offset:]
    return rest.tobytes().count(0) == len(rest)


def _check_record(view: memoryview, offset: int) -> str | None:
    """Why the record at ``offset`` is not a valid one, or None."""
    size = len(view)
    if size - offset < 4:
        return f"{size - offset} bytes, less than a record header"
    magic = bytes(view[offset : offset + 4])
    if magic == RECORD_MAGIC:
        prefix, header = _PREFIX, HEADER_SIZE
    elif magic == RECORD_MAGIC_V1:
        prefix, header = _PREFIX_V1, HEADER_SIZE_V1
    else:
        return "no record magic"
    if size - offset < header:
        return f"{size - offset} bytes, less than a record header"
    length = prefix.unpack_from(view, offset)[1]
    if length > MAX_PAYLOAD:
        return f"implausible record length {length}"
    start = offset + header
    if start + length > size:
        return f"record of {length} bytes cut short at {size - start}"
    (crc,) = _CRC.unpack_from(view, offset + prefix.size)
    if zlib.crc32(view[start : start + length], zlib.crc32(view[offset : offset + prefix.size])) != crc:
        return "checksum mismatch"
    return None


def first_valid_record(data: bytes, offset: int) -> int | None:
    """The offset of the first valid record at or after ``offset`` (searching by magic), or None."""
    view = memoryview(data)
    at = data.find(_MAGIC_HEAD, offset)
    while at != -1:
        if _check_record(view, at) is None:
            return at
        at = data.find(_MAGIC_HEAD, at + 1)
    return None


class LogReader:
    """Reads every segment of a log directory in LSN order (see the module docstring).

    Iterate :meth:`records` for (LSN, term, payload) of each record after ``after_lsn``; afterwards
    ``last_lsn`` is the last valid LSN in the log (``after_lsn`` if none is higher) and ``torn``
    describes a torn tail that ended it, if any.
    """

    def __init__(self, directory: Path, after_lsn: int) -> None:
        self.directory = directory
        self.after_lsn = after_lsn
        self.last_lsn = after_lsn
        self.torn: str | None = None
        self.segments = list_segments(directory)

    def records(self) -> Iterator[Entry]:
        expected: int | None = None
        segments = self.segments
        for index, (first_lsn, path) in enumerate(segments):
            data = _read(path)
            later = segments[index + 1 :]
            if len(data) < len(FILE_MAGIC):
                if data != FILE_MAGIC[: len(data)] or _any_record_in(later):
                    raise WalCorruption(f"{path}: truncated segment header with log segments after it")
                self.torn = f"{path}: segment header cut short at {len(data)} bytes"
                return
            if data[: len(FILE_MAGIC)] != FILE_MAGIC:
                raise WalError(f"{path}: not a boxqueue log segment")
            records, end, problem = parse_records(data, len(FILE_MAGIC))
            if problem is not None and (first_valid_record(data, end + 1) is not None or _any_record_in(later)):
                raise WalCorruption(
                    f"{path}: damaged record at byte {end} ({problem}) with valid records after it"
                )
            if records and records[0][0] != first_lsn:
                raise WalCorruption(f"{path}: first record has LSN {records[0][0]}, the name says {first_lsn}")
            for lsn, term, payload in records:
                if expected is None:
                    if lsn > self.after_lsn + 1:
                        raise WalCorruption(
                            f"{path}: the log begins at LSN {lsn} but the database holds only up to"
                            f" {self.after_lsn}: records {self.after_lsn + 1}..{lsn - 1} are missing"
                        )
                elif lsn != expected:
                    raise WalCorruption(f"{path}: LSN {lsn} where {expected} was expected")
                expected = lsn + 1
                if lsn > self.after_lsn:
                    self.last_lsn = lsn
                    yield lsn, term, payload
            if problem is not None:
                self.torn = f"{path}: torn record at byte {end} ({problem})"
                return


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise WalError(f"cannot read {path}: {exc}") from exc


def _any_record_in(segments: list[tuple[int, Path]]) -> bool:
    for _lsn, path in segments:
        data = _read(path)
        if first_valid_record(data, 0) is not None:
            return True
    return False


class WriteAheadLog:
    """The segment being appended to, and the older ones a checkpoint has yet to delete.

    Not thread-safe: the group committer calls :meth:`append`, :meth:`sync`, :meth:`rotate`
    from one worker thread at a time (it holds a lock around them).
    """

    def __init__(self, directory: Path, first_lsn: int) -> None:
        """Start a new segment for ``first_lsn``; segments already in ``directory`` are kept (they
        are older: :meth:`discard_through` deletes them)."""
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.segments = [(lsn, path) for lsn, path in list_segments(directory) if lsn < first_lsn]
        self._fd = -1
        self.size = 0  # where the next record goes
        self._allocated = 0  # the file's length: zeros from ``size`` to here
        self.first_lsn = first_lsn
        try:
            self._open_segment(first_lsn)
        except OSError as exc:
            # A full disk: no segment yet. Reads are served; the first append opens it, or
            # fails (the write with it) while there is no room.
            log.warning("cannot start a write-ahead log segment (%s): it is started by the next write", exc)

    def _open_segment(self, first_lsn: int) -> None:
        path = self.directory / segment_name(first_lsn)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, FILE_MAGIC, 0)
            os.fdatasync(fd)
            _sync_directory(self.directory)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):  # no segment without its magic is left behind
                path.unlink()
            raise
        self._close_segment()
        self._fd = fd
        self.size = self._allocated = len(FILE_MAGIC)
        self.first_lsn = first_lsn
        self.segments.append((first_lsn, path))

    def _close_segment(self) -> None:
        """Cut the segment to its records (its zeros are of no more use) and close it."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):  # zeros left at the end read as the segment's end
                os.ftruncate(self._fd, self.size)
            os.close(self._fd)
            self._fd = -1

    def append(self, record: bytes) -> None:
        """Write ``record`` after the last one (not flushed), over zeros written ahead. On failure
        the segment is cut back to where it was, so a later append does not follow a fragment."""
        if self._fd < 0:
            self._open_segment(self.first_lsn)
        start = self.size
        end = start + len(record)
        try:
            if end > self._allocated:
                self._preallocate(end)
            _write_all(self._fd, record, start)
        except BaseException:
            self.cut_back(start)
            raise
        self.size = end

    def _preallocate(self, end: int) -> None:
        """Zero-fill the segment to at least ``end``, :data:`PREALLOCATE_BYTES` at a time (flushed
        with the next record)."""
        target = max(end, self._allocated + PREALLOCATE_BYTES)
        while self._allocated < target:
            step = min(target - self._allocated, PREALLOCATE_BYTES)
            _write_all(self._fd, _ZEROS[:step], self._allocated)
            self._allocated += step

    def cut_back(self, size: int) -> None:
        """Forget what was written after ``size`` (a record whose group was not committed): zeros
        over it, so that no complete record stays behind the end."""
        at = size
        while at < self._allocated:
            step = min(self._allocated - at, PREALLOCATE_BYTES)
            _write_all(self._fd, _ZEROS[:step], at)
            at += step
        self.size = size

    def sync(self) -> None:
        if self._fd >= 0:  # (no segment: nothing was appended)
            os.fdatasync(self._fd)

    def rotate(self, first_lsn: int) -> bool:
        """Switch appends to a new segment starting at ``first_lsn`` (the current one must be
        flushed). False, and nothing done, if the current segment holds no record yet."""
        if self._fd < 0 or self.size <= len(FILE_MAGIC):
            return False
        self._open_segment(first_lsn)
        return True

    def discard_through(self, lsn: int) -> int:
        """Delete the segments (other than the current one) whose records are all at or below
        ``lsn``; LMDB must be flushed up to ``lsn``. Returns how many were deleted."""
        keep: list[tuple[int, Path]] = []
        deleted = 0
        for i, (first, path) in enumerate(self.segments):
            following = self.segments[i + 1][0] if i + 1 < len(self.segments) else None
            if following is not None and following - 1 <= lsn:
                path.unlink(missing_ok=True)
                deleted += 1
            else:
                keep.append((first, path))
        self.segments = keep
        return deleted

    def close(self) -> None:
        self._close_segment()

    def retire(self) -> None:
        """Close and delete every segment: LMDB holds and has flushed everything they hold."""
        self.close()
        for _lsn, path in self.segments:
            path.unlink(missing_ok=True)
        self.segments = []


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
