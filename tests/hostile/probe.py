"""A well-behaved client, run as a process of its own beside an attack (so that the attacker's
CPU in the test process does not count in its latencies): it calls one listener every
``interval`` seconds over one kept-alive connection, and prints its latencies as JSON.

    python -m tests.hostile.probe {deckard|zaqar|sonya|metrics} PORT SECONDS

It prints ``ready`` once its connection is up and warm, then measures for SECONDS.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

INTERVAL_S = 0.02


def caller(kind: str, port: int) -> Callable[[], bool]:
    """One call to the listener; True if it was answered as expected."""
    if kind == "deckard-raw":
        return raw_health_check(port)
    if kind == "deckard":
        import grpc
        from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
        from grpc_health.v1.health_pb2_grpc import HealthStub

        stub = HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]))
        return lambda: stub.Check(HealthCheckRequest(service=""), timeout=10).status == HealthCheckResponse.SERVING
    import uuid

    import httpx

    headers = {"Client-ID": str(uuid.uuid4()), "X-Project-Id": "probe"}  # Zaqar's, ignored by the others
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, headers=headers)
    if kind == "zaqar":
        return lambda: client.get("/v1.1/ping").status_code == 204
    if kind == "sonya":
        return lambda: client.get("/queue/listen/longpoll/no-such-queue").status_code == 404
    if kind == "metrics":
        return lambda: client.get("/health").status_code == 200
    raise SystemExit(f"unknown listener {kind!r}")


def raw_health_check(port: int) -> Callable[[], bool]:
    """Health/Check over a socket with frames made by hand (no client library's threads)."""
    import socket

    import hpack

    from boxqueue.frontdoor.http2_codec import PREFACE, frame

    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(PREFACE + frame(4, 0, 0))
    encoder = hpack.Encoder()
    state = {"sid": 1, "buffer": b""}
    fields = [(":method", "POST"), (":scheme", "http"), (":path", "/grpc.health.v1.Health/Check"),
              (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")]

    def call() -> bool:
        sid = state["sid"]
        state["sid"] += 2
        sock.sendall(frame(1, 4, sid, encoder.encode(fields)) + frame(0, 1, sid, b"\x00\x00\x00\x00\x00"))
        buffer = state["buffer"]
        while True:
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                length = int.from_bytes(buffer[:3], "big")
                kind, flags, stream = buffer[3], buffer[4], int.from_bytes(buffer[5:9], "big")
                buffer = buffer[9 + length:]
                if stream == sid and kind == 1 and flags & 1:
                    state["buffer"] = buffer
                    return True
            data = sock.recv(65536)
            if not data:
                return False
            buffer += data

    return call


def main() -> None:
    kind, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    call = caller(kind, port)
    for _ in range(10):
        assert call()
    print("ready", flush=True)
    latencies: list[float] = []
    errors: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        try:
            if not call():
                errors.append("unexpected answer")
        except Exception as exc:  # the client's own failure is what this records
            errors.append(f"{type(exc).__name__}: {exc}")
        latencies.append(time.perf_counter() - started)
        time.sleep(max(0.0, INTERVAL_S - (time.perf_counter() - started)))
    print(json.dumps({"latencies": latencies, "errors": errors[:5], "error_count": len(errors)}), flush=True)


if __name__ == "__main__":
    main()
