"""The Tarantool 1.5 style cfg reader: both syntaxes, the seed's own text, and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from boxqueue.config import Address, ConfigError, IndexConfig, PartConfig, load_config
from boxqueue.tarantool_cfg import load_tarantool_cfg, parse_tarantool_cfg

CONF = Path(__file__).resolve().parents[2] / "conf"

# The configuration in the box.queue 1.5 README (shared/seeds/box-queue-1.5.txt), verbatim:
# note the missing comma after `fieldno = 5 # pri`.
SEED = """\
readahead = 16384
primary_port = 33020
secondary_port = 33021
admin_port = 33022
space = [
{
enabled = 1,
index = [
{
type = "TREE",
unique = 1,
key_field = [
{
fieldno = 0,
type = "STR"
}
]
},
{
type = "TREE",
unique = 0,
key_field = [
{
fieldno = 1, # tube
type = "STR"
},
{
fieldno = 2, # status
type = "STR"
},
{
fieldno = 4, # ipri
type = "STR"
},
{
fieldno = 5 # pri
type = "STR"
}
]
},
{
type = "TREE",
unique = 0,
key_field = [
{
fieldno = 1, # tube
type = "STR"
},
{
fieldno = 3, # next_event
type = "NUM64"
}
]
}
]
}
]
"""

# The README's "additional (fourth) index" for queue.put_unique, verbatim.
SEED_FOURTH_INDEX = """\
{
type = "TREE",
unique = 0,
key_field = [
{
fieldno = 1, # tube
type = "STR"
},
{
fieldno = 2, # status
type = "STR"
},
{
fieldno = 12, # task data
type = "STR"
}
]
}
"""


def seed_with_fourth_index() -> str:
    end_of_third_index = SEED.rindex("}\n]\n}\n]") + 1
    return SEED[:end_of_third_index] + ",\n" + SEED_FOURTH_INDEX + "]\n}\n]\n"


def parts(*pairs: tuple[int, str]) -> tuple[PartConfig, ...]:
    return tuple(PartConfig(field=field, type=ftype) for field, ftype in pairs)


# The seed's box.queue layout gets the tube engine's types: ipri/pri (1.5's one-byte STR) are
# unsigned, the put_unique data field is a nullable scalar.
QUEUE_INDEXES = (
    IndexConfig(name="primary", type="TREE", unique=True, parts=parts((0, "string"))),
    IndexConfig(name="i1", type="TREE", unique=False, parts=parts((1, "string"), (2, "string"), (4, "unsigned"), (5, "unsigned"))),
    IndexConfig(name="i2", type="TREE", unique=False, parts=parts((1, "string"), (3, "unsigned"))),
)
PUT_UNIQUE_INDEX = IndexConfig(
    name="i3", type="TREE", unique=False, parts=(*parts((1, "string"), (2, "string")), PartConfig(field=12, type="scalar", is_nullable=True)),
)


def error(text: str, source: str = "x.cfg") -> str:
    with pytest.raises(ConfigError) as info:
        parse_tarantool_cfg(text, source)
    return str(info.value)


# -- the seed -------------------------------------------------------------------------------


def test_the_seed_text_parses() -> None:
    cfg = parse_tarantool_cfg(SEED, "seed.cfg")
    assert cfg.listen == Address("127.0.0.1", 33020)
    assert cfg.read_only_listen == Address("127.0.0.1", 33021)
    assert cfg.admin_listen == Address("127.0.0.1", 33022)
    (space,) = cfg.spaces
    assert (space.id, space.name, space.engine, space.format) == (0, "space0", "memtx", ())
    assert space.indexes == QUEUE_INDEXES


def test_a_space_not_laid_out_for_the_queue_keeps_the_1_5_types() -> None:
    text = SEED.replace("fieldno = 3, # next_event", "fieldno = 6, # not the queue layout")
    (space,) = parse_tarantool_cfg(text, "seed.cfg").spaces
    assert [p.type for p in space.indexes[1].parts] == ["string", "string", "string", "string"]


def test_the_seed_with_its_fourth_index() -> None:
    (space,) = parse_tarantool_cfg(seed_with_fourth_index(), "seed.cfg").spaces
    assert space.indexes == (*QUEUE_INDEXES, PUT_UNIQUE_INDEX)


def test_the_shipped_example_is_the_seed_with_the_fourth_index() -> None:
    cfg = load_tarantool_cfg(CONF / "tarantool15.cfg")
    assert (cfg.listen, cfg.read_only_listen, cfg.admin_listen) == (
        Address("127.0.0.1", 33020),
        Address("127.0.0.1", 33021),
        Address("127.0.0.1", 33022),
    )
    assert cfg.spaces == parse_tarantool_cfg(seed_with_fourth_index(), "seed.cfg").spaces


def test_the_shipped_example_alone_is_a_whole_config() -> None:
    config = load_config(CONF / "tarantool15.cfg")
    assert config.iproto.listen == Address("127.0.0.1", 33020)
    assert config.iproto.read_only_listen == Address("127.0.0.1", 33021)
    assert config.iproto.admin_listen == Address("127.0.0.1", 33022)
    assert config.data_dir == CONF / "data"
    assert config.tarantool_cfg == CONF / "tarantool15.cfg"
    assert config.wal.mode == "fsync"
    assert config.guest_grants is None and config.users == ()
    assert (config.deckard, config.zaqar, config.sonya) == (None, None, None)
    assert [s.name for s in config.spaces] == ["space0"]


# -- the dotted style -----------------------------------------------------------------------

DOTTED = """\
# classic 1.5 style
slab_alloc_arena = 0.1
pid_file = "box.pid"
logger = "cat - >> tarantool.log"
primary_port = 33013
secondary_port = 33014
admin_port = 33015
rows_per_wal = 50
wal_mode = "none"

space[0].enabled = 1
space[0].index[0].type = "HASH"
space[0].index[0].unique = 1
space[0].index[0].key_field[0].fieldno = 0
space[0].index[0].key_field[0].type = "NUM"
space[0].index[1].type = "TREE"
space[0].index[1].unique = 0
space[0].index[1].key_field[0].fieldno = 1
space[0].index[1].key_field[0].type = "STR"
space[0].index[1].key_field[1].fieldno = 2
space[0].index[1].key_field[1].type = "NUM64"

space[1].enabled = 0
space[1].index[0].type = "HASH"
space[1].index[0].unique = 1
space[1].index[0].key_field[0].fieldno = 0
space[1].index[0].key_field[0].type = "NUM"

space[3].enabled = 1
space[3].cardinality = -1
space[3].estimated_rows = 0
space[3].index[0].type = "TREE"
space[3].index[0].unique = 1
space[3].index[0].key_field[0].fieldno = 0
space[3].index[0].key_field[0].type = "STR"
"""


def test_the_dotted_style() -> None:
    cfg = parse_tarantool_cfg(DOTTED, "box.cfg")
    assert cfg.listen == Address("127.0.0.1", 33013)
    assert [(s.id, s.name) for s in cfg.spaces] == [(0, "space0"), (3, "space3")]
    space0 = cfg.spaces[0]
    assert space0.indexes == (
        IndexConfig(name="primary", type="HASH", unique=True, parts=parts((0, "unsigned"))),
        IndexConfig(name="i1", type="TREE", unique=False, parts=parts((1, "string"), (2, "unsigned"))),
    )
    assert cfg.spaces[1].indexes == (IndexConfig(name="primary", type="TREE", unique=True, parts=parts((0, "string"))),)


def test_styles_mix_and_bare_words_and_booleans() -> None:
    text = """\
space = [ { enabled = true, index = [ { type = tree, unique = 1,
            key_field = [ { fieldno = 0, type = num } ] } ] } ]
space[0].index[1].type = "TREE"
space[0].index[1].unique = false
space[0].index[1].key_field[0].fieldno = 1
space[0].index[1].key_field[0].type = "str"
"""
    (space,) = parse_tarantool_cfg(text, "x.cfg").spaces
    assert space.indexes == (
        IndexConfig(name="primary", type="TREE", unique=True, parts=parts((0, "unsigned"))),
        IndexConfig(name="i1", type="TREE", unique=False, parts=parts((1, "string"))),
    )


def test_commas_are_optional_and_trailing_commas_allowed() -> None:
    text = 'space = [ { enabled = 1 index = [ { type = "TREE" unique = 1 key_field = [ { fieldno = 0 type = "STR" }, ], }, ] }, ]\n'
    (space,) = parse_tarantool_cfg(text, "x.cfg").spaces
    assert space.indexes[0].parts == parts((0, "string"))


def test_index_defaults_tree_and_unique() -> None:
    text = "space[0].index[0].key_field[0].fieldno = 0\nspace[0].index[0].key_field[0].type = 'STR'\n"
    (space,) = parse_tarantool_cfg(text, "x.cfg").spaces
    assert space.indexes == (IndexConfig(name="primary", type="TREE", unique=True, parts=parts((0, "string"))),)


def test_the_old_namespace_name() -> None:
    text = SEED.replace("space = [", "namespace = [")
    assert parse_tarantool_cfg(text, "x.cfg").spaces[0].indexes == QUEUE_INDEXES


# -- listeners ------------------------------------------------------------------------------


def test_ports_listen_on_loopback_unless_bind_ipaddr_says_otherwise() -> None:
    assert parse_tarantool_cfg("primary_port = 1\n", "x.cfg").listen == Address("127.0.0.1", 1)
    text = 'bind_ipaddr = "INADDR_ANY"\nprimary_port = 1\nadmin_port = 2\n'
    cfg = parse_tarantool_cfg(text, "x.cfg")
    assert (cfg.listen, cfg.admin_listen) == (Address("0.0.0.0", 1), Address("0.0.0.0", 2))
    cfg = parse_tarantool_cfg('bind_ipaddr = "::1"\nprimary_port = 1\n', "x.cfg")
    assert cfg.listen == Address("::1", 1)


def test_port_zero_or_absent_means_no_listener() -> None:
    cfg = parse_tarantool_cfg("primary_port = 3301\nsecondary_port = 0\n", "x.cfg")
    assert (cfg.read_only_listen, cfg.admin_listen) == (None, None)
    assert parse_tarantool_cfg("", "x.cfg").listen is None


def test_two_ports_alike() -> None:
    assert error("primary_port = 1\nsecondary_port = 2\nadmin_port = 1\n") == (
        "x.cfg:3: admin_port is the same port as primary_port"
    )


def test_bad_port() -> None:
    assert error("\nprimary_port = 70000\n") == "x.cfg:2: bad port in primary_port: 70000"
    assert error('admin_port = "x"\n') == 'x.cfg:1: bad port in admin_port: "x"'


# -- errors ---------------------------------------------------------------------------------


def test_unknown_top_level_key() -> None:
    assert error("readahead = 1\n\nprimary_prot = 3301\n") == "x.cfg:3: unknown key 'primary_prot'"


def test_unknown_nested_keys_name_their_line() -> None:
    text = SEED.replace("fieldno = 3,", "fieldnum = 3,")
    assert error(text) == "x.cfg:50: unknown key 'fieldnum' in space[0].index[2].key_field[1]"
    text = "space[0].enabled = 1\nspace[0].indx[0].type = 'TREE'\n"
    assert error(text) == "x.cfg:2: unknown key 'indx' in space[0]"


def test_syntax_errors() -> None:
    assert error('primary_port = 1\npid_file = "box.pid\n') == "x.cfg:2: cannot parse: unterminated string"
    assert error("primary_port 1\n") == "x.cfg:1: cannot parse: expected '=', found '1'"
    assert error("space = [ { enabled = 1,\n") == (
        "x.cfg:2: cannot parse: expected a key, found end of file"
    )
    assert error("space = [\n") == "x.cfg:2: cannot parse: expected ']' to close space, found end of file"
    assert error("x = @\n") == "x.cfg:1: cannot parse: unexpected character '@'"
    assert error("space[a].enabled = 1\n") == "x.cfg:1: cannot parse: expected an array index, found 'a'"
    assert error("readahead = 16k\n") == "x.cfg:1: cannot parse: unexpected character '1'"


def test_a_key_given_twice() -> None:
    text = "primary_port = 1\nprimary_port = 2\n"
    assert error(text) == "x.cfg:2: cannot parse: primary_port is given twice"
    text = "space[0].enabled = 1\nspace = 3\n"
    assert error(text) == "x.cfg:2: cannot parse: space is given twice"


def test_bad_key_type() -> None:
    text = SEED.replace('"NUM64"', '"FLOAT64"')
    assert error(text) == (
        'x.cfg:51: unknown key type in space[0].index[2].key_field[1].type: "FLOAT64" '
        "(expected STR, NUM or NUM64)"
    )


def test_unsupported_index_type() -> None:
    text = SEED.replace('type = "TREE",\nunique = 0', 'type = "BITSET",\nunique = 0', 1)
    assert error(text) == (
        'x.cfg:20: unsupported index type in space[0].index[1].type: "BITSET" (expected TREE or HASH)'
    )


def test_index_rules() -> None:
    text = SEED.replace("unique = 1", "unique = 0", 1)
    assert error(text) == "x.cfg:9: space[0].index[0]: the primary key (index 0) must be unique"
    text = SEED.replace("unique = 0", "unique = 2", 1)
    assert error(text) == "x.cfg:21: space[0].index[1].unique must be 0 or 1, not 2"
    text = SEED.replace('type = "TREE",\nunique = 1', 'type = "HASH",\nunique = 0', 1)
    assert error(text) == "x.cfg:9: space[0].index[0]: the primary key (index 0) must be unique"
    text = SEED.replace('type = "TREE",\nunique = 0', 'type = "HASH",\nunique = 0', 1)
    assert error(text) == "x.cfg:19: space[0].index[1]: a HASH index must be unique"


def test_missing_pieces() -> None:
    assert error("space[0].enabled = 1\n") == "x.cfg:1: missing key 'index' in space[0]"
    text = "space[0].index[0].key_field[0].fieldno = 0\n"
    assert error(text) == "x.cfg:1: missing key 'type' in space[0].index[0].key_field[0]"
    text = "space[0].index[1].key_field[0].fieldno = 0\nspace[0].index[1].key_field[0].type = 'STR'\n"
    assert error(text) == "x.cfg:1: space[0].index[0] is missing"
    assert error("space = [ { index = [] } ]\n") == "x.cfg:1: space[0].index is empty"


def test_wrong_shapes() -> None:
    assert error("space = 1\n") == "x.cfg:1: space must be an array, not 1"
    assert error("space = [ 1 ]\n") == "x.cfg:1: space[0] must be a table, not 1"
    assert error("space = [ { index = { } } ]\n") == "x.cfg:1: space[0].index must be an array, not a table"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_tarantool_cfg(tmp_path / "nope.cfg")
    assert str(info.value) == f"{tmp_path / 'nope.cfg'}: no such file"
