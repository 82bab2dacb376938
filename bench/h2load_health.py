#!/usr/bin/env python3
"""h2load (Debian's nghttp2-client, a load generator we did not write) against the Deckard
listener's health check: requests per second, h2load's latencies and the server's CPU per call.

Starts boxqueue with the Deckard facade in a temporary directory, runs
``h2load -n N -c C -m M`` on ``/grpc.health.v1.Health/Check`` (a gRPC unary call, answered by a
task of its own), and fails if any request failed or errored.

    .venv/bin/python bench/h2load_health.py [--requests 100000] [--connections 10] [--streams 10]
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from deckard_cycle import process_cpu_s  # noqa: E402

HEALTH_REQUEST = b"\x00\x00\x00\x00\x00"  # an empty HealthCheckRequest, length-prefixed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--connections", type=int, default=10)
    parser.add_argument("--streams", type=int, default=10, help="concurrent streams per connection (-m)")
    args = parser.parse_args()
    if shutil.which("h2load") is None:
        print("h2load not found: apt-get install nghttp2-client (make install does so as root)")
        return 2
    with tempfile.TemporaryDirectory(prefix="h2load-bench-") as workdir:
        iproto, grpc_port = free_port(), free_port()
        config = Path(workdir) / "boxqueue.toml"
        config.write_text(f'data_dir = "data"\n[iproto]\nlisten = "127.0.0.1:{iproto}"\n'
                          f'[deckard]\nlisten = "127.0.0.1:{grpc_port}"\n')
        body = Path(workdir) / "health.bin"
        body.write_bytes(HEALTH_REQUEST)
        log = open(Path(workdir) / "server.log", "wb")  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(config), "--log-level", "WARNING"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", grpc_port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            command = ["h2load", "-n", str(args.requests), "-c", str(args.connections), "-m", str(args.streams),
                       "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers",
                       f"http://127.0.0.1:{grpc_port}/grpc.health.v1.Health/Check"]
            cpu_begin = process_cpu_s(server.pid)
            run = subprocess.run(command, capture_output=True, text=True, timeout=600)
            server_cpu_s = process_cpu_s(server.pid) - cpu_begin
        finally:
            server.terminate()
            server.wait(30)
            log.close()
    out = run.stdout
    print(out[out.find("finished in"):].rstrip())
    done = re.search(r"(\d+) succeeded, (\d+) failed, (\d+) errored", out)
    if run.returncode != 0 or done is None or done.group(2) != "0" or done.group(3) != "0":
        print("h2load reported failures", run.stderr)
        return 1
    print(f"server CPU {server_cpu_s * 1e6 / int(done.group(1)):.0f} us per call "
          f"({args.connections} connections x {args.streams} streams)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
