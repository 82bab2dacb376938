"""Zaqar's queues, messages and claims as tubes, tasks and claims of the engine: translation only.

* Queue ``Q`` of project ``P`` is the tube ``"P/Q"`` of a Zaqar space: the ``[zaqar] space`` for
  queues placed on no pool, the pool's space for the others (Z5). A queue exists while its tube
  is stored (the engine keeps a record of it, with ``{"metadata": ...}``).
* A message is a task: its id is the task id, its body the task's data (one field: that value;
  several: a list of them; none: null), its poster's Client-ID the task's ``client`` attr, its
  ttl the task's (or, once a claim's grace extended it, the claim's ttl + grace, as Zaqar shows).
* A message is free when its task is ready; a task taken through any API (a claim, a box.queue
  take, a Deckard pull) is claimed, and so are delayed, buried and done tasks (not free to claim).
  A message's href names the claim that holds or last held it, as Zaqar does after an expiry.
* A claim is an engine claim: an identity that expires and extends its messages' life by grace.

Health (Z6) keeps here how the latest call of each operation went, per space.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from boxqueue.tubes.engine import QueueEngine, QueueSpace, StorageError
from boxqueue.tubes.kinds import TubeKind
from boxqueue.tubes.pools import URI_SCHEME, PoolCatalog
from boxqueue.tubes.task import READY, TAKEN, Task, stored_parts
from boxqueue.tubes.tube import Claim, Tube

__all__ = ["Message", "StorageError", "ZaqarQueues"]

# Outcomes of delete_message (the app maps them to its statuses).
DELETED = "deleted"
CLAIMED = "claimed"  # claimed and no (or another live) claim given
NOT_CLAIMED = "not_claimed"  # a claim was given but the message is not under a live claim
NO_SUCH_CLAIM = "no_such_claim"  # the claim given does not exist or has expired

US = 1_000_000


@dataclass
class Message:
    """What a response shows of a message."""

    id: str
    seq: int  # its place in post order: the list marker
    created: float  # seconds since the epoch
    ttl: int  # seconds
    body: Any
    claim_id: str  # the claim holding (or that last held) it; "" for none
    claimed: bool


@dataclass
class ClaimView:
    """What a response shows of a claim."""

    id: str
    ttl: int  # seconds
    updated: float  # seconds since the epoch


def claim_view(claim: Claim) -> ClaimView:
    return ClaimView(claim.id, claim.ttl // US, claim.updated / US)


@dataclass
class Queue:
    project: str
    name: str
    metadata: dict[str, Any]


def body_of(data: list[Any]) -> Any:
    """A task's data as a Zaqar body: one field is the body, several a list, none null."""
    if len(data) == 1:
        return data[0]
    return data if data else None


class ZaqarQueues:
    """Every project's queues, over the engine's Zaqar spaces."""

    def __init__(self, engine: QueueEngine, default: QueueSpace, kind: TubeKind, pools: PoolCatalog) -> None:
        self.engine = engine
        self.default = default
        self.kind = kind
        self.pools = pools
        self.operations: dict[str, dict[str, tuple[bool, float]]] = {}  # space -> op -> (ok, seconds)

    async def open(self) -> None:
        """The pools' spaces are the engine's (created if new); then the pools are loaded."""
        await self.pools.open()
        for pool in self.pools.pools.values():
            await self.engine.own_space(pool.uri[len(URI_SCHEME):], self.kind)

    async def connect(self, space_name: str) -> None:
        """A pool's URI names this space: it exists, with the tube layout, as one of Zaqar's."""
        await self.engine.own_space(space_name, self.kind)

    # -- places ------------------------------------------------------------------------------

    def spaces(self) -> list[QueueSpace]:
        """Where Zaqar's queues are: its own space, every pool's space (even one of another API,
        such as Deckard's), and any space the engine keeps for Zaqar (a deleted pool's)."""
        names = {self.default.space.name} | {p.uri[len(URI_SCHEME):] for p in self.pools.pools.values()}
        found = {s.id: s for s in self.engine.owned_spaces() if s.space.name in names or s.kind.name == self.kind.name}
        return sorted(found.values(), key=lambda s: s.id != self.default.id)

    def _find(self, project: str, name: str) -> tuple[QueueSpace, Tube] | None:
        """The queue's tube: stored (created by Zaqar), or holding tasks put by another API."""
        tube_name = f"{project}/{name}"
        for queue_space in self.spaces():
            tube = self.engine.existing_tube(queue_space.id, tube_name)
            if tube is not None and (tube.options is not None or tube.tasks):
                return queue_space, tube
        return None

    def space_of(self, project: str, name: str) -> str | None:
        found = self._find(project, name)
        return found[0].space.name if found is not None else None

    async def _timed(self, operation: str, project: str, name: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``call`` and record how it went, per space, for health (Z6)."""
        space = self.space_of(project, name)
        started, ok = time.perf_counter(), False
        try:
            result = await call()
            ok = True
            return result
        finally:
            space = space or self.space_of(project, name) or self.default.space.name
            self.operations.setdefault(space, {})[operation] = (ok, time.perf_counter() - started)

    # -- queues ------------------------------------------------------------------------------

    def queue(self, project: str, name: str) -> Queue | None:
        found = self._find(project, name)
        if found is None:
            return None
        return Queue(project, name, dict((found[1].options or {}).get("metadata", {})))

    async def create_queue(self, project: str, name: str, metadata: dict[str, Any]) -> bool:
        """Create the queue with ``metadata``; False (and nothing changed) if it exists."""

        async def create() -> bool:
            if self._find(project, name) is not None:
                return False
            space_name = self.pools.place(project, metadata.get("_flavor"))
            queue_space = self.default if space_name is None else await self.engine.own_space(space_name, self.kind)
            return await self.engine.create_tube(queue_space.id, f"{project}/{name}", {"metadata": metadata},
                                                 kind=self.kind)

        return await self._timed("create_queue", project, name, create)

    def list_queues(self, project: str, marker: str | None, limit: int) -> list[Queue]:
        prefix = project + "/"
        names = set()
        for queue_space in self.spaces():
            for tube in self.engine.tubes_of(queue_space.id):
                if tube.options is None and not tube.tasks:
                    continue
                if tube.name.startswith(prefix) and "/" not in tube.name[len(prefix):]:
                    names.add(tube.name[len(prefix):])
        chosen = sorted(n for n in names if marker is None or n > marker)[:limit]
        return [q for n in chosen if (q := self.queue(project, n)) is not None]

    async def delete_queue(self, project: str, name: str) -> None:
        """Remove the queue with its messages and claims."""

        async def delete() -> None:
            found = self._find(project, name)
            if found is not None:
                await self.engine.drop_tube(found[0].id, found[1].name)

        await self._timed("delete_queue", project, name, delete)

    async def _ensure_queue(self, project: str, name: str) -> tuple[QueueSpace, Tube]:
        found = self._find(project, name)
        if found is None:
            await self.create_queue(project, name, {})
            found = self._find(project, name)
        assert found is not None
        return found

    # -- messages ----------------------------------------------------------------------------

    def _message(self, queue_space: QueueSpace, task: Task) -> Message:
        raw = self.engine.stored(queue_space, task)
        body = body_of(stored_parts(raw, queue_space.layout)[1]) if raw is not None else None
        return self._view(task, body)

    @staticmethod
    def _view(task: Task, body: Any) -> Message:
        attrs = task.attrs or {}
        ttl = attrs.get("lifetime", task.ttl) // US
        claim_id = task.cid if type(task.cid) is str else ""
        return Message(task.id, task.created, task.created / US, ttl, body, claim_id, task.status != READY)

    async def post(self, project: str, name: str, client: str, items: list[tuple[Any, int]]) -> list[str]:
        """Append ``(body, ttl)`` items all or nothing (the queue is created if missing)."""

        async def post() -> list[str]:
            queue_space, tube = await self._ensure_queue(project, name)
            tasks = await self.engine.put_many(
                queue_space.id, tube.name, [(ttl * US, [body], {"client": client}) for body, ttl in items],
                kind=self.kind)
            return [t.id for t in tasks]

        return await self._timed("post_messages", project, name, post)

    def _live(self, tube: Tube, now_us: int) -> list[Task]:
        return [t for t in tube.tasks.values() if t.created + t.ttl > now_us]

    def list_messages(
        self, project: str, name: str, marker: int | None, limit: int, hide_client: str | None,
        include_claimed: bool,
    ) -> list[Message]:
        """Up to ``limit`` live messages after ``marker`` (a seq), in post order; ``hide_client``'s
        own messages are left out (echo off), and claimed ones unless ``include_claimed``."""
        started, ok = time.perf_counter(), False
        found_queue = self._find(project, name)
        try:
            if found_queue is None:
                ok = True
                return []
            queue_space, tube = found_queue
            now = time.time_ns() // 1000
            found = []
            for task in tube.tasks.values():
                if marker is not None and task.created <= marker:
                    continue
                if task.created + task.ttl <= now:
                    continue
                if hide_client is not None and (task.attrs or {}).get("client") == hide_client:
                    continue
                if not include_claimed and task.status != READY:
                    continue
                found.append(self._message(queue_space, task))
                if len(found) >= limit:
                    break
            ok = True
            return found
        finally:
            space = found_queue[0].space.name if found_queue is not None else self.default.space.name
            self.operations.setdefault(space, {})["list_messages"] = (ok, time.perf_counter() - started)

    def get_messages(self, project: str, name: str, ids: list[str]) -> list[Message]:
        found_queue = self._find(project, name)
        if found_queue is None:
            return []
        queue_space, tube = found_queue
        now = time.time_ns() // 1000
        found = []
        for mid in dict.fromkeys(ids):
            task = tube.tasks.get(mid)
            if task is not None and task.created + task.ttl > now:
                found.append(self._message(queue_space, task))
        return found

    async def delete_message(self, project: str, name: str, mid: str, claim_id: str | None) -> str:
        async def delete() -> str:
            found_queue = self._find(project, name)
            if found_queue is None:
                return DELETED
            queue_space, tube = found_queue
            now = time.time_ns() // 1000
            task = tube.tasks.get(mid)
            if task is None or task.created + task.ttl <= now:
                return DELETED
            held = task.status == TAKEN
            if claim_id is None:
                if held:
                    return CLAIMED
            elif not held:
                return NOT_CLAIMED
            elif self.engine.live_claim(queue_space.id, tube.name, claim_id) is None:
                return NO_SUCH_CLAIM
            elif task.cid != claim_id:
                return CLAIMED
            await self.engine.remove(queue_space.id, tube.name, [mid])
            return DELETED

        return await self._timed("delete_messages", project, name, delete)

    async def delete_messages(self, project: str, name: str, ids: list[str]) -> None:
        """Bulk delete ignores claims."""

        async def delete() -> None:
            found_queue = self._find(project, name)
            if found_queue is not None:
                await self.engine.remove(found_queue[0].id, found_queue[1].name, ids)

        await self._timed("bulk_delete_messages", project, name, delete)

    async def pop(self, project: str, name: str, count: int) -> list[Message]:
        """Claim and delete up to ``count`` free messages at once."""
        found_queue = self._find(project, name)
        if found_queue is None:
            return []
        queue_space, tube = found_queue
        popped = await self.engine.pop(queue_space.id, tube.name, count)
        return [self._view(task, body_of(stored_parts(raw, queue_space.layout)[1])) for task, raw in popped]

    # -- claims ------------------------------------------------------------------------------

    async def claim(self, project: str, name: str, ttl: int, grace: int, limit: int) -> tuple[ClaimView, list[Message]] | None:
        """Claim up to ``limit`` of the oldest free messages; None when there is none."""

        async def claim() -> tuple[ClaimView, list[Message]] | None:
            found_queue = self._find(project, name)
            if found_queue is None:
                return None
            queue_space, tube = found_queue
            result = await self.engine.claim(queue_space.id, tube.name, ttl=ttl * US, grace=grace * US, limit=limit)
            if result is None:
                return None
            claim, taken = result
            layout = queue_space.layout
            return claim_view(claim), [self._view(task, body_of(stored_parts(raw, layout)[1])) for task, raw in taken]

        return await self._timed("claim_messages", project, name, claim)

    def get_claim(self, project: str, name: str, cid: str) -> tuple[ClaimView, list[Message]] | None:
        found_queue = self._find(project, name)
        if found_queue is None:
            return None
        queue_space, tube = found_queue
        claim = self.engine.live_claim(queue_space.id, tube.name, cid)
        if claim is None:
            return None
        tasks = self.engine.claimed_tasks(queue_space.id, tube.name, claim)
        return claim_view(claim), [self._message(queue_space, t) for t in tasks]

    async def renew(self, project: str, name: str, cid: str, ttl: int, grace: int) -> bool:
        found_queue = self._find(project, name)
        if found_queue is None:
            return False
        return await self.engine.renew_claim(found_queue[0].id, found_queue[1].name, cid, ttl=ttl * US, grace=grace * US)

    async def release(self, project: str, name: str, cid: str) -> None:
        async def release() -> None:
            found_queue = self._find(project, name)
            if found_queue is not None:
                await self.engine.release_claim(found_queue[0].id, found_queue[1].name, cid)

        await self._timed("delete_claim", project, name, release)

    # -- stats and health --------------------------------------------------------------------

    def stats(self, project: str, name: str) -> tuple[int, int, Message | None, Message | None]:
        """(total, claimed, oldest, newest) of the live messages."""
        found_queue = self._find(project, name)
        if found_queue is None:
            return 0, 0, None, None
        _queue_space, tube = found_queue
        live = self._live(tube, time.time_ns() // 1000)
        claimed = sum(1 for t in live if t.status != READY)
        oldest = self._view(live[0], None) if live else None
        newest = self._view(live[-1], None) if live else None
        return len(live), claimed, oldest, newest

    def space_reachable(self, space: str) -> bool:
        queue_space = next((s for s in self.spaces() if s.space.name == space), None)
        return queue_space is not None and not queue_space.space.dropped

    def message_volume(self, space: str | None = None) -> dict[str, int]:
        """Live messages (of the queues in ``space``, or all)."""
        now = time.time_ns() // 1000
        total = claimed = 0
        for queue_space in self.spaces():
            if space is not None and queue_space.space.name != space:
                continue
            for tube in self.engine.tubes_of(queue_space.id):
                for task in self._live(tube, now):
                    total += 1
                    claimed += task.status != READY
        return {"free": total - claimed, "claimed": claimed, "total": total}
