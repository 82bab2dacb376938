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


def test_writes_need_the_quorum_and_a_write_that_cannot_gather_it_is_not_applied(tmp_path):
    """Quorum 2 of 3: with one follower stopped writes flow; with both stopped a write fails with
    ER_SYNC_QUORUM_TIMEOUT after synchro_timeout_s and is applied nowhere, not even once the
    followers are back."""
    import time

    cluster = Cluster(tmp_path, quorum=2, synchro_timeout_s=1.5)
    cluster.start()
    try:
        leader = cluster.wait_for_leader()
        first, second = cluster.followers(leader)
        conn = cluster.connect(leader)
        conn.replace("kv", [1, "both followers up"])
        cluster.nodes[first].stop()
        conn.replace("kv", [2, "one follower up"])
        cluster.nodes[second].stop()
        started = time.monotonic()
        with pytest.raises(tarantool.DatabaseError) as err:
            conn.replace("kv", [3, "no quorum"])
        assert err.value.args[0] == 216, err.value.args  # ER_SYNC_QUORUM_TIMEOUT
        assert 1.0 < time.monotonic() - started < 10
        with pytest.raises(tarantool.DatabaseError) as err:
            conn.call("box.queue.put", [0, "jobs", 0, 0, 0, 0, "no quorum either"])
        assert err.value.args[0] == 216
        assert conn.select("kv", [3]) == [] or list(conn.select("kv", [3])) == []
        assert len(conn.select("queue", [], limit=10)) == 0
        for name in (first, second):
            cluster.nodes[name].start()
        want = [[1, "both followers up"], [2, "one follower up"]]
        for name in cluster.names:
            c = cluster.connect(name)
            cluster.wait_until(lambda c=c: sorted(list(t) for t in c.select("kv", [], limit=100)) == want,
                               timeout=30, what=f"{name} holds exactly the acknowledged rows")
            assert len(c.select("queue", [], limit=10)) == 0
            c.close()
        conn.replace("kv", [4, "quorum again"])
        conn.close()
    finally:
        cluster.stop()


def test_a_leader_stopped_past_its_lease_acknowledges_nothing_more_and_rejoins(tmp_path):
    """SIGSTOP the leader past its lease; a new leader takes writes; SIGCONT: the old leader
    acknowledges nothing as leader, rejoins as a follower, and what it wrote alone is gone."""
    import signal
    import threading
    import time

    cluster = Cluster(tmp_path, quorum=2, synchro_timeout_s=2.0)
    cluster.start()
    try:
        leader = cluster.wait_for_leader()
        conn = cluster.connect(leader)
        conn.replace("kv", [1, "before the stop"])
        results: list = []

        def write_to_the_paused_leader() -> None:  # sent while it is stopped, read once it runs
            try:
                results.append(conn.replace("kv", [666, "written to a deposed leader"]))
            except Exception as exc:
                results.append(exc)

        cluster.nodes[leader].proc.send_signal(signal.SIGSTOP)
        writer = threading.Thread(target=write_to_the_paused_leader)
        writer.start()
        try:
            new = cluster.wait_for_leader(timeout=20, other_than=leader)
            c = cluster.connect(new)
            c.replace("kv", [2, "after the failover"])
        finally:
            cluster.nodes[leader].proc.send_signal(signal.SIGCONT)
        writer.join(30)
        assert results and isinstance(results[0], Exception), results  # never acknowledged
        want = [[1, "before the stop"], [2, "after the failover"]]
        for name in cluster.names:  # (the old leader restarts its listeners as a follower)
            cluster.wait_until(lambda name=name: cluster.rows(name) == want, timeout=30,
                               what=f"{name} holds exactly the acknowledged rows")
        cluster.wait_until(lambda: cluster.info(leader)["ro"] is True, what="the old leader is a follower")
        time.sleep(0.5)
        assert cluster.leader() == new
        c.close()
    finally:
        cluster.stop()
