"""The replica set as the metrics listener shows it: the tarantool/metrics series in /metrics, the
health endpoints load balancers probe, and the dashboard's "replica" figures.

This tests the translation only, so the replica node is a stand-in shaped like
``replication.node.ReplicaNode`` (``info()``, ``state``, ``leading()``, ``config``) holding the
``box.info`` a leader, a follower or a candidate would report; the cluster itself is exercised in
``tests/integration/test_replica_health.py``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from boxqueue.metrics.app import MetricsApp
from boxqueue.metrics.collector import BoxqueueCollector
from boxqueue.metrics.dashboard_data import Dashboard
from boxqueue.metrics.observed import READY, RECOVERING, STARTING, Observed
from boxqueue.replication.election import ElectionState
from boxqueue.spaces import access as acl
from boxqueue.spaces.write_gate import WriteGate

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
PEERS = ("n1", "n2", "n3")


class Peer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.uri = f"127.0.0.1:{3300 + PEERS.index(name) + 1}"


class Config:
    def __init__(self) -> None:
        self.peers = tuple(Peer(name) for name in PEERS)
        self.synchro_quorum = 2

    def replica_id(self, name: str) -> int:
        return PEERS.index(name) + 1


class FakeNode:
    """What a ReplicaNode reports, fixed: ``info`` is returned as given."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.config = Config()
        self._info = info
        election = info["election"]
        self.state = ElectionState(election["state"], election["term"], election["leader_name"],
                                   None if election["leader_name"] is None else "127.0.0.1:3301")

    def info(self) -> dict[str, Any]:
        return self._info

    def leading(self) -> bool:
        return self._info["election"]["state"] == "leader"


def leader_info() -> dict[str, Any]:
    """n1 leads term 5 at LSN 120; n2 follows 20 records behind, n3's relay has stopped."""
    return {
        "id": 1, "name": "n1", "ro": False, "ro_reason": None, "lsn": 120, "vclock": {1: 120},
        "replication": {
            1: {"id": 1, "name": "n1", "lsn": 120, "uuid": None},
            2: {"id": 2, "name": "n2", "lsn": 100, "uuid": "u2",
                "downstream": {"status": "follow", "vclock": {1: 100}, "idle": 0.1, "lag": 0.5,
                               "lag_records": 20}},
            3: {"id": 3, "name": "n3", "lsn": 90, "uuid": "u3",
                "downstream": {"status": "stopped", "vclock": {1: 90}, "idle": 4.0, "lag": 3.0,
                               "lag_records": 30, "message": "connection reset"}},
        },
        "election": {"state": "leader", "term": 5, "vote": 0, "leader": 1, "leader_name": "n1",
                     "leader_idle": 0.0},
        "synchro": {"quorum": 2, "queue": {"len": 2, "owner": 1, "term": 5}},
    }


def follower_info(status: str = "follow", upstream: bool = True) -> dict[str, Any]:
    """n2 follows n1 (term 5) at LSN 100, 20 records behind the leader's 120."""
    leader: dict[str, Any] = {"id": 1, "name": "n1", "lsn": 120 if upstream else 0}
    if upstream:
        leader["upstream"] = {"status": status, "idle": 0.2, "peer": "127.0.0.1:3301", "lag": 0.25,
                              "lag_records": 20}
    return {
        "id": 2, "name": "n2", "ro": True, "ro_reason": "election", "lsn": 100, "vclock": {2: 100},
        "replication": {1: leader, 2: {"id": 2, "name": "n2", "lsn": 100, "uuid": None},
                        3: {"id": 3, "name": "n3", "lsn": 0}},
        "election": {"state": "follower", "term": 5, "vote": 0, "leader": 1, "leader_name": "n1",
                     "leader_idle": 0.2},
        "synchro": {"quorum": 2, "queue": {"len": 0, "owner": 0, "term": 5}},
    }


def candidate_info() -> dict[str, Any]:
    """n3 with no leader known, term 6, its stream gone."""
    return {
        "id": 3, "name": "n3", "ro": True, "ro_reason": "election", "lsn": 90, "vclock": {3: 90},
        "replication": {1: {"id": 1, "name": "n1", "lsn": 0}, 2: {"id": 2, "name": "n2", "lsn": 0},
                        3: {"id": 3, "name": "n3", "lsn": 90, "uuid": None}},
        "election": {"state": "candidate", "term": 6, "vote": 0, "leader": 0, "leader_name": None,
                     "leader_idle": 0.0},
        "synchro": {"quorum": 2, "queue": {"len": 0, "owner": 0, "term": 6}},
    }


class Catalog:
    """Only what the health check reads: the real write gate, writable unless told."""

    def __init__(self, read_only: str | None = None) -> None:
        self.writes = WriteGate(acl.AccessControl())
        self.writes.set_read_only(read_only)


class Storage:
    """Only what the health check reads of a node alone."""

    lsn = 7


def observed(info: dict[str, Any] | None, state: str = READY, read_only: str | None = None) -> Observed:
    o = Observed(state=state, catalog=Catalog(read_only))
    if info is not None:
        o.replica = FakeNode(info)
    else:
        o.storage = Storage()
    return o


def scrape(o: Observed) -> Samples:
    registry = CollectorRegistry()
    registry.register(BoxqueueCollector(o))
    out: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        assert family.type == "gauge" or not family.name.startswith(("tnt_election", "tnt_replication"))
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def series(samples: Samples, prefix: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {key: v for key, v in samples.items() if key[0].startswith(prefix)}


def labels(**pairs: str) -> frozenset[tuple[str, str]]:
    return frozenset(pairs.items())


# -- /metrics ------------------------------------------------------------------------------------


def test_leader_series_have_tarantool_names_values_and_labels():
    samples = scrape(observed(leader_info()))
    none = frozenset()
    assert series(samples, "tnt_election") == {
        ("tnt_election_state", none): 2.0, ("tnt_election_term", none): 5.0, ("tnt_election_vote", none): 0.0,
        ("tnt_election_leader", none): 1.0, ("tnt_election_leader_idle", none): 0.0,
    }
    assert series(samples, "tnt_replication") == {  # the leader's own entry (id 1) has no series
        ("tnt_replication_lag", labels(stream="downstream", id="2")): 0.5,
        ("tnt_replication_lag", labels(stream="downstream", id="3")): 3.0,
        ("tnt_replication_status", labels(stream="downstream", id="2")): 1.0,
        ("tnt_replication_status", labels(stream="downstream", id="3")): 0.0,  # "stopped" is not "follow"
    }
    assert series(samples, "boxqueue_replication") == {
        ("boxqueue_replication_lag_records", labels(stream="downstream", id="2", name="n2")): 20.0,
        ("boxqueue_replication_lag_records", labels(stream="downstream", id="3", name="n3")): 30.0,
    }
    assert samples[("tnt_read_only", none)] == 0.0
    assert samples[("tnt_info_lsn", none)] == 120.0
    assert series(samples, "tnt_info_vclock") == {("tnt_info_vclock", labels(id="1")): 120.0}
    assert series(samples, "tnt_synchro") == {
        ("tnt_synchro_queue_len", none): 2.0, ("tnt_synchro_queue_term", none): 5.0,
        ("tnt_synchro_queue_owner", none): 1.0,
    }


def test_follower_series_show_its_upstream():
    samples = scrape(observed(follower_info()))
    none = frozenset()
    assert samples[("tnt_election_state", none)] == 0.0
    assert samples[("tnt_election_leader", none)] == 1.0
    assert samples[("tnt_election_leader_idle", none)] == 0.2
    assert samples[("tnt_read_only", none)] == 1.0
    assert samples[("tnt_info_lsn", none)] == 100.0
    assert series(samples, "tnt_info_vclock") == {("tnt_info_vclock", labels(id="2")): 100.0}
    assert series(samples, "tnt_replication") == {
        ("tnt_replication_lag", labels(stream="upstream", id="1")): 0.25,
        ("tnt_replication_status", labels(stream="upstream", id="1")): 1.0,
    }
    assert series(samples, "boxqueue_replication") == {
        ("boxqueue_replication_lag_records", labels(stream="upstream", id="1", name="n1")): 20.0,
    }
    assert samples[("tnt_synchro_queue_owner", none)] == 0.0


@pytest.mark.parametrize("status", ["connect", "auth", "loading", "disconnected"])
def test_a_stream_not_following_has_status_0(status):
    samples = scrape(observed(follower_info(status)))
    assert series(samples, "tnt_replication_status") == {
        ("tnt_replication_status", labels(stream="upstream", id="1")): 0.0}


def test_candidate_series():
    samples = scrape(observed(candidate_info()))
    none = frozenset()
    assert samples[("tnt_election_state", none)] == 1.0
    assert samples[("tnt_election_leader", none)] == 0.0
    assert samples[("tnt_election_term", none)] == 6.0
    assert series(samples, "tnt_replication") == {}


def test_no_replica_set_no_replication_series():
    samples = scrape(Observed(state=READY))
    assert not [name for name, _ in samples if name.startswith(
        ("tnt_election", "tnt_replication", "tnt_synchro", "tnt_read_only", "tnt_info_lsn", "tnt_info_vclock",
         "boxqueue_replication"))]
    assert ("tnt_info_uptime", frozenset()) in samples  # the rest is still there


# -- health --------------------------------------------------------------------------------------


def client(o: Observed, *, public: bool = False) -> httpx.AsyncClient:
    """The listener's ASGI app behind its basic auth (the watcher may read), called in-process."""
    access = acl.AccessControl()
    access.add_user("watcher", "look").grant(acl.READ, acl.UNIVERSE)
    app = MetricsApp(o, Dashboard(o), trio.Event()).asgi(access, public)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://metrics")


async def statuses(o: Observed) -> tuple[int, int, int, dict[str, Any]]:
    async with client(o) as http:
        health = await http.get("/health")
        leader = await http.get("/health/leader")
        replica = await http.get("/health/replica")
    assert health.json() == leader.json() == replica.json()
    return health.status_code, leader.status_code, replica.status_code, health.json()


async def test_leader_health():
    codes = await statuses(observed(leader_info()))
    assert codes == (200, 200, 503, {"role": "leader", "name": "n1", "term": 5, "leader": "n1", "lsn": 120,
                                     "lag_records": 0, "lag_s": 0.0, "state": "ready"})


async def test_follower_health():
    codes = await statuses(observed(follower_info()))
    assert codes == (200, 503, 200, {"role": "follower", "name": "n2", "term": 5, "leader": "n1", "lsn": 100,
                                     "lag_records": 20, "lag_s": 0.25, "state": "ready"})


@pytest.mark.parametrize("status", ["connect", "auth", "loading", "disconnected", "stopped"])
async def test_a_follower_whose_stream_is_not_up_is_not_a_replica(status):
    assert (await statuses(observed(follower_info(status))))[:3] == (200, 503, 503)


async def test_a_follower_without_a_stream_yet_has_no_lag_to_tell():
    *codes, body = await statuses(observed(follower_info(upstream=False)))
    assert codes == [200, 503, 503]
    assert body["lag_records"] is None and body["lag_s"] is None and body["leader"] == "n1"


async def test_candidate_health():
    assert await statuses(observed(candidate_info())) == (
        200, 503, 503, {"role": "candidate", "name": "n3", "term": 6, "leader": None, "lsn": 90,
                        "lag_records": None, "lag_s": None, "state": "ready"})


@pytest.mark.parametrize("state", [STARTING, RECOVERING, "stopping"])
async def test_nothing_is_healthy_until_ready(state):
    assert (await statuses(observed(leader_info(), state)))[:3] == (200, 503, 503)
    assert (await statuses(observed(follower_info(), state)))[:3] == (200, 503, 503)
    *codes, body = await statuses(observed(None, state))
    assert codes == [200, 503, 503] and body["state"] == state


async def test_a_leader_still_read_only_is_not_the_leader_yet():
    """Elected while serving as a follower: until its leader incarnation opens writes."""
    assert (await statuses(observed(leader_info(), read_only="a follower of the replica set")))[:3] == (
        200, 503, 503)


async def test_alone_ready_is_a_leader():
    assert await statuses(observed(None)) == (
        200, 200, 503, {"role": "alone", "name": None, "term": None, "leader": None, "lsn": 7,
                        "lag_records": 0, "lag_s": 0.0, "state": "ready"})


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS"])
async def test_probes_by_head_and_options(method):
    """HAProxy's httpchk sends OPTIONS by default; HEAD is the other usual probe."""
    async with client(observed(follower_info())) as http:
        assert (await http.request(method, "/health/leader")).status_code == 503
        assert (await http.request(method, "/health/replica")).status_code == 200


@pytest.mark.parametrize("public", [False, True])
async def test_health_needs_no_login_when_everything_else_does(public):
    async with client(observed(leader_info()), public=public) as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/health/leader")).status_code == 200
        assert (await http.get("/health/replica")).status_code == 503  # not 401
        assert (await http.get("/api/snapshot")).status_code == 401
        assert (await http.get("/health/other")).status_code == 401  # only the three paths
        assert (await http.get("/metrics")).status_code == (200 if public else 401)
        assert (await http.get("/api/snapshot", auth=("watcher", "look"))).status_code == 200


# -- the dashboard -------------------------------------------------------------------------------


def peers(o: Observed) -> list[tuple[str, str, int | None, int | None, float | None, str | None]]:
    replica = Dashboard(o).snapshot()["replica"]
    return [(p["name"], p["role"], p["term"], p["lag_records"], p["lag_s"], p["status"]) for p in replica["peers"]]


def test_dashboard_replica_on_the_leader():
    o = observed(leader_info())
    replica = Dashboard(o).snapshot()["replica"]
    assert {k: v for k, v in replica.items() if k != "peers"} == {
        "id": 1, "name": "n1", "state": "leader", "term": 5, "leader": "n1", "ro": False, "lsn": 120,
        "quorum": 2, "queue_len": 2}
    assert peers(o) == [
        ("n1", "leader", 5, 0, 0.0, None),
        ("n2", "follower", 5, 20, 0.5, "follow"),
        ("n3", "unknown", None, 30, 3.0, "stopped"),  # its relay stopped: lag as last known
    ]
    assert replica["peers"][2]["message"] == "connection reset"
    assert [p["self"] for p in replica["peers"]] == [True, False, False]


def test_dashboard_replica_on_a_follower():
    assert peers(observed(follower_info())) == [
        ("n1", "leader", 5, 0, 0.0, None),
        ("n2", "follower", 5, 20, 0.25, "follow"),  # itself: its own stream from the leader
        ("n3", "unknown", None, None, None, None),  # a follower does not see the other followers
    ]
    lsns = [p["lsn"] for p in Dashboard(observed(follower_info())).snapshot()["replica"]["peers"]]
    assert lsns == [120, 100, None]


def test_dashboard_replica_on_a_candidate():
    replica = Dashboard(observed(candidate_info())).snapshot()["replica"]
    assert replica["state"] == "candidate" and replica["leader"] is None
    assert [p["role"] for p in replica["peers"]] == ["unknown", "unknown", "unknown"]


def test_dashboard_alone_has_no_replica():
    o = Observed(state=READY)
    assert Dashboard(o).snapshot()["replica"] is None
