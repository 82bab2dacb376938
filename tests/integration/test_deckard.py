"""The Deckard facade's ten methods and decisions K1-K13, over gRPC against the real server."""

from __future__ import annotations

import json
import math
import time

import grpc
import pytest
import tarantool
from google.protobuf import wrappers_pb2

from tests.integration.deckard_fixtures import Deckard, DeckardServer, pb, queue_name, raw_any

MAX_SCORE = float(2**53)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = DeckardServer.create(tmp_path_factory.mktemp("deckard"))
    client = srv.start()
    client.close()
    yield srv
    srv.proc.stop()


@pytest.fixture
def dk(server):
    client = Deckard(server.grpc_port)
    yield client
    client.close()


@pytest.fixture
def q():
    return queue_name()


def now_ms() -> float:
    return time.time() * 1000


# -- Add -------------------------------------------------------------------------------------


def test_add_counts_created_and_updated(dk, q):
    assert (dk.add(q, "a", "b").created_count, dk.add(q, "a", "b").updated_count) == (2, 2)
    answer = dk.add(q, "b", "c", "c")
    assert (answer.created_count, answer.updated_count) == (1, 2)  # a repeated id updates itself
    assert dk.count(q) == 3
    empty = dk.stub.Add(pb.AddRequest())
    assert (empty.created_count, empty.updated_count) == (0, 0)


def test_add_default_score_is_now_in_ms_and_scores_are_clamped(dk, q):
    before = now_ms()
    dk.add(q, "now")
    after = now_ms()
    dk.add(q, "neg", score=-5)
    dk.add(q, "huge", score=1e300)
    dk.add(q, "inf", score=math.inf)
    scores = {m.id: m.score for m in dk.pull(q, 10)}
    assert before - 1 <= scores["now"] <= after + 1
    assert scores["neg"] == 0
    assert scores["huge"] == scores["inf"] == MAX_SCORE


def test_readd_keeps_state_position_and_refreshes_data(dk, q):
    """K10: a re-Add refreshes payload, metadata, description and expiry, not score or state."""
    dk.add(q, "m", score=3, description="old", string_payload="p1", metadata={"k": "1"})
    dk.add(q, "other", score=5)
    answer = dk.add(q, "m", score=100, description="new", string_payload="p2", metadata={"k": "2"})
    assert (answer.created_count, answer.updated_count) == (0, 1)
    first = dk.pull(q)[0]
    assert (first.id, first.score, first.description, first.string_payload) == ("m", 3, "new", "p2")
    assert dict(first.metadata) == {"k": "2"}
    dk.add(q, "m", description="while processing")  # still processing afterwards
    assert dk.pull_ids(q, 10) == ["other"]
    assert dk.ack(q, "m").success


def test_any_payload_is_returned_byte_exact(dk, q):
    """Any values are stored opaquely: known types, empty values, garbage bytes, odd type URLs."""
    payload = {
        "str": raw_any("type.googleapis.com/google.protobuf.StringValue", wrappers_pb2.StringValue(value="").SerializeToString()),
        "int": raw_any("type.googleapis.com/google.protobuf.Int32Value", wrappers_pb2.Int32Value(value=0).SerializeToString()),
        "msg": raw_any("type.googleapis.com/blipai.deckard.AddMessage", pb.AddMessage(id="x", queue="y").SerializeToString()),
        "garbage": raw_any("type.googleapis.com/google.protobuf.Int32Value", b"\xff\xfe\x00garbage\x80"),
        "unknown": raw_any("example.com/no.such.Type", bytes(range(256))),
        "empty": raw_any("", b""),
    }
    dk.stub.Add(pb.AddRequest(messages=[pb.AddMessage(id="p", queue=q, payload=payload)]))
    pulled = dk.pull(q)[0]
    got = dk.get(q, "p").message
    for name, value in payload.items():
        assert pulled.payload[name].type_url == got.payload[name].type_url == value.type_url
        assert pulled.payload[name].value == got.payload[name].value == value.value
    assert set(pulled.payload) == set(payload)


# -- Pull ------------------------------------------------------------------------------------


def test_pull_orders_by_score_then_arrival(dk, q):
    for i, score in enumerate([5, 1, 3, 1, 2]):
        dk.add(q, f"m{i}", score=score)
    assert dk.pull_ids(q, 10) == ["m1", "m3", "m4", "m2", "m0"]
    assert dk.pull(q, 10) == []  # all processing now


def test_pull_score_bounds_are_inclusive_and_zero_means_unset(dk, q):
    for score in (1, 2, 3, 4, 5, 6):
        dk.add(q, f"s{score}", score=score)
    assert dk.pull_ids(q, 10, min_score=2, max_score=4) == ["s2", "s3", "s4"]
    assert dk.pull_ids(q, 10, max_score=-1) == []  # negative max means "0"
    assert dk.pull_ids(q, 1, min_score=6) == ["s6"]
    assert dk.pull_ids(q, 10) == ["s1", "s5"]


def test_pull_score_filter_is_an_age_bound_when_max_score_is_unset(dk, q):
    dk.add(q, "old", score=now_ms() - 60_000)
    dk.add(q, "fresh", score=now_ms())
    assert dk.pull_ids(q, 10, score_filter=30_000) == ["old"]


def test_pull_amount_is_clamped(dk, q):
    """K11: 0 or less is 1, more than 1000 is 1000; neither is an error."""
    dk.stub.Add(pb.AddRequest(messages=[pb.AddMessage(id=str(i), queue=q, score=i + 1) for i in range(1003)]))
    assert len(dk.pull(q, 0)) == 1
    assert len(dk.pull(q, -7)) == 1
    assert len(dk.pull(q, 5000)) == 1000
    assert len(dk.pull(q, 10)) == 1


def test_pull_fills_description_and_diagnostics(dk, q):
    """K5 and K4: description and diagnostics present, score the one it is ordered by."""
    dk.add(q, "m", score=7, description="what it is")
    first = dk.pull(q)[0]
    assert first.description == "what it is" and first.HasField("diagnostics")
    assert dk.nack(q, "m").success
    again = dk.pull(q)[0]
    assert (again.score, again.diagnostics.nacks, again.diagnostics.consecutive_nacks) == (0, 1, 1)


def test_empty_unknown_queue_pull_is_ok_and_empty(dk):
    assert dk.pull("") == []
    assert dk.pull(queue_name()) == []


def test_many_pullers_never_get_the_same_message(dk, q):
    from concurrent.futures import ThreadPoolExecutor

    dk.stub.Add(pb.AddRequest(messages=[pb.AddMessage(id=f"c{i}", queue=q) for i in range(300)]))

    def puller(_n: int) -> list[str]:
        got = []
        while True:
            ids = dk.pull_ids(q, 7)
            if not ids:
                return got
            got += ids

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(puller, range(12)))
    everything = [i for ids in results for i in ids]
    assert len(everything) == 300 and set(everything) == {f"c{i}" for i in range(300)}


# -- Ack and Nack ----------------------------------------------------------------------------


def test_ack_without_score_goes_to_the_back_with_now(dk, q):
    dk.add(q, "a", score=1)
    dk.add(q, "b", score=2)
    assert dk.pull_ids(q) == ["a"]
    before = now_ms()
    assert dk.ack(q, "a", breakpoint="page-2").success
    assert dk.pull_ids(q, 10) == ["b", "a"]
    got = dk.get(q, "a").message
    assert got.score >= before - 1 and got.breakpoint == "page-2"
    assert (got.diagnostics.acks, got.diagnostics.consecutive_acks, got.diagnostics.nacks) == (1, 1, 0)


def test_ack_and_nack_scores_are_clamped_and_honoured(dk, q):
    """K3: Ack/Nack clamp scores; a Nack's score counts even without a lock."""
    dk.add(q, "a", "b", "c", score=10)
    assert dk.pull_ids(q, 3) == ["a", "b", "c"]
    dk.ack(q, "a", score=-4)
    dk.nack(q, "b", score=1e300)
    dk.nack(q, "c")
    scores = [(m.id, m.score) for m in dk.pull(q, 3)]
    assert scores == [("a", 0.0), ("c", 0.0), ("b", MAX_SCORE)]


def test_ack_subtracts_the_deprecated_score_subtract(dk, q):
    dk.add(q, "a")
    dk.pull(q)
    before = now_ms()
    dk.ack(q, "a", score_subtract=10_000)
    assert before - 10_000 - 1 <= dk.get(q, "a").message.score <= now_ms() - 10_000 + 1


def test_nack_resets_consecutive_acks_and_ignores_breakpoint(dk, q):
    dk.add(q, "m")
    for verb in ("ack", "ack", "nack"):
        dk.pull(q)
        getattr(dk, verb)(q, "m", breakpoint=verb)
    diag = dk.get(q, "m").message.diagnostics
    assert (diag.acks, diag.nacks, diag.consecutive_acks, diag.consecutive_nacks) == (2, 1, 0, 1)
    assert dk.get(q, "m").message.breakpoint == "ack"


def test_ack_of_a_message_not_processing_fails_softly(dk, q):
    dk.add(q, "m")
    assert not dk.ack(q, "m").success  # never pulled
    assert not dk.nack(q, "nope").success  # unknown
    dk.pull(q)
    assert dk.ack(q, "m").success
    assert not dk.ack(q, "m").success  # already acked
    answer = dk.ack(q, "m")
    assert not answer.HasField("removal_response")


def test_remove_message_on_ack_reports_the_removal(dk, q):
    dk.add(q, "m", "n")
    dk.pull(q, 2)
    answer = dk.ack(q, "m", removeMessage=True)
    assert answer.success and answer.HasField("removal_response")
    assert (answer.removal_response.cacheRemoved, answer.removal_response.storageRemoved) == (1, 1)
    answer = dk.nack(q, "gone", removeMessage=True)  # success forced, nothing removed
    assert answer.success and answer.removal_response.storageRemoved == 0
    assert dk.count(q) == 1 and not dk.get(q, "m").found


# -- Count, Remove, GetById ------------------------------------------------------------------


def test_count_every_state_and_every_queue(dk, server):
    q1, q2 = queue_name("a"), queue_name("a")
    dk.add(q1, "x", "y", "z")
    dk.add(q2, "x")
    dk.pull(q1)
    dk.pull(q1)
    dk.ack(q1, dk.pull_ids(q1)[0], lock_ms=60_000)
    assert (dk.count(q1), dk.count(q2)) == (3, 1)
    assert dk.count("") >= 4
    assert dk.count(q1.split("::")[0]) == 0  # a prefix is not a queue (section 3.1)


def test_remove_counts_what_it_removed(dk, q):
    dk.add(q, "a", "b", "c")
    dk.pull(q)
    answer = dk.stub.Remove(pb.RemoveRequest(queue=q, ids=["a", "b", "nope", "a"]))
    assert (answer.cacheRemoved, answer.storageRemoved) == (2, 2)
    assert dk.count(q) == 1
    empty = dk.stub.Remove(pb.RemoveRequest(queue=q))
    assert (empty.cacheRemoved, empty.storageRemoved) == (0, 0)
    assert dk.pull_ids(q, 5) == ["c"]


def test_get_by_id_found_and_not_found(dk, q):
    dk.add(q, "m", description="d", string_payload="s", metadata={"a": "b"}, score=4)
    got = dk.get(q, "m")
    assert got.found and got.message.HasField("diagnostics")
    assert (got.message.id, got.message.queue, got.message.description, got.message.score) == ("m", q, "d", 4)
    missing = dk.get(q, "nope")
    assert not missing.found and not missing.HasField("message") and not missing.human_readable_payload


def test_human_readable_payload_is_json(dk, q):
    """K5: protobuf JSON for known types, else type_url and base64 value."""
    payload = {
        "n": raw_any("type.googleapis.com/google.protobuf.Int32Value", wrappers_pb2.Int32Value(value=3).SerializeToString()),
        "u": raw_any("example.com/x.Y", b"\x01\x02"),
        "bad": raw_any("type.googleapis.com/google.protobuf.Int32Value", b"\xff\xff\xff"),
    }
    dk.stub.Add(pb.AddRequest(messages=[pb.AddMessage(id="m", queue=q, payload=payload)]))
    readable = {k: json.loads(v) for k, v in dk.get(q, "m").human_readable_payload.items()}
    assert readable["n"] == {"@type": "type.googleapis.com/google.protobuf.Int32Value", "value": 3}
    assert readable["u"] == {"type_url": "example.com/x.Y", "value": "AQI="}
    assert readable["bad"] == {"type_url": "type.googleapis.com/google.protobuf.Int32Value", "value": "////"}


def test_queues_with_prefixes_are_independent(dk):
    base = queue_name("app")
    a, b = f"{base}::1", f"{base}::2"
    dk.add(a, "same", score=1)
    dk.add(b, "same", score=2)
    assert (dk.count(a), dk.count(b), dk.count(base)) == (1, 1, 0)
    assert [m.score for m in dk.pull(b)] == [2]
    assert dk.get(a, "same").message.score == 1


# -- EditQueue, GetQueue, max_elements ------------------------------------------------------


def test_edit_and_get_queue(dk, q):
    assert dk.stub.GetQueue(pb.GetQueueRequest(queue=q)) == pb.GetQueueResponse(
        queue=q, configuration=pb.QueueConfiguration(max_elements=0)
    )
    unset = dk.stub.EditQueue(pb.EditQueueRequest(queue=q))
    assert (unset.queue, unset.success) == (q, False)

    def edit(n: int) -> int:
        assert dk.stub.EditQueue(pb.EditQueueRequest(queue=q, configuration=pb.QueueConfiguration(max_elements=n))).success
        return dk.stub.GetQueue(pb.GetQueueRequest(queue=q)).configuration.max_elements

    assert edit(5) == 5  # K8: visible at once
    assert edit(0) == 5  # 0 changes nothing
    assert edit(-1) == 0  # negative removes the limit


def test_max_elements_evicts_soonest_to_expire_at_add(dk, q):
    """K8: enforced at Add time, soonest expiry first, then the oldest; processing ones too."""
    dk.stub.EditQueue(pb.EditQueueRequest(queue=q, configuration=pb.QueueConfiguration(max_elements=3)))
    dk.add(q, "long", ttl_minutes=600)
    dk.add(q, "short", ttl_minutes=5)
    dk.add(q, "timeless", timeless=True)
    assert dk.pull_ids(q) == ["long"]
    dk.add(q, "mid", ttl_minutes=60)  # over the limit: "short" goes
    assert dk.count(q) == 3 and not dk.get(q, "short").found
    dk.add(q, "mid2", ttl_minutes=60)  # "mid" expires first (same ttl, older)
    assert dk.count(q) == 3 and not dk.get(q, "mid").found
    assert {i for i in ("long", "timeless", "mid2") if dk.get(q, i).found} == {"long", "timeless", "mid2"}


def test_lowering_max_elements_evicts_at_once(dk, q):
    for i in range(6):
        dk.add(q, f"m{i}", ttl_minutes=10 + i)
    dk.stub.EditQueue(pb.EditQueueRequest(queue=q, configuration=pb.QueueConfiguration(max_elements=2)))
    assert dk.count(q) == 2
    assert sorted(dk.pull_ids(q, 10)) == ["m4", "m5"]


# -- expiry ----------------------------------------------------------------------------------


def test_default_ttl_applies_when_ttl_is_zero(dk, q, server):
    """K2: ttl 0 without timeless gets the configured default (1440 min), not "born expired";
    checked on the stored tuple, read over iproto."""
    before = now_ms()
    dk.add(q, "d")
    dk.add(q, "t", timeless=True)
    dk.add(q, "ten", ttl_minutes=10)
    conn = tarantool.connect("127.0.0.1", server.proc.port)
    try:
        # a task of the Deckard space: id, ..., created (us), ttl (us); expiry = created + ttl
        expires = {row[0]: (row[7] + row[8]) / 1000 for row in conn.select("deckard", [q]).data}
    finally:
        conn.close()
    day, century = 1440 * 60_000, 100 * 365.25 * 86_400_000
    assert before + day - 1 <= expires["d"] <= now_ms() + day + 1
    assert before + century - 1 <= expires["t"] <= now_ms() + century + 1
    assert before + 600_000 - 1 <= expires["ten"] <= now_ms() + 600_000 + 1
    assert dk.pull_ids(q, 5) and dk.count(q) == 3


def test_expired_messages_are_never_pulled_and_are_removed(dk, q):
    dk.add(q, "dead", ttl_minutes=-1)
    dk.add(q, "alive", ttl_minutes=1)
    assert dk.pull_ids(q, 10) == ["alive"]
    assert not dk.get(q, "dead").found
    deadline = time.monotonic() + 5
    while dk.count(q) != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert dk.count(q) == 1


# -- Flush and validation --------------------------------------------------------------------


def test_flush_clears_deckard_queues_only(dk, server):
    q = queue_name()
    dk.add(q, "a", "b")
    dk.stub.EditQueue(pb.EditQueueRequest(queue=q, configuration=pb.QueueConfiguration(max_elements=9)))
    conn = tarantool.connect("127.0.0.1", server.proc.port)
    try:
        conn.replace("keep", [1, "not a Deckard message"])
        assert dk.stub.Flush(pb.FlushRequest()).success
        assert (dk.count(""), dk.count(q)) == (0, 0)
        assert dk.stub.GetQueue(pb.GetQueueRequest(queue=q)).configuration.max_elements == 0
        assert conn.select("deckard").data == []
        assert conn.select("keep").data == [[1, "not a Deckard message"]]
    finally:
        conn.close()
    dk.add(q, "after")
    assert dk.pull_ids(q) == ["after"]


@pytest.mark.parametrize(
    "call",
    [
        lambda dk: dk.add("", "id"),
        lambda dk: dk.add("q", ""),
        lambda dk: dk.ack("", "id"),
        lambda dk: dk.ack("q", ""),
        lambda dk: dk.nack("q", ""),
        lambda dk: dk.get("", "id"),
        lambda dk: dk.get("q", ""),
        lambda dk: dk.add("q", "id", score=math.nan),
        lambda dk: dk.pull("q", min_score=math.nan),
        lambda dk: dk.ack("q", "id", score=math.nan),
    ],
)
def test_invalid_arguments(dk, call):
    """K6/K12: clear INVALID_ARGUMENT texts."""
    with pytest.raises(grpc.RpcError) as err:
        call(dk)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("invalid ")


def test_a_bad_message_in_an_add_stores_nothing(dk, q):
    with pytest.raises(grpc.RpcError) as err:
        dk.stub.Add(pb.AddRequest(messages=[pb.AddMessage(id="good", queue=q), pb.AddMessage(id="", queue=q)]))
    assert "message 1" in err.value.details()
    assert dk.count(q) == 0 and not dk.get(q, "good").found


def test_empty_queue_names_are_accepted_where_deckard_accepts_them(dk):
    """K12: Pull, Count, Remove, EditQueue and GetQueue take ""."""
    assert dk.pull("") == []
    assert dk.stub.Remove(pb.RemoveRequest(queue="", ids=["x"])).storageRemoved == 0
    assert dk.stub.GetQueue(pb.GetQueueRequest(queue="")).queue == ""
    assert dk.stub.EditQueue(pb.EditQueueRequest(queue="", configuration=pb.QueueConfiguration())).success
