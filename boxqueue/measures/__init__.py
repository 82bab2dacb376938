"""Plain measurements every room may keep: histograms of bucket counts and per-API request meters.

Like :mod:`errcodes`, this package imports nothing of ours, so the storage layer, the iproto
server, the engine and the facades can all count into these without importing the metrics room
above them. Nothing here knows Prometheus: the values are plain integers and floats that code on
the request path increments, and ``boxqueue/metrics/`` reads them when it is scraped (a Prometheus
``Counter.inc()`` per request would cost a large share of a compiled iproto request).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence

# Seconds: from 50 us (an iproto chunk of quick requests) to 10 s (a blocking take).
LATENCY_BOUNDS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)
# Writes per group commit.
BATCH_BOUNDS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

RECENT_ERRORS = 100  # kept per API for the dashboard


class Histogram:
    """Counts per bucket (``le`` bounds, plus one for +Inf) and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BOUNDS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """``times`` observations of ``value`` (a chunk of requests answered together)."""
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with (inf, all)."""
        out = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class ErrorRecord:
    """One error for the dashboard's list of recent errors."""

    __slots__ = ("at", "api", "operation", "code", "message")

    def __init__(self, at: float, api: str, operation: str, code: str, message: str) -> None:
        self.at = at
        self.api = api
        self.operation = operation
        self.code = code
        self.message = message


class RequestMeter:
    """Requests of one API by operation and outcome, errors by code, latency, recent errors.

    For the APIs whose requests cost far more than this bookkeeping (HTTP, gRPC, the console):
    one call of :meth:`record` per request. The iproto server keeps its own cheaper counts
    (``boxqueue.iproto.request_stats``). Requests are counted on the event loop; the lock is for
    the scrapes, which read the meters in a worker thread (``boxqueue/metrics/app.py``).
    """

    def __init__(self, api: str) -> None:
        self.api = api
        self.requests: dict[tuple[str, str], int] = {}  # (operation, "ok" | "error") -> count
        self.errors: dict[str, int] = {}  # code -> count
        self.latency = Histogram()
        self.recent: deque[ErrorRecord] = deque(maxlen=RECENT_ERRORS)
        self.open = 0  # connections open now, where the API has its own (the console)
        self.accepted = 0  # ... and accepted since start
        self.in_progress = 0  # requests begun and not answered yet
        self._lock = threading.Lock()

    def begin(self) -> float:
        """A request starts: returns its start time for :meth:`record`."""
        with self._lock:
            self.in_progress += 1
        return time.perf_counter()

    def record(self, operation: str, started: float, error_code: str | None = None, message: str = "") -> None:
        """The request begun at ``started`` (:meth:`begin`) is answered."""
        seconds = time.perf_counter() - started
        outcome = "ok" if error_code is None else "error"
        with self._lock:
            self.in_progress -= 1
            key = (operation, outcome)
            self.requests[key] = self.requests.get(key, 0) + 1
            self.latency.observe(seconds)
            if error_code is not None:
                self.errors[error_code] = self.errors.get(error_code, 0) + 1
                self.recent.append(ErrorRecord(time.time(), self.api, operation, error_code, message))

    def opened(self) -> None:
        with self._lock:
            self.open += 1
            self.accepted += 1

    def closed(self) -> None:
        with self._lock:
            self.open -= 1


class RateLimit:
    """At most ``burst`` events in each window of ``window_s`` seconds, for logging what would
    otherwise flood the log (a traceback per request of a busy client). ``held`` counts the events
    refused since the last one allowed, for the next line logged to say."""

    __slots__ = ("burst", "window_s", "held", "_since", "_allowed")

    def __init__(self, burst: int = 10, window_s: float = 60.0) -> None:
        self.burst = burst
        self.window_s = window_s
        self.held = 0
        self._since = -window_s
        self._allowed = 0

    def allow(self) -> bool:
        now = time.monotonic()
        if now - self._since >= self.window_s:
            self._since, self._allowed = now, 0
        if self._allowed < self.burst:
            self._allowed += 1
            return True
        self.held += 1
        return False

    def take_held(self) -> int:
        held, self.held = self.held, 0
        return held


class Gauges:
    """Named figures read at scrape time from callbacks, for parts that plug in later (a
    write-ahead log's size and checkpoints, say): ``add("boxqueue_wal_bytes", "help", fn)``."""

    def __init__(self) -> None:
        self.gauges: dict[str, tuple[str, Callable[[], float]]] = {}
        self.counters: dict[str, tuple[str, Callable[[], float]]] = {}
        self.labels: dict[str, str] = {}  # name -> the words the dashboard shows for it

    def add(self, name: str, documentation: str, read: Callable[[], float], label: str) -> None:
        """A gauge: ``read()`` returns its current value (a number); ``label`` names it for people."""
        self.gauges[name] = (documentation, read)
        self.labels[name] = label

    def add_counter(self, name: str, documentation: str, read: Callable[[], float], label: str) -> None:
        """A counter (only ever grows): ``read()`` returns its total; ``name`` without ``_total``."""
        self.counters[name] = (documentation, read)
        self.labels[name] = label
