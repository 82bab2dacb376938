"""Sonya's WebSocket listeners on sockets of their own, below the ASGI layer.

A connection whose first request is a WebSocket upgrade of ``/queue/listen/ws/{queue}[/{id}]`` is
taken over from hypercorn (``boxqueue.frontdoor.asgi_serving``): the handshake is answered here (the same
checks, statuses and bodies as the Starlette endpoint), then the listener is a
:class:`tubes.broadcast.Sink`. The fan-out hands it each message synchronously; its frame is
encoded once per message for all listeners (``boxqueue.facades.sonya.frames``) and written straight to the
socket with one non-blocking ``send``. Only when the socket's buffer is full do frames wait, in
order, in the listener's outbox, which its own writer task flushes (several frames per
``sendmsg``) when the socket is writable again. So a message costs one system call per listener
and no task switch; each connection has two tasks (the writer and the reader of what the client
sends), both in the connection's nursery.

Backpressure (S7): more than ``listener_buffer`` live messages held unsent ends the listener with
``overflow``; the frame being written is completed, the held ones dropped, and the close frame
1008 follows. A socket that takes nothing for ``SEND_TIMEOUT_S`` is dropped. Queue close and id
delete close with 1000 after the frames already held, shutdown with 1001. Client pings are
answered with pongs (with ``MAX_CONTROL_HELD`` pongs unsent, the client is not read until they
are written, so TCP holds it back), a client's close is echoed and waited for, anything else the
client sends is read and ignored.

A WebSocket upgrade that arrives later on a kept-alive connection is served by hypercorn and the
Starlette endpoint (``SonyaApi.websocket``), with the same behaviour, slower.
"""

from __future__ import annotations

import logging
import re
import socket
from collections import deque
from functools import partial
from itertools import islice

import h11
import trio
from starlette.datastructures import Headers, QueryParams
from starlette.responses import Response
from wsproto import ConnectionType
from wsproto.connection import Connection, ConnectionState
from wsproto.events import CloseConnection, Ping
from wsproto.utilities import generate_accept_token, split_comma_header

from boxqueue.facades.sonya.app import CLOSE_CODES, denied_response, not_found_response
from boxqueue.facades.sonya.frames import FrameEncoder, Variant, accept_extensions
from boxqueue.facades.sonya.inputs import parse_sequence
from boxqueue.facades.sonya.socket_io import (
    SEND_TIMEOUT_S,
    http_response,
    match_get,
    receive_some,
    send_all,
)
from boxqueue.facades.sonya.tokens import Denied, Tokens, bearer
from boxqueue.frontdoor.asgi_serving import Handler, responder
from boxqueue.measures import RequestMeter
from boxqueue.tubes.broadcast import OVERFLOW, Broadcast
from boxqueue.tubes.sequences import Message

log = logging.getLogger(__name__)

LISTEN_PATH = re.compile(r"/queue/listen/ws/([^/]+)(?:/([^/]+))?")
# After our close frame, how long the client has to answer with its own.
CLOSE_TIMEOUT_S = 5.0
# At most this many frames go into one sendmsg (well under IOV_MAX).
WRITE_BATCH = 256
# A client that sends pings but does not read our answers: after this many unsent pongs we stop
# reading it (TCP then holds the client back) until they are written.
MAX_CONTROL_HELD = 64

# What an outbox entry is: the handshake or a preloaded message, a live message, a control frame.
OTHER, LIVE, CONTROL = 0, 1, 2


class SocketListener:
    """One established WebSocket listener: the frames it still has to write (its outbox), the
    writer that flushes them when the socket can take more, the reader of the client's frames."""

    def __init__(self, sock: socket.socket, variant: Variant, frames: FrameEncoder) -> None:
        self.sock = sock
        self.variant = variant
        self.frames = frames
        self.ws: Connection | None = None  # set by start()
        self._out: deque[tuple[bytes, int]] = deque()  # (bytes, OTHER/LIVE/CONTROL), in order
        self._offset = 0  # bytes of _out[0] already written
        self._live_held = 0
        self._control_held = 0
        self._drained = trio.lowlevel.ParkingLot()  # the reader waits here for pongs to go out
        self._end_reason: str | None = None
        self._close_queued = False  # nothing but bytes already queued goes out any more
        self._gone = False  # the connection is broken or closed: nothing more is written
        self._peer_closed = trio.Event()  # the client's close frame (or the end of its stream)
        self._wake = trio.lowlevel.ParkingLot()

    # -- Sink (called by the fan-out, synchronously) ------------------------------------------

    def deliver(self, item: Message) -> int:
        if self._gone or self._close_queued:
            return 0
        frame = self.frames.text(item, self.variant)
        if self._out:
            self._out.append((frame, LIVE))
            self._live_held += 1
            return self._live_held
        try:
            written = self.sock.send(frame)
        except BlockingIOError:
            written = 0
        except OSError:
            self._lost()
            return 0
        if written == len(frame):
            return 0
        self._out.append((frame, LIVE))
        self._offset = written
        self._live_held = 1
        self._wake.unpark_all()
        return 1

    def ended(self, reason: str) -> None:
        self._end_reason = reason
        if self.ws is None:  # ended while subscribing (the server is stopping): start() closes
            return
        if reason == OVERFLOW:
            self._drop_held()
        self._queue_close(CLOSE_CODES.get(reason, 1000))

    # -- the connection ------------------------------------------------------------------------

    def start(self, response: bytes, ws: Connection, preload: list[Message]) -> None:
        """Queue the handshake response and the preload, ahead of any live frame."""
        self.ws = ws
        self._out.append((response, OTHER))
        for item in preload:
            self._out.append((self.frames.text(item, self.variant), OTHER))
        if self._end_reason is not None:
            self._queue_close(CLOSE_CODES.get(self._end_reason, 1000))
        self._wake.unpark_all()

    async def run(self) -> None:
        """Serve the connection until it is closed or lost; the caller closes the socket."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read)
            await self._write()
            nursery.cancel_scope.cancel()

    async def _write(self) -> None:
        while not self._gone:
            if self._out:
                self._flush()
                if self._out and not self._gone:
                    with trio.move_on_after(SEND_TIMEOUT_S):
                        await trio.lowlevel.wait_writable(self.sock)
                        continue
                    self._lost()  # the client has not taken anything for SEND_TIMEOUT_S
                continue
            if self._close_queued:
                with trio.move_on_after(CLOSE_TIMEOUT_S):
                    await self._peer_closed.wait()
                return
            if self._peer_closed.is_set():
                return
            await self._wake.park()

    def _flush(self) -> None:
        """Write as much of the outbox as the socket takes now, in one system call."""
        out = self._out
        if len(out) == 1:
            buffers = [memoryview(out[0][0])[self._offset:]]
        else:
            buffers = [memoryview(frame) for frame, _ in islice(out, WRITE_BATCH)]
            buffers[0] = buffers[0][self._offset:]
        try:
            written = self.sock.sendmsg(buffers)
        except BlockingIOError:
            return
        except OSError:
            self._lost()
            return
        written += self._offset
        while out and written >= len(out[0][0]):
            frame, kind = out.popleft()
            written -= len(frame)
            if kind == LIVE:
                self._live_held -= 1
            elif kind == CONTROL:
                self._control_held -= 1
                self._drained.unpark_all()
        self._offset = written

    async def _read(self) -> None:
        """Answer pings, echo a close, ignore data; note the end of the client's stream."""
        assert self.ws is not None
        ws = self.ws
        while True:
            while self._control_held >= MAX_CONTROL_HELD and not self._gone:
                await self._drained.park()
            data = await receive_some(self.sock)
            if not data:
                if not self._close_queued:
                    self._lost()  # gone without a close frame: nothing more to send
                self._peer_closed.set()
                self._wake.unpark_all()
                return
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, Ping) and not self._close_queued:
                    self._queue(ws.send(event.response()), CONTROL)
                elif isinstance(event, CloseConnection):
                    if ws.state is ConnectionState.REMOTE_CLOSING:  # the client closes: echo it
                        self._close_queued = True
                        self._queue(ws.send(event.response()), CONTROL)
                    elif ws.state is ConnectionState.OPEN:  # a protocol error: close with its code
                        self._queue_close(event.code)
                    self._peer_closed.set()
                    self._wake.unpark_all()
                    return

    def _queue(self, data: bytes, kind: int) -> None:
        if self._gone:
            return
        self._out.append((bytes(data), kind))
        if kind == CONTROL:
            self._control_held += 1
        self._wake.unpark_all()

    def _queue_close(self, code: int) -> None:
        if self._close_queued or self.ws is None or self.ws.state is not ConnectionState.OPEN:
            return
        self._close_queued = True
        self._queue(self.ws.send(CloseConnection(code)), CONTROL)

    def _drop_held(self) -> None:
        """Drop the held live frames, except one already partly written (it is completed)."""
        kept: deque[tuple[bytes, int]] = deque()
        for index, (frame, kind) in enumerate(self._out):
            if kind != LIVE or (index == 0 and self._offset > 0):
                kept.append((frame, kind))
        self._out = kept
        self._live_held = sum(1 for _, kind in kept if kind == LIVE)

    def _lost(self) -> None:
        self._gone = True
        self._out.clear()
        self._live_held = self._control_held = 0
        self._wake.unpark_all()
        self._drained.unpark_all()


class WebSocketListeners:
    """Decides which connections are Sonya WebSocket listeners and serves them."""

    def __init__(self, broadcast: Broadcast, tokens: Tokens, meter: RequestMeter | None = None) -> None:
        self.broadcast = broadcast
        self.tokens = tokens
        self.frames = FrameEncoder()
        self.meter = meter  # counts each listen handshake (operation "websocket") by its status

    def takeover(self, request: h11.Request) -> Handler | None:
        """A handler for a WebSocket upgrade of a listen path (hypercorn's test for an upgrade:
        GET, ``Connection: upgrade``, ``Upgrade: websocket``); None for anything else."""
        route = match_get(request, LISTEN_PATH)
        if route is None:
            return None
        upgrade = connection = b""
        for name, value in request.headers:
            if name == b"upgrade":
                upgrade = value.strip()
            elif name == b"connection":
                connection = value.strip()
        if upgrade.lower() != b"websocket" or not any(
            token.strip() == b"upgrade" for token in connection.lower().split(b",")
        ):
            return None
        return partial(self.serve, *route)

    async def serve(self, queue: str, key: str | None, query_string: str, sock: socket.socket,
                    request: h11.Request, head: bytes, rest: bytes) -> None:
        started = self.meter.begin() if self.meter is not None else 0.0
        status = [500]  # what the handshake was answered; 0 once recorded
        try:
            status[0] = await self._serve(queue, key, query_string, sock, request, head, rest, started, status)
        finally:
            if self.meter is not None and status[0]:
                self.meter.record("websocket", started, str(status[0]) if status[0] >= 400 else None,
                                  f"GET {request.target.decode('latin-1')}")

    async def _serve(self, queue: str, key: str | None, query_string: str, sock: socket.socket,
                     request: h11.Request, head: bytes, rest: bytes, started: float, status: list[int]) -> int:
        """Serve the listener; returns the status of a refused handshake, or 0 once accepted (and
        recorded: the listener's life is not the request's latency)."""
        conn = responder(head)
        headers = Headers(raw=list(request.headers))
        version = headers.get("sec-websocket-version")
        ws_key = headers.get("sec-websocket-key")
        if request.http_version != b"1.1" or ws_key is None or version != "13":
            await send_all(sock, http_response(conn, Response(b"", 400), close=True))  # as hypercorn: before the app
            return 400
        query = QueryParams(query_string)
        try:
            self.tokens.check_listen(bearer(headers, query), queue, key)
        except Denied as exc:
            await send_all(sock, http_response(conn, denied_response(exc), close=True))
            return exc.status
        if queue not in self.broadcast.queues:
            await send_all(sock, http_response(conn, not_found_response(), close=True))
            return 404
        offers = [offer for value in headers.getlist("sec-websocket-extensions") for offer in split_comma_header(value.encode("latin-1"))]
        accepted, extensions, variant = accept_extensions(offers)
        response_headers = [(b"sec-websocket-accept", generate_accept_token(ws_key.encode("latin-1")))]
        if accepted is not None:
            response_headers.append((b"sec-websocket-extensions", accepted))
        response_headers += [(b"upgrade", b"WebSocket"), (b"connection", b"Upgrade")]
        response = conn.send(h11.InformationalResponse(status_code=101, headers=response_headers))
        assert response is not None
        listener = SocketListener(sock, variant, self.frames)
        # Synchronous from the queue check to start(): the preload goes out before any live frame.
        got = self.broadcast.subscribe(queue, key, parse_sequence(query.getlist("sequence")), sink=listener)
        assert got is not None, "the queue was checked without an await since"
        preload, sub = got
        if self.meter is not None:
            self.meter.record("websocket", started)
        status[0] = 0
        with sub:
            listener.start(response, Connection(ConnectionType.SERVER, extensions, rest), preload)
            await listener.run()
        return 0
