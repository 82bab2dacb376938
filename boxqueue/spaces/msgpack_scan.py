# cython: annotation_typing=True
"""Walking msgpack bytes without decoding them: where a value ends, where an array's items
start, which bytes hold a tuple's fields.

The iproto codec checks every request with :func:`skip` (Tarantool's ``mp_check``), and the tube
engine splits stored task tuples with :func:`fields_at` instead of an unpacker's method calls per
field. Compiled with Cython (``msgpack_scan.pxd``); other compiled modules cimport it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cython

if cython.compiled:  # head_replaced's new array, written in one allocation
    from cython.cimports.cpython.bytes import PyBytes_AS_STRING, PyBytes_FromStringAndSize
    from cython.cimports.libc.string import memcpy


@cython.cfunc
@cython.inline
def wide32(b: cython.uint) -> cython.bint:
    """bin32, str32, ext32, array32, map32: a 32-bit size follows the type byte."""
    return b == 0xC6 or b == 0xDB or b == 0xC9 or b == 0xDD or b == 0xDF


@cython.boundscheck(False)
@cython.wraparound(False)
def skip(buf: bytes, p: cython.Py_ssize_t, end: cython.Py_ssize_t) -> cython.Py_ssize_t:
    """The position after the msgpack value at ``p`` (containers included), or -1 when it is
    malformed or does not end by ``end``: Tarantool's ``mp_check`` plus ``mp_next``."""
    pending: cython.Py_ssize_t = 1
    b: cython.uint
    n: cython.Py_ssize_t
    head: cython.Py_ssize_t
    while pending:
        if p >= end:
            return -1
        b = buf[p]
        pending -= 1
        if b <= 0x7F or b >= 0xE0 or b == 0xC0 or b == 0xC2 or b == 0xC3:
            p += 1
        elif b <= 0x8F:
            pending += 2 * (b & 0x0F)
            p += 1
        elif b <= 0x9F:
            pending += b & 0x0F
            p += 1
        elif b <= 0xBF:
            p += 1 + (b & 0x1F)
        elif b == 0xC4 or b == 0xD9 or b == 0xC7:  # bin8, str8, ext8
            if p + 2 > end:
                return -1
            p += 2 + buf[p + 1] + (1 if b == 0xC7 else 0)
        elif b == 0xC5 or b == 0xDA or b == 0xC8 or b == 0xDC or b == 0xDE or wide32(b):
            head = 5 if wide32(b) else 3  # the type byte and a 16- or 32-bit size
            if p + head > end:
                return -1
            n = (buf[p + 1] << 8) | buf[p + 2]
            if head == 5:
                n = (n << 16) | (buf[p + 3] << 8) | buf[p + 4]
            if b == 0xDC or b == 0xDD:  # array16, array32
                pending += n
                p += head
            elif b == 0xDE or b == 0xDF:  # map16, map32
                pending += 2 * n
                p += head
            else:  # bin, str, ext (an ext has a type byte after its size)
                p += head + n + (1 if b == 0xC8 or b == 0xC9 else 0)
        elif b == 0xCA:
            p += 5
        elif b == 0xCB:
            p += 9
        elif b >= 0xCC and b <= 0xD3:  # uint8..64, int8..64
            p += 1 + (1 << ((b - 0xCC) & 3))
        elif b >= 0xD4 and b <= 0xD8:  # fixext 1, 2, 4, 8, 16
            p += 2 + (1 << (b - 0xD4))
        else:  # 0xC1 is never used
            return -1
    return p if p <= end else -1


@cython.boundscheck(False)
@cython.wraparound(False)
def array_start(buf: bytes) -> tuple[int, int]:
    """The item count of the msgpack array ``buf`` holds and where its first item starts, or
    (-1, -1) when ``buf`` does not start with an array header."""
    n: cython.Py_ssize_t = len(buf)
    b: cython.uint
    if n == 0:
        return -1, -1
    b = buf[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F, 1
    if b == 0xDC and n >= 3:
        return (buf[1] << 8) | buf[2], 3
    if b == 0xDD and n >= 5:
        return (buf[1] << 24) | (buf[2] << 16) | (buf[3] << 8) | buf[4], 5
    return -1, -1


@cython.locals(count=cython.Py_ssize_t, p=cython.Py_ssize_t, end=cython.Py_ssize_t, i=cython.Py_ssize_t)
def fields_at(buf: bytes, upto: cython.Py_ssize_t) -> tuple[int, list[int]]:
    """For the msgpack array in ``buf`` (all of it, checked to its end): its item count and the
    offsets where its first ``upto`` items start, followed by where the item after them starts
    (``len(buf)`` when the array has ``upto`` items or fewer). ValueError when ``buf`` is not one
    well-formed array."""
    count, p = array_start(buf)
    if count < 0:
        raise ValueError("not a msgpack array")
    end = len(buf)
    offsets: list[int] = []
    for i in range(count):
        if i <= upto:
            offsets.append(p)
        p = skip(buf, p, end)
        if p < 0:
            raise ValueError("a malformed msgpack array")
    if p != end:
        raise ValueError("bytes after the msgpack array")
    while len(offsets) <= upto:
        offsets.append(end)
    return count, offsets


_FIX_ARRAYS = tuple(bytes([0x90 | n]) for n in range(16))


@cython.locals(count=cython.Py_ssize_t, p=cython.Py_ssize_t, end=cython.Py_ssize_t, i=cython.Py_ssize_t,
               at=cython.Py_ssize_t, items=cython.Py_ssize_t, start=cython.Py_ssize_t, total=cython.Py_ssize_t,
               kept=cython.p_char, fresh=cython.p_char, into=cython.p_char)
def head_replaced(buf: bytes, upto: cython.Py_ssize_t, head: bytes) -> tuple[int, bytes]:
    """The msgpack array in ``buf`` (all of it, checked to its end) with its first ``upto`` items
    replaced by those of the array ``head`` (``upto`` items): the item count of ``buf`` and the new
    array, which has ``upto`` items if ``buf`` had fewer. The items kept are copied as bytes, not
    decoded (a task's header rewrite). ValueError when either is not one well-formed array."""
    count, p = array_start(buf)
    items, start = array_start(head)
    if count < 0 or items != upto:
        raise ValueError("not a msgpack array" if count < 0 else "a head of another length")
    end = len(buf)
    at = end
    for i in range(count):
        if i == upto:
            at = p
        p = skip(buf, p, end)
        if p < 0:
            raise ValueError("a malformed msgpack array")
    if p != end:
        raise ValueError("bytes after the msgpack array")
    if count <= upto:
        return count, head
    total = count
    kept = buf  # (compiled: cut from the buffers as char pointers, both ends given; see tubes/task.py's rettask)
    fresh = head
    if cython.compiled and total < 16:  # (a task's tuple): the new array written in one allocation
        out = PyBytes_FromStringAndSize(cython.NULL, 1 + len(head) - start + end - at)
        into = PyBytes_AS_STRING(out)
        into[0] = 0x90 | total
        memcpy(into + 1, fresh + start, len(head) - start)
        memcpy(into + 1 + len(head) - start, kept + at, end - at)
        return count, out
    if total < 16:
        header = _FIX_ARRAYS[total]
    elif total < 0x10000:
        header = b"\xdc" + total.to_bytes(2, "big")
    else:
        header = b"\xdd" + total.to_bytes(4, "big")
    return count, b"".join((header, fresh[start:len(head)], kept[at:end]))


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(count=cython.Py_ssize_t, p=cython.Py_ssize_t, q=cython.Py_ssize_t, end=cython.Py_ssize_t,
               n=cython.Py_ssize_t, _i=cython.Py_ssize_t, k=cython.Py_ssize_t, b=cython.uint,
               u=cython.ulonglong)
def leading_items(buf: bytes, upto: cython.Py_ssize_t, decode: Callable[[bytes], Any]) -> list[Any]:
    """The first ``upto`` items of the msgpack array in ``buf``, decoded; the items after them
    are not walked. Integers, nil, booleans and strings (UTF-8, surrogateescape) are decoded
    here; any other item's bytes go to ``decode``. (A task's header is integers and strings:
    recovery reads a million of them, and a general unpacker's set-up per call costs more than
    the decoding.) ValueError when the items are malformed."""
    count, p = array_start(buf)
    if count < 0:
        raise ValueError("not a msgpack array")
    end = len(buf)
    items: list[Any] = []
    for _i in range(min(count, upto)):
        if p >= end:
            raise ValueError("a malformed msgpack array")
        b = buf[p]
        if b <= 0x7F:
            items.append(b)
            p += 1
            continue
        if b >= 0xE0:
            items.append(cython.cast(cython.int, b) - 0x100)
            p += 1
            continue
        n = -1  # a string's size, when the item is one
        if 0xA0 <= b <= 0xBF:
            n = b & 0x1F
            p += 1
        elif b == 0xD9 and p + 2 <= end:
            n = buf[p + 1]
            p += 2
        elif b == 0xDA and p + 3 <= end:
            n = (buf[p + 1] << 8) | buf[p + 2]
            p += 3
        if n >= 0:
            if p + n > end:
                raise ValueError("a malformed msgpack array")
            items.append(buf[p:p + n].decode("utf-8", "surrogateescape"))
            p += n
            continue
        if b == 0xC0 or b == 0xC2 or b == 0xC3:
            items.append(None if b == 0xC0 else b == 0xC3)
            p += 1
            continue
        if 0xCC <= b <= 0xD3:  # uint8..64, int8..64
            n = 1 << ((b - 0xCC) & 3)
            if p + 1 + n > end:
                raise ValueError("a malformed msgpack array")
            u = 0
            for k in range(n):
                u = (u << 8) | buf[p + 1 + k]
            if b <= 0xCF:
                items.append(u)
            elif not cython.compiled:  # the casts below are C's: uncompiled, the same in Python
                items.append(u - (1 << (8 * n)) if u >> (8 * n - 1) else u)
            elif n == 1:
                items.append(cython.cast(cython.schar, u))
            elif n == 2:
                items.append(cython.cast(cython.short, u))
            elif n == 4:
                items.append(cython.cast(cython.int, u))
            else:
                items.append(cython.cast(cython.longlong, u))
            p += 1 + n
            continue
        q = skip(buf, p, end)
        if q < 0:
            raise ValueError("a malformed msgpack array")
        items.append(decode(buf[p:q]))
        p = q
    return items
