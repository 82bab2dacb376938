"""The front door's own gRPC server (``boxqueue.frontdoor.grpc_connections``), in process: a
:class:`GrpcServer` on a free loopback port with a few small methods, called by grpcio's client
(from a worker thread, as grpcio's blocking client wants) while the server runs on trio."""

from __future__ import annotations

import contextlib
import threading
import time

import grpc
import hpack
import pytest
import trio

from boxqueue.frontdoor.grpc_connections import (
    Call,
    GrpcError,
    GrpcServer,
    Limits,
    Method,
    Status,
    grpc_message,
)
from boxqueue.frontdoor.http2_codec import PREFACE, frame
from boxqueue.spaces.later import Later
from tests.raw_http2 import RawHttp2, ended, goaway, message, settings

LIMIT = 64 * 1024


class Methods:
    """``/t.T/Echo`` echoes; ``/t.T/Held`` waits until released (or cancelled); ``/t.T/Fail``
    raises; ``/t.T/Refuse`` ends with a status, a text and trailing metadata; ``/t.T/Big`` answers
    ``n`` bytes (its request is ``n`` as text); ``/t.T/Chat`` echoes each message of a stream."""

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.release = trio.Event()
        self.cancelled = trio.Event()
        self.metadata: list[tuple[str, str]] = []
        self.finished: list[tuple[str, Status]] = []
        self.pending: list[tuple[bytes, Later[bytes]]] = []

    def table(self) -> dict[str, Method]:
        return {
            "/t.T/Echo": Method(unary=self.echo),
            "/t.T/Held": Method(unary=self.held),
            "/t.T/Fail": Method(unary=self.fail),
            "/t.T/Refuse": Method(unary=self.refuse),
            "/t.T/Big": Method(unary=self.big),
            "/t.T/Chat": Method(stream=self.chat),
            "/t.T/Now": Method(quick=self.now),
            "/t.T/Soon": Method(quick=self.soon, failed=lambda exc: GrpcError(Status.ABORTED, f"failed: {exc}")),
            "/t.T/Task": Method(quick=self.task),
            "/t.T/Watch": Method(stream=self.watch),
        }

    async def echo(self, data: bytes, call: Call) -> bytes:
        self.metadata += call.metadata
        return data

    async def held(self, data: bytes, call: Call) -> bytes:
        self.entered.set()
        try:
            await self.release.wait()
        except trio.Cancelled:
            self.cancelled.set()
            raise
        return b"released"

    async def fail(self, data: bytes, call: Call) -> bytes:
        raise RuntimeError("the handler failed")

    async def refuse(self, data: bytes, call: Call) -> bytes:
        raise GrpcError(Status.FAILED_PRECONDITION, "nein: 100% ünicode\n", (("x-where", "here"),))

    async def big(self, data: bytes, call: Call) -> bytes:
        return b"b" * int(data)

    async def watch(self, requests, send, call: Call) -> None:
        """As health's Watch: reads its first message, then answers until the client leaves."""
        await requests.receive()
        await send(b"watching")
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled.set()
            raise

    async def chat(self, requests, send, call: Call) -> None:
        async for request in requests:
            await send(b"re:" + request)

    def now(self, data: bytes, call: Call) -> bytes:
        if data == b"raise":
            raise GrpcError(Status.INVALID_ARGUMENT, "refused at once")
        return b"now:" + data

    def soon(self, data: bytes, call: Call) -> Later[bytes]:
        """Settled by ``settle_soon`` (as a commit settles an engine call's Later)."""
        later: Later[bytes] = Later()
        self.pending.append((data, later))
        self.entered.set()
        return later

    def task(self, data: bytes, call: Call):
        async def later() -> bytes:
            await trio.sleep(0.01)
            return b"task:" + data

        return later()

    def settle_soon(self) -> None:
        for data, later in self.pending:
            if data == b"fail":
                later.settle(None, RuntimeError("the engine failed"))
            else:
                later.settle(b"soon:" + data)
        self.pending.clear()

    def done(self, call: Call, begun: object, status: Status, text: str) -> None:
        self.finished.append((call.method, status))


async def serving(nursery: trio.Nursery, methods: Methods, **limits) -> tuple[GrpcServer, int]:
    server = GrpcServer(methods.table(), limits=Limits(max_message_bytes=LIMIT, **limits),
                        finished=methods.done, name="test gRPC")
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    return server, port


def channel(port: int) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])


def blocking(fn):
    return trio.to_thread.run_sync(fn, abandon_on_cancel=True)


async def test_unary_calls_metadata_statuses_and_texts(nursery):
    methods = Methods()
    _, port = await serving(nursery, methods)

    def calls() -> dict:
        out = {}
        with channel(port) as ch:
            out["echo"] = ch.unary_unary("/t.T/Echo")(b"hello", metadata=[("x-id", "7")], timeout=30)
            out["empty"] = ch.unary_unary("/t.T/Echo")(b"", timeout=30)
            for name in ("Fail", "Refuse", "Nope"):
                try:
                    ch.unary_unary(f"/t.T/{name}")(b"x", timeout=30)
                except grpc.RpcError as exc:
                    out[name] = (exc.code(), exc.details(), dict(exc.trailing_metadata() or ()))
        return out

    out = await blocking(calls)
    assert out["echo"] == b"hello" and out["empty"] == b""
    assert ("x-id", "7") in methods.metadata
    code, text, _ = out["Fail"]
    assert code == grpc.StatusCode.UNKNOWN and "the handler failed" in text
    assert out["Refuse"] == (grpc.StatusCode.FAILED_PRECONDITION, "nein: 100% ünicode\n", {"x-where": "here"})
    assert out["Nope"][0] == grpc.StatusCode.UNIMPLEMENTED
    assert ("/t.T/Fail", Status.UNKNOWN) in methods.finished and ("/t.T/Echo", Status.OK) in methods.finished


def test_grpc_message_is_percent_encoded():
    assert grpc_message("ok: a/b") == b"ok: a/b"
    assert grpc_message("50%\n\u00e9") == b"50%25%0A%C3%A9"


async def test_a_deadline_cancels_the_handler_and_answers_deadline_exceeded(nursery):
    methods = Methods()
    _, port = await serving(nursery, methods)

    def call() -> grpc.StatusCode:
        with channel(port) as ch:
            try:
                ch.unary_unary("/t.T/Held")(b"", timeout=0.5)
            except grpc.RpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    assert await blocking(call) == grpc.StatusCode.DEADLINE_EXCEEDED
    with trio.fail_after(10):
        await methods.cancelled.wait()  # the server's own deadline, from grpc-timeout


async def test_a_client_that_cancels_cancels_the_handler(nursery):
    methods = Methods()
    _, port = await serving(nursery, methods)
    ch = channel(port)
    try:
        future = await blocking(lambda: ch.unary_unary("/t.T/Held").future(b""))
        with trio.fail_after(10):
            await methods.entered.wait()
        future.cancel()
        with trio.fail_after(10):
            await methods.cancelled.wait()
        assert await blocking(lambda: ch.unary_unary("/t.T/Echo")(b"still", timeout=30)) == b"still"
    finally:
        ch.close()


async def test_limits_answers_beyond_the_windows_and_compressed_requests(nursery):
    methods = Methods()
    _, port = await serving(nursery, methods)

    def calls() -> dict:
        out = {}
        with channel(port) as ch:
            echo = ch.unary_unary("/t.T/Echo")
            try:
                echo(b"x" * (LIMIT + 1), timeout=30)
            except grpc.RpcError as exc:
                out["over"] = (exc.code(), exc.details())
            out["at"] = len(echo(b"y" * LIMIT, timeout=30))
            out["gzip"] = echo(b"z" * 5000, timeout=30, compression=grpc.Compression.Gzip)
            try:
                ch.unary_unary("/t.T/Big")(str(LIMIT + 1).encode(), timeout=30)
            except grpc.RpcError as exc:
                out["answer over"] = exc.code()
            try:
                echo(b"m", metadata=[("x-big", "v" * 9000)], timeout=30)
            except grpc.RpcError as exc:
                out["metadata"] = exc.code()
        # An answer larger than the client's first windows (64 KiB) waits for its updates.
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1),
                                                                  ("grpc.http2.bdp_probe", 0)]) as ch:
            out["windowed"] = len(ch.unary_unary("/t.T/Big")(str(LIMIT).encode(), timeout=30))
        return out

    out = await blocking(calls)
    assert out["over"] == (grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max ({LIMIT + 1} vs. {LIMIT})")
    assert out["at"] == LIMIT
    assert out["gzip"] == b"z" * 5000
    assert out["answer over"] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert out["metadata"] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert out["windowed"] == LIMIT


async def test_a_large_answer_is_sent_within_the_clients_windows(nursery):
    """3 MiB out, where the client's windows start at 64 KiB (BDP probing off): the answer goes out
    as the client's window updates come."""
    methods = Methods()
    server = GrpcServer(methods.table(), limits=Limits(max_message_bytes=4 << 20), name="big")
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    size = 3 * 1024 * 1024

    def call() -> bytes:
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0),
                   ("grpc.max_receive_message_length", 8 << 20)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as ch:
            return ch.unary_unary("/t.T/Big")(str(size).encode(), timeout=30)

    assert await blocking(call) == b"b" * size


async def test_a_bidirectional_stream_is_answered_message_by_message(nursery):
    methods = Methods()
    _, port = await serving(nursery, methods)

    def chat() -> list[bytes]:
        answers: list[bytes] = []
        with channel(port) as ch:
            to_send: list[bytes] = []
            ready = threading.Event()

            def requests():
                for word in (b"a", b"b", b"c"):
                    yield word
                    # the next message only once the previous answer came back
                    assert ready.wait(10)
                    ready.clear()
                    to_send.append(word)

            for answer in ch.stream_stream("/t.T/Chat")(requests(), timeout=30):
                answers.append(answer)
                ready.set()
        return answers

    assert await blocking(chat) == [b"re:a", b"re:b", b"re:c"]


async def test_stopping_lets_calls_in_progress_finish_and_refuses_new_ones(nursery):
    methods = Methods()
    server, port = await serving(nursery, methods)
    ch = channel(port)
    try:
        future = await blocking(lambda: ch.unary_unary("/t.T/Held").future(b"", timeout=30))
        with trio.fail_after(10):
            await methods.entered.wait()
        stopped = trio.Event()

        async def stop() -> None:
            await server.stop(grace=30)
            stopped.set()

        nursery.start_soon(stop)
        await trio.sleep(0.2)
        assert not stopped.is_set()  # the call in progress holds it
        methods.release.set()
        assert await blocking(lambda: future.result(timeout=30)) == b"released"
        with trio.fail_after(10):
            await stopped.wait()
        with pytest.raises(grpc.RpcError):
            await blocking(lambda: ch.unary_unary("/t.T/Echo")(b"late", timeout=2))
    finally:
        ch.close()


async def test_the_concurrent_call_limit(nursery):
    methods = Methods()
    _, port = await serving(nursery, methods, max_calls=1)
    ch = channel(port)
    try:
        future = await blocking(lambda: ch.unary_unary("/t.T/Held").future(b"", timeout=30))
        with trio.fail_after(10):
            await methods.entered.wait()
        with pytest.raises(grpc.RpcError) as err:
            await blocking(lambda: ch.unary_unary("/t.T/Echo")(b"one too many", timeout=30))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        methods.release.set()
        assert await blocking(lambda: future.result(timeout=30)) == b"released"
        assert await blocking(lambda: ch.unary_unary("/t.T/Echo")(b"now", timeout=30)) == b"now"
    finally:
        ch.close()


async def test_garbage_and_silent_clients_are_closed_and_others_served(nursery):
    methods = Methods()
    _, port = await serving(nursery, methods, preface_timeout_s=0.5)
    silent = await trio.open_tcp_stream("127.0.0.1", port)
    garbage = await trio.open_tcp_stream("127.0.0.1", port)
    await garbage.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    started = time.monotonic()
    with trio.fail_after(10):
        for stream in (garbage, silent):
            while await stream.receive_some(65536):
                pass  # whatever the server says (its settings, a GOAWAY), until it closes
    assert time.monotonic() - started < 9
    assert await blocking(lambda: channel(port).unary_unary("/t.T/Echo")(b"fine", timeout=30)) == b"fine"


async def test_quick_calls_answered_at_once_later_or_from_a_task(nursery):
    """Quick methods run without a task of their own: answered at once, from the callback of what
    they return (with errors turned into statuses by the method's ``failed``), or from a task
    when they return a coroutine."""
    methods = Methods()
    server, port = await serving(nursery, methods)
    ch = channel(port)
    try:
        assert await blocking(lambda: ch.unary_unary("/t.T/Now")(b"a", timeout=30)) == b"now:a"
        with pytest.raises(grpc.RpcError) as err:
            await blocking(lambda: ch.unary_unary("/t.T/Now")(b"raise", timeout=30))
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "refused at once")
        assert await blocking(lambda: ch.unary_unary("/t.T/Task")(b"b", timeout=30)) == b"task:b"

        ok = await blocking(lambda: ch.unary_unary("/t.T/Soon").future(b"c", timeout=30))
        failing = await blocking(lambda: ch.unary_unary("/t.T/Soon").future(b"fail", timeout=30))
        with trio.fail_after(10):
            while len(methods.pending) < 2:
                await methods.entered.wait()
                methods.entered = trio.Event()
        assert server.calls == 2  # both in progress, neither holding a task
        methods.settle_soon()
        assert await blocking(lambda: ok.result(timeout=30)) == b"soon:c"
        with pytest.raises(grpc.RpcError) as err:
            await blocking(lambda: failing.result(timeout=30))
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.ABORTED, "failed: the engine failed")

        # Past its deadline when its result comes: DEADLINE_EXCEEDED (the client says so too).
        late = await blocking(lambda: ch.unary_unary("/t.T/Soon").future(b"d", timeout=0.3))
        with trio.fail_after(10):
            while not methods.pending:
                await methods.entered.wait()
                methods.entered = trio.Event()
        await trio.sleep(0.5)
        methods.settle_soon()
        with pytest.raises(grpc.RpcError) as err:
            await blocking(lambda: late.result(timeout=30))
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert ("/t.T/Soon", Status.ABORTED) in methods.finished
        assert await blocking(lambda: ch.unary_unary("/t.T/Now")(b"e", timeout=30)) == b"now:e"
    finally:
        ch.close()


async def test_a_connection_holding_too_much_unfinished_input_is_closed(nursery):
    """Many calls each sending most of a 4 MiB message and never its end: past 32 MiB held on
    one connection, the server says GOAWAY (ENHANCE_YOUR_CALM) and closes it; others are served."""
    methods = Methods()
    server = GrpcServer(methods.table(), limits=Limits(), name="bounded")
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    encoder = hpack.Encoder()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    prefix = b"\x00" + (4 << 20).to_bytes(4, "big") + b"p" * (16384 - 5)  # a 4 MiB message begins
    received = bytearray()

    async def send() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(PREFACE + frame(4, 0, 0))
            for sid in range(1, 2 * 10, 2):
                head = encoder.encode([(":method", "POST"), (":path", "/t.T/Echo"), (":scheme", "http"),
                                       ("content-type", "application/grpc")])
                await stream.send_all(frame(1, 0x4, sid, head) + frame(0, 0, sid, prefix))
                for _ in range(220):  # 3.4 MiB of the message, never its end
                    await stream.send_all(frame(0, 0, sid, b"p" * 16384))

    async def read() -> None:
        while data := await stream.receive_some(65536):
            received.extend(data)

    with trio.fail_after(60):
        async with trio.open_nursery() as inner:
            inner.start_soon(send)
            await read()
            inner.cancel_scope.cancel()
    goaway = received.rfind(b"\x07\x00\x00\x00\x00\x00")
    assert goaway >= 0 and int.from_bytes(received[goaway + 10:goaway + 14], "big") == 11  # ENHANCE_YOUR_CALM
    assert await blocking(lambda: channel(port).unary_unary("/t.T/Echo")(b"fine", timeout=30)) == b"fine"


async def wait_for(condition, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.01)


async def test_request_bytes_held_count_from_the_first_byte_even_compressed(nursery):
    """Finding 1: a unary message whose stream never ended was not counted once complete, and a
    gzip one was held decompressed (4 KiB on the wire held 4 MiB). Now every byte a connection
    holds for calls not yet given them counts, and a compressed message is held as it came:
    past MAX_HELD (32 MiB) the connection ends with GOAWAY ENHANCE_YOUR_CALM, and nothing stays
    held."""
    methods = Methods()
    server = GrpcServer(methods.table(), limits=Limits(max_message_bytes=4 << 20), name="held")
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    bomb = message(b"\x00" * (4 << 20), compressed=True)
    assert len(bomb) < 8192
    raw = await RawHttp2.open(port)
    for sid in range(1, 2 * 8, 2):
        await raw.send(raw.head(sid, "/t.T/Echo", metadata=[("grpc-encoding", "gzip")]) + raw.data(sid, bomb))
    await wait_for(lambda: server.held == 8 * (len(bomb) - 5))  # as they came, not 32 MiB
    whole = message(b"w" * (1 << 20))
    for sid in range(17, 17 + 2 * 40, 2):  # 40 MiB of complete messages, never their streams' end
        if not await raw.send(raw.head(sid, "/t.T/Echo") + raw.data(sid, whole)):
            break
    assert await raw.read(goaway, timeout=10), "no GOAWAY"
    assert raw.goaway()[0] == 11  # ENHANCE_YOUR_CALM
    await wait_for(lambda: server.held == 0)
    await raw.aclose()
    assert await blocking(lambda: channel(port).unary_unary("/t.T/Echo")(b"fine", timeout=30)) == b"fine"
    # A compressed message is decompressed (within the limit) when its call runs.
    assert await blocking(lambda: channel(port).unary_unary("/t.T/Echo")(
        b"z" * 5000, timeout=30, compression=grpc.Compression.Gzip)) == b"z" * 5000


async def test_the_server_refuses_a_message_past_its_bytes_held(nursery):
    """Across connections, a large message that would take the server into the last quarter of
    ``max_held_bytes`` is RESOURCE_EXHAUSTED; a small call still goes through."""
    methods = Methods()
    server = GrpcServer(methods.table(), limits=Limits(max_message_bytes=4 << 20, max_held_bytes=12 << 20),
                        name="held")
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    big = message(b"b" * (4 << 20))
    clients = [await RawHttp2.open(port) for _ in range(3)]
    for n, raw in enumerate(clients):
        await raw.send(raw.head(1, "/t.T/Echo") + raw.data(1, big))  # no END_STREAM: held
        if n < 2:  # held before the next one comes (the server reads the connections in any order)
            await wait_for(lambda n=n: server.held == (n + 1) * (len(big) - 5))
    assert await clients[2].read(ended(1), timeout=10)
    assert clients[2].status(1) == 8  # RESOURCE_EXHAUSTED
    await wait_for(lambda: server.held == 2 * len(big) - 10)
    assert await blocking(lambda: channel(port).unary_unary("/t.T/Echo")(b"small", timeout=30)) == b"small"
    for raw in clients:
        await raw.aclose()
    await wait_for(lambda: server.held == 0)


async def test_a_call_is_refused_at_its_head_before_its_body(nursery):
    """Finding 1: the guard (the token check) ran only once the request had ended, so a client
    without a token could make the server hold its message. Now it runs at the head."""
    methods = Methods()

    def guard(call: Call) -> None:
        if call.value("authorization") != "Bearer right":
            raise GrpcError(Status.UNAUTHENTICATED, "no")

    server = GrpcServer(methods.table(), limits=Limits(), guard=guard, name="guarded")
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    raw = await RawHttp2.open(port)
    await raw.send(raw.head(1, "/t.T/Echo") + raw.data(1, b"\x00\x00\x40\x00\x00" + b"x" * 1000))
    assert await raw.read(ended(1), timeout=5), "no answer before the request ended"
    assert raw.status(1) == 16  # UNAUTHENTICATED
    assert server.held == 0
    await raw.send(raw.data(1, b"x" * 10000))  # the rest of the body: dropped
    await raw.send(raw.head(3, "/t.T/Echo", metadata=[("authorization", "Bearer right")])
                   + raw.data(3, message(b"ok"), end=True))
    assert await raw.read(ended(3), timeout=5) and raw.status(3) == 0
    await raw.aclose()


async def test_a_watch_that_reads_no_more_is_ended_when_its_inbox_overflows(nursery):
    """Finding 1: a watch reads one message; what a client sends after it waited in a queue of 64
    messages of up to 4 MiB each, and when that overflowed the call was answered but its handler
    kept running (and its place in the server's calls). Now the inbox is bounded in messages and
    bytes, and overflowing it ends the call."""
    methods = Methods()
    server = GrpcServer(methods.table(), limits=Limits(max_message_bytes=1 << 20), finished=methods.done,
                        name="watch")
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    raw = await RawHttp2.open(port)
    await raw.send(raw.head(1, "/t.T/Watch") + raw.data(1, message(b"first")))
    assert await raw.read(lambda f: f[0] == 0 and f[2] == 1, timeout=5)  # "watching"
    assert server.calls == 1
    for _ in range(3):  # 3 MiB on an inbox of 1 MiB
        await raw.send(raw.data(1, message(b"m" * ((1 << 20) - 10))))
    assert await raw.read(ended(1), timeout=10)
    assert raw.status(1) == 8  # RESOURCE_EXHAUSTED
    with trio.fail_after(5):
        await methods.cancelled.wait()
    await wait_for(lambda: server.calls == 0 and server.held == 0 and server.streaming == 0)
    await raw.aclose()


async def test_a_reset_quick_call_frees_its_place_at_once(nursery):
    """Finding 2: a quick call reset by its client kept its place in the server's calls until its
    engine work settled, so resets could fill ``max_calls``. Now the reset gives it back; the
    work's later result is dropped."""
    methods = Methods()
    server, port = await serving(nursery, methods)
    raw = await RawHttp2.open(port)
    await raw.send(raw.head(1, "/t.T/Soon") + raw.data(1, message(b"x"), end=True))
    await wait_for(lambda: len(methods.pending) == 1)
    assert server.calls == 1
    await raw.send(raw.reset(1))
    await wait_for(lambda: server.calls == 0, timeout=5)
    methods.settle_soon()  # the work settles after: nothing to answer, nothing counted twice
    await trio.sleep(0.1)
    assert server.calls == 0 and 1 not in raw.answers
    await raw.aclose()


async def test_rapid_resets_fill_no_calls_and_end_the_connection(nursery):
    """Finding 2, the CVE-2023-44487 pattern: HEADERS, a message and RST_STREAM, over and over, on
    quick calls whose work never settles. The server's calls stay free and, past the budget of
    resets, the connection ends with GOAWAY ENHANCE_YOUR_CALM; other clients are served."""
    methods = Methods()
    server, port = await serving(nursery, methods, max_calls=64)
    raw = await RawHttp2.open(port)
    for sid in range(1, 2 * 2000, 2):
        burst = raw.head(sid, "/t.T/Soon") + raw.data(sid, message(b"r"), end=True) + raw.reset(sid)
        if not await raw.send(burst):
            break
    assert await raw.read(goaway, timeout=10)
    assert raw.goaway()[0] == 11
    assert server.calls == 0
    assert await blocking(lambda: channel(port).unary_unary("/t.T/Echo")(b"fine", timeout=30)) == b"fine"
    await raw.aclose()


async def test_streaming_calls_are_limited_per_connection(nursery):
    """Finding 3: 8 connections x 128 watches took all 1,024 calls. Now a connection runs at most
    ``max_streaming_per_connection`` streaming calls and the server at most half its calls."""
    methods = Methods()
    server, port = await serving(nursery, methods, max_streaming_per_connection=3, max_calls=8)
    raw = await RawHttp2.open(port)
    for sid in (1, 3, 5, 7):
        await raw.send(raw.head(sid, "/t.T/Watch") + raw.data(sid, message(b"w")))
    assert await raw.read(ended(7), timeout=5)
    assert raw.status(7) == 8 and all(raw.status(sid) is None for sid in (1, 3, 5))
    other = await RawHttp2.open(port)
    for sid in (1, 3):
        await other.send(other.head(sid, "/t.T/Watch") + other.data(sid, message(b"w")))
    assert await other.read(ended(3), timeout=5)
    assert other.status(3) == 8 and other.status(1) is None  # 4 of 8: the streaming half is full
    assert server.streaming == 4
    assert await blocking(lambda: channel(port).unary_unary("/t.T/Echo")(b"unary", timeout=30)) == b"unary"
    await raw.aclose()
    await other.aclose()
    await wait_for(lambda: server.calls == 0 and server.streaming == 0)


async def test_the_connections_deadlines(nursery):
    """Finding 3: after its first byte a connection had no deadline. Now: the preface within
    ``preface_timeout_s``; a frame or a head within ``header_timeout_s`` of its first byte; a
    unary request within ``body_timeout_s`` of its head; no call for ``idle_timeout_s``: GOAWAY.
    A busy client is not cut off."""
    methods = Methods()
    _, port = await serving(nursery, methods, preface_timeout_s=0.5, header_timeout_s=0.5, body_timeout_s=0.5,
                            idle_timeout_s=0.6)
    started = trio.current_time()
    partial = await RawHttp2.open(port, preface=False)
    await partial.send(PREFACE[:10])
    half_frame = await RawHttp2.open(port)
    await half_frame.send(frame(6, 0, 0, b"12345678")[:12])
    half_head = await RawHttp2.open(port)
    await half_head.send(frame(1, 0, 1, half_head.encoder.encode([(":method", "POST")])))  # no END_HEADERS
    body = await RawHttp2.open(port)
    await body.send(body.head(1, "/t.T/Echo") + body.data(1, b"\x00\x00\x00"))
    idle = await RawHttp2.open(port)
    for raw in (partial, half_frame, half_head, idle):
        assert await raw.read_to_close(timeout=5)
    assert trio.current_time() - started < 4
    for raw in (half_frame, half_head):
        assert raw.goaway()[0] == 11, raw.goaway()
    assert idle.goaway()[0] == 0  # NO_ERROR: a graceful end
    assert await body.read(ended(1), timeout=5)
    assert body.status(1) == 4 and "did not arrive" in body.heads(1)[-1]["grpc-message"]

    def busy() -> int:
        with channel(port) as ch:
            end = time.monotonic() + 2
            n = 0
            while time.monotonic() < end:
                assert ch.unary_unary("/t.T/Echo")(b"x", timeout=30) == b"x"
                n += 1
                time.sleep(0.05)
            return n

    assert await blocking(busy) > 10


async def test_an_unsupported_encoding_names_the_supported_ones(nursery):
    """Finding 4: UNIMPLEMENTED for an unknown grpc-encoding says what is accepted."""
    methods = Methods()
    _, port = await serving(nursery, methods)
    raw = await RawHttp2.open(port)
    await raw.send(raw.head(1, "/t.T/Echo", metadata=[("grpc-encoding", "br")]) + raw.data(1, message(b"x"), end=True))
    assert await raw.read(ended(1), timeout=5)
    trailers = raw.heads(1)[-1]
    assert trailers["grpc-status"] == "12" and trailers["grpc-accept-encoding"] == "identity,gzip"
    await raw.aclose()


async def test_an_answer_the_clients_window_holds_shut_is_given_up(nursery):
    """A client that sets its windows to 0 and never opens them: the answer waits
    ``send_timeout_s``, then the stream is reset and the call's place freed."""
    methods = Methods()
    server, port = await serving(nursery, methods, send_timeout_s=0.5)
    raw = await RawHttp2.open(port, first=settings((4, 0)))  # SETTINGS_INITIAL_WINDOW_SIZE 0
    await raw.send(raw.head(1, "/t.T/Big") + raw.data(1, message(b"100"), end=True))
    assert await raw.read(ended(1), timeout=5)
    assert raw.was_reset(1) == 8  # CANCEL
    await wait_for(lambda: server.calls == 0)
    await raw.aclose()


async def test_a_connection_decompresses_within_its_budget(nursery):
    """A gzip bomb is 4 KiB on the wire and 4 MiB (milliseconds of CPU) once inflated: a
    connection inflates INFLATE_BURST bytes at once, then INFLATE_RATE a second; past that a
    compressed call is RESOURCE_EXHAUSTED, and an uncompressed one still goes through."""
    methods = Methods()
    server = GrpcServer(methods.table(), limits=Limits(max_message_bytes=4 << 20), name="inflating")
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    raw = await RawHttp2.open(port)
    bomb = message(b"\x00" * (4 << 20), compressed=True)
    sids = range(1, 2 * 6, 2)
    # Big answers the number its request says: 4 MiB of zeros is none (UNKNOWN), once inflated.
    await raw.send(b"".join(raw.head(sid, "/t.T/Big", metadata=[("grpc-encoding", "gzip")]) + raw.data(sid, bomb, end=True)
                            for sid in sids))
    assert await raw.read(lambda f: all(raw.status(sid) is not None for sid in sids), timeout=10)
    statuses = [raw.status(sid) for sid in sids]
    assert statuses[0] == 2 and 8 in statuses, statuses
    refused = next(raw.heads(sid)[-1] for sid in sids if raw.status(sid) == 8)
    assert "decompressed bytes" in refused["grpc-message"]
    await raw.send(raw.head(21, "/t.T/Big") + raw.data(21, message(b"10"), end=True))
    assert await raw.read(ended(21), timeout=5) and raw.status(21) == 0
    await raw.aclose()
