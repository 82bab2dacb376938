"""Keys beyond LMDB's key size, nullable parts, and every field type through the connector."""

import decimal
import uuid

import pytest
import tarantool
from tarantool.error import DatabaseError

from tests.integration.conftest import TARGET

EQ, REQ, ALL, LT, LE, GE, GT = range(7)


def test_long_keys_keep_their_order(conn):
    prefix = "p" * 900  # far beyond the 511 bytes LMDB allows in a key
    names = [prefix + suffix for suffix in ("b", "a", "c", "ab", "")] + ["short", prefix[:10]]
    for i, name in enumerate(names):
        conn.insert("longkeys", (name, "tag" + "x" * 700 if i % 2 else "tag", i))
    ordered = [t[0] for t in conn.select("longkeys", [], iterator=ALL)]
    assert ordered == sorted(names)
    assert [t[0] for t in conn.select("longkeys", [], iterator=REQ)] == sorted(names, reverse=True)
    assert [t[0] for t in conn.select("longkeys", [prefix + "a"], iterator=GT)] == [
        n for n in sorted(names) if n > prefix + "a"
    ]
    assert [t[0] for t in conn.select("longkeys", [prefix + "ab"], iterator=LE)] == [
        n for n in sorted(names, reverse=True) if n <= prefix + "ab"
    ]
    assert [t[2] for t in conn.select("longkeys", prefix + "c")] == [2]
    with pytest.raises(DatabaseError) as err:
        conn.insert("longkeys", (prefix + "c", "dup"))
    assert err.value.args[0] == 3
    # a non-unique index whose long keys collide on their first bytes
    long_tag = [t[2] for t in conn.select("longkeys", ["tag" + "x" * 700], index="tag")]
    assert sorted(long_tag) == [1, 3, 5] and long_tag == [
        t[2] for t in sorted((t for t in conn.select("longkeys") if t[1] != "tag"), key=lambda t: t[0])
    ]
    assert rows_deleted(conn, prefix + "a") == [[prefix + "a", "tag" + "x" * 700, 1]]
    assert len(conn.select("longkeys", ["tag" + "x" * 700], index="tag")) == 2


def rows_deleted(conn, key):
    return [list(t) for t in conn.delete("longkeys", key)]


def test_every_field_type(conn):
    row = (1, -5, decimal.Decimal("2.5"), 1.5, "s", True, b"\x00\x01", 7, uuid.UUID(int=9),
           decimal.Decimal("-12.345"), tarantool.Datetime(year=2024, month=5, day=6) if TARGET == "ours" else 0,
           {"any": [1, None]}, None)
    assert list(conn.insert("typed", row)[0]) == list(row)
    assert list(conn.select("typed", uuid.UUID(int=9), index="by_uuid")[0]) == list(row)
    bad = {1: 1.5, 3: 1, 4: b"bytes", 5: 1, 6: "str", 8: "not-a-uuid", 9: 1.5}
    for field, value in bad.items():
        broken = list(row)
        broken[0] = 100 + field
        broken[field] = value
        with pytest.raises(DatabaseError) as err:
            conn.insert("typed", tuple(broken))
        assert err.value.args[0] == 23, (field, err.value.args)


def test_nullable_unique_index_allows_many_nulls(conn):
    base = [2, -1, 1, 1.0, "s", False, b"", "x", None, decimal.Decimal(1), None, None, None]
    for i in range(3):
        row = list(base)
        row[0], row[8] = 10 + i, uuid.UUID(int=100 + i)
        if TARGET != "ours":
            row[10] = 0
        else:
            row[10] = tarantool.Datetime(year=2020, month=1, day=1)
        conn.insert("typed", tuple(row))
    assert [t[0] for t in conn.select("typed", [None], index="by_opt")] == [10, 11, 12]
    row = list(base)
    row[0], row[8], row[12] = 20, uuid.UUID(int=200), "only"
    row[10] = tarantool.Datetime(year=2020, month=1, day=1) if TARGET == "ours" else 0
    conn.insert("typed", tuple(row))
    row[0], row[8] = 21, uuid.UUID(int=201)
    with pytest.raises(DatabaseError) as err:
        conn.insert("typed", tuple(row))
    assert err.value.args[:2] == (3, "Duplicate key exists in unique index 'by_opt' in space 'typed'")
