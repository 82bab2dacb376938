"""Instructions per request of the whole server process, counted by valgrind's callgrind.

`handle_cost.py` counts decoding and handling in-process; this counts everything the server runs
for a request: the trio loop, socket reads and writes (their user-space side), framing, handling,
group commit and LMDB. The server runs under callgrind and is driven over loopback by pipelining
clients (16 connections x 16 requests in flight, as `iproto_load.py`), twice: with N and with 2N
requests after the same start-up and preload; the difference divided by N is the cost of one
request. Instruction counts do not depend on what else the machine is doing, so they compare
builds where wall-clock figures cannot.

    .venv/bin/python bench/served_cost.py select replace --count 20000
    .venv/bin/python bench/served_cost.py ping --keep /tmp/ping.callgrind   # keep the profile

The kernel's share of a request (system calls) is not counted. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import iproto_load as load

OPS = ("ping", "select", "call", "replace")

# The server as `boxqueue serve` runs it, with an LMDB map valgrind accepts (it refuses 1 TiB).
_LAUNCH = """
import functools, sys
from boxqueue import cli, process
from boxqueue.storage.environment import Storage
process.Storage = functools.partial(Storage, map_size=1 << 30)
sys.exit(cli.main(["serve", "--config", sys.argv[1]]))
"""


def drive(port: int, op: str, total: int, rows: int, connections: int = 16, inflight: int = 16) -> None:
    """Send ``total`` requests of ``op``, keeping ``inflight`` outstanding on each connection."""
    pool = load.request_pool(op, rows, seed=f"served-{op}")
    socks = [load.connect("127.0.0.1", port, timeout=600) for _ in range(connections)]
    selector = selectors.DefaultSelector()
    state = {}
    sent = answered = 0
    next_request = 0

    def request(sync: int) -> bytes:
        nonlocal next_request
        prefix, body = pool[next_request % len(pool)]
        next_request += 1
        return prefix + load.U64.pack(sync) + body

    for sock in socks:
        sock.setblocking(False)
        burst = min(inflight, total - sent)
        sock.sendall(b"".join(request(i) for i in range(burst))) if burst else None
        sent += burst
        state[sock] = [b"", burst]
        selector.register(sock, selectors.EVENT_READ)
    found: list[tuple[int, int, int, int]] = []
    while answered < total:
        for key, _ in selector.select(timeout=600):
            sock = key.fileobj
            chunk = sock.recv(1 << 18)
            if not chunk:
                raise ConnectionError("the server closed a connection")
            entry = state[sock]
            data = entry[0] + chunk
            found.clear()
            entry[0] = data[load.split_responses(data, found):]
            replies = []
            for code, sync, _start, _end in found:
                if code != 0:
                    raise RuntimeError(f"request failed: 0x{code:x}")
                answered += 1
                if sent < total:
                    replies.append(request(sync))
                    sent += 1
            if replies:
                sock.setblocking(True)
                sock.sendall(b"".join(replies))
                sock.setblocking(False)
    for sock in socks:
        sock.close()


def instructions(op: str, count: int, rows: int, wal: str, keep: Path | None, metrics: bool = False,
                 connections: int = 16, inflight: int = 16) -> int:
    args = argparse.Namespace(memtx_memory=0, tarantool_bin="tarantool", metrics=metrics)
    server = load.Server("ours", wal, args)
    out = keep if keep is not None else "/dev/null"
    config = server.command[server.command.index("--config") + 1]
    server.command = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
        sys.executable, "-c", _LAUNCH, config,
    ]
    server.env["PYTHONHASHSEED"] = "0"
    server.start(timeout=300)
    try:
        if op in ("select", "replace"):
            load.preload(server.port, rows)
        drive(server.port, op, count, rows, connections, inflight)
        server.proc.send_signal(signal.SIGTERM)  # callgrind writes its totals as the server exits
        server.proc.wait(timeout=300)
        log = server.log_path.read_text(errors="replace")
    finally:
        server.stop()
    match = re.search(r"Collected : (\d+)", log)
    if match is None:
        raise RuntimeError(f"no callgrind total in the server's log:\n{log[-2000:]}")
    return int(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ops", nargs="*", help=f"any of {', '.join(OPS)} (default: all)")
    parser.add_argument("--count", type=int, default=20_000, help="N: requests of the shorter run")
    parser.add_argument("--rows", type=int, default=10_000, help="rows preloaded for select and replace")
    parser.add_argument("--wal", default="none", help="wal mode of the server (fsync, write, none)")
    parser.add_argument("--keep", type=Path, help="keep the longer run's callgrind profile here")
    parser.add_argument("--profile", type=int, metavar="N", help="print the N costliest functions per request")
    parser.add_argument("--connections", type=int, default=16, help="client connections")
    parser.add_argument("--inflight", type=int, default=16,
                        help="requests in flight per connection (1: each request a chunk of its own, as "
                             "clients that wait for each answer send them)")
    parser.add_argument("--metrics", action="store_true",
                        help="the server has a [metrics] listener (per-chunk latency on; nobody scrapes)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 1
    for op in args.ops or OPS:
        if op not in OPS:
            parser.error(f"unknown op {op}")
        profiles = [Path(tempfile.mkdtemp()) / "short.cg", Path(tempfile.mkdtemp()) / "long.cg"] if args.profile else [None, args.keep]
        shape = (args.connections, args.inflight)
        short = instructions(op, args.count, args.rows, args.wal, profiles[0], args.metrics, *shape)
        long = instructions(op, 2 * args.count, args.rows, args.wal, profiles[1], args.metrics, *shape)
        shown = f"wal {args.wal}" + (", metrics on" if args.metrics else "")
        if shape != (16, 16):
            shown += f", {args.connections} connections x {args.inflight} in flight"
        print(f"{op:8s} {(long - short) / args.count:9,.0f} instructions/request ({shown})", flush=True)
        if args.profile:
            print_profile_difference(*profiles, args.count, args.profile)


def _functions(profile: Path) -> dict[str, int]:
    """Exclusive instructions by function, from callgrind_annotate."""
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(profile)], capture_output=True, text=True, check=True
    ).stdout
    out: dict[str, int] = {}
    for line in text.splitlines():
        if "=>" in line:  # a call's inclusive cost, not a function's own
            continue
        m = re.match(r"\s*([\d,]+) \([\s\d.]+%\)\s+(\S.*?)(?: \[.*\])?$", line)
        if m and ":" in m.group(2):
            name = re.sub(r"^.*?(Python-3[^/]*/|/work/main/|/project/)", "", m.group(2))
            out[name] = out.get(name, 0) + int(m.group(1).replace(",", ""))
    return out


def print_profile_difference(short: Path, long: Path, count: int, top: int) -> None:
    """The functions a request costs (the longer run's profile minus the shorter one's)."""
    before, after = _functions(short), _functions(long)
    diff = sorted(((after.get(k, 0) - before.get(k, 0)) / count, k) for k in after)
    for per_request, name in reversed(diff[-top:]):
        print(f"    {per_request:8,.0f}  {name}")
    return 0


if __name__ == "__main__":
    tempfile.tempdir = tempfile.gettempdir()
    sys.exit(main())
