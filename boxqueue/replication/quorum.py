"""A leader's synchronous acknowledgement: a write is answered once a quorum holds it durably.

Tarantool's limbo, in small. The group committer commits each of the leader's groups to its own
log and LMDB as before, holds the group's answers (``GroupCommitter._awaiting``) and says so
(:meth:`Quorum.durable`). Followers acknowledge the records they hold durably
(:meth:`Quorum.ack`). Once ``size`` members, the leader counted, hold a group, the committer
answers it and every group before it (``confirm``).

**An answer is a promise.** "Done" means a quorum holds the write, so every future leader has it
(the election picks the most advanced of a majority that published after the last leader went:
:mod:`boxqueue.replication.election`). "Failed" may be said only of a write no future leader can
keep: one that never reached the log. Everything else is answered ER_SYNC_QUORUM_TIMEOUT (216)
with a message saying its outcome is unknown: the write may be kept (by this leader if a quorum
still confirms it, by the next leader if it holds it) or dropped (a next leader that lacks it).
So nothing is ever rolled back here. As in Tarantool's newer behaviour, the limbo never times out
into a rollback; as in its ``election_fencing_mode``, a leader that cannot gather its quorum
steps aside instead (:meth:`run`): when the oldest waiting group has waited ``timeout_s``, or the
followers it needs have been silent for that long, it is *abandoned*: every waiting writer hears
216, every queued write not yet in the log is refused (ER_READONLY: it was never logged, so it
failed for certain), and ``on_stall`` is awaited (the leader resigns, so that a member that can
reach a quorum may lead).

Invariants:

* ``confirmed`` only grows, and never beyond ``own`` (what is durable here) nor beyond what
  ``size`` members hold durably;
* nothing is confirmed while ``lease_valid()`` is false (a leader that cannot renew its etcd
  lease may already have a successor) nor once ``abandoned``;
* once ``abandoned`` the committer answers nothing more as done: groups still being flushed
  are answered 216 when they become durable (:meth:`durable`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import trio

from boxqueue.errcodes import ER, BoxError
from boxqueue.replication import safeguards
from boxqueue.storage.commit import GroupCommitter

log = logging.getLogger(__name__)
SECOND_LOOK_S = 0.05  # how long a stall must last once seen before the leader gives up



def outcome_unknown(why: str) -> BoxError:
    """What the writer of a group no quorum confirmed hears: its write may or may not be kept."""
    return BoxError(ER.SYNC_QUORUM_TIMEOUT,
                    message=f"Quorum collection for a synchronous transaction is timed out: {why}; "
                            "the write's outcome is unknown (a later leader may keep it or not)")


def never_logged(why: str) -> BoxError:
    """What the writer of a write that never reached the log hears: it failed for certain."""
    return BoxError(ER.READONLY, message=f"Can't modify data on a read-only instance: {why}")


class Quorum:
    """The leader's limbo. ``size``: members, the leader counted, that must hold a group;
    ``timeout_s``: how long a group, or the quorum's followers, may keep it waiting before the
    leader gives up (``on_stall``); ``lost_after_s``: silence after which a follower no longer
    counts as present (the quorum's followers may be silent for the longer of the two)."""

    def __init__(self, committer: GroupCommitter, size: int, timeout_s: float,
                 lease_valid: Callable[[], bool] = lambda: True,
                 on_stall: Callable[[str], Awaitable[None]] | None = None,
                 lost_after_s: float = math.inf) -> None:
        self.committer = committer
        self.size = size
        self.timeout_s = timeout_s
        self.lease_valid = lease_valid
        self.on_stall = on_stall
        self.lost_after_s = lost_after_s
        self.own = 0  # the last of this leader's groups durable here
        self.acked: dict[str, int] = {}  # follower -> the last record durable there
        self.heard_at: dict[str, float] = {}  # follower -> when it last said anything
        self.confirmed = 0
        self.started = trio.current_time()
        self._deadlines: list[tuple[int, float]] = []  # (lsn, when) of groups not yet confirmed
        self._changed = trio.Event()
        self.abandoned: str | None = None  # why, once this leader answers nothing more as done

    # -- what the committer and the relays tell it ---------------------------------------------

    def durable(self, lsn: int) -> None:
        """The committer: group ``lsn`` is durable here and waits for the quorum."""
        self.own = max(self.own, lsn)
        if self.abandoned is not None:  # a group that was being flushed when the leader gave up
            self.committer.settle_unknown(outcome_unknown(self.abandoned))
            return
        self.waiting(lsn)

    def waiting(self, lsn: int) -> None:
        """A group (or a write that changed nothing but read up to ``lsn``) waits for the
        quorum to confirm ``lsn``."""
        if self.abandoned is not None:  # (applied as the leader gave up): nobody will confirm it
            self.committer.settle_unknown(outcome_unknown(self.abandoned))
            return
        self._deadlines.append((lsn, trio.current_time() + self.timeout_s))
        if len(self._deadlines) == 1:
            self._wake()
        self.check()

    def holds_back(self, lsn: int) -> bool:
        """Whether an answer that read up to ``lsn`` must wait: not yet confirmed, or the lease
        in doubt (a deposed leader's reads may be stale)."""
        return lsn > self.confirmed or not self.lease_valid() or self.abandoned is not None

    def ack(self, follower: str, lsn: int) -> None:
        self.heard_at[follower] = trio.current_time()
        if lsn > self.acked.get(follower, 0):
            self.acked[follower] = lsn
        self.check()

    def heard(self, follower: str) -> None:
        """Any row from a follower: it is present."""
        self.heard_at[follower] = trio.current_time()

    def forget(self, follower: str) -> None:
        self.acked.pop(follower, None)

    def check(self) -> None:
        """Confirm what a quorum holds (unless the lease is in doubt or the leader gave up)."""
        if self.abandoned is not None or not self.lease_valid():
            return
        held = sorted([self.own, *self.acked.values()], reverse=True)
        if safeguards.off("no-quorum"):
            held = [self.own] * self.size
        if len(held) >= self.size:
            self.confirmed = max(self.confirmed, min(held[self.size - 1], self.own))
        confirmed = self.confirmed
        if self._deadlines and self._deadlines[0][0] <= confirmed:
            self._deadlines = [(lsn, when) for lsn, when in self._deadlines if lsn > confirmed]
        oldest = self.committer.oldest_awaiting()
        if oldest is not None and oldest <= confirmed:
            self.committer.confirm(confirmed)

    # -- giving up ------------------------------------------------------------------------------

    def abandon(self, why: str) -> None:
        """This leader answers nothing more as done: the waiting writers hear that their outcome
        is unknown, the queued writes that never reached the log are refused."""
        if self.abandoned is None:
            self.abandoned = why
            self._deadlines = []
            self.committer.refuse_writes(lambda: never_logged(why))
        self.committer.drop_pending(never_logged(why))
        self.committer.settle_unknown(outcome_unknown(why))

    def stalled(self, now: float) -> str | None:
        """Why this leader must give up now, if it must."""
        if self._deadlines and self._deadlines[0][1] <= now:
            return f"no quorum of {self.size} confirmed LSN {self._deadlines[0][0]} within {self.timeout_s:g} s"
        if self.size > 1 and now - self._quorum_heard_at() >= self._silence_s:
            return f"fewer than {self.size - 1} followers heard from for {now - self._quorum_heard_at():.1f} s"
        return None

    @property
    def _silence_s(self) -> float:
        """How long the followers a quorum needs may all be silent (at least the time after which
        a follower counts as lost)."""
        return max(self.timeout_s, self.lost_after_s)

    def _quorum_heard_at(self) -> float:
        """The last time enough followers for a quorum had been heard from (a follower never
        heard from counts as heard when this leader began)."""
        needed = self.size - 1
        heard = sorted(self.heard_at.values(), reverse=True)
        return max(heard[needed - 1] if len(heard) >= needed else self.started, self.started)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watches for a stall (see the module docstring); until cancelled or the leader gave up.
        While answers wait it also looks again every tick, so one held back by a lease that was
        briefly in doubt goes out once the lease is renewed, even with no follower to say so."""
        task_status.started()
        tick = 0.1
        looked_again = False
        while True:
            now = trio.current_time()
            self.check()
            why = self.stalled(now)
            if why is not None and not looked_again:
                # A second look once the other tasks have run: after the event loop was held up
                # (a long collection, a busy machine), acknowledgements may wait unread in the
                # relays' sockets, and this task may be the first to run.
                looked_again = True
                await trio.sleep(SECOND_LOOK_S)
                continue
            looked_again = False
            if why is not None:
                log.warning("the leader gives up: %s; %d groups wait, their outcome unknown", why,
                            self.committer.awaiting)
                self.abandon(why)
                if self.on_stall is not None:
                    await self.on_stall(why)
                return
            wake = now + tick if self.committer.awaiting else math.inf
            if self._deadlines:
                wake = min(wake, self._deadlines[0][1])
            if self.size > 1:
                wake = min(wake, self._quorum_heard_at() + self._silence_s)
            with trio.move_on_at(max(wake, now + 0.01)):
                await self._changed.wait()
