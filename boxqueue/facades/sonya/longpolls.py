"""Sonya's long-polls on connections of their own, below the ASGI layer.

A connection whose first request is ``GET /queue/listen/longpoll/{queue}[/{id}]`` (no body) is
taken over from hypercorn (``boxqueue.frontdoor.asgi_serving``) and its requests are answered here for as
long as they are long-polls: the same checks, statuses, bodies and wait rules as the Starlette
endpoint (``SonyaApi.longpoll``), each answer written with one ``send``. Heads are parsed (and
checked) by h11; answers are framed here, as h11 frames them, because h11's state machine cost
more than the rest of a poll. The first request that is something else is handed back to
hypercorn with everything after it, so a client may mix polls and other calls on one kept-alive
connection.

One task per connection reads and answers its requests. A poll that has to wait is a
:class:`tubes.broadcast.Sink`: the fan-out writes its answer straight to the socket and ends its
subscription, and the task, which meanwhile waits for the client's next bytes (its next request,
or the end of its stream, which ends a waiting poll), only wakes when they come. So a poll costs
one task wake-up, a parsed head, a subscription and one write, instead of a trip through
hypercorn, Starlette and the ASGI calls. A second task per connection, parked, closes an idle
connection when the server stops. Both live in the connection's nursery.
"""

from __future__ import annotations

import math
import re
import socket

import h11
import trio
from starlette.datastructures import Headers, QueryParams

from boxqueue.facades.sonya.app import denied_response, messages_response, not_found_response
from boxqueue.facades.sonya.inputs import parse_sequence
from boxqueue.facades.sonya.socket_io import (
    Route,
    fast_response,
    keep_alive,
    match_get,
    receive_some,
    send_all,
)
from boxqueue.facades.sonya.tokens import Denied, Tokens, bearer
from boxqueue.frontdoor.asgi_serving import HEAD_END, Handler, parse_head
from boxqueue.measures import RequestMeter
from boxqueue.tubes.broadcast import Broadcast, Subscription
from boxqueue.tubes.sequences import Message

LONGPOLL_PATH = re.compile(r"/queue/listen/longpoll/([^/]+)(?:/([^/]+))?")
MAX_BUFFERED = 65536  # what a client may send ahead of its answers before we stop reading
IDLE_S = 75.0  # as hypercorn's keep-alive timeout (the listener's keep_alive_timeout_s, when served)


class _Poll:
    """One waiting long-poll: the sink its subscription delivers to. Its answer (the first live
    message, or ``[]`` when the subscription ends) is written during the fan-out; what the socket
    does not take at once is left in ``unsent`` for the connection's task."""

    def __init__(self, sock: socket.socket, keep: bool) -> None:
        self.sock = sock
        self.keep = keep
        self.sub: Subscription | None = None
        self.answered = False
        self.unsent = b""
        self.waiting: trio.CancelScope | None = None  # the task's wait while the poll waits
        # Wake the task once answered even if all was written: it must close the connection, or
        # it is not reading (so the client's next request would not wake it).
        self.wake = not keep

    def deliver(self, item: Message) -> int:
        self._answer([item])
        return 0

    def ended(self, reason: str) -> None:
        self._answer([])

    def _answer(self, items: list[Message]) -> None:
        if self.answered:
            return
        self.answered = True
        if self.sub is not None:
            self.sub.close()
        data = fast_response(messages_response(items), self.keep)
        try:
            written = self.sock.send(data)
        except BlockingIOError:
            written = 0
        except OSError:
            written = len(data)  # the connection is broken: the task finds out when it reads
        self.unsent = data[written:]
        if (self.unsent or self.wake) and self.waiting is not None:
            self.waiting.cancel()


class _Connection:
    """One taken-over connection: what the client sent that is not handled yet."""

    def __init__(self, sock: socket.socket, buffered: bytes, idle_s: float = IDLE_S) -> None:
        self.sock = sock
        self.buffer = bytearray(buffered)
        self.idle_s = idle_s
        self.eof = False
        self.stopping = False
        self.late = False  # the next head did not arrive within idle_s
        self.waiting: trio.CancelScope | None = None  # the task's wait for the client's bytes

    async def read_more(self) -> None:
        data = await receive_some(self.sock)
        if data:
            self.buffer += data
        else:
            self.eof = True

    async def stop_when(self, shutdown: trio.Event) -> None:
        """Close the connection when the server stops, if it is idle (a waiting poll is answered
        ``[]`` by the broadcast's shutdown, then the connection closes)."""
        await shutdown.wait()
        self.stopping = True
        if self.waiting is not None:
            self.waiting.cancel()

    async def next_head(self) -> bool:
        """Read (up to ``idle_s``) until a whole request head is buffered; False if the client
        left, went quiet, sent too much, or the server is stopping."""
        if HEAD_END in self.buffer:  # usually: it came while the last poll waited
            return True
        with trio.move_on_after(self.idle_s) as self.waiting:
            while HEAD_END not in self.buffer:
                if self.eof or self.stopping or len(self.buffer) >= MAX_BUFFERED:
                    break
                await self.read_more()
        self.late = self.waiting.cancelled_caught and not self.stopping
        self.waiting = None
        return HEAD_END in self.buffer


class LongPolls:
    """Decides which connections start with a long-poll, and serves their long-polls."""

    def __init__(self, broadcast: Broadcast, tokens: Tokens, longpoll_max_wait_s: float, shutdown: trio.Event,
                 meter: RequestMeter | None = None, idle_s: float = IDLE_S) -> None:
        self.broadcast = broadcast
        self.tokens = tokens
        self.max_wait = longpoll_max_wait_s if longpoll_max_wait_s > 0 else math.inf
        self.shutdown = shutdown
        self.meter = meter  # counts each long-poll (operation "longpoll") by its status
        self.idle_s = idle_s  # between a connection's long-polls, up to the end of the next head

    def takeover(self, request: h11.Request) -> Handler | None:
        return self.serve if _route(request) is not None else None

    async def serve(self, sock: socket.socket, request: h11.Request, head: bytes, rest: bytes) -> bytes | None:
        conn = _Connection(sock, rest, self.idle_s)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.stop_when, self.shutdown)
            try:
                while True:
                    route = _route(request)
                    if route is None:  # not a long-poll: hypercorn serves it and what follows
                        return head + bytes(conn.buffer)
                    keep = keep_alive(request)
                    if not await self._answer(conn, route, request, keep) or not keep or conn.stopping:
                        return None
                    if not await conn.next_head():
                        if conn.buffer and not conn.eof and not conn.stopping and not conn.late:
                            return bytes(conn.buffer)  # more than a head we parse: hypercorn's
                        return None
                    parsed = parse_head(bytes(conn.buffer))
                    if parsed is None:
                        return bytes(conn.buffer)  # hypercorn answers it its own way
                    request, length = parsed
                    head = bytes(conn.buffer[:length])
                    del conn.buffer[:length]
            finally:
                nursery.cancel_scope.cancel()

    async def _answer(self, conn: _Connection, route: Route, request: h11.Request, keep: bool) -> bool:
        """Answer one long-poll; False if the connection is to be closed."""
        status = [200]
        if self.meter is None:
            return await self._answer_poll(conn, route, request, keep, status)
        started = self.meter.begin()
        try:
            return await self._answer_poll(conn, route, request, keep, status)
        finally:
            self.meter.record("longpoll", started, str(status[0]) if status[0] >= 400 else None,
                              f"GET {request.target.decode('latin-1')}")

    async def _answer_poll(self, conn: _Connection, route: Route, request: h11.Request, keep: bool,
                           status: list[int]) -> bool:
        queue, key, query_string = route
        headers = Headers(raw=list(request.headers))
        query = QueryParams(query_string)
        try:
            self.tokens.check_listen(bearer(headers, query), queue, key)
        except Denied as exc:
            status[0] = exc.status
            return await send_all(conn.sock, fast_response(denied_response(exc), keep))
        poll = _Poll(conn.sock, keep)
        got = self.broadcast.subscribe(queue, key, parse_sequence(query.getlist("sequence")), sink=poll)
        if got is None:
            status[0] = 404
            return await send_all(conn.sock, fast_response(not_found_response(), keep))
        preload, poll.sub = got
        if preload or poll.answered:  # (answered: the server is stopping)
            poll.sub.close()
            if not poll.answered:
                return await send_all(conn.sock, fast_response(messages_response(preload), keep))
        else:
            # Wait for the client's next bytes; the fan-out answers meanwhile, and wakes this task
            # (cancels the wait) only if the socket did not take the whole answer, or the task
            # must close the connection or is not reading. One cancel scope: they cost.
            with poll.sub, trio.move_on_after(self.max_wait) as scope:
                poll.waiting = conn.waiting = scope
                while not poll.answered and not conn.eof and not conn.stopping:
                    if len(conn.buffer) < MAX_BUFFERED:
                        await conn.read_more()
                    else:  # the client sent too much ahead: stop reading it
                        poll.wake = True
                        await trio.sleep_forever()
            poll.waiting = conn.waiting = None
            if not poll.answered:
                if conn.eof:
                    return False  # the client left while it waited
                poll.ended("waited")  # the wait limit passed, or the server stops: []
        return not poll.unsent or await send_all(conn.sock, poll.unsent)


def _route(request: h11.Request) -> Route | None:
    """(queue, id, query) of a long-poll GET without a body; None for anything else."""
    for name, _value in request.headers:
        if name in (b"content-length", b"transfer-encoding", b"upgrade"):
            return None
    return match_get(request, LONGPOLL_PATH)
