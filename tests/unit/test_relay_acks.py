"""What a leader counts as held by a follower: only the follower's acknowledgements.

A SUBSCRIBE names the follower's last record, which may not be flushed there yet (it reconnects
with records in LMDB whose log is still being flushed): counting it towards a quorum could
confirm a write that a crash of that follower loses. The relay runs for real over an in-memory
stream, with a real leader's storage behind it.
"""

from __future__ import annotations

from types import SimpleNamespace

import trio
import trio.testing

from boxqueue.replication import rows
from boxqueue.replication.history import History
from boxqueue.replication.quorum import Quorum
from boxqueue.replication.relay import Relays
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import WAL_DIR, Storage


async def test_a_subscribe_position_counts_for_nothing_until_acknowledged(tmp_path):
    storage = Storage(tmp_path / "leader", "fsync")
    try:
        async with trio.open_nursery() as nursery:
            committer = GroupCommitter(storage)
            await nursery.start(committer.run)
            history = History(storage.path / WAL_DIR, storage.lsn)
            committer.feed = history.add
            for i in range(3):
                await committer.write(lambda txn, i=i: txn.put(b"k%d" % i, b"v", db=storage.db(b"t", txn=txn)))
            lsn = storage.lsn
            assert lsn >= 3
            quorum = Quorum(committer, 2, 30.0)
            relays = Relays(storage, committer, history, 1, "set-uuid", lambda: 0, 0.2, lambda: quorum)
            leader_side, follower_side = trio.testing.memory_stream_pair()
            request = SimpleNamespace(type=rows.SUBSCRIBE, sync=2, body={
                rows.INSTANCE_NAME: "f1", rows.INSTANCE_UUID: "f1-uuid", rows.LSN: lsn, rows.TERM: 0})
            io = SimpleNamespace(receive=leader_side.receive_some, send_all=leader_side.send_all)  # the connection's IO
            nursery.start_soon(relays.serve, SimpleNamespace(peer="test"), request, io, b"")

            decoder = rows.RowDecoder()
            with trio.fail_after(5):
                while (answer := decoder.next_row()) is None:
                    decoder.feed(await follower_side.receive_some(65536))
            assert not answer.is_error and answer.lsn == lsn
            await trio.sleep(0.5)  # heartbeats flow; the follower says nothing yet
            assert "f1" not in quorum.acked and relays.downstream["f1"].acked == 0

            await follower_side.send_all(rows.ack({1: lsn - 1}, lsn - 1, 0))
            with trio.fail_after(5):
                while quorum.acked.get("f1") != lsn - 1:
                    await trio.sleep(0.01)
            assert relays.downstream["f1"].acked == lsn - 1
            nursery.cancel_scope.cancel()
    finally:
        storage.close()
