"""The front door's own HTTP/1.1 server (``boxqueue.frontdoor.http1_connections``), in process:
``serve_asgi(..., http1=True)`` on a free loopback port with a small ASGI application, driven
by raw sockets (to see the bytes and the connection's fate) and by httpx."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from boxqueue.frontdoor.asgi_serving import Listening, serve_asgi


class App:
    """Echoes what it was asked; ``/fail`` raises, ``/wait`` waits for the client to leave,
    ``/refuse`` answers without reading the body."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.left = trio.Event()
        self.entered = trio.Event()  # /held: the request has reached the application...
        self.release = trio.Event()  # ... which answers once this is set

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": 1000})
            return
        assert scope["type"] == "http"
        self.scopes.append(scope)
        path = scope["path"]
        if path == "/fail":
            raise RuntimeError("the application failed")
        if path in ("/stream", "/unframed", "/bad-header"):
            await receive()
            headers = [(b"x-note", b"one\r\nset-cookie: injected")] if path == "/bad-header" else []
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            more = path == "/stream"
            await send({"type": "http.response.body", "body": b"first,", "more_body": more})
            if more:
                await send({"type": "http.response.body", "body": b"second", "more_body": False})
            return
        if path == "/held":
            self.entered.set()
            await self.release.wait()
        if path == "/wait":
            message = await receive()
            assert message["type"] == "http.request"
            if (await receive())["type"] == "http.disconnect":
                self.left.set()
            return
        body = b""
        if path not in ("/refuse", "/unread"):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the body did not come in time (answered 408)
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    break
        answer = json.dumps({"method": scope["method"], "path": path, "query": scope["query_string"].decode(),
                             "body": body.decode()}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})


async def start(nursery: trio.Nursery, app: App, **listening: Any) -> tuple[int, trio.Event]:
    shutdown = trio.Event()
    port = await nursery.start(lambda task_status: serve_asgi(
        app, "127.0.0.1", 0, shutdown, name="test", http1=True, graceful_s=2.0,
        listening=Listening(**listening), task_status=task_status))
    return port, shutdown


async def read_answer(stream: trio.SocketStream, buffer: bytearray,
                      head: bool = False) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One answer (status line, headers, body by content-length unless it answers a HEAD)."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        assert data, f"the connection closed before an answer: {bytes(buffer)!r}"
        buffer += data
    end = buffer.index(b"\r\n\r\n")
    lines = bytes(buffer[:end]).split(b"\r\n")
    del buffer[: end + 4]
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines[1:])}
    length = 0 if head else int(headers.get(b"content-length", b"0"))
    while len(buffer) < length:
        data = await stream.receive_some(65536)
        assert data
        buffer += data
    body = bytes(buffer[:length])
    del buffer[:length]
    return lines[0], headers, body


async def closed(stream: trio.SocketStream, buffer: bytearray) -> bool:
    """Whether the server closes the connection (within 5 s) with nothing more sent."""
    with trio.move_on_after(5):
        data = await stream.receive_some(65536)
        buffer += data
        return data == b""
    return False


class Raw:
    """One raw connection to the server, and what was read from it ahead of the next answer."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    @classmethod
    async def to(cls, port: int) -> Raw:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def answer(self, head: bool = False) -> tuple[bytes, dict[bytes, bytes], bytes]:
        return await read_answer(self.stream, self.buffer, head)

    async def closed(self) -> bool:
        return await closed(self.stream, self.buffer)


async def test_one_connection_serves_many_requests_with_and_without_bodies() -> None:
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app)
        conn = await Raw.to(port)
        for i in range(3):
            await conn.send(b"GET /a%%20b?x=%d HTTP/1.1\r\nHost: h\r\n\r\n" % i)
            status, headers, body = await conn.answer()
            assert status == b"HTTP/1.1 200 " or status.startswith(b"HTTP/1.1 200"), status
            assert b"connection" not in headers and b"date" in headers
            assert json.loads(body) == {"method": "GET", "path": "/a b", "query": f"x={i}", "body": ""}
            await conn.send(b"DELETE /d HTTP/1.1\r\nHost: h\r\n\r\n")
            status, headers, body = await conn.answer()
            assert json.loads(body)["method"] == "DELETE" and b"connection" not in headers
            await conn.send(b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello")
            status, headers, body = await conn.answer()
            assert json.loads(body)["body"] == "hello" and b"connection" not in headers
            # Answered without the application asking for the request (read to its end): kept.
            await conn.send(b"DELETE /unread HTTP/1.1\r\nHost: h\r\n\r\n")
            status, headers, body = await conn.answer()
            assert json.loads(body)["path"] == "/unread" and b"connection" not in headers
        client = app.scopes[0]["client"]
        assert all(scope["client"] == client for scope in app.scopes)  # one connection throughout
        assert len(app.scopes) == 12
        assert app.scopes[0]["raw_path"] == b"/a%20b" and app.scopes[0]["server"][1] == port
        await conn.stream.aclose()
        shutdown.set()


async def test_pipelined_chunked_and_100_continue_requests() -> None:
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app)
        conn = await Raw.to(port)
        await conn.send(b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\n"
                              b"POST /2 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                              b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                              b"HEAD /3 HTTP/1.1\r\nHost: h\r\n\r\n")
        _, _, body = await conn.answer()
        assert json.loads(body)["path"] == "/1"
        _, _, body = await conn.answer()
        assert json.loads(body) == {"method": "POST", "path": "/2", "query": "", "body": "abcde"}
        status, headers, _ = await conn.answer(head=True)
        assert status.startswith(b"HTTP/1.1 200") and int(headers[b"content-length"]) > 0
        assert conn.buffer == b""  # HEAD: the head only, no body
        await conn.send(b"POST /4 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
        status, _, _ = await conn.answer()
        assert status.startswith(b"HTTP/1.1 100")
        await conn.send(b"xyz")
        _, _, body = await conn.answer()
        assert json.loads(body)["body"] == "xyz"
        await conn.stream.aclose()
        shutdown.set()


async def test_refusals_close_the_connection_and_the_server_goes_on() -> None:
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app, body_timeout_s=1.0)
        cases = [
            (b"GET /fail HTTP/1.1\r\nHost: h\r\n\r\n", b"HTTP/1.1 500"),
            (b"GET /ok HTTP/1.1\r\nHost: h\r\n\r\nNOT HTTP AT ALL\r\n\r\n", b"HTTP/1.1 400"),
            (b"POST /refuse HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n12", b"HTTP/1.1 200"),
            (b"POST /slow HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n12", b"HTTP/1.1 408"),
        ]
        for request, expected in cases:
            conn = await Raw.to(port)
            await conn.send(request)
            status, headers, _ = await conn.answer()
            if request.startswith(b"GET /ok"):  # the first request is answered, the garbage refused
                assert status.startswith(b"HTTP/1.1 200")
                status, headers, _ = await conn.answer()
            assert status.startswith(expected), (request, status)
            assert headers.get(b"connection") == b"close", (request, headers)
            assert await conn.closed(), request
            await conn.stream.aclose()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            answer = await client.post("/after", content=b"still serving")
            assert answer.json()["body"] == "still serving"
        shutdown.set()


async def test_a_waiting_request_sees_its_client_leave() -> None:
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app)
        conn = await Raw.to(port)
        await conn.send(b"GET /wait HTTP/1.1\r\nHost: h\r\n\r\n")
        await trio.sleep(0.2)
        assert not app.left.is_set()
        await conn.stream.aclose()
        with trio.fail_after(5):
            await app.left.wait()
        shutdown.set()


async def test_idle_connections_close_when_the_server_stops_and_after_the_keep_alive_timeout() -> None:
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app, keep_alive_timeout_s=1.0)
        conn = await Raw.to(port)
        await conn.send(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
        await conn.answer()
        started = trio.current_time()
        assert await conn.closed()  # idle past the keep-alive timeout
        assert 0.8 <= trio.current_time() - started < 4.0
        conn = await Raw.to(port)
        await conn.send(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
        await conn.answer()
        held = await Raw.to(port)
        await held.send(b"GET /held HTTP/1.1\r\nHost: h\r\n\r\n")
        await app.entered.wait()
        started = trio.current_time()
        shutdown.set()
        assert await conn.closed()
        assert trio.current_time() - started < 0.9  # at once, not at the keep-alive timeout
        app.release.set()  # the request under way when the server stopped is answered...
        status, headers, _ = await held.answer()
        assert status.startswith(b"HTTP/1.1 200") and headers[b"connection"] == b"close"  # ...as the last
        assert await held.closed()


async def test_websocket_upgrades_still_go_to_hypercorn() -> None:
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app)
        conn = await Raw.to(port)
        await conn.send(b"GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        status, headers, _ = await conn.answer()
        assert status.startswith(b"HTTP/1.1 101"), status
        assert headers[b"sec-websocket-accept"] == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        await conn.stream.aclose()
        shutdown.set()


async def read_chunked(stream: trio.SocketStream, buffer: bytearray) -> bytes:
    body = b""
    while True:
        while b"\r\n" not in buffer:
            buffer += await stream.receive_some(65536)
        line, _, rest = bytes(buffer).partition(b"\r\n")
        size = int(line, 16)
        while len(rest) < size + 2:
            rest += await stream.receive_some(65536)
        body += rest[:size]
        buffer[:] = rest[size + 2:]
        if size == 0:
            return body


async def test_answers_are_framed_by_length_or_in_chunks_and_headers_are_checked() -> None:
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app)
        conn = await Raw.to(port)
        await conn.send(b"GET /unframed HTTP/1.1\r\nHost: h\r\n\r\n")
        _, headers, body = await conn.answer()
        assert headers[b"content-length"] == b"6" and body == b"first,"
        await conn.send(b"GET /stream HTTP/1.1\r\nHost: h\r\n\r\n")
        _, headers, _ = await conn.answer(head=True)
        assert headers[b"transfer-encoding"] == b"chunked" and b"content-length" not in headers
        assert await read_chunked(conn.stream, conn.buffer) == b"first,second"
        await conn.send(b"GET /bad-header HTTP/1.1\r\nHost: h\r\n\r\n")
        status, headers, _ = await conn.answer()
        assert status.startswith(b"HTTP/1.1 500") and b"set-cookie" not in headers
        assert await conn.closed()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            answer = await client.get("/stream")
            assert answer.text == "first,second"
        shutdown.set()


async def test_http_1_0_long_heads_and_upgrades_on_a_kept_connection_end_it() -> None:
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app)
        conn = await Raw.to(port)
        await conn.send(b"GET /old HTTP/1.0\r\n\r\n")
        status, headers, body = await conn.answer()
        assert headers[b"connection"] == b"close" and json.loads(body)["path"] == "/old"
        assert await conn.closed()

        conn = await Raw.to(port)
        await conn.send(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n")
        await conn.answer()
        await conn.send(b"GET /long HTTP/1.1\r\nHost: h\r\nX-Long: " + b"a" * 20000)
        await trio.sleep(0.1)
        await conn.send(b"a" * 20000)  # a head past 16 KiB, still unfinished
        status, headers, _ = await conn.answer()
        assert status.startswith(b"HTTP/1.1 431"), status
        assert await conn.closed()

        conn = await Raw.to(port)
        await conn.send(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n")
        await conn.answer()
        await conn.send(b"GET /up HTTP/1.1\r\nHost: h\r\nUpgrade: other\r\nConnection: Upgrade\r\n\r\n")
        status, headers, body = await conn.answer()
        assert status.startswith(b"HTTP/1.1 200") and headers[b"connection"] == b"close"
        assert json.loads(body)["path"] == "/up"
        assert await conn.closed()
        shutdown.set()


async def test_a_head_trickling_in_after_a_request_is_cut_off_at_the_header_timeout() -> None:
    """A slowloris on a kept-alive connection: the next head a byte at a time. The head must end
    within ``header_timeout_s`` of its first byte, however often bytes come (the keep-alive
    deadline was restarted at every read: such a head held the connection for ever)."""
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app, keep_alive_timeout_s=5.0, header_timeout_s=1.0)
        conn = await Raw.to(port)
        await conn.send(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n")
        await conn.answer()
        started = trio.current_time()
        ended = None
        with trio.move_on_after(8):
            for byte in b"GET /second HTTP/1.1\r\nX-Slow: " + b"a" * 1000:
                try:
                    await conn.send(bytes((byte,)))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                with trio.move_on_after(0.2):
                    if await conn.stream.receive_some(65536) == b"":
                        break
            ended = trio.current_time() - started
        assert ended is not None and ended < 3.0, ended
        assert app.scopes[-1]["path"] == "/first"
        shutdown.set()


async def test_an_http_1_1_request_needs_one_host() -> None:
    """RFC 9112 3.2: none, or two, is 400 and the connection closes; HTTP/1.0 needs none."""
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app)
        for request in (b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /nohost HTTP/1.1\r\n\r\n",
                        b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /two HTTP/1.1\r\nHost: h\r\nHost: i\r\n\r\n"):
            conn = await Raw.to(port)
            await conn.send(request)
            status, _, body = await conn.answer()
            assert status.startswith(b"HTTP/1.1 200") and json.loads(body)["path"] == "/a"
            status, headers, _ = await conn.answer()
            assert status.startswith(b"HTTP/1.1 400") and headers[b"connection"] == b"close", request
            assert await conn.closed()
        assert [scope["path"] for scope in app.scopes] == ["/a", "/a"]
        conn = await Raw.to(port)
        await conn.send(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /old HTTP/1.0\r\n\r\n")
        await conn.answer()
        status, _, body = await conn.answer()
        assert status.startswith(b"HTTP/1.1 200") and json.loads(body)["path"] == "/old"
        shutdown.set()


async def test_a_streamed_answer_to_head_sends_no_chunks() -> None:
    """An answer to HEAD has no body: not even the chunked framing's last chunk, which the client
    would read as the start of the next answer."""
    app = App()
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, app)
        conn = await Raw.to(port)
        await conn.send(b"HEAD /stream HTTP/1.1\r\nHost: h\r\n\r\n")
        status, headers, _ = await conn.answer(head=True)
        assert status.startswith(b"HTTP/1.1 200") and headers[b"transfer-encoding"] == b"chunked"
        await conn.send(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
        status, _, body = await conn.answer()
        assert status.startswith(b"HTTP/1.1 200"), status  # the next answer, nothing before it
        assert json.loads(body)["path"] == "/next"
        shutdown.set()
