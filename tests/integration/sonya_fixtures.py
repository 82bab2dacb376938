"""Helpers for the Sonya facade tests: a real server with a [sonya] section, and thin clients
(httpx for HTTP, the websockets library's threaded client for WebSocket)."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.serverproc import ServerProcess, free_port


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class SonyaServer:
    """A boxqueue process serving Sonya on a free port, and a client for it."""

    def __init__(self, workdir: Path, sonya: str = "", wal_mode: str = "fsync", queue_space: bool = False) -> None:
        self.http_port = free_port()
        extra = (QUEUE_SPACE_0 if queue_space else "") + f'\n[sonya]\nlisten = "127.0.0.1:{self.http_port}"\n{sonya}\n'
        self.proc = ServerProcess(workdir, extra_config=extra, wal_mode=wal_mode, read_only=False)
        self.base = f"http://127.0.0.1:{self.http_port}"
        self.http = httpx.Client(base_url=self.base, timeout=30)

    def start(self) -> SonyaServer:
        self.proc.start()
        wait_for_port(self.http_port)
        return self

    def restart(self) -> None:
        self.http.close()
        self.proc.restart()
        wait_for_port(self.http_port)
        self.http = httpx.Client(base_url=self.base, timeout=30)

    def kill(self) -> None:
        self.http.close()
        self.proc.kill()

    def close(self) -> None:
        self.http.close()
        self.proc.kill()

    # -- calls -------------------------------------------------------------------------------

    def create(self, queue: str, **kw: Any) -> httpx.Response:
        return self.http.post(f"/queue/create/{queue}", **kw)

    def close_queue(self, queue: str, **kw: Any) -> httpx.Response:
        return self.http.post(f"/queue/close/{queue}", **kw)

    def send(self, queue: str, body: Any, **kw: Any) -> httpx.Response:
        return self.http.post(f"/queue/send/{queue}", json=body, **kw)

    def send_ok(self, queue: str, key: str, payload: Any, sequence: int | None = None) -> int:
        body: dict[str, Any] = {"id": key, "payload": payload}
        if sequence is not None:
            body["sequence"] = sequence
        r = self.send(queue, body)
        assert r.status_code == 200, r.text
        assert r.json()["success"] is True, r.text
        return r.json()["sequence_id"]

    def delete(self, queue: str, key: str, **kw: Any) -> httpx.Response:
        return self.http.post(f"/queue/delete/{queue}/{key}", **kw)

    def poll(self, queue: str, key: str | None = None, sequence: Any = None, timeout: float = 30, **kw: Any) -> httpx.Response:
        path = f"/queue/listen/longpoll/{queue}" + (f"/{key}" if key is not None else "")
        params = dict(kw.pop("params", {}))
        if sequence is not None:
            params["sequence"] = str(sequence)
        return self.http.get(path, params=params, timeout=timeout, **kw)

    def history(self, queue: str, key: str | None = None) -> list[tuple[str, int, Any]]:
        """Every stored version (``sequence=first``) as (id, sequence, payload)."""
        r = self.poll(queue, key, "first", timeout=5)
        assert r.status_code == 200, r.text
        return [(m["id"], m["sequence"], m["payload"]) for m in r.json()]

    def ws(self, queue: str, key: str | None = None, query: str = "", **kw: Any) -> ClientConnection:
        path = f"/queue/listen/ws/{queue}" + (f"/{key}" if key is not None else "")
        return connect(f"ws://127.0.0.1:{self.http_port}{path}{query}", open_timeout=10, **kw)


def ws_messages(conn: ClientConnection, count: int, timeout: float = 10) -> list[dict[str, Any]]:
    out = []
    for _ in range(count):
        frame = conn.recv(timeout=timeout)
        assert isinstance(frame, str), "messages are text frames"
        out.append(json.loads(frame))
    return out


class Background:
    """Run a function in a thread and collect its result (for a long-poll that must be waiting
    while the test does something else)."""

    def __init__(self, fn: Any, *args: Any, **kw: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = fn(*args, **kw)
            except BaseException as exc:  # handed to the test by get()
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def get(self, timeout: float = 30) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "still running"
        if self.error is not None:
            raise self.error
        return self.result


def wait_listeners_settle() -> None:
    """Give a long-poll started in a thread time to reach the server and subscribe."""
    time.sleep(0.3)


class RawWebSocket:
    """A WebSocket client on a plain socket with a small receive buffer: it can stop reading
    entirely (a stalled browser tab), then read the frames the server managed to send."""

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise RuntimeError("closed during the handshake")
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        self.status = int(head.split(b" ", 2)[1])

    def frames(self, timeout: float = 20) -> list[tuple[int, bytes]]:
        """Read until the server sends a close frame or closes the connection; (opcode, payload)
        of every frame."""
        self.sock.settimeout(timeout)
        data = bytearray(self.buffer)
        out: list[tuple[int, bytes]] = []
        at = 0
        while True:
            while len(data) - at >= 2:  # every complete frame so far
                opcode, length, start = data[at] & 0x0F, data[at + 1] & 0x7F, at + 2
                if length == 126:
                    length, start = struct.unpack(">H", data[at + 2:at + 4])[0], at + 4
                elif length == 127:
                    length, start = struct.unpack(">Q", data[at + 2:at + 10])[0], at + 10
                if len(data) < start + length:
                    break
                out.append((opcode, bytes(data[start:start + length])))
                at = start + length
            if out and out[-1][0] == 8:
                return out
            try:
                chunk = self.sock.recv(1 << 20)
            except (TimeoutError, ConnectionResetError):
                return out
            if not chunk:
                return out
            data += chunk

    def close(self) -> None:
        self.sock.close()
