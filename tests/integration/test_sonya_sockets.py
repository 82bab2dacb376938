"""Sonya's WebSocket listeners on their own sockets (boxqueue/facades/sonya/socket_listeners.py): fan-out to
hundreds of listeners without loss, duplicates or reordering, a lagging listener closed with 1008
while the others get everything, the protocol details (pings, closes, protocol errors, handshake
errors, permessage-deflate), and the upgrade that hypercorn still serves (after another request
on the same connection).

The fan-out tests run the real server in the test's trio loop and read with wsproto client
connections; the others start the server process and use the websockets library or raw sockets."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
import uuid

import pytest
import trio
from websockets.exceptions import ConnectionClosed
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, RejectConnection, Request, TextMessage
from wsproto.extensions import PerMessageDeflate

from boxqueue.config import load_config
from boxqueue.process import Server
from tests.integration.conftest import ours_only
from tests.integration.sonya_fixtures import RawWebSocket, SonyaServer, ws_messages

pytestmark = ours_only()


# -- in-process: many listeners ------------------------------------------------------------------


async def start_server(tmp_path, nursery, sonya: str) -> tuple[Server, int]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n[wal]\nmode = "none"\n'
        f'[sonya]\nlisten = "127.0.0.1:0"\n{sonya}\n'
    )
    server = Server(load_config(cfg), handle_signals=False)
    ports = await nursery.start(server.run)
    return server, ports.extra["sonya"]


class Listener:
    """A WebSocket client on wsproto over a trio stream: every text message it gets, and the close
    code it was sent."""

    def __init__(self, stream: trio.SocketStream, ws: WSConnection) -> None:
        self.stream = stream
        self.ws = ws
        self.messages: list[dict] = []
        self.close_code: int | None = None
        self.extensions: list = []
        self._text = ""

    @classmethod
    async def connect(cls, port: int, path: str, deflate: bool) -> Listener:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        ws = WSConnection(ConnectionType.CLIENT)
        offer = [PerMessageDeflate()] if deflate else []
        await stream.send_all(ws.send(Request(host="127.0.0.1", target=path, extensions=offer)))
        self = cls(stream, ws)
        while True:
            ws.receive_data(await stream.receive_some(65536))
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    self.extensions = event.extensions
                    return self
                if isinstance(event, RejectConnection):
                    raise AssertionError(f"refused with {event.status_code}")

    async def read_until(self, count: int) -> None:
        """Read until ``count`` messages arrived or the server closed the connection."""
        while len(self.messages) < count and self.close_code is None:
            data = await self.stream.receive_some(65536)
            self.ws.receive_data(data or None)
            for event in self.ws.events():
                if isinstance(event, TextMessage):
                    self._text += event.data
                    if event.message_finished:
                        self.messages.append(json.loads(self._text))
                        self._text = ""
                elif isinstance(event, CloseConnection):
                    self.close_code = event.code
            if not data:
                return


async def test_fan_out_to_hundreds_of_listeners_loses_duplicates_and_reorders_nothing(tmp_path, nursery):
    server, port = await start_server(tmp_path, nursery, "max_key_updates = 5")
    broadcast = server.broadcast
    await broadcast.create("q")
    await broadcast.send("q", "k", '"before"')  # history for the sequence=first listeners
    listeners: list[Listener] = []
    paths = ["/queue/listen/ws/q", "/queue/listen/ws/q/k", "/queue/listen/ws/q/k?sequence=first"]
    for i in range(300):  # whole queue and by id; half of them with permessage-deflate
        listeners.append(await Listener.connect(port, paths[i % 3], deflate=i % 2 == 0))
    assert broadcast.listener_count() == 300
    assert all(bool(listener.extensions) == (i % 2 == 0) for i, listener in enumerate(listeners))
    sent = 40
    for n in range(sent):  # back to back, several fan-outs in flight at once
        broadcast.publish_nowait("q", "k", json.dumps({"n": n, "pad": "z" * (n * 97)}))
    with trio.fail_after(60):  # generous: 12,000 deliveries, and the readers share the loop
        async with trio.open_nursery() as readers:
            for i, listener in enumerate(listeners):
                readers.start_soon(listener.read_until, sent + (1 if i % 3 == 2 else 0))
    for i, listener in enumerate(listeners):
        got = listener.messages
        if i % 3 == 2:
            assert got[0] == {"id": "k", "sequence": 1, "payload": "before"}
            got = got[1:]
        assert [m["sequence"] for m in got] == list(range(2, sent + 2)), i
        assert [m["payload"]["n"] for m in got] == list(range(sent)), i
        assert listener.close_code is None
    # Clients leaving, with or without a close frame, take their subscriptions with them.
    for i, listener in enumerate(listeners):
        if i % 2:
            await listener.stream.send_all(listener.ws.send(CloseConnection(code=1000)))
        else:
            await listener.stream.aclose()
    with trio.fail_after(30):
        while broadcast.listener_count():
            await trio.sleep(0.05)


async def test_a_lagging_listener_is_closed_1008_and_the_others_get_every_message(tmp_path, nursery):
    server, port = await start_server(tmp_path, nursery, "listener_buffer = 4\nmax_key_updates = 1")
    broadcast = server.broadcast
    await broadcast.create("q")
    fast = [await Listener.connect(port, "/queue/listen/ws/q", deflate=i % 2 == 0) for i in range(20)]
    slow = await Listener.connect(port, "/queue/listen/ws/q", deflate=False)  # reads nothing for now
    slow.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    payload = json.dumps("x" * 100_000)  # incompressible enough only without deflate: slow has none
    sent = 150
    with trio.fail_after(120):
        async with trio.open_nursery() as readers:
            for listener in fast:
                readers.start_soon(listener.read_until, sent)
            for n in range(sent):
                await broadcast.send("q", "k", payload)
                # The fast listeners read as fast as they can, but they share this trio loop
                # with the sender: keep them within two messages of it (the buffer holds four),
                # so that only the listener that reads nothing lags, whatever order the
                # scheduler runs the tasks in (a change of the group committer's scheduling
                # once made the sender outrun them).
                while any(len(one.messages) < n - 1 and one.close_code is None for one in fast):
                    await trio.sleep(0.001)
    for listener in fast:
        assert [m["sequence"] for m in listener.messages] == list(range(1, sent + 1))
        assert listener.close_code is None
    with trio.fail_after(30):
        await slow.read_until(sent)
    assert slow.close_code == 1008
    got = [m["sequence"] for m in slow.messages]
    assert 0 < len(got) < sent and got == list(range(1, len(got) + 1))
    assert broadcast.listener_count() == len(fast)


# -- a server process: protocol details ----------------------------------------------------------


@pytest.fixture(scope="module")
def sonya(tmp_path_factory):
    srv = SonyaServer(tmp_path_factory.mktemp("sonya-sockets"), "").start()
    yield srv
    srv.proc.stop()
    srv.http.close()


def fresh_queue(srv: SonyaServer) -> str:
    name = "q" + uuid.uuid4().hex[:10]
    assert srv.create(name).status_code == 201
    return name


def test_deflate_is_negotiated_without_server_context_takeover_and_pings_are_answered(sonya):
    q = fresh_queue(sonya)
    with sonya.ws(q) as ws:
        offered = ws.response.headers["Sec-WebSocket-Extensions"]
        assert offered.startswith("permessage-deflate") and "server_no_context_takeover" in offered
        for _ in range(3):  # the same text three times: each frame compressed on its own
            sonya.send_ok(q, "k", {"same": "text " * 50})
        assert [m["sequence"] for m in ws_messages(ws, 3)] == [1, 2, 3]
        assert ws.ping(b"are you there").wait(10)
        ws.close(1000)
        assert ws.close_code == 1000  # the server echoed our close


def test_without_an_offer_frames_are_plain_text(sonya):
    q = fresh_queue(sonya)
    raw = RawWebSocket(sonya.http_port, f"/queue/listen/ws/{q}")
    try:
        assert raw.status == 101
        sonya.send_ok(q, "k", "plain")
        sonya.close_queue(q)
        frames = raw.frames()
    finally:
        raw.close()
    assert frames[0] == (1, b'{"id":"k","sequence":1,"payload":"plain"}')
    assert frames[-1][0] == 8 and struct.unpack(">H", frames[-1][1][:2])[0] == 1000


def test_a_client_protocol_error_is_closed_1002_and_others_are_unaffected(sonya):
    q = fresh_queue(sonya)
    raw = RawWebSocket(sonya.http_port, f"/queue/listen/ws/{q}")
    try:
        with sonya.ws(q) as other:
            raw.sock.sendall(b"\x81\x02hi")  # a client frame must be masked
            frames = raw.frames(timeout=10)
            assert frames[-1][0] == 8 and struct.unpack(">H", frames[-1][1][:2])[0] == 1002
            sonya.send_ok(q, "k", "still served")
            assert ws_messages(other, 1)[0]["payload"] == "still served"
    finally:
        raw.close()


def _raw_request(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data:
                head, _, body = data.partition(b"\r\n\r\n")
                length = [int(v.split(b":")[1]) for v in head.split(b"\r\n") if v.lower().startswith(b"content-length:")]
                if length and len(body) >= length[0]:
                    break
        return data


@pytest.mark.parametrize("bad", ["Sec-WebSocket-Version: 12\r\nSec-WebSocket-Key: {key}\r\n", "Sec-WebSocket-Version: 13\r\n"])
def test_bad_handshakes_are_400_before_anything_else(sonya, bad):
    key = base64.b64encode(os.urandom(16)).decode()
    answer = _raw_request(
        sonya.http_port,
        ("GET /queue/listen/ws/nosuchqueue HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
         + bad.format(key=key) + "\r\n").encode(),
    )
    assert answer.startswith(b"HTTP/1.1 400")


def test_an_upgrade_after_another_request_on_the_connection_is_still_served(sonya):
    """Only a connection's first request is looked at; later upgrades go through hypercorn and the
    Starlette endpoint, with the same stream and close code."""
    q = fresh_queue(sonya)
    sonya.send_ok(q, "k", "stored")
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", sonya.http_port), timeout=10) as s:
        s.sendall(f"GET /queue/listen/longpoll/{q}/k?sequence=1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while not data.endswith(b"]"):
            data += s.recv(65536)
        assert data.startswith(b"HTTP/1.1 200") and b'"payload":"stored"' in data
        s.sendall(
            f"GET /queue/listen/ws/{q}/k?sequence=first HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        assert data.startswith(b"HTTP/1.1 101")
        rest = data.split(b"\r\n\r\n", 1)[1]
        sonya.send_ok(q, "k", "live")
        time.sleep(0.5)
        sonya.delete(q, "k")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b"\x88" not in rest:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
    assert b'"payload":"stored"' in rest and b'"payload":"live"' in rest
    close = rest[rest.index(b"\x88"):]
    assert struct.unpack(">H", close[2:4])[0] == 1000


def test_a_server_close_waits_for_the_clients_close_frame(sonya):
    q = fresh_queue(sonya)
    with sonya.ws(q) as ws:
        sonya.close_queue(q)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
        assert closed.value.sent is not None and closed.value.sent.code == 1000  # a clean handshake


# -- long-polls on connections of their own ------------------------------------------------------


class RawHttp:
    """A kept-alive HTTP/1.1 connection on a plain socket: requests and parsed answers."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, "closed before an answer"
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            self.buffer += self.sock.recv(65536)
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), headers, body

    def closed_by_server(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def test_longpolls_pipelined_then_other_calls_on_the_same_connection(sonya):
    q = fresh_queue(sonya)
    sonya.send_ok(q, "k", "one")
    sonya.send_ok(q, "k", "two")
    conn = RawHttp(sonya.http_port)
    try:
        conn.send(  # two polls in one write: answered in order
            f"GET /queue/listen/longpoll/{q}/k?sequence=1 HTTP/1.1\r\nHost: x\r\n\r\n"
            f"GET /queue/listen/longpoll/{q}/k?sequence=last HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
        status, headers, body = conn.answer()
        assert (status, headers["content-type"]) == (200, "application/json") and "date" in headers
        assert [m["payload"] for m in json.loads(body)] == ["one", "two"]
        status, _, body = conn.answer()
        assert (status, [m["sequence"] for m in json.loads(body)]) == (200, [2])
        conn.send(f"GET /queue/listen/longpoll/nosuch{q} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert conn.answer()[:3:2] == (404, b"Queue Not Found")
        # Another call on the same connection goes to hypercorn, then polls still work there.
        payload = json.dumps({"id": "k", "payload": "three"}).encode()
        conn.send(
            f"POST /queue/send/{q} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
        )
        status, _, body = conn.answer()
        assert (status, json.loads(body)) == (200, {"success": True, "sequence_id": 3})
        conn.send(f"GET /queue/listen/longpoll/{q}/k?sequence=3 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert json.loads(conn.answer()[2])[0]["payload"] == "three"
    finally:
        conn.close()


def test_a_waiting_longpoll_gets_the_next_message_and_http_1_0_is_closed_after(sonya):
    q = fresh_queue(sonya)
    conn = RawHttp(sonya.http_port)
    try:
        conn.send(f"GET /queue/listen/longpoll/{q} HTTP/1.0\r\n\r\n".encode())
        time.sleep(0.5)
        sonya.send_ok(q, "z", {"live": True})
        status, _, body = conn.answer()
        assert (status, json.loads(body)) == (200, [{"id": "z", "sequence": 1, "payload": {"live": True}}])
        assert conn.closed_by_server(10)
    finally:
        conn.close()


async def test_a_longpoll_whose_client_leaves_lets_go_and_stop_closes_idle_connections(tmp_path, nursery):
    server, port = await start_server(tmp_path, nursery, "longpoll_max_wait_s = 0")
    broadcast = server.broadcast
    await broadcast.create("q")
    await broadcast.send("q", "k", '"stored"')
    leaving = await trio.open_tcp_stream("127.0.0.1", port)
    await leaving.send_all(b"GET /queue/listen/longpoll/q/k HTTP/1.1\r\nHost: x\r\n\r\n")
    with trio.fail_after(10):
        while broadcast.listener_count() != 1:
            await trio.sleep(0.01)
    await leaving.aclose()
    with trio.fail_after(10):
        while broadcast.listener_count():
            await trio.sleep(0.01)
    idle = await trio.open_tcp_stream("127.0.0.1", port)
    await idle.send_all(b"GET /queue/listen/longpoll/q/k?sequence=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await idle.receive_some(65536)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'"payload":"stored"}]')
    server.stop()
    with trio.fail_after(4):  # the graceful limit is 5 s: an idle poll connection closes at once
        while await idle.receive_some(65536):
            pass


def test_a_client_that_pings_without_reading_is_held_back_not_buffered(sonya):
    """Pongs wait in the listener's outbox only up to a bound; then the server stops reading the
    client, so TCP holds the client's pings back. Once it reads, it gets its pongs and the stream."""
    q = fresh_queue(sonya)
    raw = RawWebSocket(sonya.http_port, f"/queue/listen/ws/{q}")
    try:
        assert raw.status == 101
        ping = b"\x89\xfd" + b"\x00" * 4 + b"p" * 125  # masked (with a zero key), 125-byte payload
        raw.sock.settimeout(5)
        sent = 0
        with pytest.raises(TimeoutError):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                raw.sock.sendall(ping * 64)
                sent += 64
        assert sent < 400_000  # held back long before 50 MB of pongs could pile up
        sonya.send_ok(q, "k", "after the pings")
        raw.sock.settimeout(30)
        data = b""
        while b"after the pings" not in data:
            chunk = raw.sock.recv(1 << 20)
            assert chunk, "closed"
            data += chunk
        assert data.startswith(b"\x8a\x7d" + b"p" * 125)  # pongs first, in order
    finally:
        raw.close()


def test_a_live_longpoll_answer_larger_than_the_socket_takes_is_finished(sonya):
    """The fan-out writes a waiting poll's answer; what the socket does not take at once is
    finished by the connection's task, and the connection serves the next poll."""
    q = fresh_queue(sonya)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", sonya.http_port))
    conn = RawHttp.__new__(RawHttp)
    conn.sock, conn.buffer = sock, b""
    try:
        conn.send(f"GET /queue/listen/longpoll/{q}/k HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        time.sleep(0.5)
        big = "b" * 1_500_000
        sonya.send_ok(q, "k", big)
        time.sleep(0.5)  # the answer waits in the socket buffers and the server's task
        sock.settimeout(20)
        status, _headers, body = conn.answer()
        assert status == 200 and json.loads(body) == [{"id": "k", "sequence": 1, "payload": big}]
        conn.send(f"GET /queue/listen/longpoll/{q}/k?sequence=1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert json.loads(conn.answer()[2])[0]["sequence"] == 1
    finally:
        conn.close()
