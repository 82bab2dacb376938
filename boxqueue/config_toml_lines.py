"""Where each key of a TOML document is: ``tomllib`` gives no positions, so scan the text once.

Only used on text ``tomllib`` has already accepted; errors then name the line of the bad key.
"""

from __future__ import annotations

import contextlib
import re
import tomllib
from bisect import bisect_left
from collections.abc import Sequence

from boxqueue.config_model import Key

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"[^,\]}\n#]*")  # numbers, booleans, dates: up to the next delimiter


class TomlLines:
    """The line of every key, table header and array item of a valid TOML document.

    Paths are tuples as in the parsed data: ``[[space]]`` number 2 is ``("space", 1)``, the second
    item of an inline array ``indexes = [...]`` is ``(..., "indexes", 1)``.
    """

    def __init__(self, text: str) -> None:
        self._text = text
        self._pos = 0
        self._newlines = [i for i, ch in enumerate(text) if ch == "\n"]
        self.lines: dict[Key, int] = {}
        with contextlib.suppress(IndexError, ValueError, tomllib.TOMLDecodeError):
            self._document()  # best effort: the lines found before a failure stay usable

    def line_of(self, path: Sequence[str | int]) -> int | None:
        """The line of ``path``, or of its nearest enclosing key that has one."""
        key = tuple(path)
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key[:-1]
        return None

    # -- scanning ----------------------------------------------------------------------------

    def _line(self) -> int:
        return bisect_left(self._newlines, self._pos) + 1

    def _peek(self) -> str:
        return self._text[self._pos] if self._pos < len(self._text) else "\0"

    def _skip(self, newlines: bool) -> None:
        text = self._text
        while self._pos < len(text):
            ch = text[self._pos]
            if ch in " \t\r" or (newlines and ch == "\n"):
                self._pos += 1
            elif ch == "#":
                end = text.find("\n", self._pos)
                self._pos = len(text) if end < 0 else end
            else:
                return

    def _note(self, path: Key, line: int) -> None:
        for n in range(1, len(path) + 1):
            self.lines.setdefault(path[:n], line)

    def _document(self) -> None:
        table: Key = ()
        arrays: dict[Key, int] = {}  # array-of-tables path -> items so far
        while True:
            self._skip(newlines=True)
            if self._pos >= len(self._text):
                return
            line = self._line()
            if self._text.startswith("[[", self._pos):
                self._pos += 2
                names = self._key()
                self._pos += 2  # "]]"
                parent = self._resolve(names[:-1], arrays)
                array = (*parent, names[-1])
                arrays[array] = arrays.get(array, 0) + 1
                table = (*array, arrays[array] - 1)
                self._note(table, line)
            elif self._peek() == "[":
                self._pos += 1
                table = self._resolve(self._key(), arrays)
                self._pos += 1  # "]"
                self._note(table, line)
            else:
                names = self._key()
                self._skip(newlines=False)
                self._pos += 1  # "="
                self._note(table + names, line)
                self._value(table + names)

    @staticmethod
    def _resolve(names: tuple[str, ...], arrays: dict[Key, int]) -> Key:
        path: Key = ()
        for name in names:
            path += (name,)
            if path in arrays:
                path += (arrays[path] - 1,)
        return path

    def _key(self) -> tuple[str, ...]:
        names: list[str] = []
        while True:
            self._skip(newlines=False)
            if self._peek() in "\"'":
                start = self._pos
                self._string()
                names.append(tomllib.loads("k = " + self._text[start : self._pos])["k"])
            else:
                found = _BARE_KEY.match(self._text, self._pos)
                if found is None:
                    raise ValueError("bad key")
                names.append(found.group())
                self._pos = found.end()
            self._skip(newlines=False)
            if self._peek() != ".":
                return tuple(names)
            self._pos += 1

    def _value(self, path: Key) -> None:
        self._skip(newlines=False)
        ch = self._peek()
        if ch == "{":
            self._pos += 1
            while True:
                self._skip(newlines=True)  # TOML 1.1 allows newlines; be lenient
                if self._peek() == "}":
                    self._pos += 1
                    return
                line = self._line()
                names = self._key()
                self._skip(newlines=False)
                self._pos += 1  # "="
                self._note(path + names, line)
                self._value(path + names)
                self._skip(newlines=True)
                if self._peek() == ",":
                    self._pos += 1
        elif ch == "[":
            self._pos += 1
            item = 0
            while True:
                self._skip(newlines=True)
                if self._peek() == "]":
                    self._pos += 1
                    return
                self._note((*path, item), self._line())
                self._value((*path, item))
                item += 1
                self._skip(newlines=True)
                if self._peek() == ",":
                    self._pos += 1
        elif ch in "\"'":
            self._string()
        else:
            found = _SCALAR.match(self._text, self._pos)
            assert found is not None
            self._pos = found.end()

    def _string(self) -> None:
        text = self._text
        quote = text[self._pos]
        if text.startswith(quote * 3, self._pos):
            end = text.index(quote * 3, self._pos + 3)
            while quote == '"' and _escaped(text, end):
                end = text.index(quote * 3, end + 1)
            end += 3
            while text.startswith(quote, end):  # up to two quotes may close the string
                end += 1
            self._pos = end
            return
        end = self._pos + 1
        while text[end] != quote:
            end += 2 if quote == '"' and text[end] == "\\" else 1
        self._pos = end + 1


def _escaped(text: str, pos: int) -> bool:
    backslashes = 0
    while pos - backslashes - 1 >= 0 and text[pos - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1
