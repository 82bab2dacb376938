"""Tarantool 1.5 style configuration files (``tarantool.cfg``): space definitions and ports.

Both styles real 1.5 configs use are read, and may be mixed:

* dotted: ``space[0].index[0].key_field[0].type = "NUM"``, one assignment per line;
* nested: ``space = [ { enabled = 1, index = [ { type = "TREE", ... } ] } ]`` over many lines,
  commas between items optional (the box.queue README leaves one out).

Comments start with ``#``. Space ``i`` becomes space id ``i`` named ``space<i>``; its indexes are
named ``primary``, ``i1``, ``i2``...; key types STR -> string, NUM/NUM64 -> unsigned. The other 1.5
options are accepted and ignored; an unknown key is an error.

Listeners: 1.5 bound every port to ``bind_ipaddr`` (default INADDR_ANY). Here the host is
``bind_ipaddr`` when the file sets it (``INADDR_ANY`` meaning 0.0.0.0) and 127.0.0.1 otherwise,
because this server gives guest full rights when no users are configured. A port of 0 (1.5's
"not set") leaves that listener off.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boxqueue.config_model import (
    INDEX_TYPES,
    Address,
    ConfigError,
    IndexConfig,
    Key,
    PartConfig,
    SpaceConfig,
    default_index_name,
    dotted,
    index_problem,
    listener_clash,
    read_text,
    show,
)
from boxqueue.spaces import fieldtypes

DEFAULT_HOST = "127.0.0.1"

# Accepted and ignored: Tarantool 1.4/1.5 options with no meaning here.
IGNORED_OPTIONS = frozenset(
    {
        "username", "local_hot_standby", "coredump", "replication_port", "log_level",
        "slab_alloc_arena", "slab_alloc_minimal", "slab_alloc_factor", "work_dir", "script_dir",
        "snap_dir", "wal_dir", "pid_file", "logger", "logger_nonblock", "io_collect_interval",
        "backlog", "readahead", "snap_io_rate_limit", "rows_per_wal", "wal_writer_inbox_size",
        "wal_mode", "wal_fsync_delay", "wal_dir_rescan_delay", "panic_on_snap_error",
        "panic_on_wal_error", "too_long_threshold", "custom_proc_title", "memcached",
        "memcached_port", "memcached_space", "memcached_namespace", "memcached_expire",
        "memcached_expire_per_loop", "memcached_expire_full_sweep", "replication_source",
        "remote_hot_standby", "wal_feeder_ipaddr", "wal_feeder_port", "wal_feeder_bind_ipaddr",
        "wal_feeder_bind_port",
    }
)
PORT_OPTIONS = ("primary_port", "secondary_port", "admin_port")
# Every top-level scalar option a 1.5 file may hold ("space" and "namespace" aside).
OPTIONS = IGNORED_OPTIONS | set(PORT_OPTIONS) | {"bind_ipaddr"}

_SPACE_KEYS = frozenset({"enabled", "cardinality", "arity", "estimated_rows", "index"})
_INDEX_KEYS = frozenset({"type", "unique", "key_field"})
_KEY_FIELD_KEYS = frozenset({"fieldno", "type"})


@dataclass(frozen=True)
class TarantoolCfg:
    source: Path
    listen: Address | None  # primary_port
    read_only_listen: Address | None  # secondary_port
    admin_listen: Address | None  # admin_port
    spaces: tuple[SpaceConfig, ...]


def load_tarantool_cfg(path: str | Path) -> TarantoolCfg:
    source = Path(path)
    return parse_tarantool_cfg(read_text(source), str(source))


def parse_tarantool_cfg(text: str, source: str) -> TarantoolCfg:
    """Read a 1.5 cfg's text; ``source`` names the file in errors."""
    parser = _Parser(source, text)
    parser.document()
    return _Reader(source, parser.lines).read(parser.root)


# --------------------------------------------------------------------------------------------
# Syntax: a tree of dicts (tables) and _Array (int-keyed dicts, possibly sparse), with lines
# --------------------------------------------------------------------------------------------


class _Array(dict[int, Any]):
    """An array of the cfg: ``space[3]`` may be given without ``space[0..2]``."""


_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\f\v\n]+)
  | (?P<comment>\#[^\n]*)
  | (?P<number>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)(?![A-Za-z0-9_])
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<punct>[=,.\[\]{}])
    """,
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}


@dataclass(frozen=True)
class _Token:
    kind: str  # number | name | string | punct | end
    text: str
    line: int


def _tokens(file: str, text: str) -> Iterator[_Token]:
    pos, line = 0, 1
    while pos < len(text):
        found = _TOKEN.match(text, pos)
        if found is None:
            if text[pos] in "\"'":
                raise _syntax(file, line, "unterminated string")
            raise _syntax(file, line, f"unexpected character {text[pos]!r}")
        kind = found.lastgroup or ""
        if kind not in ("space", "comment"):
            yield _Token(kind, found.group(), line)
        line += found.group().count("\n")
        pos = found.end()
    yield _Token("end", "", line)


def _syntax(file: str, line: int, message: str) -> ConfigError:
    return ConfigError(file, line, f"cannot parse: {message}", syntax=True)


class _Parser:
    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self.tokens = list(_tokens(file, text))
        self.i = 0
        self.root: dict[str, Any] = {}
        self.lines: dict[Key, int] = {}

    def document(self) -> None:
        while self.peek().kind != "end":
            line = self.peek().line
            path = self.path()
            self.expect("=")
            self.value(path, line)

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        if token.kind != "end":
            self.i += 1
        return token

    def accept(self, punct: str) -> bool:
        token = self.peek()
        if token.kind == "punct" and token.text == punct:
            self.i += 1
            return True
        return False

    def expect(self, punct: str) -> None:
        if not self.accept(punct):
            raise self.unexpected(f"expected '{punct}'")

    def unexpected(self, wanted: str) -> ConfigError:
        token = self.peek()
        found = "end of file" if token.kind == "end" else repr(token.text)
        return _syntax(self.file, token.line, f"{wanted}, found {found}")

    def path(self) -> Key:
        """``name ( .name | [number] )*``"""
        path: Key = (self.name("expected a key"),)
        while True:
            if self.accept("."):
                path += (self.name("expected a key after '.'"),)
            elif self.accept("["):
                token = self.peek()
                if token.kind != "number" or not token.text.isdigit():
                    raise self.unexpected("expected an array index")
                self.take()
                path += (int(token.text),)
                self.expect("]")
            else:
                return path

    def name(self, wanted: str) -> str:
        token = self.peek()
        if token.kind != "name":
            raise self.unexpected(wanted)
        return self.take().text

    def value(self, path: Key, line: int) -> None:
        token = self.peek()
        if token.kind not in ("number", "string", "name") and token.text not in ("[", "{"):
            raise self.unexpected(f"expected a value for {dotted(path)}")
        self.take()
        if token.kind == "punct" and token.text == "[":
            self.container(path, _Array, line)
            item = 0
            while not self.accept("]"):
                if self.peek().kind == "end":
                    raise self.unexpected(f"expected ']' to close {dotted(path)}")
                self.value((*path, item), self.peek().line)
                item += 1
                self.accept(",")
        elif token.kind == "punct" and token.text == "{":
            self.container(path, dict, line)
            while not self.accept("}"):
                member_line = self.peek().line
                member = self.path()
                self.expect("=")
                self.value(path + member, member_line)
                self.accept(",")
        else:
            self.assign(path, _scalar(token), line)

    def container(self, path: Key, kind: type, line: int) -> Any:
        """The table or array at ``path``, created (with its parents) if needed."""
        node: Any = self.root
        for n, segment in enumerate(path):
            wanted = kind if n == len(path) - 1 else (
                _Array if isinstance(path[n + 1], int) else dict
            )
            child = node.get(segment)
            if child is None:
                child = node[segment] = wanted()
                self.lines.setdefault(path[: n + 1], line)
            elif type(child) is not wanted:
                raise _syntax(self.file, line, f"{dotted(path[: n + 1])} is given twice")
            node = child
        return node

    def assign(self, path: Key, value: Any, line: int) -> None:
        parent = self.container(path[:-1], _Array if isinstance(path[-1], int) else dict, line)
        if path[-1] in parent:
            raise _syntax(self.file, line, f"{dotted(path)} is given twice")
        parent[path[-1]] = value
        self.lines[path] = line


def _show(value: Any) -> str:
    return "an array" if type(value) is _Array else show(value)


def _scalar(token: _Token) -> Any:
    if token.kind == "number":
        text = token.text
        return int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)
    if token.kind == "string":
        return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), token.text[1:-1])
    lowered = token.text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    return token.text  # a bare word, e.g. type = TREE


# --------------------------------------------------------------------------------------------
# Meaning
# --------------------------------------------------------------------------------------------


class _Reader:
    def __init__(self, file: str, lines: dict[Key, int]) -> None:
        self.file = file
        self.lines = lines

    def fail(self, path: Key, message: str) -> ConfigError:
        key = tuple(path)
        while key and key not in self.lines:
            key = key[:-1]
        return ConfigError(self.file, self.lines.get(key), message, key=dotted(path))

    def read(self, root: dict[str, Any]) -> TarantoolCfg:
        spaces: list[SpaceConfig] = []
        for key, value in root.items():
            if key in ("space", "namespace"):
                spaces += self.spaces(value, (key,))
            elif key not in OPTIONS:
                raise self.fail((key,), f"unknown key {key!r}")
        host = self.host(root)
        listen, read_only, admin = (self.listener(root, key, host) for key in PORT_OPTIONS)
        clash = listener_clash([(("primary_port",), listen), (("secondary_port",), read_only), (("admin_port",), admin)])
        if clash is not None:
            raise self.fail(clash[0], f"{dotted(clash[0])} is the same port as {dotted(clash[1])}")
        ids = [s.id for s in spaces]
        if len(set(ids)) != len(ids):
            raise self.fail(("namespace",), "both space and namespace define the same space")
        return TarantoolCfg(Path(self.file), listen, read_only, admin, spaces=tuple(spaces))

    def host(self, root: dict[str, Any]) -> str:
        value = root.get("bind_ipaddr", DEFAULT_HOST)
        if value == "INADDR_ANY":
            return "0.0.0.0"
        if not isinstance(value, str):
            raise self.fail(("bind_ipaddr",), f"bind_ipaddr must be a string, not {_show(value)}")
        try:
            Address.parse(f"[{value}]:0" if ":" in value else f"{value}:0")
        except ValueError:
            raise self.fail(("bind_ipaddr",), f"bad bind_ipaddr: {_show(value)}") from None
        return value

    def listener(self, root: dict[str, Any], key: str, host: str) -> Address | None:
        value = root.get(key, 0)
        if type(value) is not int or not 0 <= value <= 65535:
            raise self.fail((key,), f"bad port in {key}: {_show(value)}")
        return Address(host, value) if value else None

    def spaces(self, value: Any, path: Key) -> list[SpaceConfig]:
        out = []
        for number, entry in sorted(self.array(value, path).items()):
            space = self.space(entry, (*path, number), number)
            if space is not None:
                out.append(space)
        return out

    def space(self, entry: Any, path: Key, number: int) -> SpaceConfig | None:
        t = self.table(entry, path, _SPACE_KEYS)
        if not self.flag(t, path, "enabled", True):
            return None
        for key in ("cardinality", "arity", "estimated_rows"):
            if key in t and type(t[key]) is not int:
                raise self.fail((*path, key), f"{dotted((*path, key))} must be an integer")
        if "index" not in t:
            raise self.fail(path, f"{dotted(path)}: missing key 'index'")
        indexes = self.dense(t["index"], (*path, "index"))
        return as_queue_space(
            SpaceConfig(
                id=number,
                name=f"space{number}",
                engine="memtx",
                format=(),
                indexes=tuple(self.index(raw, (*path, "index", i), i) for i, raw in enumerate(indexes)),
            )
        )

    def index(self, entry: Any, path: Key, position: int) -> IndexConfig:
        t = self.table(entry, path, _INDEX_KEYS)
        itype = t.get("type", "TREE")
        if not isinstance(itype, str) or itype.upper() not in INDEX_TYPES:
            raise self.fail(
                (*path, "type"),
                f"unsupported index type in {dotted(path)}.type: {_show(itype)} "
                "(expected TREE or HASH)",
            )
        if "key_field" not in t:
            raise self.fail(path, f"{dotted(path)}: missing key 'key_field'")
        key_fields = self.dense(t["key_field"], (*path, "key_field"))
        parts = tuple(self.part(raw, (*path, "key_field", i)) for i, raw in enumerate(key_fields))
        index = IndexConfig(
            name=default_index_name(position), type=itype.upper(), unique=self.flag(t, path, "unique", True),
            parts=parts,
        )
        problem = index_problem(index, position)
        if problem is not None:
            raise self.fail(path, f"{dotted(path)}: {problem}")
        return index

    def part(self, entry: Any, path: Key) -> PartConfig:
        t = self.table(entry, path, _KEY_FIELD_KEYS)
        for key in ("fieldno", "type"):
            if key not in t:
                raise self.fail(path, f"{dotted(path)}: missing key {key!r}")
        fieldno = t["fieldno"]
        if type(fieldno) is not int or fieldno < 0:
            raise self.fail(
                (*path, "fieldno"), f"{dotted(path)}.fieldno must be a field number, "
                f"not {_show(fieldno)}",
            )
        ftype = fieldtypes.normalize(t["type"])
        if ftype is None or not fieldtypes.indexable(ftype):
            raise self.fail(
                (*path, "type"),
                f"unknown key type in {dotted(path)}.type: {_show(t['type'])} "
                "(expected STR, NUM or NUM64)",
            )
        return PartConfig(field=fieldno, type=ftype)

    # -- shapes ------------------------------------------------------------------------------

    def table(self, value: Any, path: Key, allowed: frozenset[str]) -> dict[str, Any]:
        if type(value) is not dict:
            raise self.fail(path, f"{dotted(path)} must be a table, not {_show(value)}")
        for key in value:
            if key not in allowed:
                raise self.fail((*path, key), f"unknown key {key!r} in {dotted(path)}")
        return value

    def array(self, value: Any, path: Key) -> _Array:
        if type(value) is not _Array:
            raise self.fail(path, f"{dotted(path)} must be an array, not {_show(value)}")
        return value

    def dense(self, value: Any, path: Key) -> list[Any]:
        """An array that must be given as items 0, 1, 2... without gaps, and not empty."""
        items = self.array(value, path)
        if not items:
            raise self.fail(path, f"{dotted(path)} is empty")
        for n in range(len(items)):
            if n not in items:
                raise self.fail(path, f"{dotted((*path, n))} is missing")
        return [items[n] for n in range(len(items))]

    def flag(self, t: dict[str, Any], path: Key, key: str, default: bool) -> bool:
        value = t.get(key, default)
        if value in (0, 1) and type(value) in (int, bool):
            return bool(value)
        raise self.fail((*path, key), f"{dotted((*path, key))} must be 0 or 1, not {_show(value)}")


# The box.queue layout (field numbers per index) and the msgpack-era type of each of its fields:
# 1.5 packed ipri and pri into one-byte strings so a STR index sorted them; the tube engine stores
# numbers, and the put_unique index's data field may be absent or of any scalar type (D4).
_QUEUE_LAYOUT = ((0,), (1, 2, 4, 5), (1, 3), (1, 2, 12))
_QUEUE_TYPES = {0: "string", 1: "string", 2: "string", 3: "unsigned", 4: "unsigned", 5: "unsigned"}


def as_queue_space(space: SpaceConfig) -> SpaceConfig:
    """A 1.5 space laid out for box.queue gets the types the tube engine stores; others as is."""
    layout = tuple(tuple(p.field for p in index.parts) for index in space.indexes)
    if layout not in (_QUEUE_LAYOUT[:3], _QUEUE_LAYOUT):
        return space
    indexes = []
    for index in space.indexes:
        parts = []
        for part in index.parts:
            if part.field == 12:
                parts.append(part.model_copy(update={"type": "scalar", "is_nullable": True}))
            else:
                parts.append(part.model_copy(update={"type": _QUEUE_TYPES[part.field]}))
        indexes.append(index.model_copy(update={"parts": tuple(parts)}))
    return space.model_copy(update={"indexes": tuple(indexes)})
