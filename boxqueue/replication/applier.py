"""The follower's side of the stream: connect to the leader, follow its log, hold every record.

:meth:`Applier.follow` connects to the leader's iproto listener as a client would (greeting,
AUTH as the configured replication user), sends SUBSCRIBE with its log's last record, and
hands the records it is sent to the group committer (``log_replicated``: the same LSN and term),
which logs and flushes each batch of them, then applies them to LMDB. A record is acknowledged
once its log holds it, without waiting for LMDB (a restart replays the log past LMDB's position):
that takes the apply and a pass of the commit loop out of what the leader's quorum waits for.
Records that arrive while a batch is being flushed make the next batch. Heartbeats are answered
with an acknowledgement too. A leader that answers ER_TOO_EARLY_SUBSCRIBE gets a JOIN: the
follower takes a fresh copy (:mod:`boxqueue.replication.copy`) and subscribes again.

Records of a deposed leader are refused: a stream whose term (in the leader's answer) is older
than the newest term this follower knows of, or a record of an older term than the one before it,
ends the stream. A record logged and acknowledged that then cannot be applied stops the process
(the leader counts it as held here); the log's replay at the restart applies it.
"""

from __future__ import annotations

import base64
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgpack
import trio

from boxqueue.errcodes import ER
from boxqueue.iproto.greeting import VERSION_ID
from boxqueue.replication import rows
from boxqueue.replication.copy import CopyWriter
from boxqueue.spaces import access as acl
from boxqueue.spaces.catalog import CATALOG_DB, Catalog
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import Storage, StorageError
from boxqueue.storage.redo import decode

log = logging.getLogger(__name__)

AUTH = 7


class StreamRefused(Exception):
    """The leader refused this follower, or sent what it must not follow."""


# What ends a stream (the follower connects again): the network, the leader, bad rows, a log that
# cannot take the records (a full disk, say).
STREAM_ENDS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, StreamRefused, ValueError,
               StorageError)


def first_leaf(group: BaseExceptionGroup) -> BaseException:
    """The first exception of a (nested) group: why a stream's tasks ended."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found


@dataclass
class Upstream:
    """The leader as this follower sees it (``box.info.replication[...].upstream``)."""

    peer: str = ""
    status: str = "connect"
    message: str = ""
    received_at: float = field(default_factory=time.monotonic)  # the last row
    lag: float = 0.0  # seconds between a record's writing on the leader and its arrival here
    leader_lsn: int = 0


class Applier:
    def __init__(self, storage: Storage, committer: GroupCommitter, catalog: Catalog, *, name: str,
                 user: str | None, password: str | None, heartbeat_s: float,
                 known_term: Callable[[], int], instance_uuid: str,
                 reloads: dict[bytes, Callable[[], Awaitable[None]]] | None = None) -> None:
        self.storage = storage
        self.committer = committer
        self.catalog = catalog
        self.name = name
        self.user = user
        self.password = password
        self.heartbeat_s = heartbeat_s
        self.known_term = known_term  # the newest term this node knows of (from the election)
        self.instance_uuid = instance_uuid
        self.upstream = Upstream()
        self.copies = 0
        self.queued = 0  # the last record taken from the stream (a new stream may send it again)
        # What to read again once records change a database: the catalogue's spaces, and what the
        # caller adds (the persisted Lua functions, say), once per batch of such records.
        self.reloads: dict[bytes, Callable[[], Awaitable[None]]] = {CATALOG_DB: catalog.reload, **(reloads or {})}
        self._changed: set[bytes] = set()
        self._change_seen = trio.Event()

    async def follow(self, host: str, port: int) -> None:
        """Follow the leader at ``host:port`` until cancelled, reconnecting after every failure."""
        self.upstream = Upstream(peer=f"{host}:{port}")
        while True:
            try:
                await self._subscribe(host, port)
            except _Rejoin:
                self.upstream.status = "loading"
                await self._join(host, port)
                continue
            except STREAM_ENDS as exc:
                self.upstream.status = "disconnected"
                self.upstream.message = str(exc)
                log.info("replication from %s:%d: %s; connecting again", host, port, exc)
            await trio.sleep(self.heartbeat_s)

    # -- one connection --------------------------------------------------------------------------

    async def _connect(self, host: str, port: int) -> tuple[trio.SocketStream, rows.RowDecoder]:
        self.upstream.status = "connect"
        stream = await trio.open_tcp_stream(host, port)
        try:
            greeting = await _receive_exactly(stream, 128)
            salt = base64.b64decode(greeting[64:128].strip())[:20]
            decoder = rows.RowDecoder()
            if self.user is not None:
                self.upstream.status = "auth"
                scramble = acl.chap_sha1_scramble(self.password or "", salt)
                await stream.send_all(_request(AUTH, 1, {0x23: self.user, 0x21: ["chap-sha1", scramble]}))
                answer = await _next_row(stream, decoder, 10 * self.heartbeat_s + 10)
                if answer.is_error:
                    raise StreamRefused(f"the leader refused the login of {self.user!r}: {_message(answer)}")
            return stream, decoder
        except BaseException:
            await stream.aclose()
            raise

    async def _subscribe(self, host: str, port: int) -> None:
        stream, decoder = await self._connect(host, port)
        async with stream:
            storage = self.storage
            await stream.send_all(rows.subscribe(2, self.instance_uuid, self.name, {1: storage.logged_lsn},
                                                 storage.logged_lsn, storage.logged_term, VERSION_ID))
            answer = await _next_row(stream, decoder, 10 * self.heartbeat_s + 10)
            if answer.is_error:
                if answer.error_code == ER.TOO_EARLY_SUBSCRIBE:
                    raise _Rejoin()
                raise StreamRefused(f"the leader refused the subscription: {_message(answer)}")
            stream_term = answer.term
            if stream_term < self.known_term():
                raise StreamRefused(f"the leader's term {stream_term} is older than term {self.known_term()}")
            self.upstream.status = "follow"
            self.upstream.message = ""
            self.upstream.leader_lsn = answer.lsn
            log.info("following the leader at %s:%d (term %d, its log at %d, ours at %d)",
                     host, port, stream_term, answer.lsn, storage.lsn)
            await self._apply(stream, decoder, stream_term)

    async def _apply(self, stream: trio.SocketStream, decoder: rows.RowDecoder, stream_term: int) -> None:
        """Log and apply records as they come, each acknowledged once the log holds it, until the
        stream ends."""
        try:
            await self._apply_rows(stream, decoder, stream_term)
        except* STREAM_ENDS as group:  # one task's failure ends the stream: report the first
            raise first_leaf(group) from None

    async def _apply_rows(self, stream: trio.SocketStream, decoder: rows.RowDecoder, stream_term: int) -> None:
        storage = self.storage
        last_term = storage.logged_term
        self.queued = storage.logged_lsn  # (records taken by an earlier stream and not logged are gone)
        async with trio.open_nursery() as nursery:
            applied = _Applied(self)
            batch = _Batch()
            # What we hold durably, at once: the leader counts no more than an acknowledgement
            # says (our SUBSCRIBE's position may name records not flushed yet).
            batch.ack_due = True
            nursery.start_soon(self._log_batches, stream, batch, applied)
            nursery.start_soon(self._reload_changed)
            while True:
                row = await _next_row(stream, decoder, 4 * self.heartbeat_s)
                self.upstream.received_at = time.monotonic()
                if row.is_error:
                    raise StreamRefused(f"the leader ended the stream: {_message(row)}")
                if row.type == rows.RECORD:
                    term = row.term
                    if term < last_term or term > stream_term or self.known_term() > stream_term:
                        raise StreamRefused(f"record {row.lsn} of term {term} refused (stream of term "
                                            f"{stream_term}, newest known {self.known_term()})")
                    last_term = term
                    if row.lsn <= self.queued:
                        continue  # logged already, or on its way (sent again by a new stream)
                    stamp = row.header.get(rows.TIMESTAMP)
                    if isinstance(stamp, float | int):
                        self.upstream.lag = max(time.time() - stamp, 0.0)
                    self.upstream.leader_lsn = max(self.upstream.leader_lsn, row.lsn)
                    self._take(row.lsn, term, row.body.get(rows.DATA, b""), batch, applied)
                elif row.type == rows.OK:  # a heartbeat: say what we hold durably
                    self.upstream.lag = 0.0 if storage.lsn >= self.upstream.leader_lsn else self.upstream.lag
                    batch.ack_due = True
                    batch.ready.set()

    def _take(self, lsn: int, term: int, payload: bytes, batch: _Batch, applied: _Applied) -> None:
        ops = decode(payload)
        reloads = self.reloads
        for op in ops:
            if op[1] in reloads:
                applied.changes.append((lsn, {op[1] for op in ops} & reloads.keys()))
                break
        batch.records.append((lsn, term, payload, ops))
        self.queued = lsn
        batch.ready.set()

    async def _log_batches(self, stream: trio.SocketStream, batch: _Batch, applied: _Applied) -> None:
        """Log what the stream brought while the last batch was flushed, then acknowledge it
        (and answer heartbeats): the one task that writes to the leader."""
        committer = self.committer
        storage = self.storage
        while True:
            if not batch.records and not batch.ack_due:
                await batch.ready.wait()
            if batch.ready.is_set():
                batch.ready = trio.Event()
            records, batch.records = batch.records, []
            batch.ack_due = False
            if records:
                await committer.log_replicated(records, applied)
            lsn = storage.synced_lsn
            await stream.send_all(rows.ack({1: lsn}, lsn, storage.logged_term))

    async def _reload_changed(self) -> None:
        """Records changed what ``reloads`` names: read it again (once per batch of them), the
        catalogue first."""
        if self._changed:  # (a stream that ended while it read them again: read them now)
            self._change_seen.set()
        while True:
            await self._change_seen.wait()
            self._change_seen = trio.Event()
            changed = set(self._changed)
            for name in sorted(changed, key=lambda n: n != CATALOG_DB):
                await self.reloads[name]()
            # Forgotten only once read again: a stream that ends meanwhile cancels this task, and
            # the next stream's must not lose them (the catalogue stayed without a new index).
            self._changed -= changed

    # -- a fresh copy ----------------------------------------------------------------------------

    async def _join(self, host: str, port: int) -> None:
        stream, decoder = await self._connect(host, port)
        async with stream:
            await stream.send_all(rows.join(3, self.instance_uuid, VERSION_ID))
            start = await _next_row(stream, decoder, 10 * self.heartbeat_s + 10)
            if start.is_error:
                raise StreamRefused(f"the leader refused a copy: {_message(start)}")
            log.info("taking a fresh copy from %s:%d (its log at %d)", host, port, start.lsn)
            writer = CopyWriter(self.storage, self.committer)
            await writer.begin()
            received = 0
            while True:
                row = await _next_row(stream, decoder, 10 * self.heartbeat_s + 30)
                if row.is_error:
                    raise StreamRefused(f"the copy failed on the leader: {_message(row)}")
                if row.type == rows.SNAPSHOT:
                    data = row.body.get(rows.DATA, b"")
                    received += len(data)
                    await writer.chunk(data)
                    continue
                await writer.end(row.lsn, row.term)
                break
            self.copies += 1
            await self.catalog.reload()
            for name, reload in self.reloads.items():
                if name != CATALOG_DB:
                    await reload()
            log.info("copy of %d bytes taken, as of LSN %d", received, row.lsn)


class _Batch:
    """Records taken from the stream and not logged yet (in order), and the event that says
    there is something to log or acknowledge."""

    __slots__ = ("records", "ready", "ack_due")

    def __init__(self) -> None:
        self.records: list[tuple[int, int, bytes, list]] = []
        self.ready = trio.Event()
        self.ack_due = False  # a heartbeat came: acknowledge, even with nothing new logged


class _Applied:
    """The committer's callback for every record of one stream once applied to LMDB (it was
    logged and acknowledged before): hands the records that changed what ``Applier.reloads``
    names to the reloading task. A record that cannot be applied stops the process (see the
    module's docstring). One object a stream: a closure a record cost the follower as much as
    decoding the record."""

    __slots__ = ("applier", "changes")

    def __init__(self, applier: Applier) -> None:
        self.applier = applier
        self.changes: collections.deque[tuple[int, set[bytes]]] = collections.deque()  # (lsn, names), in order

    def __call__(self, _result: object, error: BaseException | None) -> None:
        applier = self.applier
        storage = applier.storage
        if error is not None:
            applier.committer.fatal(f"a replicated record after {storage.lsn}, logged and acknowledged, "
                                    f"could not be applied: {error}")
            return
        changes = self.changes
        if changes and changes[0][0] <= storage.lsn:
            while changes and changes[0][0] <= storage.lsn:
                applier._changed |= changes.popleft()[1]
            applier._change_seen.set()


class _Rejoin(Exception):
    """The leader asks for a fresh copy."""


async def _receive_exactly(stream: trio.SocketStream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await stream.receive_some(n - len(data))
        if not chunk:
            raise ConnectionError("the leader closed the connection")
        data += chunk
    return data


async def _next_row(stream: trio.SocketStream, decoder: rows.RowDecoder, timeout: float) -> rows.Row:
    while True:
        row = decoder.next_row()
        if row is not None:
            return row
        with trio.move_on_after(timeout) as waited:
            data = await stream.receive_some(1 << 20)
        if waited.cancelled_caught:
            raise ConnectionError(f"nothing from the leader for {timeout:.1f} s")
        if not data:
            raise ConnectionError("the leader closed the connection")
        decoder.feed(data)


def _request(rtype: int, sync: int, body: dict) -> bytes:
    payload = msgpack.packb({0: rtype, 1: sync}) + msgpack.packb(body, use_bin_type=True)
    return b"\xce" + len(payload).to_bytes(4, "big") + payload


def _message(row: rows.Row) -> str:
    return str(row.body.get(rows.ERROR_24, f"error {row.error_code}"))
