"""``box.space.<name>:<method>`` and ``box.space.<name>.index.<index>:<method>`` as procedures.

Tarantool resolves CALL names through Lua globals, so connectors (Node's ``call`` above all) can
call a space's methods directly. This resolver gives the same names to CALL and CALL_16 without a
Lua engine: select, get, insert, replace, update, upsert, delete, len, count, truncate.
"""

from __future__ import annotations

import re
from collections.abc import Coroutine
from typing import Any

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces import access as acl
from boxqueue.spaces import iterators as it
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.msgpack_values import Raw
from boxqueue.spaces.procedures import CallContext, ProcedureEntry, make_entry
from boxqueue.spaces.space import Space
from boxqueue.spaces.sysviews import SystemView
from boxqueue.spaces.update import parse_ops

_NAME = re.compile(r"^box\.space\.([^.:]+)(?:\.index\.([^.:]+))?:(\w+)$")
_WRITES = frozenset({"insert", "replace", "update", "upsert", "delete", "truncate"})
_READS = frozenset({"select", "get", "len", "count"})


def _key(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _iterator(value: Any) -> int:
    if value is None:
        return it.EQ
    if type(value) is int:
        return value
    if isinstance(value, str) and value.upper() in it.BY_NAME:
        return it.BY_NAME[value.upper()]
    raise BoxError(ER.ITERATOR_TYPE, value)


def space_method_resolver(catalog: Catalog):
    """A resolver for :meth:`spaces.procedures.Procedures.add_resolver`."""

    def resolve(name: str) -> ProcedureEntry | None:
        match = _NAME.match(name)
        if match is None or match.group(3) not in _WRITES | _READS:
            return None
        space_ref, index_ref, method = match.groups()

        def call(ctx: CallContext, *args: Any) -> list[Any] | Coroutine[Any, Any, list[Any]]:
            ref: int | str = int(space_ref) if space_ref.isdigit() else space_ref
            space = catalog.lookup(ref)
            if isinstance(space, SystemView):
                if method in _WRITES:
                    raise BoxError(ER.VIEW_IS_RO, space.name)
                if space.defn.engine != "sysview":
                    catalog.access.check(ctx.user, acl.READ, acl.SPACE, space.name)
            elif method in _WRITES:
                catalog.writes.check_space_write(ctx.user, space, ctx.read_only)
            else:
                catalog.access.check(ctx.user, acl.READ, acl.SPACE, space.name)
            iid = 0
            if index_ref is not None:
                iid = int(index_ref) if index_ref.isdigit() else space.index_named(index_ref).iid
            if method in _READS:  # answered at once: a read never waits
                return _read(space, iid, method, list(args), ctx)
            return _write(space, iid, method, list(args))

        return make_entry(name, call, writes=match.group(3) in _WRITES)

    return resolve


def _read(space: Space | SystemView, iid: int, method: str, args: list[Any], ctx: CallContext) -> list[Any]:
    arg = args[0] if args else None
    if method == "select":
        opts = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
        key = _key(arg)
        iterator = _iterator(opts.get("iterator"))
        limit = opts.get("limit", 0xFFFFFFFF)
        offset = opts.get("offset", 0)
        if isinstance(space, SystemView):
            rows = space.select(iid, iterator, key, offset, limit, user=ctx.user)
        else:
            rows = space.select(iid, iterator, key, offset, limit)
        return [[Raw(r) for r in rows]]
    if method == "get":
        if isinstance(space, SystemView):
            rows = space.select(iid, it.EQ, _key(arg), 0, 1, user=ctx.user)
            return [Raw(rows[0])] if rows else [None]
        found = space.get(iid, _key(arg))
        return [Raw(found) if found is not None else None]
    if method == "len":
        return [space.len()]
    if method == "count":
        if isinstance(space, SystemView):
            return [space.len(ctx.user)]
        opts = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
        return [space.count(iid, _iterator(opts.get("iterator", it.EQ if arg else it.ALL)), _key(arg))]
    raise BoxError(ER.NO_SUCH_PROC, method)


async def _write(space: Space | SystemView, iid: int, method: str, args: list[Any]) -> list[Any]:
    arg = args[0] if args else None
    assert isinstance(space, Space)
    if method in ("insert", "replace"):
        if type(arg) is not list:
            raise BoxError(ER.TUPLE_NOT_ARRAY)
        put = space.insert if method == "insert" else space.replace
        return [Raw(await put(None, arg))]
    if method == "delete":
        found = await space.delete(iid, _key(arg))
        return [Raw(found) if found is not None else None]
    if method == "update":
        ops = parse_ops(args[1] if len(args) > 1 else [], 1)  # Lua's field numbers are 1-based
        found = await space.update(iid, _key(arg), ops)
        return [Raw(found) if found is not None else None]
    if method == "upsert":
        if type(arg) is not list:
            raise BoxError(ER.TUPLE_NOT_ARRAY)
        await space.upsert(None, arg, parse_ops(args[1] if len(args) > 1 else [], 1))
        return []
    if method == "truncate":
        await space.truncate()
        return []
    raise BoxError(ER.NO_SUCH_PROC, method)
