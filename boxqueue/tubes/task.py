"""A task: its tuple layouts in a queue space, and the part of it kept in memory.

Every task has the twelve header fields of the 1.5 module (numbered from 0):

    0 id  1 tube  2 status  3 event  4 ipri  5 pri  6 cid  7 created  8 ttl  9 ttr
    10 cbury  11 ctaken

Times are integer microseconds since the epoch, ttl and ttr integer microseconds (ttl counted
from ``created``). ``created`` is unique and increasing within a server (the engine makes it so),
the creation sequence that breaks ties between equal priorities (FIFO, D3) and Zaqar's post order.

Two layouts put them in a tuple (:class:`Layout`):

* the 1.5 layout (D12) of the queue spaces a user declares: the header, then the data fields from
  12 on; the primary key is the id;
* the tube layout of the spaces the engine owns (Deckard's and Zaqar's): the header, field 12
  ``attrs`` (a small map the engine keeps in memory: a Deckard message's diagnostics and
  breakpoint, a Zaqar message's poster, the priority a lock ends with), field 13 ``attachments``
  (a map kept only in LMDB: a Deckard message's description, metadata and payload), then the
  data fields from 14 on; the primary key is (tube, id), since Deckard's ids are per queue.

Memory holds the header (and ``attrs``); attachments and data stay in LMDB and are copied byte for
byte from the stored tuple whenever the task is rewritten.
"""

from __future__ import annotations

import base64
from typing import Any

import cython
import msgpack

from boxqueue.spaces import msgpack_scan
from boxqueue.spaces.definitions import FieldDef
from boxqueue.spaces.msgpack_values import Raw, array_header, pack, unpack

READY = "r"
DELAYED = "d"
TAKEN = "t"
BURIED = "b"
DONE = "*"

HUMAN = {READY: "ready", DELAYED: "delayed", TAKEN: "taken", BURIED: "buried", DONE: "done"}
STATUS_ORDER = (READY, DELAYED, TAKEN, BURIED, DONE)  # the order statistics lists them in

HEADER_FIELDS = 12
F_ID, F_TUBE, F_STATUS, F_EVENT, F_IPRI, F_PRI, F_CID, F_CREATED, F_TTL, F_TTR, F_CBURY, F_CTAKEN = range(12)
F_ATTRS, F_ATTACHMENTS = 12, 13


@cython.cclass
class Layout:
    """Where a space keeps a task's fields."""

    __slots__ = ("name", "header", "data_at", "by_tube")

    def __init__(self, name: str, header: int, data_at: int, by_tube: bool) -> None:
        self.name = name
        self.header = header  # fields kept in memory (the header, and attrs in the tube layout)
        self.data_at = data_at  # the first data field
        self.by_tube = by_tube  # primary key (tube, id) rather than (id)

    def key(self, task: Task) -> list[Any]:
        return [task.tube, task.id] if self.by_tube else [task.id]


QUEUE15 = Layout("1.5", HEADER_FIELDS, HEADER_FIELDS, False)
TUBE_LAYOUT = Layout("tube", HEADER_FIELDS + 1, HEADER_FIELDS + 2, True)

# The tube layout as a space format and primary key (the engine creates its spaces with these).
TUBE_FORMAT = (
    FieldDef("id", "string"),
    FieldDef("tube", "string"),
    FieldDef("status", "string"),
    FieldDef("event", "unsigned"),
    FieldDef("ipri", "number"),
    FieldDef("pri", "number"),
    FieldDef("cid", "scalar"),  # a session id, a claim id, or 0 for nobody
    FieldDef("created", "unsigned"),
    FieldDef("ttl", "unsigned"),
    FieldDef("ttr", "unsigned"),
    FieldDef("cbury", "unsigned"),
    FieldDef("ctaken", "unsigned"),
    FieldDef("attrs", "map"),
    FieldDef("attachments", "map"),
)
TUBE_KEY = [[F_TUBE, "string"], [F_ID, "string"]]


# Not tracked by the cyclic collector (compiled): a task refers to strings, numbers and a small map
# of them, never back to anything that could refer to it, so it is in no cycle; tracked, every
# full collection walked every task held (with a million of them, about a second each).
@cython.no_gc
@cython.cclass
class Task:
    """The in-memory image of a stored task, without its attachments and data."""

    __slots__ = (
        "id", "tube", "status", "event", "ipri", "pri", "cid", "created", "ttl", "ttr", "cbury", "ctaken",
        "attrs",
    )

    def __init__(
        self,
        id: str,
        tube: str,
        status: str,
        event: int,
        ipri: Any,
        pri: Any,
        cid: Any,
        created: int,
        ttl: int,
        ttr: int,
        cbury: int = 0,
        ctaken: int = 0,
        attrs: dict[str, Any] | None = None,
    ) -> None:
        self.id = id
        self.tube = tube
        self.status = status
        self.event = event
        self.ipri = ipri
        self.pri = pri
        self.cid = cid
        self.created = created
        self.ttl = ttl
        self.ttr = ttr
        self.cbury = cbury
        self.ctaken = ctaken
        self.attrs = attrs

    @property
    def expires(self) -> int:
        return self.created + self.ttl

    def take_key(self) -> tuple[Any, Any, int, str]:
        """Take order: internal priority, priority (a score), creation sequence."""
        return (self.ipri, self.pri, self.created, self.id)

    def event_key(self) -> tuple[int, int, str]:
        return (self.event, self.created, self.id)

    def header(self) -> list[Any]:
        """The stored header: 12 fields, and ``attrs`` for a task of the tube layout."""
        fields = [
            self.id, self.tube, self.status, self.event, self.ipri, self.pri, self.cid,
            self.created, self.ttl, self.ttr, self.cbury, self.ctaken,
        ]
        if self.attrs is not None:
            fields.append(self.attrs)
        return fields

    def copy(self) -> Task:
        copied = Task(*self.header()[:HEADER_FIELDS])
        copied.attrs = None if self.attrs is None else dict(self.attrs)
        return copied

    def snapshot(self) -> list[Any]:
        """Every field as it is now, to :meth:`restore` if a change has to be undone."""
        return [
            self.id, self.tube, self.status, self.event, self.ipri, self.pri, self.cid,
            self.created, self.ttl, self.ttr, self.cbury, self.ctaken,
            None if self.attrs is None else dict(self.attrs),
        ]

    def restore(self, fields: list[Any]) -> None:
        """Become the snapshot again (undo an in-memory change whose write failed)."""
        (self.id, self.tube, self.status, self.event, self.ipri, self.pri, self.cid, self.created,
         self.ttl, self.ttr, self.cbury, self.ctaken, self.attrs) = fields

    @classmethod
    def from_fields(cls, fields: list[Any], layout: Layout) -> Task:
        task: Task
        if len(fields) < HEADER_FIELDS:
            task = cls(*fields)
        else:  # fields set one by one: no slice and no call with twelve arguments
            task = Task.__new__(Task)
            task.id = fields[0]
            task.tube = fields[1]
            task.status = fields[2]
            task.event = fields[3]
            task.ipri = fields[4]
            task.pri = fields[5]
            task.cid = fields[6]
            task.created = fields[7]
            task.ttl = fields[8]
            task.ttr = fields[9]
            task.cbury = fields[10]
            task.ctaken = fields[11]
            task.attrs = None
        if layout.header > HEADER_FIELDS:
            attrs = fields[F_ATTRS] if len(fields) > F_ATTRS else None
            task.attrs = dict(attrs) if isinstance(attrs, dict) else {}
        return task


@cython.locals(count=cython.Py_ssize_t, p=cython.Py_ssize_t, end=cython.Py_ssize_t, i=cython.Py_ssize_t,
               first=cython.Py_ssize_t, status_at=cython.Py_ssize_t, status_end=cython.Py_ssize_t,
               data=cython.Py_ssize_t, upto=cython.Py_ssize_t, items=cython.Py_ssize_t, chars=cython.p_char)
def rettask(raw: bytes, data_at: int = HEADER_FIELDS) -> Raw:
    """What the queue functions return from a stored task tuple, ``[id, tube, status name,
    data...]``: the id and the tube as stored, the status by its name, the data fields as stored.
    One walk over the tuple's msgpack bytes (:mod:`boxqueue.spaces.msgpack_scan`, checked to its
    end as :func:`msgpack_scan.fields_at` checks them); no field is decoded but the status."""
    count, first = msgpack_scan.array_start(raw)
    if count < 0:
        raise ValueError("not a msgpack array")
    if count < 3:
        raise ValueError("a task tuple has fewer than 3 fields")
    upto = data_at
    end = len(raw)
    p = first
    status_at = status_end = data = end
    for i in range(count):
        if i == 2:
            status_at = p
        elif i == 3:
            status_end = p
        if i == upto:
            data = p
        p = msgpack_scan.skip(raw, p, end)
        if p < 0:
            raise ValueError("a malformed msgpack array")
    if p != end:
        raise ValueError("bytes after the msgpack array")
    named = None
    if status_end - status_at == 2 and raw[status_at] == 0xA1:  # a one-letter status (every known one)
        named = _PACKED_NAMES_BY_LETTER.get(raw[status_at + 1])
    if named is None:
        value = unpack(raw[status_at:status_end])
        named = pack(HUMAN.get(value, value))
    items = 3 + max(count - upto, 0)
    header = _FIXARRAY_HEADERS[items] if items < 16 else array_header(items)
    # Compiled, the pieces are cut from the bytes' buffer (a slice of a char pointer, both ends
    # given: the data may hold zero bytes); a bytes slice goes through a slice object.
    chars = raw
    return Raw(b"".join((header, chars[first:status_at], named, chars[data:end])))


_PACKED_NAMES_BY_LETTER = cython.declare(dict, {ord(status): pack(name) for status, name in HUMAN.items()})
_FIXARRAY_HEADERS = cython.declare(tuple, tuple(array_header(n) for n in range(16)))


def encode_task(header: list[Any], data_count: int, data_raw: bytes) -> bytes:
    """A task tuple from its header fields and what follows them, already msgpack."""
    # The header packs in one call; its own array header (one byte: fewer than 16 fields) gives
    # way to the tuple's.
    return array_header(len(header) + data_count) + pack(header)[1:] + data_raw


@cython.locals(task=Task, upto=cython.Py_ssize_t, tasks=list)
def load_tasks(chunk: list[bytes], layout: Layout, loaded: dict[str, list[Task]]) -> list[Task]:
    """The tasks of stored tuples, each also appended to its tube's list in ``loaded``
    (recovery: only the header of each tuple is decoded, not its data); the tasks of a tube
    share one string for its name."""
    upto = layout.header
    made: list[Task] = []
    times: dict[Any, Any] = {}  # ttl and ttr values met, to share (a tube's tasks mostly have the same)
    for raw in chunk:
        fields = msgpack_scan.leading_items(raw, upto, unpack)
        if len(fields) < 10 or not (_is_time(fields[3]) and _is_time(fields[7])):
            raise ValueError(f"a stored task's header is not a task's: {raw[:100]!r}")
        task = Task.from_fields(fields, layout)
        tasks = loaded.get(task.tube)
        if tasks is None:
            loaded[task.tube] = [task]
        else:
            task.tube = tasks[0].tube
            tasks.append(task)
        task.ttl = _shared(times, task.ttl)
        task.ttr = _shared(times, task.ttr)
        made.append(task)
    return made


@cython.cfunc
def _is_time(value: Any) -> cython.bint:
    """``event`` and ``created`` are C integers (``task.pxd``): a signed 64-bit int."""
    return type(value) is int and -(2**63) <= value < 2**63


@cython.cfunc
def _shared(values: dict[Any, Any], value: Any) -> Any:
    """The object equal to ``value`` met before (the first of them), so that equal numbers read
    from a million tuples are not a million objects; at most 256 kept."""
    if type(value) is not int:
        return value
    known = values.get(value)
    if known is not None:
        return known
    if len(values) < 256:
        values[value] = value
    return value


@cython.locals(task=Task)
def sort_by_created(tasks: list[Task]) -> None:
    """Sort ``tasks`` by ``created`` (an int, ``task.pxd``): compared as floats when every value
    is below 2**53 in size (exact then), which CPython's sort compares on its fast path, several
    times faster than ints of two digits such as microsecond times (a million tasks at
    recovery); else as ints."""
    for task in tasks:
        if not -(2**53) < task.created < 2**53:
            tasks.sort(key=created_of)
            return
    tasks.sort(key=_created_float)


@cython.locals(tasks=list, task=Task, last=Task, i=cython.Py_ssize_t)
def in_creation_order(tasks: list[Task]) -> bool:
    """Whether ``tasks`` come in creation order, as a stable sort by creation would leave them
    (compared in C: such a sort's key calls cost more)."""
    for i in range(1, len(tasks)):
        last, task = tasks[i - 1], tasks[i]
        if task.created < last.created:
            return False
    return True


@cython.locals(task=Task)
def created_of(task: Task) -> Any:
    return task.created


@cython.locals(task=Task)
def _created_float(task: Task) -> float:
    return float(task.created)


def stored_parts(raw: bytes, layout: Layout) -> tuple[dict[str, Any], list[Any]]:
    """The attachments (``{}`` in the 1.5 layout) and the data fields of a stored task."""
    fields = msgpack.unpackb(raw, raw=False, strict_map_key=False, unicode_errors="surrogateescape")
    attachments = fields[F_ATTACHMENTS] if layout.data_at > F_ATTACHMENTS and len(fields) > F_ATTACHMENTS else {}
    return (attachments if isinstance(attachments, dict) else {}), fields[layout.data_at:]


def data_json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for task data, which is msgpack: bytes become text when they
    are UTF-8, else base64; the rest str()."""
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    return str(value)
