"""The server's configuration: one typed, frozen value, loaded once at start.

The key names are a contract (``specs/config.md``) that other tools write to. ``load_config`` reads
a TOML file, or a Tarantool 1.5 style ``.cfg`` alone (see ``boxqueue.tarantool_cfg``). Every problem
is a ``ConfigError`` whose text names the file, the line and the key, for example
``conf/x.toml:7: unknown key 'lisen' in [iproto]``; the CLI prints it and exits with status 2.

This module is the public face; import configuration names from here. The parts live in
``config_types`` (the dataclasses, constants and errors), ``config_rules`` (checks both readers
share), ``config_toml_lines`` (where each key is in the TOML text) and ``config_toml_reader``
(TOML data to ``Config``). This module only picks the format and reads the file.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from boxqueue import tarantool_cfg
from boxqueue.config_rules import (
    default_index_name,
    dotted,
    index_problem,
    listener_clash,
    show,
)
from boxqueue.config_toml_lines import TomlLines
from boxqueue.config_toml_reader import TomlReader
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
    read_text,
)

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
    "EtcdConfig",
    "FieldConfig",
    "Grant",
    "IndexConfig",
    "IprotoConfig",
    "Key",
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
        config = replace(config, data_dir=absolute_path(Path(data_dir_override)))
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
    return TomlReader(str(source), text).config(source, data)


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
    return Config(
        source=source,
        data_dir=absolute_path(source.parent / DEFAULT_DATA_DIR),
        iproto=IprotoConfig(
            listen=legacy.listen or DEFAULT_LISTEN,
            read_only_listen=legacy.read_only_listen,
            admin_listen=legacy.admin_listen,
        ),
        wal=WalConfig(),
        guest_grants=None,
        users=(),
        spaces=ordered_spaces(legacy.spaces),
        tarantool_cfg=absolute_path(source),
        deckard=None,
        zaqar=None,
        sonya=None,
    )
