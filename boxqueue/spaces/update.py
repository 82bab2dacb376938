"""Tarantool's UPDATE / UPSERT operations, applied to a decoded tuple.

An op is ``[op_char, field, args...]`` (iproto spec §4.2). Work is split the way Tarantool splits it,
because the split decides which errors a client sees:

* :func:`parse_ops` is Tarantool's decode step. Its errors always reach the client, UPSERT included.
* :func:`apply_ops` is the do step. UPDATE returns its first error; UPSERT (``skip_errors=True``)
  skips the failing op and goes on, as 2.6 does.

Messages follow 2.6 to the letter. Fields are named 1-based (wire index 10 with base 0 is "Field 11"),
a negative position is printed as given until it has been resolved against the tuple, and a field
given as a string is printed as that string in single quotes.

A string field is a format field name or a Tarantool JSON path: ``'name'``, ``'[3]'`` (always
1-based), ``'name.key'``, ``'[2][1]'``, ``'["name"]'``. Paths reach into nested arrays and maps.

Where this differs from 2.6:
* Several ops may change the same field; they apply one after the other, as the spec says and 3.0+
  does. 2.6 refused the second one with ``Field N UPDATE error: double update of the same field``.
* A field number outside int32 is named by the value sent; 2.6 printed a stale buffer value.
As in 2.6 and the spec, ``=``/``!`` more than one past the end and ``#`` past the end are errors
(later versions pad with nils or do nothing instead).
"""

from __future__ import annotations

import decimal
import math
from dataclasses import dataclass
from typing import Any

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces.msgpack_values import PairsMap

MAX_OPS = 4000  # BOX_UPDATE_OP_CNT_MAX

_ARG_COUNT = {"=": 3, "!": 3, "#": 3, "+": 3, "-": 3, "&": 3, "|": 3, "^": 3, ":": 5}
_INT_MIN, _UINT_MAX = -(2**63), 2**64 - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

# Tarantool's decimal context: 38 digits, half-up rounding. Only overflow is an error; underflow
# and rounding are silent (decimal_check_status()).
_DECIMAL = decimal.Context(
    prec=38,
    Emax=37,
    Emin=-37,
    rounding=decimal.ROUND_HALF_UP,
    traps=[decimal.Overflow, decimal.InvalidOperation, decimal.DivisionByZero],
)


@dataclass(frozen=True, slots=True)
class UpdateOp:
    """One validated op.

    ``field`` is a 0-based position with INDEX_BASE already removed (negative counts from the end),
    or the field name / JSON path exactly as sent. ``args`` are the op's arguments; for ``#`` the
    count is already cut to 32 bits as Tarantool does, for ``:`` the offset is 0-based.
    """

    opcode: str
    field: int | str
    args: tuple[Any, ...]


# ---------------------------------------------------------------------------------------------
# Decoding


def parse_ops(
    ops: object, index_base: int = 0, field_names: dict[str, int] | None = None
) -> list[UpdateOp]:
    """Validate the wire op list (must be a list of lists: ``[op_char, field, args...]``).

    Op numbers in messages are 1-based; ``index_base`` is the wire INDEX_BASE (0 default, 1 allowed).
    Tarantool resolves field names while decoding, so with ``field_names`` (the space format) an
    unknown name or a malformed path raises here, in Tarantool's order; without it the check is left
    to :func:`apply_ops`. Pass it for UPSERT, where decode errors are returned but apply errors are not.
    """
    if not _is_array(ops) or not _is_uint(index_base):
        # The request decoder rejects a non-array IPROTO_OPS or a non-uint IPROTO_INDEX_BASE
        # before the update code sees them.
        raise BoxError(ER.INVALID_MSGPACK, "packet body")
    if len(ops) > MAX_OPS:
        raise BoxError(ER.ILLEGAL_PARAMS, "too many operations for update")
    return [_parse_op(n, raw, index_base, field_names) for n, raw in enumerate(ops, 1)]


def _parse_op(
    number: int, raw: object, index_base: int, field_names: dict[str, int] | None
) -> UpdateOp:
    if not _is_array(raw):
        raise BoxError(ER.ILLEGAL_PARAMS, "update operation must be an array {op,..}")
    if not raw:
        raise BoxError(
            ER.ILLEGAL_PARAMS, "update operation must be an array {op,..}, got empty array"
        )
    opcode = raw[0]
    if not isinstance(opcode, str):
        raise BoxError(ER.ILLEGAL_PARAMS, "update operation name must be a string")
    if opcode not in _ARG_COUNT:
        raise BoxError(ER.UNKNOWN_UPDATE_OP, number, f'"{opcode}"')
    if len(raw) != _ARG_COUNT[opcode]:
        reason = f"wrong number of arguments, expected {_ARG_COUNT[opcode]}, got {len(raw)}"
        raise BoxError(ER.UNKNOWN_UPDATE_OP, number, reason)

    field = raw[1]
    if isinstance(field, str):
        if field_names is not None:
            _resolve(field, field_names)
    elif _is_int(field):
        if not _INT32_MIN <= field <= _INT32_MAX:
            # 2.6 names the field with whatever its op buffer held; the value sent is clearer.
            raise BoxError(ER.UPDATE_ARG_TYPE, opcode, field, "an integer")
        if field - index_base >= 0:
            field -= index_base
        elif field >= 0:  # 0 with INDEX_BASE 1: below the base, but not "from the end"
            raise BoxError(ER.NO_SUCH_FIELD_NO, field)
    else:
        raise BoxError(ER.ILLEGAL_PARAMS, "field id must be a number or a string")
    return UpdateOp(opcode, field, _parse_args(opcode, raw[2:], _label(field), index_base))


def _parse_args(opcode: str, args: list, label: str, index_base: int) -> tuple[Any, ...]:
    """Check argument types the way xrow_update_read_arg_* do, before any tuple is touched."""
    if opcode in "+-":
        if not _is_number(args[0]):
            raise BoxError(ER.UPDATE_ARG_TYPE, opcode, label, "a number")
    elif opcode in "&|^#":
        if not _is_uint(args[0]):
            raise BoxError(ER.UPDATE_ARG_TYPE, opcode, label, "a positive integer")
        if opcode == "#":
            count = args[0] & 0xFFFFFFFF  # Tarantool keeps the count in a uint32_t
            if count == 0:
                raise BoxError(ER.UPDATE_FIELD, label, "cannot delete 0 fields")
            return (count,)
    elif opcode == ":":
        offset, cut, paste = args
        if not _is_int32(offset):
            raise BoxError(ER.UPDATE_ARG_TYPE, opcode, label, "an integer")
        if offset >= 0:
            if offset - index_base < 0:
                raise BoxError(ER.UPDATE_SPLICE, label, "offset is out of bound")
            offset -= index_base
        if not _is_int32(cut):
            raise BoxError(ER.UPDATE_ARG_TYPE, opcode, label, "an integer")
        if not isinstance(paste, str):
            raise BoxError(ER.UPDATE_ARG_TYPE, opcode, label, "a string")
        return (offset, cut, paste)
    return tuple(args)


# ---------------------------------------------------------------------------------------------
# Applying


def apply_ops(
    fields: list,
    ops: list[UpdateOp],
    field_names: dict[str, int] | None = None,
    *,
    skip_errors: bool = False,
) -> list:
    """Return a NEW list of fields with ``ops`` applied in order; ``fields`` is never mutated.

    A string field resolves through ``field_names`` (format name -> 0-based position) or as a JSON
    path. ``skip_errors`` is UPSERT's behaviour: an op that fails is left out and the rest still apply.
    """
    result = list(fields)
    for op in ops:
        try:
            result = _apply(result, op, field_names)
        except BoxError:
            if not skip_errors:
                raise
    return result


def _apply(fields: list, op: UpdateOp, field_names: dict[str, int] | None) -> list:
    if isinstance(op.field, int):
        return _in_array(fields, op.field, op, None, 0)
    position, offset = _resolve(op.field, field_names or {})
    return _in_array(fields, position, op, op.field, offset, top=True)


def _in_array(
    array: list, index: int, op: UpdateOp, path: str | None, offset: int, top: bool = False
) -> list:
    """Apply ``op`` at ``array[index]``, or deeper when ``path[offset:]`` has more tokens.

    ``path`` is None for a field sent as a number: only then may ``index`` be negative, and a
    missing field is error 37 rather than 201. ``top`` marks the tuple itself.
    """
    size = len(array)
    last = path is None or offset == len(path)
    if last and op.opcode == "=" and index == size:
        return [*array, op.args[0]]  # '=' just past the end appends
    bound = size + 1 if last and op.opcode == "!" else size
    position = index + bound if index < 0 else index
    if not 0 <= position < bound:
        if path is None:
            raise BoxError(ER.NO_SUCH_FIELD_NO, index + 1 if index >= 0 else index)
        raise BoxError(ER.NO_SUCH_FIELD_NAME, _label(path)) if top else _not_found(op, path, offset)
    result = list(array)
    if not last:
        result[position] = _descend(array[position], op, path, offset)
    elif op.opcode == "!":
        result.insert(position, op.args[0])
    elif op.opcode == "=":
        result[position] = op.args[0]
    elif op.opcode == "#":
        del result[position : position + op.args[0]]
    else:
        result[position] = _scalar(array[position], op, _label(path, position))
    return result


def _in_map(mapping: dict | PairsMap, key: str | int, op: UpdateOp, path: str, offset: int) -> Any:
    """Apply ``op`` at ``mapping[key]`` (a JSON path step such as ``.key``)."""
    items = list(mapping.items()) if isinstance(mapping, dict) else list(mapping)
    found = _find_key(items, key)
    last = offset == len(path)
    if found is None:
        if not (last and op.opcode in "=!"):
            raise _not_found(op, path, offset)
        items.insert(0, (key, op.args[0]))  # Tarantool emits the keys it adds first
    elif not last:
        items[found] = (key, _descend(items[found][1], op, path, offset))
    elif op.opcode == "!":
        raise BoxError(ER.UPDATE_FIELD, _label(path), "the key exists already")
    elif op.opcode == "=":
        items[found] = (key, op.args[0])
    elif op.opcode == "#":
        if op.args[0] != 1:
            raise BoxError(
                ER.UPDATE_FIELD, _label(path), "can delete only 1 field from a map in a row"
            )
        del items[found]
    else:
        items[found] = (key, _scalar(items[found][1], op, _label(path)))
    return dict(items) if isinstance(mapping, dict) else PairsMap(items)


def _descend(value: Any, op: UpdateOp, path: str, offset: int) -> Any:
    """Follow the next path token into ``value``; tokens are read lazily, as Tarantool does."""
    try:
        token, end = _next_token(path, offset)
    except _BadJson as exc:
        raise _bad_json(path, exc.position) from None
    if token is _ANY:
        raise _bad_json(path, end - 1)
    if isinstance(token, int) and _is_array(value):
        return _in_array(value, token, op, path, end)
    if isinstance(value, dict | PairsMap):
        key = token if isinstance(token, str) else token + 1  # [N] also finds an integer key N
        if isinstance(token, str) or _find_key(value, key) is not None:
            return _in_map(value, key, op, path, end)
    if end == len(path) and op.opcode in "=!":
        kind = "index a non-array" if isinstance(token, int) else "key a non-map"
        raise BoxError(ER.UPDATE_FIELD, _label(path), f"can not access by {kind} field")
    raise _not_found(op, path, end)


def _not_found(op: UpdateOp, path: str, offset: int) -> BoxError:
    """201 for a path step inside a field that finds nothing. For ``=`` and ``!`` Tarantool first
    reads the next token, to learn whether the step was the last one, so a malformed rest of the
    path is reported instead."""
    if op.opcode in "=!" and offset < len(path):
        try:
            _next_token(path, offset)
        except _BadJson as exc:
            return _bad_json(path, exc.position)
    return BoxError(ER.NO_SUCH_FIELD_NAME, _label(path))


# ---------------------------------------------------------------------------------------------
# Scalar ops: + - & | ^ :


def _scalar(value: Any, op: UpdateOp, label: str) -> Any:
    opcode, arg = op.opcode, op.args[0]
    if opcode in "+-":
        return _arith(value, opcode, arg, label)
    if opcode in "&|^":
        if not _is_uint(value):
            raise BoxError(ER.UPDATE_ARG_TYPE, opcode, label, "a positive integer")
        return value & arg if opcode == "&" else value | arg if opcode == "|" else value ^ arg
    return _splice(value, *op.args, label)


def _arith(value: Any, opcode: str, arg: Any, label: str) -> Any:
    """``+``/``-``: int with int is checked against Tarantool's range, a float makes a float, a
    decimal makes a decimal (the other side converted, floats through 15 significant digits)."""
    if not _is_number(value):
        raise BoxError(ER.UPDATE_ARG_TYPE, opcode, label, "a number")
    if isinstance(value, decimal.Decimal) or isinstance(arg, decimal.Decimal):
        left, right = _to_decimal(value), _to_decimal(arg)
        if left is None or right is None:
            raise BoxError(ER.UPDATE_ARG_TYPE, opcode, label, "a number convertible to decimal")
        try:
            return _DECIMAL.add(left, right) if opcode == "+" else _DECIMAL.subtract(left, right)
        except decimal.DecimalException:
            raise BoxError(ER.UPDATE_DECIMAL_OVERFLOW, opcode, label) from None
    if isinstance(value, float) or isinstance(arg, float):
        return float(value) + float(arg) if opcode == "+" else float(value) - float(arg)
    result = value + arg if opcode == "+" else value - arg
    if not _INT_MIN <= result <= _UINT_MAX:
        raise BoxError(ER.UPDATE_INTEGER_OVERFLOW, opcode, label)
    return result


def _to_decimal(number: Any) -> decimal.Decimal | None:
    if isinstance(number, decimal.Decimal):
        return number
    if isinstance(number, int):
        return decimal.Decimal(number)
    if not math.isfinite(number):
        return None
    try:  # decimal_from_double(): printf("%.15g"), then parse; inf, nan and overflow fail
        return _DECIMAL.create_decimal(format(number, ".15g"))
    except decimal.DecimalException:
        return None


def _splice(value: Any, offset: int, cut: int, paste: str, label: str) -> str:
    """``:`` works on the UTF-8 bytes, as Tarantool does, so it can split a character; the
    surrogateescape round trip keeps such bytes exactly."""
    if not isinstance(value, str):
        raise BoxError(ER.UPDATE_ARG_TYPE, ":", label, "a string")
    data = value.encode("utf-8", "surrogateescape")
    size = len(data)
    if offset < 0:
        if -offset > size + 1:
            raise BoxError(ER.UPDATE_SPLICE, label, "offset is out of bound")
        offset += size + 1  # -1 is after the last byte
    offset = min(offset, size)
    if cut < 0:  # a negative cut leaves that many bytes at the end
        cut = 0 if -cut > size - offset else cut + size - offset
    cut = min(cut, size - offset)
    result = data[:offset] + paste.encode("utf-8", "surrogateescape") + data[offset + cut :]
    return result.decode("utf-8", "surrogateescape")


# ---------------------------------------------------------------------------------------------
# Field names and JSON paths


class _BadJson(Exception):
    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position  # 1-based, in characters, as json_lexer reports it


_ANY = object()  # the '[*]' token, which update does not accept


def _resolve(path: str, field_names: dict[str, int]) -> tuple[int, int]:
    """Top-level position of a string field, and where the rest of its path starts.

    Like xrow_update_op_decode(): an exact format name wins; otherwise the first JSON token must be
    ``[N]`` or a known name. Anything else is 201 with the path as sent.
    """
    if path in field_names:
        return field_names[path], len(path)
    try:
        token, end = _next_token(path, 0) if path else (None, 0)
    except _BadJson as exc:
        raise _bad_json(path, exc.position) from None
    if isinstance(token, int):
        return token, end
    if isinstance(token, str) and token in field_names:
        return field_names[token], end
    raise BoxError(ER.NO_SUCH_FIELD_NAME, path)


def _next_token(path: str, i: int) -> tuple[Any, int]:
    """Read one token of a Tarantool JSON path at ``path[i]``: an int (a 0-based ``[N]``), a str
    (``.key``, ``["key"]``, or a leading bare name) or ``_ANY``. Returns it with the next offset."""
    size = len(path)
    char = path[i]
    if char == "[":
        i += 1
        if i == size:
            raise _BadJson(i)
        char = path[i]
        if char in "\"'":
            end = i + 1
            while end < size and path[end] != char:
                if _is_surrogate(path[end]):  # not valid UTF-8 on the wire
                    raise _BadJson(end + 1)
                end += 1
            if end == size:
                raise _BadJson(end + 1)
            if end == i + 1:
                raise _BadJson(end + 1)  # an empty key
            token, i = path[i + 1 : end], end + 1
        elif char == "*":
            token, i = _ANY, i + 1
        else:
            end = i
            while end < size and path[end] in "0123456789":
                end += 1
            # [N] is 1-based whatever INDEX_BASE says; a huge N just finds nothing.
            number = int(path[i:end]) if 0 < end - i < 19 else 2**63
            if end == i or number < 1:
                raise _BadJson(i + 1)
            token, i = number - 1, end
        if i == size or path[i] != "]":
            raise _BadJson(i + 1)
        return token, i + 1
    if char == ".":
        if i + 1 == size:
            raise _BadJson(i + 2)
        return _identifier(path, i + 1)
    if i != 0:
        raise _BadJson(i + 1)
    return _identifier(path, i)


def _identifier(path: str, start: int) -> tuple[str, int]:
    char = path[start]
    if not (char.isalpha() or char == "_"):
        raise _BadJson(start + 1)
    end = start + 1
    while end < len(path) and (path[end].isalnum() or path[end] == "_"):
        end += 1
    return path[start:end], end


def _bad_json(path: str, position: int) -> BoxError:
    return BoxError(ER.UPDATE_FIELD, _label(path), f"invalid JSON in position {position}")


# ---------------------------------------------------------------------------------------------
# Small helpers


def _label(field: int | str | None, position: int = 0) -> str:
    """How Tarantool names a field in update errors: the path in quotes, or the 1-based number
    (``field``, or ``position`` once a number sent has been resolved against the tuple)."""
    if isinstance(field, str):
        return f"'{field}'"
    number = position if field is None else field
    return str(number + 1 if number >= 0 else number)


def _find_key(mapping: dict | PairsMap | list, key: str | int) -> int | None:
    """Index of ``key`` among the map's pairs; only a key of the same msgpack type matches."""
    pairs = mapping.items() if isinstance(mapping, dict) else mapping
    return next((i for i, (k, _) in enumerate(pairs) if type(k) is type(key) and k == key), None)


def _is_array(value: object) -> bool:
    return isinstance(value, list | tuple) and not isinstance(value, PairsMap)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int32(value: object) -> bool:
    return _is_int(value) and _INT32_MIN <= value <= _INT32_MAX


def _is_uint(value: object) -> bool:
    return _is_int(value) and value >= 0


def _is_number(value: object) -> bool:
    return _is_int(value) or isinstance(value, float | decimal.Decimal)


def _is_surrogate(char: str) -> bool:
    return "\ud800" <= char <= "\udfff"
