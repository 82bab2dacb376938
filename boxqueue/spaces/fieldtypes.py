"""Field types: their names, what each accepts, and which can be indexed."""

from __future__ import annotations

import decimal
import uuid
from collections.abc import Callable
from typing import Any

import msgpack

from boxqueue.spaces.msgpack_values import EXT_INTERVAL, Datetime, PairsMap

UNSIGNED = "unsigned"
INTEGER = "integer"
NUMBER = "number"
DOUBLE = "double"
STRING = "string"
BOOLEAN = "boolean"
VARBINARY = "varbinary"
SCALAR = "scalar"
UUID = "uuid"
DECIMAL = "decimal"
DATETIME = "datetime"
INTERVAL = "interval"
ANY = "any"
ARRAY = "array"
MAP = "map"

# Legacy and short spellings, matched case-insensitively (Tarantool 1.5/1.6 configs use NUM, STR,
# NUM64; 2.x normalises num, str, int, uint).
_ALIASES = {
    "num": UNSIGNED,
    "uint": UNSIGNED,
    "num64": UNSIGNED,
    "str": STRING,
    "int": INTEGER,
    "bool": BOOLEAN,
    "float": DOUBLE,
    "bin": VARBINARY,
}

_NOT_INDEXABLE = frozenset({ANY, ARRAY, MAP, INTERVAL})


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_number(v: Any) -> bool:
    t = type(v)
    return t is int or t is float or t is decimal.Decimal


def _is_scalar(v: Any) -> bool:
    t = type(v)
    return t in _SCALAR_TYPES


_SCALAR_TYPES = frozenset({int, float, decimal.Decimal, str, bytes, bool, uuid.UUID, Datetime})

ACCEPTS: dict[str, Callable[[Any], bool]] = {
    UNSIGNED: lambda v: type(v) is int and v >= 0,
    INTEGER: _is_int,
    NUMBER: _is_number,
    DOUBLE: lambda v: type(v) is float,
    STRING: lambda v: type(v) is str,
    BOOLEAN: lambda v: type(v) is bool,
    VARBINARY: lambda v: type(v) is bytes,
    SCALAR: _is_scalar,
    UUID: lambda v: type(v) is uuid.UUID,
    DECIMAL: lambda v: type(v) is decimal.Decimal,
    DATETIME: lambda v: type(v) is Datetime,
    INTERVAL: lambda v: isinstance(v, msgpack.ExtType) and v.code == EXT_INTERVAL,
    ANY: lambda v: True,
    ARRAY: lambda v: type(v) is list,
    MAP: lambda v: type(v) is dict or type(v) is PairsMap,
}

# What error messages call the type ("expected unsigned", "expected a number"...)
EXPECTED: dict[str, str] = {name: name for name in ACCEPTS}


def normalize(name: Any) -> str | None:
    """The canonical name of a field type, or ``None`` when it is not one."""
    if not isinstance(name, str):
        return None
    lowered = name.lower()
    if lowered in ACCEPTS:
        return lowered
    return _ALIASES.get(lowered)


def indexable(name: str) -> bool:
    return name in ACCEPTS and name not in _NOT_INDEXABLE
