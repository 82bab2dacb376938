"""How the group committer forms its groups around a flush of the write-ahead log (fsync mode).

While a group is flushed, the commit loop applies the next batch only if many writes wait
(``EARLY_NEXT_GROUP``): otherwise the writes that arrive during the flush wait for it and make
one bigger group. To see that, the real log's append and flush are held at a gate (a slow disk is
a fault a test cannot cause), and each write notes when it runs.
"""

import threading

import trio

from boxqueue.storage.commit import EARLY_NEXT_GROUP, GroupCommitter
from boxqueue.storage.environment import Storage


class Gate:
    """Wraps a method of the log: calls wait until :meth:`open`; ``entered`` once one waits."""

    def __init__(self, method) -> None:
        self.method = method
        self.entered = threading.Event()
        self._open = threading.Event()

    def __call__(self, *args):
        self.entered.set()
        if not self._open.wait(30):
            raise TimeoutError("the test never opened the gate")
        return self.method(*args)

    def open(self) -> None:
        self._open.set()


async def wait_for(event: threading.Event) -> None:
    with trio.fail_after(10):
        while not event.is_set():
            await trio.sleep(0.005)


def noting(storage: Storage, ran: list[int], n: int):
    def write(txn):
        ran.append(n)
        txn.put(b"k%d" % n, b"v", db=storage.db(b"t", txn=txn))
        return n

    return write


async def first_group_held(committer: GroupCommitter, storage: Storage, nursery, waiting: int, ran: list[int]):
    """A first group held at its append while ``waiting`` writes are submitted behind it; then
    the append goes on and the flush is held. Returns the flush's gate."""
    append, sync = Gate(storage.log.append), Gate(storage.log.sync)
    storage.log.append, storage.log.sync = append, sync
    nursery.start_soon(committer.write, noting(storage, ran, 0))
    await wait_for(append.entered)
    for n in range(1, waiting + 1):
        nursery.start_soon(committer.write, noting(storage, ran, n))
    await trio.sleep(0.05)  # every writer submitted (they start at once; the margin is generous)
    assert ran == [0]
    append.open()
    await wait_for(sync.entered)
    return sync


async def test_few_waiting_writes_wait_for_the_flush_and_make_one_group(tmp_path):
    storage = Storage(tmp_path, "fsync", checkpoint_interval_s=3600)
    committer = GroupCommitter(storage)
    ran: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        groups_before = committer.batches
        async with trio.open_nursery() as writers:
            sync = await first_group_held(committer, storage, writers, 3, ran)
            await trio.sleep(0.2)  # the loop was not told early: nothing more is applied
            assert ran == [0]
            sync.open()
        assert sorted(ran) == [0, 1, 2, 3]
        assert committer.batches - groups_before == 2  # the three waiting writes in one group
        nursery.cancel_scope.cancel()
    storage.close()


async def test_many_waiting_writes_are_applied_while_the_group_before_them_is_flushed(tmp_path):
    storage = Storage(tmp_path, "fsync", checkpoint_interval_s=3600)
    committer = GroupCommitter(storage)
    ran: list[int] = []
    waiting = EARLY_NEXT_GROUP + 8
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        groups_before = committer.batches
        async with trio.open_nursery() as writers:
            sync = await first_group_held(committer, storage, writers, waiting, ran)
            with trio.fail_after(10):  # told early: the next group is applied during the flush
                while len(ran) < waiting + 1:
                    await trio.sleep(0.005)
            assert committer.batches == groups_before  # and nothing is answered before the flush
            sync.open()
        assert sorted(ran) == list(range(waiting + 1))
        nursery.cancel_scope.cancel()
    storage.close()
