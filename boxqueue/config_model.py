"""The configuration, declared once: every section and key with its type, default, bounds and meaning.

The models are pydantic v2 models, frozen, refusing unknown keys. They are both what a TOML file is
validated into and what the server reads at run time; ``docs/configuration.md`` is generated from
these declarations (``boxqueue.config_reference``), and a test fails when the two disagree.

Checks that a type cannot express (a HASH index must be unique, two listeners on one port, a
replica set's own uri) are validators here too. They raise ``problem(...)``: a pydantic error of
type ``boxqueue`` whose text may name the key (``{key}``, the dotted path of the value, or
``{path}``, the dotted path of the table that raised it); ``at`` is where, under that table, the
line of the problem is. ``boxqueue.config`` turns errors into ``file:line: message``.

Relative paths (the data directory, TLS files, the 1.5 cfg) are relative to the folder given as
validation context (``{"folder": ...}``); without one, to the working directory.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from boxqueue.spaces import fieldtypes

Key = tuple[str | int, ...]  # where a value is: ("space", 0, "indexes", 1, "parts", 0, "type")

DEFAULT_DATA_DIR = "data"
MAX_SPACE_ID = 2147483647
WAL_MODES = ("fsync", "write", "none")
ENGINES = ("memtx", "vinyl")
INDEX_TYPES = ("TREE", "HASH")
PRIVILEGES = ("read", "write", "execute")
OBJECT_TYPES = ("universe", "space", "function")


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


def problem(text: str, *at: str | int) -> PydanticCustomError:
    """A rule's failure: ``text`` may hold ``{key}`` (the value's dotted path, ``at`` included) and
    ``{path}`` (the dotted path of the table whose validator found it)."""
    return PydanticCustomError("boxqueue", "{text}", {"text": text, "at": tuple(at)})


# -- pydantic's errors in our words ---------------------------------------------------------------


def config_error(file: str, line_of: Callable[[Key], int | None], err: ValidationError) -> ConfigError:
    """The problem that comes first in the file, worded as the rest of the server words them;
    ``line_of`` says where a key is in the file (pydantic knows no lines)."""
    found = [(e["type"] != "extra_forbidden", _where(e), _message(e)) for e in err.errors(include_url=False)]
    # An unknown key first (a misspelt key also makes the right one missing), then by line.
    (_, path, message) = min(found, key=lambda f: (f[0], line_of(f[1]) or 1 << 30))
    return ConfigError(file, line_of(path), message, key=dotted(path))


def _where(error: ErrorDetails) -> Key:
    return tuple(error["loc"]) + tuple((error.get("ctx") or {}).get("at", ()))


def _message(error: ErrorDetails) -> str:
    loc = tuple(error["loc"])
    kind = error["type"]
    value = error["input"]
    ctx = error.get("ctx") or {}
    key = dotted(loc)
    if kind == "boxqueue":
        return str(ctx["text"]).replace("{key}", dotted(_where(error))).replace("{path}", key)
    if kind in ("extra_forbidden", "missing"):
        parent = loc[:-1]
        where = f" in [{parent[0]}]" if len(parent) == 1 else f" in {dotted(parent)}" if parent else ""
        verb = "unknown" if kind == "extra_forbidden" else "missing"
        return f"{verb} key {loc[-1]!r}{where}"
    if kind == "greater_than_equal":
        bound = ctx["ge"]
        if isinstance(bound, float):  # a number of seconds: the bound as written
            return f"{key} must be at least {bound:g}"
        return f"{key} must be at least {bound}, not {value}"
    if kind == "literal_error":
        return f"bad {key}: {show(value)} (expected {ctx['expected'].replace(chr(39), '')})"
    wanted = _WANTED.get(kind)
    if wanted is not None:
        return f"{key} must be {wanted}, not {show(value)}"
    return f"{key}: {error['msg']}"


_WANTED = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "finite_number": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "dict_type": "a table",
    "tuple_type": "an array",
    "list_type": "an array",
}


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
    if isinstance(value, list | tuple):
        return "an array"
    return str(value)


def absolute_path(path: Path) -> Path:
    """Absolute and without ``..`` (lexically, so a later chdir cannot change its meaning)."""
    return Path(os.path.abspath(path))


def _folder(info: ValidationInfo) -> Path:
    context = info.context or {}
    return Path(context.get("folder", "."))


def _repeat(items: Sequence[Any], key: Callable[[Any], Any]) -> int | None:
    """The position of the first item whose ``key`` an earlier item already has (None: all differ)."""
    seen: set[Any] = set()
    for i, item in enumerate(items):
        if key(item) in seen:
            return i
        seen.add(key(item))
    return None


def _settle(model: BaseModel, **values: Any) -> None:
    """Set fields of a frozen model while its own validator runs (resolved defaults)."""
    for name, value in values.items():
        object.__setattr__(model, name, value)


# -- addresses ---------------------------------------------------------------------------------


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


def _address(value: Any) -> Any:
    if isinstance(value, Address):
        return value
    if not isinstance(value, str):
        raise problem('{key} must be a "host:port" string, not ' + show(value))
    try:
        return Address.parse(value)
    except AddressError as err:
        hint = "" if err.part == "port" else ' (expected "host:port", IPv6 as "[::1]:3301")'
        raise problem(f"bad {err.part} in {{key}}: {show(value)}{hint}") from None


# -- value types -------------------------------------------------------------------------------


def _non_empty(value: str) -> str:
    if not value:
        raise problem("{key} is empty")
    return value


def _visible_ascii(value: str) -> str:
    if not value or not all(0x21 <= ord(c) <= 0x7E for c in value):
        raise problem("{key} must be non-empty visible ASCII (it is sent in a header)")
    return value


def _usable_space_name(value: str) -> str:
    if not value or len(value) > 64 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise problem(f"{{key}} is not a usable space name: {show(value)}")
    return value


def _field_type(value: Any) -> str:
    canonical = fieldtypes.normalize(value)
    if canonical is None:
        raise problem(f"unknown field type in {{key}}: {show(value)}")
    return canonical


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


ListenAddress = Annotated[Address, BeforeValidator(_address)]
Text = Annotated[str, Strict()]
Name = Annotated[str, Strict(), AfterValidator(_non_empty)]
Token = Annotated[str, Strict(), AfterValidator(_visible_ascii)]
SpaceName = Annotated[str, Strict(), AfterValidator(_usable_space_name)]
FieldType = Annotated[str, BeforeValidator(_field_type)]
Flag = Annotated[bool, Strict()]
Count = Annotated[int, Strict(), Field(ge=1)]
Seconds = Annotated[float, Strict(), Field(allow_inf_nan=False)]


class Section(BaseModel):
    """A table of the file: unknown keys are refused, values are frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# -- TLS ---------------------------------------------------------------------------------------


def _given_path(value: Any, info: ValidationInfo) -> Path:
    """A path the file names (a non-empty string), relative to the file's folder."""
    if not isinstance(value, str):
        raise problem("{key} must be a string, not " + show(value))
    if not value:
        raise problem("{key} is empty")
    return _folder(info) / value


def _readable_file(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, Path):
        return value
    found = absolute_path(_given_path(value, info))
    if not os.access(found, os.R_OK) or not found.is_file():
        raise problem(f"{{key}}: cannot read {found}")
    return found


ReadableFile = Annotated[Path, BeforeValidator(_readable_file)]


class TlsConfig(Section):
    """A listener's TLS: its certificate chain and key; with ``ca_file``, clients must present a
    certificate signed by it."""

    cert_file: ReadableFile = Field(description="the certificate chain (PEM)")
    key_file: ReadableFile = Field(description="its private key (PEM)")
    ca_file: ReadableFile | None = Field(
        None, description="set: clients must present a certificate signed by this CA"
    )
    ciphers: Text | None = Field(None, description="an OpenSSL cipher list")

    @field_validator("ciphers")
    @classmethod
    def _no_empty_ciphers(cls, value: str | None) -> str | None:
        return value or None


class DeckardTlsConfig(TlsConfig):
    """Deckard's TLS, which may check a client certificate only when one is given."""

    client_auth: Literal["require", "optional"] = Field(
        "require",
        description="with `ca_file`: `require` a client certificate, or check it only when one is "
        "given (`optional`, Deckard's VerifyClientCertIfGiven)",
    )

    @model_validator(mode="after")
    def _client_auth_needs_ca(self) -> DeckardTlsConfig:
        if "client_auth" in self.model_fields_set and self.ca_file is None:
            raise problem("{key} needs ca_file", "client_auth")
        return self


# -- the sections ------------------------------------------------------------------------------


class IprotoConfig(Section):
    """Tarantool's binary protocol and the admin console."""

    listen: ListenAddress | None = Field(
        None, description='Tarantool\'s binary protocol; absent: the 1.5 cfg\'s `primary_port`, else "127.0.0.1:3301"'
    )
    read_only_listen: ListenAddress | None = Field(
        None, description="a second port that serves reads only; writes there fail with ER_READONLY (7)"
    )
    admin_listen: ListenAddress | None = Field(None, description="the admin console (Lua, YAML answers)")
    max_packet_bytes: Count = Field(16777216, description="a longer length prefix is refused")
    max_inflight_per_connection: Count = Field(
        768, description="requests a connection may have unanswered before it stops being read "
        "(Tarantool's `net_msg_max`)"
    )
    tls: TlsConfig | None = Field(
        None, description="TLS on every iproto listener (as Tarantool Enterprise's ssl transport)"
    )
    max_connections: Count | None = Field(
        None, description="per listener; beyond it a connection is closed before the greeting"
    )
    max_waiting_takes_per_connection: Count = Field(
        512, description="takes (calls that wait) a connection may have waiting at once"
    )


class WalConfig(Section):
    """Durability: the write-ahead log in front of LMDB."""

    mode: Literal["fsync", "write", "none"] = Field(
        "fsync", description="`fsync`: every acknowledged write is in the log and flushed; "
        "`write`: written, not flushed; `none`: no log"
    )
    checkpoint_interval_s: Seconds = Field(
        5.0, ge=0.001, description="LMDB is flushed and the log it holds deleted this often ..."
    )
    checkpoint_bytes: Annotated[int, Strict()] = Field(
        16 << 20, ge=4096, description="... or as soon as the log's current segment is this big"
    )


class LuaConfig(Section):
    """Limits of the embedded Lua: the admin console, EVAL and Lua functions called over CALL."""

    time_limit_s: Seconds = Field(
        5.0, ge=0.001, description="Lua run time of one statement, chunk or call (waits excluded)"
    )
    memory_limit_bytes: Annotated[int, Strict()] = Field(
        268435456, ge=1048576, description="everything the Lua runtime allocates"
    )


class Grant(Section):
    """Privileges on the universe, or on one space or function."""

    privileges: tuple[Literal["read", "write", "execute"], ...] = Field(
        description="among read, write and execute"
    )
    object_type: Literal["universe", "space", "function"] = Field(description="what is granted")
    object_name: Text | None = Field(None, description="the space or function; none for the universe")

    @model_validator(mode="after")
    def _consistent(self) -> Grant:
        if not self.privileges:
            raise problem("{key} is empty", "privileges")
        if self.object_type == "universe" and self.object_name is not None:
            raise problem("{path}: the universe has no object_name", "object_name")
        if self.object_type != "universe" and not self.object_name:
            raise problem(f"{{path}}: a {self.object_type} grant needs an object_name")
        _settle(self, privileges=tuple(p for p in PRIVILEGES if p in self.privileges))
        return self


class GuestConfig(Section):
    """The guest's rights: everything while no `[[users]]` exist, else only what is granted here."""

    grants: tuple[Grant, ...] = Field((), description="the guest's grants")


class UserConfig(Section):
    """A user who logs in with chap-sha1."""

    name: Name = Field(description="the login")
    password: Text = Field(description="checked with chap-sha1")
    grants: tuple[Grant, ...] = Field((), description="read on the universe also gives Tarantool's `replication` role")

    @field_validator("name")
    @classmethod
    def _not_guest(cls, value: str) -> str:
        if value == "guest":
            raise problem("guest is configured with [guest], not [[users]]")
        return value


# -- spaces ------------------------------------------------------------------------------------


class FieldConfig(Section):
    """A field of a space's format."""

    name: Name = Field(description="the field's name")
    type: FieldType = Field("any", description="a Tarantool field type (`unsigned`, `string`, ...)")
    is_nullable: Flag = Field(False, description="whether nil is allowed")


def _part_shape(value: Any) -> Any:
    """``[field, "type"]`` and a field alone are short for ``{ field, type }``."""
    if isinstance(value, list | tuple):
        if not 1 <= len(value) <= 2:
            raise problem('{key}: expected [field, "type"]')
        return {"field": value[0], "type": value[1]} if len(value) == 2 else {"field": value[0]}
    if isinstance(value, int | str) and not isinstance(value, bool):
        return {"field": value}
    return value


def _part_field(value: Any) -> Any:
    if isinstance(value, str) or (type(value) is int and value >= 0):
        return value
    raise problem(f"{{key}} must be a field number (0-based) or name, not {show(value)}")


class PartConfig(Section):
    """A key part of an index: ``[field, "type"]``, a field alone, or a table."""

    # A field's name is kept as given until its space resolves it to the number the type says.
    field: Annotated[int, PlainValidator(_part_field)] = Field(
        description="the field's number (0-based) or its name in the format"
    )
    type: FieldType = Field("", description="absent: the format's type of the field, else `unsigned`")
    is_nullable: Flag = Field(False, description="absent: as the format says")
    collation: Text | None = Field(None, description="string parts: `none`, `binary` or `unicode...`")

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, value: Any) -> Any:
        return _part_shape(value)


class IndexConfig(Section):
    """An index of a space."""

    name: Name = Field("", description='absent: "primary" for the first, else "i1", "i2", ...')
    type: Annotated[Literal["TREE", "HASH"], BeforeValidator(_upper)] = Field(
        "TREE", description="`TREE` or `HASH`"
    )
    unique: Flag = Field(True, description="whether keys are unique")
    parts: tuple[PartConfig, ...] = Field(description="the key parts")


def default_index_name(position: int) -> str:
    return "primary" if position == 0 else f"i{position}"


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


class SpaceConfig(Section):
    """A space declared in the file (besides those of a 1.5 cfg)."""

    id: Annotated[int, Strict()] | None = Field(None, description="absent: the next free id from 512")
    name: Name = Field(description='absent with an id: "space<id>"')
    engine: Literal["memtx", "vinyl"] = Field("memtx", description="`memtx` or `vinyl` (both stored in LMDB)")
    format: tuple[FieldConfig, ...] = Field((), description="the fields: `{ name, type, is_nullable }`")
    indexes: tuple[IndexConfig, ...] = Field((), description="the indexes; the first is the primary key")
    temporary: Flag = Field(False, description="kept in memory only, as Tarantool's temporary spaces")

    @model_validator(mode="before")
    @classmethod
    def _name_from_id(cls, value: Any) -> Any:
        if isinstance(value, dict) and "name" not in value and type(value.get("id")) is int:
            return {**value, "name": f"space{value['id']}"}
        return value

    @field_validator("id")
    @classmethod
    def _id_range(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= MAX_SPACE_ID:
            raise problem(f"{{key}} must be 0..{MAX_SPACE_ID}, not {value}")
        return value

    @field_validator("format")
    @classmethod
    def _unique_fields(cls, fields: tuple[FieldConfig, ...]) -> tuple[FieldConfig, ...]:
        i = _repeat(fields, lambda f: f.name)
        if i is not None:
            raise problem(f"duplicate field name {show(fields[i].name)}", i, "name")
        return fields

    @model_validator(mode="after")
    def _resolve_indexes(self) -> SpaceConfig:
        indexes: list[IndexConfig] = []
        for position, index in enumerate(self.indexes):
            at = ("indexes", position)
            parts = tuple(self._resolve_part(p, (*at, "parts", n)) for n, p in enumerate(index.parts))
            name = index.name or default_index_name(position)
            if any(i.name == name for i in indexes):
                raise problem(f"duplicate index name {show(name)}", *at, "name")
            resolved = index.model_copy(update={"name": name, "parts": parts})
            trouble = index_problem(resolved, position)
            if trouble is not None:
                raise problem(f"{{path}}.{dotted(at)}: {trouble}", *at)
            indexes.append(resolved)
        _settle(self, indexes=tuple(indexes))
        return self

    def _resolve_part(self, part: PartConfig, at: Key) -> PartConfig:
        """The part with its field as a number and its type and nullability as the format says."""
        field: int | str = part.field
        if isinstance(field, str):
            names = [f.name for f in self.format]
            if field not in names:
                raise problem(f"no field named {show(field)} in the format", *at, "field")
            field = names.index(field)
        declared = self.format[field] if field < len(self.format) else None
        ptype = part.type or (declared.type if declared else "unsigned")
        where = "{path}." + dotted(at)
        if not fieldtypes.indexable(ptype):
            raise problem(f"{where}: a {ptype} field cannot be indexed", *at, "type")
        if declared is not None and not compatible_part_type(declared.type, ptype):
            raise problem(f"{where}: field {field} is {declared.type} in the format, not {ptype}", *at, "type")
        nullable = part.is_nullable if "is_nullable" in part.model_fields_set else bool(
            declared and declared.is_nullable
        )
        if part.collation is not None:
            if ptype not in ("string", "scalar"):
                raise problem(f"{where}: only string parts have a collation", *at, "collation")
            if part.collation not in ("none", "binary") and not part.collation.startswith("unicode"):
                raise problem(f"unknown collation {show(part.collation)}", *at, "collation")
        return PartConfig(field=field, type=ptype, is_nullable=nullable, collation=part.collation)


def ordered_spaces(spaces: Sequence[SpaceConfig]) -> tuple[SpaceConfig, ...]:
    """The order ``Config.spaces`` promises: ids ascending, then spaces without an id as given."""
    with_id = sorted((s for s in spaces if s.id is not None), key=lambda s: s.id or 0)
    return tuple(with_id) + tuple(s for s in spaces if s.id is None)


# -- facades and metrics -----------------------------------------------------------------------


class HttpListenerConfig(Section):
    """What every HTTP listener ([zaqar], [sonya], [metrics]) takes besides its own keys."""

    listen: ListenAddress = Field(description="the HTTP port")
    tls: TlsConfig | None = Field(None, description="TLS on this listener")
    max_connections: Count | None = Field(None, description="connections at once; beyond it a new one is closed")
    header_timeout_s: Seconds = Field(
        20.0, ge=0.1, description="the TLS handshake and the first request's head must arrive within it, and a later head within it of its first byte"
    )
    keep_alive_timeout_s: Seconds = Field(
        75.0, ge=0.1, description="a connection idle between requests for this long is closed"
    )
    body_timeout_s: Seconds = Field(
        60.0, ge=0.1, description="a request's body must arrive within it of its head, else 408"
    )


class DeckardConfig(Section):
    """The Deckard facade (gRPC); absent: off."""

    listen: ListenAddress = Field(Address("127.0.0.1", 8081), description="the gRPC port")
    default_ttl_minutes: Count = Field(1440, description="a message's time to live when Add gives none")
    allow_flush: Flag = Field(True, description="whether the Flush call is served")
    space: SpaceName = Field("deckard", description="the queue space of Deckard's queues: queue X is tube X of it")
    token: Token | None = Field(None, description="set: every call needs `authorization: Bearer <token>`")
    tls: DeckardTlsConfig | None = Field(None, description="TLS on the gRPC port")
    max_connections: Count | None = Field(None, description="connections at once; beyond it a new one is closed")
    header_timeout_s: Seconds = Field(
        20.0, ge=0.1, description="the HTTP/2 preface, and then each frame or head from its first byte, must arrive within it"
    )
    body_timeout_s: Seconds = Field(
        60.0, ge=0.1, description="a unary call's request from its head to its end (and any request message from its first byte) within it, else DEADLINE_EXCEEDED"
    )
    idle_timeout_s: Seconds = Field(
        300.0, ge=0.1, description="a connection without a call for this long gets GOAWAY and is closed"
    )


class ZaqarToken(Section):
    """A token of `auth = "token"`: the project it fixes, and whether it is an operator's."""

    token: Token = Field(description="the `X-Auth-Token` value")
    project: Name = Field(description="the project of the requests that carry it")
    admin: Flag = Field(False, description="may manage pools and flavors (Zaqar's admin role)")


# Zaqar's limit options (its [transport] and [storage] names) and their smallest sane values.
ZAQAR_LIMITS = {
    "max_messages_post_size": 1,
    "max_queue_metadata": 1,
    "max_message_ttl": 60,
    "max_claim_ttl": 60,
    "max_claim_grace": 60,
    "default_message_ttl": 60,
    "default_claim_ttl": 60,
    "default_claim_grace": 60,
}
_ZAQAR_LIMIT = "a Zaqar limit under Zaqar's own option name; absent: Zaqar's default"


class ZaqarConfig(HttpListenerConfig):
    """The Zaqar v1.1 facade (HTTP, JSON and MessagePack); absent: off."""

    listen: ListenAddress = Field(Address("127.0.0.1", 8888), description="the HTTP port")
    default_project: Text | None = Field(
        None, description="the project of a request without `X-Project-Id` (ignored with token auth)"
    )
    space: SpaceName = Field("zaqar", description='queues on no pool: queue Q of project P is tube "P/Q" of it')
    auth: Literal["none", "token"] = Field("none", description="`none` or `token`")
    tokens: tuple[ZaqarToken, ...] = Field((), description='with `auth = "token"`: the tokens and their projects')
    max_messages_post_size: Annotated[int, Strict()] | None = Field(None, ge=1, description=_ZAQAR_LIMIT)
    max_queue_metadata: Annotated[int, Strict()] | None = Field(None, ge=1, description=_ZAQAR_LIMIT)
    max_message_ttl: Annotated[int, Strict()] | None = Field(None, ge=60, description=_ZAQAR_LIMIT)
    max_claim_ttl: Annotated[int, Strict()] | None = Field(None, ge=60, description=_ZAQAR_LIMIT)
    max_claim_grace: Annotated[int, Strict()] | None = Field(None, ge=60, description=_ZAQAR_LIMIT)
    default_message_ttl: Annotated[int, Strict()] | None = Field(None, ge=60, description=_ZAQAR_LIMIT)
    default_claim_ttl: Annotated[int, Strict()] | None = Field(None, ge=60, description=_ZAQAR_LIMIT)
    default_claim_grace: Annotated[int, Strict()] | None = Field(None, ge=60, description=_ZAQAR_LIMIT)

    @field_validator("default_project")
    @classmethod
    def _project_length(cls, value: str | None) -> str | None:
        if value is not None and not 1 <= len(value) <= 256:
            raise problem("zaqar.default_project must be 1 to 256 characters")
        return value

    @field_validator("tokens")
    @classmethod
    def _distinct_tokens(cls, tokens: tuple[ZaqarToken, ...]) -> tuple[ZaqarToken, ...]:
        i = _repeat(tokens, lambda t: t.token)
        if i is not None:
            raise problem(f"zaqar.tokens[{i}]: the same token twice", i, "token")
        return tokens

    @model_validator(mode="after")
    def _token_auth_needs_tokens(self) -> ZaqarConfig:
        if self.auth == "token" and not self.tokens:
            raise problem('zaqar.auth = "token" needs at least one entry in zaqar.tokens', "auth")
        return self

    @property
    def limits(self) -> tuple[tuple[str, int], ...]:
        """The limits the file sets, by Zaqar's option names."""
        return tuple((name, getattr(self, name)) for name in ZAQAR_LIMITS if getattr(self, name) is not None)


class SonyaConfig(HttpListenerConfig):
    """The Sonya facade (sequences, long-poll, WebSocket); absent: off."""

    listen: ListenAddress = Field(Address("127.0.0.1", 8080), description="the HTTP port")
    max_key_updates: Annotated[int, Strict()] | None = Field(
        None, ge=0, description="versions kept per id; absent: every version"
    )
    service_token: Text | None = Field(None, description="set: secure mode (the service token and JWTs are required)")
    jwt_ttl_s: Count = Field(60, description="lifetime of the tokens `generate_jwt` makes")
    longpoll_max_wait_s: Seconds = Field(
        30.0, ge=0, description="0: a long-poll waits without a limit (Sonya's own behaviour)"
    )
    task_events: tuple[Text, ...] = Field((), description="work tubes whose task changes are published")
    listener_buffer: Count = Field(
        1024, description="messages a listener may fall behind before it is closed (1008)"
    )

    @field_validator("service_token")
    @classmethod
    def _token_not_empty(cls, value: str | None) -> str | None:
        if value == "":
            raise problem("{key} is empty")
        return value


class MetricsConfig(HttpListenerConfig):
    """Prometheus `/metrics`, the health endpoints and the dashboard at `/`; absent: off."""

    listen: ListenAddress = Field(Address("127.0.0.1", 9100), description="the HTTP port")
    public: Flag = Field(False, description="`/metrics` needs no login even when `[[users]]` exist")


# -- replication -------------------------------------------------------------------------------


class PeerConfig(Section):
    """A member of the replica set: its name and its ``[iproto] listen`` address."""

    name: Name = Field(description="the member's name")
    uri: ListenAddress = Field(description="that member's `[iproto] listen`")


class EtcdConfig(Section):
    """Where the leader's key and lease live."""

    endpoints: tuple[Text, ...] = Field(("127.0.0.1:2379",), description="etcd's client URLs")
    prefix: Text = Field("/boxqueue/main", description="the cluster's keys live under it")
    lease_ttl_s: Annotated[int, Strict()] = Field(3, ge=2, description="the leader's lease")

    @field_validator("endpoints")
    @classmethod
    def _some_endpoint(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise problem("{key} is empty")
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix_shape(cls, value: str) -> str:
        if not value.startswith("/") or value.endswith("/"):
            raise problem("{key} must start with '/' and not end with it")
        return value


def _majority(data: dict[str, Any]) -> int:
    return len(data.get("peers", ())) // 2 + 1


class ReplicationConfig(Section):
    """This instance's place in a replica set; absent: it runs alone."""

    name: Name = Field(description="this member; one of `peers`")
    peers: tuple[PeerConfig, ...] = Field(
        description="every member, this one included, in the same order in every member's file"
    )
    synchro_quorum: Count = Field(
        default_factory=_majority, description="members (the leader counted) that must hold a write "
        "before its client is answered: a majority of `peers` or more (absent: a majority), or 1 = "
        "asynchronous (a failover may lose the last writes acknowledged)"
    )
    synchro_timeout_s: Seconds = Field(
        5.0, ge=0.01, description="a write no quorum holds after it is answered ER_SYNC_QUORUM_TIMEOUT (216, "
        "outcome unknown) and the leader resigns; so does a leader whose quorum's followers are silent that long"
    )
    heartbeat_s: Seconds = Field(1.0, ge=0.01, description="a peer silent for four heartbeats is lost")
    user: Text | None = Field(None, description="a `[[users]]` entry (or admin) the peers log in as; absent: guest")
    password: Text | None = Field(None, description="that user's password")
    etcd: EtcdConfig = Field(EtcdConfig(), description="where the leader's key and lease live")

    @field_validator("peers")
    @classmethod
    def _peers(cls, peers: tuple[PeerConfig, ...]) -> tuple[PeerConfig, ...]:
        i = _repeat(peers, lambda p: p.name)
        if i is not None:
            raise problem(f"duplicate peer name {show(peers[i].name)}", i, "name")
        if len(peers) > 31:
            raise problem("a replica set has at most 31 peers")
        return peers

    @model_validator(mode="after")
    def _consistent(self) -> ReplicationConfig:
        if all(p.name != self.name for p in self.peers):
            raise problem(f"replication.name {show(self.name)} is not one of replication.peers", "name")
        if self.synchro_quorum > len(self.peers):
            raise problem(
                f"replication.synchro_quorum {self.synchro_quorum} is more than the {len(self.peers)} peers",
                "synchro_quorum",
            )
        majority = len(self.peers) // 2 + 1
        if 1 < self.synchro_quorum < majority:
            # Two quorums that do not meet could each confirm writes the other's leader lacks.
            raise problem(
                f"replication.synchro_quorum {self.synchro_quorum} is less than a majority of the "
                f"{len(self.peers)} peers ({majority}); use {majority} or more, or 1 for asynchronous",
                "synchro_quorum",
            )
        if self.user is not None and self.password is None:
            raise problem("replication.user needs replication.password")
        return self

    @property
    def peer(self) -> PeerConfig:
        """This instance's entry."""
        return next(p for p in self.peers if p.name == self.name)

    def replica_id(self, name: str) -> int:
        """A member's replica id: its place in ``peers``, from 1 (as Tarantool numbers them)."""
        return next(i for i, p in enumerate(self.peers, 1) if p.name == name)


# -- the file ----------------------------------------------------------------------------------


def _data_dir(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, Path):
        return value
    return absolute_path(_given_path(value, info))


def _cfg_file(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, Path) or value is None:
        return value
    shown = Path(os.path.normpath(_given_path(value, info)))
    if not shown.is_file():
        raise problem(f"tarantool_cfg: no such file: {shown}")
    return absolute_path(shown)


class Config(Section):
    """The whole file. Facade sections that are absent leave their facade off."""

    data_dir: Annotated[Path, BeforeValidator(_data_dir)] = Field(
        DEFAULT_DATA_DIR, validate_default=True,
        description="the LMDB environment and the write-ahead log under it (LMDB's `data.mdb` is a sparse "
                    "file as large as its 1 TiB map: copy it with a sparse-aware tool)",
    )
    tarantool_cfg: Annotated[Path | None, BeforeValidator(_cfg_file)] = Field(
        None, description="a 1.5 style file whose `space = [...]` list creates spaces 0, 1, 2, ... "
        "(STR -> string, NUM/NUM64 -> unsigned); its ports fill the listeners the file leaves unset",
    )
    iproto: IprotoConfig = Field(IprotoConfig(), description="the binary protocol")
    wal: WalConfig = Field(WalConfig(), description="durability")
    guest: GuestConfig | None = Field(
        None, description="the guest's rights: everything while no `[[users]]` exist, else only these"
    )
    users: tuple[UserConfig, ...] = Field((), description="the users who log in (`[[users]]`)")
    spaces: tuple[SpaceConfig, ...] = Field(
        (), alias="space", description="spaces declared here (`[[space]]`): ids ascending, then those without an id"
    )
    deckard: DeckardConfig | None = Field(None, description="the Deckard facade")
    zaqar: ZaqarConfig | None = Field(None, description="the Zaqar facade")
    sonya: SonyaConfig | None = Field(None, description="the Sonya facade")
    lua: LuaConfig = Field(LuaConfig(), description="the embedded Lua's limits")
    metrics: MetricsConfig | None = Field(None, description="the metrics listener")
    replication: ReplicationConfig | None = Field(None, description="a replica set; absent: a single node")

    _source: Path = PrivateAttr(default=Path())

    @property
    def source(self) -> Path:
        """The file given, as given."""
        return self._source

    @property
    def guest_grants(self) -> tuple[Grant, ...] | None:
        """None: full rights while no users exist, else none."""
        return None if self.guest is None else self.guest.grants

    @field_validator("users")
    @classmethod
    def _distinct_users(cls, users: tuple[UserConfig, ...]) -> tuple[UserConfig, ...]:
        i = _repeat(users, lambda u: u.name)
        if i is not None:
            raise problem(f"duplicate user name {show(users[i].name)}", i, "name")
        return users

    @field_validator("spaces")
    @classmethod
    def _distinct_spaces(cls, spaces: tuple[SpaceConfig, ...]) -> tuple[SpaceConfig, ...]:
        for i, space in enumerate(spaces):
            for other in spaces[:i]:
                if space.id is not None and other.id == space.id:
                    raise problem(f"duplicate space id {space.id}", i, "id")
                if other.name == space.name:
                    raise problem(f"duplicate space name {show(space.name)}", i, "name")
        return spaces

    def with_source(self, source: Path) -> Config:
        self._source = source
        return self


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


DEFAULT_LISTEN = Address("127.0.0.1", 3301)
DEFAULT_DECKARD_LISTEN = DeckardConfig.model_fields["listen"].default
DEFAULT_ZAQAR_LISTEN = ZaqarConfig.model_fields["listen"].default
DEFAULT_SONYA_LISTEN = SonyaConfig.model_fields["listen"].default
DEFAULT_METRICS_LISTEN = MetricsConfig.model_fields["listen"].default
