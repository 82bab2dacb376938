"""The leader's side of the stream: a follower's SUBSCRIBE or JOIN, served on its connection.

The iproto dispatcher hands over a connection that sent JOIN or SUBSCRIBE (after its AUTH):
:meth:`Relays.serve` runs until the follower goes away. A SUBSCRIBE names the follower's last
record (LSN and term); the leader streams every record after it, as they are written, with a
heartbeat when there is nothing to send, and reads the follower's acknowledgements, which count
towards the quorum (:mod:`boxqueue.replication.quorum`). A follower whose log does not continue the
leader's, or is older than what the leader keeps, is answered ER_TOO_EARLY_SUBSCRIBE and JOINs:
it gets a fresh copy (:mod:`boxqueue.replication.copy`), then subscribes from the copy's position.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack
import trio

from boxqueue.errcodes import ER, BoxError
from boxqueue.replication import rows
from boxqueue.replication.applier import first_leaf
from boxqueue.replication.copy import open_all, read_chunks
from boxqueue.replication.history import Gone, History
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import Storage

log = logging.getLogger(__name__)

TERMS_DB = b"_replication"  # replicated: when each term began
TERMS_KEY = b"terms"
JOIN_PIN_S = 120.0  # how long the records after a copy are kept for its follower's SUBSCRIBE


class IO(Protocol):
    async def receive(self, max_bytes: int) -> bytes: ...
    async def send_all(self, data: bytes) -> None: ...


def read_terms(storage: Storage) -> list[tuple[int, int]]:
    """When each term began: (term, its first LSN), oldest first."""
    handle = storage.existing_db(TERMS_DB)
    if handle is None:
        return []
    with storage.env.begin() as txn:
        raw = txn.get(TERMS_KEY, db=handle)
    return [tuple(pair) for pair in msgpack.unpackb(raw)] if raw is not None else []


def term_at(terms: list[tuple[int, int]], lsn: int) -> int:
    """The term record ``lsn`` was written in (0: before any term)."""
    found = 0
    for term, first in terms:
        if first <= lsn:
            found = term
    return found


@dataclass
class Downstream:
    """A follower as the leader sees it (``box.info.replication[...].downstream``)."""

    name: str
    uuid: str
    acked: int = 0  # its last durable record
    acked_at: float = field(default_factory=time.monotonic)
    sent: int = 0
    status: str = "follow"
    message: str = ""
    lag: float = 0.0  # seconds from a record's sending to its acknowledgement


class Relays:
    """Every follower's stream on this leader."""

    def __init__(self, storage: Storage, committer: GroupCommitter, history: History, replica_id: int,
                 replicaset_uuid: str, term: Callable[[], int], heartbeat_s: float,
                 quorum: Callable[[], Any]) -> None:
        self.storage = storage
        self.committer = committer
        self.history = history
        self.replica_id = replica_id
        self.replicaset_uuid = replicaset_uuid
        self.term = term
        self.heartbeat_s = heartbeat_s
        self.quorum = quorum  # the leader's Quorum, or None (asynchronous)
        self.downstream: dict[str, Downstream] = {}
        self._pins: dict[str, tuple[int, float]] = {}  # copies taken: uuid -> (lsn, until)

    def vclock(self) -> dict[int, int]:
        return {self.replica_id: self.storage.lsn}

    def keep_from(self) -> int | None:
        """The lowest record a follower (or a copy that has yet to subscribe) still needs."""
        now = time.monotonic()
        self._pins = {uuid: pin for uuid, pin in self._pins.items() if pin[1] > now}
        lowest = [lsn for lsn, _until in self._pins.values()]
        kept = self.history.keep_from()
        if kept is not None:
            lowest.append(kept)
        return min(lowest, default=None)

    async def serve(self, session: Any, request: Any, io: IO, leftover: bytes) -> None:
        body = request.body
        try:
            if request.type == rows.JOIN:
                await self._join(request.sync, body, io)
            else:
                await self._subscribe(request.sync, body, io, leftover)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            log.info("replication stream to %s ended: %s", session.peer, first_leaf(group))

    # -- SUBSCRIBE -----------------------------------------------------------------------------

    def continues(self, lsn: int, term: int) -> bool:
        """Whether a follower whose last record is ``lsn`` of ``term`` can go on from there."""
        storage = self.storage
        if lsn > storage.lsn or lsn == 0 < storage.lsn:  # ahead of us, or empty: a copy
            return False
        if lsn > 0 and term_at(read_terms(storage), lsn) != term:
            return False
        return self.history.available_from(lsn + 1)

    async def _subscribe(self, sync: int, body: dict[int, Any], io: IO, leftover: bytes) -> None:
        name = str(body.get(rows.INSTANCE_NAME, "")) or str(body.get(rows.INSTANCE_UUID, "?"))
        uuid = str(body.get(rows.INSTANCE_UUID, ""))
        lsn = int(body.get(rows.LSN, 0) or 0)
        term = int(body.get(rows.TERM, 0) or 0)
        if not self.continues(lsn, term):
            log.info("follower %s (log at %d, term %d) does not continue this log (at %d): it takes a copy",
                     name, lsn, term, self.storage.lsn)
            error = BoxError(ER.TOO_EARLY_SUBSCRIBE, uuid or name)
            await io.send_all(rows.error(sync, error.code, error.message))
            return
        self._pins.pop(uuid, None)
        # Not yet acknowledged: the position may name records the follower has not flushed. It
        # acknowledges what it holds durably as soon as it follows.
        down = self.downstream[name] = Downstream(name, uuid, acked=0, sent=lsn)
        key = object()
        self.history.reading(key, lsn + 1)
        await io.send_all(rows.position(sync, self.replica_id, self.replicaset_uuid, self.vclock(),
                                        self.storage.lsn, self.term()))
        log.info("follower %s subscribed from LSN %d", name, lsn)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_acks, io, leftover, down, key, nursery.cancel_scope)
                await self._send_records(sync, io, down)
        finally:
            self.history.done_reading(key)
            down.status = "stopped"
            quorum = self.quorum()
            if quorum is not None:
                quorum.forget(name)

    async def _send_records(self, sync: int, io: IO, down: Downstream) -> None:
        history = self.history
        next_lsn = down.sent + 1
        beats = 0
        while True:
            try:
                entries = history.read(next_lsn)
            except Gone:
                down.message = f"record {next_lsn} is no longer kept"
                log.warning("follower %s: %s; it will take a copy", down.name, down.message)
                return
            if entries:
                await io.send_all(b"".join(rows.record(sync, self.replica_id, lsn, term, payload)
                                           for lsn, term, payload in entries))
                next_lsn = entries[-1][0] + 1
                down.sent = next_lsn - 1
                continue
            with trio.move_on_after(self.heartbeat_s):
                await history.wait_beyond(next_lsn - 1)
                continue
            beats += 1
            await io.send_all(rows.heartbeat(sync, self.replica_id, beats))

    async def _read_acks(self, io: IO, leftover: bytes, down: Downstream, key: object,
                         stop: trio.CancelScope) -> None:
        decoder = rows.RowDecoder(max_row=1 << 20)
        decoder.feed(leftover)
        try:
            while True:
                while (row := decoder.next_row()) is not None:
                    lsn = int(row.body.get(rows.LSN, 0) or 0)
                    quorum = self.quorum()
                    if lsn > down.acked:
                        down.acked = lsn
                        self.history.reading(key, lsn + 1)
                        if quorum is not None:
                            quorum.ack(down.name, lsn)
                    elif quorum is not None:
                        quorum.heard(down.name)
                    down.acked_at = time.monotonic()
                with trio.move_on_after(4 * self.heartbeat_s) as waited:
                    data = await io.receive(65536)
                if waited.cancelled_caught:
                    down.message = f"no acknowledgement for {4 * self.heartbeat_s:.1f} s"
                    log.warning("follower %s: %s; dropped", down.name, down.message)
                    return
                if not data:
                    return
                decoder.feed(data)
        except ValueError as exc:
            down.message = f"bad acknowledgement: {exc}"
            log.warning("follower %s: %s", down.name, down.message)
        finally:
            stop.cancel()

    # -- JOIN ------------------------------------------------------------------------------------

    async def _join(self, sync: int, body: dict[int, Any], io: IO) -> None:
        uuid = str(body.get(rows.INSTANCE_UUID, ""))
        storage = self.storage
        lsn = storage.lsn
        term = term_at(read_terms(storage), lsn)
        self._pins[uuid] = (lsn + 1, time.monotonic() + JOIN_PIN_S)
        log.info("a follower (%s) takes a copy as of LSN %d", uuid, lsn)
        await open_all(storage, self.committer)
        await io.send_all(rows.position(sync, self.replica_id, self.replicaset_uuid, self.vclock(), lsn, term))
        sent = 0
        for chunk in read_chunks(storage):
            await io.send_all(rows.snapshot(sync, chunk))
            sent += len(chunk)
        await io.send_all(rows.position(sync, self.replica_id, self.replicaset_uuid, self.vclock(), lsn, term))
        log.info("copy of %d bytes sent to %s", sent, uuid)
