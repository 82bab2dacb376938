"""FIFO queues with claims (the tube kind behind the Zaqar facade), stored in LMDB spaces.

A queue belongs to a project and holds messages in post order; a claim is a consumer identity
that expires: the messages it holds are invisible to other claims and to listings until it is
released or expires, and claiming extends a message's life by the claim's grace. Three spaces
(queues, messages, claims) are the truth; everything in :class:`ClaimQueue` is a cache rebuilt
from them at start. Every change is one write through the group committer and a call returns
only once its write is durable. One monitor task per queue, owned by :meth:`ClaimQueues.run`'s
nursery, removes expired messages and claims at their time (no separate garbage collector).

Memory is changed before the write is awaited where two callers could race (claim, pop, delete),
so concurrent claimers never share a message; a failed write puts the memory back.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lmdb
import msgpack
import trio
from sortedcontainers import SortedDict, SortedList

from spaces import iterators
from spaces.catalog import Catalog
from spaces.space import REPLACE, Space, StorageError, decode_tuple
from tubes.pools import PoolCatalog

log = logging.getLogger(__name__)

__all__ = ["ClaimQueues", "Claim", "ClaimQueue", "Message", "StorageError"]  # StorageError: a failed write

QUEUES_SPACE = "zaqar_queues"
MESSAGES_SPACE = "zaqar_messages"
CLAIMS_SPACE = "zaqar_claims"
IDLE_WAIT = 3600.0

# Outcomes of delete_message (the facade maps them to its statuses).
DELETED = "deleted"
CLAIMED = "claimed"  # claimed and no (or another live) claim given
NOT_CLAIMED = "not_claimed"  # a claim was given but the message is not under a live claim
NO_SUCH_CLAIM = "no_such_claim"  # the claim given does not exist or has expired


@dataclass
class Message:
    seq: int
    id: str
    created: float
    ttl: int
    expires: float
    client: str
    body: Any
    claim_id: str = ""
    claim_expires: float = 0.0

    def fields(self, project: str, queue: str) -> list[Any]:
        return [self.seq, project, queue, self.id, self.created, self.ttl, self.expires, self.client,
                self.body, self.claim_id, self.claim_expires]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Message:
        return cls(f[0], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10])

    def claimed(self, now: float) -> bool:
        return bool(self.claim_id) and self.claim_expires > now


@dataclass
class Claim:
    id: str
    ttl: int
    grace: int
    expires: float
    updated: float
    message_seqs: set[int] = field(default_factory=set)

    def fields(self, project: str, queue: str) -> list[Any]:
        return [self.id, project, queue, self.ttl, self.grace, self.expires, self.updated]


class ClaimQueue:
    """One queue's cache: metadata, messages in FIFO order, live claims, the expiry timeline."""

    def __init__(self, project: str, name: str, metadata: dict[str, Any], space: str = MESSAGES_SPACE) -> None:
        self.project = project
        self.name = name
        self.metadata = metadata
        self.space = space  # where its messages are: the default space or a pool's
        self.messages: SortedDict = SortedDict()  # seq -> Message
        self.by_id: dict[str, Message] = {}
        self.claims: dict[str, Claim] = {}
        self.timeline: SortedList = SortedList()  # (time, kind "c"/"m", claim id or seq)
        self.wakeup = trio.Event()
        self.monitor_started = False

    def place(self, msg: Message) -> None:
        self.messages[msg.seq] = msg
        self.by_id[msg.id] = msg
        self.timeline.add((msg.expires, "m", msg.seq))

    def unplace(self, msg: Message) -> None:
        del self.messages[msg.seq]
        del self.by_id[msg.id]
        self.timeline.discard((msg.expires, "m", msg.seq))
        claim = self.claims.get(msg.claim_id)
        if claim is not None:
            claim.message_seqs.discard(msg.seq)

    def set_expiry(self, msg: Message, expires: float) -> None:
        self.timeline.discard((msg.expires, "m", msg.seq))
        msg.expires = expires
        self.timeline.add((expires, "m", msg.seq))

    def place_claim(self, claim: Claim) -> None:
        self.claims[claim.id] = claim
        self.timeline.add((claim.expires, "c", claim.id))

    def unplace_claim(self, claim: Claim) -> None:
        self.claims.pop(claim.id, None)
        self.timeline.discard((claim.expires, "c", claim.id))

    def live_message(self, mid: str, now: float) -> Message | None:
        msg = self.by_id.get(mid)
        return msg if msg is not None and msg.expires > now else None

    def live_claim(self, cid: str, now: float) -> Claim | None:
        claim = self.claims.get(cid)
        return claim if claim is not None and claim.expires > now else None

    def free_messages(self, now: float, limit: int) -> list[Message]:
        """The oldest ``limit`` live messages under no live claim."""
        found = []
        for msg in self.messages.values():
            if msg.expires > now and not msg.claimed(now):
                found.append(msg)
                if len(found) >= limit:
                    break
        return found


def timed(operation: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Record how the latest call of a method went and how long it took, per message space (the
    default one or a pool's), for health (Z6). The methods take ``(project, queue, ...)``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def timed_async(self: ClaimQueues, project: str, name: str, *args: Any, **kwargs: Any) -> Any:
                space = self.space_of(project, name)
                started, ok = time.perf_counter(), False
                try:
                    result = await fn(self, project, name, *args, **kwargs)
                    ok = True
                    return result
                finally:
                    space = space or self.space_of(project, name) or MESSAGES_SPACE
                    self.operations.setdefault(space, {})[operation] = (ok, time.perf_counter() - started)

            return timed_async

        @functools.wraps(fn)
        def timed_sync(self: ClaimQueues, project: str, name: str, *args: Any, **kwargs: Any) -> Any:
            started, ok = time.perf_counter(), False
            try:
                result = fn(self, project, name, *args, **kwargs)
                ok = True
                return result
            finally:
                space = self.space_of(project, name) or MESSAGES_SPACE
                self.operations.setdefault(space, {})[operation] = (ok, time.perf_counter() - started)

        return timed_sync

    return wrap


class ClaimQueues:
    """Every project's claim queues, over the three spaces of the catalogue."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.committer = catalog.committer
        self.queues: dict[tuple[str, str], ClaimQueue] = {}
        self._seq = 0
        self._nursery: trio.Nursery | None = None
        self.spaces: dict[str, Space] = {}
        self.pools = PoolCatalog(catalog)
        self.operations: dict[str, dict[str, tuple[bool, float]]] = {}  # space -> op -> (ok, seconds)

    # -- start -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._ensure_spaces()
        await self.pools.open()
        self._recover()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for queue in self.queues.values():
                self._start_monitor(queue)
            task_status.started()
            await trio.sleep_forever()

    async def _ensure_spaces(self) -> None:
        layouts = {
            QUEUES_SPACE: [[1, "string"], [2, "string"]],
            MESSAGES_SPACE: [[0, "unsigned"]],
            CLAIMS_SPACE: [[0, "string"]],
        }
        for name, parts in layouts.items():
            space, _ = await self.catalog.create_space(name, if_not_exists=True)
            if "primary" not in space.index_by_name:
                await self.catalog.create_index(space, "primary", index_type="TREE", unique=True, parts=parts)
            self.spaces[name] = space

    def _recover(self) -> None:
        """Rebuild the caches from the spaces; claims already expired are dropped lazily."""
        for raw in self.spaces[QUEUES_SPACE].pairs(0, iterators.ALL, []):
            f = decode_tuple(raw)
            self.queues[(f[1], f[2])] = ClaimQueue(f[1], f[2], f[3], f[4] if len(f) > 4 else MESSAGES_SPACE)
        for raw in self.spaces[CLAIMS_SPACE].pairs(0, iterators.ALL, []):
            f = decode_tuple(raw)
            queue = self.queues.get((f[1], f[2]))
            if queue is not None:
                queue.place_claim(Claim(f[0], f[3], f[4], f[5], f[6]))
        message_spaces = {MESSAGES_SPACE} | {q.space for q in self.queues.values()}
        raws = [raw for name in sorted(message_spaces) if (space := self._space(name)) is not None
                for raw in space.pairs(0, iterators.ALL, [])]
        for raw in raws:
            f = decode_tuple(raw)
            queue = self.queues.get((f[1], f[2]))
            if queue is None:
                continue
            msg = Message.from_fields(f)
            queue.place(msg)
            self._seq = max(self._seq, msg.seq)
            claim = queue.claims.get(msg.claim_id)
            if claim is not None:
                claim.message_seqs.add(msg.seq)

    # -- writes ------------------------------------------------------------------------------

    def _space(self, name: str) -> Space | None:
        return self.spaces.get(name) or self.catalog.by_name.get(name)

    def _put(self, space_name: str, fields: list[Any]) -> Callable[[lmdb.Transaction], Any]:
        space = self._space(space_name)
        assert space is not None, space_name
        return space.prepare_put(msgpack.packb(fields), fields, REPLACE)

    def _delete(self, space_name: str, key: list[Any]) -> Callable[[lmdb.Transaction], Any]:
        space = self._space(space_name)
        assert space is not None, space_name
        return space.prepare_delete(0, key)

    async def _commit(self, writes: list[Callable[[lmdb.Transaction], Any]]) -> None:
        """All of ``writes`` in one transaction; returns once durable."""
        if not writes:
            return

        def write(txn: lmdb.Transaction) -> None:
            for fn in writes:
                fn(txn)

        await self.committer.write(write)

    def _message_write(self, queue: ClaimQueue, msg: Message) -> Callable[[lmdb.Transaction], Any]:
        return self._put(queue.space, msg.fields(queue.project, queue.name))

    # -- queues ------------------------------------------------------------------------------

    def queue(self, project: str, name: str) -> ClaimQueue | None:
        return self.queues.get((project, name))

    @timed("create_queue")
    async def create_queue(self, project: str, name: str, metadata: dict[str, Any]) -> bool:
        """Create the queue with ``metadata``; False (and nothing changed) if it exists."""
        if (project, name) in self.queues:
            return False
        space = self.pools.place(project, metadata.get("_flavor")) or MESSAGES_SPACE
        queue = self.queues[(project, name)] = ClaimQueue(project, name, metadata, space)
        try:
            await self._commit([self._put(QUEUES_SPACE, [0, project, name, metadata, space])])
        except BaseException:
            if self.queues.get((project, name)) is queue:
                del self.queues[(project, name)]
            raise
        self._start_monitor(queue)
        return True

    async def _ensure_queue(self, project: str, name: str) -> ClaimQueue:
        if (project, name) not in self.queues:
            await self.create_queue(project, name, {})
        return self.queues[(project, name)]

    def list_queues(self, project: str, marker: str | None, limit: int) -> list[ClaimQueue]:
        names = sorted(n for p, n in self.queues if p == project and (marker is None or n > marker))
        return [self.queues[(project, n)] for n in names[:limit]]

    @timed("delete_queue")
    async def delete_queue(self, project: str, name: str) -> None:
        """Remove the queue with its messages and claims."""
        queue = self.queues.pop((project, name), None)
        if queue is None:
            return
        writes = [self._delete(QUEUES_SPACE, [project, name])]
        writes += [self._delete(queue.space, [seq]) for seq in queue.messages]
        writes += [self._delete(CLAIMS_SPACE, [cid]) for cid in queue.claims]
        queue.wakeup.set()
        await self._commit(writes)

    # -- messages ----------------------------------------------------------------------------

    @timed("post_messages")
    async def post(self, project: str, name: str, client: str, items: list[tuple[Any, int]]) -> list[str]:
        """Append ``(body, ttl)`` items all or nothing (the queue is created if missing)."""
        queue = await self._ensure_queue(project, name)
        now = time.time()
        msgs = []
        for body, ttl in items:
            self._seq += 1
            msgs.append(Message(self._seq, uuid.uuid4().hex, now, ttl, now + ttl, client, body))
        await self._commit([self._message_write(queue, m) for m in msgs])
        if self.queues.get((project, name)) is queue:
            for m in msgs:
                queue.place(m)
            queue.wakeup.set()
        else:  # the queue was deleted while the post committed: so are its messages
            await self._commit([self._delete(queue.space, [m.seq]) for m in msgs])
        return [m.id for m in msgs]

    @timed("list_messages")
    def list_messages(
        self, project: str, name: str, marker: int | None, limit: int, hide_client: str | None,
        include_claimed: bool,
    ) -> list[Message]:
        """Up to ``limit`` live messages after ``marker`` (a seq), FIFO; ``hide_client``'s own
        messages are left out (echo off) and claimed ones unless ``include_claimed``."""
        queue = self.queues.get((project, name))
        if queue is None:
            return []
        now = time.time()
        found = []
        start = 0 if marker is None else marker + 1
        for seq in queue.messages.irange(minimum=start):
            msg = queue.messages[seq]
            if msg.expires <= now or (hide_client is not None and msg.client == hide_client):
                continue
            if not include_claimed and msg.claimed(now):
                continue
            found.append(msg)
            if len(found) >= limit:
                break
        return found

    def get_messages(self, project: str, name: str, ids: list[str]) -> list[Message]:
        queue = self.queues.get((project, name))
        if queue is None:
            return []
        now = time.time()
        seen: set[str] = set()
        found = []
        for mid in ids:
            msg = queue.live_message(mid, now)
            if msg is not None and mid not in seen:
                seen.add(mid)
                found.append(msg)
        return found

    @timed("delete_messages")
    async def delete_message(self, project: str, name: str, mid: str, claim_id: str | None) -> str:
        queue = self.queues.get((project, name))
        now = time.time()
        msg = queue.live_message(mid, now) if queue is not None else None
        if msg is None:
            return DELETED
        claimed = msg.claimed(now)
        if claim_id is None:
            if claimed:
                return CLAIMED
        elif not claimed:
            return NOT_CLAIMED
        elif queue.live_claim(claim_id, now) is None:
            return NO_SUCH_CLAIM
        elif msg.claim_id != claim_id:
            return CLAIMED
        await self._remove(queue, [msg])
        return DELETED

    @timed("bulk_delete_messages")
    async def delete_messages(self, project: str, name: str, ids: list[str]) -> None:
        """Bulk delete ignores claims."""
        queue = self.queues.get((project, name))
        if queue is None:
            return
        await self._remove(queue, [m for mid in dict.fromkeys(ids) if (m := queue.by_id.get(mid))])

    async def pop(self, project: str, name: str, count: int) -> list[Message]:
        """Claim and delete up to ``count`` free messages at once."""
        queue = self.queues.get((project, name))
        if queue is None:
            return []
        msgs = queue.free_messages(time.time(), count)
        await self._remove(queue, msgs)
        return msgs

    async def _remove(self, queue: ClaimQueue, msgs: list[Message]) -> None:
        for msg in msgs:
            queue.unplace(msg)
        try:
            await self._commit([self._delete(queue.space, [m.seq]) for m in msgs])
        except BaseException:
            for msg in msgs:
                queue.place(msg)
            raise

    # -- claims ------------------------------------------------------------------------------

    @timed("claim_messages")
    async def claim(self, project: str, name: str, ttl: int, grace: int, limit: int) -> tuple[Claim, list[Message]] | None:
        """Claim up to ``limit`` of the oldest free messages; None when there is none."""
        queue = self.queues.get((project, name))
        if queue is None:
            return None
        now = time.time()
        msgs = queue.free_messages(now, limit)
        if not msgs:
            return None
        claim = Claim(uuid.uuid4().hex, ttl, grace, now + ttl, now, {m.seq for m in msgs})
        before = [(m, m.claim_id, m.claim_expires, m.ttl, m.expires) for m in msgs]
        queue.place_claim(claim)
        for msg in msgs:
            msg.claim_id, msg.claim_expires = claim.id, claim.expires
            self._extend(queue, msg, claim, now)
        try:
            await self._commit(
                [self._put(CLAIMS_SPACE, claim.fields(project, name))]
                + [self._message_write(queue, m) for m in msgs]
            )
        except BaseException:
            queue.unplace_claim(claim)
            for msg, cid, cexp, mttl, mexp in before:
                msg.claim_id, msg.claim_expires, msg.ttl = cid, cexp, mttl
                queue.set_expiry(msg, mexp)
            raise
        queue.wakeup.set()
        return claim, msgs

    @staticmethod
    def _extend(queue: ClaimQueue, msg: Message, claim: Claim, now: float) -> None:
        """Grace: a message that would die before its claim lives ``grace`` past it."""
        if msg.expires < claim.expires:
            msg.ttl = claim.ttl + claim.grace
            queue.set_expiry(msg, claim.expires + claim.grace)

    def get_claim(self, project: str, name: str, cid: str) -> tuple[Claim, list[Message]] | None:
        queue = self.queues.get((project, name))
        now = time.time()
        claim = queue.live_claim(cid, now) if queue is not None else None
        if claim is None:
            return None
        msgs = [m for seq in sorted(claim.message_seqs) if (m := queue.messages.get(seq)) and m.expires > now]
        return claim, msgs

    async def renew(self, project: str, name: str, cid: str, ttl: int, grace: int) -> bool:
        found = self.get_claim(project, name, cid)
        if found is None:
            return False
        queue = self.queues[(project, name)]
        claim, msgs = found
        now = time.time()
        queue.unplace_claim(claim)
        claim.ttl, claim.grace, claim.expires, claim.updated = ttl, grace, now + ttl, now
        queue.place_claim(claim)
        for msg in msgs:
            msg.claim_expires = claim.expires
            self._extend(queue, msg, claim, now)
        await self._commit(
            [self._put(CLAIMS_SPACE, claim.fields(project, name))] + [self._message_write(queue, m) for m in msgs]
        )
        queue.wakeup.set()
        return True

    @timed("delete_claim")
    async def release(self, project: str, name: str, cid: str) -> None:
        queue = self.queues.get((project, name))
        claim = queue.claims.get(cid) if queue is not None else None
        if claim is None:
            return
        queue.unplace_claim(claim)
        msgs = [m for seq in claim.message_seqs if (m := queue.messages.get(seq)) and m.claim_id == cid]
        for msg in msgs:
            msg.claim_id, msg.claim_expires = "", 0.0
        await self._commit(
            [self._delete(CLAIMS_SPACE, [cid])] + [self._message_write(queue, m) for m in msgs]
        )

    def space_of(self, project: str, name: str) -> str | None:
        queue = self.queues.get((project, name))
        return queue.space if queue is not None else None

    def space_reachable(self, space: str) -> bool:
        return self._space(space) is not None

    def message_volume(self, space: str | None = None) -> dict[str, int]:
        """Live messages (of the queues in ``space``, or all)."""
        now = time.time()
        total = claimed = 0
        for queue in self.queues.values():
            if space is not None and queue.space != space:
                continue
            for msg in queue.messages.values():
                if msg.expires > now:
                    total += 1
                    claimed += msg.claimed(now)
        return {"free": total - claimed, "claimed": claimed, "total": total}

    # -- stats -------------------------------------------------------------------------------

    def stats(self, project: str, name: str) -> tuple[int, int, Message | None, Message | None]:
        """(total, claimed, oldest, newest) of the live messages."""
        queue = self.queues.get((project, name))
        if queue is None:
            return 0, 0, None, None
        now = time.time()
        live = [m for m in queue.messages.values() if m.expires > now]
        claimed = sum(1 for m in live if m.claimed(now))
        return len(live), claimed, (live[0] if live else None), (live[-1] if live else None)

    # -- expiry ------------------------------------------------------------------------------

    def _start_monitor(self, queue: ClaimQueue) -> None:
        if self._nursery is None or queue.monitor_started:
            return
        queue.monitor_started = True
        self._nursery.start_soon(self._monitor, queue)

    async def _monitor(self, queue: ClaimQueue) -> None:
        """Remove the queue's expired messages and claims, each at its own time."""
        key = (queue.project, queue.name)
        while self.queues.get(key) is queue:
            queue.wakeup = trio.Event()
            now = time.time()
            due = []
            while queue.timeline and queue.timeline[0][0] <= now:
                due.append(queue.timeline.pop(0))
            if due:
                try:
                    await self._expire(queue, due)
                except Exception:
                    log.exception("expiry in queue %s/%s failed", queue.project, queue.name)
                    for entry in due:
                        queue.timeline.add(entry)
                    await trio.sleep(0.1)
                continue
            wait = IDLE_WAIT if not queue.timeline else queue.timeline[0][0] - now
            with trio.move_on_after(max(wait, 0.0)):
                await queue.wakeup.wait()

    async def _expire(self, queue: ClaimQueue, due: list[tuple[float, str, Any]]) -> None:
        writes = []
        for _when, kind, ident in due:
            if kind == "m":
                msg = queue.messages.get(ident)
                if msg is not None:
                    queue.timeline.add((msg.expires, "m", msg.seq))  # unplace discards it again
                    queue.unplace(msg)
                    writes.append(self._delete(queue.space, [ident]))
            elif queue.claims.pop(ident, None) is not None:
                writes.append(self._delete(CLAIMS_SPACE, [ident]))
        await self._commit(writes)
