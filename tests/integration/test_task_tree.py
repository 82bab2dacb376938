"""``kill -USR1`` writes what every task awaits to the log (for chasing a hang), and the server
goes on serving."""

import signal
import time

import tarantool

from tests.serverproc import ServerProcess


def test_sigusr1_logs_the_task_tree_and_changes_nothing(tmp_path):
    server = ServerProcess(tmp_path / "srv", read_only=False)
    server.start()
    try:
        server.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while "tasks at SIGUSR1" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        text = server.log()
        assert "tasks at SIGUSR1" in text
        assert "GroupCommitter.run" in text or "run (commit.py" in text, text[-3000:]
        conn = tarantool.Connection("127.0.0.1", server.port)
        assert conn.ping() is not None
        conn.close()
        assert server.stop() == 0  # and it still stops
    finally:
        server.kill()
