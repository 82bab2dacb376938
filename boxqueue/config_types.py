"""The typed configuration: frozen dataclasses, the contract's defaults and limits, ConfigError.

This module imports no reader, so the TOML reader (``boxqueue.config_toml_reader``), the 1.5 cfg
reader (``boxqueue.tarantool_cfg``) and ``boxqueue.config`` can all build on it without an import
cycle. Import these names from ``boxqueue.config``, the public face.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
class TlsConfig:
    """A listener's TLS (``[<section>.tls]``): its certificate chain and key; with ``ca_file``,
    clients must present a certificate signed by it (``client_auth = "optional"``, Deckard only:
    checked when given, as Deckard's VerifyClientCertIfGiven)."""

    cert_file: Path  # absolute
    key_file: Path
    ca_file: Path | None = None
    ciphers: str | None = None  # OpenSSL cipher list
    client_auth: str = "require"  # "require" | "optional" (with ca_file)


@dataclass(frozen=True)
class ZaqarToken:
    token: str
    project: str
    admin: bool = False  # may manage pools and flavors (Zaqar's admin role)


@dataclass(frozen=True)
class IprotoConfig:
    listen: Address | None
    read_only_listen: Address | None
    admin_listen: Address | None
    max_packet_bytes: int = 16777216
    max_inflight_per_connection: int = 768
    tls: TlsConfig | None = None  # every iproto listener: binary, read-only and admin console
    max_connections: int | None = None  # per listener; None: no limit
    max_waiting_takes_per_connection: int = 512  # blocking takes (calls that wait) at once


@dataclass(frozen=True)
class WalConfig:
    mode: str = "fsync"  # fsync | write | none
    checkpoint_interval_s: float = 5.0  # fsync mode: LMDB flushed and the log trimmed this often
    checkpoint_bytes: int = 16 << 20  # ... or as soon as the log's current segment is this big


@dataclass(frozen=True)
class DeckardConfig:
    listen: Address
    default_ttl_minutes: int = 1440
    allow_flush: bool = True
    space: str = "deckard"  # the queue space of Deckard's queues: queue X is tube X of it
    token: str | None = None  # required as `authorization: Bearer <token>` when set
    tls: TlsConfig | None = None
    max_connections: int | None = None


@dataclass(frozen=True)
class ZaqarConfig:
    listen: Address
    default_project: str | None = None  # Z4: the project of requests without X-Project-Id
    # Z3: Zaqar's limits under Zaqar's option names; absent ones keep Zaqar's defaults.
    limits: tuple[tuple[str, int], ...] = ()
    space: str = "zaqar"  # queues on no pool: queue Q of project P is tube "P/Q" of it
    auth: str = "none"  # "none" | "token"
    tokens: tuple[ZaqarToken, ...] = ()  # with auth = "token": X-Auth-Token values and their projects
    tls: TlsConfig | None = None
    max_connections: int | None = None
    header_timeout_s: float = 20.0  # accept to the end of the first request's head
    body_timeout_s: float = 60.0  # the end of a request's head to the end of its body


@dataclass(frozen=True)
class SonyaConfig:
    listen: Address
    max_key_updates: int | None = None
    service_token: str | None = None
    jwt_ttl_s: int = 60
    longpoll_max_wait_s: float = 30  # 0: no server-side limit (Sonya's own behaviour)
    task_events: tuple[str, ...] = ()
    listener_buffer: int = 1024  # messages a listener may fall behind before it is closed (1008)
    tls: TlsConfig | None = None
    max_connections: int | None = None
    header_timeout_s: float = 20.0  # accept to the end of the first request's head
    body_timeout_s: float = 60.0  # the end of a request's head to the end of its body


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus ``/metrics`` and the dashboard at ``/`` (off when the section is absent)."""

    listen: Address
    public: bool = False  # True: /metrics needs no login even with [[users]]
    tls: TlsConfig | None = None
    max_connections: int | None = None
    header_timeout_s: float = 20.0  # accept to the end of the first request's head
    body_timeout_s: float = 60.0  # the end of a request's head to the end of its body


@dataclass(frozen=True)
class LuaConfig:
    """Limits of the embedded Lua (admin console, EVAL, Lua functions called over CALL)."""

    time_limit_s: float = 5.0  # Lua run time of one statement, chunk or call (waits excluded)
    memory_limit_bytes: int = 268435456  # everything the Lua runtime allocates


@dataclass(frozen=True)
class PeerConfig:
    """A member of the replica set: its name and its ``[iproto] listen`` address."""

    name: str
    uri: Address


@dataclass(frozen=True)
class EtcdConfig:
    """``[replication.etcd]``: where the leader's key and lease live."""

    endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    prefix: str = "/boxqueue/main"
    lease_ttl_s: int = 3


@dataclass(frozen=True)
class ReplicationConfig:
    """``[replication]``: this instance's place in a replica set (absent: it runs alone)."""

    name: str
    peers: tuple[PeerConfig, ...]  # every member, this one included, in the file's order
    synchro_quorum: int  # instances that must hold a write before it is acknowledged, the leader included
    synchro_timeout_s: float = 5.0
    heartbeat_s: float = 1.0
    user: str | None = None  # the peers authenticate as this [[users]] entry (None: guest)
    password: str | None = None
    etcd: EtcdConfig = EtcdConfig()

    @property
    def peer(self) -> PeerConfig:
        """This instance's entry."""
        return next(p for p in self.peers if p.name == self.name)

    def replica_id(self, name: str) -> int:
        """A member's replica id: its place in ``peers``, from 1 (as Tarantool numbers them)."""
        return next(i for i, p in enumerate(self.peers, 1) if p.name == name)


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
    lua: LuaConfig = LuaConfig()
    metrics: MetricsConfig | None = None  # None: no metrics listener
    replication: ReplicationConfig | None = None  # None: a single node


DEFAULT_LISTEN = Address("127.0.0.1", 3301)
DEFAULT_DECKARD_LISTEN = Address("127.0.0.1", 8081)
DEFAULT_ZAQAR_LISTEN = Address("127.0.0.1", 8888)
DEFAULT_SONYA_LISTEN = Address("127.0.0.1", 8080)
DEFAULT_METRICS_LISTEN = Address("127.0.0.1", 9100)
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


def absolute_path(path: Path) -> Path:
    """Absolute and without ``..`` (lexically, so a later chdir cannot change its meaning)."""
    return Path(os.path.abspath(path))


def ordered_spaces(spaces: Sequence[SpaceConfig]) -> tuple[SpaceConfig, ...]:
    """The order ``Config.spaces`` promises: ids ascending, then spaces without an id as given."""
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
