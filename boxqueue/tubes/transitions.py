"""The task state changes the engine's verbs share, as functions of a task (mutations applied in
memory before the change is written)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cython

from boxqueue.tubes.task import DELAYED, READY, TAKEN, Task
from boxqueue.tubes.tube import Claim

Mutate = Callable[[Task], None]

INTERNAL_ERROR_RETRY_US = 5_000_000
MAX_TIME_US = 2**63 - 1  # every stored time fits a signed 64-bit integer


def life(expires: int, created: int) -> int:
    return min(max(expires - created, 0), MAX_TIME_US - created)


def expiring_at(expires: int) -> Mutate:
    """A new expiry; a delay, lock or deadline that ends before it still ends when it did."""

    def expiring(t: Task) -> None:
        old = t.created + t.ttl
        t.ttl = life(expires, t.created)
        if t.status in (DELAYED, TAKEN) and t.event < old:
            t.event = min(t.event, t.created + t.ttl)
        else:
            t.event = t.created + t.ttl

    return expiring


def held_by(claim: Claim, now: int) -> Mutate:
    """Taken by ``claim``: a task that would die before the claim lives ``grace`` past it."""
    return _HeldBy(claim.expires, claim.grace, claim.ttl, claim.holder)


@cython.cclass
class _HeldBy:
    """:func:`held_by`'s mutation: an object with the claim's times as C integers, called for
    each task a claim takes (a Spark batch's tens of thousands), where a closure read them from
    the claim on every call."""

    __slots__ = ("expires", "grace", "ttl", "holder")

    def __init__(self, expires: int, grace: int, ttl: int, holder: Any) -> None:
        self.expires = expires
        self.grace = grace
        self.ttl = ttl
        self.holder = holder

    @cython.locals(t=Task, life=cython.longlong)
    def __call__(self, t: Task) -> None:
        life = t.ttl  # (every stored time fits 64 bits: added up as C integers)
        if t.created + life < self.expires:
            life = self.expires + self.grace - t.created
            t.ttl = life
            if t.attrs is not None:
                t.attrs["lifetime"] = self.ttl + self.grace
        if t.status != TAKEN:
            t.ctaken += 1
        t.status, t.cid, t.ttr = TAKEN, self.holder, self.ttl
        t.event = min(self.expires, t.created + life)


def made_ready(task: Task) -> None:
    task.status, task.event, task.cid = READY, task.created + task.ttl, 0


def unburied(task: Task) -> None:
    task.status = READY  # cbury counts buries only (D6)


def retry_later(now: int) -> Mutate:
    def later(t: Task) -> None:
        t.event = now + INTERNAL_ERROR_RETRY_US

    return later
