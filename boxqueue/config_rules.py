"""Rules a configuration must keep, shared by the TOML reader and the 1.5 cfg reader.

Both readers refuse the same indexes and the same listener clashes, and both name keys and values
the same way in their messages (``space[0].indexes[1]``, ``"abc"``), so these live apart from
either reader.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from boxqueue.config_types import Address, IndexConfig, Key


def index_problem(index: IndexConfig, position: int) -> str | None:
    """What Tarantool would refuse about this index (``position`` 0 is the primary key)."""
    if not index.parts:
        return "an index needs at least one part"
    if position == 0 and not index.unique:
        return "the primary key (index 0) must be unique"
    if index.type == "HASH" and not index.unique:
        return "a HASH index must be unique"
    nullable = any(p.is_nullable for p in index.parts)
    if position == 0 and nullable:
        return "the primary key (index 0) cannot have nullable parts"
    if index.type == "HASH" and nullable:
        return "a HASH index cannot have nullable parts"
    fields = [p.field for p in index.parts]
    if len(set(fields)) != len(fields):
        return "the same field is indexed twice"
    return None


def listener_clash(
    listeners: Sequence[tuple[Key, Address | None]],
) -> tuple[Key, Key, Address] | None:
    """Two listeners on one host:port cannot both bind: (the later key, the earlier, the address)."""
    seen: dict[Address, Key] = {}
    for key, address in listeners:
        if address is None or address.port == 0:
            continue
        if address in seen:
            return key, seen[address], address
        seen[address] = key
    return None


_NUMERIC_WIDENING = {("unsigned", "integer"), ("unsigned", "number"), ("integer", "number"),
                     ("double", "number")}


def compatible_part_type(declared: str, part: str) -> bool:
    """Whether an index part of type ``part`` may cover a field the format declares ``declared``."""
    return (
        declared == part
        or declared == "any"
        or "scalar" in (declared, part)
        or (declared, part) in _NUMERIC_WIDENING
        or (part, declared) in _NUMERIC_WIDENING
    )


def default_index_name(position: int) -> str:
    return "primary" if position == 0 else f"i{position}"


def dotted(path: Sequence[str | int]) -> str:
    """``("space", 0, "indexes", 1)`` -> ``space[0].indexes[1]``."""
    out = ""
    for segment in path:
        if isinstance(segment, int):
            out += f"[{segment}]"
        else:
            out += f".{segment}" if out else segment
    return out


def show(value: Any) -> str:
    """A value as the user wrote it in TOML."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # quoted, newlines and quotes escaped
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return str(value)
