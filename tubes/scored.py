"""Scored tubes: priority queues ordered by a score, with ack deadlines, locks and expiry.

This is the tube kind Deckard's queues are made of (the facade in :mod:`facades.deckard` only
translates). A queue is a tube named by any string; a message is keyed by (queue, id). A message
is *active* (pullable, lowest score first, ties in arrival order), *processing* (pulled, until
its ack deadline) or *locked* (acked or nacked with a lock, until its unlock time). Every message
expires at its ``expires`` time, whatever its state; a queue may have a ``max_elements`` limit,
beyond which the messages closest to expiry are evicted.

Storage is the truth: every message is a tuple of one space (``deckard_messages``, layout in
:mod:`tubes.scored_message`) and every limit a tuple of ``deckard_queues``, both created through
the catalogue, written only through the group committer, so an acknowledged change survives a
kill -9. Memory holds, per queue, the active ordering, the timeline of deadlines and unlocks and
the expiry ordering: caches rebuilt from LMDB at start. As in :mod:`tubes.engine`, a change is
decided in memory first (two pulls never get the same message), then written; the call returns
once the write is durable, and the memory change is undone if the write fails.

One monitor task per queue, owned by this object's nursery, sleeps until the queue's next
deadline, unlock or expiry and acts at that time (K7), woken early when a change brings an event
closer. Times are milliseconds since the epoch.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import lmdb
import trio
from sortedcontainers import SortedList

from errcodes import ER, BoxError
from spaces.catalog import Catalog
from spaces.msgpack_values import pack
from spaces.space import REPLACE, Space, decode_tuple
from tubes.scored_message import (
    ACTIVE,
    LIMIT_FORMAT,
    LIMIT_KEY,
    LOCKED_BY_ACK,
    LOCKED_BY_NACK,
    MESSAGE_FORMAT,
    MESSAGE_KEY,
    NO_RESTORE,
    PROCESSING,
    ScoredMessage,
    encode_message,
    rewrite_header,
)

log = logging.getLogger(__name__)

MESSAGES_SPACE = "deckard_messages"
LIMITS_SPACE = "deckard_queues"

MIN_SCORE = 0.0
MAX_SCORE = float(2**53)
TIMELESS_MS = 100 * 36525 * 24 * 3600 * 1000 // 100  # 100 years of 365.25 days, in ms
MAX_TIME_MS = 2**62  # far beyond any real date, and still a msgpack unsigned
RETRY_AFTER_FAILURE = 0.1
IDLE_WAIT = 3600.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def clamp_score(score: float) -> float:
    """Scores live in [0, 2^53] (K3); NaN is refused by the facade before it gets here."""
    return min(max(float(score), MIN_SCORE), MAX_SCORE)


def clamp_time(ms: int) -> int:
    return min(max(int(ms), 0), MAX_TIME_MS)


@dataclass
class NewMessage:
    """One message of an add: ``score`` None means "now" (the default algorithm)."""

    queue: str
    id: str
    score: float | None
    expires: int
    data: list[Any]


class ScoredTube:
    """The messages of one queue and the orderings the monitor and pulls work from."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.messages: dict[str, ScoredMessage] = {}
        self.active: SortedList = SortedList()  # (score, seq, id)
        self.timeline: SortedList = SortedList()  # (event, seq, id) of processing and locked ones
        self.expiry: SortedList = SortedList()  # (expires, seq, id) of every message
        self.limit = 0  # max_elements, 0 for none
        self.monitor_started = False
        self.monitor_wakeup = trio.Event()
        self.monitor_until = math.inf  # when the sleeping monitor will look again

    def place(self, message: ScoredMessage) -> None:
        self.messages[message.id] = message
        if message.state == ACTIVE:
            self.active.add(message.active_key())
        else:
            self.timeline.add(message.event_key())
        self.expiry.add(message.expiry_key())

    def unplace(self, message: ScoredMessage) -> None:
        if message.state == ACTIVE:
            self.active.remove(message.active_key())
        else:
            self.timeline.remove(message.event_key())
        self.expiry.remove(message.expiry_key())
        del self.messages[message.id]

    def next_time(self) -> int | None:
        """When something happens next: a deadline, an unlock or an expiry."""
        times = [keys[0][0] for keys in (self.timeline, self.expiry) if keys]
        return min(times) if times else None

    def wake_monitor_for(self, when: int) -> None:
        """Wake the monitor if ``when`` comes before the time it sleeps until."""
        if when < self.monitor_until:
            self.monitor_wakeup.set()


class ScoredQueues:
    """Every scored tube of the server, stored in the ``deckard_messages`` space."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.committer = catalog.committer
        self.tubes: dict[str, ScoredTube] = {}
        self._messages: Space | None = None
        self._limits: Space | None = None
        self._nursery: trio.Nursery | None = None
        self._last_seq = 0
        self._adding: dict[tuple[str, str], trio.Event] = {}  # adds of one key run one at a time
        self._generation = 0  # bumped by flush: adds written before it must not be placed

    # -- life ----------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Create the spaces if needed, rebuild memory from them, then own the monitors."""
        self._messages = await self._space(MESSAGES_SPACE, MESSAGE_FORMAT, MESSAGE_KEY)
        self._limits = await self._space(LIMITS_SPACE, LIMIT_FORMAT, LIMIT_KEY)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._recover()
            for tube in list(self.tubes.values()):
                if tube.limit:
                    await self._enforce_limit(tube)
                self._ensure_monitor(tube)
            task_status.started()
            await trio.sleep_forever()

    async def _space(self, name: str, fmt: tuple[Any, ...], parts: list[Any]) -> Space:
        space = self.catalog.by_name.get(name)
        if space is None:
            space, _ = await self.catalog.create_space(name, format=fmt, if_not_exists=True)
        if space.primary is None:
            await self.catalog.create_index(space, "primary", index_type="TREE", unique=True, parts=parts)
        laid_out = tuple((f.name, f.type) for f in space.defn.format) == tuple((f.name, f.type) for f in fmt)
        if not laid_out or space.primary is None or space.primary.fieldnos != tuple(p[0] for p in parts):
            raise BoxError(
                ER.SPACE_EXISTS, name, message=f"Space '{name}' already exists with another layout than Deckard's"
            )
        return space

    def _recover(self) -> None:
        """Memory from LMDB: every message in the state it was stored in (K13)."""
        for raw in self._space_of(self._limits).pairs(0, 2, []):
            queue, limit = decode_tuple(raw)[:2]
            self.tube(queue).limit = limit
        count = 0
        for raw in self._space_of(self._messages).pairs(0, 2, []):
            message = ScoredMessage.from_fields(decode_tuple(raw))
            self.tube(message.queue).place(message)
            self._last_seq = max(self._last_seq, message.seq)
            count += 1
        if count:
            log.info("scored tubes: %d messages in %d queues", count, len(self.tubes))

    @staticmethod
    def _space_of(space: Space | None) -> Space:
        if space is None:
            raise RuntimeError("scored tubes are not running")
        return space

    # -- lookups -------------------------------------------------------------------------------

    def tube(self, name: str) -> ScoredTube:
        tube = self.tubes.get(name)
        if tube is None:
            tube = self.tubes[name] = ScoredTube(name)
        return tube

    def _next_seq(self) -> int:
        seq = max(time.time_ns() // 1000, self._last_seq + 1)
        self._last_seq = seq
        return seq

    def count(self, queue: str | None) -> int:
        """Messages of ``queue`` in every state; ``None``: of every queue."""
        if queue is None:
            return sum(len(t.messages) for t in self.tubes.values())
        tube = self.tubes.get(queue)
        return 0 if tube is None else len(tube.messages)

    def get(self, queue: str, message_id: str) -> tuple[ScoredMessage, bytes] | None:
        """A copy of the message and its stored tuple, if it exists and has not expired."""
        tube = self.tubes.get(queue)
        message = tube.messages.get(message_id) if tube is not None else None
        if message is None or message.expires <= now_ms():
            return None
        raw = self._space_of(self._messages).get(0, [queue, message_id])
        if raw is None:
            return None
        return message.copy(), raw

    def limit(self, queue: str) -> int:
        tube = self.tubes.get(queue)
        return 0 if tube is None else tube.limit

    # -- writes --------------------------------------------------------------------------------

    def _put(self, message: ScoredMessage, data: list[Any]) -> Callable[[lmdb.Transaction], Any]:
        raw = encode_message(message.header(), data)
        return self._space_of(self._messages).prepare_put(raw, decode_tuple(raw), REPLACE)

    def _rewrite(self, message: ScoredMessage) -> Callable[[lmdb.Transaction], Any]:
        header = message.header()
        return self._space_of(self._messages).prepare_transform(
            [message.queue, message.id], lambda stored: rewrite_header(header, stored)
        )

    def _delete(self, message: ScoredMessage) -> Callable[[lmdb.Transaction], Any]:
        return self._space_of(self._messages).prepare_delete(0, [message.queue, message.id])

    async def _write_all(self, writes: list[Callable[[lmdb.Transaction], Any]]) -> list[Any]:
        """Several writes as one commit (one flush), in order; their results."""
        if not writes:
            return []

        def write(txn: lmdb.Transaction) -> list[Any]:
            return [w(txn) for w in writes]

        return await self.committer.write(write)

    async def _change(
        self, tube: ScoredTube, changes: list[tuple[ScoredMessage, Callable[[ScoredMessage], None]]]
    ) -> list[Any]:
        """Apply each change to its message in memory, write the new headers in one commit and
        return the stored tuples; on failure put back what is still as this call left it."""
        undo: list[tuple[ScoredMessage, ScoredMessage, list[Any]]] = []
        writes = []
        for message, mutate in changes:
            before = message.copy()
            tube.unplace(message)
            mutate(message)
            tube.place(message)
            undo.append((message, before, message.header()))
            writes.append(self._rewrite(message))
            if message.state != ACTIVE:
                tube.wake_monitor_for(message.event)
        try:
            return await self._write_all(writes)
        except BaseException:
            for message, before, header in undo:
                if tube.messages.get(message.id) is message and message.header() == header:
                    tube.unplace(message)
                    message.restore_from(before)
                    tube.place(message)
            raise

    async def _remove(self, tube: ScoredTube, messages: list[ScoredMessage]) -> int:
        """Delete messages (memory first, then one commit); how many there were."""
        gone = [m for m in messages if tube.messages.get(m.id) is m]
        for message in gone:
            tube.unplace(message)
        try:
            await self._write_all([self._delete(m) for m in gone])
        except BaseException:
            for message in gone:
                if message.id not in tube.messages:
                    tube.place(message)
            raise
        if not tube.messages:
            tube.monitor_wakeup.set()  # its monitor ends, and the queue is forgotten
        return len(gone)

    # -- producers -----------------------------------------------------------------------------

    async def add(self, items: list[NewMessage]) -> tuple[int, int]:
        """Insert or update messages, in one commit; returns (created, updated) (section 2.1).

        A new message is active with its score; an existing one keeps its state, score,
        position, breakpoint and diagnostics, and gets the new data and expiry (K10). A queue
        over its limit then evicts the messages closest to expiry (K8).
        """
        keys = {(item.queue, item.id) for item in items}
        while True:
            busy = [self._adding[k] for k in keys if k in self._adding]
            if not busy:
                break
            await busy[0].wait()
        finished = trio.Event()
        for key in keys:
            self._adding[key] = finished
        try:
            return await self._add(items)
        finally:
            for key in keys:
                del self._adding[key]
            finished.set()

    async def _add(self, items: list[NewMessage]) -> tuple[int, int]:
        now = now_ms()
        created: dict[tuple[str, str], ScoredMessage] = {}
        updated: list[tuple[ScoredTube, ScoredMessage, ScoredMessage]] = []  # tube, message, before
        writes = []
        for item in items:
            key = (item.queue, item.id)
            tube = self.tubes.get(item.queue)
            existing = created.get(key) or (tube.messages.get(item.id) if tube is not None else None)
            expires = clamp_time(item.expires)
            if existing is None:
                score = clamp_score(now if item.score is None else item.score)
                message = ScoredMessage(item.queue, item.id, ACTIVE, score, 0, NO_RESTORE, expires, self._next_seq())
                created[key] = message
            else:
                message = existing
                if key not in created:
                    assert tube is not None
                    updated.append((tube, message, message.copy()))
                    tube.unplace(message)
                    message.expires = expires
                    tube.place(message)
                    tube.wake_monitor_for(expires)
                else:
                    message.expires = expires
            writes.append(self._put(message, item.data))
        generation = self._generation
        try:
            await self._write_all(writes)
        except BaseException:
            for tube, message, before in reversed(updated):
                if tube.messages.get(message.id) is message:
                    tube.unplace(message)
                    message.expires = before.expires
                    tube.place(message)
            raise
        touched: dict[str, ScoredTube] = {}
        if generation == self._generation:  # else a flush came after the write: nothing to place
            for message in created.values():
                tube = self.tube(message.queue)
                if message.id in tube.messages:  # a concurrent add of another batch cannot be
                    continue  # here (keys are exclusive), so this is only defensive
                tube.place(message)
                tube.wake_monitor_for(message.expires)
                touched[tube.name] = tube
        for tube, _message, _before in updated:
            touched[tube.name] = tube
        for tube in touched.values():
            self._ensure_monitor(tube)
            if tube.limit and len(tube.messages) > tube.limit:
                await self._enforce_limit(tube)
        return len(created), len(items) - len(created)

    # -- consumers -----------------------------------------------------------------------------

    async def pull(
        self, queue: str, amount: int, min_score: float, max_score: float, deadline_ms: int
    ) -> list[tuple[ScoredMessage, bytes]]:
        """Up to ``amount`` active messages with ``min_score <= score <= max_score``, lowest
        score first, made processing until now + ``deadline_ms``; with their stored tuples."""
        tube = self.tubes.get(queue)
        if tube is None or amount <= 0:
            return []
        now = now_ms()
        chosen: list[ScoredMessage] = []
        for key in tube.active.irange((min_score,), (max_score, math.inf)):
            message = tube.messages[key[2]]
            if message.expires <= now:
                tube.wake_monitor_for(message.expires)
                continue
            chosen.append(message)
            if len(chosen) >= amount:
                break
        if not chosen:
            return []
        deadline = clamp_time(now + deadline_ms)

        def processing(message: ScoredMessage) -> None:
            message.state, message.event = PROCESSING, deadline

        stored = await self._change(tube, [(m, processing) for m in chosen])
        return [(m.copy(), raw) for m, raw in zip(chosen, stored, strict=True) if raw is not None]

    async def unpull(self, queue: str, ids: Iterable[str]) -> None:
        """Processing messages go back to active where they were (same score), as if never
        pulled: for a pull whose answer could not carry them all."""
        tube = self.tubes.get(queue)
        if tube is None:
            return
        found = [tube.messages[i] for i in ids if i in tube.messages and tube.messages[i].state == PROCESSING]

        def active_again(message: ScoredMessage) -> None:
            message.state, message.event = ACTIVE, 0

        await self._change(tube, [(m, active_again) for m in found])

    async def settle(
        self,
        queue: str,
        message_id: str,
        *,
        nack: bool,
        score: float | None,
        lock_ms: int,
        breakpoint: str,
        score_subtract: float = 0.0,
    ) -> bool:
        """Ack or nack a processing message (sections 2.3-2.4 with K3); False if it is not one.

        Without a lock it is active again at once: with ``score`` if given, else a nack goes to
        the front (0) and an ack to the back (now). With ``lock_ms`` it is locked until then and
        unlocks with ``score`` if given, else with that default taken at unlock time.
        """
        tube = self.tubes.get(queue)
        message = tube.messages.get(message_id) if tube is not None else None
        if tube is None or message is None or message.state != PROCESSING:
            return False
        now = now_ms()

        def settled(m: ScoredMessage) -> None:
            if nack:
                m.nacks += 1
                m.consecutive_nacks += 1
                m.consecutive_acks = 0
            else:
                m.acks += 1
                m.consecutive_acks += 1
                m.consecutive_nacks = 0
                m.breakpoint = breakpoint
            if lock_ms > 0:
                m.state = LOCKED_BY_NACK if nack else LOCKED_BY_ACK
                m.event = clamp_time(now + lock_ms)
                m.restore = NO_RESTORE if score is None else clamp_score(score)
            else:
                m.state, m.event, m.restore = ACTIVE, 0, NO_RESTORE
                if score is not None:
                    m.score = clamp_score(score)
                else:
                    m.score = MIN_SCORE if nack else clamp_score(now - score_subtract)

        await self._change(tube, [(message, settled)])
        return True

    async def remove(self, queue: str, ids: Iterable[str]) -> int:
        tube = self.tubes.get(queue)
        if tube is None:
            return 0
        found = [tube.messages[i] for i in dict.fromkeys(ids) if i in tube.messages]
        return await self._remove(tube, found)

    # -- queues --------------------------------------------------------------------------------

    async def set_limit(self, queue: str, max_elements: int) -> None:
        """``max_elements`` > 0 sets the limit (evicting at once, K8), < 0 removes it, 0 is
        ignored (Deckard's QueueConfiguration rules)."""
        if max_elements == 0:
            return
        limit = max(max_elements, 0)
        tube = self.tube(queue)
        limits = self._space_of(self._limits)
        if limit:
            write = limits.prepare_put(pack([queue, limit]), [queue, limit], REPLACE)
        else:
            write = limits.prepare_delete(0, [queue])
        before = tube.limit
        tube.limit = limit
        try:
            await self.committer.write(write)
        except BaseException:
            tube.limit = before
            raise
        if limit and len(tube.messages) > limit:
            await self._enforce_limit(tube)
        self._ensure_monitor(tube)
        self._forget_if_unused(tube)

    def _forget_if_unused(self, tube: ScoredTube) -> None:
        """A queue with no messages, no limit and no monitor costs no memory."""
        if not tube.messages and not tube.limit and not tube.monitor_started and self.tubes.get(tube.name) is tube:
            del self.tubes[tube.name]

    async def _enforce_limit(self, tube: ScoredTube) -> None:
        """Evict the messages closest to expiry (then the oldest) down to the limit (K8)."""
        excess = len(tube.messages) - tube.limit
        if tube.limit <= 0 or excess <= 0:
            return
        doomed = [tube.messages[key[2]] for key in tube.expiry[:excess]]
        removed = await self._remove(tube, doomed)
        log.debug("queue %r over its limit of %d: %d messages evicted", tube.name, tube.limit, removed)

    async def flush(self) -> None:
        """Every scored message and limit is gone (the spaces are truncated, nothing else)."""
        self._generation += 1
        for tube in self.tubes.values():
            tube.messages.clear()
            tube.active.clear()
            tube.timeline.clear()
            tube.expiry.clear()
            tube.limit = 0
            tube.monitor_wakeup.set()
        for tube in list(self.tubes.values()):
            self._forget_if_unused(tube)
        messages = self._space_of(self._messages)
        limits = self._space_of(self._limits)
        await self._write_all([messages.prepare_truncate(), limits.prepare_truncate()])

    # -- monitors ------------------------------------------------------------------------------

    def _ensure_monitor(self, tube: ScoredTube) -> None:
        if self._nursery is None or tube.monitor_started:
            return
        if not tube.messages:
            return
        tube.monitor_started = True
        self._nursery.start_soon(self._monitor, tube)

    async def _monitor(self, tube: ScoredTube) -> None:
        """Deadlines, unlocks and expiry of one queue, each at its own time."""
        try:
            while True:
                tube.monitor_wakeup = trio.Event()
                tube.monitor_until = -math.inf  # busy: every change counts as earlier
                try:
                    await self._act(tube, now_ms())
                except Exception:
                    log.exception("monitor of scored queue %r failed", tube.name)
                    await trio.sleep(RETRY_AFTER_FAILURE)
                    continue
                if tube.monitor_wakeup.is_set():
                    continue
                next_time = tube.next_time()
                if next_time is None:
                    if not tube.messages:
                        return
                    wait = IDLE_WAIT
                else:
                    wait = (next_time - now_ms()) / 1000
                tube.monitor_until = next_time if next_time is not None else math.inf
                with trio.move_on_after(max(wait, 0)):
                    await tube.monitor_wakeup.wait()
        finally:
            tube.monitor_started = False
            tube.monitor_until = math.inf
            self._forget_if_unused(tube)

    async def _act(self, tube: ScoredTube, now: int) -> None:
        expired = [tube.messages[key[2]] for key in tube.expiry.irange(maximum=(now, math.inf))]
        if expired:
            await self._remove(tube, expired)
        due = [tube.messages[key[2]] for key in tube.timeline.irange(maximum=(now, math.inf))]
        if due:
            await self._change(tube, [(m, _back_to_active(now)) for m in due])


def _back_to_active(now: int) -> Callable[[ScoredMessage], None]:
    """A deadline passing puts the message at the front (K7); a lock ending puts it back with
    the score given with the lock, else the front for a nack and the back (now) for an ack."""

    def back(message: ScoredMessage) -> None:
        if message.state == PROCESSING:
            message.score = MIN_SCORE
        elif message.restore != NO_RESTORE:
            message.score = message.restore
        elif message.state == LOCKED_BY_NACK:
            message.score = MIN_SCORE
        else:
            message.score = clamp_score(now)
        message.state, message.event, message.restore = ACTIVE, 0, NO_RESTORE

    return back
