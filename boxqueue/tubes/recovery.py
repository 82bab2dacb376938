"""How far the engine's start-up recovery (rebuilding every tube from LMDB) has come.

The engine loads tasks in chunks and yields to the event loop between them, so the metrics
listener, which starts before recovery, can answer "recovering" with these figures meanwhile.
Progress is logged with counts and an estimate of the time left at most every ``LOG_EVERY_S``.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

LOG_EVERY_S = 2.0


class RecoveryProgress:
    """Tasks to load (counted from LMDB before loading), tasks loaded, and the times."""

    def __init__(self) -> None:
        self.state = "waiting"  # waiting | recovering | done
        self.total = 0
        self.loaded = 0
        self.started: float | None = None  # time.monotonic()
        self.seconds: float | None = None  # how long recovery took, once done
        self._logged = 0.0

    def begin(self, total: int) -> None:
        self.state = "recovering"
        self.total = total
        self.loaded = 0
        self.started = self._logged = time.monotonic()
        log.info("recovering tubes: %s tasks to load", f"{total:,}")

    def advance(self, loaded: int) -> None:
        self.loaded += loaded
        now = time.monotonic()
        if now - self._logged >= LOG_EVERY_S:
            self._logged = now
            left = self.seconds_left()
            estimate = "" if left is None else f", about {left:.0f} s left"
            log.info("recovering tubes: %s of %s tasks (%.0f%%)%s", f"{self.loaded:,}", f"{self.total:,}",
                     100 * self.fraction(), estimate)

    def finish(self) -> None:
        self.state = "done"
        self.seconds = time.monotonic() - (self.started or time.monotonic())
        log.info("recovered %s tasks in %.2f s", f"{self.loaded:,}", self.seconds)

    def fraction(self) -> float:
        if self.state == "done":
            return 1.0
        return min(self.loaded / self.total, 1.0) if self.total else 0.0

    def seconds_left(self) -> float | None:
        """At the pace so far; None before anything is loaded."""
        if self.state != "recovering" or not self.loaded or self.started is None:
            return None
        elapsed = time.monotonic() - self.started
        return max(self.total - self.loaded, 0) * elapsed / self.loaded
