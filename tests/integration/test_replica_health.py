"""What load balancers, orchestrators and Prometheus see of a replica set: three real servers and a
real etcd, each server with its metrics listener, probed over real HTTP.

The replica set has ``[[users]]`` (the replicator), so the metrics listener asks for a login:
the health endpoints must answer without one, as HAProxy and Kubernetes probe them."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.replica_fixtures import REPLICATOR, Cluster
from tests.serverproc import ServerProcess, free_port

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class MeteredCluster(Cluster):
    """A :class:`Cluster` whose every node also serves ``[metrics]``, each on a port of its own."""

    metrics_ports: dict[str, int] = field(init=False, default_factory=dict)

    def _node(self, name: str) -> ServerProcess:
        node = super()._node(name)
        port = self.metrics_ports.setdefault(name, free_port())
        node.extra_config += f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
        return node

    def http(self, name: str, path: str, **kwargs) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.metrics_ports[name]}{path}", timeout=5, **kwargs)

    def status(self, name: str, path: str) -> int:
        return self.http(name, path).status_code

    def scrape(self, name: str) -> Samples:
        response = self.http(name, "/metrics", auth=REPLICATOR)
        assert response.status_code == 200, response.text
        out: Samples = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                out[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return out

    def replica_id(self, name: str) -> int:
        return list(self.ports).index(name) + 1  # the order of the peers list, stopped nodes too


def value(samples: Samples, metric: str, /, **labels: str) -> float | None:
    return samples.get((metric, frozenset(labels.items())))


@pytest.fixture
def cluster(tmp_path):
    c = MeteredCluster(tmp_path)
    c.start()
    yield c
    c.stop()


def wait_for_roles(cluster: MeteredCluster, leader: str) -> None:
    """Until the leader says so on /health/leader and every follower follows it."""
    cluster.wait_until(lambda: cluster.status(leader, "/health/leader") == 200, what=f"{leader} healthy as leader")
    for follower in cluster.followers(leader):
        cluster.wait_until(lambda f=follower: cluster.status(f, "/health/replica") == 200,
                           what=f"{follower} healthy as a replica")


def test_leader_and_followers_answer_the_probes_and_the_metrics(cluster):
    leader = cluster.wait_for_leader()
    followers = cluster.followers(leader)
    conn = cluster.connect(leader)
    for i in range(20):
        conn.replace("kv", [i, f"value {i}"])
    conn.close()
    wait_for_roles(cluster, leader)

    # The leader: 200 on /health/leader, 503 on /health/replica, no login asked.
    assert cluster.status(leader, "/health/replica") == 503
    assert cluster.http(leader, "/metrics").status_code == 401  # everything else needs the login
    body = cluster.http(leader, "/health").json()
    assert cluster.http(leader, "/health/leader").json()["role"] == "leader"
    term, lsn = body["term"], body["lsn"]
    assert body == {"role": "leader", "name": leader, "term": term, "leader": leader, "lsn": lsn,
                    "lag_records": 0, "lag_s": 0.0, "state": "ready"}
    assert term >= 1 and lsn >= 20

    # The followers: the reverse; they name the leader and its term, and catch up to its LSN.
    for follower in followers:
        assert cluster.status(follower, "/health/leader") == 503
        cluster.wait_until(lambda f=follower: cluster.http(f, "/health").json()["lag_records"] == 0,
                           what=f"{follower} caught up")
        body = cluster.http(follower, "/health/replica").json()
        assert body["lag_s"] >= 0.0
        assert body == {"role": "follower", "name": follower, "term": term, "leader": leader, "lsn": lsn,
                        "lag_records": 0, "lag_s": body["lag_s"], "state": "ready"}

    # /metrics, as tarantool/metrics names the series.
    leader_id = str(cluster.replica_id(leader))
    cluster.wait_until(lambda: all(
        value(cluster.scrape(leader), "tnt_replication_status", stream="downstream",
              id=str(cluster.replica_id(f))) == 1.0 for f in followers), what="both relays following")
    samples = cluster.scrape(leader)
    assert value(samples, "tnt_election_state") == 2.0
    assert value(samples, "tnt_election_term") == term
    assert value(samples, "tnt_election_leader") == int(leader_id)
    assert value(samples, "tnt_read_only") == 0.0
    assert value(samples, "tnt_info_lsn") >= lsn
    assert value(samples, "tnt_info_vclock", id=leader_id) == value(samples, "tnt_info_lsn")
    assert value(samples, "tnt_replication_status", stream="upstream", id=leader_id) is None
    for follower in followers:
        fid = str(cluster.replica_id(follower))
        assert value(samples, "tnt_replication_lag", stream="downstream", id=fid) >= 0.0
        assert value(samples, "boxqueue_replication_lag_records", stream="downstream", id=fid,
                     name=follower) is not None
    for follower in followers:
        samples = cluster.scrape(follower)
        assert value(samples, "tnt_election_state") == 0.0
        assert value(samples, "tnt_election_term") == term
        assert value(samples, "tnt_election_leader") == int(leader_id)
        assert value(samples, "tnt_read_only") == 1.0
        assert value(samples, "tnt_replication_status", stream="upstream", id=leader_id) == 1.0
        assert value(samples, "tnt_replication_lag", stream="upstream", id=leader_id) >= 0.0
        assert value(samples, "boxqueue_replication_lag_records", stream="upstream", id=leader_id,
                     name=leader) == 0.0
        own = str(cluster.replica_id(follower))
        assert not [key for key in samples if key[0].startswith("tnt_replication") and ("id", own) in key[1]]

    # The dashboard's snapshot: the replica set as each node sees it.
    replica = cluster.http(leader, "/api/snapshot", auth=REPLICATOR).json()["replica"]
    assert (replica["name"], replica["state"], replica["term"], replica["leader"]) == (leader, "leader", term, leader)
    assert {p["name"]: p["role"] for p in replica["peers"]} == {
        leader: "leader", **{f: "follower" for f in followers}}
    replica = cluster.http(followers[0], "/api/snapshot", auth=REPLICATOR).json()["replica"]
    assert replica["state"] == "follower" and replica["leader"] == leader
    assert {p["name"]: p["role"] for p in replica["peers"]} == {
        leader: "leader", followers[0]: "follower", followers[1]: "unknown"}


def test_after_a_failover_the_probes_point_at_the_new_leader(cluster):
    """The leader stops: a balancer probing /health/leader finds the new one, and the remaining
    follower is a healthy replica of it."""
    old = cluster.wait_for_leader()
    wait_for_roles(cluster, old)
    old_term = cluster.http(old, "/health").json()["term"]
    cluster.nodes[old].stop()
    cluster.names.remove(old)  # the cluster's look-ups skip the stopped node
    new = cluster.wait_for_leader(other_than=old)
    wait_for_roles(cluster, new)
    body = cluster.http(new, "/health/leader").json()
    assert body["role"] == "leader" and body["name"] == new and body["term"] > old_term
    (follower,) = [n for n in cluster.names if n != new]
    body = cluster.http(follower, "/health/replica").json()
    assert body["leader"] == new and body["term"] == cluster.http(new, "/health").json()["term"]
    assert value(cluster.scrape(follower), "tnt_replication_status", stream="upstream",
                 id=str(cluster.replica_id(new))) == 1.0
