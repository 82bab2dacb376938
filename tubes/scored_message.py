"""A scored message: its tuple layout in the scored-tube space, and the part kept in memory.

The tuple (fields numbered from 0):

    0 queue  1 id  2 state  3 score  4 event  5 restore  6 expires  7 seq
    8 acks  9 nacks  10 consecutive acks  11 consecutive nacks  12 breakpoint  13... data

``state`` is ``a`` (active: ordered by score), ``p`` (processing until ``event``, its ack
deadline), ``la`` / ``ln`` (locked by an ack / a nack until ``event``). ``restore`` is the score
a locked message gets back when it unlocks (``-1``: none given, so the lock kind's default).
Times are integer milliseconds since the epoch, as Deckard counts them; ``seq`` is unique and
increasing per server (microseconds at creation), the tie-break between equal scores and equal
expiry times. The data fields are opaque to the tube: the facade decides what they hold, and they
stay in LMDB, copied byte for byte whenever the header is rewritten.
"""

from __future__ import annotations

from typing import Any

import msgpack

from spaces.definitions import FieldDef
from spaces.msgpack_values import array_header, pack

ACTIVE = "a"
PROCESSING = "p"
LOCKED_BY_ACK = "la"
LOCKED_BY_NACK = "ln"
STATES = (ACTIVE, PROCESSING, LOCKED_BY_ACK, LOCKED_BY_NACK)
NO_RESTORE = -1.0

HEADER_FIELDS = 13

MESSAGE_FORMAT = (
    FieldDef("queue", "string"),
    FieldDef("id", "string"),
    FieldDef("state", "string"),
    FieldDef("score", "number"),
    FieldDef("event", "unsigned"),
    FieldDef("restore", "number"),
    FieldDef("expires", "unsigned"),
    FieldDef("seq", "unsigned"),
    FieldDef("acks", "unsigned"),
    FieldDef("nacks", "unsigned"),
    FieldDef("consecutive_acks", "unsigned"),
    FieldDef("consecutive_nacks", "unsigned"),
    FieldDef("breakpoint", "string"),
)
MESSAGE_KEY = [[0, "string"], [1, "string"]]

LIMIT_FORMAT = (FieldDef("queue", "string"), FieldDef("max_elements", "unsigned"))
LIMIT_KEY = [[0, "string"]]


class ScoredMessage:
    """The in-memory image of a stored message, without its data."""

    __slots__ = (
        "queue", "id", "state", "score", "event", "restore", "expires", "seq",
        "acks", "nacks", "consecutive_acks", "consecutive_nacks", "breakpoint",
    )

    def __init__(
        self,
        queue: str,
        id: str,
        state: str,
        score: float,
        event: int,
        restore: float,
        expires: int,
        seq: int,
        acks: int = 0,
        nacks: int = 0,
        consecutive_acks: int = 0,
        consecutive_nacks: int = 0,
        breakpoint: str = "",
    ) -> None:
        self.queue = queue
        self.id = id
        self.state = state
        self.score = score
        self.event = event
        self.restore = restore
        self.expires = expires
        self.seq = seq
        self.acks = acks
        self.nacks = nacks
        self.consecutive_acks = consecutive_acks
        self.consecutive_nacks = consecutive_nacks
        self.breakpoint = breakpoint

    def header(self) -> list[Any]:
        return [getattr(self, name) for name in ScoredMessage.__slots__]

    def copy(self) -> ScoredMessage:
        return ScoredMessage(*self.header())

    def restore_from(self, other: ScoredMessage) -> None:
        """Become ``other`` again (undo an in-memory change whose write failed)."""
        for name in ScoredMessage.__slots__:
            setattr(self, name, getattr(other, name))

    def active_key(self) -> tuple[float, int, str]:
        return (self.score, self.seq, self.id)

    def event_key(self) -> tuple[int, int, str]:
        return (self.event, self.seq, self.id)

    def expiry_key(self) -> tuple[int, int, str]:
        return (self.expires, self.seq, self.id)

    @classmethod
    def from_fields(cls, fields: list[Any]) -> ScoredMessage:
        message = cls(*fields[:HEADER_FIELDS])
        message.score = float(message.score)
        message.restore = float(message.restore)
        return message


def encode_message(header: list[Any], data: list[Any]) -> bytes:
    return array_header(HEADER_FIELDS + len(data)) + b"".join(pack(v) for v in header + data)


def rewrite_header(header: list[Any], stored: bytes) -> bytes:
    """A stored message with a new header and its data bytes exactly as they were."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(stored), 16))
    unpacker.feed(stored)
    count = unpacker.read_array_header()
    for _ in range(min(count, HEADER_FIELDS)):
        unpacker.skip()
    data_count = max(count - HEADER_FIELDS, 0)
    return array_header(HEADER_FIELDS + data_count) + b"".join(pack(v) for v in header) + stored[unpacker.tell():]


def message_data(stored: bytes) -> list[Any]:
    """The data fields of a stored message (bin values come back as ``bytes``)."""
    fields = msgpack.unpackb(stored, raw=False, strict_map_key=False)
    return fields[HEADER_FIELDS:]
