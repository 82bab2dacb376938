#!/usr/bin/env python3
"""Zaqar v1.1 post -> claim -> delete cycle over HTTP, end to end (messages/s).

Starts a boxqueue server (wal fsync by default) with the Zaqar facade in a temporary directory,
then runs ``--clients`` concurrent HTTP clients spread over ``--procs`` worker processes. Each
client repeats: POST ``--batch`` messages to its queue, claim them (``limit=--batch``), DELETE
each with its claim id. The headline is messages deleted per second in the measured window,
with p50/p99 of the whole cycle.

``--client raw`` (the default) writes each request's bytes itself and reads answers framed by
``Content-Length`` (reconnecting when the server says ``Connection: close``, as gunicorn's sync
workers do after every answer), like ``wrk``: on this two-core machine httpx spent more CPU per
message than the server it measured, so with httpx the figure was the client's. ``--client httpx``
runs the same cycle with httpx.

    .venv/bin/python bench/zaqar_cycle.py --clients 16 --seconds 10

``--url`` drives an already running server instead (no boxqueue is started), for instance real
OpenStack Zaqar started by ``bench/real_zaqar.sh``:

    .venv/bin/python bench/zaqar_cycle.py --url http://127.0.0.1:8888 --seconds 10

``--against-real`` runs the same load, after boxqueue's, against real Zaqar started fresh for the
run by ``bench/real_zaqar.sh`` (so both start empty: Zaqar on Redis slows as expired claims pile
up), on Redis as it ships, with ``appendfsync always`` (durable per write, as ``wal fsync``), or
both, and prints the ratios:

    .venv/bin/python bench/zaqar_cycle.py --seconds 10 --against-real both
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from multiprocessing import get_context
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.serverproc import ServerProcess, free_port


class HttpxHttp:
    """The same requests through httpx (``--client httpx``)."""

    def __init__(self, base: str, headers: dict[str, str]) -> None:
        self.client = httpx.AsyncClient(base_url=base, headers=headers, timeout=60)

    async def request(self, method: str, target: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else None
        answer = await self.client.request(method, target, content=body, headers=headers)
        return answer.status_code, answer.content

    async def aclose(self) -> None:
        await self.client.aclose()


class RawHttp:
    """A keep-alive HTTP/1.1 client that writes its requests' bytes itself and reads answers
    framed by Content-Length (what both servers send here); it reconnects after an answer that
    says ``Connection: close``."""

    def __init__(self, base: str, headers: dict[str, str]) -> None:
        self.host, _, port = base.removeprefix("http://").partition(":")
        self.port = int(port or 80)
        self.fixed = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"{self.host}:{self.port}", **headers}.items())
        self.stream: trio.SocketStream | None = None
        self.buffer = bytearray()

    async def request(self, method: str, target: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self.stream is None:  # (numeric address: no name lookup in a thread, as open_tcp_stream does)
            sock = trio.socket.socket()
            await sock.connect((self.host, self.port))
            self.stream = trio.SocketStream(sock)
            self.buffer.clear()
        head = f"{method} {target} HTTP/1.1\r\n{self.fixed}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        await self.stream.send_all(head.encode() + b"\r\n" + (body or b""))
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            await self._more()
        lines = bytes(self.buffer[:end]).split(b"\r\n")
        del self.buffer[: end + 4]
        status = int(lines[0].split(b" ", 2)[1])
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                close = b"close" in value.lower()
            elif name == b"transfer-encoding":
                raise RuntimeError("a chunked answer: this client reads Content-Length only")
        while len(self.buffer) < length:
            await self._more()
        answer = bytes(self.buffer[:length])
        del self.buffer[:length]
        if close:
            await self.aclose()
        return status, answer

    async def _more(self) -> None:
        assert self.stream is not None
        data = await self.stream.receive_some(65536)
        if not data:
            raise RuntimeError("the server closed the connection before its answer")
        self.buffer += data

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None


async def client_loop(http: RawHttp | HttpxHttp, queue: str, batch: int, until: float,
                      warmup_end: float) -> tuple[int, list[float]]:
    """One client's cycles on ``http`` until ``until``: messages deleted and cycle times after ``warmup_end``."""
    done, cycles = 0, []
    msgs = json.dumps({"messages": [{"body": {"n": i, "payload": "x" * 64}, "ttl": 300} for i in range(batch)]}).encode()
    claim = json.dumps({"ttl": 60, "grace": 60}).encode()
    try:
        while time.monotonic() < until:
            started = time.monotonic()
            status, answer = await http.request("POST", f"/v1.1/queues/{queue}/messages", msgs)
            if status != 201:
                raise RuntimeError(f"post answered {status}: {answer[:200]!r}")
            status, answer = await http.request("POST", f"/v1.1/queues/{queue}/claims?limit={batch}", claim)
            if status != 201:
                continue
            for m in json.loads(answer)["messages"]:
                status, answer = await http.request("DELETE", m["href"])
                if status != 204:
                    raise RuntimeError(f"delete answered {status}: {answer[:200]!r}")
                if started >= warmup_end:
                    done += 1
            if started >= warmup_end:
                cycles.append(time.monotonic() - started)
    finally:
        await http.aclose()
    return done, cycles


def worker(base: str, clients: int, offset: int, batch: int, until: float, warmup_end: float, out,
           client: str = "raw") -> None:
    transport = RawHttp if client == "raw" else HttpxHttp

    async def main() -> None:
        results: list[tuple[int, list[float]]] = []

        async def one(i: int) -> None:
            http = transport(base, {"Client-ID": str(uuid.uuid4()), "X-Project-ID": "bench"})
            results.append(await client_loop(http, f"bench{offset + i}", batch, until, warmup_end))

        cpu = [0.0, 0.0]

        async def clock() -> None:  # this process's CPU over the measured window
            await trio.sleep(max(0.0, warmup_end - time.monotonic()))
            cpu[0] = time.process_time()
            await trio.sleep(max(0.0, until - time.monotonic()))
            cpu[1] = time.process_time()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(clock)
            for i in range(clients):
                nursery.start_soon(one, i)
        out.put((sum(d for d, _ in results), [c for _, cs in results for c in cs], cpu[1] - cpu[0]))

    trio.run(main)


def _stat_fields(stat: Path) -> list[str]:
    """The fields of a /proc/PID/stat after the command name (fields[3]: session, [11:13]: CPU)."""
    return stat.read_text().rsplit(")", 1)[1].split()


def _cpu_s(pid: int) -> float:
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(base: str, args: argparse.Namespace,
             server_cpu: Callable[[], float] | None = None) -> tuple[list[tuple[int, list[float], float]], float | None]:
    """Run the client processes against ``base``; each one's (deleted, cycle times, its CPU
    seconds over the measured window), and the
    server's CPU seconds over the measured window when its pid is given."""
    ctx = get_context("spawn")
    out = ctx.Queue()
    start = time.monotonic() + 1.0  # let the workers start
    warmup_end = start + args.warmup
    until = warmup_end + args.seconds
    per = [args.clients // args.procs + (1 if i < args.clients % args.procs else 0) for i in range(args.procs)]
    procs, offset = [], 0
    for n in per:
        p = ctx.Process(target=worker, args=(base, n, offset, args.batch, until, warmup_end, out, args.client))
        p.start()
        procs.append(p)
        offset += n
    cpu = None
    if server_cpu is not None:
        time.sleep(max(0.0, warmup_end - time.monotonic()))
        cpu0 = server_cpu()
        time.sleep(max(0.0, until - time.monotonic()))
        cpu = server_cpu() - cpu0
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return results, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--batch", type=int, default=1, help="messages per post and claim")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--wal", default="fsync", choices=["fsync", "write", "none"])
    parser.add_argument("--client", default="raw", choices=["raw", "httpx"],
                        help="raw: requests written as bytes (cheap); httpx: the httpx client")
    parser.add_argument("--json", type=Path, help="append each result here too (a JSON line)")
    parser.add_argument("--url", help="drive this Zaqar endpoint (http://host:port) instead of starting boxqueue")
    parser.add_argument("--against-real", choices=["as-ships", "always", "both"],
                        help="after boxqueue, run the same load against real Zaqar started fresh by "
                             "bench/real_zaqar.sh: Redis as it ships, with appendfsync always, or both")
    args = parser.parse_args()
    if args.url:
        results, _ = run_load(args.url.rstrip("/"), args)
        report(args, results, None, {"url": args.url})
        return
    with tempfile.TemporaryDirectory() as tmp:
        http_port = free_port()
        server = ServerProcess(Path(tmp), extra_config=f'[zaqar]\nlisten = "127.0.0.1:{http_port}"\n',
                               wal_mode=args.wal, read_only=False)
        server.start()
        pid = server.proc.pid if server.proc else None
        try:
            results, cpu = run_load(f"http://127.0.0.1:{http_port}", args, (lambda: _cpu_s(pid)) if pid else None)
        finally:
            server.stop()
    ours = report(args, results, cpu, {"server": "boxqueue", "wal": args.wal})
    if args.against_real:
        for redis in (["as-ships", "always"] if args.against_real == "both" else [args.against_real]):
            results, cpu = run_real_zaqar(args, redis)
            theirs = report(args, results, cpu, {"server": f"zaqar 21.0.3, redis {redis}"})
            print(json.dumps({"ratio_vs": redis, "messages_per_s": round(ours["messages_per_s"] / theirs["messages_per_s"], 2)}))


REDIS_ALWAYS = "--appendonly yes --appendfsync always"


def run_real_zaqar(args: argparse.Namespace, redis: str) -> tuple[list[tuple[int, list[float], float]], float | None]:
    """The load against real Zaqar (gunicorn and Redis) started fresh by bench/real_zaqar.sh; the
    server's CPU is that of every process of the script's session (gunicorn's and Redis's)."""
    port = free_port()
    env = {**os.environ, **({"REDIS_ARGS": REDIS_ALWAYS} if redis == "always" else {})}
    script = Path(__file__).resolve().parent / "real_zaqar.sh"
    proc = subprocess.Popen([str(script), str(port)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120  # (the first run installs Zaqar into its venv)
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code < 500:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("real Zaqar did not start (run bench/real_zaqar.sh to see why)")
            time.sleep(0.5)
        return run_load(f"http://127.0.0.1:{port}", args, lambda: _session_cpu_s(proc.pid))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def _session_cpu_s(sid: int) -> float:
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = _stat_fields(stat)
        except OSError:
            continue
        if int(fields[3]) == sid:  # the session id
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def report(args: argparse.Namespace, results: list[tuple[int, list[float], float]], cpu: float | None,
           what: dict[str, object]) -> dict[str, object]:
    done = sum(d for d, _, _ in results)
    cycles = sorted(c for _, cs, _ in results for c in cs)
    client_cpu = sum(c for _, _, c in results)
    result = {
        **what, "clients": args.clients, "client": args.client, "batch": args.batch, "seconds": args.seconds,
        "messages_per_s": round(done / args.seconds, 1),
        "cycle_p50_ms": round(statistics.median(cycles) * 1000, 1) if cycles else None,
        "cycle_p99_ms": round(cycles[int(len(cycles) * 0.99) - 1] * 1000, 1) if cycles else None,
        **({"server_cpu_us_per_message": round(cpu * 1e6 / done)} if cpu is not None and done else {}),
        **({"client_cpu_us_per_message": round(client_cpu * 1e6 / done)} if done else {}),
    }
    print(json.dumps(result))
    if args.json:
        with args.json.open("a") as out:
            out.write(json.dumps(result) + "\n")
    return result

if __name__ == "__main__":
    main()
