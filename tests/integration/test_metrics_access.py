"""Who may see the dashboard and /metrics (HTTP basic over the chap-sha1 users), and the
"recovering" state while a large store is rebuilt at start."""

from __future__ import annotations

import re
import socket
import struct
import time

import httpx
import msgpack
import pytest

from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.serverproc import ServerProcess, free_port

USERS = """
[[users]]
name = "watcher"
password = "look"
grants = [{ privileges = ["read"], object_type = "universe" }]

[[users]]
name = "runner"
password = "run"
grants = [{ privileges = ["execute"], object_type = "universe" }]
"""


def start(tmp_path, extra: str) -> tuple[ServerProcess, int]:
    port = free_port()
    server = ServerProcess(tmp_path / "server", wal_mode="write", read_only=False,
                           extra_config=f'[metrics]\nlisten = "127.0.0.1:{port}"\n{extra}')
    server.start()
    return server, port


@pytest.mark.parametrize("path", ["/metrics", "/", "/api/snapshot", "/dashboard.js"])
def test_users_need_read_on_the_universe(tmp_path, path):
    server, port = start(tmp_path, USERS)
    url = f"http://127.0.0.1:{port}{path}"
    try:
        anonymous = httpx.get(url)
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"].startswith('Basic realm="boxqueue"')
        assert httpx.get(url, auth=("watcher", "wrong")).status_code == 401
        assert httpx.get(url, auth=("nobody", "look")).status_code == 401
        assert httpx.get(url, auth=("admin", "")).status_code == 401  # admin has no password here
        refused = httpx.get(url, auth=("runner", "run"))
        assert refused.status_code == 403 and "no read access" in refused.text
        assert httpx.get(url, auth=("watcher", "look")).status_code == 200
        assert httpx.get(url, headers={"Authorization": "Basic !!!"}).status_code == 401
    finally:
        server.stop()


def test_public_exempts_only_metrics(tmp_path):
    server, port = start(tmp_path, "\n".join(["public = true", USERS]))
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/", auth=("watcher", "look")).status_code == 200
    finally:
        server.stop()


def test_no_users_no_login(tmp_path):
    server, port = start(tmp_path, "")
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 200
        assert "<title>boxqueue dashboard</title>" in httpx.get(f"http://127.0.0.1:{port}/").text
    finally:
        server.stop()


def test_recovering_is_reported_until_the_tubes_are_rebuilt(tmp_path):
    """A store of 150,000 tasks: while the restarted server loads them, /metrics and the
    snapshot say "recovering" (the metrics listener starts before recovery), and the log shows
    the counts; afterwards "ready" with the time recovery took. The tasks are put through
    box.queue.put (the queue space refuses direct writes)."""
    tasks = 150_000
    server, port = start(tmp_path, QUEUE_SPACE_0)
    # box.queue.put(space, tube, delay, ttl, ttr, pri, data...): ready, a day to live.
    _pipelined_calls(server.port, [("box.queue.put", [0, f"tube{i % 50}", 0, 86400, 300, 0, "data"])
                                   for i in range(tasks)])
    server.stop()

    server.launch()
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            time.sleep(0.02)
            continue
        state = re.search(r'^boxqueue_state\{state="(\w+)"\} 1\.0$', text, re.M)
        seen.append(state.group(1) if state else None)
        if state and state.group(1) == "ready":
            break
        time.sleep(0.02)
    server.wait_ready()
    try:
        assert "recovering" in seen, seen[:20]
        assert seen[-1] == "ready"
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert re.search(r"^boxqueue_recovering 0\.0$", text, re.M)
        assert re.search(rf"^boxqueue_recovery_loaded_tasks {tasks}\.0$", text, re.M)
        assert re.search(r"^boxqueue_recovery_seconds \d", text, re.M)
        snapshot = httpx.get(f"http://127.0.0.1:{port}/api/snapshot").json()
        assert snapshot["storage"]["recovery"]["state"] == "done"
        assert snapshot["tubes"]["all"] == 50
        log = server.log()
        assert f"recovering tubes: {tasks:,} tasks to load" in log
        assert f"recovered {tasks:,} tasks in" in log
    finally:
        server.stop()


def _pipelined_calls(port: int, calls: list[tuple[str, list]], window: int = 1000) -> None:
    """CALL each (function, args), ``window`` requests in flight on one connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        received = b""
        while len(received) < 128:
            received += sock.recv(128 - len(received))
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        answered = 0
        items: list = []
        for first in range(0, len(calls), window):
            frames = []
            for sync, (function, args) in enumerate(calls[first:first + window], start=first):
                body = msgpack.packb({0x00: 0x0A, 0x01: sync}) + msgpack.packb({0x22: function, 0x21: args})
                frames.append(b"\xce" + struct.pack(">I", len(body)) + body)
            sock.sendall(b"".join(frames))
            while answered < first + len(frames):
                unpacker.feed(sock.recv(1 << 20))
                items.extend(unpacker)
                while len(items) >= 3:  # an answer is three values: its length, header and body
                    _length, header, _body = items[:3]
                    del items[:3]
                    assert header[0x00] == 0, header
                    answered += 1
