"""Reads parsed TOML into the typed configuration, checking every key of the contract.

``tomllib`` only says whether the text is TOML; this module says whether it is a configuration:
unknown keys, wrong types, bad values and clashes each fail with the file, the line and the key.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from boxqueue import tarantool_cfg
from boxqueue.config_rules import (
    compatible_part_type,
    default_index_name,
    dotted,
    index_problem,
    listener_clash,
    show,
)
from boxqueue.config_toml_lines import TomlLines
from boxqueue.config_types import (
    DEFAULT_DATA_DIR,
    DEFAULT_DECKARD_LISTEN,
    DEFAULT_LISTEN,
    DEFAULT_METRICS_LISTEN,
    DEFAULT_SONYA_LISTEN,
    DEFAULT_ZAQAR_LISTEN,
    ENGINES,
    INDEX_TYPES,
    MAX_SPACE_ID,
    OBJECT_TYPES,
    PRIVILEGES,
    WAL_MODES,
    Address,
    AddressError,
    Config,
    ConfigError,
    DeckardConfig,
    EtcdConfig,
    FieldConfig,
    Grant,
    IndexConfig,
    IprotoConfig,
    Key,
    LuaConfig,
    MetricsConfig,
    PartConfig,
    PeerConfig,
    ReplicationConfig,
    SonyaConfig,
    SpaceConfig,
    TlsConfig,
    UserConfig,
    WalConfig,
    ZaqarConfig,
    ZaqarToken,
    absolute_path,
    ordered_spaces,
)
from spaces import fieldtypes

_MISSING: Any = object()

_TOP = frozenset(
    {"data_dir", "tarantool_cfg", "iproto", "wal", "guest", "users", "space",
     "deckard", "zaqar", "sonya", "lua", "metrics", "replication"}
)
_IPROTO = frozenset(
    {"listen", "read_only_listen", "admin_listen", "max_packet_bytes",
     "max_inflight_per_connection", "tls", "max_connections", "max_waiting_takes_per_connection"}
)
_TLS = frozenset({"cert_file", "key_file", "ca_file", "ciphers"})
_SPACE = frozenset({"id", "name", "engine", "format", "indexes", "temporary"})
_FIELD = frozenset({"name", "type", "is_nullable"})
_INDEX = frozenset({"name", "type", "unique", "parts"})
_PART = frozenset({"field", "type", "is_nullable", "collation"})
_USER = frozenset({"name", "password", "grants"})
_GRANT = frozenset({"privileges", "object_type", "object_name"})
_SONYA = frozenset(
    {"listen", "max_key_updates", "service_token", "jwt_ttl_s", "longpoll_max_wait_s",
     "task_events", "listener_buffer", "tls", "max_connections", "header_timeout_s", "body_timeout_s"}
)


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


class TomlReader:
    """Checks and converts parsed TOML, failing with the file, line and key of the problem."""

    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self.lines = TomlLines(text)
        self.folder = Path(file).parent

    def fail(self, path: Key, message: str) -> ConfigError:
        return ConfigError(self.file, self.lines.line_of(path), message, key=dotted(path))

    # -- the document ------------------------------------------------------------------------

    def config(self, source: Path, data: dict[str, Any]) -> Config:
        root = self.table(data, (), _TOP)
        folder = source.parent
        data_dir = absolute_path(folder / self.name(root, (), "data_dir", DEFAULT_DATA_DIR))
        legacy = None
        legacy_path = None
        if "tarantool_cfg" in root:
            shown = Path(os.path.normpath(folder / self.name(root, (), "tarantool_cfg")))
            if not shown.is_file():
                raise self.fail(("tarantool_cfg",), f"tarantool_cfg: no such file: {shown}")
            legacy = tarantool_cfg.load_tarantool_cfg(shown)
            legacy_path = absolute_path(shown)
        iproto = self.iproto(root)
        if legacy is not None:
            iproto = IprotoConfig(
                listen=iproto.listen or legacy.listen,
                read_only_listen=iproto.read_only_listen or legacy.read_only_listen,
                admin_listen=iproto.admin_listen or legacy.admin_listen,
                max_packet_bytes=iproto.max_packet_bytes,
                max_inflight_per_connection=iproto.max_inflight_per_connection,
                tls=iproto.tls,
                max_connections=iproto.max_connections,
                max_waiting_takes_per_connection=iproto.max_waiting_takes_per_connection,
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
            spaces=ordered_spaces(spaces),
            tarantool_cfg=legacy_path,
            deckard=self.deckard(root),
            zaqar=self.zaqar(root),
            sonya=self.sonya(root),
            lua=self.lua(root),
            metrics=self.metrics(root),
        )
        replication = self.replication(root, config)
        if replication is not None:
            config = replace(config, replication=replication)
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
                (("metrics", "listen"), config.metrics.listen if config.metrics else None),
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
            tls=self.tls(t, path),
            max_connections=self.integer(t, path, "max_connections", None, minimum=1),
            max_waiting_takes_per_connection=self.integer(
                t, path, "max_waiting_takes_per_connection", 512, minimum=1
            ),
        )

    def tls(self, t: dict[str, Any], path: Key, client_auth: bool = False) -> TlsConfig | None:
        """``[<section>.tls]``: files relative to the config file, each checked to be readable."""
        if "tls" not in t:
            return None
        tpath = (*path, "tls")
        allowed = _TLS | {"client_auth"} if client_auth else _TLS
        tt = self.table(t["tls"], tpath, allowed)

        def file(key: str, required: bool) -> Path | None:
            name = self.string(tt, tpath, key, _MISSING if required else None)
            if name is None:
                return None
            if not name:
                raise self.fail((*tpath, key), f"{dotted((*tpath, key))} is empty")
            found = absolute_path(self.folder / name)
            if not os.access(found, os.R_OK) or not found.is_file():
                raise self.fail((*tpath, key), f"{dotted((*tpath, key))}: cannot read {found}")
            return found

        ca_file = file("ca_file", False)
        mode = self.string(tt, tpath, "client_auth", "require")
        if mode not in ("require", "optional"):
            raise self.fail((*tpath, "client_auth"), f"bad {dotted((*tpath, 'client_auth'))}: {show(mode)} "
                            "(expected require or optional)")
        if "client_auth" in tt and ca_file is None:
            raise self.fail((*tpath, "client_auth"), f"{dotted((*tpath, 'client_auth'))} needs ca_file")
        ciphers = self.string(tt, tpath, "ciphers", None)
        return TlsConfig(
            cert_file=file("cert_file", True),  # type: ignore[arg-type]
            key_file=file("key_file", True),  # type: ignore[arg-type]
            ca_file=ca_file,
            ciphers=ciphers or None,
            client_auth=mode,
        )

    def lua(self, root: dict[str, Any]) -> LuaConfig:
        path: Key = ("lua",)
        t = self.table(root.get("lua", {}), path, {"time_limit_s", "memory_limit_bytes"})
        return LuaConfig(
            time_limit_s=self.number(t, path, "time_limit_s", 5.0, minimum=0.001),
            memory_limit_bytes=self.integer(t, path, "memory_limit_bytes", 268435456, minimum=1048576),
        )

    def wal(self, root: dict[str, Any]) -> WalConfig:
        path: Key = ("wal",)
        t = self.table(root.get("wal", {}), path, {"mode", "checkpoint_interval_s", "checkpoint_bytes"})
        mode = self.string(t, path, "mode", "fsync")
        if mode not in WAL_MODES:
            raise self.fail(
                (*path, "mode"), f"bad wal.mode: {show(mode)} (expected fsync, write or none)"
            )
        return WalConfig(
            mode,
            checkpoint_interval_s=self.number(
                t, path, "checkpoint_interval_s", WalConfig.checkpoint_interval_s, minimum=0.001
            ),
            checkpoint_bytes=self.integer(t, path, "checkpoint_bytes", WalConfig.checkpoint_bytes, minimum=4096),
        )

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
                raise self.fail((*path, "name"), "guest is configured with [guest], not [[users]]")
            if any(u.name == name for u in users):
                raise self.fail((*path, "name"), f"duplicate user name {show(name)}")
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
                        (*gpath, "privileges", i),
                        f"unknown privilege {show(privilege)} in {dotted(gpath)} "
                        "(expected read, write or execute)",
                    )
            if not privileges:
                raise self.fail((*gpath, "privileges"), f"{dotted(gpath)}.privileges is empty")
            object_type = self.string(g, gpath, "object_type")
            if object_type not in OBJECT_TYPES:
                raise self.fail(
                    (*gpath, "object_type"),
                    f"bad object_type {show(object_type)} in {dotted(gpath)} "
                    "(expected universe, space or function)",
                )
            object_name = self.string(g, gpath, "object_name", None)
            if object_type == "universe" and object_name is not None:
                raise self.fail(
                    (*gpath, "object_name"), f"{dotted(gpath)}: the universe has no object_name"
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
                    raise self.fail((*path, "id"), f"duplicate space id {space.id}")
                if other.name == space.name:
                    raise self.fail((*path, "name"), f"duplicate space name {show(space.name)}")
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
        name = self.name(t, path, "name") if "name" in t or space_id is None else f"space{space_id}"
        engine = self.string(t, path, "engine", "memtx")
        if engine not in ENGINES:
            raise self.fail(
                (*path, "engine"), f"bad engine {show(engine)} in {dotted(path)} "
                "(expected memtx or vinyl)",
            )
        fmt = self.format(t, path)
        indexes: list[IndexConfig] = []
        for ipath, it in self.tables(t, path, "indexes", _INDEX):
            index = self.index(it, ipath, len(indexes), fmt)
            if any(i.name == index.name for i in indexes):
                raise self.fail((*ipath, "name"), f"duplicate index name {show(index.name)}")
            indexes.append(index)
        temporary = self.boolean(t, path, "temporary", False)
        return SpaceConfig(space_id, name, engine, fmt, tuple(indexes), temporary)

    def format(self, t: dict[str, Any], path: Key) -> tuple[FieldConfig, ...]:
        fields: list[FieldConfig] = []
        for fpath, ft in self.tables(t, path, "format", _FIELD):
            name = self.name(ft, fpath, "name")
            if any(f.name == name for f in fields):
                raise self.fail((*fpath, "name"), f"duplicate field name {show(name)}")
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
                (*path, "type"), f"unsupported index type {show(t['type'])} in {dotted(path)} "
                "(expected TREE or HASH)",
            )
        unique = self.boolean(t, path, "unique", True)
        raw_parts = self.array(t, path, "parts")
        parts = tuple(self.part(p, (*path, "parts", i), fmt) for i, p in enumerate(raw_parts))
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
                raise self.fail((*path, "field"), f"no field named {show(field)} in the format")
            field = names.index(field)
        elif type(field) is not int or field < 0:
            raise self.fail(
                (*path, "field"),
                f"{dotted(path)}.field must be a field number (0-based) or name, "
                f"not {show(field)}",
            )
        declared = fmt[field] if field < len(fmt) else None
        ptype = self.field_type(t, path, "type", declared.type if declared else "unsigned")
        if not fieldtypes.indexable(ptype):
            raise self.fail((*path, "type"), f"{dotted(path)}: a {ptype} field cannot be indexed")
        if declared is not None and not compatible_part_type(declared.type, ptype):
            raise self.fail(
                (*path, "type"),
                f"{dotted(path)}: field {field} is {declared.type} in the format, not {ptype}",
            )
        nullable = self.boolean(t, path, "is_nullable", declared.is_nullable if declared else False)
        collation = self.string(t, path, "collation", None)
        if collation is not None:
            if ptype not in ("string", "scalar"):
                raise self.fail(
                    (*path, "collation"), f"{dotted(path)}: only string parts have a collation"
                )
            if collation not in ("none", "binary") and not collation.startswith("unicode"):
                raise self.fail((*path, "collation"), f"unknown collation {show(collation)}")
        return PartConfig(field, ptype, nullable, collation)

    # -- facades -----------------------------------------------------------------------------

    def deckard(self, root: dict[str, Any]) -> DeckardConfig | None:
        if "deckard" not in root:
            return None
        path: Key = ("deckard",)
        t = self.table(root["deckard"], path, {"listen", "default_ttl_minutes", "allow_flush", "space", "token",
                                               "tls", "max_connections"})
        return DeckardConfig(
            listen=self.address(t, path, "listen", DEFAULT_DECKARD_LISTEN),
            default_ttl_minutes=self.integer(t, path, "default_ttl_minutes", 1440, minimum=1),
            allow_flush=self.boolean(t, path, "allow_flush", True),
            space=self.space_name(t, path, "deckard"),
            token=self.secret(t, path, "token"),
            tls=self.tls(t, path, client_auth=True),
            max_connections=self.integer(t, path, "max_connections", None, minimum=1),
        )

    def secret(self, t: dict[str, Any], path: Key, key: str) -> str | None:
        """A token: absent, or a non-empty string a header can carry (visible ASCII)."""
        value = self.string(t, path, key, None)
        if value is None:
            return None
        if not value or not all(0x21 <= ord(c) <= 0x7E for c in value):
            raise self.fail((*path, key), f"{dotted((*path, key))} must be non-empty visible ASCII "
                            "(it is sent in a header)")
        return str(value)

    def space_name(self, t: dict[str, Any], path: Key, default: str) -> str:
        """The ``space`` of a facade: a space name (no control characters, at most 64)."""
        name = self.name(t, path, "space", default)
        if len(name) > 64 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
            raise self.fail((*path, "space"), f"{dotted((*path, 'space'))} is not a usable space name: {show(name)}")
        return name

    def zaqar(self, root: dict[str, Any]) -> ZaqarConfig | None:
        if "zaqar" not in root:
            return None
        path: Key = ("zaqar",)
        t = self.table(root["zaqar"], path, {"listen", "default_project", "space", "auth", "tokens", "tls",
                                             "max_connections", "header_timeout_s", "body_timeout_s",
                                             *ZAQAR_LIMITS})
        project = self.string(t, path, "default_project", None)
        if project == "" or (project is not None and len(project) > 256):
            raise self.fail((*path, "default_project"), "zaqar.default_project must be 1 to 256 characters")
        limits = tuple(
            (key, self.integer(t, path, key, None, minimum=minimum))
            for key, minimum in ZAQAR_LIMITS.items()
            if key in t
        )
        auth = self.string(t, path, "auth", "none")
        if auth not in ("none", "token"):
            raise self.fail((*path, "auth"), f"bad zaqar.auth: {show(auth)} (expected none or token)")
        tokens: list[ZaqarToken] = []
        for tpath, tt in self.tables(t, path, "tokens", frozenset({"token", "project", "admin"})):
            token = self.secret(tt, tpath, "token")
            if token is None:
                raise self.fail(tpath, f"missing key 'token' in {dotted(tpath)}")
            if any(known.token == token for known in tokens):
                raise self.fail((*tpath, "token"), f"{dotted(tpath)}: the same token twice")
            tokens.append(ZaqarToken(token, self.name(tt, tpath, "project"), self.boolean(tt, tpath, "admin", False)))
        if auth == "token" and not tokens:
            raise self.fail((*path, "auth"), 'zaqar.auth = "token" needs at least one entry in zaqar.tokens')
        return ZaqarConfig(
            listen=self.address(t, path, "listen", DEFAULT_ZAQAR_LISTEN),
            default_project=project,
            limits=limits,
            space=self.space_name(t, path, "zaqar"),
            auth=auth,
            tokens=tuple(tokens),
            **self.http_listener(t, path),
        )

    def sonya(self, root: dict[str, Any]) -> SonyaConfig | None:
        if "sonya" not in root:
            return None
        path: Key = ("sonya",)
        t = self.table(root["sonya"], path, _SONYA)
        token = self.string(t, path, "service_token", None)
        if token == "":
            raise self.fail((*path, "service_token"), "sonya.service_token is empty")
        return SonyaConfig(
            listen=self.address(t, path, "listen", DEFAULT_SONYA_LISTEN),
            max_key_updates=self.integer(t, path, "max_key_updates", None, minimum=0),
            service_token=token,
            jwt_ttl_s=self.integer(t, path, "jwt_ttl_s", 60, minimum=1),
            longpoll_max_wait_s=self.number(t, path, "longpoll_max_wait_s", 30.0, minimum=0),
            task_events=tuple(self.strings(t, path, "task_events", ())),
            listener_buffer=self.integer(t, path, "listener_buffer", 1024, minimum=1),
            **self.http_listener(t, path),
        )

    def http_listener(self, t: dict[str, Any], path: Key) -> dict[str, Any]:
        """The keys every HTTP listener takes ([zaqar], [sonya], [metrics]): TLS and limits."""
        return {
            "tls": self.tls(t, path),
            "max_connections": self.integer(t, path, "max_connections", None, minimum=1),
            "header_timeout_s": self.number(t, path, "header_timeout_s", 20.0, minimum=0.1),
            "body_timeout_s": self.number(t, path, "body_timeout_s", 60.0, minimum=0.1),
        }

    def metrics(self, root: dict[str, Any]) -> MetricsConfig | None:
        if "metrics" not in root:
            return None
        path: Key = ("metrics",)
        t = self.table(root["metrics"], path, {"listen", "public", "tls", "max_connections", "header_timeout_s",
                                                   "body_timeout_s"})
        return MetricsConfig(
            listen=self.address(t, path, "listen", DEFAULT_METRICS_LISTEN),
            public=self.boolean(t, path, "public", False),
            **self.http_listener(t, path),
        )

    # -- replication ---------------------------------------------------------------------------

    def replication(self, root: dict[str, Any], config: Config) -> ReplicationConfig | None:
        if "replication" not in root:
            return None
        path: Key = ("replication",)
        t = self.table(root["replication"], path, {"name", "peers", "user", "password", "synchro_quorum",
                                                   "synchro_timeout_s", "heartbeat_s", "etcd"})
        name = self.name(t, path, "name")
        peers: list[PeerConfig] = []
        for ppath, pt in self.tables(t, path, "peers", frozenset({"name", "uri"})):
            peer_name = self.name(pt, ppath, "name")
            if any(p.name == peer_name for p in peers):
                raise self.fail((*ppath, "name"), f"duplicate peer name {show(peer_name)}")
            uri = self.address(pt, ppath, "uri", None)
            if uri is None:
                raise self.fail(ppath, f"missing key 'uri' in {dotted(ppath)}")
            peers.append(PeerConfig(peer_name, uri))
        if len(peers) > 31:
            raise self.fail((*path, "peers"), "a replica set has at most 31 peers")
        me = next((p for p in peers if p.name == name), None)
        if me is None:
            raise self.fail((*path, "name"), f"replication.name {show(name)} is not one of replication.peers")
        listen = config.iproto.listen
        wildcard = listen is not None and listen.host in ("0.0.0.0", "::")
        if me.uri != listen and not (wildcard and listen is not None and me.uri.port == listen.port):
            raise self.fail((*path, "peers"), f"this instance's uri ({me.uri}) is not its [iproto] listen "
                            f"address ({config.iproto.listen})")
        user = self.string(t, path, "user", None)
        password = self.string(t, path, "password", None)
        if user is not None:
            if user != "admin" and all(u.name != user for u in config.users):
                raise self.fail((*path, "user"), f"replication.user {show(user)} is not one of [[users]]")
            if password is None:
                raise self.fail(path, "replication.user needs replication.password")
        quorum = self.integer(t, path, "synchro_quorum", len(peers) // 2 + 1, minimum=1)
        if quorum > len(peers):
            raise self.fail((*path, "synchro_quorum"), f"replication.synchro_quorum {quorum} is more than the "
                            f"{len(peers)} peers")
        if config.wal.mode != "fsync":
            raise self.fail(path, 'a replica set replicates the write-ahead log: [wal] mode must be "fsync"')
        etcd = EtcdConfig()
        if "etcd" in t:
            epath = (*path, "etcd")
            et = self.table(t["etcd"], epath, {"endpoints", "prefix", "lease_ttl_s"})
            endpoints = tuple(self.strings(et, epath, "endpoints", list(etcd.endpoints)))
            if not endpoints:
                raise self.fail((*epath, "endpoints"), "replication.etcd.endpoints is empty")
            prefix = self.string(et, epath, "prefix", etcd.prefix)
            if not prefix.startswith("/") or prefix.endswith("/"):
                raise self.fail((*epath, "prefix"), "replication.etcd.prefix must start with '/' and not end with it")
            etcd = EtcdConfig(endpoints, prefix, self.integer(et, epath, "lease_ttl_s", etcd.lease_ttl_s, minimum=2))
        return ReplicationConfig(
            name=name,
            peers=tuple(peers),
            synchro_quorum=quorum,
            synchro_timeout_s=self.number(t, path, "synchro_timeout_s", 5.0, minimum=0.01),
            heartbeat_s=self.number(t, path, "heartbeat_s", 1.0, minimum=0.01),
            user=user,
            password=password,
            etcd=etcd,
        )

    # -- typed getters -----------------------------------------------------------------------

    def table(self, value: Any, path: Key, allowed: frozenset[str] | set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"{dotted(path)} must be a table, not {show(value)}")
        for key in value:
            if key not in allowed:
                where = f" in [{path[0]}]" if len(path) == 1 else f" in {dotted(path)}" if path else ""
                raise self.fail((*path, key), f"unknown key {key!r}{where}")
        return value

    def tables(
        self, t: dict[str, Any], path: Key, key: str, allowed: frozenset[str]
    ) -> list[tuple[Key, dict[str, Any]]]:
        """The items of an array of tables, each with its path."""
        items = self.array(t, path, key, [])
        out = []
        for i, item in enumerate(items):
            ipath = (*path, key, i)
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
        return self.fail((*path, key), f"{dotted((*path, key))} must be {what}, not {show(value)}")

    def string(self, t: dict[str, Any], path: Key, key: str, default: Any = _MISSING) -> Any:
        value = self.get(t, path, key, default)
        if key in t and not isinstance(value, str):
            raise self.wrong(path, key, "a string", value)
        return value

    def name(self, t: dict[str, Any], path: Key, key: str, default: Any = _MISSING) -> str:
        value = self.string(t, path, key, default)
        if not value:
            raise self.fail((*path, key), f"{dotted((*path, key))} is empty")
        return str(value)

    def strings(self, t: dict[str, Any], path: Key, key: str, default: Any = _MISSING) -> list[str]:
        values = self.array(t, path, key, default)
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise self.fail(
                    (*path, key, i), f"{dotted((*path, key, i))} must be a string, not {show(value)}"
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
            raise self.fail((*path, key), f"{dotted((*path, key))} must be {bounds}, not {value}")
        return value

    def number(
        self, t: dict[str, Any], path: Key, key: str, default: float, minimum: float
    ) -> float:
        value = self.get(t, path, key, default)
        if type(value) not in (int, float) or value != value:
            raise self.wrong(path, key, "a number", value)
        if value < minimum:
            raise self.fail((*path, key), f"{dotted((*path, key))} must be at least {minimum}")
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
                (*path, key), f"bad {err.part} in {dotted((*path, key))}: {show(value)}{hint}"
            ) from None

    def field_type(self, t: dict[str, Any], path: Key, key: str, default: str) -> str:
        value = self.get(t, path, key, default)
        canonical = fieldtypes.normalize(value)
        if canonical is None:
            raise self.fail(
                (*path, key), f"unknown field type in {dotted((*path, key))}: {show(value)}"
            )
        return canonical
