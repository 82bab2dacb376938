"""A data directory written by the three-engine layout (Deckard's ``deckard_messages`` and
``deckard_queues``; Zaqar's ``zaqar_queues``, ``zaqar_messages``, ``zaqar_claims`` and pool spaces
with the same message layout) is moved into the engine's spaces at start, with every message's
state, order, times and content.

The old spaces are written here tuple for tuple as the old code wrote them (their layouts are
copied from it), then the real server starts on the directory in the test's trio loop."""

from __future__ import annotations

import time
import uuid

import msgpack
import pytest
import trio

from boxqueue.config import load_config
from boxqueue.errcodes import BoxError
from boxqueue.facades.deckard import translate
from boxqueue.process import Server
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.definitions import FieldDef
from boxqueue.spaces.space import REPLACE
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import Storage

OLD_DECKARD_FORMAT = tuple(
    FieldDef(name, kind)
    for name, kind in (
        ("queue", "string"), ("id", "string"), ("state", "string"), ("score", "number"), ("event", "unsigned"),
        ("restore", "number"), ("expires", "unsigned"), ("seq", "unsigned"), ("acks", "unsigned"),
        ("nacks", "unsigned"), ("consecutive_acks", "unsigned"), ("consecutive_nacks", "unsigned"),
        ("breakpoint", "string"),
    )
)


async def write_old_layout(data_dir, build) -> None:
    """Open the data directory as the old server did and let ``build(catalog, put)`` fill it."""
    storage = Storage(data_dir, "fsync")
    try:
        committer = GroupCommitter(storage, rejections=(BoxError,))
        catalog = Catalog(storage, committer)
        catalog.load()
        async with trio.open_nursery() as nursery:
            await nursery.start(committer.run)

            async def put(space, fields) -> None:
                raw = msgpack.packb(fields, use_bin_type=True)
                await committer.write(space.prepare_put(raw, fields, REPLACE))

            await build(catalog, put)
            nursery.cancel_scope.cancel()
    finally:
        storage.close()


async def start(tmp_path, nursery, sections: str) -> Server:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n{sections}')
    server = Server(load_config(cfg), handle_signals=False)
    await nursery.start(server.run)
    return server


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def test_deckard_messages_and_limits_move_into_the_deckard_space(tmp_path, nursery):
    now = now_ms()
    hour = 3_600_000

    async def build(catalog: Catalog, put) -> None:
        messages, _ = await catalog.create_space("deckard_messages", format=OLD_DECKARD_FORMAT)
        await catalog.create_index(messages, "primary", parts=[[0, "string"], [1, "string"]])
        limits, _ = await catalog.create_space(
            "deckard_queues", format=(FieldDef("queue", "string"), FieldDef("max_elements", "unsigned")))
        await catalog.create_index(limits, "primary", parts=[[0, "string"]])
        seq = now * 1000
        payload = {"p": ["type.googleapis.com/x.Y", b"\x00\xff"]}
        # queue id state score event restore expires seq acks nacks cacks cnacks breakpoint | data
        await put(messages, ["q", "active", "a", 5.0, 0, -1.0, now + hour, seq + 1, 2, 1, 0, 1, "bp",
                             "described", "text", {"k": "v"}, payload])
        await put(messages, ["q", "busy", "p", 3.0, now + hour // 2, -1.0, now + hour, seq + 2, 0, 0, 0, 0, "",
                             "", "", {}, {}])
        await put(messages, ["q", "locked", "ln", 1.0, now + 600, 7.0, now + hour, seq + 3, 0, 1, 0, 1, "",
                             "", "", {}, {}])
        await put(messages, ["other", "active", "a", 2.0, 0, -1.0, now + hour, seq + 4, 0, 0, 0, 0, "",
                             "", "x", {}, {}])
        await put(limits, ["q", 10])

    await write_old_layout(tmp_path / "d", build)
    server = await start(tmp_path, nursery, '[deckard]\nlisten = "127.0.0.1:0"\n')
    try:
        engine, sid = server.engine, server.deckard_space.id
        assert "deckard_messages" not in server.catalog.by_name and "deckard_queues" not in server.catalog.by_name
        tube = engine.existing_tube(sid, "q")
        assert tube.limit == 10
        active, busy, locked = (tube.tasks[i] for i in ("active", "busy", "locked"))
        assert (active.status, busy.status, locked.status) == ("r", "t", "d")
        assert busy.event == (now + 3_600_000 // 2) * 1000 and locked.event == (now + 600) * 1000
        assert active.created + active.ttl == (now + hour) * 1000
        raw = engine.stored(engine.queue_space(sid), active)
        message = translate.to_message(active, raw)
        assert (message.description, message.string_payload, dict(message.metadata), message.score,
                message.breakpoint) == ("described", "text", {"k": "v"}, 5.0, "bp")
        assert (message.payload["p"].type_url, message.payload["p"].value) == ("type.googleapis.com/x.Y", b"\x00\xff")
        assert (message.diagnostics.acks, message.diagnostics.nacks, message.diagnostics.consecutive_nacks) == (2, 1, 1)
        # The lock ends on time with the score it was given; the queue's order is the old one.
        with trio.fail_after(5):
            while locked.status != "r":
                await trio.sleep(0.05)
        assert locked.pri == 7.0
        pulled = await engine.take_many(sid, "q", 10, 60_000_000)
        assert [t.id for t, _raw in pulled] == ["active", "locked"]
        assert [t.id for t, _raw in await engine.take_many(sid, "other", 10, 60_000_000)] == ["active"]
    finally:
        server.stop()


async def test_a_start_without_old_data_changes_nothing(tmp_path, nursery):
    server = await start(tmp_path, nursery, '[deckard]\nlisten = "127.0.0.1:0"\n')
    try:
        assert "deckard" in server.catalog.by_name and "deckard_messages" not in server.catalog.by_name
    finally:
        server.stop()


@pytest.fixture
def project() -> str:
    return "p" + uuid.uuid4().hex[:6]


async def test_zaqar_queues_messages_claims_and_pool_spaces_move_into_the_engine(tmp_path, nursery):
    now = time.time()
    free_id, held_id, stale_id, pooled_id, other_id = (uuid.uuid4().hex for _ in range(5))
    claim_id, gone_claim = uuid.uuid4().hex, uuid.uuid4().hex

    async def build(catalog: Catalog, put) -> None:
        spaces = {}
        for name, parts in (("zaqar_queues", [[1, "string"], [2, "string"]]), ("zaqar_messages", [[0, "unsigned"]]),
                            ("zaqar_claims", [[0, "string"]]), ("zaqar_pools", [[0, "string"]]),
                            ("zaqar_flavors", [[0, "string"], [1, "string"]]), ("zq_pool", [[0, "unsigned"]]),
                            ("zq_empty_pool", [[0, "unsigned"]])):
            spaces[name], _ = await catalog.create_space(name)
            await catalog.create_index(spaces[name], "primary", parts=parts)
        await put(spaces["zaqar_queues"], [0, "p", "q", {"purpose": "docs"}, "zaqar_messages"])
        await put(spaces["zaqar_queues"], [0, "p", "pooled", {}, "zq_pool"])
        await put(spaces["zaqar_pools"], ["pool1", "boxqueue://zq_pool", 10, {}, None])
        await put(spaces["zaqar_pools"], ["pool2", "boxqueue://zq_empty_pool", 0, {}, None])
        await put(spaces["zaqar_claims"], [claim_id, "p", "q", 600, 60, now + 600, now - 5])
        # seq project queue id created ttl expires client body claim_id claim_expires
        await put(spaces["zaqar_messages"], [1, "p", "q", free_id, now - 10, 3600, now + 3590, "c1", {"n": 1}, "", 0.0])
        await put(spaces["zaqar_messages"], [2, "p", "q", held_id, now - 9, 360, now + 600 + 60, "c1", [1, 2],
                                             claim_id, now + 600])
        await put(spaces["zaqar_messages"], [3, "p", "q", stale_id, now - 8, 3600, now + 3590, "c2", "s",
                                             gone_claim, now - 1])
        await put(spaces["zaqar_messages"], [4, "p", "gone", other_id, now - 8, 3600, now + 3590, "c2", "x", "", 0.0])
        await put(spaces["zq_pool"], [5, "p", "pooled", pooled_id, now - 7, 3600, now + 3590, "c3", "in a pool", "", 0.0])

    await write_old_layout(tmp_path / "d", build)
    server = await start(tmp_path, nursery, '[zaqar]\nlisten = "127.0.0.1:0"\n')
    try:
        queues = server.zaqar_queues
        names = server.catalog.by_name
        assert not {"zaqar_queues", "zaqar_messages", "zaqar_claims", "zq_pool__tubes"} & set(names)
        assert {"zaqar_pools", "zaqar_flavors", "zq_pool", "zq_empty_pool", "zaqar"} <= set(names)
        assert [q.name for q in queues.list_queues("p", None, 10)] == ["pooled", "q"]
        assert queues.queue("p", "q").metadata == {"purpose": "docs"}
        assert queues.space_of("p", "pooled") == "zq_pool" and queues.space_of("p", "q") == "zaqar"
        listed = queues.list_messages("p", "q", None, 10, None, True)
        assert [(m.id, m.body, m.claim_id, m.claimed) for m in listed] == [
            (free_id, {"n": 1}, "", False), (held_id, [1, 2], claim_id, True), (stale_id, "s", gone_claim, False)]
        assert listed[1].ttl == 360 and listed[0].ttl == 3600
        assert [m.id for m in queues.list_messages("p", "q", None, 10, "c1", False)] == [stale_id]  # echo off
        claim, held = queues.get_claim("p", "q", claim_id)
        assert [m.id for m in held] == [held_id] and claim.ttl == 600
        assert [m.body for m in queues.get_messages("p", "pooled", [pooled_id])] == ["in a pool"]
        # The queues go on: FIFO after the migrated messages, the claim can be released.
        (new,) = await queues.post("p", "q", "c1", [("after", 300)])
        await queues.release("p", "q", claim_id)
        assert [m.id for m in queues.list_messages("p", "q", None, 10, None, False)] == [free_id, held_id, stale_id, new]
        await queues.create_queue("p", "placed", {})
        assert queues.space_of("p", "placed") == "zq_pool"  # the weight-0 pool takes nothing
    finally:
        server.stop()
