# cython: annotation_typing=True
"""Walking msgpack bytes without decoding them: where a value ends, where an array's items
start, which bytes hold a tuple's fields.

The iproto codec checks every request with :func:`skip` (Tarantool's ``mp_check``), and the tube
engine splits stored task tuples with :func:`fields_at` instead of an unpacker's method calls per
field. Compiled with Cython (``msgpack_scan.pxd``); other compiled modules cimport it.
"""

from __future__ import annotations

import cython


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
