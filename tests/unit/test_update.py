"""UPDATE / UPSERT ops (spaces.update).

Every expected result and message below was checked against a real Tarantool 2.6.0 (same tuple,
same ops, over iproto), except where a test says it follows the spec instead.
"""

import decimal
import uuid

import msgpack
import pytest

from boxqueue.errcodes import BoxError
from boxqueue.spaces.msgpack_values import PairsMap, pack, unpack
from boxqueue.spaces.update import MAX_OPS, UpdateOp, apply_ops, parse_ops

D = decimal.Decimal

# The space format used on the real server: id, a, b, c.
NAMES = {"id": 0, "a": 1, "b": 2, "c": 3}


def upd(fields, ops, base=0, names=NAMES):
    return apply_ops(fields, parse_ops(ops, base, names), names)


def err(fields, ops, base=0, names=NAMES):
    with pytest.raises(BoxError) as exc:
        upd(fields, ops, base, names)
    return exc.value.code, exc.value.message


def parse_err(ops, base=0, names=None):
    with pytest.raises(BoxError) as exc:
        parse_ops(ops, base, names)
    return exc.value.code, exc.value.message


# --------------------------------------------------------------------------------------------
# Decoding the op list


def test_parse_ops_result():
    ops = parse_ops([["=", 1, "x"], ["#", -1, 2], [":", "a", 1, -1, "p"]])
    assert ops == [
        UpdateOp("=", 1, ("x",)),
        UpdateOp("#", -1, (2,)),
        UpdateOp(":", "a", (1, -1, "p")),
    ]


def test_parse_ops_index_base_1():
    assert parse_ops([["=", 1, 0], [":", 2, 1, 0, ""], ["=", -1, 0]], 1) == [
        UpdateOp("=", 0, (0,)),
        UpdateOp(":", 1, (0, 0, "")),
        UpdateOp("=", -1, (0,)),
    ]


def test_empty_op_list_changes_nothing():
    assert upd([1, "x", 3], []) == [1, "x", 3]


@pytest.mark.parametrize(
    "ops, expected",
    [
        ([["x", 1, "y"]], (28, 'Unknown UPDATE operation #1: "x"')),
        ([["x"]], (28, 'Unknown UPDATE operation #1: "x"')),
        ([["==", 1, 2]], (28, 'Unknown UPDATE operation #1: "=="')),
        ([["", 1, 2]], (28, 'Unknown UPDATE operation #1: ""')),
        ([["*", 1, 2]], (28, 'Unknown UPDATE operation #1: "*"')),
        (
            [["=", 1]],
            (28, "Unknown UPDATE operation #1: wrong number of arguments, expected 3, got 2"),
        ),
        (
            [["="]],
            (28, "Unknown UPDATE operation #1: wrong number of arguments, expected 3, got 1"),
        ),
        (
            [[":", 1, 2]],
            (28, "Unknown UPDATE operation #1: wrong number of arguments, expected 5, got 3"),
        ),
        (
            [["=", 1, 2], ["=", 2, 3, 4]],
            (28, "Unknown UPDATE operation #2: wrong number of arguments, expected 3, got 4"),
        ),
        (
            [[]],
            (1, "Illegal parameters, update operation must be an array {op,..}, got empty array"),
        ),
        ([[1, 1, 2]], (1, "Illegal parameters, update operation name must be a string")),
        (["=", 1, 2], (1, "Illegal parameters, update operation must be an array {op,..}")),
        ([{"=": 1}], (1, "Illegal parameters, update operation must be an array {op,..}")),
        ([["=", 1.5, 2]], (1, "Illegal parameters, field id must be a number or a string")),
        ([["=", None, 2]], (1, "Illegal parameters, field id must be a number or a string")),
        ([["=", True, 2]], (1, "Illegal parameters, field id must be a number or a string")),
        ([["=", 1, 0]] * (MAX_OPS + 1), (1, "Illegal parameters, too many operations for update")),
        # The wire request decoder rejects a non-array op list.
        (5, (20, "Invalid MsgPack - packet body")),
        ({}, (20, "Invalid MsgPack - packet body")),
        (PairsMap([([1], 2)]), (20, "Invalid MsgPack - packet body")),
    ],
)
def test_parse_errors(ops, expected):
    assert parse_err(ops) == expected


def test_max_ops_is_allowed():
    assert upd([1, "x", 3], [["=", 1, 0]] * MAX_OPS) == [1, 0, 3]


def test_index_base_must_be_uint():
    assert parse_err([["=", 1, 1]], base=-1) == (20, "Invalid MsgPack - packet body")


def test_parse_errors_report_the_failing_op_in_order():
    # Decoding goes op by op: field, then arguments.
    assert parse_err([["=", 1, 2], ["+", 1, "z"], ["x", 1, 2]]) == (
        26,
        "Argument type in operation '+' on field 2 does not match field type: expected a number",
    )
    assert parse_err([["=", "nosuch", 1], ["+", 1, "x"]], names=NAMES) == (
        201,
        "Field 'nosuch' was not found in the tuple",
    )
    assert parse_err([["+", 1, "x"], ["=", "nosuch", 1]], names=NAMES)[0] == 26


def test_field_number_must_fit_int32():
    # 2.6 names the field with a stale value from its op buffer; we name it by the value sent.
    assert parse_err([["=", 2**31, 1]]) == (
        26,
        "Argument type in operation '=' on field 2147483648 does not match field type: "
        "expected an integer",
    )
    assert parse_err([["#", -(2**40), 1]])[0] == 26
    assert parse_ops([["=", 2**31 - 1, 1], ["=", -(2**31), 1]])[1].field == -(2**31)


def test_names_unchecked_without_format_at_parse_time():
    # Without field_names the name is only looked up when applied.
    ops = parse_ops([["=", "nosuch", 1]])
    with pytest.raises(BoxError) as exc:
        apply_ops([1], ops, NAMES)
    assert exc.value.message == "Field 'nosuch' was not found in the tuple"


# --------------------------------------------------------------------------------------------
# '=' and '!'


@pytest.mark.parametrize(
    "ops, result",
    [
        ([["=", 1, "y"]], [1, "y", 3]),
        ([["=", 3, "y"]], [1, "x", 3, "y"]),  # position == field count appends
        ([["=", -1, 1]], [1, "x", 1]),
        ([["=", -3, 7]], [7, "x", 3]),
        ([["=", "a", 2]], [1, 2, 3]),
        ([["=", "c", 2]], [1, "x", 3, 2]),  # a format field just past the end appends too
        ([["=", "[2]", 2]], [1, 2, 3]),
        ([["=", "[4]", 2]], [1, "x", 3, 2]),
        ([["=", '["a"]', 1]], [1, 1, 3]),
        ([["=", "['a']", 1]], [1, 1, 3]),
        ([["=", ".a", 1]], [1, 1, 3]),
        ([["=", "[02]", "q"]], [1, "q", 3]),
        ([["!", 0, 1]], [1, 1, "x", 3]),
        ([["!", 1, 9]], [1, 9, "x", 3]),
        ([["!", 3, 1]], [1, "x", 3, 1]),  # position == field count appends
        ([["!", -1, 1]], [1, "x", 3, 1]),  # so does -1
        ([["!", -4, 1]], [1, 1, "x", 3]),
        ([["!", "[4]", 5]], [1, "x", 3, 5]),
        ([["!", "c", 5]], [1, "x", 3, 5]),
        ([["=", 1, [1, {"k": None}]]], [1, [1, {"k": None}], 3]),
    ],
)
def test_set_and_insert(ops, result):
    assert upd([1, "x", 3], ops) == result


def test_set_appends_to_an_empty_tuple():
    assert upd([], [["=", 0, 1]]) == [1]
    assert upd([], [["!", -1, 1]]) == [1]


@pytest.mark.parametrize(
    "ops, expected",
    [
        # Field numbers in messages are 1-based; negative ones are printed as sent.
        ([["=", 4, "y"]], (37, "Field 5 was not found in the tuple")),
        ([["=", 7, "y"]], (37, "Field 8 was not found in the tuple")),
        ([["=", -5, 1]], (37, "Field -5 was not found in the tuple")),
        ([["=", -4, 1]], (37, "Field -4 was not found in the tuple")),
        ([["!", 4, 1]], (37, "Field 5 was not found in the tuple")),
        ([["!", -5, 1]], (37, "Field -5 was not found in the tuple")),
        ([["=", "nosuch", 2]], (201, "Field 'nosuch' was not found in the tuple")),
        ([["=", "", 1]], (201, "Field '' was not found in the tuple")),
        ([["=", "ab cd", 1]], (201, "Field 'ab cd' was not found in the tuple")),
        ([["=", "_x", 1]], (201, "Field '_x' was not found in the tuple")),
        ([["=", "é", 1]], (201, "Field 'é' was not found in the tuple")),
        ([["=", '["zz"]', 1]], (201, "Field '[\"zz\"]' was not found in the tuple")),
        ([["=", "[*]", 1]], (201, "Field '[*]' was not found in the tuple")),
        # Found by the decoder, missing in this tuple: the name is quoted a second time.
        ([["=", "[5]", 2]], (201, "Field ''[5]'' was not found in the tuple")),
        ([["!", "[5]", 5]], (201, "Field ''[5]'' was not found in the tuple")),
    ],
)
def test_set_and_insert_errors(ops, expected):
    assert err([1, "x", 3], ops) == expected


def test_index_base_1():
    t = [1, "x", 3]
    assert upd(t, [["=", 2, 1]], base=1) == [1, 1, 3]
    assert upd(t, [["=", 4, 1]], base=1) == [1, "x", 3, 1]
    assert upd(t, [["=", -1, 1]], base=1) == [1, "x", 1]
    assert upd(t, [["+", -1, 1]], base=1) == [1, "x", 4]
    assert upd(t, [["!", 1, 0]], base=1) == [0, 1, "x", 3]
    assert err(t, [["=", 5, 1]], base=1) == (37, "Field 5 was not found in the tuple")
    assert err(t, [["+", 4, 1]], base=1) == (37, "Field 4 was not found in the tuple")
    # 0 is below the base: "not found", printed as sent, before the arguments are looked at.
    assert err(t, [["=", 0, 1]], base=1) == (37, "Field 0 was not found in the tuple")
    assert err(t, [["+", 0, "x"]], base=1) == (37, "Field 0 was not found in the tuple")
    assert err(t, [["+", 2, 1]], base=1) == (
        26,
        "Argument type in operation '+' on field 2 does not match field type: expected a number",
    )
    # JSON '[N]' stays 1-based whatever the base.
    assert upd(t, [["=", "[2]", 0]], base=1) == [1, 0, 3]


def test_other_index_bases_shift_too():
    assert upd([1, "x", 3], [["=", 3, 0]], base=2) == [1, 0, 3]
    assert err([1, "x", 3], [["=", 1, 1]], base=2) == (37, "Field 1 was not found in the tuple")


# --------------------------------------------------------------------------------------------
# '#'


@pytest.mark.parametrize(
    "ops, result",
    [
        ([["#", 1, 1]], [1, 3]),
        ([["#", 1, 100]], [1]),  # past the end deletes to the end
        ([["#", -1, 1]], [1, "x"]),
        ([["#", -3, 1]], ["x", 3]),
        ([["#", "a", 100]], [1]),
        ([["#", ".a", 1]], [1, 3]),
        ([["#", 1, 2**32 + 1]], [1, 3]),  # the count is a uint32_t in Tarantool
    ],
)
def test_delete(ops, result):
    assert upd([1, "x", 3], ops) == result


@pytest.mark.parametrize(
    "ops, expected",
    [
        ([["#", 1, 0]], (29, "Field 2 UPDATE error: cannot delete 0 fields")),
        ([["#", 1, 2**32]], (29, "Field 2 UPDATE error: cannot delete 0 fields")),
        ([["#", -1, 0]], (29, "Field -1 UPDATE error: cannot delete 0 fields")),
        ([["#", "a", 0]], (29, "Field 'a' UPDATE error: cannot delete 0 fields")),
        ([["#", 3, 1]], (37, "Field 4 was not found in the tuple")),
        ([["#", -4, 1]], (37, "Field -4 was not found in the tuple")),
        (
            [["#", 1, -1]],
            (
                26,
                "Argument type in operation '#' on field 2 does not match field type: "
                "expected a positive integer",
            ),
        ),
        ([["#", 1, "a"]], (26, None)),
        ([["#", 1, 1.0]], (26, None)),
        ([["#", 1, True]], (26, None)),
    ],
)
def test_delete_errors(ops, expected):
    code, message = err([1, "x", 3], ops)
    assert code == expected[0]
    if expected[1] is not None:
        assert message == expected[1]


# --------------------------------------------------------------------------------------------
# '+' and '-'


@pytest.mark.parametrize(
    "value, ops, result",
    [
        (10, [["+", 1, 5]], 15),
        (10, [["+", 1, -20]], -10),
        (10, [["+", 1, 1.5]], 11.5),  # int + float is a float
        (10, [["-", 1, 1.5]], 8.5),
        (1.5, [["+", 1, 1]], 2.5),
        (0.1, [["+", 1, 0.2]], 0.30000000000000004),
        (2**64 - 2, [["+", 1, 1]], 2**64 - 1),
        (-(2**63), [["+", 1, 2**64 - 1]], 2**63 - 1),
        (2**64 - 1, [["-", 1, 2**64 - 1]], 0),
        (2**64 - 1, [["+", 1, 1.0]], 1.8446744073709552e19),
        (-(2**63), [["-", 1, 0.5]], -9.223372036854776e18),
        (10, [["+", 1, 1e308], ["+", 1, 1e308]], float("inf")),
    ],
)
def test_arith(value, ops, result):
    out = upd([1, value, 3], ops)
    assert out == [1, result, 3]
    assert type(out[1]) is type(result)


@pytest.mark.parametrize(
    "value, ops, expected",
    [
        (2**64 - 1, [["+", 1, 1]], "Integer overflow when performing '+' operation on field 2"),
        (-(2**63), [["-", 1, 1]], "Integer overflow when performing '-' operation on field 2"),
        (0, [["-", 1, 2**64 - 1]], "Integer overflow when performing '-' operation on field 2"),
        (
            10,
            [["+", "a", 2**64 - 1]],
            "Integer overflow when performing '+' operation on field 'a'",
        ),
        # A negative position is resolved before the op runs, so the message shows it 1-based.
        (10, [["+", -2, 2**64 - 1]], "Integer overflow when performing '+' operation on field 2"),
    ],
)
def test_integer_overflow(value, ops, expected):
    assert err([1, value, 3], ops) == (95, expected)


def test_integer_overflow_names():
    t = [1, "x", 2**64 - 1]
    assert (
        err(t, [["+", "b", 1]])[1] == "Integer overflow when performing '+' operation on field 'b'"
    )
    assert err(t, [["+", -1, 1]])[1] == "Integer overflow when performing '+' operation on field 3"
    assert err(t, [["+", "[3]", 1]])[1] == (
        "Integer overflow when performing '+' operation on field '[3]'"
    )


NOT_A_NUMBER = "does not match field type: expected a number"


@pytest.mark.parametrize(
    "value, ops, field",
    [
        ("x", [["+", 1, 1]], "2"),
        ("x", [["+", -2, 1]], "2"),  # resolved: 1-based
        (10, [["+", -2, "z"]], "-2"),  # argument checked before the tuple: as sent
        (10, [["+", 1, "z"]], "2"),
        (10, [["+", 1, True]], "2"),  # booleans are not numbers
        (True, [["+", 1, 1]], "2"),
        (None, [["+", 1, 1]], "2"),
        (10, [["+", 1, None]], "2"),
        (10, [["+", 1, b"ab"]], "2"),
        (10, [["+", 1, [1]]], "2"),
        (10, [["-", "a", "z"]], "'a'"),
        ("x", [["+", "a", 2]], "'a'"),
        (D("1.5"), [["+", 1, "x"]], "2"),
        ("s", [["+", 1, D(1)]], "2"),
    ],
)
def test_arith_type_errors(value, ops, field):
    opcode = ops[0][0]
    assert err([1, value, 3], ops) == (
        26,
        f"Argument type in operation '{opcode}' on field {field} {NOT_A_NUMBER}",
    )


def test_arith_rejects_uuid_and_other_extensions():
    assert err([1, uuid.UUID(int=5), 3], [["+", 1, 1]])[0] == 26
    assert err([1, 10, 3], [["+", 1, uuid.UUID(int=5)]])[0] == 26
    assert err([1, 10, 3], [["+", 1, msgpack.ExtType(9, b"ab")]])[0] == 26


@pytest.mark.parametrize(
    "value, ops, result",
    [
        (10, [["+", 1, D("1.5")]], D("11.5")),
        (D("1.5"), [["+", 1, 1]], D("2.5")),
        (D("1.5"), [["+", 1, 0.1]], D("1.6")),  # a float goes through 15 significant digits
        (D("1.5"), [["+", 1, 1 / 3]], D("1.833333333333333")),
        (D("1.5"), [["+", 1, 1e37]], D("10000000000000000000000000000000000002")),
        (D("1.5"), [["+", 1, 1e-300]], D("1.5000000000000000000000000000000000000")),
        (D("1.5"), [["-", 1, 2**64 - 1]], D("-18446744073709551613.5")),
        (2**64 - 1, [["+", 1, D(1)]], D("18446744073709551616")),
        (D("1.10"), [["+", 1, D("1.20")]], D("2.30")),
        (D("1.10"), [["-", 1, D("1.10")]], D("0.00")),
        (D("-1.5"), [["-", 1, D("-1.5")]], D("0.0")),
        (D("1E-30"), [["+", 1, D("1E-30")]], D("2E-30")),
        (D("1E-37"), [["-", 1, D("2E-37")]], D("-1E-37")),
        (D("1E+37"), [["+", 1, D("1E+37")]], D("2E+37")),
        # 38 digits, rounded half up.
        (D("1"), [["+", 1, D("1E-37")]], D("1.0000000000000000000000000000000000001")),
        (D("1"), [["+", 1, D("1E-38")]], D("1.0000000000000000000000000000000000000")),
        (D("9" * 38), [["+", 1, D("0.1")]], D("9" * 38)),
        (D("9" * 37), [["+", 1, D("0.5")]], D("9" * 37 + ".5")),
        (
            D("0.12345678901234567890123456789012345675"),
            [["+", 1, 1]],
            D("1.1234567890123456789012345678901234568"),
        ),
        (
            D("-0.12345678901234567890123456789012345675"),
            [["-", 1, 1]],
            D("-1.1234567890123456789012345678901234568"),
        ),
    ],
)
def test_decimal_arith(value, ops, result):
    out = upd([1, value, 3], ops)[1]
    assert isinstance(out, D)
    assert out.as_tuple() == result.as_tuple()


@pytest.mark.parametrize(
    "value, ops, expected",
    [
        (
            D("9" * 38),
            [["+", 1, 1]],
            (160, "Decimal overflow when performing operation '+' on field 2"),
        ),
        (D("-" + "9" * 38), [["-", 1, 1]], (160, None)),
        (D("5E+37"), [["+", 1, D("5E+37")]], (160, None)),
        (
            D("1.5"),
            [["-", 1, float("inf")]],
            (
                26,
                "Argument type in operation '-' on field 2 does not match field type: "
                "expected a number convertible to decimal",
            ),
        ),
        (D("1.5"), [["-", 1, float("nan")]], (26, None)),
        (D("1.5"), [["+", 1, 1e38]], (26, None)),  # beyond the 38 digits
        (D("1.5"), [["+", 1, 1e300]], (26, None)),
    ],
)
def test_decimal_errors(value, ops, expected):
    code, message = err([1, value, 3], ops)
    assert code == expected[0]
    if expected[1] is not None:
        assert message == expected[1]


# --------------------------------------------------------------------------------------------
# '&', '|', '^'


@pytest.mark.parametrize(
    "value, ops, result",
    [
        (12, [["&", 1, 10]], 8),
        (12, [["|", 1, 10]], 14),
        (12, [["^", 1, 10]], 6),
        (2**64 - 1, [["^", 1, 2**64 - 1]], 0),
        (2**63, [["|", 1, 1]], 2**63 + 1),
        (5, [["&", "a", 4]], 4),
    ],
)
def test_bitwise(value, ops, result):
    assert upd([1, value, 3], ops) == [1, result, 3]


POSITIVE = "does not match field type: expected a positive integer"


@pytest.mark.parametrize(
    "value, ops, field",
    [
        (12, [["^", 1, -10]], "2"),
        (-12, [["^", 1, 10]], "2"),
        (12.0, [["^", 1, 10]], "2"),
        (12, [["^", 1, 10.0]], "2"),
        (12, [["^", 1, True]], "2"),
        (True, [["|", 1, 1]], "2"),
        (12, [["^", -2, "x"]], "-2"),
        ("x", [["^", -2, 3]], "2"),
        (12, [["&", "a", "x"]], "'a'"),
        ("x", [["|", "a", 3]], "'a'"),
    ],
)
def test_bitwise_errors(value, ops, field):
    opcode = ops[0][0]
    assert err([1, value, 3], ops) == (
        26,
        f"Argument type in operation '{opcode}' on field {field} {POSITIVE}",
    )


def test_bitwise_missing_fields():
    assert err([1, 12, 3], [["^", 7, 3]]) == (37, "Field 8 was not found in the tuple")
    assert err([1, 12, 3], [["^", "nosuch", 3]]) == (
        201,
        "Field 'nosuch' was not found in the tuple",
    )
    assert err([1, 12, 3], [["^", "c", 3]]) == (201, "Field ''c'' was not found in the tuple")
    assert err([1, "x", 3], [["+", "c", 2]]) == (201, "Field ''c'' was not found in the tuple")
    assert err([1, "x", 3], [["+", "[5]", 2]]) == (201, "Field ''[5]'' was not found in the tuple")
    assert err([1, "x", 3], [["+", -5, 1]]) == (37, "Field -5 was not found in the tuple")


# --------------------------------------------------------------------------------------------
# ':' (splice)


@pytest.mark.parametrize(
    "value, args, result",
    [
        # The spec's examples (iproto notes, section 4.2).
        ("tuple_3", (3, 2, "lalal"), "tuplalal_3"),
        ("hello, world", (2, 3, "---"), "he---, world"),
        ("hello, world", (-1, 1, "X"), "hello, worldX"),
        ("hello, world", (-3, 10, "X"), "hello, worX"),
        ("hello, world", (0, 0, "A"), "Ahello, world"),
        # Clamping and negative cuts.
        ("hello, world", (100, 5, "A"), "hello, worldA"),
        ("hello, world", (-13, 1, "A"), "Aello, world"),
        ("hello, world", (2, -3, "A"), "heArld"),  # a negative cut keeps that many at the end
        ("hello, world", (2, -10, "A"), "heAllo, world"),
        ("hello, world", (2, -11, "A"), "heAllo, world"),
        ("hello, world", (2, -30, "A"), "heAllo, world"),
        ("hello", (-6, 2, ""), "llo"),
        ("hello", (-6, -1, ""), "o"),
        ("hello", (5, -1, "Z"), "helloZ"),
        ("hello", (2**31 - 1, -(2**31), "Z"), "helloZ"),
        ("hello", (1, 1, "é"), "héllo"),
        # Offsets count bytes, so a multi-byte character can be cut in half.
        ("héllo", (2, 1, "A"), "h\udcc3Allo"),
        ("héllo", (1, 1, "A"), "hA\udca9llo"),
        ("héllo", (-1, 0, "é"), "hélloé"),
    ],
)
def test_splice(value, args, result):
    assert upd([1, value, 3], [[":", 1, *args]]) == [1, result, 3]


def test_splice_result_is_valid_msgpack_str():
    out = upd([1, "héllo"], [[":", 1, 2, 1, "A"]])
    assert pack(out) == b"\x92\x01\xa6h\xc3Allo"
    assert unpack(pack(out)) == out


def test_splice_index_base_1():
    t = [1, "hello, world", 3]
    assert upd(t, [[":", 2, 1, 1, "A"]], base=1) == [1, "Aello, world", 3]
    assert upd(t, [[":", 2, -1, 1, "A"]], base=1) == [1, "hello, worldA", 3]
    assert err(t, [[":", 2, 0, 1, "A"]], base=1) == (
        25,
        "SPLICE error on field 2: offset is out of bound",
    )


SPLICE_TYPE = "Argument type in operation ':' on field {} does not match field type: expected {}"


@pytest.mark.parametrize(
    "value, op, expected",
    [
        (
            "hello, world",
            [":", 1, -14, 1, "A"],
            (25, "SPLICE error on field 2: offset is out of bound"),
        ),
        ("hello", [":", -2, -7, 1, "A"], (25, "SPLICE error on field 2: offset is out of bound")),
        (
            "hello",
            [":", "a", -7, 1, "A"],
            (25, "SPLICE error on field 'a': offset is out of bound"),
        ),
        # Tarantool 2.6 crashes on this one (it negates INT32_MIN); it is simply out of bound here.
        (
            "hello",
            [":", 1, -(2**31), 1, "A"],
            (25, "SPLICE error on field 2: offset is out of bound"),
        ),
        ("hello", [":", 1, 2**31, 1, "A"], (26, SPLICE_TYPE.format(2, "an integer"))),
        ("hello", [":", 1, 1, 2**31, "A"], (26, SPLICE_TYPE.format(2, "an integer"))),
        ("hello", [":", 1, 1.0, 1, "A"], (26, SPLICE_TYPE.format(2, "an integer"))),
        ("hello", [":", 1, 1, 1.0, "A"], (26, SPLICE_TYPE.format(2, "an integer"))),
        ("hello", [":", 1, True, 1, "A"], (26, SPLICE_TYPE.format(2, "an integer"))),
        ("hello", [":", 1, 1, 1, b"A"], (26, SPLICE_TYPE.format(2, "a string"))),
        ("hello", [":", 1, 1, 1, 5], (26, SPLICE_TYPE.format(2, "a string"))),
        (b"hello", [":", 1, 1, 1, "A"], (26, SPLICE_TYPE.format(2, "a string"))),
        (5, [":", 1, 1, 1, "A"], (26, SPLICE_TYPE.format(2, "a string"))),
        (5, [":", -2, 1, 1, "A"], (26, SPLICE_TYPE.format(2, "a string"))),
    ],
)
def test_splice_errors(value, op, expected):
    assert err([1, value, 3], [op]) == expected


def test_splice_offset_checked_before_the_field_number_with_base():
    # A field below the base is reported before the splice arguments are looked at.
    assert err([1, "hello", 3], [[":", 1, 0, 1, "A"]], base=5) == (
        37,
        "Field 1 was not found in the tuple",
    )
    assert err([1, "hello", 3], [[":", 1, 1, 1, "A"]], base=1) == (
        26,
        SPLICE_TYPE.format(1, "a string"),
    )


# --------------------------------------------------------------------------------------------
# Several ops


def test_ops_apply_in_order():
    assert upd([1, 10, 3], [["=", 1, 1], ["#", 1, 1], ["+", 1, 5]]) == [1, 8]
    assert upd([1, "x", 3], [["!", 2, 1], ["+", 3, 1]]) == [1, "x", 1, 4]
    assert upd([1, "x", 3], [["+", "b", 2**64 - 1 - 3], ["=", 1, "y"]]) == [1, "y", 2**64 - 1]


def test_same_field_twice_follows_the_spec():
    # The spec (section 4.2) and Tarantool 3.0+ apply both; 2.6 said
    # "Field 2 UPDATE error: double update of the same field" (code 29).
    assert upd([1, 10, 3], [["+", 1, 1], ["+", 1, 1]]) == [1, 12, 3]
    assert upd([1, "x", 3], [["+", 2, 1], ["=", 2, 10], ["+", 2, 1]]) == [1, "x", 11]
    assert upd([1, "x", 3], [[":", 1, 0, 0, "a"], [":", 1, 0, 0, "b"]]) == [1, "bax", 3]
    assert upd([1, 12, 3], [["&", 1, 0x0F], ["|", 1, 0xC0]]) == [1, 0xCC, 3]
    assert err([1, "x", 3], [["+", "b", 2**64 - 1], ["+", "b", 1]]) == (
        95,
        "Integer overflow when performing '+' operation on field 'b'",
    )


def test_fields_are_never_mutated():
    inner = [10, {"k": [1, 2]}]
    fields = [1, inner, "s"]
    out = upd(fields, [["=", 0, 2], ["+", "[2][2].k[1]", 5], ["!", "[2][1]", 0], ["#", 2, 1]])
    assert out == [2, [0, 10, {"k": [6, 2]}]]
    assert fields == [1, [10, {"k": [1, 2]}], "s"]
    assert fields[1] is inner


def test_failed_update_leaves_fields_alone():
    fields = [1, "x", 3]
    with pytest.raises(BoxError):
        upd(fields, [["=", 1, "y"], ["+", 1, 1]])
    assert fields == [1, "x", 3]


# --------------------------------------------------------------------------------------------
# UPSERT: apply errors are skipped one op at a time


def upsert(fields, ops):
    return apply_ops(fields, parse_ops(ops, 0, NAMES), NAMES, skip_errors=True)


def test_upsert_skips_failing_ops():
    assert upsert([1, "x", 3], [["+", 2, 1], ["+", 1, 5], ["=", 3, "y"]]) == [1, "x", 4, "y"]
    assert upsert([1, "x", 3], [["+", "c", 1]]) == [1, "x", 3]
    assert upsert([1, "x", 3], [["+", "[9]", 1], ["=", 1, "ok"]]) == [1, "ok", 3]
    assert upsert([1, "x", 3], [["=", 7, 1], ["=", 1, "ok"]]) == [1, "ok", 3]
    assert upsert([1, "x", 2**64 - 1], [["+", 2, 1], ["=", 1, "ok"]]) == [1, "ok", 2**64 - 1]
    assert upsert([1, "x", 3], [["=", "a.b", 1], ["=", 1, "ok"]]) == [1, "ok", 3]
    assert upsert([1, "x", 3], [[":", 1, -9, 1, "A"], ["=", 2, "ok"]]) == [1, "x", "ok"]


def test_upsert_decode_errors_are_still_raised():
    for ops, code in [
        ([["x", 2, 1]], 28),
        ([["+", 2, "a"]], 26),
        ([["=", "nosuch", 1]], 201),
        ([["#", 1, 0]], 29),
        ([["=", "[0]", 1]], 29),
    ]:
        with pytest.raises(BoxError) as exc:
            parse_ops(ops, 0, NAMES)
        assert exc.value.code == code


# --------------------------------------------------------------------------------------------
# JSON paths into nested arrays and maps

NESTED = [1, [10, 20, 30], {"k": 1, "s": "abc"}]


@pytest.mark.parametrize(
    "ops, result",
    [
        ([["=", "[2][1]", 5]], [1, [5, 20, 30], {"k": 1, "s": "abc"}]),
        ([["=", "[2][4]", 5]], [1, [10, 20, 30, 5], {"k": 1, "s": "abc"}]),
        ([["!", "[2][1]", 5]], [1, [5, 10, 20, 30], {"k": 1, "s": "abc"}]),
        ([["!", "[2][4]", 5]], [1, [10, 20, 30, 5], {"k": 1, "s": "abc"}]),
        ([["#", "[2][2]", 5]], [1, [10], {"k": 1, "s": "abc"}]),
        ([["+", "[2][3]", 1]], [1, [10, 20, 31], {"k": 1, "s": "abc"}]),
        ([["+", "[3].k", 1]], [1, [10, 20, 30], {"k": 2, "s": "abc"}]),
        ([["+", "b.k", 1]], [1, [10, 20, 30], {"k": 2, "s": "abc"}]),
        ([["+", 'b["k"]', 1]], [1, [10, 20, 30], {"k": 2, "s": "abc"}]),
        ([["=", "[3].k", 7]], [1, [10, 20, 30], {"k": 7, "s": "abc"}]),
        ([["#", "[3].k", 1]], [1, [10, 20, 30], {"s": "abc"}]),
        ([[":", "[3].s", 1, 1, "X"]], [1, [10, 20, 30], {"k": 1, "s": "aXc"}]),
        ([["=", "[2][1]", 1], ["=", "[2][2]", 1]], [1, [1, 1, 30], {"k": 1, "s": "abc"}]),
        ([["=", "[2][1]", 1], ["=", "[2]", 1]], [1, 1, {"k": 1, "s": "abc"}]),
        ([["=", "[4]", [1]], ["=", "[4][1]", 2]], [1, [10, 20, 30], {"k": 1, "s": "abc"}, [2]]),
    ],
)
def test_paths(ops, result):
    assert upd(NESTED, ops) == result


def test_paths_add_map_keys_first():
    # Tarantool writes the keys it adds before the existing ones.
    out = upd(NESTED, [["=", "[3].z", 1], ["=", "[3].y", 2]])
    assert list(out[2].items()) == [("y", 2), ("z", 1), ("k", 1), ("s", "abc")]
    out = upd(NESTED, [["!", "[3].z", 7]])
    assert list(out[2].items()) == [("z", 7), ("k", 1), ("s", "abc")]


def test_paths_deeper():
    t = [1, [10, [20, 21], 30], {"k": {"m": 1}, "s": "abc"}]
    assert upd(t, [["=", "[2][2][3]", "q"]])[1] == [10, [20, 21, "q"], 30]
    assert upd(t, [["=", "b.k.n", "q"]])[2] == {"k": {"n": "q", "m": 1}, "s": "abc"}
    assert upd(t, [["=", "b['k']", "q"]])[2] == {"k": "q", "s": "abc"}
    assert upd(t, [["=", '["b"].k', "q"]])[2] == {"k": "q", "s": "abc"}
    assert upd(t, [["=", "[2][01]", "q"]])[1] == ["q", [20, 21], 30]
    assert upd(t, [["=", "[2][3]", "q"], ["=", "[2][4]", "r"]])[1] == [10, [20, 21], "q", "r"]
    u = [1, [1, {"a": [1, 2]}], 3]
    assert upd(u, [["+", "[2][2].a[2]", 5]])[1] == [1, {"a": [1, 7]}]
    assert upd(u, [["!", "[2][2].a[1]", 5]])[1] == [1, {"a": [5, 1, 2]}]
    assert upd(u, [["#", "[2][2].a", 1]])[1] == [1, {}]
    assert upd(u, [["=", "[2][2].b", 1]])[1] == [1, {"b": 1, "a": [1, 2]}]
    assert upd(u, [["+", "[2][2].a[2]", 1], ["+", "[2][2].a[1]", 1]])[1] == [1, {"a": [2, 3]}]


def test_paths_integer_map_keys():
    # '[N]' on a map finds the integer key N.
    t = [1, [10, 20, 30], {"k": 1, 5: 1}]
    assert upd(t, [["=", "[3][5]", 2]])[2] == {"k": 1, 5: 2}
    assert upd(t, [["+", "[3][5]", 2]])[2] == {"k": 1, 5: 3}
    assert upd([1, {5: [1]}], [["=", "[2][5][1]", 7]])[1] == {5: [7]}
    assert err(t, [["!", "[3][5]", 2]]) == (
        29,
        "Field '[3][5]' UPDATE error: the key exists already",
    )
    assert err(t, [["+", "[3][4]", 2]]) == (201, "Field ''[3][4]'' was not found in the tuple")
    assert upd([1, {5: 1, "5": 2}], [["+", '[2]["5"]', 2]])[1] == {5: 1, "5": 4}


def test_paths_into_pairs_maps():
    pm = PairsMap([([1], "list key"), ("k", 1)])
    out = upd([1, pm], [["+", "[2].k", 1], ["=", "[2].z", 0]])
    assert isinstance(out[1], PairsMap)
    assert list(out[1]) == [("z", 0), ([1], "list key"), ("k", 2)]
    assert upd([1, pm], [["#", "[2].k", 1]])[1] == PairsMap([([1], "list key")])


@pytest.mark.parametrize(
    "ops, expected",
    [
        ([["=", "[2][5]", 5]], (201, "Field ''[2][5]'' was not found in the tuple")),
        ([["!", "[2][5]", 5]], (201, "Field ''[2][5]'' was not found in the tuple")),
        ([["#", "[2][4]", 1]], (201, "Field ''[2][4]'' was not found in the tuple")),
        ([["+", "[2][4]", 1]], (201, "Field ''[2][4]'' was not found in the tuple")),
        ([["+", "[2].x", 1]], (201, "Field ''[2].x'' was not found in the tuple")),
        ([["+", "[2][1][1]", 1]], (201, "Field ''[2][1][1]'' was not found in the tuple")),
        ([["+", "b[1]", 1]], (201, "Field ''b[1]'' was not found in the tuple")),
        ([["+", "[3].z", 1]], (201, "Field ''[3].z'' was not found in the tuple")),
        ([["#", "[3].z", 1]], (201, "Field ''[3].z'' was not found in the tuple")),
        ([["#", "[3].z", 2]], (201, "Field ''[3].z'' was not found in the tuple")),
        ([["=", "[3].z.y", 1]], (201, "Field ''[3].z.y'' was not found in the tuple")),
        ([["=", "[2][7][1]", 1]], (201, "Field ''[2][7][1]'' was not found in the tuple")),
        ([["=", "[9][", 1]], (201, "Field ''[9]['' was not found in the tuple")),
        ([["!", "[3].k", 7]], (29, "Field '[3].k' UPDATE error: the key exists already")),
        (
            [["#", "[3].k", 2]],
            (29, "Field '[3].k' UPDATE error: can delete only 1 field from a map in a row"),
        ),
        (
            [["=", "a.b", 1]],
            (29, "Field 'a.b' UPDATE error: can not access by key a non-map field"),
        ),
        (
            [["=", "[2].b", 1]],
            (29, "Field '[2].b' UPDATE error: can not access by key a non-map field"),
        ),
        (
            [["=", "[2][1][1]", 1]],
            (29, "Field '[2][1][1]' UPDATE error: can not access by index a non-array field"),
        ),
        (
            [["=", "[3][5]", 1]],
            (29, "Field '[3][5]' UPDATE error: can not access by index a non-array field"),
        ),
        (
            [["!", "[3][1]", 5]],
            (29, "Field '[3][1]' UPDATE error: can not access by index a non-array field"),
        ),
        (
            [["+", "[3].s", 1]],
            (
                26,
                "Argument type in operation '+' on field '[3].s' does not match field type: "
                "expected a number",
            ),
        ),
        (
            [[":", "[2][1]", 1, 1, "x"]],
            (
                26,
                "Argument type in operation ':' on field '[2][1]' does not match field type: "
                "expected a string",
            ),
        ),
    ],
)
def test_path_errors(ops, expected):
    assert err(NESTED, ops) == expected


@pytest.mark.parametrize(
    "path, position",
    [
        ("[0]", 2),  # '[N]' is 1-based
        ("[", 1),
        ("[-1]", 2),
        ("[x]", 2),
        ("[2", 3),
        ("[2][1", 6),
        ("a[1", 4),
        ("a ", 2),
        ("a.", 3),
        ("b['']", 4),
        ('b["k]', 6),
        ("['a'", 5),
        ("b.1", 3),
        ("b..k", 3),
        ("[2]x", 4),
        ("[2] ", 4),
        ("1abc", 1),
        ("[3].k.", 7),
        ("[3].k[*]", 7),
        ("[2][*]", 5),
        ("[2][", 4),
        ("[2][1].", 8),
        # For '=' a step that finds nothing reads the next token first.
        ("[2][9].", 8),
        ("[3].zz.", 8),
        ("[2][1].x.", 10),
    ],
)
def test_path_syntax_errors(path, position):
    assert err(NESTED, [["=", path, 1]]) == (
        29,
        f"Field '{path}' UPDATE error: invalid JSON in position {position}",
    )


def test_path_step_that_finds_nothing_for_other_ops():
    # Only '=' and '!' look past a missing step; other ops report it missing.
    assert err(NESTED, [["+", "[3].zz.", 1]]) == (
        201,
        "Field ''[3].zz.'' was not found in the tuple",
    )
    assert err(NESTED, [["+", "[2][9].", 1]]) == (
        201,
        "Field ''[2][9].'' was not found in the tuple",
    )
    assert err(NESTED, [["=", "[3].zz[*]", 1]]) == (
        201,
        "Field ''[3].zz[*]'' was not found in the tuple",
    )
    assert err(NESTED, [["+", "[2][1].", 1]]) == (
        29,
        "Field '[2][1].' UPDATE error: invalid JSON in position 8",
    )


def test_exact_format_name_wins_over_path_syntax():
    names = {"id": 0, "a.b": 1, "my field": 2}
    assert upd([1, 2, 3], [["=", "a.b", 0], ["+", "my field", 1]], names=names) == [1, 0, 4]


def test_space_without_format_still_takes_paths():
    assert upd([1, [5]], [["+", "[2][1]", 1]], names={}) == [1, [6]]
    assert upd([1, [5]], [["+", "[2][1]", 1]], names=None) == [1, [6]]
    assert err([1, 2], [["=", "a", 1]], names={}) == (201, "Field 'a' was not found in the tuple")
