"""A hand-driven HTTP/2 client for tests that must send what a well-behaved client never would
(frames by hand: partial, reset at once, flooded, windows held shut) and see every frame the
server answers with. Frames are made by :func:`boxqueue.frontdoor.http2_codec.frame`; heads are
encoded with ``hpack``, answers' heads decoded with it."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import Callable, Iterable

import hpack
import trio

from boxqueue.frontdoor.http2_codec import PREFACE, frame

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS = 0x1, 0x4

Frame = tuple[int, int, int, bytes]  # type, flags, stream, payload


def message(payload: bytes, *, compressed: bool = False) -> bytes:
    """One gRPC length-prefixed message (gzip compressed with ``compressed``)."""
    if compressed:
        payload = gzip.compress(payload)
    return bytes((1 if compressed else 0,)) + len(payload).to_bytes(4, "big") + payload


def request_head(encoder: hpack.Encoder, sid: int, path: str, *, end: bool = False,
                 metadata: Iterable[tuple[str, str]] = (), fields: list[tuple[str, str]] | None = None) -> bytes:
    """A gRPC request's HEADERS frame, its block made by ``encoder`` (``fields``: instead of the
    usual pseudo-headers and content-type)."""
    if fields is None:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
                  ("content-type", "application/grpc"), ("te", "trailers")]
    block = encoder.encode([*fields, *metadata])
    return frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid, block)


def settings(*pairs: tuple[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in pairs))


class RawHttp2:
    """One connection; :meth:`read` collects what the server sends."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buffer = bytearray()
        self.frames: list[Frame] = []
        self.answers: dict[int, list[dict[str, str]]] = {}  # each stream's heads, decoded as they came
        self.closed = False

    @classmethod
    async def open(cls, port: int, *, first: bytes = b"", preface: bool = True) -> RawHttp2:
        """Connected to 127.0.0.1:``port``; with ``preface``, the preface and ``first`` (default:
        an empty SETTINGS) sent."""
        raw = cls(await trio.open_tcp_stream("127.0.0.1", port))
        if preface:
            await raw.send(PREFACE + (first or settings()))
        return raw

    def head(self, sid: int, path: str, *, end: bool = False, metadata: Iterable[tuple[str, str]] = (),
             fields: list[tuple[str, str]] | None = None) -> bytes:
        """A request's HEADERS frame (:func:`request_head`, with this connection's encoder)."""
        return request_head(self.encoder, sid, path, end=end, metadata=metadata, fields=fields)

    @staticmethod
    def data(sid: int, payload: bytes, *, end: bool = False) -> bytes:
        """DATA frames of at most 16 KiB carrying ``payload``."""
        pieces = [payload[i:i + 16384] for i in range(0, len(payload), 16384)] or [b""]
        return b"".join(frame(DATA, END_STREAM if end and i == len(pieces) - 1 else 0, sid, piece)
                        for i, piece in enumerate(pieces))

    @staticmethod
    def reset(sid: int, code: int = 8) -> bytes:
        return frame(RST_STREAM, 0, sid, code.to_bytes(4, "big"))

    async def send(self, data: bytes) -> bool:
        """False if the server has closed the connection."""
        try:
            await self.stream.send_all(data)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False

    async def read(self, until: Callable[[Frame], bool] = lambda f: False, timeout: float = 10.0) -> bool:
        """Read frames until one satisfies ``until`` (True), or the connection closes or
        ``timeout`` passes (False)."""
        with trio.move_on_after(timeout):
            while True:
                while len(self.buffer) >= 9:
                    length = int.from_bytes(self.buffer[:3], "big")
                    if len(self.buffer) < 9 + length:
                        break
                    found = (self.buffer[3], self.buffer[4], int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF,
                             bytes(self.buffer[9:9 + length]))
                    del self.buffer[:9 + length]
                    self.frames.append(found)
                    if found[0] == HEADERS:
                        self.answers.setdefault(found[2], []).append(dict(self.decoder.decode(found[3])))
                    if until(found):
                        return True
                if self.closed:
                    return False
                try:
                    data = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    self.closed = True
                else:
                    self.buffer += data
        return False

    async def read_to_close(self, timeout: float = 10.0) -> bool:
        """Whether the server closed the connection within ``timeout``."""
        await self.read(timeout=timeout)
        return self.closed

    def goaway(self) -> tuple[int, bytes] | None:
        """The last GOAWAY's error code and debug text, if one came."""
        for kind, _, _, payload in reversed(self.frames):
            if kind == GOAWAY:
                return int.from_bytes(payload[4:8], "big"), payload[8:]
        return None

    def heads(self, sid: int) -> list[dict[str, str]]:
        """The heads (and trailers) answered on ``sid``, decoded."""
        return self.answers.get(sid, [])

    def status(self, sid: int) -> int | None:
        """``grpc-status`` of ``sid``'s answer, once its trailers came."""
        for head in self.heads(sid):
            if "grpc-status" in head:
                return int(head["grpc-status"])
        return None

    def was_reset(self, sid: int) -> int | None:
        for kind, _, stream, payload in self.frames:
            if kind == RST_STREAM and stream == sid:
                return int.from_bytes(payload, "big")
        return None

    async def aclose(self) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.stream.aclose()


def ended(sid: int) -> Callable[[Frame], bool]:
    """A frame that ends ``sid`` (its trailers, or a reset)."""
    return lambda f: f[2] == sid and ((f[0] == HEADERS and f[1] & END_STREAM) or f[0] == RST_STREAM)


def goaway(f: Frame) -> bool:
    return f[0] == GOAWAY
