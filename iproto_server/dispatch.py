"""Request dispatch: one handler per request type.

:meth:`Dispatcher.handle` returns the response bytes at once for requests that never wait
(PING, SELECT, AUTH, errors...) and a coroutine for those that do (writes wait for their commit,
calls may block). The connection answers the first kind inline and runs the second as a task, so
a slow request never holds up a fast one behind it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from types import CoroutineType
from typing import Any

from errcodes import ER, BoxError
from iproto_server import codec
from iproto_server.request_stats import RequestStats
from iproto_server.session import Session
from spaces import access as acl
from spaces.catalog import Catalog
from spaces.later import Later
from spaces.msgpack_values import Raw
from spaces.procedures import Procedures
from spaces.space import INSERT, REPLACE, Space, StorageError
from spaces.sysviews import SystemView
from spaces.update import parse_ops

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 3
FEATURES: list[int] = []

# The values at once (a chunk that finished on the event loop), or an awaitable producing them.
EvalHandler = Callable[[Session, str, list[Any]], "list[Any] | Awaitable[list[Any]]"]
Reply = Callable[[bytes], None]


_NO_KEY: list[Any] = []


class _PendingWrite:
    """A write handed to the group committer; answered from its completion callback."""

    __slots__ = ("write", "returns_tuple")

    def __init__(self, write: Any, returns_tuple: bool = True) -> None:
        self.write = write
        self.returns_tuple = returns_tuple


def _field(body: dict[int, Any], key: int, name: str, required: bool = False, default: Any = 0) -> Any:
    value = body.get(key)
    if value is None:
        if required:
            raise BoxError(ER.MISSING_REQUEST_FIELD, name)
        return default
    return value


def _uint(body: dict[int, Any], key: int, name: str, required: bool = False, default: int = 0) -> int:
    value = _field(body, key, name, required, default)
    if type(value) is not int or value < 0:
        raise BoxError(ER.INVALID_MSGPACK, "packet body")
    return value


def _array(body: dict[int, Any], key: int, name: str, required: bool = False) -> list[Any]:
    value = _field(body, key, name, required, None)
    if value is None:
        return []
    if type(value) is not list:
        raise BoxError(ER.INVALID_MSGPACK, "packet body")
    return value


def _is_array(value: Any) -> bool:
    return isinstance(value, list | tuple | Raw)


def wrap_call16(values: list[Any]) -> list[Any]:
    """CALL_16 turns return values into tuples (iproto notes, section 3.6)."""
    if len(values) == 1:
        only = values[0]
        if isinstance(only, list | tuple) and only and _is_array(only[0]):
            return [v if _is_array(v) else [v] for v in only]
        return [only if _is_array(only) else [only]]
    return [v if _is_array(v) else [v] for v in values]


def _procedure_error(exc: Exception) -> Exception:
    """What a procedure raised, as the client sees it: Python errors become ER_PROC_LUA with their
    text, the way a Lua error reaches a Tarantool client."""
    if isinstance(exc, BoxError | StorageError):
        return exc
    return BoxError(ER.PROC_LUA, message=str(exc) or type(exc).__name__)


class Dispatcher:
    """Turns requests into responses, checking schema version, access and read-only ports."""

    def __init__(
        self,
        catalog: Catalog,
        procedures: Procedures,
        eval_handler: EvalHandler | None = None,
        stats: RequestStats | None = None,
    ) -> None:
        self.catalog = catalog
        self.stats = stats if stats is not None else RequestStats()
        self._by_type = self.stats.by_type
        self.access = catalog.access
        self.procedures = procedures
        self.eval_handler = eval_handler
        self._handlers: dict[int, Callable[[Session, codec.Request], Any]] = {
            codec.PING: self._ping,
            codec.SELECT: self._select,
            codec.INSERT: self._insert,
            codec.REPLACE: self._replace,
            codec.UPDATE: self._update,
            codec.DELETE: self._delete,
            codec.UPSERT: self._upsert,
            codec.CALL: self._call,
            codec.CALL_16: self._call16,
            codec.EVAL: self._eval,
            codec.AUTH: self._auth,
            codec.ID: self._id,
        }

    # -- entry point ---------------------------------------------------------------------------

    def handle(
        self, session: Session, request: codec.Request, reply: Reply
    ) -> bytes | Coroutine[Any, Any, bytes] | None:
        """The response bytes at once; ``None`` when ``reply`` will be called with them later (a
        write waiting for its commit); or a coroutine producing them (a call that may block)."""
        sync = request.sync
        try:
            request_type = request.type
            if 0 <= request_type < 256:
                self._by_type[request_type] += 1
            version = self.catalog.schema_version
            if request.schema_version and request.schema_version != version:
                raise BoxError(ER.WRONG_SCHEMA_VERSION, version, request.schema_version)
            handler = self._handlers.get(request.type)
            if handler is None:
                raise BoxError(ER.UNKNOWN_REQUEST_TYPE, request.type)
            result = handler(session, request)
            kind = type(result)
            if kind is bytes:
                return codec.response(sync, self.catalog.schema_version, result)
            if kind is _PendingWrite:
                self._submit(sync, result, reply)
                return None
            if kind is Later:
                self._reply_later(sync, result, reply)
                return None
            return self._finish(sync, result)
        except Exception as exc:
            self.stats.errors += 1
            return codec.error_response(sync, self.catalog.schema_version, self._as_box_error(exc))

    def _submit(self, sync: int, pending: _PendingWrite, reply: Reply) -> None:
        returns_tuple = pending.returns_tuple

        def done(result: Any, error: BaseException | None) -> None:
            version = self.catalog.schema_version
            if error is not None:
                self.stats.errors += 1
                reply(codec.error_response(sync, version, self._as_box_error(error)))
            elif result is None or not returns_tuple:
                reply(codec.response(sync, version, codec.EMPTY_TUPLES_BODY))
            else:
                reply(codec.response(sync, version, codec.data_body_from_tuples([result])))

        self.catalog.committer.submit(pending.write, done)

    def _reply_later(self, sync: int, later: Later[bytes], reply: Reply) -> None:
        def settled(body: bytes | None, error: BaseException | None) -> None:
            version = self.catalog.schema_version
            if error is None:
                reply(codec.response(sync, version, body))
            else:
                if not isinstance(error, Exception):
                    error = RuntimeError(repr(error))
                reply(codec.error_response(sync, version, self._as_box_error(_procedure_error(error))))

        later.then(settled)

    def error(self, sync: int, error: BoxError) -> bytes:
        return codec.error_response(sync, self.catalog.schema_version, error)

    async def _finish(self, sync: int, pending: Awaitable[bytes]) -> bytes:
        try:
            body = await pending
        except Exception as exc:
            self.stats.errors += 1
            return codec.error_response(sync, self.catalog.schema_version, self._as_box_error(exc))
        return codec.response(sync, self.catalog.schema_version, body)

    @staticmethod
    def _as_box_error(exc: Exception) -> BoxError:
        if isinstance(exc, BoxError):
            return exc
        if isinstance(exc, StorageError):
            log.error("storage failure: %s", exc)
            return BoxError(ER.WAL_IO)
        log.exception("internal error while handling a request")
        return BoxError(ER.SYSTEM, f"internal error: {type(exc).__name__}")

    # -- lookups -------------------------------------------------------------------------------

    def _space_of(self, body: dict[int, Any]) -> Space | SystemView:
        sid = body.get(codec.SPACE_ID)
        if sid is None:
            name = body.get(codec.SPACE_NAME)
            if name is None:
                raise BoxError(ER.MISSING_REQUEST_FIELD, "space id")
            if type(name) is not str:
                raise BoxError(ER.INVALID_MSGPACK, "packet body")
            return self.catalog.lookup(name)
        if type(sid) is not int or sid < 0:
            raise BoxError(ER.INVALID_MSGPACK, "packet body")
        return self.catalog.lookup(sid)

    def _index_id(self, space: Space | SystemView, body: dict[int, Any]) -> int:
        name = body.get(codec.INDEX_NAME)
        if name is not None and codec.INDEX_ID not in body:
            if type(name) is not str:
                raise BoxError(ER.INVALID_MSGPACK, "packet body")
            return space.index_named(name).iid
        return _uint(body, codec.INDEX_ID, "index id")

    def _writable(self, session: Session, body: dict[int, Any]) -> Space:
        space = self._space_of(body)
        if isinstance(space, SystemView):
            if space.defn.engine == "sysview":
                raise BoxError(ER.VIEW_IS_RO, space.name)
            raise BoxError(ER.UNSUPPORTED, "boxqueue", "writes to system spaces through iproto")
        if session.read_only:
            raise BoxError(ER.READONLY)
        self.access.check(session.user, acl.WRITE, acl.SPACE, space.name)
        return space

    # -- handlers --------------------------------------------------------------------------

    def _ping(self, session: Session, request: codec.Request) -> bytes:
        return codec.EMPTY_BODY

    def _id(self, session: Session, request: codec.Request) -> bytes:
        return codec.id_body(PROTOCOL_VERSION, FEATURES)

    def _auth(self, session: Session, request: codec.Request) -> bytes:
        body = request.body
        name = _field(body, codec.USER_NAME, "username", required=True)
        if type(name) is not str:
            raise BoxError(ER.INVALID_MSGPACK, "packet body")
        pair = _array(body, codec.TUPLE, "tuple")
        method = pair[0] if pair else None
        scramble = pair[1] if len(pair) > 1 else None
        user = self.access.authenticate(name, session.salt[:20], method, scramble)
        session.set_user(user)
        return codec.EMPTY_BODY

    def _select(self, session: Session, request: codec.Request) -> bytes:
        body = request.body
        # The common case, checked in one go: a data space by id, every field of the right type.
        get = body.get
        space = self.catalog.spaces.get(get(codec.SPACE_ID))
        iid, limit, offset = get(codec.INDEX_ID, 0), get(codec.LIMIT), get(codec.OFFSET, 0)
        iterator, key = get(codec.ITERATOR, 0), get(codec.KEY, _NO_KEY)
        if (
            space is not None
            and type(iid) is int
            and type(limit) is int
            and type(offset) is int
            and type(iterator) is int
            and type(key) is list
            and iid >= 0
            and limit >= 0
            and offset >= 0
            and codec.INDEX_NAME not in body
        ):
            if not session.user.privileges_on(acl.SPACE, space.name) & acl.READ:
                self.access.check(session.user, acl.READ, acl.SPACE, space.name)
            return codec.data_body_from_tuples(space.select(iid, iterator, key, offset, limit))
        return self._select_checked(session, body)

    def _select_checked(self, session: Session, body: dict[int, Any]) -> bytes:
        space = self._space_of(body)
        iid = self._index_id(space, body)
        limit = _uint(body, codec.LIMIT, "limit", required=True)
        offset = _uint(body, codec.OFFSET, "offset")
        iterator = _uint(body, codec.ITERATOR, "iterator")
        key = _array(body, codec.KEY, "key")
        if isinstance(space, SystemView):
            if space.defn.engine != "sysview":
                self.access.check(session.user, acl.READ, acl.SPACE, space.name)
            tuples = space.select(iid, iterator, key, offset, limit, user=session.user)
        else:
            self.access.check(session.user, acl.READ, acl.SPACE, space.name)
            tuples = space.select(iid, iterator, key, offset, limit)
        return codec.data_body_from_tuples(tuples)

    def _put(self, session: Session, request: codec.Request, mode: str) -> _PendingWrite:
        body = request.body
        space = self._writable(session, body)
        fields = _array(body, codec.TUPLE, "tuple", required=True)
        return _PendingWrite(space.prepare_put(request.tuple_raw, fields, mode))

    def _insert(self, session: Session, request: codec.Request) -> _PendingWrite:
        return self._put(session, request, INSERT)

    def _replace(self, session: Session, request: codec.Request) -> _PendingWrite:
        return self._put(session, request, REPLACE)

    def _ops(self, space: Space, body: dict[int, Any], key: int) -> list[Any]:
        index_base = _uint(body, codec.INDEX_BASE, "index base")
        return parse_ops(_array(body, key, "tuple", required=True), index_base, space.field_names)

    def _update(self, session: Session, request: codec.Request) -> _PendingWrite:
        body = request.body
        space = self._writable(session, body)
        iid = self._index_id(space, body)
        key = _array(body, codec.KEY, "key", required=True)
        return _PendingWrite(space.prepare_update(iid, key, self._ops(space, body, codec.TUPLE)))

    def _delete(self, session: Session, request: codec.Request) -> _PendingWrite:
        body = request.body
        space = self._writable(session, body)
        iid = self._index_id(space, body)
        key = _array(body, codec.KEY, "key", required=True)
        return _PendingWrite(space.prepare_delete(iid, key))

    def _upsert(self, session: Session, request: codec.Request) -> _PendingWrite:
        body = request.body
        space = self._writable(session, body)
        fields = _array(body, codec.TUPLE, "tuple", required=True)
        ops = parse_ops(_array(body, codec.OPS, "ops"), _uint(body, codec.INDEX_BASE, "index base"), space.field_names)
        return _PendingWrite(space.prepare_upsert(request.tuple_raw, fields, ops), returns_tuple=False)

    def _procedure_call(
        self, session: Session, request: codec.Request, call16: bool
    ) -> Coroutine[Any, Any, bytes] | Later[bytes] | bytes:
        body = request.body
        name = _field(body, codec.FUNCTION_NAME, "function name", required=True)
        if type(name) is not str:
            raise BoxError(ER.INVALID_MSGPACK, "packet body")
        args = _array(body, codec.TUPLE, "tuple")
        entry = self.procedures.resolve(name)
        if entry is None:
            raise BoxError(ER.NO_SUCH_PROC, name)
        self.access.check(session.user, acl.EXECUTE, acl.FUNCTION, name)
        if entry.writes and session.read_only:
            raise BoxError(ER.READONLY)
        if entry.is_async:
            return self._run_procedure(entry.fn(session.context, *args), entry.name, call16)
        try:
            values = entry.fn(session.context, *args)
        except Exception as exc:
            raise _procedure_error(exc) from exc
        kind = type(values)
        if kind is Later:
            return values.map(lambda done: self._call_body(done, call16))
        if kind is CoroutineType:
            return self._run_procedure(values, entry.name, call16)
        return self._call_body(values, call16)

    @staticmethod
    def _call_body(values: Any, call16: bool) -> bytes:
        values = list(values) if values is not None else []
        if call16:
            values = wrap_call16(values)
        return codec.data_body(values)

    async def _run_procedure(self, running: Awaitable[Any], name: str, call16: bool) -> bytes:
        try:
            values = await running
        except Exception as exc:
            log.debug("procedure %s raised", name, exc_info=True)
            raise _procedure_error(exc) from exc
        return self._call_body(values, call16)

    def _call(self, session: Session, request: codec.Request) -> Coroutine[Any, Any, bytes] | bytes:
        return self._procedure_call(session, request, call16=False)

    def _call16(self, session: Session, request: codec.Request) -> Coroutine[Any, Any, bytes] | bytes:
        return self._procedure_call(session, request, call16=True)

    def _eval(self, session: Session, request: codec.Request) -> Coroutine[Any, Any, bytes] | bytes:
        body = request.body
        expr = _field(body, codec.EXPR, "expression", required=True)
        if type(expr) is not str:
            raise BoxError(ER.INVALID_MSGPACK, "packet body")
        args = _array(body, codec.TUPLE, "tuple")
        self.access.check(session.user, acl.EXECUTE, acl.UNIVERSE, "")
        if self.eval_handler is None:
            raise BoxError(ER.UNSUPPORTED, "boxqueue", "EVAL (no Lua engine is configured)")
        values = self.eval_handler(session, expr, args)
        if type(values) is list:
            return codec.data_body(values)
        return self._run_eval(values)

    @staticmethod
    async def _run_eval(running: Awaitable[list[Any]]) -> bytes:
        return codec.data_body(list(await running))
