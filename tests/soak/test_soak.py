"""Soak: every API's traffic for a while, and the server's memory must stay flat.

One server with every listener on takes blocks of each API's requests in turn (connection churn,
pipelined mixes of every iproto request type, ID and AUTH, errors and malformed frames; console
lines; Zaqar, Sonya over HTTP and WebSocket, Deckard, tarantool/queue's API, metrics scrapes). RSS is read after every
block. After a warm-up the samples must show no growth: the trend (least-squares slope per
request) and the growth over the measured rounds both stay under their bounds, and a failure
prints what each API's blocks grew.

``make test`` runs the short form (about a minute); ``make soak`` the long one
(``BOXQUEUE_SOAK=long``: over two million requests).
"""

from __future__ import annotations

import os

import pytest
import tarantool

from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.memory_slope import MemoryTrace
from tests.serverproc import ServerProcess, free_port
from tests.soak import traffic

LONG = os.environ.get("BOXQUEUE_SOAK", "") == "long"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ports = {name: free_port() for name in ("zaqar", "sonya", "deckard", "metrics", "admin")}
    config = (
        f'[zaqar]\nlisten = "127.0.0.1:{ports["zaqar"]}"\n'
        f'[sonya]\nlisten = "127.0.0.1:{ports["sonya"]}"\nlongpoll_max_wait_s = 1\n'
        f'[deckard]\nlisten = "127.0.0.1:{ports["deckard"]}"\n'
        f'[metrics]\nlisten = "127.0.0.1:{ports["metrics"]}"\n'
        f"{traffic.SOAK_CONFIG}{QUEUE_SPACE_0}"
    )
    proc = ServerProcess(tmp_path_factory.mktemp("soak"), extra_config=config, wal_mode="write",
                         admin_port=ports.pop("admin"))
    proc.start()
    proc.ports = ports
    yield proc
    assert proc.stop() == 0, proc.log()[-3000:]


def every_api(server) -> list[traffic.Traffic]:
    p = server.ports
    scale = 4 if LONG else 1
    return [
        traffic.IprotoIdChurn(server.port, connections=20 * scale),
        traffic.IprotoChurn(server.port, server.ro_port, connections=8 * scale),
        traffic.IprotoPipelined(server.port, requests=3000 * scale),
        traffic.Console(server.admin_port, sessions=3 * scale),
        traffic.Zaqar(p["zaqar"], cycles=3 * scale),
        traffic.Sonya(p["sonya"], cycles=2 * scale),
        traffic.Deckard(p["deckard"], cycles=4 * scale),
        traffic.QueueModule(server.port, cycles=5 * scale),
        traffic.Metrics(p["metrics"], scrapes=2 * scale),
    ]


def run_rounds(server, traffics, rounds: int) -> tuple[MemoryTrace, int]:
    trace = MemoryTrace(server.proc.pid)
    requests = 0
    trace.sample("start", 0)
    for _ in range(rounds):
        for t in traffics:
            requests += t.block()
            trace.sample(t.name, requests)
    return trace, requests


def run_alone(server, t: traffic.Traffic, blocks: int) -> MemoryTrace:
    """``blocks`` blocks of one API's traffic, nothing else: the API's own trace."""
    trace = MemoryTrace(server.proc.pid)
    requests = 0
    trace.sample(t.name, 0)
    for _ in range(blocks):
        requests += t.block()
        trace.sample(t.name, requests)
    return trace


def test_every_api_keeps_memory_flat(server):
    """Every API in turn after a warm-up (the growth over the mixed rounds is judged), then each
    API alone (so that a leak shows against the API that has it: in the mixed rounds one API's
    blocks may reuse memory another's freed)."""
    traffics = every_api(server)
    for t in traffics:
        t.setup()
    warm_rounds, rounds, alone_blocks = (6, 60, 12) if LONG else (12, 10, 4)
    try:
        trace, requests = run_rounds(server, traffics, warm_rounds + rounds)
        alone = {t.name: run_alone(server, t, alone_blocks) for t in traffics}
    finally:
        for t in traffics:
            t.close()
    warm_up = 1 + warm_rounds * len(traffics)
    lines = [f"{'alone':<18} {'requests':>10} {'RSS KiB':>9} {'anon KiB':>9} {'B/request':>10}"]
    for name, t_trace in alone.items():  # the first block is the API's own warm-up
        kept = t_trace.after(1)
        lines.append(f"{name:<18} {kept[-1].requests - kept[0].requests:>10} {t_trace.growth_kib(1):>9} "
                     f"{t_trace.growth_kib(1, 'RssAnon'):>9} {t_trace.bytes_per_request(1):>10.1f}")
    report = trace.report(warm_up) + "\n" + "\n".join(lines)
    print("\n" + trace.series() + "\n" + report)
    measured = trace.after(warm_up)
    measured_requests = measured[-1].requests - measured[0].requests
    if LONG:
        assert requests >= 2_000_000, f"the long soak made only {requests} requests"
    # A leak of 100 bytes a request is 10 MB per 100,000 requests: flat means well under that.
    per_request = trace.bytes_per_request(warm_up)
    grown = trace.growth_kib(warm_up)
    bound_kib = 20 * 1000 if LONG else 8 * 1024
    assert per_request < 20 and grown < bound_kib, (
        f"the server's memory grew over {measured_requests} requests after the warm-up:\n{report}")
    grew_alone = [name for name, t_trace in alone.items() if t_trace.growth_kib(1) > bound_kib // 4]
    assert not grew_alone, f"the server's memory grew with the traffic of {', '.join(grew_alone)}:\n{report}"
    log = server.log()
    assert "Traceback" not in log, log[-6000:]


def test_id_requests_leave_memory_flat(server):
    """The issue's measurement: connections that each send 1,000 ID requests and close (400 of
    them in the long form, 100 here) leave RSS where it was after the warm-up."""
    id_churn = traffic.IprotoIdChurn(server.port, connections=20)
    trace = MemoryTrace(server.proc.pid)
    trace.sample("start", 0)
    requests = 0
    for _ in range(2):  # warm-up: 40 connections
        requests += id_churn.block()
    trace.sample("warm", requests)
    for _ in range(20 if LONG else 5):
        requests += id_churn.block()
        trace.sample(id_churn.name, requests)
    report = trace.report(1)
    print("\n" + report)
    assert trace.growth_kib(1) < 10 * 1000, report
    assert trace.bytes_per_request(1) < 5, report


def test_server_still_serves_after_the_soak(server):
    """The soak's data is where the blocks left it, and the server answers a new client."""
    conn = tarantool.Connection("127.0.0.1", server.port, user=traffic.USER, password=traffic.PASSWORD)
    try:
        assert conn.ping() is not None
        assert len(conn.select(traffic.SOAK_SPACE, [], limit=1000)) <= 500 + 1
    finally:
        conn.close()
