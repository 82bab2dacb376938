"""What box.queue's verbs do to one task (ack, touch, done, bury, dig, kick, release, requeue,
delete, truncate, with the 1.5 owner checks and counters), tarantool/queue's verbs that check no
owner (bury, touch, release_all), and deleting tasks by id or the free ones at the head
(Deckard's Remove, Zaqar's delete and pop)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, cast

import boxqueue.tubes.transitions as tr
from boxqueue.spaces.later import Later
from boxqueue.spaces.space import decode_tuple
from boxqueue.tubes.consumers import Consumers
from boxqueue.tubes.engine_base import (
    now_us,
    pack_tail,
    proc_error,
)
from boxqueue.tubes.task import (
    BURIED,
    DELAYED,
    DONE,
    QUEUE15,
    READY,
    TAKEN,
    Task,
)

log = logging.getLogger(__name__)


class TaskVerbs(Consumers):
    def ack(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "ack")
        return self._delete(self.queue_space(space_id), tube, task, ("ack",))

    def touch(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "touch")
        event = min(now_us() + task.ttr, task.expires)

        def touched(t: Task) -> None:
            t.event = event

        return self._change(self.queue_space(space_id), tube, task, touched, counter="touch")

    def done(self, space_id: int, task_id: Any, consumer: int, data: list[Any]) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "done")
        queue_space = self.queue_space(space_id)
        tail = None
        if queue_space.layout is QUEUE15:
            tail = pack_tail(len(data), data)
        else:  # the attachments stay
            raw = self.stored(queue_space, task)
            attachments = decode_tuple(raw)[13] if raw is not None else {}
            tail = self.tail(queue_space, data, attachments)

        def finished(t: Task) -> None:
            t.status, t.event = DONE, t.expires

        return self._change(queue_space, tube, task, finished, counter="done", tail=tail)

    def bury(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "done")  # sic: 1.5's text (D8)

        def buried(t: Task) -> None:
            t.status, t.event, t.cbury = BURIED, t.expires, t.cbury + 1

        return self._change(self.queue_space(space_id), tube, task, buried, counter="bury")

    def dig(self, space_id: int, task_id: Any) -> Later[bytes]:
        tube, task = self.find(space_id, task_id)
        if task.status != BURIED:
            raise proc_error("Task is not buried")
        return self._change(self.queue_space(space_id), tube, task, tr.unburied, counter="dig",
                            after=tube.wake_one_consumer)  # D7

    async def kick(self, space_id: int, tube_name: str, count: int) -> int:
        """Up to ``count`` buried tasks, in take order, become ready (D5)."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((queue_space.id, tube_name))
        if count <= 0 or tube is None:
            return 0
        chosen = tube.buried_in_order()[:count]
        pending = [
            self._change(queue_space, tube, task, tr.unburied, counter="dig", after=tube.wake_one_consumer)  # D7
            for task in chosen
        ]
        kicked = 0
        for later in pending:
            await later
            kicked += 1
        return kicked

    def release(self, space_id: int, task_id: Any, consumer: int, delay: int, ttl_s: float | None,
                *, ttl_us: int | None = None) -> Later[bytes]:
        """Back to ready (or delayed); a given ttl restarts the task's life from now (+delay);
        ``ttl_us``: the task's whole life from its creation, exactly (tarantool/queue's)."""
        tube, task = self.owned(space_id, task_id, consumer, "release")
        now = now_us()
        ttl = task.ttl
        if ttl_us is not None:
            ttl = tr.life(task.created + ttl_us, task.created)
        elif ttl_s is not None and ttl_s > 0:
            ttl = int(ttl_s * 1_000_000) + (now - task.created) + max(delay, 0)

        def released(t: Task) -> None:
            t.ttl, t.cid = ttl, 0
            if delay > 0:
                t.status, t.event = DELAYED, min(now + delay, t.expires)
            else:
                t.status, t.event = READY, t.expires

        after = tube.wake_one_consumer if delay <= 0 else None
        return self._change(self.queue_space(space_id), tube, task, released, counter="release", after=after)

    def bury_any(self, space_id: int, task_id: Any) -> Later[bytes]:
        """Buried whatever its state and whoever holds it (tarantool/queue's bury)."""
        tube, task = self.find(space_id, task_id)

        def buried(t: Task) -> None:
            t.status, t.event, t.cbury, t.cid = BURIED, t.expires, t.cbury + 1, 0

        return self._change(self.queue_space(space_id), tube, task, buried, counter="bury")

    def prolong(self, space_id: int, task_id: Any, delta: int | None) -> Later[bytes]:
        """``delta`` microseconds more for the task's current deadline, its ttl and its ttr;
        None: all three become endless (tarantool/queue's touch)."""
        tube, task = self.find(space_id, task_id)

        def prolonged(t: Task) -> None:
            if delta is None:
                t.ttl = t.ttr = tr.MAX_TIME_US - t.created
                t.event = tr.MAX_TIME_US
            else:
                t.ttl = tr.life(t.created + t.ttl + delta, t.created)
                t.ttr = min(t.ttr + delta, tr.MAX_TIME_US)
                t.event = min(t.event + delta, tr.MAX_TIME_US)

        return self._change(self.queue_space(space_id), tube, task, prolonged, counter="touch")

    async def release_taken(self, space_id: int, tube_name: str) -> int:
        """Every taken task of the tube back to ready, whoever holds it."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((queue_space.id, tube_name))
        if tube is None:
            return 0
        taken = [t for t in tube.tasks.values() if t.status == TAKEN]
        pending = [self._change(queue_space, tube, t, tr.made_ready, counter="release", after=tube.wake_one_consumer)
                   for t in taken]
        for later in pending:
            await later
        return len(pending)

    def requeue(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        """Back to ready behind every ready task of the tube, whatever their priority (D13)."""
        tube, task = self.owned(space_id, task_id, consumer, "release")  # sic: 1.5's text (D8)
        last = tube.last_ready()
        ipri, pri = tube.kind.requeue_order(None if last is None else int(last.ipri), task.ipri, task.pri)

        def requeued(t: Task) -> None:
            t.status, t.event, t.cid, t.ipri, t.pri = READY, t.expires, 0, ipri, pri

        return self._change(self.queue_space(space_id), tube, task, requeued, counter="requeue",
                            after=tube.wake_one_consumer)

    def delete(self, space_id: int, task_id: Any) -> Later[bytes]:
        tube, task = self.find(space_id, task_id)
        return self._delete(self.queue_space(space_id), tube, task, ("delete",))

    async def truncate(self, space_id: int, tube_name: str) -> int:
        """Every task of the tube is deleted; the tube itself (its record, its claims) stays."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        if tube is None or not tube.tasks:
            return 0
        doomed = list(tube.tasks.values())
        await self._batch(queue_space, tube, deletes=doomed)
        return len(doomed)

    def remove(self, space_id: int, tube_name: str, ids: Iterable[str], *, only_free: bool = False) -> Later[list[Task]]:
        """Delete the tasks with these ids (that exist; with ``only_free``, that are ready)."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        if tube is None:
            return Later.done([])
        found = [t for i in dict.fromkeys(ids) if (t := tube.tasks.get(i)) is not None]
        if only_free:
            found = [t for t in found if t.status == READY]
        if not found:
            return Later.done([])
        return self._batch(queue_space, tube, deletes=found).map(lambda _raws: found)

    def pop(self, space_id: int, tube_name: str, limit: int) -> Later[list[tuple[Task, bytes]]]:
        """Take and delete up to ``limit`` free tasks at once (Zaqar's pop)."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        chosen = [] if tube is None else self.free_tasks(tube, limit)
        if not chosen:
            return Later.done([])
        assert tube is not None
        return self._batch(queue_space, tube, deletes=chosen).map(
            lambda raws: list(zip(chosen, cast("list[bytes]", raws), strict=True)))  # deleted rows: bytes

