"""The admin console and the embedded Lua, against the real server over real sockets.

The YAML expectations in ``TARANTOOL_ANSWERS`` were captured from Debian's Tarantool 2.6.0
console (``require('console').listen``); ``test_reference_tarantool_prints_the_same`` re-checks
them against ``/usr/bin/tarantool`` where it is installed.
"""

from __future__ import annotations

import select
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import tarantool
import trio
from tarantool.error import DatabaseError

from tests.integration.console_answers import TARANTOOL_ANSWERS
from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.serverproc import ServerProcess, free_port

EMPTY = "---\n...\n"

CONFIG = (
    """
[lua]
time_limit_s = 2.0
memory_limit_bytes = 67108864
"""
    + QUEUE_SPACE_0
)


class Console:
    """A console client over a plain socket, as `nc` would be."""

    def __init__(self, port: int, delimiter: str = "") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.greeting = self._read_exactly(128)
        self.delimiter = delimiter
        self.buffer = b""

    def _read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def send(self, text: str) -> None:
        self.sock.sendall(text.encode())

    def answer(self) -> bytes:
        while b"\n...\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed before a whole answer")
            self.buffer += chunk
        end = self.buffer.index(b"\n...\n") + 5
        doc, self.buffer = self.buffer[:end], self.buffer[end:]
        return doc

    def run(self, statement: str) -> str:
        self.send(statement + self.delimiter + "\n")
        return self.answer().decode()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def lua_server(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("lua"), extra_config=CONFIG, admin_port=free_port())
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def console(lua_server):
    c = Console(lua_server.admin_port)
    yield c
    c.close()


@pytest.fixture
def conn(lua_server):
    c = tarantool.connect("127.0.0.1", lua_server.port)
    yield c
    c.close()


def unique(prefix: str) -> str:
    return f"{prefix}_{time.monotonic_ns()}"


# -- protocol ---------------------------------------------------------------------------------


def test_greeting_is_the_console_one(console):
    g = console.greeting
    assert len(g) == 128
    assert g[:10] == b"Tarantool " and g[:63].rstrip().endswith(b"(Lua console)")
    assert g[63:64] == b"\n" and g[127:] == b"\n"
    assert g[64:].startswith(b"type 'help' for interactive help")


@pytest.mark.parametrize(
    ("statement", "expected"), TARANTOOL_ANSWERS, ids=[c[0][:40] for c in TARANTOOL_ANSWERS]
)
def test_yaml_answers_are_tarantools(console, statement, expected):
    assert console.run(statement) == expected


def test_statements_without_results_and_globals(console):
    assert console.run("local a = 1") == EMPTY
    assert console.run("") == EMPTY
    name = unique("g")
    assert console.run(f"{name} = 41") == EMPTY
    other = Console(console.sock.getpeername()[1])  # globals are shared, as in Tarantool
    assert other.run(f"{name} + 1") == "---\n- 42\n...\n"
    other.close()


def test_delimiter_allows_multi_line_statements(console):
    assert console.run("\\set delimiter !") == EMPTY
    console.delimiter = "!"
    console.send("local s = 0\nfor i = 1, 10 do\n  s = s + i\nend\nreturn s!\n")
    assert console.answer() == b"---\n- 55\n...\n"
    assert console.run("require('console').delimiter('')") == EMPTY
    console.delimiter = ""
    assert console.run("1 + 1") == "---\n- 2\n...\n"


def test_crlf_lines_and_pipelined_statements(console):
    console.send("1\r\n2\r\n3\n")
    answers = [console.answer() for _ in range(3)]
    assert answers == [b"---\n- 1\n...\n", b"---\n- 2\n...\n", b"---\n- 3\n...\n"]


def test_commands(console):
    assert console.run("\\set output yaml") == "---\n- true\n...\n"
    assert console.run("\\set output lua").startswith("---\n- error: ")
    assert console.run("\\set language lua") == "---\n- true\n...\n"
    assert console.run("\\nosuch") == "---\n- error: Invalid command \\nosuch. Type \\help for help.\n...\n"
    console.send("\\q\n")
    assert console.sock.recv(100) == b""


def test_tilde_dot_closes(console):
    console.send("~.\n")
    assert console.sock.recv(100) == b""


def test_syntax_and_runtime_errors(console):
    assert console.run("x = ") == "---\n- error: '[string \"x = \"]:1: unexpected symbol near ''<eof>'''\n...\n"
    assert console.run("error('boom')") == "---\n- error: boom\n...\n"
    assert console.run("pcall(error, 'x')") == "---\n- false\n- x\n...\n"


def test_sandbox_has_no_os_exit_or_io(console):
    assert console.run("os.exit") == "---\n- null\n...\n"
    assert console.run("io") == "---\n- null\n...\n"
    assert console.run("require('ffi')") == "---\n- error: module 'ffi' not found\n...\n"
    assert console.run("string.dump, ('').dump") == "---\n- null\n- null\n...\n"
    assert console.run("loadstring(string.char(27) .. 'LJ')") == (
        "---\n- null\n- 'loadstring: bytecode is not accepted'\n...\n"
    )
    assert console.run("1") == "---\n- 1\n...\n"


# -- box --------------------------------------------------------------------------------------


def test_box_info_session_cfg(console, lua_server):
    lines = console.run(
        "box.info.version, box.info.ro, box.info.pid > 0, type(box.info.uptime), box.info.uuid"
    ).splitlines()
    assert lines[1].startswith("- 2.11.0") and lines[2:5] == ["- false", "- true", "- number"]
    assert len(lines[5]) == 2 + 36
    assert console.run("box.info().status") == "---\n- running\n...\n"
    assert console.run("box.session.id() > 0") == "---\n- true\n...\n"
    assert console.run("box.session.user()") == "---\n- admin\n...\n"
    assert console.run("box.cfg.listen") == f"---\n- 127.0.0.1:{lua_server.port}\n...\n"
    assert console.run("box.cfg.wal_mode") == "---\n- fsync\n...\n"
    assert console.run("box.cfg.nosuch") == "---\n- null\n...\n"
    assert console.run("box.cfg.listen = 1").startswith("---\n- error: ")
    assert console.run("box.cfg.listen") == f"---\n- 127.0.0.1:{lua_server.port}\n...\n"


def _number(answer: str) -> int:
    assert answer.startswith("---\n- ") and answer.endswith("\n...\n"), answer
    return int(answer[6:-5])


def test_box_stat_counts_requests(console, conn):
    conn.select("queue", limit=1)  # the connector loads its schema first: not counted below
    selects, errors = _number(console.run("box.stat().SELECT.total")), _number(console.run("box.stat().ERROR.total"))
    conn.select("queue", limit=1)
    conn.select("queue", limit=1)
    console.run("box.space.queue:select({}, {limit = 1})")
    with pytest.raises(DatabaseError):
        conn.eval("error('counted')")
    assert _number(console.run("box.stat().SELECT.total")) == selects + 3
    assert _number(console.run("box.stat().ERROR.total")) == errors + 1
    assert _number(console.run("box.stat().EVAL.total")) >= 1
    time.sleep(0.2)  # the rate is measured over at least 0.1 s, at most about 6
    for _ in range(60):
        conn.select("queue", limit=1)
    # 60 selects within the window: at least 60 / 6 per second
    assert _number(console.run("box.stat().SELECT.rps")) >= 8


def test_space_methods(console, conn):
    name = unique("sp")
    sp = f"box.space.{name}"
    fmt = "{{name = 'id', type = 'unsigned'}, {name = 'v', type = 'string'}}"
    assert console.run(f"s = box.schema.space.create('{name}', {{format = {fmt}}})") == EMPTY
    assert console.run("s:create_index('primary')").startswith("---\n- id: 0\n  name: primary\n")
    assert console.run("s:create_index('by_v', {unique = false, parts = {2, 'string'}})").startswith(
        "---\n- id: 1\n"
    )
    assert console.run(f"{sp}:insert{{1, 'a'}}") == "---\n- [1, 'a']\n...\n"
    assert console.run(f"{sp}:insert{{1, 'a'}}") == (
        f"---\n- error: Duplicate key exists in unique index 'primary' in space '{name}'\n...\n"
    )
    assert console.run(f"{sp}:replace{{2, 'b'}}") == "---\n- [2, 'b']\n...\n"
    assert console.run(f"{sp}:insert{{3, 'b'}}") == "---\n- [3, 'b']\n...\n"
    assert console.run(f"{sp}:select{{}}") == "---\n- - [1, 'a']\n  - [2, 'b']\n  - [3, 'b']\n...\n"
    assert console.run(f"{sp}:select({{2}}, {{iterator = 'GE', limit = 1}})") == "---\n- - [2, 'b']\n...\n"
    assert console.run(f"{sp}.index.by_v:select{{'b'}}") == "---\n- - [2, 'b']\n  - [3, 'b']\n...\n"
    assert console.run(f"{sp}.index.by_v:count('b')") == "---\n- 2\n...\n"
    assert console.run(f"{sp}:get(1)") == "---\n- [1, 'a']\n...\n"
    assert console.run(f"{sp}:get(9)") == "---\n- null\n...\n"
    assert console.run(f"{sp}:len(), {sp}:count()") == "---\n- 3\n- 3\n...\n"
    assert console.run(f"{sp}:update(1, {{{{'=', 2, 'z'}}}})") == "---\n- [1, 'z']\n...\n"
    assert console.run(f"{sp}:upsert({{4, 'u'}}, {{{{'=', 2, 'w'}}}})") == EMPTY
    assert console.run(f"{sp}:upsert({{4, 'u'}}, {{{{'=', 2, 'w'}}}})") == EMPTY
    assert console.run(f"{sp}:get{{4}}") == "---\n- [4, 'w']\n...\n"
    assert console.run(f"{sp}:delete(2)") == "---\n- [2, 'b']\n...\n"
    assert console.run(f"local n = 0 for _, t in {sp}:pairs() do n = n + t[1] end return n") == "---\n- 8\n...\n"
    assert console.run(f"{sp}.index.primary:max()[1], {sp}.index.primary:min()[1]") == "---\n- 4\n- 1\n...\n"
    assert console.run(f"{sp}:format()[2].name") == "---\n- v\n...\n"
    assert console.run(f"{sp}:insert{{'x'}}") == (
        "---\n- error: 'Tuple field 1 type does not match one required by operation: expected unsigned'\n...\n"
    )
    # the binary protocol sees the same data (its schema reload finds the new space)
    assert conn.select(name).data == [[1, "z"], [3, "b"], [4, "w"]]
    assert console.run(f"{sp}:truncate()") == EMPTY
    assert conn.select(name).data == []
    assert console.run(f"{sp}.index.by_v:drop()") == EMPTY
    assert console.run(f"{sp}.index.by_v") == "---\n- null\n...\n"
    assert console.run(f"{sp}:drop()") == EMPTY
    assert console.run(f"{sp} == nil") == "---\n- true\n...\n"


def test_ddl_of_another_session_shows_at_once(console, lua_server):
    name = unique("x")
    other = Console(lua_server.admin_port)
    try:
        assert console.run(f"box.space.{name} == nil") == "---\n- true\n...\n"
        other.run(f"box.schema.space.create('{name}'):create_index('pk')")
        assert console.run(f"box.space.{name}.index.pk.name") == "---\n- pk\n...\n"
        other.run(f"box.space.{name}:rename('{name}_2')")
        assert console.run(f"box.space.{name} == nil, box.space.{name}_2.name") == (
            f"---\n- true\n- {name}_2\n...\n"
        )
        other.run(f"box.space.{name}_2:drop()")
        assert console.run(f"box.space.{name}_2 == nil") == "---\n- true\n...\n"
    finally:
        other.close()


def test_schema_errors(console):
    assert console.run("box.schema.space.create('queue')") == "---\n- error: Space 'queue' already exists\n...\n"
    assert console.run("box.schema.space.create('queue', {if_not_exists = true}).id") == "---\n- 0\n...\n"
    assert console.run("box.space.queue:create_index('task_id')") == (
        "---\n- error: Index 'task_id' already exists\n...\n"
    )


def test_tuples(console):
    assert console.run("box.tuple.new{1, 'a'}:unpack()") == "---\n- 1\n- a\n...\n"
    assert console.run("#box.tuple.new{1, 2, 3}") == "---\n- 3\n...\n"
    assert console.run("box.tuple.new(1, 2)") == "---\n- [1, 2]\n...\n"


def test_users_created_and_granted_from_lua(console, lua_server):
    name = unique("u")
    assert console.run(f"box.schema.user.create('{name}', {{password = 'pw'}})") == EMPTY
    assert console.run(f"box.schema.user.exists('{name}')") == "---\n- true\n...\n"
    c = tarantool.connect("127.0.0.1", lua_server.port, user=name, password="pw")
    try:
        with pytest.raises(DatabaseError) as err:
            c.eval("return 1")
        assert err.value.args[0] == 42
        assert console.run(f"box.schema.user.grant('{name}', 'read,write,execute', 'universe')") == EMPTY
        assert c.eval("return 1").data == [1]
    finally:
        c.close()


# -- box.queue --------------------------------------------------------------------------------


def test_queue_from_the_console(console):
    tube = unique("t")
    put = console.run(f"box.queue.put(0, '{tube}', 0, 0, 0, 0, 'hello')")
    assert put.startswith("---\n- [") and f"'{tube}', 'ready', 'hello']" in put
    taken = console.run(f"queue.take(0, '{tube}', 1)")
    assert f"'{tube}', 'taken', 'hello']" in taken
    task_id = taken.split("'")[1]
    assert console.run(f"box.queue.ack(0, '{task_id}')") == taken  # the task as it was (Q28)
    assert console.run(f"box.space.queue:get('{task_id}')") == "---\n- null\n...\n"
    assert console.run(f"box.queue.meta(0, '{task_id}')") == "---\n- error: Task not found\n...\n"
    ack_count = console.run(
        f"local s = box.queue.statistics(0, '{tube}') "
        f"for i = 1, #s, 2 do if s[i] == 'space0.{tube}.ack' then return s[i + 1] end end"
    )
    assert ack_count in ("---\n- 1\n...\n", "---\n- '1'\n...\n")


def test_take_waits_without_blocking_the_server(console, conn):
    """A console take waits on the event loop: iproto is served meanwhile, and a put wakes it."""
    tube = unique("w")
    console.send(f"box.queue.take(0, '{tube}', 10)\n")
    time.sleep(0.3)
    started = time.monotonic()
    assert conn.eval("return 7").data == [7]
    conn.call("box.queue.put", [0, tube, 0, 0, 0, 0, "late"])
    answer = console.answer().decode()
    assert f"'{tube}', 'taken', 'late']" in answer
    assert time.monotonic() - started < 5


def test_take_times_out_with_nothing(console):
    tube = unique("e")
    started = time.monotonic()
    assert console.run(f"box.queue.take(0, '{tube}', 0.2)") == EMPTY
    assert 0.15 < time.monotonic() - started < 5


# -- EVAL and CALL ----------------------------------------------------------------------------


def test_eval(conn):
    assert conn.eval("return box.info.version").data[0].startswith("2.11.0")
    args = [1, "a", None, [1, 2], {"k": "v"}]
    assert conn.eval("return ...", args).data == args
    assert conn.eval("return 1, 'two', {3}").data == [1, "two", [3]]
    assert conn.eval("local x = 1").data == []
    assert conn.eval("return nil").data == [None]
    assert conn.eval("return box.tuple.new{1, 2}").data == [[1, 2]]
    assert conn.eval("return box.space.queue:len()").data[0] >= 0
    assert conn.eval("return 2^53, 0.5").data == [2**53, 0.5]
    with pytest.raises(DatabaseError) as err:
        conn.eval("\x1bLJ\x02")
    assert err.value.args == (32, "bytecode is not accepted")


def test_eval_errors(conn):
    with pytest.raises(DatabaseError) as err:
        conn.eval("return 1 +")
    assert err.value.args == (32, "eval:1: unexpected symbol near '<eof>'")
    with pytest.raises(DatabaseError) as err:
        conn.eval("error('x')")
    assert err.value.args == (32, "eval:1: x")
    with pytest.raises(DatabaseError) as err:
        conn.eval("box.error({code = 123, reason = 'mine'})")
    assert err.value.args == (123, "mine")
    with pytest.raises(DatabaseError) as err:
        conn.eval("return box.schema.space.create('queue')")
    assert err.value.args == (10, "Space 'queue' already exists")


def test_lua_functions_are_callable(console, conn):
    fn = unique("double")
    assert console.run(f"function {fn}(x) return x * 2, 'done' end") == EMPTY
    assert conn.call(fn, [21]).data == [42, "done"]
    assert fn in [row[2] for row in conn.select(297).data]  # listed in _vfunc
    c16 = tarantool.Connection("127.0.0.1", conn.port, call_16=True)
    assert c16.call(fn, [21]).data == [[42], ["done"]]
    c16.close()
    other = unique("fails")
    conn.eval(f"function {other}() error('broken') end")
    with pytest.raises(DatabaseError) as err:
        conn.call(other)
    assert err.value.args[0] == 32 and err.value.args[1].endswith("broken")
    console.run(f"{fn} = nil")  # gone with its global
    with pytest.raises(DatabaseError) as err:
        conn.call(fn, [1])
    assert err.value.args == (33, f"Procedure '{fn}' is not defined")
    assert fn not in [row[2] for row in conn.select(297).data]
    # a global that held something else becomes a function: callable although no new name appeared
    again = unique("late")
    conn.eval(f"{again} = 5")
    conn.eval(f"{again} = function() return 'late' end")
    assert conn.call(again).data == ["late"]


def test_functions_in_global_tables_are_callable(console, conn):
    app = unique("app")
    console.run(f"{app} = {{n = 5}}")
    console.run(f"function {app}.add(x, y) return x + y end")
    console.run(f"function {app}:scaled(x) return self.n * x end")
    assert conn.call(f"{app}.add", [2, 3]).data == [5]
    assert conn.call(f"{app}:scaled", [4]).data == [20]
    with pytest.raises(DatabaseError) as err:
        conn.call(f"{app}.nosuch")
    assert err.value.args == (33, f"Procedure '{app}.nosuch' is not defined")


def test_a_console_take_is_released_when_the_console_closes(lua_server, conn):
    tube = unique("rel")
    conn.call("box.queue.put", [0, tube, 0, 0, 0, 0, "x"])
    c = Console(lua_server.admin_port)
    assert f"'{tube}', 'taken', 'x']" in c.run(f"box.queue.take(0, '{tube}', 1)")
    c.close()
    deadline = time.monotonic() + 5
    while conn.select(0, [tube, "r"], index="tube_status").data == [] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(conn.select(0, [tube, "r"], index="tube_status").data) == 1  # back to ready


def test_read_only_port_refuses_writes_from_eval(lua_server):
    c = tarantool.connect("127.0.0.1", lua_server.ro_port)
    try:
        assert c.eval("return box.space.queue:len()").data[0] >= 0
        with pytest.raises(DatabaseError) as err:
            c.eval("return box.queue.put(0, 'ro', 0, 0, 0, 0, 'x')")
        assert err.value.args[0] == 7
        with pytest.raises(DatabaseError) as err:
            c.eval("box.schema.space.create('ro_space')")
        assert err.value.args[0] == 7
    finally:
        c.close()


# -- limits -----------------------------------------------------------------------------------

LIMIT_ERROR = "---\n- error: Lua time limit exceeded (2 s)\n...\n"


def test_runaway_script_is_stopped_while_others_are_served(console, conn):
    console.send("while true do end\n")
    time.sleep(0.2)
    assert conn.ping(notime=True) == "Success"
    assert conn.select("queue", limit=1) is not None
    other = Console(console.sock.getpeername()[1])
    assert other.greeting[:10] == b"Tarantool "  # a new console connection is accepted too
    other.close()
    # all that was answered while the loop still ran: its answer has not come yet
    assert select.select([console.sock], [], [], 0)[0] == []
    assert console.answer().decode() == LIMIT_ERROR
    assert console.run("1 + 1") == "---\n- 2\n...\n"


def eval_error(conn: tarantool.Connection, code: str, args: list | None = None) -> tuple:
    """The (code, message) an EVAL that must fail answers."""
    with pytest.raises(DatabaseError) as err:
        conn.eval(code, args or [])
    return err.value.args


class Background:
    """A request on its own connection in a thread, so the test can talk to the server meanwhile."""

    def __init__(self, port: int, code: str, args: list | None = None) -> None:
        self.conn = tarantool.connect("127.0.0.1", port)
        self.result: object = None
        self.error: DatabaseError | None = None
        self.thread = threading.Thread(target=self._run, args=(code, args or []), daemon=True)
        self.thread.start()

    def _run(self, code: str, args: list) -> None:
        try:
            self.result = self.conn.eval(code, args).data
        except DatabaseError as exc:
            self.error = exc

    def join(self, timeout: float = 30) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive()
        self.conn.close()


@pytest.mark.parametrize(
    ("runaway", "lua_meanwhile"),
    [
        ("while true do end", True),  # starts on the event loop, moves to the Lua thread
        ("pcall(function() while true do end end)", True),
        ("local co = coroutine.wrap(function() while true do end end) co()", True),
        # a comparator cannot yield: the Lua thread is its own until the limit, the loop is not
        ("table.sort({3, 2, 1}, function(a, b) while true do end end)", False),
    ],
)
def test_runaway_eval_is_stopped_while_others_are_served(lua_server, conn, runaway, lua_meanwhile):
    started = time.monotonic()
    runaway_job = Background(lua_server.port, runaway)
    time.sleep(0.3)
    for i in range(5):
        if lua_meanwhile:  # Lua from another connection runs meanwhile
            assert conn.eval("return ... + 1", [i]).data == [i + 1]
            assert conn.eval("return box.space.queue:len()").data[0] >= 0
        assert conn.ping(notime=True) == "Success"
        assert conn.select("queue", limit=1) is not None
        assert conn.call("box.session.id").data[0] > 0
    assert runaway_job.thread.is_alive()  # all that was answered while the runaway still ran
    runaway_job.join()
    assert runaway_job.error is not None
    assert runaway_job.error.args == (32, "Lua time limit exceeded (2 s)")
    assert time.monotonic() - started > 1.9  # it did run for its whole time limit
    assert conn.eval("return 'after'").data == ["after"]


def test_eval_take_waits_without_blocking_others(lua_server, conn):
    tube = unique("ev")
    taker = Background(lua_server.port, "return box.queue.take(0, ..., 10)", [tube])
    time.sleep(0.3)
    assert conn.eval("return 7").data == [7]
    assert taker.thread.is_alive()
    conn.call("box.queue.put", [0, tube, 0, 0, 0, 0, "for the waiting eval"])
    taker.join()
    assert taker.error is None
    assert taker.result[0][1:] == [tube, "taken", "for the waiting eval"]


def test_repeated_chunks_give_the_same_results(conn):
    """A repeated EVAL reuses its compiled chunk: locals start afresh, globals carry over as
    they would if it were compiled again, arguments and errors are each call's own."""
    name = unique("counter")
    chunk = f"local seen = {{}} seen[#seen + 1] = ... {name} = ({name} or 0) + 1 return #seen, ..., {name}"
    for i in range(1, 4):
        assert conn.eval(chunk, [f"arg{i}"]).data == [1, f"arg{i}", i]
    for _ in range(2):
        assert eval_error(conn, "error(...)", ["again"]) == (32, "eval:1: again")
        assert eval_error(conn, "return 1 +") == (32, "eval:1: unexpected symbol near '<eof>'")


def test_lua_that_calls_back_from_c_moves_and_keeps_lua_semantics(conn):
    """sort comparators, gsub callbacks, __tostring in format, xpcall handlers, user coroutines
    and long loops inside them: results as plain LuaJIT gives them."""
    assert conn.eval(
        "local t = {} for i = 1, 3000 do t[i] = (i * 7919) % 3001 end "
        "table.sort(t, function(a, b) return a > b end) return t[1], t[3000], #t"
    ).data == [3000, 1, 3000]
    assert conn.eval("return (string.gsub('a-b-c', '%a', function(c) return c:upper() end))").data == ["A-B-C"]
    assert conn.eval("return ('x'):rep(3):gsub('x', {x = 'y'})").data == ["yyy", 3]
    assert conn.eval(
        "local v = setmetatable({}, {__tostring = function() return 'V' end}) return string.format('%s!', v)"
    ).data == ["V!"]
    assert conn.eval(
        "return xpcall(function() error('e', 0) end, function(e) return e .. box.session.id() end)"
    ).data[:1] == [False]
    assert conn.eval("return xpcall(function() error('a') end, function() error('b') end)").data == [
        False, "error in error handling"]
    assert conn.eval(
        "local co = coroutine.wrap(function(a) local x = 0 for i = 1, 3e6 do x = x + 1 end "
        "local b = coroutine.yield(a + x) return b * 2, box.session.id() ~= nil end) "
        "return co(1), co(10)"
    ).data == [3000001, 20, True]
    assert conn.eval(
        "local co = coroutine.create(function() for i = 1, 2e6 do end coroutine.yield() return 'end' end) "
        "local a = {coroutine.resume(co)} local b = {coroutine.resume(co)} return #a, a[1], b[2]"
    ).data == [1, True, "end"]
    assert eval_error(conn, "table.sort(nil)") == (32, "eval:1: bad argument #1 to 'sort' (table expected, got nil)")
    assert eval_error(conn, "string.gsub('a', 'a', function() return box.space.queue:len() end)") == (
        32, "attempt to yield across C-call boundary")


def test_a_job_coroutine_cannot_be_resumed_by_user_code(conn):
    """Job coroutines are reused by the driver: one saved by a chunk stays out of reach."""
    name = unique("saved")
    assert conn.eval(f"{name} = coroutine.running() return coroutine.resume({name})").data == [
        False, "cannot resume non-suspended coroutine"]
    assert conn.eval(f"return coroutine.resume({name}, error, 'x')").data == [
        False, "cannot resume non-suspended coroutine"]
    assert conn.eval("return 1 + 1").data == [2]


def test_pcall_cannot_swallow_the_limit(console):
    started = time.monotonic()
    assert console.run("for i = 1, 100 do pcall(function() while true do end end) end") == LIMIT_ERROR
    assert time.monotonic() - started < 10


def test_a_huge_result_is_refused(console):
    answer = console.run("local t = {} for i = 1, 1100000 do t[i] = i end return t")
    assert answer == "---\n- error: a result of more than 1000000 values is refused\n...\n"
    assert console.run("1") == "---\n- 1\n...\n"


def test_print_goes_to_the_log(console, lua_server):
    marker = unique("printed")
    assert console.run(f"print('{marker}', 1, nil)") == EMPTY
    deadline = time.monotonic() + 5
    while f"{marker}\t1\tnil" not in lua_server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"{marker}\t1\tnil" in lua_server.log()


def test_allocation_bomb_is_stopped(console, conn):
    answer = console.run("local t = {} for i = 1, 1e9 do t[i] = string.rep('x', 64) .. i end")
    assert answer == "---\n- error: Lua memory limit exceeded (67108864 bytes)\n...\n"
    # the memory is given back: the next statements can allocate again
    assert console.run("#string.rep('y', 1000000)") == "---\n- 1000000\n...\n"
    assert conn.eval("return 5").data == [5]


def test_time_spent_waiting_does_not_count(console):
    tube = unique("slow")
    # 2.5 s of waiting in two takes is more than the 2 s limit, but it is not Lua run time
    answer = console.run(f"box.queue.take(0, '{tube}', 1.25) box.queue.take(0, '{tube}', 1.25) return 'ok'")
    assert answer == "---\n- ok\n...\n"


# -- restart ----------------------------------------------------------------------------------


def test_ddl_and_data_survive_a_restart(tmp_path):
    proc = ServerProcess(tmp_path / "srv", admin_port=free_port())
    proc.start()
    try:
        c = Console(proc.admin_port)
        created = c.run("box.schema.space.create('jobs', {format = {{'id', 'unsigned'}, {'body', 'string'}}}).id")
        assert created == "---\n- 512\n...\n"
        c.run("box.space.jobs:create_index('pk')")
        c.run("box.space.jobs:create_index('body', {parts = {'body'}, unique = false})")
        body = "function(n) return box.space.jobs:get(n)[2] .. '!' end"
        assert c.run(f"box.schema.func.create('shout', {{body = \"{body}\"}})") == EMPTY
        assert c.run("box.schema.func.create('named_only')") == EMPTY
        assert c.run("box.schema.func.create('shout', {body = 'function() end'})") == (
            "---\n- error: Function 'shout' already exists\n...\n"
        )
        assert c.run("box.schema.func.create('bad', {body = 'x +'})").startswith(
            "---\n- error: 'Failed to create function ''bad'': "
        )
        assert c.run("transient = function() return 1 end") == EMPTY
        assert c.run("box.space.jobs:insert{1, 'one'}") == "---\n- [1, 'one']\n...\n"
        c.close()
        proc.kill()  # kill -9: only what was committed may come back
        proc.start()
        c = Console(proc.admin_port)
        assert c.run("box.space.jobs:select{}") == "---\n- - [1, 'one']\n...\n"
        assert c.run("box.space.jobs.index.body:select{'one'}") == "---\n- - [1, 'one']\n...\n"
        assert c.run("box.space.jobs.index.body.parts[1].fieldno") == "---\n- 2\n...\n"
        assert c.run("shout(1)") == "---\n- one!\n...\n"
        assert c.run("box.schema.func.exists('named_only'), box.schema.func.exists('bad')") == (
            "---\n- true\n- false\n...\n"
        )
        assert c.run("transient") == "---\n- null\n...\n"  # plain globals live as long as the process
        conn = tarantool.connect("127.0.0.1", proc.port)
        assert conn.select("jobs", "one", index="body").data == [[1, "one"]]
        assert conn.call("shout", [1]).data == ["one!"]  # a persisted function is callable at once
        assert c.run("box.schema.func.drop('shout')") == EMPTY
        with pytest.raises(DatabaseError) as err:
            conn.call("shout", [1])
        assert err.value.args[0] == 33
        assert c.run("box.schema.func.drop('shout')") == "---\n- error: Function 'shout' does not exist\n...\n"
        conn.close()
        c.close()
    finally:
        proc.kill()


def test_users_and_grants_made_from_lua_survive_a_restart(tmp_path):
    proc = ServerProcess(tmp_path / "srv", admin_port=free_port())
    proc.start()
    try:
        c = Console(proc.admin_port)
        c.run("box.schema.space.create('notes', {format = {{'id', 'unsigned'}}}):create_index('pk')")
        c.run("box.space.notes:insert{7}")
        assert c.run("box.schema.user.create('carol', {password = 'pw'})") == EMPTY
        assert c.run("box.schema.user.grant('carol', 'read', 'space', 'notes')") == EMPTY
        assert c.run("box.schema.user.grant('carol', 'read', 'space', '_vspace')") == EMPTY
        assert c.run("box.schema.user.grant('carol', 'read', 'space', '_vindex')") == EMPTY
        assert c.run("box.schema.user.grant('admin', 'execute', 'function', 'anything')") == EMPTY
        c.close()
        proc.kill()  # kill -9: what the console was told is done must come back
        proc.start()
        c = Console(proc.admin_port)
        assert c.run("box.schema.user.exists('carol')") == "---\n- true\n...\n"
        c.close()
        conn = tarantool.connect("127.0.0.1", proc.port, user="carol", password="pw")
        assert conn.select("notes").data == [[7]]
        with pytest.raises(DatabaseError) as err:
            conn.insert("notes", [8])  # only read was granted
        assert err.value.args[0] == 42
        conn.close()
        with pytest.raises(DatabaseError) as err:
            tarantool.connect("127.0.0.1", proc.port, user="carol", password="wrong")
        assert "Incorrect password supplied for user 'carol'" in str(err.value)
    finally:
        proc.kill()


def test_sigterm_with_a_console_running_a_loop(tmp_path):
    proc = ServerProcess(tmp_path / "srv", admin_port=free_port(), extra_config="[lua]\ntime_limit_s = 2.0\n")
    proc.start()
    try:
        busy, idle = Console(proc.admin_port), Console(proc.admin_port)
        busy.send("while true do end\n")
        time.sleep(0.3)
        started = time.monotonic()
        assert proc.stop(timeout=20) == 0  # stops cleanly once the loop hits its limit
        assert time.monotonic() - started < 15
        busy.close()
        idle.close()
    finally:
        proc.kill()


# -- login ------------------------------------------------------------------------------------

USERS = """
[[users]]
name = "alice"
password = "secret"
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[users]]
name = "reader"
password = "r"
grants = [{ privileges = ["read"], object_type = "space", object_name = "jobs" }]

[[space]]
id = 512
name = "jobs"
indexes = [{name = "pk", type = "TREE", unique = true, parts = [{field = 0, type = "unsigned"}]}]
"""


def test_console_login_when_users_exist(tmp_path):
    proc = ServerProcess(tmp_path / "srv", admin_port=free_port(), extra_config=USERS)
    proc.start()
    try:
        c = Console(proc.admin_port)
        denied = (
            "---\n- error: 'Authentication required: \\login <user> <password> or require(''console'').login(''<user>'',\n"
            "    ''<password>'') first'\n...\n"
        )
        assert c.run("box.space.jobs:insert{1}") == denied
        assert c.run("os") == denied
        # what tarantoolctl sends first is accepted before login
        assert c.run("\\set output yaml") == "---\n- true\n...\n"
        assert c.run("\\login alice wrong") == "---\n- error: Incorrect password supplied for user 'alice'\n...\n"
        assert c.run("\\login nobody x") == "---\n- error: User 'nobody' is not found\n...\n"
        assert c.run("box.space.jobs:len()") == denied
        assert c.run("\\login alice secret") == "---\n- true\n...\n"
        assert c.run("box.session.user()") == "---\n- alice\n...\n"
        assert c.run("box.space.jobs:insert{1}") == "---\n- [1]\n...\n"
        c.close()
        r = Console(proc.admin_port)
        assert r.run("require(\"console\").delimiter(\"$EOF$\")") == EMPTY
        r.delimiter = "$EOF$"
        assert r.run("require('console').login('reader', 'r')") == "---\n- true\n...\n"
        assert r.run("box.space.jobs:select{}") == "---\n- - [1]\n...\n"
        assert r.run("box.space.jobs:insert{2}") == (
            "---\n- error: Write access to space 'jobs' is denied for user 'reader'\n...\n"
        )
        assert r.run("box.queue.statistics()") == (
            "---\n- error: Execute access to function 'box.queue.statistics' is denied for user 'reader'\n...\n"
        )
        assert r.run("box.schema.space.create('x')") == (
            "---\n- error: Write access to universe '' is denied for user 'reader'\n...\n"
        )
        r.close()
    finally:
        proc.kill()


def test_console_binds_loopback_in_the_shipped_config():
    text = (Path(__file__).resolve().parents[2] / "conf" / "boxqueue.toml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("admin_listen"))
    assert '"127.0.0.1:' in line


def test_unknown_lua_key_is_a_config_error(tmp_path):
    proc = ServerProcess(tmp_path / "srv", extra_config="[lua]\ntime_limit = 3\n")
    with pytest.raises(RuntimeError) as err:
        proc.start(timeout=15)
    assert "unknown key 'time_limit' in [lua]" in str(err.value)


# -- Tarantool's own clients, and Tarantool itself --------------------------------------------

needs_tarantool = pytest.mark.skipif(shutil.which("tarantool") is None, reason="Debian's tarantool is not installed")


@needs_tarantool
@pytest.mark.skipif(shutil.which("tarantoolctl") is None, reason="tarantoolctl is not installed")
def test_tarantoolctl_connect(lua_server):
    script = "x_from_tarantoolctl = 20\nreturn x_from_tarantoolctl + 1, box.space.queue.id\n"
    done = subprocess.run(
        ["tarantoolctl", "connect", f"127.0.0.1:{lua_server.admin_port}"],
        input=script.encode(),
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().startswith("---\n- 21\n- 0\n...\n")
    c = Console(lua_server.admin_port)  # what it defined is there for everyone
    assert c.run("x_from_tarantoolctl") == "---\n- 20\n...\n"
    c.close()


@needs_tarantool
def test_console_connect_from_tarantool(lua_server, tmp_path):
    """Tarantool's own `require('console').connect()`, the way tarantoolctl drives it."""
    script = tmp_path / "client.lua"
    script.write_text(
        "local console = require('console')\n"
        "console.on_start(function(self)\n"
        "    console.connect(arg[1])\n"
        "    io.write(self:eval('box.space.queue.id, 1 + 2'))\n"
        "    io.flush()\n"
        "    os.exit(0)\n"
        "end)\n"
        "console.start()\n"
    )
    done = subprocess.run(
        ["tarantool", str(script), f"127.0.0.1:{lua_server.admin_port}"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "---\n- 0\n- 3\n...\n"


@needs_tarantool
def test_console_login_from_tarantools_client(tmp_path):
    proc = ServerProcess(tmp_path / "srv", admin_port=free_port(), extra_config=USERS)
    proc.start()
    script = tmp_path / "client.lua"
    script.write_text(
        "local console = require('console')\n"
        "console.on_start(function(self)\n"
        "    console.connect(arg[1])\n"
        "    io.write(self:eval('box.session.user()'))\n"
        "    io.write(self:eval(\"require('console').login('alice', 'secret')\"))\n"
        "    io.write(self:eval('box.session.user()'))\n"
        "    io.flush()\n"
        "    os.exit(0)\n"
        "end)\n"
        "console.start()\n"
    )
    try:
        done = subprocess.run(
            ["tarantool", str(script), f"127.0.0.1:{proc.admin_port}"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
        )
        assert done.returncode == 0, done.stderr
        out = done.stdout.decode()
        assert out.startswith("---\n- error: 'Authentication required")
        assert out.endswith("---\n- true\n...\n---\n- alice\n...\n")
    finally:
        proc.kill()


@needs_tarantool
def test_reference_tarantool_prints_the_same(tmp_path):
    """The expectations above are Tarantool's: ask a real one."""
    port = free_port()
    script = tmp_path / "init.lua"
    script.write_text(
        f"box.cfg{{work_dir = '{tmp_path}', log = '{tmp_path}/tt.log'}}\n"
        f"require('console').listen('127.0.0.1:{port}')\n"
    )
    proc = subprocess.Popen(["tarantool", str(script)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                c = Console(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        for statement, expected in TARANTOOL_ANSWERS:
            assert c.run(statement) == expected, statement
        c.close()
    finally:
        proc.terminate()
        proc.wait(10)


async def test_console_sessions_do_not_wait_for_each_other(lua_server):
    """Two consoles: one waits in a take, the other keeps answering (trio client, real sockets)."""
    port = lua_server.admin_port

    async def open_console() -> trio.SocketStream:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        got = b""
        while len(got) < 128:
            got += await stream.receive_some(128 - len(got))
        return stream

    async def ask(stream: trio.SocketStream, line: str) -> bytes:
        await stream.send_all(line.encode() + b"\n")
        got = b""
        while not got.endswith(b"\n...\n"):
            got += await stream.receive_some(65536)
        return got

    waiting, other = await open_console(), await open_console()
    tube = unique("pair")
    result: list[bytes] = []

    async def wait_for_task() -> None:
        result.append(await ask(waiting, f"box.queue.take(0, '{tube}', 10)"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_task)
        await trio.sleep(0.3)
        with trio.fail_after(3):
            assert await ask(other, "10 * 10") == b"---\n- 100\n...\n"
            await ask(other, f"box.queue.put(0, '{tube}', 0, 0, 0, 0, 'x')")
    assert b"'taken', 'x']" in result[0]
    await waiting.aclose()
    await other.aclose()
