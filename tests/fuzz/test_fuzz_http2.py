"""HTTP/2 under fuzz: the codec of our own (``boxqueue/frontdoor/http2_codec.py``) and the gRPC server
over it, with frames of every type, random flags, stream ids and payloads, and random bytes.

The codec, in process: whatever arrives, it returns events or raises :class:`Http2Error` (with a
GOAWAY queued), never another exception, and holds at most one frame of unparsed bytes. The
server (Deckard's listener): after the frames, a well-behaved client on another connection is
served, the process is alive, nothing acknowledged is lost, and memory stays flat
(``memory_bounded``, replaying the examples)."""

from __future__ import annotations

import socket

from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpc_health.v1.health_pb2_grpc import HealthStub
from hypothesis import given
from hypothesis import strategies as st

from boxqueue.frontdoor.http2_codec import MAX_FRAME, PREFACE, Http2Error, ServerCodec, frame
from tests.fuzz.conftest import fuzz_settings

# Mostly well-formed frames (a head the codec can decode among them) so the fuzzing gets past the
# frame layer; flags and stream ids from small sets so streams are opened, continued and reset.
HEAD = bytes.fromhex("8386") + b"\x04\x0c/t.T/Method" + b"\x5f\x10application/grpc"  # POST, http, :path, content-type
frames = st.builds(
    frame,
    st.integers(0, 11),
    st.sampled_from([0, 0x1, 0x4, 0x5, 0x8, 0x20, 0x25, 0xFF]),
    st.sampled_from([0, 1, 3, 5, 7, 2, 2**31 - 1]),
    st.one_of(st.just(HEAD), st.just(b"\x00\x00\x00\x00\x02hi"), st.binary(max_size=64),
              st.binary(min_size=4, max_size=8)),
)
chunks = st.lists(frames, max_size=20).map(b"".join) | st.binary(max_size=300)


@fuzz_settings(400)
@given(data=chunks, split=st.integers(1, 64))
def test_the_codec_answers_anything_with_events_or_a_protocol_error(data, split):
    codec = ServerCodec(max_streams=4)
    codec.receive(PREFACE)
    try:
        for start in range(0, len(data), split):
            events = codec.receive(data[start:start + split])
            assert all(isinstance(event, tuple) and isinstance(event[0], int) for event in events)
            assert len(codec._buffer) <= 9 + MAX_FRAME
            assert len(codec.streams) <= 4
    except Http2Error:
        assert 7 in _types(codec.data_to_send())  # a GOAWAY is queued


def _types(out: bytes) -> list[int]:
    kinds, position = [], 0
    while position + 9 <= len(out):
        kinds.append(out[position + 3])
        position += 9 + int.from_bytes(out[position:position + 3], "big")
    return kinds


PING_BACK = frame(6, 0x1, 0, b"fuzzdone")  # the server's answer to the PING that ends an example


def send_frames(port: int, data: bytes) -> int:
    """One connection: the preface, the frames and a PING; then read until the PING's answer or
    the connection's end (a GOAWAY first), whichever the frames led to."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(PREFACE + frame(4, 0, 0) + data + frame(6, 0, 0, b"fuzzdone"))
        received = b""
        try:
            while PING_BACK not in received and (chunk := sock.recv(65536)):
                received += chunk
        except ConnectionResetError:
            pass
    return 1


@fuzz_settings(60)
@given(data=st.lists(frames, max_size=12).map(b"".join))
def test_random_frames_to_the_grpc_listener(target, memory_bounded, data):
    target.replayable(lambda: send_frames(target.grpc_port, data))
    send_frames(target.grpc_port, data)
    target.check_alive()
    health = HealthStub(target.deckard).Check(HealthCheckRequest(service=""), timeout=30)
    assert health.status == HealthCheckResponse.SERVING  # another client is served


def test_the_sentinels_survive_http2_fuzzing(target):
    target.check_sentinels()
