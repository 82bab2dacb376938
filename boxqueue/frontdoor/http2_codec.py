"""HTTP/2's server side, as gRPC uses it, without I/O: bytes in, events out; answers to bytes.

Why not the ``h2`` library, which speaks all of HTTP/2: for a gRPC call (a head, one message,
trailers each way) its frame objects, stream state machines, header validation and per-frame
logging cost about 40% of the server's CPU per call (a py-spy profile of the Deckard cycle,
docs/performance.md). gRPC needs a small part of HTTP/2, and a server needs less still: it never
pushes, never opens streams, and writes only the heads and trailers it chooses. This codec keeps
to that part, as RFC 9113 says it must be done:

* the client's preface, then frames of at most 16 KiB (our ``SETTINGS_MAX_FRAME_SIZE``); a head
  split over CONTINUATION frames; padding and priority fields; PING answered; SETTINGS applied
  and acknowledged; PRIORITY and frame types it does not know ignored; a PUSH_PROMISE, a frame of
  the wrong size or on the wrong stream, a new stream whose id is not above the last one, a
  WINDOW_UPDATE on a stream not yet opened are connection errors (a GOAWAY with the code, then
  :class:`Http2Error`); frames on a stream we reset are ignored (they may have crossed our reset);
* header blocks decoded by the ``hpack`` library (the dynamic table, Huffman codes, the size
  limits); our heads and trailers are encoded as literals that do not touch the client's dynamic
  table (``:status 200`` and ``content-type`` from the static table), so no encoder state is
  needed but one: a client that sets ``SETTINGS_HEADER_TABLE_SIZE`` is sent a dynamic table size
  update (to 0) at the start of our next head, as RFC 7541 4.2 requires of an encoder;
* requests checked as RFC 9113 8.2 and 8.3 say (field names in lower case without separators or
  controls, values without NUL, CR, LF or surrounding white space, no connection-specific fields,
  ``te`` only ``trailers``, the request pseudo-header fields once each, before the others, and
  ``:method``, ``:scheme`` and ``:path`` present; none in trailers): a malformed one is a stream
  error (``RST_STREAM PROTOCOL_ERROR``);
* flow control both ways: what the client sends is acknowledged as it is read (a WINDOW_UPDATE
  once half a window is consumed), and sending beyond the windows we gave is a
  ``FLOW_CONTROL_ERROR`` (of the connection, or of the stream); what we send stays within the
  client's connection and stream windows (:meth:`ServerCodec.window`), which its WINDOW_UPDATE and
  SETTINGS frames open;
* ``SETTINGS_MAX_CONCURRENT_STREAMS``: a stream beyond it is refused (``RST_STREAM
  REFUSED_STREAM``; the client may retry it);
* floods: streams reset (by the client, or refused and reset by us) are budgeted like nghttp2's
  stream reset limit (``RESET_BURST`` at once, then ``RESET_RATE`` a second: the rapid-reset
  attack, CVE-2023-44487), and so are the frames that ask for work but carry none (PING,
  SETTINGS, PRIORITY, unknown types, empty DATA: ``IDLE_FRAME_BURST``, ``IDLE_FRAME_RATE``); a
  head takes at most ``MAX_CONTINUATIONS`` CONTINUATION frames and ``MAX_HEADER_BLOCK`` bytes.
  Past a budget the connection ends with ``GOAWAY ENHANCE_YOUR_CALM``.

Events are tuples, their first item the kind: ``(REQUEST, stream, headers, ended)``,
``(DATA, stream, data, ended)``, ``(RESET, stream)``, ``(WINDOW, 0)`` (the client opened a
window), ``(GOAWAY, last_stream)`` (the client is leaving).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import cython
import hpack
import hpack.exceptions

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113, 6).
F_DATA, F_HEADERS, F_PRIORITY, F_RST_STREAM, F_SETTINGS, F_PUSH_PROMISE, F_PING, F_GOAWAY, F_WINDOW_UPDATE, \
    F_CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY = 0x20

# Error codes (7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11

# Settings (6.5.2).
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, \
    S_MAX_HEADER_LIST_SIZE = range(1, 7)

# Event kinds.
REQUEST, DATA, RESET, WINDOW, GOAWAY = range(5)

DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1
MAX_FRAME = 16384  # what we accept (the protocol's default: we do not raise it)
MAX_HEADER_BLOCK = 65536  # a head's encoded bytes, over its frames
MAX_CONTINUATIONS = 64  # a head's CONTINUATION frames (an empty one adds no bytes but costs a frame)
RESET_BURST, RESET_RATE = 256, 64.0  # streams reset at once, then a second, before ENHANCE_YOUR_CALM
IDLE_FRAME_BURST, IDLE_FRAME_RATE = 1000, 200.0  # frames that carry no work, at once, then a second
DECODED_KEPT = 32  # blocks of indexed fields kept decoded (see ServerCodec._decode)
RESET_REMEMBERED = 256  # the streams we reset last, whose late frames are ignored
TABLE_SIZE_ZERO = b"\x20"  # an HPACK dynamic table size update to 0 (RFC 7541 6.3)

# RFC 9113 8.2 and 8.3: what a request's fields may hold.
_PSEUDO = {b":method": 1, b":scheme": 2, b":authority": 4, b":path": 8}  # the request's, as bits
_REQUIRED = 1 | 2 | 8
CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"))
_TOKEN = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"  # a field name's characters (a token in lower case)
_BAD_VALUE = re.compile(rb"[\x00\r\n]").search
_WHITE = b" \t"


class Budget:
    """A token bucket: ``burst`` spent at once, given back at ``rate`` a second."""

    __slots__ = ("burst", "rate", "clock", "tokens", "at")

    def __init__(self, burst: int, rate: float, clock: Callable[[], float]) -> None:
        self.burst = burst
        self.rate = rate
        self.clock = clock
        self.tokens = float(burst)
        self.at = clock()

    def spend(self) -> bool:
        """One token; False when none is left."""
        if self.tokens < 1.0 and self.available() < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def available(self) -> float:
        """The tokens now (refilled for the time passed)."""
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now
        return self.tokens


def malformed(headers: Iterable[tuple[Any, Any]], trailers: bool = False,
              checked: dict[Any, None] | None = None) -> str | None:
    """Why a request head (or its trailers) breaks RFC 9113 8.2 and 8.3; None if it does not.
    ``checked``: fields whose characters were found valid before (a client repeats most of its
    fields on every call), filled here."""
    pseudo = 0
    regular = False
    for field in headers:
        name, value = field
        bit = _PSEUDO.get(name, 0)
        if bit:
            if trailers or regular or pseudo & bit or not value:
                return f"the pseudo-header field {name!r} in trailers, after a regular field, repeated or empty"
            pseudo |= bit
        else:
            if name[:1] == b":":
                return f"the pseudo-header field {name!r}"
            regular = True
            if name in CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
                return f"the connection-specific field {name!r}"
        if checked is not None and field in checked:
            continue
        if not name or (not bit and name.translate(None, _TOKEN)):
            return f"the field name {name!r}"
        if value and (_BAD_VALUE(value) is not None or value[0] in _WHITE or value[-1] in _WHITE):
            return f"the value of {name!r}"
        if checked is not None:
            if len(checked) >= 512:
                checked.clear()
            checked[field] = None
    if not trailers and pseudo & _REQUIRED != _REQUIRED:
        return "a request without :method, :scheme or :path"  # gRPC never sends CONNECT
    return None


class Http2Error(Exception):
    """The client broke the protocol: the connection ends (a GOAWAY is ready to send)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's prefixed integer (5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman code (6.2.2): it
    leaves the client's dynamic table as it is."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


# ":status: 200" is entry 8 of the static table; "content-type" is entry 31 (a literal without
# indexing with an indexed name).
HEAD_BLOCK = b"\x88" + _integer(31, 4) + _integer(16, 7) + b"application/grpc"
# A frame's type and flags, for send_answer: a head, a DATA frame, the trailers that end the stream.
_HEADS, _DATA, _LAST_HEADS = bytes((F_HEADERS, END_HEADERS)), bytes((F_DATA, 0)), bytes((F_HEADERS, END_HEADERS | END_STREAM))


class _Stream:
    __slots__ = ("send_window", "unacknowledged", "received", "remote_closed", "local_closed")

    def __init__(self, send_window: int, remote_closed: bool) -> None:
        self.send_window = send_window
        self.unacknowledged = 0
        self.received = 0  # bytes of DATA since our last WINDOW_UPDATE of the stream (the window used)
        self.remote_closed = remote_closed
        self.local_closed = False


def _indexed_only(block: bytes) -> bool:
    """Whether the HPACK block is indexed fields only (RFC 7541 6.1: a first byte with its top
    bit set, then the index's continuation bytes when its 7-bit prefix is full)."""
    i, n = 0, len(block)
    while i < n:
        first = block[i]
        if not first & 0x80:
            return False
        i += 1
        if first & 0x7F == 0x7F:  # the index goes on while the top bit is set
            while i < n and block[i] & 0x80:
                i += 1
            i += 1
    return i == n


class ServerCodec:
    """One connection's HTTP/2 state, server side."""

    def __init__(self, *, max_streams: int = 100, stream_window: int = 1 << 20, connection_window: int = 4 << 20,
                 max_header_list: int = 32768, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_streams = max_streams
        self.stream_window = stream_window
        self.connection_window = connection_window
        self.out = bytearray()
        self.streams: dict[int, _Stream] = {}
        self.highest = 0  # the highest stream id the client has opened
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16384
        self.send_window = DEFAULT_WINDOW  # the connection's, for what we send
        self._buffer = bytearray()
        self._preface = False
        self._unacknowledged = 0  # connection-level bytes received since our last WINDOW_UPDATE
        self._head: tuple[int, int, bytearray] | None = None  # a head awaiting its CONTINUATION frames
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = max_header_list
        self._decoded: dict[bytes, list[Any]] = {}  # see _decode: [fields, found a well-formed request head]
        self._events: list[Any] = []
        self._window_event = False
        self._continuations = 0
        self._checked: dict[Any, None] = {}  # fields found valid (see malformed)
        self._table_update = b""  # a dynamic table size update owed at the start of our next head
        self._reset_by_us: dict[int, None] = {}  # the last RESET_REMEMBERED streams we reset
        self._resets = Budget(RESET_BURST, RESET_RATE, clock)
        self._idle_frames = Budget(IDLE_FRAME_BURST, IDLE_FRAME_RATE, clock)
        settings = b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in (
            (S_ENABLE_PUSH, 0), (S_MAX_CONCURRENT_STREAMS, max_streams), (S_INITIAL_WINDOW_SIZE, stream_window),
            (S_MAX_HEADER_LIST_SIZE, max_header_list)))
        self.out += frame(F_SETTINGS, 0, 0, settings)
        self.out += frame(F_WINDOW_UPDATE, 0, 0, (connection_window - DEFAULT_WINDOW).to_bytes(4, "big"))

    # -- what the client sends -------------------------------------------------------------------

    @cython.locals(buffer=bytearray, position=cython.Py_ssize_t, end=cython.Py_ssize_t, left=cython.Py_ssize_t,
                   length=cython.Py_ssize_t, kind=cython.int, flags=cython.int, stream=cython.long)
    def receive(self, data: bytes, max_frames: int = 0) -> list[Any]:
        """The events in ``data`` (and what came before it unparsed), from at most ``max_frames``
        frames (0: all; :meth:`ready` says whether more wait). Raises Http2Error."""
        buffer = self._buffer
        buffer += data
        events: list[Any] = []
        self._events = events
        self._window_event = False
        position = 0
        if not self._preface:
            if len(buffer) < len(PREFACE):
                if not PREFACE.startswith(bytes(buffer)):
                    self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return events
            if buffer[:len(PREFACE)] != PREFACE:
                self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface = True
            position = len(PREFACE)
        end = len(buffer)
        left = max_frames or -1
        while end - position >= 9 and left:
            left -= 1
            length = (buffer[position] << 16) | (buffer[position + 1] << 8) | buffer[position + 2]
            if length > MAX_FRAME:
                self._fail(FRAME_SIZE_ERROR, f"a frame of {length} bytes (the limit is {MAX_FRAME})")
            if end - position < 9 + length:
                break
            kind = buffer[position + 3]
            flags = buffer[position + 4]
            stream = ((buffer[position + 5] & 0x7F) << 24) | (buffer[position + 6] << 16) | (buffer[position + 7] << 8) \
                | buffer[position + 8]
            payload = bytes(buffer[position + 9:position + 9 + length])
            position += 9 + length
            self._frame(kind, flags, stream, payload)
        del buffer[:position]
        if self._window_event:
            events.append((WINDOW, 0))
        return events

    def ready(self) -> bool:
        """Whether a whole frame waits in what was received (left by ``max_frames``)."""
        buffer = self._buffer
        return self._preface and len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big")

    @property
    def preface_received(self) -> bool:
        return self._preface

    def partial(self) -> bool:
        """Whether part of the preface, of a frame or of a head (awaiting its CONTINUATION) has come
        and the rest not yet."""
        return bool(self._buffer) or self._head is not None or not self._preface

    def _fail(self, code: int, text: str) -> None:
        self.out += frame(F_GOAWAY, 0, 0, self.highest.to_bytes(4, "big") + code.to_bytes(4, "big") + text.encode()[:256])
        raise Http2Error(code, text)

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self._head is not None and kind != F_CONTINUATION:
            self._fail(PROTOCOL_ERROR, "a head's CONTINUATION expected")
        if kind == F_DATA:
            self._data(flags, stream, payload)
        elif kind == F_HEADERS:
            self._headers(flags, stream, payload)
        elif kind == F_CONTINUATION:
            self._continuation(flags, stream, payload)
        elif kind == F_WINDOW_UPDATE:
            self._window_update(stream, payload)
        elif kind == F_RST_STREAM:
            if stream == 0 or len(payload) != 4:
                self._fail(PROTOCOL_ERROR if stream == 0 else FRAME_SIZE_ERROR, "a malformed RST_STREAM")
            if stream > self.highest:
                self._fail(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            if self.streams.pop(stream, None) is not None:
                self._count_reset()
                self._events.append((RESET, stream))
        elif kind == F_SETTINGS:
            self._settings(flags, stream, payload)
        elif kind == F_PING:
            if stream != 0:
                self._fail(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                self._fail(FRAME_SIZE_ERROR, "a PING of another size than 8")
            if not flags & ACK:
                self._idle_frame()
                self.out += frame(F_PING, ACK, 0, payload)
        elif kind == F_GOAWAY:
            if stream != 0:
                self._fail(PROTOCOL_ERROR, "GOAWAY on a stream")
            self._events.append((GOAWAY, int.from_bytes(payload[:4], "big") & 0x7FFFFFFF))
        elif kind == F_PRIORITY:
            if stream == 0:
                self._fail(PROTOCOL_ERROR, "PRIORITY on the connection")
            if len(payload) != 5:
                self._fail(FRAME_SIZE_ERROR, "a PRIORITY of another size than 5")
            self._idle_frame()
        elif kind == F_PUSH_PROMISE:
            self._fail(PROTOCOL_ERROR, "a client does not push")
        else:  # any other type is ignored (5.5)
            self._idle_frame()

    def _idle_frame(self) -> None:
        """A frame that asks for work and carries none, against its budget."""
        if not self._idle_frames.spend():
            self._fail(ENHANCE_YOUR_CALM, "too many frames without a request (PING, SETTINGS, PRIORITY, empty DATA)")

    def _count_reset(self) -> None:
        """A stream that ended in a reset, against the budget of resets."""
        if not self._resets.spend():
            self._fail(ENHANCE_YOUR_CALM, "too many streams reset")

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes | None:
        if not flags & PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            return None
        return payload[1:len(payload) - payload[0]]

    def _data(self, flags: int, stream: int, payload: bytes) -> None:
        if stream == 0:
            self._fail(PROTOCOL_ERROR, "DATA on the connection")
        self._unacknowledged += len(payload)
        if self._unacknowledged > self.connection_window:
            self._fail(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        if self._unacknowledged >= self.connection_window // 2:
            self.out += frame(F_WINDOW_UPDATE, 0, 0, self._unacknowledged.to_bytes(4, "big"))
            self._unacknowledged = 0
        data = self._unpad(flags, payload)
        if data is None:
            self._fail(PROTOCOL_ERROR, "DATA with more padding than payload")
            return
        state = self.streams.get(stream)
        if state is None or state.remote_closed:
            if stream > self.highest:
                self._fail(PROTOCOL_ERROR, "DATA on an idle stream")
            if state is not None:
                self.reset(stream, STREAM_CLOSED)
            return  # a stream already reset or answered: dropped
        state.received += len(payload)
        if state.received > self.stream_window:
            self.reset(stream, FLOW_CONTROL_ERROR)
            self._events.append((RESET, stream))
            return
        ended = bool(flags & END_STREAM)
        if ended:
            state.remote_closed = True
            self._closed_both(stream, state)
        else:
            if not payload:
                self._idle_frame()
            state.unacknowledged += len(payload)
            if state.unacknowledged >= self.stream_window // 2:
                self.out += frame(F_WINDOW_UPDATE, 0, stream, state.unacknowledged.to_bytes(4, "big"))
                state.received -= state.unacknowledged
                state.unacknowledged = 0
        self._events.append((DATA, stream, data, ended))

    def _headers(self, flags: int, stream: int, payload: bytes) -> None:
        if stream == 0:
            self._fail(PROTOCOL_ERROR, "HEADERS on the connection")
        block = self._unpad(flags, payload)
        if block is None:
            self._fail(PROTOCOL_ERROR, "HEADERS with more padding than payload")
            return
        if flags & PRIORITY:
            block = block[5:]
        if flags & END_HEADERS:
            self._head_done(stream, bool(flags & END_STREAM), block)
        else:
            self._head = (stream, flags, bytearray(block))
            self._continuations = 0

    def _continuation(self, flags: int, stream: int, payload: bytes) -> None:
        head = self._head
        if head is None or head[0] != stream:
            self._fail(PROTOCOL_ERROR, "CONTINUATION without its head")
            return
        head[2].extend(payload)
        self._continuations += 1
        if len(head[2]) > MAX_HEADER_BLOCK or self._continuations > MAX_CONTINUATIONS:
            self._fail(ENHANCE_YOUR_CALM,
                       f"a head of more than {MAX_HEADER_BLOCK} bytes or {MAX_CONTINUATIONS} CONTINUATION frames")
        if flags & END_HEADERS:
            self._head = None
            self._head_done(stream, bool(head[1] & END_STREAM), bytes(head[2]))

    def _decode(self, block: bytes) -> list[Any]:
        """A head's fields. A block of indexed fields only (what a client sends for a head it
        sent before: every field in the dynamic table by then) changes no table, so while the
        table stays as it is the block means what it meant: its fields are kept (at most
        DECODED_KEPT blocks, each with whether it was found a well-formed request head: see
        :meth:`_head_done`) and any other block, which may change the table, forgets them."""
        kept = self._decoded
        known = kept.get(block)
        if known is not None:
            return list(known[0])
        headers = list(self._decoder.decode(block, raw=True))
        if _indexed_only(block):
            if len(kept) >= DECODED_KEPT:
                kept.clear()
            kept[block] = [list(headers), False]
        elif kept:
            kept.clear()
        return headers

    def _head_done(self, stream: int, ended: bool, block: bytes) -> None:
        try:  # always decoded: the dynamic table must follow the client's
            headers = self._decode(block)
        except hpack.exceptions.OversizedHeaderListError:
            self._fail(ENHANCE_YOUR_CALM, "a head over the header list size")
            return
        except (hpack.exceptions.HPACKError, IndexError, ValueError) as exc:
            self._fail(COMPRESSION_ERROR, f"an undecodable head: {exc}")
            return
        state = self.streams.get(stream)
        if state is not None:  # trailers from the client: only the end of its stream matters
            if not ended:
                self._fail(PROTOCOL_ERROR, "a second head without END_STREAM")
            if state.remote_closed:
                self.reset(stream, STREAM_CLOSED)
                self._events.append((RESET, stream))
                return
            if malformed(headers, trailers=True, checked=self._checked) is not None:
                self.reset(stream, PROTOCOL_ERROR)
                self._count_reset()
                self._events.append((RESET, stream))
                return
            state.remote_closed = True
            self._closed_both(stream, state)
            self._events.append((DATA, stream, b"", True))
            return
        if stream <= self.highest or not stream & 1:
            if stream in self._reset_by_us:
                return  # crossed our reset
            self._fail(PROTOCOL_ERROR, f"a client stream id {stream} after {self.highest}")
        self.highest = stream
        if len(self.streams) >= self.max_streams:
            self._refuse(stream, REFUSED_STREAM)
            return
        kept = self._decoded.get(block)
        if kept is None or not kept[1]:  # a kept block found well-formed once is so while it is kept
            if malformed(headers, checked=self._checked) is not None:
                self._refuse(stream, PROTOCOL_ERROR)
                return
            if kept is not None:
                kept[1] = True
        self.streams[stream] = _Stream(self.peer_initial_window, ended)
        self._events.append((REQUEST, stream, headers, ended))

    def _window_update(self, stream: int, payload: bytes) -> None:
        if len(payload) != 4:
            self._fail(FRAME_SIZE_ERROR, "a WINDOW_UPDATE of another size than 4")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream == 0:
            if increment == 0:
                self._fail(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                self._fail(FLOW_CONTROL_ERROR, "the connection's window over 2^31-1")
        else:
            state = self.streams.get(stream)
            if state is None:
                if stream > self.highest:
                    self._fail(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
                return
            if increment == 0 or state.send_window + increment > MAX_WINDOW:
                self.reset(stream, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR)
                self._events.append((RESET, stream))
                return
            state.send_window += increment
        self._window_event = True

    def _settings(self, flags: int, stream: int, payload: bytes) -> None:
        if stream != 0:
            self._fail(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                self._fail(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            self._fail(FRAME_SIZE_ERROR, "a SETTINGS payload not a multiple of 6")
        self._idle_frame()
        for i in range(0, len(payload), 6):
            key = int.from_bytes(payload[i:i + 2], "big")
            value = int.from_bytes(payload[i + 2:i + 6], "big")
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    self._fail(FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for state in self.streams.values():
                    state.send_window += delta
                self._window_event = True
            elif key == S_MAX_FRAME_SIZE:
                if not 16384 <= value <= 16777215:
                    self._fail(PROTOCOL_ERROR, f"a max frame size of {value}")
                self.peer_max_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                self._fail(PROTOCOL_ERROR, "ENABLE_PUSH other than 0 or 1")
            elif key == S_HEADER_TABLE_SIZE:
                # Our answers never use the dynamic table, but a decoder whose table the client has
                # resized expects the encoder to say its size (nghttp2 refuses the next head otherwise).
                self._table_update = TABLE_SIZE_ZERO
            # the rest is advisory
        self.out += frame(F_SETTINGS, ACK, 0)

    # -- what we send ------------------------------------------------------------------------------

    def window(self, stream: int) -> int:
        """How many bytes of DATA ``stream`` may send now (0 if it is gone)."""
        state = self.streams.get(stream)
        if state is None or state.local_closed:
            return 0
        return min(self.send_window, state.send_window)

    def is_open(self, stream: int) -> bool:
        state = self.streams.get(stream)
        return state is not None and not state.local_closed

    def send_head(self, stream: int, block: bytes = HEAD_BLOCK, *, end: bool = False) -> None:
        """A head (a header block made by :func:`literal` and ``HEAD_BLOCK``); ``end`` makes it
        the last frame of the stream (trailers, or a trailers-only answer)."""
        state = self.streams.get(stream)
        if state is None or state.local_closed:
            return
        limit = self.peer_max_frame
        flags = END_STREAM if end else 0
        if self._table_update:
            block = self._table_update + block
            self._table_update = b""
        if len(block) <= limit:
            self.out += frame(F_HEADERS, flags | END_HEADERS, stream, block)
        else:
            self.out += frame(F_HEADERS, flags, stream, block[:limit])
            rest = block[limit:]
            while rest:
                piece, rest = rest[:limit], rest[limit:]
                self.out += frame(F_CONTINUATION, 0 if rest else END_HEADERS, stream, piece)
        if end:
            state.local_closed = True
            self._closed_both(stream, state)

    def send_answer(self, stream: int, data: bytes, trailers: bytes) -> None:
        """A whole answer: the head (``HEAD_BLOCK``), ``data`` (within :meth:`window`: the caller
        checks) and the trailers that end the stream; as :meth:`send_head`, :meth:`send_data` and
        :meth:`send_head` with ``end`` would send them, made in one piece when each fits a frame."""
        state = self.streams.get(stream)
        if state is None or state.local_closed:
            return
        limit = self.peer_max_frame
        if len(data) > limit or len(trailers) > limit:
            self.send_head(stream)
            self.send_data(stream, data)
            self.send_head(stream, trailers, end=True)
            return
        head = HEAD_BLOCK
        if self._table_update:
            head = self._table_update + head
            self._table_update = b""
        size = len(data)
        state.send_window -= size
        self.send_window -= size
        sid = stream.to_bytes(4, "big")
        self.out += b"".join((len(head).to_bytes(3, "big"), _HEADS, sid, head, size.to_bytes(3, "big"), _DATA, sid,
                              data, len(trailers).to_bytes(3, "big"), _LAST_HEADS, sid, trailers))
        state.local_closed = True
        self._closed_both(stream, state)

    def send_data(self, stream: int, data: bytes) -> None:
        """DATA within :meth:`window` (the caller checks), split at the client's frame size."""
        state = self.streams.get(stream)
        if state is None or state.local_closed:
            return
        state.send_window -= len(data)
        self.send_window -= len(data)
        limit = self.peer_max_frame
        if len(data) <= limit:
            self.out += frame(F_DATA, 0, stream, data)
            return
        for start in range(0, len(data), limit):
            self.out += frame(F_DATA, 0, stream, data[start:start + limit])

    def reset(self, stream: int, code: int = CANCEL) -> None:
        if self.streams.pop(stream, None) is not None:
            self._remember_reset(stream)
            self.out += frame(F_RST_STREAM, 0, stream, code.to_bytes(4, "big"))

    def _refuse(self, stream: int, code: int) -> None:
        """A new stream reset at once (refused, or malformed)."""
        self._remember_reset(stream)
        self.out += frame(F_RST_STREAM, 0, stream, code.to_bytes(4, "big"))
        self._count_reset()

    def _remember_reset(self, stream: int) -> None:
        reset = self._reset_by_us
        reset[stream] = None
        if len(reset) > RESET_REMEMBERED:
            del reset[next(iter(reset))]

    def go_away(self, code: int = NO_ERROR, text: str = "") -> None:
        """The streams opened so far may finish; no other will be served (``text``: the debug data)."""
        self.out += frame(F_GOAWAY, 0, 0, self.highest.to_bytes(4, "big") + code.to_bytes(4, "big") + text.encode()[:256])

    def data_to_send(self) -> bytes:
        out = bytes(self.out)
        self.out.clear()
        return out

    def _closed_both(self, stream: int, state: _Stream) -> None:
        if state.local_closed and state.remote_closed:
            del self.streams[stream]
