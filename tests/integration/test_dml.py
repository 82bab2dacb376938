"""DML and selects through the real `tarantool` connector, with Tarantool's exact answers.

Every expectation here also holds on a real Tarantool 2.6 (BOXQUEUE_TEST_TARGET=tarantool).
"""

import pytest
from tarantool.error import DatabaseError

EQ, REQ, ALL, LT, LE, GE, GT = range(7)


def rows(response):
    return [list(t) for t in response]


def error_of(fn):
    with pytest.raises(DatabaseError) as err:
        fn()
    return err.value.args[0], err.value.args[1]


def test_connect_loads_the_schema(conn):
    assert conn.ping(notime=True) == "Success"
    space = conn.schema.get_space("test")
    assert space.sid == 512
    assert space.indexes[1].name == "name"
    assert conn.schema.get_space("_vspace").sid == 281


def test_insert_select_replace_delete(conn):
    assert rows(conn.insert("test", (1, "one"))) == [[1, "one"]]
    assert rows(conn.insert("test", (2, "two", {"a": [1, 2]}))) == [[2, "two", {"a": [1, 2]}]]
    assert rows(conn.select("test", 2)) == [[2, "two", {"a": [1, 2]}]]
    assert rows(conn.replace("test", (2, "deux"))) == [[2, "deux"]]
    assert rows(conn.select("test")) == [[1, "one"], [2, "deux"]]
    assert rows(conn.delete("test", 1)) == [[1, "one"]]
    assert rows(conn.delete("test", 1)) == []
    assert rows(conn.select("test")) == [[2, "deux"]]


def test_duplicate_insert(conn):
    conn.insert("test", (1, "one"))
    assert error_of(lambda: conn.insert("test", (1, "again"))) == (
        3, "Duplicate key exists in unique index 'primary' in space 'test'")


def test_format_checks(conn):
    assert error_of(lambda: conn.insert("test", ("x", "y"))) == (
        23, "Tuple field 1 type does not match one required by operation: expected unsigned")
    assert error_of(lambda: conn.insert("test", (9,))) == (
        39, "Tuple field 2 required by space format is missing")
    assert error_of(lambda: conn.insert("test", (-1, "neg"))) == (
        23, "Tuple field 1 type does not match one required by operation: expected unsigned")
    # fields beyond the format are allowed
    assert rows(conn.insert("test", (9, "nine", None, "extra", 5))) == [[9, "nine", None, "extra", 5]]


def test_update_operations(conn):
    conn.insert("test", (1, "hello, world", 10))
    assert rows(conn.update("test", 1, [("+", 2, 5)])) == [[1, "hello, world", 15]]
    assert rows(conn.update("test", 1, [(":", 1, 2, 3, "---")])) == [[1, "he---, world", 15]]
    assert rows(conn.update("test", 1, [("!", 3, "ins"), ("#", 2, 1)])) == [[1, "he---, world", "ins"]]
    assert rows(conn.update("test", 1000, [("=", 1, "x")])) == []
    assert error_of(lambda: conn.update("test", 1, [("=", 0, 100)])) == (
        94, "Attempt to modify a tuple field which is part of index 'primary' in space 'test'")
    assert error_of(lambda: conn.update("test", 1, [("=", 10, 1)])) == (
        37, "Field 11 was not found in the tuple")
    assert error_of(lambda: conn.update("test", 1, [("+", 1, 1)])) == (
        26, "Argument type in operation '+' on field 2 does not match field type: expected a number")
    assert error_of(lambda: conn.update("test", 1, [("=", 1, 7)])) == (
        23, "Tuple field 2 type does not match one required by operation: expected string")
    assert rows(conn.select("test", 1)) == [[1, "he---, world", "ins"]]


def test_update_by_field_name(conn):
    conn.insert("test", (1, "a", 1))
    assert rows(conn.update("test", 1, [("=", "name", "b")])) == [[1, "b", 1]]


def test_upsert(conn):
    assert rows(conn.upsert("test", (5, "five", 1), [("+", 2, 1)])) == []
    assert rows(conn.select("test", 5)) == [[5, "five", 1]]
    conn.upsert("test", (5, "five", 1), [("+", 2, 10)])
    assert rows(conn.select("test", 5)) == [[5, "five", 11]]
    # a failing op is skipped silently and the tuple stays
    assert rows(conn.upsert("test", (5, "five"), [("+", 1, 1)])) == []
    assert rows(conn.select("test", 5)) == [[5, "five", 11]]


def test_tree_iterators_unique(conn):
    for i in (1, 2, 3, 4, 5):
        conn.insert("test", (i, f"n{i}"))
    ids = lambda it, key: [t[0] for t in conn.select("test", key, iterator=it)]  # noqa: E731
    assert ids(EQ, [3]) == [3]
    assert ids(EQ, []) == [1, 2, 3, 4, 5]
    assert ids(REQ, [3]) == [3]
    assert ids(REQ, []) == [5, 4, 3, 2, 1]
    assert ids(ALL, []) == [1, 2, 3, 4, 5]
    assert ids(ALL, [3]) == [3, 4, 5]
    assert ids(LT, [3]) == [2, 1]
    assert ids(LE, [3]) == [3, 2, 1]
    assert ids(GE, [3]) == [3, 4, 5]
    assert ids(GT, [3]) == [4, 5]
    assert ids(LT, []) == [5, 4, 3, 2, 1]
    assert ids(GT, []) == [1, 2, 3, 4, 5]
    assert ids(GT, [9]) == []
    assert ids(LT, [0]) == []


def test_offset_and_limit(conn):
    for i in range(1, 6):
        conn.insert("test", (i, "x"))
    assert [t[0] for t in conn.select("test", [], iterator=ALL, offset=1, limit=2)] == [2, 3]
    assert [t[0] for t in conn.select("test", [], iterator=REQ, offset=3, limit=10)] == [2, 1]
    assert rows(conn.select("test", [], iterator=ALL, limit=0)) == []
    assert rows(conn.select("test", [1], offset=1)) == []


def test_non_unique_index_orders_ties_by_primary_key(conn):
    conn.insert("test", (5, "n1"))
    conn.insert("test", (3, "n1"))
    conn.insert("test", (4, "n0"))
    conn.insert("test", (1, "n2"))
    by_name = lambda it, key: [t[0] for t in conn.select("test", key, index="name", iterator=it)]  # noqa: E731
    assert by_name(EQ, ["n1"]) == [3, 5]
    assert by_name(REQ, ["n1"]) == [5, 3]
    assert by_name(ALL, []) == [4, 3, 5, 1]
    assert by_name(GT, ["n0"]) == [3, 5, 1]
    assert by_name(LE, ["n1"]) == [5, 3, 4]
    assert by_name(LT, ["n1"]) == [4]


def test_multipart_partial_keys(conn):
    for i in range(1, 11):
        conn.insert("multi", (i, i % 3, f"v{20 - i}"))
    sel = lambda it, key: [list(t) for t in conn.select("multi", key, index="pair", iterator=it)]  # noqa: E731
    assert sel(EQ, [1]) == [[10, 1, "v10"], [7, 1, "v13"], [4, 1, "v16"], [1, 1, "v19"]]
    assert sel(LT, [1]) == [[3, 0, "v17"], [6, 0, "v14"], [9, 0, "v11"]]
    assert sel(GT, [1, "v15"]) == [[4, 1, "v16"], [1, 1, "v19"], [8, 2, "v12"], [5, 2, "v15"], [2, 2, "v18"]]
    assert sel(LE, [0, "v14"]) == [[6, 0, "v14"], [9, 0, "v11"]]
    assert sel(REQ, [2]) == [[2, 2, "v18"], [5, 2, "v15"], [8, 2, "v12"]]
    assert error_of(lambda: conn.select("multi", [1, "a", 3], index="pair")) == (
        31, "Invalid key part count (expected [0..2], got 3)")


def test_hash_index(conn):
    for k in ("a", "b", "c", "d"):
        conn.insert("hsh", (k, k.upper()))
    assert rows(conn.select("hsh", "b")) == [["b", "B"]]
    everything = [t[0] for t in conn.select("hsh", [], iterator=ALL)]
    assert sorted(everything) == ["a", "b", "c", "d"]
    # GT pages through the hash order
    after = [t[0] for t in conn.select("hsh", [everything[1]], iterator=GT)]
    assert after == everything[2:]
    assert error_of(lambda: conn.select("hsh", [], iterator=EQ)) == (
        136, "HASH index  does not support selects via a partial key (expected 1 parts, got 0). "
             "Please Consider changing index type to TREE.")
    assert error_of(lambda: conn.select("hsh", ["a"], iterator=GE)) == (
        112, "Index 'pk' (HASH) of space 'hsh' (memtx) does not support requested iterator type")


def test_key_errors(conn):
    assert error_of(lambda: conn.select("test", [1], index=7)) == (35, "No index #7 is defined in space 'test'")
    assert error_of(lambda: conn.select(999, [])) == (36, "Space '999' does not exist")
    assert error_of(lambda: conn.select("test", [1, 2])) == (31, "Invalid key part count (expected [0..1], got 2)")
    assert error_of(lambda: conn.select("test", ["x"])) == (
        18, "Supplied key type of part 0 does not match index part type: expected unsigned")
    assert error_of(lambda: conn.delete("test", ["x"], index=1)) == (
        41, "Get() doesn't support partial keys and non-unique indexes")
    assert error_of(lambda: conn.delete("test", [1, 2])) == (
        19, "Invalid key part count in an exact match (expected 1, got 2)")
    assert error_of(lambda: conn.select("test", [1], iterator=12)) == (1, "Illegal parameters, Invalid iterator type")
    assert error_of(lambda: conn.select("test", [1], iterator=7)) == (
        112, "Index 'primary' (TREE) of space 'test' (memtx) does not support requested iterator type")


def test_scalar_index_order_and_number_collisions(conn):
    values = [True, False, -3, 2.5, 0, "b", "ABC", "abc", b"abc", 10000000000000000000, -0.5, 5, b"\x00bin"]
    for v in values:
        conn.insert("scalars", (v,))
    got = [t[0] for t in conn.select("scalars", [], iterator=ALL)]
    assert got == [False, True, -3, -0.5, 0, 2.5, 5, 10000000000000000000, "ABC", "abc", "b", b"\x00bin", b"abc"]
    assert error_of(lambda: conn.insert("scalars", (5.0,)))[0] == 3  # 5 and 5.0 are the same key


def test_call_and_call16_wrapping(conn):
    conn.insert("test", (1, "one"))
    assert conn.call("box.space.test:select", [[1]]).data == [[[1, "one"]]]
    assert conn.call("box.space.test:get", [1]).data == [[1, "one"]]
    assert conn.call("box.space.test:len").data == [1]
    assert error_of(lambda: conn.call("nosuch")) == (33, "Procedure 'nosuch' is not defined")


def test_sysview_lookups_by_name(conn):
    [row] = conn.select(281, ["test"], index=2)
    assert row[:5] == [512, 1, "test", "memtx", 0]
    assert [f["name"] for f in row[6]] == ["id", "name", "val"]
    [irow] = conn.select(289, [512, "name"], index=2)
    assert irow[:4] == [512, 1, "name", "tree"] and irow[4] == {"unique": False}
    assert [list(p) for p in irow[5]] == [[1, "string"]]
