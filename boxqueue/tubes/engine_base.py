"""The engine's state and its one write path: spaces, tubes, lookups, memory, changes.

:class:`EngineBase` holds what every part of the engine shares (:mod:`boxqueue.tubes.engine` assembles
them): the queue spaces and tubes, where each task is, who holds what, and the three ways a
change is made — :meth:`EngineBase._change` (one task), :meth:`EngineBase._delete` and
:meth:`EngineBase._batch` (several tasks of a tube, inserts and records, one commit). Each applies
the change in memory first, with the counters that count it, submits one write to the group
committer, undoes both if the write fails, and runs the change hooks once it is durable.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import cython
import lmdb
import trio

import boxqueue.tubes.transitions as tr
from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces import msgpack_scan
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.later import Later
from boxqueue.spaces.msgpack_values import pack, pack_flat
from boxqueue.spaces.ownership import Owner
from boxqueue.spaces.space import REPLACE, Space
from boxqueue.tubes.kinds import BOX_QUEUE_KIND, TubeKind
from boxqueue.tubes.task import (
    QUEUE15,
    READY,
    TAKEN,
    TUBE_FORMAT,
    TUBE_KEY,
    Layout,
    Task,
    encode_task,
)
from boxqueue.tubes.tube import (
    CLAIM_HOLDERS,
    PUTS,
    TALLIES,
    Claim,
    Remains,
    Tube,
    is_claim_holder,
    tally_of,
)

if cython.compiled:  # the clock read in C (a task's creation time, a call a task)
    from cython.cimports.posix.time import CLOCK_REALTIME, clock_gettime, timespec

log = logging.getLogger(__name__)

IDLE_WAIT = 3600.0
RANDOM_POOL = 512  # ids whose random bits are drawn at once
# What memory keeps of tubes forgotten with nothing in them (box.queue's counters, which 1.5 shows
# for the life of the process, and the metrics' tallies): for the most recently used this many.
FORGOTTEN_KEPT = 10_000
MAX_TIME_US = tr.MAX_TIME_US

# (space id, tube, task id, status before or None, status after or None, stored tuple or None)
ChangeHook = Callable[[int, str, str, str | None, str | None, bytes | None], None]

# The layout of a user's queue space (D12): index parts by field number.
_LAYOUT = ((0,), (1, 2, 4, 5), (1, 3))
_UNIQUE_LAYOUT = (1, 2, 12)

ENGINE_OWNER = Owner("the tube engine", indexes_in_memory=True)
BOX_QUEUE_OWNER = Owner("box.queue", schema_open=True, indexes_in_memory=True)

# The engine's own records: which spaces it owns, tubes that exist on their own, live claims, and
# the chunks a Spark stream's sink has written (boxqueue/tubes/streams.py).
OWNED_SPACES = "tube_spaces"
TUBE_RECORDS = "tube_records"
CLAIM_RECORDS = "tube_claims"
SINK_MARKS = "stream_marks"
RECORD_KEYS = {
    OWNED_SPACES: [[0, "string"]],
    TUBE_RECORDS: [[0, "unsigned"], [1, "string"]],
    CLAIM_RECORDS: [[0, "unsigned"], [1, "string"], [2, "string"]],
    SINK_MARKS: [[0, "string"], [1, "unsigned"], [2, "unsigned"], [3, "unsigned"], [4, "unsigned"]],
}

# A version 7 id's marks (RFC 9562): its version in the high half, its variant in the low one.
_UUID7_VERSION = cython.declare(cython.ulonglong, 0x7 << 12)
_UUID7_VARIANT = cython.declare(cython.ulonglong, 0x2 << 62)
_HEX_DIGITS = cython.declare(bytes, b"0123456789abcdef")

Mutate = tr.Mutate
Tail = tuple[int, bytes]  # fields past the header, as msgpack: how many, and their bytes


def proc_error(text: str) -> BoxError:
    """The queue's errors reach the client as ER_PROC_LUA with the original texts (D8)."""
    return BoxError(ER.PROC_LUA, message=text)


def now_us() -> int:
    return time.time_ns() // 1000


@cython.cfunc
@cython.inline
def _clock_us() -> cython.longlong:
    """:func:`now_us`, read in C when compiled."""
    if not cython.compiled:
        return time.time_ns() // 1000
    ts = cython.declare(timespec)
    clock_gettime(CLOCK_REALTIME, cython.address(ts))
    return ts.tv_sec * 1_000_000 + ts.tv_nsec // 1000


@cython.cfunc
def _place(where: dict, task_id: str, tube: Tube) -> cython.void:
    """Note in a space's map of task ids that ``tube`` holds ``task_id`` (a list when tubes of the
    space share the id)."""
    other = where.setdefault(task_id, tube)
    if other is tube:
        return
    if type(other) is list:
        other.append(tube)
    else:
        where[task_id] = [other, tube]


@cython.cfunc
def _unplace(where: dict, task_id: str, tube: Tube) -> cython.void:
    """Undo :func:`_place`."""
    other = where.get(task_id)
    if other is tube:
        del where[task_id]
    elif type(other) is list:
        other.remove(tube)
        if len(other) == 1:
            where[task_id] = other[0]


@cython.cfunc
@cython.locals(task=Task)
def _unhold(held_by_session: dict, task: Task) -> cython.void:
    """``task``, taken by a session, is no longer among the tasks that session holds."""
    held = held_by_session.get(task.cid)
    if held is not None:
        held.pop(task, None)
        if not held:
            del held_by_session[task.cid]


def is_queue_space(space: Space) -> bool:
    """A space with the 1.5 layout's indexes (D12)."""
    parts = tuple(space.indexes[i].fieldnos for i in sorted(space.indexes))
    return parts[:3] == _LAYOUT and (len(parts) == 3 or (len(parts) == 4 and parts[3] == _UNIQUE_LAYOUT))


def has_tube_layout(space: Space) -> bool:
    fmt = tuple((f.name, f.type) for f in space.defn.format)
    return (
        fmt[: len(TUBE_FORMAT)] == tuple((f.name, f.type) for f in TUBE_FORMAT)
        and space.primary is not None
        and space.primary.fieldnos == tuple(p[0] for p in TUBE_KEY)
    )


def pack_tail(count: int, values: Iterable[Any]) -> Tail:
    return count, b"".join(pack(v) for v in values)


@cython.cclass
class QueueSpace:
    """A space holding tasks: its layout and the kind of its tubes."""

    __slots__ = ("space", "layout", "kind", "owned")

    def __init__(self, space: Space, layout: Layout, kind: TubeKind, owned: bool) -> None:
        self.space = space
        self.layout = layout
        self.kind = kind
        self.owned = owned

    @property
    def id(self) -> int:
        return self.space.id


class BatchError(RuntimeError):
    """A write of several tasks failed part-way; the committer rolls the batch back."""


class EngineBase:
    """All tubes of all queue spaces of one server: the state the engine's parts share."""

    if TYPE_CHECKING:  # what one part calls of another (QueueEngine composes them all)
        def tail(self, queue_space: QueueSpace, data: list[Any],
                 attachments: dict[str, Any] | None = None) -> Tail: ...

        def tail_values(self, queue_space: QueueSpace, data: list[Any],
                        attachments: dict[str, Any] | None = None) -> list[Any]: ...

        def free_tasks(self, tube: Tube, limit: int, low: float = ..., high: float = ...) -> list[Task]: ...

        def _adopt(
            self, queue_space: QueueSpace, tube: Tube, kind: TubeKind | None
        ) -> tuple[list[Callable[[lmdb.Transaction], Any]], dict[str, Any] | None]: ...

        async def _enforce_limit(self, queue_space: QueueSpace, tube: Tube) -> None: ...

    def __init__(self, catalog: Catalog, kinds: dict[str, TubeKind] | None = None) -> None:
        self.catalog = catalog
        self.committer = catalog.committer
        self.kinds = dict(kinds or {})
        self.tubes: dict[tuple[int, str], Tube] = {}
        # space id -> task id -> its tube (a list if tubes of the space share the id): one dict a
        # space rather than (space, id) keys, which cost a tuple a task in memory.
        self._where: dict[int, dict[str, Tube | list[Tube]]] = {}
        self._held: dict[int, dict[Task, Tube]] = {}  # session -> the tasks it has taken
        self._owned: dict[int, QueueSpace] = {}
        self._checked: dict[int, tuple[Space, int, QueueSpace | None]] = {}  # D12 checks per schema
        self._known: dict[Any, tuple[int, QueueSpace]] = {}  # queue_space's answers per schema
        self._records: dict[str, Space] = {}
        self._last_created = 0
        self._nursery: trio.Nursery | None = None
        self._recovered = False
        self.hooks: list[ChangeHook] = []
        self._random = random.Random()  # task ids: seeded from os.urandom
        self._random_pool = b""  # ... its bytes, drawn ahead (_random_bits)
        self._random_at = 0
        self._upserting: dict[tuple[int, str, str], trio.Event] = {}
        self.tallies: dict[int, list[int]] = {}  # per space: the sum of its tubes' tallies, never reset
        # (space id, tube) -> the counters of a forgotten tube, oldest first (bounded)
        self.forgotten: OrderedDict[tuple[int, str], Remains] = OrderedDict()

    # -- lookups -------------------------------------------------------------------------------

    def queue_spaces(self) -> dict[int, QueueSpace]:
        """Every space holding tasks: the user's queue spaces and the engine's own."""
        found = {}
        for sid, space in self.catalog.spaces.items():
            queue_space = self._owned.get(sid)
            if queue_space is None and is_queue_space(space):
                queue_space = QueueSpace(space, QUEUE15, self.kinds.get("box.queue", BOX_QUEUE_KIND), owned=False)
            if queue_space is not None:
                found[sid] = queue_space
        return found

    def space_owner(self, space: Space) -> Owner | None:
        """The engine's rule for :mod:`boxqueue.spaces.ownership`: its own spaces and record spaces keep
        their data and their definition; box.queue's queue spaces (declared by the user, D12)
        only their data, since the engine holds their tasks in memory."""
        if space.id in self._owned or space.name in RECORD_KEYS:
            return ENGINE_OWNER
        if is_queue_space(space):
            return BOX_QUEUE_OWNER
        return None

    def queue_space(self, space_id: Any) -> QueueSpace:
        """The queue space with this id, else ER_NO_SUCH_SPACE (D12). Every call of every API
        asks, so the answer is kept until the schema changes."""
        known = self._known.get(space_id)
        if known is not None and known[0] == self.catalog.schema_version:
            return known[1]
        queue_space = self._find_queue_space(space_id)
        self._known[space_id] = (self.catalog.schema_version, queue_space)
        return queue_space

    def _find_queue_space(self, space_id: Any) -> QueueSpace:
        owned = self._owned.get(space_id) if type(space_id) is int else None
        if owned is not None and not owned.space.dropped:
            return owned
        space = self.catalog.spaces.get(space_id) if type(space_id) is int else None
        if space is None:
            raise BoxError(ER.NO_SUCH_SPACE, space_id)
        # Whether a space is laid out for the queue only changes with its indexes (DDL).
        known = self._checked.get(space_id)
        if known is None or known[0] is not space or known[1] != self.catalog.schema_version:
            queue_space = None
            if is_queue_space(space):
                queue_space = QueueSpace(space, QUEUE15, self.kinds.get("box.queue", BOX_QUEUE_KIND), owned=False)
            known = self._checked[space_id] = (space, self.catalog.schema_version, queue_space)
        if known[2] is None:
            raise BoxError(ER.NO_SUCH_SPACE, space_id)
        return known[2]

    def space(self, space_id: Any) -> Space:
        return self.queue_space(space_id).space

    def owned_spaces(self, kind_name: str | None = None) -> list[QueueSpace]:
        return [s for s in self._owned.values() if kind_name is None or s.kind.name == kind_name]

    def tube(self, space_id: int, name: str) -> Tube:
        return self._tube(self.queue_space(space_id), name)

    def kind_named(self, name: str) -> TubeKind:
        kind = self.kinds.get(name)
        if kind is None:
            kind = self.kinds[name] = default_kind(name)
        return kind

    def _tube(self, queue_space: QueueSpace, name: str) -> Tube:
        key = (queue_space.id, name)
        tube = self.tubes.get(key)
        if tube is None:
            tube = self.tubes[key] = Tube(queue_space.id, name, queue_space.kind)
            if self.forgotten:
                remains = self.forgotten.pop(key, None)
                if remains is not None:
                    tube.stats, tube.tally = remains.stats, remains.tally
        return tube

    def existing_tube(self, space_id: int, name: str) -> Tube | None:
        return self.tubes.get((space_id, name))

    def find(self, space_id: int, task_id: Any) -> tuple[Tube, Task]:
        """The task with this id in the space (box.queue's calls name no tube)."""
        where = self._where.get(space_id)
        found = where.get(task_id) if where is not None and isinstance(task_id, str) else None
        if found is None:
            raise proc_error("Task not found")
        if isinstance(found, list):
            raise _ambiguous(space_id, task_id, found)
        return found, found.tasks[task_id]

    def get(self, space_id: int, tube_name: str, task_id: str) -> Task | None:
        tube = self.tubes.get((space_id, tube_name))
        return None if tube is None else tube.tasks.get(task_id)

    def owned(self, space_id: int, task_id: Any, consumer: int, verb: str) -> tuple[Tube, Task]:
        """The three checks of the 1.5 module, in its order and with its texts."""
        tube, task = self.find(space_id, task_id)
        if task.status != TAKEN:
            raise proc_error("Task is not taken")
        if task.cid != consumer:
            raise proc_error(f"Only consumer that took the task can it {verb}")
        return tube, task

    def stored(self, queue_space: QueueSpace, task: Task) -> bytes | None:
        """The task's stored tuple, with the header memory has for a task of a listed claim
        (whose stored header still shows it as it was before the claim: see
        :class:`tubes.tube.Claim`)."""
        raw = queue_space.space.get(0, queue_space.layout.key(task))
        if raw is not None and task.status == TAKEN and is_claim_holder(task.cid):
            tube = self.tubes.get((queue_space.id, task.tube))
            claim = None if tube is None else tube.claims.get(task.cid)
            if claim is not None and claim.listed is not None:
                raw = _as_in_memory(raw, task)
        return raw

    @cython.locals(task=Task)
    def stored_of_claim(self, queue_space: QueueSpace, tasks: list[Task], claim: Claim) -> list[bytes]:
        """What :meth:`stored` gives for each of ``tasks``, all held by ``claim``, read in one
        transaction (a task not stored is left out)."""
        layout = queue_space.layout
        raws = queue_space.space.get_many([layout.key(task) for task in tasks])
        if claim.listed is None:
            return [raw for raw in raws if raw is not None]
        return [_as_in_memory(raw, task) for task, raw in zip(tasks, raws, strict=True) if raw is not None]

    # -- memory --------------------------------------------------------------------------------

    @cython.locals(tube=Tube, task=Task)
    def _add(self, tube: Tube, task: Task) -> None:
        task.tube = tube.name  # one string for the tube's tasks (each request decodes its own)
        tube.tasks[task.id] = task
        _place(self._where_in(tube.space_id), task.id, tube)
        self._enter(tube, task)

    def _where_in(self, space_id: int) -> dict[str, Tube | list[Tube]]:
        where = self._where.get(space_id)
        if where is None:
            where = self._where[space_id] = {}
        return where

    @cython.locals(tube=Tube, task=Task)
    def _remove(self, tube: Tube, task: Task) -> None:
        self._leave(tube, task)
        del tube.tasks[task.id]
        if not tube.tasks:
            tube.monitor_wakeup.set()  # its monitor ends, and the tube may be forgotten
        _unplace(self._where[tube.space_id], task.id, tube)

    @cython.locals(tube=Tube, task=Task)
    def _note_loaded(self, queue_space: QueueSpace, tasks: list[Task]) -> None:
        """Recovery, for tasks just read from LMDB: each noted in its space's map of task ids,
        and those left taken by a session in ``_held``. (Done in the order they were read, which
        is the order they lie in memory, before :meth:`_add_all` takes them in creation order:
        at a million tasks this costs half as much as the same lookups made later.)"""
        where = self._where_in(queue_space.id)
        tube = None
        for task in tasks:
            if tube is None or tube.name != task.tube:
                tube = self._tube(queue_space, task.tube)
            _place(where, task.id, tube)
            if task.status == TAKEN and is_session(task.cid):
                self._held.setdefault(task.cid, {})[task] = tube

    @cython.locals(tube=Tube, task=Task)
    def _add_all(self, tube: Tube, tasks: list[Task]) -> None:
        """Recovery: ``tasks`` (noted by :meth:`_note_loaded`), in creation order, into the
        tube's structures; into a tube that holds nothing, with its orderings built in one step
        and its monitor woken once."""
        if not tasks:
            return
        if tube.tasks:
            for task in tasks:
                tube.tasks[task.id] = task
                self._enter(tube, task)
            return
        if tube.enter_all(tasks) < tube.monitor_until:
            tube.monitor_wakeup.set()
        if not tube.monitor_running:
            self._start_monitor(tube)

    @cython.locals(tube=Tube, task=Task)
    def _enter(self, tube: Tube, task: Task) -> None:
        tube.enter(task)
        if task.status == TAKEN and is_session(task.cid):
            self._held.setdefault(task.cid, {})[task] = tube
        if task.event < tube.monitor_until:
            tube.monitor_wakeup.set()
        if not tube.monitor_running:
            self._start_monitor(tube)

    @cython.locals(tube=Tube, task=Task, i=cython.Py_ssize_t, earliest=cython.longlong)
    def _enter_many(self, tube: Tube, tasks: list[Task]) -> None:
        """:meth:`_enter` of each of ``tasks``, into the tube's orderings at once
        (:meth:`Tube.enter_many`)."""
        if not tasks:
            return
        tube.enter_many(tasks)
        earliest = MAX_TIME_US
        for i in range(len(tasks)):
            task = tasks[i]
            if task.status == TAKEN and is_session(task.cid):
                self._held.setdefault(task.cid, {})[task] = tube
            if task.event < earliest:
                earliest = task.event
        if earliest < tube.monitor_until:
            tube.monitor_wakeup.set()
        if not tube.monitor_running:
            self._start_monitor(tube)

    @cython.locals(tube=Tube, task=Task, i=cython.Py_ssize_t)
    def _leave_many(self, tube: Tube, tasks: list[Task]) -> None:
        """:meth:`_leave` of each of ``tasks``, out of the tube's orderings at once
        (:meth:`Tube.leave_many`)."""
        tube.leave_many(tasks)
        for i in range(len(tasks)):
            task = tasks[i]
            if task.status == TAKEN and is_session(task.cid):
                _unhold(self._held, task)

    @cython.locals(tube=Tube, task=Task, i=cython.Py_ssize_t)
    def _remove_many(self, tube: Tube, tasks: list[Task]) -> None:
        """:meth:`_remove` of each of ``tasks``."""
        self._leave_many(tube, tasks)
        where = self._where[tube.space_id]
        for i in range(len(tasks)):
            task = tasks[i]
            del tube.tasks[task.id]
            _unplace(where, task.id, tube)
        if not tube.tasks:
            tube.monitor_wakeup.set()  # its monitor ends, and the tube may be forgotten

    @cython.locals(tube=Tube, task=Task)
    def _leave(self, tube: Tube, task: Task) -> None:
        tube.leave(task)
        if task.status == TAKEN and is_session(task.cid):
            _unhold(self._held, task)

    @cython.locals(created=cython.longlong)
    def _next_created(self) -> int:
        created = _clock_us()
        if created <= self._last_created:
            created = self._last_created + 1
        self._last_created = created
        return created

    @cython.locals(us=cython.longlong, high=cython.ulonglong, low=cython.ulonglong, i=cython.int, digits=cython.p_char)
    def new_id(self, created: int) -> str:
        """32 lowercase hex digits of a version 7 UUID (RFC 9562): the time in milliseconds, the
        microseconds within it (the 12 bits RFC 9562 leaves to sub-millisecond order), 62 random
        bits. The shape 1.5's ``uuid_hex`` gave (its ids were version 4, all random), so clients
        that check the 32 hex digits see no change; ordered by creation time, so the tasks a
        batch puts, takes or acks together sit together in LMDB's primary B-tree. Random ids
        spread a claim of 25,000 tasks over most of the tree's leaf pages, each one copied and
        written again at commit: the streaming source ran some 1.4x faster with these ids
        (bench/stream_phases.py, docs/performance.md 2026-11-29). ``created``: the task's creation
        time in microseconds."""
        us = created
        # Two 64-bit halves written as hex digits into a C buffer: as one 128-bit Python int,
        # with hex() and zfill, an id took some 4,000 instructions, through a bytearray 2,600.
        high = ((us // 1000) << 16) | _UUID7_VERSION | (us % 1000)
        low = _UUID7_VARIANT | self._random_bits()
        if not cython.compiled:
            return f"{high:016x}{low:016x}"
        out = cython.declare(cython.char[32])
        digits = _HEX_DIGITS
        for i in range(16):
            out[15 - i] = digits[high & 0xF]
            out[31 - i] = digits[low & 0xF]
            high >>= 4
            low >>= 4
        return out[:32].decode("ascii")

    @cython.locals(at=cython.Py_ssize_t, pool=bytes, chars=cython.p_uchar, bits=cython.ulonglong, i=cython.int)
    def _random_bits(self) -> int:
        """62 random bits for an id, from a pool of ``_random``'s bytes drawn RANDOM_POOL ids at a
        time (a call of ``getrandbits`` an id cost some 800 instructions)."""
        at = self._random_at
        pool = self._random_pool
        if at + 8 > len(pool):
            pool = self._random_pool = self._random.randbytes(8 * RANDOM_POOL)
            at = 0
        self._random_at = at + 8
        if not cython.compiled:
            return int.from_bytes(pool[at : at + 8], "little") >> 2
        chars = pool
        bits = 0
        for i in range(8):
            bits = (bits << 8) | chars[at + i]
        return bits >> 2

    def _forget_if_unused(self, tube: Tube) -> None:
        """Forget a tube memory need not keep; a record that only named its kind goes too.

        Its counters stay in :attr:`forgotten` (bounded) and come back with the tube: a tube
        holds a few kilobytes of structures, and a server whose clients name a new tube per job
        must not keep one for every name it ever saw."""
        key = (tube.space_id, tube.name)
        if tube.unused() and self.tubes.get(key) is tube:
            del self.tubes[key]
            if tube.stats or any(tube.tally):
                self._keep_forgotten(key, Remains(tube.stats, tube.tally))
            if tube.options is not None:
                tube.options = None
                self.committer.submit(self._record_write(TUBE_RECORDS, None, list(key)),
                                      log_failure(f"deleting the record of tube {tube.name!r}"))

    def _keep_forgotten(self, key: tuple[int, str], remains: Remains) -> None:
        self.forgotten[key] = remains
        if len(self.forgotten) > FORGOTTEN_KEPT:
            self.forgotten.popitem(last=False)

    def _count_forgotten(self, key: tuple[int, str], counter: str) -> None:
        """Count on a tube memory does not hold (a take that found nothing), without making one."""
        remains = self.forgotten.pop(key, None)
        if remains is None:
            remains = Remains({}, [0] * len(TALLIES))
        remains.stats[counter] = remains.stats.get(counter, 0) + 1
        self._keep_forgotten(key, remains)

    def _start_monitor(self, tube: Tube) -> None:
        raise NotImplementedError  # tubes.monitors

    # -- writes --------------------------------------------------------------------------------

    def _change(
        self,
        queue_space: QueueSpace,
        tube: Tube,
        task: Task,
        mutate: Mutate,
        *,
        counter: str | None = None,
        tail: Tail | None = None,
        after: Callable[[], None] | None = None,
    ) -> Later[bytes]:
        """Change ``task`` in memory (counting ``counter`` with it) and write it, keeping its
        stored attachments and data unless ``tail`` is given; the Later gives the stored tuple
        once durable, after ``after()`` has run. A write that fails undoes both."""
        before = task.snapshot()
        old_status = task.status
        self._leave(tube, task)
        mutate(task)
        self._enter(tube, task)
        new_status = task.status
        if counter is not None:
            tube.count(counter)
        header = task.header()
        write = _rewrite(queue_space, task, header, tail)

        later: Later[bytes] = Later()
        try:
            self.committer.submit(write, _Changed(self, tube, task, counter, before, header, old_status, new_status,
                                                  after, later))
        except BaseException:
            self._undo_change(tube, task, counter, before, header)
            raise
        return later

    @cython.locals(tube=Tube, task=Task)
    def _undo_change(self, tube: Tube, task: Task, counter: str | None, before: Any, header: Any) -> None:
        """A change whose write failed: its count and the task as it was (unless changed since)."""
        if counter is not None:
            tube.uncount(counter)
        if tube.tasks.get(task.id) is task and task.header() == header:
            self._leave(tube, task)
            task.restore(before)
            self._enter(tube, task)

    def _delete(self, queue_space: QueueSpace, tube: Tube, task: Task, counters: tuple[str, ...] = ()) -> Later[bytes]:
        self._remove(tube, task)
        for counter in counters:
            tube.count(counter)

        later: Later[bytes] = Later()
        try:
            self.committer.submit(queue_space.space.prepare_delete(0, queue_space.layout.key(task)),
                                  _Deleted(self, tube, task, counters, later))
        except BaseException:
            self._undo_delete(tube, task, counters)
            raise
        return later

    def _undo_delete(self, tube: Tube, task: Task, counters: tuple[str, ...]) -> None:
        for counter in counters:
            tube.uncount(counter)
        if task.id not in tube.tasks:
            self._add(tube, task)

    @cython.locals(task=Task, layout=Layout)
    def _batch(
        self,
        queue_space: QueueSpace,
        tube: Tube,
        *,
        changes: Iterable[tuple[Task, Mutate, Tail | None]] = (),
        deletes: Iterable[Task] = (),
        inserts: Iterable[tuple[Task, list[Any]]] = (),
        records: Iterable[Callable[[lmdb.Transaction], Any]] = (),
        counters: Iterable[str] = (),
        undo_extra: Callable[[], None] | None = None,
        expiring: bool = False,
        rewrite: bool = True,
    ) -> Later[list[bytes | None]]:
        """Several changes of one tube as one write (one commit): ``changes`` and ``deletes``
        happen in memory now, ``inserts`` once durable (each with the values of its fields past
        the header); ``records`` are written with them. The
        Later gives the stored tuples: changed, then deleted, then inserted ones. ``expiring``:
        the deletes are tasks whose ttl ended. ``rewrite=False``: the changes are not written
        (a listed claim's tasks, which its record holds: see :class:`tubes.tube.Claim`), and the
        Later gives no tuple for them."""
        space, layout = queue_space.space, queue_space.layout
        done_changes: list[tuple[Task, list[Any], list[Any]]] = []
        writes: list[Callable[[lmdb.Transaction], Any]] = []
        counted = list(counters)
        for counter in counted:
            tube.count(counter)
        changed = list(changes)
        moved: list[Task] = [change[0] for change in changed]
        befores = [task.snapshot() for task in moved]
        # Out of the tube's orderings and back in, all at once (a claim's tasks move as one run),
        # unless a task comes twice (a Deckard Add naming an id twice), which moves one at a time.
        together = len(moved) < 2 or len({id(task) for task in moved}) == len(moved)
        if together:
            self._leave_many(tube, moved)
        for i in range(len(changed)):
            task = moved[i]
            if not together:
                self._leave(tube, task)
            changed[i][1](task)
            if not together:
                self._enter(tube, task)
        if together:
            self._enter_many(tube, moved)
        for i in range(len(changed)):
            task = moved[i]
            header = task.header()
            done_changes.append((task, befores[i], header))
            if rewrite:
                writes.append(_rewrite(queue_space, task, header, changed[i][2]))
        written = len(done_changes) if rewrite else 0  # the results of the changes' writes
        deleted = [t for t in deletes if tube.tasks.get(t.id) is t]
        drop: Callable[[lmdb.Transaction], list[Any]] | None = None
        if deleted:
            self._remove_many(tube, deleted)
            drop = space.prepare_deletes([layout.key(task) for task in deleted])  # one write for them all
        new: list[Task] = []
        raws: list[bytes] = []
        rows: list[list[Any]] = []
        for task, past_header in inserts:  # packed once with the header, and checked as values
            fields = task.header()
            fields += past_header
            new.append(task)
            rows.append(fields)
            raws.append(pack_flat(fields))
        put: Callable[[lmdb.Transaction], Any] | None = None
        if new:
            put = space.prepare_puts(raws, rows, REPLACE)  # one write for them all, in order
            tube.pending += 1
        extra = list(records)

        def write(txn: lmdb.Transaction) -> list[Any]:
            results = []
            try:
                for fn in writes:
                    results.append(fn(txn))
                if drop is not None:
                    results.extend(drop(txn))
                if put is not None:
                    results.extend(put(txn))
                for fn in extra:
                    fn(txn)
            except BoxError as exc:  # part of the batch is written: the committer must roll back
                raise BatchError(f"a write of tube {tube.name!r} failed: {exc.message}") from exc
            if any(r is None for r in results[:written]):
                raise BatchError(f"a task of tube {tube.name!r} is missing from its space")
            return results

        later: Later[list[bytes | None]] = Later()

        def done(results: list[Any] | None, error: BaseException | None) -> None:
            if new:
                tube.pending -= 1
            if error is not None:
                self._undo_batch(tube, counted, done_changes, deleted, undo_extra)
                later.settle(None, error)
                return
            assert results is not None
            self._tally_changed(tube, done_changes)
            if self.hooks:
                for i, (task, before, _header) in enumerate(done_changes):
                    raw = results[i] if rewrite else self.stored(queue_space, task)
                    self._notify(tube, task.id, before[2], task.status, raw)
            self._tally_deleted(tube, deleted, expiring)
            if self.hooks:
                for task in deleted:
                    self._notify(tube, task.id, task.status, None, None)
            self._place_inserted(queue_space, tube, new, results[written + len(deleted):])
            later.settle(results)

        try:
            self.committer.submit(write, done)
        except BaseException:
            if new:
                tube.pending -= 1
            self._undo_batch(tube, counted, done_changes, deleted, undo_extra)
            raise
        return later

    def _undo_batch(self, tube: Tube, counted: list[str], done_changes: list[tuple[Task, list[Any], list[Any]]],
                    deleted: list[Task], undo_extra: Callable[[], None] | None) -> None:
        """A batch whose write failed: its counts, changes and deletes taken back, newest first."""
        for counter in counted:
            tube.uncount(counter)
        for task, before, header in reversed(done_changes):
            if task.id in tube.tasks and tube.tasks[task.id] is task and task.header() == header:
                self._leave(tube, task)
                task.restore(before)
                self._enter(tube, task)
        for task in deleted:
            if task.id not in tube.tasks:
                self._add(tube, task)
        if undo_extra is not None:
            undo_extra()

    @cython.locals(task=Task, i=cython.Py_ssize_t, woke=cython.bint)
    def _place_inserted(self, queue_space: QueueSpace, tube: Tube, tasks: list[Task], raws: list[bytes]) -> None:
        """Tasks whose insert is durable (``raws``: their stored tuples) become visible; if their
        tube was dropped meanwhile, they are deleted again (nothing outlives its tube). A batch's
        tasks are placed together: into the tube's orderings at once (:meth:`_enter_many`), the
        tally counted and a waiting consumer woken once for them all."""
        if not tasks:
            return
        if tube.dropped:
            deletes = [queue_space.space.prepare_delete(0, queue_space.layout.key(t)) for t in tasks]
            self.committer.submit(_all(deletes), log_failure("deleting tasks put into a dropped tube"))
            return
        woke = False
        held = tube.tasks
        where = self._where_in(tube.space_id)
        name = tube.name
        placed: list[Task] = []
        hooked: list[int] | None = [] if self.hooks else None  # the placed ones' places in ``raws``
        for i in range(len(tasks)):
            task = tasks[i]
            if held.setdefault(task.id, task) is not task:  # a concurrent put of the same key (upserts wait for each other)
                continue
            task.tube = name  # one string for the tube's tasks (each request decodes its own)
            _place(where, task.id, tube)
            placed.append(task)
            if hooked is not None:
                hooked.append(i)
            if task.status == READY:
                woke = True
        self._enter_many(tube, placed)
        if hooked is not None:
            for i in hooked:
                task = tasks[i]
                self._notify(tube, task.id, None, task.status, raws[i])
        self._count_tally(tube, PUTS, len(placed))
        if woke:
            tube.wake_one_consumer()

    @cython.locals(i=cython.Py_ssize_t, run=cython.Py_ssize_t, before=list, header=list)
    def _tally_changed(self, tube: Tube, done_changes: list[tuple[Task, list[Any], list[Any]]]) -> None:
        """:meth:`_tally` of each change of status of a batch's ``(task, before, header)``, a run
        of the same change at a time (a claim's tasks all go from ready to taken)."""
        old: Any = None
        new: Any = None
        run = 0
        for i in range(len(done_changes)):
            _task, before, header = done_changes[i]
            if before[2] is header[2] or before[2] == header[2]:
                continue
            if before[2] is not old or header[2] is not new:
                if run:
                    self._count_tally(tube, tally_of(old, new), run)
                old, new, run = before[2], header[2], 0
            run += 1
        if run:
            self._count_tally(tube, tally_of(old, new), run)

    @cython.locals(task=Task, i=cython.Py_ssize_t, run=cython.Py_ssize_t)
    def _tally_deleted(self, tube: Tube, deleted: list[Task], expired: bool) -> None:
        """:meth:`_tally` of each of ``deleted``, a run of one status at a time (a batch's
        deletes mostly share theirs)."""
        status: Any = None
        run = 0
        for i in range(len(deleted)):
            task = deleted[i]
            if task.status is not status:
                if run:
                    self._count_tally(tube, tally_of(status, None, expired), run)
                status, run = task.status, 0
            run += 1
        if run:
            self._count_tally(tube, tally_of(status, None, expired), run)

    def _tally(self, tube: Tube, old: str | None, new: str | None, expired: bool = False) -> None:
        """Count a durable change of status (:func:`tubes.tube.tally_of`) for the tube and its space."""
        self._count_tally(tube, tally_of(old, new, expired), 1)

    def _count_tally(self, tube: Tube, which: int, count: int) -> None:
        """``count`` more in tally ``which`` (none if negative) of the tube and its space."""
        if which >= 0 and count:
            tube.tally[which] += count
            totals = self.tallies.get(tube.space_id)
            if totals is None:
                totals = self.tallies[tube.space_id] = [0] * len(TALLIES)
            totals[which] += count

    def _notify(self, tube: Tube, task_id: str, old: str | None, new: str | None, raw: bytes | None) -> None:
        for hook in self.hooks:
            try:
                hook(tube.space_id, tube.name, task_id, old, new, raw)
            except Exception:
                log.exception("task change hook failed")

    def record_space(self, name: str) -> Space:
        """One of the engine's record spaces (open once it owns a space)."""
        return self._records[name]

    def _record_write(self, name: str, record: list[Any] | None, key: list[Any]) -> Callable[[lmdb.Transaction], Any]:
        space = self._records[name]
        if record is None:
            return space.prepare_delete(0, key)
        return space.prepare_put(pack(record), record, REPLACE)


def has_tube_layout_format(space: Space) -> bool:
    fmt = tuple((f.name, f.type) for f in space.defn.format)
    return fmt[: len(TUBE_FORMAT)] == tuple((f.name, f.type) for f in TUBE_FORMAT)


def default_kind(name: str) -> TubeKind:
    from boxqueue.tubes.kinds import QUEUE_MODULE, QUEUE_MODULE_KIND, deckard_kind, zaqar_kind

    if name == QUEUE_MODULE:
        return QUEUE_MODULE_KIND
    if name == "deckard":
        return deckard_kind(1440)
    if name == "zaqar":
        return zaqar_kind(3600, 300)
    return BOX_QUEUE_KIND


def is_session(cid: Any) -> bool:
    return type(cid) is int and 0 < cid < CLAIM_HOLDERS


@cython.locals(task=Task)
def _as_in_memory(raw: bytes, task: Task) -> bytes:
    """The stored tuple ``raw`` of ``task`` with the header it has in memory."""
    header = task.header()
    return msgpack_scan.head_replaced(raw, len(header), pack_flat(header))[1]


def _rewrite(queue_space: QueueSpace, task: Task, header: list[Any], tail: Tail | None) -> Callable[[lmdb.Transaction], Any]:
    """The write of a changed task: its stored header replaced and what follows it kept as stored
    (the header holds ``attrs`` in the tube layout, so it is the layout's whole kept part), or,
    with ``tail``, the tuple made again from the header and the new tail."""
    key = queue_space.layout.key(task)
    if tail is None:
        return queue_space.space.prepare_head_rewrite(key, header)
    return queue_space.space.prepare_transform(key, _with_tail(header, tail))


def _with_tail(header: list[Any], tail: Tail) -> Callable[[bytes], bytes]:
    def transform(_old: bytes) -> bytes:
        return encode_task(header, *tail)

    return transform


def counted(tube: Tube, counter: str | None, result: Any, options: dict[str, Any] | None = None) -> Any:
    """A put is durable: count it; a tube whose record was written with it has it now."""
    if counter is not None:
        tube.count(counter)
    if options is not None and tube.options is None and not tube.dropped:
        tube.options = options
    return result


def _ambiguous(space_id: int, task_id: Any, tubes: list[Tube]) -> BoxError:
    names = ", ".join(sorted(t.name for t in tubes))
    return proc_error(f"Task id {task_id!r} is ambiguous in space {space_id}: tubes {names} hold one")


@cython.cclass
class _Deleted:
    """:meth:`EngineBase._delete`'s completion: one object a write, where a closure cost a
    function and a cell for each name it used."""

    __slots__ = ("engine", "tube", "task", "counters", "later")

    def __init__(self, engine: EngineBase, tube: Tube, task: Task, counters: tuple[str, ...], later: Later[bytes]) -> None:
        self.engine = engine
        self.tube = tube
        self.task = task
        self.counters = counters
        self.later = later

    def __call__(self, raw: bytes | None, error: BaseException | None) -> None:
        engine = self.engine
        tube = self.tube
        task = self.task
        if error is not None:
            engine._undo_delete(tube, task, self.counters)
            self.later.settle(None, error)
            return
        engine._tally(tube, task.status, None)
        engine._notify(tube, task.id, task.status, None, None)
        self.later.settle(raw)


@cython.cclass
class _Changed:
    """:meth:`EngineBase._change`'s completion, one object a write as :class:`_Deleted` is: the
    stored tuple once durable (``after()`` run first), or the change undone when the write failed."""

    __slots__ = ("engine", "tube", "task", "counter", "before", "header", "old_status", "new_status", "after",
                 "later")

    def __init__(self, engine: EngineBase, tube: Tube, task: Task, counter: str | None, before: Any, header: Any,
                 old_status: Any, new_status: Any, after: Callable[[], None] | None, later: Later[bytes]) -> None:
        self.engine = engine
        self.tube = tube
        self.task = task
        self.counter = counter
        self.before = before
        self.header = header
        self.old_status = old_status
        self.new_status = new_status
        self.after = after
        self.later = later

    def __call__(self, raw: bytes | None, error: BaseException | None) -> None:
        engine = self.engine
        if error is None and raw is None:
            error = proc_error("Task not found")
        if error is not None:
            engine._undo_change(self.tube, self.task, self.counter, self.before, self.header)
            self.later.settle(None, error)
            return
        if self.old_status != self.new_status:
            engine._tally(self.tube, self.old_status, self.new_status)
        if engine.hooks:
            engine._notify(self.tube, self.task.id, self.old_status, self.task.status, raw)
        after = self.after
        if after is not None:
            after()
        self.later.settle(raw)


def _all(writes: list[Callable[[lmdb.Transaction], Any]]) -> Callable[[lmdb.Transaction], None]:
    def write(txn: lmdb.Transaction) -> None:
        for fn in writes:
            fn(txn)

    return write


def log_failure(what: str) -> Callable[[Any, BaseException | None], None]:
    def done(_result: Any, error: BaseException | None) -> None:
        if error is not None:
            log.error("%s failed: %s", what, error)

    return done


