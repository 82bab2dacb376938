"""Redo records: what a transaction changed, noted through RedoTxn, replayed idempotently."""

import lmdb
import pytest

from boxqueue.storage import redo


@pytest.fixture
def env(tmp_path):
    e = lmdb.open(str(tmp_path / "env"), max_dbs=16, lock=False, sync=False)
    yield e
    e.close()


def contents(env) -> dict:
    """Every named database and its items."""
    out = {}
    with env.begin() as txn:
        names = [k for k, _ in txn.cursor()]
    for name in names:
        db = env.open_db(name, create=False)
        with env.begin() as txn:
            out[name] = list(txn.cursor(db=db))
    return out


def open_db(env):
    def opener(name, txn, create):
        try:
            return env.open_db(name, txn=txn, create=create)
        except lmdb.NotFoundError:
            return None

    return opener


def test_only_changes_that_took_effect_are_noted(env):
    db = env.open_db(b"a")
    with env.begin(write=True) as raw:
        txn = redo.RedoTxn(raw, {db: b"a", None: None})
        assert txn.put(b"k", b"1", db=db)
        assert not txn.put(b"k", b"2", overwrite=False, db=db)
        assert not txn.delete(b"missing", db=db)
        assert txn.replace(b"k", b"3", db=db) == b"1"
        assert txn.get(b"k", db=db) == b"3"
        assert txn.pop(b"k", db=db) == b"3"
        assert txn.pop(b"k", db=db) is None
        assert txn.stat(db)["entries"] == 0
        assert txn.operations() == [
            (redo.PUT, b"a", b"k", b"1"),
            (redo.PUT, b"a", b"k", b"3"),
            (redo.DELETE, b"a", b"k", None),
        ]
        assert redo.decode(txn.encode()) == txn.operations()


def test_values_of_bytes_subclasses_are_logged_too(env):
    class Raw(bytes):
        pass

    db = env.open_db(b"a")
    with env.begin(write=True) as raw:
        txn = redo.RedoTxn(raw, {db: b"a", None: None})
        txn.put(Raw(b"k"), Raw(b"v"), db=db)
        assert redo.decode(txn.encode()) == [(redo.PUT, b"a", b"k", b"v")]


def test_a_handle_without_a_name_cannot_write(env):
    unnamed = env.open_db(b"b")
    with env.begin(write=True) as raw:
        txn = redo.RedoTxn(raw, {None: None})
        with pytest.raises(redo.UnloggedDatabase):
            txn.put(b"k", b"v", db=unnamed)
        assert txn.get(b"k", db=unnamed) is None  # reads need no name


def test_cursor_writes_are_noted_and_reads_pass_through(env):
    db = env.open_db(b"a")
    with env.begin(write=True) as raw:
        txn = redo.RedoTxn(raw, {db: b"a", None: None})
        for i in range(3):
            txn.put(b"k%d" % i, b"v", db=db)
        with txn.cursor(db=db) as cur:
            assert [k for k, _v in cur] == [b"k0", b"k1", b"k2"]
            assert cur.set_key(b"k1")
            assert cur.delete()
            assert cur.put(b"k9", b"w")
            with pytest.raises(AttributeError):
                cur.putmulti([(b"x", b"y")])
        assert txn.operations()[-2:] == [(redo.DELETE, b"a", b"k1", None), (redo.PUT, b"a", b"k9", b"w")]


def test_replay_rebuilds_the_same_state_and_is_idempotent(env, tmp_path):
    # The original history, noted as it runs: DDL (create, empty, delete, re-create) and data.
    names = {None: None}
    batches = []
    for step in range(4):
        with env.begin(write=True) as raw:
            txn = redo.RedoTxn(raw, names)
            if step == 0:
                for name in (b"a", b"b"):
                    db = env.open_db(name, txn=raw)
                    names[db] = name
                    txn.created(name)
                    for i in range(20):
                        txn.put(b"%s%03d" % (name, i), b"v%d" % i, db=db)
            elif step == 1:
                a = next(h for h, n in names.items() if n == b"a")
                for i in range(0, 20, 3):
                    txn.delete(b"a%03d" % i, db=a)
                b = next(h for h, n in names.items() if n == b"b")
                txn.drop(b, delete=False)
                txn.put(b"after-empty", b"1", db=b)
            elif step == 2:
                b = next(h for h, n in names.items() if n == b"b")
                txn.drop(b, delete=True)
                del names[b]
            else:
                db = env.open_db(b"b", txn=raw)
                names[db] = b"b"
                txn.created(b"b")
                txn.put(b"reborn", b"2", db=db)
                txn.created(b"empty")
                env.open_db(b"empty", txn=raw)
            batches.append(txn.encode())
    expected = contents(env)
    assert expected[b"b"] == [(b"reborn", b"2")] and expected[b"empty"] == []

    other = lmdb.open(str(tmp_path / "replayed"), max_dbs=16, lock=False, sync=False)
    try:
        for payload in batches:
            with other.begin(write=True) as txn:
                redo.replay(txn, redo.decode(payload), open_db(other))
        assert contents(other) == expected
        # Again, from the end state, and from a state part-way through: nothing changes.
        for start in (0, 2):
            for payload in batches[start:]:
                with other.begin(write=True) as txn:
                    redo.replay(txn, redo.decode(payload), open_db(other))
            assert contents(other) == expected
    finally:
        other.close()


def test_a_payload_that_is_not_a_list_of_operations_is_refused():
    with pytest.raises(ValueError):
        redo.decode(b"\x01")
    with pytest.raises(ValueError):
        redo.decode(b"\x93\x00\xc0\xc0")  # three items: not whole operations


def test_put_all_writes_and_notes_each_pair_in_order_as_puts_would(env, tmp_path):
    db = env.open_db(b"a")
    pairs = [(b"k2", b"two"), (b"k1", b"one"), (b"k2", b"again")]  # a key written twice: the last wins
    with env.begin(write=True) as raw:
        txn = redo.RedoTxn(raw, {db: b"a", None: None})
        redo.put_all(txn, [k for k, _ in pairs], [v for _, v in pairs], db)
        assert txn.operations() == [(redo.PUT, b"a", k, v) for k, v in pairs]
        payload = txn.encode()
    assert contents(env)[b"a"] == [(b"k1", b"one"), (b"k2", b"again")]
    # A bare transaction (no log) writes the same; the record replays to the same state elsewhere.
    other = lmdb.open(str(tmp_path / "other"), max_dbs=16, lock=False, sync=False)
    try:
        with other.begin(write=True) as txn:
            redo.put_all(txn, [b"k0"], [b"zero"], other.open_db(b"a", txn=txn))
        with other.begin(write=True) as txn:
            redo.replay(txn, redo.decode(payload), open_db(other))
        assert contents(other)[b"a"] == [(b"k0", b"zero"), (b"k1", b"one"), (b"k2", b"again")]
    finally:
        other.close()
