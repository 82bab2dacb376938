"""The server as a process: raw protocol edge cases, read-only port, restarts, kill -9, SIGTERM."""

import base64
import decimal
import socket
import threading
import time
import uuid
from pathlib import Path

import msgpack
import pytest
import tarantool
from tarantool.error import DatabaseError

from tests.integration.conftest import TARGET
from tests.serverproc import rss_kib

ours = pytest.mark.skipif(TARGET != "ours", reason="checks boxqueue's own process")


class RawClient:
    """A bare iproto client: frames requests by hand and reads whole responses."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.greeting = self._read(128)
        self.buffer = b""

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    @staticmethod
    def frame(header: dict, body: dict | None = None) -> bytes:
        payload = msgpack.packb(header) + (msgpack.packb(body) if body is not None else b"")
        return b"\xce" + len(payload).to_bytes(4, "big") + payload

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self) -> tuple[dict, dict]:
        prefix = self._read(5)
        assert prefix[0] == 0xCE
        payload = self._read(int.from_bytes(prefix[1:], "big"))
        unpacker = msgpack.Unpacker(
            raw=False, strict_map_key=False, unicode_errors="surrogateescape", use_list=False
        )
        unpacker.feed(payload)
        header, body = list(unpacker)
        return header, body

    def closed_by_server(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def test_greeting_is_128_bytes_with_a_salt(server):
    c = RawClient(server.port)
    line1, line2 = c.greeting[:64], c.greeting[64:]
    assert line1.startswith(b"Tarantool ") and b"(Binary)" in line1 and line1.endswith(b"\n")
    assert len(base64.b64decode(line2[:44])) == 32
    c.close()


def test_malformed_requests_get_errors_and_the_connection_survives(server):
    c = RawClient(server.port)
    # body is not a map
    c.send(c.frame({0: 1, 1: 11}, [1, 2]))
    header, body = c.response()
    assert header[0] == 0x8000 | 20 and header[1] == 11 and body[0x31] == "Invalid MsgPack - packet body"
    # header is not a map
    payload = msgpack.packb([1, 2])
    c.send(b"\xce" + len(payload).to_bytes(4, "big") + payload)
    header, body = c.response()
    assert header[0] == 0x8000 | 20 and header[1] == 0 and body[0x31] == "Invalid MsgPack - packet header"
    # wrong type in the body
    c.send(c.frame({0: 1, 1: 12}, {0x10: "512", 0x12: 1}))
    header, body = c.response()
    assert header[0] == 0x8000 | 20 and header[1] == 12
    # unknown request type
    c.send(c.frame({0: 99, 1: 13}, {}))
    header, body = c.response()
    assert header[0] == 0x8000 | 48 and body[0x31] == "Unknown request type 99"
    # missing mandatory limit
    c.send(c.frame({0: 1, 1: 14}, {0x10: 512}))
    header, body = c.response()
    assert header[0] == 0x8000 | 69 and body[0x31] == "Missing mandatory field 'limit' in request"
    # a SELECT needs its key, even an empty one, as in Tarantool 2.6 (with another index too)
    for sync, body_fields in ((16, {0x10: 512, 0x12: 10}), (17, {0x10: 512, 0x11: 1, 0x12: 10, 0x14: 2})):
        c.send(c.frame({0: 1, 1: sync}, body_fields))
        header, body = c.response()
        assert header[0] == 0x8000 | 69 and header[1] == sync
        assert body[0x31] == "Missing mandatory field 'key' in request"
    c.send(c.frame({0: 1, 1: 18}, {0x10: 512, 0x12: 10, 0x20: []}))  # an empty key: every tuple
    header, body = c.response()
    assert header[0] == 0 and header[1] == 18 and isinstance(body[0x30], tuple)  # (arrays decode as tuples)
    # still serving
    c.send(c.frame({0: 64, 1: 15}))
    header, body = c.response()
    assert header[0] == 0 and header[1] == 15 and body == {}
    c.close()


def test_headers_are_checked_as_tarantool_checks_them(server):
    """Tarantool's xrow_header_decode: keys it knows, each with the type it expects; the error
    carries the sync read before the fault (0 when it came first)."""
    c = RawClient(server.port)
    bad_header = (0x8000 | 20, "Invalid MsgPack - packet header")
    cases = [
        ({0: 64, 1: 21, 0x7F: 1}, 21),  # a key Tarantool does not know, after the sync
        ({0x7F: 1, 0: 64, 1: 22}, 0),  # the same key first
        ({0: "ping", 1: 23}, 0),  # a request type that is a string
        ({0: -1, 1: 24}, 0),  # a negative request type
        ({0: 64, 1: -25}, 0),  # a negative sync
        ({0: 64, 1: 26, 5: "x"}, 26),  # a schema version that is a string
        ({0: 64, 1: 27, 0x30: [1]}, 27),  # a key Tarantool knows only in bodies
    ]
    for header_map, sync in cases:
        c.send(c.frame(header_map))
        header, body = c.response()
        assert (header[0], body[0x31]) == bad_header, header_map
        assert header[1] == sync, header_map
    c.send(c.frame({0: 64, 1: 28, 4: 1.5}))  # a timestamp, a double: a key Tarantool accepts
    header, _ = c.response()
    assert header[0] == 0 and header[1] == 28
    c.close()


def test_upsert_needs_its_operations_and_hash_keys_their_part_count(server):
    c = RawClient(server.port)
    c.send(c.frame({0: 9, 1: 31}, {0x10: 512, 0x21: [9_000_001, "no ops"]}))
    header, body = c.response()
    assert header[0] == 0x8000 | 69 and body[0x31] == "Missing mandatory field 'operations' in request"
    c.send(c.frame({0: 1, 1: 32}, {0x10: 512, 0x11: 0, 0x12: 1, 0x14: 0, 0x20: [9_000_001]}))
    header, body = c.response()
    assert header[0] == 0 and len(body[0x30]) == 0  # nothing was inserted
    c.send(c.frame({0: 1, 1: 33}, {0x10: 513, 0x11: 0, 0x12: 1, 0x14: 0, 0x20: ["a", "b"]}))
    header, body = c.response()
    assert header[0] == 0x8000 | 31 and body[0x31] == "Invalid key part count (expected [0..1], got 2)"
    c.send(c.frame({0: 1, 1: 34}, {0x10: 513, 0x11: 0, 0x12: 1, 0x14: 0, 0x20: []}))
    header, body = c.response()
    assert header[0] == 0x8000 | 136  # a partial key of a HASH index
    c.close()


def test_bad_length_prefix_closes_only_that_connection(server):
    victim, bystander = RawClient(server.port), RawClient(server.port)
    victim.send(b"\xa5hello")
    header, body = victim.response()
    assert header[0] == 0x8000 | 20 and body[0x31] == "Invalid MsgPack - packet length"
    assert victim.closed_by_server()
    bystander.send(bystander.frame({0: 64, 1: 1}))
    assert bystander.response()[0][0] == 0
    victim.close()
    bystander.close()


@ours
def test_huge_length_prefix_is_refused_without_buffering(server):
    c = RawClient(server.port)
    c.send(b"\xce\x7f\xff\xff\xff" + b"x" * 1000)
    header, _body = c.response()
    assert header[0] == 0x8000 | 20
    assert c.closed_by_server()
    c.close()


def test_schema_version_mismatch(server):
    c = RawClient(server.port)
    c.send(c.frame({0: 64, 1: 1}))
    current = c.response()[0][5]
    c.send(c.frame({0: 64, 1: 2, 5: current + 1000}))
    header, _body = c.response()
    assert header[0] == 0x8000 | 109 and header[5] == current
    c.send(c.frame({0: 64, 1: 3, 5: current}))
    assert c.response()[0][0] == 0
    c.close()


@ours
def test_id_negotiation(server):
    c = RawClient(server.port)
    c.send(c.frame({0: 73, 1: 5}, {0x54: 6, 0x55: [0, 1, 2, 3, 4, 5, 6]}))
    header, body = c.response()
    assert header[0] == 0
    assert body[0x54] >= 1 and body[0x55] == () and body[0x5B] == "chap-sha1"
    c.close()


def test_tuples_round_trip_byte_exact(server, conn):
    """A uint32-encoded integer, a str that is not UTF-8, a bin and a map with an array key."""
    raw_tuple = (
        b"\x95"
        + b"\xce\x00\x00\xa4\x31"  # 42033 as uint32, not the shortest form
        + b"\xa3\xff\xfeZ"  # str with bytes that are not UTF-8
        + b"\xc4\x02\x00\x01"  # bin
        + b"\x81\x92\x01\x02\xa1v"  # {[1, 2]: 'v'}
        + b"\xca\x3f\xc0\x00\x00"  # float32 1.5
    )
    c = RawClient(server.port)
    # space "test" (512): field 2 must be a string, and "\xff\xfeZ" is a str on the wire
    body = b"\x82\x10\xcd\x02\x00\x21" + raw_tuple
    header = msgpack.packb({0: 2, 1: 1})
    c.send(b"\xce" + (len(header) + len(body)).to_bytes(4, "big") + header + body)
    assert c.response()[0][0] == 0
    # Read back with an ALL scan of the (truncated) space, not by key: Tarantool 2.6 stores the
    # tuple as sent but does not find it by the key 42033 when that key is encoded as a uint32
    # (checked against 2.6.0: get{42033} answers nothing while a scan returns the tuple).
    c.send(c.frame({0: 1, 1: 2}, {0x10: 512, 0x12: 1, 0x14: 2, 0x20: []}))
    prefix = c._read(5)
    payload = c._read(int.from_bytes(prefix[1:], "big"))
    assert payload.endswith(raw_tuple)
    c.close()


def test_pipelined_requests_are_answered_by_sync(server):
    """A ping sent after writes is answered before them: writes wait for the flush, pings don't."""
    c = RawClient(server.port)
    data = b"".join(c.frame({0: 3, 1: 100 + i}, {0x10: 512, 0x21: [1000 + i, "w"]}) for i in range(50))
    data += c.frame({0: 64, 1: 999})
    c.send(data)
    syncs = [c.response()[0][1] for _ in range(51)]
    assert sorted(syncs) == sorted([*range(100, 150), 999])
    if TARGET == "ours":
        assert syncs.index(999) < syncs.index(149)
    c.close()


def test_read_only_port(server):
    if TARGET != "ours":
        pytest.skip("Tarantool 2.x has no secondary port")
    writer = tarantool.connect("127.0.0.1", server.port)
    writer.replace("test", (31, "ro"))
    ro = tarantool.connect("127.0.0.1", server.ro_port)
    assert [list(t) for t in ro.select("test", 31)] == [[31, "ro"]]
    for attempt in (lambda: ro.insert("test", (32, "x")), lambda: ro.delete("test", 31),
                    lambda: ro.call("box.space.test:replace", [[33, "x"]])):
        with pytest.raises(DatabaseError) as err:
            attempt()
        assert err.value.args[:2] == (7, "Can't modify data on a read-only instance")
    assert ro.call("box.info").data[0]["ro"] is True
    assert writer.call("box.info").data[0]["ro"] is False
    ro.close()
    writer.close()


@ours
def test_restart_keeps_data_schema_and_session_ids(fresh_server):
    fresh_server.start()
    c = tarantool.connect("127.0.0.1", fresh_server.port)
    for i in range(200):
        c.insert("test", (i, f"name{i % 7}", {"i": i}))
    c.insert("typed", (1, -5, 2.5, 1.5, "s", True, b"\x00", "sc", uuid.UUID(int=7),
                       decimal.Decimal("1.25"), tarantool.Datetime(year=2024, month=1, day=2), [1], None))
    first_session = c.call("box.session.id").data[0]
    c.close()
    assert fresh_server.stop() == 0
    fresh_server.start()
    c = tarantool.connect("127.0.0.1", fresh_server.port)
    assert len(c.select("test")) == 200
    assert [t[0] for t in c.select("test", ["name3"], index="name")] == [i for i in range(200) if i % 7 == 3]
    [typed] = c.select("typed", 1)
    assert typed[8] == uuid.UUID(int=7) and typed[9] == decimal.Decimal("1.25")
    assert typed[10] == tarantool.Datetime(year=2024, month=1, day=2)
    assert c.call("box.session.id").data[0] > first_session
    c.close()


@ours
def test_kill_9_during_writes_loses_no_acknowledged_write(fresh_server):
    fresh_server.start()
    acknowledged: list[int] = []
    stop = threading.Event()

    def writer(offset: int) -> None:
        try:
            c = tarantool.connect("127.0.0.1", fresh_server.port)
            i = offset
            while not stop.is_set():
                c.insert("test", (i, "durable"))
                acknowledged.append(i)
                i += 4
        except Exception:  # the server died under us: expected
            pass

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    fresh_server.kill()
    stop.set()
    for t in threads:
        t.join(10)
    assert len(acknowledged) > 50
    fresh_server.start()
    c = tarantool.connect("127.0.0.1", fresh_server.port)
    stored = {t[0] for t in c.select("test")}
    missing = [i for i in acknowledged if i not in stored]
    assert missing == []
    c.close()


@ours
def test_sigterm_finishes_in_flight_writes_and_exits_zero(fresh_server):
    fresh_server.start()
    c = RawClient(fresh_server.port)
    c.send(b"".join(c.frame({0: 3, 1: i}, {0x10: 512, 0x21: [i, "x"]}) for i in range(200)))
    first = c.response()
    assert first[0][0] == 0
    assert fresh_server.stop() == 0
    # every write the client saw acknowledged survives
    got = 1
    try:
        while True:
            header, _ = c.response()
            assert header[0] == 0
            got += 1
    except (ConnectionError, OSError):
        pass
    c.close()
    fresh_server.start()
    conn = tarantool.connect("127.0.0.1", fresh_server.port)
    assert len(conn.select("test")) >= got
    conn.close()


@ours
def test_bad_config_stops_with_file_line_and_key(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "bad.toml"
    cfg.write_text('data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:1"\nlisen = "x"\n')
    proc = subprocess.run([sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "bad.toml:4" in proc.stderr and "lisen" in proc.stderr
    assert "Traceback" not in proc.stderr


@ours
def test_check_config_and_version_start_nothing(tmp_path):
    import subprocess
    import sys
    import tomllib

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "boxqueue.cli", *args], capture_output=True, text=True,
                              timeout=30, cwd=tmp_path)

    shipped = Path(__file__).parents[2] / "conf" / "boxqueue.toml"
    ok = run("check-config", str(shipped))
    assert ok.returncode == 0 and ok.stdout.strip() == f"{shipped}: ok", ok
    assert not (tmp_path / "data").exists() and not list(tmp_path.iterdir())  # nothing made, nothing opened
    bad = tmp_path / "bad.toml"
    bad.write_text('[zaqar]\nauth = "token"\ntokens = [{ token = "a", project = "p", admin = "yes" }]\n')
    refused = run("check-config", str(bad))
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f'boxqueue: {bad}:3: zaqar.tokens[0].admin must be true or false, not "yes"'), refused
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    shown = run("--version")
    assert shown.returncode == 0 and shown.stdout.strip() == f"boxqueue {project['version']}"


@ours
def test_serve_refuses_compiled_modules_older_than_their_sources(tmp_path, monkeypatch, capsys):
    """What would run must be what the sources say (as the test suite itself checks)."""
    from boxqueue import cli

    monkeypatch.setattr(cli, "stale_extensions", lambda built_here_only: ["boxqueue.tubes.engine_base"])
    cfg = tmp_path / "c.toml"
    cfg.write_text('data_dir = "d"\n')
    assert cli.main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "older than their sources" in err and "boxqueue.tubes.engine_base" in err, err
    assert not (tmp_path / "d").exists()  # refused before anything was opened


@ours
def test_session_ids_are_positive_and_distinct(server):
    ids = set()
    for _ in range(5):
        c = tarantool.connect("127.0.0.1", server.port)
        ids.add(c.call("box.session.id").data[0])
        c.close()
    assert len(ids) == 5 and min(ids) > 0


@ours
def test_a_tarantool_15_cfg_alone(tmp_path):
    """`boxqueue serve --config x.cfg`: the 1.5 ports, and space 0 from its `space = [...]`."""
    from tests.serverproc import free_port, wait_for_greeting

    port, ro_port = free_port(), free_port()
    cfg = tmp_path / "queue.cfg"
    cfg.write_text(
        f"primary_port = {port}\nsecondary_port = {ro_port}\nslab_alloc_arena = 0.1\n"
        "space[0].enabled = 1\n"
        'space[0].index[0].type = "HASH"\nspace[0].index[0].unique = 1\n'
        'space[0].index[0].key_field[0].fieldno = 0\nspace[0].index[0].key_field[0].type = "STR"\n'
        'space[0].index[1].type = "TREE"\nspace[0].index[1].unique = 0\n'
        'space[0].index[1].key_field[0].fieldno = 1\nspace[0].index[1].key_field[0].type = "NUM64"\n'
    )
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(cfg)],
                            stderr=subprocess.PIPE)
    try:
        wait_for_greeting(port, 30, proc)
        c = tarantool.connect("127.0.0.1", port)
        assert c.insert(0, ("k", 5)).data == [["k", 5]]
        assert c.select(0, [5], index=1).data == [["k", 5]]
        [row] = c.select(289, [0, 1])
        assert row[2:4] == ["i1", "tree"] and [list(p) for p in row[5]] == [[1, "unsigned"]]
        c.close()
        ro = tarantool.connect("127.0.0.1", ro_port)
        with pytest.raises(DatabaseError) as err:
            ro.insert(0, ("j", 1))
        assert err.value.args[0] == 7
        ro.close()
    finally:
        proc.terminate()
        proc.wait(15)
    assert (tmp_path / "data").is_dir()


@ours
def test_port_in_use_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:{port}"\n')
        proc = subprocess.run([sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(cfg)],
                              capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "cannot listen" in proc.stderr and "Traceback" not in proc.stderr


@ours
def test_a_second_process_on_the_same_data_dir_is_refused(fresh_server):
    import subprocess
    import sys

    fresh_server.start()
    other = fresh_server.workdir / "other.toml"
    other.write_text('data_dir = "data"\n[iproto]\nlisten = "127.0.0.1:0"\n')
    proc = subprocess.run([sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(other)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "in use by another boxqueue process" in proc.stderr


@ours
def test_a_client_that_never_reads_is_pushed_back(fresh_server):
    """Pipelined requests whose answers are never read: the server stops reading that socket
    instead of buffering answers, keeps serving others, and its memory stays bounded."""
    fresh_server.start()
    pid = fresh_server.proc.pid
    before = rss_kib(pid)
    greedy = RawClient(fresh_server.port)
    greedy.sock.settimeout(0.5)
    select = greedy.frame({0: 1, 1: 7}, {0x10: 512, 0x12: 100, 0x14: 2, 0x20: []})
    conn = tarantool.connect("127.0.0.1", fresh_server.port)
    for i in range(100):
        conn.insert("test", (i, "x" * 200))
    chunk = select * 2000
    sent = 0
    try:
        for _ in range(2000):  # up to ~100 MB of requests, each answered with ~23 KB
            greedy.sock.sendall(chunk)
            sent += len(chunk)
    except TimeoutError:
        pass
    assert sent < 2000 * len(chunk), "the server kept reading without pushing back"
    assert conn.ping(notime=True) == "Success"
    assert len(conn.select("test", [], iterator=2, limit=5)) == 5
    grown_mib = (rss_kib(pid) - before) / 1024
    assert grown_mib < 200, f"server memory grew by {grown_mib:.0f} MiB"
    conn.close()
    greedy.close()
