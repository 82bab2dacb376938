"""The replication stream's rows, sans-IO: bytes in, :class:`Row` events out; rows to bytes.

The traffic reads as Tarantool's (``src/box/iproto_constants.h``, ``xrow.c``): a follower
authenticates with IPROTO_AUTH and sends IPROTO_SUBSCRIBE (66) or IPROTO_JOIN (65) on the
leader's iproto listener; every row the leader sends back carries the request's sync, and a row
of the log carries the LSN and the replica id of the instance that wrote it in its header, and a
timestamp. What differs is the body of a log row: ours carries a whole record of the
write-ahead log (``boxqueue.storage.wal``: the group's redo operations) and the term it was written in.

Rows (each framed as an iproto packet: ``0xCE``, a 32-bit length, the header map, the body map):

=====================  ===========================  =========================================
row                    header                       body
=====================  ===========================  =========================================
SUBSCRIBE (66)         sync                         INSTANCE_UUID, INSTANCE_NAME, VCLOCK,
                                                    LSN (the follower's last), TERM (of its
                                                    last record), SERVER_VERSION
JOIN (65)              sync                         INSTANCE_UUID, SERVER_VERSION
OK (0), answer         sync, REPLICA_ID (leader)    REPLICASET_UUID, VCLOCK, LSN, TERM
RECORD                 sync, REPLICA_ID, LSN,       TERM, DATA (the record's payload)
                       TIMESTAMP
SNAPSHOT               sync                         DATA (redo operations of the copy)
OK (0), end of copy    sync                         VCLOCK, LSN, TERM (the copy's position)
OK (0), heartbeat      sync, REPLICA_ID, TIMESTAMP  VCLOCK_SYNC
OK (0), follower's     sync, TIMESTAMP              VCLOCK, LSN (durable there), TERM
acknowledgement
errors                 the error code | 0x8000      ERROR_24, ERROR (as every iproto error)
=====================  ===========================  =========================================

A follower whose log does not continue the leader's (it is ahead, or one of its records has
another term) or that is too far behind for the leader's log is answered
ER_TOO_EARLY_SUBSCRIBE (220) and takes a fresh copy with JOIN.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

# Request and row types
OK = 0
JOIN = 65
SUBSCRIBE = 66
RECORD = 0x4000  # a write-ahead log record (boxqueue's own row type)
SNAPSHOT = 0x4001  # a part of a fresh copy (boxqueue's own row type)
ERROR_FLAG = 0x8000

# Header keys
TYPE = 0x00
SYNC = 0x01
REPLICA_ID = 0x02
LSN = 0x03
TIMESTAMP = 0x04

# Body keys
INSTANCE_UUID = 0x24
REPLICASET_UUID = 0x25
VCLOCK = 0x26
DATA = 0x30
ERROR_24 = 0x31
TERM = 0x53
VCLOCK_SYNC = 0x5A
SERVER_VERSION = 0x06
INSTANCE_NAME = 0x5D  # Tarantool 3.x's: the member's name in the replica set

_LENGTH = struct.Struct(">I")


@dataclass
class Row:
    """One decoded row: its type (the error code with ERROR_FLAG for an error) and the header and
    body maps."""

    type: int
    sync: int
    header: dict[int, Any]
    body: dict[int, Any] = field(default_factory=dict)

    @property
    def is_error(self) -> bool:
        return bool(self.type & ERROR_FLAG)

    @property
    def error_code(self) -> int:
        return self.type & ~ERROR_FLAG

    @property
    def lsn(self) -> int:
        return int(self.body.get(LSN, self.header.get(LSN, 0)))

    @property
    def term(self) -> int:
        return int(self.body.get(TERM, 0))


class RowDecoder:
    """Frames and decodes rows from a byte stream (both ways: the leader's rows and a follower's
    acknowledgements).

    A follower that catches up reads a megabyte at a time holding thousands of rows: rows are
    consumed by moving an offset (the buffer is compacted once per read, not once per row, which
    moved the rest of the buffer for every row), and one unpacker serves every row."""

    def __init__(self, max_row: int = 1 << 31) -> None:
        self._buf = bytearray()
        self._pos = 0  # where the next row starts in _buf
        self.max_row = max_row
        self._unpacker = self._new_unpacker()

    @staticmethod
    def _new_unpacker() -> msgpack.Unpacker:
        return msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=0)

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_row(self) -> Row | None:
        """The next complete row, or None until more bytes come. Raises ValueError on bytes that
        cannot be a row."""
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 5:
            return None
        if buf[pos] != 0xCE:
            raise ValueError("a replication row must start with a 32-bit length")
        (length,) = _LENGTH.unpack_from(buf, pos + 1)
        if length > self.max_row:
            raise ValueError(f"a row of {length} bytes is too long")
        end = pos + 5 + length
        if len(buf) < end:
            return None
        self._pos = end
        unpacker = self._unpacker
        unpacker.feed(memoryview(buf)[pos + 5 : end])
        before = unpacker.tell()
        try:
            header = unpacker.unpack()
            body = unpacker.unpack() if unpacker.tell() - before < length else {}
        except Exception as exc:  # (what was left of the row would be read as the next one)
            self._unpacker = self._new_unpacker()
            raise ValueError(f"a row that is not two msgpack maps: {exc!r}") from None
        if unpacker.tell() - before != length:  # bytes after the body: ignored, as they always were
            self._unpacker = self._new_unpacker()
        if type(header) is not dict or type(body) is not dict:
            raise ValueError("a row is a header map and a body map")
        return Row(int(header.get(TYPE, 0)), int(header.get(SYNC, 0)), header, body)


def _frame(header: dict[int, Any], body: dict[int, Any]) -> bytes:
    payload = msgpack.packb(header) + msgpack.packb(body, use_bin_type=True)
    return b"\xce" + _LENGTH.pack(len(payload)) + payload


def vclock_map(vclock: dict[int, int]) -> dict[int, int]:
    """A vclock as Tarantool encodes it: only the components above 0."""
    return {rid: lsn for rid, lsn in sorted(vclock.items()) if lsn > 0}


def subscribe(sync: int, instance_uuid: str, name: str, vclock: dict[int, int], lsn: int, term: int,
              version: int) -> bytes:
    return _frame({TYPE: SUBSCRIBE, SYNC: sync}, {
        INSTANCE_UUID: instance_uuid, INSTANCE_NAME: name, VCLOCK: vclock_map(vclock),
        LSN: lsn, TERM: term, SERVER_VERSION: version,
    })


def join(sync: int, instance_uuid: str, version: int) -> bytes:
    return _frame({TYPE: JOIN, SYNC: sync}, {INSTANCE_UUID: instance_uuid, SERVER_VERSION: version})


def position(sync: int, replica_id: int, replicaset_uuid: str, vclock: dict[int, int], lsn: int,
             term: int) -> bytes:
    """The leader's answer to SUBSCRIBE and JOIN, and the end of a copy: where its log stands."""
    return _frame({TYPE: OK, SYNC: sync, REPLICA_ID: replica_id},
                  {REPLICASET_UUID: replicaset_uuid, VCLOCK: vclock_map(vclock), LSN: lsn, TERM: term})


def record(sync: int, replica_id: int, lsn: int, term: int, payload: bytes, timestamp: float | None = None) -> bytes:
    return _frame({TYPE: RECORD, SYNC: sync, REPLICA_ID: replica_id, LSN: lsn,
                   TIMESTAMP: time.time() if timestamp is None else timestamp},
                  {TERM: term, DATA: payload})


def snapshot(sync: int, payload: bytes) -> bytes:
    return _frame({TYPE: SNAPSHOT, SYNC: sync}, {DATA: payload})


def heartbeat(sync: int, replica_id: int, counter: int) -> bytes:
    return _frame({TYPE: OK, SYNC: sync, REPLICA_ID: replica_id, TIMESTAMP: time.time()}, {VCLOCK_SYNC: counter})


def ack(vclock: dict[int, int], lsn: int, term: int) -> bytes:
    """A follower's acknowledgement: every record up to ``lsn`` is durable here."""
    return _frame({TYPE: OK, SYNC: 0, TIMESTAMP: time.time()}, {VCLOCK: vclock_map(vclock), LSN: lsn, TERM: term})


def error(sync: int, code: int, message: str) -> bytes:
    return _frame({TYPE: ERROR_FLAG | code, SYNC: sync}, {ERROR_24: message})
