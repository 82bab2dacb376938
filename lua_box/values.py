"""Values between Python and the embedded Lua, as Tarantool maps msgpack to Lua and back.

Runs only in the thread that holds the Lua runtime. The runtime is opened without a string
encoding, so Lua strings arrive as bytes (decoded here when they are UTF-8, else kept as binary)
and Python strings are encoded before they go in.

* ``None`` inside an array or map becomes ``box.NULL``, and ``box.NULL`` comes back as ``None``.
* Tuples (:class:`Raw` msgpack) become Lua tables with the tuple metatable, and come back as
  :class:`Raw` for the console (which prints them in flow style) or as lists for EVAL and CALL.
* LuaJIT numbers are doubles: an integral one in the 64-bit range comes back as an int, as
  Tarantool encodes it; Python ints beyond 2^53 lose precision on the way in.
"""

from __future__ import annotations

from typing import Any

from lupa import luajit21

from errcodes import ER, BoxError
from spaces.msgpack_values import Raw, pack, unpack

MAX_DEPTH = 64
# Values converted for one result (or one box call's arguments): Python objects are not under
# the Lua memory limit, so a huge table is refused rather than copied.
MAX_RESULT_VALUES = 1_000_000
_TWO_63 = 2**63
_TWO_64 = 2**64


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
    """Converters bound to one runtime and its ``internal`` table (lua_box/box.lua)."""

    def __init__(self, lua: Any, internal: Any) -> None:
        self._table_from = lua.table_from
        self._kind = internal[b"kind"]
        self._null = internal[b"NULL"]
        self._new_tuple = internal[b"new_tuple"]
        self._error_info = internal[b"error_info"]
        self._left = MAX_RESULT_VALUES

    def _spend(self, count: int) -> None:
        self._left -= count
        if self._left < 0:
            raise BoxError(ER.PROC_LUA, message=f"a result of more than {MAX_RESULT_VALUES} values is refused")

    # -- Python -> Lua -----------------------------------------------------------------------

    def to_lua(self, value: Any, nested: bool = False) -> Any:
        kind = type(value)
        if value is None:
            return self._null if nested else None
        if luajit21.lua_type(value) is not None:  # already a Lua object
            return value
        if kind is bool or kind is float:
            return value
        if kind is int:
            return value if -(2**53) <= value <= 2**53 else float(value)
        if kind is str:
            return value.encode()
        if isinstance(value, Raw):
            fields = unpack(bytes(value))
            return self._new_tuple(self._table_from([self.to_lua(v, True) for v in fields]))
        if kind is bytes:
            return value
        if isinstance(value, list | tuple):
            return self._table_from([self.to_lua(v, True) for v in value])
        if isinstance(value, dict):
            return self._table_from({self.to_lua(k, True): self.to_lua(v, True) for k, v in value.items()})
        return str(value).encode()

    def results(self, values: list[Any]) -> Any:
        """A ``{n = #values, ...}`` table for a Lua ``unpack``."""
        table = self._table_from([self.to_lua(v) for v in values])
        table[b"n"] = len(values)
        return table

    # -- Lua -> Python -----------------------------------------------------------------------

    def from_lua(self, value: Any, tuples_as_raw: bool, depth: int = 0) -> Any:
        kind = type(value)
        if value is None or kind is bool or kind is int:
            return value
        if kind is float:
            if value.is_integer() and -_TWO_63 <= value < _TWO_64:
                return int(value)
            return value
        if kind is bytes:
            try:
                return value.decode()
            except UnicodeDecodeError:
                return value
        if depth > MAX_DEPTH:
            raise BoxError(ER.PROC_LUA, message="too deep nesting (a table that contains itself?)")
        described = self._kind(value)
        lua_kind, size = described[0], described[1]
        depth += 1
        if lua_kind == b"null":
            return None
        if lua_kind == b"array":
            self._spend(size)
            return [self.from_lua(value[i], tuples_as_raw, depth) for i in range(1, size + 1)]
        if lua_kind == b"map":
            items = []
            for k, v in value.items():
                self._spend(1)
                key = self.from_lua(k, tuples_as_raw, depth)
                if isinstance(key, list | dict):
                    key = str(key)
                items.append((key, self.from_lua(v, tuples_as_raw, depth)))
            # Lua's pairs() order is a hash order (Tarantool's differs from ours): sort instead,
            # numbers before strings, so answers are stable.
            items.sort(key=_key_order)
            return dict(items)
        if lua_kind == b"tuple":
            self._spend(size)
            fields = [self.from_lua(value[i], False, depth) for i in range(1, size + 1)]
            return Raw(pack(fields)) if tuples_as_raw else fields
        if lua_kind == b"proxy":
            return self.from_lua(described[2], tuples_as_raw, depth)
        if lua_kind == b"error":
            return self.from_lua(self._error_info(value)[1], tuples_as_raw, depth)
        # functions, userdata, threads: their tostring(), as Tarantool's serializer shows them
        return self.from_lua(described[2], tuples_as_raw, depth)

    def from_results(self, table: Any, tuples_as_raw: bool) -> list[Any]:
        """The values of a ``{n = ..., ...}`` table."""
        n = table[b"n"]
        self._left = MAX_RESULT_VALUES
        self._spend(n)
        return [self.from_lua(table[i], tuples_as_raw) for i in range(1, n + 1)]

    def error(self, err: Any) -> BoxError:
        """A Lua error value as a BoxError; ``console_value`` keeps what the console prints."""
        code, message, error_type, printable = self._error_info(err)
        self._left = MAX_RESULT_VALUES
        box_error = BoxError(
            int(code) if code >= 0 else ER.PROC_LUA,
            message=self.from_lua(message, False),
            error_type=error_type.decode() if error_type else None,
        )
        box_error.console_value = self.from_lua(printable, True)  # type: ignore[attr-defined]
        return box_error
