"""Linearizability of one register's history: the Wing-Gong search with Lowe's memoisation.

The search walks the history's calls and returns in time order, tries to linearize each call
that is open (apply it to the model; remember the set of linearized operations and the model's
state; a pair seen before is a dead end), and backtracks when it meets the return of an operation
not yet linearized. Knossos and Porcupine search the same way. Unknown operations would make the
remembered sets grow with every combination of them tried; a set that adds unknown operations to
one already explored (same answered operations, same state) is a dead end too, since leaving an
unknown operation out is always allowed.

Operations that completed ``ok`` must take effect between their call and their return. ``fail``
operations are left out (they did not happen). ``info`` operations may take effect at any point
after their call, or never: their return lies at infinity, so the search succeeds once every
operation that returned is linearized, whatever remains of the unknown ones. An unknown read
constrains nothing and is left out.

The model is a register holding ``None`` (no value yet) or a value: ``read`` returns it, ``write``
sets it, ``cas(old, new)`` sets it when it holds ``old``; a cas that completed ok with the answer
False (the server found no such value) requires the register NOT to hold ``old`` at its point.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

Unset = None


@dataclass(frozen=True)
class RegisterOp:
    """One operation on one register. ``f``: read, write or cas; ``arg``: the written value, or
    ``(old, new)``; ``result``: what a read saw, whether a cas applied; ``ok``: completed ok
    (else unknown); ``ref``: the caller's handle for reports."""

    f: str
    arg: Any
    result: Any
    call: float
    ret: float  # math.inf when unknown
    ok: bool
    ref: Any = None


def step(state: Hashable, op: RegisterOp) -> tuple[bool, Hashable]:
    """Whether ``op`` may take effect on ``state`` now, and the state after it."""
    if op.f == "read":
        return state == op.result, state
    if op.f == "write":
        return True, op.arg
    if op.f == "cas":
        old, new = op.arg
        if not op.ok:  # unknown: takes effect only if it can; otherwise it is one that never did
            return state == old, new
        if op.result:
            return state == old, new
        return state != old, state
    raise ValueError(f"unknown register operation {op.f!r}")


@dataclass
class Entry:
    op_id: int
    is_call: bool
    time: float
    prev: Entry | None = None
    next: Entry | None = None
    match: Entry | None = None  # a call's return


@dataclass
class Result:
    linearizable: bool | None  # None: the search ran out of budget
    explored: int
    ops: list[RegisterOp]  # the operations searched (unknown reads left out): the indexes below
    order: list[int] = field(default_factory=list)  # a linearization (op indexes), when found
    # When not linearizable: the deepest point reached, the operation whose return could not be
    # explained there, and the states the register could hold at that point.
    deepest: list[int] = field(default_factory=list)
    stuck: int | None = None
    states_at_stuck: list[Hashable] = field(default_factory=list)


def check(ops: list[RegisterOp], initial: Hashable = Unset, budget: int = 2_000_000) -> Result:
    """Whether ``ops`` (one register's) is linearizable from ``initial``."""
    ops = [op for op in ops if op.ok or op.f != "read"]
    events: list[tuple[float, int, int, bool]] = []
    for i, op in enumerate(ops):
        events.append((op.call, 0, i, True))
        # returns before calls at the same instant: a return at t precedes a call at t
        events.append((op.ret, -1, i, False))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    head = Entry(-1, False, -math.inf)
    last = head
    calls: dict[int, Entry] = {}
    returns: dict[int, Entry] = {}
    for t, _, i, is_call in events:
        entry = Entry(i, is_call, t, prev=last)
        last.next = entry
        last = entry
        (calls if is_call else returns)[i] = entry
    for i, call in calls.items():
        call.match = returns[i]

    def lift(call: Entry) -> None:
        for e in (call, call.match):
            assert e is not None and e.prev is not None
            e.prev.next = e.next
            if e.next is not None:
                e.next.prev = e.prev

    def unlift(call: Entry) -> None:
        for e in (call.match, call):
            assert e is not None and e.prev is not None
            e.prev.next = e
            if e.next is not None:
                e.next.prev = e

    state: Hashable = initial
    linearized = 0
    stack: list[tuple[Entry, Hashable]] = []
    answered = sum(1 << i for i, op in enumerate(ops) if op.ok)
    # (the answered operations linearized, state) -> the sets of unknown ones linearized with them
    # that were explored. A node that has linearized a superset of unknown operations is dominated:
    # whatever completes it completes the explored one too, which may leave those unknown
    # operations out (they may never take effect) and is otherwise in the same place.
    cache: dict[tuple[int, Hashable], list[int]] = {(0, initial): [0]}
    explored = 0
    best: tuple[int, list[int], int | None, set[Hashable]] = (-1, [], None, set())
    entry = head.next
    while True:
        if entry is None or (not entry.is_call and math.isinf(entry.time)):
            return Result(True, explored, ops, order=[e.op_id for e, _ in stack])
        explored += 1
        if explored > budget:
            return Result(None, explored, ops, deepest=best[1], stuck=best[2])
        op = ops[entry.op_id]
        if entry.is_call:
            can, after = step(state, op)
            if can:
                marked = linearized | (1 << entry.op_id)
                key, unknown = (marked & answered, after), marked & ~answered
                seen = cache.setdefault(key, [])
                if not any((explored_set & ~unknown) == 0 for explored_set in seen):
                    seen.append(unknown)
                    stack.append((entry, state))
                    state, linearized = after, marked
                    lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
            continue
        # the return of an operation not linearized: what came before cannot explain it
        depth = len(stack)
        if depth > best[0]:
            best = (depth, [e.op_id for e, _ in stack], entry.op_id, {state})
        elif depth == best[0] and best[2] == entry.op_id:
            best[3].add(state)
        if not stack:
            break
        call, state = stack.pop()
        linearized &= ~(1 << call.op_id)
        unlift(call)
        entry = call.next
    return Result(False, explored, ops, deepest=best[1], stuck=best[2], states_at_stuck=sorted(best[3], key=repr))
