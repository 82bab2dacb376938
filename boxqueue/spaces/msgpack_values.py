"""Msgpack values as this server sees them, and their round trip to bytes.

Tuples are stored as the exact bytes a client sent; decoded values are only used to check types,
build index keys and apply updates. The decoding keeps every distinction a client can observe:

* str stays ``str`` even when it is not valid UTF-8 (decoded with ``surrogateescape`` and encoded
  back the same way), bin stays ``bytes``;
* Tarantool's extension types become :class:`decimal.Decimal` (1), :class:`uuid.UUID` (2) and
  :class:`Datetime` (4); any other extension stays a :class:`msgpack.ExtType`;
* a map whose keys Python cannot hash (arrays, maps) becomes a :class:`PairsMap`.
"""

from __future__ import annotations

import decimal
import struct
import uuid
from typing import Any

import cython
import msgpack

if cython.compiled:  # pack_flat: a string's UTF-8 as the string holds it, an int without an exception, memcpy
    from cython.cimports.cpython.long import PyLong_AsLongLongAndOverflow
    from cython.cimports.cpython.unicode import (
        PyUnicode_1BYTE_KIND,
        PyUnicode_AsUTF8AndSize,
        PyUnicode_KIND,
    )
    from cython.cimports.libc.string import memcpy

EXT_DECIMAL = 1
EXT_UUID = 2
EXT_ERROR = 3
EXT_DATETIME = 4
EXT_INTERVAL = 6

_DECIMAL_CONTEXT = decimal.Context(prec=100, Emax=999999, Emin=-999999)


class PairsMap:
    """A msgpack map whose keys cannot be dict keys (arrays, maps): its ``(key, value)`` pairs.

    Deliberately not a list, so the msgpack packer refuses it and :func:`pack` takes the slow
    path only for values that hold one.
    """

    __slots__ = ("pairs",)

    def __init__(self, pairs: Any = ()) -> None:
        self.pairs = list(pairs)

    def __iter__(self) -> Any:
        return iter(self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PairsMap) and self.pairs == other.pairs

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PairsMap({self.pairs!r})"


class Datetime:
    """Tarantool's datetime extension: seconds, nanoseconds, tz offset (minutes) and tz index."""

    __slots__ = ("seconds", "nsec", "tzoffset", "tzindex")

    def __init__(self, seconds: int, nsec: int = 0, tzoffset: int = 0, tzindex: int = 0) -> None:
        self.seconds = seconds
        self.nsec = nsec
        self.tzoffset = tzoffset
        self.tzindex = tzindex

    def sort_key(self) -> tuple[int, int]:
        """Datetimes compare by the instant, whatever the time zone they are shown in."""
        return (self.seconds, self.nsec)

    def to_ext(self) -> msgpack.ExtType:
        payload = struct.pack("<q", self.seconds)
        if self.nsec or self.tzoffset or self.tzindex:
            payload += struct.pack("<ihh", self.nsec, self.tzoffset, self.tzindex)
        return msgpack.ExtType(EXT_DATETIME, payload)

    @classmethod
    def from_payload(cls, data: bytes) -> Datetime:
        if len(data) == 8:
            return cls(struct.unpack("<q", data)[0])
        if len(data) == 16:
            seconds, nsec, tzoffset, tzindex = struct.unpack("<qihh", data)
            return cls(seconds, nsec, tzoffset, tzindex)
        raise ValueError("datetime payload must be 8 or 16 bytes")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Datetime) and self.sort_key() == other.sort_key()

    def __hash__(self) -> int:
        return hash(self.sort_key())

    def __repr__(self) -> str:
        return f"Datetime({self.seconds}, {self.nsec}, {self.tzoffset}, {self.tzindex})"


def decimal_from_payload(data: bytes) -> decimal.Decimal:
    """Decode MP_EXT 1: a msgpack int scale, then packed BCD digits with a trailing sign nibble."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(data), 16))
    unpacker.feed(data)
    scale = unpacker.unpack()
    if type(scale) is not int:
        raise ValueError("decimal scale must be an integer")
    bcd = data[unpacker.tell():]
    if not bcd:
        raise ValueError("decimal without digits")
    nibbles = []
    for byte in bcd:
        nibbles.append(byte >> 4)
        nibbles.append(byte & 0x0F)
    sign_nibble = nibbles.pop()
    if sign_nibble in (0x0B, 0x0D):
        sign = 1
    elif sign_nibble in (0x0A, 0x0C, 0x0E, 0x0F):
        sign = 0
    else:
        raise ValueError("bad decimal sign nibble")
    if any(n > 9 for n in nibbles):
        raise ValueError("bad decimal digit")
    digits = tuple(nibbles) or (0,)
    return decimal.Decimal((sign, digits, -scale))


def decimal_to_ext(value: decimal.Decimal) -> msgpack.ExtType:
    """Encode MP_EXT 1 the way Tarantool does (scale, BCD, sign nibble 0x0c / 0x0d)."""
    if not value.is_finite():
        raise ValueError("Tarantool decimals are finite")
    sign, digits, exponent = value.as_tuple()
    if exponent > 0:
        digits = tuple(digits) + (0,) * exponent
        exponent = 0
    while len(digits) > 1 and digits[0] == 0:
        digits = digits[1:]
    nibbles = [*digits, 0x0D if sign else 0x0C]
    if len(nibbles) % 2:
        nibbles.insert(0, 0)
    bcd = bytes((nibbles[i] << 4) | nibbles[i + 1] for i in range(0, len(nibbles), 2))
    return msgpack.ExtType(EXT_DECIMAL, msgpack.packb(-exponent) + bcd)


def ext_hook(code: int, data: bytes) -> Any:
    try:
        if code == EXT_DECIMAL:
            return decimal_from_payload(data)
        if code == EXT_UUID:
            if len(data) != 16:
                raise ValueError("uuid payload must be 16 bytes")
            return uuid.UUID(bytes=data)
        if code == EXT_DATETIME:
            return Datetime.from_payload(data)
    except (ValueError, msgpack.UnpackException, decimal.InvalidOperation):
        # A malformed payload is kept as an opaque extension, like one we do not know.
        pass
    return msgpack.ExtType(code, data)


def _pairs_hook(pairs: list[tuple[Any, Any]]) -> Any:
    try:
        return dict(pairs)
    except TypeError:
        return PairsMap(pairs)


def _default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return decimal_to_ext(value)
    if isinstance(value, uuid.UUID):
        return msgpack.ExtType(EXT_UUID, value.bytes)
    if isinstance(value, Datetime):
        return value.to_ext()
    raise TypeError(f"cannot encode {type(value).__name__} as msgpack")


_UNPACK_ARGS: dict[str, Any] = dict(
    raw=False,
    unicode_errors="surrogateescape",
    strict_map_key=False,
    ext_hook=ext_hook,
)


def unpack(data: bytes) -> Any:
    """Decode one msgpack value (raises ``ValueError`` subclasses on malformed input)."""
    try:
        return msgpack.unpackb(data, **_UNPACK_ARGS)
    except TypeError:
        # A map had an unhashable key; decode again keeping such maps as pairs.
        return msgpack.unpackb(data, object_pairs_hook=_pairs_hook, **_UNPACK_ARGS)


def make_unpacker(max_buffer_size: int = 0) -> msgpack.Unpacker:
    """A streaming decoder with the same conventions as :func:`unpack` (maps as pairs if needed)."""
    return msgpack.Unpacker(
        object_pairs_hook=_pairs_hook, max_buffer_size=max_buffer_size, **_UNPACK_ARGS
    )


# Strings are packed as UTF-8 by msgpack's strict path (about 250 instructions a string fewer than
# a packer given ``unicode_errors``); the escaping packer is asked only for a value holding a string
# with surrogates, which stand for bytes that were not UTF-8 (decoded with ``surrogateescape``) and
# go back out as those bytes.
_packer = msgpack.Packer(use_bin_type=True, default=_default)
_escaping_packer = msgpack.Packer(use_bin_type=True, unicode_errors="surrogateescape", default=_default)


def pack(value: Any) -> bytes:
    """Encode one value; the inverse of :func:`unpack` for everything it produces."""
    try:
        return _packer.pack(value)
    except TypeError:
        # A PairsMap somewhere inside (or a value msgpack cannot carry, which fails again below).
        return _pack_with_pairs(value)
    except UnicodeEncodeError:
        return _pack_escaping(value)


def _pack_escaping(value: Any) -> bytes:
    try:
        return _escaping_packer.pack(value)
    except TypeError:
        return _pack_with_pairs(value)


def _pack_with_pairs(value: Any) -> bytes:
    if isinstance(value, PairsMap):
        return _map_header(len(value)) + b"".join(pack(k) + pack(v) for k, v in value)
    if isinstance(value, list | tuple):
        return _array_header(len(value)) + b"".join(pack(v) for v in value)
    if isinstance(value, dict):
        return _map_header(len(value)) + b"".join(pack(k) + pack(v) for k, v in value.items())
    return _escaping_packer.pack(value)


_FLAT_ROOM = cython.declare(cython.Py_ssize_t, 512)  # the size of pack_flat's own buffer (declared there as 512)
_UINT64_END = 1 << 64  # (pack_flat writes integers from 1 << 63 up to here as uint64)
_U32_END = cython.declare(cython.longlong, 0x100000000)  # (a literal this large compares as an object)


@cython.locals(pos=cython.Py_ssize_t, count=cython.Py_ssize_t, size=cython.Py_ssize_t, n=cython.longlong,
               u=cython.ulonglong, out=cython.p_char, encoded=bytes, text_chars=cython.p_const_char,
               overflow=cython.int)
def pack_flat(values: list[Any]) -> bytes:
    """:func:`pack` of a list of fewer than 16 items, written here (compiled) when every item is
    a string of one-byte characters (Latin-1, written as UTF-8) or a byte string shorter than
    256, an integer that fits 64 bits (signed or not), nil, a boolean or an empty map, as a
    task's header and most task tuples are, and the whole fits 512 bytes: msgpack's bytes,
    without its packer's set-up and type dispatch, which cost more than such small items.
    Anything else, and every list when the module runs uncompiled, goes to :func:`pack`."""
    if not cython.compiled:
        return pack(values)
    count = len(values)
    if count >= 16:
        return pack(values)
    buf = cython.declare(cython.uchar[512])
    buf[0] = 0x90 | count
    pos = 1
    for v in values:
        if pos > _FLAT_ROOM - 9:  # (room for an integer's 9 bytes; a string checks its own)
            return pack(values)
        t = type(v)
        if t is str or t is bytes:
            if t is str:
                # The string's own UTF-8 (its characters themselves when ASCII); strings of wider
                # characters, among them those holding surrogates that stand for bytes that were
                # not UTF-8, are msgpack's to write. (No try: entering one walks the chain of
                # exceptions handled by every coroutine the call runs under, a few hundred cycles
                # at the depth of a request's.)
                if PyUnicode_KIND(v) != PyUnicode_1BYTE_KIND:
                    return pack(values)
                size = 0  # (set by the call below)
                text_chars = PyUnicode_AsUTF8AndSize(v, cython.address(size))
                if size < 32:
                    buf[pos] = 0xA0 | size
                    pos += 1
                elif size < 0x100:
                    buf[pos] = 0xD9
                    buf[pos + 1] = size
                    pos += 2
                else:
                    return pack(values)
            else:
                encoded = v
                size = len(encoded)
                if size >= 0x100:
                    return pack(values)
                buf[pos] = 0xC4
                buf[pos + 1] = size
                pos += 2
                text_chars = encoded
            if pos + size > _FLAT_ROOM:
                return pack(values)
            memcpy(cython.address(buf[pos]), text_chars, size)
            pos += size
        elif t is int:
            overflow = 0
            n = PyLong_AsLongLongAndOverflow(v, cython.address(overflow))  # (no exception to catch)
            if overflow:
                if overflow < 0 or v >= _UINT64_END:  # beyond 64 bits: msgpack's error
                    return pack(values)
                u = v  # a uint64 (a claim's consumer id)
                buf[pos] = 0xCF
                size = 8
            else:
                u = cython.cast(cython.ulonglong, n)  # (a negative's two's complement bits)
                size = 0  # a fixint: the one byte below
                if n >= 0:
                    if n < 0x80:
                        buf[pos] = n
                    elif n < 0x100:
                        buf[pos] = 0xCC
                        size = 1
                    elif n < 0x10000:
                        buf[pos] = 0xCD
                        size = 2
                    elif n < _U32_END:
                        buf[pos] = 0xCE
                        size = 4
                    else:
                        buf[pos] = 0xCF
                        size = 8
                elif n >= -32:
                    buf[pos] = n & 0xFF
                elif n >= -0x80:
                    buf[pos] = 0xD0
                    size = 1
                elif n >= -0x8000:
                    buf[pos] = 0xD1
                    size = 2
                elif n >= -0x80000000:
                    buf[pos] = 0xD2
                    size = 4
                else:
                    buf[pos] = 0xD3
                    size = 8
            pos += 1
            while size:  # big-endian
                size -= 1
                buf[pos] = (u >> (8 * size)) & 0xFF
                pos += 1
        elif v is None:
            buf[pos] = 0xC0
            pos += 1
        elif t is dict and not v:  # (the tube layout's empty attachments)
            buf[pos] = 0x80
            pos += 1
        elif t is bool:
            buf[pos] = 0xC3 if v else 0xC2
            pos += 1
        else:
            return pack(values)
    out = cython.cast(cython.p_char, buf)
    return out[:pos]


# The one-byte headers of arrays of fewer than 16 items, made once (every reply and rewritten task
# tuple asks for one).
_FIXARRAY_HEADERS = tuple(bytes([0x90 | n]) for n in range(16))


def _array_header(n: int) -> bytes:
    if 0 <= n < 16:
        return _FIXARRAY_HEADERS[n]
    if n < 0x10000:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    if n < 0x10000:
        return b"\xde" + struct.pack(">H", n)
    return b"\xdf" + struct.pack(">I", n)


array_header = _array_header


class Raw(bytes):
    """A value that is already msgpack (a stored tuple): embedded in replies as is."""

    __slots__ = ()


def pack_array(values: list[Any] | tuple[Any, ...]) -> bytes:
    """Encode a list whose items may be (or contain) :class:`Raw` pieces."""
    for v in values:
        if type(v) not in _PLAIN:
            if type(v) is list and not v:  # (an empty answer: box.queue.statistics with nothing to list)
                continue
            if len(values) == 1 and type(v) is Raw:  # a call's one stored tuple (box.queue's answers)
                return _FIXARRAY_HEADERS[1] + v
            return _array_header(len(values)) + b"".join([_pack_item(v) for v in values])
    return pack(values)


# Item types that can never hold a Raw piece: a list of these packs in one call.
_PLAIN = frozenset({int, str, float, bool, type(None), bytes, dict})


def _pack_item(value: Any) -> bytes:
    if isinstance(value, Raw):
        return value  # (joined as it is: a copy made here was copied again by the join)
    if isinstance(value, list | tuple):
        return pack_array(value)
    return pack(value)
