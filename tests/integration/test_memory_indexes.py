"""The secondary indexes of the engine's spaces are kept in memory (spaces/index_views.py), not in
LMDB: selects on them answer what the LMDB indexes answered, see exactly the snapshot the primary
index shows, and a data directory written when LMDB kept them has those entries dropped at start.

The judge of "what LMDB answered" is an ordinary space with the same definition, whose indexes LMDB
keeps, holding the same tuples: every iterator and a spread of keys must give the same rows."""

from __future__ import annotations

import itertools
import logging

import msgpack
import pytest
import trio

from boxqueue.config import load_config
from boxqueue.errcodes import ER, BoxError
from boxqueue.process import Server
from boxqueue.spaces import iterators as it
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.space import REPLACE, decode_tuple
from tests.integration.queue_fixtures import OTHER_SPACES, QUEUE_SPACE_0
from tests.integration.replica_fixtures import Cluster
from tests.integration.test_layout_migration import write_old_layout

ITERATORS = (it.EQ, it.REQ, it.ALL, it.LT, it.LE, it.GE, it.GT)


async def start(tmp_path, nursery) -> Server:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n{QUEUE_SPACE_0}')
    server = Server(load_config(cfg), handle_signals=False)
    await nursery.start(server.run)
    return server


async def fill_queue(server: Server) -> None:
    """Tasks in three tubes in every status, with equal priorities and events among them."""
    engine = server.engine
    for n in range(60):
        tube = f"t{n % 3}"
        await engine.put(0, tube, delay=(5_000_000 if n % 7 == 0 else 0), ttl=None, ttr=None,
                         pri=n % 4, data=[f"d{n % 5}", n])
    for tube in ("t0", "t1"):
        for _ in range(6):
            raw = await engine.take(0, tube, 1, 0)
            assert raw is not None
            if decode_tuple(raw)[11] % 2 == 0:
                await engine.bury(0, decode_tuple(raw)[0], 1)
    taken = await engine.take(0, "t2", 1, 0)
    await engine.ack(0, decode_tuple(taken)[0], 1)


def keys_to_try(space) -> list[tuple[int, list]]:
    """For each secondary index: no key, every prefix of every tuple's key, and keys between."""
    rows = [decode_tuple(raw) for raw in space.select(0, it.ALL, [], 0, 1 << 30)]
    out: list[tuple[int, list]] = []
    for index in space.indexes.values():
        if index.iid == 0:
            continue
        out.append((index.iid, []))
        seen = set()
        for row in rows:
            key = index.key_of(row)
            for n in range(1, len(key) + 1):
                prefix = key[:n]
                if repr(prefix) not in seen and None not in prefix:
                    seen.add(repr(prefix))
                    out.append((index.iid, prefix))
        out += [(index.iid, ["t1", "s"]), (index.iid, ["t"]), (index.iid, ["t9"]), (index.iid, ["t0", "r", 0])]
    return out


async def copy_into_a_plain_space(server: Server) -> object:
    """An ordinary space with the queue space's definition and tuples (LMDB keeps its indexes)."""
    return await copy_into_a_plain_space_of(server, 0)


async def copy_into_a_plain_space_of(server: Server, space_id: int) -> object:
    catalog, queue = server.catalog, server.catalog.spaces[space_id]
    plain, _ = await catalog.create_space(f"plain_copy_{space_id}", format=queue.defn.format)
    for index in sorted(queue.indexes.values(), key=lambda i: i.iid):
        parts = [{"field": p.field, "type": p.type, "is_nullable": p.is_nullable} for p in index.defn.parts]
        await catalog.create_index(plain, index.name, index_type="TREE", unique=index.unique, parts=parts)
    # A fifth index, so that the engine does not take it for a queue space of its own (D12).
    await catalog.create_index(plain, "not_a_queue", index_type="TREE", unique=True, parts=[[0, "string"]])
    for raw in queue.select(0, it.ALL, [], 0, 1 << 30):
        await plain.replace(raw)
    assert plain.owned_by is None and not any(i.in_memory for i in plain.indexes.values())
    return plain


def index_entries(server: Server, space, iid: int) -> int:
    return server.catalog.storage.reader().stat(space.indexes[iid].db)["entries"]


async def test_selects_on_the_indexes_in_memory_answer_what_lmdb_answered(tmp_path, nursery):
    server = await start(tmp_path, nursery)
    try:
        queue = server.catalog.spaces[0]
        assert [i.in_memory for i in queue.indexes.values()] == [False, True, True, True]
        await fill_queue(server)
        plain = await copy_into_a_plain_space(server)
        assert plain.len() == queue.len() == 59
        # LMDB holds the tuples once: the indexes in memory write nothing there.
        assert [index_entries(server, queue, iid) for iid in (1, 2, 3)] == [0, 0, 0]
        assert index_entries(server, plain, 1) == 59
        assert compare(queue, plain) > 500
        assert sum(1 for _ in queue.pairs(1, it.REQ, ["t0"])) == sum(1 for _ in plain.pairs(1, it.REQ, ["t0"]))
        assert queue.count(2, it.GE, ["t1"]) == plain.count(2, it.GE, ["t1"])
        # Changes after the views were built reach them at the next read, without a new build.
        built = queue.views.builds
        raw = await server.engine.take(0, "t0", 2, 0)
        await plain.replace(raw)
        gone = decode_tuple(queue.select(1, it.EQ, ["t1", "r"], 0, 1)[0])[0]
        await server.engine.delete(0, gone)
        await plain.delete(0, [gone])
        await server.engine.put(0, "t1", delay=0, ttl=None, ttr=None, pri=1, data=["d1", "new"])
        (row,) = [r for r in queue.select(2, it.EQ, ["t1"]) if decode_tuple(r)[13] == "new"]
        await plain.replace(row)
        assert compare(queue, plain) > 500
        assert queue.views.builds == built
    finally:
        server.stop()


async def test_each_index_is_built_at_its_own_first_read(tmp_path, nursery):
    """A select by one index builds that index's view alone; another index's view, built later
    (after changes the first one has folded in), answers from the same snapshot."""
    server = await start(tmp_path, nursery)
    try:
        queue = server.catalog.spaces[0]
        await fill_queue(server)
        plain = await copy_into_a_plain_space(server)
        assert queue.views.builds == 0
        assert len(queue.select(1, it.EQ, ["t1", "r"])) == len(plain.select(1, it.EQ, ["t1", "r"]))
        assert queue.views.builds == 1 and list(queue.views.views) == [1]
        raw = await server.engine.take(0, "t1", 2, 0)
        await plain.replace(raw)
        await server.engine.put(0, "t0", delay=0, ttl=None, ttr=None, pri=3, data=["d0", "later"])
        (row,) = [r for r in queue.select(1, it.EQ, ["t0"]) if decode_tuple(r)[13] == "later"]
        await plain.replace(row)
        assert queue.views.builds == 1
        assert compare(queue, plain) > 500
        assert queue.views.builds == 3 and sorted(queue.views.views) == [1, 2, 3]
    finally:
        server.stop()


def compare(queue, plain) -> int:
    """Every iterator on every key of :func:`keys_to_try`, with and without offset and limit, on
    both spaces: the same rows (or the same error). Returns how many selects were compared."""
    compared = 0
    for (iid, key), iterator in itertools.product(keys_to_try(queue), ITERATORS):
        for offset, limit in ((0, 1 << 30), (1, 3)):
            try:
                expected = plain.select(iid, iterator, key, offset, limit)
            except BoxError as exc:
                expected = exc.code
            try:
                got = queue.select(iid, iterator, key, offset, limit)
            except BoxError as exc:
                got = exc.code
            assert got == expected, (iid, it.NAMES[iterator], key, offset, limit)
            compared += 1
    return compared


async def test_a_read_sees_the_snapshot_the_primary_index_shows(tmp_path, nursery):
    """A write that LMDB holds but whose group is not answered yet is seen by neither index; once
    the shared reader moves on, by both; a write rolled back leaves no trace."""
    server = await start(tmp_path, nursery)
    try:
        await fill_queue(server)
        queue = server.catalog.spaces[0]
        storage = server.catalog.storage
        before = queue.select(1, it.EQ, ["t0", "r"])
        assert before  # the views are built now
        row = decode_tuple(before[0])
        row[2] = "b"  # buried, as a write would leave it
        raw = msgpack.packb(row, use_bin_type=True)
        # Applied and committed to LMDB in a transaction of this test's, as the group committer
        # does; the shared reader has not been told (the group is not answered).
        txn = storage.env.begin(write=True)
        queue.prepare_put(raw, row, REPLACE)(txn)
        txn.commit()
        assert queue.select(1, it.EQ, ["t0", "r"]) == before
        assert queue.select(0, it.EQ, [row[0]]) == [before[0]]
        storage.committed()
        assert queue.select(0, it.EQ, [row[0]]) == [raw]
        assert queue.select(1, it.EQ, ["t0", "r"]) == before[1:]
        assert raw in queue.select(1, it.EQ, ["t0", "b"])
        # Rolled back: applied, then aborted.
        row[2] = "r"
        txn = storage.env.begin(write=True)
        queue.prepare_put(msgpack.packb(row, use_bin_type=True), row, REPLACE)(txn)
        txn.abort()
        storage.committed()
        assert raw in queue.select(1, it.EQ, ["t0", "b"])
        assert queue.select(1, it.EQ, ["t0", "r"]) == before[1:]
    finally:
        server.stop()


async def write_previous_layout(data_dir) -> int:
    """Put every tuple of the queue space again as the code before index views wrote them: a
    catalogue without the engine's ownership rules keeps every index in LMDB. Returns the index
    entries written."""
    written: list[int] = []

    async def build(catalog: Catalog, put) -> None:
        queue = catalog.spaces[0]
        assert not queue.memory_indexes
        for raw in queue.select(0, it.ALL, [], 0, 1 << 30):
            fields = decode_tuple(raw)
            await queue.delete(0, [fields[0]])  # a replace of the same tuple would skip its entries
            await put(queue, fields)
        reader = catalog.storage.reader()
        written.append(sum(reader.stat(queue.indexes[iid].db)["entries"] for iid in (1, 2, 3)))

    await write_old_layout(data_dir, build)
    return written[0]


async def test_a_directory_of_the_previous_layout_has_its_index_entries_dropped(tmp_path, nursery, caplog):
    server = await start(tmp_path, nursery)
    await fill_queue(server)
    expected = {decode_tuple(r)[0] for r in server.catalog.spaces[0].select(0, it.ALL, [])}
    server.stop()
    await trio.sleep(0.3)
    assert await write_previous_layout(tmp_path / "d") == 3 * 59
    caplog.set_level(logging.INFO, logger="boxqueue.spaces.catalog")
    server = await start(tmp_path, nursery)
    try:
        queue = server.catalog.spaces[0]
        assert [index_entries(server, queue, iid) for iid in (1, 2, 3)] == [0, 0, 0]
        dropped = [r.getMessage() for r in caplog.records if "now kept in memory" in r.getMessage()]
        assert len(dropped) == 3 and all("59 entries dropped" in line for line in dropped)
        # The same tasks (those taken were released when their sessions ended with the server).
        assert {decode_tuple(r)[0] for r in queue.select(0, it.ALL, [])} == expected
        assert compare(queue, await copy_into_a_plain_space(server)) > 500
        # The engine recovered the same tasks, and serves them.
        assert await server.engine.take(0, "t2", 1, 0) is not None
    finally:
        server.stop()


def test_a_follower_keeps_its_views_as_it_applies_the_leaders_records(tmp_path):
    """A follower's selects by the indexes in memory answer what the leader's do, before and after
    the follower built its views (records replayed from the leader reach them)."""
    cluster = Cluster(tmp_path)
    cluster.start()
    try:
        leader = cluster.wait_for_leader()
        conn = cluster.connect(leader)
        for n in range(30):
            conn.call("box.queue.put", [0, f"t{n % 2}", 0, 0, 0, n % 3, f"d{n % 4}"])
        follower = cluster.connect(cluster.followers(leader)[0])
        selects = [(index, key) for index in ("tube_status", "put_unique")
                   for key in ([], ["t0"], ["t1", "r"], ["t0", "t"], ["t0", "b"])]
        selects += [("tube_event", []), ("tube_event", ["t0"]), ("tube_event", ["t1"])]

        def rows(c, index, key) -> list[list]:
            return [list(t) for t in c.select("queue", key, index=index, limit=1000, iterator=it.GE if not key else it.EQ)]

        def followed() -> bool:
            return all(rows(follower, i, k) == rows(conn, i, k) for i, k in selects)

        cluster.wait_until(followed, what="the follower answers as the leader")
        taken = [conn.call("box.queue.take", [0, "t0", 1]).data[0][0] for _ in range(4)]
        conn.call("box.queue.ack", [0, taken[0]])
        conn.call("box.queue.bury", [0, taken[1]])
        conn.call("box.queue.delete", [0, conn.select("queue", ["t1", "r"], index="tube_status", limit=1)[0][0]])
        conn.call("box.queue.put", [0, "t1", 0, 0, 0, 0, "late"])
        assert rows(conn, "tube_status", ["t0", "t"]) and rows(conn, "tube_status", ["t0", "b"])
        cluster.wait_until(followed, what="the follower answers as the leader after more writes")
    finally:
        cluster.stop()


async def test_an_index_a_ddl_adds_to_a_queue_space_is_checked_and_kept_in_memory(tmp_path, nursery):
    """box.queue's spaces leave DDL to the user (put_unique's index is added that way): the new
    index is kept in memory, writes no LMDB entry, and still refuses tuples of the wrong type."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n{QUEUE_SPACE_0}{OTHER_SPACES}')
    server = Server(load_config(cfg), handle_signals=False)
    await nursery.start(server.run)
    try:
        engine, catalog = server.engine, server.catalog
        for n in range(20):
            await engine.put(1, f"t{n % 2}", delay=0, ttl=None, ttr=None, pri=0, data=[f"d{n % 3}"])
        plain = catalog.spaces[1]
        assert plain.memory_indexes and [i.in_memory for i in plain.indexes.values()] == [False, True, True]
        with pytest.raises(BoxError) as refused:  # field 6 (cid) holds numbers, not strings
            await catalog.create_index(plain, "wrong", index_type="TREE", unique=False,
                                       parts=[[1, "string"], [6, "string"]])
        assert refused.value.code == ER.FIELD_TYPE
        await catalog.create_index(plain, "put_unique", index_type="TREE", unique=False,
                                   parts=[[1, "string"], [2, "string"], {"field": 12, "type": "scalar", "is_nullable": True}])
        space = catalog.spaces[1]
        assert space.indexes[3].in_memory and index_entries(server, space, 3) == 0
        found = space.select(3, it.EQ, ["t1", "r", "d2"])
        assert sorted(decode_tuple(r)[12] for r in found) == ["d2"] * len(found) and len(found) == 3
        assert compare(space, await copy_into_a_plain_space_of(server, 1)) > 100
    finally:
        server.stop()
