"""What a scrape of /metrics (and a dashboard snapshot) costs with many tubes.

Starts boxqueue with a [metrics] listener, puts tasks into N tubes over iproto (a ready, a taken
and a delayed task in each, so every series has a value), then times scrapes of /metrics and
of /api/snapshot (the page's JSON for one page of 50 tubes): wall time per request on the client
and the server's CPU time per request (from /proc), with the size of the answer.

    .venv/bin/python bench/metrics_scrape.py --tubes 10000 --scrapes 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import tarantool

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.queue_fixtures import QUEUE_SPACE_0  # noqa: E402
from tests.serverproc import free_port, wait_for_greeting  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Pinger:
    """One client sending PINGs one after the other: how long the event loop makes a request wait."""

    def __init__(self, port: int) -> None:
        import socket

        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.recv(128)
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import msgpack

        body = msgpack.packb({0x00: 64, 0x01: 1}) + msgpack.packb({})
        frame = b"\xce" + len(body).to_bytes(4, "big") + body
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self.sock.sendall(frame)
            got = b""
            while len(got) < 5 or len(got) < 5 + int.from_bytes(got[1:5], "big"):
                got += self.sock.recv(4096)
            self.times.append(time.perf_counter() - t0)
            time.sleep(0.002)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()

    def summary(self) -> str:
        ordered = sorted(self.times)
        if not ordered:
            return "no pings"
        p99 = ordered[int(len(ordered) * 0.99) - 1 if len(ordered) > 1 else 0]
        return (f"{len(ordered)} pings: p50 {1000 * statistics.median(ordered):.2f} ms, p99 {1000 * p99:.2f} ms, "
                f"max {1000 * ordered[-1]:.1f} ms")


def timed(url: str, pid: int, count: int) -> tuple[list[float], float, int]:
    walls = []
    size = 0
    cpu0 = cpu_seconds(pid)
    for _ in range(count):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as response:
            size = len(response.read())
        walls.append(time.perf_counter() - t0)
    return walls, (cpu_seconds(pid) - cpu0) / count, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tubes", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="metrics-scrape-"))
    port, metrics_port = free_port(), free_port()
    (tmp / "boxqueue.toml").write_text(
        f'data_dir = "data"\n[iproto]\nlisten = "127.0.0.1:{port}"\n[wal]\nmode = "none"\n'
        f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n{QUEUE_SPACE_0}'
    )
    with open(tmp / "server.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "boxqueue.cli", "serve", "--config", str(tmp / "boxqueue.toml")],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_greeting(port, 60, proc)
        conn = tarantool.connect("127.0.0.1", port)
        t0 = time.monotonic()
        for i in range(args.tubes):
            tube = f"tube{i:05d}"
            conn.call("box.queue.put", [0, tube, 0, 0, 0, 0, "taken"])
            conn.call("box.queue.take", [0, tube, 0])
            conn.call("box.queue.put", [0, tube, 0, 0, 0, 0, "ready"])
            conn.call("box.queue.put", [0, tube, 3600, 0, 0, 0, "delayed"])
        print(f"{args.tubes:,} tubes, 3 tasks each, put in {time.monotonic() - t0:.1f} s", flush=True)
        base = f"http://127.0.0.1:{metrics_port}"
        with Pinger(port) as idle:
            time.sleep(3)
        print(f"pings with nobody scraping:     {idle.summary()}", flush=True)
        for name, url in (("/metrics", base + "/metrics"), ("/api/snapshot (50 rows)", base + "/api/snapshot"),
                          ("/api/snapshot?q=tube0999", base + "/api/snapshot?q=tube0999")):
            timed(url, proc.pid, 2)  # warm up
            with Pinger(port) as during:
                walls, cpu, size = timed(url, proc.pid, args.scrapes)
            print(f"{name:28s} wall p50 {1000 * statistics.median(walls):7.1f} ms  max {1000 * max(walls):7.1f} ms  "
                  f"server CPU {1000 * cpu:7.1f} ms/request  {size / 1024:8.0f} KiB", flush=True)
            print(f"    pings meanwhile: {during.summary()}", flush=True)
        text = urllib.request.urlopen(base + "/metrics", timeout=120).read().decode()
        samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        print(f"/metrics holds {samples:,} samples", flush=True)
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
