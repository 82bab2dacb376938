"""Where Lua jobs run, seen from inside the server (run in the test's own trio loop): a chunk
that finishes quickly is answered at once on the event loop, one that waits or computes long
goes on elsewhere, and the event loop keeps serving while it does."""

from __future__ import annotations

import time

import pytest
import trio

from boxqueue.config import load_config
from boxqueue.errcodes import BoxError
from boxqueue.process import Server
from boxqueue.spaces.procedures import CallContext
from tests.integration.test_inprocess import connect, frame, read_response


@pytest.fixture
async def server(tmp_path, nursery):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n[wal]\nmode = "none"\n'
        "[lua]\ntime_limit_s = 1.0\n"
        '[[space]]\nid = 600\nname = "kv"\n'
        'indexes = [{name = "pk", type = "TREE", unique = true, parts = [{field = 0, type = "unsigned"}]}]\n'
    )
    server = Server(load_config(cfg), handle_signals=False)
    ports = await nursery.start(server.run)
    server.port = ports.iproto  # type: ignore[attr-defined]
    yield server
    server.stop()


def admin(server: Server) -> CallContext:
    return CallContext(1, server.catalog.access.users["admin"])


async def answer(result):
    """The values of an eval: at once, or from the coroutine that finishes it."""
    if isinstance(result, list):
        return result
    return await result


async def test_quick_chunks_are_answered_at_once(server):
    lua = server.lua
    ctx = admin(server)
    await answer(lua.eval(ctx, "box.space.kv:replace{1, 'one'}", []))
    # no box call, or only calls that do not wait: the values themselves, no coroutine
    assert lua.eval(ctx, "return ...", [1, "a", [2], {"k": None}]) == [1, "a", [2], {"k": None}]
    assert lua.eval(ctx, "return box.space.kv:get(1)", []) == [[1, "one"]]
    assert lua.eval(ctx, "return box.session.id(), #box.space.kv:select()", []) == [1, 1]
    lua.eval(ctx, "function twice(x) return 2 * x end", [])
    assert lua.call_function(ctx, "twice", (21,)) == [42]
    with pytest.raises(BoxError) as err:
        lua.eval(ctx, "error('at once', 0)", [])
    assert err.value.message == "at once"


async def test_waiting_and_long_chunks_go_on_elsewhere(server):
    lua = server.lua
    ctx = admin(server)
    write = lua.eval(ctx, "return box.space.kv:replace{2, 'two'}", [])
    assert not isinstance(write, list)  # waits for its commit
    assert await write == [[2, "two"]]
    long = lua.eval(ctx, "local x = 0 for i = 1, 5e6 do x = x + i end return x", [])
    assert not isinstance(long, list)  # more than the event loop's share: finished in the Lua thread
    assert await long == [12500002500000]
    sort = lua.eval(ctx, "local t = {3, 1, 2} table.sort(t, function(a, b) return a < b end) return t", [])
    assert not isinstance(sort, list)  # a comparator runs in the Lua thread
    assert await sort == [[1, 2, 3]]


async def test_repeated_chunks_are_compiled_once(server):
    lua = server.lua
    ctx = admin(server)
    compiled = lua.eval_chunks.compiled
    for i in range(5):
        assert lua.eval(ctx, "local t = {...} return #t, t[1]", [i, i]) == [2, i]
    assert lua.eval_chunks.compiled == compiled + 1
    assert lua.eval(ctx, "return 'other'", []) == ["other"]
    assert lua.eval_chunks.compiled == compiled + 2


async def test_a_runaway_chunk_does_not_hold_the_event_loop(server, nursery):
    """While a chunk loops for its whole time limit, the loop answers pings and other chunks
    within a bound far below that limit (its share per job is LOOP_SLICE_S)."""
    runaway_stream = await connect(server.port)
    other = await connect(server.port)
    buf, other_buf = bytearray(), bytearray()
    finished: list[tuple[dict, dict]] = []

    async def runaway() -> None:
        await runaway_stream.send_all(frame({0: 8, 1: 1}, {0x27: "while true do end", 0x21: []}))
        finished.append(await read_response(runaway_stream, buf))

    started = time.monotonic()
    nursery.start_soon(runaway)
    await trio.sleep(0.1)
    slowest = 0.0
    for sync in range(20):
        sent = time.monotonic()
        await other.send_all(frame({0: 64, 1: sync}))
        await read_response(other, other_buf)
        await other.send_all(frame({0: 8, 1: sync}, {0x27: "return ...", 0x21: [sync]}))
        _header, body = await read_response(other, other_buf)
        assert body[0x30] == [sync]
        slowest = max(slowest, time.monotonic() - sent)
    assert not finished  # all of that while the runaway still ran
    assert slowest < 0.5  # generous for a shared machine; the limit is 1 s
    with trio.fail_after(10):
        while not finished:
            await trio.sleep(0.01)
    _header, body = finished[0]
    assert body[0x31] == "Lua time limit exceeded (1 s)"
    assert time.monotonic() - started > 0.9
    await runaway_stream.aclose()
    await other.aclose()



async def test_long_results_come_back_whole(server):
    """Tables are read out of Lua some thousands of values at a time: every length comes back
    whole, holes as None, maps with every key."""
    lua = server.lua
    ctx = admin(server)
    for size in (1, 3999, 4000, 4001, 8001, 12345):
        values = await answer(lua.eval(ctx, "local t = {} for i = 1, ... do t[i] = i end return t", [size]))
        assert values == [list(range(1, size + 1))]
        mapped = await answer(lua.eval(ctx, "local t = {} for i = 1, ... do t['k' .. i] = i end return t", [size]))
        assert mapped == [{f"k{i}": i for i in range(1, size + 1)}]
    sparse = await answer(lua.eval(ctx, "local t = {} for i = 1, 5000 do t[3 * i] = i end t[1] = 0 return t", []))
    assert sparse[0] == {1: 0, **{3 * i: i for i in range(1, 5001)}}  # too sparse: a map, as in Tarantool
    array = await answer(lua.eval(ctx, "local t = {} for i = 1, 5000 do t[i] = i % 2 == 0 and i or nil end t[5000] = 1 return t", []))
    assert array[0][:4] == [None, 2, None, 4] and len(array[0]) == 5000
