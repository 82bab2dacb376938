"""What the embedded Lua has done since start, for the metrics: plain counts the engine keeps."""

from __future__ import annotations

from typing import Any


class LuaUsage:
    """Jobs (console statements, EVAL chunks, Lua functions called over CALL) and their Lua time.

    A job that finishes in its first stretch on the event loop (the common case: ``return ...``)
    is only counted, in ``LuaEngine.quick_jobs``, not here: a clock read on that path cost a few
    percent of an EVAL. Its run time is under one count-hook interval."""

    __slots__ = ("jobs", "failed", "seconds", "time_limit_hits", "memory_limit_hits")

    def __init__(self) -> None:
        self.jobs = 0
        self.failed = 0  # ended with an error (limit hits included)
        self.seconds = 0.0  # run time in Lua (waits for box operations excluded), as the limit counts it
        self.time_limit_hits = 0
        self.memory_limit_hits = 0

    def record(self, seconds: float, error: Any, time_limit_text: str, memory_limit_text: str) -> None:
        """One finished job: ``error`` is its BoxError or None."""
        self.jobs += 1
        self.seconds += seconds
        if error is not None:
            self.failed += 1
            message = getattr(error, "message", "")
            if message == time_limit_text:
                self.time_limit_hits += 1
            elif message == memory_limit_text:
                self.memory_limit_hits += 1
