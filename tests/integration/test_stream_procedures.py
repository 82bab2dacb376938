"""The procedures of the Spark streaming source and sink (boxqueue/tubes/stream_procedures.py) over
iproto with the ``tarantool`` connector, against a real server: claims named by the caller on a
box.queue (1.5 layout) tube and on a tarantool/queue (tube layout) tube, kept across restarts
(SIGTERM and kill -9), reads by claim, acks, lapses, and marked writes that a second run skips."""

from __future__ import annotations

import time

import pytest
import tarantool
from tarantool.error import DatabaseError

from tests.integration.queue_fixtures import QUEUE_SPACE_0, RawIproto
from tests.serverproc import ServerProcess

ILLEGAL_PARAMS = 1

SPACES = QUEUE_SPACE_0 + """
[[space]]
id = 700
name = "target"
format = [{ name = "id", type = "unsigned" }, { name = "v", type = "string" }]
indexes = [{ name = "pk", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] }]
"""


@pytest.fixture
def server(tmp_path):
    proc = ServerProcess(tmp_path / "srv", extra_config=SPACES, wal_mode="fsync", read_only=False)
    proc.start()
    yield proc
    proc.stop()


def connect(server: ServerProcess) -> tarantool.Connection:
    return tarantool.Connection("127.0.0.1", server.port)


def put(conn, tube: str, count: int, start: int = 0) -> list[str]:
    return [conn.call("box.queue.put", [0, tube, 0, 0, 0, 0, f"task-{start + i}"]).data[0][0] for i in range(count)]


def read_claim(conn, space: int, tube: str, claim: str, page: int = 1000) -> list[list]:
    """Every task of a claim, paged by ``created`` as the source's executors read it."""
    tasks: list[list] = []
    after = 0
    while True:
        data_at, _kind, rows = conn.call("boxqueue.stream_read", [space, tube, claim, after, page]).data
        tasks += [[*row[:12], row[data_at:]] for row in rows]
        if len(rows) < page:
            return tasks
        after = rows[-1][7]


def statuses(conn, tube: str) -> dict[str, int]:
    stats = conn.call("box.queue.statistics", [0, tube]).data[0]
    pairs = dict(zip(stats[::2], stats[1::2], strict=True))
    return {k.rsplit(".", 1)[1]: v for k, v in pairs.items() if ".tasks." in k}


def test_a_named_claim_on_a_box_queue_tube_survives_restarts_and_its_ack_deletes_its_tasks(server):
    conn = connect(server)
    ids = put(conn, "events", 25)
    assert conn.call("boxqueue.stream_claim", [0, "events", "s1.1.0", 10, 60]).data == [10]
    assert conn.call("boxqueue.stream_claim", [0, "events", "s1.1.1", 10, 60]).data == [10]
    # Asked again (a driver restarted, an answer lost): the same claim, nothing more taken.
    assert conn.call("boxqueue.stream_claim", [0, "events", "s1.1.0", 10, 60]).data == [10]
    first = read_claim(conn, 0, "events", "s1.1.0", page=3)
    second = read_claim(conn, 0, "events", "s1.1.1")
    assert [t[0] for t in first] == ids[:10] and [t[0] for t in second] == ids[10:20]
    assert [t[12] for t in first] == [[f"task-{i}"] for i in range(10)]
    assert {t[2] for t in first} == {"t"} and all(t[6] >= 2**63 for t in first)  # held by the claim's number
    assert statuses(conn, "events")["taken"] == 20
    conn.close()

    server.restart()
    conn = connect(server)
    assert [t[0] for t in read_claim(conn, 0, "events", "s1.1.0")] == ids[:10]
    server.kill()
    server.start()
    conn = connect(server)
    assert [t[0] for t in read_claim(conn, 0, "events", "s1.1.1")] == ids[10:20]
    # A session's take sees only what no claim holds.
    assert conn.call("box.queue.take", [0, "events", 0]).data[0][0] == ids[20]
    assert conn.call("boxqueue.stream_ack", [0, "events", ["s1.1.0", "s1.1.1", "never-made"]]).data == [20]
    assert conn.call("boxqueue.stream_ack", [0, "events", ["s1.1.0"]]).data == [0]  # acked already
    assert read_claim(conn, 0, "events", "s1.1.0") == []
    assert statuses(conn, "events") == {"total": 5, "ready": 4, "delayed": 0, "taken": 1, "buried": 0, "done": 0}
    conn.close()
    server.kill()
    server.start()
    conn = connect(server)
    # The ack is durable: nothing came back. (Counted in the space, not by statistics: whether the
    # closed session's take was released before the kill or by the restart decides which counter
    # moved, and a restart after the release lists the tube with no counters at all.)
    assert len([t for t in conn.select(0, []) if t[1] == "events"]) == 5
    conn.close()


def test_a_lapsed_claim_returns_its_tasks_to_ready_and_a_renewed_one_holds(server):
    conn = connect(server)
    ids = put(conn, "lapse", 4)
    assert conn.call("boxqueue.stream_claim", [0, "lapse", "a", 2, 1]).data == [2]
    assert conn.call("boxqueue.stream_claim", [0, "lapse", "b", 2, 1]).data == [2]
    for _ in range(3):  # 1.5 s, each renewal a full second again
        time.sleep(0.5)
        assert conn.call("boxqueue.stream_renew", [0, "lapse", ["b"], 1]).data == [1]
    assert conn.call("boxqueue.stream_renew", [0, "lapse", ["a"], 1]).data == [0]
    assert read_claim(conn, 0, "lapse", "a") == []
    assert [t[0] for t in read_claim(conn, 0, "lapse", "b")] == ids[2:]
    taken = [conn.call("box.queue.take", [0, "lapse", 0]).data for _ in range(3)]
    assert [t[0][0] for t in taken if t] == ids[:2]  # a's tasks are ready again, with cid 0
    assert conn.call("box.queue.meta", [0, ids[0]]).data[0][6] != 0  # now the session's
    # Stored too, with the claim's delivery counted: the take made it two.
    assert sorted(t[11] for t in conn.select(0, []) if t[0] in ids[:2]) == [2, 2]
    conn.close()


def test_claims_take_only_tasks_created_in_their_range(server):
    conn = connect(server)
    put(conn, "ranged", 3)
    cutoff = int(time.time() * 1_000_000)
    time.sleep(0.01)
    late = put(conn, "ranged", 2, start=3)
    assert conn.call("boxqueue.stream_claim", [0, "ranged", "late", 10, 60, cutoff]).data == [2]
    assert [t[0] for t in read_claim(conn, 0, "ranged", "late")] == late
    assert conn.call("boxqueue.stream_claim", [0, "ranged", "early", 10, 60, 0, cutoff]).data == [3]
    assert conn.call("boxqueue.stream_claim", [0, "ranged", "none", 10, 60, 0, cutoff]).data == [0]
    conn.close()


def test_a_tarantool_queue_tube_is_claimed_by_its_claim_id(server):
    conn = connect(server)
    conn.eval("queue.create_tube(..., 'fifo')", ["jobs"])
    for i in range(3):
        conn.call("queue.tube.jobs:put", [f"job-{i}"])
    space = conn.eval("return box.space.jobs.id").data[0]
    # put_many numbers the tasks of a tarantool/queue tube as its put does (all got id 3 before)
    assert conn.call("boxqueue.put_many", [space, "jobs", [[0, 0, 0, 0, "job-3"], [0, 0, 0, 0, "job-4"]]]).data == [2]
    assert [t[0] for t in conn.select(space, [], limit=10).data] == ["0", "1", "2", "3", "4"]
    assert conn.call("boxqueue.stream_claim", [space, "jobs", "q.1.0", 3, 60]).data == [3]
    tasks = read_claim(conn, space, "jobs", "q.1.0")
    assert [t[12] for t in tasks] == [["job-0"], ["job-1"], ["job-2"]]
    assert {t[6] for t in tasks} == {"q.1.0"}
    assert conn.call("queue.tube.jobs:take", [0]).data[0][2] == "job-3"
    server.kill()
    server.start()
    conn = connect(server)
    assert len(read_claim(conn, space, "jobs", "q.1.0")) == 3
    assert conn.call("boxqueue.stream_ack", [space, "jobs", ["q.1.0"]]).data == [3]
    # After the restart job-3's take was released: job-3 and job-4 are left, nothing of the claim.
    left = [conn.call("queue.tube.jobs:take", [0]).data for _ in range(3)]
    assert sorted(t[0][2] for t in left if t) == ["job-3", "job-4"]
    conn.close()


def test_while_a_change_hook_is_set_a_stream_claim_writes_its_tasks_headers(server):
    """A tarantool/queue on_task_change callback (and Sonya's task events) reads the stored tuples:
    while one is set, a stream's claim is not listed, and its tasks' headers are written."""
    conn = connect(server)
    conn.eval("""
        otc_seen = {}
        queue.create_tube(..., 'fifo', {on_task_change = function(task, what)
            table.insert(otc_seen, {task[2], what})
        end})
    """, ["watched"])
    for i in range(2):
        conn.call("queue.tube.watched:put", [f"w-{i}"])
    space = conn.eval("return box.space.watched.id").data[0]
    assert conn.call("boxqueue.stream_claim", [space, "watched", "w.1.0", 2, 60]).data == [2]
    assert [t[2] for t in conn.select(space, [], limit=10).data] == ["t", "t"]
    assert conn.select("tube_claims", [], limit=10).data[0][7:] == []  # its record lists nothing
    deadline = time.monotonic() + 10
    while len(conn.eval("return otc_seen").data[0]) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [what for _status, what in conn.eval("return otc_seen").data[0]] == ["put", "put", "take", "take"]
    conn.close()


def test_marked_puts_and_replaces_are_written_once(server):
    conn = connect(server)
    rows = [[0, 0, 0, 0, f"m-{i}"] for i in range(100)] + [[0, 0, 0, 5, "urgent"]]
    mark = ["query/queue/out", 7, 0, 123456789, 0]
    assert conn.call("boxqueue.put_many", [0, "out", rows, mark]).data == [101]
    assert conn.call("boxqueue.put_many", [0, "out", rows, mark]).data == [None]
    assert conn.call("boxqueue.put_many", [0, "out", rows[:1], ["query/queue/out", 7, 0, 123456789, 1]]).data == [1]
    assert len(conn.select(0, ["out"], index=1, limit=1000).data) == 102
    assert conn.call("box.queue.take", [0, "out", 0]).data[0][3] == "urgent"  # pri 5 before pri 0
    tuples = [[i, f"v{i}"] for i in range(50)]
    tmark = ["query/target", 7, 1, 99, 0]
    assert conn.call("boxqueue.replace_many", ["target", tuples, tmark]).data == [50]
    conn.replace("target", [0, "changed"])
    assert conn.call("boxqueue.replace_many", [700, tuples, tmark]).data == [None]
    assert conn.select("target", [0]).data == [[0, "changed"]]  # the second run wrote nothing
    # A tuple that does not fit fails the whole write, mark included.
    bad = [[1000, "ok"], ["not a number", "x"]]
    with pytest.raises(DatabaseError):
        conn.call("boxqueue.replace_many", ["target", bad, ["query/target", 8, 0, 1, 0]])
    assert conn.select("target", [1000]).data == []
    assert conn.call("boxqueue.replace_many", ["target", bad[:1], ["query/target", 8, 0, 1, 0]]).data == [1]
    assert conn.call("boxqueue.forget_marks", ["query/queue/out", 8]).data == [2]
    assert conn.call("boxqueue.put_many", [0, "out", rows[:1], mark]).data == [1]  # forgotten: written again
    assert conn.call("boxqueue.forget_marks", ["query/target", 8]).data == [1]
    assert conn.call("boxqueue.forget_marks", ["query/target", 9]).data == [1]
    conn.close()


def test_bad_arguments_are_refused_with_their_name(server):
    conn = connect(server)
    for fn, args, text in [
        ("boxqueue.stream_claim", [0, "t", "c", -1, 60], "'limit'"),
        ("boxqueue.stream_claim", [0, "t", "", 1, 60], "'claim'"),
        ("boxqueue.stream_read", [0, "t", "c", "x", 10], "'after'"),
        ("boxqueue.stream_ack", [0, "t", "c"], "'claims'"),
        ("boxqueue.put_many", [0, "t", [[0, 0]]], "a row is"),
        ("boxqueue.put_many", [0, "t", [], ["w", 1]], "'mark'"),
        ("boxqueue.forget_marks", ["w", -1], "'below_batch'"),
    ]:
        with pytest.raises(DatabaseError) as err:
            conn.call(fn, args)
        assert err.value.args[0] == ILLEGAL_PARAMS and text in err.value.args[1], (fn, err.value)
    with pytest.raises(DatabaseError) as err:
        conn.call("boxqueue.stream_claim", [700, "t", "c", 1, 60])
    assert "Space '700' does not exist" in str(err.value)  # not a queue space
    assert conn.ping() is not None
    conn.close()


def test_the_first_calls_on_a_fresh_server_arriving_together_all_succeed(server):
    """The first call makes the engine's record spaces; the calls beside it wait for them (each
    made its own before, and all but one failed with ER_INDEX_EXISTS)."""
    raw = RawIproto(server.port)
    calls = [("boxqueue.replace_many", ["target", [[i, "v"]], ["w", 1, i, 0, 0]]) for i in range(8)]
    calls += [("boxqueue.put_many", [0, "first", [[0, 0, 0, 0, i]], ["w2", 1, i, 0, 0]]) for i in range(8)]
    answers = [raw.wait_for(sync) for sync in raw.send_many(calls)]
    assert answers == [(0, [1])] * 16
    raw.close()


def test_a_stream_claim_is_one_record_and_a_task_that_leaves_it_stays_out_after_a_kill(tmp_path):
    """A stream's claim is listed (boxqueue/tubes/tube.py, Claim): its record names its tasks and
    the stored tuples keep their headers, so a raw select shows them as they were before the
    claim while every queue verb shows them taken. A task another API returns to ready (a Deckard
    Ack, which needs no owner) has its header written then, and a restart does not give it back
    to the claim; the others stay the claim's."""
    from tests.integration.test_cross_api import Servers, call

    servers = Servers(tmp_path / "srv")
    servers.start()
    try:
        sid = servers.space_id("deckard")
        conn = servers.iproto()
        ids = [call(conn, "put", sid, "jobs", 0, 0, 0, 0, f"job-{i}")[0][0] for i in range(3)]
        assert conn.call("boxqueue.stream_claim", [sid, "jobs", "s.1.0", 3, 60]).data == [3]
        stored = {t[0]: t for t in conn.select(sid, []) if t[1] == "jobs"}
        assert {stored[i][2] for i in ids} == {"r"} and {stored[i][11] for i in ids} == {0}
        assert [call(conn, "peek", sid, i)[0][2] for i in ids] == ["taken"] * 3
        assert [(t[2], t[11]) for t in read_claim(conn, sid, "jobs", "s.1.0")] == [("t", 1)] * 3
        conn.close()
        assert servers.dk.ack("jobs", ids[0]).success  # back to ready: out of the claim
        servers.restart("kill")
        conn = servers.iproto()
        assert [t[0] for t in read_claim(conn, sid, "jobs", "s.1.0")] == ids[1:]
        assert [call(conn, "peek", sid, i)[0][2] for i in ids] == ["ready", "taken", "taken"]
        assert servers.dk.pull_ids("jobs", 10) == [ids[0]]
        assert conn.call("boxqueue.stream_ack", [sid, "jobs", ["s.1.0"]]).data == [2]
        assert sorted(t[0] for t in conn.select(sid, []) if t[1] == "jobs") == [ids[0]]
        conn.close()
    finally:
        servers.stop()
