"""The iproto codec, sans-IO: bytes in, :class:`Request` events out; responses to bytes.

Nothing here touches a socket. :class:`RequestDecoder` is fed whatever arrived and hands back
complete requests; the connection code decides what to do with them.

Framing rules kept here (see the iproto notes, section 2):

* a request's length prefix may be any msgpack unsigned int; a response's is always ``0xCE`` and
  four bytes;
* a bad length prefix, or one above the configured maximum, is fatal: answer, then close;
* a bad header or body is answered with ER_INVALID_MSGPACK and the connection goes on;
* the raw bytes of the body's TUPLE are kept, so tuples are stored exactly as sent.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from errcodes import ER, BoxError
from spaces.msgpack_values import Raw, ext_hook, make_unpacker, pack, pack_array

# Request and response types
SELECT = 1
INSERT = 2
REPLACE = 3
UPDATE = 4
DELETE = 5
CALL_16 = 6
AUTH = 7
EVAL = 8
UPSERT = 9
CALL = 10
EXECUTE = 11
NOP = 12
PREPARE = 13
BEGIN = 14
COMMIT = 15
ROLLBACK = 16
PING = 64
ID = 73
WATCH = 74
UNWATCH = 75
CHUNK = 0x80
ERROR_FLAG = 0x8000

# Header keys
REQUEST_TYPE = 0x00
SYNC = 0x01
SCHEMA_VERSION = 0x05
STREAM_ID = 0x0A

# Body keys
SPACE_ID = 0x10
INDEX_ID = 0x11
LIMIT = 0x12
OFFSET = 0x13
ITERATOR = 0x14
INDEX_BASE = 0x15
KEY = 0x20
TUPLE = 0x21
FUNCTION_NAME = 0x22
USER_NAME = 0x23
EXPR = 0x27
OPS = 0x28
DATA = 0x30
ERROR_24 = 0x31
ERROR = 0x52
VERSION = 0x54
FEATURES = 0x55
AUTH_TYPE = 0x5B
SPACE_NAME = 0x5E
INDEX_NAME = 0x5F

# Keys of an entry of the extended error stack (MP_ERROR)
ERROR_STACK = 0x00
ERROR_TYPE = 0x00
ERROR_FILE = 0x01
ERROR_LINE = 0x02
ERROR_MESSAGE = 0x03
ERROR_ERRNO = 0x04
ERROR_CODE = 0x05
ERROR_FIELDS = 0x06

# The bodies whose TUPLE is stored as sent.
_KEEP_RAW_TUPLE = frozenset({INSERT, REPLACE, UPSERT})


@dataclass(slots=True)
class Request:
    """One decoded request. ``body`` maps body keys to values; ``tuple_raw`` is TUPLE as sent."""

    type: int
    sync: int
    schema_version: int
    body: dict[int, Any]
    tuple_raw: bytes | None = None
    stream_id: int = 0


@dataclass(slots=True)
class BadRequest:
    """A request that could be framed but not decoded: answer ``error`` under ``sync``."""

    sync: int
    error: BoxError


class FramingError(Exception):
    """The stream cannot be framed any more: answer ``error`` with sync 0, then close."""

    def __init__(self, error: BoxError) -> None:
        super().__init__(error.message)
        self.error = error


_LEN_WIDTH = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_U32 = struct.Struct(">I")


class RequestDecoder:
    """Turns a byte stream into :class:`Request` and :class:`BadRequest` events.

    Bytes are kept twice: in a buffer that frames packets (length prefixes, completeness, the raw
    bytes of tuples) and in one long-lived msgpack unpacker fed each chunk once, which decodes the
    headers and bodies in place. ``_origin`` is the buffer offset of the unpacker's position 0.
    """

    def __init__(self, max_packet: int = 16 * 1024 * 1024) -> None:
        self.max_packet = max_packet
        self._buf = bytearray()
        self._pos = 0
        self._unpacker = _fast_unpacker(max_packet)
        self._origin = 0

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        pos = self._pos
        if pos and (pos == len(self._buf) or pos > 65536):
            # Drop what was framed already; buffer offsets, and the unpacker's origin, move back.
            del self._buf[:pos]
            self._origin -= pos
            self._pos = 0
        self._buf += data
        self._unpacker.feed(data)

    def next_event(self) -> Request | BadRequest | None:
        """The next complete request, or ``None`` until more bytes arrive.

        Raises :class:`FramingError` when the length prefix is unusable.
        """
        buf = self._buf
        pos = self._pos
        size = len(buf)
        if pos >= size:
            return None
        first = buf[pos]
        if first <= 0x7F:
            length = first
            start = pos + 1
        elif first == 0xCE:
            if size - pos < 5:
                return None
            length = _U32.unpack_from(buf, pos + 1)[0]
            start = pos + 5
        else:
            width = _LEN_WIDTH.get(first)
            if width is None:
                raise FramingError(BoxError(ER.INVALID_MSGPACK, "packet length"))
            if size - pos < 1 + width:
                return None
            length = int.from_bytes(buf[pos + 1 : pos + 1 + width], "big")
            start = pos + 1 + width
        if length > self.max_packet:
            raise FramingError(BoxError(ER.INVALID_MSGPACK, "packet length"))
        end = start + length
        if size < end:
            return None
        self._pos = end
        # The fast path: the shared unpacker, positioned at this packet's length prefix.
        unpacker = self._unpacker
        origin = self._origin
        try:
            unpacker.skip()  # the length prefix, already read above
            header = unpacker.unpack()
            rtype = header.get(REQUEST_TYPE, 0)
            tuple_raw = None
            if origin + unpacker.tell() == end:
                body: Any = {}
            elif rtype in _KEEP_RAW_TUPLE:
                body, tuple_raw = _body_keeping_tuple(unpacker, buf, -origin)
            else:
                body = unpacker.unpack()
            if origin + unpacker.tell() == end and type(body) is dict:
                sync = header.get(SYNC, 0)
                version = header.get(SCHEMA_VERSION, 0)
                if type(sync) is int and sync >= 0 and type(rtype) is int and type(version) is int:
                    return Request(rtype, sync, version, body, tuple_raw, header.get(STREAM_ID, 0))
        except Exception:
            pass
        # Something unusual: decode this packet on its own (maps with unhashable keys kept as
        # pairs, precise errors), and restart the shared unpacker at the next packet.
        packet = bytes(buf[start:end])
        self._unpacker = unpacker = _fast_unpacker(self.max_packet)
        unpacker.feed(bytes(buf[end:]))
        self._origin = end
        return decode_packet(packet)


def _fast_unpacker(max_packet: int) -> msgpack.Unpacker:
    # It never holds more than one unfinished packet and one received chunk.
    return msgpack.Unpacker(
        raw=False,
        unicode_errors="surrogateescape",
        strict_map_key=False,
        ext_hook=ext_hook,
        max_buffer_size=2 * max_packet + (1 << 20),
    )


def decode_packet(packet: bytes) -> Request | BadRequest:
    """Decode one packet (header map, then optional body map) without its length prefix."""
    unpacker = make_unpacker(max(len(packet), 16))
    unpacker.feed(packet)
    try:
        header = unpacker.unpack()
    except Exception:
        return BadRequest(0, BoxError(ER.INVALID_MSGPACK, "packet header"))
    if type(header) is not dict:
        return BadRequest(0, BoxError(ER.INVALID_MSGPACK, "packet header"))
    sync = header.get(SYNC, 0)
    rtype = header.get(REQUEST_TYPE, 0)
    schema_version = header.get(SCHEMA_VERSION, 0)
    stream_id = header.get(STREAM_ID, 0)
    if type(sync) is not int or sync < 0:
        return BadRequest(0, BoxError(ER.INVALID_MSGPACK, "packet header"))
    if type(rtype) is not int or type(schema_version) is not int or type(stream_id) is not int:
        return BadRequest(sync, BoxError(ER.INVALID_MSGPACK, "packet header"))
    body_start = unpacker.tell()
    if body_start == len(packet):
        return Request(rtype, sync, schema_version, {}, None, stream_id)
    tuple_raw = None
    try:
        if rtype in _KEEP_RAW_TUPLE:
            body, tuple_raw = _body_keeping_tuple(unpacker, packet, 0)
        else:
            body = unpacker.unpack()
        if unpacker.tell() != len(packet):
            raise ValueError("trailing bytes")
    except Exception:
        return BadRequest(sync, BoxError(ER.INVALID_MSGPACK, "packet body"))
    if type(body) is not dict:
        return BadRequest(sync, BoxError(ER.INVALID_MSGPACK, "packet body"))
    return Request(rtype, sync, schema_version, body, tuple_raw, stream_id)


def _body_keeping_tuple(
    unpacker: msgpack.Unpacker, data: bytes | bytearray, base: int
) -> tuple[dict[int, Any], bytes | None]:
    """Decode a body map, also returning TUPLE's bytes: ``data[unpacker.tell() - base]`` is where
    the unpacker stands."""
    body: dict[int, Any] = {}
    tuple_raw = None
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if key == TUPLE:
            start = unpacker.tell() - base
            body[key] = unpacker.unpack()
            tuple_raw = bytes(data[start : unpacker.tell() - base])
        else:
            body[key] = unpacker.unpack()
    return body, tuple_raw


# -- responses ----------------------------------------------------------------------------------

_RESPONSE_HEAD = struct.Struct(">BIBBBIBBQBBI")
_HEAD_LEN = _RESPONSE_HEAD.size - 5


def response(sync: int, schema_version: int, body: bytes, code: int = 0) -> bytes:
    """A whole response packet: ``0xCE`` length, the header map, then ``body`` (msgpack bytes)."""
    return _RESPONSE_HEAD.pack(
        0xCE, _HEAD_LEN + len(body), 0x83, REQUEST_TYPE, 0xCE, code, SYNC, 0xCF, sync,
        SCHEMA_VERSION, 0xCE, schema_version,
    ) + body


EMPTY_BODY = b"\x80"
EMPTY_TUPLES_BODY = b"\x81\x30\xdd\x00\x00\x00\x00"


def data_body_from_tuples(tuples: list[bytes]) -> bytes:
    """``{DATA: [...]}`` from tuples that are already msgpack bytes (array32, as Tarantool)."""
    if len(tuples) == 1:
        return b"\x81\x30\xdd\x00\x00\x00\x01" + tuples[0]
    return b"\x81\x30\xdd" + len(tuples).to_bytes(4, "big") + b"".join(tuples)


def data_body(values: list[Any]) -> bytes:
    """``{DATA: values}``; values may hold :class:`Raw` pieces of msgpack."""
    return b"\x81\x30" + pack_array(values)


def error_body(error: BoxError) -> bytes:
    entry: dict[int, Any] = {
        ERROR_TYPE: error.error_type,
        ERROR_FILE: "box",
        ERROR_LINE: 0,
        ERROR_MESSAGE: error.message,
        ERROR_ERRNO: 0,
        ERROR_CODE: error.code,
    }
    if error.fields:
        entry[ERROR_FIELDS] = error.fields
    return pack({ERROR_24: error.message, ERROR: {ERROR_STACK: [entry]}})


def error_response(sync: int, schema_version: int, error: BoxError) -> bytes:
    return response(sync, schema_version, error_body(error), ERROR_FLAG | error.code)


def id_body(version: int, features: list[int], auth_type: str = "chap-sha1") -> bytes:
    return pack({VERSION: version, FEATURES: features, AUTH_TYPE: auth_type})


__all__ = [
    "BadRequest",
    "FramingError",
    "Raw",
    "Request",
    "RequestDecoder",
    "data_body",
    "data_body_from_tuples",
    "decode_packet",
    "error_body",
    "error_response",
    "id_body",
    "response",
]
