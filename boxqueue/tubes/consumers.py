"""Taking tasks, for each kind of consumer the engine knows:

* a session (box.queue's take, blocking up to a timeout; :meth:`Consumers.release_consumer` when
  it disconnects: its tasks are ready again at once, D11);
* nobody, with only a deadline (a Deckard pull, :meth:`Consumers.take_many`);
* a :class:`tubes.tube.Claim`, an identity that expires and extends its tasks' life by its grace
  (Zaqar's claims, and a Spark stream's batches: :mod:`boxqueue.tubes.streams`).

Settling a taken task without an owner check (Deckard's Ack and Nack) is here too."""

from __future__ import annotations

import contextlib
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import cython
import trio

import boxqueue.tubes.transitions as tr
from boxqueue.errcodes import BoxError
from boxqueue.spaces.later import Later
from boxqueue.tubes.engine_base import (
    CLAIM_RECORDS,
    MAX_TIME_US,
    QueueSpace,
    now_us,
    proc_error,
)
from boxqueue.tubes.kinds import MED_PRI, QUEUE_MODULE, back_score
from boxqueue.tubes.producers import Producers
from boxqueue.tubes.task import (
    DELAYED,
    QUEUE15,
    READY,
    TAKEN,
    Task,
    created_of,
    in_creation_order,
)
from boxqueue.tubes.tube import Claim, Tube, claim_holder

log = logging.getLogger(__name__)


class Consumers(Producers):
    def take(self, space_id: int, tube_name: str, consumer: int, timeout: float) -> Awaitable[bytes | None]:
        """The first ready task in take order, waiting up to ``timeout`` seconds for one.

        A task ready now is taken without a task of its own (a :class:`Later`); only a take that
        has to wait is a coroutine."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((queue_space.id, tube_name))
        if tube is None:
            if timeout <= 0:  # polling a tube that holds nothing: no tube is made for it
                self._count_forgotten((queue_space.id, tube_name), "take_timeout")
                return Later.done(None)
            tube = self._tube(queue_space, tube_name)
        taking = self._take_ready(queue_space, tube, consumer)
        if taking is not None:
            return taking
        if timeout <= 0:
            tube.count("take_timeout")
            self._forget_if_unused(tube)
            return Later.done(None)
        return self._take_waiting(queue_space, tube_name, consumer, trio.current_time() + timeout)

    async def _take_waiting(self, queue_space: QueueSpace, tube_name: str, consumer: int, deadline: float) -> bytes | None:
        while True:
            tube = self._tube(queue_space, tube_name)
            waiter = trio.Event()
            tube.waiters.append(waiter)
            try:
                with trio.move_on_at(deadline):
                    await waiter.wait()
            finally:
                if not waiter.is_set():
                    with contextlib.suppress(ValueError):
                        tube.waiters.remove(waiter)
            tube = self._tube(queue_space, tube_name)
            taking = self._take_ready(queue_space, tube, consumer)
            if taking is not None:
                return await taking
            if trio.current_time() >= deadline:
                tube.count("take_timeout")
                self._forget_if_unused(tube)
                return None

    @cython.locals(tube=Tube, task=Task)
    def _take_ready(self, queue_space: QueueSpace, tube: Tube, consumer: int) -> Later[bytes] | None:
        task = self._first_live_ready(tube)
        if task is None:
            return None
        event = min(now_us() + task.ttr, task.created + task.ttl)
        return self._change(queue_space, tube, task, _Taken(event, consumer), counter="take",
                            after=tube.wake_one_consumer)

    @cython.locals(tube=Tube, task=Task)
    def _first_live_ready(self, tube: Tube) -> Task | None:
        """The head of the ready list, skipping tasks already past their ttl (D7): the monitor,
        woken here, deletes those."""
        now = now_us()
        busy = tube.subqueues_busy() if tube.options else None
        for task in tube.ready:
            if task.created + task.ttl > now:
                if busy and task.attrs and task.attrs.get("utube", "") in busy:
                    continue  # its sub-queue has a task taken already
                return task
            tube.monitor_wakeup.set()
        return None

    async def release_consumer(self, consumer: int) -> None:
        """The consumer is gone (its connection closed): its taken tasks are ready at once (D11),
        counted as ``ready_by_disconnect`` in the same step (as ``release`` in tarantool/queue's
        tubes: its ``calls.release`` counts the tasks a session's end releases)."""
        held = list(self._held.get(consumer, {}).items())
        pending = []
        for task, tube in held:
            if task.status == TAKEN and task.cid == consumer and tube.tasks.get(task.id) is task:
                try:
                    queue_space = self.queue_space(tube.space_id)
                except BoxError:
                    continue  # its space is gone
                counter = "release" if tube.kind.name == QUEUE_MODULE else "ready_by_disconnect"
                pending.append(self._change(queue_space, tube, task, tr.made_ready, counter=counter,
                                            after=tube.wake_one_consumer))
        for later in pending:
            try:
                await later
            except Exception:
                log.exception("could not return a task of consumer %s to ready", consumer)

    # -- consumers: pulls, settles, claims (Deckard's and Zaqar's) --------------------------

    def free_tasks(self, tube: Tube, limit: int, low: float = -math.inf, high: float = math.inf,
                   created: tuple[int, int] | None = None) -> list[Task]:
        """Up to ``limit`` ready tasks that have not expired, in take order, with a priority
        in [low, high] (a Deckard score range: its tubes keep ipri at 127) and, if ``created``
        is given, created after its first and at or before its second time."""
        now = now_us()
        ready = tube.ready if low == -math.inf and high == math.inf else tube.ready.irange(
            (MED_PRI, low), (MED_PRI, high, math.inf))
        chosen: list[Task] = []
        for task in ready:
            if task.created + task.ttl <= now:
                tube.monitor_wakeup.set()
                continue
            if created is not None and not created[0] < task.created <= created[1]:
                continue
            chosen.append(task)
            if len(chosen) >= limit:
                break
        return chosen

    def take_many(
        self, space_id: int, tube_name: str, limit: int, ttr: int, low: float = -math.inf, high: float = math.inf
    ) -> Later[list[tuple[Task, bytes]]]:
        """Up to ``limit`` ready tasks taken by nobody until ``ttr`` from now (a Deckard pull:
        an ack deadline with no session), with their stored tuples."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        chosen = [] if tube is None or limit <= 0 else self.free_tasks(tube, limit, low, high)
        if not chosen:
            return Later.done([])
        assert tube is not None
        # A past deadline (Deckard takes a negative ack_deadline_ms) times out at once; a far one
        # is capped where every stored time is (found by fuzzing: either failed the stored write).
        ttr = min(max(ttr, 0), MAX_TIME_US)
        deadline = min(now_us() + ttr, MAX_TIME_US)

        def pulled(t: Task) -> None:
            t.status, t.event, t.cid, t.ttr, t.ctaken = TAKEN, min(deadline, t.expires), 0, ttr, t.ctaken + 1

        later = self._batch(queue_space, tube, changes=[(t, pulled, None) for t in chosen])
        # A changed task's row is always there (bytes): only inserts of nothing answer None.
        return later.map(lambda raws: [(t.copy(), raw) for t, raw in zip(chosen, cast("list[bytes]", raws), strict=True)])

    def untake(self, space_id: int, tube_name: str, ids: Iterable[str]) -> Later[list[bytes | None]]:
        """Taken tasks back to ready where they were, as if never taken."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        found = [] if tube is None else [t for i in ids if (t := tube.tasks.get(i)) is not None and t.status == TAKEN]
        if not found:
            return Later.done([])
        assert tube is not None

        def back(t: Task) -> None:
            t.status, t.event, t.cid, t.ctaken = READY, t.expires, 0, max(t.ctaken - 1, 0)

        return self._batch(queue_space, tube, changes=[(t, back, None) for t in found])

    def settle(
        self,
        space_id: int,
        tube_name: str,
        task_id: str,
        *,
        pri: float | None,
        delay: int = 0,
        unlock_pri: float | None = None,
        attrs: Callable[[dict[str, Any]], None] | None = None,
    ) -> Later[bool]:
        """A taken task (by anyone) released: ready at once with ``pri`` (None: the back of a
        tube of its kind), or locked for ``delay`` and then ready with ``unlock_pri`` (None: the
        back, at that time). ``attrs`` updates the task's attrs. False if it is not taken."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        task = None if tube is None else tube.tasks.get(task_id)
        if task is None or task.status != TAKEN:
            return Later.done(False)
        assert tube is not None
        now = now_us()

        def settled(t: Task) -> None:
            if attrs is not None:
                if t.attrs is None:
                    raise proc_error("this space keeps no attributes")
                attrs(t.attrs)
            t.cid = 0
            if delay > 0:
                t.status, t.event = DELAYED, min(now + delay, t.expires, MAX_TIME_US)
                if t.attrs is not None:
                    t.attrs["unlock"] = unlock_pri
            else:
                t.status, t.event = READY, t.expires
                t.pri = back_score() if pri is None else pri

        return self._change(queue_space, tube, task, settled, after=tube.wake_one_consumer).map(lambda _raw: True)

    def claim(
        self, space_id: int, tube_name: str, *, ttl: int, grace: int, limit: int, claim_id: str | None = None,
        created: tuple[int, int] | None = None,
    ) -> Later[tuple[Claim, list[tuple[Task, bytes]]] | None]:
        """A new claim holding up to ``limit`` free tasks, in take order (created in the range
        ``created``, if given), until ``ttl`` from now; a task that would die before the claim
        lives ``grace`` past it. ``claim_id``: the caller's id for it (one not in use), else a new
        one. None if nothing is free."""
        made = self._new_claim(space_id, tube_name, ttl=ttl, grace=grace, limit=limit, claim_id=claim_id,
                               created=created, listed=False)
        if made is None:
            return Later.done(None)
        claim, chosen, later = made
        return later.map(lambda raws: (claim, [(t, raw) for t, raw in zip(chosen, raws, strict=True) if raw]))

    def listed_claim(self, space_id: int, tube_name: str, claim_id: str, *, ttl: int, limit: int,
                     created: tuple[int, int] | None = None) -> Later[int]:
        """:meth:`claim` for a Spark stream's batch, with no grace: a listed claim (one write,
        its record, whatever the number of tasks: see :class:`tubes.tube.Claim`); how many tasks
        it holds, 0 if none was free. While a change hook is set (Sonya's task events, a
        tarantool/queue callback), whose subscribers read the stored headers, the tasks' headers
        are written as for any claim."""
        made = self._new_claim(space_id, tube_name, ttl=ttl, grace=0, limit=limit, claim_id=claim_id,
                               created=created, listed=not self.hooks)
        if made is None:
            return Later.done(0)
        _claim, chosen, later = made
        return later.map(lambda _raws: len(chosen))

    def _new_claim(
        self, space_id: int, tube_name: str, *, ttl: int, grace: int, limit: int, claim_id: str | None,
        created: tuple[int, int] | None, listed: bool,
    ) -> tuple[Claim, list[Task], Later[list[bytes | None]]] | None:
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        chosen = [] if tube is None else self.free_tasks(tube, limit, created=created)
        if not chosen:
            return None
        assert tube is not None
        now = now_us()
        claim_id = uuid.uuid4().hex if claim_id is None else claim_id
        claim = Claim(claim_id, ttl, grace, now + ttl, now, self.claim_holder(queue_space, claim_id))
        if listed:
            claim.listed = {t.id: t.ctaken for t in chosen}
        tube.place_claim(claim)
        holding = tr.held_by(claim, now)
        record = self._record_write(CLAIM_RECORDS, claim.record(space_id, tube_name), [])
        later = self._batch(queue_space, tube, changes=[(t, holding, None) for t in chosen], records=[record],
                            undo_extra=lambda: tube.unplace_claim(claim), rewrite=not listed)
        return claim, chosen, later

    def claim_holder(self, queue_space: QueueSpace, claim_id: str) -> str | int:
        """What the tasks of claim ``claim_id`` keep as their cid in this space."""
        return claim_holder(claim_id, queue_space.layout is QUEUE15)

    def present_claim(self, space_id: int, tube_name: str, claim_id: str) -> Claim | None:
        """The claim with this id, live or expired but not yet ended by the tube's monitor."""
        tube = self.tubes.get((space_id, tube_name))
        if tube is None:
            return None
        return tube.claims.get(self.claim_holder(self.queue_space(space_id), claim_id))

    def live_claim(self, space_id: int, tube_name: str, claim_id: str) -> Claim | None:
        claim = self.present_claim(space_id, tube_name, claim_id)
        return claim if claim is not None and claim.expires > now_us() else None

    @cython.locals(tube=Tube, task=Task, now=cython.longlong)
    def claimed_tasks(self, space_id: int, tube_name: str, claim: Claim) -> list[Task]:
        """The live tasks a claim holds, in creation order."""
        tube = self.tubes.get((space_id, tube_name))
        if tube is None:
            return []
        now = now_us()
        # A listed claim names its tasks in take order, most often creation order already.
        held = claim.tasks if claim.listed is None else [i for i in claim.listed if i in claim.tasks]
        tasks = []
        for task_id in held:
            found = tube.tasks.get(task_id)
            if found is not None:
                task = found
                if task.created + task.ttl > now:
                    tasks.append(task)
        return tasks if in_creation_order(tasks) else sorted(tasks, key=created_of)

    def renew_claim(self, space_id: int, tube_name: str, claim_id: str, *, ttl: int, grace: int) -> Later[bool]:
        """The claim lasts ``ttl`` from now; its tasks get the same extension as at claiming."""
        queue_space = self.queue_space(space_id)
        claim = self.live_claim(space_id, tube_name, claim_id)
        if claim is None:
            return Later.done(False)
        tube = self.tubes[(space_id, tube_name)]
        now = now_us()
        before = (claim.ttl, claim.grace, claim.expires, claim.updated)
        tube.unplace_claim(claim)
        claim.ttl, claim.grace, claim.expires, claim.updated = ttl, grace, now + ttl, now
        tube.place_claim(claim)
        holding = tr.held_by(claim, now)
        tasks = [tube.tasks[i] for i in sorted(claim.tasks)]

        def undo() -> None:
            tube.unplace_claim(claim)
            claim.ttl, claim.grace, claim.expires, claim.updated = before
            tube.place_claim(claim)

        record = self._record_write(CLAIM_RECORDS, claim.record(space_id, tube_name), [])
        return self._batch(queue_space, tube, changes=[(t, holding, None) for t in tasks], records=[record],
                           undo_extra=undo, rewrite=claim.listed is None).map(lambda _raws: True)

    def release_claim(self, space_id: int, tube_name: str, claim_id: str) -> Later[None]:
        """The claim ends now: its tasks are free (and no longer show it)."""
        queue_space = self.queue_space(space_id)
        claim = self.present_claim(space_id, tube_name, claim_id)
        if claim is None:
            return Later.done(None)
        tube = self.tubes[(space_id, tube_name)]
        tasks = [tube.tasks[i] for i in sorted(claim.tasks)]
        tube.unplace_claim(claim)
        record = self._record_write(CLAIM_RECORDS, None, [space_id, tube_name, claim_id])
        later = self._batch(queue_space, tube, changes=[(t, tr.made_ready, None) for t in tasks], records=[record],
                            undo_extra=lambda: tube.place_claim(claim))
        return later.map(lambda _raws: None)


@cython.cclass
class _Taken:
    """A take's change of its task (``_change``'s ``mutate``): an object rather than a closure,
    which would cost a function and a cell for each name it used, on every take."""

    __slots__ = ("event", "consumer")

    def __init__(self, event: Any, consumer: Any) -> None:
        self.event = event
        self.consumer = consumer

    def __call__(self, t: Task) -> None:
        t.status, t.event, t.cid, t.ctaken = TAKEN, self.event, self.consumer, t.ctaken + 1
