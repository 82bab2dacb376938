"""The server run inside the test's own trio loop, for what needs a hand on its internals:
disconnect callbacks, cancellation of a leaving client's requests, back-pressure."""

from pathlib import Path

import msgpack
import pytest
import trio

from boxqueue.config import load_config
from boxqueue.process import Server
from boxqueue.spaces.msgpack_values import unpack


def frame(header: dict, body: dict | None = None) -> bytes:
    payload = msgpack.packb(header) + (msgpack.packb(body) if body is not None else b"")
    return b"\xce" + len(payload).to_bytes(4, "big") + payload


async def read_response(stream: trio.SocketStream, buf: bytearray) -> tuple[dict, dict]:
    while True:
        if len(buf) >= 5:
            size = int.from_bytes(buf[1:5], "big")
            if len(buf) >= 5 + size:
                payload = bytes(buf[5 : 5 + size])
                del buf[: 5 + size]
                unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
                unpacker.feed(payload)
                header, body = list(unpacker)
                return header, body
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk


@pytest.fixture
async def running(tmp_path, nursery):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\nmax_inflight_per_connection = 4\n[wal]\nmode = "none"\n'
    )
    server = Server(load_config(cfg), handle_signals=False)
    ports = await nursery.start(server.run)
    yield server, ports.iproto
    server.stop()


async def connect(port: int) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    greeting = b""
    while len(greeting) < 128:
        greeting += await stream.receive_some(128 - len(greeting))
    return stream


async def test_disconnect_runs_callbacks_and_cancels_pending_calls(running):
    server, port = running
    events: dict[str, float] = {}
    entered = trio.Event()

    async def hold(ctx):
        ctx.on_disconnect(lambda: events.setdefault("disconnected", trio.current_time()))
        entered.set()
        try:
            await trio.sleep_forever()
        finally:
            events["cancelled"] = trio.current_time()

    server.procedures.register("test.hold", hold)
    stream = await connect(port)
    await stream.send_all(frame({0: 10, 1: 1}, {0x22: "test.hold", 0x21: []}))
    await entered.wait()
    closed_at = trio.current_time()
    await stream.aclose()
    with trio.fail_after(2):
        while "disconnected" not in events or "cancelled" not in events:
            await trio.sleep(0.001)
    assert events["disconnected"] - closed_at < 0.1
    assert events["cancelled"] - closed_at < 0.1


async def test_inflight_limit_pushes_back_and_loses_nothing(running):
    server, port = running
    release = trio.Event()
    started = []

    async def block(ctx, n):
        started.append(n)
        await release.wait()
        return [n]

    server.procedures.register("test.block", block)
    stream = await connect(port)
    await stream.send_all(b"".join(frame({0: 10, 1: i}, {0x22: "test.block", 0x21: [i]}) for i in range(10)))
    await trio.sleep(0.2)
    assert len(started) == 4  # max_inflight_per_connection
    release.set()
    buf = bytearray()
    answers = {}
    with trio.fail_after(5):
        for _ in range(10):
            header, body = await read_response(stream, buf)
            answers[header[1]] = body[0x30]
    assert answers == {i: [i] for i in range(10)}
    await stream.aclose()


async def test_a_slow_call_does_not_hold_up_a_fast_request(running):
    server, port = running
    gate = trio.Event()

    async def slow(ctx):
        await gate.wait()
        return ["slow"]

    server.procedures.register("test.slow", slow)
    stream = await connect(port)
    await stream.send_all(frame({0: 10, 1: 1}, {0x22: "test.slow", 0x21: []}) + frame({0: 64, 1: 2}))
    buf = bytearray()
    with trio.fail_after(2):
        header, _ = await read_response(stream, buf)
    assert header[1] == 2  # the ping, answered while the call still waits
    gate.set()
    with trio.fail_after(2):
        header, body = await read_response(stream, buf)
    assert header[1] == 1 and body[0x30] == ["slow"]
    await stream.aclose()


async def test_ddl_bumps_the_schema_version_and_shows_in_the_views(running):
    server, port = running
    stream = await connect(port)
    buf = bytearray()
    await stream.send_all(frame({0: 64, 1: 1}))
    before = (await read_response(stream, buf))[0][5]
    space, created = await server.catalog.create_space("fresh")
    assert created
    await server.catalog.create_index(space, "pk", parts=[[0, "string"]])
    await stream.send_all(frame({0: 64, 1: 2}))
    after = (await read_response(stream, buf))[0][5]
    assert after >= before + 2
    await stream.send_all(frame({0: 1, 1: 3}, {0x10: 281, 0x11: 2, 0x12: 1, 0x14: 0, 0x20: ["fresh"]}))
    header, body = await read_response(stream, buf)
    assert header[0] == 0 and body[0x30][0][:3] == [space.id, 1, "fresh"]
    # a request still carrying the old version is told to reload
    await stream.send_all(frame({0: 64, 1: 4, 5: before}))
    header, _ = await read_response(stream, buf)
    assert header[0] == 0x8000 | 109 and header[5] == after
    await server.catalog.drop_space(space)
    await stream.send_all(frame({0: 1, 1: 5}, {0x10: space.id, 0x12: 1, 0x20: []}))
    header, body = await read_response(stream, buf)
    assert header[0] == 0x8000 | 36
    await stream.aclose()


async def test_alter_space_checks_existing_tuples_and_renames(running):
    from boxqueue.errcodes import BoxError
    from boxqueue.spaces.definitions import parse_format

    server, _port = running
    catalog = server.catalog
    space, _ = await catalog.create_space("alterme")
    await catalog.create_index(space, "pk", parts=[[0, "unsigned"]])
    await space.insert(None, [1, "one"])
    with pytest.raises(BoxError) as err:
        await catalog.alter_space(space, format=parse_format([{"name": "id"}, {"name": "n", "type": "unsigned"}]))
    assert err.value.code == 23
    await catalog.alter_space(space, name="altered", format=parse_format([["id", "unsigned"], ["name", "string"]]))
    assert catalog.space("altered") is space and "alterme" not in catalog.by_name
    assert [f.name for f in space.defn.format] == ["id", "name"]
    with pytest.raises(BoxError) as err:
        parse_format([{"name": "a"}, {"name": "a"}])
    assert "duplicate field name" in err.value.message


async def test_stored_after_scans_the_primary_index_in_chunks(running):
    """Recovery's scan: every stored tuple once, in primary-key order, whatever the chunk size,
    and the key to go on after is None only at the end."""
    server, _port = running
    space, _ = await server.catalog.create_space("chunked")
    await server.catalog.create_index(space, "pk", parts=[[0, "unsigned"]])
    assert space.stored_after(None, 3) == ([], None)
    for n in (5, 1, 3, 4, 2):
        await space.insert(None, [n, f"n{n}"])
    expected = space.select(0, 2, [])  # ITERATOR_ALL
    assert [unpack(raw)[0] for raw in expected] == [1, 2, 3, 4, 5]
    for size in (1, 2, 3, 5, 6):
        seen, after, calls = [], None, 0
        while True:
            chunk, after = space.stored_after(after, size)
            seen += chunk
            calls += 1
            assert len(chunk) <= size
            if after is None:
                break
        assert seen == expected, size
        assert calls == len(expected) // size + 1, size  # a full last chunk: one more, empty call


async def test_head_rewrites_and_deletes_answer_alike_with_and_without_secondary_entries(running):
    """The engine's writes of a task's header and its deletes take a shorter way in a space whose
    secondary indexes LMDB does not keep (the tuple is not decoded): a space with a unique
    secondary index, which takes the long way, is the judge of every answer, error and tuple."""
    from boxqueue.errcodes import BoxError
    from boxqueue.spaces.definitions import FieldDef

    server, _port = running
    catalog = server.catalog
    fmt = (FieldDef("id", "string"), FieldDef("tube", "string"), FieldDef("n", "unsigned"))
    short, _ = await catalog.create_space("short_way", format=fmt)
    await catalog.create_index(short, "pk", parts=[[0, "string"]])
    judge, _ = await catalog.create_space("long_way", format=fmt)
    await catalog.create_index(judge, "pk", parts=[[0, "string"]])
    await catalog.create_index(judge, "by_n", unique=True, parts=[[2, "unsigned"], [0, "string"]])
    assert not short.secondaries and judge.secondaries
    for space in (short, judge):
        for i in range(3):
            await space.insert(None, [f"t{i}", "tube", i, "data", {"k": [i]}])

    async def outcome(space, write) -> object:
        try:
            return await catalog.committer.write(write)
        except BoxError as exc:
            return ("error", exc.code, exc.message.replace(space.name, "<space>"))

    cases = [
        ("rewrite", ["t0"], ["t0", "other", 7]),  # the head changed, the rest kept byte for byte
        ("rewrite", ["t1"], ["t1", "tube"]),  # a shorter head
        ("rewrite", ["t2"], ["t2", "tube", -1]),  # a head of the wrong type
        ("rewrite", ["t2"], ["tX", "tube", 1]),  # a head that changes the primary key
        ("rewrite", ["missing"], ["missing", "tube", 1]),
        ("delete", ["t1"], None),
        ("delete", ["missing"], None),
        ("delete", ["t1"], None),  # again: gone
    ]
    for verb, key, head in cases:
        answers = []
        for space in (short, judge):
            write = space.prepare_head_rewrite(key, head) if verb == "rewrite" else space.prepare_delete(0, key)
            answers.append(await outcome(space, write))
        assert answers[0] == answers[1], (verb, key, head, answers)
        assert short.select(0, 2, []) == judge.select(0, 2, []), (verb, key, head)
    assert [unpack(raw) for raw in short.select(0, 2, [])] == [
        ["t0", "other", 7, "data", {"k": [0]}], ["t2", "tube", 2, "data", {"k": [2]}],
    ]


async def start_with_queue_space(tmp_path: Path, nursery: trio.Nursery) -> Server:
    """A server with the shipped configuration's queue space (space 0), wal none."""
    shipped = (Path(__file__).parents[2] / "conf" / "boxqueue.toml").read_text()
    queue_space = shipped[shipped.index("[[space]]") : shipped.index("# The external APIs")]
    cfg = tmp_path / "q.toml"
    cfg.write_text('data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n[wal]\nmode = "none"\n' + queue_space)
    server = Server(load_config(cfg), handle_signals=False)
    await nursery.start(server.run)
    return server


async def test_the_engine_reports_every_task_state_change(tmp_path, nursery):
    """The hook later facades publish from (Sonya's task events): put, take, release, ack."""
    server = await start_with_queue_space(tmp_path, nursery)
    seen = []
    server.engine.hooks.append(lambda space, tube, task_id, old, new, raw: seen.append((tube, old, new)))
    from boxqueue.spaces.procedures import CallContext

    ctx = CallContext(7, server.catalog.access.guest)
    queue = server.procedures
    put = queue.resolve("box.queue.put").fn
    take = queue.resolve("box.queue.take").fn
    release = queue.resolve("box.queue.release").fn
    ack = queue.resolve("box.queue.ack").fn
    [task] = await put(ctx, 0, "events", 0, 0, 0, 0, "payload")
    task_id = msgpack.unpackb(bytes(task))[0]
    await take(ctx, 0, "events", 0)
    await release(ctx, 0, task_id)
    await take(ctx, 0, "events", 0)
    await ack(ctx, 0, task_id)
    assert seen == [
        ("events", None, "r"), ("events", "r", "t"), ("events", "t", "r"),
        ("events", "r", "t"), ("events", "t", None),
    ]
    server.stop()


async def test_tubes_used_once_are_forgotten_and_their_counters_bounded(tmp_path, nursery, monkeypatch):
    """A client that names a new tube per job (put, take, ack) or polls tubes that hold nothing
    must not leave a tube in memory for every name: an empty tube is forgotten, its box.queue
    counters stay listed by statistics, and the counters of the most recent FORGOTTEN_KEPT
    forgotten tubes are kept, no more."""
    from boxqueue.spaces.procedures import CallContext
    from boxqueue.tubes import engine_base

    monkeypatch.setattr(engine_base, "FORGOTTEN_KEPT", 50)
    server = await start_with_queue_space(tmp_path, nursery)
    engine = server.engine
    ctx = CallContext(7, server.catalog.access.guest)
    fn = {name: server.procedures.resolve("box.queue." + name).fn
          for name in ("put", "take", "ack", "kick", "statistics")}
    tubes_before = len(engine.tubes)
    for n in range(120):
        [task] = await fn["put"](ctx, 0, f"job-{n}", 0, 0, 0, 0, "payload")
        task_id = msgpack.unpackb(bytes(task))[0]
        await fn["take"](ctx, 0, f"job-{n}", 0)
        await fn["ack"](ctx, 0, task_id)
    with trio.fail_after(5):  # each tube's monitor forgets it once it has nothing left
        while len(engine.tubes) > tubes_before:
            await trio.sleep(0.01)
    for n in range(20):
        assert await fn["take"](ctx, 0, f"poll-{n}", 0) == []  # nothing there: no task, no tube
        await fn["kick"](ctx, 0, f"kick-{n}", 5)
    assert len(engine.tubes) == tubes_before
    assert len(engine.forgotten) == 50
    [listed] = fn["statistics"](ctx, 0, "job-119")
    stats = dict(zip(listed[::2], listed[1::2], strict=True))
    assert stats["space0.job-119.put"] == 1 and stats["space0.job-119.take"] == 1
    assert stats["space0.job-119.ack"] == 1 and stats["space0.job-119.tasks.total"] == 0
    [polled] = fn["statistics"](ctx, 0, "poll-19")
    assert dict(zip(polled[::2], polled[1::2], strict=True))["space0.poll-19.take_timeout"] == 1
    assert fn["statistics"](ctx, 0, "job-0") == [[]]  # beyond the bound: the oldest went
    # A forgotten tube used again takes its counters back.
    await fn["put"](ctx, 0, "job-119", 0, 0, 0, 0, "again")
    [again] = fn["statistics"](ctx, 0, "job-119")
    stats = dict(zip(again[::2], again[1::2], strict=True))
    assert stats["space0.job-119.put"] == 2 and stats["space0.job-119.tasks.total"] == 1
    assert engine.tubes[(0, "job-119")].tally[:2] == [2, 1]  # the metrics' puts and takes go on too
    server.stop()


async def test_a_procedures_bug_is_answered_logged_and_counted(running, caplog):
    """A procedure raising what no procedure means to raise (a KeyError: a bug) still answers its
    client with ER_PROC_LUA, and the bug is counted and logged with its traceback, at most ten
    times a minute however often it happens. Arguments past those a procedure names are dropped,
    as Lua drops them: that is no error at all."""
    server, port = running

    def buggy(ctx):
        return {}["missing key"]

    server.procedures.register("test.buggy", buggy)
    stream = await connect(port)
    buf = bytearray()
    for sync in range(30):
        await stream.send_all(frame({0: 10, 1: sync}, {0x22: "test.buggy", 0x21: [1, 2, 3]}))
        header, body = await read_response(stream, buf)
        assert header[0] == 0x8000 | 32 and header[1] == sync
        assert body[0x31] == "'missing key'"
    await stream.send_all(frame({0: 10, 1: 99}, {0x22: "box.session.id", 0x21: ["ignored", 2]}))
    header, body = await read_response(stream, buf)
    assert header[0] == 0 and isinstance(body[0x30][0], int)
    await stream.aclose()
    assert server.observed.stats.unexpected == 30
    logged = [r for r in caplog.records if r.name == "boxqueue.iproto.request_stats"]
    assert len(logged) == 10
    assert all(r.exc_info and r.exc_info[0] is KeyError and "test.buggy" in r.getMessage() for r in logged)
    from boxqueue.metrics.collector import BoxqueueCollector

    [family] = [f for f in BoxqueueCollector(server.observed).collect() if f.name == "boxqueue_unexpected_errors"]
    assert [(s.labels, s.value) for s in family.samples] == [({"api": "iproto"}, 30.0)]


async def test_a_read_only_instance_refuses_every_write_whichever_way_it_comes(tmp_path, nursery):
    """The write gate (spaces.write_gate), as replication sets it on a follower: DML, CALL of a
    writing procedure, box.space methods over CALL and from Lua, DDL from Lua and the engine's
    own verbs are all ER_READONLY; reads go on; once writable again, writes go through."""
    server = await start_with_queue_space(tmp_path, nursery)
    stream = await connect(server.ports.iproto)
    buf = bytearray()

    async def ask(rtype: int, body: dict) -> tuple[int, dict]:
        await stream.send_all(frame({0: rtype, 1: 1}, body))
        header, answer = await read_response(stream, buf)
        return header[0], answer

    def tube_task(name: str) -> list:
        return [0, name, 0, 0, 0, 0, "data"]

    assert (await ask(10, {0x22: "box.queue.put", 0x21: tube_task("before")}))[0] == 0
    server.catalog.writes.set_read_only("a follower")
    refused = 0x8000 | 7  # ER_READONLY
    writes = [
        (3, {0x10: 0, 0x21: ["x" * 32, "t", "r", 0, 0, 0, 0, 0, 0, 0, 0, 0]}),  # REPLACE
        (10, {0x22: "box.queue.put", 0x21: tube_task("during")}),
        (10, {0x22: "box.queue.take", 0x21: [0, "before", 0]}),
        (10, {0x22: "box.space._schema:replace", 0x21: [["x"]]}),
        (8, {0x27: "return box.queue.put(0, 'during', 0, 0, 0, 0, 'data')", 0x21: []}),
        (8, {0x27: "return box.schema.space.create('during')", 0x21: []}),
    ]
    for rtype, body in writes:
        code, answer = await ask(rtype, body)
        assert code in (refused, 0x8000 | 113), (rtype, body, answer)  # 113: a view is read-only
    assert (await ask(10, {0x22: "box.queue.put", 0x21: tube_task("during")}))[1][0x31] == \
        "Can't modify data on a read-only instance"
    with pytest.raises(Exception, match="read-only"):  # the engine itself, as a facade calls it
        await server.engine.put(0, "engine", delay=0, ttl=None, ttr=None, pri=0, data=["x"])
    code, answer = await ask(1, {0x10: 0, 0x11: 0, 0x12: 10, 0x20: []})  # SELECT still served
    assert code == 0 and len(answer[0x30]) == 1
    assert (await ask(10, {0x22: "box.queue.statistics", 0x21: [0]}))[0] == 0
    server.catalog.writes.set_read_only(None)
    assert (await ask(10, {0x22: "box.queue.put", 0x21: tube_task("after")}))[0] == 0
    await server.engine.put(0, "engine", delay=0, ttl=None, ttr=None, pri=0, data=["x"])
    await stream.aclose()
    server.stop()


async def test_requests_leave_no_reference_cycles_behind(tmp_path, nursery):
    """What a request makes is freed by reference counting: a cycle per request (a settled Later
    keeping the closures that refer back to it, an inner function held by the closure it shares)
    leaves the cyclic collector tens of thousands of objects a second to find on a busy queue,
    about 7% of the server's CPU in the queue cycle."""
    import gc

    shipped = (Path(__file__).parents[2] / "conf" / "boxqueue.toml").read_text()
    cfg = tmp_path / "q.toml"
    cfg.write_text('data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n[wal]\nmode = "none"\n'
                   + shipped[shipped.index("[[space]]") : shipped.index("# The external APIs")])
    server = Server(load_config(cfg), handle_signals=False)
    ports = await nursery.start(server.run)
    stream = await connect(ports.iproto)
    buf = bytearray()
    sync = 0

    async def call(name: str, *args: object) -> list:
        nonlocal sync
        sync += 1
        await stream.send_all(frame({0: 0x0A, 1: sync}, {0x22: name, 0x21: list(args)}))
        header, body = await read_response(stream, buf)
        assert header[0] == 0, body
        return body[0x30]

    async def cycles(n: int) -> None:
        for _ in range(n):
            await call("box.queue.put", 0, "gc", 0, 0, 0, 0, "payload")
            [task] = await call("box.queue.take", 0, "gc", 0)
            await call("box.queue.release", 0, task[0])
            [task] = await call("box.queue.take", 0, "gc", 0)
            await call("box.queue.ack", 0, task[0])
            await call("box.queue.statistics", 0, "gc")

    await cycles(50)  # first-use caches, the tube, the connection's buffers
    gc.collect()
    gc.disable()
    try:
        await cycles(300)
        found = gc.collect()
    finally:
        gc.enable()
    assert found < 300, f"{found} objects in reference cycles after 300 cycles of 6 requests"
    await stream.aclose()
    server.stop()


async def test_answers_to_writes_outlast_a_client_that_stops_reading(tmp_path, nursery):
    """Answers to writes leave at the end of their group, sent by the committing task
    (boxqueue/iproto/group_sends.py); what a full socket does not take goes to the connection's
    sender task. A client that sends many small writes with large answers (an update returns
    the whole tuple) and does not read fills its socket: every answer must still arrive, whole
    and in order, once it reads, and other clients are served meanwhile."""
    cfg = tmp_path / "w.toml"
    cfg.write_text(
        'data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n[wal]\nmode = "none"\n'
        '[[space]]\nid = 512\nname = "blobs"\n'
        'indexes = [{ name = "pk", type = "TREE", unique = true, parts = [[0, "unsigned"]] }]\n'
    )
    server = Server(load_config(cfg), handle_signals=False)
    ports = await nursery.start(server.run)
    stream = await connect(ports.iproto)
    buf = bytearray()
    blob = "b" * 16_384
    keys = 8
    with trio.fail_after(10):
        for k in range(keys):
            await stream.send_all(frame({0: 3, 1: k}, {0x10: 512, 0x21: [k, 0, blob]}))  # REPLACE
            header, _body = await read_response(stream, buf)
            assert header[0] == 0
    count = 600  # updates of 30 bytes whose answers hold about 10 MB: far more than the sockets hold
    with trio.fail_after(10):
        await stream.send_all(b"".join(  # UPDATE: field 1 += 1
            frame({0: 4, 1: 1000 + i}, {0x10: 512, 0x11: 0, 0x20: [i % keys], 0x21: [["+", 1, 1]]})
            for i in range(count)))
    other = await connect(ports.iproto)
    other_buf = bytearray()
    with trio.fail_after(10):  # the stalled client holds nobody else up
        await other.send_all(frame({0: 1, 1: 1}, {0x10: 512, 0x20: [0], 0x12: 1}))  # SELECT
        header, body = await read_response(other, other_buf)
    assert header[0] == 0
    assert body[0x30][0][0] == 0
    with trio.fail_after(30):
        for i in range(count):
            header, body = await read_response(stream, buf)
            assert header[0] == 0, body
            assert header[1] == 1000 + i
            assert body[0x30] == [[i % keys, i // keys + 1, blob]]
    await stream.aclose()
    await other.aclose()
    server.stop()


def _shipped_config_on_free_ports(tmp_path: Path) -> Path:
    """conf/boxqueue.toml with every listener on a free loopback port, its data under tmp_path."""
    import re

    shipped = (Path(__file__).parents[2] / "conf" / "boxqueue.toml").read_text()
    text = re.sub(r'^(\w*listen) = "[^"]*"', r'\1 = "127.0.0.1:0"', shipped, flags=re.M)
    text = re.sub(r'^data_dir = "[^"]*"', 'data_dir = "d"', text, flags=re.M)
    text = re.sub(r'^mode = "fsync"', 'mode = "none"', text, flags=re.M)
    cfg = tmp_path / "all.toml"
    cfg.write_text(text)
    return cfg


def _tasks_below(task: trio.lowlevel.Task) -> list[trio.lowlevel.Task]:
    found = [task]
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            found += _tasks_below(child)
    return found


async def test_every_task_of_a_running_server_has_a_root_trio_can_ask(tmp_path, nursery):
    """trio asks a task's root coroutine ``inspect.getcoroutinestate`` when the task takes a
    ``trio.Lock``; a compiled (Cython) coroutine at a task's root cannot answer, and the task
    would fail there (boxqueue/task_roots.py). Every door open, a call waiting in an iproto
    connection and idle connections on the other doors: every task's root answers."""
    import inspect

    server = Server(load_config(_shipped_config_on_free_ports(tmp_path)), handle_signals=False)
    ports = await nursery.start(server.run)
    assert {"deckard", "zaqar", "sonya", "metrics"} <= set(ports.extra)
    stream = await connect(ports.iproto)
    buf = bytearray()
    # A take that waits (a call's task in the connection) and, before it, a ping answered.
    await stream.send_all(frame({0x00: 0x0A, 0x01: 1}, {0x22: "box.queue.take", 0x21: [0, "tube", 30]}))
    await stream.send_all(frame({0x00: 0x40, 0x01: 2}))
    header, _ = await read_response(stream, buf)
    assert header[0x01] == 2 and header[0x00] == 0
    others = [await trio.open_tcp_stream("127.0.0.1", ports.extra[door]) for door in ("deckard", "zaqar", "sonya")]
    await others[0].send_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000"))
    await trio.sleep(0.2)

    tasks = _tasks_below(trio.lowlevel.current_root_task())
    unanswered = []
    for task in tasks:
        try:
            inspect.getcoroutinestate(task.coro)
        except AttributeError:
            unanswered.append(task.name)
    assert unanswered == [], unanswered
    # What the compiled modules' tasks run under their Python roots: the connection's sender and
    # its waiting call, the request statistics, the Lua thread and the queue module among them.
    rooted = {getattr(task.coro.cr_frame.f_locals["fn"], "__qualname__", "?")
              for task in tasks if task.name.endswith("python_root")}
    assert {"Connection._send_loop", "Connection._run", "RequestStats.run", "LuaEngine.run", "QueueModule.run"} <= rooted, rooted
    for other in others:
        await other.aclose()
    await stream.aclose()
    server.stop()
