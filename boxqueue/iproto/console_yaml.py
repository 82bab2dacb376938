"""The console's answers as YAML documents, printed the way Tarantool 2.6 prints them.

Tarantool's console serialises with libyaml; PyYAML's pure-Python emitter is a port of it, so
feeding it the same events gives the same bytes (line folding at 80 columns, indentation, when
a scalar must be quoted). What Tarantool decides itself, and this module copies:

* a string that would read back as something else (``true``, ``false``, ``yes``, ``no``,
  ``null``, ``~`` and anything Lua's ``tonumber`` accepts) is single-quoted;
* tuples are flow sequences in which every string is quoted (``[1, 'a']``);
* an empty Lua table is ``[]``; numbers with no fractional part print as integers when they fit
  in 64 bits, others as C's ``%.14g``;
* the document has explicit ``---`` and ``...`` markers; no values gives ``---\\n...\\n``.

Values are Python: ``None``, bool, int, float, str, bytes, list, dict, and :class:`Raw` (a tuple,
as msgpack bytes) for flow style. Nothing here touches a socket.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any

import yaml
from yaml import events

from boxqueue.spaces.msgpack_values import Raw, unpack

EMPTY_DOCUMENT = b"---\n...\n"

_QUOTED_WORDS = frozenset({"true", "false", "yes", "no", "null", "~"})
# What LuaJIT's tonumber() accepts (decimal, hex with optional fraction/exponent, binary, inf, nan).
_LUA_NUMBER = re.compile(
    r"""^\s*[+-]?(
        (\d+\.?\d*|\.\d+)([eE][+-]?\d+)?
      | 0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)([pP][+-]?\d+)?
      | 0[bB][01]+
      | inf(inity)? | nan
    )\s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_TWO_63 = 2**63
_TWO_64 = 2**64


def _number_text(value: int | float) -> str:
    if type(value) is int:
        return str(value)
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value.is_integer() and -_TWO_63 <= value < _TWO_64:
        return str(int(value))
    return f"{value:.14g}"


def _needs_quotes(text: str) -> bool:
    return text in _QUOTED_WORDS or _LUA_NUMBER.match(text) is not None


class _Events:
    """Turns values into PyYAML events."""

    def __init__(self) -> None:
        self.out: list[events.Event] = []

    def scalar(self, text: str, style: str | None = None) -> None:
        self.out.append(events.ScalarEvent(None, None, (True, True), text, style=style))

    def value(self, value: Any, flow: bool) -> None:
        kind = type(value)
        if value is None:
            self.scalar("null")
        elif kind is bool:
            self.scalar("true" if value else "false")
        elif kind is int or kind is float:
            self.scalar(_number_text(value))
        elif kind is str:
            self.string(value, flow)
        elif isinstance(value, Raw):
            self.sequence(unpack(bytes(value)), True)
        elif kind is bytes or kind is bytearray:
            self.string(bytes(value).decode("utf-8", "replace"), flow)
        elif isinstance(value, list | tuple):
            self.sequence(value, flow)
        elif isinstance(value, dict):
            self.mapping(value, flow)
        else:
            self.string(str(value), flow)

    def string(self, text: str, flow: bool) -> None:
        if flow or _needs_quotes(text):
            self.scalar(text, "'")
        else:
            self.scalar(text)

    def sequence(self, items: Any, flow: bool) -> None:
        self.out.append(events.SequenceStartEvent(None, None, True, flow_style=flow))
        for item in items:
            self.value(item, flow)
        self.out.append(events.SequenceEndEvent())

    def mapping(self, items: dict[Any, Any], flow: bool) -> None:
        if not items:
            self.sequence([], flow)
            return
        self.out.append(events.MappingStartEvent(None, None, True, flow_style=flow))
        for key, item in items.items():
            self.value(key, flow)
            self.value(item, flow)
        self.out.append(events.MappingEndEvent())


def _document(build: Any) -> bytes:
    ev = _Events()
    ev.out += [events.StreamStartEvent(), events.DocumentStartEvent(explicit=True)]
    ev.out.append(events.SequenceStartEvent(None, None, True, flow_style=False))
    build(ev)
    ev.out += [events.SequenceEndEvent(), events.DocumentEndEvent(explicit=True), events.StreamEndEvent()]
    stream = io.StringIO()
    yaml.emit(ev.out, stream, allow_unicode=True, width=80, indent=2)
    return stream.getvalue().encode()


def values_document(values: list[Any]) -> bytes:
    """The answer to a statement that returned ``values``."""
    if not values:
        return EMPTY_DOCUMENT
    return _document(lambda ev: [ev.value(v, False) for v in values])


def error_document(error: Any) -> bytes:
    """``- error: <message>`` (the error value may be a structure, as Lua allows)."""
    return _document(lambda ev: ev.mapping({"error": error}, False))
