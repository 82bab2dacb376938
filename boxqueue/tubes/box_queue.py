"""The Tarantool 1.5 ``box.queue`` API on the tube engine: argument coercion, defaults, counters,
error texts and return shapes of the original module (see ``docs/references.md``).

Every function is registered as ``box.queue.<fn>`` and ``queue.<fn>`` (D1). The consumer of a
take is the caller's session; its tasks go back to ready when the session ends (D11).

A function that writes returns a :class:`spaces.later.Later` (or, for a take that has to wait, a
coroutine): the dispatcher replies when the write is durable without a task per call, and any other
caller awaits the result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import cython
import msgpack

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces.later import Later
from boxqueue.spaces.procedures import CallContext, Procedures
from boxqueue.tubes.engine import QueueEngine, now_us, proc_error
from boxqueue.tubes.kinds import BOX_QUEUE
from boxqueue.tubes.numbers import tonumber
from boxqueue.tubes.task import HEADER_FIELDS, HUMAN, STATUS_ORDER, TUBE_LAYOUT, rettask

TIMEOUT_INFINITY = 31_536_000
US = 1_000_000


@cython.cfunc
def _number(value: Any, name: str, fn: str) -> int | float:
    number = tonumber(value)
    if number is None:
        shown = "nil" if value is None else repr(value)
        raise proc_error(f"bad argument '{name}' to queue.{fn}: a number is required, got {shown}")
    return number


@cython.cfunc
def _tube(value: Any, fn: str) -> str:
    if not isinstance(value, str):
        raise proc_error(f"bad argument 'tube' to queue.{fn}: a string is required")
    return value


def _us(seconds: int | float) -> int:
    return int(seconds * US)


def _stored_pri(pri: int | float) -> int:
    """D2: higher pri is taken sooner; stored inverted around 127."""
    return int(255 - min(max(pri + 127, 0), 255))


# A take that has to wait holds a task of its connection; a session may have this many at once
# (``[iproto] max_waiting_takes_per_connection``), more are refused with ER_PROC_LUA.
MAX_WAITING_TAKES = 512


class BoxQueue:
    """The procedures, bound to one engine."""

    def __init__(self, engine: QueueEngine, max_waiting_takes: int = MAX_WAITING_TAKES) -> None:
        self.engine = engine
        self.kind = engine.kind_named(BOX_QUEUE)  # a tube box.queue creates is box.queue's
        self._bound_sessions: set[int] = set()
        self.max_waiting_takes = max_waiting_takes  # per session: takes waiting for a task at once
        self._waiting: dict[int, int] = {}
        self._restart_checked: set[tuple[int, str]] = set()
        # A follower's engine stands by (not recovered, its tasks not in memory): the verbs that
        # change nothing read LMDB instead (the others are refused by the write gate).
        self.standby = False

    def register(self, procedures: Procedures) -> None:
        writes = {
            "put", "urgent", "put_unique", "take", "ack", "touch", "done", "bury", "dig", "unbury",
            "kick", "release", "requeue", "delete", "truncate",
        }
        reads = {"meta", "peek", "statistics", "restart_check"}
        for name in sorted(writes | reads):
            fn = getattr(self, name)
            for prefix in ("box.queue.", "queue."):
                procedures.register(prefix + name, fn, writes=name in writes)

    # -- helpers ---------------------------------------------------------------------------

    def _space(self, value: Any, fn: str) -> int:
        if type(value) is int:  # (what clients send)
            space_id = value
        else:
            number = tonumber(value)
            if number is None:
                shown = "nil" if value is None else repr(value)
                raise proc_error(f"bad argument 'space' to queue.{fn}: a number is required, got {shown}")
            if number != int(number):  # no space has a fractional id
                raise BoxError(ER.NO_SUCH_SPACE, number)
            space_id = int(number)
        self.engine.queue_space(space_id)  # ER_NO_SUCH_SPACE unless a queue space (D12)
        return space_id

    def _returned(self, space_id: int) -> Callable[[bytes | None], list[Any]]:
        """What a call returns from a stored task of this space (its data starts where the
        space's layout puts it)."""
        if self.engine.queue_space(space_id).layout.data_at == HEADER_FIELDS:
            return self._returned_15
        return self._returned_tube

    def _returned_15(self, raw: bytes | None) -> list[Any]:
        return [] if raw is None else [rettask(raw, HEADER_FIELDS)]  # (None: a take that found nothing)

    def _returned_tube(self, raw: bytes | None) -> list[Any]:
        return [] if raw is None else [rettask(raw, TUBE_LAYOUT.data_at)]

    def _consumer(self, ctx: CallContext) -> int:
        """The caller's session, bound once so its tasks are released when it ends."""
        sid = ctx.session_id
        if sid not in self._bound_sessions:
            self._bound_sessions.add(sid)

            async def released() -> None:
                self._bound_sessions.discard(sid)
                await self.engine.release_consumer(sid)

            ctx.on_disconnect(released)
        return sid

    def _put_args(self, fn: str, delay: Any, ttl: Any, ttr: Any, pri: Any) -> tuple[int, int | None, int | None, int]:
        """The put arguments in the engine's units (delay, ttl, ttr, pri); 0 or less means the
        tube's default (None)."""
        ttl_s = _number(ttl, "ttl", fn)  # checked in the 1.5 order: ttl, delay, ttr, pri (Q30)
        delay_s = _number(delay, "delay", fn)
        ttr_s = _number(ttr, "ttr", fn)
        pri_n = _number(pri, "pri", fn)
        return (
            _us(delay_s) if delay_s > 0 else 0,
            _us(ttl_s) if ttl_s > 0 else None,
            _us(ttr_s) if ttr_s > 0 else None,
            _stored_pri(pri_n),
        )

    # -- producers ---------------------------------------------------------------------------

    def put(self, ctx: CallContext, space: Any = None, tube: Any = None, delay: Any = None,
            ttl: Any = None, ttr: Any = None, pri: Any = None, *data: Any) -> Later[list[Any]]:
        space_id, name = self._space(space, "put"), _tube(tube, "put")
        delay_us, ttl_us, ttr_us, stored_pri = self._put_args("put", delay, ttl, ttr, pri)
        # Only calls that succeed count (D9), in the step the task appears.
        return self.engine.put(space_id, name, delay=delay_us, ttl=ttl_us, ttr=ttr_us, pri=stored_pri, data=list(data),
                               counter="put", kind=self.kind).map(self._returned(space_id))

    def urgent(self, ctx: CallContext, space: Any = None, tube: Any = None, delay: Any = None,
               ttl: Any = None, ttr: Any = None, pri: Any = None, *data: Any) -> Later[list[Any]]:
        space_id, name = self._space(space, "urgent"), _tube(tube, "urgent")
        delay_us, ttl_us, ttr_us, stored_pri = self._put_args("urgent", delay, ttl, ttr, pri)
        ipri = None if delay_us > 0 else self.engine.urgent_ipri(self.engine.tube(space_id, name))
        return self.engine.put(space_id, name, delay=delay_us, ttl=ttl_us, ttr=ttr_us, pri=stored_pri, data=list(data),
                               ipri=ipri, counter="urgent", kind=self.kind).map(self._returned(space_id))

    async def put_unique(self, ctx: CallContext, space: Any = None, tube: Any = None, delay: Any = None,
                         ttl: Any = None, ttr: Any = None, pri: Any = None, *data: Any) -> list[Any]:
        space_id, name = self._space(space, "put_unique"), _tube(tube, "put_unique")
        _number(delay, "delay", "put_unique")
        if not data or data[0] is None:
            raise proc_error("Can not put unique task without data")
        delay_us, ttl_us, ttr_us, stored_pri = self._put_args("put_unique", delay, ttl, ttr, pri)  # the delay converted once (D4)
        raw, _inserted = await self.engine.put_unique(space_id, name, delay=delay_us, ttl=ttl_us, ttr=ttr_us,
                                                      pri=stored_pri, data=list(data), kind=self.kind)
        return self._returned(space_id)(raw)

    # -- consumers ---------------------------------------------------------------------------

    def take(self, ctx: CallContext, space: Any = None, tube: Any = None,
             timeout: Any = None) -> Later[list[Any]] | Coroutine[Any, Any, list[Any]]:
        """A Later when a task is ready now; a coroutine when the take has to wait."""
        space_id, name = self._space(space, "take"), _tube(tube, "take")
        seconds = TIMEOUT_INFINITY if timeout is None else _number(timeout, "timeout", "take")
        if seconds < 0:
            raise proc_error("Timeout can't be less then 0")
        consumer = self._consumer(ctx)
        taking = self.engine.take(space_id, name, consumer, seconds)
        returned = self._returned(space_id)
        if isinstance(taking, Later):
            return taking.map(returned)
        return self.waiting(consumer, taking, returned)

    def waiting(self, consumer: int, taking: Awaitable[bytes | None],
                taken: Callable[[bytes | None], list[Any]]) -> Coroutine[Any, Any, list[Any]]:
        """A take that waits, counted against the session's limit of waiting takes."""
        waiting = self._waiting.get(consumer, 0)
        if waiting >= self.max_waiting_takes:
            taking.close()  # type: ignore[attr-defined]  # a coroutine never started
            raise proc_error(f"Too many waiting takes on this connection (at most {self.max_waiting_takes})")
        self._waiting[consumer] = waiting + 1
        return self._counted_wait(consumer, _waited(taking, taken))

    async def _counted_wait(self, consumer: int, waiting: Awaitable[list[Any]]) -> list[Any]:
        try:
            return await waiting
        finally:
            left = self._waiting[consumer] - 1
            if left:
                self._waiting[consumer] = left
            else:
                del self._waiting[consumer]

    def ack(self, ctx: CallContext, space: Any = None, task_id: Any = None) -> Later[list[Any]]:
        space_id = self._space(space, "ack")
        return self.engine.ack(space_id, task_id, ctx.session_id).map(self._returned(space_id))

    def touch(self, ctx: CallContext, space: Any = None, task_id: Any = None) -> Later[list[Any]]:
        space_id = self._space(space, "touch")
        return self.engine.touch(space_id, task_id, ctx.session_id).map(self._returned(space_id))

    def done(self, ctx: CallContext, space: Any = None, task_id: Any = None, *data: Any) -> Later[list[Any]]:
        space_id = self._space(space, "done")
        return self.engine.done(space_id, task_id, ctx.session_id, list(data)).map(self._returned(space_id))

    def bury(self, ctx: CallContext, space: Any = None, task_id: Any = None) -> Later[list[Any]]:
        space_id = self._space(space, "bury")
        return self.engine.bury(space_id, task_id, ctx.session_id).map(self._returned(space_id))

    def dig(self, ctx: CallContext, space: Any = None, task_id: Any = None) -> Later[list[Any]]:
        space_id = self._space(space, "dig")
        return self.engine.dig(space_id, task_id).map(self._returned(space_id))

    unbury = dig

    async def kick(self, ctx: CallContext, space: Any = None, tube: Any = None, count: Any = None) -> list[Any]:
        space_id, name = self._space(space, "kick"), _tube(tube, "kick")
        number = 1 if count is None else _number(count, "count", "kick")
        return [await self.engine.kick(space_id, name, int(number))]

    def release(self, ctx: CallContext, space: Any = None, task_id: Any = None,
                delay: Any = None, ttl: Any = None) -> Later[list[Any]]:
        space_id = self._space(space, "release")
        delay_us = 0 if delay is None else max(_us(_number(delay, "delay", "release")), 0)
        ttl_s = None if ttl is None else _number(ttl, "ttl", "release")
        return self.engine.release(space_id, task_id, ctx.session_id, delay_us, ttl_s).map(self._returned(space_id))

    def requeue(self, ctx: CallContext, space: Any = None, task_id: Any = None) -> Later[list[Any]]:
        space_id = self._space(space, "requeue")
        return self.engine.requeue(space_id, task_id, ctx.session_id).map(self._returned(space_id))

    def delete(self, ctx: CallContext, space: Any = None, task_id: Any = None) -> Later[list[Any]]:
        space_id = self._space(space, "delete")
        return self.engine.delete(space_id, task_id).map(self._returned(space_id))

    async def truncate(self, ctx: CallContext, space: Any = None, tube: Any = None) -> list[Any]:
        space_id, name = self._space(space, "truncate"), _tube(tube, "truncate")
        return [await self.engine.truncate(space_id, name)]

    # -- reading -----------------------------------------------------------------------------

    def meta(self, ctx: CallContext, space: Any = None, task_id: Any = None) -> list[Any]:
        if self.standby:
            return [self._stored_meta(self._space(space, "meta"), task_id)]
        return [self.engine.meta(self._space(space, "meta"), task_id)]

    def peek(self, ctx: CallContext, space: Any = None, task_id: Any = None) -> list[Any]:
        space_id = self._space(space, "peek")
        if self.standby:
            return self._returned(space_id)(self._stored(space_id, task_id))
        return self._returned(space_id)(self.engine.peek(space_id, task_id))

    # -- a follower's reads: from LMDB, its engine standing by ---------------------------------

    def _stored(self, space_id: int, task_id: Any) -> bytes:
        queue_space = self.engine.queue_space(space_id)
        raw = queue_space.space.get(0, [task_id]) if isinstance(task_id, str) and not queue_space.layout.by_tube \
            else None
        if raw is None:
            raise proc_error("Task not found")
        return raw

    def _stored_meta(self, space_id: int, task_id: Any) -> list[Any]:
        fields = msgpack.unpackb(self._stored(space_id, task_id))
        header = fields[:HEADER_FIELDS]
        header[2] = HUMAN.get(header[2], header[2])
        header[8] //= 1_000_000
        header[9] //= 1_000_000
        return [*header, now_us()]

    def _stored_statistics(self, space_id: int | None, tube: str | None) -> list[Any]:
        """A follower's statistics: the ``tasks.*`` figures of the tubes holding tasks, counted
        in LMDB (the counters of calls belong to the process that served them: the leader's)."""
        counts: dict[tuple[int, str], dict[str, int]] = {}
        for sid, queue_space in sorted(self.engine.queue_spaces().items()):
            if (space_id is not None and sid != space_id) or queue_space.layout.by_tube:
                continue
            for raw in queue_space.space.select(0, 0, [], 0, 1 << 62):
                fields = msgpack.unpackb(raw)
                if tube is not None and fields[1] != tube:
                    continue
                by_status = counts.setdefault((sid, fields[1]), dict.fromkeys(STATUS_ORDER, 0))
                by_status[fields[2]] = by_status.get(fields[2], 0) + 1
        out: list[Any] = []
        for (sid, name), by_status in counts.items():
            prefix = f"space{sid}.{name}.tasks."
            out += [prefix + "total", sum(by_status.values())]
            for status in STATUS_ORDER:
                out += [prefix + HUMAN[status], by_status[status]]
        return out

    def statistics(self, ctx: CallContext, space: Any = None, tube: Any = None) -> list[Any]:
        """One flat list; an unknown space or tube gives an empty one (D12, D15)."""
        space_id = None
        if space is not None:
            number = tonumber(space)
            if number is None or number != int(number):
                return [[]]
            space_id = int(number)
        if tube is not None and not isinstance(tube, str):
            return [[]]
        if self.standby:
            return [self._stored_statistics(space_id, tube)]
        return [self.engine.statistics(space_id, tube)]

    def restart_check(self, ctx: CallContext, space: Any = None, tube: Any = None) -> list[Any]:
        """Recovery runs at start (D10); this only reports whether the tube was seen before."""
        space_id, name = self._space(space, "restart_check"), _tube(tube, "restart_check")
        key = (space_id, name)
        if key in self._restart_checked or key in self.engine.tubes:
            self._restart_checked.add(key)
            return ["already started"]
        self._restart_checked.add(key)
        self.engine.tube(space_id, name)
        return ["starting"]


async def _waited(taking: Awaitable[bytes | None], taken: Callable[[bytes | None], list[Any]]) -> list[Any]:
    return taken(await taking)


def register(procedures: Procedures, engine: QueueEngine, max_waiting_takes: int = MAX_WAITING_TAKES) -> BoxQueue:
    queue = BoxQueue(engine, max_waiting_takes)
    queue.register(procedures)
    return queue

