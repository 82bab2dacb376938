"""Instructions per request spent decoding and handling one request type, without the network.

Wall-clock figures on a shared 2-CPU machine vary by 15-30% from run to run; instruction counts
under valgrind's callgrind do not, so they show whether a change to the request path helped.

    .venv/bin/python bench/handle_cost.py select        # ping | select | ... | queue | deckard (see REQUESTS)

runs the request path N times in-process under callgrind (twice: 0 and N requests) and prints
the difference per request. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import callgrind

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = ("ping", "select", "call", "replace", "eval", "eval_get", "call_lua", "queue", "module", "put_many",
            "stream", "queue_stats", "server_call", "queue_wire", "deckard")


def workload(count: int, what: str, pool: int = 0) -> None:
    """Decode and handle ``count`` requests of one kind against a fresh in-process catalogue."""
    sys.path.insert(0, str(ROOT))
    import msgpack
    import trio

    import boxqueue  # noqa: F401 - first: BOXQUEUE_PURE=1 then measures the uncompiled sources
    from boxqueue.errcodes import BoxError
    from boxqueue.iproto import codec
    from boxqueue.iproto.builtins import register_builtins
    from boxqueue.iproto.dispatch import PENDING, Dispatcher
    from boxqueue.iproto.outbox import Outbox
    from boxqueue.iproto.session import Session
    from boxqueue.lua_box.engine import LuaEngine, LuaLimits
    from boxqueue.spaces.catalog import Catalog
    from boxqueue.spaces.definitions import FieldDef
    from boxqueue.spaces.procedures import Procedures
    from boxqueue.spaces.space_procedures import space_method_resolver
    from boxqueue.storage.commit import GroupCommitter
    from boxqueue.storage.environment import Storage

    bodies = {
        "ping": ({0: codec.PING, 1: 1}, None),
        "select": ({0: codec.SELECT, 1: 1, 5: 0}, {0x10: 512, 0x11: 0, 0x12: 1, 0x13: 0, 0x14: 0, 0x20: [42]}),
        "call": ({0: codec.CALL, 1: 1}, {0x22: "box.session.id", 0x21: []}),
        "replace": ({0: codec.REPLACE, 1: 1}, {0x10: 512, 0x21: [42, "y" * 32]}),
        "eval": ({0: codec.EVAL, 1: 1}, {0x27: "return ...", 0x21: [42]}),
        "eval_get": ({0: codec.EVAL, 1: 1}, {0x27: "return box.space.bench:get(...)", 0x21: [42]}),
        "call_lua": ({0: codec.CALL, 1: 1}, {0x22: "bench_echo", 0x21: [42]}),  # a global Lua function
    }
    if what in ("queue", "module", "put_many", "stream", "queue_stats", "server_call", "queue_wire"):
        queue_workload(count, what, pool)
        return
    if what == "deckard":
        deckard_workload(count)
        return
    header, body = bodies[what]
    payload = msgpack.packb(header) + (msgpack.packb(body) if body is not None else b"")
    frame = msgpack.packb(len(payload)) + payload
    workdir = tempfile.mkdtemp(prefix="handle_cost")

    async def main() -> None:
        storage = Storage(workdir, "none", map_size=1 << 28)
        committer = GroupCommitter(storage, rejections=(BoxError,))
        catalog = Catalog(storage, committer)
        catalog.load()
        async with trio.open_nursery() as nursery:
            await nursery.start(committer.run)
            space, _ = await catalog.create_space(
                "bench", space_id=512, format=(FieldDef("id", "unsigned"), FieldDef("p", "string"))
            )
            await catalog.create_index(space, "primary", parts=[[0, "unsigned"]])
            for i in range(100):
                await space.replace(None, [i, "x" * 32])
            procedures = Procedures()
            register_builtins(procedures, catalog)
            procedures.add_resolver(space_method_resolver(catalog))
            lua = LuaEngine(catalog, procedures, LuaLimits())
            await nursery.start(lua.run)
            dispatcher = Dispatcher(
                catalog, procedures, eval_handler=lambda session, expr, args: lua.eval(session.context, expr, args)
            )
            session = Session(1, catalog.access.guest)
            defined = lua.eval(session.context, "function bench_echo(...) return ... end", [])
            if not isinstance(defined, list):  # went on elsewhere (or an engine whose EVAL always waits)
                await defined
            decoder = codec.RequestDecoder()
            outbox = Outbox(1 << 30)
            for _ in range(count):
                decoder.feed(frame)
                answer = dispatcher.handle(session, decoder.next_event(), outbox)
                if answer is not None and answer is not PENDING:  # a request that waits: its coroutine
                    await answer
                outbox.take()
            # One more, checked (in both runs, so it does not count): the successful path is
            # what is measured, never an error.
            decoder.feed(frame)
            answer = dispatcher.handle(session, decoder.next_event(), outbox)
            if answer is not None and answer is not PENDING:
                outbox.out += await answer
            await trio.sleep(0.01)  # let queued writes commit
            _check_answer(bytes(outbox.take()))
            nursery.cancel_scope.cancel()
        storage.close()

    try:
        trio.run(main)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


QUEUE_ROUND = 100
PUT_MANY_ROWS = 1000


def queue_workload(count: int, what: str = "queue", pool: int = 0) -> None:
    """``count`` tasks through box.queue put, take and ack, QUEUE_ROUND tasks per round (each
    round's requests in flight together, as a loaded server sees them); handled as the iproto
    connection handles them: bytes at once, a later reply, or a coroutine run as a task.
    ``module``: the same through tarantool/queue's calls on a ``fifottl`` tube (queue.tube.bench:put,
    take and ack);
    ``put_many``: ``count`` tasks put into the box.queue space by boxqueue.put_many, PUT_MANY_ROWS a
    call (as the Spark tube writer puts them), none taken;
    ``stream``: ``pool`` tasks put the same way in both runs, then the Spark streaming source's
    calls for ``count`` of them: claims of PUT_MANY_ROWS tasks (boxqueue.stream_claim), each read
    whole (stream_read) and acked (stream_ack), what a streamed task costs the server;
    ``queue_stats``: ``count`` CALLs of box.queue.statistics on the same server with no tasks;
    ``server_call``: ``count`` CALLs of box.session.id there, the plain call to compare it with;
    ``queue_wire``: ``queue``'s rounds sent by a client over a real loopback connection to the
    server's iproto listener, so that the connection's own work (reading, framing, writing) counts,
    as it does in ``deckard``'s cycle (the figure to compare that one with)."""
    sys.path.insert(0, str(ROOT))
    import functools

    import msgpack
    import trio

    from boxqueue import process
    from boxqueue.cli import tune_interpreter
    from boxqueue.config import load_config
    from boxqueue.process import Server
    from boxqueue.storage.environment import Storage

    # valgrind refuses the default 1 TiB map reservation.
    process.Storage = functools.partial(Storage, map_size=1 << 28)  # type: ignore[misc]
    tune_interpreter()

    workdir = tempfile.mkdtemp(prefix="handle_cost")
    config_path = Path(workdir) / "queue.toml"
    shipped = (ROOT / "conf" / "boxqueue.toml").read_text()
    port = _free_port()
    config_path.write_text(f'data_dir = "data"\n[iproto]\nlisten = "127.0.0.1:{port}"\n[wal]\nmode = "none"\n' + shipped[shipped.index("[[space]]"):shipped.index("[deckard]")])

    # One packer for every frame: ``msgpack.packb`` makes a packer a call, and the three a
    # request took cost the harness some 15,000 instructions a task, counted in this benchmark's
    # figures until 2026-11-28 (the client's work, not the server's).
    packer = msgpack.Packer()

    def frame(sync: int, name: str, args: list) -> bytes:
        payload = packer.pack({0: 10, 1: sync}) + packer.pack({0x22: name, 0x21: args})
        return packer.pack(len(payload)) + payload

    async def main() -> None:
        from boxqueue.iproto import codec
        from boxqueue.iproto.dispatch import PENDING
        from boxqueue.iproto.outbox import Outbox
        from boxqueue.iproto.session import Session

        server = Server(load_config(config_path), handle_signals=False)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            dispatcher = server.dispatcher
            session = Session(1, server.catalog.access.guest)
            decoder = codec.RequestDecoder()
            outbox = Outbox(1 << 30)

            async def finish(coro: Any) -> None:
                outbox.reply_later(await coro)

            async def round_of(frames: list[bytes]) -> list[bytes]:
                for data in frames:
                    decoder.feed(data)
                    result = dispatcher.handle(session, decoder.next_event(), outbox)
                    if result is not None:
                        outbox.inflight += 1
                        if result is not PENDING:
                            nursery.start_soon(finish, result)
                while outbox.inflight:
                    outbox.reader_waiting = trio.Event()
                    await outbox.reader_waiting.wait()
                return _packets(outbox.take())

            data = "x" * 64
            if what == "queue_wire":
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                greeting = b""
                while len(greeting) < 128:
                    greeting += await stream.receive_some(128 - len(greeting))
                buffer = b""

                async def wire_round(frames: list[bytes]) -> list[bytes]:
                    nonlocal buffer
                    await stream.send_all(b"".join(frames))
                    answers: list[bytes] = []
                    while len(answers) < len(frames):
                        buffer += await stream.receive_some(1 << 20)
                        whole, buffer = _whole_packets(buffer)
                        answers += whole
                    return answers

                for first in range(0, count + QUEUE_ROUND, QUEUE_ROUND):  # one more round, checked
                    n = min(QUEUE_ROUND, count - first) if first < count else QUEUE_ROUND
                    await wire_round([frame(i, "box.queue.put", [0, "bench", 0, 0, 0, 0, data]) for i in range(n)])
                    ids = _task_ids(await wire_round([frame(i, "box.queue.take", [0, "bench", 0]) for i in range(n)]))
                    acked = await wire_round([frame(i, "box.queue.ack", [0, task_id]) for i, task_id in enumerate(ids)])
                    if first >= count:
                        for answer in acked:
                            _check_answer(answer)
                await stream.aclose()
                server.stop()
                return
            if what == "module":
                # Over CALL, create_tube answers that its tube object cannot be encoded, as the
                # module does on Tarantool: the tube exists all the same.
                await round_of([frame(0, "queue.create_tube", ["bench", "fifottl"])])
                for first in range(0, count, QUEUE_ROUND):
                    n = min(QUEUE_ROUND, count - first)
                    await round_of([frame(i, "queue.tube.bench:put", [data]) for i in range(n)])
                    taken = await round_of([frame(i, "queue.tube.bench:take", [0]) for i in range(n)])
                    ids = _task_ids(taken)
                    await round_of([frame(i, "queue.tube.bench:ack", [task_id]) for i, task_id in enumerate(ids)])
                server.stop()
                return
            if what in ("put_many", "stream"):
                row = [0, 0, 0, 0, data]
                puts = pool if what == "stream" else count
                for first in range(0, puts, PUT_MANY_ROWS):
                    n = min(PUT_MANY_ROWS, puts - first)
                    (answer,) = await round_of([frame(first, "boxqueue.put_many", [0, "bench", [row] * n])])
                    _check_answer(answer)  # (an unpacker a call: 40 instructions a task)
                if what == "stream":
                    for first in range(0, count, PUT_MANY_ROWS):
                        n, claim = min(PUT_MANY_ROWS, count - first), f"bench.{first}"
                        for name, args in (("boxqueue.stream_claim", [0, "bench", claim, n, 60]),
                                           ("boxqueue.stream_read", [0, "bench", claim, 0, n]),
                                           ("boxqueue.stream_ack", [0, "bench", [claim]])):
                            (answer,) = await round_of([frame(first, name, args)])
                            data = _check_answer(answer)
                            got = len(data[2]) if name == "boxqueue.stream_read" else data[0]
                            if got != n:
                                raise RuntimeError(f"{name} answered for {got} tasks, not {n}")
                server.stop()
                return
            if what != "queue":
                name = "box.queue.statistics" if what == "queue_stats" else "box.session.id"
                for first in range(0, count, QUEUE_ROUND):
                    await round_of([frame(i, name, []) for i in range(min(QUEUE_ROUND, count - first))])
                server.stop()
                return
            for first in range(0, count, QUEUE_ROUND):
                n = min(QUEUE_ROUND, count - first)
                await round_of([frame(i, "box.queue.put", [0, "bench", 0, 0, 0, 0, data]) for i in range(n)])
                taken = await round_of([frame(i, "box.queue.take", [0, "bench", 0]) for i in range(n)])
                ids = _task_ids(taken)
                await round_of([frame(i, "box.queue.ack", [0, task_id]) for i, task_id in enumerate(ids)])
            server.stop()

    try:
        trio.run(main)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


DECKARD = "/blipai.deckard.Deckard/"


def _h2_fields(method: str) -> list[tuple[str, str]]:
    """A gRPC request's head as grpcio's C core sends it (without a deadline)."""
    return [(":method", "POST"), (":scheme", "http"), (":path", DECKARD + method), (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-accept-encoding", "identity,deflate,gzip"),
            ("user-agent", "grpc-python/1.66.0 grpc-c/43.0.0 (linux; chttp2)")]


def deckard_workload(count: int) -> None:
    """``count`` Deckard cycles (Add one message, Pull one, Ack it with removeMessage) over a real
    loopback HTTP/2 connection to the whole server's gRPC door, QUEUE_ROUND calls of a kind in
    flight together, as ``queue`` runs box.queue's put, take and ack. The client writes prebuilt
    frames and counts the trailers' END_STREAM flags, so that its own share stays small: a
    template message with the id's digits replaced, and a head per method encoded once by
    ``hpack`` (as a real client's encoder does, each field is entered in the dynamic table by the
    first call and referred to by its index after: a cycle of one message first, in both runs,
    enters them). One more round, checked (answers decoded, every message added, pulled and
    acked), runs in both callgrind runs too."""
    sys.path.insert(0, str(ROOT))
    import functools

    import hpack
    import trio

    from boxqueue import process
    from boxqueue.cli import tune_interpreter
    from boxqueue.config import load_config
    from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
    from boxqueue.frontdoor.http2_codec import PREFACE, frame  # a frame is laid out alike both ways
    from boxqueue.process import Server
    from boxqueue.storage.environment import Storage

    process.Storage = functools.partial(Storage, map_size=1 << 28)  # type: ignore[misc]
    tune_interpreter()
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="handle_cost")
    config_path = Path(workdir) / "deckard.toml"
    shipped = (ROOT / "conf" / "boxqueue.toml").read_text()
    section = shipped[shipped.index("[deckard]"):shipped.index("[zaqar]")].replace("127.0.0.1:8081", f"127.0.0.1:{port}")
    config_path.write_text('data_dir = "data"\n[wal]\nmode = "none"\n' + shipped[shipped.index("[[space]]"):shipped.index("[deckard]")]
                           + section)

    queue = "bench"
    add = pb.AddRequest(messages=[pb.AddMessage(id="m0000000", queue=queue, string_payload="x" * 64)]).SerializeToString()
    pull = pb.PullRequest(queue=queue, amount=1).SerializeToString()
    ack = pb.AckRequest(queue=queue, id="m0000000", removeMessage=True).SerializeToString()
    encoder = hpack.Encoder()
    heads: dict[str, bytes] = {}

    def message(body: bytes) -> bytes:
        return b"\0" + len(body).to_bytes(4, "big") + body

    class Client:
        def __init__(self, stream: trio.SocketStream) -> None:
            self.stream = stream
            self.sid = 1
            self.buffer = b""

        async def round_of(self, method: str, bodies: list[bytes], keep: bool = False) -> list[bytes]:
            """Sends the calls, waits for all their trailers; the answers' messages when ``keep``."""
            out = []
            for body in bodies:
                head = heads.get(method) or encoder.encode(_h2_fields(method))
                out.append(frame(1, 4, self.sid, head) + frame(0, 1, self.sid, message(body)))
                self.sid += 2
            await self.stream.send_all(b"".join(out))
            ended, answers, buffer = 0, [], self.buffer
            while ended < len(bodies):
                buffer += await self.stream.receive_some(1 << 20)
                pos = 0
                while len(buffer) - pos >= 9:
                    end = pos + 9 + int.from_bytes(buffer[pos:pos + 3], "big")
                    if end > len(buffer):
                        break
                    kind, flags = buffer[pos + 3], buffer[pos + 4]
                    if kind == 1 and flags & 1:
                        ended += 1
                    elif kind == 0 and keep:
                        answers.append(buffer[pos + 14:end])  # one whole message a DATA frame here
                    elif kind == 7:
                        raise RuntimeError(f"GOAWAY: {buffer[pos + 17:end]!r}")
                    pos = end
                buffer = buffer[pos:]
            self.buffer = buffer
            return answers

    async def cycles(client: Client, first: int, n: int, check: bool) -> None:
        ids = [b"m%07d" % i for i in range(first, first + n)]  # 1,000,000 first: the warming cycle
        added = await client.round_of("Add", [add.replace(b"m0000000", i) for i in ids], check)
        pulled = await client.round_of("Pull", [pull] * n, check)
        acked = await client.round_of("Ack", [ack.replace(b"m0000000", i) for i in ids], check)
        if check:
            got = sorted(m.id.encode() for a in pulled for m in pb.PullResponse.FromString(a).messages)
            if (sum(pb.AddResponse.FromString(a).created_count for a in added) != n or got != ids
                    or sum(pb.AckResponse.FromString(a).success for a in acked) != n):
                raise RuntimeError("a Deckard call failed: not every message was added, pulled and acked")

    async def main() -> None:
        server = Server(load_config(config_path), handle_signals=False)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            settings = frame(4, 0, 0, (4).to_bytes(2, "big") + (1 << 30).to_bytes(4, "big"))  # INITIAL_WINDOW_SIZE
            await stream.send_all(PREFACE + settings + frame(8, 0, 0, ((1 << 31) - 1 - 65535).to_bytes(4, "big")))
            client = Client(stream)
            await cycles(client, 1_000_000, 1, True)  # enters the heads' fields in the tables
            for method in ("Add", "Pull", "Ack"):
                heads[method] = encoder.encode(_h2_fields(method))
                if encoder.encode(_h2_fields(method)) != heads[method]:
                    raise RuntimeError("a head is still changing the dynamic table")
            for first in range(0, count, QUEUE_ROUND):
                await cycles(client, first, min(QUEUE_ROUND, count - first), False)
            await cycles(client, count, QUEUE_ROUND, True)
            await stream.aclose()
            server.stop()

    try:
        trio.run(main)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _check_answer(answer: bytes) -> Any:
    """The workload measures the successful path: stop on an error answer, else its data (None
    for an answer with no data, as a ping's)."""
    import msgpack

    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(answer)
    unpacker.unpack()  # length
    header = unpacker.unpack()
    if header[0] != 0:
        raise RuntimeError(f"the request failed: {unpacker.unpack()}")
    for body in unpacker:
        return body.get(0x30)
    return None


def _packets(data: bytes | bytearray) -> list[bytes]:
    """Whole response packets (0xCE length prefix) from a buffer of them."""
    return _whole_packets(data)[0]


def _whole_packets(data: bytes | bytearray) -> tuple[list[bytes], bytes]:
    """The whole response packets (0xCE length prefix) a buffer begins with, and the rest."""
    out, pos = [], 0
    while len(data) - pos >= 5:
        end = pos + 5 + int.from_bytes(data[pos + 1 : pos + 5], "big")
        if end > len(data):
            break
        out.append(bytes(data[pos:end]))
        pos = end
    return out, bytes(data[pos:])


def _task_ids(answers: list[bytes]) -> list[str]:
    """The task ids of a round's take answers, decoded by one streaming unpacker (making an
    ``Unpacker`` zeroes its 40 KB stack: one per answer cost the harness some 40,000
    instructions a task, counted in this benchmark's figures until 2026-11-27)."""
    import msgpack

    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(b"".join(answers))
    ids = []
    for _ in answers:
        unpacker.unpack()  # length
        header = unpacker.unpack()
        body = unpacker.unpack()
        if header[0] != 0:
            raise RuntimeError(f"take failed: {body}")
        ids.append(body[0x30][0][0])
    return ids


def instructions(count: int, what: str, pool: int = 0) -> int:
    return callgrind.instructions(__file__, ["--run", str(count), "--pool", str(pool), what])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="*", help=f"any of {', '.join(REQUESTS)} (default: all)")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--pool", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = set(args.what) - set(REQUESTS)
    if unknown:
        parser.error(f"unknown request kinds: {', '.join(sorted(unknown))}")
    args.what = args.what or list(REQUESTS)
    if args.run is not None:
        workload(args.run, args.what[0], args.pool)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 1
    for what in args.what:
        pool = args.count if what == "stream" else 0  # the same tasks put in both runs
        per_request = (instructions(args.count, what, pool) - instructions(0, what, pool)) / args.count
        unit = ("instructions/task (put, take, ack)" if what in ("queue", "module") else
                "instructions/task (put)" if what == "put_many" else
                "instructions/task (claim, read, ack)" if what == "stream" else
                "instructions/cycle (add, pull, ack)" if what == "deckard" else
                "instructions/task (put, take, ack over a connection)" if what == "queue_wire" else "instructions/request")
        print(f"{what:8s} {per_request:9,.0f} {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
