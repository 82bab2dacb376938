"""A leader's synchronous acknowledgement: a write is answered once a quorum holds it durably.

Tarantool's limbo, in small: the group committer commits each of the leader's groups to its own
log and LMDB as before, but holds the group's answers (``GroupCommitter._awaiting``) and says so
(:meth:`Quorum.durable`). Followers acknowledge the records they hold durably
(:meth:`Quorum.ack`). Once ``size`` instances, the leader counted, hold a group, the committer
answers it and every group before it (``confirm``). A group no quorum confirms within
``timeout_s`` is taken back, with every group after it (``roll_back``): its writers get
ER_SYNC_QUORUM_TIMEOUT, the later ones ER_SYNC_ROLLBACK, as Tarantool's do.

Fencing: nothing is confirmed while ``lease_valid()`` is false (a leader that cannot renew its
etcd lease may already have a successor), so such a leader acknowledges nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from boxqueue.errcodes import ER, BoxError
from boxqueue.storage.commit import GroupCommitter

log = logging.getLogger(__name__)


def rollback_error(first: bool) -> BoxError:
    """What the writers of a group taken back get: the oldest group's, then the later ones'."""
    return BoxError(ER.SYNC_QUORUM_TIMEOUT if first else ER.SYNC_ROLLBACK)


class Quorum:
    def __init__(self, committer: GroupCommitter, size: int, timeout_s: float,
                 lease_valid: Callable[[], bool] = lambda: True) -> None:
        self.committer = committer
        self.size = size
        self.timeout_s = timeout_s
        self.lease_valid = lease_valid
        self.own = 0  # the last of this leader's groups durable here
        self.acked: dict[str, int] = {}  # follower -> the last record durable there
        self.confirmed = 0
        self._deadlines: list[tuple[int, float]] = []  # (lsn, when) of groups not yet confirmed
        self._changed = trio.Event()
        self.abandoned = False

    def durable(self, lsn: int) -> None:
        """The committer: group ``lsn`` is durable here and waits for the quorum."""
        self.own = lsn
        if self.abandoned:  # a group that was under way when this node stopped leading
            self.committer.roll_back(lambda _first: BoxError(ER.SYNC_ROLLBACK))
            return
        self._deadlines.append((lsn, trio.current_time() + self.timeout_s))
        if len(self._deadlines) == 1:
            self._changed.set()
        self.check()

    def ack(self, follower: str, lsn: int) -> None:
        if lsn > self.acked.get(follower, 0):
            self.acked[follower] = lsn
            self.check()

    def forget(self, follower: str) -> None:
        self.acked.pop(follower, None)

    def check(self) -> None:
        """Confirm what a quorum holds (unless the lease is in doubt)."""
        if not self._deadlines or not self.lease_valid():
            return
        held = sorted([self.own, *self.acked.values()], reverse=True)
        if len(held) < self.size:
            return
        confirmed = min(held[self.size - 1], self.own)
        if confirmed > self.confirmed:
            self.confirmed = confirmed
            self._deadlines = [(lsn, when) for lsn, when in self._deadlines if lsn > confirmed]
            self.committer.confirm(confirmed)

    def abandon(self) -> None:
        """This node stops leading: take back every group still waiting, and any still under way."""
        self.abandoned = True
        self._deadlines = []
        self.committer.roll_back(lambda _first: BoxError(ER.SYNC_ROLLBACK))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take back what no quorum confirmed in time; until cancelled."""
        task_status.started()
        while True:
            if not self._deadlines:
                self._changed = trio.Event()
                await self._changed.wait()
                continue
            lsn, when = self._deadlines[0]
            await trio.sleep_until(when)
            self.check()
            if self._deadlines and self._deadlines[0][0] == lsn:
                log.warning("no quorum of %d confirmed LSN %d within %.1f s: taking back %d groups",
                            self.size, lsn, self.timeout_s, self.committer.awaiting)
                self._deadlines = []
                self.committer.roll_back(rollback_error)
