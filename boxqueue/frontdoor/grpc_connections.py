"""gRPC served by the front door itself: HTTP/2 through :mod:`boxqueue.frontdoor.http2_codec`, on trio.

grpcio's server runs each call on a thread of its pool; the engine lives on trio's loop, so every
Deckard call crossed from a pool thread to trio and back (about 100 us of CPU per call, on top of
grpcio's own 290). Here one task per connection reads HTTP/2 frames (the codec is sans-IO: bytes
in, events out, bytes to send) on the same loop as the engine. A call runs in a task of its
connection's nursery, or, for a ``quick`` method (one engine operation), in the reading task
itself, answered from the callback of what it returns when that settles: no task per call. An
answer (head, message and trailers) goes out in one write, without a lock or a checkpoint when
the socket takes it at once. A bare unary echo costs 77 us of server CPU per call against 460
through grpcio's pool and the hop (``bench/grpc_servers.py``, docs/performance.md).

What grpcio did for Deckard is done here, as gRPC's HTTP/2 protocol document and grpcio's
behaviour say:

* **Framing**: length-prefixed messages; ``gzip`` compressed requests are accepted
  (``grpc-encoding``; another is ``UNIMPLEMENTED`` with ``grpc-accept-encoding``), answers are
  not compressed; trailers carry ``grpc-status`` and a percent-encoded ``grpc-message``; a call
  refused before it runs gets a trailers-only answer.
* **Who may call**: the ``guard`` (a token check) runs when the call's head arrives, before a
  byte of its request message is read: a refused call costs a head, not a body.
* **Limits**: a request message over ``max_message_bytes`` is ``RESOURCE_EXHAUSTED`` as soon as
  its length prefix arrives (the rest is read and dropped), an answer over it too; request
  metadata over ``max_metadata_bytes`` (HTTP/2's header list size: names, values and 32 bytes an
  entry) is ``RESOURCE_EXHAUSTED``; at most ``max_streams`` calls at once per connection
  (HTTP/2's ``SETTINGS_MAX_CONCURRENT_STREAMS``) and ``max_calls`` in the whole server (one more
  is ``RESOURCE_EXHAUSTED``); of those, streaming calls (health watches, reflection: they may
  last as long as their clients like) at most ``max_streaming_per_connection`` per connection
  and half of ``max_calls`` in the server, so that they never take the unary calls' room;
  ``max_connections`` and TLS are the listener's (:func:`boxqueue.iproto.listening.serve_tcp`,
  TLS with ALPN ``h2``).
* **Memory**: every byte of a request message is counted from its first byte until its handler
  has it (a unary call's compressed message stays compressed until its call starts; a streaming
  call's is counted decompressed): a connection holding more than ``MAX_HELD`` is closed with
  ``GOAWAY ENHANCE_YOUR_CALM``, and a message that would take the server's count over
  ``max_held_bytes`` is ``RESOURCE_EXHAUSTED`` (its last quarter kept for messages of at most
  ``SMALL_MESSAGE`` bytes). A connection decompresses at most ``INFLATE_BURST`` bytes at once
  and ``INFLATE_RATE`` a second (a message beyond is ``RESOURCE_EXHAUSTED``: inflating costs
  milliseconds per MiB, whatever the few KiB a gzip bomb takes on the wire). A streaming call's
  messages wait for its handler in an inbox of ``STREAM_QUEUE`` messages and
  ``max_message_bytes`` bytes; a client that sends more than its handler reads (a health watch
  reads one) gets ``RESOURCE_EXHAUSTED`` and the handler is cancelled. A client that reads
  nothing of what we send stops being read once ``MAX_UNSENT`` bytes wait for it.
* **Fairness**: the codec takes ``STEP_FRAMES`` frames in one step of a connection's task, a
  checkpoint between, and a call its client resets in the same step is never started: one
  connection's flood keeps the others waiting little.
* **Deadlines**: ``grpc-timeout`` bounds the call: past it the call's task is cancelled and the
  answer is ``DEADLINE_EXCEEDED`` (a quick call's result that comes after its deadline is
  answered so too). A client's ``RST_STREAM`` (it cancelled, or gave up) cancels the call's task
  the same way, with no answer, and frees the call's place at once (a quick call's too, whose
  engine work settles later). Engine work already under way is not undone by either (a
  :class:`spaces.later.Later` is waited for whatever happens; see the facade). The connection's
  own deadlines, checked by one task for the whole server (:meth:`GrpcServer.sweep`): the
  preface within ``preface_timeout_s`` of the accept; a frame or a head begun, complete within
  ``header_timeout_s``; a unary call's request from its head to its end, and any request message
  from its first byte, within ``body_timeout_s`` (else ``DEADLINE_EXCEEDED``); a connection
  without a call for ``idle_timeout_s`` gets ``GOAWAY`` and is closed; an answer waits at most
  ``send_timeout_s`` for the client to open its window (then the stream is reset) and a write at
  most as long for the socket. A connection whose frame or head is late ends with ``GOAWAY
  ENHANCE_YOUR_CALM``.
* **Unknown methods** are ``UNIMPLEMENTED``; a handler that fails with anything but
  :class:`GrpcError` is ``UNKNOWN`` with the error's text, and logged.
* **Stopping**: :meth:`GrpcServer.stop` sends every connection a ``GOAWAY`` (clients open no new
  call on it), lets the calls in progress finish within a grace period, then cancels them.

Flow control: every received byte is acknowledged as it is read (what that lets a client send is
bounded by the counts above); answers are sent within the client's windows, waiting for its
window updates when a large answer (a 4 MiB pull) needs them.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import ssl
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import trio

from boxqueue.frontdoor.http2_codec import (
    CANCEL,
    DATA,
    ENHANCE_YOUR_CALM,
    HEAD_BLOCK,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    REQUEST,
    RESET,
    WINDOW,
    Budget,
    Http2Error,
    ServerCodec,
    literal,
)
from boxqueue.iproto.listening import serve_tcp
from boxqueue.iproto.socket_io import DirectSocket, StreamIO
from boxqueue.task_roots import python_root

log = logging.getLogger(__name__)


class Status(enum.IntEnum):
    """gRPC's status codes (``grpc/status.h``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """Ends a call with ``status`` and ``message`` (and ``trailing`` metadata)."""

    def __init__(self, status: Status, message: str, trailing: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.trailing = trailing


class Call:
    """What a handler knows of its call: the method's path and the request's metadata (a plain
    class rather than a dataclass: one is made for every call, and a compiled ``__init__`` costs
    far less than the dataclass's generated one)."""

    __slots__ = ("method", "metadata", "trailing")

    def __init__(self, method: str, metadata: list[tuple[str, str]],
                 trailing: list[tuple[str, str]] | None = None) -> None:
        self.method = method
        self.metadata = metadata
        self.trailing: list[tuple[str, str]] = [] if trailing is None else trailing  # the handler may add to them

    def __repr__(self) -> str:
        return f"Call(method={self.method!r}, metadata={self.metadata!r}, trailing={self.trailing!r})"

    def value(self, key: str) -> str | None:
        """The last value of metadata ``key`` (lower case), or None."""
        found = None
        for name, value in self.metadata:
            if name == key:
                found = value
        return found


# A unary handler takes the request message and returns the answer's; a streaming one reads the
# request messages from an async iterator and sends answers with ``send``.
UnaryHandler = Callable[[bytes, Call], Awaitable[bytes]]
Send = Callable[[bytes], Awaitable[None]]
StreamHandler = Callable[["trio.abc.ReceiveChannel[bytes]", Send, Call], Awaitable[None]]


# A quick handler answers at once: the answer's bytes, or something settled later with them
# (a ``then(callback)`` taking ``callback(value, error)``, as :class:`spaces.later.Later` does), or,
# when this call needs one after all, a coroutine returning them (run in a task).
QuickHandler = Callable[[bytes, Call], Any]


@dataclass(frozen=True, slots=True)
class Method:
    """A method's handler: ``unary`` (one message each way, in a task of its own), ``quick``
    (one message each way, answered from the reading task or from the callback of what it
    returns: no task, for calls whose work is one engine operation), or ``stream`` (any number
    of messages each way). ``failed`` turns an error a quick call's result settles with into
    its status (else UNKNOWN)."""

    unary: UnaryHandler | None = None
    stream: StreamHandler | None = None
    quick: QuickHandler | None = None
    failed: Callable[[Exception], GrpcError] | None = None


# Runs when a call's head has arrived, before its request is read (a token check, metering);
# raises GrpcError to refuse it. It returns what ``finished`` is given back when the call ends.
Guard = Callable[[Call], object]
Finished = Callable[[Call, object, Status, str], None]


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 4 * 1024 * 1024
    max_metadata_bytes: int = 8192
    max_streams: int = 128  # calls at once on one connection
    max_calls: int = 1024  # calls at once in the server
    max_connections: int | None = None
    max_streaming_per_connection: int = 16  # streaming calls (watches, reflection) at once on one connection
    max_held_bytes: int = 64 << 20  # bytes of request messages the server holds for calls not yet given them
    preface_timeout_s: float = 20.0  # from accept (after TLS) to the client's HTTP/2 preface
    header_timeout_s: float = 20.0  # a frame, or a head over CONTINUATION frames, from its first byte to its last
    body_timeout_s: float = 60.0  # a unary request from its head to its end; any request message from its first byte
    idle_timeout_s: float = 300.0  # a connection without a call for this long gets GOAWAY and is closed
    send_timeout_s: float = 30.0  # a write the socket does not take, or an answer the client's window holds


OK_TRAILERS = literal(b"grpc-status", b"0")
_NO_METHOD = Method()
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_RESERVED = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                       b"user-agent", b"grpc-message-type"))
HEADS_KEPT, HEAD_KEPT_BYTES = 32, 2048  # see _Connection.heads
STREAM_WINDOW = 1 << 20  # what each call may send ahead of our reading it; acknowledged as read
MAX_HELD = 32 << 20  # bytes of request messages one connection may hold for calls not yet given them
INFLATE_BURST, INFLATE_RATE = 8 << 20, float(4 << 20)  # bytes decompressed at once, then a second, per connection
SMALL_MESSAGE = 65536  # a request message this small may use the last quarter of max_held_bytes
STEP_FRAMES = 128  # frames the codec takes in one step of a connection's task, a checkpoint between
MAX_UNSENT = 1 << 20  # bytes of answers waiting for a client that reads nothing, before it stops being read
STREAM_QUEUE = 64  # request messages of a streaming call not yet read by its handler
LINGER_S = 2.0  # after a GOAWAY that ends a connection, what the client still sends is read for this long


def grpc_message(text: str) -> bytes:
    """``grpc-message``'s percent-encoding: printable ASCII but ``%`` as is, the rest by UTF-8 byte."""
    return quote(text, safe=" !\"#$&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~").encode()


def timeout_of(value: bytes) -> float | None:
    """``grpc-timeout`` in seconds (``1S``, ``250m``, ...); None if it is malformed."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit


def _trailers(status: Status, message: str, trailing: list[tuple[str, str]] | tuple[tuple[str, str], ...],
              *, only: bool, http: bytes = b"200") -> bytes:
    """The trailers' header block; ``only``: a trailers-only answer (the head's fields too)."""
    if only:
        out = HEAD_BLOCK if http == b"200" else literal(b":status", http) + literal(b"content-type", b"application/grpc")
    else:
        out = b""
    out += literal(b"grpc-status", str(int(status)).encode())
    if message:
        out += literal(b"grpc-message", grpc_message(message))
    for key, value in trailing:
        out += literal(key.encode("latin-1"), value.encode("latin-1"))
    return out


def _head_of(headers: list[tuple[bytes, bytes]]) -> tuple[str, float | None, bytes, tuple[tuple[str, str], ...], int, bytes]:
    """What a call's head says: its path, timeout, encoding, metadata, size (as the limit on
    metadata counts it) and content type."""
    path = b""
    timeout: float | None = None
    encoding = b""
    metadata: list[tuple[str, str]] = []
    size = 0
    content_type = b""
    for name, value in headers:
        size += len(name) + len(value) + 32
        if name[:1] == b":":
            if name == b":path":
                path = value
        elif name in _RESERVED:
            if name == b"grpc-timeout":
                timeout = timeout_of(value)
            elif name == b"grpc-encoding":
                encoding = value
            elif name == b"content-type":
                content_type = value
        else:
            metadata.append((name.decode("latin-1"), value.decode("latin-1")))
    return path.decode("latin-1"), timeout, encoding, tuple(metadata), size, content_type


class _Refused(Exception):
    """A call ended by the connection before its handler's answer (the status is already sent)."""


class Inbox(trio.abc.ReceiveChannel[bytes]):
    """A streaming call's request messages, waiting for its handler: at most ``STREAM_QUEUE`` of
    them and ``limit`` bytes. Each message's bytes stay counted in what its connection holds
    until the handler takes it."""

    def __init__(self, connection: _Connection, limit: int) -> None:
        self.connection = connection
        self.limit = limit
        self.messages: deque[bytes] = deque()
        self.size = 0
        self.ended = False  # no more will come (the client's end, or the call's)
        self.lot = trio.lowlevel.ParkingLot()

    def put(self, message: bytes) -> bool:
        """Queue ``message`` (counted by the caller); False if the inbox is full."""
        if len(self.messages) >= STREAM_QUEUE or (self.messages and self.size + len(message) > self.limit):
            return False
        self.messages.append(message)
        self.size += len(message)
        self.lot.unpark()
        return True

    def end(self) -> None:
        self.ended = True
        self.lot.unpark_all()

    def drop(self) -> None:
        """The call is over: what its handler did not take is forgotten (and uncounted)."""
        self.end()
        if self.size:
            self.connection.release(self.size)
            self.size = 0
            self.messages.clear()

    async def receive(self) -> bytes:
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self.messages:
            if self.ended:
                raise trio.EndOfChannel
            await self.lot.park()
        message = self.messages.popleft()
        self.size -= len(message)
        self.connection.release(len(message))
        await trio.lowlevel.cancel_shielded_checkpoint()
        return message

    async def aclose(self) -> None:
        self.drop()
        await trio.lowlevel.checkpoint()


class _Stream:
    """One call on a connection: its messages as they arrive, and the task that serves it."""

    __slots__ = ("id", "method", "call", "deadline", "compressed", "body", "message", "requests", "scope",
                 "answered", "ended", "reset", "begun", "guarded", "checked", "started", "finished", "received",
                 "seen", "seen_received", "inflate")

    def __init__(self, stream_id: int, call: Call, ended: bool) -> None:
        self.id = stream_id
        self.method = _NO_METHOD
        self.call = call
        self.deadline = math.inf
        self.compressed = False
        self.body = bytearray()
        self.message: bytes | None = None  # a unary call's request (counted as held until its call starts)
        self.inflate = False  # ... gzip compressed (decompressed when the call starts)
        self.requests: Inbox | None = None  # a streaming call's
        self.scope: trio.CancelScope | None = None
        self.answered = False  # its end (trailers or a reset) is sent: what it still sends is dropped
        self.ended = ended  # the client has sent everything
        self.reset = False  # the client has reset it
        self.begun = False  # the answer's head is sent
        self.guarded: object = None
        self.checked = False  # the guard let it through (``finished`` is owed)
        self.started = False  # it runs (it holds a place in the server's calls)
        self.finished = False  # its place is given back
        self.received = 0  # request messages completed so far
        self.seen = -1.0  # when the sweep first saw it waiting for the same request bytes (-1: not yet)
        self.seen_received = 0  # ... and how many messages had come then


class GrpcServer:
    """Serves ``methods`` (by path, ``/package.Service/Method``) on one listener."""

    def __init__(
        self,
        methods: Mapping[str, Method],
        *,
        limits: Limits = Limits(),
        ssl_context: ssl.SSLContext | None = None,
        guard: Guard | None = None,
        finished: Finished | None = None,
        name: str = "gRPC",
    ) -> None:
        self.methods = methods
        self.limits = limits
        self.ssl_context = ssl_context
        self.guard = guard
        self.finished = finished
        self.name = name
        self.calls = 0
        self.streaming = 0  # of the calls, streaming ones
        self.held = 0  # bytes of request messages held for calls not yet given them, over all connections
        self._connections: set[_Connection] = set()
        self._stopping = False
        self._quiet = trio.Event()  # set once stopping and no call is left

    async def serve(self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept on ``host:port`` until cancelled (stop first for a graceful end)."""
        async with trio.open_nursery() as connections:
            connections.start_soon(python_root, self.sweep)
            try:
                await serve_tcp(host, port, self._connection, connections, name=self.name,
                                ssl_context=self.ssl_context, max_connections=self.limits.max_connections,
                                task_status=task_status)
            except OSError as exc:  # binding: say which listener
                raise OSError(exc.errno, f"{self.name} listener {host}:{port}: {exc.strerror or exc}") from exc

    async def sweep(self) -> None:
        """The connections' deadlines, checked a few times per the shortest of them (one task for
        the server, not a timer per connection or per call: the calls' path keeps no clock)."""
        limits = self.limits
        tick = min(1.0, min(limits.preface_timeout_s, limits.header_timeout_s, limits.body_timeout_s,
                            limits.idle_timeout_s) / 4)
        while True:
            await trio.sleep(tick)
            now = trio.current_time()
            for connection in list(self._connections):
                connection.check(now)

    async def stop(self, grace: float) -> None:
        """GOAWAY to every connection, then wait up to ``grace`` for the calls in progress; the
        caller cancels :meth:`serve` after."""
        self._stopping = True
        for connection in list(self._connections):
            await connection.go_away()
        self.quiet()
        with trio.move_on_after(grace):
            await self._quiet.wait()

    def quiet(self) -> None:
        """While stopping: notes when no call runs or is arriving (from its head, its body may
        still be on its way, to its answer)."""
        if self._stopping and not any(connection.busy() for connection in self._connections):
            self._quiet.set()

    async def _connection(self, stream: trio.abc.Stream, peer: str) -> None:
        if self._stopping:
            await trio.aclose_forcefully(stream)
            return
        connection = _Connection(self, stream, trio.current_time())
        self._connections.add(connection)
        try:
            await connection.serve()
        finally:
            self._connections.discard(connection)
            self.quiet()
            await trio.aclose_forcefully(stream)


class _Connection:
    def __init__(self, server: GrpcServer, stream: trio.abc.Stream, opened: float) -> None:
        self.server = server
        self.stream = stream
        self.direct = DirectSocket(stream) if isinstance(stream, trio.SocketStream) else None
        self.io: DirectSocket | StreamIO = self.direct or StreamIO(stream)
        limits = server.limits
        self.codec = ServerCodec(max_streams=limits.max_streams, stream_window=STREAM_WINDOW,
                                 connection_window=4 * STREAM_WINDOW, max_header_list=4 * limits.max_metadata_bytes)
        self.streams: dict[int, _Stream] = {}
        # What the heads a client repeats say (most send the same few on every call), by their
        # fields: at most HEADS_KEPT heads of at most HEAD_KEPT_BYTES each, then forgotten.
        self.heads: dict[tuple[tuple[bytes, bytes], ...], tuple[Any, ...]] = {}
        self.writing = False  # a task is writing (see flush)
        self.written = trio.Event()  # set when the writing task is done (then replaced)
        self.held = 0  # bytes of request messages received and not yet handed to their calls
        self.streaming = 0  # streaming calls running
        self._break_after_flush = False
        self.opened = opened
        self.partial_since = -1.0  # when a frame or a head began arriving and is not complete (-1: none)
        self.idle_since = -1.0  # when the sweep first found it without a call (-1: not yet)
        self.requested = False  # a call arrived since the last sweep
        self.expired: tuple[int, str] | None = None  # a deadline ended it: the GOAWAY's code and text
        self.inflating = Budget(INFLATE_BURST, INFLATE_RATE, trio.current_time)
        self.window = trio.Event()  # set when the client opens its windows (then replaced)
        self.broken = False
        self.tasks = 0  # calls running
        self.calls: trio.Nursery
        self.reading = trio.CancelScope()

    async def serve(self) -> None:
        try:
            async with trio.open_nursery() as calls:
                self.calls = calls
                try:
                    await self.flush()  # our SETTINGS
                    with self.reading:
                        await self._read()
                    if self.expired is not None and not self.broken:
                        code, text = self.expired
                        log.info("%s: %s; connection closed", self.server.name, text)
                        self.codec.go_away(code, text)
                        await self.flush()
                        await self._linger()
                finally:
                    self.broken = True
                    self.window.set()
                    calls.cancel_scope.cancel()
                    self._release_all()
        finally:
            self.io.detach()

    def _release_all(self) -> None:
        """The connection has ended: what it held for its calls is held no more."""
        for stream in self.streams.values():
            self._drop_body(stream)
            if stream.requests is not None:
                stream.requests.drop()
        self.server.held -= self.held
        self.held = 0

    async def _read(self) -> None:
        data = await self._receive()  # the client's preface (the sweep bounds the wait)
        codec = self.codec
        while (data or codec.ready()) and not self.broken:
            try:
                # A step of this task stays short (the other connections wait for it): at most
                # STEP_FRAMES frames, then a checkpoint before the rest.
                events = codec.receive(data, STEP_FRAMES)
            except Http2Error as exc:
                log.info("%s: HTTP/2 protocol error, connection closed: %s", self.server.name, exc)
                await self.flush()
                await self._linger()
                return
            reset = {event[1] for event in events if event[0] == RESET}
            for event in events:
                if self._break_after_flush:
                    break
                kind = event[0]
                if kind == DATA:
                    self._data(event[1], event[2], event[3])
                elif kind == REQUEST:
                    if not reset or event[1] not in reset:  # not one its client reset at once
                        self._request(event[1], event[2], event[3])
                elif kind == RESET:
                    self._reset(event[1])
                elif kind == WINDOW:
                    self.window.set()
                    self.window = trio.Event()
            if codec.out:
                await self.flush()
                while self.writing and len(codec.out) > MAX_UNSENT and not self.broken:
                    await self.written.wait()  # the client reads nothing: stop reading it too
            if self._break_after_flush:
                await self._linger()
                return
            if self.server._stopping:
                self.server.quiet()
            data = b""
            if codec.ready():  # frames left for the next step
                await trio.lowlevel.checkpoint()
                continue
            if codec.partial():
                if self.partial_since < 0:
                    self.partial_since = trio.current_time()
            else:
                self.partial_since = -1.0
            data = await self._receive()

    async def _linger(self) -> None:
        """After a GOAWAY that ends the connection: stop writing, and read (and drop) what the
        client still sends, for up to ``LINGER_S``. Closing a socket with unread input resets the
        connection, and a client may then lose the GOAWAY that says why."""
        if isinstance(self.stream, trio.SocketStream):
            with contextlib.suppress(OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                await self.stream.send_eof()
        with trio.move_on_after(LINGER_S):
            while await self._receive():
                pass

    async def _receive(self) -> bytes:
        """The next bytes, waiting for them first (a checkpoint per chunk: fairness)."""
        try:
            return await self.io.receive_when_ready(65536)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def flush(self) -> None:
        """Write what the codec has to send. One task writes at a time; a task that finds another
        writing leaves its bytes to that one, which writes until nothing is left, so bytes go
        out in the order they were made. A write the socket takes at once does not wait (no
        lock, no checkpoint); one that must wait is shielded (a cancelled call must not cut a
        frame in half) and bounded by ``send_timeout_s``."""
        codec = self.codec
        if self.writing or self.broken or not codec.out:
            return
        self.writing = True
        try:
            while codec.out and not self.broken:
                if self._send_now():
                    continue
                data = codec.data_to_send()
                with trio.CancelScope(shield=True), trio.move_on_after(self.server.limits.send_timeout_s) as timer:
                    try:
                        await self.io.send_all(data)
                    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                        self._break()
                if timer.cancelled_caught:
                    self._break()
        finally:
            self.writing = False
            self.written.set()
            self.written = trio.Event()

    def _send_now(self) -> bool:
        """What the socket takes now, without waiting (the rest put back first in the codec's
        output); True when nothing is left to wait for (or the connection broke)."""
        if self.direct is None:
            return False  # TLS: every write goes through trio's stream
        codec = self.codec
        data = codec.data_to_send()
        try:
            sent = self.direct.send_some(data)
        except OSError:
            self._break()
            return True
        if sent < len(data):
            codec.out[:0] = data[sent:]
            return False
        return True

    def _write_now(self) -> None:
        """:meth:`flush` without waiting: what the socket takes now; a task writes the rest."""
        if self.writing or self.broken or not self.codec.out:
            return
        if not self._send_now():
            self.calls.start_soon(python_root, self.flush)

    def _break(self) -> None:
        self.broken = True
        self.window.set()
        self.reading.cancel()
        self.calls.cancel_scope.cancel()

    def check(self, now: float) -> None:
        """The connection's deadlines (called by the server's sweep)."""
        if self.broken or self.expired is not None:
            return
        limits = self.server.limits
        codec = self.codec
        if not codec.preface_received:
            if now - self.opened > limits.preface_timeout_s:
                self._expire(PROTOCOL_ERROR, f"no HTTP/2 preface within {limits.preface_timeout_s:g} s")
            return
        if self.partial_since >= 0 and now - self.partial_since > limits.header_timeout_s:
            self._expire(ENHANCE_YOUR_CALM, f"a frame or a head did not arrive within {limits.header_timeout_s:g} s")
            return
        if self.streams or self.tasks or self.requested:
            self.requested = False
            self.idle_since = -1.0
        elif self.idle_since < 0:
            self.idle_since = now
        elif now - self.idle_since > limits.idle_timeout_s:
            self._expire(NO_ERROR, f"no call for {limits.idle_timeout_s:g} s")
            return
        late = False
        for stream in list(self.streams.values()):
            if stream.answered or stream.ended or (stream.started and not stream.body):
                stream.seen = -1.0
                continue
            if stream.seen < 0 or stream.received != stream.seen_received:
                stream.seen, stream.seen_received = now, stream.received
            elif now - stream.seen > limits.body_timeout_s:
                self._answer_now(stream, Status.DEADLINE_EXCEEDED,
                                 f"the request message did not arrive within {limits.body_timeout_s:g} s")
                late = True
        if late:
            self._write_now()

    def _expire(self, code: int, text: str) -> None:
        self.expired = (code, text)
        self.reading.cancel()

    def hold(self, size: int) -> None:
        """``size`` more bytes of request messages held for calls not yet given them."""
        self.held += size
        self.server.held += size

    def release(self, size: int) -> None:
        self.held -= size
        self.server.held -= size

    def busy(self) -> bool:
        """A call is running, or its request is still arriving."""
        return not self.broken and (self.tasks > 0 or any(not s.answered for s in self.streams.values()))

    async def go_away(self) -> None:
        """A GOAWAY that lets the calls already begun finish."""
        if not self.broken:
            self.codec.go_away()
            await self.flush()

    # -- events (no await: the codec's state and ours change together) ---------------------------

    def _request(self, sid: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        server = self.server
        key = tuple(headers)
        head = self.heads.get(key)
        if head is None:
            head = _head_of(headers)
            if head[4] <= HEAD_KEPT_BYTES:
                if len(self.heads) >= HEADS_KEPT:
                    self.heads.clear()
                self.heads[key] = head
        path, timeout, encoding, metadata, size, content_type = head
        if server._stopping:  # the codec forgets it too: nothing of it is kept
            self.codec.reset(sid, REFUSED_STREAM)
            return
        call = Call(path, list(metadata))
        stream = _Stream(sid, call, ended)
        self.streams[sid] = stream
        self.requested = True
        if not content_type.startswith(b"application/grpc"):
            self._answer_now(stream, Status.UNKNOWN, f"not a gRPC request (content-type {content_type!r})", http=b"415")
            return
        if encoding and encoding not in (b"identity", b"gzip"):
            self._answer_now(stream, Status.UNIMPLEMENTED, f"unsupported grpc-encoding {encoding.decode('latin-1')!r}",
                             (("grpc-accept-encoding", "identity,gzip"),))
            return
        method = server.methods.get(call.method)
        if method is None:
            self._answer_now(stream, Status.UNIMPLEMENTED, "Method not found!")
            return
        if size > server.limits.max_metadata_bytes:
            self._answer_now(stream, Status.RESOURCE_EXHAUSTED,
                             f"request metadata of {size} bytes is over the limit of {server.limits.max_metadata_bytes}")
            return
        if server.calls >= server.limits.max_calls:
            self._answer_now(stream, Status.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")
            return
        if method.stream is not None and (self.streaming >= server.limits.max_streaming_per_connection
                                          or server.streaming >= server.limits.max_calls // 2):
            self._answer_now(stream, Status.RESOURCE_EXHAUSTED, "too many streaming calls at once")
            return
        stream.method = method
        if server.guard is not None:  # before a byte of the request is read
            try:
                stream.guarded = server.guard(call)
            except GrpcError as exc:
                self._answer_now(stream, exc.status, exc.message, exc.trailing)
                return
            stream.checked = True
        stream.compressed = encoding == b"gzip"
        if timeout is not None:
            stream.deadline = trio.current_time() + timeout
        if method.stream is not None:
            inbox = Inbox(self, server.limits.max_message_bytes)
            stream.requests = inbox
            self._start(stream, self._streaming, stream, inbox)
            if ended:
                inbox.end()
        elif ended:
            self._answer_now(stream, Status.UNIMPLEMENTED, "no request message for a unary method")

    def _data(self, sid: int, data: bytes, ended: bool) -> None:
        stream = self.streams.get(sid)
        if stream is None:
            return
        if ended:
            stream.ended = True
        if stream.answered:
            if ended:
                self.streams.pop(sid, None)
            return
        if data and not self._messages(stream, data):
            return
        if ended:
            if stream.requests is not None:
                stream.requests.end()
            elif stream.message is None:
                self._answer_now(stream, Status.UNIMPLEMENTED, "no request message for a unary method")
            else:
                self._start(stream, None if stream.method.quick is not None else self._unary, stream)

    def _messages(self, stream: _Stream, data: bytes) -> bool:
        """The messages ``data`` completes, handed on; False if the call was answered for them."""
        if not stream.body and stream.requests is None and stream.message is None and len(data) >= 5 and not data[0]:
            # The usual unary request: one uncompressed message in one DATA frame.
            size = len(data) - 5
            if int.from_bytes(data[1:5], "big") == size and size <= self.server.limits.max_message_bytes:
                stream.message = data[5:]
                stream.received += 1
                self.held += size
                self.server.held += size
                return self._may_hold(stream, size)
        body = stream.body
        body += data
        self.hold(len(data))
        if not self._may_hold(stream, int.from_bytes(body[1:5], "big") if len(body) >= 5 else len(body)):
            return False
        limit = self.server.limits.max_message_bytes
        while len(body) >= 5:
            length = int.from_bytes(body[1:5], "big")
            if length > limit:
                self._answer_now(stream, Status.RESOURCE_EXHAUSTED,
                                 f"Received message larger than max ({length} vs. {limit})")
                return False
            if len(body) < 5 + length:
                return True
            flag = body[0]
            message = bytes(body[5:5 + length])
            del body[:5 + length]
            self.release(5 + length)
            stream.received += 1
            if flag and not stream.compressed:
                self._answer_now(stream, Status.INTERNAL, "a compressed message without grpc-encoding")
                return False
            if stream.message is not None:
                self._answer_now(stream, Status.UNIMPLEMENTED, "more than one request message for a unary method")
                return False
            if stream.requests is None:  # a unary call's, decompressed when the call starts
                stream.message = message
                stream.inflate = bool(flag)
                self.hold(len(message))  # until the call starts
                if not self._may_hold(stream, len(message)):
                    return False
                continue
            if flag:
                try:
                    message = self._inflate(message)
                except GrpcError as exc:
                    self._answer_now(stream, exc.status, exc.message)
                    return False
            self.hold(len(message))  # until its handler has it
            if stream.requests.ended:
                self.release(len(message))  # the handler has stopped reading; its end is on its way
            elif not stream.requests.put(message):
                self.release(len(message))
                self._answer_now(stream, Status.RESOURCE_EXHAUSTED, "too many request messages waiting to be read")
                return False
            if not self._may_hold(stream, len(message)):
                return False
        return True

    def _inflate(self, message: bytes) -> bytes:
        """A gzip compressed message, decompressed within the message limit and the connection's
        budget of decompressed bytes (else GrpcError)."""
        limit = self.server.limits.max_message_bytes
        if self.inflating.available() <= 0:
            raise GrpcError(Status.RESOURCE_EXHAUSTED, "too many decompressed bytes on this connection; try again later")
        try:
            inflater = zlib.decompressobj(wbits=31)
            message = inflater.decompress(message, limit + 1)
        except zlib.error as exc:
            raise GrpcError(Status.INTERNAL, f"cannot decompress the message: {exc}") from None
        if len(message) > limit or inflater.unconsumed_tail:
            raise GrpcError(Status.RESOURCE_EXHAUSTED,
                            f"Received message larger than max (more than {limit} once decompressed)")
        self.inflating.tokens -= len(message)
        return message

    def _may_hold(self, stream: _Stream, size: int) -> bool:
        """After a count went up for a message of ``size`` bytes: False (and the call or the
        connection ended) if it is too much. The last quarter of the server's ``max_held_bytes``
        is kept for messages of at most ``SMALL_MESSAGE`` bytes, so that clients sending large
        messages cannot shut out the small calls of everyone else."""
        if self.held > MAX_HELD:
            # Many calls' messages half-sent at once: more than any client needs (a few 4 MiB
            # requests in flight). The connection ends rather than hold more.
            log.warning("%s: a connection held %d bytes of request messages; closed", self.server.name, self.held)
            self.codec.go_away(ENHANCE_YOUR_CALM)
            self._break_after_flush = True
            return False
        limit = self.server.limits.max_held_bytes
        if self.server.held > limit or (size > SMALL_MESSAGE and self.server.held > limit - limit // 4):
            self._answer_now(stream, Status.RESOURCE_EXHAUSTED,
                             "the server holds too many request messages; try again later")
            return False
        return True

    def _reset(self, sid: int) -> None:
        stream = self.streams.pop(sid, None)
        if stream is None:
            return
        stream.reset = True
        stream.answered = True
        self._drop_body(stream)
        if stream.scope is not None:
            stream.scope.cancel()
        if stream.requests is not None:
            stream.requests.drop()
        if stream.started:
            if stream.method.quick is not None:
                self._finish(stream, Status.CANCELLED, "cancelled")  # its place is free now; its work settles later
        elif stream.checked:
            self._owe_finished(stream, Status.CANCELLED, "cancelled")
        self.window.set()
        self.window = trio.Event()

    def _start(self, stream: _Stream, fn: Callable[..., Awaitable[None]] | None, *args: object) -> None:
        """The call begins (``fn`` in a task of its own; None: a quick call, run here)."""
        server = self.server
        if stream.inflate:  # here, in the reading task: one connection's messages one at a time
            assert stream.message is not None
            self.release(len(stream.message))
            compressed, stream.message, stream.inflate = stream.message, None, False
            try:
                stream.message = self._inflate(compressed)
            except GrpcError as exc:
                self._answer_now(stream, exc.status, exc.message)
                return
            self.hold(len(stream.message))
        server.calls += 1
        self.tasks += 1
        stream.started = True
        if stream.message is not None:
            self.release(len(stream.message))  # the handler's now
        if stream.requests is not None:
            server.streaming += 1
            self.streaming += 1
        if fn is None:
            self._quick(stream)
        else:
            self.calls.start_soon(python_root, fn, *args)

    def _answer_now(self, stream: _Stream, status: Status, message: str,
                    trailing: tuple[tuple[str, str], ...] = (), *, http: bytes = b"200") -> None:
        """A trailers-only answer (the trailers, if the answer has begun), sent with the next flush;
        what the client still sends on the call is read and dropped, and its handler, if one runs,
        is cancelled."""
        self.codec.send_head(stream.id, _trailers(status, message, trailing, only=not stream.begun, http=http), end=True)
        if stream.checked and not stream.started:
            self._owe_finished(stream, status, message)
        self._forget(stream)

    def _drop_body(self, stream: _Stream) -> None:
        """What arrived of a message the call will not read."""
        if stream.body:
            self.release(len(stream.body))
            stream.body.clear()
        if stream.message is not None and not stream.started:
            self.release(len(stream.message))
            stream.message = None

    def _forget(self, stream: _Stream) -> None:
        stream.answered = True
        self._drop_body(stream)
        if stream.requests is not None:
            stream.requests.drop()
        if stream.scope is not None:
            stream.scope.cancel()
        self._close(stream)

    def _close(self, stream: _Stream) -> None:
        """Its answer has ended: forgotten; a client still sending on it is asked to stop (RST_STREAM
        NO_ERROR, RFC 9113 8.1), so the stream's place on the connection is free at once."""
        if not (stream.ended or stream.reset):
            self.codec.reset(stream.id, NO_ERROR)
        self.streams.pop(stream.id, None)

    def _owe_finished(self, stream: _Stream, status: Status, text: str) -> None:
        """A call the guard let through ends before it started: ``finished`` is told all the same."""
        stream.checked = False
        if self.server.finished is not None:
            self.server.finished(stream.call, stream.guarded, status, text)

    # -- calls (each in a task of the connection's nursery) ----------------------------------------

    def _quick(self, stream: _Stream) -> None:
        """A quick call, run here (in the reading task): answered now, or when its result settles."""
        assert stream.method.quick is not None and stream.message is not None
        try:
            result = stream.method.quick(stream.message, stream.call)
        except Exception as exc:
            self._quick_done(stream, None, exc)
            return
        then = getattr(result, "then", None)
        if then is not None:
            then(lambda value, error: self._quick_done(stream, value, error))
        elif isinstance(result, Coroutine):  # needs a task after all (compiled: not inspect.iscoroutine)
            self.calls.start_soon(python_root, self._quick_awaited, stream, result)
        else:
            self._quick_done(stream, result, None)

    async def _quick_awaited(self, stream: _Stream, coroutine: Coroutine[Any, Any, bytes]) -> None:
        try:
            answer = await coroutine
        except Exception as exc:
            self._quick_done(stream, None, exc)
        except BaseException:
            self._finish(stream, Status.CANCELLED, "cancelled")
            raise
        else:
            self._quick_done(stream, answer, None)

    def _quick_done(self, stream: _Stream, answer: Any, error: BaseException | None) -> None:
        """A quick call's answer, written without waiting (see :meth:`_write_now`); an answer
        larger than the client's window now is left to a task."""
        status, text = Status.OK, ""
        if error is None and trio.current_time() > stream.deadline:
            error = GrpcError(Status.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if error is None:
            try:
                self._check_size(answer)
            except GrpcError as exc:
                error = exc
        if error is not None:
            status, text = self._failure(stream, error)
            answer = None
        try:
            if stream.answered or self.broken:
                self.streams.pop(stream.id, None)
                return
            if answer is not None and 5 + len(answer) > self.codec.window(stream.id):
                self.tasks += 1  # counted until _end_late ends (the call itself by _finish below)
                self.calls.start_soon(python_root, self._end_late, stream, answer)
                return
            self._answer(stream, answer, status, text)
            self._write_now()
        finally:
            self._finish(stream, status, text)

    async def _end_late(self, stream: _Stream, answer: bytes) -> None:
        try:
            await self._end(stream, answer, Status.OK, "")
        finally:
            self.tasks -= 1

    async def _unary(self, stream: _Stream) -> None:
        status, text = Status.OK, ""
        try:
            with trio.CancelScope(deadline=stream.deadline) as scope:
                stream.scope = scope
                assert stream.method.unary is not None and stream.message is not None
                answer = await stream.method.unary(stream.message, stream.call)
            if scope.cancelled_caught:
                status, text = self._cut_short(stream)
            else:
                self._check_size(answer)
            await self._end(stream, answer if status == Status.OK else None, status, text)
        except Exception as exc:
            status, text = self._failure(stream, exc)
            await self._end(stream, None, status, text)
        finally:
            self._finish(stream, status, text)

    async def _streaming(self, stream: _Stream, requests: Inbox) -> None:
        status, text = Status.OK, ""

        async def send(message: bytes) -> None:
            self._check_size(message)
            await self._send_message(stream, message)

        try:
            with trio.CancelScope(deadline=stream.deadline) as scope:
                stream.scope = scope
                if stream.answered:  # ended (its inbox overflowed) before this task began
                    scope.cancel()
                assert stream.method.stream is not None
                await stream.method.stream(requests, send, stream.call)
            if scope.cancelled_caught:
                status, text = self._cut_short(stream)
            await self._end(stream, None, status, text)
        except _Refused:
            status, text = Status.CANCELLED, "the connection ended the call"
        except Exception as exc:
            status, text = self._failure(stream, exc)
            await self._end(stream, None, status, text)
        finally:
            requests.drop()
            self._finish(stream, status, text)

    def _check_size(self, message: bytes) -> None:
        limit = self.server.limits.max_message_bytes
        if len(message) > limit:
            raise GrpcError(Status.RESOURCE_EXHAUSTED, f"Sent message larger than max ({len(message)} vs. {limit})")

    @staticmethod
    def _cut_short(stream: _Stream) -> tuple[Status, str]:
        """The status of a call whose task was cancelled: its client reset it, the connection answered
        it already (its inbox overflowed, its request came too late), or its deadline passed."""
        if stream.reset or stream.answered:
            return Status.CANCELLED, "cancelled"
        return Status.DEADLINE_EXCEEDED, "Deadline Exceeded"

    def _failure(self, stream: _Stream, exc: BaseException) -> tuple[Status, str]:
        """The status a call failing with ``exc`` ends with (a GrpcError's trailing metadata goes
        with it; the method's ``failed`` turns other errors into one; anything else is UNKNOWN,
        and logged)."""
        if not isinstance(exc, Exception):  # never raised here: this may run in a commit's callback
            return Status.CANCELLED, f"the call was cancelled ({type(exc).__name__})"
        if not isinstance(exc, GrpcError) and stream.method.failed is not None:
            exc = stream.method.failed(exc)
        if isinstance(exc, GrpcError):
            stream.call.trailing.extend(exc.trailing)
            return exc.status, exc.message
        log.error("%s: %s failed", self.server.name, stream.call.method, exc_info=exc)
        return Status.UNKNOWN, f"Exception calling application: {exc}"

    def _finish(self, stream: _Stream, status: Status, text: str) -> None:
        if stream.finished:
            return  # a quick call reset by its client, given back then
        stream.finished = True
        self.server.calls -= 1
        self.tasks -= 1
        if stream.requests is not None:
            self.server.streaming -= 1
            self.streaming -= 1
        if self.server.finished is not None:
            self.server.finished(stream.call, stream.guarded, status, text)
        if self.server._stopping:
            self.server.quiet()

    async def _send_message(self, stream: _Stream, message: bytes) -> None:
        """One answer message within the client's windows (the head first, if not yet sent)."""
        sid = stream.id
        codec = self.codec
        if stream.answered or self.broken:
            raise _Refused()
        if not stream.begun:
            stream.begun = True
            codec.send_head(sid)
        data = b"\x00" + len(message).to_bytes(4, "big") + message
        view = memoryview(data)
        while view:
            if stream.answered or self.broken or not codec.is_open(sid):
                raise _Refused()
            size = min(len(view), codec.window(sid))
            if size <= 0:
                opened = self.window  # before the flush: an update may come while it writes
                await self.flush()
                with trio.move_on_after(self.server.limits.send_timeout_s) as waited:
                    await opened.wait()
                if waited.cancelled_caught:  # a window held shut: the stream is given up
                    log.info("%s: %s: the client's window stayed shut for %g s; stream reset",
                             self.server.name, stream.call.method, self.server.limits.send_timeout_s)
                    codec.reset(sid, CANCEL)
                    stream.answered = True
                    self._drop_body(stream)
                    self.streams.pop(sid, None)
                    await self.flush()
                    raise _Refused()
                continue
            codec.send_data(sid, bytes(view[:size]))
            view = view[size:]
        await self.flush()

    async def _end(self, stream: _Stream, answer: bytes | None, status: Status, text: str) -> None:
        """The answer (a unary call's message, if any) and the trailers."""
        sid = stream.id
        if stream.answered or self.broken:
            self.streams.pop(sid, None)
            return
        if answer is not None and (stream.begun or 5 + len(answer) > self.codec.window(sid)):
            try:
                await self._send_message(stream, answer)
            except _Refused:
                self.streams.pop(sid, None)
                return
            answer = None
            if stream.answered or self.broken:
                self.streams.pop(sid, None)
                return
        self._answer(stream, answer, status, text)
        await self.flush()

    def _answer(self, stream: _Stream, answer: bytes | None, status: Status, text: str) -> None:
        """The head (unless sent), the message if any (within the window: the caller checks),
        and the trailers, into the codec's output."""
        sid = stream.id
        codec = self.codec
        if answer is not None:
            data = b"\x00" + len(answer).to_bytes(4, "big") + answer
            if not stream.begun and status == Status.OK and not stream.call.trailing:  # the usual answer
                stream.begun = True
                codec.send_answer(sid, data, OK_TRAILERS)
                stream.answered = True
                self._drop_body(stream)
                self._close(stream)
                return
            stream.begun = True
            codec.send_head(sid)
            codec.send_data(sid, data)
        if status == Status.OK and not stream.call.trailing:
            block = OK_TRAILERS if stream.begun else _trailers(status, "", (), only=True)
        else:
            block = _trailers(status, text, stream.call.trailing, only=not stream.begun)
        codec.send_head(sid, block, end=True)
        stream.answered = True
        self._drop_body(stream)
        self._close(stream)
