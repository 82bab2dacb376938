"""A sorted collection of distinct keys, compiled: a tube's orderings of its tasks (take order,
buried order, events, expiries) and of its claims' expiries.

sortedcontainers' ``SortedList`` kept them before, in Python: each ``add`` and ``remove`` ran a
few Python frames, and a queue cycle makes six of them (put: into the take order and the
events; take: out of both, into the events; ack: out of the events). This keeps its layout, a list
of sorted sublists of up to ``2 * LOAD`` keys with the largest key of each, so that an insertion
moves at most a sublist's pointers; and only the operations the engine uses: add, remove,
iteration in order, ``irange``, ``len``, an index and a leading slice. Keys are compared as
Python objects (tuples, here).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import Any

import cython

LOAD = 512  # a sublist is split in two when it passes 2 * LOAD keys


class Ordering:
    """Distinct comparable keys, kept in ascending order."""

    def __init__(self, keys: Iterable[Any] = (), ordered: bool = False) -> None:
        """``ordered``: ``keys`` is a list already in ascending order (kept, not sorted)."""
        ordered_keys = keys if ordered and type(keys) is list else sorted(keys)
        self._lists: list[list[Any]] = [ordered_keys[i : i + LOAD] for i in range(0, len(ordered_keys), LOAD)]
        self._maxes: list[Any] = [sub[-1] for sub in self._lists]
        self._len: int = len(ordered_keys)

    @cython.locals(pos=cython.Py_ssize_t, sub=list, maxes=list, lists=list)
    def add(self, key: Any) -> None:
        maxes = self._maxes
        lists = self._lists
        if not maxes:
            lists.append([key])
            maxes.append(key)
            self._len = 1
            return
        pos = bisect_right(maxes, key)
        if pos == len(maxes):  # after every key: the last sublist's new end (a queue's puts)
            pos -= 1
            sub = lists[pos]
            sub.append(key)
            maxes[pos] = key
        else:
            sub = lists[pos]
            insort(sub, key)
        self._len += 1
        if len(sub) > 2 * LOAD:
            rest = sub[LOAD:]
            del sub[LOAD:]
            maxes[pos] = sub[-1]
            lists.insert(pos + 1, rest)
            maxes.insert(pos + 1, rest[-1])

    @cython.locals(pos=cython.Py_ssize_t, at=cython.Py_ssize_t, sub=list, maxes=list)
    def remove(self, key: Any) -> None:
        """Take ``key`` out; ValueError if it is not there."""
        maxes = self._maxes
        pos = bisect_left(maxes, key)
        if pos == len(maxes):
            raise ValueError(f"{key!r} is not in the ordering")
        sub = self._lists[pos]
        at = bisect_left(sub, key)
        if sub[at] != key:
            raise ValueError(f"{key!r} is not in the ordering")
        del sub[at]
        self._len -= 1
        if not sub:
            del self._lists[pos]
            del maxes[pos]
        elif at == len(sub):
            maxes[pos] = sub[at - 1]

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Any]:
        return chain.from_iterable(self._lists)

    def __getitem__(self, index: Any) -> Any:
        """A key by its position (``[0]``, ``[-1]`` without a walk), or a list of keys for a slice."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                raise ValueError("an ordering is sliced with a step of 1 only")
            return list(islice(chain.from_iterable(self._lists), start, max(start, stop)))
        position = index + self._len if index < 0 else index
        if not 0 <= position < self._len:
            raise IndexError("ordering index out of range")
        if position == 0:
            return self._lists[0][0]
        if position == self._len - 1:
            return self._lists[-1][-1]
        for sub in self._lists:
            if position < len(sub):
                return sub[position]
            position -= len(sub)
        raise AssertionError("the sublists hold fewer keys than the count")  # pragma: no cover

    def irange(self, minimum: Any = None, maximum: Any = None) -> Iterator[Any]:
        """The keys from ``minimum`` to ``maximum``, both included (None: no bound), in order."""
        pos = 0
        at = 0
        if minimum is not None:
            pos = bisect_left(self._maxes, minimum)
            if pos < len(self._lists):
                at = bisect_left(self._lists[pos], minimum)
        return _keys_from(self._lists, pos, at, maximum)


def _keys_from(lists: list[list[Any]], pos: int, at: int, maximum: Any) -> Iterator[Any]:
    for number in range(pos, len(lists)):
        sub = lists[number]
        for index in range(at if number == pos else 0, len(sub)):
            key = sub[index]
            if maximum is not None and key > maximum:
                return
            yield key
