"""tarantool/queue's API (``queue.create_tube``, ``queue.tube.<name>:<method>``) over CALL with the
``tarantool`` connector: the same scenarios, with the same expected answers, run against boxqueue
and (``BOXQUEUE_TEST_TARGET=tarantool``) against Tarantool 2.6 running the module itself, from the
folder in ``BOXQUEUE_QUEUE_MODULE`` (default: ``../shared/anchors/tarantool-queue`` next to the
repository), which checks that every expectation here is the module's.

Timing fields are not compared (the module's answers hold none: a task is ``[id, status, data]``).
Errors are compared by code and text, without the ``file:line:`` prefix Lua gives the module's
errors (it names where the module is installed)."""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from pathlib import Path

import pytest
import tarantool

from tests.integration.conftest import TARGET, ReferenceTarantool
from tests.serverproc import ServerProcess

GUEST = """
[guest]
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[users]]
name = "admin"
password = "adminpw"
"""
MODULE = Path(os.environ.get("BOXQUEUE_QUEUE_MODULE", Path(__file__).parents[3] / "shared/anchors/tarantool-queue"))
_names = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if TARGET == "tarantool":  # Tarantool 2.6 with the module loaded as `queue`
        if not (MODULE / "queue" / "init.lua").exists():
            pytest.skip(f"the tarantool/queue module is not in {MODULE} (BOXQUEUE_QUEUE_MODULE)")
        ref = ReferenceTarantool(tmp_path_factory.mktemp("tarantool-queue"), "tarantool_queue_reference.lua",
                                 {"TT_QUEUE_MODULE": str(MODULE)})
        yield ref
        ref.stop()
        return
    proc = ServerProcess(tmp_path_factory.mktemp("queue-module"), extra_config=GUEST)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def connect(server):
    opened = []

    def connect() -> tarantool.Connection:
        conn = tarantool.connect("127.0.0.1", server.port)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()


@pytest.fixture
def conn(connect):
    return connect()


def call(conn: tarantool.Connection, name: str, *args):
    """The answer's data, or ("error", code, text) with Lua's location prefix taken off."""
    try:
        return conn.call(name, list(args)).data
    except tarantool.error.DatabaseError as exc:
        code, text = exc.args[0], exc.args[1]
        return ("error", code, re.sub(r"^\S*\.lua:\d+: ", "", text))


def new_tube(conn: tarantool.Connection, kind: str, opts: dict | None = None) -> str:
    """A tube of its own for the test. Over CALL the module fails to encode the tube object it
    returns (it holds functions; fifottl's and utubettl's, their fiber first): the tube exists
    all the same."""
    name = f"t{os.getpid()}_{next(_names)}_{kind}"
    args = [name, kind] if opts is None else [name, kind, opts]
    held = "userdata" if kind in ("fifottl", "utubettl") else "function"
    assert call(conn, "queue.create_tube", *args) == ("error", 32, f"unsupported Lua type '{held}'")
    return name


def call_in_background(conn: tarantool.Connection, name: str, *args):
    """:func:`call` in a thread of its own, given 0.3 s to reach the server and wait there; join
    the thread, then read its answer from the list."""
    got: list = []
    thread = threading.Thread(target=lambda: got.append(call(conn, name, *args)))
    thread.start()
    time.sleep(0.3)
    return thread, got


def wait_for(fn, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("kind", ["fifo", "fifottl"])
def test_put_take_ack_answer_the_task_with_integer_ids_and_status_letters(conn, kind):
    tube = new_tube(conn, kind)
    q = f"queue.tube.{tube}:"
    assert call(conn, q + "put", "a") == [[0, "r", "a"]]
    assert call(conn, q + "put", {"k": [1, 2]}) == [[1, "r", {"k": [1, 2]}]]
    assert call(conn, q + "take") == [[0, "t", "a"]]
    assert call(conn, q + "peek", 0) == [[0, "t", "a"]]
    assert call(conn, q + "ack", 0) == [[0, "-", "a"]]
    assert call(conn, q + "peek", 0) == ("error", 32, "Task 0 not found")
    assert call(conn, q + "take", 0) == [[1, "t", {"k": [1, 2]}]]
    assert call(conn, q + "take", 0) == []
    assert call(conn, q + "release", 1) == [[1, "r", {"k": [1, 2]}]]
    # An id is one more than the highest one the tube holds: 1 is there, so 2; with the highest
    # gone, its id is given again.
    assert call(conn, q + "put", "c") == [[2, "r", "c"]]
    assert call(conn, q + "delete", 2) == [[2, "-", "c"]]
    assert call(conn, q + "put", "d") == [[2, "r", "d"]]
    assert call(conn, q + "truncate") == []
    assert call(conn, q + "put", "e") == [[0, "r", "e"]]
    assert call(conn, q + "drop") == [True]


def test_fifo_takes_in_put_order_whatever_the_priority(conn):
    tube = new_tube(conn, "fifo")
    q = f"queue.tube.{tube}:"
    for data, pri in (("a", 5), ("b", 0), ("c", -1)):
        call(conn, q + "put", data, {"pri": pri})
    assert [call(conn, q + "take", 0)[0][2] for _ in range(3)] == ["a", "b", "c"]


def test_fifottl_takes_the_smallest_priority_first_then_in_put_order(conn):
    tube = new_tube(conn, "fifottl", {"pri": 3})
    q = f"queue.tube.{tube}:"
    call(conn, q + "put", "default-1")  # the tube's pri, 3
    call(conn, q + "put", "five", {"pri": 5})
    call(conn, q + "put", "zero", {"pri": 0})
    call(conn, q + "put", "default-2")
    call(conn, q + "put", "one", {"pri": 1})
    taken = [call(conn, q + "take", 0)[0][2] for _ in range(5)]
    assert taken == ["zero", "one", "default-1", "default-2", "five"]
    assert call(conn, q + "release", 2) == [[2, "r", "zero"]]
    assert call(conn, q + "take", 0) == [[2, "t", "zero"]]
    # the space's format keeps pri unsigned
    refused = ("error", 23, "Tuple field 6 type does not match one required by operation: expected unsigned")
    assert call(conn, q + "put", "minus", {"pri": -2}) == refused
    assert call(conn, q + "put", "half", {"pri": 0.5}) == refused


def test_errors_of_the_methods(connect):
    conn, other = connect(), connect()
    tube = new_tube(conn, "fifo")
    q = f"queue.tube.{tube}:"
    assert call(conn, "queue.create_tube", tube, "fifo") == ("error", 32, f"Space '{tube}' already exists")
    assert call(conn, "queue.create_tube", tube + "x", "lifo") == ("error", 32, "Unknown tube type lifo")
    assert call(conn, "queue.create_tube", tube + "x", "fifo") != ("error", 32, "Unknown tube type lifo")  # (made)
    assert call(conn, f"queue.tube.{tube}x:drop") == [True]
    assert call(conn, "queue.tube.no_such_tube:put", 1) == ("error", 33, "Procedure 'queue.tube.no_such_tube:put' is not defined")
    assert call(conn, q + "put") == ("error", 39, "Tuple field 3 required by space format is missing")
    call(conn, q + "put", "a")
    call(conn, q + "put", "b")
    assert call(conn, q + "ack", 0) == ("error", 32, "Task was not taken")
    assert call(conn, q + "release", 0) == ("error", 32, "Task was not taken")
    assert call(conn, q + "ack", 77) == ("error", 32, "Task was not taken")
    assert call(conn, q + "peek", 77) == ("error", 32, "Task 77 not found")
    assert call(conn, q + "delete", 77) == ("error", 32, "Task 77 not found")
    assert call(conn, q + "bury", 77) == ("error", 32, "Task 77 not found")
    assert call(conn, q + "take", 0) == [[0, "t", "a"]]
    # Only the session that took a task acks, releases or touches it.
    assert call(other, q + "ack", 0) == ("error", 32, "Task was not taken")
    assert call(other, q + "release", 0) == ("error", 32, "Task was not taken")
    assert call(other, q + "touch", 0, 5) == ("error", 32, "Task was not taken")
    assert call(conn, q + "touch", 0, 5) == ("error", 32, "fifo queue does not support touch")
    assert call(conn, q + "touch", 0) == []  # no delta: nothing done
    assert call(conn, q + "touch", 0, -1) == []
    assert call(conn, q + "drop") == ("error", 32, "There are taken tasks in the tube")
    assert call(conn, q + "ack", 0) == [[0, "-", "a"]]
    assert call(conn, q + "drop") == [True]
    assert call(conn, q + "put", "x") == ("error", 33, f"Procedure 'queue.tube.{tube}:put' is not defined")


@pytest.mark.parametrize("kind", ["fifo", "fifottl"])
def test_bury_and_kick(connect, kind):
    conn, other = connect(), connect()
    tube = new_tube(conn, kind)
    q = f"queue.tube.{tube}:"
    for data in "abcd":
        call(conn, q + "put", data)
    assert call(conn, q + "bury", 1) == [[1, "!", "b"]]
    assert call(conn, q + "bury", 1) == [[1, "!", "b"]]  # buried already: as it is
    assert call(conn, q + "take", 0) == [[0, "t", "a"]]
    assert call(other, q + "bury", 0) == [[0, "!", "a"]]  # any session buries any task
    assert call(conn, q + "ack", 0) == ("error", 32, "Task was not taken")
    assert call(conn, q + "bury", 3) == [[3, "!", "d"]]
    assert call(conn, q + "kick", 2) == [2]
    assert call(conn, q + "kick", 5) == [1]
    assert call(conn, q + "kick") == [0]
    assert call(conn, q + "kick", 0) == [0]
    assert sorted(call(conn, q + "take", 0)[0][0] for _ in range(4)) == [0, 1, 2, 3]
    stats = call(conn, "queue.statistics", tube)[0]
    assert stats["calls"]["bury"] == 3 and stats["calls"]["kick"] == 3
    assert stats["tasks"] == {"taken": 4, "ready": 0, "buried": 0, "delayed": 0, "done": 0, "total": 4}


def test_statistics_count_calls_and_tasks_as_the_module_does(conn):
    tube = new_tube(conn, "fifottl")
    q = f"queue.tube.{tube}:"
    zero = {"ack": 0, "bury": 0, "delete": 0, "kick": 0, "put": 0, "release": 0, "take": 0, "touch": 0,
            "ttl": 0, "ttr": 0, "delay": 0}
    empty = {"taken": 0, "ready": 0, "buried": 0, "delayed": 0, "done": 0, "total": 0}
    assert call(conn, "queue.statistics", tube) == [{"tasks": empty, "calls": zero}]
    for data in "abcde":
        call(conn, q + "put", data)
    call(conn, q + "put", "later", {"delay": 60})
    call(conn, q + "take")
    call(conn, q + "ack", 0)
    call(conn, q + "take")
    call(conn, q + "touch", 1, 30)
    call(conn, q + "release", 1)
    call(conn, q + "delete", 2)
    call(conn, q + "bury", 3)
    call(conn, q + "take")
    assert call(conn, "queue.statistics", tube) == [{
        "tasks": {"taken": 1, "ready": 1, "buried": 1, "delayed": 1, "done": 2, "total": 4},
        # a touch counts twice: the module's tube and its driver count it each
        "calls": {**zero, "put": 6, "take": 3, "ack": 1, "touch": 2, "release": 1, "delete": 1, "bury": 1},
    }]
    everything = call(conn, "queue.stats")[0]
    assert everything[tube] == call(conn, "queue.statistics", tube)[0]
    call(conn, q + "release", 1)
    call(conn, q + "drop")


def test_ttl_ends_a_task_and_delay_holds_it_back(conn):
    tube = new_tube(conn, "fifottl")
    q = f"queue.tube.{tube}:"
    assert call(conn, q + "put", "late", {"delay": 0.5}) == [[0, "~", "late"]]
    assert call(conn, q + "take", 0) == []
    assert call(conn, q + "put", "short", {"ttl": 0.3}) == [[1, "r", "short"]]
    wait_for(lambda: call(conn, q + "peek", 1) == ("error", 32, "Task 1 not found"), "the ttl to end")
    assert call(conn, q + "take", 5) == [[0, "t", "late"]]
    calls = call(conn, "queue.statistics", tube)[0]["calls"]
    assert (calls["ttl"], calls["delete"], calls["delay"]) == (1, 1, 1)
    assert call(conn, "queue.statistics", tube)[0]["tasks"]["done"] == 1
    call(conn, q + "ack", 0)
    call(conn, q + "drop")


def test_ttr_returns_a_taken_task_and_touch_extends_it(conn):
    tube = new_tube(conn, "fifottl", {"ttr": 0.4})
    q = f"queue.tube.{tube}:"
    call(conn, q + "put", "a")
    call(conn, q + "put", "b")
    assert call(conn, q + "take", 0) == [[0, "t", "a"]]
    assert call(conn, q + "take", 0) == [[1, "t", "b"]]
    assert call(conn, q + "touch", 1, 30) == [[1, "t", "b"]]
    wait_for(lambda: call(conn, q + "peek", 0) == [[0, "r", "a"]], "the ttr to end")
    time.sleep(0.5)
    assert call(conn, q + "peek", 1) == [[1, "t", "b"]]  # touched: 30 s more
    assert call(conn, "queue.statistics", tube)[0]["calls"]["ttr"] == 1
    assert call(conn, q + "ack", 1) == [[1, "-", "b"]]
    call(conn, q + "drop")


def test_release_with_a_delay(conn):
    tube = new_tube(conn, "fifottl")
    q = f"queue.tube.{tube}:"
    call(conn, q + "put", "a")
    call(conn, q + "take")
    assert call(conn, q + "release", 0, {"delay": 0.5}) == [[0, "~", "a"]]
    assert call(conn, q + "take", 0) == []
    assert call(conn, q + "take", 5) == [[0, "t", "a"]]
    call(conn, q + "ack", 0)
    # fifo has no delays: a release with one makes the task ready at once
    fifo = new_tube(conn, "fifo")
    call(conn, f"queue.tube.{fifo}:put", "b")
    call(conn, f"queue.tube.{fifo}:take")
    assert call(conn, f"queue.tube.{fifo}:release", 0, {"delay": 5}) == [[0, "r", "b"]]
    call(conn, q + "drop")
    call(conn, f"queue.tube.{fifo}:drop")


def test_a_waiting_take_gets_a_task_put_meanwhile_and_a_disconnect_releases_takes(connect):
    conn, consumer = connect(), connect()
    tube = new_tube(conn, "fifo")
    q = f"queue.tube.{tube}:"
    waiting, got = call_in_background(consumer, q + "take", 10)
    call(conn, q + "put", "wanted")
    waiting.join(10)
    assert got == [[[0, "t", "wanted"]]]
    consumer.close()
    wait_for(lambda: call(conn, q + "peek", 0) == [[0, "r", "wanted"]], "the disconnect to release the task")
    assert call(conn, "queue.statistics", tube)[0]["calls"]["release"] == 1  # counted as tarantool/queue 1.5.0 does
    assert call(conn, q + "take", 0) == [[0, "t", "wanted"]]
    other = connect()
    assert call(other, q + "release_all") == []
    assert call(conn, q + "peek", 0) == [[0, "r", "wanted"]]
    call(conn, q + "drop")


def test_queue_functions(conn):
    assert call(conn, "queue.state") == ["RUNNING"]
    assert call(conn, "queue.cfg", {"no_such_option": 1}) == ("error", 32, "Unknown option no_such_option")
    assert call(conn, "queue.cfg", {"in_replicaset": 1}) == ("error", 32, "Invalid value of in_replicaset: 1")
    assert call(conn, "queue.cfg", {"ttr": 0}) == []
    tube = new_tube(conn, "fifo")
    assert tube in call(conn, "queue.statistics")[0]
    call(conn, f"queue.tube.{tube}:drop")
    assert tube not in call(conn, "queue.statistics")[0]


@pytest.mark.skipif(TARGET != "ours", reason="boxqueue's own: one engine behind every API, restarts")
def test_a_module_tube_survives_a_restart_and_box_queue_statistics_keep_their_name(tmp_path):
    proc = ServerProcess(tmp_path / "srv", extra_config=GUEST)
    proc.start()
    try:
        conn = tarantool.connect("127.0.0.1", proc.port)
        tube = new_tube(conn, "fifottl", {"ttr": 100, "pri": 2})
        q = f"queue.tube.{tube}:"
        call(conn, q + "put", "a")
        call(conn, q + "put", "b", {"pri": 1})
        call(conn, q + "take")
        conn.close()
        proc.kill()
        proc.start()
        conn = tarantool.connect("127.0.0.1", proc.port)
        # The tube, its defaults and its tasks are back; a take left by the killed session is ready.
        assert call(conn, q + "peek", 1) == [[1, "r", "b"]]
        assert call(conn, q + "put", "c") == [[2, "r", "c"]]
        assert [call(conn, q + "take", 0)[0][2] for _ in range(3)] == ["b", "a", "c"]
        # box.queue's alias keeps its meaning with a space number first
        assert call(conn, "queue.statistics", 0) == [[]]
        assert call(conn, "queue.statistics", tube)[0]["tasks"]["taken"] == 3
        conn.close()
    finally:
        proc.kill()


@pytest.mark.parametrize("kind", ["utube", "utubettl"])
def test_a_sub_queue_gives_one_task_at_a_time(connect, kind):
    conn, waiter = connect(), connect()
    tube = new_tube(conn, kind)
    q = f"queue.tube.{tube}:"
    assert call(conn, q + "put", "a1", {"utube": "A"}) == [[0, "r", "a1"]]
    call(conn, q + "put", "a2", {"utube": "A"})
    call(conn, q + "put", "b1", {"utube": "B"})
    call(conn, q + "put", "n1")  # no utube: the sub-queue "nil" (tostring(nil))
    call(conn, q + "put", "n2")
    call(conn, q + "put", "x1", {"utube": None})  # msgpack's nil is box.NULL: the sub-queue "NULL"
    assert call(conn, q + "take", 0) == [[0, "t", "a1"]]
    assert call(conn, q + "take", 0) == [[2, "t", "b1"]]
    assert call(conn, q + "take", 0) == [[3, "t", "n1"]]
    assert call(conn, q + "take", 0) == [[5, "t", "x1"]]
    assert call(conn, q + "take", 0) == []  # a2 and n2 wait for their sub-queues
    assert call(conn, q + "ack", 3) == [[3, "-", "n1"]]
    assert call(conn, q + "ack", 5) == [[5, "-", "x1"]]
    assert call(conn, q + "take", 0) == [[4, "t", "n2"]]
    assert call(conn, q + "touch", 4, 10) == (
        ("error", 32, "utube queue does not support touch") if kind == "utube" else [[4, "t", "n2"]])
    taking, got = call_in_background(waiter, q + "take", 10)
    assert got == []
    assert call(conn, q + "ack", 0) == [[0, "-", "a1"]]  # A is free: the waiting take gets a2
    taking.join(10)
    assert got == [[[1, "t", "a2"]]]
    assert call(conn, q + "put") == ("error", 39, "Tuple field 4 required by space format is missing" if kind == "utube"
                                     else "Tuple field 9 required by space format is missing")
    waiter.close()
    wait_for(lambda: call(conn, q + "peek", 1) == [[1, "r", "a2"]], "the waiter's disconnect to release a2")
    assert call(conn, q + "bury", 2) == [[2, "!", "b1"]]  # B is free again
    call(conn, q + "put", "b2", {"utube": "B"})
    assert call(conn, q + "take", 0) == [[1, "t", "a2"]]
    assert call(conn, q + "take", 0) == [[5, "t", "b2"]]
    stats = call(conn, "queue.statistics", tube)[0]
    assert stats["tasks"] == {"taken": 3, "ready": 0, "buried": 1, "delayed": 0, "done": 3, "total": 4}


def test_utubettl_orders_by_priority_within_the_free_sub_queues(conn):
    tube = new_tube(conn, "utubettl")
    q = f"queue.tube.{tube}:"
    call(conn, q + "put", "a-low", {"utube": "A", "pri": 9})
    call(conn, q + "put", "b-high", {"utube": "B", "pri": 1})
    call(conn, q + "put", "a-high", {"utube": "A", "pri": 0})
    assert call(conn, q + "take", 0) == [[2, "t", "a-high"]]
    assert call(conn, q + "take", 0) == [[1, "t", "b-high"]]
    assert call(conn, q + "take", 0) == []
    assert call(conn, q + "release", 2, {"delay": 0.3}) == [[2, "~", "a-high"]]
    assert call(conn, q + "take", 0) == [[0, "t", "a-low"]]  # A's other task, while a-high waits
    assert call(conn, q + "ack", 0) == [[0, "-", "a-low"]]
    assert call(conn, q + "take", 5) == [[2, "t", "a-high"]]


def test_limfifottl_holds_at_most_its_capacity(connect):
    conn, other = connect(), connect()
    tube = new_tube(conn, "limfifottl", {"capacity": 2})
    q = f"queue.tube.{tube}:"
    assert call(conn, q + "put", "a") == [[0, "r", "a"]]
    assert call(conn, q + "take") == [[0, "t", "a"]]
    assert call(conn, q + "put", "b") == [[1, "r", "b"]]
    assert call(conn, q + "put", "c") == [None]  # full: no timeout, no task
    assert call(conn, q + "put", "c", {"timeout": 0.2}) == [None]
    waiting, got = call_in_background(other, q + "put", "d", {"timeout": 10})
    assert got == []
    assert call(conn, q + "ack", 0) == [[0, "-", "a"]]
    waiting.join(10)
    assert got == [[[2, "r", "d"]]]
    assert call(conn, q + "touch", 1, 10) == ("error", 32, "Task was not taken")
    assert call(conn, "queue.statistics", tube)[0]["tasks"]["total"] == 2


def test_identify_keeps_a_session_s_takes_across_a_reconnect(server, connect):
    raw = tarantool.connect("127.0.0.1", server.port, encoding=None)  # the UUID comes as a string of 16 bytes
    try:
        conn = connect()
        tube = new_tube(conn, "fifo")
        q = f"queue.tube.{tube}:"
        for data in ("a", "b", "c"):
            call(conn, q + "put", data)
        assert call(conn, "queue.cfg", {"ttr": 60}) == []
        first = raw.call("queue.identify").data[0]
        assert isinstance(first, bytes) and len(first) == 16
        assert raw.call("queue.identify").data == [first]
        assert raw.call(q + "take", [0]).data == [[0, b"t", b"a"]]
        raw.close()
        # Gone, with ttr 60: the task stays taken, and a connection that identifies with the UUID owns it.
        time.sleep(0.5)
        assert call(conn, q + "peek", 0) == [[0, "t", "a"]]
        raw = tarantool.connect("127.0.0.1", server.port, encoding=None)
        assert raw.call("queue.identify", [first]).data == [first]
        assert raw.call(q + "ack", [0]).data == [[0, b"-", b"a"]]
        # a session's other connections act on its takes too
        assert raw.call(q + "take", [0]).data == [[1, b"t", b"b"]]
        second = connect()
        assert call(second, q + "ack", 1) == ("error", 32, "Task was not taken")
        raw2 = tarantool.connect("127.0.0.1", server.port, encoding=None)
        assert raw2.call("queue.identify", [first]).data == [first]
        assert raw2.call(q + "ack", [1]).data == [[1, b"-", b"b"]]
        raw2.close()
        # a connection that never identified keeps its takes for ttr as well
        third = connect()
        assert call(third, q + "take", 0) == [[2, "t", "c"]]
        third.close()
        time.sleep(0.5)
        assert call(conn, q + "peek", 2) == [[2, "t", "c"]]
        # errors
        assert call(conn, "queue.identify", "short") == ("error", 32, "Invalid UUID format.")
        unknown = bytes(range(16))
        try:
            raw.call("queue.identify", [unknown])
            raise AssertionError("an unknown UUID was accepted")
        except tarantool.error.DatabaseError as exc:
            assert exc.args[0] == 32
            # (Tarantool reads the first three fields of a binary UUID little-endian)
            assert re.sub(r"^\S*\.lua:\d+: ", "", exc.args[1].decode()) == \
                "The UUID 03020100-0504-0706-0809-0a0b0c0d0e0f is unknown."
        # a short ttr: the takes go back to ready once it has passed
        assert call(conn, "queue.cfg", {"ttr": 0.5}) == []
        fourth = connect()
        call(conn, q + "put", "d")
        assert call(fourth, q + "take", 0) == [[3, "t", "d"]]
        fourth.close()
        wait_for(lambda: call(conn, q + "peek", 3) == [[3, "r", "d"]], "the session's ttr to pass", timeout=10)
    finally:
        raw.close()
        call(connect(), "queue.cfg", {"ttr": 0})


def test_the_module_from_lua(conn):
    name = f"t{os.getpid()}_{next(_names)}_lua"
    code = """
        local q = require('queue')
        local t = q.create_tube(..., 'fifottl', {ttr = 30})
        local same = queue.create_tube(..., 'fifottl', {if_not_exists = true})
        local put = t:put({1, 2}, {pri = 2})
        local taken = queue.tube[...]:take(0)
        local acked = t:ack(taken[1])
        local peeked = pcall(t.peek, t, taken[1])
        return put, taken, acked, peeked, same.name, q.tube(...), q.tube('no such tube'),
               q.statistics(...).calls.put, q.state()
    """
    assert conn.eval(code, [name]).data == [
        [0, "r", [1, 2]], [0, "t", [1, 2]], [0, "-", [1, 2]], False, name, True, False, 1, "RUNNING",
    ]
    assert conn.eval("return queue.tube[...]:drop()", [name]).data == [True]
    assert conn.eval("return queue.tube[...]", [name]).data == [None]


@pytest.mark.skipif(TARGET != "ours", reason="boxqueue's own: one engine behind every API")
def test_a_module_tube_is_a_tube_of_the_one_engine(conn):
    tube = new_tube(conn, "fifo")
    q = f"queue.tube.{tube}:"
    space_id = conn.eval("return box.space[...].id", [tube]).data[0]
    assert call(conn, q + "put", "from the module") == [[0, "r", "from the module"]]
    taken = call(conn, "box.queue.take", space_id, tube, 0)[0]
    assert (taken[0], taken[1], taken[2], taken[3:]) == ("0", tube, "taken", ["from the module"])
    assert call(conn, "box.queue.ack", space_id, "0")[0][0] == "0"
    put = call(conn, "box.queue.put", space_id, tube, 0, 0, 0, 0, "from", "box.queue")[0]
    assert put[0] == "0"  # the module's tubes number their tasks whichever API puts them
    assert call(conn, q + "take", 0) == [[0, "t", "from"]]  # (the module's task holds one data field)
    assert call(conn, q + "ack", 0) == [[0, "-", "from"]]
    stats = call(conn, "queue.statistics", tube)[0]
    assert (stats["calls"]["put"], stats["calls"]["ack"], stats["tasks"]["total"]) == (2, 2, 0)
    call(conn, q + "drop")


def test_a_tube_with_a_waiting_consumer_is_not_dropped(connect):
    conn, consumer = connect(), connect()
    tube = new_tube(conn, "fifottl")
    q = f"queue.tube.{tube}:"
    waiting, got = call_in_background(consumer, q + "take", 1)
    assert call(conn, q + "drop") == ("error", 32, "There are consumers connected the tube")
    waiting.join(10)
    assert got == [[]]
    assert call(conn, q + "drop") == [True]


def test_grant_lets_a_user_use_the_tube(server, connect):
    # (the module grants on its own spaces too, which only admin may do: tube:grant runs as admin)
    conn = tarantool.connect("127.0.0.1", server.port, user="admin", password="adminpw")
    conn.eval("box.schema.user.create('qworker', {password = 'pw', if_not_exists = true})")
    tube = new_tube(conn, "fifo")
    q = f"queue.tube.{tube}:"
    call(conn, q + "put", "a")
    worker = tarantool.connect("127.0.0.1", server.port, user="qworker", password="pw")
    try:
        denied = call(worker, q + "take", 0)
        assert denied[:2] == ("error", 42), denied
        assert call(conn, q + "grant", "qworker", {"call": True}) == []
        assert call(worker, q + "take", 0) == [[0, "t", "a"]]
        assert call(worker, q + "ack", 0) == [[0, "-", "a"]]
        assert call(worker, "queue.statistics", tube)[0]["calls"]["ack"] == 1
        assert call(worker, q + "truncate")[:2] == ("error", 42)
        assert call(conn, q + "grant", "qworker", {"truncate": True}) == []
        assert call(worker, q + "truncate") == []
    finally:
        worker.close()
    call(conn, q + "drop")
    conn.close()


def test_on_task_change_calls_a_lua_function(conn):
    name = f"t{os.getpid()}_{next(_names)}_otc"
    conn.eval("""
        local name = ...
        otc_seen = {}
        queue.create_tube(name, 'fifo', {on_task_change = function(task, what)
            table.insert(otc_seen, {task[1], task[2], what})
        end})
    """, [name])
    q = f"queue.tube.{name}:"
    call(conn, q + "put", "a")
    call(conn, q + "take", 0)
    call(conn, q + "release", 0)
    call(conn, q + "take", 0)
    call(conn, q + "ack", 0)
    expected = [[0, "r", "put"], [0, "t", "take"], [0, "r", "release"], [0, "t", "take"], [0, "-", "delete"]]
    # (the module calls it within the change; boxqueue once the change is durable)
    wait_for(lambda: conn.eval("return otc_seen").data[0] == expected, "the callbacks")
    previous = conn.eval("return queue.tube[...]:on_task_change(nil) ~= nil", [name]).data
    assert previous == [True]
    call(conn, q + "put", "b")
    time.sleep(0.3)
    assert len(conn.eval("return otc_seen").data[0]) == 5
    # a dropped tube's callback goes with it: the tube made again under its name has none
    conn.eval("queue.tube[...]:on_task_change(function() table.insert(otc_seen, 'old') end)", [name])
    assert call(conn, q + "delete", 0) == [[0, "-", "b"]]
    call(conn, q + "put", "truncated")
    call(conn, q + "truncate")
    call(conn, q + "put", "left")  # (the deletes of a truncate or a drop are not changes it hears of)
    time.sleep(0.3)
    call(conn, q + "drop")
    conn.eval("queue.create_tube(..., 'fifo')", [name])
    call(conn, q + "put", "c")
    time.sleep(0.3)
    assert conn.eval("return #otc_seen").data == [8]  # the delete's and the two puts' calls only
    call(conn, q + "drop")
