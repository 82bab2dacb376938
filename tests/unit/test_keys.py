"""The key encoding must order keys exactly as Tarantool compares them."""

import decimal
import uuid
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from boxqueue.spaces.msgpack_values import Datetime
from boxqueue.storage import keys

D = decimal.Decimal


def test_scalar_order_observed_on_tarantool():
    # The order a scalar index gave on Tarantool 2.6 (iproto notes, section 7.2).
    ordered = [
        False, True, float("-inf"), -9223372036854775808, -3, -0.5, 0, 1.0, 2.5, 5,
        10000000000000000000, float("inf"), "ABC", "abc", "b", b"\x00bin", b"abc",
    ]
    encoded = [keys.encode([v]) for v in ordered]
    assert encoded == sorted(encoded)
    assert len(set(encoded)) == len(encoded)


def test_class_order():
    values = [None, False, 7, "s", b"b", uuid.UUID(int=1), Datetime(0)]
    encoded = [keys.encode_part(v) for v in values]
    assert encoded == sorted(encoded)


def test_equal_numbers_encode_equal():
    assert keys.encode([1]) == keys.encode([1.0]) == keys.encode([D("1.00")])
    assert keys.encode([-0.0]) == keys.encode([0])
    assert keys.encode([D("0.5")]) == keys.encode([0.5])


def test_large_integers_stay_exact():
    top = 2**64 - 1
    assert keys.encode([top - 1]) < keys.encode([top])
    assert keys.encode([2**53 + 1]) > keys.encode([float(2**53)])
    assert keys.encode([-(2**63)]) < keys.encode([-(2**63) + 1])


def test_decimal_between_doubles():
    assert keys.encode([0.1]) > keys.encode([D("0.1")])  # the double 0.1 is a little above 1/10
    assert keys.encode([D("0.1")]) > keys.encode([0.09999999999999999])


def test_strings_with_nul_and_prefixes():
    values = ["", "a", "a\x00", "a\x00b", "ab", "b"]
    encoded = [keys.encode([v]) for v in values]
    assert encoded == sorted(encoded)


def test_prefix_of_key_is_byte_prefix():
    full = keys.encode([1, "x", 2.5])
    assert full.startswith(keys.encode([1, "x"]))
    assert full.startswith(keys.encode([1]))


def test_successor():
    assert keys.successor(b"ab") == b"ac"
    assert keys.successor(b"a\xff") == b"b"
    assert keys.successor(b"\xff\xff") is None


def test_long_keys_are_cut_with_a_digest():
    long_key = keys.encode(["x" * 1000])
    stored = keys.stored_form(long_key)
    assert len(stored) == keys.TRUNCATED_LEN
    assert keys.is_truncated(stored)
    assert stored != keys.stored_form(keys.encode(["x" * 999 + "y"]))
    assert keys.stored_form(b"short") == b"short"


def _exact(v):
    if isinstance(v, float):
        return Fraction(v)
    return Fraction(v)


numbers = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
        lambda d: d.is_finite() and abs(d.adjusted()) < 60
    ),
)


@given(numbers, numbers)
def test_numbers_order_by_exact_value(a, b):
    ka, kb = keys.encode([a]), keys.encode([b])
    if a in (float("inf"), float("-inf")) or b in (float("inf"), float("-inf")):
        fa = a if isinstance(a, float) else float(a) if abs(a) < 1e300 else a
        fb = b if isinstance(b, float) else float(b) if abs(b) < 1e300 else b
        if fa < fb:
            assert ka < kb
        elif fa > fb:
            assert ka > kb
        return
    ea, eb = _exact(a), _exact(b)
    assert (ka < kb) == (ea < eb)
    assert (ka == kb) == (ea == eb)


@given(st.lists(st.one_of(st.text(), st.integers(min_value=0, max_value=2**64 - 1)), min_size=2, max_size=2),
       st.lists(st.one_of(st.text(), st.integers(min_value=0, max_value=2**64 - 1)), min_size=2, max_size=2))
def test_composite_keys_order_part_by_part(a, b):
    def rank(v):
        return (1, v.encode("utf-8", "surrogatepass")) if isinstance(v, str) else (0, v)

    ra, rb = [rank(v) for v in a], [rank(v) for v in b]
    ka, kb = keys.encode(a), keys.encode(b)
    assert (ka < kb) == (ra < rb)


@given(st.integers(min_value=-10, max_value=2**64 - 1))
def test_fast_unsigned_key_matches_the_general_encoding(value):
    fast = keys.encode_unsigned_key(value)
    if fast is not None:
        assert fast == keys.stored_form(keys.encode([value]))
    else:
        assert value < 0 or value > 2**53


@given(st.text())
def test_fast_string_key_matches_the_general_encoding(value):
    fast = keys.encode_string_key(value)
    if fast is not None:
        assert fast == keys.stored_form(keys.encode([value]))
    assert keys.encode_string_key(value.encode("utf-8", "surrogatepass")) is None


@given(st.integers(min_value=0, max_value=2**53) | st.integers(min_value=0, max_value=5000))
def test_unsigned_parts_are_the_sortable_double_of_the_value(value):
    # The integer path works the double's bits out without a float; it must agree with one.
    import struct

    bits = bytearray(struct.pack(">d", float(value)))
    bits[0] |= 0x80
    expected = b"\x20" + bytes(bits) + b"\x00"
    assert keys.encode_part(value) == expected
    assert keys.encode_unsigned_key(value) == expected
    assert keys.encode_part(float(value)) == expected
