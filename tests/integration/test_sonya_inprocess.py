"""The broadcast tube inside a server run in the test's own trio loop: the seam between a
listener's snapshot and its live messages while a send is in the middle of its commit."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel

from boxqueue.config import load_config
from boxqueue.process import Server


@pytest.fixture
async def running(tmp_path, nursery):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n[wal]\nmode = "fsync"\n'
        '[sonya]\nlisten = "127.0.0.1:0"\nlistener_buffer = 2\n'
    )
    server = Server(load_config(cfg), handle_signals=False)
    ports = await nursery.start(server.run)
    yield server, ports
    server.stop()


async def http_get(port: int, path: str) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


async def test_port_zero_is_reported_and_served(running):
    server, ports = running
    assert ports.extra["sonya"] > 0
    await server.broadcast.create("q")
    answer = await http_get(ports.extra["sonya"], "/queue/listen/longpoll/missing")
    assert answer.startswith(b"HTTP/1.1 404") and answer.endswith(b"Queue Not Found")


async def test_a_version_in_flight_reaches_a_new_listener_exactly_once(running):
    """Subscribe when the send's commit is already visible to a new read transaction but its
    fan-out has not run yet: the snapshot must leave it out, the live stream deliver it once."""
    server, _ports = running
    broadcast = server.broadcast
    env = server.storage.env
    versions = broadcast.store.versions
    await broadcast.create("q")
    in_window = 0
    for attempt in range(200):
        key = f"k{attempt}"
        sent = trio.Event()

        async def send(key: str = key, sent: trio.Event = sent) -> None:
            await broadcast.send("q", key, '"v"')
            sent.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            while not sent.is_set():
                with env.begin() as txn:  # a reader begun now, as a subscription's could be
                    if versions.get(0, ["q", key, 1], txn) is not None:
                        break
                await trio.lowlevel.checkpoint()
            if broadcast._in_flight:
                in_window += 1
            server.storage.committed()  # the shared reader begins anew, as after any commit
            preload, sub = broadcast.subscribe("q", key, "first")
        with sub:  # the send is complete and fanned out now
            delivered = [m.sequence for m in preload]
            while True:
                with trio.move_on_after(0.05):
                    live = await sub.next()
                    delivered.append(live.sequence)
                    continue
                break
        assert delivered == [1], attempt
        if in_window >= 5:
            break
    assert in_window > 0, "never caught a send between its commit and its fan-out"


async def test_listener_overflow_ends_only_that_listener(running):
    server, _ports = running
    broadcast = server.broadcast
    await broadcast.create("q")
    _, slow = broadcast.subscribe("q", None, None)
    _, reader = broadcast.subscribe("q", None, None)
    with slow, reader:
        for i in range(4):
            await broadcast.send("q", "k", str(i))
            assert (await reader.next()).sequence == i + 1
        assert slow.ended == "overflow"
        assert await slow.next() is None
        assert reader.ended is None
        assert broadcast.listener_count() == 1
        # What the metrics show: one listener closed for lagging, four messages fanned out.
        assert broadcast.ended == {"overflow": 1}
        assert broadcast.fanned_out == 4


async def test_a_failing_sink_is_ended_and_the_fan_out_goes_on(running):
    server, _ports = running
    broadcast = server.broadcast
    await broadcast.create("q")

    class Breaks:
        def __init__(self) -> None:
            self.got: list[int] = []
            self.why: list[str] = []

        def deliver(self, item) -> int:
            if item.sequence == 2:
                raise ValueError("a bug in a transport")
            self.got.append(item.sequence)
            return 0

        def ended(self, reason: str) -> None:
            self.why.append(reason)

    sink = Breaks()
    _, broken = broadcast.subscribe("q", None, None, sink=sink)
    _, reader = broadcast.subscribe("q", None, None)
    _, after = broadcast.subscribe("q", None, None)  # registered after the broken one
    with broken, reader, after:
        for i in range(3):  # (read as we go: this server's listener_buffer is 2)
            await broadcast.send("q", "k", str(i))
            assert (await reader.next()).sequence == i + 1
            assert (await after.next()).sequence == i + 1
        assert (sink.got, sink.why, broken.ended) == ([1], ["failed"], "failed")
        assert broadcast.listener_count() == 2
