"""tarantool/queue's API (the module most Tarantool applications queue with today, 1.5.0) on the
tube engine: ``queue.create_tube``, ``queue.tube.<name>:<method>`` over CALL, ``queue.statistics``,
``queue.state``, ``queue.cfg``.

Served natively, not by running the module's Lua. A module tube ``jobs`` is the engine's tube
``jobs`` in an engine-owned space named ``jobs`` (the module names a tube's space after it), with
the tube layout of :mod:`boxqueue.tubes.task`, so box.queue, Deckard and Zaqar reach its tasks like any
other tube's. What the module keeps in its ``_queue`` space (the tube's type and defaults) is the
engine's tube record. What this layer adds:

* the module's task: ``[id, status letter, data]``, ids integers: the engine numbers the tasks
  of the module's tubes whichever API puts them (:meth:`tubes.tube.Tube.next_number`, stored as
  decimal text since the engine's ids are strings);
* its status letters (``r t - ! ~``), priorities (smaller first, as given), defaults (ttl and ttr
  of 100 years, ttr defaulting to ttl, ``delay`` adding to ttl) and, per type, which options count
  (``fifo`` has no ttl, ttr or pri);
* its checks and texts, as ER_PROC_LUA (32): the texts without the ``file:line:`` prefix Lua puts
  in front of them, which names where the module is installed;
* its counters: ``queue.statistics`` shows the module's quirks too (a touch of a ``fifottl`` task
  counts twice, as the module's tube and driver each count it).

Types: ``fifo``, ``fifottl``, ``limfifottl`` (``capacity``; a put into a full tube waits up to its
``timeout``), ``utube`` and ``utubettl`` (a task's ``utube`` names its sub-queue, which gives one
task at a time: the engine's tubes of sub-queues, :meth:`tubes.tube.Tube.subqueues_busy`).
Sessions (:class:`QueueSession`): a connection takes as its queue session; ``queue.identify(uuid)``
makes another connection one of that session's; a session left without a connection keeps its
takes ``queue.cfg{ttr = ...}`` seconds (default 0: released at once). A restart releases every
take (the engine's rule for a session's takes, D10), as the module does with ttr 0.

``tube:grant`` gives its privileges through the layer that keeps users (a callback, :data:`Grant`).

``on_task_change`` callbacks are Lua functions kept by the Lua layer; this layer queues each
durable change of a watched tube and has it run them (:data:`TaskChanged`), in order.

Not yet: ``grant_role``, the utube types' ``storage_mode`` (accepted, one order either way), and the
module from Lua (console, EVAL). ``temporary`` is accepted and stored; the tube is durable all
the same.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any

import cython
import trio

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces import msgpack_scan
from boxqueue.spaces.later import Later
from boxqueue.spaces.msgpack_values import Raw, pack, unpack
from boxqueue.spaces.procedures import CallContext, ProcedureEntry, Procedures, make_entry
from boxqueue.spaces.space import StorageError, decode_tuple
from boxqueue.task_roots import python_root
from boxqueue.tubes.box_queue import BoxQueue
from boxqueue.tubes.engine import QueueEngine, proc_error
from boxqueue.tubes.engine_base import TUBE_RECORDS
from boxqueue.tubes.kinds import QUEUE_MODULE
from boxqueue.tubes.numbers import tonumber
from boxqueue.tubes.task import (
    BURIED,
    DELAYED,
    DONE,
    F_STATUS,
    F_TUBE,
    READY,
    TAKEN,
    TUBE_LAYOUT,
    Task,
)

TYPES = ("fifo", "fifottl", "limfifottl", "utube", "utubettl")
TIMED = ("fifottl", "limfifottl", "utubettl")  # the types with ttl, ttr, pri and delays
SUBQUEUES = ("utube", "utubettl")
PUT_POLL_S = 0.01  # limfifottl: how often a put waiting for room looks again (the module's pace)
STATUS = {READY: "r", TAKEN: "t", DONE: "-", BURIED: "!", DELAYED: "~"}
_PACKED_STATUS = {pack(status): pack(letter) for status, letter in STATUS.items()}
# The module's states, in the order its statistics name them.
TASK_STATES = (("ready", READY), ("taken", TAKEN), ("done", DONE), ("buried", BURIED), ("delayed", DELAYED))
# The module's counters of calls, in the order its statistics name them.
CALL_COUNTERS = ("ack", "bury", "delete", "kick", "put", "release", "take", "touch", "ttl", "ttr", "delay")
MAX_TIMEOUT = 365 * 86400 * 100  # seconds: the module's "no timeout"
US = 1_000_000
TAKE_FOREVER = float(MAX_TIMEOUT)

# method -> whether it writes (a follower refuses those)
METHODS = {
    "put": True, "take": True, "touch": True, "ack": True, "release": True, "peek": False, "bury": True,
    "kick": True, "delete": True, "drop": True, "truncate": True, "release_all": True, "grant": True,
}
# what tube:grant(user, {call = true}) lets the user call (the module's list)
CALLED = ("put", "take", "touch", "ack", "release", "peek", "bury", "kick", "delete")

# box.schema.user.grant's work (user, privileges, object type, object name), given by the layer
# that keeps users (boxqueue/lua_box/operations.py): tube:grant gives its privileges through it.
Grant = Callable[[str, str, str, str], Awaitable[None]]
# Runs a tube's on_task_change callback (tube name, task, what changed), given by the Lua layer.
TaskChanged = Callable[[str, list[Any], str], Awaitable[None]]
MAX_PENDING_CHANGES = 100_000  # changes waiting for their callback; past it the oldest are dropped
# what a change of status was, as the module names it to on_task_change
_CHANGES = {
    (None, READY): "put", (None, DELAYED): "put", (READY, TAKEN): "take", (TAKEN, READY): "release",
    (DELAYED, READY): "delay", (TAKEN, DELAYED): "release", (READY, BURIED): "bury", (TAKEN, BURIED): "bury",
    (DELAYED, BURIED): "bury", (BURIED, READY): "kick", (TAKEN, TAKEN): "touch",
}
_ENGINE_COUNTER = {"kick": "dig", "ttl": "ttl.total"}
PREFIX = "queue.tube."
log = logging.getLogger(__name__)
SESSION_IDS = 1 << 48  # queue sessions take as consumers numbered from here, apart from connections
SESSION_SWEEP_S = 1.0  # how often expired sessions are looked for (the module's expiration fiber's pace)
MAX_KEPT_SESSIONS = 100_000  # sessions kept without a connection; past it the oldest one ends


class QueueSession:
    """The module's queue session: the consumer its connections take as, named by a UUID that a
    new connection gives to ``queue.identify`` to become one of them. Once it has no connection
    left it lasts ``queue.cfg{ttr = ...}`` seconds, its takes held, then they are released."""

    __slots__ = ("id", "uuid", "connections", "expires")

    def __init__(self, id: int, uuid_bytes: bytes) -> None:
        self.id = id
        self.uuid = uuid_bytes
        self.connections: set[int] = set()
        self.expires: float | None = None  # trio time, while it has no connection


@cython.cclass
class ModuleTube:
    """What the module keeps of a tube in ``_queue``: its type and its defaults (seconds)."""

    def __init__(self, name: str, space_id: int, options: dict[str, Any]) -> None:
        self.name = name
        self.space_id = space_id
        self.type = options["type"]
        self.ttl = options.get("ttl")
        self.ttr = options.get("ttr")
        self.pri = options.get("pri")
        self.capacity = options.get("capacity", 0)  # limfifottl: most tasks held; 0: no limit


def _lua_or(value: Any, default: Any) -> Any:
    """Lua's ``value or default``: only nil and false give way (0 is true in Lua)."""
    return default if value is None or value is False else value


def _seconds_us(seconds: Any) -> int:
    """The module's ``util.time``: seconds to microseconds, negative as 0."""
    return 0 if seconds < 0 else int(seconds * US)


def _options(opts: Any) -> dict[str, Any]:
    if opts is None or opts == []:  # (an empty Lua table arrives as an empty array)
        return {}
    if not isinstance(opts, dict):
        raise proc_error(f"attempt to index local 'opts' (a {_lua_type(opts)} value)")
    return opts


def _lua_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, dict)):
        return "table"
    return "userdata"


def _number_option(opts: dict[str, Any], name: str) -> Any:
    value = opts.get(name)
    if value is None or value is False or isinstance(value, (int, float)):
        return value
    number = tonumber(value)
    if number is None:
        raise proc_error(f"attempt to compare number with {_lua_type(value)}")
    return number


@cython.cclass
class QueueModule:
    """The procedures, bound to one engine (and to box.queue's, which shares its sessions). An
    extension type (``queue_module.pxd``): its calls on every task are C calls."""

    def __init__(self, engine: QueueEngine, box_queue: BoxQueue, grant: Grant | None = None,
                 task_changed: TaskChanged | None = None) -> None:
        self.engine = engine
        self.box_queue = box_queue
        self._give = grant
        self._task_changed = task_changed
        self._watched: set[str] = set()  # tubes with an on_task_change callback
        # tubes being truncated or dropped: the module's truncate and drop tell the callback nothing
        self._quiet: set[str] = set()
        self._changes: deque[tuple[str, list[Any], str]] = deque(maxlen=MAX_PENDING_CHANGES)
        self._changes_wakeup = trio.Event()
        self.kind = engine.kind_named(QUEUE_MODULE)
        self._tubes: dict[str, ModuleTube] = {}
        # resolved names: the tube they were resolved for and their entry
        self._entries: dict[str, tuple[ModuleTube, ProcedureEntry]] = {}
        self.config: dict[str, Any] = {"in_replicaset": False}
        self._session_ids = itertools.count(SESSION_IDS)
        self._sessions: dict[bytes, QueueSession] = {}  # by UUID
        self._of_connection: dict[int, QueueSession] = {}
        self._kept: OrderedDict[bytes, QueueSession] = OrderedDict()  # without a connection, oldest first
        self._bound: set[int] = set()  # connections whose disconnect is watched

    def register(self, procedures: Procedures) -> None:
        procedures.register("queue.create_tube", self.create_tube, writes=True)
        # What the module's Lua face (boxqueue/lua_box/box.lua) calls: the tube object is made there.
        procedures.register("queue._create_tube", self.make_tube, writes=True)
        procedures.register("queue._has_tube", self.has_tube)
        procedures.register("queue._tube_names", self.tube_names)
        procedures.register("queue._watch", self.watch)
        procedures.register("queue.statistics", self.statistics)  # and box.queue's alias (a space id first)
        procedures.register("queue.stats", self.statistics)
        procedures.register("queue.state", self.state)
        procedures.register("queue.cfg", self.cfg)
        procedures.register("queue.identify", self.identify, writes=True)
        # Asked before the other resolvers: its names are called on every task, and it answers
        # only for the module's tubes (a Lua global table named ``queue`` cannot shadow them).
        procedures.add_resolver(self._resolve, first=True)

    async def run(self) -> None:
        """Releases the takes of sessions left without a connection past their ttr, and runs
        the tubes' on_task_change callbacks."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(python_root, self._deliver_changes)
            await self._sweep_sessions()

    async def _sweep_sessions(self) -> None:
        while True:
            await trio.sleep(SESSION_SWEEP_S)
            now = trio.current_time()
            for session in [s for s in self._kept.values() if s.expires is not None and s.expires <= now]:
                await self._end(session)

    # -- on_task_change --------------------------------------------------------------------------

    def watch(self, ctx: CallContext, name: Any = None, on: Any = True) -> list[Any]:
        """The Lua layer says the tube has (or no longer has) an on_task_change callback."""
        if isinstance(name, str):
            if on:
                self._watched.add(name)
            else:
                self._watched.discard(name)
            self._hook_while_watched()
        return []

    def _hook_while_watched(self) -> None:
        """The engine's change hook is ours only while a tube has a callback: every change of
        every task pays for each hook."""
        hooked = self._changed in self.engine.hooks
        if self._watched and not hooked:
            self.engine.hooks.append(self._changed)
        elif not self._watched and hooked:
            self.engine.hooks.remove(self._changed)

    def _changed(self, space_id: int, tube: str, task_id: str, old: str | None, new: str | None,
                 raw: bytes | None) -> None:
        """The engine's hook: a durable change of a watched tube's task, queued for its callback
        (the module calls it within the change; here it runs once the change is durable)."""
        if tube not in self._watched or self._task_changed is None or (new is None and tube in self._quiet):
            return
        mt = self.tube_named(tube)
        if mt is None or mt.space_id != space_id:
            return
        if raw is not None:
            fields = unpack(module_task(raw))
        else:  # a deleted task: the hook does not carry its data
            fields = [int(task_id) if task_id.isascii() and task_id.isdigit() else task_id, STATUS[DONE], None]
        what = "delete" if new is None else _CHANGES.get((old, new), "change")
        if len(self._changes) == self._changes.maxlen:
            log.warning("on_task_change: %d changes wait for their callbacks; the oldest is dropped",
                        len(self._changes))
        self._changes.append((tube, fields, what))
        self._changes_wakeup.set()

    async def _deliver_changes(self) -> None:
        while True:
            await self._changes_wakeup.wait()
            self._changes_wakeup = trio.Event()
            while self._changes:
                tube, task, what = self._changes.popleft()
                if tube not in self._watched and what != "dropped":
                    continue
                if self._task_changed is None:
                    continue
                try:
                    await self._task_changed(tube, task, what)
                except Exception as exc:
                    log.warning("on_task_change of tube %r failed: %s", tube, exc)

    # -- sessions --------------------------------------------------------------------------------

    def _session(self, ctx: CallContext) -> QueueSession:
        """The caller's queue session, made at its first need (as the module's identify does)."""
        session = self._of_connection.get(ctx.session_id)
        if session is None:
            session = QueueSession(next(self._session_ids), uuid.uuid4().bytes)
            self._sessions[session.uuid] = session
            self._join(ctx, session)
        return session

    def _join(self, ctx: CallContext, session: QueueSession) -> None:
        conn = ctx.session_id
        self._of_connection[conn] = session
        session.connections.add(conn)
        session.expires = None
        self._kept.pop(session.uuid, None)
        if conn not in self._bound:
            self._bound.add(conn)

            async def disconnected() -> None:
                self._bound.discard(conn)
                await self._leave(conn)

            ctx.on_disconnect(disconnected)

    async def _leave(self, conn: int) -> None:
        """A connection leaves its session; the last one to leave ends it now (ttr 0) or
        leaves it to expire."""
        session = self._of_connection.pop(conn, None)
        if session is None:
            return
        session.connections.discard(conn)
        if session.connections:
            return
        ttr = self.config.get("ttr") or 0
        if ttr > 0:
            self._keep(session, ttr)
            if len(self._kept) > MAX_KEPT_SESSIONS:
                await self._end(next(iter(self._kept.values())))
        else:
            await self._end(session)

    def _keep(self, session: QueueSession, ttr: float) -> None:
        """The session has no connection left: it lasts ``ttr`` seconds more (swept at once with
        0), at most :data:`MAX_KEPT_SESSIONS` of them (a client that connects, identifies and leaves
        over and over must not grow memory)."""
        session.expires = trio.current_time() + ttr
        self._kept[session.uuid] = session

    async def _end(self, session: QueueSession) -> None:
        self._kept.pop(session.uuid, None)
        if self._sessions.get(session.uuid) is session:
            del self._sessions[session.uuid]
        try:
            await self.engine.release_consumer(session.id)
        except (BoxError, StorageError) as exc:
            # No write now (a full disk, a replica set's leader that no longer leads): the takes
            # stay taken; the sweep tries again (and a new leader releases them as a restart does).
            log.warning("the takes of a queue session could not be released (%s); trying again in %g s",
                        exc, SESSION_SWEEP_S)
            self._keep(session, SESSION_SWEEP_S)

    def identify(self, ctx: CallContext, session_uuid: Any = None) -> list[Any]:
        """The caller's session UUID (16 bytes, as a string the way Lua's are); with a UUID,
        the caller joins that session, which must exist."""
        if session_uuid is None:
            return [_lua_string(self._session(ctx).uuid)]
        # (a msgpack string of bytes that are not UTF-8 is decoded with surrogate escapes)
        raw = session_uuid.encode("utf-8", "surrogateescape") if isinstance(session_uuid, str) else session_uuid
        if not isinstance(raw, bytes) or len(raw) != 16:
            raise proc_error("Invalid UUID format.")
        session = self._sessions.get(raw)
        if session is None:
            # (Tarantool's binary UUIDs hold their first three fields little-endian)
            raise proc_error(f"The UUID {uuid.UUID(bytes_le=raw)} is unknown.")
        current = self._of_connection.get(ctx.session_id)
        if current is not session:
            if current is not None:
                current.connections.discard(ctx.session_id)
                if not current.connections:
                    self._keep(current, self.config.get("ttr") or 0)
            self._join(ctx, session)
        session.expires = None
        return [_lua_string(session.uuid)]

    # -- tubes -----------------------------------------------------------------------------------

    def tube_named(self, name: str) -> ModuleTube | None:
        """The module's tube ``name``, from the engine's records (kept once seen)."""
        known = self._tubes.get(name)
        space = self.engine.catalog.by_name.get(name)
        if known is not None and space is not None and space.id == known.space_id:
            return known
        self._tubes.pop(name, None)
        if space is None:
            return None
        tube = self.engine.existing_tube(space.id, name)
        options = None if tube is None else tube.options
        if tube is None or not options or options.get("type") not in TYPES or tube.kind.name != QUEUE_MODULE:
            return None
        found = self._tubes[name] = ModuleTube(name, space.id, options)
        return found

    @cython.locals(entries=dict, tubes=dict, cached=tuple)
    def _resolve(self, name: str) -> ProcedureEntry | None:
        """``queue.tube.<tube>:<method>`` for the tubes that exist."""
        entries = self._entries
        cached = entries.get(name)
        if cached is not None and not self.box_queue.standby:
            mt, entry = cached  # (what the first call of this name resolved, while its tube is the same)
            tubes = self._tubes
            space = self.engine.catalog.by_name.get(mt.name)
            if tubes.get(mt.name) is mt and space is not None and space.id == mt.space_id:
                return entry
        if not name.startswith(PREFIX):
            return None
        tube_name, _, method = name[len(PREFIX):].rpartition(":")
        if method not in METHODS:
            return None
        if self.box_queue.standby:  # a follower: the module's methods answer nil on a replica
            if self._stored_options(tube_name) is None:
                return None
            return make_entry(name, _waiting, writes=METHODS[method])
        found = self.tube_named(tube_name)
        if found is None:
            return None
        cached = entries.get(name)
        if cached is None or cached[0] is not found:
            fn = functools.partial(getattr(self, "_" + method), tube_name)
            cached = entries[name] = (found, make_entry(name, fn, writes=METHODS[method]))
        return cached[1]

    def _stored_options(self, name: str) -> dict[str, Any] | None:
        """A module tube's record read from LMDB (a follower's engine stands by, its tubes not in
        memory); None if ``name`` is no module tube."""
        by_name = self.engine.catalog.by_name
        records, space = by_name.get(TUBE_RECORDS), by_name.get(name)
        if records is None or space is None or records.primary is None:
            return None
        raw = records.get(0, [space.id, name])
        options = None if raw is None else decode_tuple(raw)[2]
        return options if isinstance(options, dict) and options.get("type") in TYPES else None

    def _stored_stats(self, name: str) -> dict[str, Any]:
        """A follower's statistics of a module tube: its tasks counted in LMDB; the counters of
        calls belong to the process that served them (the module's are kept in memory too)."""
        tasks = dict.fromkeys((state for state, _s in TASK_STATES), 0)
        space = self.engine.catalog.by_name[name]
        if space.primary is not None:
            for raw in space.select(0, 0, [], 0, 1 << 62):
                fields = decode_tuple(raw)
                if fields[F_TUBE] == name:
                    for state, status in TASK_STATES:
                        if fields[F_STATUS] == status:
                            tasks[state] += 1
        tasks["total"] = sum(tasks.values())
        return {"tasks": tasks, "calls": dict.fromkeys(CALL_COUNTERS, 0)}

    def _tube(self, name: str) -> ModuleTube:
        tube = self.tube_named(name)
        if tube is None:  # dropped since the call was resolved
            raise BoxError(ER.NO_SUCH_PROC, f"queue.tube.{name}")
        return tube

    # -- answers ---------------------------------------------------------------------------------

    def _freeing(self, mt: ModuleTube, status: str | None = None) -> Callable[[bytes], list[Any]]:
        """The answer of a change that may free a sub-queue (an ack, delete or bury of a taken
        task): in a tube of sub-queues a waiting take may now have a task."""
        if mt.type not in SUBQUEUES:
            return _answered_done if status == DONE else _answered_any

        def answered(raw: bytes) -> list[Any]:
            tube = self.engine.existing_tube(mt.space_id, mt.name)
            if tube is not None:
                tube.wake_one_consumer()
            return [module_task(raw, status)]

        return answered

    def _stored_task(self, mt: ModuleTube, key: str) -> Task | None:
        tube = self.engine.existing_tube(mt.space_id, mt.name)
        return None if tube is None else tube.tasks.get(key)

    def _task(self, mt: ModuleTube, task_id: Any) -> Task:
        """The task, else the module's peek error."""
        task = self._stored_task(mt, _task_key(task_id, 0))
        if task is None:
            raise proc_error(f"Task {_lua_tostring(task_id)} not found")
        return task

    def _check_taken(self, mt: ModuleTube, task_id: Any, ctx: CallContext) -> Task:
        """The task, taken by the caller's queue session, else the module's error."""
        task = self._stored_task(mt, _task_key(task_id, 1))
        session = self._of_connection.get(ctx.session_id)
        if task is None or task.status != TAKEN or session is None or task.cid != session.id:
            raise proc_error("Task was not taken")
        return task

    # -- queue.* ---------------------------------------------------------------------------------

    async def create_tube(self, ctx: CallContext, name: Any = None, type: Any = None, opts: Any = None) -> list[Any]:
        """Creates the tube; over CALL the module then fails to encode the tube object it returns
        (it holds functions), and so does this: the tube exists, the caller hears ER_PROC_LUA."""
        await self.make_tube(ctx, name, type, opts)
        mt = self.tube_named(name)
        raise _unencodable(type if mt is None else mt.type)

    def has_tube(self, ctx: CallContext, name: Any = None) -> list[Any]:
        return [isinstance(name, str) and self.tube_named(name) is not None]

    def tube_names(self, ctx: CallContext) -> list[Any]:
        return [sorted(
            t.name for qs in self.engine.owned_spaces(QUEUE_MODULE) for t in self.engine.stored_tubes(qs.id)
            if self.tube_named(t.name) is not None
        )]

    async def make_tube(self, ctx: CallContext, name: Any = None, type: Any = None, opts: Any = None) -> list[Any]:
        """The tube ``name`` of ``type``, created unless ``if_not_exists`` finds it."""
        options = dict(_options(opts))
        if not isinstance(name, str):
            raise proc_error("bad argument #1 to 'format' (string expected, got " + _lua_type(name) + ")")
        if_not_exists = options.get("if_not_exists") is True
        if if_not_exists and self.tube_named(name) is not None:
            return [True]
        if type not in TYPES:
            raise proc_error(f"Unknown tube type {_lua_tostring(type)}")
        if name in self.engine.catalog.by_name and not if_not_exists:
            raise proc_error(f"Space '{name}' already exists")
        record: dict[str, Any] = {"type": type}
        if options.get("temporary"):
            record["temporary"] = True
        if type in TIMED:
            ttl = _lua_or(_number_option(options, "ttl"), MAX_TIMEOUT)
            record["ttl"] = ttl
            record["ttr"] = _lua_or(_number_option(options, "ttr"), ttl)
            record["pri"] = _lua_or(_number_option(options, "pri"), 0)
        if type == "limfifottl":
            record["capacity"] = _lua_or(_number_option(options, "capacity"), 0)
        if type in SUBQUEUES:
            record["subqueues"] = True
        queue_space = await self.engine.own_space(name, self.kind)
        await self.engine.create_tube(queue_space.id, name, record, self.kind)
        return [True]

    def statistics(self, ctx: CallContext, name: Any = None, tube: Any = None) -> list[Any]:
        """The module's statistics of one tube or of all; a space number first is box.queue's."""
        if isinstance(name, (int, float)) and not isinstance(name, bool):
            return self.box_queue.statistics(ctx, name, tube)
        if self.box_queue.standby:
            names = [name] if name is not None else self._stored_names()
            if not all(isinstance(n, str) and self._stored_options(n) is not None for n in names):
                raise proc_error("attempt to index field '?' (a nil value)")
            if name is not None:
                return [self._stored_stats(name)]
            return [{n: self._stored_stats(n) for n in names}]
        if name is not None:
            mt = self.tube_named(name) if isinstance(name, str) else None
            if mt is None:
                raise proc_error("attempt to index field '?' (a nil value)")
            return [self._stats(mt)]
        names = self.tube_names(ctx)[0]
        return [{n: self._stats(mt) for n in names if (mt := self.tube_named(n)) is not None}]

    def _stats(self, mt: ModuleTube) -> dict[str, Any]:
        tube = self.engine.existing_tube(mt.space_id, mt.name)
        stats = {} if tube is None else tube.stats
        counts = {} if tube is None else tube.counts
        tasks = {name: counts.get(status, 0) for name, status in TASK_STATES}
        tasks["total"] = sum(tasks.values())
        # the engine's counters under the module's names: a kick is the engine's dig, and a task
        # whose ttl ends is a delete too
        calls = {name: stats.get(_ENGINE_COUNTER.get(name, name), 0) for name in CALL_COUNTERS}
        calls["delete"] += calls["ttl"]
        tasks["done"] = calls["ack"] + calls["delete"]
        return {"tasks": tasks, "calls": calls}

    def _stored_names(self) -> list[str]:
        """The module tubes recorded in LMDB (a follower's)."""
        records = self.engine.catalog.by_name.get(TUBE_RECORDS)
        if records is None or records.primary is None:
            return []
        spaces = self.engine.catalog.spaces
        names = []
        for raw in records.select(0, 0, [], 0, 1 << 62):
            sid, name, options = decode_tuple(raw)[:3]
            space = spaces.get(sid)
            if space is not None and space.name == name and isinstance(options, dict) and options.get("type") in TYPES:
                names.append(name)
        return sorted(names)

    def state(self, ctx: CallContext) -> list[Any]:
        return ["WAITING" if self.box_queue.standby else "RUNNING"]

    def cfg(self, ctx: CallContext, opts: Any = None) -> list[Any]:
        options = dict(_options(opts))
        options.setdefault("in_replicaset", False)
        for key, value in options.items():
            if key == "in_replicaset":
                if not isinstance(value, bool):
                    raise proc_error(f"Invalid value of in_replicaset: {_lua_tostring(value)}")
            elif key == "ttr":
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                          or value != value):
                    # (the module takes anything and fails later, when a session ends)
                    raise proc_error(f"Invalid value of ttr: {_lua_tostring(value)}")
            else:
                raise proc_error(f"Unknown option {_lua_tostring(key)}")
        self.config.update(options)
        return []

    # -- queue.tube.<name>:<method> --------------------------------------------------------------

    def _put(self, name: str, ctx: CallContext, data: Any = None, opts: Any = None) -> Any:
        mt = self._tube(name)
        options = _options(opts)
        if mt.type == "limfifottl" and mt.capacity and self._held(mt) >= mt.capacity:
            timeout = _number_option(options, "timeout")
            return self._put_when_room(mt, ctx, data, options, _lua_or(timeout, 0))
        return self._put_now(mt, data, options)

    def _held(self, mt: ModuleTube) -> int:
        """Tasks held, and puts not durable yet (each one write in flight)."""
        tube = self.engine.existing_tube(mt.space_id, mt.name)
        return 0 if tube is None else len(tube.tasks) + tube.pending

    async def _put_when_room(self, mt: ModuleTube, ctx: CallContext, data: Any, options: dict[str, Any],
                             timeout: float) -> list[Any]:
        """limfifottl's put into a full tube: it looks again every 10 ms until there is room or
        ``timeout`` seconds have passed (then it answers nil), as the module does."""
        started = trio.current_time()
        while self._held(mt) >= mt.capacity:
            if trio.current_time() - started > timeout:
                return [None]
            await trio.sleep(PUT_POLL_S)
            mt = self._tube(mt.name)
        return await self._put_now(mt, data, options)

    def _put_now(self, mt: ModuleTube, data: Any, options: dict[str, Any]) -> Later[list[Any]]:
        name = mt.name
        if data is None:
            raise BoxError(ER.FIELD_MISSING, 3 if mt.type not in SUBQUEUES else 4 if mt.type == "utube" else 9)
        delay_us, ttl_us, ttr_us, pri = 0, None, None, 0
        if mt.type in TIMED:
            ttl = _lua_or(_number_option(options, "ttl"), mt.ttl)
            ttr = _lua_or(_number_option(options, "ttr"), mt.ttr)
            pri = _lua_or(_number_option(options, "pri"), _lua_or(mt.pri, 0))
            delay = _number_option(options, "delay")
            if type(pri) is not int or pri < 0:  # the module's space keeps pri unsigned
                raise BoxError(ER.FIELD_TYPE, 6, "unsigned")
            ttl_us, ttr_us = _seconds_us(ttl), _seconds_us(ttr)
            if delay is not None and delay is not False and delay > 0:
                delay_us = _seconds_us(delay)
        attrs = None
        if mt.type in SUBQUEUES:  # msgpack's nil is box.NULL to the module: tostring gives "NULL"
            attrs = {"utube": "NULL" if "utube" in options and options["utube"] is None
                     else _lua_tostring(options.get("utube"))}
        return self.engine.put(
            mt.space_id, name, delay=delay_us, ttl=ttl_us, ttr=ttr_us, pri=pri, data=[data], counter="put",
            kind=self.kind, attrs=attrs,
        ).map(_answered_any)

    def _take(self, name: str, ctx: CallContext, timeout: Any = None) -> Any:
        mt = self._tube(name)
        if timeout is None:
            seconds = TAKE_FOREVER
        else:
            number = tonumber(timeout)
            if number is None:
                raise proc_error(f"attempt to compare number with {_lua_type(timeout)}")
            seconds = 0.0 if number < 0 else min(float(number), TAKE_FOREVER)
        consumer = self._session(ctx).id
        taking = self.engine.take(mt.space_id, name, consumer, seconds)

        if isinstance(taking, Later):
            return taking.map(_taken)
        return self.box_queue.waiting(consumer, taking, _taken)

    def _ack(self, name: str, ctx: CallContext, task_id: Any = None) -> Later[list[Any]]:
        mt = self._tube(name)
        task = self._check_taken(mt, task_id, ctx)
        return self.engine.ack(mt.space_id, task.id, task.cid).map(self._freeing(mt, DONE))

    def _release(self, name: str, ctx: CallContext, task_id: Any = None, opts: Any = None) -> Later[list[Any]]:
        mt = self._tube(name)
        task = self._check_taken(mt, task_id, ctx)
        options = _options(opts)
        delay = _number_option(options, "delay") if mt.type in TIMED else None
        if delay is not None and delay is not False and delay > 0:
            delay_us = _seconds_us(delay)
            return self.engine.release(mt.space_id, task.id, task.cid, delay_us, None,
                                       ttl_us=task.ttl + delay_us).map(self._freeing(mt))
        return self.engine.release(mt.space_id, task.id, task.cid, 0, None).map(_answered_any)

    def _peek(self, name: str, ctx: CallContext, task_id: Any = None) -> list[Any]:
        mt = self._tube(name)
        task = self._task(mt, task_id)
        return [module_task(self.engine.peek(mt.space_id, task.id))]

    def _bury(self, name: str, ctx: CallContext, task_id: Any = None) -> Any:
        mt = self._tube(name)
        task = self._task(mt, task_id)
        if task.status == BURIED:
            return [module_task(self.engine.peek(mt.space_id, task.id))]
        return self.engine.bury_any(mt.space_id, task.id).map(self._freeing(mt))

    async def _kick(self, name: str, ctx: CallContext, count: Any = None) -> list[Any]:
        mt = self._tube(name)
        number = 1 if count is None else tonumber(count)
        if number is None:
            raise proc_error("'for' limit must be a number")
        if number <= 0:
            return [number]
        wanted = math.floor(number)
        kicked = await self.engine.kick(mt.space_id, name, wanted)
        return [number if kicked == wanted else kicked]

    def _delete(self, name: str, ctx: CallContext, task_id: Any = None) -> Later[list[Any]]:
        mt = self._tube(name)
        task = self._task(mt, task_id)
        return self.engine.delete(mt.space_id, task.id).map(self._freeing(mt, DONE))

    def _touch(self, name: str, ctx: CallContext, task_id: Any = None, delta: Any = None) -> Any:
        mt = self._tube(name)
        if delta is None:
            return []
        number = tonumber(delta)
        if number is None:
            raise proc_error(f"attempt to compare {_lua_type(delta)} with number")
        if number <= 0:
            return []
        key = self._check_taken(mt, task_id, ctx).id
        tube = self.engine.existing_tube(mt.space_id, name)
        if tube is not None:
            tube.count("touch")  # the module's tube counts it before its driver acts
        if mt.type not in TIMED:
            raise proc_error(f"{mt.type} queue does not support touch")
        delta_us = None if number > MAX_TIMEOUT else int(number * US)
        return self.engine.prolong(mt.space_id, key, delta_us).map(_answered_any)

    async def _truncate(self, name: str, ctx: CallContext) -> list[Any]:
        mt = self._tube(name)
        self._quiet.add(name)
        try:
            await self.engine.truncate(mt.space_id, name)
        finally:
            self._quiet.discard(name)
        return []

    async def _release_all(self, name: str, ctx: CallContext) -> list[Any]:
        mt = self._tube(name)
        await self.engine.release_taken(mt.space_id, name)
        return []

    async def _grant(self, name: str, ctx: CallContext, user: Any = None, args: Any = None) -> list[Any]:
        """Read and write on the tube's space; with ``call``, execute on the module's functions
        and the tube's methods; with ``truncate``, on its truncate (the module's grants)."""
        mt = self._tube(name)
        options = _options(args)
        if self._give is None:
            raise BoxError(ER.UNSUPPORTED, "boxqueue", "tube:grant without users")
        await self._give(user, "read,write", "space", mt.name)
        functions: list[str] = []
        if options.get("call"):
            prefix = options.get("prefix") or "queue.tube"
            functions += ["queue.identify", "queue.statistics", *(f"{prefix}.{name}:{m}" for m in CALLED)]
        if options.get("truncate"):
            functions.append(f"{options.get('prefix') or 'queue.tube'}.{name}:truncate")
        for function in functions:
            await self._give(user, "execute", "function", function)
        return []

    async def _drop(self, name: str, ctx: CallContext) -> list[Any]:
        mt = self._tube(name)
        tube = self.engine.existing_tube(mt.space_id, name)
        if tube is not None and tube.waiters:
            raise proc_error("There are consumers connected the tube")
        if tube is not None and any(t.status == TAKEN for t in tube.tasks.values()):
            raise proc_error("There are taken tasks in the tube")
        self._quiet.add(name)  # the tasks a drop deletes are not changes the callback hears of
        try:
            await self.engine.drop_owned_space(mt.space_id)
        finally:
            self._quiet.discard(name)
        self._tubes.pop(name, None)
        if name in self._watched:  # the Lua layer forgets the tube's callback too
            self._watched.discard(name)
            self._hook_while_watched()
            self._changes.append((name, [], "dropped"))
            self._changes_wakeup.set()
        for entry in [n for n in self._entries if n.startswith(f"{PREFIX}{name}:")]:
            del self._entries[entry]
        return [True]


# -- the module's task, from a stored task tuple ------------------------------------------------

_PACKED_LETTER = cython.declare(dict, {status: pack(letter) for status, letter in STATUS.items()})
_LETTER_OF_PACKED = cython.declare(dict, _PACKED_STATUS)
_DATA_AT = cython.declare(cython.Py_ssize_t, TUBE_LAYOUT.data_at)  # the first data field


@cython.locals(count=cython.Py_ssize_t, first=cython.Py_ssize_t, p=cython.Py_ssize_t, end=cython.Py_ssize_t,
               i=cython.Py_ssize_t, id_end=cython.Py_ssize_t, status_at=cython.Py_ssize_t,
               status_end=cython.Py_ssize_t, data=cython.Py_ssize_t, data_end=cython.Py_ssize_t)
def module_task(raw: bytes, status: str | None = None) -> Raw:
    """The module's task ``[id, status letter, data]`` from a stored task tuple: its first data
    field (a task put by box.queue may have several, or none); ``status``: the letter of that
    status, not the stored one. One walk over the tuple's bytes, checked to its end as
    :func:`msgpack_scan.fields_at` checks them; only a status no letter stands for is decoded."""
    count, first = msgpack_scan.array_start(raw)
    if count < 3:
        raise ValueError("not a msgpack array of a task's fields")
    end = len(raw)
    p = first
    id_end = status_at = status_end = data = data_end = end
    for i in range(count):
        if i == 1:
            id_end = p
        elif i == 2:
            status_at = p
        elif i == 3:
            status_end = p
        elif i == _DATA_AT:
            data = p
        elif i == _DATA_AT + 1:
            data_end = p
        p = msgpack_scan.skip(raw, p, end)
        if p < 0:
            raise ValueError("a malformed msgpack array")
    if p != end:
        raise ValueError("bytes after the msgpack array")
    letter = _PACKED_LETTER[status] if status is not None else _LETTER_OF_PACKED[raw[status_at:status_end]]
    return Raw(b"".join((b"\x93", _module_id(raw[first:id_end]), letter,
                         raw[data:data_end] if data < end else b"\xc0")))


_SMALL_UINTS = cython.declare(tuple, tuple(bytes((n,)) for n in range(0x80)))


@cython.locals(head=cython.int, size=cython.Py_ssize_t, i=cython.Py_ssize_t, digit=cython.int,
               n=cython.ulonglong)
def _module_id(packed: bytes) -> bytes:
    """A stored task id (text) as the module's id: the number its digits write (the engine numbers
    the module's tasks), else the text as it is (a task another API put with an id of its own)."""
    head = packed[0]
    size = len(packed) - 1
    if 0xA1 <= head <= 0xBF and size == head - 0xA0 and size <= 19:  # a short string: digits?
        n = 0
        for i in range(1, size + 1):
            digit = packed[i] - 0x30
            if digit < 0 or digit > 9:
                break
            n = n * 10 + digit
        else:  # every byte a digit: the number (19 digits fit in 64 bits)
            if n < 0x80:
                return _SMALL_UINTS[n]
            if n <= 0xFF:
                return b"\xcc" + bytes((n,))
            if n <= 0xFFFF:
                return b"\xcd" + int(n).to_bytes(2, "big")
            if n <= 0xFFFFFFFF:
                return b"\xce" + int(n).to_bytes(4, "big")
            return b"\xcf" + int(n).to_bytes(8, "big")
    task_id = unpack(packed)
    return pack(int(task_id) if task_id.isascii() and task_id.isdigit() else task_id)


def _answered_any(raw: bytes) -> list[Any]:
    return [module_task(raw)]


def _answered_done(raw: bytes) -> list[Any]:
    return [module_task(raw, DONE)]


def _taken(raw: bytes | None) -> list[Any]:
    return [] if raw is None else [module_task(raw)]


def _task_key(task_id: Any, part: int) -> str:
    """A task id as the engine stores it; what the module's unsigned index would refuse is
    refused with its error."""
    if type(task_id) is int and task_id >= 0:
        return str(task_id)
    if type(task_id) is float and task_id >= 0 and task_id == int(task_id):
        return str(int(task_id))
    raise BoxError(ER.KEY_PART_TYPE, part, "unsigned")


def _lua_string(value: bytes) -> Raw:
    """Bytes sent as a msgpack string, as Tarantool sends a Lua string (whatever its bytes)."""
    n = len(value)
    header = bytes([0xA0 | n]) if n < 32 else b"\xd9" + bytes([n])
    return Raw(header + value)


def _waiting(ctx: CallContext, *args: Any) -> list[Any]:
    """A tube method on a follower: the module's answer on a replica (its queue is WAITING)."""
    return [None]


def _unencodable(tube_type: str) -> BoxError:
    """What the module's CALL of create_tube answers: its tube object holds functions, and
    fifottl's and utubettl's their fiber first, which msgpack cannot encode."""
    return proc_error("unsupported Lua type 'userdata'" if tube_type in ("fifottl", "utubettl") else
                      "unsupported Lua type 'function'")


def _lua_tostring(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return str(value)


def register(procedures: Procedures, engine: QueueEngine, box_queue: BoxQueue, grant: Grant | None = None,
             task_changed: TaskChanged | None = None) -> QueueModule:
    module = QueueModule(engine, box_queue, grant, task_changed)
    module.register(procedures)
    return module
