# cython: annotation_typing=True
"""Request dispatch: one handler per request type.

:meth:`Dispatcher.handle` writes the response at once into the connection's output buffer for
requests that never wait (PING, SELECT, AUTH, errors...); writes wait for their commit and are
answered into the connection's :class:`Outbox` from its callback (``handle`` returns
:data:`PENDING`); calls that may
block come back as a coroutine, which the connection runs as a task, so a slow request never holds
up a fast one behind it.

Compiled with Cython (``boxqueue/compiled.py``). Requests the codec decoded into typed fields
take short paths here (a select by a known space, a replace, a call); everything else goes
through the general checks on the body dict, which give Tarantool's errors.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import cython

from boxqueue.errcodes import ER, BoxError
from boxqueue.iproto import codec
from boxqueue.iproto.codec import (
    ABSENT,
    BadRequest,
    Request,
    RequestDecoder,
    write_response,
    write_tuples_response,
)
from boxqueue.iproto.codec import EMPTY_BODY as _EMPTY_BODY
from boxqueue.iproto.outbox import Outbox
from boxqueue.iproto.request_stats import RequestStats
from boxqueue.iproto.session import Session
from boxqueue.spaces import access as acl
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.later import Later
from boxqueue.spaces.msgpack_values import Raw
from boxqueue.spaces.procedures import ProcedureEntry, Procedures
from boxqueue.spaces.space import INSERT, REPLACE, Space, StorageError
from boxqueue.spaces.sysviews import SystemView
from boxqueue.spaces.update import parse_ops

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 3
FEATURES: list[int] = []

# The values at once (a chunk that finished on the event loop), or an awaitable producing them.
EvalHandler = Callable[[Session, str, list[Any]], "list[Any] | Awaitable[list[Any]]"]
Reply = Callable[[bytes], None]

PENDING = True  # what handle() returns when the answer will come later (see Outbox.answered)

# The request types and body keys as C constants: a module attribute costs more than the test.
T_SELECT = cython.declare(cython.ulonglong, codec.SELECT)
T_INSERT = cython.declare(cython.ulonglong, codec.INSERT)
T_REPLACE = cython.declare(cython.ulonglong, codec.REPLACE)
T_UPDATE = cython.declare(cython.ulonglong, codec.UPDATE)
T_DELETE = cython.declare(cython.ulonglong, codec.DELETE)
T_CALL_16 = cython.declare(cython.ulonglong, codec.CALL_16)
T_AUTH = cython.declare(cython.ulonglong, codec.AUTH)
T_EVAL = cython.declare(cython.ulonglong, codec.EVAL)
T_UPSERT = cython.declare(cython.ulonglong, codec.UPSERT)
T_CALL = cython.declare(cython.ulonglong, codec.CALL)
T_PING = cython.declare(cython.ulonglong, codec.PING)
T_ID = cython.declare(cython.ulonglong, codec.ID)
T_JOIN = cython.declare(cython.ulonglong, codec.JOIN)
T_SUBSCRIBE = cython.declare(cython.ulonglong, codec.SUBSCRIBE)
K_SPACE_ID = cython.declare(cython.int, codec.SPACE_ID)
K_LIMIT = cython.declare(cython.int, codec.LIMIT)
K_KEY = cython.declare(cython.int, codec.KEY)
K_TUPLE = cython.declare(cython.int, codec.TUPLE)
C_ABSENT = cython.declare(cython.longlong, ABSENT)

_NO_KEY: list[Any] = []
_READ = cython.declare(cython.longlong, acl.READ)
_EXECUTE = cython.declare(cython.longlong, acl.EXECUTE)


@cython.cfunc
def _field(body: dict, key: int, name: str, required: cython.bint = False, default: object = 0) -> object:
    value = body.get(key)
    if value is None:
        if required:
            raise BoxError(ER.MISSING_REQUEST_FIELD, name)
        return default
    return value


@cython.cfunc
def _uint(body: dict, key: int, name: str, required: cython.bint = False, default: object = 0) -> object:
    value = _field(body, key, name, required, default)
    if type(value) is not int or value < 0:
        raise BoxError(ER.INVALID_MSGPACK, "packet body")
    return value


@cython.cfunc
def _array(body: dict, key: int, name: str, required: cython.bint = False) -> list:
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


@cython.cfunc
def _procedure_error(exc: Exception, name: str, stats: Any) -> Exception:
    """What a procedure raised, as the client sees it: Python errors become ER_PROC_LUA with their
    text, the way a Lua error reaches a Tarantool client. They are bugs (a procedure's refusals
    are BoxErrors, a Lua function's errors too): counted and logged, so that one does not pass for
    a user's Lua error."""
    if isinstance(exc, BoxError | StorageError):
        return exc
    stats.count_unexpected(f"procedure {name!r}", exc)
    return BoxError(ER.PROC_LUA, message=str(exc) or type(exc).__name__)


@cython.cfunc
def _as_box_error(exc: BaseException, stats: Any) -> BoxError:
    if isinstance(exc, BoxError):
        return exc
    if isinstance(exc, StorageError):
        log.error("storage failure: %s", exc)
        return BoxError(ER.WAL_IO)
    stats.count_unexpected("a request", exc)
    return BoxError(ER.SYSTEM, f"internal error: {type(exc).__name__}")


_ONE_RAW_BODY = b"\x81\x30\x91"  # {DATA: [ ... ]}, one item


@cython.cfunc
def _call_body(values: Any, call16: cython.bint) -> bytes:
    if not call16 and type(values) is list and len(values) == 1 and type(values[0]) is Raw:
        return _ONE_RAW_BODY + values[0]  # a stored tuple (box.queue's answers): data_body's bytes
    values = list(values) if values is not None else []
    if call16:
        values = wrap_call16(values)
    return codec.data_body(values)


# The body keys each DML request must hold, in the order Tarantool 2.6 reports a missing one
# (``iproto_body_key_map``: the lowest key first), before the space is looked up. A SELECT needs
# its KEY too, even an empty one (checked against Tarantool 2.6.0: "Missing mandatory field 'key'
# in request").
_REQUIRED: tuple = (
    (), ((codec.SPACE_ID, "space id"), (codec.LIMIT, "limit"), (codec.KEY, "key")),  # SELECT
    ((codec.SPACE_ID, "space id"), (codec.TUPLE, "tuple")),  # INSERT
    ((codec.SPACE_ID, "space id"), (codec.TUPLE, "tuple")),  # REPLACE
    ((codec.SPACE_ID, "space id"), (codec.KEY, "key"), (codec.TUPLE, "tuple")),  # UPDATE
    ((codec.SPACE_ID, "space id"), (codec.KEY, "key")),  # DELETE
    (), (), (),  # CALL_16, AUTH, EVAL
    ((codec.SPACE_ID, "space id"), (codec.TUPLE, "tuple"), (codec.OPS, "operations")),  # UPSERT
)


_UINT_KEYS = frozenset({codec.SPACE_ID, codec.INDEX_ID, codec.LIMIT, codec.OFFSET, codec.ITERATOR, codec.INDEX_BASE})
_ARRAY_KEYS = frozenset({codec.KEY, codec.TUPLE, codec.OPS})


@cython.cfunc
def _required_mask(required: tuple) -> cython.ulonglong:
    mask: cython.ulonglong = 0
    for key, _name in required:
        mask |= cython.cast(cython.ulonglong, 1) << key
    return mask


# The same, as bit masks of body keys (a typed request says which keys it held in ``present``).
_REQUIRED_MASKS = cython.declare(tuple, tuple([_required_mask(r) for r in _REQUIRED]))


@cython.cfunc
def _check_required(request: Request, rtype: cython.ulonglong) -> cython.void:
    """Tarantool's decoding of a DML body (``xrow_decode_dml``): first every body key it knows
    must hold a value of its type ("packet body"), then the required keys must be there."""
    need: cython.ulonglong = _REQUIRED_MASKS[rtype]
    if need == 0:
        return
    if request.typed:  # a typed request holds well-typed values only
        if need & request.present == need:
            return
        for key, name in _REQUIRED[rtype]:
            if not request.present & (cython.cast(cython.ulonglong, 1) << key):
                raise BoxError(ER.MISSING_REQUEST_FIELD, name)
        return
    body = request.body
    for key, value in body.items():
        if key in _UINT_KEYS:
            if type(value) is not int or value < 0:
                raise BoxError(ER.INVALID_MSGPACK, "packet body")
        elif key in _ARRAY_KEYS and type(value) is not list:
            raise BoxError(ER.INVALID_MSGPACK, "packet body")
    for key, name in _REQUIRED[rtype]:
        if body.get(key) is None and not (key == K_SPACE_ID and codec.SPACE_NAME in body):
            raise BoxError(ER.MISSING_REQUEST_FIELD, name)


@cython.cclass
class _WriteReply:
    """Answers one write from its commit's completion callback (no closure per write): the
    response goes straight into the connection's outbox."""

    def __call__(self, result: object, error: object) -> None:
        outbox: Outbox = self.outbox
        version: cython.ulonglong = self.dispatcher.catalog.schema_version
        if error is not None:
            box_error = _as_box_error(error, self.dispatcher.stats)
            self.dispatcher.stats.count_error(self.rtype, box_error)
            write_response(outbox.out, self.sync, version, codec.error_body(box_error),
                           codec.ERROR_FLAG | box_error.code)
        elif result is None or not self.returns_tuple:
            write_response(outbox.out, self.sync, version, codec.EMPTY_TUPLES_BODY)
        else:
            write_tuples_response(outbox.out, self.sync, version, [result])
        outbox.answered()


@cython.cclass
class _CallReply:
    """Answers one CALL whose procedure returned a :class:`Later`, from its settlement: the
    return values become the body here, one object per call where a mapping lambda and a
    closure were two (with their scopes)."""

    def __call__(self, values: object, error: object) -> None:
        body = None
        if error is None:
            try:
                body = _call_body(values, self.call16)
            except Exception as exc:
                error = exc
        dispatcher: Dispatcher = self.dispatcher
        outbox: Outbox = self.outbox
        version: cython.ulonglong = dispatcher.catalog.schema_version
        if error is None:
            write_response(outbox.out, self.sync, version, body)
        else:
            if not isinstance(error, Exception):
                error = RuntimeError(repr(error))
            box_error = _as_box_error(_procedure_error(error, self.name, dispatcher.stats), dispatcher.stats)
            dispatcher.stats.count_error(T_CALL, box_error)
            write_response(outbox.out, self.sync, version, codec.error_body(box_error),
                           codec.ERROR_FLAG | box_error.code)
        outbox.answered()


@cython.cclass
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
        self._spaces = catalog.spaces
        self.access = catalog.access
        self.writes = catalog.writes
        # Serves a connection that sent JOIN or SUBSCRIBE: (session, request, io, bytes already
        # read after the request) -> awaitable; set on a member of a replica set.
        self.replication = None
        self.procedures = procedures
        self.eval_handler = eval_handler

    # -- entry point ---------------------------------------------------------------------------

    def handle(self, session: Session, request: Request, outbox: Outbox) -> object:
        """Answer ``request``: the response is appended to ``outbox.out`` now (returns None), or
        later by a callback that then calls ``outbox.answered()`` (returns :data:`PENDING`: a
        write waiting for its commit), or made by the returned coroutine (a call that may block)."""
        out: bytearray = outbox.out
        sync: cython.ulonglong = request.sync
        rtype: cython.ulonglong = request.type
        version: cython.ulonglong = self.catalog.schema_version
        result: object
        try:
            if rtype < 256:
                self._by_type[rtype] += 1
            if request.schema_version and request.schema_version != version:
                raise BoxError(ER.WRONG_SCHEMA_VERSION, version, request.schema_version)
            if rtype <= T_UPSERT:
                _check_required(request, rtype)
            if rtype == T_PING:
                result = _EMPTY_BODY
            elif rtype == T_SELECT:
                result = self._select(session, request)
                if type(result) is list:
                    write_tuples_response(out, sync, version, result)
                    return None
            elif rtype in (T_CALL, T_CALL_16):
                result = self._procedure_call(session, request, rtype == T_CALL_16, sync, outbox)
            elif rtype in (T_REPLACE, T_INSERT):
                self._put(session, request, REPLACE if rtype == T_REPLACE else INSERT, sync, outbox)
                return PENDING
            elif rtype == T_UPDATE:
                self._update(session, request, sync, outbox)
                return PENDING
            elif rtype == T_DELETE:
                self._delete(session, request, sync, outbox)
                return PENDING
            elif rtype == T_UPSERT:
                self._upsert(session, request, sync, outbox)
                return PENDING
            elif rtype == T_EVAL:
                result = self._eval(session, request)
            elif rtype == T_AUTH:
                result = self._auth(session, request)
            elif rtype == T_ID:
                result = codec.id_body(PROTOCOL_VERSION, FEATURES)
            elif rtype in (T_JOIN, T_SUBSCRIBE):
                self._replication_request(session, request)
                return None
            else:
                raise BoxError(ER.UNKNOWN_REQUEST_TYPE, rtype)
        except Exception as exc:
            error = _as_box_error(exc, self.stats)
            self.stats.count_error(rtype, error)
            write_response(out, sync, self.catalog.schema_version, codec.error_body(error),
                           codec.ERROR_FLAG | error.code)
            return None
        if type(result) is bytes:
            write_response(out, sync, self.catalog.schema_version, result)
            return None
        return result  # PENDING or a coroutine

    def handle_all(self, session: Session, decoder: RequestDecoder, outbox: Outbox,
                   room: cython.Py_ssize_t) -> tuple:
        """Handle the requests ``decoder`` holds, as :meth:`handle` does, until it has no more or
        ``room`` of them are left pending. Returns how many are pending, the coroutines (or None)
        the connection must run as tasks, and the :class:`codec.FramingError` that ended the
        stream (or None): the requests before it are answered all the same."""
        pending: cython.Py_ssize_t = 0
        tasks: list = None
        event: object
        bad: BadRequest
        while pending < room:
            try:
                event = decoder.next_event()
            except codec.FramingError as exc:
                return pending, tasks, exc
            if event is None:
                break
            if type(event) is BadRequest:
                bad = event
                self.stats.count_error(256, bad.error)
                write_response(outbox.out, bad.sync, self.catalog.schema_version,
                               codec.error_body(bad.error), codec.ERROR_FLAG | bad.error.code)
                continue
            result = self.handle(session, event, outbox)
            if result is None:
                if session.takeover is not None:
                    break  # what follows on this connection is the replication stream's
                continue
            pending += 1
            if result is not PENDING:
                if tasks is None:
                    tasks = []
                tasks.append(result)
        return pending, tasks, None

    @cython.cfunc
    def _replication_request(self, session: Session, request: Request) -> cython.void:
        """JOIN or SUBSCRIBE: the connection becomes a replication stream (``session.takeover``),
        served by ``self.replication`` once what came before it is answered. Tarantool asks for
        read on the universe (the ``replication`` role has it)."""
        if self.replication is None:
            raise BoxError(ER.UNSUPPORTED, "boxqueue", "replication requests without [replication]")
        self.access.check(session.user, acl.READ, acl.UNIVERSE, "")
        session.takeover = request

    def error(self, sync: int, error: BoxError) -> bytes:
        return codec.error_response(sync, self.catalog.schema_version, error)

    @cython.cfunc
    def _reply_later(
        self, sync: cython.ulonglong, later: Later, outbox: Outbox, name: str, call16: cython.bint
    ) -> cython.void:
        answer: _CallReply = _CallReply.__new__(_CallReply)
        answer.dispatcher = self
        answer.sync = sync
        answer.outbox = outbox
        answer.name = name
        answer.call16 = call16
        later.then(answer)

    async def _finish(self, sync: int, pending: Awaitable[bytes], rtype: int = T_CALL) -> bytes:
        try:
            body = await pending
        except Exception as exc:
            failure = _as_box_error(exc, self.stats)
            self.stats.count_error(rtype, failure)
            return codec.error_response(sync, self.catalog.schema_version, failure)
        return codec.response(sync, self.catalog.schema_version, body)

    @cython.cfunc
    def _submit(self, write: object, sync: cython.ulonglong, outbox: Outbox, rtype: cython.ulonglong) -> cython.void:
        answer: _WriteReply = _WriteReply.__new__(_WriteReply)
        answer.dispatcher = self
        answer.sync = sync
        answer.outbox = outbox
        answer.returns_tuple = rtype != T_UPSERT
        answer.rtype = rtype
        self.catalog.committer.submit(write, answer)

    # -- lookups -------------------------------------------------------------------------------

    @cython.cfunc
    def _space_of(self, body: dict) -> object:
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

    @cython.cfunc
    def _index_id(self, space: object, body: dict) -> object:
        name = body.get(codec.INDEX_NAME)
        if name is not None and codec.INDEX_ID not in body:
            if type(name) is not str:
                raise BoxError(ER.INVALID_MSGPACK, "packet body")
            return space.index_named(name).iid
        return _uint(body, codec.INDEX_ID, "index id")

    @cython.cfunc
    def _writable(self, session: Session, request: Request) -> object:
        space = None
        if request.typed and request.space_id != C_ABSENT:
            space = self._spaces.get(request.space_id)
        if space is None:
            space = self._space_of(request.body)
            if isinstance(space, SystemView):
                if space.defn.engine == "sysview":
                    raise BoxError(ER.VIEW_IS_RO, space.name)
                raise BoxError(ER.UNSUPPORTED, "boxqueue", "writes to system spaces through iproto")
        self.writes.check_space_write(session.user, space, session.read_only)
        return space

    # -- handlers --------------------------------------------------------------------------

    @cython.cfunc
    def _auth(self, session: Session, request: Request) -> bytes:
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

    @cython.cfunc
    def _select(self, session: Session, request: Request) -> object:
        """The tuples found (a list), or a whole body (bytes) from the general path."""
        space: Space = None
        if request.typed and request.space_id != C_ABSENT and request.limit != C_ABSENT:
            space = self._spaces.get(request.space_id)
        if space is None:
            return self._select_checked(session, request.body)
        # The common case: a data space by id, every field of the right type.
        user = session.user
        if user.universe & _READ == 0 and not user.privileges_on(acl.SPACE, space.name) & _READ:
            self.access.check(user, acl.READ, acl.SPACE, space.name)
        return space.select(
            0 if request.index_id == C_ABSENT else request.index_id,
            0 if request.iterator == C_ABSENT else request.iterator,
            _NO_KEY if request.key is None else request.key,
            0 if request.offset == C_ABSENT else request.offset,
            request.limit,
        )

    @cython.cfunc
    def _select_checked(self, session: Session, body: dict) -> bytes:
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

    @cython.cfunc
    def _put(self, session: Session, request: Request, mode: str, sync: cython.ulonglong, outbox: Outbox) -> cython.void:
        space = self._writable(session, request)
        if request.typed:
            if request.tuple is None:
                raise BoxError(ER.MISSING_REQUEST_FIELD, "tuple")
            fields = request.tuple
        else:
            fields = _array(request.body, codec.TUPLE, "tuple", required=True)
        self._submit(space.prepare_put(request.tuple_raw, fields, mode), sync, outbox, request.type)

    @cython.cfunc
    def _ops(self, space: Space, body: dict, key: cython.int) -> list:
        index_base = _uint(body, codec.INDEX_BASE, "index base")
        return parse_ops(_array(body, key, "tuple", required=True), index_base, space.field_names)

    @cython.cfunc
    def _update(self, session: Session, request: Request, sync: cython.ulonglong, outbox: Outbox) -> cython.void:
        space = self._writable(session, request)
        body = request.body
        iid = self._index_id(space, body)
        key = _array(body, codec.KEY, "key", required=True)
        self._submit(space.prepare_update(iid, key, self._ops(space, body, codec.TUPLE)), sync, outbox, request.type)

    @cython.cfunc
    def _delete(self, session: Session, request: Request, sync: cython.ulonglong, outbox: Outbox) -> cython.void:
        space = self._writable(session, request)
        body = request.body
        iid = self._index_id(space, body)
        key = _array(body, codec.KEY, "key", required=True)
        self._submit(space.prepare_delete(iid, key), sync, outbox, request.type)

    @cython.cfunc
    def _upsert(self, session: Session, request: Request, sync: cython.ulonglong, outbox: Outbox) -> cython.void:
        space = self._writable(session, request)
        body = request.body
        fields = _array(body, codec.TUPLE, "tuple", required=True)
        ops = parse_ops(
            _array(body, codec.OPS, "operations", required=True),
            _uint(body, codec.INDEX_BASE, "index base"),
            space.field_names,
        )
        self._submit(space.prepare_upsert(request.tuple_raw, fields, ops), sync, outbox, request.type)

    @cython.cfunc
    def _procedure_call(
        self, session: Session, request: Request, call16: cython.bint, sync: cython.ulonglong, outbox: Outbox
    ) -> object:
        if request.typed:
            name = request.function_name
            if name is None:
                raise BoxError(ER.MISSING_REQUEST_FIELD, "function name")
            args = _NO_KEY if request.tuple is None else request.tuple
        else:
            body = request.body
            name = _field(body, codec.FUNCTION_NAME, "function name", required=True)
            if type(name) is not str:
                raise BoxError(ER.INVALID_MSGPACK, "packet body")
            args = _array(body, codec.TUPLE, "tuple")
        entry: ProcedureEntry = self.procedures.resolve(name)
        if entry is None:
            raise BoxError(ER.NO_SUCH_PROC, name)
        user = session.user
        if user.universe & _EXECUTE == 0:
            self.access.check(user, acl.EXECUTE, acl.FUNCTION, name)
        if entry.writes:
            self.writes.check_writable(session.read_only)
        if entry.is_async:
            return self._finish(sync, self._run_procedure(entry.invoke(session.context, args), entry.name, call16))
        try:
            values = entry.invoke(session.context, args)
        except Exception as exc:
            raise _procedure_error(exc, entry.name, self.stats) from exc
        if type(values) is Later:
            self._reply_later(sync, values, outbox, entry.name, call16)
            return PENDING
        if type(values) is list:
            return _call_body(values, call16)
        if hasattr(values, "__await__"):
            return self._finish(sync, self._run_procedure(values, entry.name, call16))
        return _call_body(values, call16)

    async def _run_procedure(self, running: Awaitable[Any], name: str, call16: bool) -> bytes:
        try:
            values = await running
        except Exception as exc:
            raise _procedure_error(exc, name, self.stats) from exc
        return _call_body(values, call16)

    @cython.cfunc
    def _eval(self, session: Session, request: Request) -> object:
        body = request.body
        expr = _field(body, codec.EXPR, "expression", required=True)
        if type(expr) is not str:
            raise BoxError(ER.INVALID_MSGPACK, "packet body")
        args = _array(body, codec.TUPLE, "tuple")
        self.access.check(session.user, acl.EXECUTE, acl.UNIVERSE, "")
        if self.eval_handler is None:
            raise BoxError(ER.UNSUPPORTED, "boxqueue", "EVAL (no Lua engine is configured)")
        values = self.eval_handler(session, expr, args)
        if type(values) is list:  # the chunk finished on the event loop: answered at once
            return codec.data_body(values)
        return self._finish(request.sync, self._run_eval(values), T_EVAL)

    async def _run_eval(self, running: Awaitable[list[Any]]) -> bytes:
        return codec.data_body(list(await running))

