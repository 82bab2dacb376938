"""Sonya's long-polls on connections of their own, below the ASGI layer.

A connection whose first request is ``GET /queue/listen/longpoll/{queue}[/{id}]`` (no body) is
taken over from hypercorn (``facades.asgi_serving``) and its requests are answered here for as
long as they are long-polls: the same checks, statuses, bodies and wait rules as the Starlette
endpoint (``SonyaApi.longpoll``), each answer written with one ``send``. Heads are parsed (and
checked) by h11; answers are framed here, as h11 frames them, because h11's state machine cost
more than the rest of a poll. The first request that is
something else is handed back to hypercorn with everything after it, so a client may mix polls
and other calls on one kept-alive connection. A poll costs a parsed head, a subscription, one
task wake-up and one write, instead of a trip through hypercorn, Starlette and the ASGI calls.

Each connection has a reader task (it keeps what the client sends, and ends a waiting poll when
the client goes away) and one that stops an idle connection when the server stops; both live in
the connection's nursery.
"""

from __future__ import annotations

import math
import re
import socket

import h11
import trio
from starlette.datastructures import Headers, QueryParams
from starlette.responses import Response

from facades.asgi_serving import HEAD_END, Handler, parse_head
from facades.sonya.app import denied_response, messages_response, not_found_response
from facades.sonya.inputs import parse_sequence
from facades.sonya.socket_io import (
    Route,
    fast_response,
    keep_alive,
    match_get,
    receive_some,
    send_all,
)
from facades.sonya.tokens import Denied, Tokens, bearer
from tubes.broadcast import Broadcast

LONGPOLL_PATH = re.compile(r"/queue/listen/longpoll/([^/]+)(?:/([^/]+))?")
MAX_BUFFERED = 65536  # what a client may send ahead of its answers before we stop reading
IDLE_S = 75.0  # as hypercorn's keep-alive timeout



class _Connection:
    """The client's side of one taken-over connection: what it sent that is not handled yet."""

    def __init__(self, sock: socket.socket, buffered: bytes) -> None:
        self.sock = sock
        self.buffer = bytearray(buffered)
        self.eof = False
        self.stopping = False
        self.waiting: trio.CancelScope | None = None  # a poll waiting for a message, or idleness
        self._arrived = trio.lowlevel.ParkingLot()

    async def read(self) -> None:
        while not self.eof and len(self.buffer) < MAX_BUFFERED:
            data = await receive_some(self.sock)
            if data:
                self.buffer += data
            else:
                self.eof = True
                if self.waiting is not None:
                    self.waiting.cancel()
            self._arrived.unpark_all()

    async def stop_when(self, shutdown: trio.Event) -> None:
        await shutdown.wait()
        self.stopping = True
        if self.waiting is not None:
            self.waiting.cancel()  # a waiting poll answers [] (if its end has not already), an idle connection closes
        self._arrived.unpark_all()

    async def wait_for_head(self) -> bool:
        """Wait (up to ``IDLE_S``) until a whole request head is buffered; False if the client
        left, went quiet, sent too much, or the server is stopping."""
        with trio.move_on_after(IDLE_S) as self.waiting:
            while HEAD_END not in self.buffer:
                if self.eof or self.stopping or len(self.buffer) >= MAX_BUFFERED:
                    break
                await self._arrived.park()
        self.waiting = None
        return HEAD_END in self.buffer


class LongPolls:
    """Decides which connections start with a long-poll, and serves their long-polls."""

    def __init__(self, broadcast: Broadcast, tokens: Tokens, longpoll_max_wait_s: float, shutdown: trio.Event) -> None:
        self.broadcast = broadcast
        self.tokens = tokens
        self.max_wait = longpoll_max_wait_s if longpoll_max_wait_s > 0 else math.inf
        self.shutdown = shutdown

    def takeover(self, request: h11.Request) -> Handler | None:
        return self.serve if _route(request) is not None else None

    async def serve(self, sock: socket.socket, request: h11.Request, head: bytes, rest: bytes) -> bytes | None:
        conn = _Connection(sock, rest)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.read)
            nursery.start_soon(conn.stop_when, self.shutdown)
            try:
                while True:
                    route = _route(request)
                    if route is None:  # not a long-poll: hypercorn serves it and what follows
                        return head + bytes(conn.buffer)
                    keep = keep_alive(request)
                    if not await self._answer(conn, route, request, keep) or not keep or conn.stopping:
                        return None
                    if not await conn.wait_for_head():
                        if conn.buffer and not conn.eof and not conn.stopping:
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
        queue, key, query_string = route
        headers = Headers(raw=list(request.headers))
        query = QueryParams(query_string)
        answer: Response
        try:
            self.tokens.check_listen(bearer(headers, query), queue, key)
        except Denied as exc:
            answer = denied_response(exc)
        else:
            got = self.broadcast.subscribe(queue, key, parse_sequence(query.getlist("sequence")))
            if got is None:
                answer = not_found_response()
            else:
                preload, sub = got
                with sub:
                    if not preload:
                        with trio.move_on_after(self.max_wait) as conn.waiting:
                            item = await sub.next()
                            if item is not None:
                                preload = [item]
                        conn.waiting = None
                        if conn.eof:
                            return False  # the client left while it waited
                    answer = messages_response(preload)
        return await send_all(conn.sock, fast_response(answer, keep))


def _route(request: h11.Request) -> Route | None:
    """(queue, id, query) of a long-poll GET without a body; None for anything else."""
    for name, _value in request.headers:
        if name in (b"content-length", b"transfer-encoding", b"upgrade"):
            return None
    return match_get(request, LONGPOLL_PATH)
