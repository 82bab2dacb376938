"""Request counters for ``box.stat()``: a total and a rate per request type, as Tarantool shows.

The dispatcher counts every request it handles by type, and errors (by request type and by
code, the last ones kept with their message for the dashboard); box operations made from Lua
(console, EVAL) are counted under the same names by the Lua bindings. The rate is the average
over the last five seconds, from one snapshot per second taken by :meth:`run`. The metrics
listener reads the same counts when it is scraped: nothing more is done per request.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import trio

from boxqueue.iproto import codec
from boxqueue.measures import RateLimit

log = logging.getLogger(__name__)

NAMES = {
    codec.SELECT: "SELECT",
    codec.INSERT: "INSERT",
    codec.REPLACE: "REPLACE",
    codec.UPDATE: "UPDATE",
    codec.DELETE: "DELETE",
    codec.UPSERT: "UPSERT",
    codec.CALL: "CALL",
    codec.CALL_16: "CALL",
    codec.EVAL: "EVAL",
    codec.AUTH: "AUTH",
    codec.EXECUTE: "EXECUTE",
    codec.BEGIN: "BEGIN",
    codec.COMMIT: "COMMIT",
    codec.ROLLBACK: "ROLLBACK",
}
SHOWN = ("DELETE", "COMMIT", "SELECT", "ROLLBACK", "INSERT", "EVAL", "CALL", "ERROR", "REPLACE",
         "UPSERT", "AUTH", "EXECUTE", "UPDATE", "BEGIN")
WINDOW_S = 5
RECENT_ERRORS = 100


class RequestStats:
    def __init__(self) -> None:
        self.by_type = [0] * 256  # indexed by request type: one list store per request
        self.errors = 0
        self.errors_by_type = [0] * 257  # the last one: errors of requests not decoded (bad packets)
        self.errors_by_code: collections.Counter[int] = collections.Counter()
        # (unix time, request type or 256, code, message) of the latest errors
        self.recent_errors: collections.deque[tuple[float, int, int, str]] = collections.deque(maxlen=RECENT_ERRORS)
        self.by_name: collections.Counter[str] = collections.Counter()
        self.unexpected = 0  # exceptions a request raised that are no error of the protocol's: bugs
        self._unexpected_log = RateLimit()
        self._history: collections.deque[tuple[float, dict[str, int]]] = collections.deque(maxlen=WINDOW_S + 1)

    def count(self, request_type: int) -> None:
        if 0 <= request_type < 256:
            self.by_type[request_type] += 1

    def count_error(self, request_type: int, error: Any) -> None:
        """A request answered with ``error`` (a BoxError); ``request_type`` 256: not decoded."""
        self.errors += 1
        self.errors_by_type[request_type if 0 <= request_type < 256 else 256] += 1
        self.errors_by_code[error.code] += 1
        self.recent_errors.append((time.time(), request_type, error.code, error.message))

    def count_unexpected(self, where: str, exc: BaseException) -> None:
        """An exception that is no BoxError (a bug: a TypeError, a KeyError...) reached the client as
        an error: count it, and log it with its traceback (at most ten a minute)."""
        self.unexpected += 1
        if self._unexpected_log.allow():
            held = self._unexpected_log.take_held()
            more = f" ({held} more since the last one logged)" if held else ""
            log.error("unexpected %s in %s%s", type(exc).__name__, where, more, exc_info=exc)

    def count_name(self, name: str) -> None:
        self.by_name[name] += 1

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(SHOWN, 0)
        for request_type, name in NAMES.items():
            out[name] += self.by_type[request_type]
        for name, n in self.by_name.items():
            out[name] = out.get(name, 0) + n
        out["ERROR"] += self.errors
        return out

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{NAME: {total = n, rps = r}}`` like Tarantool's ``box.stat()``."""
        now, totals = time.monotonic(), self.totals()
        oldest = self._history[0] if self._history else None
        out = {}
        for name, total in totals.items():
            rps = 0
            if oldest is not None and now - oldest[0] >= 0.1:
                rps = round((total - oldest[1].get(name, 0)) / (now - oldest[0]))
            out[name] = {"total": total, "rps": rps}
        return out

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take the per-second snapshots the rates come from, until cancelled."""
        task_status.started()
        while True:
            self._history.append((time.monotonic(), self.totals()))
            await trio.sleep(1)
