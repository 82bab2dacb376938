"""Serve an ASGI application inside the server's own trio process (hypercorn's trio worker).

One HTTP stack for every HTTP facade: :func:`serve_asgi` binds the address, reports the bound
port through ``task_status`` (so port 0 works) and serves until ``shutdown`` is set; then it stops
accepting and gives the open requests ``graceful_s`` to finish before cancelling them. The caller
makes its long-lived requests finish first (the Sonya facade ends its listeners), so a graceful
stop answers them instead of cutting them off. A busy port raises OSError at start, like the
iproto listener.

A facade may also *take over* connections: with ``takeover``, connections are accepted here, the
head of each one's first request is read and parsed (h11), and ``takeover(request)`` may return a
handler that gets the raw socket and the bytes read and serves that connection itself, below the
ASGI layer (it may give the connection back to hypercorn later, see ``Handler``). Every other connection goes to hypercorn's
own connection server (``hypercorn.trio.tcp_server.TCPServer``, as ``hypercorn.trio.serve`` runs
it) with the bytes read so far replayed in front of the stream, so it sees exactly what the client
sent. The Sonya facade takes over WebSocket listeners this way: a fan-out then writes each
listener's frame straight to its socket instead of through ASGI, hypercorn and wsproto per frame.

A listener may also be served with ``http1``: its plain HTTP/1.1 connections that no takeover
claims (every one but a WebSocket upgrade) are then served by this process's own HTTP/1.1 server,
:mod:`boxqueue.frontdoor.http1_connections` (llhttp through httptools, one task per connection, the
ASGI application called in it), instead of hypercorn's layers; TLS connections and upgrades still
go to hypercorn. The Zaqar facade is served so: its requests are short, and hypercorn's layers cost
more than its handlers (docs/performance.md). The Sonya facade is not: a WebSocket upgrade that
follows another request on a kept-alive connection must reach hypercorn, and this server answers
every request on its connections itself (it would answer that one as a plain request).

Every HTTP listener (Zaqar, Sonya, metrics) is served through this front door, so what protects a
listener is done here once (:class:`Listening`; the HTTP/1.1 server keeps the same promises):

* **TLS** is terminated here (a :class:`trio.SSLStream` per connection, the handshake within the
  head timeout); hypercorn then sees a TLS stream (``scheme`` is ``https``). A connection that
  needs the raw socket (a takeover) cannot be handed one under TLS, so with TLS every connection
  goes to hypercorn: Sonya's listeners are then served by its Starlette endpoints (the same
  behaviour, without the fan-out's one-``send``-per-listener speed).
* **max_connections**: one more connection than the limit gets ``503`` with ``Connection: close``
  (plain HTTP; under TLS it is closed) without being read.
* **Slow clients**: the TLS handshake and the first request's head must arrive within
  ``header_timeout_s``; between requests the keep-alive timeout applies (hypercorn's idle timer
  runs until a whole head has arrived, so a head sent a byte at a time is cut off there too; our
  HTTP/1.1 server gives a head ``header_timeout_s`` from its first byte).
* **Slow bodies**: a request's body must arrive within ``body_timeout_s`` of its head; one that
  trickles in longer is answered ``408 Request Timeout`` with ``Connection: close`` (unless the
  application has begun its answer) and the application reads the end of its client
  (``http.disconnect``), so it stops waiting.
* **Requests given up on**: an answer sent before the request's body was read to its end (a body
  too large, or refused before it was read) carries ``Connection: close``, so a keep-alive client
  does not send its next request on a connection the server is about to close.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Updated
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from boxqueue.frontdoor.http1_connections import TIMEOUT_BODY, Http1Connection, Serving
from boxqueue.iproto.listening import Gate

log = logging.getLogger(__name__)

# A connection taken over: the raw socket (non-blocking; the handler's until it returns), its first
# request as h11 parsed it, that request's head bytes and the bytes received after them. The
# handler returns None when it is done with the connection (it is then closed), or bytes to
# replay to hypercorn, which serves the rest of the connection (a request the handler does not
# serve, and whatever followed it).
Handler = Callable[[socket.socket, h11.Request, bytes, bytes], Awaitable[bytes | None]]
Takeover = Callable[[h11.Request], Handler | None]

HEAD_END = b"\r\n\r\n"
_BUSY_BODY = b"Too many connections, try again later.\n"
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


@dataclass(frozen=True)
class Listening:
    """How an HTTP listener accepts: TLS, its connection limit, its timeouts."""

    ssl_context: ssl.SSLContext | None = None
    max_connections: int | None = None  # open connections at once; None: no limit
    header_timeout_s: float = 20.0  # from accept to the end of the first request's head
    keep_alive_timeout_s: float = 75.0  # idle between requests (hypercorn's: up to the end of the next head)
    body_timeout_s: float = 60.0  # from a request's head to the end of its body


PLAIN = Listening()  # no TLS, no connection limit, the default timeouts
MAX_HEAD = 16384  # h11's own limit for an incomplete head; longer heads go to hypercorn
READ_CHUNK = 65536


def hypercorn_config(host: str, port: int, graceful_s: float, keep_alive_s: float = 75.0) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.graceful_timeout = graceful_s
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = keep_alive_s
    config.backlog = 1024
    return config


async def serve_asgi(
    app: Any,
    host: str,
    port: int,
    shutdown: trio.Event,
    *,
    name: str = "HTTP",
    graceful_s: float = 5.0,
    takeover: Takeover | None = None,
    listening: Listening = PLAIN,
    http1: bool = False,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until ``shutdown`` is set; started() with the bound port.
    With ``http1``, plain HTTP/1.1 connections that ``takeover`` does not take are served by
    :mod:`boxqueue.frontdoor.http1_connections` instead of hypercorn (not TLS, not upgrades)."""
    config = hypercorn_config(host, port, graceful_s, listening.keep_alive_timeout_s)
    if listening.ssl_context is not None:
        takeover = None  # a takeover handler needs the raw socket
        http1 = False
    served = close_unread_requests(body_deadline(app, listening.body_timeout_s))
    await _FrontDoor(served, config, takeover, listening, app if http1 else None).serve(shutdown, name, task_status)


async def answer_lifespan(receive: Any, send: Any) -> None:
    """An application's side of an ASGI lifespan scope, for applications with nothing to start or
    stop (hypercorn's connection servers, as this front door runs them, send none; a server that
    runs the application whole does)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def body_deadline(app: Any, timeout_s: float) -> Any:
    """``app`` with a deadline on each request's body: ``timeout_s`` from the start of the request
    (its head has arrived) to the end of its body. Past it, the client is answered 408 (unless the
    application has begun an answer) and the application's ``receive`` says the client has gone;
    once the body has arrived, ``receive`` waits as long as the application wants (a long-poll
    listens for the client's leaving there)."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _has_body(scope["headers"]):
            await app(scope, receive, send)
            return
        deadline = trio.current_time() + timeout_s
        body_done = timed_out = answering = False

        async def timed_receive() -> dict[str, Any]:
            nonlocal body_done, timed_out
            if body_done:
                return await receive()
            if timed_out:
                return {"type": "http.disconnect"}
            with trio.move_on_at(deadline):
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    body_done = True
                return message
            timed_out = True
            log.info("a request body did not arrive within %.1f s: 408", timeout_s)
            if not answering:
                await send({"type": "http.response.start", "status": 408, "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                    (b"content-length", str(len(TIMEOUT_BODY)).encode())]})
                await send({"type": "http.response.body", "body": TIMEOUT_BODY})
            return {"type": "http.disconnect"}

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal answering
            if timed_out and not answering:
                return  # the 408 went out in its place
            answering = True
            await send(message)

        await app(scope, timed_receive, tracking_send)

    return wrapped


def close_unread_requests(app: Any) -> Any:
    """``app`` with ``Connection: close`` added to an HTTP answer that starts before the
    request's body was received to its end: hypercorn cannot reuse that connection (h11 has not
    seen the request end), and without the header a keep-alive client would send its next request
    on it and get no answer."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _has_body(scope["headers"]):
            await app(scope, receive, send)
            return
        received_all = False

        async def tracking_receive() -> dict[str, Any]:
            nonlocal received_all
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                received_all = True
            return message

        async def closing_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and not received_all:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await app(scope, tracking_receive, closing_send)

    return wrapped


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for key, value in headers:
        k = key.lower()
        if k == b"content-length":
            return value.strip() != b"0"
        if k == b"transfer-encoding":
            return True
    return False


class _FrontDoor:
    """Accepts connections (TLS, connection limit, head timeout), hands listeners' to the facade
    and the rest to hypercorn."""

    def __init__(self, app: Any, config: HypercornConfig, takeover: Takeover | None, listening: Listening,
                 http1_app: Any = None) -> None:
        self.config = config
        self.takeover = takeover
        self.listening = listening
        self.http1_app = http1_app  # served on plain HTTP/1.1 connections by our own server
        self.http1 = Serving(listening.keep_alive_timeout_s, listening.body_timeout_s, listening.header_timeout_s)
        self.app = wrap_app(app, config.wsgi_max_body_size, "asgi")
        self.context = WorkerContext(None)
        self.gate = Gate("HTTP", listening.max_connections)
        self.name = "HTTP"

    async def serve(self, shutdown: trio.Event, name: str, task_status: trio.TaskStatus[int]) -> None:
        self.name = self.gate.name = name
        sockets = self.config.create_sockets().insecure_sockets  # binds: OSError if busy
        for sock in sockets:
            sock.listen(self.config.backlog)
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]
        bound = sockets[0].getsockname()[1]
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(self._accept, listener, connections)
                tls = " (TLS)" if self.listening.ssl_context is not None else ""
                log.info("%s listening on %s:%d%s", name, sockets[0].getsockname()[0], bound, tls)
                task_status.started(bound)
                await shutdown.wait()
                accepting.cancel_scope.cancel()
            for listener in listeners:
                await listener.aclose()
            await self.context.terminated.set()  # hypercorn's connections finish and close
            self.http1.stop()  # and ours
            connections.cancel_scope.deadline = trio.current_time() + self.config.graceful_timeout

    async def _accept(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        await trio.serve_listeners(self._connection, [listener], handler_nursery=connections)

    async def _connection(self, stream: trio.SocketStream) -> None:
        if not self.gate.enter():
            await self._refuse(stream)
            return
        try:
            await self._dispatch(stream)
        except Exception:  # one connection's failure must not stop the server
            log.exception("connection failed")
            await trio.aclose_forcefully(stream)
        finally:
            self.gate.leave()

    async def _refuse(self, stream: trio.SocketStream) -> None:
        if self.listening.ssl_context is None:
            with trio.move_on_after(1):
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(BUSY_RESPONSE)
        await trio.aclose_forcefully(stream)

    async def _dispatch(self, raw: trio.SocketStream) -> None:
        stream: trio.SocketStream | trio.SSLStream = raw
        received = bytearray()
        chunk: bytes | bytearray = b""
        with trio.move_on_after(self.listening.header_timeout_s):
            if self.listening.ssl_context is not None:
                tls = trio.SSLStream(raw, self.listening.ssl_context, server_side=True, https_compatible=True)
                try:
                    await tls.do_handshake()
                except trio.BrokenResourceError as exc:
                    log.info("%s: TLS handshake failed: %s", self.name, exc.__cause__ or exc)
                    await trio.aclose_forcefully(raw)
                    return
                stream = tls
            while HEAD_END not in received and len(received) <= MAX_HEAD:
                try:
                    chunk = await stream.receive_some(READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    chunk = b""
                if not chunk:
                    break
                received += chunk
        if HEAD_END not in received and (not received or not chunk or len(received) <= MAX_HEAD):
            await trio.aclose_forcefully(stream)  # silent or too slow for too long, or gone
            return
        if isinstance(stream, trio.SSLStream):
            await self._hypercorn(_TlsReplay(stream, bytes(received)))
            return
        parsed = parse_head(bytes(received))
        handler = self.takeover(parsed[0]) if parsed is not None and self.takeover is not None else None
        if handler is None and parsed is not None and self.http1_app is not None and not _upgrade(parsed[0]):
            handler = self._serve_http1
        if parsed is None or handler is None:  # hypercorn answers what we do not parse its own way
            await self._hypercorn(_Replay(raw, bytes(received)))
            return
        request, head_length = parsed
        sock = socket.socket(fileno=raw.socket.detach())
        sock.setblocking(False)
        handed_back: bytes | None = None
        try:
            handed_back = await handler(sock, request, bytes(received[:head_length]), bytes(received[head_length:]))
        finally:
            if handed_back is None:
                trio.lowlevel.notify_closing(sock)
                sock.close()
        if handed_back is not None:
            await self._hypercorn(_Replay(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), handed_back))

    async def _serve_http1(self, sock: socket.socket, request: h11.Request, head: bytes, rest: bytes) -> None:
        await Http1Connection(sock, self.http1_app, self.http1).serve(head + rest)

    async def _hypercorn(self, stream: trio.abc.HalfCloseableStream) -> None:
        """Serve the connection with hypercorn, replaying what was read from it already."""
        # hypercorn's annotation names its own listeners' stream type; it serves any trio stream.
        await _ConnectionServer(self.app, self.config, self.context, ConnectionState({}), stream)  # type: ignore[arg-type]


class _ConnectionServer(TCPServer):
    """hypercorn's trio connection server, ended when its client has gone.

    hypercorn 0.18's trio server keeps a connection whose client closed it between requests until
    its keep-alive timeout (75 s): the end of the stream does not stop its idle timer, and the
    connection's task group waits for it. A client that opens a connection per request would hold
    that many connections (their tasks and buffers, and their place under ``max_connections``)
    for 75 s each. At the end of the stream the timer is stopped here, and not started again."""

    _client_gone = False

    async def _read_data(self) -> None:
        await super()._read_data()
        self._client_gone = True
        await self.idle_task.stop()

    async def protocol_send(self, event: Any) -> None:
        if self._client_gone and isinstance(event, Updated) and event.idle:
            return  # nothing to keep alive for
        await super().protocol_send(event)


def _upgrade(request: h11.Request) -> bool:
    """Whether ``request`` asks to switch protocols (a WebSocket handshake: hypercorn's)."""
    return any(name == b"upgrade" for name, _ in request.headers)


def parse_head(data: bytes) -> tuple[h11.Request, int] | None:
    """The request whose head (ending in CRLF CRLF) starts ``data``, and the head's length; None if
    there is no complete head there or h11 refuses it."""
    end = data.find(HEAD_END)
    if end < 0:
        return None
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data[: end + len(HEAD_END)])
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return None
    return (event, end + len(HEAD_END)) if isinstance(event, h11.Request) else None


def responder(head: bytes) -> h11.Connection:
    """An h11 server connection that has read the request ``head`` (a GET without a body): what
    writes the response, framed for that request (keep-alive, HTTP/1.0, upgrade)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(head)
    while conn.next_event() not in (h11.NEED_DATA, h11.PAUSED) and conn.their_state is not h11.DONE:
        pass
    return conn


class _Replay(trio.abc.HalfCloseableStream):
    """A socket stream whose first reads return bytes already taken from it."""

    def __init__(self, stream: trio.SocketStream, head: bytes) -> None:
        self.stream = stream
        self.socket = stream.socket  # hypercorn reads the peer and local addresses from it
        self._head = head

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._head:
            head, self._head = self._head, b""
            await trio.lowlevel.checkpoint()
            return head
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()


class _TlsReplay(_Replay):
    """A TLS stream whose handshake is done, with the bytes already read replayed: hypercorn
    recognises a TLS stream by ``do_handshake`` (so requests get ``scheme`` ``https``)."""

    def __init__(self, stream: trio.SSLStream, head: bytes) -> None:
        self.stream = stream  # type: ignore[assignment]
        self._tls = stream
        self.transport_stream = stream.transport_stream
        self._head = head

    async def do_handshake(self) -> None:
        await self._tls.do_handshake()  # done already: returns at once

    def selected_alpn_protocol(self) -> str:
        return "http/1.1"  # the front door parses HTTP/1.1 heads; h2 is not offered

    async def send_eof(self) -> None:
        raise AttributeError("a TLS stream has no half-close")  # what hypercorn expects of one
