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

The syntax is read by a parser of its own (it is not TOML); what it reads is validated by pydantic
models of the 1.5 shapes (``_File``, ``_Space``, ``_Index``, ``_KeyField``), whose errors are worded
as the TOML configuration's, and becomes the same ``SpaceConfig`` models the TOML file declares.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    Strict,
    ValidationError,
    model_validator,
)

from boxqueue.config_model import (
    INDEX_TYPES,
    Address,
    ConfigError,
    IndexConfig,
    Key,
    PartConfig,
    Section,
    SpaceConfig,
    config_error,
    default_index_name,
    dotted,
    index_problem,
    listener_clash,
    problem,
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
    return _read(source, parser.lines, parser.root)


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


def _is_array(value: Any) -> Any:
    if type(value) is not _Array:
        raise problem(f"{{key}} must be an array, not {_show(value)}")
    return value


def _dense(items: dict[int, Any]) -> dict[int, Any]:
    """An array that must be given as items 0, 1, 2... without gaps, and not empty."""
    if not items:
        raise problem("{key} is empty")
    for n in range(len(items)):
        if n not in items:
            raise problem(f"{{key}}[{n}] is missing")
    return items


def _flag(value: Any) -> Any:
    if value in (0, 1) and type(value) in (int, bool):
        return bool(value)
    raise problem(f"{{key}} must be 0 or 1, not {_show(value)}")


def _port(value: Any) -> Any:
    if type(value) is int and 0 <= value <= 65535:
        return value
    raise problem(f"bad port in {{key}}: {_show(value)}")


def _host(value: Any) -> Any:
    if value == "INADDR_ANY":
        return "0.0.0.0"
    if not isinstance(value, str):
        raise problem(f"{{key}} must be a string, not {_show(value)}")
    try:
        Address.parse(f"[{value}]:0" if ":" in value else f"{value}:0")
    except ValueError:
        raise problem(f"bad {{key}}: {_show(value)}") from None
    return value


def _index_type(value: Any) -> Any:
    if isinstance(value, str) and value.upper() in INDEX_TYPES:
        return value.upper()
    raise problem(f"unsupported index type in {{key}}: {_show(value)} (expected TREE or HASH)")


def _key_type(value: Any) -> Any:
    canonical = fieldtypes.normalize(value)
    if canonical is None or not fieldtypes.indexable(canonical):
        raise problem(f"unknown key type in {{key}}: {_show(value)} (expected STR, NUM or NUM64)")
    return canonical


def _fieldno(value: Any) -> Any:
    if type(value) is int and value >= 0:
        return value
    raise problem(f"{{key}} must be a field number, not {_show(value)}")


Flag = Annotated[bool, BeforeValidator(_flag)]
Port = Annotated[int, BeforeValidator(_port)]


Item = TypeVar("Item")
# An array of the cfg (an ``_Array``: ``space[3]`` may come without ``space[0..2]``).
Items = Annotated[dict[int, Item], BeforeValidator(_is_array)]


class _KeyField(Section):
    fieldno: Annotated[int, BeforeValidator(_fieldno)] = Field(description="the field's number, from 0")
    type: Annotated[str, BeforeValidator(_key_type)] = Field(description="STR, NUM or NUM64")


class _Index(Section):
    type: Annotated[str, BeforeValidator(_index_type)] = Field("TREE", description="TREE or HASH")
    unique: Flag = Field(True, description="0 or 1")
    key_field: Annotated[Items[_KeyField], AfterValidator(_dense)] = Field(description="the key parts")


class _Space(Section):
    enabled: Flag = Field(True, description="0: the space is skipped")
    cardinality: Annotated[int, Strict()] | None = Field(None, description="accepted, not used")
    arity: Annotated[int, Strict()] | None = Field(None, description="accepted, not used")
    estimated_rows: Annotated[int, Strict()] | None = Field(None, description="accepted, not used")
    index: Annotated[Items[_Index], AfterValidator(_dense)] = Field(description="the indexes, the primary key first")

    @model_validator(mode="after")
    def _index_rules(self) -> _Space:
        for position, index in enumerate(self.indexes()):
            trouble = index_problem(index, position)
            if trouble is not None:
                raise problem(f"{{path}}.index[{position}]: {trouble}", "index", position)
        return self

    def indexes(self) -> tuple[IndexConfig, ...]:
        return tuple(
            IndexConfig(
                name=default_index_name(position), type=raw.type, unique=raw.unique,
                parts=tuple(PartConfig(field=k.fieldno, type=k.type) for _, k in sorted(raw.key_field.items())),
            )
            for position, (_, raw) in enumerate(sorted(self.index.items()))
        )


class _File(Section):
    """A 1.5 file: its ports and spaces; its other options are accepted and ignored."""

    primary_port: Port = Field(0, description="the binary protocol; 0: off")
    secondary_port: Port = Field(0, description="the read-only port; 0: off")
    admin_port: Port = Field(0, description="the admin console; 0: off")
    bind_ipaddr: Annotated[str, BeforeValidator(_host)] = Field(DEFAULT_HOST, description="every port's host")
    space: Items[_Space] = Field(_Array(), description="spaces 0, 1, 2, ...")
    namespace: Items[_Space] = Field(_Array(), description="1.4's name for space")

    @model_validator(mode="before")
    @classmethod
    def _ignored(cls, value: Any) -> Any:
        return {k: v for k, v in value.items() if k not in IGNORED_OPTIONS} if isinstance(value, dict) else value

    def spaces(self) -> list[SpaceConfig]:
        out = []
        for items in (self.space, self.namespace):
            for number, entry in sorted(items.items()):
                if entry.enabled:
                    out.append(as_queue_space(SpaceConfig(id=number, name=f"space{number}", indexes=entry.indexes())))
        return out


def _read(file: str, lines: dict[Key, int], root: dict[str, Any]) -> TarantoolCfg:
    def line_of(path: Key) -> int | None:
        key = tuple(path)
        while key and key not in lines:
            key = key[:-1]
        return lines.get(key)

    try:
        cfg = _File.model_validate(root)
    except ValidationError as err:
        raise config_error(file, line_of, err) from None
    host = cfg.bind_ipaddr
    listen, read_only, admin = (
        Address(host, port) if port else None for port in (cfg.primary_port, cfg.secondary_port, cfg.admin_port)
    )
    clash = listener_clash([(("primary_port",), listen), (("secondary_port",), read_only), (("admin_port",), admin)])
    if clash is not None:
        key, other, _ = clash
        raise ConfigError(file, line_of(key), f"{dotted(key)} is the same port as {dotted(other)}", key=dotted(key))
    spaces = cfg.spaces()
    if len({s.id for s in spaces}) != len(spaces):
        message = "both space and namespace define the same space"
        raise ConfigError(file, line_of(("namespace",)), message, key="namespace")
    return TarantoolCfg(Path(file), listen, read_only, admin, spaces=tuple(spaces))


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
