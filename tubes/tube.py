"""One tube's in-memory state: orderings, counts, waiting consumers, statistics.

Everything here is a cache of the queue space: the engine rebuilds it from LMDB at start. A task
is *placed* in the structures of its status; the engine unplaces it before changing a field
that a structure is ordered by, and places it again after.
"""

from __future__ import annotations

from collections import deque

import trio
from sortedcontainers import SortedList

from tubes.task import BURIED, READY, STATUS_ORDER, Task


class Tube:
    """The tasks of one (space, tube) and what waits on them."""

    def __init__(self, space_id: int, name: str) -> None:
        self.space_id = space_id
        self.name = name
        self.tasks: dict[str, Task] = {}
        self.ready: SortedList = SortedList()  # take order: (ipri, pri, created, id)
        self.buried: SortedList = SortedList()  # kick order, the same keys
        self.timeline: SortedList = SortedList()  # (event, created, id) of every task
        self.counts: dict[str, int] = dict.fromkeys(STATUS_ORDER, 0)
        self.stats: dict[str, int] = {}  # counters, in the order they first moved
        self.waiters: deque[trio.Event] = deque()
        self.monitor_wakeup = trio.Event()
        self.monitor_started = False
        self.unique_lock = trio.Lock()  # put_unique: look up and insert as one step

    # -- structures ------------------------------------------------------------------------

    def place(self, task: Task) -> None:
        self.tasks[task.id] = task
        if task.status == READY:
            self.ready.add(task.take_key())
        elif task.status == BURIED:
            self.buried.add(task.take_key())
        self.timeline.add(task.event_key())
        self.counts[task.status] += 1

    def unplace(self, task: Task) -> None:
        if task.status == READY:
            self.ready.remove(task.take_key())
        elif task.status == BURIED:
            self.buried.remove(task.take_key())
        self.timeline.remove(task.event_key())
        self.counts[task.status] -= 1
        del self.tasks[task.id]

    def first_ready(self) -> Task | None:
        return self.tasks[self.ready[0][3]] if self.ready else None

    def last_ready(self) -> Task | None:
        return self.tasks[self.ready[-1][3]] if self.ready else None

    def next_event(self) -> Task | None:
        return self.tasks[self.timeline[0][2]] if self.timeline else None

    def buried_in_order(self) -> list[Task]:
        return [self.tasks[key[3]] for key in self.buried]

    # -- statistics and signals ---------------------------------------------------------------

    def count(self, counter: str, by: int = 1) -> None:
        self.stats[counter] = self.stats.get(counter, 0) + by

    def wake_one_consumer(self) -> None:
        """Wake the longest-waiting take, if any (the 1.5 capacity-one channel, without the
        token a put left for nobody: a take always looks before it waits)."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.is_set():
                waiter.set()
                return

    def wake_monitor(self) -> None:
        self.monitor_wakeup.set()
