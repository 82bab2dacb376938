"""This instance's membership of a replica set: its election, its role, and what it reports.

The process (``boxqueue.process``) serves in *incarnations*: as the leader (every listener,
the engine, relays to the followers, a quorum when acknowledgement is synchronous) or as a
follower (read-only, following the leader's log). etcd decides which (:mod:`boxqueue.replication.election`);
when the decision changes in a way the running incarnation cannot follow (a follower elected, a
leader deposed or unable to renew its lease), :meth:`ReplicaNode.wait_for_change` returns and the
process starts the other incarnation. Sessions do not survive a change of role, as they do not
survive a failover.

``box.info`` reads :meth:`ReplicaNode.info`: Tarantool's fields (``id``, ``uuid``, ``ro``, ``lsn``,
``vclock``, ``replication`` with each peer's ``upstream`` and ``downstream``, ``election``).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import trio

from boxqueue.replication.applier import Applier
from boxqueue.replication.election import Election, ElectionState
from boxqueue.replication.etcd import EtcdClient
from boxqueue.replication.quorum import Quorum
from boxqueue.replication.relay import Relays
from boxqueue.storage.environment import Storage

log = logging.getLogger(__name__)

ELECTION_STATES = {"follower": 0, "candidate": 1, "leader": 2}  # tarantool/metrics' tnt_election_state


class ReplicaNode:
    """``config`` is the process's ``[replication]`` section (``boxqueue.config.ReplicationConfig``)."""

    def __init__(self, config: Any, etcd: EtcdClient, storage: Storage) -> None:
        self.config = config
        self.etcd = etcd
        self.name = config.name
        self.facade_urls: dict[str, dict[str, str]] = {}  # member -> its facades' URLs (from etcd)
        self.replica_id = config.replica_id(config.name)
        self.storage = storage
        self._changed = trio.Event()
        self.election = Election(
            etcd, config.etcd.prefix, config.name, str(config.peer.uri), [p.name for p in config.peers],
            config.etcd.lease_ttl_s, self.position, self._on_change,
        )
        # The running incarnation's parts, for box.info and the metrics (None when not running).
        self.relays: Relays | None = None
        self.applier: Applier | None = None
        self.quorum: Quorum | None = None
        self.role_since = time.monotonic()

    def position(self) -> tuple[int, int]:
        """This node's log: (last LSN, term of the last record). A follower's log may hold
        records LMDB does not have yet: it acknowledged them, so they count."""
        return self.storage.logged_lsn, self.storage.logged_term

    def _on_change(self, state: ElectionState) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @property
    def state(self) -> ElectionState:
        return self.election.state

    def leading(self) -> bool:
        """This node is the leader, its lease sound."""
        state = self.election.state
        return state.role == "leader" and state.leader == self.name and self.election.lease_valid()

    def leader_uri(self) -> str | None:
        state = self.election.state
        return None if state.leader is None or (state.leader == self.name and not self.leading()) else state.leader_uri

    async def wait_for_change(self) -> None:
        await self._changed.wait()

    # -- where the leader's facades are (a follower's facades name them) -------------------------

    def _facades_key(self, name: str) -> bytes:
        return f"{self.config.etcd.prefix}/facades/{name}".encode()

    async def publish_facades(self, urls: dict[str, str]) -> None:
        """This member's facade URLs (``{"zaqar": "http://...", ...}``), for the others to name."""
        self.facade_urls[self.name] = urls
        await self.etcd.put(self._facades_key(self.name), json.dumps(urls).encode())

    async def follow_leader_facades(self) -> None:
        """Keep the leader's facade URLs at hand (until cancelled)."""
        while True:
            leader = self.election.state.leader
            if leader is not None and leader not in self.facade_urls:
                try:
                    kv = await self.etcd.get(self._facades_key(leader))
                    if kv is None:  # elected before it published them: look again soon
                        await trio.sleep(0.2)
                        continue
                    self.facade_urls[leader] = json.loads(kv.value)
                except Exception as exc:  # etcd away, a value not ours: the header waits
                    log.info("the leader's facades are not known yet: %s", exc)
                    await trio.sleep(1)
                    continue
            await self.wait_for_change()

    def leader_facade_url(self, api: str) -> str | None:
        leader = self.election.state.leader
        return None if leader is None else self.facade_urls.get(leader, {}).get(api)

    async def wait_until_not_leading(self, check_every: float = 0.05) -> None:
        """Until this node stops leading (deposed, resigned, or its lease in doubt)."""
        while self.leading():
            with trio.move_on_after(check_every):
                await self.wait_for_change()

    async def wait_until_leading(self) -> None:
        while not self.leading():
            await self.wait_for_change()

    # -- what clients see ------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """The replica set's part of ``box.info``."""
        state = self.election.state
        leading = self.leading()
        lsn = self.storage.lsn
        replication: dict[int, dict[str, Any]] = {}
        now = time.monotonic()
        for peer in self.config.peers:
            rid = self.config.replica_id(peer.name)
            entry: dict[str, Any] = {"id": rid, "name": peer.name, "lsn": lsn if peer.name == self.name else 0}
            if peer.name == self.name:
                entry["uuid"] = None
            elif leading and self.relays is not None and peer.name in self.relays.downstream:
                down = self.relays.downstream[peer.name]
                entry["uuid"] = down.uuid
                entry["lsn"] = down.acked
                entry["downstream"] = {"status": down.status, "vclock": {self.replica_id: down.acked},
                                       "idle": now - down.acked_at,
                                       "lag": 0.0 if down.acked >= lsn else now - down.acked_at,
                                       "lag_records": max(lsn - down.acked, 0)}
                if down.message:
                    entry["downstream"]["message"] = down.message
            elif not leading and self.applier is not None and peer.name == state.leader:
                up = self.applier.upstream
                entry["lsn"] = up.leader_lsn
                entry["upstream"] = {"status": up.status, "idle": now - up.received_at, "peer": up.peer,
                                     "lag": up.lag, "lag_records": max(up.leader_lsn - lsn, 0)}
                if up.message:
                    entry["upstream"]["message"] = up.message
            replication[rid] = entry
        return {
            "id": self.replica_id,
            "name": self.name,
            "ro": not leading,
            "ro_reason": None if leading else "election",
            "lsn": lsn,
            "vclock": {self.replica_id: lsn},
            "replication": replication,
            "election": {
                "state": "leader" if leading else ("follower" if state.leader else "candidate"),
                "term": state.term,
                "vote": 0,
                "leader": self.config.replica_id(state.leader) if state.leader in {p.name for p in self.config.peers} else 0,
                "leader_name": state.leader,
                "leader_idle": 0.0 if leading else (now - self.applier.upstream.received_at if self.applier else 0.0),
            },
            "synchro": {"quorum": self.config.synchro_quorum,
                        "queue": {"len": self.quorum.committer.awaiting if self.quorum is not None else 0,
                                  "owner": self.replica_id if leading else 0, "term": state.term}},
        }


def register_procedures(procedures: Any, node: ReplicaNode) -> None:
    """``boxqueue.leader_uris``: the leader's iproto URI first, in a list (while this member knows
    of no leader: the other members', so that a client leaves it and asks them), the shape the ``tarantool`` connector's
    ``MeshConnection(cluster_discovery_function=...)`` reads, so that a client follows the leader
    through failovers.

    **Choice:** the other members' URIs follow the leader's (a follower leaves its own out).
    MeshConnection replaces its whole address list with the answer and moves only when its
    current address is not in it: with the leader's URI alone, a client would know no other
    member once that leader died; with every member listed, a client left on a follower would
    never move. So a follower's answer sends the client to the leader, and the leader's keeps
    every member for the client to turn to when it fails."""

    def leader_uris(_ctx: Any) -> list[Any]:
        uri = node.leader_uri()
        if uri is None:  # no leader known here (a deposed leader cut from etcd, say): try the others
            return [[str(p.uri) for p in node.config.peers if p.name != node.name]]
        leader = node.state.leader
        others = [str(p.uri) for p in node.config.peers
                  if p.name != leader and (p.name != node.name or node.leading())]
        return [[uri, *others]]

    procedures.register("boxqueue.leader_uris", leader_uris)
