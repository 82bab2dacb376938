"""Tarantool's iterator types over an ordered key/value store.

An index is an ordered map from encoded keys (:mod:`boxqueue.storage.keys`) to values. Every iterator is a
seek, a direction and two predicates on the encoded key: skip entries before the range, stop at
the first entry past it. So a scan reads only what it returns, plus at most one entry.

The store is anything with LMDB's cursor interface (``set_range``, ``first``, ``last``, ``next``,
``prev``, ``key``, ``value``): an LMDB cursor for data spaces, :class:`ListCursor` for the system
views and the indexes kept in memory.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from boxqueue.storage.keys import MAX_EXACT, successor

EQ = 0
REQ = 1
ALL = 2
LT = 3
LE = 4
GE = 5
GT = 6
BITS_ALL_SET = 7
BITS_ANY_SET = 8
BITS_ALL_NOT_SET = 9
OVERLAPS = 10
NEIGHBOR = 11

NAMES = {
    EQ: "EQ", REQ: "REQ", ALL: "ALL", LT: "LT", LE: "LE", GE: "GE", GT: "GT",
    BITS_ALL_SET: "BITS_ALL_SET", BITS_ANY_SET: "BITS_ANY_SET",
    BITS_ALL_NOT_SET: "BITS_ALL_NOT_SET", OVERLAPS: "OVERLAPS", NEIGHBOR: "NEIGHBOR",
}
BY_NAME = {name: code for code, name in NAMES.items()}

FORWARD = frozenset({EQ, ALL, GE, GT})
TREE_ITERATORS = frozenset({EQ, REQ, ALL, LT, LE, GE, GT})
HASH_ITERATORS = frozenset({EQ, ALL, GT})

# Given a stored key that was cut to fit LMDB and its value, return the full encoded key.
TrueKey = Callable[[bytes, bytes], bytes]


def scan(cursor, iterator: int, prefix: bytes, true_key: TrueKey) -> Iterator[tuple[bytes, bytes]]:
    """Yield ``(encoded_key, value)`` for ``iterator`` with the encoded key ``prefix``."""
    if not prefix:
        if iterator in FORWARD:
            yield from _walk(cursor, True, cursor.first(), true_key)
        else:
            yield from _walk(cursor, False, cursor.last(), true_key)
        return
    p = prefix
    seek = p if len(p) <= MAX_EXACT else p[:MAX_EXACT]
    if iterator in FORWARD:
        for k, v in _walk(cursor, True, cursor.set_range(seek), true_key):
            if iterator == EQ:
                if k.startswith(p):
                    yield k, v
                elif k > p:
                    return
            elif iterator == GT:
                if k > p and not k.startswith(p):
                    yield k, v
            elif k >= p:  # GE, and ALL with a key
                yield k, v
        return
    upper = seek if iterator == LT and len(p) <= MAX_EXACT else successor(seek)
    positioned = cursor.set_range(upper) if upper is not None else False
    positioned = cursor.prev() if positioned else cursor.last()
    for k, v in _walk(cursor, False, positioned, true_key):
        if iterator == REQ:
            if k.startswith(p):
                yield k, v
            elif k < p:
                return
        elif iterator == LT:
            if k < p:
                yield k, v
        elif k < p or k.startswith(p):  # LE
            yield k, v


def page(values: Iterator[bytes], offset: int, limit: int) -> list[bytes]:
    """SELECT's offset and limit over a scan, reading no more of it than needed."""
    return list(itertools.islice(values, offset, offset + limit))


def _walk(cursor, forward: bool, positioned: bool, true_key: TrueKey) -> Iterator[tuple[bytes, bytes]]:
    step = cursor.next if forward else cursor.prev
    while positioned:
        k = cursor.key()
        if len(k) <= MAX_EXACT:
            yield k, cursor.value()
            positioned = step()
            continue
        # A run of cut keys sharing their first MAX_EXACT bytes: restore its true order.
        group_prefix = k[:MAX_EXACT]
        group = []
        while positioned and len(k) > MAX_EXACT and k[:MAX_EXACT] == group_prefix:
            v = cursor.value()
            group.append((true_key(k, v), v))
            positioned = step()
            if positioned:
                k = cursor.key()
        group.sort(reverse=not forward)
        yield from group


class ListCursor:
    """A cursor over keys sorted in memory, each with its value in ``value_of``: the system views
    (:meth:`of`) and the in-memory indexes (``spaces/index_views.py``, over a ``SortedList``)."""

    __slots__ = ("_keys", "_value_of", "_bisect", "_pos")

    def __init__(self, keys: Any, value_of: dict[bytes, bytes]) -> None:
        self._keys = keys
        self._value_of = value_of
        found = getattr(keys, "bisect_left", None)  # a SortedList's own, or the list's
        self._bisect = found if found is not None else functools.partial(bisect.bisect_left, keys)
        self._pos = -1

    @classmethod
    def of(cls, items: list[tuple[bytes, bytes]]) -> ListCursor:
        """A cursor over ``(key, value)`` pairs, in any order."""
        items = sorted(items)
        return cls([k for k, _ in items], dict(items))

    def _valid(self) -> bool:
        return 0 <= self._pos < len(self._keys)

    def first(self) -> bool:
        self._pos = 0
        return self._valid()

    def last(self) -> bool:
        self._pos = len(self._keys) - 1
        return self._valid()

    def set_range(self, key: bytes) -> bool:
        self._pos = self._bisect(key)
        return self._valid()

    def set_key(self, key: bytes) -> bool:
        self._pos = self._bisect(key)
        return self._valid() and self._keys[self._pos] == key

    def next(self) -> bool:
        self._pos += 1
        return self._valid()

    def prev(self) -> bool:
        self._pos -= 1
        return self._valid()

    def key(self) -> bytes:
        return self._keys[self._pos]

    def value(self) -> bytes:
        return self._value_of[self._keys[self._pos]]
