"""Helpers for the box.queue integration tests: the queue spaces' configuration, a thin wrapper over
the ``tarantool`` connector and a pipelining iproto client (many requests in flight on one
connection, answered out of order by sync)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import msgpack
import tarantool
from tarantool.error import DatabaseError

# The [[space]] block of conf/boxqueue.toml (space 0 "queue"), copied verbatim.
QUEUE_SPACE_0 = """
[[space]]
id = 0
name = "queue"
format = [
  { name = "id", type = "string" },          # 0: task id, 32 hex chars
  { name = "tube", type = "string" },        # 1: queue name
  { name = "status", type = "string" },      # 2: r, d, t, b or *
  { name = "event", type = "unsigned" },     # 3: next event, microseconds since the epoch
  { name = "ipri", type = "unsigned" },      # 4: internal priority
  { name = "pri", type = "unsigned" },       # 5: stored priority (inverted)
  { name = "cid", type = "unsigned" },       # 6: session holding the task, 0 for none
  { name = "created", type = "unsigned" },   # 7: microseconds since the epoch
  { name = "ttl", type = "unsigned" },       # 8: microseconds, from `created`
  { name = "ttr", type = "unsigned" },       # 9: microseconds
  { name = "cbury", type = "unsigned" },     # 10: times buried
  { name = "ctaken", type = "unsigned" },    # 11: times taken
]                                            # 12...: task data
indexes = [
  { name = "task_id", type = "TREE", unique = true, parts = [[0, "string"]] },
  { name = "tube_status", type = "TREE", unique = false, parts = [
    [1, "string"], [2, "string"], [4, "unsigned"], [5, "unsigned"],
  ] },
  { name = "tube_event", type = "TREE", unique = false, parts = [[1, "string"], [3, "unsigned"]] },
  # For queue.put_unique; the data field may be absent, so tasks without data are still accepted.
  { name = "put_unique", type = "TREE", unique = false, parts = [
    [1, "string"], [2, "string"], { field = 12, type = "scalar", is_nullable = true },
  ] },
]
"""

# Space 1: a second queue space without the put_unique index (D4, D12); space 2: not a queue space.
OTHER_SPACES = """
[[space]]
id = 1
name = "queue_plain"
indexes = [
  { name = "task_id", type = "TREE", unique = true, parts = [[0, "string"]] },
  { name = "tube_status", type = "TREE", unique = false, parts = [
    [1, "string"], [2, "string"], [4, "unsigned"], [5, "unsigned"],
  ] },
  { name = "tube_event", type = "TREE", unique = false, parts = [[1, "string"], [3, "unsigned"]] },
]

[[space]]
id = 2
name = "not_a_queue"
indexes = [{ name = "pk", type = "TREE", unique = true, parts = [[0, "string"]] }]
"""

QUEUE_CONFIG = QUEUE_SPACE_0 + OTHER_SPACES

IPROTO_CALL = 0x0A
IPROTO_CALL_16 = 0x06
ER_PROC_LUA = 32
ER_NO_SUCH_PROC = 33
ER_NO_SUCH_SPACE = 36


class Q:
    """One connection (one session) calling the queue functions by their short names."""

    def __init__(self, port: int, *, prefix: str = "box.queue.", call_16: bool = False) -> None:
        self.conn = tarantool.Connection("127.0.0.1", port, call_16=call_16)
        self.prefix = prefix

    def __call__(self, fn: str, *args: Any) -> list[Any]:
        return self.conn.call(self.prefix + fn, list(args)).data

    def task(self, fn: str, *args: Any) -> list[Any]:
        """A function that returns one task tuple: the tuple."""
        data = self(fn, *args)
        assert len(data) == 1, data
        return list(data[0])

    def error(self, fn: str, *args: Any) -> tuple[int, str]:
        try:
            data = self(fn, *args)
        except DatabaseError as exc:
            return exc.code, exc.message
        raise AssertionError(f"{fn}{args} succeeded with {data!r}")

    def meta(self, space: int, task_id: str) -> dict[str, Any]:
        (row,) = self("meta", space, task_id)
        names = ("id", "tube", "status", "event", "ipri", "pri", "cid", "created", "ttl", "ttr",
                 "cbury", "ctaken", "now")
        assert len(row) == len(names), row
        return dict(zip(names, row, strict=True))

    def stats(self, *args: Any) -> dict[str, Any]:
        (flat,) = self("statistics", *args)
        return as_map(flat)

    def sid(self) -> int:
        return self.conn.call("box.session.id").data[0]

    def close(self) -> None:
        self.conn.close()


def as_map(flat: list[Any]) -> dict[str, Any]:
    assert len(flat) % 2 == 0, flat
    keys = flat[0::2]
    assert len(set(keys)) == len(keys), f"duplicate statistics keys: {flat}"
    return dict(zip(keys, flat[1::2], strict=True))


class RawIproto:
    """A bare pipelining iproto client: send many requests, read answers in any order."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.greeting = self._read_exact(128)
        self.buffer = b""
        self.next_sync = 1
        self.stash: dict[int, tuple[int, Any]] = {}

    def _read_exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the server")
            data += chunk
        return data

    def frame_call(self, fn: str, args: list[Any], *, call_16: bool = False, sync: int | None = None) -> tuple[int, bytes]:
        if sync is None:
            sync = self.next_sync
            self.next_sync += 1
        header = {0x00: IPROTO_CALL_16 if call_16 else IPROTO_CALL, 0x01: sync}
        body = {0x22: fn, 0x21: args}
        payload = msgpack.packb(header) + msgpack.packb(body)
        return sync, b"\xce" + len(payload).to_bytes(4, "big") + payload

    def send_call(self, fn: str, args: list[Any], *, call_16: bool = False) -> int:
        sync, packet = self.frame_call(fn, args, call_16=call_16)
        self.sock.sendall(packet)
        return sync

    def send_many(self, calls: list[tuple[str, list[Any]]]) -> list[int]:
        """All the calls in one write; returns their syncs."""
        syncs, packets = [], []
        for fn, args in calls:
            sync, packet = self.frame_call(fn, args)
            syncs.append(sync)
            packets.append(packet)
        self.sock.sendall(b"".join(packets))
        return syncs

    def _parse_one(self) -> tuple[int, int, Any] | None:
        if len(self.buffer) < 5:
            return None
        assert self.buffer[0] == 0xCE
        size = int.from_bytes(self.buffer[1:5], "big")
        if len(self.buffer) < 5 + size:
            return None
        payload, self.buffer = self.buffer[5:5 + size], self.buffer[5 + size:]
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(payload)
        header, body = list(unpacker)
        code = header[0x00]
        if code == 0:
            return header[0x01], 0, body.get(0x30)
        return header[0x01], code & 0x7FFF, body.get(0x31)

    def receive(self, timeout: float) -> tuple[int, int, Any] | None:
        """The next answer (sync, error code or 0, data or error message), None after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            parsed = self._parse_one()
            if parsed is not None:
                return parsed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not chunk:
                raise ConnectionError("closed by the server")
            self.buffer += chunk

    def wait_for(self, sync: int, timeout: float = 10.0) -> tuple[int, Any]:
        """The answer to ``sync``; answers to other requests are kept for :meth:`pop`."""
        deadline = time.monotonic() + timeout
        while sync not in self.stash:
            answer = self.receive(deadline - time.monotonic())
            if answer is None:
                raise TimeoutError(f"no answer to sync {sync}")
            self.stash[answer[0]] = answer[1:]
        return self.stash.pop(sync)

    def call(self, fn: str, args: list[Any], timeout: float = 10.0) -> Any:
        code, data = self.wait_for(self.send_call(fn, args), timeout)
        assert code == 0, (code, data)
        return data

    def close(self) -> None:
        self.sock.close()


def poll(predicate: Callable[[], Any], timeout: float, interval: float = 0.005) -> Any:
    """Call ``predicate`` until it returns something true; that value, or the last one at timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
