"""Start the real server as a subprocess on free loopback ports, for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free loopback port not handed out before by this process: the OS may give the port of
    a socket just closed again, and two listeners of one test server must not get the same."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_for_greeting(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None,
                      tls: ssl.SSLContext | None = None) -> bytes:
    """The listener's 128-byte greeting, read as soon as it answers (over TLS with ``tls``)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as raw:
                s = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls is not None else raw
                data = b""
                while len(data) < 128:
                    chunk = s.recv(128 - len(data))
                    if not chunk:
                        break
                    data += chunk
                if len(data) == 128:
                    return data
        except OSError as exc:
            last_error = exc
        time.sleep(0.05)
    raise RuntimeError(f"server did not answer on port {port}: {last_error}")


def rss_kib(pid: int) -> int:
    """The resident memory of process ``pid``, in KiB (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@dataclass
class ServerProcess:
    """A configured server in a directory of its own; start/stop/kill it as often as needed."""

    workdir: Path
    extra_config: str = ""
    wal_mode: str = "fsync"
    wal_config: str = ""  # more [wal] keys, one per line
    read_only: bool = True
    port: int = field(default_factory=free_port)
    ro_port: int = field(default_factory=free_port)
    admin_port: int | None = None  # set: the admin console listens there
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    tls_client: ssl.SSLContext | None = None  # the iproto listeners speak TLS: how to reach them

    @property
    def config_path(self) -> Path:
        return self.workdir / "boxqueue.toml"

    def write_config(self) -> None:
        ro = f'read_only_listen = "127.0.0.1:{self.ro_port}"\n' if self.read_only else ""
        if self.admin_port is not None:
            ro += f'admin_listen = "127.0.0.1:{self.admin_port}"\n'
        self.config_path.write_text(
            'data_dir = "data"\n'
            "[iproto]\n"
            f'listen = "127.0.0.1:{self.port}"\n'
            f"{ro}"
            "[wal]\n"
            f'mode = "{self.wal_mode}"\n'
            f"{self.wal_config}\n"
            f"{self.extra_config}\n"
        )

    def start(self, timeout: float = 30.0) -> None:
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process without waiting for its listeners (see :meth:`wait_ready`)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.config_path.exists():
            self.write_config()
        self.log_path = self.workdir / "server.log"
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps its own copy; closed below
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(self.config_path)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        try:
            wait_for_greeting(self.port, timeout, self.proc, self.tls_client)
            if self.admin_port is not None:  # listeners start one after the other
                wait_for_greeting(self.admin_port, timeout, self.proc, self.tls_client)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n--- server log ---\n{self.log()}") from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()
