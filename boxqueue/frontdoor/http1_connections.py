"""Plain HTTP/1.1 connections served to an ASGI application by the front door itself.

hypercorn serves a request through several layers of its own (a connection server, a protocol
object, a stream object, a task spawned per request, an idle timer updated by events, the ASGI
message queue between them); for a short request those layers cost more than the application's
work (the Zaqar cycle's profile, docs/performance.md). A listener served with ``http1`` in
:func:`boxqueue.frontdoor.asgi_serving.serve_asgi` has its plain (not TLS) HTTP/1.1 connections
served here instead: one task per connection reads requests, calls the application in that task
with an ASGI ``http`` scope, and writes each answer's head and body with one ``send``. TLS
connections and WebSocket upgrades still go to hypercorn.

Requests are parsed by ``httptools`` (llhttp, Node's parser, as uvicorn uses it): h11 cost about
50 us of a request's 400 (parsing, its state machine, and a regular expression per header to
validate what we write). Answers are framed here: the head as the application gave it (names and
values checked for line breaks) with ``date``, the body by the application's ``content-length``,
else by its length when it comes in one message, else chunked.

What the front door promises for every HTTP listener holds here too (and is tested against both):

* between requests the keep-alive timeout applies; once the next request's first byte has come,
  its head must end within ``header_timeout_s`` of it (a deadline set once, not moved by the
  bytes that trickle in);
* a request's body must arrive within ``body_timeout_s`` of its head, else ``408`` with
  ``Connection: close`` (unless the answer has begun) and the application's ``receive`` reports
  ``http.disconnect``;
* an answer that begins before the request's body was received to its end carries
  ``Connection: close``, and the connection closes after it;
* a request the parser refuses gets ``400`` (``431`` for a head longer than ``MAX_HEAD``) and the
  connection closes, and so does an HTTP/1.1 request without exactly one ``Host`` (RFC 9112
  3.2); an application that fails before answering gets ``500``;
* once the body has been read, ``receive`` waits for the client to leave (``http.disconnect``),
  reading ahead at most ``MAX_AHEAD`` bytes of what the client sends next;
* HTTP/1.0 requests, and requests that ask for it, get ``Connection: close`` and the connection
  closes after the answer; a request that asks to switch protocols on a kept-alive connection is
  answered as a plain request, then the connection closes;
* when the server stops, idle connections close at once and a request being answered gets its
  answer with ``Connection: close``.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote
from wsgiref.handlers import format_date_time

import httptools
import trio

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 30.0  # a client that takes nothing we write for this long is dropped
MAX_AHEAD = 65536  # what a client may send ahead of an answer before we stop reading it
MAX_HEAD = 16384  # a request head longer than this is refused (431), as h11 refuses one
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
    """The ``date`` header's value, formatted once a second (a cache of the clock, nothing more)."""

    second = -1
    value = b""


def http_date() -> bytes:
    """The ``date`` header's value for an answer written now."""
    now = int(time.time())
    if now != _Date.second:
        _Date.second, _Date.value = now, format_date_time(now).encode("ascii")
    return _Date.value


@dataclass
class Serving:
    """What every connection of one listener shares: its timeouts and the server's stop."""

    keep_alive_timeout_s: float
    body_timeout_s: float
    header_timeout_s: float = 20.0  # a head from its first byte (after the first request's)
    stopping: bool = False
    idle: set[trio.CancelScope] = field(default_factory=set)  # connections waiting between requests

    def stop(self) -> None:
        """The server stops: idle connections close now, busy ones after their answer."""
        self.stopping = True
        for scope in list(self.idle):
            scope.cancel()


class _Request:
    """One request as the parser has seen it so far."""

    __slots__ = ("body", "complete", "continue_", "fed", "head_done", "head_size", "headers", "hosts", "keep",
                 "method", "target", "upgrade", "version")

    def __init__(self) -> None:
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.method = b""
        self.version = "1.1"
        self.keep = True
        self.upgrade = False
        self.continue_ = False  # the client waits for 100 Continue before its body
        self.head_done = False
        self.head_size = 0  # bytes of the target and the header lines parsed so far
        self.hosts = 0  # Host header lines
        self.fed = 0  # bytes read wholly inside the head, after the read it began in
        self.body: list[bytes] = []
        self.complete = False


class _Requests:
    """The parser's callbacks: the requests of one connection, in order, as they arrive."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[_Request] = deque()
        self.current: _Request | None = None
        self.ahead = 0  # body bytes parsed and not yet given to the application

    def on_message_begin(self) -> None:
        self.current = _Request()
        self.queue.append(self.current)

    def on_url(self, url: bytes) -> None:
        assert self.current is not None
        self.current.target += url
        self.current.head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.current is not None
        lower = name.lower()
        self.current.headers.append((lower, value))
        self.current.head_size += len(name) + len(value) + 4
        if lower == b"host":
            self.current.hosts += 1

    def on_headers_complete(self) -> None:
        request = self.current
        assert request is not None
        parser = self.parser
        request.method = parser.get_method()
        request.version = parser.get_http_version()
        request.keep = parser.should_keep_alive() and request.version == "1.1"
        request.upgrade = parser.should_upgrade()
        request.continue_ = any(k == b"expect" and v.lower() == b"100-continue" for k, v in request.headers)
        request.head_done = True

    def on_body(self, body: bytes) -> None:
        assert self.current is not None
        self.current.body.append(body)
        self.ahead += len(body)

    def on_message_complete(self) -> None:
        assert self.current is not None
        self.current.complete = True


_DISCONNECT = {"type": "http.disconnect"}
TIMEOUT_BODY = b"Request Timeout: the request body did not arrive in time.\n"
_NO_BODY_STATUS = frozenset([204, 304])


class Http1Connection:
    """One plain HTTP/1.1 connection, from its first request to its close."""

    def __init__(self, sock: socket.socket, app: ASGIApp, serving: Serving) -> None:
        self.sock = sock
        self.app = app
        self.serving = serving
        self.requests = _Requests()
        self.refused: int | None = None  # the parser refused what followed: answer this status
        self.client_gone = False
        # per request:
        self.request = _Request()
        self.delivered = True  # the application has had all of the request's body
        self.body_deadline = 0.0
        self.timed_out = False
        self.head: bytes | None = None  # the answer's head, sent with the first body
        self.framed = False  # the answer's head frames its body (content-length), or it has none
        self.chunked = False  # the answer's body goes out in chunks
        self.no_body = False  # an answer that sends no body (to a HEAD; 204, 304)
        self.answering = False
        self.answered = False
        self.close_after = False
        self.idle_began = -1.0  # when the connection began waiting for a request's first byte
        self.head_began = -1.0  # when the head being read began arriving

    def _feed(self, data: bytes) -> None:
        """Parse what the client sent; a refusal is answered once the requests before it are."""
        if self.refused is not None:
            return
        requests = self.requests
        before = requests.current
        try:
            requests.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # the request asks to switch protocols: answered as a plain request, then closed
        except httptools.HttpParserError:
            self.refused = 400
            return
        current = requests.current
        if current is not None and not current.head_done:
            # Neither count is more than the head's length: the complete lines the parser gave,
            # and the chunks read wholly inside the head (so what the parser holds of a head is
            # at most one read more than the limit).
            if current is before:
                current.fed += len(data)
            if current.fed > MAX_HEAD or current.head_size > MAX_HEAD:
                self.refused = 431

    async def serve(self, received: bytes) -> None:
        """Serve the connection's requests, starting with the bytes already read from it."""
        self._feed(received)
        try:
            server = self.sock.getsockname()[:2]
            client = self.sock.getpeername()[:2]
        except OSError:
            return
        queue = self.requests.queue
        waited = True
        while True:
            if not queue or not queue[0].head_done:
                if self.refused is not None:
                    await self._refuse(self.refused)
                    return
                if not await self._next_bytes():
                    return
                waited = True
                continue
            if not waited:
                await trio.lowlevel.checkpoint()  # pipelined requests: let the others run
            request = queue[0]
            self.idle_began = self.head_began = -1.0
            if request.version == "1.1" and request.hosts != 1:
                await self._refuse(400)  # RFC 9112 3.2: none, or more than one
                return
            if not await self._request(request, server, client):
                return
            if not request.complete or self.client_gone or not request.keep or request.upgrade:
                return
            queue.popleft()
            if request.body:  # a body the application did not ask for
                self.requests.ahead -= sum(map(len, request.body))
            waited = False

    async def _next_bytes(self) -> bool:
        """Wait for the next request's bytes (up to the keep-alive timeout from the previous
        request, or the head timeout from the first byte of this one); False to close."""
        serving = self.serving
        if serving.stopping:
            return False
        now = trio.current_time()
        current = self.requests.current
        if current is not None and not current.head_done:  # a head has begun
            if self.head_began < 0:
                self.head_began = now
            deadline = self.head_began + serving.header_timeout_s
        else:
            if self.idle_began < 0:
                self.idle_began = now
            deadline = self.idle_began + serving.keep_alive_timeout_s
        with trio.CancelScope(deadline=deadline) as scope:
            self.serving.idle.add(scope)
            try:
                data = await receive_some(self.sock)
            finally:
                self.serving.idle.discard(scope)
        if scope.cancelled_caught or not data:
            return False
        self._feed(data)
        return True

    async def _request(self, request: _Request, server: tuple[str, int], client: tuple[str, int]) -> bool:
        """Answer one request; False if the connection is to close after it."""
        self.request = request
        raw_path, _, query = request.target.partition(b"?")
        self.delivered = False
        self.body_deadline = trio.current_time() + self.serving.body_timeout_s
        self.timed_out = self.answering = self.answered = False
        self.close_after = self.serving.stopping or not request.keep or request.upgrade
        self.head = None
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.version, "method": request.method.decode("ascii"),
            "scheme": "http", "path": unquote(raw_path.decode("ascii", "replace")), "raw_path": raw_path,
            "query_string": query, "root_path": "", "headers": request.headers, "client": client,
            "server": server, "extensions": {},
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
        request = self.request
        while not request.body and not request.complete:
            if self.refused is not None:  # the body broke off in something the parser refused
                self.client_gone = self.close_after = True
                return _DISCONNECT
            if request.continue_:
                request.continue_ = False
                await self._write(b"HTTP/1.1 100 \r\n\r\n")
            data = b""
            with trio.move_on_at(self.body_deadline):
                data = await receive_some(self.sock)
            if not data:
                if trio.current_time() >= self.body_deadline:
                    await self._body_timed_out()
                self.client_gone = True
                return _DISCONNECT
            self._feed(data)
        body = request.body[0] if len(request.body) == 1 else b"".join(request.body)
        request.body = []
        self.requests.ahead -= len(body)
        if request.complete:
            self.delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.request", "body": body, "more_body": True}

    async def _wait_for_leaving(self) -> None:
        """Return when the client has left; meanwhile what it sends next is parsed and kept."""
        while not self.client_gone:
            if self.requests.ahead >= MAX_AHEAD or len(self.requests.queue) > 64 or self.refused is not None:
                await trio.sleep_forever()  # it sent too much ahead: stop reading it
            data = await receive_some(self.sock)
            if not data:
                self.client_gone = True
            else:
                self._feed(data)

    async def _body_timed_out(self) -> None:
        self.timed_out = self.close_after = True
        log.info("a request body did not arrive within %.1f s: 408", self.serving.body_timeout_s)
        if not self.answering:
            self.answering = True
            await self._write(b"HTTP/1.1 408 \r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
                              b"content-length: %d\r\ndate: %s\r\n\r\n%s"
                              % (len(TIMEOUT_BODY), http_date(), TIMEOUT_BODY))
            self.answered = True

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if self.timed_out and self.answered:
            return  # the 408 went out in its place
        if kind == "http.response.start":
            if self.answering:
                raise RuntimeError("an HTTP answer was started twice")
            self._start(message["status"], message.get("headers", ()))  # (a bad header: 500)
            self.answering = True
        elif kind == "http.response.body":
            if not self.answering or self.answered:
                raise RuntimeError("an HTTP answer's body outside its answer")
            body = message.get("body", b"")
            more = message.get("more_body", False)
            data = b""
            if self.head is not None:  # the first part: the head goes with it, framing decided
                data = self.head
                self.head = None
                if self.framed:
                    data += b"\r\n"
                elif not more:
                    data += b"content-length: %d\r\n\r\n" % len(body)
                else:
                    self.chunked = True
                    data += b"transfer-encoding: chunked\r\n\r\n"
            if body and not self.no_body:
                data += b"%x\r\n%s\r\n" % (len(body), body) if self.chunked else body
            if not more:
                if self.chunked and not self.no_body:
                    data += b"0\r\n\r\n"
                self.answered = True
            if data:
                await self._write(data)

    def _start(self, status: int, headers: Any) -> None:
        """The answer's head, but for its framing, decided when the body's first part comes."""
        if self.serving.stopping:
            self.close_after = True  # the server stopped while this request was answered
        if not self.request.complete:
            # The request is not read to its end (what follows it on the connection is unknown):
            # this answer is the connection's last, and says so, so a keep-alive client does not
            # send another on it. A body read to its end that the application did not ask for is
            # dropped: the connection goes on.
            self.close_after = True
        lines = [b"HTTP/1.1 %d \r\n" % status]
        self.framed = status in _NO_BODY_STATUS or status < 200  # no body, no framing to add
        for name, value in headers:
            if b"\n" in name or b"\r" in name or b"\n" in value or b"\r" in value:
                raise ValueError(f"a line break in an answer's header {name!r}")
            lower = name.lower()
            if lower == b"transfer-encoding" or (lower == b"connection" and self.close_after):
                continue  # the framing is ours to write
            if lower == b"content-length":
                self.framed = True
            lines.append(b"%s: %s\r\n" % (name, value))
        lines.append(b"date: %s\r\n" % http_date())
        if self.close_after:
            lines.append(b"connection: close\r\n")
        self.no_body = self.request.method == b"HEAD" or status in _NO_BODY_STATUS or status < 200
        self.chunked = False
        self.head = b"".join(lines)

    async def _write(self, data: bytes) -> None:
        if not await send_all(self.sock, data):
            self.client_gone = self.close_after = True

    async def _refuse(self, status: int) -> None:
        """Answer a request the parser refused, and close (as hypercorn answers one)."""
        await send_all(self.sock, _closing_answer(status))

    async def _answer_error(self, status: int) -> None:
        self.answering = self.answered = self.close_after = True
        await self._write(_closing_answer(status))


def _closing_answer(status: int) -> bytes:
    """An answer without a body that ends the connection."""
    return b"HTTP/1.1 %d \r\ncontent-length: 0\r\nconnection: close\r\ndate: %s\r\n\r\n" % (status, http_date())
