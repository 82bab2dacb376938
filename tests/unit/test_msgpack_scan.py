"""boxqueue.spaces.msgpack_scan: offsets found by walking msgpack bytes agree with msgpack's own decoding,
and malformed arrays are refused; tubes.task's rettask built on it."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxqueue.spaces import msgpack_scan
from boxqueue.spaces.msgpack_values import Raw, array_header, pack_array, unpack
from boxqueue.tubes.task import rettask

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False),
    st.text(max_size=300), st.binary(max_size=300),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5),
                      max_leaves=20)


@given(st.lists(values, max_size=40), st.integers(0, 45))
def test_offsets_are_where_each_item_starts(items, upto):
    raw = msgpack.packb(items, use_bin_type=True)
    count, offsets = msgpack_scan.fields_at(raw, upto)
    assert count == len(items)
    assert len(offsets) == upto + 1
    for i in range(min(count, upto)):
        assert msgpack.unpackb(raw[offsets[i]:offsets[i + 1]], raw=False, strict_map_key=False) == items[i]
    if count <= upto:
        assert offsets[count:] == [len(raw)] * (upto + 1 - count)


@given(st.lists(values, max_size=40), st.lists(values, max_size=20), st.sampled_from([0, 5, 20000, 70000]))
def test_a_replaced_head_decodes_as_the_head_then_the_kept_items(items, head, padding):
    """A task's header rewrite: the stored array with its first items replaced, the others kept as
    bytes; ``padding`` items more cross the 16-bit and 32-bit array header widths."""
    items = items + [None] * padding
    raw = msgpack.packb(items, use_bin_type=True)
    count, new_raw = msgpack_scan.head_replaced(raw, len(head), msgpack.packb(head, use_bin_type=True))
    assert count == len(items)
    assert unpack(new_raw) == head + items[len(head):]


def test_a_replaced_head_needs_two_whole_arrays():
    with pytest.raises(ValueError, match="another length"):
        msgpack_scan.head_replaced(msgpack.packb([1, 2, 3]), 2, msgpack.packb([1]))
    for raw in (msgpack.packb({1: 2}), msgpack.packb([1, 2])[:-1], msgpack.packb([1, 2]) + b"\x01"):
        with pytest.raises(ValueError):
            msgpack_scan.head_replaced(raw, 1, msgpack.packb([9]))


@given(st.lists(values, max_size=20), st.integers(0, 25))
def test_leading_items_decode_as_msgpack_does(items, upto):
    """Recovery's header decoding: integers of every width, strings of every width, and what it
    hands to the unpacker, equal to the whole array's decoding."""
    raw = msgpack.packb(items, use_bin_type=True)
    assert msgpack_scan.leading_items(raw, upto, unpack) == unpack(raw)[:upto]


def test_leading_items_keep_what_the_unpacker_keeps():
    texts = ["", "a" * 31, "b" * 32, "c" * 255, "d" * 256, "e" * 70000, "\udcff"]
    raw = msgpack.packb([0, 127, 128, -1, -32, -33, -129, -(2**15) - 1, -(2**31) - 1, -(2**63), 2**64 - 1,
                         2**32, 1.5, None, True, False, b"\x00", [1], {"k": 1}]
                        + [t.encode("utf-8", "surrogateescape") for t in texts], use_bin_type=False)
    assert msgpack_scan.leading_items(raw, 100, unpack) == unpack(raw)
    for bad in (b"\x81\x01\x02", b"\x92\x01", b"\x91\xc1", b"\x91\xd9\x05ab", b"\x91\xcf\x00"):
        with pytest.raises(ValueError):
            msgpack_scan.leading_items(bad, 3, unpack)


@pytest.mark.parametrize("n", [15, 16, 65535, 65536])
def test_every_array_header_width(n):
    raw = msgpack.packb(list(range(n)))
    count, offsets = msgpack_scan.fields_at(raw, 3)
    assert count == n and msgpack.unpackb(raw[offsets[2]:offsets[3]]) == 2


@pytest.mark.parametrize("raw", [b"", b"\x81\x01\x02", b"\x92\x01", b"\x91\xc1", b"\x91\x01\x02", b"\x91\xd9\x05ab"])
def test_malformed_arrays_are_refused(raw):
    with pytest.raises(ValueError):
        msgpack_scan.fields_at(raw, 3)


def test_rettask():
    header = ["a" * 32, "tube", "t", 1, 2, 3, 4, 5, 6, 7, 8, 9]
    raw = msgpack.packb([*header, "data", {"k": [1, 2]}])
    assert msgpack.unpackb(rettask(raw)) == ["a" * 32, "tube", "taken", "data", {"k": [1, 2]}]
    unknown = msgpack.packb(["id", "tube", "zz", 1])
    assert msgpack.unpackb(rettask(unknown)) == ["id", "tube", "zz"]  # an unknown status as stored
    with pytest.raises(ValueError):
        rettask(msgpack.packb(["id", "tube"]))
    # Exactly three fields; the data from the tube layout's place (14); the tuple checked to its end.
    assert msgpack.unpackb(rettask(msgpack.packb(["id", "tube", "b"]))) == ["id", "tube", "buried"]
    tube_layout = msgpack.packb([*header, {"a": 1}, {"b": 2}, "d1", "d2"])
    assert msgpack.unpackb(rettask(tube_layout, 14)) == ["a" * 32, "tube", "taken", "d1", "d2"]
    for bad in (raw + b"\x01", raw[:-1], b"\x81\x01\x02", b""):
        with pytest.raises(ValueError):
            rettask(bad)


@pytest.mark.parametrize("value", [
    "s" * 300, "s" * 70_000, b"b" * 300, b"b" * 70_000,  # str16, str32, bin16, bin32
    {str(i): i for i in range(20)}, {str(i): i for i in range(70_000)},  # map16, map32
    list(range(70_000)), msgpack.ExtType(5, b"e" * 300), msgpack.ExtType(5, b"e" * 70_000),
])
def test_16_and_32_bit_sizes(value):
    raw = msgpack.packb([value, 1], use_bin_type=True)
    count, offsets = msgpack_scan.fields_at(raw, 2)
    assert count == 2 and raw[offsets[1]:offsets[2]] == b"\x01" and offsets[2] == len(raw)
    assert msgpack_scan.skip(raw, offsets[0], offsets[1] - 1) == -1  # one byte short: refused


@pytest.mark.parametrize("values", [
    [], [1, "a"], [Raw(msgpack.packb(["t", 1]))], [Raw(msgpack.packb([1])), 2, [Raw(msgpack.packb("x"))]],
    [Raw(msgpack.packb(i)) for i in range(20)], list(range(70_000)),
])
def test_pack_array_embeds_raw_pieces(values):
    """A list with msgpack pieces in it (a call's stored tuples) packs as if they were decoded."""
    def plain(v):
        if isinstance(v, Raw):
            return msgpack.unpackb(v)
        return [plain(x) for x in v] if isinstance(v, list) else v

    assert msgpack.unpackb(pack_array(values), strict_map_key=False) == [plain(v) for v in values]


@pytest.mark.parametrize("n", [0, 1, 15, 16, 0xFFFF, 0x10000])
def test_array_headers(n):
    header = array_header(n)
    assert len(header) == (1 if n < 16 else 3 if n < 0x10000 else 5)
    assert msgpack.unpackb(header + b"\x01" * n) == [1] * n
