"""The configuration loader: every key of the contract, defaults, merging, paths and errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from boxqueue.config import (
    Address,
    Config,
    ConfigError,
    DeckardConfig,
    FieldConfig,
    Grant,
    IndexConfig,
    PartConfig,
    SonyaConfig,
    SpaceConfig,
    TomlLines,
    UserConfig,
    ZaqarConfig,
    load_config,
)

CONF = Path(__file__).resolve().parents[2] / "conf"

# specs/config.md's example, verbatim.
CONTRACT_EXAMPLE = """\
data_dir = "data"                      # LMDB environment; relative to this file's folder
tarantool_cfg = "tarantool.cfg"        # optional: 1.5 style file; its `space = [...]` list defines
                                       # spaces 0, 1, 2, ... (STR -> string, NUM/NUM64 -> unsigned)

[iproto]
listen = "127.0.0.1:33020"
read_only_listen = "127.0.0.1:33021"   # optional; reads only, writes fail with ER_READONLY (7)
admin_listen = "127.0.0.1:33022"       # admin console (Lua, YAML answers)
max_packet_bytes = 16777216            # larger length prefixes are refused
max_inflight_per_connection = 768      # back-pressure, like net_msg_max

[wal]
mode = "fsync"                         # fsync | write | none

[guest]                                # guest's rights: full while no [[users]] exist,
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]  # else only these

[[users]]
name = "alice"
password = "secret"                    # checked with chap-sha1
grants = [
  { privileges = ["read", "write", "execute"], object_type = "universe" },
  { privileges = ["read"], object_type = "space", object_name = "queue" },
]

[[space]]                              # the TOML way to declare a space (besides tarantool_cfg)
id = 512
name = "jobs"
format = [{ name = "id", type = "unsigned" }, { name = "body", type = "string" }]
indexes = [
  { name = "primary", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] },
]

[deckard]
listen = "127.0.0.1:8081"
default_ttl_minutes = 1440
allow_flush = true

[zaqar]
listen = "127.0.0.1:8888"

[sonya]
listen = "127.0.0.1:8080"
max_key_updates = 100                  # absent: keep every version
service_token = "..."                  # set: secure mode
jwt_ttl_s = 60                         # lifetime of tokens from generate_jwt (Sonya's default)
longpoll_max_wait_s = 30
task_events = ["emails"]               # work tubes whose task changes are published
"""

LEGACY_CFG = """\
primary_port = 40000
secondary_port = 40001
admin_port = 40002
space[0].enabled = 1
space[0].index[0].type = "HASH"
space[0].index[0].unique = 1
space[0].index[0].key_field[0].fieldno = 0
space[0].index[0].key_field[0].type = "NUM"
space[1].enabled = 1
space[1].index[0].type = "TREE"
space[1].index[0].unique = 1
space[1].index[0].key_field[0].fieldno = 0
space[1].index[0].key_field[0].type = "STR"
"""

UNIVERSE_ALL = Grant(privileges=("read", "write", "execute"), object_type="universe")


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def load(folder: Path, text: str, name: str = "x.toml") -> Config:
    return load_config(write(folder, name, text))


def error(folder: Path, text: str, name: str = "x.toml") -> str:
    """The message for ``text``, with the folder left out of the file name."""
    path = write(folder, name, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{folder}/")
    return message[len(f"{folder}/") :]


# -- the contract ---------------------------------------------------------------------------


def test_every_key_of_the_contract(tmp_path: Path) -> None:
    write(tmp_path, "tarantool.cfg", LEGACY_CFG)
    config = load(tmp_path, CONTRACT_EXAMPLE)
    assert config.source == tmp_path / "x.toml"
    assert config.data_dir == tmp_path / "data"
    assert config.tarantool_cfg == tmp_path / "tarantool.cfg"
    iproto = config.iproto
    assert iproto.listen == Address("127.0.0.1", 33020)
    assert iproto.read_only_listen == Address("127.0.0.1", 33021)
    assert iproto.admin_listen == Address("127.0.0.1", 33022)
    assert (iproto.max_packet_bytes, iproto.max_inflight_per_connection) == (16777216, 768)
    assert config.wal.mode == "fsync"
    assert config.guest_grants == (UNIVERSE_ALL,)
    assert config.users == (
        UserConfig(
            name="alice", password="secret", grants=(UNIVERSE_ALL, Grant(privileges=("read",), object_type="space", object_name="queue")),
        ),
    )
    jobs = SpaceConfig(
        id=512,
        name="jobs",
        engine="memtx",
        format=(FieldConfig(name="id", type="unsigned"), FieldConfig(name="body", type="string")),
        indexes=(IndexConfig(name="primary", type="TREE", unique=True, parts=(PartConfig(field=0, type="unsigned"),)),),
    )
    assert [s.name for s in config.spaces] == ["space0", "space1", "jobs"]
    assert config.spaces[2] == jobs
    assert config.deckard == DeckardConfig(listen=Address("127.0.0.1", 8081), default_ttl_minutes=1440, allow_flush=True)
    assert config.zaqar == ZaqarConfig(listen=Address("127.0.0.1", 8888))
    assert config.sonya == SonyaConfig(
        listen=Address("127.0.0.1", 8080),
        max_key_updates=100,
        service_token="...",
        jwt_ttl_s=60,
        longpoll_max_wait_s=30.0,
        task_events=("emails",),
    )


def test_the_configuration_is_frozen(tmp_path: Path) -> None:
    config = load(tmp_path, "")
    with pytest.raises(ValidationError, match="frozen"):
        config.wal.mode = "none"  # type: ignore[misc]


def test_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, "")
    assert config.data_dir == tmp_path / "data"
    assert config.iproto.listen == Address("127.0.0.1", 3301)
    assert (config.iproto.read_only_listen, config.iproto.admin_listen) == (None, None)
    assert (config.iproto.max_packet_bytes, config.iproto.max_inflight_per_connection) == (
        16777216,
        768,
    )
    assert config.wal.mode == "fsync"
    assert config.guest_grants is None
    assert (config.users, config.spaces, config.tarantool_cfg) == ((), (), None)
    assert (config.deckard, config.zaqar, config.sonya) == (None, None, None)


def test_a_facade_section_without_listen_takes_the_default_address(tmp_path: Path) -> None:
    config = load(tmp_path, "[deckard]\n[zaqar]\n[sonya]\n")
    assert config.deckard == DeckardConfig(listen=Address("127.0.0.1", 8081), default_ttl_minutes=1440, allow_flush=True)
    assert config.zaqar == ZaqarConfig(listen=Address("127.0.0.1", 8888))
    assert config.sonya == SonyaConfig(listen=Address("127.0.0.1", 8080))


def test_facade_options(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """\
        [deckard]
        default_ttl_minutes = 5
        allow_flush = false
        [sonya]
        listen = "0.0.0.0:0"
        longpoll_max_wait_s = 0.5
        task_events = ["a", "b"]
        """,
    )
    assert config.deckard == DeckardConfig(listen=Address("127.0.0.1", 8081), default_ttl_minutes=5, allow_flush=False)
    assert config.sonya is not None
    assert config.sonya.listen == Address("0.0.0.0", 0)
    assert (config.sonya.longpoll_max_wait_s, config.sonya.task_events) == (0.5, ("a", "b"))
    assert (config.sonya.max_key_updates, config.sonya.service_token) == (None, None)


def test_the_shipped_default() -> None:
    config = load_config(CONF / "boxqueue.toml")
    assert config.data_dir == CONF.parent / "data"
    assert config.iproto.listen == Address("127.0.0.1", 33020)
    assert config.iproto.read_only_listen == Address("127.0.0.1", 33021)
    assert config.iproto.admin_listen == Address("127.0.0.1", 33022)
    assert config.wal.mode == "fsync"
    assert (config.guest_grants, config.users, config.tarantool_cfg) == (None, (), None)
    assert config.deckard == DeckardConfig(listen=Address("127.0.0.1", 8081))
    assert config.zaqar == ZaqarConfig(listen=Address("127.0.0.1", 8888))
    assert config.sonya == SonyaConfig(listen=Address("127.0.0.1", 8080))
    (queue,) = config.spaces
    assert (queue.id, queue.name, queue.engine, queue.temporary) == (0, "queue", "memtx", False)
    assert [(f.name, f.type) for f in queue.format] == [
        ("id", "string"), ("tube", "string"), ("status", "string"), ("event", "unsigned"),
        ("ipri", "unsigned"), ("pri", "unsigned"), ("cid", "unsigned"), ("created", "unsigned"),
        ("ttl", "unsigned"), ("ttr", "unsigned"), ("cbury", "unsigned"), ("ctaken", "unsigned"),
    ]
    s, u = "string", "unsigned"
    assert queue.indexes == (
        IndexConfig(name="task_id", type="TREE", unique=True, parts=(PartConfig(field=0, type=s),)),
        IndexConfig(
            name="tube_status", type="TREE", unique=False,
            parts=(PartConfig(field=1, type=s), PartConfig(field=2, type=s), PartConfig(field=4, type=u), PartConfig(field=5, type=u)),
        ),
        IndexConfig(name="tube_event", type="TREE", unique=False, parts=(PartConfig(field=1, type=s), PartConfig(field=3, type=u))),
        IndexConfig(
            name="put_unique", type="TREE", unique=False,
            parts=(PartConfig(field=1, type=s), PartConfig(field=2, type=s), PartConfig(field=12, type="scalar", is_nullable=True)),
        ),
    )


# -- spaces ---------------------------------------------------------------------------------


def test_space_and_index_defaults(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """\
        [[space]]
        name = "t"
        format = [{ name = "k", type = "unsigned" }, { name = "v", type = "str", is_nullable = true }, { name = "rest" }]
        indexes = [{ parts = [[0, "uint"]] }, { parts = ["v"] }, { type = "hash", parts = [{ field = 0 }] }]
        """,
    )
    (space,) = config.spaces
    assert (space.id, space.engine, space.temporary) == (None, "memtx", False)
    assert space.format == (
        FieldConfig(name="k", type="unsigned"), FieldConfig(name="v", type="string", is_nullable=True), FieldConfig(name="rest", type="any")
    )
    assert space.indexes == (
        IndexConfig(name="primary", type="TREE", unique=True, parts=(PartConfig(field=0, type="unsigned"),)),
        IndexConfig(name="i1", type="TREE", unique=True, parts=(PartConfig(field=1, type="string", is_nullable=True),)),
        IndexConfig(name="i2", type="HASH", unique=True, parts=(PartConfig(field=0, type="unsigned"),)),
    )


def test_space_name_defaults_from_its_id(tmp_path: Path) -> None:
    config = load(tmp_path, "[[space]]\nid = 7\nengine = 'vinyl'\ntemporary = true\n")
    assert config.spaces == (SpaceConfig(id=7, name="space7", engine="vinyl", format=(), indexes=(), temporary=True),)


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("num", "unsigned"), ("NUM", "unsigned"), ("uint", "unsigned"), ("NUM64", "unsigned"),
        ("str", "string"), ("STR", "string"), ("int", "integer"), ("Unsigned", "unsigned"),
        ("number", "number"), ("double", "double"), ("boolean", "boolean"),
        ("varbinary", "varbinary"), ("scalar", "scalar"), ("uuid", "uuid"),
        ("decimal", "decimal"), ("datetime", "datetime"),
    ],
)
def test_field_type_names_are_stored_canonical(tmp_path: Path, written: str, canonical: str) -> None:
    config = load(
        tmp_path,
        f"""\
        [[space]]
        name = "t"
        format = [{{ name = "a", type = "{written}" }}]
        indexes = [{{ parts = [[0, "{written}"]] }}]
        """,
    )
    assert config.spaces[0].format[0].type == canonical
    assert config.spaces[0].indexes[0].parts[0].type == canonical


@pytest.mark.parametrize("ftype", ["any", "array", "map", "interval"])
def test_unindexable_types_are_fine_in_a_format(tmp_path: Path, ftype: str) -> None:
    config = load(tmp_path, f'[[space]]\nname = "t"\nformat = [{{ name = "a", type = "{ftype}" }}]\n')
    assert config.spaces[0].format[0].type == ftype


def test_spaces_are_ordered_by_id_then_declaration(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        '[[space]]\nname = "b"\n[[space]]\nid = 9\n[[space]]\nname = "a"\n[[space]]\nid = 3\n',
    )
    assert [s.name for s in config.spaces] == ["space3", "space9", "b", "a"]


# -- tarantool_cfg and merging ----------------------------------------------------------------


def test_a_cfg_space_is_replaced_by_a_toml_space_with_the_same_id(tmp_path: Path) -> None:
    write(tmp_path, "t.cfg", LEGACY_CFG)
    config = load(
        tmp_path,
        """\
        tarantool_cfg = "t.cfg"
        [[space]]
        id = 0
        name = "queue"
        indexes = [{ parts = [[0, "string"]] }]
        """,
    )
    assert [(s.id, s.name) for s in config.spaces] == [(0, "queue"), (1, "space1")]
    assert config.spaces[0].indexes[0].parts == (PartConfig(field=0, type="string"),)
    assert config.spaces[1].indexes[0].parts == (PartConfig(field=0, type="string"),)


def test_cfg_ports_fill_only_the_listeners_the_toml_leaves_unset(tmp_path: Path) -> None:
    write(tmp_path, "t.cfg", LEGACY_CFG)
    config = load(tmp_path, 'tarantool_cfg = "t.cfg"\n[iproto]\nlisten = "127.0.0.1:5000"\n')
    assert config.iproto.listen == Address("127.0.0.1", 5000)
    assert config.iproto.read_only_listen == Address("127.0.0.1", 40001)
    assert config.iproto.admin_listen == Address("127.0.0.1", 40002)
    config = load(tmp_path, 'tarantool_cfg = "t.cfg"\n')
    assert config.iproto.listen == Address("127.0.0.1", 40000)


def test_a_cfg_without_ports_leaves_the_default_listener(tmp_path: Path) -> None:
    write(tmp_path, "t.cfg", "readahead = 1\n")
    config = load(tmp_path, 'tarantool_cfg = "t.cfg"\n')
    assert config.iproto.listen == Address("127.0.0.1", 3301)
    assert config.iproto.admin_listen is None


def test_a_toml_space_may_not_take_the_name_of_a_cfg_space(tmp_path: Path) -> None:
    write(tmp_path, "t.cfg", LEGACY_CFG)
    text = 'tarantool_cfg = "t.cfg"\n[[space]]\nid = 600\nname = "space1"\n'
    assert error(tmp_path, text) == (
        'x.toml:4: space name "space1" is already space 1 of the tarantool_cfg file'
    )


def test_errors_in_the_cfg_name_the_cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "t.cfg", "readahead = 1\nprimary_port = -1\n")
    assert error(tmp_path, 'tarantool_cfg = "t.cfg"\n') == "t.cfg:2: bad port in primary_port: -1"
    write(tmp_path, "conf/x.toml", 'tarantool_cfg = "../t.cfg"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^t\.cfg:2: bad port in primary_port: -1$"):
        load_config("conf/x.toml")


def test_cfg_listeners_clashing_with_toml_ones(tmp_path: Path) -> None:
    write(tmp_path, "t.cfg", "primary_port = 1\nadmin_port = 8081\n")
    text = 'tarantool_cfg = "t.cfg"\n[deckard]\n'
    assert error(tmp_path, text) == (
        "x.toml:2: deckard.listen and iproto.admin_listen are both 127.0.0.1:8081"
    )


def test_a_missing_cfg_names_the_toml_line(tmp_path: Path) -> None:
    message = error(tmp_path, '\ntarantool_cfg = "nope.cfg"\n')
    assert message == f"x.toml:2: tarantool_cfg: no such file: {tmp_path / 'nope.cfg'}"


# -- paths ----------------------------------------------------------------------------------


def test_relative_paths_are_relative_to_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "conf/legacy/t.cfg", "primary_port = 1\n")
    write(tmp_path, "conf/x.toml", 'data_dir = "../data"\ntarantool_cfg = "legacy/t.cfg"\n')
    monkeypatch.chdir(tmp_path / "conf" / "legacy")
    config = load_config(Path("..") / "x.toml")
    assert config.data_dir == tmp_path / "data"
    assert config.tarantool_cfg == tmp_path / "conf" / "legacy" / "t.cfg"
    assert config.data_dir.is_absolute()


def test_absolute_data_dir(tmp_path: Path) -> None:
    config = load(tmp_path, f'data_dir = "{tmp_path / "elsewhere"}"\n')
    assert config.data_dir == tmp_path / "elsewhere"


def test_data_dir_override_is_relative_to_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "conf/x.toml", 'data_dir = "../data"\n')
    monkeypatch.chdir(tmp_path / "conf")
    assert load_config(path, data_dir_override="here").data_dir == tmp_path / "conf" / "here"
    assert load_config(path, data_dir_override="/abs/d").data_dir == Path("/abs/d")


# -- file kinds -----------------------------------------------------------------------------


def test_a_cfg_file_alone(tmp_path: Path) -> None:
    config = load(tmp_path, LEGACY_CFG, name="box.cfg")
    assert config.iproto.listen == Address("127.0.0.1", 40000)
    assert config.data_dir == tmp_path / "data"
    assert [s.id for s in config.spaces] == [0, 1]
    assert config.tarantool_cfg == tmp_path / "box.cfg"


def test_a_file_that_is_not_toml_is_read_as_a_cfg(tmp_path: Path) -> None:
    config = load(tmp_path, LEGACY_CFG, name="box.conf")
    assert [s.id for s in config.spaces] == [0, 1]


def test_a_cfg_of_plain_options_is_recognised_though_it_is_valid_toml(tmp_path: Path) -> None:
    config = load(tmp_path, "primary_port = 40000\nslab_alloc_arena = 0.1\n", name="box.conf")
    assert config.iproto.listen == Address("127.0.0.1", 40000)
    # ... but a .toml file is always TOML
    assert error(tmp_path, "primary_port = 40000\n") == "x.toml:1: unknown key 'primary_port'"


def test_neither_toml_nor_cfg(tmp_path: Path) -> None:
    assert error(tmp_path, "[iproto\n", name="x.conf") == (
        "x.conf:1: cannot parse: expected ']' at the end of a table declaration (column 8)"
    )
    # readable as a cfg, with a cfg problem: that problem is reported...
    assert error(tmp_path, "space[0].enabled = 1\n", name="x.conf") == (
        "x.conf:1: missing key 'index' in space[0]"
    )
    # ... unless the file says it is TOML
    assert error(tmp_path, "data_dir = 'd'\nwal.mode = fsync\n") == (
        "x.toml:2: cannot parse: invalid value (column 12)"
    )


def test_a_one_line_nested_cfg_is_valid_toml_but_still_a_cfg(tmp_path: Path) -> None:
    text = 'space = [{ enabled = 1, index = [{ type = "HASH", unique = 1, key_field = [{ fieldno = 0, type = "NUM" }] }] }]\n'
    config = load(tmp_path, text, name="box.conf")
    assert config.spaces[0].indexes == (IndexConfig(name="primary", type="HASH", unique=True, parts=(PartConfig(field=0, type="unsigned"),)),)
    config = load(tmp_path, '[[space]]\nname = "a"\n', name="box.conf")
    assert config.spaces[0].name == "a"


# -- errors ---------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.toml")
    assert str(info.value) == f"{tmp_path / 'missing.toml'}: no such file"
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory, not a file"


def test_missing_file_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^missing\.toml: no such file$"):
        load_config("missing.toml")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_bytes(b'data_dir = "d"\n# \xff\n')
    with pytest.raises(ConfigError, match=r"x\.toml:2: not UTF-8 text$"):
        load_config(path)


def test_toml_syntax_error_has_the_line(tmp_path: Path) -> None:
    assert error(tmp_path, '[iproto]\nlisten = "a:1"\nmax_packet_bytes = \n') == (
        "x.toml:3: cannot parse: invalid value (column 20)"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('data_dir = "d"\n\nlisen = 1\n', "x.toml:3: unknown key 'lisen'"),
        (
            '# comment\n[iproto]\nlisten = "127.0.0.1:1"\n\nlisen = "x"\n',
            "x.toml:5: unknown key 'lisen' in [iproto]",
        ),
        ("[wal]\nmode = 'none'\nfsync = true\n", "x.toml:3: unknown key 'fsync' in [wal]"),
        ("[zaqar]\nport = 1\n", "x.toml:2: unknown key 'port' in [zaqar]"),
        ("[deckard]\nttl = 1\n", "x.toml:2: unknown key 'ttl' in [deckard]"),
        ("[sonya]\ntoken = 'x'\n", "x.toml:2: unknown key 'token' in [sonya]"),
        ("[guest]\ngrant = []\n", "x.toml:2: unknown key 'grant' in [guest]"),
        ("[[users]]\nname = 'a'\npasswd = 'b'\n", "x.toml:3: unknown key 'passwd' in users[0]"),
        ("[[spaces]]\nid = 1\n", "x.toml:1: unknown key 'spaces'"),
        ("iproto.lisen = 'x'\n", "x.toml:1: unknown key 'lisen' in [iproto]"),
    ],
)
def test_unknown_keys_are_named_with_their_line(tmp_path: Path, text: str, message: str) -> None:
    assert error(tmp_path, text) == message


def test_unknown_keys_deep_inside_inline_tables(tmp_path: Path) -> None:
    text = """\
        [[space]]
        name = "a"
        indexes = [{ parts = [[0, "unsigned"]] }]

        [[space]]
        name = "b"
        indexes = [
          { parts = [[0, "unsigned"]] },
          { name = "x", parts = [
              [1, "string"],
            ], uniq = false },
        ]
        """
    assert error(tmp_path, text) == "x.toml:11: unknown key 'uniq' in space[1].indexes[1]"
    text = """\
        [[space]]
        name = "a"
        indexes = [{ parts = [
          { field = 0, type = "unsigned" },
          { field = 1, typ = "string" },
        ] }]
        """
    assert error(tmp_path, text) == "x.toml:5: unknown key 'typ' in space[0].indexes[0].parts[1]"


def test_lines_are_found_past_tricky_strings(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        data_dir = \"\"\"
        [iproto]
        lisen = 1
        \"\"\"
        [sonya]
        "task_events" = ['c:\\x[1]', "a\\"]b", \'\'\'
        ]'\'\'\'] # ]
        [iproto]
        'lisen' = "a:1"
        """
    )
    assert error(tmp_path, text) == "x.toml:9: unknown key 'lisen' in [iproto]"
    text = 'data_dir = """a\\"""b"""\n[iproto]\nlisten = "a:1"\n"lis\\u0065n" = "x:1"\n'
    assert error(tmp_path, text) == "x.toml:4: unknown key 'lisen' in [iproto]"


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("127.0.0.1:99999", 'bad port in iproto.listen: "127.0.0.1:99999"'),
        ("127.0.0.1:-1", 'bad port in iproto.listen: "127.0.0.1:-1"'),
        ("127.0.0.1:", 'bad port in iproto.listen: "127.0.0.1:"'),
        ("127.0.0.1:http", 'bad port in iproto.listen: "127.0.0.1:http"'),
        (
            "127.0.0.1",
            'bad address in iproto.listen: "127.0.0.1" (expected "host:port", IPv6 as "[::1]:3301")',
        ),
        (
            "::1:3301",
            'bad address in iproto.listen: "::1:3301" (expected "host:port", IPv6 as "[::1]:3301")',
        ),
        (
            "[nope]:3301",
            'bad address in iproto.listen: "[nope]:3301" (expected "host:port", IPv6 as "[::1]:3301")',
        ),
    ],
)
def test_bad_listen_addresses(tmp_path: Path, listen: str, message: str) -> None:
    assert error(tmp_path, f'\n\n[iproto]\nlisten = "{listen}"\n') == f"x.toml:4: {message}"


def test_good_listen_addresses(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """\
        [iproto]
        listen = "[::1]:3301"
        read_only_listen = "localhost:0"
        admin_listen = "0.0.0.0:65535"
        """,
    )
    assert config.iproto.listen == Address("::1", 3301)
    assert str(config.iproto.listen) == "[::1]:3301"
    assert config.iproto.read_only_listen == Address("localhost", 0)
    assert config.iproto.admin_listen == Address("0.0.0.0", 65535)


def test_two_listeners_on_one_address(tmp_path: Path) -> None:
    text = '[iproto]\nlisten = "127.0.0.1:8888"\n\n[zaqar]\n'
    assert error(tmp_path, text) == "x.toml:4: zaqar.listen and iproto.listen are both 127.0.0.1:8888"
    text = '[iproto]\nlisten = "127.0.0.1:1"\nadmin_listen = "127.0.0.1:1"\n'
    assert error(tmp_path, text) == (
        "x.toml:3: iproto.admin_listen and iproto.listen are both 127.0.0.1:1"
    )
    text = '[iproto]\nlisten = "127.0.0.1:0"\nadmin_listen = "127.0.0.1:0"\n'
    assert load(tmp_path, text).iproto.admin_listen == Address("127.0.0.1", 0)


def test_bad_wal_mode(tmp_path: Path) -> None:
    assert error(tmp_path, '[wal]\nmode = "fsnyc"\n') == (
        'x.toml:2: bad wal.mode: "fsnyc" (expected fsync, write or none)'
    )


def test_wal_checkpoint_keys(tmp_path: Path) -> None:
    default = load(tmp_path, "[wal]\n").wal
    assert (default.checkpoint_interval_s, default.checkpoint_bytes) == (5.0, 16 << 20)
    wal = load(tmp_path, "[wal]\ncheckpoint_interval_s = 0.5\ncheckpoint_bytes = 65536\n").wal
    assert (wal.mode, wal.checkpoint_interval_s, wal.checkpoint_bytes) == ("fsync", 0.5, 65536)
    assert error(tmp_path, "[wal]\ncheckpoint_interval_s = 0\n") == (
        "x.toml:2: wal.checkpoint_interval_s must be at least 0.001"
    )
    assert error(tmp_path, "[wal]\ncheckpoint_bytes = 10\n") == (
        "x.toml:2: wal.checkpoint_bytes must be at least 4096, not 10"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("data_dir = 1\n", "x.toml:1: data_dir must be a string, not 1"),
        ("iproto = 1\n", "x.toml:1: iproto must be a table, not 1"),
        ("[iproto]\nmax_packet_bytes = '1M'\n", 'x.toml:2: iproto.max_packet_bytes must be an integer, not "1M"'),
        ("[iproto]\nmax_inflight_per_connection = 0\n", "x.toml:2: iproto.max_inflight_per_connection must be at least 1, not 0"),
        ("[iproto]\nlisten = 3301\n", 'x.toml:2: iproto.listen must be a "host:port" string, not 3301'),
        ("[deckard]\nallow_flush = 1\n", "x.toml:2: deckard.allow_flush must be true or false, not 1"),
        ("[deckard]\ndefault_ttl_minutes = 0\n", "x.toml:2: deckard.default_ttl_minutes must be at least 1, not 0"),
        ("[sonya]\nlongpoll_max_wait_s = 'x'\n", 'x.toml:2: sonya.longpoll_max_wait_s must be a number, not "x"'),
        ("[sonya]\nlongpoll_max_wait_s = -1\n", "x.toml:2: sonya.longpoll_max_wait_s must be at least 0"),
        ("[sonya]\ntask_events = ['a', 2]\n", "x.toml:2: sonya.task_events[1] must be a string, not 2"),
        ("[sonya]\nservice_token = ''\n", "x.toml:2: sonya.service_token is empty"),
        ("[sonya]\nmax_key_updates = -1\n", "x.toml:2: sonya.max_key_updates must be at least 0, not -1"),
        ("[sonya]\njwt_ttl_s = true\n", "x.toml:2: sonya.jwt_ttl_s must be an integer, not true"),
        ("space = 1\n", "x.toml:1: space must be an array, not 1"),
        ("space = [1]\n", "x.toml:1: space[0] must be a table, not 1"),
    ],
)
def test_wrong_value_types(tmp_path: Path, text: str, message: str) -> None:
    assert error(tmp_path, text) == message


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("id = -1", "x.toml:3: space[0].id must be 0..2147483647, not -1"),
        ("id = true", "x.toml:3: space[0].id must be an integer, not true"),
        ("id = 1.5", "x.toml:3: space[0].id must be an integer, not 1.5"),
        ("engine = 'sophia'", 'x.toml:3: bad space[0].engine: "sophia" (expected memtx or vinyl)'),
        (
            "format = [{ name = 'a', type = 'strng' }]",
            'x.toml:3: unknown field type in space[0].format[0].type: "strng"',
        ),
        ("format = [{ type = 'string' }]", "x.toml:3: missing key 'name' in space[0].format[0]"),
        ("format = [{ name = 'a' }, { name = 'a' }]", 'x.toml:3: duplicate field name "a"'),
        (
            "indexes = [{ parts = [[0, 'unsinged']] }]",
            'x.toml:3: unknown field type in space[0].indexes[0].parts[0].type: "unsinged"',
        ),
        ("indexes = [{ parts = [[0, 'map']] }]", "x.toml:3: space[0].indexes[0].parts[0]: a map field cannot be indexed"),
        ("indexes = [{ parts = [[0, 'any']] }]", "x.toml:3: space[0].indexes[0].parts[0]: a any field cannot be indexed"),
        ("indexes = [{ type = 'BITSET', parts = [[0, 'unsigned']] }]", 'x.toml:3: bad space[0].indexes[0].type: "BITSET" (expected TREE or HASH)'),
        ("indexes = [{ unique = false, parts = [[0, 'unsigned']] }]", "x.toml:3: space[0].indexes[0]: the primary key (index 0) must be unique"),
        ("indexes = [{ parts = [{ field = 0, type = 'unsigned', is_nullable = true }] }]", "x.toml:3: space[0].indexes[0]: the primary key (index 0) cannot have nullable parts"),
        ("indexes = [{ parts = [[0]] }, { type = 'HASH', unique = false, parts = [[1]] }]", "x.toml:3: space[0].indexes[1]: a HASH index must be unique"),
        ("indexes = [{ parts = [[0], [0]] }]", "x.toml:3: space[0].indexes[0]: the same field is indexed twice"),
        ("indexes = [{ parts = [] }]", "x.toml:3: space[0].indexes[0]: an index needs at least one part"),
        ("indexes = [{ name = 'a' }]", "x.toml:3: missing key 'parts' in space[0].indexes[0]"),
        ("indexes = [{ parts = [[0]] }, { name = 'primary', parts = [[1]] }]", 'x.toml:3: duplicate index name "primary"'),
        ("indexes = [{ parts = [[-1, 'unsigned']] }]", "x.toml:3: space[0].indexes[0].parts[0].field must be a field number (0-based) or name, not -1"),
        ("indexes = [{ parts = [['nope']] }]", 'x.toml:3: no field named "nope" in the format'),
        ("indexes = [{ parts = [[0, 'unsigned', 1]] }]", 'x.toml:3: space[0].indexes[0].parts[0]: expected [field, "type"]'),
        ("indexes = [{ parts = [{ type = 'unsigned' }] }]", "x.toml:3: missing key 'field' in space[0].indexes[0].parts[0]"),
        ("indexes = [{ parts = [{ field = 0, type = 'unsigned', collation = 'unicode' }] }]", "x.toml:3: space[0].indexes[0].parts[0]: only string parts have a collation"),
        ("indexes = [{ parts = [{ field = 0, type = 'string', collation = 'klingon' }] }]", 'x.toml:3: unknown collation "klingon"'),
        ("temporary = 'yes'", 'x.toml:3: space[0].temporary must be true or false, not "yes"'),
        ("format = [{ name = 'a', type = 'unsigned' }]\nindexes = [{ parts = [[0, 'string']] }]", "x.toml:4: space[0].indexes[0].parts[0]: field 0 is unsigned in the format, not string"),
    ],
)
def test_bad_spaces(tmp_path: Path, space: str, message: str) -> None:
    assert error(tmp_path, f'[[space]]\nname = "t"\n{space}\n') == message


def test_a_space_needs_a_name_or_an_id(tmp_path: Path) -> None:
    assert error(tmp_path, "\n[[space]]\nengine = 'memtx'\n") == "x.toml:2: missing key 'name' in space[0]"


def test_duplicate_spaces(tmp_path: Path) -> None:
    text = "[[space]]\nid = 1\n[[space]]\nid = 1\nname = 'b'\n"
    assert error(tmp_path, text) == "x.toml:4: duplicate space id 1"
    text = "[[space]]\nname = 'a'\n[[space]]\nname = 'a'\n"
    assert error(tmp_path, text) == 'x.toml:4: duplicate space name "a"'


def test_compatible_part_types(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """\
        [[space]]
        name = "t"
        format = [{ name = "a", type = "unsigned" }, { name = "b" }, { name = "c", type = "string" }]
        indexes = [{ parts = [[0, "number"]] }, { parts = [[1, "string"]] }, { parts = [[2, "scalar"]] }]
        """,
    )
    assert [i.parts[0].type for i in config.spaces[0].indexes] == ["number", "string", "scalar"]


def test_collations(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """\
        [[space]]
        name = "t"
        indexes = [{ parts = [{ field = 0, type = "string", collation = "unicode_ci" }] }]
        """,
    )
    assert config.spaces[0].indexes[0].parts == (PartConfig(field=0, type="string", collation="unicode_ci"),)


# -- users and grants -----------------------------------------------------------------------


def test_grants(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """\
        [guest]
        grants = [
          { privileges = ["execute", "read", "read"], object_type = "function", object_name = "queue.put" },
        ]
        [[users]]
        name = "bob"
        password = ""
        [[users]]
        name = "carol"
        password = "pw"
        grants = [{ privileges = ["write"], object_type = "space", object_name = "jobs" }]
        """,
    )
    assert config.guest_grants == (Grant(privileges=("read", "execute"), object_type="function", object_name="queue.put"),)
    assert config.users == (
        UserConfig(name="bob", password="", grants=()),
        UserConfig(name="carol", password="pw", grants=(Grant(privileges=("write",), object_type="space", object_name="jobs"),)),
    )


def test_an_empty_guest_section_means_no_rights(tmp_path: Path) -> None:
    assert load(tmp_path, "[guest]\n").guest_grants == ()


@pytest.mark.parametrize(
    ("grant", "message"),
    [
        ("{ privileges = ['drop'], object_type = 'universe' }", 'bad guest.grants[0].privileges[0]: "drop" (expected read, write or execute)'),
        ("{ privileges = [], object_type = 'universe' }", "guest.grants[0].privileges is empty"),
        ("{ privileges = ['read'], object_type = 'sequence' }", 'bad guest.grants[0].object_type: "sequence" (expected universe, space or function)'),
        ("{ privileges = ['read'], object_type = 'space' }", "guest.grants[0]: a space grant needs an object_name"),
        ("{ privileges = ['read'], object_type = 'universe', object_name = 'x' }", "guest.grants[0]: the universe has no object_name"),
        ("{ object_type = 'universe' }", "missing key 'privileges' in guest.grants[0]"),
        ("{ privileges = 'read', object_type = 'universe' }", 'guest.grants[0].privileges must be an array, not "read"'),
    ],
)
def test_bad_grants(tmp_path: Path, grant: str, message: str) -> None:
    assert error(tmp_path, f"[guest]\ngrants = [\n  {grant},\n]\n") == f"x.toml:3: {message}"


def test_bad_users(tmp_path: Path) -> None:
    text = "[[users]]\nname = 'a'\npassword = 'x'\n[[users]]\nname = 'a'\npassword = 'y'\n"
    assert error(tmp_path, text) == 'x.toml:5: duplicate user name "a"'
    text = "[[users]]\nname = 'guest'\npassword = 'x'\n"
    assert error(tmp_path, text) == "x.toml:2: guest is configured with [guest], not [[users]]"
    text = "[[users]]\nname = 'a'\n"
    assert error(tmp_path, text) == "x.toml:1: missing key 'password' in users[0]"
    text = "[[users]]\nname = ''\npassword = 'x'\n"
    assert error(tmp_path, text) == "x.toml:2: users[0].name is empty"


# -- the line finder ------------------------------------------------------------------------


def test_toml_lines() -> None:
    lines = TomlLines(
        textwrap.dedent(
            """\
            a = 1
            [t]
            b = { c = [1,
              { d = 2 }] }

            [[arr]]
            x = 1
            [[arr]]
            [arr.sub]
            y = 2
            [[arr.items]]
            z = 3
            """
        )
    )
    assert lines.line_of(("a",)) == 1
    assert lines.line_of(("t",)) == 2
    assert lines.line_of(("t", "b", "c", 1, "d")) == 4
    assert lines.line_of(("t", "b", "c", 0)) == 3
    assert lines.line_of(("arr", 0, "x")) == 7
    assert lines.line_of(("arr", 1)) == 8
    assert lines.line_of(("arr", 1, "sub", "y")) == 10
    assert lines.line_of(("arr", 1, "items", 0, "z")) == 12
    assert lines.line_of(("arr", 1, "nothing", "here")) == 8
    assert lines.line_of(("nowhere",)) is None


# -- [lua] ----------------------------------------------------------------------------------


def test_lua_limits(tmp_path: Path) -> None:
    default = load(tmp_path, 'data_dir = "d"\n')
    assert (default.lua.time_limit_s, default.lua.memory_limit_bytes) == (5.0, 268435456)
    config = load(tmp_path, '[lua]\ntime_limit_s = 0.5\nmemory_limit_bytes = 33554432\n')
    assert (config.lua.time_limit_s, config.lua.memory_limit_bytes) == (0.5, 33554432)
    assert load_config(CONF / "boxqueue.toml").lua == default.lua


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[lua]\ntime_limit = 1\n", "x.toml:2: unknown key 'time_limit' in [lua]"),
        ("[lua]\nmemory_limit_bytes = 1000\n", "x.toml:2: lua.memory_limit_bytes must be at least 1048576, not 1000"),
        ("[lua]\ntime_limit_s = 0\n", "x.toml:2: lua.time_limit_s must be at least 0.001"),
    ],
)
def test_lua_errors(tmp_path: Path, text: str, message: str) -> None:
    assert error(tmp_path, text).startswith(message)


# -- security: TLS, tokens, limits ------------------------------------------------------------


def test_tls_tokens_and_limits(tmp_path: Path) -> None:
    for name in ("s.crt", "s.key", "ca.crt"):
        write(tmp_path, f"certs/{name}", "pem")
    config = load(tmp_path, """
        [iproto]
        max_connections = 100
        max_waiting_takes_per_connection = 8
        [iproto.tls]
        cert_file = "certs/s.crt"
        key_file = "certs/s.key"
        ca_file = "certs/ca.crt"
        ciphers = "ECDHE+AESGCM"
        [deckard]
        token = "t0k"
        max_connections = 5
        [deckard.tls]
        cert_file = "certs/s.crt"
        key_file = "certs/s.key"
        ca_file = "certs/ca.crt"
        client_auth = "optional"
        [zaqar]
        auth = "token"
        tokens = [{ token = "a", project = "p1" }, { token = "b", project = "p2", admin = true }]
        max_connections = 6
        header_timeout_s = 2.5
        body_timeout_s = 7
        [zaqar.tls]
        cert_file = "certs/s.crt"
        key_file = "certs/s.key"
        [sonya]
        [sonya.tls]
        cert_file = "certs/s.crt"
        key_file = "certs/s.key"
    """)
    tls = config.iproto.tls
    assert tls is not None and tls.cert_file == tmp_path / "certs/s.crt" and tls.ca_file == tmp_path / "certs/ca.crt"
    assert tls.ciphers == "ECDHE+AESGCM" and not hasattr(tls, "client_auth")  # Deckard's TLS alone has it
    assert (config.iproto.max_connections, config.iproto.max_waiting_takes_per_connection) == (100, 8)
    assert config.deckard is not None and config.deckard.token == "t0k" and config.deckard.max_connections == 5
    assert config.deckard.tls is not None and config.deckard.tls.client_auth == "optional"
    assert config.zaqar is not None and config.zaqar.auth == "token"
    assert [(t.token, t.project, t.admin) for t in config.zaqar.tokens] == [("a", "p1", False), ("b", "p2", True)]
    assert (config.zaqar.max_connections, config.zaqar.header_timeout_s, config.zaqar.body_timeout_s) == (6, 2.5, 7)
    assert config.sonya is not None and config.sonya.body_timeout_s == 60.0  # the default
    assert config.zaqar.tls is not None and config.zaqar.tls.ca_file is None
    assert config.sonya is not None and config.sonya.tls is not None and config.sonya.max_connections is None


def test_security_mistakes_name_the_key(tmp_path: Path) -> None:
    write(tmp_path, "s.crt", "pem")
    assert error(tmp_path, '[iproto.tls]\ncert_file = "s.crt"\n') == "x.toml:1: missing key 'key_file' in iproto.tls"
    assert error(tmp_path, '[iproto.tls]\ncert_file = "s.crt"\nkey_file = "nope.key"\n') == (
        f"x.toml:3: iproto.tls.key_file: cannot read {tmp_path}/nope.key")
    assert error(tmp_path, '[zaqar.tls]\ncert_file = "s.crt"\nkey_file = "s.crt"\nclient_auth = "optional"\n') == (
        "x.toml:4: unknown key 'client_auth' in zaqar.tls")
    assert error(tmp_path, '[zaqar]\nauth = "token"\n') == (
        'x.toml:2: zaqar.auth = "token" needs at least one entry in zaqar.tokens')
    assert error(tmp_path, '[zaqar]\nauth = "keystone"\n') == 'x.toml:2: bad zaqar.auth: "keystone" (expected none or token)'
    assert error(tmp_path, '[zaqar]\nauth = "token"\ntokens = [{ token = "a", project = "p", admin = "yes" }]\n') == (
        'x.toml:3: zaqar.tokens[0].admin must be true or false, not "yes"')
    assert error(tmp_path, '[deckard]\ntoken = "has space"\n') == (
        "x.toml:2: deckard.token must be non-empty visible ASCII (it is sent in a header)")
    assert error(tmp_path, '[sonya]\nmax_connections = 0\n') == "x.toml:2: sonya.max_connections must be at least 1, not 0"


# specs/config.md's [replication] example (the contract's names), for an instance listening where
# its entry in peers says.
REPLICATION_EXAMPLE = """\
[iproto]
listen = "127.0.0.1:3301"

[[users]]
name = "replicator"
password = "..."
grants = [{ privileges = ["read"], object_type = "universe" }]

[replication]
name = "n1"
peers = [
  { name = "n1", uri = "127.0.0.1:3301" },
  { name = "n2", uri = "127.0.0.1:3302" },
  { name = "n3", uri = "127.0.0.1:3303" },
]
user = "replicator"
password = "..."
synchro_quorum = 2
synchro_timeout_s = 5.0
heartbeat_s = 1.0

[replication.etcd]
endpoints = ["127.0.0.1:2379"]
prefix = "/boxqueue/main"
lease_ttl_s = 3
"""


def test_the_replication_section(tmp_path: Path) -> None:
    from boxqueue.config import EtcdConfig, PeerConfig

    rep = load(tmp_path, REPLICATION_EXAMPLE).replication
    assert rep is not None
    assert rep.name == "n1" and rep.peer == PeerConfig(name="n1", uri=Address("127.0.0.1", 3301))
    assert [p.name for p in rep.peers] == ["n1", "n2", "n3"] and rep.replica_id("n3") == 3
    assert (rep.synchro_quorum, rep.synchro_timeout_s, rep.heartbeat_s) == (2, 5.0, 1.0)
    assert (rep.user, rep.password) == ("replicator", "...")
    assert rep.etcd == EtcdConfig(endpoints=("127.0.0.1:2379",), prefix="/boxqueue/main", lease_ttl_s=3)
    assert load(tmp_path, "").replication is None
    # the quorum's default: a majority of the peers
    five = REPLICATION_EXAMPLE.replace("synchro_quorum = 2\n", "").replace(
        '  { name = "n3", uri = "127.0.0.1:3303" },\n',
        '  { name = "n3", uri = "127.0.0.1:3303" },\n  { name = "n4", uri = "h4:1" },\n  { name = "n5", uri = "h5:1" },\n')
    assert load(tmp_path, five).replication.synchro_quorum == 3
    # 1 (asynchronous) and a majority or more are allowed; between them two quorums could miss
    # each other
    assert load(tmp_path, five.replace("synchro_timeout_s", "synchro_quorum = 1\nsynchro_timeout_s")
                ).replication.synchro_quorum == 1
    with pytest.raises(ConfigError) as err:
        load(tmp_path, five.replace("synchro_timeout_s", "synchro_quorum = 2\nsynchro_timeout_s"))
    assert "replication.synchro_quorum 2 is less than a majority of the 5 peers (3)" in str(err.value)


@pytest.mark.parametrize("change, message", [
    (('name = "n1"', 'name = "n9"'), 'replication.name "n9" is not one of replication.peers'),
    (("synchro_quorum = 2", "synchro_quorum = 4"), "replication.synchro_quorum 4 is more than the 3 peers"),
    (('user = "replicator"', 'user = "nobody"'), 'replication.user "nobody" is not one of [[users]]'),
    (('password = "..."\nsynchro', 'synchro'), "replication.user needs replication.password"),
    (('prefix = "/boxqueue/main"', 'prefix = "boxqueue/"'), "replication.etcd.prefix must start with '/'"),
    (('lease_ttl_s = 3', 'lease_ttl_s = 1'), "lease_ttl_s"),
    (('heartbeat_s = 1.0', 'heartbeat_every = 1.0'), "unknown key 'heartbeat_every'"),
    (('{ name = "n2", uri = "127.0.0.1:3302" }', '{ name = "n1", uri = "127.0.0.1:3302" }'), 'duplicate peer name "n1"'),
    (('listen = "127.0.0.1:3301"', 'listen = "127.0.0.1:4401"'), "is not its [iproto] listen address"),
])
def test_replication_mistakes_are_named(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    text = REPLICATION_EXAMPLE.replace(*change, 1)
    assert text != REPLICATION_EXAMPLE
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    assert message in str(err.value)


def test_a_replica_set_needs_the_write_ahead_log(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, REPLICATION_EXAMPLE + '\n[wal]\nmode = "write"\n')
    assert '[wal] mode must be "fsync"' in str(err.value)
