# cython: annotation_typing=True
"""Order-preserving key encoding: ``encode(a) < encode(b)`` (as bytes) exactly when ``a < b`` in
Tarantool's comparison order.

Classes sort as nil < boolean < number < string < varbinary < uuid < datetime. Numbers of every
kind (int, float, decimal) compare by exact mathematical value, so ``1``, ``1.0`` and
``Decimal('1.00')`` encode the same and ``2**64 - 1`` stays above ``2**64 - 2``. A number is written
as the largest double not above it (8 sortable bytes) followed by the exact non-negative remainder,
which is empty for every double and every integer below 2**53.

Each encoded part is self-delimiting, so the encoding of a key prefix is a byte prefix of the
encoding of the full key: prefix scans and range seeks work on the raw bytes.

LMDB limits a key to 511 bytes. A key longer than :data:`MAX_EXACT` is stored as its first
:data:`MAX_EXACT` bytes and a SHA-1 of the whole (:func:`stored_form`); readers recognise such keys
by their length and restore the true order of that group from the tuples.
"""

from __future__ import annotations

import decimal
import hashlib
import math
import struct
import uuid
from collections.abc import Sequence
from typing import Any

import cython

if cython.compiled:  # a string's part made in one allocation from the string's own UTF-8
    from cython.cimports.cpython.bytes import PyBytes_AS_STRING, PyBytes_FromStringAndSize
    from cython.cimports.cpython.unicode import (
        PyUnicode_1BYTE_KIND,
        PyUnicode_AsUTF8AndSize,
        PyUnicode_KIND,
    )
    from cython.cimports.libc.string import memchr, memcpy

TAG_NIL = 0x05
TAG_FALSE = 0x10
TAG_TRUE = 0x11
TAG_NUMBER = 0x20
TAG_STRING = 0x30
TAG_BINARY = 0x40
TAG_UUID = 0x50
TAG_DATETIME = 0x60

MAX_EXACT = 448
TRUNCATED_LEN = MAX_EXACT + 20

_D = struct.Struct(">d")
_Q = struct.Struct(">Q")
_SIGN = 1 << 63
_MASK = (1 << 64) - 1
_NAN = b"\x00" * 8  # below the encoding of -inf, which is 0x000fffffffffffff
_EXACT_CONTEXT = decimal.Context(prec=2000, Emax=999999, Emin=-999999)
_EXACT_INT = 1 << 53


def _sortable_double(f: float) -> bytes:
    if f != f:
        return _NAN
    if f == 0.0:
        f = 0.0  # -0.0 and 0.0 are the same number
    bits = _Q.unpack(_D.pack(f))[0]
    bits = (~bits & _MASK) if bits & _SIGN else (bits | _SIGN)
    return _Q.pack(bits)


def _remainder(rem: decimal.Decimal) -> bytes:
    """A positive remainder: 0x01, biased adjusted exponent, digits 1..10, terminator 0."""
    rem = rem.normalize(_EXACT_CONTEXT)
    _sign, digits, _exp = rem.as_tuple()
    return b"\x01" + struct.pack(">H", rem.adjusted() + 0x8000) + bytes(d + 1 for d in digits) + b"\x00"


def _floor_double(value: int | decimal.Decimal) -> tuple[float, Any]:
    f = float(value)
    exact = decimal.Decimal(f) if isinstance(value, decimal.Decimal) else int(f)
    if exact > value:
        f = math.nextafter(f, -math.inf)
        exact = decimal.Decimal(f) if isinstance(value, decimal.Decimal) else int(f)
    return f, exact


def encode_number(value: int | float | decimal.Decimal) -> bytes:
    if type(value) is float:
        return b"\x20" + _sortable_double(value) + b"\x00"
    if type(value) is int:
        if -_EXACT_INT <= value <= _EXACT_INT:
            return b"\x20" + _sortable_double(float(value)) + b"\x00"
        f, exact = _floor_double(value)
        rem = value - exact
        tail = _remainder(decimal.Decimal(rem)) if rem else b"\x00"
        return b"\x20" + _sortable_double(f) + tail
    if not isinstance(value, decimal.Decimal):
        raise TypeError(f"not a number: {type(value).__name__}")
    if not value.is_finite():
        raise TypeError("decimal must be finite")
    f, exact = _floor_double(value)
    rem = _EXACT_CONTEXT.subtract(value, exact)
    tail = _remainder(rem) if rem else b"\x00"
    return b"\x20" + _sortable_double(f) + tail


@cython.cfunc
def _escaped(data: bytes) -> bytes:
    if b"\x00" in data:  # a search in C; most strings hold no NUL and skip the replace call
        data = data.replace(b"\x00", b"\x00\xff")
    return data + b"\x00\x01"


# Short strings (a tube's name, a status letter) recur in most keys: their parts are kept in a
# table read in C, up to _STR_PARTS_MAX of them (it starts again when full: memory stays bounded).
# Longer ones (task ids, most data) are encoded each time rather than churn the table.
_STR_PARTS = cython.declare(dict, {})
_STR_PARTS_MAX = cython.declare(cython.Py_ssize_t, 8192)
_STR_SHORT = cython.declare(cython.Py_ssize_t, 24)  # characters


@cython.cfunc
@cython.locals(size=cython.Py_ssize_t, chars=cython.p_const_char, out=cython.p_char)
def _encode_str(value: str) -> bytes:
    part = _STR_PARTS.get(value)
    if part is not None:
        return part
    part = None
    if cython.compiled and PyUnicode_KIND(value) == PyUnicode_1BYTE_KIND:  # (no surrogates in these)
        size = 0
        chars = PyUnicode_AsUTF8AndSize(value, cython.address(size))
        if memchr(chars, 0, size) == cython.NULL:  # (most strings: nothing to escape)
            part = PyBytes_FromStringAndSize(cython.NULL, size + 3)
            out = PyBytes_AS_STRING(part)
            out[0] = 0x30
            memcpy(out + 1, chars, size)
            out[size + 1] = 0
            out[size + 2] = 1
    if part is None:
        part = b"\x30" + _escaped(value.encode("utf-8", "surrogateescape"))
    if len(value) <= _STR_SHORT:
        if len(_STR_PARTS) >= _STR_PARTS_MAX:
            _STR_PARTS.clear()
        _STR_PARTS[value] = part
    return part


_C_SIGN = cython.declare(cython.ulonglong, 1 << 63)
_MASK52 = cython.declare(cython.ulonglong, (1 << 52) - 1)
_UINT_KEY = struct.Struct(">BQx")  # the number tag, the sortable double, no remainder


@cython.cfunc
def _double_bits(v: cython.ulonglong) -> cython.ulonglong:
    """The bits of ``float(v)`` for ``0 <= v <= 2**53`` (exact there), worked out without a float:
    the exponent is ``v``'s highest set bit."""
    if v == 0:
        return 0
    e: cython.int = 0
    w: cython.ulonglong = v
    step: cython.int = 32
    while step:  # a binary search for the highest set bit
        if w >> step:
            w >>= step
            e += step
        step >>= 1
    mantissa: cython.ulonglong = ((v << (52 - e)) if e <= 52 else (v >> (e - 52))) & _MASK52
    return (cython.cast(cython.ulonglong, 1023 + e) << 52) | mantissa


@cython.cfunc
def _computed_uint_key(v: cython.ulonglong) -> bytes:
    # One struct call makes the key's bytes (a bytearray filled a byte at a time cost about
    # 1,000 instructions a key; event times in microseconds all come this way).
    return _UINT_KEY.pack(0x20, _double_bits(v) | _C_SIGN)


# Priorities, counters and small ids recur in most keys.
_SMALL_UINTS = cython.declare(tuple, tuple([_computed_uint_key(i) for i in range(4096)]))


@cython.ccall
def uint_key(v: cython.ulonglong) -> bytes:
    """The encoded key part of a non-negative int up to 2**53: the one place it is written."""
    if v < 4096:
        return _SMALL_UINTS[v]
    return _computed_uint_key(v)


def encode_part(value: Any) -> bytes:
    """Encode one key part; raises ``TypeError`` for values no index can hold."""
    t = type(value)
    if t is int:
        if 0 <= value <= _EXACT_INT:
            return uint_key(value)
        return encode_number(value)
    if t is float:
        return encode_number(value)
    if t is str:
        return _encode_str(value)
    if value is None:
        return b"\x05"
    if t is bool:
        return b"\x11" if value else b"\x10"
    if t is bytes:
        return b"\x40" + _escaped(value)
    if t is decimal.Decimal:
        return encode_number(value)
    if t is uuid.UUID:
        return b"\x50" + value.bytes
    sort_key = getattr(value, "sort_key", None)
    if sort_key is not None:  # Tarantool datetime
        seconds, nsec = sort_key()
        return b"\x60" + _Q.pack((seconds + _SIGN) & _MASK) + struct.pack(">I", (nsec + (1 << 31)) & 0xFFFFFFFF)
    raise TypeError(f"{t.__name__} cannot be part of a key")


def encode_unsigned_key(value: Any) -> bytes | None:
    """The stored key of a one-part key holding a non-negative int, or None for anything else
    (the caller then takes the general path, which also reports type errors)."""
    if type(value) is int and 0 <= value <= _EXACT_INT:
        return uint_key(value)
    return None


def encode_string_key(value: Any) -> bytes | None:
    """The stored key of a one-part key holding a str short enough not to be cut, else None."""
    if type(value) is str:
        data = value.encode("utf-8", "surrogateescape")
        if len(data) < MAX_EXACT // 2:
            return b"\x30" + data.replace(b"\x00", b"\x00\xff") + b"\x00\x01"
    return None


def encode(parts: Sequence[Any]) -> bytes:
    """Encode a (possibly partial) key."""
    if len(parts) == 1:
        return encode_part(parts[0])
    return b"".join(map(encode_part, parts))


def stored_form(key: bytes) -> bytes:
    """The form of ``key`` that fits an LMDB key (see the module docstring)."""
    if len(key) <= MAX_EXACT:
        return key
    return key[:MAX_EXACT] + hashlib.sha1(key).digest()


def is_truncated(stored: bytes) -> bool:
    return len(stored) > MAX_EXACT


def successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
