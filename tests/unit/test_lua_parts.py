"""Index parts as Lua code writes them (1-based), turned into the catalogue's 0-based forms."""

from __future__ import annotations

import pytest

from boxqueue.lua_box.operations import _lua_parts


@pytest.mark.parametrize(
    ("lua", "parts"),
    [
        (None, [[0, "unsigned"]]),
        ([1, "unsigned"], [[0, "unsigned"]]),
        ([1, "unsigned", 2, "string"], [[0, "unsigned"], [1, "string"]]),
        ([2], [1]),
        (["id"], ["id"]),
        (["id", "string"], [["id", "string"]]),
        ([[1, "unsigned"], [3, "str"]], [[0, "unsigned"], [2, "str"]]),
        ([{"field": 2, "type": "string", "is_nullable": True}], [{"field": 1, "type": "string", "is_nullable": True}]),
        ([{"fieldno": 1, "type": "unsigned"}], [{"fieldno": 0, "type": "unsigned"}]),
        ([{"field": "name", "type": "string"}], [{"field": "name", "type": "string"}]),
        (3, [2]),
    ],
)
def test_lua_parts(lua, parts):
    assert _lua_parts(lua) == parts
