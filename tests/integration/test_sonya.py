"""The Sonya facade against the real server: every endpoint and decision S1-S11 (spec sonya.md)."""

from __future__ import annotations

import contextlib
import itertools
import json
import struct
import time
import uuid

import httpx
import pytest
import tarantool
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.integration.conftest import ours_only
from tests.integration.sonya_fixtures import (
    Background,
    RawWebSocket,
    SonyaServer,
    wait_for_port,
    ws_messages,
)

pytestmark = ours_only()

SETTLE_S = 0.5  # time for a long-poll started in a thread to reach the server and subscribe


@pytest.fixture(scope="module")
def sonya(tmp_path_factory):
    """One open-mode server for the tests that do not restart it; each test uses its own queues."""
    srv = SonyaServer(
        tmp_path_factory.mktemp("sonya"),
        'longpoll_max_wait_s = 3\ntask_events = ["emails"]',
        queue_space=True,
    ).start()
    yield srv
    srv.proc.stop()
    srv.http.close()


def fresh_queue(srv: SonyaServer) -> str:
    name = "q" + uuid.uuid4().hex[:10]
    r = srv.create(name)
    assert (r.status_code, r.json()) == (201, {"success": True})
    return name


# -- create / close / send / delete -----------------------------------------------------------


def test_create_is_201_and_idempotent_keeping_history(sonya):
    q = fresh_queue(sonya)
    assert r_ok(sonya.send(q, {"id": "a", "payload": 1})) == {"success": True, "sequence_id": 1}
    again = sonya.create(q)
    assert (again.status_code, again.json(), again.headers["content-type"]) == (201, {"success": True}, "application/json")
    assert sonya.history(q, "a") == [("a", 1, 1)]


def r_ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def test_sequences_per_queue_and_id_exact_ids(sonya):
    q = fresh_queue(sonya)
    got = [sonya.send_ok(q, k, i) for i, k in enumerate(["1", "10", "1", "1x", "1", "10"])]
    assert got == [1, 1, 2, 1, 3, 2]
    # No prefix collisions: id "1" sees only its own versions, in every read mode.
    assert sonya.history(q, "1") == [("1", 1, 0), ("1", 2, 2), ("1", 3, 4)]
    assert r_ok(sonya.poll(q, "1", "last")) == [{"id": "1", "sequence": 3, "payload": 4}]
    assert [m["sequence"] for m in r_ok(sonya.poll(q, "1", 2))] == [2, 3]
    # Another queue numbers the same ids from 1 again.
    q2 = fresh_queue(sonya)
    assert sonya.send_ok(q2, "1", "x") == 1
    # The empty id is an ordinary exact id.
    assert sonya.send_ok(q, "", "e") == 1
    assert sonya.history(q, "1")[-1] == ("1", 3, 4)


def test_send_to_missing_queue_is_success_false_and_creates_nothing(sonya):
    r = sonya.send("never" + uuid.uuid4().hex, {"id": "a", "payload": {}})
    assert (r.status_code, r.json()) == (200, {"success": False})
    assert sonya.poll("never" + uuid.uuid4().hex, timeout=5).status_code == 404


def test_custom_sequence_is_stored_as_given_and_leaves_the_counter(sonya):
    q = fresh_queue(sonya)
    assert sonya.send_ok(q, "k", "a") == 1
    assert sonya.send_ok(q, "k", "custom", sequence=999) == 999
    assert sonya.send_ok(q, "k", "b") == 2
    assert sonya.send_ok(q, "k", "big", sequence=2**64 - 1) == 2**64 - 1
    assert sonya.send_ok(q, "k", "over", sequence=999) == 999  # same sequence: overwritten
    assert sonya.history(q, "k") == [("k", 1, "a"), ("k", 2, "b"), ("k", 999, "over"), ("k", 2**64 - 1, "big")]
    assert r_ok(sonya.poll(q, "k", "last"))[0]["sequence"] == 2**64 - 1  # highest, not newest
    assert r_ok(sonya.send(q, {"id": "k", "payload": 0, "sequence": None}))["sequence_id"] == 3


def test_payload_any_json_and_unknown_fields_ignored(sonya):
    q = fresh_queue(sonya)
    payloads = [{"z": 1, "a": [1, 2.5, None]}, [1, "x"], "text", 12345678901234567890, True, None, "ünï"]
    for p in payloads:
        r = sonya.send(q, {"id": "p", "payload": p, "sequence_id": 77, "extra": 1})
        assert r_ok(r)["success"] is True
    assert [v[2] for v in sonya.history(q, "p")] == payloads
    assert [v[1] for v in sonya.history(q, "p")] == list(range(1, len(payloads) + 1))


@pytest.mark.parametrize(
    ("headers", "content", "status", "text"),
    [
        ({}, b'{"id":"a","payload":1}', 400, "Content type error"),
        ({"content-type": "text/plain"}, b'{"id":"a","payload":1}', 400, "Content type error"),
        ({"content-type": "application/json"}, b'{"id":"a","payload":', 400, "Json deserialize error"),
        ({"content-type": "application/json"}, b"[1,2]", 400, "Json deserialize error"),
        ({"content-type": "application/json"}, b'{"payload":1}', 400, "Json deserialize error: missing field `id`"),
        ({"content-type": "application/json"}, b'{"id":1,"payload":1}', 400, "Json deserialize error"),
        ({"content-type": "application/json"}, b'{"id":"a"}', 400, "Json deserialize error: missing field `payload`"),
        ({"content-type": "application/json"}, b'{"id":"a","payload":1,"sequence":0}', 400, "Json deserialize error"),
        ({"content-type": "application/json"}, b'{"id":"a","payload":1,"sequence":-1}', 400, "Json deserialize error"),
        ({"content-type": "application/json"}, b'{"id":"a","payload":1,"sequence":1.5}', 400, "Json deserialize error"),
        ({"content-type": "application/json"}, b'{"id":"a","payload":1,"sequence":"5"}', 400, "Json deserialize error"),
        ({"content-type": "application/json"}, b'{"id":"a","payload":1,"sequence":18446744073709551616}', 400, "Json deserialize error"),
        ({"content-type": "application/json"}, b'{"id":"a","payload":NaN}', 400, "Json deserialize error"),
        ({"content-type": "application/json"}, b'{"id":"a","payload":1,"sequence":true}', 400, "Json deserialize error"),
        ({"content-type": "application/json"}, b"\xff\xfe", 400, "Json deserialize error"),
    ],
)
def test_bad_send_bodies_are_refused_and_store_nothing(sonya, headers, content, status, text):
    q = fresh_queue(sonya)
    r = sonya.http.post(f"/queue/send/{q}", content=content, headers=headers)
    assert r.status_code == status
    assert r.text.startswith(text), r.text
    assert r.headers["content-type"].startswith("text/plain")
    assert sonya.send_ok(q, "a", "ok") == 1  # no number was used up, the server goes on
    assert sonya.history(q) == [("a", 1, "ok")]  # and nothing was stored


def test_json_suffix_content_types_are_accepted(sonya):
    q = fresh_queue(sonya)
    for ct in ("application/json; charset=utf-8", "application/vnd.api+json", "Application/JSON"):
        r = sonya.http.post(f"/queue/send/{q}", content=b'{"id":"a","payload":1}', headers={"content-type": ct})
        assert r_ok(r)["success"] is True
    assert len(sonya.history(q, "a")) == 3


def test_body_over_2_mib_is_413_and_not_stored(sonya):
    q = fresh_queue(sonya)
    big = json.dumps({"id": "a", "payload": "x" * (2 * 1024 * 1024)}).encode()
    r = sonya.http.post(f"/queue/send/{q}", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    # Chunked, without a length: the limit holds while reading.
    r = sonya.http.post(f"/queue/send/{q}", content=iter([big[:1000], big[1000:]]), headers={"content-type": "application/json"})
    assert r.status_code == 413
    just_under = json.dumps({"id": "a", "payload": "x" * (2 * 1024 * 1024 - 100)}).encode()
    r = sonya.http.post(f"/queue/send/{q}", content=just_under, headers={"content-type": "application/json"})
    assert r_ok(r)["sequence_id"] == 1
    assert [(k, seq) for k, seq, _ in sonya.history(q)] == [("a", 1)]  # the 413s stored nothing


def test_wrong_method_is_405_and_unknown_path_404(sonya):
    q = fresh_queue(sonya)
    assert sonya.http.get(f"/queue/create/{q}").status_code == 405
    assert sonya.http.get(f"/queue/send/{q}").status_code == 405
    assert sonya.http.post(f"/queue/listen/longpoll/{q}").status_code == 405
    assert sonya.http.post(f"/queue/listen/longpoll/{q}/a").status_code == 405
    assert sonya.http.post(f"/queue/create/{q}/").status_code == 404
    # generate_jwt exists only in secure mode.
    assert sonya.http.post(f"/queue/generate_jwt/{q}/a").status_code == 404
    sonya.send_ok(q, "marker", 1)
    assert sonya.history(q) == [("marker", 1, 1)]  # the refused calls stored nothing


def test_close_drops_history_keeps_counters(sonya):
    q = fresh_queue(sonya)
    sonya.send_ok(q, "a", 1)
    sonya.send_ok(q, "a", 2)
    waiting = Background(sonya.poll, q, "a")
    waiting_all = Background(sonya.poll, q)
    time.sleep(SETTLE_S)
    r = sonya.close_queue(q)
    assert (r.status_code, r.json()) == (200, {"success": True})
    assert waiting.get().json() == [] and waiting_all.get().json() == []
    assert sonya.poll(q, timeout=5).status_code == 404
    assert sonya.poll(q, "a", "first", timeout=5).text == "Queue Not Found"
    assert sonya.send(q, {"id": "a", "payload": 3}).json() == {"success": False}
    assert sonya.close_queue(q).json() == {"success": False}
    sonya.create(q)
    assert sonya.send_ok(q, "a", 3) == 3
    assert sonya.history(q) == [("a", 3, 3)]  # the old history is gone


def test_delete_purges_one_id_keeps_counter_and_others(sonya):
    q = fresh_queue(sonya)
    for k in ("a", "a", "b"):
        sonya.send_ok(q, k, k)
    by_id = Background(sonya.poll, q, "a")
    whole = Background(sonya.poll, q)
    time.sleep(SETTLE_S)
    r = sonya.delete(q, "a")
    assert (r.status_code, r.json()) == (200, {"success": True})
    assert by_id.get().json() == []  # the by-id poll ends empty
    assert sonya.history(q) == [("b", 1, "b")]
    assert sonya.send_ok(q, "a", "again") == 3  # counter kept
    assert whole.get().json() == [{"id": "a", "sequence": 3, "payload": "again"}]  # unaffected


def test_delete_on_missing_queue_is_false_and_creates_nothing(sonya):
    q = "gone" + uuid.uuid4().hex
    r = sonya.delete(q, "a")
    assert (r.status_code, r.json()) == (200, {"success": False})
    assert sonya.poll(q, timeout=5).status_code == 404


# -- long-poll --------------------------------------------------------------------------------


def test_longpoll_by_id_sequence_modes(sonya):
    q = fresh_queue(sonya)
    for i in range(1, 5):
        sonya.send_ok(q, "k", {"n": i})
    assert [m["sequence"] for m in r_ok(sonya.poll(q, "k", 2))] == [2, 3, 4]
    assert [m["sequence"] for m in r_ok(sonya.poll(q, "k", "first"))] == [1, 2, 3, 4]
    assert r_ok(sonya.poll(q, "k", "last")) == [{"id": "k", "sequence": 4, "payload": {"n": 4}}]
    r = sonya.poll(q, "k", 3)
    assert r.headers["content-type"] == "application/json"
    # Past the newest: waits for the next live message, which is delivered whatever its number.
    later = Background(sonya.poll, q, "k", 10)
    time.sleep(SETTLE_S)
    sonya.send_ok(q, "k", "live")
    assert later.get().json() == [{"id": "k", "sequence": 5, "payload": "live"}]


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "Last", "", "18446744073709551616", "1.5"])
def test_invalid_sequence_param_means_live_only(sonya, bad):
    q = fresh_queue(sonya)
    sonya.send_ok(q, "k", "old")
    waiting = Background(sonya.poll, q, "k", bad)
    time.sleep(SETTLE_S)
    sonya.send_ok(q, "k", "new")
    assert [m["payload"] for m in waiting.get().json()] == ["new"]


def test_repeated_sequence_param_means_live_only(sonya):
    q = fresh_queue(sonya)
    sonya.send_ok(q, "k", "old")
    waiting = Background(lambda: sonya.http.get(f"/queue/listen/longpoll/{q}/k?sequence=1&sequence=1"))
    time.sleep(SETTLE_S)
    sonya.send_ok(q, "k", "new")
    assert [m["payload"] for m in waiting.get().json()] == ["new"]


def test_longpoll_whole_queue_preloads(sonya):
    q = fresh_queue(sonya)
    for k, p in [("b", 1), ("a", 2), ("b", 3), ("a", 4), ("a", 5), ("c", 6)]:
        sonya.send_ok(q, k, p)
    ids = lambda ms: [(m["id"], m["sequence"]) for m in ms]  # noqa: E731
    assert ids(r_ok(sonya.poll(q, None, "first"))) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1)]
    assert ids(r_ok(sonya.poll(q, None, "last"))) == [("a", 3), ("b", 2), ("c", 1)]
    assert ids(r_ok(sonya.poll(q, None, 2))) == [("a", 2), ("a", 3), ("b", 2)]


def test_longpoll_max_wait_answers_empty(sonya):
    q = fresh_queue(sonya)
    started = time.monotonic()
    r = sonya.poll(q)
    elapsed = time.monotonic() - started
    assert (r.status_code, r.json()) == (200, [])
    assert 2.5 <= elapsed < 15  # longpoll_max_wait_s = 3


def test_unknown_queue_is_404_plain_text(sonya):
    r = sonya.poll("nope" + uuid.uuid4().hex, "a", "first")
    assert (r.status_code, r.text) == (404, "Queue Not Found")


def test_every_waiting_longpoll_gets_the_message(sonya):
    q = fresh_queue(sonya)
    by_id = [Background(sonya.poll, q, "k") for _ in range(5)]
    whole = [Background(sonya.poll, q) for _ in range(5)]
    other_id = Background(sonya.poll, q, "other")
    time.sleep(SETTLE_S)
    sonya.send_ok(q, "k", "hello")
    for w in by_id + whole:
        assert w.get().json() == [{"id": "k", "sequence": 1, "payload": "hello"}]
    assert other_id.get().json() == []  # another id's listener saw nothing (max wait passed)


# -- trimming -------------------------------------------------------------------------------


def test_max_key_updates_keeps_the_newest_n(tmp_path):
    srv = SonyaServer(tmp_path / "trim", "max_key_updates = 3", wal_mode="write").start()
    try:
        q = fresh_queue(srv)
        for i in range(1, 7):
            srv.send_ok(q, "k", i)
            srv.send_ok(q, "k1", i)
        assert srv.history(q, "k") == [("k", 4, 4), ("k", 5, 5), ("k", 6, 6)]
        assert [v[1] for v in srv.history(q, "k1")] == [4, 5, 6]
        # Trimming is by sequence: a custom number below the window goes at once.
        assert srv.send_ok(q, "k", "low", sequence=2) == 2
        assert [v[1] for v in srv.history(q, "k")] == [4, 5, 6]
        assert [m["sequence"] for m in r_ok(srv.poll(q, "k", 1))] == [4, 5, 6]  # from the oldest kept
    finally:
        srv.close()


def test_max_key_updates_zero_stores_nothing_but_numbers_and_delivers(tmp_path):
    srv = SonyaServer(tmp_path / "zero", "max_key_updates = 0\nlongpoll_max_wait_s = 1", wal_mode="write").start()
    try:
        q = fresh_queue(srv)
        assert [srv.send_ok(q, "k", i) for i in range(3)] == [1, 2, 3]
        assert srv.history(q, "k") == []
        with srv.ws(q, "k", "?sequence=first") as ws:
            srv.send_ok(q, "k", "live")
            assert ws_messages(ws, 1) == [{"id": "k", "sequence": 4, "payload": "live"}]
    finally:
        srv.close()


# -- WebSocket --------------------------------------------------------------------------------


def test_websocket_preload_then_live_text_frames(sonya):
    q = fresh_queue(sonya)
    sonya.send_ok(q, "k", "one")
    sonya.send_ok(q, "k", "two")
    with sonya.ws(q, "k", "?sequence=first") as ws, sonya.ws(q) as whole:
        assert [m["payload"] for m in ws_messages(ws, 2)] == ["one", "two"]
        sonya.send_ok(q, "k", "three")
        sonya.send_ok(q, "z", "other id")
        assert ws_messages(ws, 1) == [{"id": "k", "sequence": 3, "payload": "three"}]
        assert [(m["id"], m["payload"]) for m in ws_messages(whole, 2)] == [("k", "three"), ("z", "other id")]
        ws.ping()  # answered by the server; the stream goes on
        ws.send("ignored")
        sonya.send_ok(q, "k", "four")
        assert ws_messages(ws, 1)[0]["payload"] == "four"


def test_websocket_close_frames_on_queue_close_and_id_delete(sonya):
    q = fresh_queue(sonya)
    with contextlib.ExitStack() as stack:
        by_id, other_by_id, whole = (stack.enter_context(sonya.ws(q, k)) for k in ("k", "j", None))
        _check_close_frames(sonya, q, by_id, other_by_id, whole)


def _check_close_frames(sonya, q, by_id, other_by_id, whole):
    sonya.delete(q, "k")
    with pytest.raises(ConnectionClosed) as closed:
        by_id.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    sonya.send_ok(q, "j", "still here")
    assert ws_messages(other_by_id, 1)[0]["payload"] == "still here"
    assert ws_messages(whole, 1)[0]["payload"] == "still here"
    sonya.close_queue(q)
    for conn in (other_by_id, whole):
        with pytest.raises(ConnectionClosed) as closed:
            conn.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


def test_websocket_unknown_queue_404_and_plain_get_400(sonya):
    with pytest.raises(InvalidStatus) as refused:
        sonya.ws("nope" + uuid.uuid4().hex)
    assert refused.value.response.status_code == 404
    q = fresh_queue(sonya)
    assert sonya.http.get(f"/queue/listen/ws/{q}").status_code == 400
    assert sonya.http.post(f"/queue/listen/ws/{q}").status_code == 405
    assert sonya.http.get(f"/queue/listen/ws/nope{uuid.uuid4().hex}").status_code == 404


def test_slow_websocket_listener_is_closed_1008_others_unaffected(tmp_path):
    srv = SonyaServer(tmp_path / "slow", "listener_buffer = 4\nmax_key_updates = 1", wal_mode="none").start()
    try:
        q = fresh_queue(srv)
        slow = RawWebSocket(srv.http_port, f"/queue/listen/ws/{q}")  # never reads until the end
        assert slow.status == 101
        payload = "x" * 200_000
        with srv.ws(q) as fast:
            for i in range(120):
                assert srv.send_ok(q, "k", payload) == i + 1
                assert ws_messages(fast, 1)[0]["sequence"] == i + 1  # not held up by the slow one
        frames = slow.frames()
        slow.close()
        data = [f for f in frames if f[0] == 1]
        assert 0 < len(data) < 120
        assert [json.loads(p)["sequence"] for _, p in data] == list(range(1, len(data) + 1))
        assert frames[-1][0] == 8 and struct.unpack(">H", frames[-1][1][:2])[0] == 1008
    finally:
        srv.close()


# -- resume without loss or duplicates ---------------------------------------------------------


def test_resume_after_disconnect_longpoll_and_websocket(sonya):
    q = fresh_queue(sonya)
    total = 60

    def produce() -> None:
        for i in range(total):
            sonya.send_ok(q, "k", i)
            if i % 7 == 0:
                time.sleep(0.02)

    producer = Background(produce)
    # Long-poll client: resume from the last seen sequence + 1 each time.
    seen: list[int] = []
    next_seq = 1
    deadline = time.monotonic() + 60
    while len(seen) < total and time.monotonic() < deadline:
        batch = r_ok(sonya.poll(q, "k", next_seq))
        seen += [m["sequence"] for m in batch]
        if batch:
            next_seq = batch[-1]["sequence"] + 1
    producer.get()
    assert seen == list(range(1, total + 1))
    # WebSocket client: disconnect every few messages and reconnect with sequence=last+1 while
    # another producer runs.
    producer = Background(lambda: [sonya.send_ok(q, "k", total + i) for i in range(total)])
    ws_seen: list[int] = []
    while len(ws_seen) < 2 * total and time.monotonic() < deadline:
        # max_queue=None: the client library must keep reading after it leaves mid-preload, or
        # the server's close frame waits behind unread frames until the client's close timeout.
        with sonya.ws(q, "k", f"?sequence={(ws_seen[-1] + 1) if ws_seen else 1}", max_queue=None) as ws:
            for m in ws_messages(ws, min(7, 2 * total - len(ws_seen)), timeout=20):
                ws_seen.append(m["sequence"])
    producer.get()
    assert ws_seen == list(range(1, 2 * total + 1))


def test_snapshot_and_subscribe_have_no_gap_under_concurrent_sends(sonya):
    """Sockets opened with sequence=first while sends are in flight each see 1..N exactly once."""
    q = fresh_queue(sonya)
    total = 40
    producer = Background(lambda: [sonya.send_ok(q, "k", i) for i in range(total)])
    with contextlib.ExitStack() as stack:
        results = []
        for _ in range(4):
            results.append(stack.enter_context(sonya.ws(q, "k", "?sequence=first")))
            time.sleep(0.05)
        producer.get()
        for ws in results:
            assert [m["sequence"] for m in ws_messages(ws, total)] == list(range(1, total + 1))
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.3)  # and nothing twice


# -- task events --------------------------------------------------------------------------------


def test_task_events_follow_a_task_from_put_to_ack(sonya):
    c = tarantool.connect("127.0.0.1", sonya.proc.port)
    try:
        # The tube's event queue exists from the start (S11).
        with sonya.ws("emails"):  # accepted: the queue exists (a missing one is refused 404)
            pass
        put = c.call("box.queue.put", [0, "emails", 0, 0, 0, 0, "hello", 7])
        task_id = put[0][0]
        with sonya.ws("emails", task_id, "?sequence=first") as ws:
            first = ws_messages(ws, 1)
            assert first == [{"id": task_id, "sequence": 1, "payload": {"status": "ready", "previous": None, "data": ["hello", 7]}}]
            taken = c.call("box.queue.take", [0, "emails", 5])
            assert taken[0][0] == task_id
            c.call("box.queue.ack", [0, task_id])
            events = ws_messages(ws, 2)
        assert [(e["sequence"], e["payload"]["previous"], e["payload"]["status"]) for e in events] == [
            (2, "ready", "taken"),
            (3, "taken", events[1]["payload"]["status"]),
        ]
        assert events[1]["payload"]["status"] in ("deleted", "done")
        assert [m["sequence"] for m in r_ok(sonya.poll("emails", task_id, "first"))] == [1, 2, 3]
        # Tubes not listed publish nothing.
        c.call("box.queue.put", [0, "other_tube", 0, 0, 0, 0, "x"])
        assert sonya.poll("other_tube", None, "first", timeout=5).status_code == 404
    finally:
        c.close()


# -- durability and shutdown ----------------------------------------------------------------------


def test_restart_and_kill_keep_history_queues_and_counters(tmp_path):
    srv = SonyaServer(tmp_path / "dur").start()
    try:
        q = fresh_queue(srv)
        for i in range(3):
            srv.send_ok(q, "k", i)
        srv.send_ok(q, "j", "x", sequence=50)
        srv.delete(q, "gone")
        srv.restart()
        assert srv.history(q) == [("j", 50, "x"), ("k", 1, 0), ("k", 2, 1), ("k", 3, 2)]
        assert srv.send_ok(q, "k", "after restart") == 4
        acknowledged = [srv.send_ok(q, "k", i) for i in range(5)]
        srv.kill()  # SIGKILL: everything acknowledged must be there
        srv.proc.start()
        wait_for_port(srv.http_port)
        srv.http = httpx.Client(base_url=srv.base, timeout=30)
        assert [v[1] for v in srv.history(q, "k")] == [1, 2, 3, 4, *acknowledged]
        assert srv.send_ok(q, "k", "next") == acknowledged[-1] + 1
        srv.close_queue(q)
        srv.restart()
        assert srv.poll(q, timeout=5).status_code == 404  # the close is durable too
        srv.create(q)
        assert srv.send_ok(q, "k", "reborn") == acknowledged[-1] + 2
    finally:
        srv.close()


def test_graceful_shutdown_answers_longpolls_and_closes_sockets(tmp_path):
    srv = SonyaServer(tmp_path / "stop", "longpoll_max_wait_s = 0").start()
    try:
        q = fresh_queue(srv)
        waiting = Background(srv.poll, q, "k")
        with srv.ws(q) as ws:
            time.sleep(SETTLE_S)
            started = time.monotonic()
            assert srv.proc.stop() == 0
            assert time.monotonic() - started < 10
            r = waiting.get()
            assert (r.status_code, r.json()) == (200, [])
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    finally:
        srv.close()


def test_task_events_after_kill_catch_up_and_include_the_restart(tmp_path):
    srv = SonyaServer(tmp_path / "events", 'task_events = ["jobs"]', queue_space=True).start()
    try:
        c = tarantool.connect("127.0.0.1", srv.proc.port)
        task_id = c.call("box.queue.put", [0, "jobs", 0, 0, 0, 0, "work"])[0][0]
        assert c.call("box.queue.take", [0, "jobs", 5])[0][0] == task_id
        acked = c.call("box.queue.put", [0, "jobs", 0, 0, 0, 0, "short"])[0][0]
        assert c.call("box.queue.take", [0, "jobs", 5])[0][0] == acked
        c.call("box.queue.ack", [0, acked])
        srv.kill()  # at once: the first task is left taken, and the last events may be unpublished
        srv.proc.start()
        wait_for_port(srv.http_port)
        srv.http = httpx.Client(base_url=srv.base, timeout=30)
        events = r_ok(srv.poll("jobs", task_id, "first"))
        statuses = [e["payload"]["status"] for e in events]
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
        assert statuses[0] == "ready" and statuses[-2:] == ["taken", "ready"]  # the restart's return
        assert all(e["payload"]["previous"] == p["payload"]["status"] for p, e in itertools.pairwise(events))
        gone = r_ok(srv.poll("jobs", acked, "last"))
        assert gone[0]["payload"]["status"] in ("deleted", "done")
    finally:
        srv.close()


def test_busy_sonya_port_stops_the_server_with_status_1(tmp_path):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        srv = SonyaServer(tmp_path / "busy")
        srv.http_port = holder.getsockname()[1]
        srv.proc.extra_config = f'\n[sonya]\nlisten = "127.0.0.1:{srv.http_port}"\n'
        with pytest.raises(RuntimeError):
            srv.proc.start(timeout=15)
        assert "cannot listen" in srv.proc.log()
        assert srv.proc.proc.wait(10) == 1
        srv.http.close()
