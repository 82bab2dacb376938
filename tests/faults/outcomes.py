"""What an answer means for the history: the one table of the fault suite.

``ok``: the operation took effect (the server said so). ``fail``: it is known NOT to have taken
effect, and no later leader may keep it. ``info``: unknown, it may take effect at any time after
its invocation, or never. A checker trusts ``fail`` as much as ``ok``: the server must not say
"failed" of a write that is kept.
"""

from __future__ import annotations

from typing import Literal

import httpx
from tarantool.error import DatabaseError, NetworkError

Outcome = Literal["ok", "fail", "info"]

# iproto error codes that promise the write was not applied and never will be.
DEFINITE_CODES: dict[int, str] = {
    7: "ER_READONLY",        # a follower, or a leader that is not leading: nothing was logged
    40: "ER_WAL_IO",         # the log could not be written
    116: "ER_LOADING",       # the instance is not serving yet
    217: "ER_SYNC_ROLLBACK",  # taken back: no leader may keep it
}
# Named for the reports; every code not in DEFINITE_CODES is unknown.
UNKNOWN_CODES: dict[int, str] = {
    216: "ER_SYNC_QUORUM_TIMEOUT",  # no quorum in time: it may still be kept
}

FOLLOWER_503 = "follower of its replica set"  # the text of a follower's Zaqar 503 (facades/follower.py)


def code_name(code: int) -> str:
    return DEFINITE_CODES.get(code) or UNKNOWN_CODES.get(code) or f"error {code}"


def iproto_error(exc: BaseException, sent: bool) -> tuple[Outcome, str]:
    """The outcome of an exception from the ``tarantool`` connector. ``sent``: the request may
    have left this client (a connection lost after that is unknown; a refused connection before
    it is a definite failure)."""
    if isinstance(exc, DatabaseError) and not isinstance(exc, NetworkError) and exc.args \
            and isinstance(exc.args[0], int):
        code = exc.args[0]
        text = str(exc.args[1]) if len(exc.args) > 1 else ""
        outcome: Outcome = "fail" if code in DEFINITE_CODES else "info"
        return outcome, f"{code_name(code)}: {text}"
    if isinstance(exc, NetworkError | OSError) and not sent:
        return "fail", f"not sent: {exc}"
    return "info", f"{type(exc).__name__}: {exc}"


def http_status(status: int, body: str) -> Outcome:
    """A Zaqar answer: 2xx done; a follower's 503 and any 4xx but 408 failed; else unknown."""
    if 200 <= status < 300:
        return "ok"
    if status == 503 and FOLLOWER_503 in body:
        return "fail"
    if 400 <= status < 500 and status != 408:
        return "fail"
    return "info"


def http_error(exc: BaseException) -> tuple[Outcome, str]:
    """An exception from httpx: nothing sent when the connection could not be made."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return "fail", f"not sent: {type(exc).__name__} {exc}"
    return "info", f"{type(exc).__name__}: {exc}"
