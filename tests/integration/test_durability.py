"""Kill -9 under heavy pipelined write load, and during write-ahead log checkpoints: every write
the server acknowledged is there after the restart."""

import socket
import threading
import time

import msgpack
import pytest
import tarantool

from tests.integration.conftest import TARGET, TEST_SPACES
from tests.serverproc import ServerProcess

pytestmark = pytest.mark.skipif(TARGET != "ours", reason="kills boxqueue's own process")

REPLACE = 3
SPACE_TEST = 512


class PipelinedWriter(threading.Thread):
    """One connection that keeps ``inflight`` REPLACEs of fresh ids outstanding; the sync of a
    request is its id, so an answer with code 0 names the id it acknowledged."""

    def __init__(self, port: int, first_id: int, step: int, inflight: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port, self.next_id, self.step, self.inflight, self.stop = port, first_id, step, inflight, stop
        self.acked: list[int] = []
        self.errors: list[object] = []

    def _requests(self, n: int) -> bytes:
        out = []
        for _ in range(n):
            i = self.next_id
            self.next_id += self.step
            payload = msgpack.packb({0: REPLACE, 1: i}) + msgpack.packb(
                {0x10: SPACE_TEST, 0x21: [i, "durable", "p" * 40]}
            )
            out.append(b"\xce" + len(payload).to_bytes(4, "big") + payload)
        return b"".join(out)

    def run(self) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            greeting = b""
            while len(greeting) < 128:
                greeting += sock.recv(128 - len(greeting))
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
            sock.sendall(self._requests(self.inflight))
            parts: list[object] = []
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    return
                unpacker.feed(data)
                answered = 0
                for obj in unpacker:
                    parts.append(obj)
                    if len(parts) == 3:  # length, header, body
                        _length, header, body = parts
                        parts = []
                        answered += 1
                        if header[0] == 0:
                            self.acked.append(header[1])
                        else:
                            self.errors.append(body)
                if answered and not self.stop.is_set():
                    sock.sendall(self._requests(answered))
        except OSError:  # the server was killed under us: expected
            pass


def load_and_kill(srv: ServerProcess, first_id: int, seconds: float, on_kill=None) -> list[int]:
    """Heavy write load for ``seconds``, then SIGKILL; the ids acknowledged before the kill."""
    stop = threading.Event()
    writers = [PipelinedWriter(srv.port, first_id + k, 4, 64, stop) for k in range(4)]
    for w in writers:
        w.start()
    time.sleep(seconds)
    srv.kill()
    if on_kill is not None:
        on_kill()
    stop.set()
    for w in writers:
        w.join(30)
    for w in writers:
        assert w.errors == [], w.errors[:3]
    return [i for w in writers for i in w.acked]


def stored_ids(srv: ServerProcess) -> set[int]:
    c = tarantool.connect("127.0.0.1", srv.port)
    try:
        return {t[0] for t in c.select("test", [], limit=2**31)}
    finally:
        c.close()


@pytest.mark.parametrize("mode", ["fsync", "write"])  # the modes that promise a kill loses nothing
def test_kill_9_under_pipelined_load_loses_no_acknowledged_write(tmp_path, mode):
    srv = ServerProcess(tmp_path / "srv", extra_config=TEST_SPACES, wal_mode=mode)
    try:
        srv.start()
        acked = load_and_kill(srv, 1, 2.0)
        assert len(acked) > 1000
        srv.start()
        stored = stored_ids(srv)
        missing = [i for i in acked if i not in stored]
        assert missing == []
    finally:
        srv.kill()


def test_kill_9_during_checkpoints_loses_no_acknowledged_write(tmp_path):
    """Checkpoints back to back (a tiny interval and size threshold), killed again and again: a
    kill that finds more than one log segment came between a checkpoint's switch to a new segment
    and its deletion of the old ones, i.e. while it flushed LMDB. Where a kill lands is chance: on
    a loaded machine six rounds once all found one segment, so rounds go on (at most 14) until two
    kills have found more."""
    srv = ServerProcess(
        tmp_path / "srv",
        extra_config=TEST_SPACES,
        wal_config="checkpoint_interval_s = 0.001\ncheckpoint_bytes = 4096",
    )
    wal_dir = srv.workdir / "data" / "wal"
    segments_at_kill: list[int] = []
    acked: list[int] = []
    try:
        for round_no in range(14):
            srv.start()
            acked += load_and_kill(
                srv,
                1 + round_no * 10_000_000,
                1.0,
                on_kill=lambda: segments_at_kill.append(len(list(wal_dir.glob("*.wal")))),
            )
            if round_no >= 2 and sum(n > 1 for n in segments_at_kill) >= 2:
                break
        srv.start()
        stored = stored_ids(srv)
        assert [i for i in acked if i not in stored] == []
        assert len(acked) > 1000
        assert sum(n > 1 for n in segments_at_kill) >= 1, segments_at_kill
        assert "checkpoint failed" not in srv.log()
    finally:
        srv.kill()


def test_a_damaged_log_stops_the_server_with_a_clear_message(tmp_path):
    srv = ServerProcess(tmp_path / "srv", extra_config=TEST_SPACES, wal_config="checkpoint_interval_s = 3600")
    try:
        srv.start()
        c = tarantool.connect("127.0.0.1", srv.port)
        for i in range(20):  # one group each: a log of many records
            c.replace("test", (i, "logged"))
        c.close()
        srv.kill()  # the log stays: no checkpoint has run since the start
        [segment] = sorted((srv.workdir / "data" / "wal").glob("*.wal"))
        data = bytearray(segment.read_bytes())
        data[8 + 20] ^= 0xFF  # the first record's payload; valid records follow it
        segment.write_bytes(bytes(data))
        with pytest.raises(RuntimeError, match="exited with 1"):
            srv.start(timeout=30)
        log = srv.log()
        assert "damaged record at byte 8" in log and segment.name in log
        assert "Traceback" not in log
        assert segment.read_bytes() == bytes(data)  # nothing was deleted or rewritten
    finally:
        srv.kill()
