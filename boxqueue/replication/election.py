"""The replica set's leader election, with etcd as the only arbiter.

We keep no consensus protocol of our own: ``P/leader`` names the leader and lives on a lease only
the leader keeps alive, and its create_revision is the term, which etcd only ever raises. Every
member publishes ``P/members/<name>`` (its log position) on a lease of its own, so a candidate can
see who is alive and who is most advanced before it tries to take the key. The leader is fenced
by its own clock: :meth:`Election.lease_valid` lapses a third of a TTL before etcd could let the
lease go, so an old leader stops acknowledging before a successor can be elected.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

import trio

from boxqueue.replication.etcd import EtcdClient, EtcdError, KeyValue

log = logging.getLogger(__name__)

Role = Literal["leader", "follower", "candidate"]


@dataclass(frozen=True, slots=True)
class ElectionState:
    """What this member believes: its role, the term (0 before any) and who leads it."""

    role: Role
    term: int = 0
    leader: str | None = None
    leader_uri: str | None = None


def _backoff(failures: int) -> float:
    return min(0.1 * 2**failures, 1.0)


def _json(kv: KeyValue) -> dict[str, Any]:
    """A key's JSON value; a value that is not ours reads as empty rather than stopping `run`."""
    try:
        value = json.loads(kv.value)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Election:
    """One member's view of the election; :meth:`run` does the work and owns every task.

    ``peers`` are the names of every configured member (this one is added if missing): a candidate
    needs a majority of them alive. ``position()`` returns this member's (last LSN, term of the last
    record), the order of the write-ahead log's entries; candidates compare (term, LSN).
    """

    def __init__(self, client: EtcdClient, prefix: str, name: str, uri: str, peers: list[str],
                 lease_ttl_s: int, position: Callable[[], tuple[int, int]],
                 on_change: Callable[[ElectionState], None] | None = None) -> None:
        self._client = client
        self._prefix = prefix.rstrip("/")
        self._leader_key = f"{self._prefix}/leader".encode()
        self.name, self.uri = name, uri
        self._peers = sorted(set(peers) | {name})
        self._ttl = lease_ttl_s
        self._position = position
        self._on_change = on_change
        self.state = ElectionState("candidate")
        self._members: dict[str, dict] = {}
        self._member_lease: int | None = None
        self._leader_lease: int | None = None
        self._renewed_at = -math.inf  # when the last good keepalive was *sent*
        self._lead_scope: trio.CancelScope | None = None
        self._abstain_until = -math.inf  # after resign(): stay out of the next election
        self._publishing = trio.Lock()

    # what the owner reads

    def lease_valid(self) -> bool:
        """Whether this member may act as leader now: checked before acknowledging anything.
        etcd counts the TTL from when it received a keepalive, we from before we sent it, and we
        give up at 2/3 of it, so this turns False before etcd can hand the key to anyone else."""
        return (self.state.role == "leader"
                and trio.current_time() - self._renewed_at < self._ttl * 2 / 3)

    def members(self) -> dict[str, dict]:
        """The alive members' last published JSON, by name, as last read from etcd."""
        return dict(self._members)

    # running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Takes part in the election until cancelled; started() once this member's key is
        published and the first state is known. Cancelling revokes this member's leases."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._refresh_members)
                await self._contend(task_status)
        finally:
            self._step_down("no longer running")
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
                # the member key first: candidates woken by the leader key's deletion must not
                # wait for us as the best of the alive members
                for lease in (self._member_lease, self._leader_lease):
                    if lease is not None:
                        await self._quietly(self._client.revoke(lease))
            self._leader_lease = self._member_lease = None

    async def resign(self) -> None:
        """A leader steps down and sits out one election (2 x TTL) so that another member takes
        over: its member key goes first, so candidates woken by the leader key's deletion no
        longer count it. A no-op unless leading."""
        if self.state.role != "leader":
            return
        term, lease = self.state.term, self._leader_lease
        self._abstain_until = trio.current_time() + 2 * self._ttl
        async with self._publishing:
            if self._member_lease is not None:
                await self._quietly(self._client.revoke(self._member_lease))
                self._member_lease = None
        self._step_down("resigned")
        await self._withdraw(term, lease)

    async def _contend(self, task_status: trio.TaskStatus[None]) -> None:
        """The main loop: look at the leader key, then follow it, clear our own stale one, or
        campaign; any etcd failure here only delays the next look."""
        started, failures = False, 0
        while True:
            try:
                floor = await self._publish()
                kv = await self._client.get(self._leader_key)
                holder = _json(kv) if kv is not None else {}
                if kv is None:
                    self._set("candidate", self.state.term)
                elif holder.get("name") != self.name:
                    self._set("follower", kv.create_revision, holder.get("name"),
                              holder.get("uri"))
                if not started:
                    task_status.started()
                    started = True
                failures = 0
                if kv is None:
                    await self._campaign(floor)
                elif holder.get("name") == self.name:
                    await self._clear_stale(kv)  # an earlier leadership of ours, now over
                else:
                    await self._follow(kv)
            except EtcdError as exc:
                failures += 1
                log.warning("%s: election: etcd failed (%s); retrying", self.name, exc)
                await trio.sleep(_backoff(failures))

    async def _campaign(self, floor: int | None) -> None:
        """Takes the key if we may; else waits for a leader key (watched from ``floor``, a
        revision before we saw none) and returns for the caller to look again."""
        remaining = self._abstain_until - trio.current_time()
        if floor is None or remaining > 0:  # sitting out after resign(): look again soon
            await trio.sleep(min(max(remaining, 0.1), self._ttl / 3))
            return
        alive = await self._read_members()
        if len(alive) < len(self._peers) // 2 + 1:
            wait, best = self._ttl / 3, None  # no majority: look again when members refresh
        else:
            best = min(alive.values(), key=lambda m: (-int(m.get("term", 0)),
                                                      -int(m.get("lsn", 0)), str(m["name"])))
            wait = 2 * self._ttl  # the best one should take the key; if it died, look again
        if best is not None and best["name"] == self.name:
            granted_at = trio.current_time()
            self._leader_lease = lease = await self._client.grant(self._ttl)
            value = json.dumps({"name": self.name, "uri": self.uri}).encode()
            won, term = await self._client.create_if_absent(self._leader_key, value, lease)
            if won:
                self._renewed_at = granted_at
                await self._lead(term, lease)
            else:
                self._leader_lease = None
                await self._quietly(self._client.revoke(lease))
            return
        with trio.move_on_after(wait):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._wake_on, self._leader_key, "PUT", floor, nursery)
                if best is not None:  # the best one's member key going means it died: no wait
                    key = f"{self._prefix}/members/{best['name']}".encode()
                    nursery.start_soon(self._wake_on, key, "DELETE", floor, nursery)

    async def _wake_on(self, key: bytes, kind: str, floor: int, nursery: trio.Nursery) -> None:
        """Ends the wait at the first ``kind`` event on ``key``, or (after a pause) when the watch
        fails: either way the caller looks again."""
        try:
            async with aclosing(self._client.watch(key, floor + 1)) as events:
                async for event in events:
                    if event.type == kind:
                        break
        except EtcdError as exc:
            log.debug("%s: election: watching %r: %s", self.name, key, exc)
            await trio.sleep(_backoff(3))
        nursery.cancel_scope.cancel()

    async def _follow(self, kv: KeyValue) -> None:
        """Until the leader's key goes (its lease lapsed, or it resigned), or for 2 x TTL: a watch
        over a connection that died silently would never say, so the caller looks again."""
        with trio.move_on_after(2 * self._ttl):
            async with aclosing(self._client.watch(self._leader_key, kv.revision + 1)) as events:
                async for event in events:
                    if event.type == "DELETE" or event.kv.create_revision != kv.create_revision:
                        self._set("candidate", self.state.term)
                        return

    async def _clear_stale(self, kv: KeyValue) -> None:
        log.info("%s: election: removing our own stale leader key (term %d)",
                 self.name, kv.create_revision)
        await self._client.delete_if(self._leader_key, kv.create_revision)
        if kv.lease:
            await self._quietly(self._client.revoke(kv.lease))

    # leading

    async def _lead(self, term: int, lease: int) -> None:
        log.info("%s: election: leader in term %d", self.name, term)
        self._set("leader", term, self.name, self.uri)
        async with trio.open_nursery() as nursery:
            self._lead_scope = nursery.cancel_scope
            nursery.start_soon(self._keep_leader_lease, lease)
            nursery.start_soon(self._guard_key, term)
        self._lead_scope = None
        with trio.move_on_after(self._ttl / 3):
            await self._withdraw(term, lease)

    async def _keep_leader_lease(self, lease: int) -> None:
        """Renews every TTL/3; a keepalive that fails, finds the lease gone, or has not answered
        by the time lease_valid() lapses ends the leadership at once."""
        while True:
            await trio.sleep_until(self._renewed_at + self._ttl / 3)
            sent = trio.current_time()
            try:
                with trio.fail_at(self._renewed_at + self._ttl * 2 / 3):
                    ttl = await self._client.keepalive(lease)
            except (EtcdError, trio.TooSlowError) as exc:
                self._step_down(f"keepalive failed: {exc!r}")
                return
            if ttl <= 0:
                self._step_down("the leader lease is gone")
                return
            self._renewed_at = sent

    async def _guard_key(self, term: int) -> None:
        """Steps down if our key is deleted behind our back (by hand, say), which would let a
        successor in while our lease still runs. A broken watch alone is no reason to step down."""
        failures = 0
        while True:
            try:
                kv = await self._client.get(self._leader_key)
                if kv is None or kv.create_revision != term:
                    self._step_down("the leader key is gone")
                    return
                watch = self._client.watch(self._leader_key, kv.revision + 1)
                async with aclosing(watch) as events:
                    async for event in events:
                        if event.type == "DELETE" or event.kv.create_revision != term:
                            self._step_down("the leader key was deleted")
                            return
            except EtcdError as exc:
                failures += 1
                log.debug("%s: election: watching the leader key: %s", self.name, exc)
                await trio.sleep(_backoff(failures))

    def _step_down(self, why: str) -> None:
        """Fences at once (synchronously: no await between the cause and lease_valid() False)."""
        self._renewed_at = -math.inf
        if self.state.role == "leader":
            log.warning("%s: election: stepping down from term %d: %s",
                        self.name, self.state.term, why)
            self._set("candidate", self.state.term)
        if self._lead_scope is not None:
            self._lead_scope.cancel()

    async def _withdraw(self, term: int, lease: int | None) -> None:
        """Deletes our key only while it is still the incarnation of ``term``, never a
        successor's, then ends the lease; failures are left to the lease's TTL."""
        await self._quietly(self._client.delete_if(self._leader_key, term))
        if lease is not None:
            await self._quietly(self._client.revoke(lease))
            if self._leader_lease == lease:
                self._leader_lease = None

    # members

    async def _refresh_members(self) -> None:
        while True:
            try:
                await self._publish()
                await self._read_members()
            except EtcdError as exc:
                log.warning("%s: election: refreshing members failed: %s", self.name, exc)
            await trio.sleep(self._ttl / 3)

    async def _publish(self) -> int | None:
        """Puts our member key with our current position; the write's revision, or None while
        we sit out an election after resigning."""
        async with self._publishing:
            if trio.current_time() < self._abstain_until:
                return None
            if self._member_lease is None or await self._client.keepalive(self._member_lease) <= 0:
                self._member_lease = await self._client.grant(self._ttl)
            lsn, term = self._position()
            value = {"name": self.name, "uri": self.uri, "lsn": lsn, "term": term}
            return await self._client.put(f"{self._prefix}/members/{self.name}".encode(),
                                          json.dumps(value).encode(), self._member_lease)

    async def _read_members(self) -> dict[str, dict]:
        alive = {}
        for peer in self._peers:
            kv = await self._client.get(f"{self._prefix}/members/{peer}".encode())
            if kv is not None and _json(kv).get("name") == peer:
                alive[peer] = _json(kv)
        self._members = alive
        return alive

    # state

    def _set(self, role: Role, term: int, leader: str | None = None,
             leader_uri: str | None = None) -> None:
        state = ElectionState(role, term, leader, leader_uri)
        if state != self.state:
            self.state = state
            if self._on_change is not None:
                self._on_change(state)

    async def _quietly(self, request: Awaitable[object]) -> None:
        try:
            await request
        except EtcdError as exc:
            log.debug("%s: election: ignored: %s", self.name, exc)
