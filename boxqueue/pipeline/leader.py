"""Calls that reach the writable member and try again where the outcome allows it.

The streaming source and sink call procedures that are safe to repeat (a claim named by the
caller, an ack of named claims, a write carrying its mark), so an answer that says nothing was
done, or that nobody knows, is followed by the same call again, on the leader:

* ER_READONLY (7): a follower, or a leader that gave up: refused, not applied; ER_LOADING (116):
  a member still starting;
* ER_SYNC_QUORUM_TIMEOUT (216) and a connection lost mid-call: the outcome is unknown (applied
  or not): repeating the call gives the same end state either way;
* no connection at all: a server restarting, a leader gone.

The leader is found as the ``tarantool`` connector's MeshConnection finds it: ``boxqueue.leader_uris``
on any member answers the leader's URI first (docs/replication.md); a server that is no replica set
has no such procedure and is its own leader. Anything else (a bad argument, a denied access) is
raised at once. A call that finds no leader within ``failover_timeout`` seconds raises.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import tarantool
from tarantool.error import DatabaseError, NetworkError

from boxqueue.pipeline.connect import describe_database_error, open_connection
from boxqueue.pipeline.errors import BoxqueueSourceError
from boxqueue.pipeline.options import SourceOptions, parse_uri

log = logging.getLogger(__name__)

RETRIED = {7, 116, 216}  # ER_READONLY, ER_LOADING, ER_SYNC_QUORUM_TIMEOUT
NO_SUCH_PROC = 33
T = TypeVar("T")


class NoLeader(BoxqueueSourceError):
    """No member could be reached (yet)."""


class LeaderCalls:
    """One connection to the member that leads, opened again (and looked for) when needed."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.members: list[tuple[str, int]] = list(opts.members or ((opts.host, opts.port),))
        self._conn: tarantool.Connection | None = None
        self.failovers = 0  # times a call went to another connection after a failure

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def call(self, function: str, args: list[Any], what: str) -> list[Any]:
        """``function(*args)``'s answer, from the leader; ``what`` names the call in errors."""
        return self.with_leader(lambda conn: list(conn.call(function, args).data), what)

    def with_leader(self, action: Callable[[tarantool.Connection], T], what: str) -> T:
        """``action(connection to the leader)``, done again on the leader while it fails in a way
        that leaves the outcome unknown or undone (see the module's docstring)."""
        deadline = time.monotonic() + self.opts.failover_timeout
        pause = 0.05
        while True:
            try:
                return action(self.connection())
            except NetworkError as exc:
                failure: Exception = exc
            except DatabaseError as exc:
                if exc.args[0] not in RETRIED:
                    raise describe_database_error(exc, what) from None
                failure = exc
            except NoLeader as exc:
                failure = exc
            self.close()
            self.failovers += 1
            if time.monotonic() >= deadline:
                raise BoxqueueSourceError(
                    f"{what}: no leader answered within {self.opts.failover_timeout:g} s "
                    f"(members {', '.join(f'{h}:{p}' for h, p in self.members)}): {failure}") from None
            log.info("%s: %s; trying again on the leader", what, failure)
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def connection(self) -> tarantool.Connection:
        """The connection to the leader, found if need be."""
        if self._conn is None:
            self._conn = self._find_leader()
        return self._conn

    def _find_leader(self) -> tarantool.Connection:
        """A connection to the member the members name as the leader (or the only server)."""
        last: Exception | None = None
        for host, port in list(self.members):
            try:
                conn = open_connection(self._at(host, port))
            except BoxqueueSourceError as exc:
                if str(exc).startswith("authentication failed"):
                    raise
                last = exc
                continue
            try:
                uris = conn.call("boxqueue.leader_uris").data[0]
            except NetworkError as exc:
                conn.close()
                last = exc
                continue
            except DatabaseError as exc:
                if exc.args[0] == NO_SUCH_PROC:
                    return conn  # not a replica set: this server is the one
                conn.close()
                last = exc
                continue
            if not uris:
                conn.close()
                continue
            leader = parse_uri(str(uris[0]))
            for member in (parse_uri(str(u)) for u in uris):
                if member not in self.members:
                    self.members.append(member)
            if leader == (host, port):
                return conn
            conn.close()
            try:
                return open_connection(self._at(*leader))
            except BoxqueueSourceError as exc:
                last = exc
        raise NoLeader(f"no member answered: {last}")

    def _at(self, host: str, port: int) -> SourceOptions:
        return replace(self.opts, host=host, port=port)
