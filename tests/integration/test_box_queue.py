"""The Tarantool 1.5 box.queue API over iproto, against the real server in a subprocess.

Behaviour: Tarantool 1.5's box.queue, and the decisions D1-D15 (see docs/references.md).
Most tests share one module-scoped server and use a tube of their own; the restart tests start
servers of their own.
"""

from __future__ import annotations

import itertools
import re
import statistics as stats_lib
import threading
import time
import tomllib
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import tarantool

from tests.integration.conftest import TARGET
from tests.integration.queue_fixtures import (
    ER_NO_SUCH_PROC,
    ER_NO_SUCH_SPACE,
    ER_PROC_LUA,
    QUEUE_CONFIG,
    QUEUE_SPACE_0,
    Q,
    RawIproto,
    as_map,
    poll,
)
from tests.serverproc import ROOT, ServerProcess

pytestmark = pytest.mark.skipif(TARGET != "ours", reason="box.queue is boxqueue's own API")

US = 1_000_000
DEFAULT_TTL_US = 2_160_000 * US
DEFAULT_TTR_US = 60 * US
# Slack on the upper bound of a timed wake: the wake is a write, and a write waits for its fsync,
# which has taken over 0.25 s on a busy CI disk. Still well under the takes' 3-5 s timeouts, so a
# wake that never comes still fails.
FSYNC_SLACK = 0.5
TASK_STATES = ("total", "ready", "delayed", "taken", "buried", "done")


def stored_pri(pri: float) -> int:
    """D2 / spec 2.1."""
    return int(255 - min(max(pri + 127, 0), 255))


def scalar(value: Any, call_16: bool) -> list[Any]:
    """A plain returned value: [v] over CALL, [[v]] over CALL_16 (spec section 9)."""
    return [[value]] if call_16 else [value]


class Background(threading.Thread):
    """Run ``fn`` in a thread; remember its result (or exception) and when it returned."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.args = fn, args
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished_at: float | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:
            self.error = exc
        finally:
            self.finished_at = time.perf_counter()

    def get(self, timeout: float = 15.0) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "background call did not return"
        if self.error is not None:
            raise self.error
        return self.result


def background_take(port: int, tube: str, timeout: float, space: int = 0) -> tuple[Background, Q]:
    """A blocking take on a connection of its own (created here, used only by the thread)."""
    consumer = Q(port)
    return Background(consumer, "take", space, tube, timeout), consumer


# -- fixtures --------------------------------------------------------------------------------------

_tube_numbers = itertools.count()


@pytest.fixture(scope="module")
def qserver(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("box_queue"), extra_config=QUEUE_CONFIG)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def tube(request) -> str:
    return f"{request.node.name}-{next(_tube_numbers)}"


@pytest.fixture
def q(qserver):
    conn = Q(qserver.port)
    yield conn
    conn.close()


@pytest.fixture
def q2(qserver):
    conn = Q(qserver.port)
    yield conn
    conn.close()


# -- configuration, shapes, names ------------------------------------------------------------------


def test_the_tested_queue_space_is_the_shipped_one():
    shipped = tomllib.loads((ROOT / "conf" / "boxqueue.toml").read_text())
    (space0,) = [s for s in shipped["space"] if s["id"] == 0]
    assert space0 == tomllib.loads(QUEUE_SPACE_0)["space"][0]


def test_task_ids_are_version_7_uuids_in_creation_order(q, tube):
    """Ids keep 1.5's shape (32 lowercase hex digits) and are ordered by creation time (RFC 9562's
    version 7): the tasks a batch touches sit together in the primary B-tree."""
    ids = []
    for i in range(5):
        ids.append(q.task("put", 0, tube, 0, 0, 0, 0, f"task-{i}")[0])
        time.sleep(0.002)  # another millisecond: the order is the time's, not chance's
    assert all(re.fullmatch("[0-9a-f]{32}", task_id) for task_id in ids)
    assert all(uuid.UUID(task_id).version == 7 and uuid.UUID(task_id).variant == uuid.RFC_4122 for task_id in ids)
    assert ids == sorted(ids) and len(set(ids)) == 5
    now_ms = time.time() * 1000
    assert all(now_ms - 5000 < int(task_id[:12], 16) <= now_ms + 1 for task_id in ids)


def test_put_returns_the_task_and_select_shows_the_spec_layout(q, tube):
    before = time.time()
    task = q.task("put", 0, tube, 0, 0, 0, 0, "payload", 42, [1, "two"], {"k": 3.5})
    after = time.time()
    task_id = task[0]
    assert re.fullmatch("[0-9a-f]{32}", task_id)
    assert task[1:] == [tube, "ready", "payload", 42, [1, "two"], {"k": 3.5}]

    (row,) = q.conn.select(0, [task_id]).data
    assert len(row) == 12 + 4
    assert row[:3] == [task_id, tube, "r"]
    event, ipri, pri, cid, created, ttl, ttr, cbury, ctaken = row[3:12]
    assert (before - 0.05) * US <= created <= (after + 0.05) * US
    assert (ttl, ttr) == (DEFAULT_TTL_US, DEFAULT_TTR_US)
    assert event == created + ttl
    assert (ipri, pri, cid, cbury, ctaken) == (127, 128, 0, 0, 0)
    assert row[12:] == ["payload", 42, [1, "two"], {"k": 3.5}]

    # The secondary indexes of section 1.2 find it too.
    assert q.conn.select(0, [tube, "r"], index="tube_status").data == [row]
    assert q.conn.select(0, [tube], index="tube_event").data == [row]
    assert q.conn.select(0, [tube, "r", "payload"], index="put_unique").data == [row]

    sid = q.sid()
    assert q.task("take", 0, tube, 0)[:3] == [task_id, tube, "taken"]
    (row,) = q.conn.select(0, [task_id]).data
    now = time.time() * US
    assert row[2] == "t" and row[6] == sid and row[11] == 1
    assert now + DEFAULT_TTR_US - 2 * US <= row[3] <= now + DEFAULT_TTR_US + 0.1 * US
    assert q.conn.select(0, [tube, "r"], index="tube_status").data == []
    assert q.conn.select(0, [tube, "t"], index="tube_status").data == [row]


def test_every_index_follows_a_task_through_its_changes(q, tube):
    """A change of a task rewrites its stored header in place (the data as stored) and moves only
    the index entries whose parts changed: each index holds the task once, under its key now."""
    other = q.task("put", 0, tube, 0, 0, 0, 0, "other")[0]  # a neighbour whose entries stay put
    task_id = q.task("put", 0, tube, 0, 0, 0, 0, "payload", {"k": [1, 2.5]})[0]
    indexes = {"tube_status": (1, 2, 4, 5), "tube_event": (1, 3), "put_unique": (1, 2, 12)}

    def check() -> list:
        (row,) = q.conn.select(0, [task_id]).data
        assert row[12:] == ["payload", {"k": [1, 2.5]}]
        for name, parts in indexes.items():
            found = q.conn.select(0, [row[p] for p in parts], index=name).data
            assert [r for r in found if r[0] == task_id] == [row], name
            everything = [r[0] for r in q.conn.select(0, [tube], index=name).data]
            assert sorted(everything) == sorted(ids), name
        return row

    ids = [task_id, other]
    q.task("take", 0, tube, 0)  # the neighbour, put first
    rows = [check()]
    for fn, args in (("take", (tube, 0)), ("touch", (task_id,)), ("bury", (task_id,)), ("dig", (task_id,)),
                     ("take", (tube, 0)), ("requeue", (task_id,)), ("delete", (other,)),
                     ("take", (tube, 0)), ("release", (task_id, 60))):
        q(fn, 0, *args)
        if fn == "delete":
            ids.remove(other)
        rows.append(check())
    statuses = [row[2] for row in rows]
    assert statuses == ["r", "t", "t", "b", "r", "t", "r", "r", "t", "d"]
    # Gone from the entries it had before: nothing under an earlier key but what is there now.
    for before, after in itertools.pairwise(rows):
        for name, parts in indexes.items():
            if [before[p] for p in parts] != [after[p] for p in parts]:
                found = q.conn.select(0, [before[p] for p in parts], index=name).data
                assert task_id not in [r[0] for r in found], (name, before[2], after[2])


@pytest.mark.parametrize("call_16", [False, True], ids=["call", "call16"])
@pytest.mark.parametrize("prefix", ["box.queue.", "queue."])
def test_every_function_under_both_names_and_both_calls(qserver, tube, prefix, call_16):
    c = Q(qserver.port, prefix=prefix, call_16=call_16)
    try:
        ((tid, *rest),) = c("put", 0, tube, 0, 0, 0, 0, "d")
        assert rest == [tube, "ready", "d"]
        assert c("peek", 0, tid) == [[tid, tube, "ready", "d"]]
        assert c("take", 0, tube, 0) == [[tid, tube, "taken", "d"]]
        assert c("take", 0, tube, 0) == []  # D15: nothing, not an empty tuple
        assert c("touch", 0, tid) == [[tid, tube, "taken", "d"]]
        assert c("bury", 0, tid) == [[tid, tube, "buried", "d"]]
        assert c("dig", 0, tid) == [[tid, tube, "ready", "d"]]
        c("take", 0, tube, 0)
        c("bury", 0, tid)
        assert c("unbury", 0, tid) == [[tid, tube, "ready", "d"]]
        c("take", 0, tube, 0)
        c("bury", 0, tid)
        assert c("kick", 0, tube, 5) == scalar(1, call_16)
        c("take", 0, tube, 0)
        assert c("release", 0, tid) == [[tid, tube, "ready", "d"]]
        c("take", 0, tube, 0)
        assert c("requeue", 0, tid) == [[tid, tube, "ready", "d"]]
        c("take", 0, tube, 0)
        assert c("done", 0, tid, "x", 2) == [[tid, tube, "done", "x", 2]]
        ((meta),) = c("meta", 0, tid)
        assert len(meta) == 13 and meta[:3] == [tid, tube, "done"]
        assert c("delete", 0, tid) == [[tid, tube, "done", "x", 2]]

        ((uid, *rest),) = c("urgent", 0, tube, 0, 0, 0, 0, "u")
        assert rest == [tube, "ready", "u"]
        assert c("take", 0, tube, 0) == [[uid, tube, "taken", "u"]]
        assert c("ack", 0, uid) == [[uid, tube, "taken", "u"]]
        ((pid, *rest),) = c("put_unique", 0, tube, 0, 0, 0, 0, "p")
        assert rest == [tube, "ready", "p"]
        assert c("put_unique", 0, tube, 0, 0, 0, 0, "p") == [[pid, tube, "ready", "p"]]
        assert c("truncate", 0, tube) == scalar(1, call_16)
        assert c("truncate", 0, tube) == scalar(0, call_16)

        assert c("restart_check", 0, tube) == scalar("already started", call_16)
        assert c("restart_check", 0, tube + "-fresh") == scalar("starting", call_16)
        assert c("restart_check", 0, tube + "-fresh") == scalar("already started", call_16)
        assert c("statistics", 0, tube + "-never-used") == [[]]
        (flat,) = c("statistics", 0, tube)
        assert as_map(flat)[f"space0.{tube}.put"] == 2
        with pytest.raises(Exception) as info:
            c("no_such_function", 0)
        assert info.value.code == ER_NO_SUCH_PROC
    finally:
        c.close()


# -- arguments -------------------------------------------------------------------------------------


def test_numeric_strings_are_coerced_like_lua_tonumber(q, tube):
    # space "0", delay "0.5", ttl "1e3", ttr "5", pri "10"
    task = q.task("put", "0", tube, "0.5", "1e3", "5", "10", "x")
    assert task[1:] == [tube, "delayed", "x"]
    m = q.meta(0, task[0])
    assert m["ttl"] == 1000  # 1000 s plus the 0.5 s delay, in whole seconds
    assert m["ttr"] == 5
    assert m["pri"] == 118 == stored_pri(10)
    assert m["ipri"] == 127
    assert 500_000 - 2000 <= m["event"] - m["created"] <= 500_000 + 2000
    (row,) = q.conn.select(0, [task[0]]).data
    assert row[8] == 1_000_500_000 and row[9] == 5_000_000

    # whitespace, a negative delay (= none), hex, a leading-dot float, a negative pri
    task = q.task("put", " 0 ", tube, " -1 ", "0x10", ".5", "-1", "y")
    assert task[1:] == [tube, "ready", "y"]
    m = q.meta("0", task[0])
    assert (m["ttl"], m["ttr"], m["pri"]) == (16, 0, 129)  # a 0.5 s ttr reads 0 (D14)
    (row,) = q.conn.select(0, [task[0]]).data
    assert row[8] == 16 * US and row[9] == 500_000
    # msgpack floats are numbers too
    m = q.meta(0, q.task("put", 0.0, tube + "-f", 0, 2.5, 1.5, 2.7, "z")[0])
    assert (m["ttl"], m["ttr"], m["pri"]) == (2, 1, 125)

    # "0" and 0 are one space: statistics are keyed by the number
    assert q.stats("0", tube) == q.stats(0, tube)
    assert q.stats(0, tube)[f"space0.{tube}.put"] == 2
    # take's timeout, kick's count and release's delay/ttl are coerced as well
    assert q.task("take", "0", tube, "0")[0] == task[0]
    started = time.monotonic()
    assert q("take", 0, tube, "0.2") == []
    assert 0.18 <= time.monotonic() - started < 1.0
    assert q.task("release", 0, task[0], "0", "100")[2] == "ready"
    assert q.meta(0, task[0])["ttl"] == 100
    q("take", 0, tube, 0)
    q("bury", 0, task[0])
    assert q("kick", "0", tube, "1") == [1]


def test_zero_and_negative_numbers_mean_the_defaults(q, tube):
    for args in ((0, 0, 0, 0), (-5, -5, -5, 0), ("0", "-1", "0", "0")):
        task = q.task("put", 0, tube, *args)  # no data at all: allowed, even with index 3 (D4)
        assert task[1:] == [tube, "ready"]
        m = q.meta(0, task[0])
        assert (m["ttl"], m["ttr"], m["pri"], m["ipri"]) == (2_160_000, 60, 128, 127)
        (row,) = q.conn.select(0, [task[0]]).data
        assert len(row) == 12 and row[8] == DEFAULT_TTL_US and row[9] == DEFAULT_TTR_US


def test_non_numeric_and_missing_numbers_are_clear_proc_lua_errors(q, tube):
    q.task("put", 0, tube, 0, 0, 0, 0, "seed")
    taken = q.task("take", 0, tube, 0)[0]
    rows = q.conn.select(0, [tube], index="tube_event").data
    bad_values = ["abc", "", "5s", "1e", None, True, [1], {"a": 1}]
    good = {"delay": 0, "ttl": 0, "ttr": 0, "pri": 0}
    for fn in ("put", "urgent", "put_unique"):
        for name in ("delay", "ttl", "ttr", "pri"):
            for bad in bad_values:
                args = dict(good, **{name: bad})
                code, message = q.error(fn, 0, tube, args["delay"], args["ttl"], args["ttr"], args["pri"], "d")
                assert code == ER_PROC_LUA, (fn, name, bad, message)
                assert f"'{name}'" in message, (fn, name, bad, message)
    # missing arguments: the first one checked is named (ttl, delay, ttr, pri: Q30)
    code, message = q.error("put", 0, tube)
    assert code == ER_PROC_LUA and "'ttl'" in message
    code, message = q.error("put", 0, tube, 0, 0, 0)
    assert code == ER_PROC_LUA and "'pri'" in message
    for bad in ("abc", "", "5s", "1e", True, [1]):  # None: the default for these
        code, message = q.error("take", 0, tube, bad)
        assert code == ER_PROC_LUA and "'timeout'" in message, (bad, message)
        code, message = q.error("kick", 0, tube, bad)
        assert code == ER_PROC_LUA and "'count'" in message, (bad, message)
        code, message = q.error("release", 0, taken, bad)
        assert code == ER_PROC_LUA and "'delay'" in message, (bad, message)
        code, message = q.error("release", 0, taken, 0, bad)
        assert code == ER_PROC_LUA and "'ttl'" in message, (bad, message)
    for timeout in (-1, "-0.5", -0.001):
        assert q.error("take", 0, tube, timeout) == (ER_PROC_LUA, "Timeout can't be less then 0")
    # nothing changed
    assert q.conn.select(0, [tube], index="tube_event").data == rows


def test_missing_or_non_numeric_space_is_a_clear_proc_lua_error(q, tube):
    for space in (None, "abc", "", True):
        for fn, args in (("put", (tube, 0, 0, 0, 0, "d")), ("take", (tube, 0)), ("meta", ("x",)),
                         ("kick", (tube, 1)), ("truncate", (tube,))):
            code, message = q.error(fn, space, *args)
            assert code == ER_PROC_LUA and "'space'" in message, (fn, space, code, message)
    code, message = q.error("put")
    assert code == ER_PROC_LUA and "'space'" in message


def test_unknown_space_and_non_queue_space_are_er_no_such_space(q, tube):
    tid = q.task("put", 0, tube, 0, 0, 0, 0, "d")[0]
    calls = [
        ("put", (tube, 0, 0, 0, 0, "d")), ("urgent", (tube, 0, 0, 0, 0, "d")),
        ("put_unique", (tube, 0, 0, 0, 0, "d")), ("take", (tube, 0)), ("ack", (tid,)),
        ("touch", (tid,)), ("done", (tid,)), ("bury", (tid,)), ("dig", (tid,)), ("unbury", (tid,)),
        ("kick", (tube, 1)), ("release", (tid,)), ("requeue", (tid,)), ("delete", (tid,)),
        ("truncate", (tube,)), ("meta", (tid,)), ("peek", (tid,)), ("restart_check", (tube,)),
    ]
    for space in (7, "7", 2, 0.5):
        for fn, args in calls:
            code, message = q.error(fn, space, *args)
            assert code == ER_NO_SUCH_SPACE, (fn, space, code, message)
    assert q.error("peek", 7, tid) == (ER_NO_SUCH_SPACE, "Space '7' does not exist")
    # statistics answers an empty result instead (D12, D15)
    for args in ((7,), (7, tube), (2,), (2, tube), ("abc",)):
        assert q("statistics", *args) == [[]]
    # the task is still there, unchanged, and space 1 (another queue space) does not know it
    assert q.task("peek", 0, tid)[2] == "ready"
    assert q.error("peek", 1, tid) == (ER_PROC_LUA, "Task not found")
    assert q.error("ack", 1, tid) == (ER_PROC_LUA, "Task not found")


def test_the_tube_must_be_a_string(q):
    for bad in (5, None, ["t"], b"\xff\xfe", True):
        for fn, args in (("put", (0, 0, 0, 0, "d")), ("urgent", (0, 0, 0, 0, "d")),
                         ("put_unique", (0, 0, 0, 0, "d")), ("take", (0,)), ("kick", (1,)),
                         ("truncate", ())):
            code, message = q.error(fn, 0, bad, *args)
            assert code == ER_PROC_LUA and "'tube'" in message, (fn, bad, code, message)


def test_unknown_ids_are_task_not_found(q, tube):
    q.task("put", 0, tube, 0, 0, 0, 0, "d")
    for task_id in ("0" * 32, "", None, 5, ["x"]):
        for fn in ("ack", "touch", "done", "bury", "dig", "unbury", "release", "requeue", "delete",
                   "meta", "peek"):
            assert q.error(fn, 0, task_id) == (ER_PROC_LUA, "Task not found"), (fn, task_id)


# -- put_unique --------------------------------------------------------------------------------------


def test_put_unique_deduplicates_ready_and_delayed_tasks_on_the_first_data_field(q, tube):
    first = q.task("put_unique", 0, tube, 0, 0, 0, 0, "k1", "extra")
    assert first[1:] == [tube, "ready", "k1", "extra"]
    # the same first field: the existing task, unchanged (pri, ttl and later data ignored)
    assert q.task("put_unique", 0, tube, 0, 5, 5, 50, "k1", "other") == first
    assert q.meta(0, first[0])["pri"] == 128 and q.meta(0, first[0])["ttl"] == 2_160_000
    second = q.task("put_unique", 0, tube, "0", "0", "0", "0", "k2")
    assert second[0] != first[0] and second[1:] == [tube, "ready", "k2"]
    assert q.stats(0, tube)[f"space0.{tube}.put"] == 2  # a duplicate is not counted

    # a taken task is not a duplicate
    assert q.task("take", 0, tube, 0)[0] == first[0]
    third = q.task("put_unique", 0, tube, 0, 0, 0, 0, "k1")
    assert third[0] != first[0] and third[2] == "ready"

    # with a delay: delayed tasks are looked at, and the delay is converted once (D4)
    delayed = q.task("put_unique", 0, tube, 1, 0, 0, 0, "k3")
    assert delayed[2] == "delayed"
    m = q.meta(0, delayed[0])
    assert 1_000_000 - 2000 <= m["event"] - m["created"] <= 1_000_000 + 2000
    assert m["ttl"] == 2_160_001
    assert q.task("put_unique", 0, tube, "1", 0, 0, 0, "k3") == delayed
    # without a delay only ready tasks count: a new task
    ready_k3 = q.task("put_unique", 0, tube, 0, 0, 0, 0, "k3")
    assert ready_k3[0] != delayed[0] and ready_k3[2] == "ready"
    assert q.stats(0, tube)[f"space0.{tube}.put"] == 5

    # no data
    for data in ((), (None,), (None, "x")):
        assert q.error("put_unique", 0, tube, 0, 0, 0, 0, *data) == (
            ER_PROC_LUA, "Can not put unique task without data")
    # space 1 has no put_unique index: the original text; the data check comes first (Q30)
    assert q.error("put_unique", 1, tube, 0, 0, 0, 0, "k") == (
        ER_PROC_LUA, "Tarantool have to be configured to use queue.put_unique method")
    assert q.error("put_unique", 1, tube, 0, 0, 0, 0) == (ER_PROC_LUA, "Can not put unique task without data")
    # the unique index does not forbid data-less tasks (D4): put and done without data
    bare = q.task("put", 0, tube + "-bare", 0, 0, 0, 0)
    assert bare[1:] == [tube + "-bare", "ready"]
    assert q.task("take", 0, tube + "-bare", 0)[0] == bare[0]
    assert q.task("done", 0, bare[0]) == [bare[0], tube + "-bare", "done"]


def test_any_msgpack_value_may_be_the_first_data_field_without_the_unique_index(q, tube):
    """Space 1 has no put_unique index: data are arbitrary msgpack values (spec 1.3)."""
    tid = q.task("put", 1, tube, 0, 0, 0, 100, "first")[0]
    q("take", 1, tube, 0)
    assert q.task("done", 1, tid, {"result": [1, 2]}) == [tid, tube, "done", {"result": [1, 2]}]
    for data in ([1, "two"], {"k": 1}):
        assert q.task("put", 1, tube, 0, 0, 0, 0, data, "more")[2:] == ["ready", data, "more"]
        assert q.task("urgent", 1, tube, 0, 0, 0, 0, data)[2:] == ["ready", data]


def test_the_unique_index_asks_for_a_scalar_first_data_field(q, tube):
    """Space 0's put_unique index holds field 12 as a nullable scalar (docs/box-queue.md): an
    array or a map there is refused with Tarantool's field type error, and nothing is stored."""
    for data in ([1, "two"], {"k": 1}):
        assert q.error("put", 0, tube, 0, 0, 0, 0, data) == (
            23, "Tuple field 13 type does not match one required by operation: expected scalar")
    assert q("take", 0, tube, 0) == []


# -- take --------------------------------------------------------------------------------------------


def test_take_timeouts_and_the_empty_result(q, tube):
    started = time.monotonic()
    assert q("take", 0, tube, 0) == []
    assert time.monotonic() - started < 0.1
    started = time.monotonic()
    assert q("take", 0, tube, 0.3) == []
    assert 0.29 <= time.monotonic() - started < 0.8
    started = time.monotonic()
    assert q("take", 0, tube, "0.2") == []
    assert 0.19 <= time.monotonic() - started < 0.7
    s = q.stats(0, tube)
    assert s[f"space0.{tube}.take_timeout"] == 3 and f"space0.{tube}.take" not in s


def test_take_without_a_timeout_waits_until_a_task_comes(qserver, q, tube):
    consumer = Q(qserver.port)
    try:
        job = Background(consumer, "take", 0, tube)  # no timeout: 365 days
        time.sleep(0.3)
        assert job.is_alive()
        tid = q.task("put", 0, tube, 0, 0, 0, 0, "late")[0]
        assert job.get(5) == [[tid, tube, "taken", "late"]]
    finally:
        consumer.close()


def test_take_records_the_consumer_and_the_ttr(q, tube):
    tid = q.task("put", 0, tube, 0, 0, 5, 0, "d")[0]
    taken_at = time.monotonic()
    assert q.task("take", 0, tube, 0) == [tid, tube, "taken", "d"]
    m = q.meta(0, tid)
    since_take_us = (time.monotonic() - taken_at) * 1e6  # meta's "now" is later by at most this
    assert m["status"] == "taken" and m["cid"] == q.sid() and m["ctaken"] == 1
    assert 5_000_000 - since_take_us - 1_000 <= m["event"] - m["now"] <= 5_000_000
    q("release", 0, tid)
    m = q.meta(0, tid)
    assert (m["status"], m["cid"], m["ctaken"]) == ("ready", 0, 1)
    assert m["event"] == m["created"] + DEFAULT_TTL_US
    q("take", 0, tube, 0)
    assert q.meta(0, tid)["ctaken"] == 2


def test_take_skips_a_head_already_past_its_ttl(q, tube):
    doomed = q.task("put", 0, tube, 0, 0.3, 0, 100, "doomed")[0]  # the head: highest priority
    kept = q.task("put", 0, tube, 0, 0, 0, 0, "kept")[0]
    time.sleep(0.4)
    assert q.task("take", 0, tube, 0)[0] == kept
    assert q.error("peek", 0, doomed) == (ER_PROC_LUA, "Task not found")
    s = poll(lambda: (m := q.stats(0, tube)).get(f"space0.{tube}.ttl.ready") and m, 1.0)
    assert s[f"space0.{tube}.ttl.total"] == 1 and s[f"space0.{tube}.ttl.ready"] == 1


# -- ack, touch, done, bury, dig, kick -------------------------------------------------------------


def test_ack_deletes_the_taken_task(q, tube):
    tid = q.task("put", 0, tube, 0, 0, 0, 0, "a", "b")[0]
    assert q.error("ack", 0, tid) == (ER_PROC_LUA, "Task is not taken")
    q("take", 0, tube, 0)
    assert q.task("ack", 0, tid) == [tid, tube, "taken", "a", "b"]  # the status before (Q28)
    assert q.conn.select(0, [tid]).data == []
    assert q.error("meta", 0, tid) == (ER_PROC_LUA, "Task not found")
    assert q.error("ack", 0, tid) == (ER_PROC_LUA, "Task not found")
    s = q.stats(0, tube)
    assert s[f"space0.{tube}.ack"] == 1 and s[f"space0.{tube}.tasks.total"] == 0


def test_touch_pushes_the_ttr_deadline(q, tube):
    tid = q.task("put", 0, tube, 0, 0, 1, 0, "d")[0]
    q("take", 0, tube, 0)
    time.sleep(0.6)
    touched_at = time.monotonic()
    assert q.task("touch", 0, tid) == [tid, tube, "taken", "d"]
    m = q.meta(0, tid)
    # The deadline is the touch's time + ttr: meta's "now" is later by what passed between the
    # touch and the meta (measured here, so a busy machine does not fail the check).
    since_touch_us = (time.monotonic() - touched_at) * 1e6
    assert 1_000_000 - since_touch_us - 1_000 <= m["event"] - m["now"] <= 1_000_000
    assert m["ctaken"] == 1
    # past the first deadline (take + 1 s) the task is still taken ...
    time.sleep(max(0.0, touched_at + 0.75 - time.monotonic()))
    assert q.task("peek", 0, tid)[2] == "taken"
    # ... and it comes back one ttr after the touch
    assert poll(lambda: q.task("peek", 0, tid)[2] == "ready", 1.5)
    assert 0.95 <= time.monotonic() - touched_at <= 1.2 + FSYNC_SLACK  # the return to ready is a write
    assert q.stats(0, tube)[f"space0.{tube}.touch"] == 1


def test_touch_does_not_go_beyond_the_ttl(q, tube):
    tid = q.task("put", 0, tube, 0, 3, 100, 0, "d")[0]
    q("take", 0, tube, 0)
    m = q.meta(0, tid)
    assert m["event"] == m["created"] + 3 * US
    q("touch", 0, tid)
    assert q.meta(0, tid)["event"] == m["created"] + 3 * US


def test_done_replaces_the_data_and_keeps_the_task(q, q2, tube):
    tid = q.task("put", 0, tube, 0, 100, 0, 0, "a", "b")[0]
    q("take", 0, tube, 0)
    assert q.error("done", 0, "f" * 32) == (ER_PROC_LUA, "Task not found")
    assert q.task("done", 0, tid, "r1", {"x": 1}) == [tid, tube, "done", "r1", {"x": 1}]
    assert q2.task("peek", 0, tid) == [tid, tube, "done", "r1", {"x": 1}]
    m = q.meta(0, tid)
    assert m["cid"] == q.sid()  # not reset (Q18)
    assert m["event"] == m["created"] + 100 * US and m["ctaken"] == 1
    (row,) = q.conn.select(0, [tid]).data
    assert row[2] == "*" and row[12:] == ["r1", {"x": 1}]
    assert q.error("done", 0, tid) == (ER_PROC_LUA, "Task is not taken")
    assert q.error("ack", 0, tid) == (ER_PROC_LUA, "Task is not taken")
    assert q("take", 0, tube, 0) == []
    assert q.stats(0, tube)[f"space0.{tube}.done"] == 1
    assert q.stats(0, tube)[f"space0.{tube}.tasks.done"] == 1


def test_bury_dig_and_unbury(q, q2, tube):
    tid = q.task("put", 0, tube, 0, 0, 0, 0, "d")[0]
    assert q.error("bury", 0, tid) == (ER_PROC_LUA, "Task is not taken")
    q("take", 0, tube, 0)
    assert q.task("bury", 0, tid) == [tid, tube, "buried", "d"]
    m = q.meta(0, tid)
    assert (m["status"], m["cbury"], m["cid"]) == ("buried", 1, q.sid())
    assert m["event"] == m["created"] + DEFAULT_TTL_US
    assert q("take", 0, tube, 0) == []
    # no ownership check for dig/unbury
    assert q2.task("dig", 0, tid) == [tid, tube, "ready", "d"]
    m = q.meta(0, tid)
    assert m["status"] == "ready" and m["ipri"] == 127 and m["pri"] == 128
    assert q.error("dig", 0, tid) == (ER_PROC_LUA, "Task is not buried")
    assert q.error("unbury", 0, tid) == (ER_PROC_LUA, "Task is not buried")
    q("take", 0, tube, 0)
    assert q.error("dig", 0, tid) == (ER_PROC_LUA, "Task is not buried")
    q("bury", 0, tid)
    assert q2.task("unbury", 0, tid) == [tid, tube, "ready", "d"]
    s = q.stats(0, tube)
    assert s[f"space0.{tube}.bury"] == 2 and s[f"space0.{tube}.dig"] == 2


def test_cbury_counts_buries_only(q, tube):
    tid = q.task("put", 0, tube, 0, 0, 0, 0, "d")[0]
    q("take", 0, tube, 0)
    q("bury", 0, tid)
    q("dig", 0, tid)
    assert q.meta(0, tid)["cbury"] == 1
    q("take", 0, tube, 0)
    q("bury", 0, tid)
    q("kick", 0, tube, 1)
    q("take", 0, tube, 0)
    q("bury", 0, tid)
    q("unbury", 0, tid)
    assert q.meta(0, tid)["cbury"] == 3


def test_kick_honours_count_in_take_order(q, tube):
    ids = {pri: q.task("put", 0, tube, 0, 0, 0, pri, f"p{pri}")[0] for pri in (1, 2, 3, 4, 5)}
    for pri in (5, 4, 3, 2, 1):  # take order: highest pri first
        assert q.task("take", 0, tube, 0)[0] == ids[pri]
        q("bury", 0, ids[pri])

    def statuses() -> dict[int, str]:
        return {pri: q.task("peek", 0, tid)[2] for pri, tid in ids.items()}

    assert q("kick", 0, tube) == [1]  # count defaults to 1
    assert statuses() == {5: "ready", 4: "buried", 3: "buried", 2: "buried", 1: "buried"}
    assert q("kick", 0, tube, 2) == [2]
    assert statuses() == {5: "ready", 4: "ready", 3: "ready", 2: "buried", 1: "buried"}
    assert q("kick", 0, tube, 0) == [0]
    assert q("kick", 0, tube, -3) == [0]
    assert statuses()[2] == "buried"
    assert q("kick", 0, tube, "10") == [2]
    assert q("kick", 0, tube, 10) == [0]
    assert q("kick", 0, tube + "-empty", 3) == [0]
    assert set(statuses().values()) == {"ready"}
    s = q.stats(0, tube)
    assert s[f"space0.{tube}.dig"] == 5 and s[f"space0.{tube}.bury"] == 5
    assert not [k for k in s if k.endswith(".kick")]
    # kicked tasks keep their priorities: still taken highest pri first
    assert [q.task("take", 0, tube, 0)[0] for _ in range(5)] == [ids[p] for p in (5, 4, 3, 2, 1)]


@pytest.mark.parametrize("how", ["dig", "unbury", "kick"])
def test_dig_unbury_and_kick_wake_a_waiting_consumer(qserver, q, tube, how):
    tid = q.task("put", 0, tube, 0, 0, 0, 0, "d")[0]
    q("take", 0, tube, 0)
    q("bury", 0, tid)
    job, consumer = background_take(qserver.port, tube, 5)
    try:
        time.sleep(0.25)
        assert job.is_alive()
        started = time.perf_counter()
        q(how, 0, tube if how == "kick" else tid)
        assert job.get(6) == [[tid, tube, "taken", "d"]]
        # woken at once, not at its 5 s timeout (a bound of 0.1 s failed once in a full run on the
        # busy 2-core machine, at 0.18 s: two commits and their flushes sit between the two)
        assert job.finished_at - started < 1.0
    finally:
        consumer.close()


def test_kick_wakes_one_waiting_consumer_per_task(qserver, q, tube):
    ids = [q.task("put", 0, tube, 0, 0, 0, 0, i)[0] for i in range(3)]
    for tid in ids:
        q("take", 0, tube, 0)
        q("bury", 0, tid)
    waiting = [background_take(qserver.port, tube, 3) for _ in range(4)]
    try:
        time.sleep(0.25)
        kicked_at = time.perf_counter()
        assert q("kick", 0, tube, 3) == [3]
        results = [job.get(5) for job, _ in waiting]
        assert sorted(r[0][0] for r in results if r) == sorted(ids)
        assert all(job.finished_at - kicked_at < 1.0 for job, _ in waiting if job.result)  # (timeout: 3 s)
        assert sum(1 for r in results if not r) == 1
    finally:
        for _, consumer in waiting:
            consumer.close()


def test_queue_spaces_are_separate(q, tube):
    in1 = q.task("put", 1, tube, 0, 0, 0, 0, "one")[0]
    assert q("take", 0, tube, 0) == []
    assert q.error("meta", 0, in1) == (ER_PROC_LUA, "Task not found")
    assert q.task("take", 1, tube, 0) == [in1, tube, "taken", "one"]
    assert q.error("ack", 0, in1) == (ER_PROC_LUA, "Task not found")
    assert q.task("ack", 1, in1)[0] == in1
    assert q.conn.select(1, [in1]).data == [] and q.conn.select(0, [in1]).data == []
    assert as_map(q("statistics", 1, tube)[0]) == {
        f"space1.{tube}.put": 1, f"space1.{tube}.take": 1, f"space1.{tube}.ack": 1,
        **{f"space1.{tube}.tasks.{s}": 0 for s in TASK_STATES}}
    assert as_map(q("statistics", 0, tube)[0]) == {
        f"space0.{tube}.take_timeout": 1, **{f"space0.{tube}.tasks.{s}": 0 for s in TASK_STATES}}


# -- release, requeue, urgent, priorities ------------------------------------------------------------


def test_release_to_ready_and_with_a_delay(qserver, q, tube):
    tid = q.task("put", 0, tube, 0, 100, 0, 0, "d")[0]
    q("take", 0, tube, 0)
    assert q.task("release", 0, tid) == [tid, tube, "ready", "d"]
    m = q.meta(0, tid)
    assert (m["status"], m["cid"], m["ctaken"], m["ttl"]) == ("ready", 0, 1, 100)
    assert m["event"] == m["created"] + 100 * US
    q("take", 0, tube, 0)
    assert q.task("release", 0, tid, -1) == [tid, tube, "ready", "d"]  # a negative delay is none

    q("take", 0, tube, 0)
    job, consumer = background_take(qserver.port, tube, 3)
    try:
        released_at = time.perf_counter()
        assert q.task("release", 0, tid, 0.5) == [tid, tube, "delayed", "d"]
        m = q.meta(0, tid)
        since_release_us = (time.perf_counter() - released_at) * 1e6  # meta's "now" is later by at most this
        assert (m["status"], m["cid"]) == ("delayed", 0)
        assert 500_000 - since_release_us - 1_000 <= m["event"] - m["now"] <= 500_000
        assert job.get(4) == [[tid, tube, "taken", "d"]]
        assert 0.48 <= job.finished_at - released_at <= 0.65 + FSYNC_SLACK
    finally:
        consumer.close()
    assert q.stats(0, tube)[f"space0.{tube}.release"] == 3


def test_release_with_a_ttl_restarts_the_lifetime(q, tube):
    kept = q.task("put", 0, tube, 0, 100, 0, 0, "kept")[0]
    q("take", 0, tube, 0)
    q("release", 0, kept, 0, 0)  # ttl 0: the stored ttl stays
    assert q.meta(0, kept)["ttl"] == 100
    q("take", 0, tube, 0)
    q("release", 0, kept, 0, -5)
    assert q.meta(0, kept)["ttl"] == 100

    short = q.task("put", 0, tube, 0, 100, 0, 10, "short")[0]  # pri 10: taken first
    assert q.task("take", 0, tube, 0)[0] == short
    released_at = time.monotonic()
    assert q.task("release", 0, short, 0, 1)[2] == "ready"  # now lives 1 s from now (Q17)
    (row,) = q.conn.select(0, [short]).data
    assert US <= row[8] < 1.5 * US
    assert row[3] == row[7] + row[8]
    assert q.meta(0, short)["ttl"] == 1

    both = q.task("put", 0, tube, 0, 100, 0, 20, "both")[0]
    assert q.task("take", 0, tube, 0)[0] == both
    both_at = time.monotonic()
    assert q.task("release", 0, both, 0.3, 0.5)[2] == "delayed"  # ready after 0.3, gone after 0.8

    assert poll(lambda: q.conn.select(0, [both]).data[0][2] == "r", 1.0)
    assert 0.28 <= time.monotonic() - both_at <= 0.45 + FSYNC_SLACK
    assert poll(lambda: not q.conn.select(0, [both]).data, 2.0)
    assert 0.78 <= time.monotonic() - both_at <= 1.0 + FSYNC_SLACK
    assert poll(lambda: not q.conn.select(0, [short]).data, 2.0)
    assert 0.98 <= time.monotonic() - released_at <= 1.2 + FSYNC_SLACK
    s = q.stats(0, tube)
    assert s[f"space0.{tube}.ttl.total"] == 2 and s[f"space0.{tube}.ttl.ready"] == 2
    assert q.task("peek", 0, kept)[2] == "ready"


def test_priorities_are_offsets_and_ties_are_fifo(q, tube):
    pris = [0, 30, -1, 10, 200, 128, -200, -127, 1, "20", 0, 30, -1, 10, 0, 2.7, 127, -126]
    ids = []
    for i, pri in enumerate(pris):
        ids.append(q.task("put", 0, tube, 0, 0, 0, pri, i)[0])
    expected_stored = [stored_pri(float(p)) for p in pris]
    assert [q.meta(0, tid)["pri"] for tid in ids] == expected_stored
    assert expected_stored[:10] == [128, 98, 129, 118, 0, 0, 255, 255, 127, 108]
    order = sorted(range(len(pris)), key=lambda i: (expected_stored[i], i))
    taken = [q.task("take", 0, tube, 0)[3] for _ in pris]
    assert taken == order
    assert q("take", 0, tube, 0) == []


def test_pipelined_puts_on_one_connection_are_fifo_in_request_order(qserver, q, tube):
    """Tarantool runs the requests of one connection in arrival order; so do puts sent without
    waiting for their answers, however they are grouped into commits."""
    raw = RawIproto(qserver.port)
    try:
        syncs = raw.send_many([("box.queue.put", [0, tube, 0, 0, 0, 0, i]) for i in range(300)])
        answers = [raw.wait_for(sync) for sync in syncs]
    finally:
        raw.close()
    assert all(code == 0 for code, _ in answers)
    taken = [q.task("take", 0, tube, 0)[3] for _ in range(300)]
    assert taken == list(range(300))


def test_fifo_among_equal_priorities_survives_state_changes(q, tube):
    a, b, c = (q.task("put", 0, tube, 0, 0, 0, 0, name)[0] for name in "abc")
    assert q.task("take", 0, tube, 0)[0] == a
    assert q.task("take", 0, tube, 0)[0] == b
    q("release", 0, b)
    q("release", 0, a)
    assert [q.task("take", 0, tube, 0)[0] for _ in range(3)] == [a, b, c]
    q("bury", 0, c)
    q("bury", 0, b)
    q("bury", 0, a)
    assert q("kick", 0, tube, 3) == [3]
    assert [q.task("take", 0, tube, 0)[0] for _ in range(3)] == [a, b, c]


def test_urgent_and_requeue_order_by_internal_priority(q, tube):
    a = q.task("put", 0, tube, 0, 0, 0, 30, "a")[0]
    b = q.task("put", 0, tube, 0, 0, 0, 0, "b")[0]
    c = q.task("put", 0, tube, 0, 0, 0, -20, "c")[0]
    assert [q.meta(0, t)["pri"] for t in (a, b, c)] == [98, 128, 148]
    assert q.task("take", 0, tube, 0)[0] == a
    # requeue: behind every ready task whatever their pri (last ready ipri + 1)
    assert q.task("requeue", 0, a) == [a, tube, "ready", "a"]
    m = q.meta(0, a)
    assert (m["ipri"], m["pri"], m["cid"], m["ctaken"]) == (128, 98, 0, 1)
    # urgent: ahead of the head of the ready list whatever its pri (head ipri - 1)
    u1 = q.task("urgent", 0, tube, 0, 0, 0, -100, "u1")
    assert u1[1:] == [tube, "ready", "u1"]
    assert (q.meta(0, u1[0])["ipri"], q.meta(0, u1[0])["pri"]) == (126, 228)
    u2 = q.task("urgent", 0, tube, "0", "0", "0", "0", "u2")[0]
    assert q.meta(0, u2)["ipri"] == 125
    # urgent with a delay is a plain put with the default lane
    ud = q.task("urgent", 0, tube, 5, 0, 0, 0, "ud")
    assert ud[2] == "delayed" and q.meta(0, ud[0])["ipri"] == 127
    assert [q.task("take", 0, tube, 0)[0] for _ in range(5)] == [u2, u1[0], b, c, a]
    s = q.stats(0, tube)
    assert s[f"space0.{tube}.urgent"] == 3 and s[f"space0.{tube}.put"] == 3
    assert s[f"space0.{tube}.requeue"] == 1
    # with no ready task: 127 for both
    for tid in (u2, u1[0], b, c):
        q("ack", 0, tid)
    assert q.task("requeue", 0, a)[2] == "ready" and q.meta(0, a)["ipri"] == 127
    q("take", 0, tube, 0)
    q("ack", 0, a)
    e = q.task("urgent", 0, tube, 0, 0, 0, 0, "e")[0]
    assert q.meta(0, e)["ipri"] == 127
    q("take", 0, tube, 0)
    q("requeue", 0, e)
    assert q.meta(0, e)["ipri"] == 127


def test_internal_priority_saturates(q, tube):
    """Q21: urgent stops at 0, requeue at 255, no renormalisation."""
    urgent = [q.meta(0, q.task("urgent", 0, tube, 0, 0, 0, 0, i)[0])["ipri"] for i in range(130)]
    assert urgent == [*range(127, -1, -1), 0, 0]
    other = tube + "-requeue"
    q("put", 0, other, 0, 0, 0, 0, "x")
    q("put", 0, other, 0, 0, 0, 0, "y")
    requeued = []
    for _ in range(130):
        tid = q.task("take", 0, other, 0)[0]
        q("requeue", 0, tid)
        requeued.append(q.meta(0, tid)["ipri"])
    assert requeued == [*range(128, 256), 255, 255]


def test_requeue_looks_only_at_its_own_tube(q, tube):
    before, after = tube + "-a", tube + "-b"  # "-a" sorts before "-b"
    x1 = q.task("put", 0, before, 0, 0, 0, 0, "x1")[0]
    x2 = q.task("put", 0, before, 0, 0, 0, 0, "x2")[0]
    q("take", 0, before, 0)
    q("requeue", 0, x1)
    assert q.task("take", 0, before, 0)[0] == x2
    q("requeue", 0, x2)
    assert (q.meta(0, x1)["ipri"], q.meta(0, x2)["ipri"]) == (128, 129)
    y = q.task("put", 0, after, 0, 0, 0, 0, "y")[0]
    q("take", 0, after, 0)
    q("requeue", 0, y)
    assert q.meta(0, y)["ipri"] == 127  # D13: not 130 from the other tube (Q22)


# -- delete, truncate, meta, peek ------------------------------------------------------------------


def test_delete_works_in_every_state(q, q2, tube):
    ready = q.task("put", 0, tube, 0, 0, 0, 0, "r")[0]
    delayed = q.task("put", 0, tube, 10, 0, 0, 0, "d")[0]
    taken = q.task("put", 0, tube, 0, 0, 0, 100, "t")[0]
    assert q2.task("take", 0, tube, 0)[0] == taken
    buried = q.task("put", 0, tube, 0, 0, 0, 100, "b")[0]
    q("take", 0, tube, 0)
    q("bury", 0, buried)
    done = q.task("put", 0, tube, 0, 0, 0, 100, "x")[0]
    q("take", 0, tube, 0)
    q("done", 0, done, "result")
    for tid, status, data in ((ready, "ready", "r"), (delayed, "delayed", "d"), (taken, "taken", "t"),
                              (buried, "buried", "b"), (done, "done", "result")):
        assert q.task("delete", 0, tid) == [tid, tube, status, data]  # no ownership check
        assert q.error("peek", 0, tid) == (ER_PROC_LUA, "Task not found")
        assert q.error("delete", 0, tid) == (ER_PROC_LUA, "Task not found")
    assert q2.error("ack", 0, taken) == (ER_PROC_LUA, "Task not found")
    s = q.stats(0, tube)
    assert s[f"space0.{tube}.delete"] == 5 and s[f"space0.{tube}.tasks.total"] == 0
    assert q.conn.select(0, [tube], index="tube_event").data == []


def test_truncate_deletes_every_task_of_the_tube_only(q, q2, tube):
    other = tube + "-other"
    q("put", 0, tube, 0, 0, 0, 0, "r")
    q("put", 0, tube, 10, 0, 0, 0, "d")
    taken = q.task("put", 0, tube, 0, 0, 0, 100, "t")[0]
    q2("take", 0, tube, 0)
    buried = q.task("put", 0, tube, 0, 0, 0, 100, "b")[0]
    q("take", 0, tube, 0)
    q("bury", 0, buried)
    keep_other = q.task("put", 0, other, 0, 0, 0, 0, "o")[0]
    keep_space1 = q.task("put", 1, tube, 0, 0, 0, 0, "s1")[0]
    counters = {k: v for k, v in q.stats(0, tube).items() if ".tasks." not in k}
    assert q("truncate", 0, tube) == [4]
    assert q.conn.select(0, [tube], index="tube_event").data == []
    assert q("truncate", 0, tube) == [0]
    assert q("truncate", 0, tube + "-never") == [0]
    assert q2.error("ack", 0, taken) == (ER_PROC_LUA, "Task not found")
    assert q.task("peek", 0, keep_other)[2] == "ready"
    assert q.task("peek", 1, keep_space1)[2] == "ready"
    s = q.stats(0, tube)
    assert {k: v for k, v in s.items() if ".tasks." not in k} == counters  # truncate is not counted
    assert [s[f"space0.{tube}.tasks.{state}"] for state in TASK_STATES] == [0] * 6


def test_meta_fields_and_units(q, tube):
    before = time.time() * US
    tid = q.task("put", 0, tube, 0, 10, 20, 5, "d")[0]
    (row,) = q("meta", 0, tid)
    assert len(row) == 13
    assert all(type(v) is int for v in row[3:]), row  # D14: integers, not strings
    m = q.meta(0, tid)
    assert (m["id"], m["tube"], m["status"]) == (tid, tube, "ready")
    assert (m["ipri"], m["pri"], m["cid"], m["ttl"], m["ttr"], m["cbury"], m["ctaken"]) == (
        127, 123, 0, 10, 20, 0, 0)
    assert before - 50_000 <= m["created"] <= m["now"] <= time.time() * US + 50_000
    assert m["event"] == m["created"] + 10 * US
    fractional = q.task("put", 0, tube, 0, 10.9, 0.5, 0, "f")[0]
    assert (q.meta(0, fractional)["ttl"], q.meta(0, fractional)["ttr"]) == (10, 0)
    assert q.stats(0, tube)[f"space0.{tube}.meta"] == 4


def test_peek_changes_nothing(q, tube):
    tid = q.task("put", 0, tube, 0, 0, 0, 0, "d", 1)[0]
    before = q.conn.select(0, [tid]).data
    assert q.task("peek", 0, tid) == [tid, tube, "ready", "d", 1]
    q("take", 0, tube, 0)
    taken = q.conn.select(0, [tid]).data
    assert q.task("peek", 0, tid) == [tid, tube, "taken", "d", 1]
    assert q.conn.select(0, [tid]).data == taken != before
    assert q.stats(0, tube)[f"space0.{tube}.peek"] == 2


# -- statistics and counters ------------------------------------------------------------------------


def test_statistics_format(qserver, q, tube):
    dotted = tube + ".with.dots"
    assert q("statistics", 0, tube) == [[]]
    a = q.task("put", 0, tube, 0, 0, 0, 0, "a")[0]
    q("put", 0, tube, 0, 0, 0, 0, "b")
    q("put", 0, tube, 10, 0, 0, 0, "c")
    q("take", 0, tube, 0)
    q("ack", 0, a)
    q("take", 0, tube, 0)
    q("put", 0, dotted, 0, 0, 0, 0, "d")
    q("put", 1, tube, 0, 0, 0, 0, "e")

    (flat,) = q("statistics", 0, tube)
    names, values = flat[0::2], flat[1::2]
    prefix = f"space0.{tube}."
    assert all(type(n) is str and n.startswith(prefix) for n in names), flat
    assert all(type(v) is int for v in values), flat  # D9: integers
    assert names[-6:] == [prefix + "tasks." + s for s in TASK_STATES]  # D9: counters, then tasks.*
    assert dict(zip(names[:-6], values[:-6], strict=True)) == {
        prefix + "put": 3, prefix + "take": 2, prefix + "ack": 1}
    assert values[-6:] == [2, 0, 1, 1, 0, 0]
    assert q("statistics", 0, tube) == [flat]  # deterministic
    assert q("statistics", "0", tube) == [flat]

    # statistics(space): every tube of the space, each as one block, counters then tasks.*
    (flat0,) = q("statistics", 0)
    (flat_all,) = q("statistics")
    for whole in (flat0, flat_all):
        names = whole[0::2]
        ours = [i for i, n in enumerate(names) if n in flat[0::2]]  # the dotted tube shares the prefix
        assert ours == list(range(ours[0], ours[0] + len(ours)))
        assert whole[2 * ours[0]:2 * (ours[-1] + 1)] == flat
        assert as_map(whole)[f"space0.{dotted}.tasks.ready"] == 1
    assert f"space1.{tube}.put" not in as_map(flat0)
    assert as_map(flat_all)[f"space1.{tube}.put"] == 1
    assert as_map(q("statistics", 1, tube)[0])[f"space1.{tube}.tasks.total"] == 1
    # an unknown tube, an unknown space: one empty tuple (D15)
    assert q("statistics", 0, tube + "-unknown") == [[]]
    assert q("statistics", 9) == [[]]


def test_every_counter_name(qserver, q, q2, tube):
    p = f"space0.{tube}."
    t1 = q.task("put", 0, tube, 0, 0, 0, 0, "1")[0]
    q("urgent", 0, tube, 0, 0, 0, 0, "u")
    q("put_unique", 0, tube, 0, 0, 0, 0, "1")  # a duplicate of t1: not counted
    u = q.task("take", 0, tube, 0)[0]  # the urgent one
    q("touch", 0, u)
    q("release", 0, u)
    q("take", 0, tube, 0)
    q("requeue", 0, u)
    q("take", 0, tube, 0)  # t1
    q("bury", 0, t1)
    q("dig", 0, t1)
    q("take", 0, tube, 0)
    q("done", 0, t1)
    q("take", 0, tube, 0)  # u
    q("ack", 0, u)
    q("take", 0, tube, 0)  # nothing: take_timeout
    q("meta", 0, t1)
    q("peek", 0, t1)
    q("delete", 0, t1)
    q("put", 0, tube, 0, 0, 0, 0, "left")
    q("put", 0, tube, 0, 0.2, 0, 0, "expires")
    taker = Q(qserver.port)
    taker("take", 0, tube, 0)
    taker.close()
    q("kick", 0, tube, 1)
    q("truncate", 0, tube + "-x")
    q("restart_check", 0, tube)
    s = poll(lambda: (m := q.stats(0, tube)).get(p + "ttl.total") and m.get(p + "ready_by_disconnect") and m, 2.0)
    assert s == {
        p + "put": 3, p + "urgent": 1, p + "take": 6, p + "touch": 1, p + "release": 1,
        p + "requeue": 1, p + "bury": 1, p + "dig": 1, p + "done": 1, p + "ack": 1,
        p + "take_timeout": 1, p + "meta": 1, p + "peek": 1, p + "delete": 1,
        p + "ttl.total": 1, p + "ttl.ready": 1, p + "ready_by_disconnect": 1,
        p + "tasks.total": 1, p + "tasks.ready": 1, p + "tasks.delayed": 0, p + "tasks.taken": 0,
        p + "tasks.buried": 0, p + "tasks.done": 0,
    }


def test_failed_calls_do_not_move_counters(q, q2, tube):
    tid = q.task("put", 0, tube, 0, 0, 0, 0, "d")[0]
    q2("take", 0, tube, 0)
    before = q.stats(0, tube)
    q.error("take", 0, tube, -1)
    q.error("take", 0, tube, "soon")
    q.error("put_unique", 0, tube, 0, 0, 0, "x", "data")
    q.error("put_unique", 0, tube, 0, 0, 0, 0)
    for fn in ("ack", "touch", "done", "bury", "release", "requeue"):
        q.error(fn, 0, tid)
    q.error("dig", 0, tid)
    q.error("unbury", 0, tid)
    q.error("kick", 0, tube, "x")
    q.error("release", 0, tid, "x")
    assert q.stats(0, tube) == before


def test_failed_put_and_urgent_do_not_count(q, tube):
    q("put", 0, tube, 0, 0, 0, 0, "seed")
    before = q.stats(0, tube)
    q.error("put", 0, tube, "x", 0, 0, 0)
    q.error("put", 0, tube, 0, 0, 0)
    q.error("urgent", 0, tube, 0, "x", 0, 0)
    assert q.stats(0, tube) == before


def test_restart_check_registry(q, tube):
    assert q("restart_check", 0, tube) == ["starting"]
    assert q("restart_check", 0, tube) == ["already started"]
    assert q("restart_check", "0", tube) == ["already started"]
    assert q("restart_check", 1, tube) == ["starting"]
    assert q("statistics", 0, tube) == [[]]  # not counted
    q("put", 0, tube + "-used", 0, 0, 0, 0, "d")
    assert q("restart_check", 0, tube + "-used") == ["already started"]


# -- timing -------------------------------------------------------------------------------------------


def test_a_delayed_task_becomes_ready_on_time(qserver, q, tube):
    sent_at = time.perf_counter()
    tid = q.task("put", 0, tube, 0.5, 0, 0, 0, "d")[0]
    returned_at = time.perf_counter()
    assert q("take", 0, tube, 0) == []
    job, consumer = background_take(qserver.port, tube, 3)
    try:
        time.sleep(0.3)
        assert q.task("peek", 0, tid)[2] == "delayed"
        assert job.get(4) == [[tid, tube, "taken", "d"]]
        assert job.finished_at - sent_at >= 0.495
        assert job.finished_at - returned_at <= 0.6 + FSYNC_SLACK
    finally:
        consumer.close()
    m = q.meta(0, tid)
    assert m["ttl"] == 2_160_000  # 25 days + 0.5 s delay, in whole seconds
    assert m["ctaken"] == 1


def test_ttr_returns_a_taken_task_to_ready(qserver, q, tube):
    tid = q.task("put", 0, tube, 0, 0, 0.5, 0, "d")[0]
    q("take", 0, tube, 0)
    taken_at = time.perf_counter()
    job, consumer = background_take(qserver.port, tube, 3)
    try:
        assert job.get(4) == [[tid, tube, "taken", "d"]]
        assert 0.45 <= job.finished_at - taken_at <= 0.6 + FSYNC_SLACK
        m = q.meta(0, tid)
        assert m["cid"] == consumer.sid() and m["ctaken"] == 2
        assert q.error("ack", 0, tid) == (ER_PROC_LUA, "Only consumer that took the task can it ack")
        # (read while the consumer still holds the task: its leaving would count ready_by_disconnect)
        names = {k.removeprefix(f"space0.{tube}.") for k in q.stats(0, tube)}
        assert names == {"put", "take", "meta", *(f"tasks.{s}" for s in TASK_STATES)}  # ttr has no counter
    finally:
        consumer.close()


def test_ttl_deletes_tasks_in_every_state_on_time(q, tube):
    offset = time.time() - time.monotonic()
    ids: dict[str, str] = {}
    ids["taken"] = q.task("put", 0, tube, 0, 0.6, 30, 100, "t")[0]
    q("take", 0, tube, 0)
    ids["buried"] = q.task("put", 0, tube, 0, 0.6, 30, 100, "b")[0]
    q("take", 0, tube, 0)
    q("bury", 0, ids["buried"])
    ids["done"] = q.task("put", 0, tube, 0, 0.6, 30, 100, "x")[0]
    q("take", 0, tube, 0)
    q("done", 0, ids["done"])
    ids["delayed"] = q.task("put", 0, tube, 0, 0.6, 30, 100, "d")[0]
    q("take", 0, tube, 0)
    assert q.task("release", 0, ids["delayed"], 5)[2] == "delayed"  # clipped to created + ttl
    ids["ready"] = q.task("put", 0, tube, 0, 0.6, 30, 0, "r")[0]
    expiry = {}
    for state, tid in ids.items():
        (row,) = q.conn.select(0, [tid]).data
        assert row[8] == 600_000
        expiry[state] = (row[7] + row[8]) / US - offset  # local monotonic time
    assert q.meta(0, ids["delayed"])["event"] == q.meta(0, ids["delayed"])["created"] + 600_000
    gone: dict[str, float] = {}
    deadline = time.monotonic() + 3
    while len(gone) < len(ids) and time.monotonic() < deadline:
        for state, tid in ids.items():
            if state not in gone and not q.conn.select(0, [tid]).data:
                gone[state] = time.monotonic()
        time.sleep(0.003)
    assert set(gone) == set(ids)
    for state in ids:
        assert -0.02 <= gone[state] - expiry[state] <= 0.15, (state, gone[state] - expiry[state])
    s = q.stats(0, tube)
    p = f"space0.{tube}."
    assert s[p + "ttl.total"] == 5
    assert [s[p + "ttl." + state] for state in ("ready", "delayed", "taken", "buried", "done")] == [1] * 5
    assert s[p + "tasks.total"] == 0


def test_a_put_wakes_a_blocked_take_promptly(qserver, q, tube):
    latencies = []
    consumer = Q(qserver.port)
    try:
        for i in range(6):
            job = Background(consumer, "take", 0, tube, 5)
            time.sleep(0.1)
            assert job.is_alive()
            put_at = time.perf_counter()
            tid = q.task("put", 0, tube, 0, 0, 0, 0, i)[0]
            assert job.get(6) == [[tid, tube, "taken", i]]
            latencies.append(job.finished_at - put_at)
    finally:
        consumer.close()
    # The median says "promptly"; one wake-up in six may meet a busy machine (0.13 s once in a
    # full run), still far below the take's 5 s timeout.
    assert max(latencies) < 0.5, latencies
    assert stats_lib.median(latencies) < 0.03, latencies


# -- sessions -------------------------------------------------------------------------------------------


def test_only_the_taker_may_change_a_taken_task(q, q2, tube):
    tid = q.task("put", 0, tube, 0, 0, 0, 0, "d")[0]
    assert q2.error("ack", 0, tid) == (ER_PROC_LUA, "Task is not taken")  # checked before the owner
    q("take", 0, tube, 0)
    before = q.conn.select(0, [tid]).data
    for fn, verb in (("ack", "ack"), ("touch", "touch"), ("done", "done"), ("bury", "done"),
                     ("release", "release"), ("requeue", "release")):
        assert q2.error(fn, 0, tid) == (ER_PROC_LUA, f"Only consumer that took the task can it {verb}")
    assert q2.error("release", 0, tid, 1, 1) == (ER_PROC_LUA, "Only consumer that took the task can it release")
    assert q2.error("done", 0, tid, "x") == (ER_PROC_LUA, "Only consumer that took the task can it done")
    assert q.conn.select(0, [tid]).data == before
    # no ownership for the others
    assert q2.task("peek", 0, tid)[2] == "taken"
    assert q2.meta(0, tid)["cid"] == q.sid() != q2.sid()
    assert q.task("ack", 0, tid)[2] == "taken"


def test_closing_the_takers_connection_makes_its_tasks_ready(qserver, q, tube):
    other = tube + "-other"
    taker = Q(qserver.port)
    sid = taker.sid()
    a = q.task("put", 0, tube, 0, 0, 0, 0, "a")[0]
    b = q.task("put", 0, tube, 0, 0, 0, 0, "b")[0]
    z = q.task("put", 0, other, 0, 0, 0, 0, "z")[0]
    w = q.task("put", 0, tube, 0, 0, 0, -10, "w")[0]
    x = q.task("put", 0, tube, 0, 0, 0, -10, "x")[0]
    assert [taker.task("take", 0, tube, 0)[0] for _ in range(4)] == [a, b, w, x]
    taker("bury", 0, w)
    taker("done", 0, x)
    assert taker.task("take", 0, other, 0)[0] == z
    closed_at = time.monotonic()
    taker.close()

    def all_ready() -> bool:
        return all(q.task("peek", 0, t)[2] == "ready" for t in (a, b, z))

    assert poll(all_ready, 1.0)
    assert time.monotonic() - closed_at < 1.0
    for t in (a, b, z):
        m = q.meta(0, t)
        assert (m["cid"], m["ctaken"], m["ipri"]) == (0, 1, 127)
        assert m["event"] == m["created"] + DEFAULT_TTL_US
    assert (q.meta(0, w)["status"], q.meta(0, w)["cid"]) == ("buried", sid)
    assert (q.meta(0, x)["status"], q.meta(0, x)["cid"]) == ("done", sid)
    assert q.stats(0, tube)[f"space0.{tube}.ready_by_disconnect"] == 2
    assert q.stats(0, other)[f"space0.{other}.ready_by_disconnect"] == 1
    assert [q.task("take", 0, tube, 0)[0] for _ in range(2)] == [a, b]  # order kept


def test_statistics_move_in_the_same_step_as_the_state_they_count(qserver, q, tube):
    """A consumer holding two tasks disconnects; a poller sends ``meta`` of both tasks and
    ``statistics`` in one write (answered in that order, with nothing between them), again and
    again: whenever ``meta`` shows a task ready, ``statistics`` already counts it as
    ``ready_by_disconnect``, never the state without its counter."""
    poller = RawIproto(qserver.port)
    try:
        for round_ in range(10):
            name = f"{tube}-{round_}"
            ids = [q.task("put", 0, name, 0, 0, 0, 0, i)[0] for i in ("a", "b")]
            taker = Q(qserver.port)
            assert [taker.task("take", 0, name, 0)[0] for _ in ids] == ids
            taker.close()
            deadline = time.monotonic() + 5
            while True:
                syncs = poller.send_many([("box.queue.meta", [0, i]) for i in ids] + [("box.queue.statistics", [0, name])])
                answers = [poller.wait_for(s) for s in syncs]
                assert all(code == 0 for code, _data in answers), answers
                ready = sum(data[0][2] == "ready" for _code, data in answers[:2])
                stats = as_map(answers[2][1][0])
                assert stats.get(f"space0.{name}.ready_by_disconnect", 0) == ready, (ready, stats)
                assert stats[f"space0.{name}.tasks.ready"] == ready
                if ready == 2:
                    break
                assert time.monotonic() < deadline, "the tasks did not come back"
    finally:
        poller.close()


def test_a_disconnect_hands_the_task_to_a_waiting_consumer(qserver, q, tube):
    taker = Q(qserver.port)
    tid = q.task("put", 0, tube, 0, 0, 0, 0, "d")[0]
    taker("take", 0, tube, 0)
    job, consumer = background_take(qserver.port, tube, 5)
    try:
        time.sleep(0.2)
        closed_at = time.perf_counter()
        taker.close()
        assert job.get(6) == [[tid, tube, "taken", "d"]]
        assert job.finished_at - closed_at < 0.5 + FSYNC_SLACK
        assert q.meta(0, tid)["cid"] == consumer.sid()
    finally:
        consumer.close()


def test_a_pending_take_of_a_closed_connection_takes_nothing(qserver, q, tube):
    doomed = RawIproto(qserver.port)
    doomed_sid = doomed.call("box.session.id", [])[0]
    doomed.send_many([("box.queue.take", [0, tube, 10])] * 3)
    time.sleep(0.1)
    job, consumer = background_take(qserver.port, tube, 5)  # waits behind the doomed ones
    try:
        time.sleep(0.2)
        doomed.close()
        time.sleep(0.2)
        put_at = time.perf_counter()
        first = q.task("put", 0, tube, 0, 0, 0, 0, "first")[0]
        assert job.get(6) == [[first, tube, "taken", "first"]]  # the wakeup was not lost
        assert job.finished_at - put_at < 0.2 + FSYNC_SLACK
        second = q.task("put", 0, tube, 0, 0, 0, 0, "second")[0]
        time.sleep(0.3)
        m = q.meta(0, second)
        assert (m["status"], m["cid"], m["ctaken"]) == ("ready", 0, 0)
        assert q.meta(0, first)["cid"] == consumer.sid() != doomed_sid
        assert q.stats(0, tube)[f"space0.{tube}.take"] == 1
    finally:
        consumer.close()


def test_session_ids_are_distinct_per_connection(qserver):
    conns = [Q(qserver.port) for _ in range(5)]
    try:
        sids = [c.sid() for c in conns]
        assert len(set(sids)) == 5 and all(s > 0 for s in sids)
        assert sids == sorted(sids)
    finally:
        for c in conns:
            c.close()


# -- concurrency ------------------------------------------------------------------------------------------


def test_many_blocking_takes_on_one_connection(qserver, q, tube):
    raw = RawIproto(qserver.port)
    try:
        sid = raw.call("box.session.id", [])[0]
        syncs = set(raw.send_many([("box.queue.take", [0, tube, 20])] * 300))
        assert raw.receive(0.3) is None  # all of them wait
        # the connection still answers other requests meanwhile
        assert raw.call("box.session.id", []) == [sid]

        answers: dict[int, Any] = {}

        def collect(n: int) -> None:
            deadline = time.monotonic() + 5
            while len(answers) < n and time.monotonic() < deadline:
                got = raw.receive(deadline - time.monotonic())
                if got is not None and got[0] in syncs:
                    assert got[1] == 0, got
                    answers[got[0]] = got[2]

        puts = [q.task("put", 0, tube, 0, 0, 0, 0, i)[0] for i in range(120)]
        collect(120)
        assert len(answers) == 120
        assert raw.receive(0.3) is None  # one waiter per task, no more
        puts += [q.task("put", 0, tube, 0, 0, 0, 0, i)[0] for i in range(120, 300)]
        collect(300)
        assert set(answers) == syncs
        taken = [a[0] for a in answers.values()]
        assert all(len(a) == 1 and a[0][1:3] == [tube, "taken"] for a in answers.values())
        assert sorted(t[0] for t in taken) == sorted(puts)
        assert {q.meta(0, t)["cid"] for t in puts} == {sid}
        ack_syncs = raw.send_many([("box.queue.ack", [0, t]) for t in puts])
        for s in ack_syncs:
            code, data = raw.wait_for(s)
            assert code == 0 and data[0][2] == "taken"
        assert q.stats(0, tube)[f"space0.{tube}.tasks.total"] == 0
    finally:
        raw.close()


def test_a_put_wakes_one_waiter_per_task_across_connections(qserver, q, tube):
    consumers = [Q(qserver.port) for _ in range(8)]
    try:
        started = time.perf_counter()
        jobs = [Background(c, "take", 0, tube, 2.0) for c in consumers]
        time.sleep(0.3)
        ids = [q.task("put", 0, tube, 0, 0, 0, 0, i)[0] for i in range(3)]
        results = [job.get(5) for job in jobs]
        got = [r[0][0] for r in results if r]
        assert sorted(got) == sorted(ids)
        for job, result in zip(jobs, results, strict=True):
            if result:
                assert job.finished_at - started < 1.0
            else:
                assert 1.95 <= job.finished_at - started <= 2.6
        s = q.stats(0, tube)
        assert s[f"space0.{tube}.take"] == 3 and s[f"space0.{tube}.take_timeout"] == 5
    finally:
        for c in consumers:
            c.close()


def test_producers_and_consumers_take_every_task_exactly_once(qserver, tube):
    raw_producers, raw_window, per_raw_producer = 5, 200, 500
    connector_producers, per_connector_producer = 4, 50
    raw_consumers, raw_takes = 5, 200
    connector_consumers = 4
    total = raw_producers * per_raw_producer + connector_producers * per_connector_producer
    lock = threading.Lock()
    put: dict[str, list[Any]] = {}
    taken: list[tuple[str, list[Any]]] = []
    acked = [0]
    all_taken = threading.Event()

    def record_take(task: list[Any]) -> None:
        with lock:
            taken.append((task[0], task[3:]))
            if len(taken) >= total:
                all_taken.set()

    def raw_producer(n: int) -> None:
        c = RawIproto(qserver.port)
        try:
            inflight: dict[int, list[Any]] = {}
            sent = 0
            while sent < per_raw_producer or inflight:
                while len(inflight) < raw_window and sent < per_raw_producer:
                    data = [f"raw{n}", sent]
                    inflight[c.send_call("box.queue.put", [0, tube, 0, 0, 0, 0, *data])] = data
                    sent += 1
                answer = c.receive(10)
                assert answer is not None, "a put got no answer within 10 s"
                sync, code, body = answer
                assert code == 0, body
                data = inflight.pop(sync)
                assert body[0][2:] == ["ready", *data]
                with lock:
                    put[body[0][0]] = data
        finally:
            c.close()

    def connector_producer(n: int) -> None:
        c = Q(qserver.port, prefix="queue.")
        try:
            for i in range(per_connector_producer):
                task = c.task("put", 0, tube, 0, 0, 0, 0, f"conn{n}", i)
                with lock:
                    put[task[0]] = [f"conn{n}", i]
        finally:
            c.close()

    def raw_consumer() -> None:
        c = RawIproto(qserver.port)
        try:
            takes = set(c.send_many([("box.queue.take", [0, tube, 10])] * raw_takes))
            acks: set[int] = set()
            while not (all_taken.is_set() and not acks):
                answer = c.receive(0.2)
                if answer is None:
                    continue
                sync, code, body = answer
                assert code == 0, body
                if sync in takes:
                    takes.discard(sync)
                    if body:
                        record_take(list(body[0]))
                        acks.add(c.send_call("box.queue.ack", [0, body[0][0]]))
                    if not all_taken.is_set():
                        takes.add(c.send_call("box.queue.take", [0, tube, 10]))
                else:
                    acks.remove(sync)
                    with lock:
                        acked[0] += 1
        finally:
            c.close()

    def connector_consumer() -> None:
        c = Q(qserver.port)
        try:
            while not all_taken.is_set():
                result = c("take", 0, tube, 0.2)
                if result:
                    record_take(list(result[0]))
                    c("ack", 0, result[0][0])
                    with lock:
                        acked[0] += 1
        finally:
            c.close()

    started = time.monotonic()
    jobs = [Background(raw_consumer) for _ in range(raw_consumers)]
    jobs += [Background(connector_consumer) for _ in range(connector_consumers)]
    time.sleep(0.2)
    jobs += [Background(raw_producer, n) for n in range(raw_producers)]
    jobs += [Background(connector_producer, n) for n in range(connector_producers)]
    for job in jobs:
        job.get(40)
    elapsed = time.monotonic() - started
    assert len(put) == total
    ids = [t for t, _ in taken]
    assert len(ids) == total and len(set(ids)) == total  # every task taken exactly once
    assert set(ids) == set(put)
    assert all(put[t] == data for t, data in taken)
    assert acked[0] == total
    assert elapsed < 30
    checker = Q(qserver.port)
    try:
        s = checker.stats(0, tube)
    finally:
        checker.close()
    p = f"space0.{tube}."
    assert (s[p + "put"], s[p + "take"], s[p + "ack"], s[p + "tasks.total"]) == (total, total, total, 0)


# -- restart ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["kill", "term"])
def test_restart_keeps_tasks_and_frees_taken_ones(tmp_path, how):
    srv = ServerProcess(tmp_path / "srv", extra_config=QUEUE_CONFIG)
    srv.start()
    try:
        q, taker = Q(srv.port), Q(srv.port)
        tube, later, expiring, quiet = "main", "later", "expiring", "quiet"
        r = q.task("put", 0, tube, 0, 0, 0, 0, "r")[0]
        t = q.task("put", 0, tube, 0, 0, 0, 100, "t")[0]
        assert taker.task("take", 0, tube, 0)[0] == t
        b = q.task("put", 0, tube, 0, 0, 0, 100, "b")[0]
        taker("take", 0, tube, 0)
        taker("bury", 0, b)
        x = q.task("put", 0, tube, 0, 0, 0, 100, "x")[0]
        taker("take", 0, tube, 0)
        taker("done", 0, x, "result")
        d = q.task("put", 0, tube, 30, 0, 0, 0, "d")[0]
        acked = q.task("put", 0, tube, 0, 0, 0, 100, "acked")[0]
        taker("take", 0, tube, 0)
        taker("ack", 0, acked)
        quiet_id = q.task("put", 0, quiet, 0, 0, 0, 0, "q")[0]
        max_sid = max(q.sid(), taker.sid())
        rows = {row[0]: row for row in q.conn.select(0, []).data}
        # the two timed tubes last, so that their clocks run through the restart
        later_at = time.monotonic()
        later_id = q.task("put", 0, later, 2.0, 0, 0, 0, "later")[0]
        expiring_at = time.monotonic()
        expiring_id = q.task("put", 0, expiring, 0, 2.0, 0, 0, "e")[0]
        if how == "kill":
            srv.kill()  # the taker is still connected: its task stays taken in storage
        else:
            assert srv.stop() == 0
        q.close()
        taker.close()
        srv.start()

        q = Q(srv.port)
        # counters start again from nothing; tasks.* count what is stored (D10, spec 5.1)
        (flat,) = q("statistics", 0, tube)
        p = f"space0.{tube}."
        tasks = [p + "tasks.total", 5, p + "tasks.ready", 2, p + "tasks.delayed", 1, p + "tasks.taken", 0,
                 p + "tasks.buried", 1, p + "tasks.done", 1]
        if how == "kill":
            assert flat == [p + "ready_by_restart", 1, *tasks]
        else:
            # A graceful stop closes the connections first: the taker's task went back to ready
            # then (D11), and that counter died with the process; nothing is left taken at start.
            assert flat in ([], [p + "ready_by_restart", 1, *tasks])
        q("peek", 0, r)
        (flat,) = q("statistics", 0, tube)
        assert flat[-12:] == tasks and as_map(flat)[p + "peek"] == 1
        assert q("statistics", 0, quiet) == [[]]
        assert q.sid() > max_sid  # never reused (D10)

        m = q.meta(0, t)
        assert (m["status"], m["cid"], m["ctaken"]) == ("ready", 0, 1)
        (row,) = q.conn.select(0, [t]).data
        assert row[3] == row[7] + row[8]  # event = created + ttl
        assert row[4:6] == rows[t][4:6] and row[7:] == rows[t][7:]
        for tid in (r, b, x, d):
            assert q.conn.select(0, [tid]).data == [rows[tid]]
        assert q.task("peek", 0, x) == [x, tube, "done", "result"]
        assert q.conn.select(0, [acked]).data == []
        assert q.error("ack", 0, t) == (ER_PROC_LUA, "Task is not taken")
        assert [q.task("take", 0, tube, 0)[0] for _ in range(2)] == [t, r]
        assert q.task("peek", 0, quiet_id)[2] == "ready"

        # Monitors run from the start for every tube holding tasks (D10): nothing touches these
        # two tubes, yet the delayed task becomes ready and the other one expires on time.
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 4
        while len(seen) < 2 and time.monotonic() < deadline:
            if "later" not in seen and q.conn.select(0, [later_id]).data[0][2] == "r":
                seen["later"] = time.monotonic() - later_at
            if "expiring" not in seen and not q.conn.select(0, [expiring_id]).data:
                seen["expiring"] = time.monotonic() - expiring_at
            time.sleep(0.005)
        assert 1.99 <= seen["later"] <= 2.2 + FSYNC_SLACK, seen  # each wake is a write
        assert 1.99 <= seen["expiring"] <= 2.2 + FSYNC_SLACK, seen
        assert q.stats(0, expiring)[f"space0.{expiring}.ttl.ready"] == 1
        assert q.task("take", 0, later, 0) == [later_id, later, "taken", "later"]
        q.close()
    finally:
        srv.kill()


def test_kill_loses_no_acknowledged_change(tmp_path):
    srv = ServerProcess(tmp_path / "srv", extra_config=QUEUE_CONFIG)
    srv.start()
    try:
        q = Q(srv.port)
        ids = [q.task("put", 0, "durable", 0, 0, 0, 0, i)[0] for i in range(50)]
        for tid in ids[:20]:
            q("take", 0, "durable", 0)
            q("ack", 0, tid)
        for tid in ids[20:30]:
            q("take", 0, "durable", 0)
            q("bury", 0, tid)
        expected = {row[0]: row for row in q.conn.select(0, []).data}
        srv.kill()
        srv.start()
        q = Q(srv.port)
        assert {row[0]: row for row in q.conn.select(0, []).data} == expected
        assert len(expected) == 30
        assert q("statistics", 0, "durable") == [[]]  # nothing was taken at the kill: no counter
        assert [q.task("take", 0, "durable", 0)[3] for _ in range(20)] == list(range(30, 50))
        q.close()
    finally:
        srv.kill()


def test_concurrent_put_unique_from_many_connections_makes_one_task(qserver, tube):
    """put_unique runs as a call that waits (its tube's lock: look up, then insert); sixteen
    connections sending the same data at once all get the one task it made. trio asks a task that
    takes a lock for its root coroutine's state, which a compiled coroutine cannot tell: before
    calls got a Python root (boxqueue/task_roots.py) the calls failed or were never answered."""
    clients = [tarantool.Connection("127.0.0.1", qserver.port, socket_timeout=10) for _ in range(16)]
    answers: list[Any] = [None] * len(clients)
    start = threading.Barrier(len(clients))

    def put(i: int) -> None:
        start.wait()
        try:
            answers[i] = [clients[i].call("box.queue.put_unique", [0, tube, 0, 0, 0, 0, "same", k]).data
                          for k in range(5)]
        except Exception as exc:  # recorded: the assertion below names it
            answers[i] = exc

    threads = [threading.Thread(target=put, args=(i,)) for i in range(len(clients))]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        errors = [a for a in answers if not isinstance(a, list)]
        assert errors == []
        made = {task[0] for calls in answers for (task,) in calls}
        assert len(made) == 1, made
        (task_id,) = made
        assert clients[0].select(0, [tube, "r", "same"], index="put_unique").data[0][0] == task_id
    finally:
        for c in clients:
            c.close()
