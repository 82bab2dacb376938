"""Instructions per request spent decoding and handling one request type, without the network.

Wall-clock figures on a shared 2-CPU machine vary by 15-30% from run to run; instruction counts
under valgrind's callgrind do not, so they show whether a change to the request path helped.

    .venv/bin/python bench/handle_cost.py select        # ping | select | call | replace

runs the request path N times in-process under callgrind (twice: 0 and N requests) and prints
the difference per request. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = ("ping", "select", "call", "replace")


def workload(count: int, what: str) -> None:
    """Decode and handle ``count`` requests of one kind against a fresh in-process catalogue."""
    sys.path.insert(0, str(ROOT))
    import msgpack
    import trio

    from errcodes import BoxError
    from iproto_server import codec
    from iproto_server.builtins import register_builtins
    from iproto_server.dispatch import Dispatcher
    from iproto_server.session import Session
    from spaces.catalog import Catalog
    from spaces.definitions import FieldDef
    from spaces.procedures import Procedures
    from storage.commit import GroupCommitter
    from storage.environment import Storage

    bodies = {
        "ping": ({0: codec.PING, 1: 1}, None),
        "select": ({0: codec.SELECT, 1: 1, 5: 0}, {0x10: 512, 0x11: 0, 0x12: 1, 0x13: 0, 0x14: 0, 0x20: [42]}),
        "call": ({0: codec.CALL, 1: 1}, {0x22: "box.session.id", 0x21: []}),
        "replace": ({0: codec.REPLACE, 1: 1}, {0x10: 512, 0x21: [42, "y" * 32]}),
    }
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
            dispatcher = Dispatcher(catalog, procedures)
            session = Session(1, catalog.access.guest)
            decoder = codec.RequestDecoder()
            answers: list[bytes] = []
            for _ in range(count):
                decoder.feed(frame)
                dispatcher.handle(session, decoder.next_event(), answers.append)
            await trio.sleep(0.01)  # let queued writes commit
            nursery.cancel_scope.cancel()
        storage.close()

    try:
        trio.run(main)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def instructions(count: int, what: str) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0")
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, __file__, "--run", str(count), what],
        capture_output=True, text=True, env=env, check=True,
    )
    match = re.search(r"Collected : (\d+)", proc.stderr)
    if match is None:
        raise RuntimeError(proc.stderr[-2000:])
    return int(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="*", help=f"any of {', '.join(REQUESTS)} (default: all)")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = set(args.what) - set(REQUESTS)
    if unknown:
        parser.error(f"unknown request kinds: {', '.join(sorted(unknown))}")
    args.what = args.what or list(REQUESTS)
    if args.run is not None:
        workload(args.run, args.what[0])
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 1
    for what in args.what:
        per_request = (instructions(args.count, what) - instructions(0, what)) / args.count
        print(f"{what:8s} {per_request:9,.0f} instructions/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
