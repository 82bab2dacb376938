"""The leader's records as its relays read them: the newest in memory, older ones from the log.

The group committer hands every record it logs to :meth:`History.add` once LMDB holds it (its
``feed``), so a relay streaming to a follower that keeps up never touches the disk. A follower
that is behind is sent what the write-ahead log's segments still hold; one behind even those takes
a fresh copy (:mod:`boxqueue.replication.copy`). While followers read, the segments they still need are
kept (:meth:`History.keep_from`, the committer's checkpoint asks it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path

import trio

from boxqueue.storage.wal import LogReader, WalError, list_segments

Entry = tuple[int, int, bytes]  # (lsn, term, payload)


class History:
    """Recent records (up to ``keep_bytes`` of payload) and the log directory for older ones."""

    def __init__(self, log_dir: Path, last_lsn: int, keep_bytes: int = 64 << 20) -> None:
        self.log_dir = log_dir
        self.last_lsn = last_lsn  # the newest record LMDB holds here
        self.keep_bytes = keep_bytes
        self._recent: deque[Entry] = deque()
        self._bytes = 0
        self._arrived = trio.Event()
        self._readers: dict[object, int] = {}  # who reads -> the lowest LSN it still needs

    # -- writing (the committer's feed) --------------------------------------------------------

    def add(self, lsn: int, term: int, payload: bytes) -> None:
        if self._recent and lsn != self._recent[-1][0] + 1:
            self._recent.clear()  # not a continuation (a copy was taken): start again
            self._bytes = 0
        self._recent.append((lsn, term, payload))
        self._bytes += len(payload)
        while self._bytes > self.keep_bytes and len(self._recent) > 1:
            self._bytes -= len(self._recent.popleft()[2])
        self.last_lsn = lsn
        self._arrived.set()
        self._arrived = trio.Event()

    async def wait_beyond(self, lsn: int) -> None:
        """Until a record after ``lsn`` exists."""
        while self.last_lsn <= lsn:
            await self._arrived.wait()

    # -- reading ---------------------------------------------------------------------------------

    def oldest_available(self) -> int:
        """The oldest LSN a relay can still send (``last_lsn + 1`` when it has nothing older)."""
        oldest = self._recent[0][0] if self._recent else self.last_lsn + 1
        segments = list_segments(self.log_dir)
        if segments:
            oldest = min(oldest, segments[0][0])
        return oldest

    def available_from(self, lsn: int) -> bool:
        """Whether every record from ``lsn`` on can be sent."""
        return lsn > self.last_lsn or self.oldest_available() <= lsn

    def read(self, first: int, most_bytes: int = 4 << 20) -> list[Entry]:
        """Records from ``first`` on, up to about ``most_bytes`` of payload (at least one if any);
        raises :class:`Gone` when ``first`` is no longer kept."""
        if first > self.last_lsn:
            return []
        recent = self._recent
        if recent and recent[0][0] <= first:
            out: list[Entry] = []
            size = 0
            for i in range(first - recent[0][0], len(recent)):
                entry = recent[i]
                out.append(entry)
                size += len(entry[2])
                if size >= most_bytes:
                    break
            return out
        return list(self._read_log(first, most_bytes))

    def _read_log(self, first: int, most_bytes: int) -> Iterator[Entry]:
        reader = LogReader(self.log_dir, first - 1)
        if not reader.segments or reader.segments[0][0] > first:
            raise Gone(first)
        size = 0
        try:
            for lsn, term, payload in reader.records():
                yield lsn, term, bytes(payload)
                size += len(payload)
                if size >= most_bytes:
                    return
        except (WalError, OSError) as exc:  # a checkpoint deleted a segment meanwhile
            raise Gone(first) from exc

    # -- what the log must keep ----------------------------------------------------------------

    def reading(self, reader: object, lsn: int) -> None:
        """``reader`` still needs every record from ``lsn`` on."""
        self._readers[reader] = lsn

    def done_reading(self, reader: object) -> None:
        self._readers.pop(reader, None)

    def keep_from(self) -> int | None:
        """The lowest LSN a reader still needs (the committer keeps the segments holding it)."""
        return min(self._readers.values(), default=None)


class Gone(Exception):
    """The records asked for are no longer kept: the follower needs a fresh copy."""

    def __init__(self, lsn: int) -> None:
        super().__init__(f"record {lsn} is no longer in the log")
        self.lsn = lsn
