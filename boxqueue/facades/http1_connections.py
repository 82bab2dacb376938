"""Plain HTTP/1.1 connections served to an ASGI application by the front door itself.

hypercorn serves a request through several layers of its own (a connection server, a protocol
object, a stream object, a task spawned per request, an idle timer updated by events, the ASGI
message queue between them); for a short request those layers cost more than the application's
work (the Zaqar cycle's profile, docs/performance.md). A listener served with ``http1`` in
:func:`boxqueue.facades.asgi_serving.serve_asgi` has its plain (not TLS) HTTP/1.1 connections
served here instead: one task per connection reads with h11, calls the application in that task
with an ASGI ``http`` scope, and writes each answer's head and body with one ``send``. TLS
connections and WebSocket upgrades still go to hypercorn.

What the front door promises for every HTTP listener holds here too (and is tested against both):

* between requests the keep-alive timeout applies, up to the end of the next head;
* a request's body must arrive within ``body_timeout_s`` of its head, else ``408`` with
  ``Connection: close`` (unless the answer has begun) and the application's ``receive`` reports
  ``http.disconnect``;
* an answer that begins before the request's body was read to its end carries
  ``Connection: close``, and the connection closes after it;
* a head h11 refuses gets h11's status hint (``400``, ``431`` for a head too long) and the
  connection closes; an application that fails before answering gets ``500``;
* once the body has been read, ``receive`` waits for the client to leave (``http.disconnect``),
  reading ahead at most ``MAX_AHEAD`` bytes of what the client sends next;
* when the server stops, idle connections close at once and a request being answered gets its
  answer with ``Connection: close``.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote
from wsgiref.handlers import format_date_time

import h11
import trio

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 30.0  # a client that takes nothing we write for this long is dropped
MAX_AHEAD = 65536  # what a client may send ahead of an answer before we stop reading it
READ_CHUNK = 65536

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def receive_some(sock: socket.socket, max_bytes: int = READ_CHUNK) -> bytes:
    """The next bytes the client sends; b"" once its stream has ended (or broken)."""
    while True:
        await trio.lowlevel.wait_readable(sock)
        try:
            return sock.recv(max_bytes)
        except BlockingIOError:
            continue
        except OSError:
            return b""


async def send_all(sock: socket.socket, data: bytes) -> bool:
    """Write ``data``, waiting while the socket is full; False if the connection broke or took
    nothing for ``SEND_TIMEOUT_S``."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            with trio.move_on_after(SEND_TIMEOUT_S) as timer:
                await trio.lowlevel.wait_writable(sock)
            if timer.cancelled_caught:
                return False
        except OSError:
            return False
    return True


class _Date:
    """The ``date`` header's value, formatted once a second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second, cls.value = now, format_date_time(now).encode("ascii")
        return cls.value


@dataclass
class Serving:
    """What every connection of one listener shares: its timeouts and the server's stop."""

    keep_alive_timeout_s: float
    body_timeout_s: float
    stopping: bool = False
    idle: set[trio.CancelScope] = field(default_factory=set)  # connections waiting between requests

    def stop(self) -> None:
        """The server stops: idle connections close now, busy ones after their answer."""
        self.stopping = True
        for scope in list(self.idle):
            scope.cancel()


_DISCONNECT = {"type": "http.disconnect"}
_TIMEOUT_BODY = b"Request Timeout: the request body did not arrive in time.\n"


class Http1Connection:
    """One plain HTTP/1.1 connection, from its first request to its close."""

    def __init__(self, sock: socket.socket, app: ASGIApp, serving: Serving) -> None:
        self.sock = sock
        self.app = app
        self.serving = serving
        self.conn = h11.Connection(h11.SERVER)
        self.client_gone = False
        # per request:
        self.method = b""
        self.body_done = True  # h11 has read the request to its end
        self.delivered = True  # and the application has had all of it
        self.body_deadline = 0.0
        self.timed_out = False
        self.head: h11.Response | None = None  # the answer's head, sent with the first body
        self.answering = False
        self.answered = False
        self.close_after = False

    async def serve(self, received: bytes) -> None:
        """Serve the connection's requests, starting with the bytes already read from it."""
        conn = self.conn
        conn.receive_data(received)
        try:
            server = self.sock.getsockname()[:2]
            client = self.sock.getpeername()[:2]
        except OSError:
            return
        waited = True
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                await self._refuse(exc.error_status_hint)
                return
            if event is h11.NEED_DATA:
                if not await self._next_bytes():
                    return
                waited = True
                continue
            if not isinstance(event, h11.Request):
                return  # the client closed (ConnectionClosed), or nothing more we can read
            if not waited:
                await trio.lowlevel.checkpoint()  # pipelined requests: let the others run
            if not await self._request(event, server, client):
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE or self.client_gone:
                return
            conn.start_next_cycle()
            waited = False

    async def _next_bytes(self) -> bool:
        """Wait (up to the keep-alive timeout) for the next request's bytes; False to close."""
        if self.serving.stopping:
            return False
        with trio.CancelScope(deadline=trio.current_time() + self.serving.keep_alive_timeout_s) as scope:
            self.serving.idle.add(scope)
            try:
                data = await receive_some(self.sock)
            finally:
                self.serving.idle.discard(scope)
        if scope.cancelled_caught or not data:
            return False
        self.conn.receive_data(data)
        return True

    async def _request(self, request: h11.Request, server: tuple[str, int], client: tuple[str, int]) -> bool:
        """Answer one request; False if the connection is to close after it."""
        raw_path, _, query = request.target.partition(b"?")
        self.method = request.method
        headers = list(request.headers)
        self.delivered = False
        self.body_done = not has_body(headers)
        if self.body_done:
            self.conn.next_event()  # its EndOfMessage: the request is read to its end
        self.body_deadline = trio.current_time() + self.serving.body_timeout_s
        self.timed_out = self.answering = self.answered = False
        self.close_after = self.serving.stopping
        self.head = None
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode("ascii"), "method": request.method.decode("ascii"),
            "scheme": "http", "path": unquote(raw_path.decode("ascii", "replace")), "raw_path": raw_path,
            "query_string": query, "root_path": "", "headers": headers, "client": client, "server": server,
            "extensions": {},
        }
        try:
            await self.app(scope, self._receive, self._send)
        except Exception:
            log.exception("HTTP application failed on %s %s", scope["method"], scope["path"])
            if not self.answering:
                await self._answer_error(500)
            return False
        if not self.answered:
            if not self.answering:  # the application returned without an answer
                await self._answer_error(500)
            return False
        return not self.close_after

    async def _receive(self) -> dict[str, Any]:
        if self.delivered or self.timed_out:
            await self._wait_for_leaving()
            return _DISCONNECT
        if self.body_done:  # a request without a body
            self.delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        conn = self.conn
        body = b""
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                self.client_gone = self.close_after = True  # a broken body: nothing more to read
                return _DISCONNECT
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                self.body_done = self.delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            elif event is h11.NEED_DATA:
                if body:
                    return {"type": "http.request", "body": body, "more_body": True}
                if conn.they_are_waiting_for_100_continue:
                    await self._write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
                data = b""
                with trio.move_on_at(self.body_deadline):
                    data = await receive_some(self.sock)
                if not data:
                    if trio.current_time() >= self.body_deadline:
                        await self._body_timed_out()
                    self.client_gone = True
                    return _DISCONNECT
                conn.receive_data(data)
            else:  # ConnectionClosed, or nothing that belongs to a body
                self.client_gone = True
                return _DISCONNECT

    async def _wait_for_leaving(self) -> None:
        """Return when the client has left; meanwhile what it sends next is kept for later."""
        while not self.client_gone:
            if len(self.conn.trailing_data[0]) >= MAX_AHEAD:
                await trio.sleep_forever()  # it sent too much ahead: stop reading it
            data = await receive_some(self.sock)
            if not data:
                self.client_gone = True
            else:
                self.conn.receive_data(data)

    async def _body_timed_out(self) -> None:
        self.timed_out = self.close_after = True
        log.info("a request body did not arrive within %.1f s: 408", self.serving.body_timeout_s)
        if not self.answering:
            self.answering = True
            headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                       (b"content-length", b"%d" % len(_TIMEOUT_BODY)), (b"date", _Date.now())]
            conn = self.conn
            await self._write(conn.send(h11.Response(status_code=408, headers=headers))
                              + conn.send(h11.Data(data=_TIMEOUT_BODY)) + conn.send(h11.EndOfMessage()))
            self.answered = True

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if self.timed_out and self.answered:
            return  # the 408 went out in its place
        if kind == "http.response.start":
            if self.answering:
                raise RuntimeError("an HTTP answer was started twice")
            self.answering = True
            headers = [*message.get("headers", ()), (b"date", _Date.now())]
            if not self.body_done or self.close_after:
                # The request is not read to its end (or the server stops): this answer is the
                # connection's last, and says so, so a keep-alive client does not send another.
                self.close_after = True
                headers = [(k, v) for k, v in headers if k.lower() != b"connection"]
                headers.append((b"connection", b"close"))
            self.head = h11.Response(status_code=message["status"], headers=headers)
        elif kind == "http.response.body":
            if not self.answering or self.answered:
                raise RuntimeError("an HTTP answer's body outside its answer")
            conn = self.conn
            data = b""
            if self.head is not None:
                data = conn.send(self.head) or b""
                self.head = None
            body = message.get("body", b"")
            if body and self.method != b"HEAD":
                data += conn.send(h11.Data(data=body)) or b""
            if not message.get("more_body", False):
                data += conn.send(h11.EndOfMessage()) or b""
                self.answered = True
            if data:
                await self._write(data)

    async def _write(self, data: bytes) -> None:
        if not await send_all(self.sock, data):
            self.client_gone = self.close_after = True

    async def _refuse(self, status: int) -> None:
        """Answer a request h11 refused, and close (as hypercorn answers one)."""
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        await send_all(self.sock, b"HTTP/1.1 %d \r\ncontent-length: 0\r\nconnection: close\r\ndate: %s\r\n\r\n"
                       % (status, _Date.now()))

    async def _answer_error(self, status: int) -> None:
        self.answering = True
        self.close_after = True
        conn = self.conn
        if conn.our_state is not h11.SEND_RESPONSE:
            return
        headers = [(b"content-length", b"0"), (b"connection", b"close"), (b"date", _Date.now())]
        await self._write(conn.send(h11.Response(status_code=status, headers=headers))
                          + conn.send(h11.EndOfMessage()))
        self.answered = True


def has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request with these (h11: lower-case) headers has a body to read."""
    for key, value in headers:
        name = key.lower()
        if name == b"content-length":
            return value.strip() != b"0"
        if name == b"transfer-encoding":
            return True
    return False
