"""The server's configuration: one typed, frozen value, loaded once at start.

The key names are a contract that other tools write to (``docs/configuration.md``, generated from
``boxqueue.config_model``, where every key is declared). ``load_config`` reads a TOML file, or a
Tarantool 1.5 style ``.cfg`` alone (see ``boxqueue.tarantool_cfg``). Every problem is a
``ConfigError`` whose text names the file, the line and the key, for example
``conf/x.toml:7: unknown key 'lisen' in [iproto]``; the CLI prints it and exits with status 2.

This module is the public face; import configuration names from here. It picks the format, has the
models validate the data, says where in the file each problem is (``tomllib`` gives no positions:
``config_toml_lines`` finds them) and applies the rules that need the whole file at once: the 1.5
cfg's spaces and ports, listeners on one port, a replica set's own address.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from boxqueue import tarantool_cfg
from boxqueue.config_model import (
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
    DeckardTlsConfig,
    EtcdConfig,
    FieldConfig,
    Grant,
    GuestConfig,
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
    config_error,
    default_index_name,
    dotted,
    index_problem,
    listener_clash,
    ordered_spaces,
    read_text,
    show,
)
from boxqueue.config_toml_lines import TomlLines

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_DECKARD_LISTEN",
    "DEFAULT_LISTEN",
    "DEFAULT_METRICS_LISTEN",
    "DEFAULT_SONYA_LISTEN",
    "DEFAULT_ZAQAR_LISTEN",
    "ENGINES",
    "INDEX_TYPES",
    "MAX_SPACE_ID",
    "OBJECT_TYPES",
    "PRIVILEGES",
    "WAL_MODES",
    "Address",
    "AddressError",
    "Config",
    "ConfigError",
    "DeckardConfig",
    "DeckardTlsConfig",
    "EtcdConfig",
    "FieldConfig",
    "Grant",
    "GuestConfig",
    "IndexConfig",
    "IprotoConfig",
    "LuaConfig",
    "MetricsConfig",
    "PartConfig",
    "PeerConfig",
    "ReplicationConfig",
    "SonyaConfig",
    "SpaceConfig",
    "TlsConfig",
    "TomlLines",
    "UserConfig",
    "WalConfig",
    "ZaqarConfig",
    "ZaqarToken",
    "default_index_name",
    "dotted",
    "index_problem",
    "listener_clash",
    "load_config",
    "read_text",
    "show",
]


def load_config(path: str | Path, data_dir_override: str | None = None) -> Config:
    """Load FILE: TOML, or a Tarantool 1.5 ``.cfg`` alone (by suffix, or when TOML fails)."""
    source = Path(path)
    text = read_text(source)
    if source.suffix == ".cfg":
        config = _from_tarantool_cfg(source, text)
    else:
        config = _from_toml_or_cfg(source, text)
    if data_dir_override is not None:
        config = config.model_copy(update={"data_dir": absolute_path(Path(data_dir_override))})  # keeps the source
    return config


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
    return _from_toml(source, text, data)


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
    if not data or not set(data) <= tarantool_cfg.OPTIONS | {"space", "namespace"}:
        return False
    spaces = data.get("space", [])
    return not (
        isinstance(spaces, list)
        and any(isinstance(s, dict) and {"id", "name", "indexes"} & set(s) for s in spaces)
    )


def _from_tarantool_cfg(source: Path, text: str) -> Config:
    legacy = tarantool_cfg.parse_tarantool_cfg(text, str(source))
    config = Config.model_validate({}, context={"folder": source.parent})
    return config.model_copy(update={
        "iproto": IprotoConfig(
            listen=legacy.listen or DEFAULT_LISTEN,
            read_only_listen=legacy.read_only_listen,
            admin_listen=legacy.admin_listen,
        ),
        "spaces": ordered_spaces(legacy.spaces),
        "tarantool_cfg": absolute_path(source),
    }).with_source(source)


# -- TOML --------------------------------------------------------------------------------------


def _from_toml(source: Path, text: str, data: dict[str, Any]) -> Config:
    lines = TomlLines(text)
    try:
        config = Config.model_validate(data, context={"folder": source.parent})
    except ValidationError as err:
        raise config_error(str(source), lines.line_of, err) from None
    # The 1.5 cfg's own errors name it as the file names it (relative to the working directory).
    shown = Path(os.path.normpath(source.parent / data["tarantool_cfg"])) if config.tarantool_cfg else None
    return _WholeFile(str(source), lines).settle(config, shown).with_source(source)


class _WholeFile:
    """The rules that need the whole file: the 1.5 cfg it names, listeners, the replica set."""

    def __init__(self, file: str, lines: TomlLines) -> None:
        self.file = file
        self.lines = lines

    def fail(self, path: Key, message: str) -> ConfigError:
        return ConfigError(self.file, self.lines.line_of(path), message, key=dotted(path))

    def settle(self, config: Config, legacy_file: Path | None) -> Config:
        iproto = config.iproto
        spaces = config.spaces
        if legacy_file is not None:
            legacy = tarantool_cfg.load_tarantool_cfg(legacy_file)
            iproto = iproto.model_copy(update={
                "listen": iproto.listen or legacy.listen,
                "read_only_listen": iproto.read_only_listen or legacy.read_only_listen,
                "admin_listen": iproto.admin_listen or legacy.admin_listen,
            })
            spaces = self.merge_spaces(legacy.spaces, spaces)
        if iproto.listen is None:
            iproto = iproto.model_copy(update={"listen": DEFAULT_LISTEN})
        config = config.model_copy(update={"iproto": iproto, "spaces": ordered_spaces(spaces)})
        self.check_listeners(config)
        if config.replication is not None:
            self.check_replication(config, config.replication)
        return config

    def merge_spaces(
        self, legacy: tuple[SpaceConfig, ...], spaces: tuple[SpaceConfig, ...]
    ) -> tuple[SpaceConfig, ...]:
        """The 1.5 cfg's spaces, except those a ``[[space]]`` with the same id replaces."""
        ids = {s.id for s in spaces}
        merged = [s for s in legacy if s.id not in ids]
        for i, space in enumerate(spaces):
            clash = next((s for s in merged if s.name == space.name), None)
            if clash is not None:
                raise self.fail(
                    ("space", i, "name"),
                    f"space name {show(space.name)} is already space {clash.id} of the tarantool_cfg file",
                )
        return (*merged, *spaces)

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

    def check_replication(self, config: Config, rep: ReplicationConfig) -> None:
        path: Key = ("replication",)
        listen = config.iproto.listen
        wildcard = listen is not None and listen.host in ("0.0.0.0", "::")
        uri = rep.peer.uri
        if uri != listen and not (wildcard and listen is not None and uri.port == listen.port):
            raise self.fail((*path, "peers"), f"this instance's uri ({uri}) is not its [iproto] listen "
                            f"address ({listen})")
        if rep.user is not None and rep.user != "admin" and all(u.name != rep.user for u in config.users):
            raise self.fail((*path, "user"), f"replication.user {show(rep.user)} is not one of [[users]]")
        if config.wal.mode != "fsync":
            raise self.fail(path, 'a replica set replicates the write-ahead log: [wal] mode must be "fsync"')
