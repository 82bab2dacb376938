"""One tube's in-memory state: orderings, counts, consumers, waiting takes, statistics.

Everything here is a cache of LMDB: the engine rebuilds it at start. ``tasks`` holds every task of
the tube in creation order; a task is *in* the structures of its status (:meth:`Tube.enter`) and
leaves them (:meth:`Tube.leave`) before the engine changes a field they are ordered by.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from typing import Any

import cython
import trio

from boxqueue.tubes.kinds import TubeKind
from boxqueue.tubes.ordering import EVENT_ORDER, EXPIRY_ORDER, READY_ORDER, Ordering
from boxqueue.tubes.task import BURIED, DONE, READY, STATUS_ORDER, TAKEN, Task

# What happened to tasks, counted for every API once each change is durable (the metrics read
# these plain integers when scraped): indexes into ``Tube.tally`` and the engine's totals.
TALLIES = ("puts", "takes", "acks", "releases", "buries", "kicks", "deletes", "expiries")
PUTS, TAKES, ACKS, RELEASES, BURIES, KICKS, DELETES, EXPIRIES = range(len(TALLIES))


def tally_of(old: str | None, new: str | None, expired: bool = False) -> int:
    """Which tally a durable change of status counts in, or -1 for none: a new task is a put;
    becoming taken a take (box.queue take, Deckard pull, Zaqar claim); a taken task deleted or
    done an ack; a taken task ready or delayed again a release (release, requeue, Deckard Ack and
    Nack, a claim released or expired, a deadline passed, a consumer gone); buried a bury; buried
    to ready a kick; any other delete a delete, or an expiry when its ttl ended it."""
    if old is None:
        return PUTS
    if new is None:
        return EXPIRIES if expired else ACKS if old == TAKEN else DELETES
    if new == TAKEN:
        return -1 if old == TAKEN else TAKES
    if new == BURIED:
        return -1 if old == BURIED else BURIES
    if old == TAKEN:
        return ACKS if new == DONE else RELEASES
    if old == BURIED:
        return KICKS
    return -1


# Where a space keeps numbers as a task's cid (box.queue's 1.5 layout declares it unsigned), the
# tasks a claim holds carry a number at or above this one: above every session's id.
CLAIM_HOLDERS = 1 << 63


def claim_holder(claim_id: str, numbered: bool) -> str | int:
    """What a task held by claim ``claim_id`` keeps as its cid: the claim's id, or in a space whose
    cid is a number, a number made from the id (the same one again after a restart)."""
    if not numbered:
        return claim_id
    digest = hashlib.blake2b(claim_id.encode(), digest_size=8).digest()
    return CLAIM_HOLDERS | (int.from_bytes(digest, "big") & (CLAIM_HOLDERS - 1))


def is_claim_holder(cid: Any) -> bool:
    return type(cid) is str or (type(cid) is int and cid >= CLAIM_HOLDERS)


class Claim:
    """A consumer identity that expires (a Zaqar claim, a Spark stream's batch): the tasks it
    holds are taken with its ``holder`` (:func:`claim_holder`) as their cid, until it is released
    or expires; claiming extends their life by ``grace``. Times in microseconds.

    Where its tasks are durably taken: in their stored headers (Zaqar's claims), or, for a
    **listed** claim (a Spark stream's), in its own record, which lists them with the delivery
    count each had when claimed (:attr:`listed`). A listed claim's tasks keep their stored headers
    as they were (ready) until the claim ends, when they are rewritten ready with this delivery
    counted, or until they are acknowledged (deleted): a claim of N tasks is one write, not N.
    Recovery takes again each listed task whose stored header still shows that count and ready
    (``QueueEngine._recover_claims``); one whose header changed since (it left the claim) is not."""

    __slots__ = ("id", "ttl", "grace", "expires", "updated", "tasks", "holder", "listed")

    def __init__(self, id: str, ttl: int, grace: int, expires: int, updated: int,
                 holder: str | int | None = None) -> None:
        self.id = id
        self.ttl = ttl
        self.grace = grace
        self.expires = expires
        self.updated = updated
        self.tasks: set[str] = set()  # ids of the tasks it holds now
        self.holder = id if holder is None else holder
        self.listed: dict[str, int] | None = None  # a listed claim's tasks: id -> ctaken when claimed

    def record(self, space_id: int, tube: str) -> list[Any]:
        fields = [space_id, tube, self.id, self.ttl, self.grace, self.expires, self.updated]
        if self.listed is not None:
            fields += [list(self.listed), list(self.listed.values())]
        return fields


class Remains:
    """What memory keeps of a tube it forgot (see ``EngineBase._forget_if_unused``): box.queue's
    counters and the metrics' tallies, which go on where they were if the tube is used again."""

    __slots__ = ("stats", "tally")

    def __init__(self, stats: dict[str, int], tally: list[int]) -> None:
        self.stats = stats
        self.tally = tally


@cython.locals(task=Task)
def _subqueue(task: Task) -> str:
    attrs = task.attrs
    return "" if not attrs else attrs.get("utube", "")


class Tube:
    """The tasks of one (space, tube) and what waits on them."""

    def __init__(self, space_id: int, name: str, kind: TubeKind) -> None:
        self.space_id = space_id
        self.name = name
        self.kind = kind
        self.tasks: dict[str, Task] = {}  # every task, in creation order
        # The tasks in orders (ordering.py's task orderings): take order (ipri, pri, created, id),
        # kick order (the same), every task by (event, created, id).
        self.ready: Ordering = Ordering(kind=READY_ORDER)
        self.buried: Ordering = Ordering(kind=READY_ORDER)
        self.timeline: Ordering = Ordering(kind=EVENT_ORDER)
        self.counts: dict[str, int] = dict.fromkeys(STATUS_ORDER, 0)
        self.stats: dict[str, int] = {}  # box.queue's counters, in the order they first moved
        self.waiters: deque[trio.Event] = deque()
        self.claims: dict[str | int, Claim] = {}  # by holder
        self.claim_times: Ordering = Ordering()  # (expires, holder)
        self.options: dict[str, Any] | None = None  # the stored record of a tube that has one
        self.limit = 0  # most tasks the tube keeps (Deckard's max_elements); 0: no limit
        self.by_expiry: Ordering | None = None  # by (expires, created, id), kept while limited
        self.monitor_wakeup = trio.Event()
        self.monitor_until = math.inf  # when the sleeping monitor looks again
        self.monitor_running = False
        self.unique_lock: trio.Lock | None = None  # put_unique: look up and insert as one step
        self.pending = 0  # writes in flight that insert tasks
        self.dropped = False  # the tube was dropped: what is still being written into it goes
        self.tally = [0] * len(TALLIES)  # see tally_of; kept with the Remains of a forgotten tube
        # A tube of sub-queues (its record says ``subqueues``: tarantool/queue's utube) takes at
        # most one task of each sub-queue (a task's ``attrs["utube"]``) at a time: how many
        # taken tasks each sub-queue has, counted from the first take on (None before).
        self.busy: dict[str, int] | None = None
        self.last_number: int | None = None  # numbered tasks: the highest number handed out

    # -- structures ------------------------------------------------------------------------

    @cython.locals(task=Task)
    def enter(self, task: Task) -> None:
        status = task.status
        if status == READY:
            self.ready.add(task)
        elif status == BURIED:
            self.buried.add(task)
        self.timeline.add(task)
        if self.by_expiry is not None:
            self.by_expiry.add(task)
        _count_in(self, task, status)

    def enter_many(self, tasks: list[Task]) -> None:
        """:meth:`enter` of each of ``tasks`` (in their order in the orderings, mostly: the
        tasks a batch puts, in creation order; those a claim holds, due together): each ordering
        extended once (:meth:`Ordering.extend`)."""
        ready: list[Task] = []
        buried: list[Task] = []
        _note_many(self, tasks, 1, ready, buried)
        if ready:
            self.ready.extend(ready)
        if buried:
            self.buried.extend(buried)
        self.timeline.extend(tasks)
        if self.by_expiry is not None:
            self.by_expiry.extend(tasks)

    def leave_many(self, tasks: list[Task]) -> None:
        """:meth:`leave` of each of ``tasks``: each ordering shortened once
        (:meth:`Ordering.remove_many`)."""
        ready: list[Task] = []
        buried: list[Task] = []
        _note_many(self, tasks, -1, ready, buried)
        if ready:
            self.ready.remove_many(ready)
        if buried:
            self.buried.remove_many(buried)
        self.timeline.remove_many(tasks)
        if self.by_expiry is not None:
            self.by_expiry.remove_many(tasks)

    @cython.locals(task=Task, first=Task, ready_sorted=cython.bint, buried_sorted=cython.bint,
                   timeline_sorted=cython.bint, expiry_sorted=cython.bint)
    def enter_all(self, tasks: list[Task]) -> Any:
        """``tasks`` (in creation order, ties in key order) into a tube that holds nothing (a
        recovery): into :attr:`tasks` and, as :meth:`enter` does, its orderings, made in one step
        each rather than a key at a time. Returns the earliest of their events.

        The keys come in creation order, so an ordering's keys are already sorted when the
        fields before ``created`` in its keys never go down from one task to the next; this is
        checked on those fields (numbers) as the keys are made, and only a list found out of order
        is sorted (comparing a million tuples costs about 0.2 s even when they are in order).
        One pass over the tasks: a million of them lie in memory in another order than this."""
        assert not self.tasks and tasks
        first = tasks[0]
        first_event = first.event
        ready: list[Any] = []
        buried: list[Any] = []
        timeline: list[Any] = []
        by_expiry: list[Any] | None = None if self.by_expiry is None else []
        ready_sorted = buried_sorted = timeline_sorted = expiry_sorted = True
        ready_last = buried_last = (first.ipri, first.pri)
        last_event, last_expiry = first.event, first.created + first.ttl
        for task in tasks:
            self.tasks[task.id] = task
            event = task.event
            if event < first_event:
                first_event = event
            status = task.status
            if status == READY:
                if ready_sorted and (task.ipri, task.pri) < ready_last:
                    ready_sorted = False
                ready_last = (task.ipri, task.pri)
                ready.append(task)
            elif status == BURIED:
                if buried_sorted and (task.ipri, task.pri) < buried_last:
                    buried_sorted = False
                buried_last = (task.ipri, task.pri)
                buried.append(task)
            if timeline_sorted and event < last_event:
                timeline_sorted = False
            last_event = event
            timeline.append(task)
            if by_expiry is not None:
                expiry = task.created + task.ttl
                if expiry_sorted and expiry < last_expiry:
                    expiry_sorted = False
                last_expiry = expiry
                by_expiry.append(task)
            _count_in(self, task, status)
        self.ready = Ordering(ready, ready_sorted, READY_ORDER)
        self.buried = Ordering(buried, buried_sorted, READY_ORDER)
        self.timeline = Ordering(timeline, timeline_sorted, EVENT_ORDER)
        if by_expiry is not None:
            self.by_expiry = Ordering(by_expiry, expiry_sorted, EXPIRY_ORDER)
        return first_event

    @cython.locals(task=Task)
    def leave(self, task: Task) -> None:
        status = task.status
        if status == READY:
            self.ready.remove(task)
        elif status == BURIED:
            self.buried.remove(task)
        self.timeline.remove(task)
        if self.by_expiry is not None:
            self.by_expiry.remove(task)
        _count_out(self, task, status)

    def next_number(self) -> str:
        """The id of a new task of a tube whose tasks are numbered (tarantool/queue's): one more
        than the highest number it holds, counting those handed to puts not durable yet (the
        module takes ``max(task_id) + 1``, so the highest id is given again once it is gone)."""
        last = self.last_number
        if last is None or (not self.pending and str(last) not in self.tasks):
            last = max((int(k) for k in self.tasks if k.isascii() and k.isdigit()), default=-1)
        self.last_number = last + 1
        return str(last + 1)

    def subqueues_busy(self) -> dict[str, int] | None:
        """The taken tasks per sub-queue of a tube of sub-queues (None for other tubes), counted
        once and kept up to date from then on."""
        if self.busy is None and self.options is not None and self.options.get("subqueues"):
            busy: dict[str, int] = {}
            for task in self.tasks.values():
                if task.status == TAKEN:
                    busy[_subqueue(task)] = busy.get(_subqueue(task), 0) + 1
            self.busy = busy
        return self.busy

    def first_ready(self) -> Task | None:
        return self.ready[0] if self.ready else None

    def last_ready(self) -> Task | None:
        return self.ready[-1] if self.ready else None

    def buried_in_order(self) -> list[Task]:
        return list(self.buried)

    def next_time(self) -> float:
        """When the monitor has something to do next: a task's event or a claim's expiry."""
        first = self.timeline[0].event if self.timeline else math.inf
        if self.claim_times and self.claim_times[0][0] < first:
            return self.claim_times[0][0]
        return first

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        if limit > 0 and self.by_expiry is None:
            self.by_expiry = Ordering(self.tasks.values(), kind=EXPIRY_ORDER)
        elif limit <= 0:
            self.by_expiry = None

    def place_claim(self, claim: Claim) -> None:
        self.claims[claim.holder] = claim
        self.claim_times.add((claim.expires, claim.holder))

    def unplace_claim(self, claim: Claim) -> None:
        if self.claims.get(claim.holder) is claim:
            del self.claims[claim.holder]
            self.claim_times.remove((claim.expires, claim.holder))

    def unused(self) -> bool:
        """Nothing here that memory must keep: the tube can be forgotten (a record that only
        names its kind goes with it)."""
        stored = self.options is not None and (self.kind.stored_tubes or bool(set(self.options) - {"kind"}))
        return not (
            self.tasks or self.waiters or self.claims or stored
            or self.limit or self.monitor_running or self.unique_lock is not None or self.pending
        )

    # -- statistics and signals ---------------------------------------------------------------

    def count(self, counter: str, by: int = 1) -> None:
        self.stats[counter] = self.stats.get(counter, 0) + by

    def uncount(self, counter: str, by: int = 1) -> None:
        """Take back a count whose change was undone (its write failed)."""
        left = self.stats.get(counter, 0) - by
        if left > 0:
            self.stats[counter] = left
        else:
            self.stats.pop(counter, None)

    def wake_one_consumer(self) -> None:
        """Wake the longest-waiting take, if any (the 1.5 capacity-one channel, without the
        token a put left for nobody: a take always looks before it waits)."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.is_set():
                waiter.set()
                return

    def wake_monitor_for(self, when: float) -> None:
        """Wake the monitor if ``when`` comes before the time it sleeps until."""
        if when < self.monitor_until:
            self.monitor_wakeup.set()


@cython.cfunc
@cython.locals(tube=Tube, task=Task, i=cython.Py_ssize_t, run=cython.Py_ssize_t, step=cython.int)
def _note_many(tube: Tube, tasks: list[Task], step: int, ready: list[Task], buried: list[Task]) -> None:
    """What :meth:`Tube.enter_many` (``step`` 1) or :meth:`Tube.leave_many` (-1) notes of
    ``tasks`` besides their keys: as :func:`_count_in` or :func:`_count_out` of each, the counts
    by status added up a run of one status at a time; and which of them are ``ready`` and
    ``buried`` (the orderings of their status)."""
    counted: Any = None  # the status of the run of tasks counted together, and its length
    run = 0
    for i in range(len(tasks)):
        task = tasks[i]
        status = task.status
        if status == READY:
            ready.append(task)
        elif status == BURIED:
            buried.append(task)
        if step > 0:
            _held_in(tube, task, status)
        else:
            _held_out(tube, task, status)
        if status is not counted:
            if run:
                tube.counts[counted] += step * run
            counted, run = status, 0
        run += 1
    if run:
        tube.counts[counted] += step * run


@cython.cfunc
@cython.locals(tube=Tube, task=Task)
def _count_out(tube: Tube, task: Task, status: str) -> None:
    """What :meth:`Tube.leave` takes back of a task besides its keys."""
    _held_out(tube, task, status)
    tube.counts[status] -= 1


@cython.cfunc
@cython.locals(tube=Tube, task=Task)
def _held_out(tube: Tube, task: Task, status: str) -> None:
    """A task taken is no longer its claim's, nor counted busy in its sub-queue."""
    if status != TAKEN:
        return
    if is_claim_holder(task.cid):
        claim = tube.claims.get(task.cid)
        if claim is not None:
            claim.tasks.discard(task.id)
    if tube.busy is not None:
        sub = _subqueue(task)
        left = tube.busy[sub] - 1
        if left:
            tube.busy[sub] = left
        else:
            del tube.busy[sub]


@cython.cfunc
@cython.locals(tube=Tube, task=Task)
def _count_in(tube: Tube, task: Task, status: str) -> None:
    """What :meth:`Tube.enter` and :meth:`Tube.enter_all` note of a task besides its keys: a
    claim's tasks, the counts by status, the busy sub-queues."""
    _held_in(tube, task, status)
    tube.counts[status] += 1


@cython.cfunc
@cython.locals(tube=Tube, task=Task)
def _held_in(tube: Tube, task: Task, status: str) -> None:
    """A task taken is its claim's, and counted busy in its sub-queue."""
    if status != TAKEN:
        return
    if is_claim_holder(task.cid):
        claim = tube.claims.get(task.cid)
        if claim is not None:
            claim.tasks.add(task.id)
    if tube.busy is not None:
        sub = _subqueue(task)
        tube.busy[sub] = tube.busy.get(sub, 0) + 1
