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
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

log = logging.getLogger(__name__)

# A connection taken over: the raw socket (non-blocking; the handler's until it returns), its first
# request as h11 parsed it, that request's head bytes and the bytes received after them. The
# handler returns None when it is done with the connection (it is then closed), or bytes to
# replay to hypercorn, which serves the rest of the connection (a request the handler does not
# serve, and whatever followed it).
Handler = Callable[[socket.socket, h11.Request, bytes, bytes], Awaitable[bytes | None]]
Takeover = Callable[[h11.Request], Handler | None]

HEAD_END = b"\r\n\r\n"
MAX_HEAD = 16384  # h11's own limit for an incomplete head; longer heads go to hypercorn
READ_CHUNK = 65536


def hypercorn_config(host: str, port: int, graceful_s: float) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.graceful_timeout = graceful_s
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 75
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
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until ``shutdown`` is set; started() with the bound port."""
    config = hypercorn_config(host, port, graceful_s)
    if takeover is not None:
        await _FrontDoor(app, config, takeover).serve(shutdown, name, task_status)
        return
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(app, config, shutdown_trigger=shutdown.wait, task_status=task_status)
        )
        bound = int(binds[0].rsplit(":", 1)[1])
        log.info("%s listening on %s:%d", name, host, bound)
        task_status.started(bound)


class _FrontDoor:
    """Accepts connections, hands listeners' to the facade and the rest to hypercorn."""

    def __init__(self, app: Any, config: HypercornConfig, takeover: Takeover) -> None:
        self.config = config
        self.takeover = takeover
        self.app = wrap_app(app, config.wsgi_max_body_size, "asgi")
        self.context = WorkerContext(None)

    async def serve(self, shutdown: trio.Event, name: str, task_status: trio.TaskStatus[int]) -> None:
        sockets = self.config.create_sockets().insecure_sockets  # binds: OSError if busy
        for sock in sockets:
            sock.listen(self.config.backlog)
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]
        bound = sockets[0].getsockname()[1]
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(self._accept, listener, connections)
                log.info("%s listening on %s:%d", name, sockets[0].getsockname()[0], bound)
                task_status.started(bound)
                await shutdown.wait()
                accepting.cancel_scope.cancel()
            for listener in listeners:
                await listener.aclose()
            await self.context.terminated.set()  # hypercorn's connections finish and close
            connections.cancel_scope.deadline = trio.current_time() + self.config.graceful_timeout

    async def _accept(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        await trio.serve_listeners(self._connection, [listener], handler_nursery=connections)

    async def _connection(self, stream: trio.SocketStream) -> None:
        try:
            await self._dispatch(stream)
        except Exception:  # one connection's failure must not stop the server
            log.exception("connection failed")
            await trio.aclose_forcefully(stream)

    async def _dispatch(self, stream: trio.SocketStream) -> None:
        received = bytearray()
        with trio.move_on_after(self.config.keep_alive_timeout):
            while HEAD_END not in received and len(received) <= MAX_HEAD:
                try:
                    chunk = await stream.receive_some(READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    chunk = b""
                if not chunk:
                    break
                received += chunk
        if HEAD_END not in received and (not received or not chunk or len(received) <= MAX_HEAD):
            await trio.aclose_forcefully(stream)  # silent for too long, or gone
            return
        parsed = parse_head(bytes(received))
        handler = self.takeover(parsed[0]) if parsed is not None else None
        if parsed is None or handler is None:  # hypercorn answers what we do not parse its own way
            await self._hypercorn(stream, bytes(received))
            return
        request, head_length = parsed
        sock = socket.socket(fileno=stream.socket.detach())
        sock.setblocking(False)
        handed_back: bytes | None = None
        try:
            handed_back = await handler(sock, request, bytes(received[:head_length]), bytes(received[head_length:]))
        finally:
            if handed_back is None:
                trio.lowlevel.notify_closing(sock)
                sock.close()
        if handed_back is not None:
            await self._hypercorn(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), handed_back)

    async def _hypercorn(self, stream: trio.SocketStream, received: bytes) -> None:
        """Serve the connection with hypercorn, replaying what was read from it already."""
        await TCPServer(self.app, self.config, self.context, ConnectionState({}), _Replay(stream, received))


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
