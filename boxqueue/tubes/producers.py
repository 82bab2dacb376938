"""Putting tasks: box.queue's puts, Zaqar's post of several messages, Deckard's upsert by id.

A task becomes visible (to takes, listings, the monitor) only once its insert is durable. A tube
that holds nothing yet takes the kind of the API that puts into it."""

from __future__ import annotations

import functools
import logging
from typing import Any

import cython
import trio

import boxqueue.tubes.transitions as tr
from boxqueue.spaces.later import Later
from boxqueue.spaces.msgpack_values import pack_flat
from boxqueue.spaces.space import INSERT, REPLACE
from boxqueue.tubes.engine_base import (
    MAX_TIME_US,
    EngineBase,
    Mutate,
    QueueSpace,
    Tail,
    counted,
    now_us,
    pack_tail,
    proc_error,
)
from boxqueue.tubes.kinds import MED_PRI, TubeKind
from boxqueue.tubes.task import (
    DELAYED,
    QUEUE15,
    READY,
    TUBE_LAYOUT,
    Task,
)
from boxqueue.tubes.tube import Tube

log = logging.getLogger(__name__)

_NO_PRI = object()  # no priority asked about yet (Producers.new_puts)


class Producers(EngineBase):
    def new_task(
        self,
        queue_space: QueueSpace,
        tube: Tube,
        *,
        delay: int = 0,
        ttl: int | None = None,
        ttr: int | None = None,
        ipri: Any = MED_PRI,
        pri: Any,
        task_id: str | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> Task:
        """A task not stored yet: ``ttl`` counts from its creation and includes ``delay``."""
        return self._new_task(queue_space, tube, delay, ttl, ttr, ipri, pri, task_id, attrs)

    @cython.locals(task=Task, created=cython.longlong, life=cython.longlong)
    def _new_task(self, queue_space: QueueSpace, tube: Tube, delay: int, ttl: int | None, ttr: int | None, ipri: Any,
                  pri: Any, task_id: str | None, attrs: dict[str, Any] | None) -> Task:
        """:meth:`new_task` with its arguments in order (a C call from the engine's compiled parts)."""
        created = self._next_created()
        kind = tube.kind
        life = (kind.default_ttl if ttl is None else ttl) + delay
        life = min(max(life, 0), MAX_TIME_US - created)
        task = Task.__new__(Task)  # fields set one by one: no call with thirteen arguments
        if delay > 0:
            task.status, task.event = DELAYED, min(now_us() + delay, created + life)
        else:
            task.status, task.event = READY, created + life
        if queue_space.layout is TUBE_LAYOUT and attrs is None:
            attrs = {}
        if task_id is None:
            task_id = tube.next_number() if kind.numbered else self.new_id(created)
        task.id = task_id
        task.tube = tube.name
        task.ipri = ipri
        task.pri = pri
        task.cid = 0
        task.created = created
        task.ttl = life
        task.ttr = kind.default_ttr if ttr is None else ttr
        task.cbury = 0
        task.ctaken = 0
        task.attrs = attrs
        return task

    @cython.locals(tube_layout=cython.bint)
    def new_puts(self, queue_space: QueueSpace, tube: Tube, items: list[tuple[int, int | None, int | None, Any, list[Any]]]
                 ) -> list[tuple[Task, list[Any]]]:
        """box.queue's puts ``(delay, ttl, ttr, pri, data)`` (its units and stored priority; ttl
        or ttr None: the kind's), as :meth:`_batch`'s inserts: each task made as :meth:`new_task`
        makes it, positioned by the tube's kind, with the values of its fields past the header
        (``data`` itself in the 1.5 layout: the caller gives it up)."""
        kind = tube.kind
        tube_layout = queue_space.layout is TUBE_LAYOUT
        by_pri = kind.order_of_pri
        out = []
        asked: Any = _NO_PRI  # the priority put_order was last asked about (by_pri), and its answer
        ipri: Any = None
        stored_pri: Any = None
        for delay, ttl, ttr, pri, data in items:
            if pri is not asked or not by_pri:
                ipri, stored_pri = kind.put_order(pri, None)
                asked = pri
            task = self._new_task(queue_space, tube, delay, ttl, ttr, ipri, stored_pri, None, None)
            out.append((task, [{}, *data] if tube_layout else data))
        return out

    def tail(self, queue_space: QueueSpace, data: list[Any], attachments: dict[str, Any] | None = None) -> Tail:
        """The fields past the header: the attachments map in the tube layout, then the data."""
        values = self.tail_values(queue_space, data, attachments)
        return pack_tail(len(values), values)

    def tail_values(self, queue_space: QueueSpace, data: list[Any], attachments: dict[str, Any] | None = None) -> list[Any]:
        """:meth:`tail` as values, for an insert (packed with its header in one go)."""
        if queue_space.layout is TUBE_LAYOUT:
            return [attachments or {}, *data]
        return list(data)

    def put(
        self,
        space_id: int,
        tube_name: str,
        *,
        delay: int,
        ttl: int | None,
        ttr: int | None,
        pri: int,
        data: list[Any],
        ipri: int | None = None,
        counter: str | None = None,
        kind: TubeKind | None = None,
        task_id: str | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> Later[bytes]:
        """box.queue's insert: the position comes from the tube's kind (``ipri`` None: the
        default lane; urgent passes its lane). ``counter`` counts when the put is durable;
        ``kind`` is the caller's, which a tube holding nothing yet takes; ``task_id``: the
        caller's id for the task (tarantool/queue's), else a new random one; ``attrs``: the
        task's attrs in the tube layout (a sub-queue's name, ``utube``)."""
        queue_space = self.queue_space(space_id)
        tube = self._tube(queue_space, tube_name)
        records, options = self._adopt(queue_space, tube, kind)
        ipri_, pri_ = tube.kind.put_order(pri, ipri)
        task = self.new_task(queue_space, tube, delay=delay, ttl=ttl, ttr=ttr, ipri=ipri_, pri=pri_, task_id=task_id,
                             attrs=attrs)
        if not records:
            return self._put_one(queue_space, tube, task, data, counter)
        later = self._batch(queue_space, tube, inserts=[(task, self.tail_values(queue_space, data))], records=records)
        return later.map(lambda results: counted(tube, counter, results[0], options))

    def _put_one(self, queue_space: QueueSpace, tube: Tube, task: Task, data: list[Any], counter: str | None) -> Later[bytes]:
        """A put with no tube record to write: one insert, placed once durable. (A task of the
        tube layout is written as a replace, as a batch of puts writes it.)"""
        if queue_space.layout is QUEUE15:
            fields = task.header() + data
            op = INSERT
        else:
            fields = [*task.header(), {}, *data]  # (no attachments)
            op = REPLACE
        raw = pack_flat(fields)
        write = queue_space.space.prepare_put(raw, fields, op)
        later: Later[bytes] = Later()
        tube.pending += 1
        try:
            self.committer.submit(write, _Inserted(self, queue_space, tube, task, raw, counter, later))
        except BaseException:
            tube.pending -= 1
            raise
        return later

    def put_many(
        self, space_id: int, tube_name: str, items: list[tuple[int | None, list[Any], dict[str, Any]]],
        kind: TubeKind | None = None,
    ) -> Later[list[Task]]:
        """Several tasks of the tube's default position, all or nothing: ``(ttl, data, attrs)``
        each (Zaqar's post). The tube's record is written with them if it needs one."""
        queue_space = self.queue_space(space_id)
        tube = self._tube(queue_space, tube_name)
        records, options = self._adopt(queue_space, tube, kind)
        ipri, pri = tube.kind.put_order(0, None)
        tasks = [self.new_task(queue_space, tube, ttl=ttl, ipri=ipri, pri=pri, attrs=attrs) for ttl, _d, attrs in items]
        inserts = [(task, self.tail_values(queue_space, data)) for task, (_t, data, _a) in zip(tasks, items, strict=True)]
        later = self._batch(queue_space, tube, inserts=inserts, records=records)
        return later.map(lambda _results: counted(tube, None, tasks, options))

    def urgent_ipri(self, tube: Tube) -> int:
        """Ahead of the current head of the ready list (D2, section 2.2)."""
        head = tube.first_ready()
        if head is None or not tube.kind.urgent_lanes:
            return MED_PRI
        return max(int(head.ipri) - 1, 0)

    async def put_unique(
        self, space_id: int, tube_name: str, *, delay: int, ttl: int | None, ttr: int | None, pri: int, data: list[Any],
        kind: TubeKind | None = None,
    ) -> tuple[bytes, bool]:
        """A task, unless a ready (delayed, with a delay) task of the tube has the same first
        data field: then that one. Returns the stored tuple and whether it was inserted."""
        queue_space = self.queue_space(space_id)
        space = queue_space.space
        if 3 not in space.indexes:
            raise proc_error("Tarantool have to be configured to use queue.put_unique method")
        tube = self._tube(queue_space, tube_name)
        status = DELAYED if delay > 0 else READY
        if tube.unique_lock is None:
            tube.unique_lock = trio.Lock()
        async with tube.unique_lock:
            found = space.select(3, 0, [tube_name, status, data[0]], 0, 1)
            if found:
                return found[0], False
            put = self.put(space_id, tube_name, delay=delay, ttl=ttl, ttr=ttr, pri=pri, data=data, counter="put",
                           kind=kind)
            return await put, True

    async def upsert(
        self, space_id: int, items: list[tuple[str, str, float, int, dict[str, Any], list[Any]]],
        kind: TubeKind | None = None,
    ) -> tuple[int, int]:
        """Insert or refresh tasks by (tube, id), in one commit: ``(tube, id, pri, expires,
        attachments, data)`` each (Deckard's Add, K10). A new task is ready with ``pri``; an
        existing one keeps its state, priority, position and attrs, and gets the new
        attachments, data and expiry. Returns (created, updated). A tube over its limit then
        evicts the tasks closest to expiry (K8)."""
        queue_space = self.queue_space(space_id)
        keys = {(space_id, tube, task_id) for tube, task_id, *_rest in items}
        while True:
            busy = [self._upserting[k] for k in keys if k in self._upserting]
            if not busy:
                break
            await busy[0].wait()
        finished = trio.Event()
        for key in keys:
            self._upserting[key] = finished
        try:
            return await self._upsert(queue_space, items, kind)
        finally:
            for key in keys:
                del self._upserting[key]
            finished.set()

    def upsert_now(
        self, space_id: int, items: list[tuple[str, str, float, int, dict[str, Any], list[Any]]],
        kind: TubeKind | None = None,
    ) -> Later[tuple[int, int]] | None:
        """:meth:`upsert` without a task, where it has nothing to wait for (Deckard's usual Add:
        one queue without a limit, and no other upsert of these ids under way): its one commit's
        Later, mapped to (created, updated). None where :meth:`upsert` is needed."""
        names = {item[0] for item in items}
        if len(names) != 1:
            return None
        (name,) = names
        keys = {(space_id, name, item[1]) for item in items}
        if not self._upserting.keys().isdisjoint(keys):
            return None
        queue_space = self.queue_space(space_id)
        if self._tube(queue_space, name).limit:
            return None
        created, updated, pending = self._upsert_batches(queue_space, items, kind)
        ((_tube, later),) = pending
        finished = trio.Event()
        for key in keys:
            self._upserting[key] = finished
        answer: Later[tuple[int, int]] = Later()

        def done(_value: Any, error: BaseException | None) -> None:
            for key in keys:
                del self._upserting[key]
            finished.set()
            answer.settle(None if error is not None else (created, updated), error)

        later.then(done)
        return answer

    async def _upsert(
        self, queue_space: QueueSpace, items: list[tuple[str, str, float, int, dict[str, Any], list[Any]]],
        kind: TubeKind | None,
    ) -> tuple[int, int]:
        created, updated, pending = self._upsert_batches(queue_space, items, kind)
        error: BaseException | None = None
        for _tube, later in pending:
            try:
                await later
            except BaseException as exc:  # every batch is awaited, the first error is raised
                error = error or exc
        if error is not None:
            raise error
        for tube, _later in pending:
            if tube.limit and len(tube.tasks) > tube.limit:
                await self._enforce_limit(queue_space, tube)
        return created, updated

    def _upsert_batches(
        self, queue_space: QueueSpace, items: list[tuple[str, str, float, int, dict[str, Any], list[Any]]],
        kind: TubeKind | None,
    ) -> tuple[int, int, list[tuple[Tube, Later[Any]]]]:
        """Each tube's batch of an upsert, submitted: (created, updated, [(tube, its Later)])."""
        by_tube: dict[str, list[tuple[str, float, int, dict[str, Any], list[Any]]]] = {}
        for tube_name, task_id, pri, expires, attachments, data in items:
            by_tube.setdefault(tube_name, []).append((task_id, pri, expires, attachments, data))
        created = updated = 0
        pending = []
        for tube_name, entries in by_tube.items():
            tube = self._tube(queue_space, tube_name)
            records, options = self._adopt(queue_space, tube, kind)
            new: dict[str, tuple[Task, list[Any]]] = {}
            changes: list[tuple[Task, Mutate, Tail | None]] = []
            for task_id, pri, expires, attachments, data in entries:
                values = self.tail_values(queue_space, data, attachments)
                if task_id in new:
                    task = new[task_id][0]
                    task.ttl = tr.life(expires, task.created)
                    task.event = task.created + task.ttl
                    new[task_id] = (task, values)
                    updated += 1
                    continue
                existing = tube.tasks.get(task_id)
                if existing is None:
                    task = self.new_task(queue_space, tube, ipri=MED_PRI, pri=pri, task_id=task_id)
                    task.ttl = tr.life(expires, task.created)
                    task.event = task.created + task.ttl
                    new[task_id] = (task, values)
                    created += 1
                else:
                    changes.append((existing, tr.expiring_at(expires), pack_tail(len(values), values)))
                    updated += 1
            later = self._batch(queue_space, tube, changes=changes, inserts=list(new.values()), records=records)
            pending.append((tube, later.map(functools.partial(counted, tube, None, options=options))))
        return created, updated, pending


@cython.cclass
class _Inserted:
    """:meth:`Producers._put_one`'s completion: one object a put, where a closure cost a function
    and a cell for each name it used. Once durable the task is placed (and counted)."""

    __slots__ = ("engine", "queue_space", "tube", "task", "raw", "counter", "later")

    def __init__(self, engine: Producers, queue_space: Any, tube: Tube, task: Task, raw: bytes, counter: str | None,
                 later: Later[bytes]) -> None:
        self.engine = engine
        self.queue_space = queue_space
        self.tube = tube
        self.task = task
        self.raw = raw
        self.counter = counter
        self.later = later

    def __call__(self, _result: Any, error: BaseException | None) -> None:
        tube = self.tube
        tube.pending -= 1
        if error is not None:
            self.later.settle(None, error)
            return
        counter = self.counter
        if counter is not None:
            tube.count(counter)
        self.engine._place_inserted(self.queue_space, tube, [self.task], [self.raw])
        self.later.settle(self.raw)
