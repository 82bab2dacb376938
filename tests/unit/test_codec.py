"""The iproto codec, bytes in and events out, without a network."""

import msgpack
import pytest

from boxqueue.errcodes import ER, BoxError
from boxqueue.iproto import codec
from boxqueue.iproto.greeting import (
    GREETING_SIZE,
    binary_greeting,
    console_greeting,
    parse_greeting,
)


def frame(header, body=None, prefix="short"):
    payload = msgpack.packb(header) + (msgpack.packb(body) if body is not None else b"")
    if prefix == "short":
        return msgpack.packb(len(payload)) + payload
    return b"\xce" + len(payload).to_bytes(4, "big") + payload


def events(data, max_packet=1 << 20):
    decoder = codec.RequestDecoder(max_packet)
    decoder.feed(data)
    out = []
    while (event := decoder.next_event()) is not None:
        out.append(event)
    return out


def test_python_style_ping_without_body():
    data = bytes.fromhex("07 83 00 40 01 00 05 00".replace(" ", ""))
    [req] = events(data)
    assert (req.type, req.sync, req.schema_version, req.body) == (codec.PING, 0, 0, {})


def test_node_style_prefix_and_pipelining():
    one = frame({0: codec.PING, 1: 1}, prefix="ce")
    two = frame({0: codec.SELECT, 1: 2}, {0x10: 512, 0x12: 1, 0x20: [1]}, prefix="ce")
    reqs = events(one + two)
    assert [r.sync for r in reqs] == [1, 2]
    assert reqs[1].body == {0x10: 512, 0x12: 1, 0x20: [1]}


def test_every_uint_width_of_the_length_prefix():
    payload = msgpack.packb({0: codec.PING, 1: 9})
    for prefix in (bytes([len(payload)]), b"\xcc" + bytes([len(payload)]),
                   b"\xcd" + len(payload).to_bytes(2, "big"), b"\xcf" + len(payload).to_bytes(8, "big")):
        [req] = events(prefix + payload)
        assert req.sync == 9


def test_bytes_arriving_one_at_a_time():
    data = frame({0: codec.INSERT, 1: 5}, {0x10: 512, 0x21: [1, "x"]})
    decoder = codec.RequestDecoder()
    got = []
    for i in range(len(data)):
        decoder.feed(data[i : i + 1])
        event = decoder.next_event()
        if event is not None:
            got.append(event)
    assert len(got) == 1 and got[0].sync == 5


def test_insert_keeps_tuple_bytes_exactly():
    # A uint32-encoded 5 and a str holding bytes that are not UTF-8: both must survive.
    raw_tuple = b"\x92\xce\x00\x00\x00\x05\xa2\xff\xfe"
    body = b"\x82\x10\xcd\x02\x00\x21" + raw_tuple
    header = msgpack.packb({0: codec.INSERT, 1: 3})
    data = msgpack.packb(len(header) + len(body)) + header + body
    [req] = events(data)
    assert req.tuple_raw == raw_tuple
    assert req.body[0x21][0] == 5
    assert req.body[0x21][1].encode("utf-8", "surrogateescape") == b"\xff\xfe"


def test_bad_length_prefix_is_fatal():
    with pytest.raises(codec.FramingError) as err:
        events(b"\xa3abc")
    assert err.value.error.code == ER.INVALID_MSGPACK
    assert err.value.error.message == "Invalid MsgPack - packet length"


def test_huge_length_prefix_is_refused_before_buffering():
    with pytest.raises(codec.FramingError):
        events(b"\xce\x7f\xff\xff\xff", max_packet=1024)


def test_header_not_a_map():
    [bad] = events(msgpack.packb(2) + b"\x91\x01")
    assert isinstance(bad, codec.BadRequest)
    assert bad.sync == 0 and bad.error.message == "Invalid MsgPack - packet header"


def test_body_not_a_map_keeps_sync():
    [bad] = events(frame({0: codec.SELECT, 1: 77}, [1, 2]))
    assert isinstance(bad, codec.BadRequest)
    assert bad.sync == 77 and bad.error.message == "Invalid MsgPack - packet body"


def test_truncated_body_inside_a_packet():
    header = msgpack.packb({0: codec.SELECT, 1: 4})
    body = b"\x81\x10"  # a map whose value is missing
    [bad] = events(msgpack.packb(len(header) + len(body)) + header + body)
    assert isinstance(bad, codec.BadRequest) and bad.sync == 4


def test_missing_request_type_is_zero():
    [req] = events(frame({1: 3}))
    assert req.type == 0


def test_response_header_is_fixed_width():
    packet = codec.response(7, 85, codec.EMPTY_BODY)
    assert packet == bytes.fromhex(
        "ce00000018" "83" "00ce00000000" "01cf0000000000000007" "05ce00000055" "80"
    )


def test_select_response_uses_array32():
    packet = codec.response(1, 85, codec.data_body_from_tuples([msgpack.packb([1, "one"])]))
    assert packet.endswith(bytes.fromhex("8130dd000000019201a36f6e65"))
    assert len(packet) - 5 == int.from_bytes(packet[1:5], "big")


def test_error_response_carries_both_encodings():
    err = BoxError(ER.UNKNOWN_REQUEST_TYPE, 73)
    packet = codec.error_response(9, 85, err)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(packet[5:])
    header, body = list(unpacker)
    assert header == {0: 0x8000 | 48, 1: 9, 5: 85}
    assert body[0x31] == "Unknown request type 73"
    [entry] = body[0x52][0]
    assert {k: entry[k] for k in range(6)} == {
        0: "ClientError", 1: entry[1], 2: entry[2], 3: "Unknown request type 73", 4: 0, 5: 48,
    }


def test_access_denied_has_fields():
    from boxqueue.errcodes import access_denied

    body = msgpack.unpackb(codec.error_body(access_denied("Read", "space", "t", "bob")), strict_map_key=False)
    entry = body[0x52][0][0]
    assert entry[0] == "AccessDeniedError"
    assert entry[6] == {"object_type": "space", "object_name": "t", "access_type": "Read"}
    assert body[0x31] == "Read access to space 't' is denied for user 'bob'"


def test_binary_greeting_layout():
    data, salt = binary_greeting("f9eaadc1-8dae-4a12-92ec-9eb5260fb101", b"\x01" * 32)
    assert len(data) == GREETING_SIZE == 128
    assert data[63:64] == b"\n" and data[127:128] == b"\n"
    assert data.startswith(b"Tarantool 2.11.0 (Binary) f9eaadc1-8dae-4a12-92ec-9eb5260fb101")
    assert b"\x00" not in data
    parsed = parse_greeting(data)
    assert parsed["protocol"] == "Binary" and parsed["salt"] == salt


def test_console_greeting_layout():
    data = console_greeting()
    assert len(data) == 128
    assert data.split(b"\n")[0].rstrip().endswith(b"(Lua console)")


def test_long_stream_in_random_chunks_keeps_every_tuple_exact():
    import random

    rng = random.Random(7)
    packets, expected = [], []
    for i in range(3000):
        raw_tuple = msgpack.packb([i, "v" * rng.randrange(0, 200)])
        body = b"\x82\x10\xcd\x02\x00\x21" + raw_tuple
        header = msgpack.packb({0: codec.REPLACE, 1: i})
        packets.append(b"\xce" + (len(header) + len(body)).to_bytes(4, "big") + header + body)
        expected.append((i, raw_tuple))
    stream = b"".join(packets)
    decoder = codec.RequestDecoder()
    got = []
    pos = 0
    while pos < len(stream):
        step = rng.randrange(1, 9000)
        decoder.feed(stream[pos : pos + step])
        pos += step
        while (event := decoder.next_event()) is not None:
            got.append((event.sync, event.tuple_raw))
    assert got == expected
    assert decoder.buffered == 0


def test_a_malformed_packet_between_good_ones():
    good = frame({0: codec.PING, 1: 1})
    bad = frame({0: codec.SELECT, 1: 2}, [1, 2])  # body is not a map
    unhashable = b"\x92\x01\x81\x91\x01\xa1x"  # [1, {[1]: 'x'}]: a map key Python cannot hash
    body = b"\x82\x10\xcd\x02\x00\x21" + unhashable
    header = msgpack.packb({0: codec.INSERT, 1: 3})
    odd = b"\xce" + (len(header) + len(body)).to_bytes(4, "big") + header + body
    reqs = events(good + bad + odd + good)
    assert [type(r).__name__ for r in reqs] == ["Request", "BadRequest", "Request", "Request"]
    assert reqs[1].sync == 2
    assert reqs[2].tuple_raw == unhashable
    assert reqs[2].body[0x21][1].pairs == [([1], "x")]


def test_packets_off_the_fast_path_leave_nothing_behind():
    """Every packet the fast decoder hands to the general path (ID's feature list, a header key it
    does not read, a map in a tuple, a body that is not a map) must not leave memory behind: a
    shared exception instance used to grow its traceback by three frames per such packet."""
    import gc
    import tracemalloc

    shapes = [
        frame({0: codec.ID, 1: 7}, {0x54: 3, 0x55: [0, 1, 2, 3]}),
        frame({0: codec.PING, 1: 8, 0x04: 1}),  # a header key outside the fast path's set
        frame({0: codec.REPLACE, 1: 9}, {0x10: 512, 0x21: [1, {"a": 1}]}),
        frame({0: codec.SELECT, 1: 10}, [1, 2]),
        frame({0: codec.AUTH, 1: 11}, {0x23: "guest", 0x21: ["chap-sha1", b"x" * 20]}),
    ]
    data = b"".join(shapes)
    decoder = codec.RequestDecoder()

    def run(rounds):
        for _ in range(rounds):
            decoder.feed(data)
            while decoder.next_event() is not None:
                pass

    run(200)
    gc.collect()
    tracemalloc.start()
    try:
        run(20)
        before = tracemalloc.get_traced_memory()[0]
        run(4000)  # 20,000 packets off the fast path
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"the decoder kept {grown} bytes after 20,000 packets"
