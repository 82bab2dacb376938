"""A data space: its tuples in LMDB, one named database per index.

Layout of the databases (keys encoded by :mod:`boxqueue.storage.keys`, cut by ``stored_form``):

* primary index: ``pk`` -> the tuple's msgpack bytes, exactly as the client sent them;
* unique secondary index: ``key`` -> the primary entry's key;
* non-unique secondary index (and a unique one whose key holds a null, since nulls never clash):
  ``key + pk`` -> the primary entry's key. Equal keys are thus ordered by primary key, as in
  Tarantool.

Reads run on the event loop against the shared read transaction. Writes are prepared here (checks
that need no data) and return a function of the write transaction for the group committer; that
function checks what needs data (duplicates), then writes, so a rejected write writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import cython
import lmdb

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces import fieldtypes, msgpack_scan
from boxqueue.spaces import iterators as it
from boxqueue.spaces.definitions import IndexDef, SpaceDef
from boxqueue.spaces.index_views import IndexViews
from boxqueue.spaces.msgpack_values import pack, pack_flat, unpack
from boxqueue.spaces.update import UpdateOp, apply_ops
from boxqueue.storage import keys
from boxqueue.storage import keys as key_encoding
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import Storage, StorageError
from boxqueue.storage.redo import pop_all, put_all

__all__ = ["INSERT", "REPLACE", "Index", "IndexLookup", "Space", "StorageError", "decode_tuple"]

log = logging.getLogger(__name__)

INSERT = "insert"
REPLACE = "replace"

WriteFn = Callable[[lmdb.Transaction], Any]

# The field types every write checks, tested here in C; the others by fieldtypes.ACCEPTS (a call
# a field, some 300 instructions: a 1.5 queue task's twelve header fields took 4,900 a rewrite).
_BY_CALL = cython.declare(cython.int, 0)
_UNSIGNED = cython.declare(cython.int, 1)
_INTEGER = cython.declare(cython.int, 2)
_STRING = cython.declare(cython.int, 3)
_DOUBLE = cython.declare(cython.int, 4)
_VARBINARY = cython.declare(cython.int, 5)
_BOOLEAN = cython.declare(cython.int, 6)
_ANY = cython.declare(cython.int, 7)
_TYPE_CODES = {
    fieldtypes.UNSIGNED: _UNSIGNED, fieldtypes.INTEGER: _INTEGER, fieldtypes.STRING: _STRING,
    fieldtypes.DOUBLE: _DOUBLE, fieldtypes.VARBINARY: _VARBINARY, fieldtypes.BOOLEAN: _BOOLEAN,
    fieldtypes.ANY: _ANY,
}


@cython.cfunc
@cython.inline
@cython.locals(code=cython.int)
def _accepted(code: int, accepts: Any, value: Any) -> cython.bint:
    """What ``fieldtypes.ACCEPTS`` says of ``value`` for the type coded ``code``."""
    kind = type(value)
    if code == _UNSIGNED:
        return kind is int and value >= 0
    if code == _STRING:
        return kind is str
    if code == _INTEGER:
        return kind is int
    if code == _DOUBLE:
        return kind is float
    if code == _VARBINARY:
        return kind is bytes
    if code == _BOOLEAN:
        return kind is bool
    if code == _ANY:
        return True
    return bool(accepts(value))


@cython.cclass
class _FieldCheck:
    """What a write checks of one field (:meth:`Space.check_tuple`): its number, its type's code
    (``_BY_CALL``: ``accepts`` decides), whether nil may stand there. C fields, read without the
    unpacking of a tuple a field."""

    __slots__ = ("fieldno", "code", "accepts", "tname", "nullable")

    def __init__(self, fieldno: int, code: int, accepts: Callable[[Any], bool], tname: str, nullable: bool) -> None:
        self.fieldno = fieldno
        self.code = code
        self.accepts = accepts
        self.tname = tname
        self.nullable = nullable


def decode_tuple(raw: bytes) -> list[Any]:
    fields = unpack(raw)
    if type(fields) is not list:
        raise BoxError(ER.TUPLE_NOT_ARRAY)
    return fields


def _both(raw: bytes | None, fields: list[Any] | None) -> tuple[bytes, list[Any]]:
    """A tuple as bytes and as values, computing whichever is missing."""
    if raw is None:
        if type(fields) is not list:
            raise BoxError(ER.TUPLE_NOT_ARRAY)
        return pack(fields), fields
    return raw, decode_tuple(raw) if fields is None else fields


_NIL_PART = keys.encode_part(None)

# (Looked up on the module object: ``keys`` here is also the compiled module's C interface.)
_FAST_KEYS: dict[str, Callable[[Any], bytes | None]] = {
    fieldtypes.UNSIGNED: getattr(key_encoding, "encode_unsigned_key"),  # noqa: B009
    fieldtypes.STRING: getattr(key_encoding, "encode_string_key"),  # noqa: B009
}


@cython.cclass
class Index:
    """One index of a space: key extraction, key checks and scans."""


    def __init__(self, defn: IndexDef, space: Space) -> None:
        self.defn = defn
        self.space = space
        self.iid = defn.iid
        self.name = defn.name
        self.is_hash = defn.type == "HASH"
        self.unique = defn.unique
        self.parts = defn.parts
        self.fieldnos = tuple(p.field for p in defn.parts)
        self._last_field = max(self.fieldnos)
        self.part_count = len(defn.parts)
        self.has_nullable = any(p.is_nullable for p in defn.parts)
        self._accepts = tuple(fieldtypes.ACCEPTS[p.type] for p in defn.parts)
        # For the commonest lookup, a unique one-part key: value -> stored key, or None to take
        # the general path (which also validates).
        self.fast_key = None
        if self.unique and self.part_count == 1 and not self.has_nullable:
            self.fast_key = _FAST_KEYS.get(defn.parts[0].type)
        self.db = None
        # Kept in memory (spaces/index_views.py) rather than in its LMDB database, which stays
        # empty: set by Space.keep_indexes_in_memory.
        self.in_memory = False

    @cython.locals(n=cython.Py_ssize_t, f=cython.Py_ssize_t)
    def key_of(self, fields: list[Any]) -> list[Any]:
        n = len(fields)
        return [fields[f] if f < n else None for f in self.fieldnos]

    @cython.locals(n=cython.Py_ssize_t, f=cython.Py_ssize_t, parts=list)
    def entry_key(self, fields: list[Any], pk_encoded: bytes) -> tuple[bytes, bool]:
        """The full (uncut) key of this tuple's entry, and whether it is a unique-form entry."""
        n = len(fields)
        parts = []
        for f in self.fieldnos:
            parts.append(keys.encode_part(fields[f]) if f < n else _NIL_PART)  # absent: nil
        encoded = b"".join(parts)
        if self.iid == 0:
            return encoded, True
        if self.unique and not (self.has_nullable and self._has_nil(fields)):
            return encoded, True
        return encoded + pk_encoded, False

    def _has_nil(self, fields: list[Any]) -> bool:
        n = len(fields)
        return any(f >= n or fields[f] is None for f in self.fieldnos)

    def check_key(self, key: list[Any], exact: bool) -> None:
        """Tarantool's key checks: part count (31, or 41/19 for exact matches), part types (18)."""
        if exact:
            if not self.unique:
                raise BoxError(ER.MORE_THAN_ONE_TUPLE)
            if len(key) != self.part_count:
                raise BoxError(ER.EXACT_MATCH, self.part_count, len(key))
        elif len(key) > self.part_count:
            raise BoxError(ER.KEY_PART_COUNT, self.part_count, len(key))
        for i, value in enumerate(key):
            if value is None and self.parts[i].is_nullable:
                continue
            if not self._accepts[i](value):
                raise BoxError(ER.KEY_PART_TYPE, i, self.parts[i].type)

    def check_iterator(self, iterator: int, key: list[Any]) -> None:
        """Tarantool's checks of a select, in its order (``box_select``, ``key_validate``): the
        iterator type, then the key (part count, a partial key of a HASH index, part types), then
        whether this index has such an iterator."""
        if type(iterator) is not int or iterator < 0 or iterator > it.NEIGHBOR:
            raise BoxError(ER.ILLEGAL_PARAMS, "Invalid iterator type")
        # No key is fine for a TREE index, for ALL, and for a HASH index's GT (legacy).
        if key or (self.is_hash and iterator != it.ALL and iterator != it.GT):
            if len(key) > self.part_count:
                raise BoxError(ER.KEY_PART_COUNT, self.part_count, len(key))
            if self.is_hash and len(key) < self.part_count:
                raise BoxError(ER.PARTIAL_KEY, "HASH", self.part_count, len(key))
            self.check_key(key, exact=False)
        allowed = it.HASH_ITERATORS if self.is_hash else it.TREE_ITERATORS
        if iterator not in allowed:
            raise BoxError(
                ER.UNSUPPORTED_INDEX_FEATURE,
                self.name,
                self.defn.type,
                self.space.name,
                self.space.defn.engine,
                "requested iterator type",
            )


def _index_by_id(indexes: dict[int, Index], iid: int, space_name: str) -> Index:
    index = indexes.get(iid)
    if index is None:
        raise BoxError(ER.NO_SUCH_INDEX_ID, iid, space_name)
    return index


def _index_by_name(index_by_name: dict[str, Index], name: str, space_name: str) -> Index:
    index = index_by_name.get(name)
    if index is None:
        raise BoxError(ER.NO_SUCH_INDEX_NAME, name, space_name)
    return index


class IndexLookup:
    """Index lookups by id and by name, with Tarantool's errors (system views; :class:`Space`
    has the same two methods)."""

    name: str
    indexes: dict[int, Index]
    index_by_name: dict[str, Index]

    def index(self, iid: int) -> Index:
        return _index_by_id(self.indexes, iid, self.name)

    def index_named(self, name: str) -> Index:
        return _index_by_name(self.index_by_name, name, self.name)


@cython.cclass
class _ReplaceOnly:
    """A REPLACE into a space with no secondary index in LMDB: one put, noted for the in-memory
    views if the space has them (a callable object rather than a closure, which costs more to make
    on every write; and no read of the tuple it replaces, which nothing here needs)."""

    def __init__(self, space: Space, pk_stored: bytes, raw: bytes) -> None:
        self.space = space
        self.pk_stored = pk_stored
        self.raw = raw

    def __call__(self, txn: lmdb.Transaction) -> bytes:
        space = self.space
        space._check_alive()
        txn.put(self.pk_stored, self.raw, True, True, False, space.primary.db)
        if space.views is not None:
            space.views.changed(txn, self.pk_stored)
        return self.raw


@cython.cclass
class _ReplaceMany:
    """:class:`_ReplaceOnly` of several tuples, in order, as one write (a batch of puts: a Spark
    tube write's ``put_many``): their entries go to LMDB in one call (a cursor's ``putmulti``,
    about a quarter of what a ``put`` a tuple costs), and are noted for the views in one step.
    Its result is the list of the tuples written."""

    def __init__(self, space: Space, pks: list[bytes], raws: list[bytes]) -> None:
        self.space = space
        self.pks = pks
        self.raws = raws

    def __call__(self, txn: lmdb.Transaction) -> list[bytes]:
        space = self.space
        space._check_alive()
        put_all(txn, self.pks, self.raws, space.primary.db)
        if space.views is not None:
            space.views.changed_many(txn, self.pks)
        return self.raws


@cython.cclass
class _DeleteMany:
    """Deletes by primary key from a space with no secondary index in LMDB, in order, as one
    write (a Spark stream's ack of a claim's tasks): each entry found and deleted in one search,
    the lot noted for the views in one step. Its result is the list of the tuples deleted (None
    where there was none)."""

    def __init__(self, space: Space, pks: list[bytes]) -> None:
        self.space = space
        self.pks = pks

    def __call__(self, txn: lmdb.Transaction) -> list[bytes | None]:
        space = self.space
        space._check_alive()
        raws = pop_all(txn, self.pks, space.primary.db)
        if space.views is not None:
            space.views.changed_many(txn, self.pks)
        return raws


@cython.cclass
class Space:
    """Tuples of one user space, with their indexes."""


    def __init__(
        self,
        defn: SpaceDef,
        index_defs: list[IndexDef],
        storage: Storage,
        committer: GroupCommitter | None = None,
        txn: lmdb.Transaction | None = None,
    ) -> None:
        self.storage = storage
        self.committer = committer
        self.indexes = {}
        self.index_by_name = {}
        self.dropped = False
        self.owned_by = None  # a spaces.ownership.Owner: its data changes only through the engine
        self.memory_indexes = False
        self.views = None
        self.redefine(defn, index_defs, txn)

    def index(self, iid: int) -> Index:
        return _index_by_id(self.indexes, iid, self.name)

    def index_named(self, name: str) -> Index:
        return _index_by_name(self.index_by_name, name, self.name)

    # -- definition -------------------------------------------------------------------------

    def redefine(self, defn: SpaceDef, index_defs: list[IndexDef], txn: lmdb.Transaction | None = None) -> None:
        old = self.indexes
        self.defn = defn
        self.id = defn.id
        self.name = defn.name
        self.field_names = {f.name: i for i, f in enumerate(defn.format)}
        self.indexes = {}
        self.index_by_name = {}
        for idef in sorted(index_defs, key=lambda d: d.iid):
            index = Index(idef, self)
            previous = old.get(idef.iid)
            if previous is not None and previous.defn.db_name == idef.db_name:
                index.db = previous.db
            else:
                index.db = self.storage.db(idef.db_name.encode(), txn=txn)
            self.indexes[idef.iid] = index
            self.index_by_name[idef.name] = index
        self.primary = self.indexes.get(0)
        self._place_indexes()
        self._checks = self._compile_checks()

    def keep_indexes_in_memory(self, on: bool) -> None:
        """Keep this space's non-unique secondary indexes in memory (spaces/index_views.py)
        rather than in LMDB: for the spaces the tube engine owns."""
        if on != self.memory_indexes:
            self.memory_indexes = on
            self._place_indexes()

    @cython.locals(index=Index)
    def _place_indexes(self) -> None:
        """Which secondary indexes LMDB keeps (``secondaries``, the ones writes maintain) and
        which are in memory; a space with some in memory gets its views, and its primary
        database is watched so that records replayed from a leader reach them."""
        secondaries = []
        in_memory = False
        for iid, index in self.indexes.items():
            if iid == 0:
                continue
            index.in_memory = self.memory_indexes and not index.unique
            if index.in_memory:
                in_memory = True
            else:
                secondaries.append(index)
        self.secondaries = secondaries
        old = self.views
        watched = self.storage.watched
        if old is not None and self.primary is not None:
            watched.pop(self.primary.defn.db_name.encode(), None)
        if in_memory and self.primary is not None:
            # A change noted before a redefinition is still to be folded in; the views are built
            # again (the set of indexes may have changed).
            self.views = IndexViews(self, None if old is None else old.noted)
            watched[self.primary.defn.db_name.encode()] = self.views.replayed
        else:
            self.views = None

    def _compile_checks(self) -> list[_FieldCheck]:
        types: dict[int, tuple[str, bool]] = {}
        for i, f in enumerate(self.defn.format):
            types[i] = (f.type, f.is_nullable)
        for index in self.indexes.values():
            for part in index.parts:
                declared = types.get(part.field)
                if declared is None or declared[0] in (fieldtypes.ANY, fieldtypes.SCALAR):
                    nullable = part.is_nullable if declared is None else declared[1] or part.is_nullable
                    types[part.field] = (part.type, nullable)
        self._field_count = self.defn.field_count or 0
        return [
            _FieldCheck(no, _TYPE_CODES.get(t, _BY_CALL), fieldtypes.ACCEPTS[t], t, nullable)
            for no, (t, nullable) in sorted(types.items())
            if not (t == fieldtypes.ANY and nullable)
        ]

    def _primary(self) -> Index:
        if self.primary is None:
            raise BoxError(ER.NO_SUCH_INDEX_ID, 0, self.name)
        return self.primary

    @cython.locals(n=cython.Py_ssize_t, fieldno=cython.Py_ssize_t, check=_FieldCheck, checks=list,
                   i=cython.Py_ssize_t)
    def check_tuple(self, fields: list[Any], count: int = -1) -> None:
        """The space format and index part types (23 wrong type, 39 missing, 38 field count).
        ``count``: the tuple has that many fields, those past ``fields`` kept as stored (so
        checked when stored: a header rewrite's)."""
        n = len(fields)
        if count < 0:
            count = n
        if self._field_count and count != self._field_count:
            raise BoxError(ER.EXACT_FIELD_COUNT, count, self._field_count)
        checks = self._checks
        for i in range(len(checks)):
            check = checks[i]
            fieldno = check.fieldno
            if fieldno >= n:
                if fieldno < count or check.nullable:
                    continue
                raise BoxError(ER.FIELD_MISSING, fieldno + 1)
            value = fields[fieldno]
            if value is None and check.nullable:
                continue
            if not _accepted(check.code, check.accepts, value):
                raise BoxError(ER.FIELD_TYPE, fieldno + 1, check.tname)

    # -- reads --------------------------------------------------------------------------------

    @cython.locals(index=Index)
    def select(
        self,
        iid: int,
        iterator: int,
        key: list[Any],
        offset: int = 0,
        limit: int = 0xFFFFFFFF,
        txn: lmdb.Transaction | None = None,
    ) -> list[bytes]:
        """Tuples (msgpack bytes) in index order."""
        index = self.indexes.get(iid)
        if index is None:
            raise BoxError(ER.NO_SUCH_INDEX_ID, iid, self.name)
        fast_key = index.fast_key
        if fast_key is not None and iterator == 0 and len(key) == 1 and limit > 0 and not offset:
            stored = fast_key(key[0])
            if stored is not None:  # a well-typed unique key: one get
                if txn is None:
                    txn = self.storage.reader()
                found = txn.get(stored, None, index.db)
                if found is not None and index.iid != 0:
                    found = txn.get(found, None, self.primary.db)
                return [] if found is None else [found]
        if iterator == it.EQ and index.unique and len(key) == index.part_count:
            index.check_key(key, exact=False)
            if None not in key:  # a unique lookup: one get, no cursor
                if limit <= 0 or offset:
                    return []
                found = self._get(index, key, txn or self.storage.reader())
                return [found] if found is not None else []
        else:
            index.check_iterator(iterator, key)
            index.check_key(key, exact=False)
        if limit <= 0:
            return []
        return it.page(self._iterate(index, iterator, key, txn or self.storage.reader()), offset, limit)

    def get(self, iid: int, key: list[Any], txn: lmdb.Transaction | None = None) -> bytes | None:
        index = self.index(iid)
        index.check_key(key, exact=True)
        return self._get(index, key, txn or self.storage.reader())

    def get_many(self, wanted: list[list[Any]]) -> list[bytes | None]:
        """:meth:`get` by primary key of each key of ``wanted``, in one read transaction (a Spark
        stream's read of a claim's tasks)."""
        primary = self._primary()
        txn = self.storage.reader()
        db = primary.db
        found: list[bytes | None] = []
        for key in wanted:
            primary.check_key(key, exact=True)
            # (:meth:`_get`'s primary-key lookup, inline: a call a key cost about 1,000
            # instructions a streamed task in bench/handle_cost.py stream)
            found.append(txn.get(keys.stored_form(keys.encode(key)), None, db))
        return found

    def pairs(self, iid: int, iterator: int, key: list[Any], txn: lmdb.Transaction | None = None) -> Iterator[bytes]:
        """A lazy scan; the transaction must stay valid while it is consumed."""
        index = self.index(iid)
        index.check_iterator(iterator, key)
        index.check_key(key, exact=False)
        return self._iterate(index, iterator, key, txn or self.storage.reader())

    def count(self, iid: int = 0, iterator: int = it.ALL, key: list[Any] | None = None) -> int:
        key = key or []
        if not key and iterator in (it.ALL, it.EQ, it.GE, it.LE, it.REQ):
            return self.len()
        return sum(1 for _ in self.pairs(iid, iterator, key))

    def len(self, txn: lmdb.Transaction | None = None) -> int:
        primary = self._primary()
        txn = txn or self.storage.reader()
        return txn.stat(primary.db)["entries"]

    def stored_after(self, after: bytes | None, limit: int) -> tuple[list[bytes], bytes | None]:
        """Up to ``limit`` stored tuples in primary-key order, from the first after the stored
        primary key ``after`` (from the start when None), and the stored key to go on after (None
        once the scan has reached the end): a scan in chunks that decodes no key (recovery)."""
        values: list[bytes] = []
        with self.storage.reader().cursor(db=self._primary().db) as cursor:
            found = cursor.first() if after is None else cursor.set_range(after)
            if found and after is not None and cursor.key() == after:
                found = cursor.next()
            if not found:
                return values, None
            for value in cursor.iternext(keys=False):
                values.append(value)
                if len(values) >= limit:
                    return values, cursor.key()
        return values, None

    def _get(self, index: Index, key: list[Any], txn: lmdb.Transaction) -> bytes | None:
        found = txn.get(keys.stored_form(keys.encode(key)), db=index.db)
        if found is None or index.iid == 0:
            return found
        return txn.get(found, db=self._primary().db)

    def _iterate(self, index: Index, iterator: int, key: list[Any], txn: lmdb.Transaction) -> Iterator[bytes]:
        if index.is_hash and iterator == it.ALL:
            key = []
        primary_db = self._primary().db
        prefix = keys.encode(key)
        if index.in_memory:
            views = self.views
            reader = self.storage.reader()
            # The shared reader's snapshot keeps the shared views; any other transaction gets
            # a view of its own for this scan.
            cursor = views.cursor(index, txn) if txn is reader else views.cursor_in(index, txn)
            for _k, value in it.scan(cursor, iterator, prefix, self._true_key(index, txn)):
                yield txn.get(value, db=primary_db)
            return
        with txn.cursor(db=index.db) as cursor:
            for _k, value in it.scan(cursor, iterator, prefix, self._true_key(index, txn)):
                yield value if index.iid == 0 else txn.get(value, db=primary_db)

    def _true_key(self, index: Index, txn: lmdb.Transaction) -> it.TrueKey:
        primary = self._primary()

        def true_key(_stored: bytes, value: bytes) -> bytes:
            raw = value if index.iid == 0 else txn.get(value, db=primary.db)
            fields = decode_tuple(raw)
            pk = keys.encode(primary.key_of(fields))
            return index.entry_key(fields, pk)[0]

        return true_key

    # -- writes ------------------------------------------------------------------------------

    async def _write(self, fn: WriteFn) -> Any:
        if self.committer is None:
            raise BoxError(ER.READONLY)
        return await self.committer.write(fn)

    async def insert(self, raw: bytes | None, fields: list[Any] | None = None) -> bytes:
        raw, fields = _both(raw, fields)
        return await self._write(self.prepare_put(raw, fields, INSERT))

    async def replace(self, raw: bytes | None, fields: list[Any] | None = None) -> bytes:
        raw, fields = _both(raw, fields)
        return await self._write(self.prepare_put(raw, fields, REPLACE))

    async def delete(self, iid: int, key: list[Any]) -> bytes | None:
        return await self._write(self.prepare_delete(iid, key))

    async def update(self, iid: int, key: list[Any], ops: list[UpdateOp]) -> bytes | None:
        return await self._write(self.prepare_update(iid, key, ops))

    async def upsert(self, raw: bytes | None, fields: list[Any] | None, ops: list[UpdateOp]) -> None:
        raw, fields = _both(raw, fields)
        await self._write(self.prepare_upsert(raw, fields, ops))

    async def truncate(self) -> None:
        await self._write(self.prepare_truncate())

    # -- write preparation (each returns a function of the write transaction) ----------------

    def prepare_put(self, raw: bytes, fields: list[Any], mode: str) -> WriteFn:
        """INSERT or REPLACE of a tuple already decoded from ``raw``."""
        primary = self._primary()
        self.check_tuple(fields)
        pk = keys.encode(primary.key_of(fields))
        new_entries = self._entries(fields, pk)

        if mode == REPLACE and not self.secondaries:
            return _ReplaceOnly(self, new_entries[0][1], raw)

        def write(txn: lmdb.Transaction) -> bytes:
            self._check_alive()
            pk_stored = new_entries[0][1]
            old = txn.get(pk_stored, db=primary.db)
            if old is not None and mode == INSERT:
                raise BoxError(ER.TUPLE_FOUND, primary.name, self.name)
            old_entries = None
            if old is not None and self.secondaries:
                old_entries = self._entries(decode_tuple(old), pk)
            if self.secondaries:
                self._check_unique(txn, new_entries, pk_stored, old_entries)
            self._store(txn, raw, new_entries, old_entries)
            return raw

        return write

    @cython.locals(primary=Index, i=cython.Py_ssize_t)
    def prepare_puts(self, raws: list[bytes], rows: list[list[Any]], mode: str) -> WriteFn:
        """:meth:`prepare_put` of each tuple (``raws[i]``, decoded as ``rows[i]``), as one write
        that makes them in order; its result is the list of their results (the tuples)."""
        if mode == REPLACE and not self.secondaries:
            primary = self._primary()
            pks = []
            for i in range(len(rows)):
                fields = rows[i]
                self.check_tuple(fields)
                pks.append(keys.stored_form(keys.encode(primary.key_of(fields))))
            return _ReplaceMany(self, pks, raws)
        writes = [self.prepare_put(raw, fields, mode) for raw, fields in zip(raws, rows, strict=True)]

        def write(txn: lmdb.Transaction) -> list[Any]:
            return [fn(txn) for fn in writes]

        return write

    def prepare_deletes(self, pks: list[list[Any]]) -> Callable[[lmdb.Transaction], list[bytes | None]]:
        """:meth:`prepare_delete` by primary key of each of ``pks``, as one write that deletes
        them in order; its result is the list of the tuples deleted (None where there was none)."""
        primary = self._primary()
        if not self.secondaries:
            stored = []
            for key in pks:
                primary.check_key(key, exact=True)
                stored.append(keys.stored_form(keys.encode(key)))
            return _DeleteMany(self, stored)
        deletes = [self.prepare_delete(0, key) for key in pks]

        def delete(txn: lmdb.Transaction) -> list[bytes | None]:
            return [fn(txn) for fn in deletes]

        return delete

    def prepare_delete(self, iid: int, key: list[Any]) -> WriteFn:
        index = self.index(iid)
        index.check_key(key, exact=True)
        encoded = keys.encode(key)

        def delete(txn: lmdb.Transaction) -> bytes | None:
            self._check_alive()
            if self.secondaries:  # their entries come from the tuple's fields
                found = self._find(txn, index, encoded)
                if found is None:
                    return None
                pk_stored, raw, fields = found
                pk = keys.encode(self._primary().key_of(fields))
                for entry_index, stored, _unique in self._entries(fields, pk):
                    txn.delete(stored, db=entry_index.db)
            elif index.iid == 0:  # the primary entry alone, found and deleted in one search
                pk_stored = keys.stored_form(encoded)
                raw = txn.pop(pk_stored, db=self._primary().db)
                if raw is None:
                    return None
            else:  # the primary entry alone, found through this index's
                located = self._locate(txn, index, encoded)
                if located is None:
                    return None
                pk_stored, raw = located
                txn.delete(pk_stored, db=self._primary().db)
            if self.views is not None:
                self.views.changed(txn, pk_stored)
            return raw

        return delete

    def prepare_update(self, iid: int, key: list[Any], ops: list[UpdateOp]) -> WriteFn:
        def update(txn: lmdb.Transaction, pk_stored: bytes, raw: bytes, fields: list[Any]) -> bytes:
            return self._apply_update(txn, pk_stored, fields, ops)

        return self._prepare_by_key(iid, key, update)

    def prepare_transform(self, key: list[Any], transform: Callable[[bytes], bytes]) -> WriteFn:
        """Read-modify-write by primary key: ``transform(stored tuple) -> new tuple`` runs inside
        the write transaction, so it sees every write queued before it. The new tuple is checked
        like any replace (format, unique indexes, unchanged primary key). ``None`` if no tuple."""

        def rewrite(txn: lmdb.Transaction, pk_stored: bytes, raw: bytes, fields: list[Any]) -> bytes:
            new_raw = transform(raw)
            return self._rewrite(txn, pk_stored, fields, decode_tuple(new_raw), new_raw)

        return self._prepare_by_key(0, key, rewrite)

    def prepare_head_rewrite(self, key: list[Any], head: list[Any]) -> WriteFn:
        """Read-modify-write by primary key that replaces the stored tuple's first ``len(head)``
        fields with ``head`` and keeps the rest as stored bytes (the tube engine's changes of a
        task's header). What :meth:`prepare_transform` with such a transform gives, with less
        work: the new tuple is not decoded, and only the index entries whose parts changed are
        computed. ``None`` if no tuple."""
        primary = self._primary()
        primary.check_key(key, exact=True)
        encoded = keys.encode(key)
        # The head's primary key, when the head holds all of it (the engine's heads do).
        head_key = primary.key_of(head) if max(primary.fieldnos) < len(head) else None

        def rewrite(txn: lmdb.Transaction) -> bytes | None:
            self._check_alive()
            return self._rewrite_head(txn, encoded, key, head, head_key)

        return rewrite

    @cython.locals(n=cython.Py_ssize_t, count=cython.Py_ssize_t)
    def _rewrite_head(self, txn: lmdb.Transaction, encoded: bytes, key: list[Any], head: list[Any],
                      head_key: list[Any] | None) -> bytes | None:
        primary = self._primary()
        located = self._locate(txn, primary, encoded)
        if located is None:
            return None
        pk_stored, raw = located
        n = len(head)
        count, new_raw = msgpack_scan.head_replaced(raw, n, pack_flat(head))
        if head_key is not None and count >= n and not self.secondaries:
            # Without secondary indexes in LMDB nothing needs the stored fields decoded: the kept
            # ones were checked when stored (and again by any change of format since), the head
            # is checked here, and only the primary entry changes.
            if head_key != key:  # (numbers equal by value encode alike: storage/keys.py)
                raise BoxError(ER.CANT_UPDATE_PRIMARY_KEY, primary.name, self.name)
            self.check_tuple(head, count)
            txn.put(pk_stored, new_raw, True, True, False, primary.db)
            if self.views is not None:
                self.views.changed(txn, pk_stored)
            return new_raw
        fields = decode_tuple(raw)
        return self._rewrite(txn, pk_stored, fields, head + fields[n:], new_raw)

    def _rewrite(self, txn: lmdb.Transaction, pk_stored: bytes, fields: list[Any], new_fields: list[Any],
                 new_raw: bytes | None) -> bytes:
        """Store ``new_fields`` (packed as ``new_raw``, or here once checked when None) in place of
        the tuple ``fields`` stored under ``pk_stored``: the primary key unchanged, the format and
        the unique indexes checked, only the index entries that change moved."""
        primary = self._primary()
        pk = keys.encode(primary.key_of(new_fields))
        if keys.stored_form(pk) != pk_stored:
            raise BoxError(ER.CANT_UPDATE_PRIMARY_KEY, primary.name, self.name)
        self.check_tuple(new_fields)
        if new_raw is None:
            new_raw = pack(new_fields)
        new_entries, old_entries = self._changed_entries(fields, new_fields, pk, pk_stored)
        self._check_unique(txn, new_entries, pk_stored, old_entries)
        self._store(txn, new_raw, new_entries, old_entries)
        return new_raw

    @cython.locals(index=Index, f=cython.Py_ssize_t, changed=cython.bint)
    def _changed_entries(
        self, old_fields: list[Any], new_fields: list[Any], pk: bytes, pk_stored: bytes,
    ) -> tuple[list[tuple[Index, bytes, bool]], list[tuple[Index, bytes, bool]]]:
        """The entries of the new and the old tuple (same primary key) in the indexes where a
        part's value changed, primary first (as :meth:`_store` takes them); an index whose parts
        kept their values, type included, keeps its entry (equal values of one type encode to the
        same key: numbers by value, ``storage/keys.py``)."""
        primary_entry = (self.primary, pk_stored, True)
        new_entries = [primary_entry]
        old_entries = [primary_entry]
        n_old = len(old_fields)
        n_new = len(new_fields)
        stored_form = keys.stored_form
        for index in self.secondaries:
            changed = False
            for f in index.fieldnos:
                old = old_fields[f] if f < n_old else None
                new = new_fields[f] if f < n_new else None
                if old is not new and (type(old) is not type(new) or old != new):
                    changed = True
                    break
            if changed:
                full, unique_form = index.entry_key(new_fields, pk)
                new_entries.append((index, stored_form(full), unique_form))
                full, unique_form = index.entry_key(old_fields, pk)
                old_entries.append((index, stored_form(full), unique_form))
        return new_entries, old_entries

    def _prepare_by_key(self, iid: int, key: list[Any], action: Callable[..., bytes]) -> WriteFn:
        """A write on the tuple a full unique key names; ``None`` when there is none."""
        index = self.index(iid)
        index.check_key(key, exact=True)
        encoded = keys.encode(key)

        def write(txn: lmdb.Transaction) -> bytes | None:
            self._check_alive()
            found = self._find(txn, index, encoded)
            return None if found is None else action(txn, *found)

        return write

    def prepare_upsert(self, raw: bytes, fields: list[Any], ops: list[UpdateOp]) -> WriteFn:
        """UPSERT: insert ``raw`` when its primary key is new, else apply ``ops``. As in
        Tarantool, a failing op is skipped, and a result that changes the primary key or breaks
        the format leaves the tuple as it was; neither is reported to the client."""
        primary = self._primary()
        self.check_tuple(fields)
        pk = keys.encode(primary.key_of(fields))
        new_entries = self._entries(fields, pk)

        def write(txn: lmdb.Transaction) -> None:
            self._check_alive()
            pk_stored = new_entries[0][1]
            old = txn.get(pk_stored, db=primary.db)
            if old is None:
                self._check_unique(txn, new_entries, pk_stored)
                self._store(txn, raw, new_entries, None)
                return None
            try:
                self._apply_update(txn, pk_stored, decode_tuple(old), ops, skip_errors=True)
            except BoxError as exc:
                log.info("upsert into space '%s' left the tuple unchanged: %s", self.name, exc.message)
            return None

        return write

    def prepare_truncate(self) -> WriteFn:
        def write(txn: lmdb.Transaction) -> None:
            for index in self.indexes.values():
                txn.drop(index.db, delete=False)
            if self.views is not None:
                self.views.emptied(txn)

        return write

    # -- write internals (run in the committer) ----------------------------------------------

    def _check_alive(self) -> None:
        if self.dropped:
            raise BoxError(ER.NO_SUCH_SPACE, self.name)

    @cython.locals(index=Index)
    def _entries(self, fields: list[Any], pk: bytes) -> list[tuple[Index, bytes, bool]]:
        """Each index's entry for this tuple, primary first; ``pk`` is its encoded primary key."""
        stored_form = keys.stored_form
        out = [(self.primary, stored_form(pk), True)]
        for index in self.secondaries:
            full, unique_form = index.entry_key(fields, pk)
            out.append((index, stored_form(full), unique_form))
        return out

    def _find(self, txn: lmdb.Transaction, index: Index, encoded: bytes) -> tuple[bytes, bytes, list[Any]] | None:
        """The stored primary key, the tuple and its fields of the tuple a unique key names."""
        located = self._locate(txn, index, encoded)
        if located is None:
            return None
        pk_stored, raw = located
        return pk_stored, raw, decode_tuple(raw)

    def _locate(self, txn: lmdb.Transaction, index: Index, encoded: bytes) -> tuple[bytes, bytes] | None:
        stored = keys.stored_form(encoded)
        primary_db = self._primary().db
        if index.iid == 0:
            raw = txn.get(stored, db=primary_db)
            pk_stored = stored
        else:
            pk_stored = txn.get(stored, db=index.db)
            raw = txn.get(pk_stored, db=primary_db) if pk_stored is not None else None
        if raw is None:
            return None
        return pk_stored, raw

    def _apply_update(
        self,
        txn: lmdb.Transaction,
        pk_stored: bytes,
        fields: list[Any],
        ops: list[UpdateOp],
        skip_errors: bool = False,
    ) -> bytes:
        new_fields = apply_ops(fields, ops, self.field_names, skip_errors=skip_errors)
        return self._rewrite(txn, pk_stored, fields, new_fields, None)

    @cython.locals(i=cython.Py_ssize_t)
    def _check_unique(
        self,
        txn: lmdb.Transaction,
        entries: list[tuple[Index, bytes, bool]],
        pk_stored: bytes,
        old_entries: list[tuple[Index, bytes, bool]] | None = None,
    ) -> None:
        """No other tuple holds a unique key of ``entries`` (keys the tuple already had are
        skipped: they are its own)."""
        for i in range(1, len(entries)):
            index, stored, unique_form = entries[i]
            if not unique_form or (old_entries is not None and old_entries[i][1] == stored):
                continue
            holder = txn.get(stored, None, index.db)
            if holder is not None and holder != pk_stored:
                raise BoxError(ER.TUPLE_FOUND, index.name, self.name)

    @cython.locals(i=cython.Py_ssize_t)
    def _store(
        self,
        txn: lmdb.Transaction,
        raw: bytes,
        new_entries: list[tuple[Index, bytes, bool]],
        old_entries: list[tuple[Index, bytes, bool]] | None,
    ) -> None:
        """Write the tuple and its index entries; an entry that did not change is left as it is."""
        pk_stored = new_entries[0][1]
        txn.put(pk_stored, raw, True, True, False, new_entries[0][0].db)
        if self.views is not None:
            self.views.changed(txn, pk_stored)
        for i in range(1, len(new_entries)):
            index, stored, _unique = new_entries[i]
            if old_entries is not None:
                old_key = old_entries[i][1]
                if old_key == stored:
                    continue
                txn.delete(old_key, b"", index.db)
            txn.put(stored, pk_stored, True, True, False, index.db)
