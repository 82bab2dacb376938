"""msgpack_values.pack: strings that were not UTF-8 go back out as the bytes they came from.

A str decoded with ``surrogateescape`` holds lone surrogates for the bytes that were not UTF-8.
pack tries msgpack's strict UTF-8 path first (the fast one) and falls back to the escaping packer
for a value holding such a string, wherever it sits (alone, in an array, in a map, in a map that
must be packed as pairs, in a reply built by pack_array).
"""

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from boxqueue.spaces.msgpack_values import PairsMap, Raw, pack, pack_array, pack_flat, unpack

NOT_UTF8 = b"\xff\xfe".decode("utf-8", "surrogateescape")


def escaped(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True, unicode_errors="surrogateescape")


def test_a_string_that_was_not_utf8_packs_as_its_bytes_wherever_it_sits():
    assert pack(NOT_UTF8) == b"\xa2\xff\xfe"
    for value in (["ok", NOT_UTF8, 1], {"k": NOT_UTF8}, {NOT_UTF8: [NOT_UTF8]}, [[1, [NOT_UTF8]]]):
        assert pack(value) == escaped(value)
        assert unpack(pack(value)) == value
    pairs = PairsMap([([1], NOT_UTF8)])
    assert pack(pairs) == b"\x81\x91\x01\xa2\xff\xfe"
    assert pack_array(["a", NOT_UTF8]) == escaped(["a", NOT_UTF8])
    assert pack_array([Raw(b"\xc0"), NOT_UTF8]) == b"\x92\xc0\xa2\xff\xfe"


def test_the_strict_packer_is_unharmed_by_a_fallback():
    assert pack(["x", NOT_UTF8]) == escaped(["x", NOT_UTF8])
    assert pack(["x", "é"]) == b"\x92\xa1x\xa2\xc3\xa9"  # (no bytes of the failed attempt left behind)


@given(st.lists(st.one_of(st.binary(max_size=40), st.text(max_size=20), st.integers(-(2**63), 2**64 - 1),
                          st.none(), st.booleans()), max_size=12))
def test_pack_gives_the_bytes_the_escaping_packer_gives(items):
    """Any mix of strings (from arbitrary bytes, surrogateescape-decoded, or text), byte strings,
    integers, nil and booleans: pack and msgpack with surrogateescape agree byte for byte."""
    values = [v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) and len(v) % 2 else v for v in items]
    assert pack(values) == escaped(values)
    assert pack_array(values) == escaped(values)


FLAT_ITEMS = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.integers(-300, 300),
    st.sampled_from([0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 2**32 - 1, 2**32, 2**63 - 1, -32, -33, -128, -129,
                     -(2**15), -(2**15) - 1, -(2**31), -(2**31) - 1, -(2**63)]),
    st.text(max_size=300), st.text(alphabet=st.characters(max_codepoint=127), max_size=300),
    st.none(), st.booleans(), st.binary(max_size=300), st.just({}),
    st.floats(allow_nan=False), st.lists(st.integers(-5, 5), max_size=3),  # pack's own path
)


@given(st.lists(FLAT_ITEMS, max_size=20))
def test_pack_flat_gives_msgpacks_bytes(items):
    """pack_flat writes small lists of ASCII strings, byte strings, integers (every width, both
    signs, at each edge), nil, booleans and empty maps itself, and leaves the rest to pack: the
    bytes are msgpack's."""
    assert pack_flat(items) == escaped(items)


def test_pack_flat_of_a_task_header():
    header = ["01a22727657a72c19acea22525cfd9ce", "bench", "r", 1798113223034705, 127, 128, 0,
              1795953223034705, 2160000000000, 60000000, 0, 0, "x" * 64]
    assert pack_flat(header) == escaped(header)
    assert pack_flat([NOT_UTF8, -1]) == escaped([NOT_UTF8, -1])
