"""Failover times, read from the history: after each nemesis, how long until a write was
acknowledged again.

``failover``: from the nemesis's start to the first write acknowledged among those invoked after
it (on a new leader, or on the same one when it kept leading). ``longest gap``: the longest time
without any acknowledged write between the nemesis's start and the end of its quiet period, a
write in flight at the start included: what a client saw as unavailability.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from tests.faults.history import Op


@dataclass
class Window:
    nemesis: str
    start: float  # monotonic
    end: float  # the end of its quiet period
    failover_s: float | None = None  # None: no write acknowledged in the window
    longest_gap_s: float | None = None  # the whole window when nothing was acknowledged in it


def measure(ops: list[Op], windows: list[Window]) -> list[Window]:
    acked = sorted((op.invoked, op.completed) for op in ops if op.acknowledged_write and op.completed is not None)
    for w in windows:
        after = [done for invoked, done in acked if invoked >= w.start and done <= w.end]
        w.failover_s = min(after) - w.start if after else None
        times = sorted(done for _, done in acked if w.start <= done <= w.end)
        edges = [w.start, *times, w.end]
        w.longest_gap_s = max(b - a for a, b in itertools.pairwise(edges))
    return windows


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile (p in 0..100) of ``values``."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]
