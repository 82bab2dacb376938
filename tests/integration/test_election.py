"""Leader election against a real etcd: several Election instances, each with its own client."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio

from boxqueue.replication.election import Election, ElectionState
from boxqueue.replication.etcd import EtcdClient
from tests.etcdproc import EtcdProcess

TTL = 2
TIMEOUT = 2.0  # each etcd request; a paused proxy makes requests hang this long
_prefixes = itertools.count()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    proc = EtcdProcess(tmp_path_factory.mktemp("etcd"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def prefix(request) -> str:
    return f"/boxqueue-test/{request.node.name}/{next(_prefixes)}"


class PausableProxy:
    """A TCP proxy to etcd whose traffic can be held: a stalled network path, while etcd itself
    (and every other member's path to it) keeps working."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._flowing = trio.Event()
        self._flowing.set()

    def pause(self) -> None:
        self._flowing = trio.Event()

    def resume(self) -> None:
        self._flowing.set()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, down: trio.SocketStream) -> None:
        try:
            up = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        except OSError:
            await down.aclose()
            return
        async with down, up, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, down, up, nursery.cancel_scope)
            nursery.start_soon(self._pump, up, down, nursery.cancel_scope)

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream,
                    both: trio.CancelScope) -> None:
        try:
            while data := await source.receive_some(65536):
                await self._flowing.wait()  # what arrives during a pause is held, not dropped
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            both.cancel()


@dataclass
class Member:
    name: str
    client: EtcdClient
    position: tuple[int, int] = (0, 0)  # (last LSN, term of the last record)
    changes: list[tuple[float, ElectionState]] = field(default_factory=list)
    election: Election = field(init=False)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)

    @property
    def state(self) -> ElectionState:
        return self.election.state

    def stop(self) -> None:
        """Cancels this member's run(): it revokes its leases on the way out."""
        self.scope.cancel()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.scope:
                await self.election.run(task_status=task_status)
        finally:
            self.done.set()


class Group:
    """Members of one replica set, run in one nursery, with a guard that fails the test if two
    members ever hold a valid lease at the same moment."""

    def __init__(self, nursery: trio.Nursery, endpoint: str, prefix: str) -> None:
        self.nursery, self.endpoint, self.prefix = nursery, endpoint, prefix
        self.members: list[Member] = []

    async def start(self, name: str, peers: list[str], position: tuple[int, int] = (0, 0),
                    endpoint: str | None = None) -> Member:
        member = Member(name, EtcdClient([endpoint or self.endpoint], TIMEOUT), position)
        member.election = Election(
            member.client, self.prefix, name, f"{name}.example:3301", peers, TTL,
            lambda: member.position,
            lambda state: member.changes.append((trio.current_time(), state)))
        self.members.append(member)
        with trio.fail_after(10):
            await self.nursery.start(member.run)
        return member

    async def guard_fencing(self) -> None:
        while True:
            valid = [m.name for m in self.members if m.election.lease_valid()]
            assert len(valid) <= 1, f"two valid leases at once: {valid}"
            await trio.sleep(0.005)

    async def converged(self, members: list[Member], timeout: float) -> Member:
        """Waits until exactly one of ``members`` leads and the others follow it in its term."""
        with trio.fail_after(timeout):
            while True:
                leaders = [m for m in members if m.state.role == "leader"]
                if len(leaders) == 1 and leaders[0].election.lease_valid():
                    lead = leaders[0].state
                    expected = ElectionState("follower", lead.term, lead.leader, lead.leader_uri)
                    if all(m.state == expected for m in members if m is not leaders[0]):
                        return leaders[0]
                await trio.sleep(0.02)


@asynccontextmanager
async def group(endpoint: str, prefix: str) -> AsyncIterator[Group]:
    async with trio.open_nursery() as nursery:
        g = Group(nursery, endpoint, prefix)
        nursery.start_soon(g.guard_fencing)
        try:
            yield g
        finally:
            nursery.cancel_scope.cancel()
    for member in g.members:
        await member.client.aclose()


async def test_three_members_elect_one_leader_that_the_others_follow(etcd, prefix):
    peers = ["a", "b", "c"]
    async with group(etcd.endpoint, prefix) as g:
        members = [await g.start(name, peers) for name in peers]
        leader = await g.converged(members, TTL * 3)
        state = leader.state
        assert state.term > 0 and state.leader == leader.name
        assert state.leader_uri == f"{leader.name}.example:3301"
        key = await members[0].client.get(f"{prefix}/leader".encode())
        assert key.create_revision == state.term
        for m in members:
            assert m.election.lease_valid() is (m is leader)
        with trio.fail_after(TTL):
            while set(leader.election.members()) != set(peers):
                await trio.sleep(0.05)
        assert leader.election.members()["b"] == {
            "name": "b", "uri": "b.example:3301", "lsn": 0, "term": 0}
        await trio.sleep(TTL * 1.5)  # and it stays so, the leader renewing its lease
        assert await g.converged(members, 0.5) is leader and leader.state.term == state.term


@pytest.mark.parametrize(("positions", "winner"), [
    ({"a": (10, 1), "b": (4, 2), "c": (5, 1)}, "b"),  # a higher term beats a longer log
    ({"a": (7, 3), "b": (7, 3), "c": (9, 3)}, "c"),  # in the same term, the longer log
    ({"c": (7, 3), "b": (7, 3), "a": (7, 3)}, "a"),  # all equal: the smallest name
])
async def test_the_most_advanced_member_wins(etcd, prefix, positions, winner):
    # five configured peers, three running: nobody may take the key before all three are alive,
    # so the outcome does not depend on who started first
    peers = ["a", "b", "c", "d", "e"]
    async with group(etcd.endpoint, prefix) as g:
        members = [await g.start(name, peers, position) for name, position in positions.items()]
        leader = await g.converged(members, TTL * 4)
        assert leader.name == winner
        assert leader.election.members()[winner]["lsn"] == positions[winner][0]


async def test_no_leader_without_a_majority_alive(etcd, prefix):
    peers = ["a", "b", "c"]
    async with group(etcd.endpoint, prefix) as g:
        a = await g.start("a", peers, (5, 1))
        await trio.sleep(TTL * 2.5)
        assert a.state == ElectionState("candidate") and not a.election.lease_valid()
        assert await a.client.get(f"{prefix}/leader".encode()) is None
        assert set(a.election.members()) == {"a"}
        b = await g.start("b", peers)
        leader = await g.converged([a, b], TTL * 2)
        assert leader is a  # the more advanced of the two


async def test_a_stopped_leader_is_replaced_with_a_higher_term(etcd, prefix):
    peers = ["a", "b", "c"]
    async with group(etcd.endpoint, prefix) as g:
        members = [await g.start(name, peers) for name in peers]
        old = await g.converged(members, TTL * 3)
        old_term = old.state.term
        stopped = trio.current_time()
        old.stop()
        with trio.fail_after(2):
            await old.done.wait()
        # it revoked its leases on the way out: its keys are gone at once, not after a TTL
        held = await members[0].client.get(f"{prefix}/leader".encode())
        assert held is None or held.create_revision != old_term
        assert await members[0].client.get(f"{prefix}/members/{old.name}".encode()) is None
        rest = [m for m in members if m is not old]
        new = await g.converged(rest, TTL + 3)
        took = trio.current_time() - stopped
        assert new.state.term > old_term
        assert took < TTL + 3
        print(f"failover after a stop took {took:.2f}s")


async def test_a_resigning_leader_hands_over(etcd, prefix):
    peers = ["a", "b", "c"]
    async with group(etcd.endpoint, prefix) as g:
        members = [await g.start(name, peers) for name in peers]
        old = await g.converged(members, TTL * 3)
        old_term = old.state.term
        await old.election.resign()
        assert old.state.role != "leader" and not old.election.lease_valid()
        # a successor, which the resigned one follows well before its sitting-out (2 x TTL) ends
        new = await g.converged(members, TTL + 1)
        assert new is not old and new.state.term > old_term
        await old.election.resign()  # not leading: nothing happens
        assert old.state.role == "follower"


async def test_a_stalled_leader_fences_itself_before_anyone_else_can_win(etcd, prefix):
    peers = ["a", "b", "c"]
    async with group(etcd.endpoint, prefix) as g:
        proxy = PausableProxy(etcd.client_port)
        port = await g.nursery.start(proxy.serve)
        a = await g.start("a", peers, (1, 9), endpoint=f"127.0.0.1:{port}")  # the best: leads
        others = [await g.start(name, peers) for name in ("b", "c")]
        assert await g.converged([a, *others], TTL * 3) is a
        old_term = a.state.term

        paused = trio.current_time()
        proxy.pause()
        with trio.fail_after(TTL * 2 / 3 + 0.5):
            while a.election.lease_valid():
                await trio.sleep(0.005)
        fenced = trio.current_time()
        new = await g.converged(others, TTL + 4)
        won_at = next(t for t, s in new.changes if s.role == "leader" and s.term > old_term)
        assert won_at > fenced and new.state.term > old_term
        assert a.state.role != "leader"
        print(f"fenced {fenced - paused:.2f}s after the pause, successor {won_at - paused:.2f}s")

        proxy.resume()  # the old leader comes back as a follower of the new term
        assert await g.converged([a, *others], TTL * 4) is new


async def test_members_converge_again_after_etcd_restarts(tmp_path, prefix):
    etcd = EtcdProcess(tmp_path / "etcd")
    etcd.start()
    try:
        peers = ["a", "b", "c"]
        async with group(etcd.endpoint, prefix) as g:
            members = [await g.start(name, peers) for name in peers]
            old = await g.converged(members, TTL * 3)
            old_term = old.state.term

            await trio.to_thread.run_sync(etcd.stop)
            stopped = trio.current_time()
            with trio.fail_after(TTL * 2 / 3 + 0.5):  # etcd gone: the leader fences itself
                while old.election.lease_valid():
                    await trio.sleep(0.005)
            assert trio.current_time() - stopped < TTL * 2 / 3 + 0.5
            await trio.sleep(TTL)
            assert not any(m.state.role == "leader" for m in members)

            await trio.to_thread.run_sync(etcd.start)  # the same ports and data
            new = await g.converged(members, TTL * 6)
            assert new.state.term > old_term
    finally:
        etcd.kill()


async def test_a_position_published_before_the_leader_went_does_not_count(etcd, prefix):
    """b holds every write a confirmed (its log at 10) but cannot reach etcd when a goes: its
    member key still shows the position it published earlier (3). c (at 5) must not win on that
    stale picture, which would make it the most advanced of a "majority" and wipe b's records
    when b rejoins; it waits until b publishes again, and b wins."""
    peers = ["a", "b", "c"]
    async with group(etcd.endpoint, prefix) as g:
        proxy = PausableProxy(etcd.client_port)
        port = await g.nursery.start(proxy.serve)
        a = await g.start("a", peers, (10, 1))
        b = await g.start("b", peers, (3, 1), endpoint=f"127.0.0.1:{port}")
        c = await g.start("c", peers, (5, 1))
        assert await g.converged([a, b, c], TTL * 3) is a
        with trio.fail_after(TTL):  # b's position as a saw it (published before the pause)
            while a.election.members().get("b", {}).get("lsn") != 3:
                await trio.sleep(0.02)
        proxy.pause()
        b.position = (10, 1)  # it caught up with a, but can publish nothing now
        a.stop()  # its keys go at once: c campaigns while b's old member key still lives
        await trio.sleep(TTL * 2)
        assert c.state.role != "leader", "c won on a position b published before the leader went"
        proxy.resume()
        leader = await g.converged([b, c], TTL * 6)
        assert leader is b


class RefusingProxy(PausableProxy):
    """A :class:`PausableProxy` that can also refuse: while refusing, every connection to it, and
    every one it carries, is closed at once (etcd unreachable for a moment)."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self.refusing = False
        self._carried: set[trio.CancelScope] = set()

    def refuse(self) -> None:
        self.refusing = True
        for scope in list(self._carried):
            scope.cancel()

    async def _handle(self, down: trio.SocketStream) -> None:
        if self.refusing:
            await down.aclose()
            return
        with trio.CancelScope() as scope:
            self._carried.add(scope)
            try:
                await super()._handle(down)
            finally:
                self._carried.discard(scope)
        await down.aclose()


async def test_a_leader_keeps_its_lease_through_a_keepalive_that_fails_once(etcd, prefix):
    """etcd is unreachable just when a renewal is due, and back well before the lease's fence:
    the leader tries again and stays the leader, in the same term (it used to step down at the
    first failed keepalive, with most of its lease left)."""
    ttl = 3
    async with trio.open_nursery() as nursery:
        proxy = RefusingProxy(etcd.client_port)
        port = await nursery.start(proxy.serve)
        clients = [EtcdClient([f"127.0.0.1:{port}"], TIMEOUT), EtcdClient([etcd.endpoint], TIMEOUT)]
        elections = [Election(client, prefix, name, f"{name}:1", ["a", "b"], ttl, lambda: (0, 0))
                     for client, name in zip(clients, ["a", "b"], strict=True)]
        for election in elections:
            await nursery.start(election.run)
        a = elections[0]
        with trio.fail_after(ttl * 4):
            while a.state.role != "leader" or not a.lease_valid():
                await trio.sleep(0.02)
        term = a.state.term
        renewed = a._renewed_at
        with trio.fail_after(ttl):
            while a._renewed_at == renewed:  # a renewal just happened: the next is due in ttl/3
                await trio.sleep(0.005)
        await trio.sleep_until(a._renewed_at + ttl / 3 - 0.1)
        proxy.refuse()
        await trio.sleep(0.5)  # the renewal due meanwhile failed
        proxy.refusing = False
        await trio.sleep(ttl)
        assert a.state.role == "leader" and a.state.term == term and a.lease_valid()
        assert elections[1].state.role == "follower" and elections[1].state.term == term
        nursery.cancel_scope.cancel()
    for client in clients:
        await client.aclose()


async def test_a_leader_that_won_just_after_a_member_looked_is_followed_at_once(etcd, prefix):
    """b reads no leader key; a takes it before b reads the members' positions. b's wait for a
    leader must see a's key at once: it watched from the members' later read, missed a's key and
    followed a only when its wait ran out (TTL/3, or 2 x TTL), while a's writes, with no follower,
    failed (the CI run of tests/integration/test_spark_streaming.py that caught it)."""
    ttl = 30
    client, other = EtcdClient([etcd.endpoint], TIMEOUT), EtcdClient([etcd.endpoint], TIMEOUT)
    try:
        b = Election(client, prefix, "b", "b.example:3301", ["a", "b", "c"], ttl, lambda: (0, 0))
        kv, looked_at = await client.read(b._leader_key)
        assert kv is None
        lease = await other.grant(ttl)
        won, _term = await other.create_if_absent(b._leader_key, b'{"name": "a", "uri": "a.example:3301"}', lease)
        assert won
        with trio.fail_after(ttl / 3 - 5):  # its wait without a majority's positions: ttl / 3
            await b._campaign(looked_at, looked_at)
    finally:
        await client.aclose()
        await other.aclose()
