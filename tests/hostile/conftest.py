"""One real server for the attack suite, with every HTTP and gRPC listener on free loopback ports
and short deadlines (so that the defences act within a siege), and its RSS once it has started
and served a little: the base of every siege's memory bound."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import pytest

from tests.serverproc import ServerProcess, free_port, rss_kib

HTTP_DEADLINES = "header_timeout_s = 2.0\nkeep_alive_timeout_s = 3.0\nbody_timeout_s = 3.0\n"
HEADER_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 3.0


@dataclass
class Target:
    proc: ServerProcess
    ports: dict[str, int]
    rss_start_kib: int

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def check_alive(self) -> None:
        assert self.proc.proc is not None and self.proc.proc.poll() is None, self.proc.log()[-3000:]


def started(workdir, deckard: str, http: str) -> Target:
    ports = {name: free_port() for name in ("deckard", "zaqar", "sonya", "metrics")}
    config = (
        f'[deckard]\nlisten = "127.0.0.1:{ports["deckard"]}"\n{deckard}'
        f'[zaqar]\nlisten = "127.0.0.1:{ports["zaqar"]}"\n{http}'
        f'[sonya]\nlisten = "127.0.0.1:{ports["sonya"]}"\n{http}'
        f'[metrics]\nlisten = "127.0.0.1:{ports["metrics"]}"\npublic = true\n{http}'
    )
    proc = ServerProcess(workdir, extra_config=config, wal_mode="write", read_only=False)
    proc.start()
    assert proc.proc is not None
    return Target(proc, ports, rss_kib(proc.proc.pid))


def stopped(target: Target, workdir) -> None:
    code = target.proc.stop()
    log = target.proc.log()
    shutil.rmtree(workdir, ignore_errors=True)
    assert code == 0, log[-3000:]


@pytest.fixture(scope="package")
def target(tmp_path_factory):
    """Short deadlines: the defences act within a siege."""
    workdir = tmp_path_factory.mktemp("hostile")
    server = started(workdir, "header_timeout_s = 2.0\nbody_timeout_s = 3.0\nidle_timeout_s = 5.0\n", HTTP_DEADLINES)
    yield server
    stopped(server, workdir)


@pytest.fixture(scope="package")
def patient(tmp_path_factory):
    """The default deadlines (20 s for a head, 75 s kept alive, 300 s idle on gRPC): idle
    connections stay open through a siege."""
    workdir = tmp_path_factory.mktemp("hostile-defaults")
    server = started(workdir, "", "")
    yield server
    stopped(server, workdir)
