"""The tube engine: task states, ordering, blocking takes, consumers, monitors.

Transport-neutral: a consumer is an integer identity (an iproto session id for box.queue) whose
tasks go back to ready when :meth:`QueueEngine.release_consumer` is called (the iproto session
closed). Times are microseconds since the epoch; arguments arrive already checked and converted
by an adapter such as :mod:`tubes.box_queue`.

Every state change is decided in memory first (so concurrent calls see it at once: a task being
taken cannot be taken twice), then written as one storage write, grouped with its neighbours by
the group committer; the call returns when the write is durable. If the write fails, the memory
change is undone. Tasks become visible to consumers only once their put is durable.

One monitor task per tube, owned by the engine's nursery, sleeps until the tube's earliest event
(delay end, ttr, ttl) and is woken early when a change may bring that event closer.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from errcodes import ER, BoxError
from spaces.catalog import Catalog
from spaces.later import Later
from spaces.msgpack_values import pack
from spaces.space import INSERT, Space, decode_tuple
from tubes.task import (
    BURIED,
    DELAYED,
    DONE,
    HUMAN,
    READY,
    STATUS_ORDER,
    TAKEN,
    Task,
    encode_task,
    split_data,
)
from tubes.tube import Tube

log = logging.getLogger(__name__)

MED_PRI = 127
MAX_PRI = 255
IDLE_WAIT = 3600.0
INTERNAL_ERROR_RETRY_US = 5_000_000

# (space id, tube, task id, status before or None, status after or None, stored tuple or None)
ChangeHook = Callable[[int, str, str, str | None, str | None, bytes | None], None]

# The layout of a queue space (D12): index parts by field number.
_LAYOUT = ((0,), (1, 2, 4, 5), (1, 3))
_UNIQUE_LAYOUT = (1, 2, 12)

# The version (4) and variant (10) bits of a random UUID.
_UUID4_CLEAR = ~((0xF << 76) | (0x3 << 62))
_UUID4_SET = (0x4 << 76) | (0x2 << 62)


def proc_error(text: str) -> BoxError:
    """The queue's errors reach the client as ER_PROC_LUA with the original texts (D8)."""
    return BoxError(ER.PROC_LUA, message=text)


def now_us() -> int:
    return time.time_ns() // 1000


def is_queue_space(space: Space) -> bool:
    parts = tuple(space.indexes[i].fieldnos for i in sorted(space.indexes))
    return parts[:3] == _LAYOUT and (len(parts) == 3 or (len(parts) == 4 and parts[3] == _UNIQUE_LAYOUT))


class QueueEngine:
    """All tubes of all queue spaces of one server."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.committer = catalog.committer
        self.tubes: dict[tuple[int, str], Tube] = {}
        self._where: dict[tuple[int, str], Tube] = {}  # (space id, task id) -> its tube
        self._taken_by: dict[int, set[tuple[int, str]]] = {}  # consumer -> (space id, task id)
        self._last_created = 0
        self._layouts: dict[int, tuple[Space, int, bool]] = {}
        self._nursery: trio.Nursery | None = None
        self.hooks: list[ChangeHook] = []
        self._random = random.Random()  # task ids: seeded from os.urandom

    # -- life ----------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._recover()
            task_status.started()
            await trio.sleep_forever()

    async def _recover(self) -> None:
        """Rebuild memory from the queue spaces; tasks left taken become ready (D10)."""
        left_taken: list[tuple[Space, Tube, Task]] = []
        for space in self.queue_spaces().values():
            if space.primary is None:
                continue
            for raw in space.pairs(0, 2, []):
                task = Task.from_fields(decode_tuple(raw))
                tube = self.tube(space.id, task.tube, start_monitor=False)
                self._place(space.id, tube, task)
                self._last_created = max(self._last_created, task.created)
                if task.status == TAKEN:
                    left_taken.append((space, tube, task))
        async with trio.open_nursery() as nursery:
            for space, tube, task in left_taken:
                nursery.start_soon(self._return_to_ready, space, tube, task, "ready_by_restart")
        for (space_id, _name), tube in self.tubes.items():
            if tube.tasks:
                self._start_monitor(space_id, tube)
        if left_taken:
            log.info("%d tasks left taken by the previous run are ready again", len(left_taken))

    # -- lookups -------------------------------------------------------------------------------

    def queue_spaces(self) -> dict[int, Space]:
        return {sid: s for sid, s in self.catalog.spaces.items() if is_queue_space(s)}

    def space(self, space_id: Any) -> Space:
        space = self.catalog.spaces.get(space_id) if type(space_id) is int else None
        if space is None:
            raise BoxError(ER.NO_SUCH_SPACE, space_id)
        # Whether a space is laid out for the queue only changes with its indexes (DDL).
        known = self._layouts.get(space_id)
        if known is None or known[0] is not space or known[1] != self.catalog.schema_version:
            known = self._layouts[space_id] = (space, self.catalog.schema_version, is_queue_space(space))
        if not known[2]:
            raise BoxError(ER.NO_SUCH_SPACE, space_id)
        return space

    def tube(self, space_id: int, name: str, start_monitor: bool = True) -> Tube:
        tube = self.tubes.get((space_id, name))
        if tube is None:
            tube = self.tubes[(space_id, name)] = Tube(space_id, name)
        if start_monitor and not tube.monitor_started:
            self._start_monitor(space_id, tube)
        return tube

    def find(self, space_id: int, task_id: Any) -> tuple[Tube, Task]:
        tube = self._where.get((space_id, task_id)) if isinstance(task_id, str) else None
        if tube is None:
            raise proc_error("Task not found")
        return tube, tube.tasks[task_id]

    def owned(self, space_id: int, task_id: Any, consumer: int, verb: str) -> tuple[Tube, Task]:
        """The three checks of the 1.5 module, in its order and with its texts."""
        tube, task = self.find(space_id, task_id)
        if task.status != TAKEN:
            raise proc_error("Task is not taken")
        if task.cid != consumer:
            raise proc_error(f"Only consumer that took the task can it {verb}")
        return tube, task

    # -- memory --------------------------------------------------------------------------------

    def _place(self, space_id: int, tube: Tube, task: Task) -> None:
        tube.place(task)
        self._where[(space_id, task.id)] = tube
        if task.status == TAKEN:
            self._taken_by.setdefault(task.cid, set()).add((space_id, task.id))

    def _unplace(self, space_id: int, tube: Tube, task: Task) -> None:
        tube.unplace(task)
        del self._where[(space_id, task.id)]
        if task.status == TAKEN:
            held = self._taken_by.get(task.cid)
            if held is not None:
                held.discard((space_id, task.id))
                if not held:
                    del self._taken_by[task.cid]

    def _next_created(self) -> int:
        created = max(now_us(), self._last_created + 1)
        self._last_created = created
        return created

    # -- writes --------------------------------------------------------------------------------

    def _change(
        self,
        space: Space,
        tube: Tube,
        task: Task,
        mutate: Callable[[Task], None],
        data: list[Any] | None = None,
        after: Callable[[], None] | None = None,
    ) -> Later[bytes]:
        """Change ``task`` in memory and write it (keeping its stored data unless ``data`` is
        given); the Later gives the stored tuple once durable, after ``after()`` has run. A write
        that fails undoes the memory change."""
        before = task.copy()
        self._unplace(space.id, tube, task)
        mutate(task)
        self._place(space.id, tube, task)
        header = task.header()
        if data is None:

            def transform(old: bytes) -> bytes:
                return encode_task(header, *split_data(old))
        else:
            packed = b"".join(pack(v) for v in data)

            def transform(old: bytes) -> bytes:
                return encode_task(header, len(data), packed)

        def undo() -> None:
            if tube.tasks.get(task.id) is task and task.header() == header:
                self._unplace(space.id, tube, task)
                task.restore(before)
                self._place(space.id, tube, task)

        later: Later[bytes] = Later()

        def done(raw: bytes | None, error: BaseException | None) -> None:
            if error is None and raw is None:
                error = proc_error("Task not found")
            if error is not None:
                undo()
                later.settle(None, error)
                return
            self._notify(space.id, tube.name, task.id, before.status, task.status, raw)
            if after is not None:
                after()
            later.settle(raw)

        try:
            self.committer.submit(space.prepare_transform([task.id], transform), done)
        except BaseException:
            undo()
            raise
        return later

    def _delete(self, space: Space, tube: Tube, task: Task) -> Later[bytes]:
        self._unplace(space.id, tube, task)

        def undo() -> None:
            if (space.id, task.id) not in self._where:
                self._place(space.id, tube, task)

        later: Later[bytes] = Later()

        def done(raw: bytes | None, error: BaseException | None) -> None:
            if error is not None:
                undo()
                later.settle(None, error)
                return
            self._notify(space.id, tube.name, task.id, task.status, None, None)
            later.settle(raw)

        try:
            self.committer.submit(space.prepare_delete(0, [task.id]), done)
        except BaseException:
            undo()
            raise
        return later

    def _notify(self, space_id: int, tube: str, task_id: str, old: str | None, new: str | None, raw: bytes | None) -> None:
        for hook in self.hooks:
            try:
                hook(space_id, tube, task_id, old, new, raw)
            except Exception:
                log.exception("task change hook failed")

    # -- producers -----------------------------------------------------------------------------

    def put(
        self,
        space_id: int,
        tube_name: str,
        *,
        delay: int,
        ttl: int,
        ttr: int,
        pri: int,
        data: list[Any],
        ipri: int | None = None,
    ) -> Later[bytes]:
        """Insert a task (``ipri`` None: the default lane; put_unique and urgent pass theirs)."""
        space = self.space(space_id)
        tube = self.tube(space_id, tube_name)
        now = now_us()
        created = self._next_created()
        ttl += delay
        if delay > 0:
            status, event = DELAYED, now + delay
        else:
            status, event = READY, created + ttl
        task = Task(self._new_id(), tube_name, status, event, MED_PRI if ipri is None else ipri, pri, 0, created, ttl, ttr)
        raw = pack(task.header() + data)
        write = space.prepare_put(raw, decode_tuple(raw), INSERT)
        later: Later[bytes] = Later()

        def done(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                later.settle(None, error)
                return
            self._place(space_id, tube, task)
            if status == READY:
                tube.wake_one_consumer()
            tube.wake_monitor()
            self._notify(space_id, tube_name, task.id, None, status, raw)
            later.settle(raw)

        self.committer.submit(write, done)
        return later

    def _new_id(self) -> str:
        """32 lowercase hex digits of a version 4 UUID, as 1.5's uuid_hex gave."""
        bits = self._random.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET
        return f"{bits:032x}"

    def urgent_ipri(self, tube: Tube) -> int:
        """Ahead of the current head of the ready list (D2, section 2.2)."""
        head = tube.first_ready()
        return MED_PRI if head is None else max(head.ipri - 1, 0)

    async def put_unique(
        self, space_id: int, tube_name: str, *, delay: int, ttl: int, ttr: int, pri: int, data: list[Any]
    ) -> tuple[bytes, bool]:
        """A task, unless a ready (delayed, with a delay) task of the tube has the same first
        data field: then that one. Returns the stored tuple and whether it was inserted."""
        space = self.space(space_id)
        if 3 not in space.indexes:
            raise proc_error("Tarantool have to be configured to use queue.put_unique method")
        tube = self.tube(space_id, tube_name)
        status = DELAYED if delay > 0 else READY
        async with tube.unique_lock:
            found = space.select(3, 0, [tube_name, status, data[0]], 0, 1)
            if found:
                return found[0], False
            return await self.put(space_id, tube_name, delay=delay, ttl=ttl, ttr=ttr, pri=pri, data=data), True

    # -- consumers -----------------------------------------------------------------------------

    def take(self, space_id: int, tube_name: str, consumer: int, timeout: float) -> Awaitable[bytes | None]:
        """The first ready task in take order, waiting up to ``timeout`` seconds for one.

        A task ready now is taken without a task of its own (a :class:`Later`); only a take that
        has to wait is a coroutine."""
        space = self.space(space_id)
        tube = self.tube(space_id, tube_name)
        taking = self._take_ready(space, tube, consumer)
        if taking is not None:
            return taking
        if timeout <= 0:
            tube.count("take_timeout")
            return Later.done(None)
        return self._take_waiting(space, tube, consumer, trio.current_time() + timeout)

    async def _take_waiting(self, space: Space, tube: Tube, consumer: int, deadline: float) -> bytes | None:
        while True:
            waiter = trio.Event()
            tube.waiters.append(waiter)
            try:
                with trio.move_on_at(deadline):
                    await waiter.wait()
            finally:
                if not waiter.is_set():
                    try:
                        tube.waiters.remove(waiter)
                    except ValueError:
                        pass
            taking = self._take_ready(space, tube, consumer)
            if taking is not None:
                return await taking
            if trio.current_time() >= deadline:
                tube.count("take_timeout")
                return None

    def _take_ready(self, space: Space, tube: Tube, consumer: int) -> Later[bytes] | None:
        task = self._first_live_ready(tube)
        if task is None:
            return None
        event = min(now_us() + task.ttr, task.expires)

        def taken(t: Task) -> None:
            t.status, t.event, t.cid, t.ctaken = TAKEN, event, consumer, t.ctaken + 1

        def after() -> None:
            tube.wake_monitor()
            tube.wake_one_consumer()
            tube.count("take")

        return self._change(space, tube, task, taken, after=after)

    def _first_live_ready(self, tube: Tube) -> Task | None:
        """The head of the ready list, skipping tasks already past their ttl (D7): the monitor,
        woken here, deletes those."""
        now = now_us()
        for key in tube.ready:
            task = tube.tasks[key[3]]
            if task.expires > now:
                return task
            tube.wake_monitor()
        return None

    def ack(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "ack")
        tube.count("ack")
        return self._delete(self.space(space_id), tube, task)

    def touch(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "touch")
        event = min(now_us() + task.ttr, task.expires)

        def touched(t: Task) -> None:
            t.event = event

        return self._change(self.space(space_id), tube, task, touched, after=lambda: tube.count("touch"))

    def done(self, space_id: int, task_id: Any, consumer: int, data: list[Any]) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "done")

        def finished(t: Task) -> None:
            t.status, t.event = DONE, t.expires

        def after() -> None:
            tube.wake_monitor()
            tube.count("done")

        return self._change(self.space(space_id), tube, task, finished, data=data, after=after)

    def bury(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "done")  # sic: 1.5's text (D8)

        def buried(t: Task) -> None:
            t.status, t.event, t.cbury = BURIED, t.expires, t.cbury + 1

        def after() -> None:
            tube.wake_monitor()
            tube.count("bury")

        return self._change(self.space(space_id), tube, task, buried, after=after)

    def dig(self, space_id: int, task_id: Any) -> Later[bytes]:
        tube, task = self.find(space_id, task_id)
        if task.status != BURIED:
            raise proc_error("Task is not buried")

        def after() -> None:
            tube.wake_monitor()
            tube.wake_one_consumer()  # D7
            tube.count("dig")

        return self._change(self.space(space_id), tube, task, _unburied, after=after)

    async def kick(self, space_id: int, tube_name: str, count: int) -> int:
        """Up to ``count`` buried tasks, in take order, become ready (D5)."""
        space = self.space(space_id)
        tube = self.tube(space_id, tube_name)
        if count <= 0:
            return 0
        chosen = tube.buried_in_order()[:count]
        kicked = 0

        async def kick_one(task: Task) -> None:
            nonlocal kicked
            await self._change(space, tube, task, _unburied)
            kicked += 1
            tube.count("dig")
            tube.wake_one_consumer()  # D7

        async with trio.open_nursery() as nursery:
            for task in chosen:
                nursery.start_soon(kick_one, task)
        tube.wake_monitor()
        return kicked

    def release(self, space_id: int, task_id: Any, consumer: int, delay: int, ttl_s: float | None) -> Later[bytes]:
        """Back to ready (or delayed); a given ttl restarts the task's life from now (+delay)."""
        tube, task = self.owned(space_id, task_id, consumer, "release")
        now = now_us()
        ttl = task.ttl
        if ttl_s is not None and ttl_s > 0:
            ttl = int(ttl_s * 1_000_000) + (now - task.created) + max(delay, 0)

        def released(t: Task) -> None:
            t.ttl, t.cid = ttl, 0
            if delay > 0:
                t.status, t.event = DELAYED, min(now + delay, t.expires)
            else:
                t.status, t.event = READY, t.expires

        def after() -> None:
            if delay <= 0:
                tube.wake_one_consumer()
            tube.wake_monitor()
            tube.count("release")

        return self._change(self.space(space_id), tube, task, released, after=after)

    def requeue(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        """Back to ready behind every ready task of the tube, whatever their priority (D13)."""
        tube, task = self.owned(space_id, task_id, consumer, "release")  # sic: 1.5's text (D8)
        last = tube.last_ready()
        ipri = MED_PRI if last is None else min(last.ipri + 1, MAX_PRI)

        def requeued(t: Task) -> None:
            t.status, t.event, t.cid, t.ipri = READY, t.expires, 0, ipri

        def after() -> None:
            tube.wake_one_consumer()
            tube.wake_monitor()
            tube.count("requeue")

        return self._change(self.space(space_id), tube, task, requeued, after=after)

    def delete(self, space_id: int, task_id: Any) -> Later[bytes]:
        tube, task = self.find(space_id, task_id)
        tube.count("delete")
        return self._delete(self.space(space_id), tube, task)

    async def truncate(self, space_id: int, tube_name: str) -> int:
        space = self.space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        if tube is None or not tube.tasks:
            return 0
        doomed = list(tube.tasks.values())
        for task in doomed:
            self._unplace(space_id, tube, task)
        deletes = [space.prepare_delete(0, [task.id]) for task in doomed]

        def write(txn: Any) -> None:
            for delete in deletes:
                delete(txn)

        try:
            await self.committer.write(write)
        except BaseException:
            for task in doomed:
                if (space_id, task.id) not in self._where:
                    self._place(space_id, tube, task)
            raise
        for task in doomed:
            self._notify(space_id, tube_name, task.id, task.status, None, None)
        return len(doomed)

    async def release_consumer(self, consumer: int) -> None:
        """The consumer is gone (its connection closed): its taken tasks are ready at once (D11)."""
        held = list(self._taken_by.get(consumer, ()))
        async with trio.open_nursery() as nursery:
            for space_id, task_id in held:
                tube = self._where.get((space_id, task_id))
                if tube is None:
                    continue
                task = tube.tasks[task_id]
                if task.status == TAKEN and task.cid == consumer:
                    nursery.start_soon(self._return_to_ready, self.space(space_id), tube, task, "ready_by_disconnect")

    async def _return_to_ready(self, space: Space, tube: Tube, task: Task, counter: str) -> None:
        try:
            await self._change(space, tube, task, _made_ready)
        except Exception:
            log.exception("could not return task %s to ready", task.id)
            return
        tube.count(counter)
        tube.wake_one_consumer()
        tube.wake_monitor()

    # -- reading -------------------------------------------------------------------------------

    def stored(self, space_id: int, task_id: str) -> bytes:
        raw = self.space(space_id).get(0, [task_id])
        if raw is None:
            raise proc_error("Task not found")
        return raw

    def meta(self, space_id: int, task_id: Any) -> list[Any]:
        tube, task = self.find(space_id, task_id)
        tube.count("meta")
        return [
            task.id, task.tube, HUMAN[task.status], task.event, task.ipri, task.pri, task.cid,
            task.created, task.ttl // 1_000_000, task.ttr // 1_000_000, task.cbury, task.ctaken, now_us(),
        ]

    def peek(self, space_id: int, task_id: Any) -> bytes:
        tube, task = self.find(space_id, task_id)
        tube.count("peek")
        return self.stored(space_id, task.id)

    def statistics(self, space_id: int | None = None, tube_name: str | None = None) -> list[Any]:
        """The flat list of section 5.1: counters in the order they first moved, then tasks.*."""
        out: list[Any] = []
        for (sid, name), tube in self.tubes.items():
            if space_id is not None and sid != space_id:
                continue
            if tube_name is not None and name != tube_name:
                continue
            if not tube.stats:
                continue
            prefix = f"space{sid}.{name}."
            for counter, value in tube.stats.items():
                out += [prefix + counter, value]
            out += [prefix + "tasks.total", len(tube.tasks)]
            for status in STATUS_ORDER:
                out += [prefix + "tasks." + HUMAN[status], tube.counts[status]]
        return out

    # -- monitors ------------------------------------------------------------------------------

    def _start_monitor(self, space_id: int, tube: Tube) -> None:
        if self._nursery is None or tube.monitor_started:
            return
        tube.monitor_started = True
        self._nursery.start_soon(self._monitor, space_id, tube)

    async def _monitor(self, space_id: int, tube: Tube) -> None:
        """Delays ending, ttr passing and ttl expiring for one tube, each at its own time."""
        while True:
            tube.monitor_wakeup = trio.Event()
            try:
                space = self.space(space_id)
            except BoxError:
                return  # the space is gone
            task = tube.next_event()
            while task is not None and task.event <= (now := now_us()):
                try:
                    await self._expire(space, tube, task, now)
                except Exception:
                    log.exception("monitor of %s.%s failed on task %s", space_id, tube.name, task.id)
                    await trio.sleep(0.1)
                task = tube.next_event()
            wait = IDLE_WAIT if task is None else (task.event - now_us()) / 1_000_000
            with trio.move_on_after(max(wait, 0)):
                await tube.monitor_wakeup.wait()

    async def _expire(self, space: Space, tube: Tube, task: Task, now: int) -> None:
        if now >= task.expires:
            tube.count("ttl.total")
            tube.count("ttl." + HUMAN[task.status])
            await self._delete(space, tube, task)
        elif task.status in (DELAYED, TAKEN):
            await self._change(space, tube, task, _made_ready)
            tube.wake_one_consumer()
        else:
            log.error("Internal error: unexpected task status %r of task %s", task.status, task.id)

            def later(t: Task) -> None:
                t.event = now + INTERNAL_ERROR_RETRY_US

            await self._change(space, tube, task, later)


def _made_ready(task: Task) -> None:
    task.status, task.event, task.cid = READY, task.expires, 0


def _unburied(task: Task) -> None:
    task.status = READY  # cbury counts buries only (D6)
