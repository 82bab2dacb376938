"""The Deckard listener as a server: timing of locks and deadlines, restarts and kill -9, health,
reflection, the wire contract, bad input and configuration."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from boxqueue.facades.deckard.generated import deckard_service_pb2_grpc as pb_grpc
from boxqueue.facades.deckard.server import GRACE_S
from tests.integration.deckard_fixtures import Deckard, DeckardServer, pb, queue_name
from tests.integration.test_metrics import delta, scrape
from tests.serverproc import ROOT, free_port

# A 1 s sweep would release a lock anywhere up to a second late; these bounds allow a busy
# machine half a second, which a sweep would exceed most of the time over three locks.
SLACK_S = 0.5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = DeckardServer.create(tmp_path_factory.mktemp("deckard-server"))
    srv.start().close()
    yield srv
    srv.proc.stop()


@pytest.fixture
def dk(server):
    client = Deckard(server.grpc_port)
    yield client
    client.close()


def wait_for_pull(dk: Deckard, queue: str, limit_s: float) -> tuple[float, list[pb.Message]]:
    """Pull until something comes, polling every 10 ms; (seconds waited, messages)."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        got = dk.pull(queue, 10)
        if got:
            return time.monotonic() - start, got
        time.sleep(0.01)
    return time.monotonic() - start, []


# -- timing ----------------------------------------------------------------------------------


def test_locks_release_on_time_with_their_scores(dk):
    """K7: each lock ends at its own time (not on a sweep), never early; an ack lock without a
    score comes back behind the rest, a nack lock at the front, a lock with a score with it."""
    q = queue_name()
    dk.add(q, "a", "b", "c", score=50)
    assert dk.pull_ids(q, 3) == ["a", "b", "c"]
    started = time.monotonic()
    dk.ack(q, "a", lock_ms=300)
    dk.nack(q, "b", lock_ms=700, score=7)
    dk.nack(q, "c", lock_ms=1100)
    seen = {}
    while len(seen) < 3 and time.monotonic() - started < 5:
        for m in dk.pull(q, 3):
            seen[m.id] = (time.monotonic() - started, m.score)
        time.sleep(0.01)
    assert set(seen) == {"a", "b", "c"}
    for message_id, lock_s in (("a", 0.3), ("b", 0.7), ("c", 1.1)):
        assert lock_s - 0.02 <= seen[message_id][0] <= lock_s + SLACK_S, (message_id, seen)
    assert seen["a"][1] > 1e12  # now in ms
    assert (seen["b"][1], seen["c"][1]) == (7, 0)


def test_ack_deadline_returns_the_message_to_the_front(dk):
    """K7: a processing message whose deadline passes is active again, with score 0."""
    q = queue_name()
    dk.add(q, "slow", score=100)
    started = time.monotonic()
    assert dk.pull_ids(q, ack_deadline_ms=400) == ["slow"]
    dk.add(q, "other", score=1)
    assert dk.pull_ids(q, 1, ack_deadline_ms=60_000) == ["other"]
    _, got = wait_for_pull(dk, q, 5)
    waited = time.monotonic() - started
    assert [(m.id, m.score) for m in got] == [("slow", 0.0)]
    assert 0.4 - 0.02 <= waited <= 0.4 + SLACK_S
    assert dk.ack(q, "other").success  # its own deadline is far: still processing


def test_a_late_ack_fails_after_the_deadline(dk):
    q = queue_name()
    dk.add(q, "m")
    dk.pull(q, ack_deadline_ms=200)
    time.sleep(0.2 + SLACK_S)
    assert not dk.ack(q, "m").success
    assert dk.pull_ids(q) == ["m"]


# -- health, reflection, wire contract -------------------------------------------------------


def test_health_reports_serving(dk):
    health = health_pb2_grpc.HealthStub(dk.channel)
    for service in ("", "blipai.deckard.Deckard", "grpc.health.v1.Health"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as err:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_sends_the_status_at_once(dk):
    """Watch answers with the current status without waiting for a change, SERVICE_UNKNOWN for a
    service the server does not know (as grpcio's HealthServicer), and keeps the stream open."""
    health = health_pb2_grpc.HealthStub(dk.channel)
    expected = {"": health_pb2.HealthCheckResponse.SERVING,
                "blipai.deckard.Deckard": health_pb2.HealthCheckResponse.SERVING,
                "no.such.Service": health_pb2.HealthCheckResponse.SERVICE_UNKNOWN}
    # One stream per service, open together: each ends only at its deadline (nothing changed).
    streams = {service: health.Watch(health_pb2.HealthCheckRequest(service=service), timeout=5)
               for service in expected}
    try:
        for service, stream in streams.items():
            assert next(stream).status == expected[service], service
        for service, stream in streams.items():
            with pytest.raises(grpc.RpcError) as err:
                next(stream)  # a stream the server ended would stop here with OK instead
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, service
    finally:
        for stream in streams.values():
            stream.cancel()


def test_health_watch_reports_not_serving_when_the_server_stops(tmp_path):
    """A watcher hears NOT_SERVING as soon as the server begins to stop (SIGTERM), before the
    calls' grace period ends; when it leaves, the server stops without waiting out that grace."""
    srv = DeckardServer.create(tmp_path / "srv")
    client = srv.start()
    try:
        health = health_pb2_grpc.HealthStub(client.channel)
        stream = health.Watch(health_pb2.HealthCheckRequest(service="blipai.deckard.Deckard"), timeout=60)
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
        srv.proc.proc.send_signal(signal.SIGTERM)
        asked_to_stop = time.monotonic()
        assert next(stream).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert time.monotonic() - asked_to_stop < GRACE_S  # not the grace period's end
        stream.cancel()
        left_at = time.monotonic()
        assert srv.proc.proc.wait(timeout=60) == 0
        assert time.monotonic() - left_at < GRACE_S - 1  # the watcher's leaving ended the grace
    finally:
        client.close()
        srv.proc.stop()


@pytest.mark.parametrize("version", ["v1alpha", "v1"])
def test_reflection_lists_the_service_and_its_file(dk, version):
    path = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
    call = dk.channel.stream_stream(
        path,
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="blipai.deckard.Deckard"),
    ]
    listed, file_answer = list(call(iter(requests)))
    names = {s.name for s in listed.list_services_response.service}
    assert {"blipai.deckard.Deckard", "grpc.health.v1.Health"} <= names
    from google.protobuf import descriptor_pb2

    files = [descriptor_pb2.FileDescriptorProto.FromString(b) for b in file_answer.file_descriptor_response.file_descriptor_proto]
    deckard = next(f for f in files if f.package == "blipai.deckard")
    assert deckard.name == "deckard_service.proto"
    assert [m.name for m in deckard.service[0].method] == [
        "Add", "Pull", "Ack", "Nack", "Count", "Remove", "Flush", "GetById", "EditQueue", "GetQueue",
    ]


def test_wire_field_numbers_match_the_contract():
    """K1: the spec's field tables, checked on the compiled descriptor."""
    expected = {
        "GetByIdRequest": {"queue": 1, "id": 2},
        "GetByIdResponse": {"message": 1, "found": 2, "human_readable_payload": 3},
        "RemoveRequest": {"ids": 1, "queue": 2},
        "RemoveResponse": {"cacheRemoved": 1, "storageRemoved": 2},
        "PullRequest": {"queue": 1, "amount": 2, "score_filter": 3, "max_score": 4, "min_score": 5, "ack_deadline_ms": 6},
        "PullResponse": {"messages": 1},
        "Message": {"id": 1, "description": 2, "queue": 3, "metadata": 4, "string_payload": 5, "score": 6,
                    "breakpoint": 7, "payload": 8, "diagnostics": 9},
        "MessageDiagnostics": {"acks": 1, "nacks": 2, "consecutive_acks": 3, "consecutive_nacks": 4},
        "CountRequest": {"queue": 1},
        "CountResponse": {"count": 1},
        "AddMessage": {"id": 1, "string_payload": 3, "queue": 4, "timeless": 6, "ttl_minutes": 7, "description": 8,
                       "payload": 10, "metadata": 11, "score": 12},
        "AddRequest": {"messages": 1},
        "AddResponse": {"created_count": 1, "updated_count": 2},
        "EditQueueRequest": {"queue": 1, "configuration": 2},
        "EditQueueResponse": {"queue": 1, "success": 2},
        "QueueConfiguration": {"max_elements": 1},
        "GetQueueRequest": {"queue": 1},
        "GetQueueResponse": {"queue": 1, "configuration": 2},
        "AckRequest": {"id": 1, "queue": 2, "score_subtract": 3, "breakpoint": 4, "reason": 5, "lock_ms": 6,
                       "removeMessage": 7, "score": 10},
        "AckResponse": {"success": 1, "removal_response": 2},
        "FlushRequest": {},
        "FlushResponse": {"success": 1},
    }
    file = pb.DESCRIPTOR
    assert (file.name, file.package) == ("deckard_service.proto", "blipai.deckard")
    for name, fields in expected.items():
        assert {f.name: f.number for f in file.message_types_by_name[name].fields} == fields, name
    nack = file.services_by_name["Deckard"].methods_by_name["Nack"]
    assert (nack.input_type.name, nack.output_type.name) == ("AckRequest", "AckResponse")


# -- bad input -------------------------------------------------------------------------------


def test_oversized_request_is_refused_and_the_server_keeps_serving(dk):
    q = queue_name()
    big = pb.AddMessage(id="big", queue=q, string_payload="x" * (4 * 1024 * 1024 + 10))
    with pytest.raises(grpc.RpcError) as err:
        dk.stub.Add(pb.AddRequest(messages=[big]))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dk.count(q) == 0
    assert dk.add(q, "small").created_count == 1


def test_a_pull_too_large_for_one_answer_returns_what_fits_and_keeps_the_rest(dk):
    """Three 1.5 MiB messages cannot go out in one 4 MiB answer: two do, the third is back in
    the queue at once (not stuck processing until its deadline)."""
    q = queue_name()
    for i in range(3):
        dk.add(q, f"big{i}", score=i + 1, string_payload=str(i) * (1536 * 1024))
    first = dk.pull_ids(q, 3, ack_deadline_ms=600_000)
    assert first == ["big0", "big1"]
    assert dk.pull_ids(q, 3) == ["big2"]
    assert dk.ack(q, "big0").success and dk.ack(q, "big2").success


def test_unknown_method_is_unimplemented(dk):
    call = dk.channel.unary_unary("/blipai.deckard.Deckard/Teleport")
    with pytest.raises(grpc.RpcError) as err:
        call(b"")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_undecodable_request_bytes_get_an_error_and_nothing_is_stored(dk):
    q = queue_name()
    call = dk.channel.unary_unary("/blipai.deckard.Deckard/Add")
    for garbage in (b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x05\x22\x03\xff\xfe\xfd"):  # bad length, bad UTF-8
        with pytest.raises(grpc.RpcError) as err:
            call(garbage)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert err.value.details().startswith("cannot decode the request as blipai.deckard.AddRequest")
    assert dk.count(q) == 0
    assert dk.add(q, "fine").created_count == 1


def test_old_clients_reserved_fields_are_ignored(dk):
    """Fields 2/5/9 of AddMessage (removed upstream) arrive as unknown fields."""
    q = queue_name()
    body = pb.AddMessage(id="old", queue=q).SerializeToString() + b"\x12\x03abc" + b"\x2a\x00" + b"\x4a\x01z"
    request = b"\x0a" + bytes([len(body)]) + body
    call = dk.channel.unary_unary("/blipai.deckard.Deckard/Add", response_deserializer=pb.AddResponse.FromString)
    assert call(request).created_count == 1
    assert dk.get(q, "old").found


# -- restarts and configuration --------------------------------------------------------------


def _state(dk: Deckard, q: str) -> dict[str, tuple]:
    out = {}
    for i in ("ready", "busy", "locked", "acked"):
        got = dk.get(q, i)
        if got.found:
            m = got.message
            out[i] = (m.score, m.breakpoint, m.description, m.diagnostics.acks, m.diagnostics.nacks, dict(m.metadata))
    return out


@pytest.mark.parametrize("how", ["sigterm", "kill -9"])
def test_restart_keeps_every_message_state_and_limit(tmp_path, how):
    """K13: scores, processing deadlines, locks, diagnostics and limits survive a restart, and
    every acknowledged change survives kill -9."""
    srv = DeckardServer.create(tmp_path / "srv")
    dk = srv.start()
    q = queue_name()
    try:
        dk.add(q, "ready", score=3, description="r", metadata={"k": "v"})
        dk.add(q, "busy", score=4)
        dk.add(q, "locked", score=5)
        dk.add(q, "acked", score=6)
        dk.stub.EditQueue(pb.EditQueueRequest(queue=q, configuration=pb.QueueConfiguration(max_elements=50)))
        assert dk.pull_ids(q, 3, max_score=5, ack_deadline_ms=60_000) == ["ready", "busy", "locked"]
        dk.ack(q, "ready", score=3, breakpoint="bp")
        dk.nack(q, "locked", lock_ms=60_000, score=1)
        before = _state(dk, q)
        dk.close()
        if how == "sigterm":
            assert srv.proc.stop() == 0
        else:
            srv.proc.kill()
        dk = srv.start()
        assert _state(dk, q) == before
        assert dk.stub.GetQueue(pb.GetQueueRequest(queue=q)).configuration.max_elements == 50
        assert dk.pull_ids(q, 10) == ["ready", "acked"]  # busy still processing, locked still locked
        assert dk.ack(q, "busy").success  # its deadline carried over, so it is still processing
    finally:
        dk.close()
        srv.proc.kill()


def test_a_lock_expiring_while_down_is_released_at_start(tmp_path):
    srv = DeckardServer.create(tmp_path / "srv")
    dk = srv.start()
    q = queue_name()
    try:
        dk.add(q, "m")
        dk.pull(q)
        dk.nack(q, "m", lock_ms=300)
        dk.close()
        srv.proc.stop()
        time.sleep(0.4)
        dk = srv.start()
        waited, got = wait_for_pull(dk, q, 3)
        assert [m.id for m in got] == ["m"] and waited < 1
    finally:
        dk.close()
        srv.proc.kill()


def test_flush_can_be_disabled(tmp_path):
    srv = DeckardServer.create(tmp_path / "srv", "allow_flush = false\ndefault_ttl_minutes = 5\n")
    dk = srv.start()
    try:
        q = queue_name()
        dk.add(q, "m")
        assert not dk.stub.Flush(pb.FlushRequest()).success  # K9
        assert dk.count(q) == 1
    finally:
        dk.close()
        srv.proc.stop()


def serve_until_it_exits(srv: DeckardServer) -> subprocess.CompletedProcess[str]:
    """Run the server in the foreground with its config, for the cases where it must not start."""
    srv.proc.workdir.mkdir(parents=True)
    srv.proc.write_config()
    return subprocess.run(
        [sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(srv.proc.config_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_busy_deckard_port_stops_the_server_with_status_1(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        srv = DeckardServer.create(tmp_path / "srv")
        srv.grpc_port = port
        srv.proc.extra_config = srv.proc.extra_config.replace(
            srv.proc.extra_config.split('"')[1], f"127.0.0.1:{port}", 1
        )
        done = serve_until_it_exits(srv)
    assert done.returncode == 1, done.stderr
    assert "cannot listen" in done.stderr and str(port) in done.stderr


@pytest.mark.parametrize("how", ["sigterm", "kill -9"])
def test_stopping_during_a_large_add_keeps_it_whole_or_not_at_all(tmp_path, how):
    """An Add is one commit: whatever stops the server, its messages are all there after the
    restart or none are, and all are there if the client was told so. SIGTERM lets it finish."""
    srv = DeckardServer.create(tmp_path / "srv")
    dk = srv.start()
    q = queue_name()
    n = 20_000
    try:
        future = dk.stub.Add.future(pb.AddRequest(messages=[pb.AddMessage(id=str(i), queue=q) for i in range(n)]))
        time.sleep(0.05)
        if how == "sigterm":
            assert srv.proc.stop() == 0
        else:
            srv.proc.kill()
        try:
            answer = future.result(timeout=30)
        except grpc.RpcError:
            answer = None
        dk.close()
        dk = srv.start()
        count = dk.count(q)
        if answer is not None:
            assert (answer.created_count, count) == (n, n)
        else:
            assert count in (0, n)
        if how == "sigterm":
            assert answer is not None  # the grace period let it finish
    finally:
        dk.close()
        srv.proc.kill()


def test_a_space_named_like_deckards_with_another_layout_stops_the_server_cleanly(tmp_path):
    srv = DeckardServer.create(tmp_path / "srv")
    srv.proc.extra_config += (
        '\n[[space]]\nname = "deckard"\nformat = [{ name = "id", type = "unsigned" }]\n'
        'indexes = [{ name = "primary", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] }]\n'
    )
    done = serve_until_it_exits(srv)
    assert done.returncode == 1, done.stderr
    assert "Space 'deckard' already exists" in done.stderr
    assert "Traceback" not in done.stderr


def test_calls_are_counted_in_the_metrics(tmp_path):
    """Every unary call is counted by method and outcome, errors by status name; a call refused for
    its token is counted, reflection streams are not."""
    metrics_port = free_port()
    srv = DeckardServer.create(tmp_path / "srv", f'token = "sesame"\n\n[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n')
    srv.proc.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    token = [("authorization", "Bearer sesame")]
    try:
        stub = pb_grpc.DeckardStub(channel)
        before = scrape(metrics_port)
        q = queue_name()
        for i in range(2):
            stub.Add(pb.AddRequest(messages=[pb.AddMessage(id=f"m{i}", queue=q)]), metadata=token, timeout=30)
        assert len(stub.Pull(pb.PullRequest(queue=q, amount=1), metadata=token, timeout=30).messages) == 1
        with pytest.raises(grpc.RpcError):
            stub.Ack(pb.AckRequest(queue=q, id=""), metadata=token, timeout=30)  # INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError):
            stub.Count(pb.CountRequest(queue=q), timeout=30)  # no token: UNAUTHENTICATED
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        after = scrape(metrics_port)
    finally:
        channel.close()
        srv.proc.stop()
    counted = {
        ("Add", "ok"): 2, ("Pull", "ok"): 1, ("Ack", "error"): 1, ("Count", "error"): 1, ("Check", "ok"): 1,
    }
    for (operation, outcome), n in counted.items():
        assert delta(before, after, "boxqueue_api_requests_total", api="deckard", operation=operation,
                     outcome=outcome) == n, (operation, outcome)
    assert delta(before, after, "boxqueue_api_errors_total", api="deckard", code="INVALID_ARGUMENT") == 1
    assert delta(before, after, "boxqueue_api_errors_total", api="deckard", code="UNAUTHENTICATED") == 1
