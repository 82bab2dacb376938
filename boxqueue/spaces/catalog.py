"""The catalogue: every space and index, persisted in LMDB, and the schema version.

The ``_catalog`` database holds one record per space (its ``_space`` row and its ``_index`` rows
with the names of their LMDB databases) and a few counters (schema version, largest space id,
instance uuid, session ids handed out). Schema changes run one at a time under a lock, as
exclusive commits; memory is updated only once the change is durable, and the schema version is
bumped so connectors reload their caches.
"""

from __future__ import annotations

import logging
import re
import struct
import uuid
from typing import Any

import lmdb
import msgpack
import trio

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces import fieldtypes, sysviews
from boxqueue.spaces.access import AccessControl
from boxqueue.spaces.definitions import (
    FieldDef,
    IndexDef,
    SpaceDef,
    check_index,
    index_from_row,
    parse_part,
    space_from_row,
)
from boxqueue.spaces.ownership import Ownership
from boxqueue.spaces.space import Index, Space, decode_tuple
from boxqueue.spaces.write_gate import WriteGate
from boxqueue.storage import keys
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import Storage

log = logging.getLogger(__name__)

CATALOG_DB = b"_catalog"
FIRST_USER_SPACE_ID = 512
SCHEMA_VERSION_START = 80
SESSION_BLOCK = 1000

_SPACE_PREFIX = b"space:"
_META_SCHEMA_VERSION = b"meta:schema_version"
_META_MAX_ID = b"meta:max_id"
_META_DB_SEQ = b"meta:db_seq"
_META_UUID = b"meta:instance_uuid"
_META_SESSIONS = b"meta:session_ids_reserved"

_IDENTIFIER = re.compile(r"^[^\x00-\x1f\x7f]{1,65000}$")


def _space_key(space_id: int) -> bytes:
    return _SPACE_PREFIX + struct.pack(">I", space_id)


def _get_int(txn: lmdb.Transaction, db: Any, key: bytes, default: int) -> int:
    raw = txn.get(key, db=db)
    return default if raw is None else msgpack.unpackb(raw)


class Catalog:
    """Spaces by id and name, DDL, and the system views built from them."""

    def __init__(self, storage: Storage, committer: GroupCommitter, access: AccessControl | None = None) -> None:
        self.storage = storage
        self.committer = committer
        self.access = access or AccessControl()
        self.spaces: dict[int, Space] = {}
        self.by_name: dict[str, Space] = {}
        self.schema_version = SCHEMA_VERSION_START
        self.max_id = FIRST_USER_SPACE_ID - 1
        self.instance_uuid = ""
        self.functions: dict[str, int] = {}  # name -> id, for _vfunc (filled by the procedure registry)
        self._db_seq = 0
        self._sessions_reserved = 0
        self._next_session = 1
        self._ddl_lock = trio.Lock()
        self._db = storage.db(CATALOG_DB)
        self.views = sysviews.SystemViews(self)
        self.ownership = Ownership()  # which spaces only the engine may change (spaces.ownership)
        self.writes = WriteGate(self.access, committer)  # whether a client's write may happen (spaces.write_gate)

    # -- loading -----------------------------------------------------------------------------

    def load(self) -> None:
        """Read the catalogue from LMDB; create the counters on first start."""
        env = self.storage.env
        with env.begin(write=True) as txn:
            self.schema_version = _get_int(txn, self._db, _META_SCHEMA_VERSION, SCHEMA_VERSION_START)
            self.max_id = _get_int(txn, self._db, _META_MAX_ID, FIRST_USER_SPACE_ID - 1)
            self._db_seq = _get_int(txn, self._db, _META_DB_SEQ, 0)
            # This node's own identity and session ids live in its local database, which is never
            # replicated (a data directory written before replica sets kept them in the catalogue).
            local = self.storage.local_db
            raw_uuid = txn.get(_META_UUID, db=local) or txn.get(_META_UUID, db=self._db)
            if raw_uuid is None:
                raw_uuid = str(uuid.uuid4()).encode()
            txn.put(_META_UUID, raw_uuid, db=local)
            self.instance_uuid = raw_uuid.decode()
            # Session ids are never reused: start after every id reserved by earlier runs.
            reserved = max(_get_int(txn, local, _META_SESSIONS, 0), _get_int(txn, self._db, _META_SESSIONS, 0))
            self._next_session = reserved + 1
            self._sessions_reserved = reserved + SESSION_BLOCK
            txn.put(_META_SESSIONS, msgpack.packb(self._sessions_reserved), db=local)
            self._read_spaces(txn)
        # The handles opened in it are valid for good: not to be forgotten with the next write
        # transaction that is aborted (a full disk's, say).
        self.storage.txn_ended(True)

    async def reload(self) -> None:
        """Read the spaces again from LMDB, as a follower does after records that changed them (or
        after a fresh copy): the definitions are replaced, the node's own metadata kept. The
        indexes' databases are opened first, each in a write transaction of the committer's."""
        opened: set[str] = set()
        while True:
            with self.storage.env.begin() as txn:
                names = {db_name for record in self._space_records(txn) for _row, db_name in record["indexes"]}
                if names <= opened:  # every handle open: read them all in this transaction
                    self.spaces = {}
                    self.by_name = {}
                    self.storage.watched.clear()  # the new spaces watch their own databases
                    self.schema_version = _get_int(txn, self._db, _META_SCHEMA_VERSION, SCHEMA_VERSION_START)
                    self.max_id = _get_int(txn, self._db, _META_MAX_ID, FIRST_USER_SPACE_ID - 1)
                    self._db_seq = _get_int(txn, self._db, _META_DB_SEQ, 0)
                    self._read_spaces(txn)
                    return
            for db_name in sorted(names - opened):  # (records applied meanwhile: look again after)
                await self.committer.open_db(db_name.encode())
            opened |= names

    def _space_records(self, txn: lmdb.Transaction) -> list[dict[str, Any]]:
        records = []
        with txn.cursor(db=self._db) as cur:
            if cur.set_range(_SPACE_PREFIX):
                for k, v in cur:
                    if not k.startswith(_SPACE_PREFIX):
                        break
                    records.append(msgpack.unpackb(v, raw=False, strict_map_key=False))
        return records

    def _read_spaces(self, txn: lmdb.Transaction) -> None:
        records = self._space_records(txn)
        for record in records:
            sdef = space_from_row(record["row"])
            idefs = [index_from_row(row, db_name) for row, db_name in record["indexes"]]
            self._register(Space(sdef, idefs, self.storage, self.committer, txn))

    def _register(self, space: Space) -> None:
        self.spaces[space.id] = space
        self.by_name[space.name] = space
        self.ownership.mark(space)

    def _unregister(self, space: Space) -> None:
        space.keep_indexes_in_memory(False)
        self.spaces.pop(space.id, None)
        if self.by_name.get(space.name) is space:
            del self.by_name[space.name]

    async def empty_memory_index_databases(self) -> int:
        """Empty the LMDB databases of the indexes kept in memory (spaces/index_views.py): a data
        directory written before they were (or an index a DDL made since the last start) still
        holds their entries, which nothing reads or updates any more. This node's own change,
        not logged: every member does it at its start. Returns the entries dropped."""
        reader = self.storage.reader()
        stale = [
            (space, index, reader.stat(index.db)["entries"])
            for space in self.spaces.values()
            for index in space.indexes.values()
            if index.in_memory and index.db is not None
        ]
        stale = [(space, index, entries) for space, index, entries in stale if entries]
        if not stale:
            return 0

        def empty(txn: lmdb.Transaction) -> None:
            for _space, index, _entries in stale:
                txn.drop(index.db, delete=False)

        await self.committer.write_local(empty)
        for space, index, entries in stale:
            log.info("space '%s': index '%s' is now kept in memory; its LMDB database's %d entries dropped",
                     space.name, index.name, entries)
        return sum(entries for _space, _index, entries in stale)

    # -- lookups -----------------------------------------------------------------------------

    def space(self, ref: int | str) -> Space:
        """A data space by id or name; ER_NO_SUCH_SPACE otherwise (system views excluded)."""
        found = self.spaces.get(ref) if type(ref) is int else self.by_name.get(ref)
        if found is None:
            raise BoxError(ER.NO_SUCH_SPACE, ref)
        return found

    def lookup(self, ref: int | str) -> Space | sysviews.SystemView:
        """A data space or a system view by id or name."""
        if type(ref) is int:
            found = self.spaces.get(ref) or self.views.by_id.get(ref)
        else:
            found = self.by_name.get(ref) or self.views.by_name.get(ref)
        if found is None:
            raise BoxError(ER.NO_SUCH_SPACE, ref)
        return found

    # -- session ids -------------------------------------------------------------------------

    async def next_session_id(self) -> int:
        """A session id never handed out before, even by an earlier run of the server."""
        sid = self._next_session
        self._next_session += 1
        if sid > self._sessions_reserved:
            async with self._ddl_lock:
                if sid > self._sessions_reserved:
                    reserved = max(self._sessions_reserved, sid) + SESSION_BLOCK

                    def write(txn: lmdb.Transaction) -> None:
                        txn.put(_META_SESSIONS, msgpack.packb(reserved), db=self.storage.local_db)

                    await self.committer.write_local(write)
                    self._sessions_reserved = reserved
        return sid

    # -- DDL ---------------------------------------------------------------------------------

    def _new_db_name(self, space_id: int, iid: int) -> str:
        self._db_seq += 1
        return f"s{space_id}.i{iid}.{self._db_seq}"

    async def create_space(
        self,
        name: str,
        *,
        space_id: int | None = None,
        format: tuple[FieldDef, ...] = (),
        engine: str = "memtx",
        field_count: int = 0,
        owner: int = 1,
        temporary: bool = False,
        if_not_exists: bool = False,
    ) -> tuple[Space, bool]:
        """Create a space; returns it and whether it was created (``False`` with if_not_exists)."""
        async with self._ddl_lock:
            if not isinstance(name, str) or not _IDENTIFIER.match(name):
                raise BoxError(ER.IDENTIFIER, name)
            existing = self.by_name.get(name) or self.views.by_name.get(name)
            if existing is not None:
                if if_not_exists and isinstance(existing, Space):
                    return existing, False
                raise BoxError(ER.SPACE_EXISTS, name)
            if engine not in ("memtx", "vinyl"):
                raise BoxError(ER.NO_SUCH_ENGINE, engine)
            if space_id is None:
                space_id = max(self.max_id, max(self.spaces, default=0), FIRST_USER_SPACE_ID - 1) + 1
            elif space_id in self.spaces or space_id in self.views.by_id:
                if if_not_exists and space_id in self.spaces:
                    return self.spaces[space_id], False
                raise BoxError(ER.SPACE_EXISTS, space_id)
            if type(space_id) is not int or space_id < 0 or space_id > 0x7FFFFFFF:
                raise BoxError(ER.CREATE_SPACE, name, "space id is out of range")
            flags = {"temporary": True} if temporary else {}
            sdef = SpaceDef(space_id, name, engine, owner, field_count, tuple(format), flags)
            space = Space(sdef, [], self.storage, self.committer)
            await self._persist(space, [], max_id=max(self.max_id, space_id))
            self.max_id = max(self.max_id, space_id)
            self._register(space)
            return space, True

    async def create_index(
        self,
        space: Space,
        name: str,
        *,
        index_type: str = "TREE",
        unique: bool | None = None,
        parts: list[Any] | None = None,
        iid: int | None = None,
        if_not_exists: bool = False,
    ) -> tuple[IndexDef, bool]:
        async with self._ddl_lock:
            self._check_alive(space)
            if not isinstance(name, str) or not _IDENTIFIER.match(name):
                raise BoxError(ER.IDENTIFIER, name)
            if name in space.index_by_name:
                if if_not_exists:
                    return space.index_by_name[name].defn, False
                raise BoxError(ER.INDEX_EXISTS, name)
            if iid is None:
                iid = max(space.indexes, default=-1) + 1
            elif iid in space.indexes:
                raise BoxError(ER.INDEX_EXISTS, name)
            if iid != 0 and space.primary is None:
                raise BoxError(ER.MODIFY_INDEX, name, space.name, "can not add a secondary key before primary")
            index_type = str(index_type).upper()
            if unique is None:
                unique = True
            raw_parts = parts if parts is not None else [[0, "unsigned"]]
            if not isinstance(raw_parts, list | tuple):
                raise BoxError(ER.ILLEGAL_PARAMS, "options.parts must be a table")
            part_defs = tuple(parse_part(p, i, space.defn.format) for i, p in enumerate(raw_parts))
            idef = IndexDef(space.id, iid, name, index_type, bool(unique), part_defs)
            others = [i.defn for i in space.indexes.values()]
            check_index(space.defn, idef, others)
            idef = IndexDef(space.id, iid, name, index_type, bool(unique), part_defs, self._new_db_name(space.id, iid))
            await self._persist(space, [*others, idef], build=idef)
            space.redefine(space.defn, [*others, idef])
            self.ownership.mark(space)
            return idef, True

    async def drop_index(self, space: Space, iid: int) -> None:
        async with self._ddl_lock:
            self._check_alive(space)
            index = space.index(iid)
            if iid == 0 and len(space.indexes) > 1:
                raise BoxError(ER.DROP_PRIMARY_KEY, space.name)
            remaining = [i.defn for i in space.indexes.values() if i.iid != iid]

            def drop(txn: lmdb.Transaction) -> None:
                txn.drop(index.db, delete=True)

            await self._persist(space, remaining, extra=drop)
            self.storage.forget_db(index.defn.db_name.encode())
            space.redefine(space.defn, remaining)
            self.ownership.mark(space)

    async def drop_space(self, space: Space) -> None:
        async with self._ddl_lock:
            self._check_alive(space)
            dbs = [(i.db, i.defn.db_name) for i in space.indexes.values()]

            def write(txn: lmdb.Transaction) -> None:
                for db, _name in dbs:
                    txn.drop(db, delete=True)
                txn.delete(_space_key(space.id), db=self._db)
                txn.put(_META_SCHEMA_VERSION, msgpack.packb(self.schema_version + 1), db=self._db)

            await self.committer.write(write, exclusive=True)
            for _db, name in dbs:
                self.storage.forget_db(name.encode())
            space.dropped = True
            self._unregister(space)
            self.schema_version += 1

    async def alter_space(self, space: Space, *, name: str | None = None, format: tuple[FieldDef, ...] | None = None) -> None:
        async with self._ddl_lock:
            self._check_alive(space)
            sdef = space.defn
            if name is not None and name != sdef.name:
                if name in self.by_name or name in self.views.by_name:
                    raise BoxError(ER.SPACE_EXISTS, name)
                sdef = SpaceDef(sdef.id, name, sdef.engine, sdef.owner, sdef.field_count, sdef.format, sdef.flags)
            if format is not None:
                sdef = sdef.with_format(tuple(format))
                self._check_existing_tuples(space, sdef)
            idefs = [i.defn for i in space.indexes.values()]
            old_name = space.name
            await self._persist(space, idefs, sdef=sdef)
            if self.by_name.get(old_name) is space:
                del self.by_name[old_name]
            space.redefine(sdef, idefs)
            self._register(space)

    def _check_alive(self, space: Space) -> None:
        if space.dropped or self.spaces.get(space.id) is not space:
            raise BoxError(ER.NO_SUCH_SPACE, space.name)

    def _check_existing_tuples(self, space: Space, sdef: SpaceDef) -> None:
        checker = Space(sdef, [i.defn for i in space.indexes.values()], self.storage)
        if space.primary is None:
            return
        for raw in space.pairs(0, 2, []):
            checker.check_tuple(decode_tuple(raw))

    async def _persist(
        self,
        space: Space,
        idefs: list[IndexDef],
        *,
        sdef: SpaceDef | None = None,
        max_id: int | None = None,
        build: IndexDef | None = None,
        extra: Any = None,
    ) -> None:
        sdef = sdef or space.defn
        record = msgpack.packb(
            {"row": sdef.to_row(), "indexes": [[i.to_row(), i.db_name] for i in sorted(idefs, key=lambda d: d.iid)]},
            use_bin_type=True,
        )
        version = self.schema_version + 1
        storage = self.storage

        def write(txn: lmdb.Transaction) -> None:
            if build is not None:
                db = storage.db(build.db_name.encode(), txn=txn)
                if build.iid != 0:
                    # An index the space keeps in memory is checked here, and built at its first
                    # read (spaces/index_views.py).
                    _build_index(txn, space, build, db, store=not (space.memory_indexes and not build.unique))
            if extra is not None:
                extra(txn)
            txn.put(_space_key(sdef.id), record, db=self._db)
            txn.put(_META_SCHEMA_VERSION, msgpack.packb(version), db=self._db)
            txn.put(_META_DB_SEQ, msgpack.packb(self._db_seq), db=self._db)
            if max_id is not None:
                txn.put(_META_MAX_ID, msgpack.packb(max_id), db=self._db)

        try:
            await self.committer.write(write, exclusive=True)
        except BaseException:
            if build is not None:
                storage.forget_db(build.db_name.encode())
            raise
        self.schema_version = version


def _build_index(txn: lmdb.Transaction, space: Space, idef: IndexDef, db: Any, store: bool = True) -> None:
    """Fill a new secondary index from the primary one, rejecting duplicates and bad types
    (``store`` false: only check the types, for an index kept in memory)."""
    index = Index(idef, space)
    index.db = db
    primary = space.primary
    if primary is None:
        return
    with txn.cursor(db=primary.db) as cur:
        for pk_stored, raw in cur:
            fields = decode_tuple(raw)
            for part in idef.parts:
                value = fields[part.field] if part.field < len(fields) else None
                if value is None and part.is_nullable:
                    continue
                if not fieldtypes.ACCEPTS[part.type](value):
                    if value is None:
                        raise BoxError(ER.FIELD_MISSING, part.field + 1)
                    raise BoxError(ER.FIELD_TYPE, part.field + 1, part.type)
            if not store:
                continue
            pk = keys.encode(primary.key_of(fields))
            full, unique_form = index.entry_key(fields, pk)
            stored = keys.stored_form(full)
            if unique_form and txn.get(stored, db=db) is not None:
                raise BoxError(ER.TUPLE_FOUND, idef.name, space.name)
            txn.put(stored, pk_stored, db=db)
