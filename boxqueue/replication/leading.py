"""What an incarnation serving as the leader adds to the single-node server.

Before any write: the committer's records feed the relays' history (``committer.feed``) and the
log keeps what followers still need (``committer.keep_from``); the iproto dispatcher hands
JOIN and SUBSCRIBE connections to the relays. The first record of the term notes when the term
began (the terms history, replicated like any data, which a follower's SUBSCRIBE is checked
against). Once the start-up writes are done (no client has been answered yet), and before any
listener or facade opens, every write waits for the quorum (:mod:`boxqueue.replication.quorum`;
with ``synchro_quorum = 1`` it is confirmed at once, but only while the lease is sound). When the
incarnation ends (the server stops, or this node no longer leads), client writes are refused at
once and the writers still waiting for a quorum hear that their outcome is unknown. A leader
whose quorum stalls resigns (``Election.resign``), so that a member that can reach a quorum leads.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import msgpack
import trio

from boxqueue.replication.history import History
from boxqueue.replication.node import ReplicaNode
from boxqueue.replication.quorum import Quorum
from boxqueue.replication.relay import TERMS_DB, TERMS_KEY, Relays, read_terms
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import WAL_DIR, Storage

log = logging.getLogger(__name__)


def replicaset_uuid(prefix: str) -> str:
    """The replica set's uuid: derived from its etcd prefix, so every member agrees on it."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "etcd:" + prefix))


class Leading:
    def __init__(self, node: ReplicaNode, storage: Storage, committer: GroupCommitter, dispatcher: Any) -> None:
        self.node = node
        self.storage = storage
        self.committer = committer
        self.dispatcher = dispatcher
        rep = node.config
        storage.term = node.state.term
        self.history = History(storage.path / WAL_DIR, storage.lsn)
        committer.feed = self.history.add
        self.relays = node.relays = Relays(
            storage, committer, self.history, node.replica_id, replicaset_uuid(rep.etcd.prefix), lambda: node.state.term,
            rep.heartbeat_s, lambda: node.quorum,
        )
        committer.keep_from = self.relays.keep_from
        dispatcher.replication = self.relays.serve

    async def begin_term(self) -> None:
        """The term's first record: when it began."""
        storage = self.storage
        await self.committer.open_db(TERMS_DB)
        term, first = storage.term, storage.lsn + 1
        terms = [pair for pair in read_terms(storage) if pair[0] < term] + [(term, first)]

        def write(txn: Any) -> None:
            txn.put(TERMS_KEY, msgpack.packb(terms), db=storage.db(TERMS_DB, txn=txn))

        await self.committer.write(write)

    async def start_quorum(self, nursery: trio.Nursery) -> None:
        """From now on every write waits for the quorum: before any client can write."""
        rep = self.node.config
        quorum = self.node.quorum = Quorum(
            self.committer, rep.synchro_quorum, rep.synchro_timeout_s, self.node.election.lease_valid,
            on_stall=self._resign, lost_after_s=4 * rep.heartbeat_s,
        )
        self.committer.quorum = quorum
        await nursery.start(quorum.run)
        log.info("every write now waits for a quorum of %d (term %d)", rep.synchro_quorum, self.node.state.term)
        nursery.start_soon(self._step_aside_when_the_disk_is_full, rep.synchro_timeout_s)

    async def _step_aside_when_the_disk_is_full(self, patience_s: float) -> None:
        """A leader whose writes have failed for lack of disk space for ``patience_s`` resigns: a
        member with room can take the writes (it serves reads meanwhile, as a follower)."""
        committer = self.committer
        while True:
            await trio.sleep(min(0.5, patience_s / 4))
            since = committer.no_space_since
            if since is not None and time.monotonic() - since >= patience_s:
                why = f"no disk space for writes for {time.monotonic() - since:.1f} s"
                if self.node.quorum is not None:
                    self.node.quorum.abandon(why)
                await self.node.election.resign(why)
                return

    async def _resign(self, why: str) -> None:
        """The quorum stalled: step aside for a member that can reach one."""
        await self.node.election.resign(why)

    def end(self) -> None:
        """No more client writes; the writers still waiting for a quorum hear their outcome is
        unknown."""
        self.dispatcher.writes.set_read_only("no longer the leader")
        if self.node.quorum is not None:
            self.node.quorum.abandon("this node no longer leads")
