"""The system spaces connectors read: ``_space``/``_vspace``, ``_index``/``_vindex``, ``_user``,
``_func``, ``_priv`` and friends, built from the catalogue on each read.

The ``_v*`` views show each user only the objects it has some right on (plus the views
themselves); the underlying ``_space``-style spaces need read access on them. Both are served by
the same iterator code as data spaces, so connectors' name lookups (index 2 of ``_vspace`` and
``_vindex``) behave as on Tarantool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from boxqueue.spaces import access as acl
from boxqueue.spaces import iterators as it
from boxqueue.spaces.definitions import FieldDef, IndexDef, PartDef, SpaceDef
from boxqueue.spaces.msgpack_values import pack
from boxqueue.spaces.space import Index, IndexLookup
from boxqueue.storage import keys

if TYPE_CHECKING:
    from boxqueue.spaces.catalog import Catalog

U, S, A, M, ARR, SC = "unsigned", "string", "any", "map", "array", "scalar"


def _fmt(*fields: tuple[str, str]) -> tuple[FieldDef, ...]:
    return tuple(FieldDef(n, t) for n, t in fields)


def _idx(space_id: int, iid: int, name: str, unique: bool, *parts: tuple[int, str]) -> IndexDef:
    return IndexDef(space_id, iid, name, "TREE", unique, tuple(PartDef(f, t) for f, t in parts))


_SPACE_FMT = _fmt(("id", U), ("owner", U), ("name", S), ("engine", S), ("field_count", U), ("flags", M), ("format", ARR))
_INDEX_FMT = _fmt(("id", U), ("iid", U), ("name", S), ("type", S), ("opts", M), ("parts", ARR))
_USER_FMT = _fmt(("id", U), ("owner", U), ("name", S), ("type", S), ("auth", M))
_FUNC_FMT = _fmt(("id", U), ("owner", U), ("name", S), ("setuid", U), ("language", S))
_PRIV_FMT = _fmt(("grantor", U), ("grantee", U), ("object_type", S), ("object_id", SC), ("privilege", U))


def _space_indexes(sid: int) -> list[IndexDef]:
    return [_idx(sid, 0, "primary", True, (0, U)), _idx(sid, 1, "owner", False, (1, U)), _idx(sid, 2, "name", True, (2, S))]


def _index_indexes(sid: int) -> list[IndexDef]:
    return [_idx(sid, 0, "primary", True, (0, U), (1, U)), _idx(sid, 2, "name", True, (0, U), (2, S))]


def _priv_indexes(sid: int) -> list[IndexDef]:
    return [
        _idx(sid, 0, "primary", True, (1, U), (2, S), (3, SC)),
        _idx(sid, 1, "owner", False, (0, U)),
        _idx(sid, 2, "object", False, (2, S), (3, SC)),
    ]


# id, name, engine, format, index factory, rows kind, is a filtered view
_VIEWS: list[tuple[int, str, str, tuple[FieldDef, ...], Callable[[int], list[IndexDef]], str, bool]] = [
    (272, "_schema", "memtx", _fmt(("key", S), ("value", A)), lambda s: [_idx(s, 0, "primary", True, (0, S))], "schema", False),
    (276, "_collation", "memtx", _fmt(("id", U), ("name", S), ("owner", U), ("type", S), ("locale", S), ("opts", M)),
     lambda s: [_idx(s, 0, "primary", True, (0, U)), _idx(s, 1, "name", True, (1, S))], "empty", False),
    (277, "_vcollation", "sysview", _fmt(("id", U), ("name", S), ("owner", U), ("type", S), ("locale", S), ("opts", M)),
     lambda s: [_idx(s, 0, "primary", True, (0, U)), _idx(s, 1, "name", True, (1, S))], "empty", True),
    (280, "_space", "memtx", _SPACE_FMT, _space_indexes, "space", False),
    (281, "_vspace", "sysview", _SPACE_FMT, _space_indexes, "space", True),
    (288, "_index", "memtx", _INDEX_FMT, _index_indexes, "index", False),
    (289, "_vindex", "sysview", _INDEX_FMT, _index_indexes, "index", True),
    (296, "_func", "memtx", _FUNC_FMT, _space_indexes, "func", False),
    (297, "_vfunc", "sysview", _FUNC_FMT, _space_indexes, "func", True),
    (304, "_user", "memtx", _USER_FMT, _space_indexes, "user", False),
    (305, "_vuser", "sysview", _USER_FMT, _space_indexes, "user", True),
    (312, "_priv", "memtx", _PRIV_FMT, _priv_indexes, "priv", False),
    (313, "_vpriv", "sysview", _PRIV_FMT, _priv_indexes, "priv", True),
    (320, "_cluster", "memtx", _fmt(("id", U), ("uuid", S)),
     lambda s: [_idx(s, 0, "primary", True, (0, U)), _idx(s, 1, "uuid", True, (1, S))], "cluster", False),
    (330, "_truncate", "memtx", _fmt(("id", U), ("count", U)), lambda s: [_idx(s, 0, "primary", True, (0, U))], "empty", False),
]


class SystemView(IndexLookup):
    """One system space: read-only, rows computed from the catalogue."""

    def __init__(self, views: SystemViews, sid: int, name: str, engine: str, fmt: tuple[FieldDef, ...],
                 index_defs: list[IndexDef], kind: str, filtered: bool) -> None:
        self.views = views
        self.id = sid
        self.name = name
        self.defn = SpaceDef(sid, name, engine, 1, 0, fmt, {})
        self.kind = kind
        self.filtered = filtered
        self.index_defs = index_defs
        self.indexes = {d.iid: Index(d, self) for d in index_defs}  # type: ignore[arg-type]
        self.index_by_name = {i.name: i for i in self.indexes.values()}
        self.field_names = {f.name: i for i, f in enumerate(fmt)}
        self.primary = self.indexes[0]

    def select(self, iid: int, iterator: int, key: list[Any], offset: int = 0, limit: int = 0xFFFFFFFF,
               user: acl.User | None = None) -> list[bytes]:
        index = self.index(iid)
        index.check_iterator(iterator, key)
        index.check_key(key, exact=False)
        if limit <= 0:
            return []
        rows = self.views.rows(self.kind, user if self.filtered else None)
        items = []
        for row in rows:
            pk = keys.encode(self.primary.key_of(row))
            items.append((index.entry_key(row, pk)[0], pack(row)))
        scan = it.scan(it.ListCursor.of(items), iterator, keys.encode(key), lambda k, _v: k)
        return it.page((raw for _k, raw in scan), offset, limit)

    def len(self, user: acl.User | None = None) -> int:
        return len(self.views.rows(self.kind, user if self.filtered else None))


class SystemViews:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.by_id: dict[int, SystemView] = {}
        self.by_name: dict[str, SystemView] = {}
        for sid, name, engine, fmt, make_indexes, kind, filtered in _VIEWS:
            view = SystemView(self, sid, name, engine, fmt, make_indexes(sid), kind, filtered)
            self.by_id[sid] = view
            self.by_name[name] = view

    def rows(self, kind: str, user: acl.User | None) -> list[list[Any]]:
        return getattr(self, f"_{kind}_rows")(user)

    def _visible(self, user: acl.User | None, object_type: str, name: str) -> bool:
        return user is None or user.privileges_on(object_type, name) != 0

    def _empty_rows(self, user: acl.User | None) -> list[list[Any]]:
        return []

    def _schema_rows(self, user: acl.User | None) -> list[list[Any]]:
        c = self.catalog
        return [["cluster", c.instance_uuid], ["max_id", c.max_id], ["version", 2, 6, 0]]

    def _cluster_rows(self, user: acl.User | None) -> list[list[Any]]:
        return [[1, self.catalog.instance_uuid]]

    def _space_rows(self, user: acl.User | None) -> list[list[Any]]:
        rows = []
        for view in self.by_id.values():
            if user is None or view.filtered or user.privileges_on(acl.SPACE, view.name):
                rows.append(view.defn.to_row())
        for space in self.catalog.spaces.values():
            if self._visible(user, acl.SPACE, space.name):
                rows.append(space.defn.to_row())
        return rows

    def _index_rows(self, user: acl.User | None) -> list[list[Any]]:
        rows = []
        for view in self.by_id.values():
            if user is None or view.filtered or user.privileges_on(acl.SPACE, view.name):
                rows.extend(d.to_row() for d in view.index_defs)
        for space in self.catalog.spaces.values():
            if self._visible(user, acl.SPACE, space.name):
                rows.extend(i.defn.to_row() for i in space.indexes.values())
        return rows

    def _func_rows(self, user: acl.User | None) -> list[list[Any]]:
        return [
            [fid, 1, name, 0, "LUA"]
            for name, fid in self.catalog.functions.items()
            if self._visible(user, acl.FUNCTION, name)
        ]

    def _user_rows(self, user: acl.User | None) -> list[list[Any]]:
        users = self.catalog.access.by_id.values()
        if user is None or user.privileges_on(acl.UNIVERSE, "") & acl.READ:
            return [u.row() for u in users]
        return [u.row() for u in users if u.id in (user.id, acl.PUBLIC_ID)]

    def _priv_rows(self, user: acl.User | None) -> list[list[Any]]:
        rows = []
        for u in self.catalog.access.by_id.values():
            if user is not None and u.id != user.id and not user.privileges_on(acl.UNIVERSE, "") & acl.READ:
                continue
            for (object_type, object_name), bits in u.grants.items():
                rows.append([acl.ADMIN_ID, u.id, object_type, self._object_id(object_type, object_name), bits])
        return rows

    def _object_id(self, object_type: str, name: str) -> Any:
        if object_type == acl.UNIVERSE:
            return 0
        if object_type == acl.SPACE:
            space = self.catalog.by_name.get(name)
            return space.id if space is not None else name
        return self.catalog.functions.get(name, name)
