"""A sorted collection of distinct keys, compiled: a tube's orderings of its tasks (take order,
buried order, events, expiries) and of its claims' expiries.

sortedcontainers' ``SortedList`` kept them before, in Python: each ``add`` and ``remove`` ran a
few Python frames, and a queue cycle makes six of them (put: into the take order and the
events; take: out of both, into the events; ack: out of the events). This keeps its layout, a list
of sorted sublists of up to ``2 * LOAD`` keys with the largest key of each, so that an insertion
moves at most a sublist's pointers; and only the operations the engine uses: add and remove, of a
key or of a batch of them (``extend``, ``remove_many``: a run that lies together is moved at
once), iteration in order, ``irange``, ``len``, an index and a leading slice.

Keys are Python objects compared as such (a tube's claims: ``(expires, holder)`` tuples), or, in
an ordering of a ``kind``, the tasks themselves, compared by the fields that kind names (a task
ordering): ``READY_ORDER`` (ipri, pri, created, id: the take and kick orders), ``EVENT_ORDER``
(event, created, id) and ``EXPIRY_ORDER`` (created + ttl, created, id). A task ordering holds no
key tuple per task (two of them, about 150 bytes a task, were most of a queued task's memory
besides the task itself) and compares in C; a task's fields must not change while it is in one
(the engine takes a task out of its tube's orderings before it changes it, and puts it back
after). Its ``irange`` bounds are key tuples, compared with the tasks' keys.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import Any

import cython

from boxqueue.tubes.task import Task

LOAD = 512  # a sublist is split in two when it passes 2 * LOAD keys
KEYS, READY_ORDER, EVENT_ORDER, EXPIRY_ORDER = -1, 0, 1, 2


@cython.locals(task=Task)
def task_key(kind: int, task: Task) -> tuple[Any, ...]:
    """The key a task ordering of ``kind`` orders ``task`` by."""
    if kind == READY_ORDER:
        return (task.ipri, task.pri, task.created, task.id)
    if kind == EVENT_ORDER:
        return (task.event, task.created, task.id)
    return (task.created + task.ttl, task.created, task.id)


@cython.cfunc
@cython.locals(kind=cython.int, a=Task, b=Task)
def _task_less(kind: int, a: Task, b: Task) -> cython.bint:
    if kind == READY_ORDER:
        # (Tasks of a tube mostly share their lane and priority, small ints CPython keeps one
        # object each of: the identity test spares two comparisons of objects a step.)
        if a.ipri is not b.ipri and a.ipri != b.ipri:
            return a.ipri < b.ipri
        if a.pri is not b.pri and a.pri != b.pri:
            return a.pri < b.pri
    elif kind == EVENT_ORDER:
        if a.event != b.event:
            return a.event < b.event
    else:
        ea = a.created + a.ttl
        eb = b.created + b.ttl
        if ea != eb:
            return ea < eb
    if a.created != b.created:
        return a.created < b.created
    return a.id < b.id


@cython.cfunc
@cython.locals(kind=cython.int)
def _less(kind: int, a: Any, b: Any) -> cython.bint:
    """``a < b`` in an ordering of ``kind``; in a task ordering, either may be a key tuple."""
    if kind == KEYS:
        return a < b
    if type(a) is tuple or type(b) is tuple:
        return (a if type(a) is tuple else task_key(kind, a)) < (b if type(b) is tuple else task_key(kind, b))
    return _task_less(kind, a, b)


@cython.cfunc
@cython.locals(kind=cython.int, lo=cython.Py_ssize_t, hi=cython.Py_ssize_t, mid=cython.Py_ssize_t)
def _bisect_left(kind: int, seq: list[Any], x: Any) -> cython.Py_ssize_t:
    if kind == KEYS:
        return bisect_left(seq, x)
    lo, hi = 0, len(seq)
    while lo < hi:
        mid = (lo + hi) // 2
        if _less(kind, seq[mid], x):
            lo = mid + 1
        else:
            hi = mid
    return lo


@cython.cfunc
@cython.locals(kind=cython.int, lo=cython.Py_ssize_t, hi=cython.Py_ssize_t, mid=cython.Py_ssize_t)
def _bisect_right(kind: int, seq: list[Any], x: Any) -> cython.Py_ssize_t:
    if kind == KEYS:
        return bisect_right(seq, x)
    lo, hi = 0, len(seq)
    while lo < hi:
        mid = (lo + hi) // 2
        if _less(kind, x, seq[mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


class Ordering:
    """Distinct comparable keys, kept in ascending order."""

    def __init__(self, keys: Iterable[Any] = (), ordered: bool = False, kind: int = KEYS) -> None:
        """``ordered``: ``keys`` is a list already in ascending order (kept, not sorted);
        ``kind``: a task ordering's (the keys are tasks), or ``KEYS``."""
        self.kind = kind
        if ordered and type(keys) is list:
            ordered_keys = keys
        elif kind == KEYS:
            ordered_keys = sorted(keys)
        else:
            ordered_keys = sorted(keys, key=lambda task: task_key(kind, task))
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
        pos = len(maxes) - 1
        if not _less(self.kind, key, maxes[pos]):  # after every key: the last sublist's new end (a queue's puts)
            sub = lists[pos]
            sub.append(key)
            maxes[pos] = key
        else:
            pos = _bisect_right(self.kind, maxes, key)
            sub = lists[pos]
            sub.insert(_bisect_right(self.kind, sub, key), key)
        self._len += 1
        if len(sub) > 2 * LOAD:
            rest = sub[LOAD:]
            del sub[LOAD:]
            maxes[pos] = sub[-1]
            lists.insert(pos + 1, rest)
            maxes.insert(pos + 1, rest[-1])

    @cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t, n=cython.Py_ssize_t, kind=cython.int, sub=list,
                   maxes=list, lists=list, pos=cython.Py_ssize_t, at=cython.Py_ssize_t, end=cython.Py_ssize_t)
    def extend(self, keys: list[Any]) -> None:
        """:meth:`add` of each of ``keys``, in order. A run of them, each after the one before
        and all of them before the next key held (a batch of puts, in creation order, on the
        end; a claim's tasks, all due when the claim ends, in the timeline), goes in at once:
        one search and one insertion of the run, rather than one of each a key."""
        kind = self.kind
        lists = self._lists
        maxes = self._maxes
        n = len(keys)
        i = 0
        while i < n:
            bound: Any = None  # the key held that the run must stay below (None: the end)
            if not maxes:
                lists.append([])
                maxes.append(None)
                pos = at = 0
            elif not _less(kind, keys[i], maxes[len(maxes) - 1]):  # after every key
                pos = len(maxes) - 1
                at = len(lists[pos])
            else:
                pos = _bisect_right(kind, maxes, keys[i])
                sub = lists[pos]
                at = _bisect_right(kind, sub, keys[i])
                bound = sub[at]  # (maxes[pos] is above the key, so a key of sub follows it)
            j = i + 1
            while j < n and _less(kind, keys[j - 1], keys[j]) and (bound is None or _less(kind, keys[j], bound)):
                j += 1
            sub = lists[pos]
            end = len(sub)
            sub[at:at] = keys[i:j]
            if at == end:
                maxes[pos] = sub[len(sub) - 1]
            self._len += j - i
            if len(sub) > 2 * LOAD:  # split as add splits: sublists of LOAD keys after this one
                pieces = [sub[k : k + LOAD] for k in range(LOAD, len(sub), LOAD)]
                del sub[LOAD:]
                maxes[pos] = sub[LOAD - 1]
                lists[pos + 1 : pos + 1] = pieces
                maxes[pos + 1 : pos + 1] = [piece[len(piece) - 1] for piece in pieces]
            i = j

    @cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t, n=cython.Py_ssize_t, kind=cython.int, sub=list,
                   maxes=list, lists=list, pos=cython.Py_ssize_t, at=cython.Py_ssize_t)
    def remove_many(self, keys: list[Any]) -> None:
        """:meth:`remove` of each of ``keys``, in order; ValueError at the first that is not
        there (those before it are gone). A run of them that lie together in the ordering, in
        its order (a claim's tasks, the head of the take order), goes at once: one search and
        one deletion of the run."""
        kind = self.kind
        lists = self._lists
        maxes = self._maxes
        n = len(keys)
        i = 0
        while i < n:
            key = keys[i]
            if maxes and kind != KEYS and lists[0][0] is key:  # the head (takes and claims)
                pos = at = 0
                sub = lists[0]
            else:
                pos = _bisect_left(kind, maxes, key)
                if pos == len(maxes):
                    raise ValueError(f"{key!r} is not in the ordering")
                sub = lists[pos]
                at = _bisect_left(kind, sub, key)
                if at == len(sub) or (sub[at] is not key if kind != KEYS else sub[at] != key):
                    raise ValueError(f"{key!r} is not in the ordering")
            j = i + 1
            while j < n and at + j - i < len(sub) and (sub[at + j - i] is keys[j] if kind != KEYS
                                                          else sub[at + j - i] == keys[j]):
                j += 1
            del sub[at : at + j - i]
            self._len -= j - i
            if not sub:
                del lists[pos]
                del maxes[pos]
            elif at == len(sub):
                maxes[pos] = sub[at - 1]
            i = j

    @cython.locals(pos=cython.Py_ssize_t, at=cython.Py_ssize_t, sub=list, maxes=list)
    def remove(self, key: Any) -> None:
        """Take ``key`` out; ValueError if it is not there."""
        maxes = self._maxes
        if maxes and self.kind != KEYS and self._lists[0][0] is key:  # the head (a take)
            pos = at = 0
            sub = self._lists[0]
        else:
            pos = _bisect_left(self.kind, maxes, key)
            if pos == len(maxes):
                raise ValueError(f"{key!r} is not in the ordering")
            sub = self._lists[pos]
            at = _bisect_left(self.kind, sub, key)
            if at == len(sub) or (sub[at] is not key if self.kind != KEYS else sub[at] != key):
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
            pos = _bisect_left(self.kind, self._maxes, minimum)
            if pos < len(self._lists):
                at = _bisect_left(self.kind, self._lists[pos], minimum)
        return _keys_from(self.kind, self._lists, pos, at, maximum)


def _keys_from(kind: int, lists: list[list[Any]], pos: int, at: int, maximum: Any) -> Iterator[Any]:
    for number in range(pos, len(lists)):
        sub = lists[number]
        for index in range(at if number == pos else 0, len(sub)):
            key = sub[index]
            if maximum is not None and _less(kind, maximum, key):
                return
            yield key
