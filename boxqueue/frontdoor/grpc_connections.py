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
  (``grpc-encoding``), answers are not compressed; trailers carry ``grpc-status`` and a
  percent-encoded ``grpc-message``; a call refused before it runs gets a trailers-only answer.
* **Limits**: a request message over ``max_message_bytes`` is ``RESOURCE_EXHAUSTED`` as soon as
  its length prefix arrives (the rest is read and dropped), an answer over it too; request
  metadata over ``max_metadata_bytes`` (HTTP/2's header list size: names, values and 32 bytes an
  entry) is ``RESOURCE_EXHAUSTED``; at most ``max_streams`` calls at once per connection
  (HTTP/2's ``SETTINGS_MAX_CONCURRENT_STREAMS``) and ``max_calls`` in the whole server (one more
  is ``RESOURCE_EXHAUSTED``); ``max_connections`` and TLS are the listener's
  (:func:`boxqueue.iproto.listening.serve_tcp`, TLS with ALPN ``h2``).
* **Deadlines**: ``grpc-timeout`` bounds the call: past it the call's task is cancelled and the
  answer is ``DEADLINE_EXCEEDED`` (a quick call's result that comes after its deadline is
  answered so too). A client's ``RST_STREAM`` (it cancelled, or gave up) cancels the call's task
  the same way, with no answer. Engine work already under way is not undone by either (a
  :class:`spaces.later.Later` is waited for whatever happens; see the facade).
* **Unknown methods** are ``UNIMPLEMENTED``; a handler that fails with anything but
  :class:`GrpcError` is ``UNKNOWN`` with the error's text, and logged.
* **Stopping**: :meth:`GrpcServer.stop` sends every connection a ``GOAWAY`` (clients open no new
  call on it), lets the calls in progress finish within a grace period, then cancels them.

Flow control: every received byte is acknowledged as it is read (a call's messages are bounded
by ``max_message_bytes``, and a connection holding more than ``MAX_BUFFERED`` bytes of unfinished
messages is closed with ``GOAWAY ENHANCE_YOUR_CALM``); answers are sent within the client's
windows, waiting for its window updates when a large answer (a 4 MiB pull) needs them.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import logging
import math
import ssl
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import trio

from boxqueue.frontdoor.http2_codec import (
    DATA,
    ENHANCE_YOUR_CALM,
    HEAD_BLOCK,
    REFUSED_STREAM,
    REQUEST,
    RESET,
    WINDOW,
    Http2Error,
    ServerCodec,
    literal,
)
from boxqueue.iproto.listening import serve_tcp
from boxqueue.iproto.socket_io import DirectSocket, StreamIO

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


@dataclass(slots=True)
class Call:
    """What a handler knows of its call: the method's path and the request's metadata."""

    method: str
    metadata: list[tuple[str, str]]
    trailing: list[tuple[str, str]] = field(default_factory=list)  # the handler may add to them

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
StreamHandler = Callable[["trio.MemoryReceiveChannel[bytes]", Send, Call], Awaitable[None]]


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


# Runs before every call's handler (a token check, metering); raises GrpcError to refuse it.
# It returns what ``finished`` is given back when the call ends.
Guard = Callable[[Call], object]
Finished = Callable[[Call, object, Status, str], None]


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 4 * 1024 * 1024
    max_metadata_bytes: int = 8192
    max_streams: int = 128  # calls at once on one connection
    max_calls: int = 1024  # calls at once in the server
    max_connections: int | None = None
    preface_timeout_s: float = 20.0  # from accept (after TLS) to the client's HTTP/2 preface


OK_TRAILERS = literal(b"grpc-status", b"0")
_NO_METHOD = Method()
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_RESERVED = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                       b"user-agent", b"grpc-message-type"))
STREAM_WINDOW = 1 << 20  # what each call may send ahead of our reading it; acknowledged as read
MAX_BUFFERED = 32 << 20  # bytes of unfinished request messages one connection may hold
STREAM_QUEUE = 64  # request messages of a streaming call not yet read by its handler
LINGER_S = 2.0  # after a GOAWAY that ends a connection, what the client still sends is read for this long
SEND_TIMEOUT_S = 30.0  # a client that takes nothing we write for this long is dropped


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


class _Refused(Exception):
    """A call ended by the connection before its handler's answer (the status is already sent)."""


class _Stream:
    """One call on a connection: its messages as they arrive, and the task that serves it."""

    __slots__ = ("id", "method", "call", "deadline", "compressed", "body", "message", "requests", "scope",
                 "answered", "ended", "reset", "begun", "guarded")

    def __init__(self, stream_id: int, call: Call, ended: bool) -> None:
        self.id = stream_id
        self.method = _NO_METHOD
        self.call = call
        self.deadline = math.inf
        self.compressed = False
        self.body = bytearray()
        self.message: bytes | None = None  # a unary call's request
        self.requests: trio.MemorySendChannel[bytes] | None = None  # a streaming call's
        self.scope: trio.CancelScope | None = None
        self.answered = False  # its end (trailers or a reset) is sent: what it still sends is dropped
        self.ended = ended  # the client has sent everything
        self.reset = False  # the client has reset it
        self.begun = False  # the answer's head is sent
        self.guarded: object = None


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
        self._connections: set[_Connection] = set()
        self._stopping = False
        self._quiet = trio.Event()  # set once stopping and no call is left

    async def serve(self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept on ``host:port`` until cancelled (stop first for a graceful end)."""
        async with trio.open_nursery() as connections:
            try:
                await serve_tcp(host, port, self._connection, connections, name=self.name,
                                ssl_context=self.ssl_context, max_connections=self.limits.max_connections,
                                task_status=task_status)
            except OSError as exc:  # binding: say which listener
                raise OSError(exc.errno, f"{self.name} listener {host}:{port}: {exc.strerror or exc}") from exc

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
        connection = _Connection(self, stream)
        self._connections.add(connection)
        try:
            await connection.serve()
        finally:
            self._connections.discard(connection)
            self.quiet()
            await trio.aclose_forcefully(stream)


class _Connection:
    def __init__(self, server: GrpcServer, stream: trio.abc.Stream) -> None:
        self.server = server
        self.stream = stream
        self.direct = DirectSocket(stream) if isinstance(stream, trio.SocketStream) else None
        self.io: DirectSocket | StreamIO = self.direct or StreamIO(stream)
        limits = server.limits
        self.codec = ServerCodec(max_streams=limits.max_streams, stream_window=STREAM_WINDOW,
                                 connection_window=4 * STREAM_WINDOW, max_header_list=4 * limits.max_metadata_bytes)
        self.streams: dict[int, _Stream] = {}
        self.writing = False  # a task is writing (see flush)
        self.buffered = 0  # bytes of request messages received and not yet handed to their calls
        self._break_after_flush = False
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
                finally:
                    self.broken = True
                    self.window.set()
                    calls.cancel_scope.cancel()
        finally:
            self.io.detach()

    async def _read(self) -> None:
        data = b""
        with trio.move_on_after(self.server.limits.preface_timeout_s):
            data = await self._receive()  # the client's preface, or nothing
        codec = self.codec
        while data and not self.broken:
            try:
                events = codec.receive(data)
            except Http2Error as exc:
                log.info("%s: HTTP/2 protocol error, connection closed: %s", self.server.name, exc)
                await self.flush()
                await self._linger()
                return
            for event in events:
                if self._break_after_flush:
                    break
                kind = event[0]
                if kind == DATA:
                    self._data(event[1], event[2], event[3])
                elif kind == REQUEST:
                    self._request(event[1], event[2], event[3])
                elif kind == RESET:
                    self._reset(event[1])
                elif kind == WINDOW:
                    self.window.set()
                    self.window = trio.Event()
            if codec.out:
                await self.flush()
            if self._break_after_flush:
                await self._linger()
                return
            if self.server._stopping:
                self.server.quiet()
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
        frame in half) and bounded by ``SEND_TIMEOUT_S``."""
        codec = self.codec
        if self.writing or self.broken or not codec.out:
            return
        self.writing = True
        try:
            while codec.out and not self.broken:
                if self._send_now():
                    continue
                data = codec.data_to_send()
                with trio.CancelScope(shield=True), trio.move_on_after(SEND_TIMEOUT_S) as timer:
                    try:
                        await self.io.send_all(data)
                    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                        self._break()
                if timer.cancelled_caught:
                    self._break()
        finally:
            self.writing = False

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
            self.calls.start_soon(self.flush)

    def _break(self) -> None:
        self.broken = True
        self.window.set()
        self.reading.cancel()
        self.calls.cancel_scope.cancel()

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
        if server._stopping:  # the codec forgets it too: nothing of it is kept
            self.codec.reset(sid, REFUSED_STREAM)
            return
        call = Call(path.decode("latin-1"), metadata)
        stream = _Stream(sid, call, ended)
        self.streams[sid] = stream
        if not content_type.startswith(b"application/grpc"):
            self._answer_now(stream, Status.UNKNOWN, f"not a gRPC request (content-type {content_type!r})", http=b"415")
            return
        if encoding and encoding not in (b"identity", b"gzip"):
            self._answer_now(stream, Status.UNIMPLEMENTED, f"unsupported grpc-encoding {encoding.decode('latin-1')!r}")
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
        stream.method = method
        stream.compressed = encoding == b"gzip"
        if timeout is not None:
            stream.deadline = trio.current_time() + timeout
        if method.stream is not None:
            send, receive = trio.open_memory_channel[bytes](STREAM_QUEUE)
            stream.requests = send
            self._start(stream, self._streaming, stream, receive)
            if ended:
                send.close()
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
                stream.requests.close()
            elif stream.message is None:
                self._answer_now(stream, Status.UNIMPLEMENTED, "no request message for a unary method")
            else:
                self._start(stream, None if stream.method.quick is not None else self._unary, stream)

    def _messages(self, stream: _Stream, data: bytes) -> bool:
        """The messages ``data`` completes, handed on; False if the call was answered for them."""
        body = stream.body
        body += data
        self.buffered += len(data)
        if self.buffered > MAX_BUFFERED:
            # Many calls' messages half-sent at once: more than any client needs (a few 4 MiB
            # requests in flight). The connection ends rather than hold more.
            log.warning("%s: a connection held %d bytes of unfinished request messages; closed",
                        self.server.name, self.buffered)
            self.codec.go_away(ENHANCE_YOUR_CALM)
            self._break_after_flush = True
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
            self.buffered -= 5 + length
            if flag:
                if not stream.compressed:
                    self._answer_now(stream, Status.INTERNAL, "a compressed message without grpc-encoding")
                    return False
                try:
                    inflater = zlib.decompressobj(wbits=31)
                    message = inflater.decompress(message, limit + 1)
                except zlib.error as exc:
                    self._answer_now(stream, Status.INTERNAL, f"cannot decompress the message: {exc}")
                    return False
                if len(message) > limit or inflater.unconsumed_tail:
                    self._answer_now(stream, Status.RESOURCE_EXHAUSTED,
                                     f"Received message larger than max (more than {limit} once decompressed)")
                    return False
            if stream.requests is not None:
                try:
                    stream.requests.send_nowait(message)
                except trio.WouldBlock:
                    self._answer_now(stream, Status.RESOURCE_EXHAUSTED, "too many request messages waiting to be read")
                    return False
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the handler has stopped reading; its end is on its way
            elif stream.message is not None:
                self._answer_now(stream, Status.UNIMPLEMENTED, "more than one request message for a unary method")
                return False
            else:
                stream.message = message
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
            stream.requests.close()
        self.window.set()
        self.window = trio.Event()

    def _start(self, stream: _Stream, fn: Callable[..., Awaitable[None]] | None, *args: object) -> None:
        """The call begins (``fn`` in a task of its own; None: a quick call, run here)."""
        server = self.server
        if server.guard is not None:
            try:
                stream.guarded = server.guard(stream.call)
            except GrpcError as exc:
                self._answer_now(stream, exc.status, exc.message, exc.trailing)
                return
        server.calls += 1
        self.tasks += 1
        if fn is None:
            self._quick(stream)
        else:
            self.calls.start_soon(fn, *args)

    def _answer_now(self, stream: _Stream, status: Status, message: str,
                    trailing: tuple[tuple[str, str], ...] = (), *, http: bytes = b"200") -> None:
        """A trailers-only answer, sent with the next flush; what the client still sends on the
        call is read and dropped."""
        self.codec.send_head(stream.id, _trailers(status, message, trailing, only=True, http=http), end=True)
        self._forget(stream)

    def _drop_body(self, stream: _Stream) -> None:
        """What arrived of a message the call will not read."""
        if stream.body:
            self.buffered -= len(stream.body)
            stream.body.clear()

    def _forget(self, stream: _Stream) -> None:
        stream.answered = True
        self._drop_body(stream)
        if stream.requests is not None:
            stream.requests.close()
        if stream.ended or stream.reset:
            self.streams.pop(stream.id, None)

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
        elif inspect.iscoroutine(result):  # this call needs a task after all
            self.calls.start_soon(self._quick_awaited, stream, result)
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
                self.calls.start_soon(self._end_late, stream, answer)
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

    async def _streaming(self, stream: _Stream, requests: trio.MemoryReceiveChannel[bytes]) -> None:
        status, text = Status.OK, ""

        async def send(message: bytes) -> None:
            self._check_size(message)
            await self._send_message(stream, message)

        try:
            with trio.CancelScope(deadline=stream.deadline) as scope:
                stream.scope = scope
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
            requests.close()
            self._finish(stream, status, text)

    def _check_size(self, message: bytes) -> None:
        limit = self.server.limits.max_message_bytes
        if len(message) > limit:
            raise GrpcError(Status.RESOURCE_EXHAUSTED, f"Sent message larger than max ({len(message)} vs. {limit})")

    @staticmethod
    def _cut_short(stream: _Stream) -> tuple[Status, str]:
        """The status of a call whose task was cancelled: its client reset it, or its deadline passed."""
        return (Status.CANCELLED, "cancelled") if stream.reset else (Status.DEADLINE_EXCEEDED, "Deadline Exceeded")

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
        self.server.calls -= 1
        self.tasks -= 1
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
                await opened.wait()
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
            stream.begun = True
            codec.send_head(sid)
            codec.send_data(sid, b"\x00" + len(answer).to_bytes(4, "big") + answer)
        if status == Status.OK and not stream.call.trailing:
            block = OK_TRAILERS if stream.begun else _trailers(status, "", (), only=True)
        else:
            block = _trailers(status, text, stream.call.trailing, only=not stream.begun)
        codec.send_head(sid, block, end=True)
        stream.answered = True
        self._drop_body(stream)
        if stream.ended:
            self.streams.pop(sid, None)
