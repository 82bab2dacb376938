"""One engine behind box.queue, Deckard and Zaqar: a task put through one API is taken, settled and
inspected through the others, with their real clients (the ``tarantool`` connector, grpcio stubs,
httpx), and every step survives a restart of the server (SIGTERM or kill -9)."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest
import tarantool
from tarantool.error import DatabaseError

from tests.integration.deckard_fixtures import Deckard, pb
from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.serverproc import ServerProcess, free_port

CLIENT = "3381af92-2b9e-11e3-b191-71861300734c"


class Servers:
    """One boxqueue process serving iproto, Deckard and Zaqar."""

    def __init__(self, workdir, deckard: str = "", zaqar: str = "") -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        config = (
            f'[deckard]\nlisten = "127.0.0.1:{self.grpc_port}"\n{deckard}\n'
            f'[zaqar]\nlisten = "127.0.0.1:{self.http_port}"\n{zaqar}\n{QUEUE_SPACE_0}'
        )
        self.proc = ServerProcess(workdir, extra_config=config, read_only=False)
        self.dk: Deckard | None = None

    def start(self) -> None:
        self.proc.start()
        self.dk = Deckard(self.grpc_port)

    def restart(self, how: str) -> None:
        if self.dk is not None:
            self.dk.close()
        if how == "kill":
            self.proc.kill()
        else:
            assert self.proc.stop() == 0
        self.start()

    def stop(self) -> None:
        if self.dk is not None:
            self.dk.close()
        self.proc.stop()

    def zaqar(self, project: str = "proj") -> httpx.Client:
        headers = {"Client-ID": CLIENT, "X-Project-Id": project}
        return httpx.Client(base_url=f"http://127.0.0.1:{self.http_port}", headers=headers, timeout=30)

    def iproto(self) -> tarantool.Connection:
        return tarantool.Connection("127.0.0.1", self.proc.port)

    def space_id(self, name: str) -> int:
        conn = self.iproto()
        try:
            return conn.schema.get_space(name).sid
        finally:
            conn.close()


@pytest.fixture
def servers(tmp_path):
    s = Servers(tmp_path / "srv")
    s.start()
    yield s
    s.stop()


def call(conn: tarantool.Connection, fn: str, *args) -> list:
    return conn.call("box.queue." + fn, list(args)).data


def test_put_over_zaqar_then_take_and_ack_over_iproto(servers):
    """A Zaqar message is a task of the Zaqar space (tube "project/queue", body = its one data
    field); a box.queue take holds it (Zaqar counts it claimed), ack removes it."""
    with servers.zaqar() as z:
        r = z.post("/v1.1/queues/jobs/messages", json={"messages": [{"body": {"n": 1}, "ttl": 600},
                                                                    {"body": "second", "ttl": 600}]})
        assert r.status_code == 201
        first, second = (href.rsplit("/", 1)[1] for href in r.json()["resources"])
    servers.restart("kill")
    sid = servers.space_id("zaqar")
    conn = servers.iproto()
    try:
        assert call(conn, "take", sid, "proj/jobs", 5) == [[first, "proj/jobs", "taken", {"n": 1}]]
        with servers.zaqar() as z:
            stats = z.get("/v1.1/queues/jobs/stats").json()["messages"]
            assert (stats["claimed"], stats["free"], stats["total"]) == (1, 1, 2)
            assert [m["id"] for m in z.get("/v1.1/queues/jobs/messages?echo=true").json()["messages"]] == [second]
            r = z.delete(f"/v1.1/queues/jobs/messages/{first}")  # taken, and no claim of Zaqar's
            assert r.status_code == 403
        assert call(conn, "ack", sid, first)[0][:3] == [first, "proj/jobs", "taken"]
    finally:
        conn.close()
    servers.restart("term")
    with servers.zaqar() as z:
        assert z.get(f"/v1.1/queues/jobs/messages/{first}").status_code == 404
        assert [m["body"] for m in z.get("/v1.1/queues/jobs/messages?echo=true").json()["messages"]] == ["second"]
        assert z.get("/v1.1/queues/jobs/stats").json()["messages"]["total"] == 1


def test_add_over_deckard_then_claim_and_delete_over_zaqar(servers):
    """A Zaqar pool on the Deckard space puts Deckard's queue "proj/q" within Zaqar's reach as
    queue q of project proj: a claim holds the message (Deckard sees it processing), a delete
    with the claim removes it."""
    q = "proj/q" + uuid.uuid4().hex[:6]
    name = q.split("/")[1]
    servers.dk.stub.Add(pb.AddRequest(messages=[
        pb.AddMessage(id="m1", queue=q, string_payload="hello", score=2),
        pb.AddMessage(id="m2", queue=q, string_payload="world", score=1),
    ]))
    with servers.zaqar() as z:
        assert z.put("/v1.1/pools/dk", json={"uri": "boxqueue://deckard", "weight": 1}).status_code == 201
    servers.restart("term")
    with servers.zaqar() as z:
        r = z.post(f"/v1.1/queues/{name}/claims?limit=1", json={"ttl": 120, "grace": 60})
        assert r.status_code == 201
        (message,) = r.json()["messages"]
        assert (message["id"], message["body"]) == ("m2", "world")  # Deckard's score order
        claim_href = message["href"]
    assert servers.dk.pull_ids(q, 10) == ["m1"]  # m2 is being processed
    assert servers.dk.get(q, "m2").found
    servers.restart("kill")
    with servers.zaqar() as z:
        claim_id = claim_href.split("claim_id=")[1]
        got = z.get(f"/v1.1/queues/{name}/claims/{claim_id}").json()
        assert [m["id"] for m in got["messages"]] == ["m2"]
        assert z.delete(claim_href).status_code == 204
        assert z.get(f"/v1.1/queues/{name}/messages/m2").status_code == 404
    assert not servers.dk.get(q, "m2").found
    servers.restart("term")
    assert not servers.dk.get(q, "m2").found
    assert servers.dk.count(q) == 1


def test_put_over_iproto_then_pull_and_ack_over_deckard(servers):
    """A box.queue put into the Deckard space is a message of Deckard's queue with that name; a
    Deckard Ack returns it to the back of the queue (Deckard's meaning), an Ack with
    removeMessage removes it."""
    sid = servers.space_id("deckard")
    queue = "jobs-" + uuid.uuid4().hex[:6]
    conn = servers.iproto()
    try:
        (task,) = call(conn, "put", sid, queue, 0, 0, 0, 0, "payload")
        (other,) = call(conn, "put", sid, queue, 0, 0, 0, 0, "x", 2)  # two data fields
    finally:
        conn.close()
    servers.restart("kill")
    pulled = servers.dk.pull(queue)
    assert [(m.id, m.string_payload) for m in pulled] == [(task[0], "payload")]
    conn = servers.iproto()
    try:
        assert call(conn, "peek", sid, task[0])[0][2] == "taken"  # processing is taken
        assert servers.dk.ack(queue, task[0]).success
        assert call(conn, "peek", sid, task[0])[0][2] == "ready"
    finally:
        conn.close()
    servers.restart("term")
    assert [(m.id, m.string_payload) for m in servers.dk.pull(queue, 10)] == [
        (other[0], json.dumps(["x", 2])), (task[0], "payload")]  # the acked one went to the back
    got = servers.dk.get(queue, task[0]).message
    assert got.diagnostics.acks == 1
    answer = servers.dk.ack(queue, task[0], removeMessage=True)
    assert answer.success and answer.removal_response.storageRemoved == 1
    servers.restart("kill")
    conn = servers.iproto()
    try:
        with pytest.raises(DatabaseError, match="Task not found"):
            call(conn, "peek", sid, task[0])
        assert call(conn, "peek", sid, other[0])[0][2] == "taken"  # Deckard consumers keep deadlines (K13)
    finally:
        conn.close()


def test_a_box_queue_take_is_processing_for_deckard_and_its_timeout_is_deckards(tmp_path):
    """box.queue's take of a Deckard message: Deckard cannot pull it and may ack it; box.queue's
    own verbs check the taker; the session ending puts it back."""
    servers = Servers(tmp_path / "srv")
    servers.start()
    try:
        sid = servers.space_id("deckard")
        servers.dk.add("dq", "a", string_payload="A", score=5)
        conn = servers.iproto()
        try:
            assert call(conn, "take", sid, "dq", 1) == [["a", "dq", "taken", "A"]]
            assert servers.dk.pull("dq") == []
            other = servers.iproto()
            try:
                with pytest.raises(DatabaseError, match="Only consumer that took the task can it ack"):
                    call(other, "ack", sid, "a")
            finally:
                other.close()
        finally:
            conn.close()
        deadline = time.monotonic() + 5
        while not servers.dk.pull_ids("dq") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert servers.dk.get("dq", "a").message.score == 5  # a disconnect keeps the position
    finally:
        servers.stop()


def test_one_space_for_deckard_and_zaqar(tmp_path):
    """``[deckard] space`` and ``[zaqar] space`` may name the same space: Deckard's queue "p/q"
    is Zaqar's queue q of project p."""
    servers = Servers(tmp_path / "srv", deckard='space = "shared"', zaqar='space = "shared"')
    servers.start()
    try:
        servers.dk.add("p/q", "d1", string_payload="from deckard")
        with servers.zaqar("p") as z:
            z.post("/v1.1/queues/q/messages", json={"messages": [{"body": "from zaqar"}]})
            listed = z.get("/v1.1/queues/q/messages?echo=true").json()["messages"]
            assert [m["body"] for m in listed] == ["from deckard", "from zaqar"]
        servers.restart("term")
        assert sorted(m.string_payload for m in servers.dk.pull("p/q", 10)) == ["from deckard", "from zaqar"]
        with servers.zaqar("p") as z:
            assert z.get("/v1.1/queues/q/stats").json()["messages"]["claimed"] == 2
    finally:
        servers.stop()
