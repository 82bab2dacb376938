"""The server's configuration: one typed, frozen value, loaded once at start.

The key names are a contract (``specs/config.md``) that other tools write to. ``load_config`` reads
a TOML file, or a Tarantool 1.5 style ``.cfg`` alone (see ``boxqueue.tarantool_cfg``). Every problem
is a ``ConfigError`` whose text names the file, the line and the key, for example
``conf/x.toml:7: unknown key 'lisen' in [iproto]``; the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spaces import fieldtypes

# --------------------------------------------------------------------------------------------
# The typed configuration
# --------------------------------------------------------------------------------------------

Key = tuple[str | int, ...]  # where a value is: ("space", 0, "indexes", 1, "parts", 0, "type")


@dataclass(frozen=True)
class Address:
    host: str
    port: int  # 0 asks the OS for an ephemeral port

    @classmethod
    def parse(cls, text: str) -> Address:
        """``host:port``, IPv6 hosts in brackets (``[::1]:3301``); raises ``AddressError``."""
        host, port_text = _split_host_port(text)
        if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
            raise AddressError("port", text)
        return cls(host, int(port_text))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class AddressError(ValueError):
    """A listen address that is not ``host:port`` (``part`` is "address") or has a bad port."""

    def __init__(self, part: str, text: str) -> None:
        super().__init__(f"bad {part}: {text!r}")
        self.part = part
        self.text = text


@dataclass(frozen=True)
class FieldConfig:
    name: str
    type: str
    is_nullable: bool = False


@dataclass(frozen=True)
class PartConfig:
    field: int  # 0-based
    type: str
    is_nullable: bool = False
    collation: str | None = None


@dataclass(frozen=True)
class IndexConfig:
    name: str
    type: str  # "TREE" | "HASH"
    unique: bool
    parts: tuple[PartConfig, ...]


@dataclass(frozen=True)
class SpaceConfig:
    id: int | None  # None: the server picks the next free id (512 and up)
    name: str
    engine: str
    format: tuple[FieldConfig, ...]
    indexes: tuple[IndexConfig, ...]
    temporary: bool = False


@dataclass(frozen=True)
class Grant:
    privileges: tuple[str, ...]  # among "read", "write", "execute", in that order
    object_type: str  # "universe" | "space" | "function"
    object_name: str | None = None  # None exactly for the universe


@dataclass(frozen=True)
class UserConfig:
    name: str
    password: str
    grants: tuple[Grant, ...]


@dataclass(frozen=True)
class IprotoConfig:
    listen: Address | None
    read_only_listen: Address | None
    admin_listen: Address | None
    max_packet_bytes: int = 16777216
    max_inflight_per_connection: int = 768


@dataclass(frozen=True)
class WalConfig:
    mode: str = "fsync"  # fsync | write | none


@dataclass(frozen=True)
class DeckardConfig:
    listen: Address
    default_ttl_minutes: int = 1440
    allow_flush: bool = True


@dataclass(frozen=True)
class ZaqarConfig:
    listen: Address


@dataclass(frozen=True)
class SonyaConfig:
    listen: Address
    max_key_updates: int | None = None
    service_token: str | None = None
    jwt_ttl_s: int = 60
    longpoll_max_wait_s: float = 30
    task_events: tuple[str, ...] = ()


@dataclass(frozen=True)
class Config:
    source: Path  # the file given, as given
    data_dir: Path  # absolute
    iproto: IprotoConfig
    wal: WalConfig
    guest_grants: tuple[Grant, ...] | None  # None: full rights while no users exist, else none
    users: tuple[UserConfig, ...]
    spaces: tuple[SpaceConfig, ...]  # ids ascending, then spaces without an id in file order
    tarantool_cfg: Path | None  # absolute; the 1.5 file the spaces came from, if any
    deckard: DeckardConfig | None  # None: facade off
    zaqar: ZaqarConfig | None
    sonya: SonyaConfig | None


DEFAULT_LISTEN = Address("127.0.0.1", 3301)
DEFAULT_DECKARD_LISTEN = Address("127.0.0.1", 8081)
DEFAULT_ZAQAR_LISTEN = Address("127.0.0.1", 8888)
DEFAULT_SONYA_LISTEN = Address("127.0.0.1", 8080)
DEFAULT_DATA_DIR = "data"
WAL_MODES = ("fsync", "write", "none")
ENGINES = ("memtx", "vinyl")
INDEX_TYPES = ("TREE", "HASH")
PRIVILEGES = ("read", "write", "execute")
OBJECT_TYPES = ("universe", "space", "function")
MAX_SPACE_ID = 2147483647


class ConfigError(Exception):
    """A configuration problem; ``str(err)`` is ``file:line: message`` (no line if unknown)."""

    def __init__(
        self, file: str, line: int | None, message: str, *, key: str | None = None,
        syntax: bool = False,
    ) -> None:
        super().__init__(f"{file}:{line}: {message}" if line else f"{file}: {message}")
        self.file = file
        self.line = line
        self.key = key
        self.message = message
        self.syntax = syntax  # the file could not be parsed at all


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_config(path: str | Path, data_dir_override: str | None = None) -> Config:
    """Load FILE: TOML, or a Tarantool 1.5 ``.cfg`` alone (by suffix, or when TOML fails)."""
    source = Path(path)
    text = read_text(source)
    if source.suffix == ".cfg":
        config = _from_tarantool_cfg(source, text)
    else:
        config = _from_toml_or_cfg(source, text)
    if data_dir_override is not None:
        config = replace(config, data_dir=_absolute(Path(data_dir_override)))
    return config


def read_text(path: Path) -> str:
    """The file's UTF-8 text, or a ``ConfigError`` naming the file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(str(path), None, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(str(path), None, "is a directory, not a file") from None
    except OSError as err:
        raise ConfigError(str(path), None, f"cannot read: {err.strerror or err}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError(str(path), line, "not UTF-8 text", syntax=True) from None


def _from_toml_or_cfg(source: Path, text: str) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        toml_error = _toml_syntax_error(str(source), err)
        try:
            return _from_tarantool_cfg(source, text)
        except ConfigError as cfg_error:
            # Readable as a 1.5 cfg with something else wrong: say that, unless it claims to be TOML.
            use_cfg = not cfg_error.syntax and source.suffix != ".toml"
            raise (cfg_error if use_cfg else toml_error) from None
    if source.suffix != ".toml" and _looks_like_tarantool_cfg(data):
        return _from_tarantool_cfg(source, text)
    return _TomlReader(str(source), text).config(source, data)


def _toml_syntax_error(file: str, err: tomllib.TOMLDecodeError) -> ConfigError:
    message = str(err)
    found = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if found is None:
        return ConfigError(file, None, f"cannot parse: {message}", syntax=True)
    detail = message[: found.start()]
    detail = detail[:1].lower() + detail[1:]
    return ConfigError(
        file, int(found.group(1)), f"cannot parse: {detail} (column {found.group(2)})",
        syntax=True,
    )


def _looks_like_tarantool_cfg(data: dict[str, Any]) -> bool:
    """Some 1.5 files are valid TOML too; their option names and space keys give them away."""
    from boxqueue import tarantool_cfg

    if not data or not set(data) <= tarantool_cfg.OPTIONS | {"space", "namespace"}:
        return False
    spaces = data.get("space", [])
    return not (
        isinstance(spaces, list)
        and any(isinstance(s, dict) and {"id", "name", "indexes"} & set(s) for s in spaces)
    )


def _from_tarantool_cfg(source: Path, text: str) -> Config:
    from boxqueue import tarantool_cfg

    legacy = tarantool_cfg.parse_tarantool_cfg(text, str(source))
    return Config(
        source=source,
        data_dir=_absolute(source.parent / DEFAULT_DATA_DIR),
        iproto=IprotoConfig(
            listen=legacy.listen or DEFAULT_LISTEN,
            read_only_listen=legacy.read_only_listen,
            admin_listen=legacy.admin_listen,
        ),
        wal=WalConfig(),
        guest_grants=None,
        users=(),
        spaces=_ordered(legacy.spaces),
        tarantool_cfg=_absolute(source),
        deckard=None,
        zaqar=None,
        sonya=None,
    )


def _absolute(path: Path) -> Path:
    """Absolute and without ``..`` (lexically, so a later chdir cannot change its meaning)."""
    return Path(os.path.abspath(path))


def _ordered(spaces: Sequence[SpaceConfig]) -> tuple[SpaceConfig, ...]:
    with_id = sorted((s for s in spaces if s.id is not None), key=lambda s: s.id or 0)
    return tuple(with_id) + tuple(s for s in spaces if s.id is None)


def _split_host_port(text: str) -> tuple[str, str]:
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise AddressError("address", text) from None
        if not sep:
            raise AddressError("address", text)
        return host, port
    host, sep, port = text.rpartition(":")
    if not sep or not re.fullmatch(r"[A-Za-z0-9._-]+", host):
        raise AddressError("address", text)
    return host, port


# --------------------------------------------------------------------------------------------
# Checks shared with the 1.5 cfg reader
# --------------------------------------------------------------------------------------------


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


def _compatible(declared: str, part: str) -> bool:
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


# --------------------------------------------------------------------------------------------
# Where each key is: tomllib gives no positions, so scan the (already valid) text once
# --------------------------------------------------------------------------------------------

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
        try:
            self._document()
        except (IndexError, ValueError, tomllib.TOMLDecodeError):
            pass  # best effort: lines found so far stay usable

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
                array = parent + (names[-1],)
                arrays[array] = arrays.get(array, 0) + 1
                table = array + (arrays[array] - 1,)
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
                self._note(path + (item,), self._line())
                self._value(path + (item,))
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


# --------------------------------------------------------------------------------------------
# Reading the TOML data into the typed configuration
# --------------------------------------------------------------------------------------------

_MISSING: Any = object()

_TOP = frozenset(
    {"data_dir", "tarantool_cfg", "iproto", "wal", "guest", "users", "space",
     "deckard", "zaqar", "sonya"}
)
_IPROTO = frozenset(
    {"listen", "read_only_listen", "admin_listen", "max_packet_bytes",
     "max_inflight_per_connection"}
)
_SPACE = frozenset({"id", "name", "engine", "format", "indexes", "temporary"})
_FIELD = frozenset({"name", "type", "is_nullable"})
_INDEX = frozenset({"name", "type", "unique", "parts"})
_PART = frozenset({"field", "type", "is_nullable", "collation"})
_USER = frozenset({"name", "password", "grants"})
_GRANT = frozenset({"privileges", "object_type", "object_name"})
_SONYA = frozenset(
    {"listen", "max_key_updates", "service_token", "jwt_ttl_s", "longpoll_max_wait_s",
     "task_events"}
)


class _TomlReader:
    """Checks and converts parsed TOML, failing with the file, line and key of the problem."""

    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self.lines = TomlLines(text)

    def fail(self, path: Key, message: str) -> ConfigError:
        return ConfigError(self.file, self.lines.line_of(path), message, key=dotted(path))

    # -- the document ------------------------------------------------------------------------

    def config(self, source: Path, data: dict[str, Any]) -> Config:
        from boxqueue import tarantool_cfg

        root = self.table(data, (), _TOP)
        folder = source.parent
        data_dir = _absolute(folder / self.name(root, (), "data_dir", DEFAULT_DATA_DIR))
        legacy = None
        legacy_path = None
        if "tarantool_cfg" in root:
            shown = Path(os.path.normpath(folder / self.name(root, (), "tarantool_cfg")))
            if not shown.is_file():
                raise self.fail(("tarantool_cfg",), f"tarantool_cfg: no such file: {shown}")
            legacy = tarantool_cfg.load_tarantool_cfg(shown)
            legacy_path = _absolute(shown)
        iproto = self.iproto(root)
        if legacy is not None:
            iproto = IprotoConfig(
                listen=iproto.listen or legacy.listen,
                read_only_listen=iproto.read_only_listen or legacy.read_only_listen,
                admin_listen=iproto.admin_listen or legacy.admin_listen,
                max_packet_bytes=iproto.max_packet_bytes,
                max_inflight_per_connection=iproto.max_inflight_per_connection,
            )
        if iproto.listen is None:
            iproto = replace(iproto, listen=DEFAULT_LISTEN)
        spaces = self.spaces(root)
        if legacy is not None:
            spaces = self.merge_spaces(legacy.spaces, spaces)
        config = Config(
            source=source,
            data_dir=data_dir,
            iproto=iproto,
            wal=self.wal(root),
            guest_grants=self.guest(root),
            users=self.users(root),
            spaces=_ordered(spaces),
            tarantool_cfg=legacy_path,
            deckard=self.deckard(root),
            zaqar=self.zaqar(root),
            sonya=self.sonya(root),
        )
        self.check_listeners(config)
        return config

    def check_listeners(self, config: Config) -> None:
        iproto = config.iproto
        clash = listener_clash(
            [
                (("iproto", "listen"), iproto.listen),
                (("iproto", "read_only_listen"), iproto.read_only_listen),
                (("iproto", "admin_listen"), iproto.admin_listen),
                (("deckard", "listen"), config.deckard.listen if config.deckard else None),
                (("zaqar", "listen"), config.zaqar.listen if config.zaqar else None),
                (("sonya", "listen"), config.sonya.listen if config.sonya else None),
            ]
        )
        if clash is not None:
            key, other, address = clash
            raise self.fail(key, f"{dotted(key)} and {dotted(other)} are both {address}")

    def iproto(self, root: dict[str, Any]) -> IprotoConfig:
        path: Key = ("iproto",)
        t = self.table(root.get("iproto", {}), path, _IPROTO)
        return IprotoConfig(
            listen=self.address(t, path, "listen", None),
            read_only_listen=self.address(t, path, "read_only_listen", None),
            admin_listen=self.address(t, path, "admin_listen", None),
            max_packet_bytes=self.integer(t, path, "max_packet_bytes", 16777216, minimum=1),
            max_inflight_per_connection=self.integer(
                t, path, "max_inflight_per_connection", 768, minimum=1
            ),
        )

    def wal(self, root: dict[str, Any]) -> WalConfig:
        path: Key = ("wal",)
        t = self.table(root.get("wal", {}), path, {"mode"})
        mode = self.string(t, path, "mode", "fsync")
        if mode not in WAL_MODES:
            raise self.fail(
                path + ("mode",), f"bad wal.mode: {show(mode)} (expected fsync, write or none)"
            )
        return WalConfig(mode)

    def guest(self, root: dict[str, Any]) -> tuple[Grant, ...] | None:
        if "guest" not in root:
            return None
        path: Key = ("guest",)
        t = self.table(root["guest"], path, {"grants"})
        return self.grants(t, path)

    def users(self, root: dict[str, Any]) -> tuple[UserConfig, ...]:
        users: list[UserConfig] = []
        for path, t in self.tables(root, (), "users", _USER):
            name = self.name(t, path, "name")
            if name == "guest":
                raise self.fail(path + ("name",), "guest is configured with [guest], not [[users]]")
            if any(u.name == name for u in users):
                raise self.fail(path + ("name",), f"duplicate user name {show(name)}")
            password = self.string(t, path, "password")
            users.append(UserConfig(name, password, self.grants(t, path)))
        return tuple(users)

    def grants(self, t: dict[str, Any], path: Key) -> tuple[Grant, ...]:
        grants = []
        for gpath, g in self.tables(t, path, "grants", _GRANT):
            privileges = self.strings(g, gpath, "privileges")
            for i, privilege in enumerate(privileges):
                if privilege not in PRIVILEGES:
                    raise self.fail(
                        gpath + ("privileges", i),
                        f"unknown privilege {show(privilege)} in {dotted(gpath)} "
                        "(expected read, write or execute)",
                    )
            if not privileges:
                raise self.fail(gpath + ("privileges",), f"{dotted(gpath)}.privileges is empty")
            object_type = self.string(g, gpath, "object_type")
            if object_type not in OBJECT_TYPES:
                raise self.fail(
                    gpath + ("object_type",),
                    f"bad object_type {show(object_type)} in {dotted(gpath)} "
                    "(expected universe, space or function)",
                )
            object_name = self.string(g, gpath, "object_name", None)
            if object_type == "universe" and object_name is not None:
                raise self.fail(
                    gpath + ("object_name",), f"{dotted(gpath)}: the universe has no object_name"
                )
            if object_type != "universe" and not object_name:
                raise self.fail(
                    gpath, f"{dotted(gpath)}: a {object_type} grant needs an object_name"
                )
            ordered = tuple(p for p in PRIVILEGES if p in privileges)
            grants.append(Grant(ordered, object_type, object_name))
        return tuple(grants)

    # -- spaces ------------------------------------------------------------------------------

    def spaces(self, root: dict[str, Any]) -> list[SpaceConfig]:
        spaces: list[SpaceConfig] = []
        for path, t in self.tables(root, (), "space", _SPACE):
            space = self.space(t, path)
            for other in spaces:
                if space.id is not None and other.id == space.id:
                    raise self.fail(path + ("id",), f"duplicate space id {space.id}")
                if other.name == space.name:
                    raise self.fail(path + ("name",), f"duplicate space name {show(space.name)}")
            spaces.append(space)
        return spaces

    def merge_spaces(
        self, legacy: Sequence[SpaceConfig], spaces: list[SpaceConfig]
    ) -> list[SpaceConfig]:
        """The 1.5 cfg's spaces, except those a ``[[space]]`` with the same id replaces."""
        ids = {s.id for s in spaces}
        merged = [s for s in legacy if s.id not in ids]
        for i, space in enumerate(spaces):
            clash = next((s for s in merged if s.name == space.name), None)
            if clash is not None:
                raise self.fail(
                    ("space", i, "name"),
                    f"space name {show(space.name)} is already space {clash.id} "
                    "of the tarantool_cfg file",
                )
        return merged + spaces

    def space(self, t: dict[str, Any], path: Key) -> SpaceConfig:
        space_id = self.integer(t, path, "id", None, minimum=0, maximum=MAX_SPACE_ID)
        if "name" in t or space_id is None:
            name = self.name(t, path, "name")
        else:
            name = f"space{space_id}"
        engine = self.string(t, path, "engine", "memtx")
        if engine not in ENGINES:
            raise self.fail(
                path + ("engine",), f"bad engine {show(engine)} in {dotted(path)} "
                "(expected memtx or vinyl)",
            )
        fmt = self.format(t, path)
        indexes: list[IndexConfig] = []
        for ipath, it in self.tables(t, path, "indexes", _INDEX):
            index = self.index(it, ipath, len(indexes), fmt)
            if any(i.name == index.name for i in indexes):
                raise self.fail(ipath + ("name",), f"duplicate index name {show(index.name)}")
            indexes.append(index)
        temporary = self.boolean(t, path, "temporary", False)
        return SpaceConfig(space_id, name, engine, fmt, tuple(indexes), temporary)

    def format(self, t: dict[str, Any], path: Key) -> tuple[FieldConfig, ...]:
        fields: list[FieldConfig] = []
        for fpath, ft in self.tables(t, path, "format", _FIELD):
            name = self.name(ft, fpath, "name")
            if any(f.name == name for f in fields):
                raise self.fail(fpath + ("name",), f"duplicate field name {show(name)}")
            ftype = self.field_type(ft, fpath, "type", "any")
            fields.append(FieldConfig(name, ftype, self.boolean(ft, fpath, "is_nullable", False)))
        return tuple(fields)

    def index(
        self, t: dict[str, Any], path: Key, position: int, fmt: tuple[FieldConfig, ...]
    ) -> IndexConfig:
        name = self.name(t, path, "name", default_index_name(position))
        itype = self.string(t, path, "type", "TREE").upper()
        if itype not in INDEX_TYPES:
            raise self.fail(
                path + ("type",), f"unsupported index type {show(t['type'])} in {dotted(path)} "
                "(expected TREE or HASH)",
            )
        unique = self.boolean(t, path, "unique", True)
        raw_parts = self.array(t, path, "parts")
        parts = tuple(self.part(p, path + ("parts", i), fmt) for i, p in enumerate(raw_parts))
        index = IndexConfig(name, itype, unique, parts)
        problem = index_problem(index, position)
        if problem is not None:
            raise self.fail(path, f"{dotted(path)}: {problem}")
        return index

    def part(self, raw: Any, path: Key, fmt: tuple[FieldConfig, ...]) -> PartConfig:
        if isinstance(raw, list):  # [field, "type"]
            if not 1 <= len(raw) <= 2:
                raise self.fail(path, f"{dotted(path)}: expected [field, \"type\"]")
            raw = {"field": raw[0], "type": raw[1]} if len(raw) == 2 else {"field": raw[0]}
        elif isinstance(raw, int | str) and not isinstance(raw, bool):  # a field alone
            raw = {"field": raw}
        t = self.table(raw, path, _PART)
        if "field" not in t:
            raise self.fail(path, f"missing key 'field' in {dotted(path)}")
        field = t["field"]
        if isinstance(field, str):
            names = [f.name for f in fmt]
            if field not in names:
                raise self.fail(path + ("field",), f"no field named {show(field)} in the format")
            field = names.index(field)
        elif type(field) is not int or field < 0:
            raise self.fail(
                path + ("field",),
                f"{dotted(path)}.field must be a field number (0-based) or name, "
                f"not {show(field)}",
            )
        declared = fmt[field] if field < len(fmt) else None
        ptype = self.field_type(t, path, "type", declared.type if declared else "unsigned")
        if not fieldtypes.indexable(ptype):
            raise self.fail(path + ("type",), f"{dotted(path)}: a {ptype} field cannot be indexed")
        if declared is not None and not _compatible(declared.type, ptype):
            raise self.fail(
                path + ("type",),
                f"{dotted(path)}: field {field} is {declared.type} in the format, not {ptype}",
            )
        nullable = self.boolean(t, path, "is_nullable", declared.is_nullable if declared else False)
        collation = self.string(t, path, "collation", None)
        if collation is not None:
            if ptype not in ("string", "scalar"):
                raise self.fail(
                    path + ("collation",), f"{dotted(path)}: only string parts have a collation"
                )
            if collation not in ("none", "binary") and not collation.startswith("unicode"):
                raise self.fail(path + ("collation",), f"unknown collation {show(collation)}")
        return PartConfig(field, ptype, nullable, collation)

    # -- facades -----------------------------------------------------------------------------

    def deckard(self, root: dict[str, Any]) -> DeckardConfig | None:
        if "deckard" not in root:
            return None
        path: Key = ("deckard",)
        t = self.table(root["deckard"], path, {"listen", "default_ttl_minutes", "allow_flush"})
        return DeckardConfig(
            listen=self.address(t, path, "listen", DEFAULT_DECKARD_LISTEN),
            default_ttl_minutes=self.integer(t, path, "default_ttl_minutes", 1440, minimum=1),
            allow_flush=self.boolean(t, path, "allow_flush", True),
        )

    def zaqar(self, root: dict[str, Any]) -> ZaqarConfig | None:
        if "zaqar" not in root:
            return None
        path: Key = ("zaqar",)
        t = self.table(root["zaqar"], path, {"listen"})
        return ZaqarConfig(listen=self.address(t, path, "listen", DEFAULT_ZAQAR_LISTEN))

    def sonya(self, root: dict[str, Any]) -> SonyaConfig | None:
        if "sonya" not in root:
            return None
        path: Key = ("sonya",)
        t = self.table(root["sonya"], path, _SONYA)
        token = self.string(t, path, "service_token", None)
        if token == "":
            raise self.fail(path + ("service_token",), "sonya.service_token is empty")
        return SonyaConfig(
            listen=self.address(t, path, "listen", DEFAULT_SONYA_LISTEN),
            max_key_updates=self.integer(t, path, "max_key_updates", None, minimum=1),
            service_token=token,
            jwt_ttl_s=self.integer(t, path, "jwt_ttl_s", 60, minimum=1),
            longpoll_max_wait_s=self.number(t, path, "longpoll_max_wait_s", 30.0, minimum=0),
            task_events=tuple(self.strings(t, path, "task_events", ())),
        )

    # -- typed getters -----------------------------------------------------------------------

    def table(self, value: Any, path: Key, allowed: frozenset[str] | set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"{dotted(path)} must be a table, not {show(value)}")
        for key in value:
            if key not in allowed:
                where = f" in [{path[0]}]" if len(path) == 1 else f" in {dotted(path)}" if path else ""
                raise self.fail(path + (key,), f"unknown key {key!r}{where}")
        return value

    def tables(
        self, t: dict[str, Any], path: Key, key: str, allowed: frozenset[str]
    ) -> list[tuple[Key, dict[str, Any]]]:
        """The items of an array of tables, each with its path."""
        items = self.array(t, path, key, [])
        out = []
        for i, item in enumerate(items):
            ipath = path + (key, i)
            out.append((ipath, self.table(item, ipath, allowed)))
        return out

    def get(self, t: dict[str, Any], path: Key, key: str, default: Any) -> Any:
        if key in t:
            return t[key]
        if default is _MISSING:
            where = f" in [{path[0]}]" if len(path) == 1 else f" in {dotted(path)}" if path else ""
            raise self.fail(path, f"missing key {key!r}{where}")
        return default

    def wrong(self, path: Key, key: str, what: str, value: Any) -> ConfigError:
        return self.fail(path + (key,), f"{dotted(path + (key,))} must be {what}, not {show(value)}")

    def string(self, t: dict[str, Any], path: Key, key: str, default: Any = _MISSING) -> Any:
        value = self.get(t, path, key, default)
        if key in t and not isinstance(value, str):
            raise self.wrong(path, key, "a string", value)
        return value

    def name(self, t: dict[str, Any], path: Key, key: str, default: Any = _MISSING) -> str:
        value = self.string(t, path, key, default)
        if not value:
            raise self.fail(path + (key,), f"{dotted(path + (key,))} is empty")
        return str(value)

    def strings(self, t: dict[str, Any], path: Key, key: str, default: Any = _MISSING) -> list[str]:
        values = self.array(t, path, key, default)
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise self.fail(
                    path + (key, i), f"{dotted(path + (key, i))} must be a string, not {show(value)}"
                )
        return list(values)

    def array(self, t: dict[str, Any], path: Key, key: str, default: Any = _MISSING) -> list[Any]:
        value = self.get(t, path, key, default)
        if not isinstance(value, list | tuple):
            raise self.wrong(path, key, "an array", value)
        return list(value)

    def boolean(self, t: dict[str, Any], path: Key, key: str, default: bool) -> bool:
        value = self.get(t, path, key, default)
        if not isinstance(value, bool):
            raise self.wrong(path, key, "true or false", value)
        return value

    def integer(
        self, t: dict[str, Any], path: Key, key: str, default: Any,
        minimum: int | None = None, maximum: int | None = None,
    ) -> Any:
        value = self.get(t, path, key, default)
        if key not in t:
            return value
        if type(value) is not int:
            raise self.wrong(path, key, "an integer", value)
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bounds = f"at least {minimum}" if maximum is None else f"{minimum}..{maximum}"
            raise self.fail(path + (key,), f"{dotted(path + (key,))} must be {bounds}, not {value}")
        return value

    def number(
        self, t: dict[str, Any], path: Key, key: str, default: float, minimum: float
    ) -> float:
        value = self.get(t, path, key, default)
        if type(value) not in (int, float) or value != value:
            raise self.wrong(path, key, "a number", value)
        if value < minimum:
            raise self.fail(path + (key,), f"{dotted(path + (key,))} must be at least {minimum}")
        return float(value)

    def address(self, t: dict[str, Any], path: Key, key: str, default: Any) -> Any:
        value = self.get(t, path, key, default)
        if key not in t:
            return value
        if not isinstance(value, str):
            raise self.wrong(path, key, 'a "host:port" string', value)
        try:
            return Address.parse(value)
        except AddressError as err:
            hint = "" if err.part == "port" else ' (expected "host:port", IPv6 as "[::1]:3301")'
            raise self.fail(
                path + (key,), f"bad {err.part} in {dotted(path + (key,))}: {show(value)}{hint}"
            ) from None

    def field_type(self, t: dict[str, Any], path: Key, key: str, default: str) -> str:
        value = self.get(t, path, key, default)
        canonical = fieldtypes.normalize(value)
        if canonical is None:
            raise self.fail(
                path + (key,), f"unknown field type in {dotted(path + (key,))}: {show(value)}"
            )
        return canonical
