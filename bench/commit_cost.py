#!/usr/bin/env python3
"""Where the time of a durable group commit goes: LMDB's own flushes against a write-ahead log.

    .venv/bin/python bench/commit_cost.py [--rows 100000] [--batch 128] [--groups 200]

Preloads ``--rows`` rows (8-byte keys, 40-byte values) into one LMDB named database, then times
groups of ``--batch`` replaces of random rows, committed in the ways boxqueue has used:

* LMDB flushing every commit (``sync=True``: data pages, then the meta page): boxqueue before its
  write-ahead log;
* LMDB committed without a flush (``sync=False``): what a group cost LMDB until 2026-11-27;
* ``env.sync(True)`` after each such commit: what a checkpoint costs if it ran after every group;
* LMDB writing in place (``writemap``), committed without a flush: what a group costs LMDB now,
  in every mode (applying and committing, since in place the page copies move into the apply);
* a log record of the group's size appended and flushed with ``fdatasync`` (into a growing file,
  and into a file filled with zeros beforehand, which spares the file system a metadata update).

Figures are means per group in microseconds; the disk is shared with whatever else runs.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import struct
import tempfile
import time
import zlib

import lmdb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--groups", type=int, default=200)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="commit_cost")
    try:
        measure(workdir, args.rows, args.batch, args.groups)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def measure(workdir: str, rows: int, batch: int, groups: int) -> None:
    key = struct.Struct(">Q").pack
    path = os.path.join(workdir, "env")

    def open_env(sync: bool, writemap: bool = False) -> tuple[lmdb.Environment, object]:
        env = lmdb.open(path, map_size=1 << 34, max_dbs=4, sync=sync, metasync=sync, lock=False, readahead=False,
                        writemap=writemap)
        return env, env.open_db(b"rows")

    env, db = open_env(True)
    with env.begin(write=True) as txn:
        for i in range(rows):
            txn.put(key(i), os.urandom(40), db=db)
    env.sync(True)
    rng = random.Random(1)

    def groups_of(env: lmdb.Environment, db: object, flush_after: bool) -> tuple[float, float, float]:
        apply = commit = flush = 0.0
        for _ in range(groups):
            t0 = time.perf_counter()
            txn = env.begin(write=True)
            for _ in range(batch):
                txn.put(key(rng.randrange(rows)), os.urandom(40), db=db)
            t1 = time.perf_counter()
            txn.commit()
            t2 = time.perf_counter()
            if flush_after:
                env.sync(True)
            t3 = time.perf_counter()
            apply, commit, flush = apply + t1 - t0, commit + t2 - t1, flush + t3 - t2
        return apply / groups * 1e6, commit / groups * 1e6, flush / groups * 1e6

    def show(label: str, us: str) -> None:
        print(f"  {label:<52s} {us:>16s} us")

    apply, commit, _ = groups_of(env, db, False)
    print(f"{batch} replaces of random rows among {rows:,}: applying them takes {apply:,.0f} us")
    show("LMDB commit flushing data and meta (sync=True)", f"{commit:,.0f}")
    env.close()
    env, db = open_env(False)
    _, commit, _ = groups_of(env, db, False)
    show("LMDB commit without a flush (sync=False)", f"{commit:,.0f}")
    _, commit, flush = groups_of(env, db, True)
    show("the same, then env.sync(True)", f"{commit:,.0f} + {flush:,.0f}")
    env.close()
    env, db = open_env(False, writemap=True)
    apply, commit, _ = groups_of(env, db, False)
    show("applied and committed in place (writemap), no flush", f"{apply:,.0f} + {commit:,.0f}")
    env.close()

    record = os.urandom(batch * 60)  # about what a group of these replaces logs
    log = os.path.join(workdir, "log")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    t0 = time.perf_counter()
    for _ in range(groups):
        os.write(fd, record)
        os.fdatasync(fd)
    appended = (time.perf_counter() - t0) / groups * 1e6
    os.close(fd)
    fd = os.open(log, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, bytes(groups * len(record)))
    os.fsync(fd)
    t0 = time.perf_counter()
    for i in range(groups):
        os.pwrite(fd, record, i * len(record))
        os.fdatasync(fd)
    overwritten = (time.perf_counter() - t0) / groups * 1e6
    os.close(fd)
    t0 = time.perf_counter()
    for _ in range(groups):
        zlib.crc32(record)
    crc = (time.perf_counter() - t0) / groups * 1e6
    show(f"a {len(record):,}-byte log record appended + fdatasync", f"{appended:,.0f}")
    show("... written over zeros + fdatasync", f"{overwritten:,.0f}")
    show("its CRC-32 (zlib)", f"{crc:,.1f}")


if __name__ == "__main__":
    main()
