"""/metrics after known traffic: exact counts, parsed with prometheus_client's own parser.

Every figure is a difference between two scrapes around the traffic (the connector's own schema
requests happen before the first), except the tube figures of tubes that did not exist before."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid

import httpx
import msgpack
import pytest
import tarantool
import websockets
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.serverproc import ServerProcess, free_port

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int, **kwargs) -> Samples:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30, **kwargs)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    return samples.get((metric, frozenset(labels.items())), 0.0)


def delta(before: Samples, after: Samples, metric: str, /, **labels: str) -> float:
    return value(after, metric, **labels) - value(before, metric, **labels)


@pytest.fixture
def served(tmp_path):
    ports = {name: free_port() for name in ("metrics", "zaqar", "sonya", "admin")}
    server = ServerProcess(
        tmp_path / "server",
        wal_mode="write",
        read_only=False,
        admin_port=ports["admin"],
        extra_config=QUEUE_SPACE_0 + f"""
[metrics]
listen = "127.0.0.1:{ports['metrics']}"

[zaqar]
listen = "127.0.0.1:{ports['zaqar']}"

[sonya]
listen = "127.0.0.1:{ports['sonya']}"
""",
    )
    server.start()
    try:
        yield server, ports
    finally:
        server.stop()


def console(port: int, *statements: str) -> list[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.recv(128)
        answers = []
        for statement in statements:
            sock.sendall(statement.encode() + b"\n")
            data = b""
            while not data.endswith(b"\n...\n"):
                chunk = sock.recv(65536)
                assert chunk, "the console closed"
                data += chunk
            answers.append(data.decode())
        return answers


def test_exact_counts_after_known_traffic(served):
    server, ports = served
    conn = tarantool.connect("127.0.0.1", server.port)
    before = scrape(ports["metrics"])

    # iproto: 5 puts; take A, take B, ack A, release B, take C, bury C; an ack of a missing task.
    for i in range(5):
        conn.call("box.queue.put", [0, "emails", 0, 0, 0, 0, f"task {i}"])
    a = conn.call("box.queue.take", [0, "emails", 1])[0][0]
    b = conn.call("box.queue.take", [0, "emails", 1])[0][0]
    conn.call("box.queue.ack", [0, a])
    conn.call("box.queue.release", [0, b])
    c = conn.call("box.queue.take", [0, "emails", 1])[0][0]
    conn.call("box.queue.bury", [0, c])
    with pytest.raises(tarantool.DatabaseError):
        conn.call("box.queue.ack", [0, "no-such-task"])
    # A task that expires: ttl 1 s.
    conn.call("box.queue.put", [0, "short", 0, 1, 0, 0, "soon gone"])

    # Zaqar: create a queue, post two messages, ask for a message that does not exist (404).
    headers = {"Client-ID": str(uuid.uuid4()), "X-Project-Id": "demo"}
    zaqar = f"http://127.0.0.1:{ports['zaqar']}/v1.1/queues/jobs"
    assert httpx.put(zaqar, headers=headers, json={}).status_code == 201
    assert httpx.post(zaqar + "/messages", headers=headers,
                      json={"messages": [{"ttl": 300, "body": 1}, {"ttl": 300, "body": 2}]}).status_code == 201
    assert httpx.get(zaqar + "/messages/" + "0" * 32, headers=headers).status_code == 404

    # Sonya: a queue, one WebSocket listener, two sends fanned out to it.
    sonya = f"http://127.0.0.1:{ports['sonya']}/queue"
    assert httpx.post(f"{sonya}/create/news").status_code == 201

    async def listen_and_send() -> list[str]:
        async with websockets.connect(f"ws://127.0.0.1:{ports['sonya']}/queue/listen/ws/news") as ws:
            async with httpx.AsyncClient() as client:
                for n in range(2):
                    sent = await client.post(f"{sonya}/send/news", json={"id": "k", "payload": {"n": n}})
                    assert sent.status_code == 200
            return [await asyncio.wait_for(ws.recv(), 10) for _ in range(2)]

    assert len(asyncio.run(listen_and_send())) == 2

    # Console: one statement that works, one that fails.
    answers = console(ports["admin"], "return 1 + 1", "error('boom')")
    assert "- 2" in answers[0] and "boom" in answers[1]

    time.sleep(2.5)  # the short task expires
    after = scrape(ports["metrics"])

    # iproto requests by operation and outcome, errors by code, tnt_* names.
    assert delta(before, after, "boxqueue_api_requests_total", api="iproto", operation="call", outcome="ok") == 12
    assert delta(before, after, "boxqueue_api_requests_total", api="iproto", operation="call", outcome="error") == 1
    assert delta(before, after, "boxqueue_api_errors_total", api="iproto", code="32") == 1  # ER_PROC_LUA
    assert delta(before, after, "tnt_stats_op_total", operation="call") == 13
    assert delta(before, after, "tnt_stats_op_total", operation="error") == 1
    assert delta(before, after, "tnt_net_requests_total") == 13
    assert value(after, "tnt_net_connections_current") == 1
    # iproto's latency is sampled (see test_iproto_latency_is_sampled_per_chunk).
    assert value(after, "boxqueue_api_request_duration_seconds_bucket", api="iproto", le="+Inf") == \
        value(after, "boxqueue_api_request_duration_seconds_count", api="iproto")

    # The tube's counters and depth by state.
    tube = {"space": "queue", "tube": "emails", "kind": "box.queue"}
    assert value(after, "boxqueue_tube_puts_total", **tube) == 5
    assert value(after, "boxqueue_tube_takes_total", **tube) == 3
    assert value(after, "boxqueue_tube_acks_total", **tube) == 1
    assert value(after, "boxqueue_tube_releases_total", **tube) == 1
    assert value(after, "boxqueue_tube_buries_total", **tube) == 1
    assert value(after, "boxqueue_tube_expiries_total", **tube) == 0
    assert value(after, "boxqueue_tube_tasks", state="ready", **tube) == 3
    assert value(after, "boxqueue_tube_tasks", state="buried", **tube) == 1
    assert value(after, "boxqueue_tube_tasks", state="taken", **tube) == 0
    assert value(after, "boxqueue_tube_waiting_takes", **tube) == 0
    assert value(after, "boxqueue_tube_oldest_ready_age_seconds", **tube) > 0
    # A tube that holds nothing is forgotten: its series go until it is used again (its counters
    # then go on where they were); the space's totals keep counting.
    short = {"space": "queue", "tube": "short", "kind": "box.queue"}
    assert ("boxqueue_tube_expiries_total", frozenset(short.items())) not in after
    conn.call("box.queue.put", [0, "short", 0, 0, 0, 0, "back"])
    again = scrape(ports["metrics"])
    assert value(again, "boxqueue_tube_expiries_total", **short) == 1
    assert value(again, "boxqueue_tube_puts_total", **short) == 2
    assert value(again, "boxqueue_tube_tasks", state="ready", **short) == 1
    assert value(after, "boxqueue_space_tasks_total", space="queue", event="puts") == 6
    assert value(after, "boxqueue_space_tasks_total", space="queue", event="expiries") == 1
    assert value(after, "tnt_space_len", name="queue", engine="memtx") == 4

    # Zaqar: by handler and status.
    assert delta(before, after, "boxqueue_api_requests_total", api="zaqar", operation="put_queue", outcome="ok") == 1
    assert delta(before, after, "boxqueue_api_requests_total", api="zaqar", operation="post_messages", outcome="ok") == 1
    assert delta(before, after, "boxqueue_api_requests_total", api="zaqar", operation="get_message",
                 outcome="error") == 1
    assert delta(before, after, "boxqueue_api_errors_total", api="zaqar", code="404") == 1
    assert value(after, "boxqueue_tube_puts_total", space="zaqar", tube="demo/jobs", kind="zaqar") == 2
    assert delta(before, after, "boxqueue_api_request_duration_seconds_count", api="zaqar") == 3

    # Sonya: the create, two sends and the listener's handshake; its fan-out.
    assert delta(before, after, "boxqueue_api_requests_total", api="sonya", operation="create", outcome="ok") == 1
    assert delta(before, after, "boxqueue_api_requests_total", api="sonya", operation="send", outcome="ok") == 2
    assert delta(before, after, "boxqueue_api_requests_total", api="sonya", operation="websocket", outcome="ok") == 1
    assert delta(before, after, "boxqueue_sonya_messages_total") == 2
    assert delta(before, after, "boxqueue_sonya_deliveries_total") == 2
    assert delta(before, after, "boxqueue_sonya_subscriptions_total") == 1
    assert value(after, "boxqueue_sonya_listeners_ended_total", reason="overflow") == 0

    # Console statements and the Lua jobs they ran.
    assert delta(before, after, "boxqueue_api_requests_total", api="console", operation="statement", outcome="ok") == 1
    assert delta(before, after, "boxqueue_api_requests_total", api="console", operation="statement",
                 outcome="error") == 1
    assert delta(before, after, "boxqueue_api_connections_total", api="console") == 1
    assert delta(before, after, "boxqueue_lua_jobs_total") == 2
    assert delta(before, after, "boxqueue_lua_failed_jobs_total") == 1
    assert value(after, "tnt_info_memory_lua") > 0

    # Storage: one observation per commit in both histograms.
    commits = value(after, "boxqueue_commits_total")
    assert commits > 0
    assert value(after, "boxqueue_commit_batch_size_count") == commits
    assert value(after, "boxqueue_commit_duration_seconds_count") == commits
    assert value(after, "boxqueue_commit_batch_size_sum") == value(after, "boxqueue_commit_writes_total")
    assert value(after, "boxqueue_lmdb_used_bytes") > 0
    assert value(after, "boxqueue_lmdb_map_size_bytes") >= value(after, "boxqueue_lmdb_used_bytes")
    assert value(after, "boxqueue_state", state="ready") == 1
    assert value(after, "boxqueue_recovering") == 0
    assert value(after, "tnt_info_uptime") > 0
    conn.close()


def test_a_waiting_take_shows(served):
    server, ports = served
    conn = tarantool.connect("127.0.0.1", server.port)
    conn.call("box.queue.put", [0, "idle", 0, 0, 0, 0, "x"])
    conn.call("box.queue.take", [0, "idle", 1])
    waiter = tarantool.connect("127.0.0.1", server.port)
    import threading

    thread = threading.Thread(target=lambda: waiter.call("box.queue.take", [0, "idle", 3]))
    thread.start()
    try:
        tube = {"space": "queue", "tube": "idle", "kind": "box.queue"}
        deadline = time.monotonic() + 10
        while value(scrape(ports["metrics"]), "boxqueue_tube_waiting_takes", **tube) != 1:
            assert time.monotonic() < deadline, "the waiting take never showed"
            time.sleep(0.1)
    finally:
        thread.join()
    assert value(scrape(ports["metrics"]), "boxqueue_tube_waiting_takes", **tube) == 0
    conn.close()
    waiter.close()


def test_snapshot_json_pages_and_searches(served):
    server, ports = served
    conn = tarantool.connect("127.0.0.1", server.port)
    for i in range(7):
        conn.call("box.queue.put", [0, f"t{i}", 0, 0, 0, 0, "x"])
    base = f"http://127.0.0.1:{ports['metrics']}/api/snapshot"
    page = httpx.get(base, params={"size": 3, "page": 1}).json()
    assert page["state"] == "ready"
    assert page["tubes"]["all"] == 7 and page["tubes"]["matching"] == 7
    assert [r["tube"] for r in page["tubes"]["rows"]] == ["t3", "t4", "t5"]
    found = httpx.get(base, params={"q": "T6"}).json()["tubes"]
    assert found["matching"] == 1 and found["rows"][0]["states"]["ready"] == 1
    assert found["rows"][0]["tally"]["puts"] == 1
    conn.close()


def test_iproto_latency_is_sampled_per_chunk(served):
    """One chunk in 16 is timed, the first of each connection included, and every request in a
    timed chunk is observed: those answered at once, and writes once they are committed."""
    server, ports = served

    def frame(request_type: int, sync: int, body: dict) -> bytes:
        packed = msgpack.packb({0x00: request_type, 0x01: sync}) + msgpack.packb(body)
        return b"\xce" + struct.pack(">I", len(packed)) + packed

    def ping(sync: int) -> bytes:
        return frame(64, sync, {})

    def put(sync: int) -> bytes:
        return frame(10, sync, {0x22: "box.queue.put", 0x21: [0, "sampled", 0, 0, 0, 0, sync]})

    def send_and_read(sock: socket.socket, data: bytes, answers: int) -> None:
        sock.sendall(data)  # one write: the server reads it as one chunk
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        items: list = []
        while len(items) < 3 * answers:
            unpacker.feed(sock.recv(65536))
            items.extend(unpacker)
        assert all(header[0x00] == 0 for header in items[1::3]), items

    before = scrape(ports["metrics"])
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.recv(128)
        send_and_read(sock, b"".join(ping(i) for i in range(10)), 10)  # chunk 1, timed: 10
        for i in range(15):
            send_and_read(sock, ping(100 + i), 1)  # chunks 2-16
        send_and_read(sock, b"".join(put(200 + i) for i in range(5)), 5)  # chunk 17, timed: 5 writes
        for i in range(15):
            send_and_read(sock, ping(300 + i), 1)  # chunks 18-32
        send_and_read(sock, ping(400), 1)  # chunk 33, timed
    after = scrape(ports["metrics"])
    assert delta(before, after, "boxqueue_api_request_duration_seconds_count", api="iproto") == 16
    assert delta(before, after, "tnt_net_requests_total") == 10 + 15 + 5 + 15 + 1
    assert value(after, "boxqueue_tube_puts_total", space="queue", tube="sampled", kind="box.queue") == 5


def test_sigterm_ends_an_open_event_stream(served):
    """A dashboard left open does not hold the server up: SIGTERM ends its stream and the server
    exits 0 (within the HTTP stacks' grace period)."""
    server, ports = served
    with httpx.stream("GET", f"http://127.0.0.1:{ports['metrics']}/api/events", timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        first = next(line for line in lines if line)
        assert first.startswith("data: {") and '"state":"ready"' in first
        second = next(line for line in lines if line)  # a snapshot a second
        assert second.startswith("data: {")
        started = time.monotonic()
        assert server.stop() == 0
    assert time.monotonic() - started < 10
