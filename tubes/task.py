"""A task: its tuple layout in the queue space, and the part of it kept in memory.

The tuple (fields numbered from 0, as in the 1.5 module):

    0 id  1 tube  2 status  3 event  4 ipri  5 pri  6 cid  7 created  8 ttl  9 ttr
    10 cbury  11 ctaken  12... data

Times are integer microseconds since the epoch, ttl and ttr integer microseconds (ttl counted
from ``created``). ``created`` is unique and increasing within a server (the engine makes it so),
which makes it the creation sequence that breaks ties between equal priorities (FIFO, D3).

Memory holds every field but the data; the data stays in LMDB and is copied byte for byte from the
stored tuple whenever the task is rewritten.
"""

from __future__ import annotations

from typing import Any

import msgpack

from spaces.msgpack_values import Raw, array_header, pack

READY = "r"
DELAYED = "d"
TAKEN = "t"
BURIED = "b"
DONE = "*"

HUMAN = {READY: "ready", DELAYED: "delayed", TAKEN: "taken", BURIED: "buried", DONE: "done"}
STATUS_ORDER = (READY, DELAYED, TAKEN, BURIED, DONE)  # the order statistics lists them in

HEADER_FIELDS = 12
F_ID, F_TUBE, F_STATUS, F_EVENT, F_IPRI, F_PRI, F_CID, F_CREATED, F_TTL, F_TTR, F_CBURY, F_CTAKEN = range(12)


class Task:
    """The in-memory image of a stored task, without its data."""

    __slots__ = ("id", "tube", "status", "event", "ipri", "pri", "cid", "created", "ttl", "ttr", "cbury", "ctaken")

    def __init__(
        self,
        id: str,
        tube: str,
        status: str,
        event: int,
        ipri: int,
        pri: int,
        cid: int,
        created: int,
        ttl: int,
        ttr: int,
        cbury: int = 0,
        ctaken: int = 0,
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

    @property
    def expires(self) -> int:
        return self.created + self.ttl

    def take_key(self) -> tuple[int, int, int, str]:
        """Take order: internal priority, stored priority, creation sequence."""
        return (self.ipri, self.pri, self.created, self.id)

    def event_key(self) -> tuple[int, int, str]:
        return (self.event, self.created, self.id)

    def header(self) -> list[Any]:
        return [
            self.id, self.tube, self.status, self.event, self.ipri, self.pri, self.cid,
            self.created, self.ttl, self.ttr, self.cbury, self.ctaken,
        ]

    def copy(self) -> Task:
        return Task(*self.header())

    def restore(self, other: Task) -> None:
        """Become ``other`` again (undo an in-memory change whose write failed)."""
        for name in Task.__slots__:
            setattr(self, name, getattr(other, name))

    @classmethod
    def from_fields(cls, fields: list[Any]) -> Task:
        return cls(*fields[:HEADER_FIELDS])


def _unpacker(raw: bytes) -> msgpack.Unpacker:
    # Sized to the tuple: by default an unpacker mallocs a 1 MiB buffer, which costs more than
    # everything else done with it here.
    unpacker = msgpack.Unpacker(
        raw=False, unicode_errors="surrogateescape", max_buffer_size=max(len(raw), 16)
    )
    unpacker.feed(raw)
    return unpacker


def split_data(raw: bytes) -> tuple[int, bytes]:
    """How many data fields a stored tuple has, and their msgpack bytes as stored."""
    unpacker = _unpacker(raw)
    count = unpacker.read_array_header()
    for _ in range(min(count, HEADER_FIELDS)):
        unpacker.skip()
    return max(count - HEADER_FIELDS, 0), raw[unpacker.tell():]


def encode_task(header: list[Any], data_count: int, data_raw: bytes) -> bytes:
    """A task tuple from its 12 header fields and data that is already msgpack."""
    # The header packs in one call; its own array header (one byte: 12 < 16) gives way to the
    # tuple's.
    return array_header(HEADER_FIELDS + data_count) + pack(header)[1:] + data_raw


def rettask(raw: bytes) -> Raw:
    """What the queue functions return: ``[id, tube, status name, data...]`` from a stored tuple."""
    unpacker = _unpacker(raw)
    count = unpacker.read_array_header()
    task_id, tube, status = unpacker.unpack(), unpacker.unpack(), unpacker.unpack()
    for _ in range(HEADER_FIELDS - 3):
        unpacker.skip()
    data_count, data_raw = max(count - HEADER_FIELDS, 0), raw[unpacker.tell():]
    head = pack(task_id) + pack(tube) + pack(HUMAN.get(status, status))
    return Raw(array_header(3 + data_count) + head + data_raw)
