"""One monitor task per tube, owned by the engine's nursery: it sleeps until the tube's next event
(a delay or lock ending, a deadline passing, a task or claim expiring), acts on everything due in
one write, and ends when the tube holds nothing timed. A change that brings an event closer wakes
it (:meth:`tubes.tube.Tube.wake_monitor_for`)."""

from __future__ import annotations

import logging
import math

import trio

import boxqueue.tubes.transitions as tr
from boxqueue.errcodes import ER, BoxError
from boxqueue.tubes.engine_base import (
    CLAIM_RECORDS,
    IDLE_WAIT,
    Mutate,
    QueueSpace,
    now_us,
)
from boxqueue.tubes.kinds import QUEUE_MODULE, back_score
from boxqueue.tubes.task import (
    DELAYED,
    HUMAN,
    READY,
    TAKEN,
    Task,
)
from boxqueue.tubes.tube import Tube
from boxqueue.tubes.tube_records import TubeRecords

log = logging.getLogger(__name__)


class Monitors(TubeRecords):
    def _start_monitor(self, tube: Tube) -> None:
        if self._nursery is None or tube.monitor_running:
            return
        tube.monitor_running = True
        self._nursery.start_soon(self._monitor, tube)

    async def _monitor(self, tube: Tube) -> None:
        """Delays and locks ending, deadlines passing, tasks and claims expiring, each at its
        own time, for one tube; ends when the tube holds nothing timed."""
        key = (tube.space_id, tube.name)
        try:
            while self.tubes.get(key) is tube and (tube.tasks or tube.claims):
                tube.monitor_wakeup = trio.Event()
                tube.monitor_until = -math.inf  # busy: every change counts as earlier
                try:
                    await self._act(self.queue_space(tube.space_id), tube, now_us())
                except BoxError as exc:
                    if exc.code == ER.NO_SUCH_SPACE:
                        return  # the space is gone
                    # A write refused or of unknown outcome (a full disk, a leader giving up):
                    # look again shortly, as after any failure (an incarnation that ends stops us).
                    log.warning("monitor of tube %r of space %d: %s", tube.name, tube.space_id, exc)
                    await trio.sleep(0.1)
                    continue
                except Exception:
                    log.exception("monitor of tube %r of space %d failed", tube.name, tube.space_id)
                    await trio.sleep(0.1)
                    continue
                if tube.monitor_wakeup.is_set():
                    continue
                when = tube.next_time()
                if when == math.inf and not tube.tasks and not tube.claims:
                    return
                tube.monitor_until = when
                wait = IDLE_WAIT if when == math.inf else (when - now_us()) / 1_000_000
                with trio.move_on_after(max(wait, 0)):
                    await tube.monitor_wakeup.wait()
        finally:
            tube.monitor_running = False
            tube.monitor_until = math.inf
            self._forget_if_unused(tube)

    async def _act(self, queue_space: QueueSpace, tube: Tube, now: int) -> None:
        due = list(tube.timeline.irange(maximum=(now, math.inf)))
        expired = [t for t in due if now >= t.created + t.ttl]
        counters: list[str] = []
        if tube.kind.name == "box.queue" or tube.stats:  # another kind's tube shows box.queue's
            for task in expired:  # counters once box.queue has used it
                counters += ["ttl.total", "ttl." + HUMAN[task.status]]
        module = tube.kind.name == QUEUE_MODULE  # tarantool/queue counts delays and ttrs that end
        changes = []
        for task in due:
            if now >= task.created + task.ttl:
                continue
            if task.status in (DELAYED, TAKEN):
                changes.append((task, self._ready_again(tube, task), None))
                if module:
                    counters.append("delay" if task.status == DELAYED else "ttr")
            else:
                log.error("Internal error: unexpected task status %r of task %s", task.status, task.id)
                changes.append((task, tr.retry_later(now), None))
        ended = [tube.claims[holder] for _t, holder in tube.claim_times.irange(maximum=(now + 1,))]
        records = []
        for claim in ended:
            tube.unplace_claim(claim)
            records.append(self._record_write(CLAIM_RECORDS, None, [tube.space_id, tube.name, claim.id]))
        if not (expired or changes or records):
            return

        def put_back_claims() -> None:
            for claim in ended:
                tube.place_claim(claim)

        await self._batch(queue_space, tube, changes=changes, deletes=expired, records=records, counters=counters,
                          undo_extra=put_back_claims, expiring=True)
        if any(task.status == READY for task, _m, _t in changes):
            tube.wake_one_consumer()

    def _ready_again(self, tube: Tube, task: Task) -> Mutate:
        """A delay or lock ending (with the priority the lock gave), or a deadline passing (a
        Deckard tube's task then goes to the front, K7; a session's cid is cleared, and so is a
        claim's number in a 1.5 space; a claim's id stays for Zaqar to show)."""
        timeout_pri = tube.kind.timeout_pri if task.status == TAKEN else None

        def ready(t: Task) -> None:
            if t.status == DELAYED and t.attrs and "unlock" in t.attrs:
                unlock = t.attrs.pop("unlock")
                t.pri = back_score() if unlock is None else unlock
            elif timeout_pri is not None:
                t.pri = timeout_pri
            if type(t.cid) is not str:
                t.cid = 0
            t.status, t.event = READY, t.created + t.ttl

        return ready


