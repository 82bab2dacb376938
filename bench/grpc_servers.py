#!/usr/bin/env python3
"""gRPC server candidates for the Deckard facade, side by side on a bare unary echo.

Each candidate serves ``/bench.Echo/Echo`` (a ``google.protobuf.BytesValue`` in, the same out) in
a process of its own; ``--clients`` grpcio clients (threads over ``--procs`` processes, one
channel each) call it one call at a time, as Deckard's clients do. Reported: calls/s and the
server process's CPU per call (user + system, /proc) over the measured window.

Candidates (``--servers``):

* ``threadpool``: grpcio's thread-pool server (``grpc.server``), the handler answering at once;
* ``threadpool-trio``: the same, each call handed to a trio loop in another thread and its answer
  handed back, as Deckard's bridge to the engine did until the front door served gRPC itself (the
  hop's cost);
* ``aio``: grpcio's asyncio server (``grpc.aio``) on its own loop;
* ``aio-trio``: the asyncio server, each call handed to a trio loop thread and back;
* ``h2-trio``: gRPC's unary framing over the ``h2`` library on trio, one task per connection, the
  answer written in the task that read the request: what serving Deckard from our own front door
  (as the Zaqar facade's HTTP/1.1 is served) would cost in transport, before any of gRPC's other
  duties (deadlines, metadata limits, compression flags, status details, TLS with ALPN);
* ``front-door``: the server Deckard runs on, ``boxqueue/frontdoor/grpc_connections.py`` (HTTP/2 by
  its own codec, with gRPC's other duties: deadlines, limits, statuses, a task per call), the echo
  as its method;
* ``purerpc``: purerpc (gRPC over h2 on anyio) on trio. purerpc 0.8 needs ``h2 < 4`` where the
  project has h2 4, so it runs from another interpreter: ``--purerpc-python`` names one that has
  purerpc, trio and protobuf (a venv of its own).

    .venv/bin/python bench/grpc_servers.py --servers threadpool,threadpool-trio,aio,aio-trio
    .venv/bin/python bench/grpc_servers.py --servers purerpc --purerpc-python /tmp/prpc/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing import get_context
from pathlib import Path

SERVERS = ("threadpool", "threadpool-trio", "aio", "aio-trio", "purerpc", "h2-trio", "front-door")
METHOD = "/bench.Echo/Echo"


# --------------------------------------------------------------------------- servers (child process)


def _trio_loop() -> tuple[object, threading.Thread]:
    """A trio loop in a thread of its own; returns its token once it runs."""
    import trio

    ready: list[object] = []
    started = threading.Event()

    async def main() -> None:
        ready.append(trio.lowlevel.current_trio_token())
        started.set()
        await trio.sleep_forever()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    started.wait()
    return ready[0], thread


def _hop(token: object, value: bytes) -> bytes:
    """The bridge's round trip: run on trio (``run_sync_soon``), block on a queue for the answer."""
    import queue

    answer: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    token.run_sync_soon(answer.put, value)  # type: ignore[attr-defined]
    return answer.get()


def serve_grpcio(kind: str, port: int) -> None:
    from concurrent import futures

    import grpc
    from google.protobuf.wrappers_pb2 import BytesValue

    token = _trio_loop()[0] if kind.endswith("-trio") else None

    def echo(request: BytesValue, _context: object) -> BytesValue:
        if token is not None:
            return BytesValue(value=_hop(token, request.value))
        return request

    handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(
            echo, request_deserializer=BytesValue.FromString, response_serializer=BytesValue.SerializeToString),
    })
    if kind.startswith("threadpool"):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print("ready", flush=True)
        server.wait_for_termination()
        return

    import asyncio

    async def aio_echo(request: BytesValue, _context: object) -> BytesValue:
        if token is None:
            return request
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def answered(value: bytes) -> None:
            loop.call_soon_threadsafe(future.set_result, value)

        token.run_sync_soon(answered, request.value)  # type: ignore[attr-defined]
        return BytesValue(value=await future)

    aio_handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(
            aio_echo, request_deserializer=BytesValue.FromString, response_serializer=BytesValue.SerializeToString),
    })

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((aio_handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


PURERPC_SERVER = r"""
import sys
import purerpc, trio
from google.protobuf.wrappers_pb2 import BytesValue

service = purerpc.Service("bench.Echo")

@service.rpc("Echo")
async def echo(message: BytesValue) -> BytesValue:
    return message

server = purerpc.Server(int(sys.argv[1]))
server.add_service(service)
print("ready", flush=True)
server.serve(backend="trio")
"""


def serve_h2_trio(port: int) -> None:
    """A bare gRPC unary echo over h2 on trio (see the module docstring)."""
    import h2.config
    import h2.connection
    import h2.events
    import trio

    config = h2.config.H2Configuration(client_side=False, header_encoding=None)
    answer_head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    trailers = [(b"grpc-status", b"0")]

    async def connection(stream: trio.SocketStream) -> None:
        conn = h2.connection.H2Connection(config=config)
        conn.initiate_connection()
        await stream.send_all(conn.data_to_send())
        bodies: dict[int, bytearray] = {}
        while data := await stream.receive_some(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    bodies[event.stream_id] = bytearray()
                elif isinstance(event, h2.events.DataReceived):
                    bodies[event.stream_id] += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    message = bytes(bodies.pop(event.stream_id))  # 5-byte prefix + BytesValue: echoed
                    conn.send_headers(event.stream_id, answer_head)
                    conn.send_data(event.stream_id, message)
                    conn.send_headers(event.stream_id, trailers, end_stream=True)
            if out := conn.data_to_send():
                await stream.send_all(out)

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        print("ready", flush=True)
        await trio.serve_listeners(connection, listeners)

    trio.run(main)


def serve_front_door(port: int) -> None:
    """The echo on the front door's gRPC server (see the module docstring)."""
    import trio

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from boxqueue.frontdoor.grpc_connections import Call, GrpcServer, Method

    async def echo(data: bytes, call: Call) -> bytes:
        return data

    async def main() -> None:
        server = GrpcServer({METHOD: Method(unary=echo)})
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, "127.0.0.1", port)
            print("ready", flush=True)

    trio.run(main)


# --------------------------------------------------------------------------- clients


def _client_proc(port: int, threads: int, start_at: float, measure_from: float, stop_at: float) -> dict:
    import grpc
    from google.protobuf.wrappers_pb2 import BytesValue

    counts = [0] * threads
    errors = [0] * threads
    payload = BytesValue(value=b"x" * 64).SerializeToString()

    def run(i: int) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(METHOD)  # bytes in and out: no client-side (de)serialising
            grpc.channel_ready_future(channel).result(timeout=30)
            while time.time() < start_at:
                time.sleep(0.005)
            while (now := time.time()) < stop_at:
                try:
                    call(payload, timeout=10)
                except grpc.RpcError:
                    errors[i] += 1
                    continue
                if now >= measure_from:
                    counts[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"calls": sum(counts), "errors": sum(errors)}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(kind: str, args: argparse.Namespace) -> dict:
    port = _free_port()
    if kind == "purerpc":
        if not args.purerpc_python:
            return {"server": kind, "skipped": "needs --purerpc-python (purerpc needs h2 < 4)"}
        command = [args.purerpc_python, "-c", PURERPC_SERVER, str(port)]
    else:
        command = [sys.executable, __file__, "--serve", kind, "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            return {"server": kind, "failed": "the server did not start"}
        time.sleep(0.5)
        start_at = time.time() + 1.0
        measure_from = start_at + args.warmup
        stop_at = measure_from + args.duration
        per_proc = [args.clients // args.procs + (1 if i < args.clients % args.procs else 0) for i in range(args.procs)]
        with get_context("fork").Pool(args.procs) as pool:
            pending = pool.starmap_async(_client_proc, [(port, n, start_at, measure_from, stop_at) for n in per_proc])
            time.sleep(max(0.0, measure_from - time.time()))
            cpu0 = _cpu_s(server.pid)
            time.sleep(max(0.0, stop_at - time.time()))
            cpu = _cpu_s(server.pid) - cpu0
            results = pending.get(timeout=args.duration + 120)
    finally:
        server.terminate()
        server.wait(10)
    calls = sum(r["calls"] for r in results)
    return {"server": kind, "calls_per_s": calls / args.duration, "server_cpu_us_per_call": cpu * 1e6 / calls if calls else None,
            "errors": sum(r["errors"] for r in results)}


def main() -> int:
    parser = argparse.ArgumentParser(description="gRPC server candidates on a unary echo (see the module docstring).")
    parser.add_argument("--servers", default="threadpool,threadpool-trio,aio,aio-trio")
    parser.add_argument("--clients", type=int, default=16, help="sequential clients, one channel each")
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--purerpc-python", help="an interpreter with purerpc, trio and protobuf installed")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "h2-trio":
        serve_h2_trio(args.port)
        return 0
    if args.serve == "front-door":
        serve_front_door(args.port)
        return 0
    if args.serve:
        serve_grpcio(args.serve, args.port)
        return 0
    kinds = [k for k in args.servers.split(",") if k]
    unknown = [k for k in kinds if k not in SERVERS]
    if unknown:
        print(f"unknown servers: {', '.join(unknown)} (choose from {', '.join(SERVERS)})", file=sys.stderr)
        return 2
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"{args.clients} sequential clients over {args.procs} processes, {args.warmup:g} s warm-up, "
          f"{args.duration:g} s measured; 64-byte BytesValue echo", flush=True)
    rows = []
    for kind in kinds:
        row = measure(kind, args)
        rows.append(row)
        if "calls_per_s" in row:
            print(f"{kind:<16} {row['calls_per_s']:>9,.0f} calls/s  {row['server_cpu_us_per_call']:>7.0f} us server CPU/call"
                  f"  errors {row['errors']}", flush=True)
        else:
            print(f"{kind:<16} {row.get('skipped') or row.get('failed')}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
