"""The nemeses: one fault each, injected, held for a few seconds, then healed.

Each has a ``name``, whether it needs a three-member etcd (``needs_etcd3``: the "first endpoint"
ones; the others run against one etcd member or three, acting on the first), ``inject`` (returns what it did,
for the history and the report) and ``heal``. They act through the topology's nftables and tc
(:mod:`tests.faults.netns`), signals to the processes, and the members' small disks.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from tests.faults.cluster import FaultCluster
from tests.faults.netns import Topology


@dataclass
class Stage:
    """What a nemesis acts on."""

    cluster: FaultCluster
    topology: Topology
    rng: random.Random
    hold_s: float  # how long the fault lasts, unless the nemesis says otherwise

    def etcd_hosts(self) -> list[str]:
        return list(self.cluster.etcds)

    def leader(self) -> str:
        return self.cluster.wait_for_leader(timeout=60)


class Nemesis:
    name = ""
    needs_etcd3 = False
    hold_s: float | None = None  # set by inject when the nemesis decides its own duration
    # when the fault took effect (monotonic), if not at the end of inject: failover counts from it
    effective_at: float | None = None

    def inject(self, stage: Stage) -> str:
        raise NotImplementedError

    def heal(self, stage: Stage) -> None:
        stage.topology.heal()


class IsolateLeader(Nemesis):
    name = "isolate-leader"

    def inject(self, stage: Stage) -> str:
        leader = stage.leader()
        stage.topology.isolate(leader)
        return f"{leader} (the leader) cut from every other host"


class LeaderFromEtcd(Nemesis):
    name = "leader-from-etcd"

    def inject(self, stage: Stage) -> str:
        leader = stage.leader()
        stage.topology.cut_from(leader, stage.etcd_hosts())
        return f"{leader} (the leader) cut from etcd only"


class LeaderFromFollowers(Nemesis):
    name = "leader-from-followers"

    def inject(self, stage: Stage) -> str:
        leader = stage.leader()
        followers = stage.cluster.followers(leader)
        stage.topology.cut_from(leader, followers)
        return f"{leader} (the leader) cut from its followers {', '.join(followers)} only"


class MajoritiesRing(Nemesis):
    """Every member sees a majority, no two the same one. With three members that is a line
    a - b - c: a and c are cut from each other, b reaches both, etcd reaches all. The leader is
    put at one end, so one of its followers loses it while it keeps its majority."""

    name = "majorities-ring"

    def inject(self, stage: Stage) -> str:
        leader = stage.leader()
        middle, end = stage.rng.sample(stage.cluster.followers(leader), 2)
        stage.topology.cut([(leader, end)])
        return f"ring {leader} - {middle} - {end}: {leader} (the leader) and {end} cut from each other"


class IsolateFollower(Nemesis):
    name = "isolate-follower"

    def inject(self, stage: Stage) -> str:
        follower = stage.rng.choice(stage.cluster.followers(stage.leader()))
        stage.topology.isolate(follower)
        return f"{follower} (a follower) cut from every other host"


class PauseLeader(Nemesis):
    """SIGSTOP of the leader for 0.5 to 3 lease TTLs, then SIGCONT."""

    name = "pause-leader"

    def inject(self, stage: Stage) -> str:
        leader = stage.leader()
        ttls = stage.rng.uniform(0.5, 3.0)
        self.hold_s = ttls * stage.cluster.lease_ttl_s
        self.paused = leader
        stage.cluster.members[leader].pause()
        return f"{leader} (the leader) stopped (SIGSTOP) for {self.hold_s:.1f} s ({ttls:.2f} lease TTLs)"

    def heal(self, stage: Stage) -> None:
        stage.cluster.members[self.paused].resume()


class KillLeaderAndSuccessor(Nemesis):
    """kill -9 of the leader, then of its successor within a second of its election; both are
    started again when healing."""

    name = "kill-leader-and-successor"

    def inject(self, stage: Stage) -> str:
        cluster = stage.cluster
        first = stage.leader()
        cluster.members[first].kill()
        self.effective_at = time.monotonic()
        self.killed = [first]
        try:
            second = cluster.wait_for_leader(timeout=30, other_than=first)
        except RuntimeError:
            return f"{first} (the leader) killed (-9); no successor within 30 s"
        delay = stage.rng.uniform(0, 1.0)
        time.sleep(delay)
        cluster.members[second].kill()
        self.killed.append(second)
        return f"{first} (the leader) killed (-9), then {second}, {delay:.2f} s after it was seen leading"

    def heal(self, stage: Stage) -> None:
        for name in self.killed:
            stage.cluster.members[name].start()


class PauseEtcd(Nemesis):
    name = "pause-etcd"

    def inject(self, stage: Stage) -> str:
        stage.cluster.etcds["e1"].pause()
        return "etcd (its first member) stopped (SIGSTOP)"

    def heal(self, stage: Stage) -> None:
        stage.cluster.etcds["e1"].resume()


class SlowEtcd(Nemesis):
    name = "slow-etcd"

    def inject(self, stage: Stage) -> str:
        stage.topology.slow("e1", rate="32kbit", latency="500ms", burst="2kb")
        return "etcd's (its first member's) link through a token bucket of 32 kbit/s both ways (tbf, 500 ms queue)"


class EtcdFirstEndpointIsolated(Nemesis):
    name = "etcd-first-endpoint-isolated"
    needs_etcd3 = True

    def inject(self, stage: Stage) -> str:
        stage.topology.isolate("e1")
        return "e1, the first etcd endpoint, cut from every other host"


class EtcdFirstEndpointMinority(Nemesis):
    """The first endpoint still answers the members, but it is cut from the other etcd members:
    a minority that cannot commit anything."""

    name = "etcd-first-endpoint-minority"
    needs_etcd3 = True

    def inject(self, stage: Stage) -> str:
        stage.topology.cut_from("e1", ["e2", "e3"])
        return "e1, the first etcd endpoint, cut from the other etcd members only (a minority the members still reach)"


class DiskFull(Nemesis):
    """A member's data directory (a small tmpfs) filled to the brim, then freed: the leader's
    or a follower's, by the seed."""

    name = "disk-full"

    def inject(self, stage: Stage) -> str:
        # held twice as long: the write-ahead log's segment and LMDB's map have room ahead of them
        self.hold_s = 2 * stage.hold_s
        leader = stage.leader()
        self.member = leader if stage.rng.random() < 0.5 else stage.rng.choice(stage.cluster.followers(leader))
        disk = stage.cluster.members[self.member].disk
        assert disk is not None
        filled = disk.fill()
        role = "the leader" if self.member == leader else "a follower"
        return f"{self.member}'s disk ({role}) filled: {filled / 2**20:.0f} MiB of filler, {disk.free_bytes()} bytes left"

    def heal(self, stage: Stage) -> None:
        disk = stage.cluster.members[self.member].disk
        assert disk is not None
        disk.free()


ALL: dict[str, type[Nemesis]] = {n.name: n for n in (
    IsolateLeader, LeaderFromEtcd, LeaderFromFollowers, MajoritiesRing, IsolateFollower, PauseLeader,
    KillLeaderAndSuccessor, PauseEtcd, SlowEtcd, EtcdFirstEndpointIsolated, EtcdFirstEndpointMinority, DiskFull)}
