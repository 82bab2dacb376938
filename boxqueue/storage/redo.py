"""Redo records: what a write transaction changed, by named database, so a log can replay it.

A write is a function of the LMDB write transaction (:mod:`boxqueue.storage.commit`). In ``fsync`` mode the
group committer hands it a :class:`RedoTxn` instead of the bare transaction: the same methods, each
write also noted as an operation. The operations of a group are one log record
(:mod:`boxqueue.storage.wal`); :func:`replay` applies them to another transaction.

Every operation is a blind write (put this value, delete this key, empty or delete this database,
create this database), so applying a record twice, or to a state that already holds it, changes
nothing: replay is idempotent. Only what took effect is noted (a ``put`` refused by
``overwrite=False``, a ``delete`` of a missing key are not). Databases are named by their LMDB
name, the main database by ``None``; only handles opened through
:meth:`storage.environment.Storage.db` have a name, and a write through any other handle fails
rather than go unlogged. Databases must not be ``dupsort`` (none of ours is).

The operations of a group are one flat msgpack array, four items an operation (flat, of exact
types only, because packing it is part of every write's cost):

* ``PUT, name, key, value``
* ``DELETE, name, key, nil``
* ``DROP, name, delete, nil`` (``delete`` false: emptied; true: removed)
* ``CREATE, name, nil, nil``
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lmdb
import msgpack

PUT = 0
DELETE = 1
DROP = 2
CREATE = 3

Op = tuple[Any, Any, Any, Any]


class UnloggedDatabase(Exception):
    """A write through a database handle the log cannot name."""


class RedoTxn:
    """A write transaction that notes each change it makes (see the module docstring).

    ``txn`` is the real transaction; ``ops`` the changes so far, in order, four items each (see
    :meth:`operations`); ``names`` maps the database handles of
    :class:`storage.environment.Storage` to their names.
    """

    __slots__ = ("txn", "ops", "_names")

    def __init__(self, txn: lmdb.Transaction, names: dict[Any, bytes | None]) -> None:
        # Any: lmdb's stubs type values as bytes | memoryview; without buffers=True (never used
        # here) they are bytes.
        self.txn: Any = txn
        self.ops: list[Any] = []
        self._names = names

    def _name(self, db: Any) -> bytes | None:
        try:
            return self._names[db]
        except KeyError:
            raise UnloggedDatabase(
                "a write through a database handle not opened with Storage.db cannot be logged"
            ) from None

    # -- reads: straight through ----------------------------------------------------------

    def get(self, key: bytes, default: Any = None, db: Any = None) -> Any:
        return self.txn.get(key, default, db)

    def stat(self, db: Any) -> dict[str, int]:
        return self.txn.stat(db)

    def id(self) -> int:
        return self.txn.id()

    def cursor(self, db: Any = None) -> RedoCursor:
        return RedoCursor(self.txn.cursor(db), self, db)

    # -- writes: made, then noted ---------------------------------------------------------

    def put(
        self,
        key: bytes,
        value: bytes,
        dupdata: bool = True,
        overwrite: bool = True,
        append: bool = False,
        db: Any = None,
    ) -> bool:
        try:  # inlined _name: this is every write's path
            name = self._names[db]
        except KeyError:
            name = self._name(db)
        if self.txn.put(key, value, dupdata, overwrite, append, db):
            self.ops += (PUT, name, key, value)
            return True
        return False

    def put_many(self, keys: list[bytes], values: list[bytes], db: Any = None) -> None:
        """:meth:`put` (overwriting) of each ``keys[i]``, ``values[i]``, in order: one call of a
        cursor's ``putmulti`` (about a quarter of what a ``put`` a pair costs)."""
        name = self._name(db)
        with self.txn.cursor(db) as cursor:
            cursor.putmulti(zip(keys, values, strict=True))
        ops: list[Any] = self.ops
        for i in range(len(keys)):
            ops.append(PUT)
            ops.append(name)
            ops.append(keys[i])
            ops.append(values[i])

    def replace(self, key: bytes, value: bytes, db: Any = None) -> bytes | None:
        name = self._name(db)
        old = self.txn.replace(key, value, db)
        self.ops += (PUT, name, key, value)
        return old

    def delete(self, key: bytes, value: bytes = b"", db: Any = None) -> bool:
        try:
            name = self._names[db]
        except KeyError:
            name = self._name(db)
        if self.txn.delete(key, value, db):
            self.ops += (DELETE, name, key, None)
            return True
        return False

    def pop(self, key: bytes, db: Any = None) -> bytes | None:
        try:  # inlined _name: an engine's delete by primary key comes here
            name = self._names[db]
        except KeyError:
            name = self._name(db)
        old = self.txn.pop(key, db)
        if old is not None:
            self.ops += (DELETE, name, key, None)
        return old

    def pop_many(self, keys: list[bytes], db: Any = None) -> list[bytes | None]:
        """:meth:`pop` of each of ``keys``, in order (the database's name looked up once)."""
        name = self._name(db)
        txn = self.txn
        ops: list[Any] = self.ops
        found: list[bytes | None] = []
        for i in range(len(keys)):
            key = keys[i]
            old = txn.pop(key, db)
            if old is not None:
                ops.append(DELETE)
                ops.append(name)
                ops.append(key)
                ops.append(None)
            found.append(old)
        return found

    def drop(self, db: Any, delete: bool = True) -> None:
        name = self._name(db)
        self.txn.drop(db, delete)
        self.ops += (DROP, name, bool(delete), None)

    def created(self, name: bytes) -> None:
        """Note that the named database ``name`` was opened with ``create=True`` in this
        transaction (called by :meth:`storage.environment.Storage.db`)."""
        self.ops += (CREATE, name, None, None)

    # -- the record ------------------------------------------------------------------------

    def operations(self) -> list[Op]:
        """The changes so far, one tuple each (for reading; :attr:`ops` is flat)."""
        ops = self.ops
        return [tuple(ops[i : i + 4]) for i in range(0, len(ops), 4)]

    def encode(self) -> bytes:
        """The operations so far, as the payload of one log record."""
        try:
            return msgpack.packb(self.ops, use_bin_type=True, strict_types=True)
        except TypeError:  # a subclass of bytes somewhere: the slower, lenient packer takes it
            return msgpack.packb(self.ops, use_bin_type=True)


class RedoCursor:
    """A cursor of a :class:`RedoTxn`: reads go straight through, writes are noted."""

    __slots__ = ("_cursor", "_redo", "_name", "_db")

    def __init__(self, cursor: lmdb.Cursor, redo: RedoTxn, db: Any) -> None:
        self._cursor: Any = cursor  # values are bytes, as the transaction's
        self._redo = redo
        self._name = redo._name(db)
        self._db = db

    def __getattr__(self, attr: str) -> Any:
        if attr in ("putmulti", "replace", "pop"):
            raise AttributeError(f"RedoCursor.{attr} is not supported: write through the transaction")
        return getattr(self._cursor, attr)

    def __iter__(self):
        return iter(self._cursor)

    def __enter__(self) -> RedoCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()

    def put(self, key: bytes, value: bytes, dupdata: bool = True, overwrite: bool = True, append: bool = False) -> bool:
        if self._cursor.put(key, value, dupdata, overwrite, append):
            self._redo.ops += (PUT, self._name, key, value)
            return True
        return False

    def delete(self, dupdata: bool = False) -> bool:
        key = self._cursor.key()
        if self._cursor.delete(dupdata):
            self._redo.ops += (DELETE, self._name, key, None)
            return True
        return False


def put_all(txn: Any, keys: list[bytes], values: list[bytes], db: Any) -> None:
    """``txn.put(keys[i], values[i], db=db)`` (overwriting) of each pair, in order, in one call:
    in a :class:`RedoTxn` (noted) or a bare transaction."""
    if type(txn) is RedoTxn:
        txn.put_many(keys, values, db)
        return
    with txn.cursor(db) as cursor:
        cursor.putmulti(zip(keys, values, strict=True))


def pop_all(txn: Any, keys: list[bytes], db: Any) -> list[bytes | None]:
    """``txn.pop(key, db)`` of each of ``keys``, in order: what each held (None where nothing),
    in a :class:`RedoTxn` (noted) or a bare transaction."""
    if type(txn) is RedoTxn:
        return txn.pop_many(keys, db)
    return [txn.pop(key, db) for key in keys]


def decode(payload: bytes | memoryview) -> list[Op]:
    """The operations of one log record's payload."""
    flat = msgpack.unpackb(payload, use_list=False, raw=True)
    if type(flat) is not tuple or len(flat) % 4:
        raise ValueError("a redo payload is a list of operations, four items each")
    return [flat[i : i + 4] for i in range(0, len(flat), 4)]


OpenDb = Callable[[bytes | None, lmdb.Transaction, bool], Any]


def replay(txn: Any, ops: list[Op], open_db: OpenDb, forget: Callable[[bytes], None] | None = None,
           watched: dict[bytes, Callable[[Any, bytes | None], None]] | None = None) -> None:
    """Apply ``ops`` in ``txn`` (a transaction, or a :class:`RedoTxn` to log them again).
    ``open_db(name, txn, create)`` gives the handle of a named database (``None`` when ``create``
    is false and it does not exist); ``name`` ``None`` is the main database. ``forget(name)`` is
    told of each database a DROP removes (its handle is no longer valid). ``watched``: database
    name -> a function told ``(txn, key)`` of each PUT or DELETE there and ``(txn, None)`` of a
    DROP."""
    handles: dict[bytes | None, Any] = {}

    def handle(name: bytes | None, create: bool = True) -> Any:
        found = handles.get(name)
        if found is None:
            found = open_db(name, txn, create)
            if found is not None:
                handles[name] = found
        return found

    for op in ops:
        code = op[0]
        if watched and op[1] in watched and code != CREATE:
            watched[op[1]](txn, op[2] if code in (PUT, DELETE) else None)
        if code == PUT:
            txn.put(op[2], op[3], db=handle(op[1]))
        elif code == DELETE:
            txn.delete(op[2], db=handle(op[1]))
        elif code == DROP:
            db = handle(op[1], create=False)
            if db is not None:
                txn.drop(db, delete=op[2])
                if op[2]:
                    handles.pop(op[1], None)
                    if forget is not None:
                        forget(op[1])
        elif code == CREATE:
            handle(op[1])
        else:
            raise ValueError(f"unknown redo operation {code!r}")
