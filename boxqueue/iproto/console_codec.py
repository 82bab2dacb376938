"""The admin console's text protocol, sans-IO: bytes in, statements out; answers in, bytes out.

Framing is Tarantool's (``console.lua``'s ``client_read``): a statement ends with the session's
delimiter followed by ``\\n`` or ``\\r``; the delimiter is empty at first, so each line is one
statement. ``\\set delimiter X`` (or ``require('console').delimiter('X')``, as
``tarantoolctl connect`` sends ``$EOF$``) makes multi-line input possible. A line ``~.`` closes
the connection, like ssh. Lines starting with a backslash are console commands (``\\set``,
``\\help``, ``\\quit``, and ``\\login user password`` for this server's console login, also written
``require('console').login('user', 'password')`` for Tarantool's own console client).

Answers are YAML documents (see :mod:`boxqueue.iproto.console_yaml`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from boxqueue.iproto.console_yaml import error_document, values_document

__all__ = [
    "DELIMITER_STATEMENT",
    "LOGIN_STATEMENT",
    "Command",
    "ConsoleDecoder",
    "Statement",
    "StatementTooLong",
    "error_document",
    "parse_command",
    "values_document",
]

# The statement `tarantoolctl connect` sends to set its delimiter, recognised before login.
DELIMITER_STATEMENT = re.compile(
    r"""^\s*require\s*\(?\s*(["'])console\1\s*\)?\s*\.\s*delimiter\s*\(\s*(["'])(.*)\2\s*\)\s*;?\s*$"""
)


# The console's login as a Lua-looking statement: Tarantool's own console client (tarantoolctl,
# require('console').connect) refuses to send a backslash command it does not know, like \login.
LOGIN_STATEMENT = re.compile(
    r"""^\s*require\s*\(?\s*(["'])console\1\s*\)?\s*\.\s*login\s*\(\s*(["'])((?:(?!\2).)*)\2\s*"""
    r"""(?:,\s*(["'])((?:(?!\4).)*)\4\s*)?\)\s*;?\s*$"""
)


class StatementTooLong(Exception):
    """More bytes than the limit arrived without a delimiter: the peer is cut off."""


@dataclass(frozen=True)
class Statement:
    """Lua text to run."""

    text: str


@dataclass(frozen=True)
class Command:
    """A backslash command: its words, e.g. ``('set', 'delimiter', '!')``."""

    words: tuple[str, ...]


@dataclass(frozen=True)
class Close:
    """The peer asked to close (``~.``)."""


def parse_command(text: str) -> Command | None:
    if not text.startswith("\\"):
        return None
    return Command(tuple(text[1:].split()))


class ConsoleDecoder:
    """Splits the byte stream into statements with the current delimiter."""

    def __init__(self, max_statement_bytes: int = 16 * 1024 * 1024) -> None:
        self.delimiter = ""
        self.max_statement_bytes = max_statement_bytes
        self._buffer = bytearray()
        self._scanned = 0  # bytes already searched without finding an end
        self._skip_lf = False  # a statement ended with \r: a \n right after it belongs to it

    def feed(self, data: bytes) -> None:
        self._buffer += data
        if self._skip_lf and self._buffer:
            if self._buffer[:1] == b"\n":
                del self._buffer[:1]
            self._skip_lf = False

    def next_event(self) -> Statement | Command | Close | None:
        """The next complete statement, or ``None`` until more bytes arrive."""
        delimiter = self.delimiter.encode()
        buffer = self._buffer
        start = max(self._scanned - len(delimiter) - 1, 0)
        end = -1
        position = start
        while True:
            newline = _first_end(buffer, position)
            if newline < 0:
                break
            if buffer[newline - len(delimiter):newline] == delimiter and newline >= len(delimiter):
                end = newline
                break
            position = newline + 1
        if end < 0:
            self._scanned = len(buffer)
            if len(buffer) > self.max_statement_bytes:
                raise StatementTooLong(f"a statement longer than {self.max_statement_bytes} bytes")
            return None
        raw = bytes(buffer[: end - len(delimiter)])
        terminator = buffer[end : end + 1]
        del buffer[: end + 1]
        self._scanned = 0
        if terminator == b"\r":
            if buffer[:1] == b"\n":
                del buffer[:1]
            elif not buffer:
                self._skip_lf = True
        if raw == b"~.":
            return Close()
        text = raw.decode("utf-8", "surrogateescape")
        command = parse_command(text)
        if command is not None:
            return command
        return Statement(text)


def _first_end(buffer: bytearray, position: int) -> int:
    lf = buffer.find(b"\n", position)
    cr = buffer.find(b"\r", position)
    if lf < 0:
        return cr
    if cr < 0:
        return lf
    return min(lf, cr)
