#!/usr/bin/env python3
"""What a replicated write costs a follower against what it cost the leader, in instructions.

    .venv/bin/python bench/apply_cost.py [--count 4000] [--group 1] [--group 16]

For each ``--group`` size G (writes per group: 1 is a sequential client's write, 16 a pipelined
load's), under valgrind's callgrind (twice: 0 and ``--count`` writes, the difference divided):

* **leader**: ``--count`` REPLACEs of a 40-byte tuple made by the space (``Space.prepare_put``)
  and committed by the group committer in ``wal fsync`` mode, G at a time, each group's record fed
  to the replication feed as a leader's is (iproto's decoding of the request is not counted: see
  ``bench/handle_cost.py replace`` for it);
* **follower**: the records those groups made, sent as the leader's relay sends them and applied
  by the follower's own code (``Applier._apply_rows``: row decoding, the committer's replicated
  writes, acknowledgements), from an in-memory stream.

The figures are instructions per *write* for the leader and per *record* for the follower (a
record holds a group's G writes). Issue 36's target: a follower's cost per record at most half the
leader's per write. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import callgrind

ROOT = Path(__file__).resolve().parent.parent


async def _leader_storage(workdir: str, nursery: Any) -> tuple[Any, Any, Any]:
    from boxqueue.errcodes import BoxError
    from boxqueue.spaces.catalog import Catalog
    from boxqueue.spaces.definitions import FieldDef
    from boxqueue.storage.commit import GroupCommitter
    from boxqueue.storage.environment import Storage

    storage = Storage(workdir, "fsync", map_size=1 << 30)
    committer = GroupCommitter(storage, rejections=(BoxError,))
    catalog = Catalog(storage, committer)
    catalog.load()
    await nursery.start(committer.run)
    space, _ = await catalog.create_space("bench", space_id=512,
                                          format=(FieldDef("id", "unsigned"), FieldDef("p", "string")))
    await catalog.create_index(space, "primary", parts=[[0, "unsigned"]])
    return storage, committer, space


def leader(count: int, group: int, records_path: str | None) -> None:
    """``count`` replaces, ``group`` at a time; the records made are pickled to ``records_path``."""
    import trio

    from boxqueue.spaces.msgpack_values import pack
    from boxqueue.spaces.space import REPLACE, decode_tuple

    workdir = tempfile.mkdtemp(prefix="apply_cost_leader")
    records: list[tuple[int, int, bytes]] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            storage, committer, space = await _leader_storage(workdir, nursery)
            first = storage.lsn
            committer.feed = lambda lsn, term, payload: records.append((lsn, term, payload))
            state = {"left": 0, "done": trio.Event()}

            def done(_result: object, error: BaseException | None) -> None:
                if error is not None:
                    raise error
                state["left"] -= 1
                if state["left"] == 0:
                    state["done"].set()

            key = 0
            for _ in range(count // group):
                state["left"], state["done"] = group, trio.Event()
                for _ in range(group):
                    raw = pack([key % 1000, "x" * 32])
                    committer.submit(space.prepare_put(raw, decode_tuple(raw), REPLACE), done)
                    key += 1
                await state["done"].wait()
            nursery.cancel_scope.cancel()
        storage.close()
        found["first"] = first

    found: dict[str, Any] = {}
    try:
        trio.run(main)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if records_path is not None:
        with open(records_path, "wb") as f:
            pickle.dump((found["first"], records), f)


def follower(count: int, records_path: str) -> None:
    """Apply the first ``count`` records of ``records_path`` as a follower does."""
    import trio
    import trio.testing

    from boxqueue.errcodes import BoxError
    from boxqueue.replication import rows
    from boxqueue.replication.applier import Applier
    from boxqueue.spaces.catalog import Catalog
    from boxqueue.storage.commit import GroupCommitter
    from boxqueue.storage.environment import Storage

    with open(records_path, "rb") as f:
        first, records = pickle.load(f)
    seed_dir = tempfile.mkdtemp(prefix="apply_cost_seed")
    workdir = tempfile.mkdtemp(prefix="apply_cost_follower")

    async def main() -> None:
        # The follower starts from the leader's state before the measured records: the same
        # catalogue (space 512), made by a leader run of no writes copied over.
        async with trio.open_nursery() as nursery:
            storage, _committer, _space = await _leader_storage(seed_dir, nursery)
            nursery.cancel_scope.cancel()
        storage.close()
        shutil.rmtree(workdir)
        shutil.copytree(seed_dir, workdir)
        storage = Storage(workdir, "fsync", map_size=1 << 30)
        assert storage.lsn == first, (storage.lsn, first)
        committer = GroupCommitter(storage, rejections=(BoxError,))
        catalog = Catalog(storage, committer)
        catalog.load()
        wire = b"".join(rows.record(1, 1, lsn, term, payload, 0.0) for lsn, term, payload in records[:count])
        target = first + count
        applier = Applier(storage, committer, catalog, name="f", user=None, password=None, heartbeat_s=3600.0,
                          known_term=lambda: 0, instance_uuid="f-uuid")
        ours, theirs = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            await nursery.start(committer.run)

            async def leader_side() -> None:
                for at in range(0, len(wire), 1 << 16):  # as a socket delivers: 64 KiB reads
                    await theirs.send_all(wire[at:at + (1 << 16)])
                while True:  # the acknowledgements, read and dropped
                    await theirs.receive_some(1 << 16)

            nursery.start_soon(leader_side)

            async def apply() -> None:
                try:
                    await applier._apply_rows(ours, rows.RowDecoder(), 0)  # type: ignore[arg-type]
                except Exception:
                    if storage.lsn < target:
                        raise

            nursery.start_soon(apply)
            while storage.synced_lsn < target:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        storage.close()

    try:
        trio.run(main)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(seed_dir, ignore_errors=True)


def instructions(args: list[str]) -> int:
    return callgrind.instructions(__file__, args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=4000, help="writes measured (default 4000)")
    parser.add_argument("--group", type=int, action="append", help="writes per group (default: 1 and 16)")
    parser.add_argument("--run", choices=("leader", "follower"), help=argparse.SUPPRESS)
    parser.add_argument("--records", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import boxqueue  # noqa: F401 - first: BOXQUEUE_PURE=1 then measures the uncompiled sources

    if args.run == "leader":
        leader(args.count, args.group[0], args.records)
        return 0
    if args.run == "follower":
        follower(args.count, args.records)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is needed (apt-get install valgrind)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="apply_cost") as tmp:
        for group in args.group or [1, 16]:
            writes = args.count - args.count % group
            records_path = os.path.join(tmp, f"records-{group}")
            leader(writes, group, records_path)  # the records the follower applies (not measured)
            lead = (instructions(["--run", "leader", "--count", str(writes), "--group", str(group)])
                    - instructions(["--run", "leader", "--count", "0", "--group", str(group)])) / writes
            n = writes // group
            follow = (instructions(["--run", "follower", "--count", str(n), "--records", records_path])
                      - instructions(["--run", "follower", "--count", "0", "--records", records_path])) / n
            print(f"groups of {group:3d}: leader {lead:10,.0f} instructions a write; follower {follow:10,.0f} "
                  f"a record ({follow / lead:.2f} of the leader's write; {follow / group:,.0f} a write)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
