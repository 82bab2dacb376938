"""Values between Python and the embedded Lua, as Tarantool maps msgpack to Lua and back.

Used only by whoever holds the Lua runtime (see ``LuaEngine``'s state lock). The runtime is
opened without a string encoding, so Lua strings arrive as bytes (decoded here when they are
UTF-8, else kept as binary) and Python strings are encoded before they go in.

* ``None`` inside an array or map becomes ``box.NULL``, and ``box.NULL`` comes back as ``None``.
* Tuples (:class:`Raw` msgpack) become Lua tables with the tuple metatable, and come back as
  :class:`Raw` for the console (which prints them in flow style) or as lists for EVAL and CALL.
* LuaJIT numbers are doubles: an integral one in the 64-bit range comes back as an int, as
  Tarantool encodes it; Python ints beyond 2^53 lose precision on the way in.

What comes back from Lua has been *described* inside the job (``describe`` in box.lua): scalars
as they are, tables as plain tables naming their shape, so converting them here runs no user
code and takes one call into Lua per table.
"""

from __future__ import annotations

from typing import Any

import msgpack
from lupa import luajit21

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces.msgpack_values import Raw, ext_hook, pack, unpack

MAX_DEPTH = 64
# Values converted for one result (or one box call's arguments): Python objects are not under
# the Lua memory limit, so a huge table is refused rather than copied (counted in box.lua).
MAX_RESULT_VALUES = 1_000_000
_TWO_53 = 2**53
_TWO_63 = 2**63
_TWO_64 = 2**64
_CHUNK = 4000  # values moved into or out of Lua in one call
_MAX_TUPLES_ANSWER = 256
# How the driver answers a box call whose result is one tuple, or an array of tuples.
ANSWER_TUPLE = 1
ANSWER_TUPLES = 2


def _key_order(item: tuple[Any, Any]) -> tuple[int, Any]:
    key = item[0]
    if isinstance(key, bool):
        return (0, int(key))
    if isinstance(key, int | float):
        return (1, key)
    if isinstance(key, str):
        return (2, key)
    return (3, repr(key))


class LuaValues:
    """Converters bound to one runtime and its ``internal`` table (boxqueue/lua_box/box.lua)."""

    def __init__(self, lua: Any, internal: Any) -> None:
        # Only C functions of Lua's library are called here: no VM instruction runs on the main
        # Lua state, where the count hook could not yield (see box.lua, Count hooks).
        lua_globals = lua.globals()
        self._table_from = lua.table_from
        self._setmetatable = lua_globals[b"setmetatable"]
        self._unpack = lua_globals[b"unpack"]
        self._null = internal[b"NULL"]
        self._tuple_mt = internal[b"tuple_mt"]
        self._error_mt = internal[b"error_mt"]
        self._lua_table = type(lua.table())

    # -- Python -> Lua -----------------------------------------------------------------------

    def to_lua(self, value: Any, nested: bool = False) -> Any:
        kind = type(value)
        if kind is int:
            return value if -_TWO_53 <= value <= _TWO_53 else float(value)
        if kind is str:
            return value.encode()
        if value is None:
            return self._null if nested else None
        if kind is bool or kind is float or kind is bytes:
            return value
        if kind is Raw:
            return self._setmetatable(self._table_from(self._fields(value)), self._tuple_mt)
        if luajit21.lua_type(value) is not None:  # already a Lua object
            return value
        if isinstance(value, list | tuple):
            return self._table_from([self.to_lua(v, True) for v in value])
        if isinstance(value, dict):
            return self._table_from({self.to_lua(k, True): self.to_lua(v, True) for k, v in value.items()})
        if isinstance(value, bytes):
            return bytes(value)
        return str(value).encode()

    def _fields(self, raw: Raw) -> list[Any]:
        """A stored tuple's fields for Lua, strings as they are stored (no decoding)."""
        try:
            fields = msgpack.unpackb(raw, raw=True, strict_map_key=False, ext_hook=ext_hook)
        except TypeError:  # a map with a key Python cannot hash
            fields = [v.encode() if type(v) is str else v for v in unpack(bytes(raw))]
        to_lua = self.to_lua
        return [f if type(f) is bytes else to_lua(f, True) for f in fields]

    def new_error(self, error: BoxError) -> Any:
        """A BoxError as the Lua error object box.error makes."""
        fields = {b"code": error.code, b"message": error.message.encode(), b"type": error.error_type.encode()}
        return self._setmetatable(self._table_from(fields), self._error_mt)

    def answer(self, values: list[Any]) -> tuple[Any, ...]:
        """What resumes a job after a box call (see `resumed` in box.lua): its values, with the
        usual results of space methods (a tuple or nil; an array of tuples) as fields for the
        job to build the tables, which is cheaper than building them from here."""
        if len(values) == 1:
            only = values[0]
            kind = type(only)
            if kind is Raw:
                return (ANSWER_TUPLE, *self._fields(only))
            if kind is list and len(only) <= _MAX_TUPLES_ANSWER:
                flat: list[Any] = [ANSWER_TUPLES]
                for item in only:
                    if type(item) is not Raw:
                        break
                    fields = self._fields(item)
                    flat.append(len(fields))
                    flat.extend(fields)
                else:
                    if len(flat) <= _CHUNK:
                        return tuple(flat)
        return (True, *self.args(values))

    def args(self, values: Any) -> list[Any]:
        """Values passed to Lua as a list of arguments (EVAL's, CALL's, a box call's results)."""
        out = []
        for v in values:  # the common kinds inline: this is on the path of every EVAL
            kind = type(v)
            if kind is str:
                out.append(v.encode())
            elif (kind is int and -_TWO_53 <= v <= _TWO_53) or kind is float or kind is bytes or v is None:
                out.append(v)
            else:
                out.append(self.to_lua(v))
        return out

    # -- Lua -> Python -----------------------------------------------------------------------

    def from_lua(self, value: Any, tuples_as_raw: bool) -> Any:
        """A described value (or a plain Lua string, number, boolean, nil) as Python."""
        kind = type(value)
        if kind is bytes:
            try:
                return value.decode()
            except UnicodeDecodeError:
                return value
        if kind is float:
            if value.is_integer() and -_TWO_63 <= value < _TWO_64:
                return int(value)
            return value
        if kind is self._lua_table:
            return self._from_described(value, tuples_as_raw)
        return value  # None, bool, int

    def from_results(self, values: tuple[Any, ...], first: int, tuples_as_raw: bool) -> list[Any]:
        """``values[first:]`` as Python."""
        out = []
        for i in range(first, len(values)):  # the common kinds inline, as in args()
            v = values[i]
            kind = type(v)
            if kind is bytes:
                try:
                    out.append(v.decode())
                except UnicodeDecodeError:
                    out.append(v)
            elif kind is int or v is None or kind is bool:
                out.append(v)
            else:
                out.append(self.from_lua(v, tuples_as_raw))
        return out

    def _from_described(self, table: Any, tuples_as_raw: bool) -> Any:
        n = table[b"n"]
        if n <= _CHUNK:
            items = self._unpack(table, 1, n)
            if type(items) is not tuple:  # unpack_returned_tuples gives one value as itself
                items = (items,)
        else:  # Lua's stack takes some thousands of values at a time
            collected: list[Any] = []
            for first in range(1, n + 1, _CHUNK):
                got = self._unpack(table, first, min(first + _CHUNK - 1, n))
                if type(got) is tuple:
                    collected.extend(got)
                else:  # a last chunk of one
                    collected.append(got)
            items = tuple(collected)
        shape = items[0]
        if shape == b"a":
            return self.from_results(items, 1, tuples_as_raw)
        if shape == b"t":
            fields = self.from_results(items, 1, False)
            return Raw(pack(fields)) if tuples_as_raw else fields
        from_lua = self.from_lua
        pairs = []
        for i in range(1, n, 2):
            key = from_lua(items[i], tuples_as_raw)
            if isinstance(key, list | dict):
                key = str(key)
            pairs.append((key, from_lua(items[i + 1], tuples_as_raw)))
        # Lua's pairs() order is a hash order (Tarantool's differs from ours): sort instead,
        # numbers before strings, so answers are stable.
        pairs.sort(key=_key_order)
        return dict(pairs)

    def error(self, code: Any, message: Any, error_type: Any, printable: Any) -> BoxError:
        """A job's error as a BoxError; ``console_value`` keeps what the console prints."""
        text = self.from_lua(message, False)
        box_error = BoxError(
            int(code) if code >= 0 else ER.PROC_LUA,
            message=text if isinstance(text, str) else str(text),
            error_type=error_type.decode() if error_type else None,
        )
        box_error.console_value = self.from_lua(printable, True)  # type: ignore[attr-defined]
        return box_error
