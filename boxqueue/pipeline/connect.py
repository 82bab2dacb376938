"""Opening a connector connection and describing a space, with errors that say what went wrong.

The connector wraps every connect failure in ``NetworkError``; the cause tells an unreachable
server from a refused login, and the user should not have to read a traceback to know which.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import tarantool
from tarantool.error import DatabaseError, NetworkError, SchemaError

from boxqueue.pipeline.errors import BoxqueueSourceError
from boxqueue.pipeline.options import SourceOptions

_AUTH_CODES = {45, 47}  # ER_NO_SUCH_USER, ER_CREDS_MISMATCH
_ACCESS_CODES = {42, 48, 49, 50, 51, 52, 53}  # access denied, and the other grant errors


class PipelinedConnection(tarantool.Connection):
    """The connector's connection with a real sync counter, so answers can be matched to requests.

    The stock connector waits for each answer and always sends sync 0; when several requests are
    in flight the server may answer them out of order, so each needs its own sync.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._syncs = itertools.count(1)
        super().__init__(*args, **kwargs)

    def generate_sync(self) -> int:
        return next(self._syncs)


def open_connection(opts: SourceOptions, *, raise_errors: bool = True) -> tarantool.Connection:
    """Connect (and authenticate) or raise :class:`BoxqueueSourceError` naming the reason.

    ``raise_errors=False`` gives a connection whose error answers are returned instead of raised,
    which pipelined writes need (they report the first failing row after draining the rest).
    """
    try:
        conn = PipelinedConnection(
            opts.host,
            opts.port,
            user=opts.user,
            password=opts.password,
            socket_timeout=max(opts.connect_timeout, 60.0),
            connection_timeout=opts.connect_timeout,
            reconnect_max_attempts=0,
        )
    except NetworkError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        if isinstance(cause, NetworkError) and cause.__cause__ is not None:
            cause = cause.__cause__
        code = cause.args[0] if isinstance(cause, DatabaseError) and cause.args else None
        if code in _AUTH_CODES:
            who = opts.user or "guest"
            raise BoxqueueSourceError(
                f"authentication failed for user '{who}' at {opts.uri}: {cause.args[1]}"
            ) from None
        reason = cause.args[1] if isinstance(cause, DatabaseError) and len(cause.args) > 1 else cause
        raise BoxqueueSourceError(f"cannot connect to boxqueue at {opts.uri}: {reason}") from None
    conn.error = raise_errors  # the connector's switch: error answers raised or returned
    return conn


def describe_database_error(exc: DatabaseError, what: str) -> BoxqueueSourceError:
    """A connector error turned into one sentence that says what was being done."""
    code = exc.args[0] if exc.args else None
    message = exc.args[1] if len(exc.args) > 1 else str(exc)
    if code in _ACCESS_CODES:
        return BoxqueueSourceError(f"{what}: access denied: {message}")
    if isinstance(exc, NetworkError):
        return BoxqueueSourceError(f"{what}: lost the connection to the server: {message}")
    return BoxqueueSourceError(f"{what}: {message} (error {code})")


@dataclass(frozen=True)
class FieldInfo:
    """One field of a space format."""

    name: str
    type: str
    nullable: bool


@dataclass(frozen=True)
class SpaceInfo:
    """What the data source needs to know about a space: its format and its primary key."""

    id: int
    name: str
    fields: tuple[FieldInfo, ...]
    pk_fields: tuple[int, ...]
    pk_types: tuple[str, ...]
    pk_kind: str  # "tree" or "hash"

    def field_named(self, name: str) -> int | None:
        for number, field in enumerate(self.fields):
            if field.name == name:
                return number
        return None


def describe_space(conn: tarantool.Connection, space: str, uri: str) -> SpaceInfo:
    """Read a space's format and primary index over iproto (``_vspace``/``_vindex``)."""
    ref: int | str = int(space) if space.isdigit() else space
    try:
        schema_space = conn.schema.get_space(ref)
        primary = conn.schema.get_index(schema_space.sid, 0)
    except SchemaError as exc:
        if "no index" in str(exc):
            raise BoxqueueSourceError(f"space '{space}' at {uri} has no primary index") from None
        raise BoxqueueSourceError(f"space '{space}' does not exist at {uri}") from None
    except NetworkError:
        raise  # the caller decides (a stream tries another member)
    except DatabaseError as exc:
        raise describe_database_error(exc, f"reading the schema of space '{space}' at {uri}") from None
    fields = []
    count = sum(1 for key in schema_space.format if isinstance(key, int))
    for number in range(count):
        part = schema_space.format[number]
        fields.append(
            FieldInfo(
                name=str(part.get("name", f"field_{number + 1}")),
                type=str(part.get("type", "any")).lower(),
                nullable=bool(part.get("is_nullable", False)),
            )
        )
    pk_fields = tuple(int(field) for field, _ in primary.parts)
    pk_types = tuple(str(kind).lower() for _, kind in primary.parts)
    return SpaceInfo(
        id=int(schema_space.sid),
        name=str(schema_space.name),
        fields=tuple(fields),
        pk_fields=pk_fields,
        pk_types=pk_types,
        pk_kind=str(primary.index).lower(),
    )


def check_queue_space(conn: tarantool.Connection, space: SpaceInfo, unique: bool) -> None:
    """Refuse, before any put, a space box.queue would refuse for every row.

    The server takes a space as a queue space when its indexes have the 1.5 layout: the task id
    first, then (tube, status, ...) and (tube, event); put_unique also needs a fourth index.
    """
    def parts(iid: int) -> list[int] | None:
        try:
            return [int(field) for field, _ in conn.schema.get_index(space.id, iid).parts]
        except SchemaError:
            return None

    layout = (parts(1) or [])[:2] == [1, 2] and (parts(2) or [])[:2] == [1, 3] and space.pk_fields == (0,)
    if not layout:
        raise BoxqueueSourceError(
            f"space '{space.name}' is not a queue space: box.queue needs the 1.5 layout "
            "(primary key on the task id, indexes on tube+status and tube+event)"
        )
    if unique and parts(3) is None:
        raise BoxqueueSourceError(
            f"option unique needs put_unique, and queue space '{space.name}' has no fourth "
            "(tube, status, data) index for it"
        )
