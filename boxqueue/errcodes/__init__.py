"""The error registry: every error this server reports, in one table.

Modelled on Tarantool's ``errcode.h``: a code, a name and a message format. Every layer raises
:class:`BoxError` with a member of :class:`ER`; the iproto codec turns it into an error packet and each
facade maps codes to its own statuses in one place.
"""

from __future__ import annotations

import enum
from typing import Any


class ER(enum.IntEnum):
    """Tarantool error codes; the value is the code, the message format lives in ``FORMATS``."""

    UNKNOWN = 0
    ILLEGAL_PARAMS = 1
    MEMORY_ISSUE = 2
    TUPLE_FOUND = 3
    TUPLE_NOT_FOUND = 4
    UNSUPPORTED = 5
    READONLY = 7
    CREATE_SPACE = 9
    SPACE_EXISTS = 10
    DROP_SPACE = 11
    ALTER_SPACE = 12
    INDEX_TYPE = 13
    MODIFY_INDEX = 14
    LAST_DROP = 15
    DROP_PRIMARY_KEY = 17
    KEY_PART_TYPE = 18
    EXACT_MATCH = 19
    INVALID_MSGPACK = 20
    PROC_RET = 21
    TUPLE_NOT_ARRAY = 22
    FIELD_TYPE = 23
    INDEX_PART_TYPE_MISMATCH = 24
    UPDATE_SPLICE = 25
    UPDATE_ARG_TYPE = 26
    FORMAT_MISMATCH_INDEX_PART = 27
    UNKNOWN_UPDATE_OP = 28
    UPDATE_FIELD = 29
    KEY_PART_COUNT = 31
    PROC_LUA = 32
    NO_SUCH_PROC = 33
    NO_SUCH_INDEX_ID = 35
    NO_SUCH_SPACE = 36
    NO_SUCH_FIELD_NO = 37
    EXACT_FIELD_COUNT = 38
    FIELD_MISSING = 39
    WAL_IO = 40
    MORE_THAN_ONE_TUPLE = 41
    ACCESS_DENIED = 42
    CREATE_USER = 43
    DROP_USER = 44
    NO_SUCH_USER = 45
    USER_EXISTS = 46
    PASSWORD_MISMATCH = 47
    UNKNOWN_REQUEST_TYPE = 48
    UNKNOWN_SCHEMA_OBJECT = 49
    CREATE_FUNCTION = 50
    NO_SUCH_FUNCTION = 51
    FUNCTION_EXISTS = 52
    NO_SUCH_ENGINE = 57
    CFG = 59
    MISSING_REQUEST_FIELD = 69
    IDENTIFIER = 70
    DROP_FUNCTION = 71
    ITERATOR_TYPE = 72
    TIMEOUT = 78
    NO_SUCH_ROLE = 82
    INDEX_EXISTS = 85
    SESSION_CLOSED = 86
    GRANT = 88
    PRIV_GRANTED = 89
    CANT_UPDATE_PRIMARY_KEY = 94
    UPDATE_INTEGER_OVERFLOW = 95
    GUEST_USER_PASSWORD = 96
    UNSUPPORTED_PRIV = 98
    PROTOCOL = 104
    WRONG_INDEX_RECORD = 106
    WRONG_INDEX_PARTS = 107
    WRONG_INDEX_OPTIONS = 108
    WRONG_SCHEMA_VERSION = 109
    MEMTX_MAX_TUPLE_SIZE = 110
    WRONG_SPACE_OPTIONS = 111
    UNSUPPORTED_INDEX_FEATURE = 112
    VIEW_IS_RO = 113
    NO_TRANSACTION = 114
    SYSTEM = 115
    LOADING = 116
    CONNECTION_TO_SELF = 117
    KEY_PART_IS_TOO_LONG = 118
    PARTIAL_KEY = 136
    TRUNCATE_SYSTEM_SPACE = 137
    NO_SUCH_INDEX_NAME = 148
    UPDATE_DECIMAL_OVERFLOW = 160
    NO_SUCH_FIELD_NAME = 201
    SYNC_QUORUM_TIMEOUT = 216
    SYNC_ROLLBACK = 217
    TOO_EARLY_SUBSCRIBE = 220
    UNABLE_TO_PROCESS_IN_STREAM = 229
    UNABLE_TO_PROCESS_OUT_OF_STREAM = 230
    UNKNOWN_AUTH_METHOD = 249
    AUTH_REQUIRED = 258


# Message formats, printf style as in errcode.h (the 2.6 wording where it differs from 3.x, because
# the connectors' test suites were written against it).
FORMATS: dict[ER, str] = {
    ER.UNKNOWN: "Unknown error",
    ER.ILLEGAL_PARAMS: "Illegal parameters, %s",
    ER.MEMORY_ISSUE: "Failed to allocate %u bytes in %s for %s",
    ER.TUPLE_FOUND: "Duplicate key exists in unique index '%s' in space '%s'",
    ER.TUPLE_NOT_FOUND: "Tuple doesn't exist in index '%s' in space '%s'",
    ER.UNSUPPORTED: "%s does not support %s",
    ER.READONLY: "Can't modify data on a read-only instance",
    ER.CREATE_SPACE: "Failed to create space '%s': %s",
    ER.SPACE_EXISTS: "Space '%s' already exists",
    ER.DROP_SPACE: "Can't drop space '%s': %s",
    ER.ALTER_SPACE: "Can't modify space '%s': %s",
    ER.INDEX_TYPE: "Unsupported index type supplied for index '%s' in space '%s'",
    ER.MODIFY_INDEX: "Can't create or modify index '%s' in space '%s': %s",
    ER.LAST_DROP: "Can't drop the primary key in a system space, space '%s'",
    ER.DROP_PRIMARY_KEY: "Can't drop primary key in space '%s' while secondary keys exist",
    ER.KEY_PART_TYPE: "Supplied key type of part %u does not match index part type: expected %s",
    ER.EXACT_MATCH: "Invalid key part count in an exact match (expected %u, got %u)",
    ER.INVALID_MSGPACK: "Invalid MsgPack - %s",
    ER.PROC_RET: "msgpack.encode: can not encode Lua type '%s'",
    ER.TUPLE_NOT_ARRAY: "Tuple/Key must be MsgPack array",
    ER.FIELD_TYPE: "Tuple field %s type does not match one required by operation: expected %s",
    ER.INDEX_PART_TYPE_MISMATCH: "Field %s has type '%s' in one index, but type '%s' in another",
    ER.UPDATE_SPLICE: "SPLICE error on field %s: %s",
    ER.UPDATE_ARG_TYPE: "Argument type in operation '%s' on field %s does not match field type: expected %s",
    ER.FORMAT_MISMATCH_INDEX_PART: "Field %s has type '%s' in space format, but type '%s' in index definition",
    ER.UNKNOWN_UPDATE_OP: "Unknown UPDATE operation #%d: %s",
    ER.UPDATE_FIELD: "Field %s UPDATE error: %s",
    ER.KEY_PART_COUNT: "Invalid key part count (expected [0..%u], got %u)",
    ER.PROC_LUA: "%s",
    ER.NO_SUCH_PROC: "Procedure '%s' is not defined",
    ER.NO_SUCH_INDEX_ID: "No index #%u is defined in space '%s'",
    ER.NO_SUCH_SPACE: "Space '%s' does not exist",
    ER.NO_SUCH_FIELD_NO: "Field %d was not found in the tuple",
    ER.EXACT_FIELD_COUNT: "Tuple field count %u does not match space field count %u",
    ER.FIELD_MISSING: "Tuple field %s required by space format is missing",
    ER.WAL_IO: "Failed to write to disk",
    ER.MORE_THAN_ONE_TUPLE: "Get() doesn't support partial keys and non-unique indexes",
    ER.ACCESS_DENIED: "%s access to %s '%s' is denied for user '%s'",
    ER.CREATE_USER: "Failed to create user '%s': %s",
    ER.DROP_USER: "Failed to drop user or role '%s': %s",
    ER.NO_SUCH_USER: "User '%s' is not found",
    ER.USER_EXISTS: "User '%s' already exists",
    ER.PASSWORD_MISMATCH: "Incorrect password supplied for user '%s'",
    ER.UNKNOWN_REQUEST_TYPE: "Unknown request type %u",
    ER.UNKNOWN_SCHEMA_OBJECT: "Unknown object type '%s'",
    ER.CREATE_FUNCTION: "Failed to create function '%s': %s",
    ER.NO_SUCH_FUNCTION: "Function '%s' does not exist",
    ER.FUNCTION_EXISTS: "Function '%s' already exists",
    ER.NO_SUCH_ENGINE: "Space engine '%s' does not exist",
    ER.CFG: "Incorrect value for option '%s': %s",
    ER.MISSING_REQUEST_FIELD: "Missing mandatory field '%s' in request",
    ER.IDENTIFIER: "Invalid identifier '%s' (expected printable symbols only or it is too long)",
    ER.DROP_FUNCTION: "Can't drop function %u: %s",
    ER.ITERATOR_TYPE: "Unknown iterator type '%s'",
    ER.TIMEOUT: "Timeout exceeded",
    ER.NO_SUCH_ROLE: "Role '%s' is not found",
    ER.INDEX_EXISTS: "Index '%s' already exists",
    ER.SESSION_CLOSED: "Session is closed",
    ER.GRANT: "Incorrect grant arguments: %s",
    ER.PRIV_GRANTED: "User '%s' already has %s access on %s '%s'",
    ER.CANT_UPDATE_PRIMARY_KEY: "Attempt to modify a tuple field which is part of index '%s' in space '%s'",
    ER.UPDATE_INTEGER_OVERFLOW: "Integer overflow when performing '%s' operation on field %s",
    ER.GUEST_USER_PASSWORD: "Setting password for guest user has no effect",
    ER.UNSUPPORTED_PRIV: "Unsupported %s privilege '%s'",
    ER.PROTOCOL: "%s",
    ER.WRONG_INDEX_RECORD: "Wrong record in _index space: got {%s}, expected {%s}",
    ER.WRONG_INDEX_PARTS: "Wrong index part %u: %s",
    ER.WRONG_INDEX_OPTIONS: "Wrong index options: %s",
    ER.WRONG_SCHEMA_VERSION: "Wrong schema version, current: %d, in request: %d",
    ER.MEMTX_MAX_TUPLE_SIZE: "Failed to allocate %u bytes for tuple: tuple is too large. Check 'memtx_max_tuple_size' configuration option.",
    ER.WRONG_SPACE_OPTIONS: "Wrong space options: %s",
    ER.UNSUPPORTED_INDEX_FEATURE: "Index '%s' (%s) of space '%s' (%s) does not support %s",
    ER.VIEW_IS_RO: "View '%s' is read-only",
    ER.NO_TRANSACTION: "No active transaction",
    ER.SYSTEM: "%s",
    ER.LOADING: "Instance bootstrap hasn't finished yet",
    ER.CONNECTION_TO_SELF: "Connection to self",
    ER.KEY_PART_IS_TOO_LONG: "Key part is too long: %u of %u bytes",
    ER.PARTIAL_KEY: "%s index  does not support selects via a partial key (expected %u parts, got %u). Please Consider changing index type to TREE.",
    ER.TRUNCATE_SYSTEM_SPACE: "Can't truncate a system space, space '%s'",
    ER.NO_SUCH_INDEX_NAME: "No index '%s' is defined in space '%s'",
    ER.UPDATE_DECIMAL_OVERFLOW: "Decimal overflow when performing operation '%s' on field %s",
    ER.NO_SUCH_FIELD_NAME: "Field '%s' was not found in the tuple",
    ER.SYNC_QUORUM_TIMEOUT: "Quorum collection for a synchronous transaction is timed out",
    ER.SYNC_ROLLBACK: "A rollback for a synchronous transaction is received",
    ER.TOO_EARLY_SUBSCRIBE: "Can't subscribe non-anonymous replica %s until join is done",
    ER.UNABLE_TO_PROCESS_IN_STREAM: "Unable to process %s request in stream",
    ER.UNABLE_TO_PROCESS_OUT_OF_STREAM: "Unable to process %s request out of stream",
    ER.UNKNOWN_AUTH_METHOD: "Unknown authentication method '%s'",
    ER.AUTH_REQUIRED: "Authentication required",
}

# The error "class" Tarantool reports in the extended error stack; ClientError unless listed.
ERROR_TYPES: dict[ER, str] = {
    ER.ACCESS_DENIED: "AccessDeniedError",
    ER.PROC_LUA: "LuajitError",
    ER.SYSTEM: "SystemError",
    ER.WAL_IO: "XlogError",
}


def _render(fmt: str, args: tuple[Any, ...]) -> str:
    # errcode.h formats are printf-style; every conversion we use prints like %s.
    for spec in ("%llu", "%u", "%d", "%c"):
        fmt = fmt.replace(spec, "%s")
    return fmt % args if args else fmt


class BoxError(Exception):
    """An error with a Tarantool code; ``str()`` is the message the client sees."""

    def __init__(
        self,
        code: ER | int,
        *args: Any,
        message: str | None = None,
        error_type: str | None = None,
        fields: dict[str, Any] | None = None,
    ) -> None:
        self.code = int(code)
        if message is None:
            fmt = FORMATS.get(code) if isinstance(code, ER) else None
            message = _render(fmt, args) if fmt is not None else "Unknown error"
        self.message = message
        known = ER(code) if code in ER._value2member_map_ else None
        self.error_type = error_type or (ERROR_TYPES.get(known, "ClientError") if known else "ClientError")
        self.fields = fields
        super().__init__(message)

    def __repr__(self) -> str:
        return f"BoxError({self.code}, {self.message!r})"


def access_denied(access: str, object_type: str, object_name: str, user: str) -> BoxError:
    """ER_ACCESS_DENIED with the payload fields Tarantool attaches to it."""
    return BoxError(
        ER.ACCESS_DENIED,
        access,
        object_type,
        object_name,
        user,
        fields={"object_type": object_type, "object_name": object_name, "access_type": access},
    )
