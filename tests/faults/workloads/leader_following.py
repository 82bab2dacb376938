"""The clients' connections: the ``tarantool`` connector's MeshConnection following the leader
through ``boxqueue.leader_uris``, and the Zaqar client following ``X-Boxqueue-Leader``.

An operation's outcome depends on whether its request may have left the client
(:func:`tests.faults.outcomes.iproto_error`): :class:`TrackedMesh` notes the moment it starts
sending, after it has (re)connected and run its discovery. After an unknown outcome the
connection is closed (a late answer must not be read as the next request's), and after a few
refusals in a row the client tries the next member itself: a deposed leader cut from the others
may know no leader to send it to.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Callable
from typing import Any

import httpx
import tarantool
from tarantool.error import ClusterDiscoveryWarning, NetworkError, NetworkWarning
from tarantool.mesh_connection import update_connection

from tests.faults.history import History, Op
from tests.faults.outcomes import Outcome, http_error, http_status, iproto_error

# The connector warns of every discovery that finds no leader (during elections): expected here.
warnings.filterwarnings("ignore", category=ClusterDiscoveryWarning)
warnings.filterwarnings("ignore", category=NetworkWarning)

ROTATE_AFTER = 3  # refusals in a row before trying the next member
RETRY_PAUSE_S = 0.05  # after an answer that is not ok, as a client retrying would wait


class TrackedMesh(tarantool.MeshConnection):
    """``sent`` turns True once the current request may have reached the server."""

    sent = False

    def _send_request(self, request: Any, on_push: Any = None, on_push_ctx: Any = None) -> Any:
        self.sent = False
        self._opt_reconnect()
        self._opt_refresh_instances()
        self._opt_reconnect()
        self.sent = True
        return self._send_request_wo_reconnect(request, on_push, on_push_ctx)

    def _send_request_wo_reconnect(self, request: Any, on_push: Any = None, on_push_ctx: Any = None) -> Any:
        """Any request, the discovery's too. The connector matches answers to requests by order
        alone: after a timeout the late answer would be read as the next request's, so a
        connection that failed is never used again."""
        try:
            return super()._send_request_wo_reconnect(request, on_push, on_push_ctx)
        except NetworkError:
            self.drop()
            raise

    def drop(self) -> None:
        self.close()
        self.connected = False

    def rotate(self) -> None:
        """To the next member of the list."""
        self.drop()
        update_connection(self, self.strategy.getnext())


class IprotoClient:
    """One client process: a connection and the history it writes to."""

    def __init__(self, history: History, process: str, workload: str, addresses: list[dict[str, Any]],
                 names: dict[str, str], socket_timeout: float = 10.0) -> None:
        self.history = history
        self.process = process
        self.workload = workload
        self.names = names  # address -> member name, for the reports
        self.conn = TrackedMesh(addrs=addresses, cluster_discovery_function="boxqueue.leader_uris",
                                cluster_discovery_delay=0.3, connect_now=False, socket_timeout=socket_timeout,
                                connection_timeout=2, reconnect_max_attempts=1, reconnect_delay=0.05,
                                )
        self.refusals = 0

    def perform(self, f: str, value: Any, request: Callable[[TrackedMesh], Any],
                result: Callable[[Any], Any] = lambda answer: None) -> Op:
        """Invokes ``f(value)``: ``request`` sends it, ``result`` reads what to record from the
        answer's data."""
        op = self.history.invoke(self.process, self.workload, f, value)
        node = None
        try:
            self.conn.sent = False
            if self.conn._socket is None or self.conn.schema is None:  # DML needs the schema first
                self.conn._opt_reconnect()
            answer = request(self.conn)
            node = self.names.get(self.conn.host)
            recorded = result(answer.data if hasattr(answer, "data") else answer)
        except Exception as exc:
            node = self.names.get(self.conn.host)
            outcome, why = iproto_error(exc, self.conn.sent)
            self._after(outcome)
            return self.history.complete(op, outcome, error=why, node=node)
        self.refusals = 0
        return self.history.complete(op, "ok", result=recorded, node=node)

    def _after(self, outcome: Outcome) -> None:
        if outcome == "info":
            self.conn.drop()
        time.sleep(RETRY_PAUSE_S)
        self.refusals += 1
        if self.refusals >= ROTATE_AFTER:
            self.refusals = 0
            self.conn.rotate()

    def close(self) -> None:
        self.conn.drop()


class ZaqarClient:
    """Zaqar v1.1 over HTTP/1.1; a follower's 503 names the leader, which is tried next."""

    def __init__(self, history: History, process: str, urls: dict[str, str], project: str = "faults",
                 client_id: str = "", timeout: float = 10.0) -> None:
        self.history = history
        self.process = process
        self.urls = urls  # member -> base URL
        self.by_url = {u: n for n, u in urls.items()}
        self.order = itertools.cycle(list(urls.values()))
        self.base = next(self.order)
        self.http = httpx.Client(timeout=timeout, trust_env=False, headers={
            "Client-ID": client_id, "X-Project-Id": project})
        self.refusals = 0

    def perform(self, f: str, value: Any, method: str, path: str, json: Any = None,
                result: Callable[[httpx.Response], Any] = lambda r: None) -> tuple[Op, httpx.Response | None]:
        op = self.history.invoke(self.process, "zaqar", f, value)
        node = self.by_url.get(self.base)
        try:
            response = self.http.request(method, self.base + path, json=json)
        except Exception as exc:
            outcome, why = http_error(exc)
            self._move()
            time.sleep(RETRY_PAUSE_S)
            return self.history.complete(op, outcome, error=why, node=node), None
        outcome = http_status(response.status_code, response.text)
        if outcome != "ok":
            time.sleep(RETRY_PAUSE_S)
            leader = response.headers.get("x-boxqueue-leader")
            if leader and leader in self.by_url:
                self.base = leader
            else:
                self.refusals += 1
                if self.refusals >= ROTATE_AFTER:
                    self._move()
            return self.history.complete(op, outcome, error=f"HTTP {response.status_code} {response.text[:160]}",
                                         node=node), response
        self.refusals = 0
        try:
            recorded = result(response)
        except Exception as exc:  # an answer we cannot read: what it did is unknown
            return self.history.complete(op, "info", error=f"unreadable answer: {exc!r}", node=node), response
        return self.history.complete(op, "ok", result=recorded, node=node), response

    def _move(self) -> None:
        self.refusals = 0
        self.base = next(self.order)

    def close(self) -> None:
        self.http.close()
