"""What Lua's ``box`` table asks Python to do, run on the event loop by the job driver.

Each operation gets the job (who is calling, and the console it came from, if any) and the Lua
arguments already converted to Python; it returns the list of Lua return values, synchronously
or as a coroutine (a write waiting for its commit, a queue take waiting for a task). They bind
to the same objects as the iproto handlers: space methods go through the procedure registry's
``box.space.<id>.index.<iid>:<method>`` entries (the same code CALL runs, with its access and
read-only checks), DDL through the catalogue, so it is persisted and bumps the schema version.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from boxqueue.errcodes import ER, BoxError
from boxqueue.lua_box.persisted_functions import PersistedFunctions
from boxqueue.lua_box.persisted_users import PersistedUsers
from boxqueue.spaces import access as acl
from boxqueue.spaces import fieldtypes
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.definitions import parse_format
from boxqueue.spaces.procedures import CallContext, Procedures
from boxqueue.spaces.space import Space


@dataclass
class Job:
    """One running chunk or function: its caller and, from the console, the console's hooks."""

    ctx: CallContext
    set_delimiter: Callable[[str], None] | None = None


_MAX_SPACE_ENTRIES = 4096

# Space methods called from Lua, counted in box.stat() like the requests they stand for.
_COUNTED_AS = {
    "select": "SELECT", "get": "SELECT", "insert": "INSERT", "replace": "REPLACE",
    "update": "UPDATE", "upsert": "UPSERT", "delete": "DELETE",
}


def _opts(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, list) and not value:
        return {}
    if not isinstance(value, dict):
        raise BoxError(ER.ILLEGAL_PARAMS, "options should be a table")
    return value


def _lua_parts(raw: Any) -> list[Any]:
    """Index parts as Lua writes them (1-based field numbers, flat or nested) in the 0-based
    forms :func:`spaces.definitions.parse_part` reads."""
    if raw is None:
        return [[0, "unsigned"]]
    if not isinstance(raw, list):
        raw = [raw]
    if raw and all(isinstance(p, list | dict) for p in raw):
        out: list[Any] = []
        for part in raw:
            if isinstance(part, list):
                fieldno = part[0] - 1 if part and type(part[0]) is int else (part[0] if part else None)
                out.append([fieldno, *part[1:]])
            else:
                part = dict(part)
                key = "field" if "field" in part else "fieldno"
                if type(part.get(key)) is int:
                    part[key] -= 1
                out.append(part)
        return out
    # flat: {1, 'unsigned', 2, 'string'}, {1}, {'id'}, {'id', 'string'}
    out = []
    i = 0
    while i < len(raw):
        item = raw[i]
        fieldno = item - 1 if type(item) is int else item
        if i + 1 < len(raw) and isinstance(raw[i + 1], str) and fieldtypes.normalize(raw[i + 1]):
            out.append([fieldno, raw[i + 1]])
            i += 2
        else:
            out.append(fieldno)
            i += 1
    return out


def space_info(space: Any) -> dict[str, Any]:
    defn = space.defn
    indexes = []
    for iid in sorted(space.indexes):
        idef = space.indexes[iid].defn
        indexes.append(
            {
                "id": idef.iid,
                "name": idef.name,
                "type": idef.type,
                "unique": idef.unique,
                "parts": [
                    {"fieldno": p.field + 1, "type": p.type, "is_nullable": p.is_nullable}
                    for p in idef.parts
                ],
            }
        )
    return {
        "id": space.id,
        "name": space.name,
        "engine": defn.engine,
        "field_count": defn.field_count,
        "temporary": bool(defn.flags.get("temporary", False)) if isinstance(defn.flags, dict) else False,
        "indexes": indexes,
    }


class Operations:
    """The operations by name; :meth:`get` is what the driver looks up."""

    def __init__(self, catalog: Catalog, procedures: Procedures, stats: Any = None,
                 functions: PersistedFunctions | None = None, users: PersistedUsers | None = None) -> None:
        self.catalog = catalog
        self.functions = functions
        self.users = users
        self.procedures = procedures
        self.stats = stats  # request counters (boxqueue.iproto.request_stats), shown by box.stat()
        # Space methods by (space id, index id, method): the entries look the space up at each
        # call, so they stay valid across DDL; the names come from Lua, so the dict is bounded.
        self._space_entries: dict[tuple[Any, Any, Any], Any] = {}
        self._table: dict[str, Callable[..., Any]] = {
            "call": self.call,
            "space": self.space,
            "space_info": self.space_info,
            "space_format": self.space_format,
            "create_space": self.create_space,
            "create_index": self.create_index,
            "drop_index": self.drop_index,
            "drop_space": self.drop_space,
            "alter_space": self.alter_space,
            "user_create": self.user_create,
            "user_grant": self.user_grant,
            "user_exists": self.user_exists,
            "console_delimiter": self.console_delimiter,
            "stat": self.stat,
            "func_create": self.func_create,
            "func_drop": self.func_drop,
            "func_exists": self.func_exists,
        }

    def by_name(self) -> dict[str, Callable[..., Any]]:
        return dict(self._table)

    def get(self, name: str) -> Callable[..., Any]:
        op = self._table.get(name)
        if op is None:
            raise BoxError(ER.PROC_LUA, message=f"unknown box operation '{name}'")
        return op

    # -- procedures and spaces ---------------------------------------------------------------

    def call(self, job: Job, name: Any = None, *args: Any) -> Any:
        """A procedure of the registry (box.queue.*, box.info, box.session.*) by name, with the
        access check CALL makes: the queue functions bypass the spaces' own checks."""
        entry = self.procedures.resolve(name) if isinstance(name, str) else None
        if entry is None:
            raise BoxError(ER.NO_SUCH_PROC, name)
        self.catalog.access.check(job.ctx.user, acl.EXECUTE, acl.FUNCTION, name)
        if entry.writes:
            self.catalog.writes.check_writable(job.ctx.read_only)
        return entry.invoke(job.ctx, args)

    def space(self, job: Job, space_id: Any, iid: Any, method: Any, *args: Any) -> Any:
        """``box.space[id].index[iid]:method(...)`` through the registry's space methods."""
        key = (space_id, iid, method) if type(space_id) is int and type(iid) is int and type(method) is str else None
        entry = self._space_entries.get(key) if key is not None else None
        if entry is None:
            entry = self.procedures.resolve(f"box.space.{space_id}.index.{iid}:{method}")
            if entry is None:
                raise BoxError(ER.NO_SUCH_PROC, f"space method '{method}'")
            if key is not None:
                if len(self._space_entries) >= _MAX_SPACE_ENTRIES:
                    self._space_entries.clear()
                self._space_entries[key] = entry
        counted = _COUNTED_AS.get(method)
        if counted is not None and self.stats is not None:
            self.stats.count_name(counted)
        return entry.invoke(job.ctx, args)

    def stat(self, job: Job) -> list[Any]:
        if self.stats is None:
            return [{}]
        return [self.stats.snapshot()]

    def space_info(self, job: Job, ref: Any) -> list[Any]:
        if not isinstance(ref, int | str) or isinstance(ref, bool):
            return [None]
        try:
            found = self.catalog.lookup(ref)
        except BoxError:
            return [None]
        return [space_info(found)]

    def space_format(self, job: Job, space_id: int) -> list[Any]:
        space = self.catalog.space(space_id)
        return [[f.to_map() for f in space.defn.format]]

    # -- DDL ---------------------------------------------------------------------------------

    def _ddl(self, job: Job) -> None:
        self.catalog.writes.check_schema_write(job.ctx.user, job.ctx.read_only)

    async def create_space(self, job: Job, name: Any = None, opts: Any = None) -> list[Any]:
        self._ddl(job)
        o = _opts(opts)
        if not isinstance(name, str):
            raise BoxError(ER.ILLEGAL_PARAMS, "name should be a string")
        space, _created = await self.catalog.create_space(
            name,
            space_id=o.get("id"),
            format=parse_format(o.get("format")),
            engine=o.get("engine", "memtx"),
            field_count=int(o.get("field_count", 0) or 0),
            temporary=bool(o.get("temporary", False)),
            if_not_exists=bool(o.get("if_not_exists", False)),
        )
        return [space_info(space)]

    def _space(self, job: Job, space_id: Any) -> Space:
        """The space a DDL statement changes, once the statement may change it (not a space
        whose definition the engine keeps)."""
        self._ddl(job)
        space = self.catalog.space(space_id)
        self.catalog.writes.check_schema_owner(job.ctx.user, space)
        return space

    async def create_index(self, job: Job, space_id: Any, name: Any = None, opts: Any = None) -> list[Any]:
        space = self._space(job, space_id)
        o = _opts(opts)
        idef, _created = await self.catalog.create_index(
            space,
            name,
            index_type=o.get("type", "TREE"),
            unique=o.get("unique"),
            parts=_lua_parts(o.get("parts")),
            iid=o.get("id"),
            if_not_exists=bool(o.get("if_not_exists", False)),
        )
        info = space_info(space)
        return [next(i for i in info["indexes"] if i["id"] == idef.iid)]

    async def drop_index(self, job: Job, space_id: Any, iid: Any) -> list[Any]:
        await self.catalog.drop_index(self._space(job, space_id), iid)
        return []

    async def drop_space(self, job: Job, space_id: Any) -> list[Any]:
        await self.catalog.drop_space(self._space(job, space_id))
        return []

    async def alter_space(self, job: Job, space_id: Any, changes: Any = None) -> list[Any]:
        space = self._space(job, space_id)
        c = _opts(changes)
        fmt = parse_format(c["format"]) if "format" in c else None
        await self.catalog.alter_space(space, name=c.get("name"), format=fmt)
        return []

    # -- users -------------------------------------------------------------------------------

    async def user_create(self, job: Job, name: Any = None, opts: Any = None) -> list[Any]:
        """A user, kept in LMDB (``boxqueue/lua_box/persisted_users.py``) when the server has storage."""
        self._ddl(job)
        o = _opts(opts)
        if not isinstance(name, str) or not name:
            raise BoxError(ER.ILLEGAL_PARAMS, "name should be a string")
        if name in self.catalog.access.users:
            if o.get("if_not_exists"):
                return []
            raise BoxError(ER.USER_EXISTS, name)
        password = o.get("password")
        password = password if isinstance(password, str) else None
        if self.users is None:
            self.catalog.access.add_user(name, password)
        else:
            await self.users.create(self.catalog.access, name, password)
        return []

    async def user_grant(self, job: Job, name: Any = None, privileges: Any = None, object_type: Any = None,
                   object_name: Any = None, opts: Any = None) -> list[Any]:
        self._ddl(job)
        await self.grant(name, privileges, object_type, object_name)
        return []

    async def grant(self, name: Any, privileges: Any, object_type: Any, object_name: Any) -> None:
        """box.schema.user.grant's work, kept with the user's record (tarantool/queue's
        tube:grant gives its privileges through it too)."""
        user = self.catalog.access.users.get(name) if isinstance(name, str) else None
        if user is None:
            raise BoxError(ER.NO_SUCH_USER, name)
        if not isinstance(privileges, str):
            raise BoxError(ER.ILLEGAL_PARAMS, "privileges should be a string")
        bits = 0
        for privilege in privileges.replace(" ", "").split(","):
            if privilege not in acl.PRIVILEGE_BITS:
                raise BoxError(ER.ILLEGAL_PARAMS, f"unknown privilege '{privilege}'")
            bits |= acl.PRIVILEGE_BITS[privilege]
        otype = object_type if isinstance(object_type, str) else acl.UNIVERSE
        if otype not in (acl.UNIVERSE, acl.SPACE, acl.FUNCTION):
            raise BoxError(ER.ILLEGAL_PARAMS, f"unknown object type '{otype}'")
        oname = object_name if isinstance(object_name, str) else ""
        if self.users is None:
            user.grant(bits, otype, oname)
        else:
            await self.users.grant(user, bits, otype, oname)

    def user_exists(self, job: Job, name: Any = None) -> list[Any]:
        return [isinstance(name, str) and name in self.catalog.access.users]

    # -- persisted functions -----------------------------------------------------------------

    def _functions(self) -> PersistedFunctions:
        if self.functions is None:
            raise BoxError(ER.UNSUPPORTED, "boxqueue", "box.schema.func without storage")
        return self.functions

    async def func_create(self, job: Job, name: Any = None, body: Any = None, if_not_exists: Any = None) -> list[Any]:
        self._ddl(job)
        if not isinstance(name, str) or not name:
            raise BoxError(ER.ILLEGAL_PARAMS, "name should be a string")
        return [await self._functions().create(name, body if isinstance(body, str) else None, bool(if_not_exists))]

    async def func_drop(self, job: Job, name: Any = None, if_exists: Any = None) -> list[Any]:
        self._ddl(job)
        functions = self._functions()
        had_body = isinstance(name, str) and functions.bodies.get(name) is not None
        return [await functions.drop(name, bool(if_exists)), had_body]

    def func_exists(self, job: Job, name: Any = None) -> list[Any]:
        return [isinstance(name, str) and self._functions().exists(name)]

    # -- console -----------------------------------------------------------------------------

    def console_delimiter(self, job: Job, delimiter: Any = None) -> list[Any]:
        if job.set_delimiter is None:
            raise BoxError(ER.PROC_LUA, message="console.delimiter(): need existing console")
        if not isinstance(delimiter, str):
            raise BoxError(ER.PROC_LUA, message="invalid delimiter")
        job.set_delimiter(delimiter)
        return []
