"""Spaces whose data belongs to the engine (boxqueue/spaces/ownership.py): readable over iproto with the
read privilege, never changed directly (iproto DML, CALL of ``box.space.*``, the console's Lua),
always changed through the engine's own verbs (box.queue, Deckard, Zaqar, Sonya)."""

from __future__ import annotations

import httpx
import pytest
import tarantool
from tarantool.error import DatabaseError

from tests.integration.deckard_fixtures import Deckard, pb
from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.integration.test_console import Console
from tests.serverproc import ServerProcess, free_port

CLIENT = "3381af92-2b9e-11e3-b191-71861300734c"
ACCESS_DENIED = 42

USERS = """
[guest]
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[users]]
name = "admin2"
password = "pw"
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[space]]
id = 700
name = "plain"
indexes = [{ name = "pk", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] }]
"""


class Servers:
    def __init__(self, workdir) -> None:
        self.grpc_port, self.http_port, self.sonya_port = free_port(), free_port(), free_port()
        config = (
            f'[deckard]\nlisten = "127.0.0.1:{self.grpc_port}"\n'
            f'[zaqar]\nlisten = "127.0.0.1:{self.http_port}"\n'
            f'[sonya]\nlisten = "127.0.0.1:{self.sonya_port}"\ntask_events = ["emails"]\n'
            f"{USERS}{QUEUE_SPACE_0}"
        )
        self.proc = ServerProcess(workdir, extra_config=config, read_only=False, admin_port=free_port())


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    s = Servers(tmp_path_factory.mktemp("owned"))
    s.proc.start()
    yield s
    s.proc.stop()


@pytest.fixture
def conn(servers):
    c = tarantool.Connection("127.0.0.1", servers.proc.port)
    yield c
    c.close()


def fill_through_the_engine(servers: Servers, conn: tarantool.Connection) -> None:
    conn.call("box.queue.put", 0, "emails", 0, 60, 60, 0, "through box.queue")
    dk = Deckard(servers.grpc_port)
    try:
        dk.stub.Add(pb.AddRequest(messages=[pb.AddMessage(id="m1", queue="dq", string_payload="hi")]))
    finally:
        dk.close()
    headers = {"Client-ID": CLIENT, "X-Project-Id": "p"}
    with httpx.Client(base_url=f"http://127.0.0.1:{servers.http_port}", headers=headers, timeout=30) as z:
        assert z.put("/v1.1/queues/zq").status_code in (201, 204)
        assert z.post("/v1.1/queues/zq/messages", json={"messages": [{"ttl": 300, "body": 1}]}).status_code == 201
        pool = z.put("/v1.1/pools/pool1", json={"weight": 1, "uri": "boxqueue://pool_space"})
        assert pool.status_code in (201, 204), pool.text
        assert z.put("/v1.1/queues/on_pool").status_code in (201, 204)
        assert z.post("/v1.1/queues/on_pool/messages", json={"messages": [{"ttl": 300, "body": 2}]}).status_code == 201
    sonya = httpx.post(f"http://127.0.0.1:{servers.sonya_port}/queue/create/news", timeout=30)
    assert sonya.status_code in (200, 201)


OWNED = ["queue", "deckard", "zaqar", "pool_space", "tube_spaces", "tube_records", "tube_claims", "stream_marks",
         "sonya_queues", "sonya_counters", "sonya_versions", "zaqar_pools", "zaqar_flavors"]


def everything(conn: tarantool.Connection, name: str) -> list:
    return [list(t) for t in conn.select(name, [], limit=1000000)]


def test_direct_writes_are_refused_and_change_nothing(servers, conn):
    fill_through_the_engine(servers, conn)
    for name in OWNED:
        before = everything(conn, name)
        if name not in ("tube_claims", "stream_marks", "zaqar_flavors"):
            assert before, f"{name} was filled through the engine"
        sample = list(before[0]) if before else ["x", "y"]
        attempts = [
            ("replace", (name, sample)),
            ("insert", (name, ["a" * 32, *sample[1:]])),
            ("delete", (name, sample[:1])),
            ("update", (name, sample[:1], [("=", 1, "z")])),
            ("upsert", (name, sample, [("=", 1, "z")])),
            ("call", (f"box.space.{name}:replace", [sample])),
            ("call", (f"box.space.{name}:truncate",)),
            ("eval", (f"return box.space.{name}:delete(...)", [sample[:1]])),
        ]
        for method, args in attempts:
            with pytest.raises(DatabaseError) as err:
                getattr(conn, method)(*args)
            assert err.value.code == ACCESS_DENIED, (name, err.value)
            assert f"Write access to space '{name}' is denied for user 'guest'" in str(err.value)
        assert everything(conn, name) == before, name


def test_universe_rights_do_not_open_them_but_reads_work(servers, conn):
    fill_through_the_engine(servers, conn)
    admin = tarantool.Connection("127.0.0.1", servers.proc.port, user="admin2", password="pw")
    try:
        rows = admin.select("deckard", [])
        assert rows and all(r[1] == "dq" for r in rows)
        with pytest.raises(DatabaseError) as err:
            admin.replace("deckard", list(rows[0]))
        assert err.value.code == ACCESS_DENIED
        assert "Write access to space 'deckard' is denied for user 'admin2'" in str(err.value)
    finally:
        admin.close()


def test_the_engine_still_writes_them(servers, conn):
    task = conn.call("box.queue.put", 0, "emails", 0, 60, 60, 0, "engine write")[0]
    taken = conn.call("box.queue.take", 0, "emails", 5)[0]
    assert taken[0] in (task[0], taken[0])
    conn.call("box.queue.ack", 0, taken[0])
    assert not conn.select("queue", [taken[0]])


def test_an_ordinary_space_is_unaffected(conn):
    conn.replace("plain", [1, "x"])
    assert list(conn.select("plain", [1])[0]) == [1, "x"]
    conn.delete("plain", [1])


def test_console_lua_has_the_same_rule(servers):
    console = Console(servers.proc.admin_port)
    try:
        assert "error" not in console.run("\\login admin2 pw")
        for statement in (
            "box.space.deckard:replace{'q', 'x'}",
            "box.space.queue:truncate()",
            "box.space.sonya_versions:delete{'a', 'b', 1}",
        ):
            answer = console.run(statement)
            assert "Write access to space" in answer and "is denied for user 'admin2'" in answer, (statement, answer)
        for statement in ("box.space.deckard:drop()", "box.space.zaqar:rename('other')",
                          "box.space.tube_records.index.primary:drop()",
                          "box.space.sonya_queues:create_index('extra', {parts = {1, 'string'}, unique = false})"):
            answer = console.run(statement)
            assert "Alter access to space" in answer and "is denied" in answer, (statement, answer)
        assert "deckard" in console.run("box.space.deckard.name")
        # box.queue's spaces are the user's declarations: their schema stays the user's (an index
        # may be added, as put_unique needs), their data the engine's.
        answer = console.run("box.space.queue:create_index('by_created', {parts = {{8, 'unsigned'}}, unique = false})")
        assert "error" not in answer, answer
        assert "error" not in console.run("box.space.queue.index.by_created:drop()")
        answer = console.run("box.space.queue:select({}, {limit = 1})")
        assert "error" not in answer
    finally:
        console.close()
