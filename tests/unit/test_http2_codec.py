"""The HTTP/2 server codec, without sockets: frames in, events and frames out. The client side is
played by the ``h2`` library (a real HTTP/2 implementation) where it can make the frames, and by
hand for the frames a well-behaved client never sends."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from boxqueue.frontdoor.http2_codec import (
    DATA,
    ENHANCE_YOUR_CALM,
    F_CONTINUATION,
    F_DATA,
    F_HEADERS,
    F_PING,
    F_PUSH_PROMISE,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    HEAD_BLOCK,
    IDLE_FRAME_BURST,
    IDLE_FRAME_RATE,
    MAX_CONTINUATIONS,
    PREFACE,
    PROTOCOL_ERROR,
    REQUEST,
    RESET,
    RESET_BURST,
    RESET_RATE,
    WINDOW,
    Http2Error,
    ServerCodec,
    frame,
    literal,
)

HEAD = [(":method", "POST"), (":scheme", "http"), (":path", "/t.T/Echo"), (":authority", "x"),
        ("content-type", "application/grpc"), ("te", "trailers")]


class Pair:
    """A codec and an h2 client connected to it in memory."""

    def __init__(self, **kwargs) -> None:
        self.server = ServerCodec(**kwargs)
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.client.initiate_connection()
        self.events = self.to_server()
        self.to_client()

    def to_server(self) -> list:
        return self.server.receive(self.client.data_to_send())

    def to_client(self) -> list:
        return self.client.receive_data(self.server.data_to_send())


def test_a_unary_call_both_ways():
    p = Pair()
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, HEAD)
    p.client.send_data(sid, b"\x00\x00\x00\x00\x02hi", end_stream=True)
    events = p.to_server()
    assert events[0][:2] == (REQUEST, sid) and (b":path", b"/t.T/Echo") in events[0][2] and events[0][3] is False
    assert events[1] == (DATA, sid, b"\x00\x00\x00\x00\x02hi", True)
    p.server.send_head(sid)
    p.server.send_data(sid, b"\x00\x00\x00\x00\x02ho")
    p.server.send_head(sid, literal(b"grpc-status", b"0") + literal(b"grpc-message", b"fine"), end=True)
    got = p.to_client()
    kinds = [type(e) for e in got]
    assert h2.events.ResponseReceived in kinds and h2.events.TrailersReceived in kinds and h2.events.StreamEnded in kinds
    response = next(e for e in got if isinstance(e, h2.events.ResponseReceived))
    assert dict(response.headers) == {":status": "200", "content-type": "application/grpc"}
    trailers = next(e for e in got if isinstance(e, h2.events.TrailersReceived))
    assert dict(trailers.headers) == {"grpc-status": "0", "grpc-message": "fine"}
    assert next(e for e in got if isinstance(e, h2.events.DataReceived)).data == b"\x00\x00\x00\x00\x02ho"
    assert sid not in p.server.streams  # closed both ways


def test_heads_keep_the_clients_dynamic_table_in_step():
    """The client indexes its headers: the second and third heads refer to the first's entries."""
    p = Pair()
    for n in range(3):
        sid = p.client.get_next_available_stream_id()
        p.client.send_headers(sid, [*HEAD, ("x-request", f"r{n}"), ("authorization", "Bearer t")], end_stream=True)
        (event,) = p.to_server()
        assert (b"x-request", f"r{n}".encode()) in event[2] and (b"authorization", b"Bearer t") in event[2]


def test_a_repeated_head_means_what_the_dynamic_table_says_now():
    """A head of indexed fields only is kept decoded while the table stays the same; a head that
    adds to the table shifts every index, and the same bytes then mean other fields."""
    server = ServerCodec()
    server.receive(PREFACE + frame(4, 0, 0))
    encoder, reference = hpack.Encoder(), hpack.Decoder()
    first = encoder.encode([*HEAD, ("x-a", "1")])
    repeated = encoder.encode([*HEAD, ("x-a", "1")])  # every field in the table by now: indexed only
    assert all(b & 0x80 for b in repeated)
    for stream in (1, 3, 5):
        block = first if stream == 1 else repeated
        (event,) = server.receive(frame(F_HEADERS, 0x5, stream, block))
        assert event[0] == REQUEST and (b"x-a", b"1") in event[2] and (b":path", b"/t.T/Echo") in event[2]
    for block in (first, repeated):
        reference.decode(block, raw=True)
    adding = encoder.encode([*HEAD, ("x-a", "2")])  # a new entry: the older ones move up one index
    (event,) = server.receive(frame(F_HEADERS, 0x5, 7, adding))
    assert (b"x-a", b"2") in event[2]
    reference.decode(adding, raw=True)
    now = reference.decode(repeated, raw=True)
    assert (b":path", b"/t.T/Echo") not in now  # (the shifted indices no longer reach it)
    events = server.receive(frame(F_HEADERS, 0x5, 9, repeated))
    assert not [e for e in events if e[0] == REQUEST], "the head was answered from what it meant before"


def test_ping_settings_and_windows():
    p = Pair()
    p.client.ping(b"12345678")
    p.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
    events = p.to_server()
    assert (WINDOW, 0) in events
    got = p.to_client()
    assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678" for e in got)
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in got)
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, HEAD, end_stream=True)
    p.to_server()
    assert p.server.window(sid) == 100
    p.server.send_data(sid, b"x" * 100)
    assert p.server.window(sid) == 0
    p.client.increment_flow_control_window(50, stream_id=sid)
    assert (WINDOW, 0) in p.to_server()
    assert p.server.window(sid) == 50


def test_what_the_client_sends_is_acknowledged():
    p = Pair(stream_window=1000, connection_window=100_000)
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, HEAD)
    p.to_server()
    p.to_client()
    for _ in range(3):
        p.client.send_data(sid, b"y" * 400)
        p.to_server()
        p.to_client()
    # 1,200 bytes were sent on a window of 1,000: the codec's updates opened it again.
    assert p.client.local_flow_control_window(sid) >= 1000 - 400


def test_a_head_over_continuation_frames_and_padding():
    server = ServerCodec()
    server.receive(PREFACE + frame(4, 0, 0))
    block = hpack.Encoder().encode([*HEAD, (b"x-long", b"v" * 3000)])
    events = server.receive(frame(F_HEADERS, 0x8, 1, bytes([4]) + block[:1000] + b"\x00" * 4)
                            + frame(F_CONTINUATION, 0, 1, block[1000:2000])
                            + frame(F_CONTINUATION, 0x4, 1, block[2000:]))
    assert events[0][0] == REQUEST and (b"x-long", b"v" * 3000) in events[0][2]
    events = server.receive(frame(F_DATA, 0x8 | 0x1, 1, bytes([3]) + b"abc" + b"\x00" * 3))
    assert events == [(DATA, 1, b"abc", True)]


def test_frames_split_anywhere_are_put_back_together():
    p = Pair()
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, HEAD)
    p.client.send_data(sid, b"z" * 5000, end_stream=True)
    data = p.client.data_to_send()
    events = []
    for i in range(0, len(data), 7):
        events += p.server.receive(data[i:i + 7])
    assert events[0][0] == REQUEST
    assert b"".join(e[2] for e in events if e[0] == DATA) == b"z" * 5000


def test_too_many_streams_are_refused_and_resets_reported():
    server = ServerCodec(max_streams=2)
    server.receive(PREFACE + frame(4, 0, 0))
    encoder = hpack.Encoder()
    heads = b"".join(frame(F_HEADERS, 0x4, sid, encoder.encode(HEAD)) for sid in (1, 3, 5))
    events = server.receive(heads)
    assert [e[1] for e in events if e[0] == REQUEST] == [1, 3]
    assert frame(3, 0, 5, (7).to_bytes(4, "big")) in server.data_to_send()  # RST_STREAM REFUSED_STREAM
    assert server.receive(frame(3, 0, 1, (8).to_bytes(4, "big"))) == [(RESET, 1)]
    assert server.receive(frame(7, 0, 0, (3).to_bytes(4, "big") + (0).to_bytes(4, "big")))[0] == (GOAWAY, 3)


@pytest.mark.parametrize("bad", [
    b"GET / HTTP/1.1\r\n\r\n" + b"x" * 10,  # not HTTP/2
    PREFACE + frame(F_PUSH_PROMISE, 0x4, 1, b"\x00\x00\x00\x02"),
    PREFACE + frame(F_PING, 0, 1, b"12345678"),  # PING on a stream
    PREFACE + frame(F_PING, 0, 0, b"1234"),  # the wrong size
    PREFACE + (20000).to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01",  # over the frame size
    PREFACE + frame(F_HEADERS, 0x4, 2, HEAD_BLOCK),  # an even stream id
    PREFACE + frame(F_HEADERS, 0x4, 1, b"\xff\xff\xff\xff"),  # not HPACK
    PREFACE + frame(F_DATA, 0, 9, b"x"),  # DATA on an idle stream
    PREFACE + frame(F_HEADERS, 0, 1, HEAD_BLOCK) + frame(F_DATA, 0, 1, b""),  # no CONTINUATION
])
def test_protocol_errors_end_the_connection_with_a_goaway(bad):
    server = ServerCodec()
    with pytest.raises(Http2Error):
        server.receive(bad)
    assert 7 in frame_types(server.data_to_send())  # a GOAWAY was queued


def frame_types(out: bytes) -> list[int]:
    kinds, position = [], 0
    while position < len(out):
        kinds.append(out[position + 3])
        position += 9 + int.from_bytes(out[position:position + 3], "big")
    return kinds


def test_integers_and_literals_decode_as_hpack_says():
    decoder = hpack.Decoder()
    block = HEAD_BLOCK + literal(b"grpc-message", b"m" * 300) + literal(b"k" * 130, b"")
    assert decoder.decode(block, raw=True) == [(b":status", b"200"), (b"content-type", b"application/grpc"),
                                               (b"grpc-message", b"m" * 300), (b"k" * 130, b"")]
    assert not decoder.header_table.dynamic_entries  # nothing was added to the client's dynamic table


class FrozenClock:
    """The codec's clock, moved by hand: budgets refill only when the test says time passed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def opened(**kwargs) -> ServerCodec:
    server = ServerCodec(**kwargs)
    server.receive(PREFACE + frame(4, 0, 0))
    server.data_to_send()
    return server


def frames_of(out: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame in ``out``."""
    found, position = [], 0
    while position < len(out):
        length = int.from_bytes(out[position:position + 3], "big")
        found.append((out[position + 3], out[position + 4], int.from_bytes(out[position + 5:position + 9], "big"),
                      out[position + 9:position + 9 + length]))
        position += 9 + length
    return found


def error_code(excinfo: pytest.ExceptionInfo[Http2Error]) -> int:
    return excinfo.value.code


def test_a_lowered_header_table_size_is_followed_by_a_table_size_update():
    """nghttp's ``-c 0``: the client's decoder shrinks its table and expects our next head to
    begin with a dynamic table size update (RFC 7541 4.2); later heads need none."""
    server = opened()
    server.receive(frame(4, 0, 0, (1).to_bytes(2, "big") + (0).to_bytes(4, "big")))
    server.receive(frame(F_HEADERS, 0x5, 1, hpack.Encoder().encode(HEAD)))
    server.send_head(1, end=True)
    heads = [f for f in frames_of(server.data_to_send()) if f[0] == F_HEADERS]
    assert heads[0][3][:1] == b"\x20" and heads[0][3][1:] == HEAD_BLOCK
    decoder = hpack.Decoder()
    decoder.header_table_size = 0
    assert decoder.decode(heads[0][3], raw=True)[0] == (b":status", b"200")
    server.receive(frame(F_HEADERS, 0x5, 3, hpack.Encoder().encode(HEAD)))
    server.send_head(3, end=True)
    assert next(f for f in frames_of(server.data_to_send()) if f[0] == F_HEADERS)[3] == HEAD_BLOCK


@pytest.mark.parametrize("size", [2, 16384 - 5, 16384 - 4, 40000])
@pytest.mark.parametrize("table_update", [False, True])
def test_a_whole_answer_is_what_its_head_data_and_trailers_would_be(size: int, table_update: bool) -> None:
    """``send_answer`` (one piece) sends the frames ``send_head``, ``send_data`` and ``send_head``
    with ``end`` send, and leaves the windows and the stream as they leave them: with a table size
    update owed, and with a message over the client's frame size (then split)."""
    answers = []
    for whole in (False, True):
        server = opened()
        if table_update:
            server.receive(frame(4, 0, 0, (1).to_bytes(2, "big") + (0).to_bytes(4, "big")))
        server.receive(frame(F_HEADERS, 0x5, 1, hpack.Encoder().encode(HEAD)))
        server.data_to_send()
        data, trailers = b"\x00" + size.to_bytes(4, "big") + b"m" * size, literal(b"grpc-status", b"0")
        if whole:
            server.send_answer(1, data, trailers)
        else:
            server.send_head(1)
            server.send_data(1, data)
            server.send_head(1, trailers, end=True)
        answers.append((frames_of(server.data_to_send()), server.send_window, 1 in server.streams))
    assert answers[0] == answers[1]
    sent, window, still_open = answers[1]
    assert [f[0] for f in sent][:2] == [F_HEADERS, F_DATA] and sent[-1][:2] == (F_HEADERS, 0x5) and not still_open
    assert b"".join(f[3] for f in sent if f[0] == F_DATA) == b"\x00" + size.to_bytes(4, "big") + b"m" * size
    assert window == 65535 - 5 - size
    assert (sent[0][3][:1] == b"\x20") is table_update


def test_data_beyond_the_streams_window_is_a_flow_control_error():
    server = opened(stream_window=1000)
    encoder = hpack.Encoder()
    assert server.receive(frame(F_HEADERS, 0x4, 1, encoder.encode(HEAD)))[0][0] == REQUEST
    assert server.receive(frame(F_DATA, 0, 1, b"x" * 400))[0][0] == DATA
    assert server.receive(frame(F_DATA, 0, 1, b"x" * 601)) == [(RESET, 1)]  # 1,001 on a window of 1,000
    assert (3, 0, 1, FLOW_CONTROL_ERROR.to_bytes(4, "big")) in frames_of(server.data_to_send())
    assert server.receive(frame(F_DATA, 0x1, 1, b"late")) == []  # crossed the reset: dropped
    assert server.receive(frame(F_HEADERS, 0x5, 3, encoder.encode(HEAD)))[0][:2] == (REQUEST, 3)


@pytest.mark.parametrize("head", [
    [*HEAD[:5], ("Content-Type", "application/grpc")],  # upper case
    [*HEAD, ("connection", "keep-alive")],
    [*HEAD, ("te", "gzip")],
    [*HEAD, ("x-a b", "v")],  # a space in a name
    [*HEAD, ("x-v", " padded")],
    [*HEAD, ("x-v", "a\x00b")],
    [("content-type", "application/grpc"), *HEAD[:4]],  # a pseudo-header after a regular field
    [*HEAD[:4], (":status", "200"), *HEAD[4:]],  # a response's pseudo-header
    [*HEAD[:4], (":path", "/again"), *HEAD[4:]],  # twice
    [h for h in HEAD if h[0] != ":scheme"],  # missing
    [(":method", "POST"), (":scheme", "http"), (":path", ""), *HEAD[3:]],  # empty
])
def test_a_malformed_request_is_a_stream_error(head):
    """RFC 9113 8.2 and 8.3: the stream is reset with PROTOCOL_ERROR, no request reaches the
    server, and the connection goes on."""
    server = opened()
    encoder = hpack.Encoder()
    assert server.receive(frame(F_HEADERS, 0x5, 1, encoder.encode(head))) == []
    assert (3, 0, 1, PROTOCOL_ERROR.to_bytes(4, "big")) in frames_of(server.data_to_send())
    assert server.receive(frame(F_DATA, 0x1, 1, b"crossed")) == []
    assert server.receive(frame(F_HEADERS, 0x5, 3, encoder.encode(HEAD)))[0][:2] == (REQUEST, 3)


def test_trailers_with_a_pseudo_header_reset_the_stream():
    server = opened()
    encoder = hpack.Encoder()
    server.receive(frame(F_HEADERS, 0x4, 1, encoder.encode(HEAD)))
    assert server.receive(frame(F_HEADERS, 0x5, 1, encoder.encode([(":path", "/x")]))) == [(RESET, 1)]
    assert (3, 0, 1, PROTOCOL_ERROR.to_bytes(4, "big")) in frames_of(server.data_to_send())


def test_a_stream_id_going_backwards_and_a_window_update_on_an_idle_stream_end_the_connection():
    encoder = hpack.Encoder()
    server = opened()
    server.receive(frame(F_HEADERS, 0x5, 5, encoder.encode(HEAD)))
    with pytest.raises(Http2Error) as err:
        server.receive(frame(F_HEADERS, 0x5, 3, encoder.encode(HEAD)))
    assert error_code(err) == PROTOCOL_ERROR
    assert frames_of(server.data_to_send())[-1][0] == 7  # GOAWAY
    server = opened()
    encoder = hpack.Encoder()
    server.receive(frame(F_HEADERS, 0x5, 1, encoder.encode(HEAD)))
    server.receive(frame(8, 0, 1, (10).to_bytes(4, "big")))  # an open stream: fine
    with pytest.raises(Http2Error) as err:
        server.receive(frame(8, 0, 9, (10).to_bytes(4, "big")))
    assert error_code(err) == PROTOCOL_ERROR


def test_rapid_resets_end_the_connection_with_enhance_your_calm():
    """HEADERS then RST_STREAM, again and again, on a codec of 2 streams: the budget of resets
    (RESET_BURST at once) runs out and the connection ends; a client that waits gets it back."""
    clock = FrozenClock()
    server = opened(max_streams=2, clock=clock)
    encoder = hpack.Encoder()
    requests = 0
    with pytest.raises(Http2Error) as err:
        for sid in range(1, 4001, 2):
            events = server.receive(frame(F_HEADERS, 0x4, sid, encoder.encode(HEAD)) + frame(3, 0, sid, (8).to_bytes(4, "big")))
            requests += sum(1 for e in events if e[0] == REQUEST)
    assert error_code(err) == ENHANCE_YOUR_CALM
    assert requests == RESET_BURST
    server = opened(max_streams=2, clock=clock)
    encoder = hpack.Encoder()
    for n in range(3 * RESET_BURST):
        sid = 2 * n + 1
        clock.now += 1 / (RESET_RATE / 2)  # half the rate: never refused
        server.receive(frame(F_HEADERS, 0x4, sid, encoder.encode(HEAD)) + frame(3, 0, sid, (8).to_bytes(4, "big")))


def test_streams_refused_over_the_limit_count_as_resets():
    server = opened(max_streams=1, clock=FrozenClock())
    encoder = hpack.Encoder()
    server.receive(frame(F_HEADERS, 0x4, 1, encoder.encode(HEAD)))
    with pytest.raises(Http2Error) as err:
        for sid in range(3, 4001, 2):
            server.receive(frame(F_HEADERS, 0x4, sid, encoder.encode(HEAD)))
    assert error_code(err) == ENHANCE_YOUR_CALM


def test_a_continuation_flood_ends_the_connection():
    """Empty CONTINUATION frames after a head that never ends (the 2024 CONTINUATION flood)."""
    server = opened()
    server.receive(frame(F_HEADERS, 0, 1, hpack.Encoder().encode(HEAD)))
    with pytest.raises(Http2Error) as err:
        server.receive(frame(F_CONTINUATION, 0, 1) * (MAX_CONTINUATIONS + 1))
    assert error_code(err) == ENHANCE_YOUR_CALM


@pytest.mark.parametrize("flood", [
    frame(F_PING, 0, 0, b"12345678"),
    frame(4, 0, 0),  # an empty SETTINGS
    frame(2, 0, 1, b"\x00\x00\x00\x00\x10"),  # PRIORITY
    frame(0xBB, 0, 0, b"?"),  # a type nobody knows
])
def test_frames_without_work_are_budgeted(flood):
    clock = FrozenClock()
    server = opened(clock=clock)
    server.receive(flood * (IDLE_FRAME_BURST - 1))
    clock.now += 1.0  # refilled at IDLE_FRAME_RATE
    server.receive(flood * int(IDLE_FRAME_RATE))
    with pytest.raises(Http2Error) as err:
        server.receive(flood * 2)
    assert error_code(err) == ENHANCE_YOUR_CALM


def test_partial_input_is_reported():
    server = ServerCodec()
    assert server.partial()
    server.receive(PREFACE + frame(4, 0, 0))
    assert not server.partial()
    block = hpack.Encoder().encode(HEAD)
    server.receive(frame(F_HEADERS, 0, 1, block))
    assert server.partial()  # a head awaiting its CONTINUATION
    server.receive(frame(F_CONTINUATION, 0x4, 1))
    assert not server.partial()
    server.receive(frame(F_DATA, 0, 1, b"abc")[:5])
    assert server.partial()
