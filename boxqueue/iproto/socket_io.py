"""Socket reads and writes that go through trio's scheduler only when the socket is not ready.

``trio.SocketStream`` yields to the scheduler on every call, even when the data is already there:
that is trio's guarantee of fairness, and it costs a task switch or two per read and per write.
A connection that answers pipelined requests reads and writes once per chunk, so this adapter
calls the socket directly and waits through ``trio.lowlevel`` only when the socket would block.
The caller keeps fairness by checkpointing once per chunk it handles.
"""

from __future__ import annotations

import contextlib
import socket

import trio


class DirectSocket:
    """A second Python socket object on the stream's file descriptor (never closes it)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._sock = socket.socket(fileno=stream.socket.fileno())
        self._sock.setblocking(False)
        self.missed = False  # the last receive found nothing to read at first

    async def receive(self, max_bytes: int) -> bytes:
        sock = self._sock
        try:
            data = sock.recv(max_bytes)
        except BlockingIOError:
            self.missed = True
        else:
            self.missed = False
            return data
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                return sock.recv(max_bytes)
            except BlockingIOError:
                pass

    async def receive_when_ready(self, max_bytes: int) -> bytes:
        """:meth:`receive` after the last read emptied the socket: wait for data first, rather
        than try a read that would fail (a system call and an exception saved per request when
        clients send one request at a time; ``missed`` tells the caller when that is so). The
        wait is a checkpoint."""
        await trio.lowlevel.wait_readable(self._sock)
        return await self.receive(max_bytes)

    async def send_all(self, data: bytes) -> None:
        sock = self._sock
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return
        view = memoryview(data)
        while sent < len(view):
            await trio.lowlevel.wait_writable(sock)
            with contextlib.suppress(BlockingIOError):
                sent += sock.send(view[sent:])

    def send_some(self, data: bytes | bytearray) -> int:
        """Send what the socket takes now, without waiting: how many bytes it took (OSError
        when the connection is broken)."""
        try:
            return self._sock.send(data)
        except BlockingIOError:
            return 0

    def detach(self) -> None:
        """Forget the descriptor; the trio stream closes it."""
        self._sock.detach()


class StreamIO:
    """The same calls over any trio stream (a TLS one, whose bytes must pass through OpenSSL):
    every call goes through trio. A broken stream reads as its end, as a reset socket does."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self.missed = False  # not known: every call goes through trio

    async def receive(self, max_bytes: int) -> bytes:
        try:
            return await self._stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    receive_when_ready = receive  # every call already goes through trio

    async def send_all(self, data: bytes) -> None:
        await self._stream.send_all(data)

    def detach(self) -> None:
        """Nothing to forget: the stream is closed by its owner."""
