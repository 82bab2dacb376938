"""A full disk, for real: each server's data on a small tmpfs filled to the brim by another file.

A server whose disk fills answers writes ER_WAL_IO (40) and applies none of them; killed there, it
starts again on the full disk (LMDB's reserve is not asked for again at start), serves reads, and
takes writes again as soon as there is room, without a restart. In a replica set, a follower with
a full disk holds no one back (the quorum comes from the others) and catches up once it has room;
a leader that cannot write steps aside for one that can. Mounting a tmpfs needs root: elsewhere
these tests are skipped, saying so.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import tarantool

from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.integration.replica_fixtures import CLUSTER_SPACES, Cluster
from tests.serverproc import ServerProcess

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs (a disk that fills) needs root")

DISK_BYTES = 160 << 20  # the server's 64 MB reserve, its log, and room to spare


@contextmanager
def tmpfs(path: Path, size: int = DISK_BYTES) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path, name: str = "filler") -> Path:
    """Take every free byte of ``disk`` with a file of its own (returned: delete it to free them)."""
    filler = disk / name
    with open(filler, "ab", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass
    assert os.statvfs(disk).f_bavail == 0
    return filler


def refused(call) -> int:
    with pytest.raises(tarantool.DatabaseError) as err:
        call()
    return err.value.args[0]


SPACES = CLUSTER_SPACES + QUEUE_SPACE_0


def test_a_server_on_a_full_disk_refuses_writes_restarts_serves_reads_and_heals(tmp_path):
    with tmpfs(tmp_path / "disk") as disk:
        server = ServerProcess(disk / "srv", extra_config=SPACES, read_only=False)
        server.start()
        try:
            conn = tarantool.Connection("127.0.0.1", server.port)
            for i in range(200):
                conn.replace("kv", [i, "x" * 200])
            put = conn.call("box.queue.put", [0, "jobs", 0, 0, 0, 0, "before the disk filled"]).data[0]
            filler = fill(disk)
            # The log segment has room written ahead of it: write until it is used up.
            for i in range(1000, 100_000):
                try:
                    conn.replace("kv", [i, "y" * 2000])
                except tarantool.DatabaseError as exc:
                    assert exc.args[0] == 40, exc.args  # ER_WAL_IO
                    failed_key = i
                    break
            else:
                raise AssertionError("writes never failed on a full disk")
            assert conn.select("kv", [failed_key]) == [] or list(conn.select("kv", [failed_key])) == []
            # A put's record is smaller than those replaces' (one LMDB entry since the queue space's
            # secondary indexes are kept in memory): a few may still fit in what is left.
            for _ in range(5000):
                try:
                    conn.call("box.queue.put", [0, "jobs", 0, 0, 0, 0, "no room"])
                except tarantool.DatabaseError as exc:
                    assert exc.args[0] == 40, exc.args  # ER_WAL_IO
                    break
            else:
                raise AssertionError("puts never failed on a full disk")
            assert list(conn.select("kv", [5])) == [[5, "x" * 200]]  # reads go on
            acknowledged = sorted(list(t) for t in conn.select("kv", [], limit=10**6))
            conn.close()

            server.kill()  # and it starts again on the same full disk
            free_at_start = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            assert free_at_start < 32 << 20  # less than the reserve it keeps ahead: not asked for again
            server.start()
            conn = tarantool.Connection("127.0.0.1", server.port)
            assert sorted(list(t) for t in conn.select("kv", [], limit=10**6)) == acknowledged
            refill = fill(disk, "filler-2")  # what the start freed (the old log segments) is taken too
            assert refused(lambda: conn.replace("kv", [1, "z"])) == 40
            assert list(conn.select("kv", [1])) == [[1, "x" * 200]]

            filler.unlink()
            refill.unlink()  # room again: writes go on, no restart
            conn.replace("kv", [1, "after the room came back"])
            assert list(conn.select("kv", [1])) == [[1, "after the room came back"]]
            taken = conn.call("box.queue.take", [0, "jobs", 1]).data[0]
            assert taken[0] == put[0] and taken[3] == "before the disk filled"
            conn.call("box.queue.ack", [0, taken[0]])
            conn.close()
        finally:
            server.kill()


def test_a_follower_with_a_full_disk_holds_no_one_back_and_catches_up(tmp_path):
    cluster = Cluster(tmp_path, quorum=2, synchro_timeout_s=1.5)
    disks = {name: tmpfs(tmp_path / name) for name in cluster.names}
    for cm in disks.values():
        cm.__enter__()
    try:
        cluster.start()
        leader = cluster.wait_for_leader()
        full, other = cluster.followers(leader)
        conn = cluster.connect(leader)
        for i in range(100):
            conn.replace("kv", [i, "before"])
        cluster.wait_until(lambda: len(cluster.rows(full)) == 100, what="the follower has the rows")
        filler = fill(tmp_path / full)
        for i in range(100, 2100):  # a quorum without it: every write acknowledged at once
            conn.replace("kv", [i, "y" * 1000])
        assert len(cluster.rows(other)) == 2100

        cluster.nodes[full].kill()  # and it restarts on its full disk, as a follower serving reads
        cluster.nodes[full].start()
        assert 100 <= len(cluster.rows(full)) < 2100
        assert cluster.info(full)["ro"] is True
        conn.replace("kv", [5000, "while it is full"])

        filler.unlink()
        want = cluster.rows(leader)
        cluster.wait_until(lambda: cluster.rows(full) == want, timeout=60, what="the follower catches up")
        conn.close()
    finally:
        cluster.stop()
        for cm in disks.values():
            cm.__exit__(None, None, None)


def reconnect(cluster: Cluster, name: str, deadline: float) -> tarantool.Connection:
    """A new connection to ``name``, tried again while it is refused (until ``deadline``)."""
    while True:
        try:
            return cluster.connect(name)
        except tarantool.NetworkError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_leader_with_a_full_disk_steps_aside_for_one_that_can_write(tmp_path):
    cluster = Cluster(tmp_path, quorum=2, synchro_timeout_s=1.5)
    disks = {name: tmpfs(tmp_path / name) for name in cluster.names}
    for cm in disks.values():
        cm.__enter__()
    try:
        cluster.start()
        leader = cluster.wait_for_leader()
        conn = cluster.connect(leader)
        conn.replace("kv", [1, "acknowledged"])
        fill(tmp_path / leader)
        started = time.monotonic()
        codes = set()
        while cluster.leader() in (leader, None):  # it refuses writes (nothing logged), then resigns
            try:
                conn.replace("kv", [2, "y" * 4000])
            except tarantool.NetworkError:  # (first: a DatabaseError too, its errno in args[0])
                # The leader stepped aside: its next incarnation serves on new connections, once
                # it listens again (a connection in between is refused).
                conn.close()
                conn = reconnect(cluster, leader, started + 30)
            except tarantool.DatabaseError as exc:
                codes.add(exc.args[0])
            assert time.monotonic() - started < 30, "the leader with a full disk did not step aside"
            time.sleep(0.05)
        assert codes <= {40, 7}, codes  # ER_WAL_IO, then ER_READONLY once it gave up: failed, certainly
        new = cluster.wait_for_leader(other_than=leader)
        c = cluster.connect(new)
        c.replace("kv", [3, "on the new leader"])
        assert [1, "acknowledged"] in cluster.rows(new)
        # The old leader stayed up through all this, and serves reads as a follower.
        assert cluster.nodes[leader].proc.poll() is None
        assert cluster.info(leader)["ro"] is True
        c.close()
        conn.close()
    finally:
        cluster.stop()
        for cm in disks.values():
            cm.__exit__(None, None, None)
