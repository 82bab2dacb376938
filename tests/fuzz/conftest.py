"""Property-based fuzzing of every API against one running server (hypothesis).

The invariant after every example: the answer is a well-formed error or a correct answer (each
test checks its protocol's shape), the server process is alive, a well-behaved client on another
connection is served, nothing acknowledged before the fuzzing is lost (:meth:`Target.check_sentinels`,
run after every example), and the server's memory stays bounded (checked once per module).

Memory is judged by its slope, not only by its end point: a module's few hundred examples are too
few requests for a leak of a few hundred bytes each to show against the allocators' noise, so
once a module's fuzzing is done its examples are sent again, round after round (each example
records how to, with :meth:`Target.replayable`) until RSS is flat: its slope over the last
``REPLAY_WINDOW`` requests under ``REPLAY_BYTES_PER_REQUEST``. A server still climbing after
``REPLAY_MOST`` requests fails the module.

``make test`` runs the ``quick`` profile (a budget of about 90 s for all fuzz tests together on
the shared 2-core machine); ``make fuzz`` runs ``BOXQUEUE_FUZZ=long`` (20x the examples).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import grpc
import httpx
import pytest
import tarantool
from hypothesis import HealthCheck, settings

from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.facades.deckard.generated import deckard_service_pb2_grpc as pb_grpc
from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.memory_slope import MemoryTrace
from tests.serverproc import ServerProcess, free_port, rss_kib

LONG = os.environ.get("BOXQUEUE_FUZZ", "") == "long"
SCALE = 20 if LONG else 1


def fuzz_settings(n: int) -> settings:
    """``n`` examples in ``make test`` (20 n with BOXQUEUE_FUZZ=long), derandomized there so a
    failure repeats; no deadline (the machine is shared)."""
    return settings(
        max_examples=n * SCALE, deadline=None, derandomize=not LONG, print_blob=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                               HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


CLIENT = "3381af92-2b9e-11e3-b191-71861300734c"
SENTINEL_ROW = [1, "acknowledged before the fuzzing"]
SENTINEL_PROJECT = "sentinel-project"  # Zaqar; fuzz tests use other projects
SENTINEL_NAME = "sentinel"  # the queue of each API holding acknowledged data; fuzz tests avoid it
SENTINEL_SPACE = 7777  # no fuzz test names it: what it holds must survive everything
MEMORY_BOUND_KIB = 300 * 1024  # growth of the server's RSS over a whole fuzz module
# After a module's fuzzing its examples are sent again until RSS is flat over the last
# REPLAY_WINDOW requests (a least-squares slope under REPLAY_BYTES_PER_REQUEST); a server that is
# still climbing after REPLAY_MOST requests fails. The memory of a fresh server climbs for a while
# before it levels off (trio keeps up to a thousand ended cancel scopes in its deadline heap,
# allocator arenas and the Lua heap fill up), by a few MB over the first thousands of
# connections; a leak never levels off.
REPLAY_WINDOW = 6_000 * (4 if LONG else 1)
REPLAY_MOST = 10 * REPLAY_WINDOW
REPLAY_BYTES_PER_REQUEST = 100
MAX_REPLAYS = 400  # examples kept per module

FUZZ_SPACES = """
[[space]]
id = 7777
name = "sentinel"
indexes = [{ name = "pk", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] }]

[[space]]
id = 512
name = "kv"
format = [{ name = "id", type = "unsigned" }, { name = "v", type = "any", is_nullable = true }]
indexes = [
  { name = "pk", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] },
  { name = "by_v", type = "TREE", unique = false, parts = [{ field = 1, type = "scalar", is_nullable = true }] },
]
"""


class Target:
    """The server under fuzz, with data acknowledged before any fuzzing and a well-behaved client
    of each protocol that must keep being served."""

    def __init__(self, workdir) -> None:
        self.zaqar_port, self.sonya_port, self.grpc_port = free_port(), free_port(), free_port()
        config = (
            f'[zaqar]\nlisten = "127.0.0.1:{self.zaqar_port}"\n'
            f'[sonya]\nlisten = "127.0.0.1:{self.sonya_port}"\nlongpoll_max_wait_s = 1\n'
            f'[deckard]\nlisten = "127.0.0.1:{self.grpc_port}"\nallow_flush = false\n'
            f"[lua]\ntime_limit_s = 1.0\n"
            f"{FUZZ_SPACES}{QUEUE_SPACE_0}"
        )
        self.proc = ServerProcess(workdir, extra_config=config, wal_mode="write", admin_port=free_port())
        self.good: tarantool.Connection | None = None
        self.deckard: grpc.Channel | None = None
        self.replays: list[Callable[[], int]] = []

    def replayable(self, send: Callable[[], int]) -> None:
        """How to send an example's requests again (``send`` returns how many it sent), for the
        memory check at the end of the module."""
        if len(self.replays) < MAX_REPLAYS:
            self.replays.append(send)

    def start(self) -> None:
        self.proc.start()
        self.good = tarantool.Connection("127.0.0.1", self.proc.port)
        self.good.replace("sentinel", SENTINEL_ROW)
        self.good.call("box.queue.put", 0, "sentinel", 0, 3600, 3600, 0, "sentinel task")
        # tarantool/queue's: the fuzz tests call the tube "fz"; the sentinel tube holds a kept task
        self.good.eval("queue.create_tube('fz', 'utubettl', {if_not_exists = true})")
        self.good.eval("queue.create_tube('sentinel_module', 'fifottl', {if_not_exists = true})")
        self.good.call("queue.tube.sentinel_module:put", "kept")
        with self.zaqar() as z:
            z.put("/v1.1/queues/sentinel")
            z.post("/v1.1/queues/sentinel/messages", json={"messages": [{"ttl": 3600, "body": "kept"}]})
        httpx.post(f"http://127.0.0.1:{self.sonya_port}/queue/create/sentinel", timeout=30)
        httpx.post(f"http://127.0.0.1:{self.sonya_port}/queue/send/sentinel",
                   json={"id": "k", "payload": "kept"}, timeout=30)
        self.deckard = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        pb_grpc.DeckardStub(self.deckard).Add(
            pb.AddRequest(messages=[pb.AddMessage(id="kept", queue="sentinel", string_payload="kept", timeless=True)]),
            timeout=30)

    def stop(self) -> None:
        if self.good is not None:
            self.good.close()
        if self.deckard is not None:
            self.deckard.close()
        assert self.proc.stop() == 0, self.proc.log()[-3000:]

    def zaqar(self, project: str = SENTINEL_PROJECT) -> httpx.Client:
        return httpx.Client(base_url=f"http://127.0.0.1:{self.zaqar_port}", timeout=30,
                            headers={"Client-ID": CLIENT, "X-Project-Id": project})

    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def check_alive(self) -> None:
        assert self.proc.proc is not None and self.proc.proc.poll() is None, self.proc.log()[-3000:]

    def check_sentinels(self) -> None:
        """The server is alive, serves a well-behaved client on its own connection, and still has
        everything acknowledged before the fuzzing."""
        self.check_alive()
        assert self.good is not None
        assert [list(t) for t in self.good.select("sentinel", [1])] == [SENTINEL_ROW]
        tasks = self.good.select("queue", ["sentinel"], index="tube_status")
        assert any(t[-1] == "sentinel task" for t in tasks)
        assert self.good.call("queue.tube.sentinel_module:peek", 0).data == [[0, "r", "kept"]]
        with self.zaqar() as z:
            listed = z.get("/v1.1/queues/sentinel/messages", params={"echo": "true"})
            assert listed.status_code == 200 and [m["body"] for m in listed.json()["messages"]][:1] == ["kept"]
        polled = httpx.get(f"http://127.0.0.1:{self.sonya_port}/queue/listen/longpoll/sentinel/k",
                           params={"sequence": "first"}, timeout=30)
        assert polled.status_code == 200 and polled.json()[0]["payload"] == "kept"
        found = pb_grpc.DeckardStub(self.deckard).GetById(pb.GetByIdRequest(queue="sentinel", id="kept"), timeout=30)
        assert found.found and found.message.string_payload == "kept"


@pytest.fixture(scope="package")
def target(tmp_path_factory):
    """One server for the fuzz package; stopped (and its gRPC channel closed) when the package is
    done: a live grpcio channel in the test process breaks later forks (Spark's gateway)."""
    t = Target(tmp_path_factory.mktemp("fuzz"))
    t.start()
    yield t
    t.check_sentinels()
    t.stop()


@pytest.fixture(scope="module")
def memory_bounded(target):
    """Fails the module whose fuzzing grows the server's memory past the bound, or whose examples,
    sent again and again, make its memory climb (see the module's docstring)."""
    before = rss_kib(target.pid())
    log_at = len(target.proc.log())
    target.replays = []
    yield
    time.sleep(0.5)
    grown = rss_kib(target.pid()) - before
    assert grown < MEMORY_BOUND_KIB, f"the server grew by {grown} KiB during this fuzz module"
    replays, target.replays = target.replays, []
    if replays:
        trace, window = replay_until_flat(target, replays)
        report = trace.report(window)
        print("\n" + report)
        assert trace.bytes_per_request(window) < REPLAY_BYTES_PER_REQUEST, (
            f"the server's memory still climbs after {trace.samples[-1].requests} requests of this module's "
            f"examples sent again (the table: the last {REPLAY_WINDOW} of them):\n{report}")
    target.check_alive()
    logged = target.proc.log()[log_at:]
    assert "Traceback" not in logged, "the server logged an unexpected exception:\n" + logged[-6000:]


def replay_until_flat(target: Target, replays: list[Callable[[], int]]) -> tuple[MemoryTrace, int]:
    """Send the examples again, round after round, reading RSS after each round, until the samples
    of the last REPLAY_WINDOW requests are flat or REPLAY_MOST requests have gone: the trace and
    the index of the window's first sample."""
    trace = MemoryTrace(target.pid())
    trace.sample("replay", 0)
    sent = 0
    while True:
        for send in replays:
            sent += send()
        trace.sample("replay", sent)
        # the window: the last REPLAY_WINDOW requests, and six rounds at least
        window = min(next(i for i, s in enumerate(trace.samples) if s.requests >= sent - REPLAY_WINDOW),
                     len(trace.samples) - 7)
        if sent >= REPLAY_MOST:
            return trace, max(window, 0)
        if sent >= REPLAY_WINDOW and window >= 0 and trace.bytes_per_request(window) < REPLAY_BYTES_PER_REQUEST:
            return trace, window


def raw_connection(port: int, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_until_closed_or_quiet(sock: socket.socket, quiet: float = 0.3, most: int = 1 << 22) -> tuple[bytes, bool]:
    """What the server sends until it closes (True) or is quiet for ``quiet`` seconds."""
    sock.settimeout(quiet)
    data = b""
    while len(data) < most:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return data, False
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def send_and_finish(sock: socket.socket, data: bytes, timeout: float = 20.0) -> bytes:
    """Send ``data``, end the client's side of the stream and read everything the server answers
    until it closes the connection (it must, within ``timeout``: a client that has left gets its
    quick answers and nothing waits for it)."""
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return b""
    answer, closed = read_until_closed_or_quiet(sock, quiet=timeout)
    assert closed, "the server kept a connection open after its client left"
    return answer
