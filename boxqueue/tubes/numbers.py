"""Lua's ``tonumber`` as the 1.5 module applied it to every numeric argument.

Over the 1.5 protocol every argument arrived as a string, so ``"5"``, ``" 1e3 "`` and ``"0x10"``
are numbers; ``""``, ``"abc"``, ``"5s"``, ``nil`` and booleans are not.
"""

from __future__ import annotations

import decimal
import re
from typing import Any

_DECIMAL = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")
_HEX = re.compile(r"^[+-]?0[xX][0-9a-fA-F]+$")


def tonumber(value: Any) -> int | float | None:
    """The number ``value`` stands for, or ``None`` (Lua's ``nil``)."""
    kind = type(value)
    if kind is int or kind is float:
        return value
    if kind is decimal.Decimal:
        return float(value)
    if kind is bytes:
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
        kind = str
    if kind is not str:
        return None
    text = value.strip(" \t\n\r\f\v")
    if _DECIMAL.match(text):
        number = float(text)
        if number.is_integer() and "." not in text and "e" not in text.lower():
            return int(text)
        return number
    if _HEX.match(text):
        return int(text, 16)
    return None
