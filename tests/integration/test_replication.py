"""Replica sets: three real servers and a real etcd on loopback, real clients throughout."""

from __future__ import annotations

import pytest
import tarantool

from tests.integration.replica_fixtures import Cluster


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    c.start()
    yield c
    c.stop()


def test_a_write_on_the_leader_is_read_on_every_follower_which_refuse_writes(cluster):
    leader = cluster.wait_for_leader()
    conn = cluster.connect(leader)
    for i in range(50):
        conn.replace("kv", [i, f"value {i}"])
    conn.call("box.queue.put", [0, "jobs", 0, 0, 0, 0, "a task"])
    conn.close()
    for follower in cluster.followers(leader):
        f = cluster.connect(follower)
        cluster.wait_until(lambda f=f: len(f.select("kv", [], limit=100)) == 50, what=f"{follower} has the rows")
        assert [list(t) for t in f.select("kv", [7])] == [[7, "value 7"]]
        assert len(f.select("queue", [], limit=10)) == 1
        with pytest.raises(tarantool.DatabaseError) as err:
            f.replace("kv", [1000, "no"])
        assert err.value.args[0] == 7  # ER_READONLY
        with pytest.raises(tarantool.DatabaseError) as err:
            f.call("box.queue.put", [0, "jobs", 0, 0, 0, 0, "no"])
        assert err.value.args[0] == 7
        info = f.call("box.info").data[0]
        assert info["ro"] is True and info["election"]["state"] == "follower"
        assert info["election"]["leader_name"] == leader
        assert f.call("boxqueue.leader_uris").data[0] == [f"127.0.0.1:{cluster.ports[leader]}"]
        f.close()
    info = cluster.info(leader)
    assert info["ro"] is False and info["election"]["state"] == "leader"


def test_kill_9_of_the_leader_a_new_leader_has_every_acknowledged_write_and_the_old_one_rejoins(tmp_path):
    """Quorum 2 of 3: every write acknowledged before the kill is on the new leader, which takes
    writes within 10 s of the kill; the killed node restarts, rejoins as a follower and ends
    with the leader's data."""
    import threading
    import time

    cluster = Cluster(tmp_path, quorum=2)
    cluster.start()
    try:
        leader = cluster.wait_for_leader()
        acked: list[int] = []
        stop = threading.Event()

        def produce() -> None:
            conn = cluster.connect(leader)
            i = 0
            while not stop.is_set():
                try:
                    conn.replace("kv", [i, f"v{i}"])
                except Exception:
                    return
                acked.append(i)
                i += 1

        producer = threading.Thread(target=produce)
        producer.start()
        time.sleep(1.5)
        cluster.nodes[leader].kill()
        killed_at = time.monotonic()
        stop.set()
        producer.join(10)
        assert len(acked) > 50, len(acked)
        new = cluster.wait_for_leader(timeout=15, other_than=leader)
        conn = cluster.connect(new)
        cluster.wait_until(lambda: conn.replace("kv", [10**6, "after"]) is not None, timeout=15,
                           what="the new leader takes a write")
        assert time.monotonic() - killed_at < 10
        have = {t[0] for t in conn.select("kv", [], limit=10**7)}
        missing = [i for i in acked if i not in have]
        assert not missing, f"{len(missing)} acknowledged writes lost, first {missing[:5]}"
        cluster.nodes[leader].start()
        rows = sorted(list(t) for t in conn.select("kv", [], limit=10**7))
        old = cluster.connect(leader)
        cluster.wait_until(lambda: sorted(list(t) for t in old.select("kv", [], limit=10**7)) == rows,
                           timeout=30, what="the old leader catches up")
        assert cluster.info(leader)["ro"] is True
        old.close()
        conn.close()
    finally:
        cluster.stop()
