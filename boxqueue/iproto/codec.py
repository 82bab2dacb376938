# cython: annotation_typing=True
"""The iproto codec, sans-IO: bytes in, :class:`Request` events out; responses to bytes.

Nothing here touches a socket. :class:`RequestDecoder` is fed whatever arrived and hands back
complete requests; the connection code decides what to do with them.

Framing rules kept here (see the iproto notes, section 2):

* a request's length prefix may be any msgpack unsigned int; a response's is always ``0xCE`` and
  four bytes;
* a bad length prefix, or one above the configured maximum, is fatal: answer, then close;
* a bad header or body is answered with ER_INVALID_MSGPACK and the connection goes on;
* the raw bytes of the body's TUPLE are kept, so tuples are stored exactly as sent.

The header is checked as Tarantool 2.6 checks it (``xrow_header_decode``): the header must be one
well-formed map whose keys are unsigned integers below ``IPROTO_KEY_MAX`` (0x53), each value of
the msgpack type Tarantool expects for its key (``iproto_key_type``). Anything else is "packet
header"; the reply carries the sync read before the fault, which is 0 when the header could not
be read at all.

This module is compiled with Cython (pure-Python mode; see ``boxqueue/compiled.py``). Requests in
the common shapes (a small header map; a body of the usual keys holding unsigned ints, strings and
arrays) are decoded here byte by byte into typed fields, without building the body as a dict;
every other request goes through msgpack and is checked the slow, general way. Both paths give the
same values.
"""

from __future__ import annotations

import struct
from typing import Any

import cython
import msgpack

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces import msgpack_scan
from boxqueue.spaces.msgpack_values import Raw, make_unpacker, pack, pack_array, unpack

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
JOIN = 65
SUBSCRIBE = 66
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

# The same numbers as C constants for the decoder: a module attribute costs more than the test.
_T_INSERT = cython.declare(cython.ulonglong, INSERT)
_T_REPLACE = cython.declare(cython.ulonglong, REPLACE)
_T_UPSERT = cython.declare(cython.ulonglong, UPSERT)
_H_TYPE = cython.declare(cython.uint, REQUEST_TYPE)
_H_SYNC = cython.declare(cython.uint, SYNC)
_H_SCHEMA = cython.declare(cython.uint, SCHEMA_VERSION)
_H_STREAM = cython.declare(cython.uint, STREAM_ID)
_K_SPACE_ID = cython.declare(cython.uint, SPACE_ID)
_K_INDEX_ID = cython.declare(cython.uint, INDEX_ID)
_K_LIMIT = cython.declare(cython.uint, LIMIT)
_K_OFFSET = cython.declare(cython.uint, OFFSET)
_K_ITERATOR = cython.declare(cython.uint, ITERATOR)
_K_INDEX_BASE = cython.declare(cython.uint, INDEX_BASE)
_K_KEY = cython.declare(cython.uint, KEY)
_K_TUPLE = cython.declare(cython.uint, TUPLE)
_K_FUNCTION_NAME = cython.declare(cython.uint, FUNCTION_NAME)
_K_EXPR = cython.declare(cython.uint, EXPR)
_K_OPS = cython.declare(cython.uint, OPS)

# Tarantool 2.6's header check: keys below IPROTO_KEY_MAX, each with the msgpack type of
# iproto_key_type[key] (keys Tarantool 2.6 gives no type to expect nil).
KEY_MAX = 0x53
MP_NIL, MP_UINT, MP_INT, MP_STR, MP_BIN, MP_ARRAY, MP_MAP, MP_BOOL, MP_FLOAT, MP_DOUBLE, MP_EXT = range(11)
_KEY_TYPES = (
    [MP_UINT] * 4 + [MP_DOUBLE] + [MP_UINT] * 27  # 0x00-0x1f (0x04: timestamp)
    + [MP_ARRAY, MP_ARRAY, MP_STR, MP_STR, MP_STR, MP_STR, MP_MAP, MP_STR, MP_ARRAY, MP_MAP, MP_MAP, MP_MAP]
    + [MP_NIL] * (KEY_MAX - 0x2C)
)

# The bodies whose TUPLE is stored as sent.
_KEEP_RAW_TUPLE = frozenset({INSERT, REPLACE, UPSERT})

ABSENT = -1  # a typed unsigned field the body did not hold


@cython.cclass
class Request:
    """One decoded request.

    The header is always typed. The body is either decoded into the typed fields (``typed``:
    unsigned fields hold ``ABSENT`` when missing, objects ``None``), or, for unusual requests,
    kept as a dict in ``body`` (body keys to values) with ``typed`` false. ``body`` is always
    readable; for a typed request it is rebuilt from the fields. ``tuple_raw`` is TUPLE as sent.
    """


    def __init__(
        self,
        type: int,
        sync: int,
        schema_version: int,
        body: dict[int, Any],
        tuple_raw: bytes | None = None,
        stream_id: int = 0,
    ) -> None:
        _init_header(self, type, sync, schema_version, stream_id)
        self._body = body
        self.tuple_raw = tuple_raw

    @property
    def body(self) -> dict[int, Any]:
        if self._body is None:
            self._body = _body_of(self)
        return self._body

    def __repr__(self) -> str:
        return f"Request(type={self.type}, sync={self.sync}, body={self.body!r})"


@cython.cfunc
def _init_header(r: Request, rtype: cython.ulonglong, sync: cython.ulonglong, schema: cython.ulonglong,
                 stream: cython.ulonglong) -> cython.void:
    r.type = rtype
    r.sync = sync
    r.schema_version = schema
    r.stream_id = stream
    r.tuple_raw = None
    r.typed = False
    r.present = 0
    r.space_id = r.index_id = r.limit = r.offset = r.iterator = r.index_base = ABSENT
    r.key = r.tuple = r.ops = r.function_name = r.expr = None
    r._body = None


def _body_of(r: Request) -> dict[int, Any]:
    """The body dict of a typed request (only the keys it held)."""
    body: dict[int, Any] = {}
    for key, value in ((SPACE_ID, r.space_id), (INDEX_ID, r.index_id), (LIMIT, r.limit),
                       (OFFSET, r.offset), (ITERATOR, r.iterator), (INDEX_BASE, r.index_base)):
        if value != ABSENT:
            body[key] = value
    for key, value in ((KEY, r.key), (TUPLE, r.tuple), (OPS, r.ops), (FUNCTION_NAME, r.function_name),
                       (EXPR, r.expr)):
        if value is not None:
            body[key] = value
    return body


@cython.cclass
class BadRequest:
    """A request that could be framed but not decoded: answer ``error`` under ``sync``."""


    def __init__(self, sync: int, error: BoxError) -> None:
        self.sync = sync
        self.error = error


class FramingError(Exception):
    """The stream cannot be framed any more: answer ``error`` with sync 0, then close."""

    def __init__(self, error: BoxError) -> None:
        super().__init__(error.message)
        self.error = error


# The fast decoder's "this packet takes the general path": ``_value`` returns this object, the
# other steps return None or False. A status the caller tests, not an exception: a shared
# exception instance, raised again and again, grows the traceback it carries by every raise (and
# keeps each frame's locals alive), and a fresh one per packet costs more than the test.
_NOT_SIMPLE = cython.declare(object, object())


# -- reading msgpack from a bytes buffer ----------------------------------------------------------


@cython.cfunc
def _mp_type(b: cython.uint) -> cython.int:
    """Tarantool's ``mp_typeof`` of a value's first byte."""
    if b <= 0x7F or (b >= 0xCC and b <= 0xCF):
        return MP_UINT
    if b >= 0xE0 or (b >= 0xD0 and b <= 0xD3):
        return MP_INT
    if b <= 0x8F or b == 0xDE or b == 0xDF:
        return MP_MAP
    if b <= 0x9F or b == 0xDC or b == 0xDD:
        return MP_ARRAY
    if b <= 0xBF or (b >= 0xD9 and b <= 0xDB):
        return MP_STR
    if b == 0xC0:
        return MP_NIL
    if b == 0xC2 or b == 0xC3:
        return MP_BOOL
    if b >= 0xC4 and b <= 0xC6:
        return MP_BIN
    if b == 0xCA:
        return MP_FLOAT
    if b == 0xCB:
        return MP_DOUBLE
    return MP_EXT


@cython.cfunc
@cython.boundscheck(False)
@cython.wraparound(False)
def _uint_at(buf: bytes, p: cython.Py_ssize_t) -> cython.ulonglong:
    """The unsigned int at ``p`` (its type already checked and its bytes known to be there)."""
    b: cython.uint = buf[p]
    i: cython.int
    width: cython.int
    value: cython.ulonglong = 0
    if b <= 0x7F:
        return b
    width = 1 << (b - 0xCC)
    for i in range(width):
        value = (value << 8) | buf[p + 1 + i]
    return value


# -- the decoder ----------------------------------------------------------------------------------

_LEN_WIDTH = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}


@cython.cclass
class RequestDecoder:
    """Turns a byte stream into :class:`Request` and :class:`BadRequest` events.

    Received chunks are kept as they came; they are joined only when a packet spans two of them,
    and then only once all of that packet is there.
    """


    def __init__(self, max_packet: int = 16 * 1024 * 1024) -> None:
        self.max_packet = max_packet
        self._buf = b""
        self._pos = 0
        self._more = []
        self._more_len = 0
        self._p = 0
        self._end = 0
        self.packets = 0  # packets framed so far (the connection counts a chunk's requests by it)

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos + self._more_len

    def take_buffered(self) -> bytes:
        """Every byte received and not framed yet, handed over (the stream that follows a
        replication request is not iproto requests any more)."""
        data = self._buf[self._pos:] + b"".join(self._more)
        self._buf = b""
        self._pos = 0
        self._more = []
        self._more_len = 0
        return data

    def feed(self, data: bytes) -> None:
        if self._pos >= len(self._buf) and not self._more_len:
            self._buf = bytes(data)
            self._pos = 0
        elif data:
            self._more.append(bytes(data))
            self._more_len += len(data)

    @cython.cfunc
    def _gather(self, size: cython.Py_ssize_t) -> cython.bint:
        """Make the next ``size`` bytes contiguous in ``_buf``; False if they have not come yet."""
        if len(self._buf) - self._pos >= size:
            return True
        if len(self._buf) - self._pos + self._more_len < size:
            return False
        self._buf = self._buf[self._pos:] + b"".join(self._more)
        self._pos = 0
        self._more = []
        self._more_len = 0
        return True

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def next_event(self) -> Request | BadRequest | None:
        """The next complete request, or ``None`` until more bytes arrive.

        Raises :class:`FramingError` when the length prefix is unusable.
        """
        pos: cython.Py_ssize_t = self._pos
        first: cython.uint
        width: cython.Py_ssize_t
        start: cython.Py_ssize_t
        length: cython.ulonglong
        if pos >= len(self._buf):
            if not self._more_len or not self._gather(1):
                return None
            pos = self._pos
        first = self._buf[pos]
        if first <= 0x7F:
            width = 0
        elif first >= 0xCC and first <= 0xCF:
            width = 1 << (first - 0xCC)
        else:
            raise FramingError(BoxError(ER.INVALID_MSGPACK, "packet length"))
        if not self._gather(1 + width):
            return None
        pos = self._pos
        length = _uint_at(self._buf, pos)
        if length > cython.cast(cython.ulonglong, self.max_packet):
            raise FramingError(BoxError(ER.INVALID_MSGPACK, "packet length"))
        if not self._gather(1 + width + cython.cast(cython.Py_ssize_t, length)):
            return None
        start = self._pos + 1 + width
        self._end = start + cython.cast(cython.Py_ssize_t, length)
        self._pos = self._end
        self.packets += 1
        request: Request = self._decode_simple(start)
        if request is None:
            return decode_packet(self._buf[start:self._end])
        return request

    # -- the fast decoder: the usual shapes only, anything else answers "not simple" ----------
    # (None from _decode_simple and _array, False from _decode_body, _NOT_SIMPLE from _value)

    @cython.cfunc
    @cython.boundscheck(False)
    @cython.wraparound(False)
    def _decode_simple(self, start: cython.Py_ssize_t) -> Request:
        buf: bytes = self._buf
        end: cython.Py_ssize_t = self._end
        p: cython.Py_ssize_t = start
        b: cython.uint
        count: cython.uint
        key: cython.uint
        rtype: cython.ulonglong = 0
        sync: cython.ulonglong = 0
        schema: cython.ulonglong = 0
        stream: cython.ulonglong = 0
        value: cython.ulonglong
        request: Request
        if p >= end:
            return None
        b = buf[p]
        if b < 0x80 or b > 0x8F:
            return None
        count = b & 0x0F
        p += 1
        while count:
            count -= 1
            if p + 2 > end:
                return None
            key = buf[p]
            b = buf[p + 1]
            if key >= 0x20 or key == 0x04 or not (b <= 0x7F or (b >= 0xCC and b <= 0xCF)):
                return None
            if b > 0x7F and p + 2 + (1 << (b - 0xCC)) > end:
                return None
            value = _uint_at(buf, p + 1)
            p += 2 if b <= 0x7F else 2 + (1 << (b - 0xCC))
            if key == _H_TYPE:
                rtype = value
            elif key == _H_SYNC:
                sync = value
            elif key == _H_SCHEMA:
                schema = value
            elif key == _H_STREAM:
                stream = value
        request = Request.__new__(Request)
        _init_header(request, rtype, sync, schema, stream)
        if p == end:
            request.typed = True
            return request
        self._p = p
        if not self._decode_body(request) or self._p != end:
            return None
        request.typed = True
        return request

    @cython.cfunc
    @cython.boundscheck(False)
    @cython.wraparound(False)
    def _decode_body(self, request: Request) -> cython.bint:
        buf: bytes = self._buf
        end: cython.Py_ssize_t = self._end
        p: cython.Py_ssize_t = self._p
        b: cython.uint
        count: cython.uint
        key: cython.uint
        value: cython.ulonglong
        start: cython.Py_ssize_t
        items: list
        item: object
        b = buf[p]
        if b < 0x80 or b > 0x8F:
            return False
        count = b & 0x0F
        p += 1
        while count:
            count -= 1
            if p + 2 > end:
                return False
            key = buf[p]
            b = buf[p + 1]
            p += 1
            if key < 64:
                request.present |= cython.cast(cython.ulonglong, 1) << key
            if key >= _K_SPACE_ID and key <= _K_INDEX_BASE:
                if b <= 0x7F:
                    value = b
                    p += 1
                elif b >= 0xCC and b <= 0xCE:  # uint8..32: no value above 2^63
                    if p + 1 + (1 << (b - 0xCC)) > end:
                        return False
                    value = _uint_at(buf, p)
                    p += 1 + (1 << (b - 0xCC))
                else:
                    return False
                if key == _K_SPACE_ID:
                    request.space_id = value
                elif key == _K_INDEX_ID:
                    request.index_id = value
                elif key == _K_LIMIT:
                    request.limit = value
                elif key == _K_OFFSET:
                    request.offset = value
                elif key == _K_ITERATOR:
                    request.iterator = value
                else:
                    request.index_base = value
            elif key in (_K_KEY, _K_TUPLE, _K_OPS):
                if not ((b >= 0x90 and b <= 0x9F) or b == 0xDC or b == 0xDD):
                    return False
                start = p
                self._p = p
                items = self._array()
                if items is None:
                    return False
                if key == _K_KEY:
                    request.key = items
                elif key == _K_TUPLE:
                    request.tuple = items
                    if request.type == _T_INSERT or request.type == _T_REPLACE or request.type == _T_UPSERT:
                        request.tuple_raw = buf[start:self._p]
                else:
                    request.ops = items
                p = self._p
            elif key in (_K_FUNCTION_NAME, _K_EXPR):
                if not ((b >= 0xA0 and b <= 0xBF) or (b >= 0xD9 and b <= 0xDB)):
                    return False
                self._p = p
                item = self._value()
                if item is _NOT_SIMPLE:
                    return False
                if key == _K_FUNCTION_NAME:
                    request.function_name = item
                else:
                    request.expr = item
                p = self._p
            else:
                return False
        self._p = p
        return True

    @cython.cfunc
    @cython.boundscheck(False)
    @cython.wraparound(False)
    def _array(self) -> list:
        """The array at the cursor, as a list (None when it is not simple); the cursor moves
        past it."""
        buf: bytes = self._buf
        p: cython.Py_ssize_t = self._p
        b: cython.uint = buf[p]
        n: cython.Py_ssize_t
        i: cython.Py_ssize_t
        items: list
        item: object
        if b <= 0x9F:
            n = b & 0x0F
            p += 1
        elif b == 0xDC:
            if p + 3 > self._end:
                return None
            n = (buf[p + 1] << 8) | buf[p + 2]
            p += 3
        else:
            if p + 5 > self._end:
                return None
            n = (buf[p + 1] << 24) | (buf[p + 2] << 16) | (buf[p + 3] << 8) | buf[p + 4]
            p += 5
        if n > self._end - p:  # every item takes a byte at least
            return None
        items = [None] * n
        self._p = p
        for i in range(n):
            item = self._value()
            if item is _NOT_SIMPLE:
                return None
            items[i] = item
        return items

    @cython.cfunc
    @cython.boundscheck(False)
    @cython.wraparound(False)
    def _value(self) -> object:
        """The value at the cursor (ints, strings, nil and booleans here; anything else through
        msgpack; ``_NOT_SIMPLE`` for anything it cannot read); the cursor moves past it."""
        buf: bytes = self._buf
        p: cython.Py_ssize_t = self._p
        end: cython.Py_ssize_t = self._end
        b: cython.uint
        n: cython.Py_ssize_t
        after: cython.Py_ssize_t
        if p >= end:
            return _NOT_SIMPLE
        b = buf[p]
        if b <= 0x7F:
            self._p = p + 1
            return b
        if b >= 0xA0 and b <= 0xBF:
            n = b & 0x1F
            p += 1
        elif b == 0xD9:
            if p + 2 > end:
                return _NOT_SIMPLE
            n = buf[p + 1]
            p += 2
        elif b == 0xDA:
            if p + 3 > end:
                return _NOT_SIMPLE
            n = (buf[p + 1] << 8) | buf[p + 2]
            p += 3
        elif b >= 0xCC and b <= 0xCF:
            n = 1 << (b - 0xCC)
            if p + 1 + n > end:
                return _NOT_SIMPLE
            self._p = p + 1 + n
            return _uint_at(buf, p)
        elif b >= 0xE0:
            self._p = p + 1
            return cython.cast(cython.int, b) - 256
        elif b == 0xC0:
            self._p = p + 1
            return None
        elif b == 0xC2 or b == 0xC3:
            self._p = p + 1
            return b == 0xC3
        else:
            after = msgpack_scan.skip(buf, p, end)
            if after < 0:
                return _NOT_SIMPLE
            self._p = after
            return _unpack_value(buf[p:after])
        if p + n > end:
            return _NOT_SIMPLE
        self._p = p + n
        return buf[p:p + n].decode("utf-8", "surrogateescape")


def _unpack_value(data: bytes) -> Any:
    try:
        return unpack(data)
    except Exception:
        return _NOT_SIMPLE


# -- the general path -----------------------------------------------------------------------------


def decode_packet(packet: bytes) -> Request | BadRequest:
    """Decode one packet (header map, then optional body map) without its length prefix."""
    header_end = msgpack_scan.skip(packet, 0, len(packet))
    if header_end < 0 or _mp_type(packet[0]) != MP_MAP:
        return BadRequest(0, BoxError(ER.INVALID_MSGPACK, "packet header"))
    checked = _check_header(packet, header_end)
    if type(checked) is BadRequest:
        return checked
    rtype, sync, schema_version, stream_id = checked
    if header_end == len(packet):
        return Request(rtype, sync, schema_version, {}, None, stream_id)
    unpacker = make_unpacker(max(len(packet), 16))
    unpacker.feed(packet)
    tuple_raw = None
    try:
        unpacker.skip()  # the header, checked above
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


def _check_header(packet: bytes, header_end: int) -> tuple[int, int, int, int] | BadRequest:
    """Tarantool's key and type checks of a well-formed header map: (type, sync, schema
    version, stream id), or the error, with the sync read before the fault."""
    # Strings are not checked for UTF-8 (Tarantool does not check them either): an invalid one
    # raised UnicodeDecodeError out of the decoder, which stopped the server (found by fuzzing).
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(packet), 16), unicode_errors="surrogateescape")
    unpacker.feed(packet[:header_end])
    fields = {REQUEST_TYPE: 0, SYNC: 0, SCHEMA_VERSION: 0, STREAM_ID: 0}
    try:
        for _ in range(unpacker.read_map_header()):
            at = unpacker.tell()
            if _mp_type(packet[at]) != MP_UINT:
                return BadRequest(fields[SYNC], BoxError(ER.INVALID_MSGPACK, "packet header"))
            key = unpacker.unpack()
            at = unpacker.tell()
            if key >= KEY_MAX or _KEY_TYPES[key] != _mp_type(packet[at]):
                return BadRequest(fields[SYNC], BoxError(ER.INVALID_MSGPACK, "packet header"))
            value = unpacker.unpack()
            if key in fields:
                fields[key] = value
    except ValueError:  # msgpack's own refusals (limits of nesting or sizes)
        return BadRequest(fields[SYNC], BoxError(ER.INVALID_MSGPACK, "packet header"))
    return fields[REQUEST_TYPE], fields[SYNC], fields[SCHEMA_VERSION], fields[STREAM_ID]


def _body_keeping_tuple(
    unpacker: msgpack.Unpacker, data: bytes, base: int
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

_HEAD_LEN = 23  # the header map: 0x83, type/code as uint32, sync as uint64, schema as uint32
_HEAD = b"\xce\x00\x00\x00\x00\x83\x00\xce\x00\x00\x00\x00\x01\xcf" + bytes(8) + b"\x05\xce" + bytes(4)


@cython.ccall
@cython.boundscheck(False)
@cython.wraparound(False)
def write_response(out: bytearray, sync: cython.ulonglong, schema_version: cython.ulonglong, body: bytes,
                   code: cython.ulonglong = 0) -> cython.void:
    """Append a whole response packet to ``out``: ``0xCE`` length, the header map, then ``body``
    (msgpack bytes)."""
    at: cython.Py_ssize_t = len(out)
    length: cython.ulonglong = _HEAD_LEN + len(body)
    i: cython.int
    out += _HEAD
    out += body
    for i in range(4):
        out[at + 1 + i] = (length >> (24 - 8 * i)) & 0xFF
        out[at + 8 + i] = (code >> (24 - 8 * i)) & 0xFF
        out[at + 24 + i] = (schema_version >> (24 - 8 * i)) & 0xFF
    for i in range(8):
        out[at + 14 + i] = (sync >> (56 - 8 * i)) & 0xFF


@cython.ccall
@cython.boundscheck(False)
@cython.wraparound(False)
def write_tuples_response(out: bytearray, sync: cython.ulonglong, schema_version: cython.ulonglong,
                          tuples: list) -> cython.void:
    """Append the answer ``{DATA: [tuples...]}`` (tuples already msgpack, array32 as Tarantool)
    without building the body first."""
    at: cython.Py_ssize_t = len(out)
    n: cython.Py_ssize_t = len(tuples)
    length: cython.ulonglong = _HEAD_LEN + 7
    i: cython.int
    t: bytes
    for t in tuples:
        length += len(t)
    out += _HEAD
    out += _TUPLES_HEAD
    for t in tuples:
        out += t
    for i in range(4):
        out[at + 1 + i] = (length >> (24 - 8 * i)) & 0xFF
        out[at + 24 + i] = (schema_version >> (24 - 8 * i)) & 0xFF
        out[at + 31 + i] = (n >> (24 - 8 * i)) & 0xFF
    for i in range(8):
        out[at + 14 + i] = (sync >> (56 - 8 * i)) & 0xFF


def response(sync: int, schema_version: int, body: bytes, code: int = 0) -> bytes:
    """A whole response packet: ``0xCE`` length, the header map, then ``body`` (msgpack bytes)."""
    out = bytearray()
    write_response(out, sync, schema_version, body, code)
    return bytes(out)


EMPTY_BODY = b"\x80"
EMPTY_TUPLES_BODY = b"\x81\x30\xdd\x00\x00\x00\x00"
_TUPLES_HEAD = b"\x81\x30\xdd\x00\x00\x00\x00"  # the count is written in place
_ONE_TUPLE = b"\x81\x30\xdd\x00\x00\x00\x01"
_U32 = struct.Struct(">I")


def data_body_from_tuples(tuples: list[bytes]) -> bytes:
    """``{DATA: [...]}`` from tuples that are already msgpack bytes (array32, as Tarantool)."""
    if len(tuples) == 1:
        return _ONE_TUPLE + tuples[0]
    return b"\x81\x30\xdd" + _U32.pack(len(tuples)) + b"".join(tuples)


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
    "ABSENT",
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
    "write_response",
    "write_tuples_response",
]
