"""The replica set's leader election, with etcd as the only arbiter.

We keep no consensus protocol of our own: ``P/leader`` names the leader and lives on a lease only
the leader keeps alive, and its create_revision is the term, which etcd only ever raises. Every
member publishes ``P/members/<name>`` (its log position) on a lease of its own, so a candidate can
see who is alive and who is most advanced before it tries to take the key. The leader is fenced
by its own clock: :meth:`Election.lease_valid` lapses a third of a TTL before etcd could let the
lease go, so an old leader stops acknowledging before a successor can be elected.

Who may win: the most advanced (term of the last record, then LSN) of a majority of the members
whose positions were published *after* the leader key was seen gone (their key's mod_revision is
above the revision at which the candidate read no leader key). The old leader confirmed nothing
after that (it fenced itself first), so every write it confirmed is on a majority, which meets
that majority: the winner has it. A member that publishes late (paused, starved, behind a slow
etcd) is not counted on an old position; it waits for the next round. The key is created in one
transaction with the condition that none of the counted positions changed since they were read.
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

from boxqueue.replication import safeguards
from boxqueue.replication.etcd import EtcdClient, EtcdError, KeyValue

log = logging.getLogger(__name__)

Role = Literal["leader", "follower", "candidate"]


@dataclass(frozen=True, slots=True)
class _Member:
    """A member's published position: its JSON and when it was written (mod_revision)."""

    name: str
    value: dict[str, Any]
    mod_revision: int


@dataclass(frozen=True, slots=True)
class ElectionState:
    """What this member believes: its role, the term (0 before any) and who leads it."""

    role: Role
    term: int = 0
    leader: str | None = None
    leader_uri: str | None = None


def _backoff(failures: int) -> float:
    return min(0.1 * 2**failures, 1.0)


def _position(value: dict[str, Any]) -> tuple[int, int]:
    """A published member value's (LSN, term), as ``position()`` gives them."""
    try:
        return int(value.get("lsn", 0)), int(value.get("term", 0))
    except (TypeError, ValueError):
        return 0, 0


def _rank(member: _Member) -> tuple[int, int, str]:
    """Candidates in order: the term of the last record, then the LSN, highest first; then the
    smallest name."""
    lsn, term = _position(member.value)
    return -term, -lsn, member.name


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
        # A revision at which the leader key was gone, and no leader key since: positions
        # published after it count in a campaign (None while a leader key is known).
        self._absent_since: int | None = None
        self._publishing = trio.Lock()

    # what the owner reads

    def lease_valid(self) -> bool:
        """Whether this member may act as leader now: checked before acknowledging anything.
        etcd counts the TTL from when it received a keepalive, we from before we sent it, and we
        give up at 2/3 of it, so this turns False before etcd can hand the key to anyone else."""
        if safeguards.off("no-fence"):
            return self.state.role == "leader"
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

    async def resign(self, why: str = "resigned") -> None:
        """A leader steps down at once and sits out one election (2 x TTL) so that another member
        takes over: it publishes no position meanwhile, and its member key goes before its
        leader key, so candidates do not wait for it. A no-op unless leading."""
        if self.state.role != "leader":
            return
        term, lease = self.state.term, self._leader_lease
        self._abstain_until = trio.current_time() + 2 * self._ttl
        self._step_down(why)  # fenced at once, before any await
        async with self._publishing:
            if self._member_lease is not None:
                await self._quietly(self._client.revoke(self._member_lease))
                self._member_lease = None
        await self._withdraw(term, lease)

    async def _contend(self, task_status: trio.TaskStatus[None]) -> None:
        """The main loop: look at the leader key, then follow it, clear our own stale one, or
        campaign; any etcd failure here only delays the next look."""
        started, failures = False, 0
        while True:
            try:
                if not started:
                    await self._publish()
                kv, revision = await self._client.read(self._leader_key)
                holder = _json(kv) if kv is not None else {}
                if kv is None:
                    self._set("candidate", self.state.term)
                    if self._absent_since is None:
                        self._absent_since = revision
                else:
                    self._absent_since = None
                if kv is not None and holder.get("name") != self.name:
                    self._set("follower", kv.create_revision, holder.get("name"),
                              holder.get("uri"))
                if not started:
                    task_status.started()
                    started = True
                failures = 0
                if kv is None:
                    await self._campaign(self._absent_since or revision, revision)
                elif holder.get("name") == self.name:
                    await self._clear_stale(kv)  # an earlier leadership of ours, now over
                else:
                    await self._follow(kv)
            except EtcdError as exc:
                failures += 1
                log.warning("%s: election: etcd failed (%s); retrying", self.name, exc)
                await trio.sleep(_backoff(failures))

    async def _campaign(self, absent_at: int, looked_at: int) -> None:
        """The leader key was absent at revision ``absent_at`` (and still at ``looked_at``, when
        the caller read it): take it if we are the most advanced of a majority that published
        since (see the module docstring); else wait for a leader, for the best one to go, or for
        more positions, and return for the caller to look again."""
        remaining = self._abstain_until - trio.current_time()
        if remaining > 0:  # sitting out after resign(): look again soon
            await trio.sleep(min(max(remaining, 0.1), self._ttl / 3))
            return
        members, revision = await self._read_members()
        mine = members.get(self.name)
        if mine is None or mine.mod_revision <= absent_at or _position(mine.value) != self._position():
            if await self._publish() is None:
                return
            members, revision = await self._read_members()
        fresh = {name: m for name, m in members.items() if m.mod_revision > absent_at}
        best: _Member | None = None
        if len(fresh) >= len(self._peers) // 2 + 1:
            best = min(fresh.values(), key=_rank)
            # An alive member that said it was further ahead, but before the leader went, is
            # not counted; it is waited for, until it publishes again (every TTL/3) or its key
            # lapses (a paused one), so that the most advanced member leads when it can.
            ahead = min(members.values(), key=_rank)
            if _rank(ahead) < _rank(best):
                best = ahead
        if best is not None and best.name == self.name and best.mod_revision > absent_at:
            granted_at = trio.current_time()
            self._leader_lease = lease = await self._client.grant(self._ttl)
            value = json.dumps({"name": self.name, "uri": self.uri}).encode()
            won, term = await self._client.create_if_absent(
                self._leader_key, value, lease, unchanged={self._member_key(m.name): m.mod_revision
                                                           for m in fresh.values()})
            if won:
                self._renewed_at = granted_at
                await self._lead(term, lease)
            else:
                self._leader_lease = None
                await self._quietly(self._client.revoke(lease))
            return
        # The best one should take the key (if it died, look again); without a fresh majority,
        # look again at the next position published.
        wait = 2 * self._ttl if best is not None else self._ttl / 3
        with trio.move_on_after(wait):
            async with trio.open_nursery() as nursery:
                # a leader key put (even one deleted again before we look) ends this absence:
                # watched from where the key was read absent, not from the members' later read
                # (a member that won in between was missed, and followed only 2 x TTL later)
                nursery.start_soon(self._wake_on, self._leader_key, "PUT", looked_at, nursery, False,
                                   self._leader_seen)
                if best is not None:  # the best one's member key going means it died: no wait
                    nursery.start_soon(self._wake_on, self._member_key(best.name), "DELETE", revision, nursery)
                    if best.mod_revision <= absent_at:  # ... and its next position ends the wait too
                        nursery.start_soon(self._wake_on, self._member_key(best.name), "PUT", revision, nursery)
                else:
                    nursery.start_soon(self._wake_on, self._member_key(""), "PUT", revision, nursery, True)

    async def _wake_on(self, key: bytes, kind: str, floor: int, nursery: trio.Nursery,
                       prefix: bool = False, seen: Callable[[], None] | None = None) -> None:
        """Ends the wait at the first ``kind`` event on ``key`` (on any key under it, with
        ``prefix``) after revision ``floor`` (calling ``seen()`` then), or (after a pause) when
        the watch fails: either way the caller looks again."""
        try:
            async with aclosing(self._client.watch(key, floor + 1, prefix=prefix)) as events:
                async for event in events:
                    if event.type == kind:
                        if seen is not None:
                            seen()
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
                    if event.type == "DELETE":
                        self._absent_since = event.kv.mod_revision  # the deletion's revision
                    if event.type == "DELETE" or event.kv.create_revision != kv.create_revision:
                        self._set("candidate", self.state.term)
                        return

    def _leader_seen(self) -> None:
        """A leader key existed after the absence we noted: the next one starts afresh."""
        self._absent_since = None

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
        """Renews every TTL/3. A keepalive that fails is tried again (the client moves to the
        next endpoint) until lease_valid() lapses; one that finds the lease gone, or none answered
        by then, ends the leadership."""
        failures = 0
        while True:
            await trio.sleep_until(self._renewed_at + self._ttl / 3)
            deadline = self._renewed_at + self._ttl * 2 / 3
            sent = trio.current_time()
            if safeguards.off("no-fence"):
                deadline = math.inf
            try:
                with trio.fail_at(deadline):
                    ttl = await self._client.keepalive(lease)
            except trio.TooSlowError:
                self._step_down("no keepalive was answered before the lease's fence")
                return
            except EtcdError as exc:
                failures += 1
                log.warning("%s: election: keepalive failed (%s); trying again", self.name, exc)
                with trio.move_on_at(deadline):
                    await trio.sleep(_backoff(failures))
                    continue
                self._step_down(f"no keepalive succeeded before the lease's fence (last: {exc})")
                return
            failures = 0
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

    def _member_key(self, name: str) -> bytes:
        return f"{self._prefix}/members/{name}".encode()

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
            return await self._client.put(self._member_key(self.name), json.dumps(value).encode(),
                                          self._member_lease)

    async def _read_members(self) -> tuple[dict[str, _Member], int]:
        """The alive peers' published positions, and the revision they were read at."""
        kvs, revision = await self._client.read_prefix(self._member_key(""))
        alive = {}
        peers = set(self._peers)
        for kv in kvs:
            value = _json(kv)
            name = value.get("name")
            if name in peers and kv.key == self._member_key(str(name)):
                alive[str(name)] = _Member(str(name), value, kv.mod_revision)
        self._members = {name: m.value for name, m in alive.items()}
        return alive, revision

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
