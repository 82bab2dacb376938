"""The broadcast tube kind: named queues of versioned keys, fanned out to every listener (S1).

Nothing is consumed. A send gets a per-(queue, id) sequence inside its own committer write (so
the counter and the version are durable together and sends are numbered in the order they were
made), and it is fanned out from that write's after-commit hook. The committer runs writes and
their hooks in submission order, so listeners of a key see its versions in sequence order (S5).

A subscription reads its preload from the committed snapshot and registers for live messages
in one synchronous step: a version is either committed already (then it is in the snapshot and
its fan-out is over) or not (then its fan-out will reach the new listener). No gap, no duplicate.

Each listener has a bounded buffer; one that falls further behind is ended with ``overflow``
instead of slowing the sender or anyone else. Queue close and key delete end the matching
listeners once they are durable; :meth:`Broadcast.shutdown` ends all of them.

A listener either pulls (``await sub.next()``: one task wake-up per message) or gives a
:class:`Sink` that the fan-out hands every message to synchronously, so a WebSocket can write
its frame straight to the socket during the fan-out, with no task per message. Either way the
fan-out hands every listener the same :class:`Message` object, so whatever a transport derives
from it (``Message.encoded``) is made once per message.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import lmdb
import trio

from boxqueue.spaces.catalog import Catalog
from boxqueue.tubes.sequences import Message, SequenceStore, message, open_spaces

log = logging.getLogger(__name__)

# Why a listener ended.
CLOSED = "closed"  # its queue was closed
DELETED = "deleted"  # its key's history was deleted (by-id listeners)
OVERFLOW = "overflow"  # it fell more than its buffer behind
SHUTDOWN = "shutdown"  # the server is stopping
FAILED = "failed"  # its sink failed (a bug): it is ended rather than the fan-out to the others

Start = int | str | None  # a sequence, "first", "last", or None for live messages only


class Sink(Protocol):
    """Where a pushing listener's live messages go (a WebSocket's outgoing buffer, say)."""

    def deliver(self, item: Message) -> int:
        """Take one live message without blocking; return how many live messages the sink still
        holds unsent, this one included (more than the listener's capacity ends it with
        ``overflow``)."""
        ...

    def ended(self, reason: str) -> None:
        """The subscription has ended (once; nothing is delivered after this)."""
        ...


class Subscription:
    """One listener: a bounded buffer of live messages (or a :class:`Sink`) and, once ended,
    the reason."""

    def __init__(self, owner: Broadcast, queue: str, key: str | None, capacity: int, sink: Sink | None = None) -> None:
        self.queue = queue
        self.key = key
        self.capacity = capacity
        self.ended: str | None = None
        self._owner = owner
        self._sink = sink
        self._items: deque[Message] = deque()
        self._lot = trio.lowlevel.ParkingLot()

    def push(self, item: Message) -> None:
        if self.ended is not None:
            return
        if self._sink is not None:
            try:
                held = self._sink.deliver(item)
            except Exception:
                log.exception("a listener's sink failed; ending that listener")
                self.end(FAILED)
                return
            if held > self.capacity:
                self.end(OVERFLOW)
            return
        if len(self._items) >= self.capacity:
            self.end(OVERFLOW)
            return
        self._items.append(item)
        self._lot.unpark_all()

    def end(self, reason: str) -> None:
        """Stop delivering; a reader gets what is buffered (nothing after an overflow), then None;
        a sink is told why."""
        if self.ended is None:
            self.ended = reason
            ended = self._owner.ended
            ended[reason] = ended.get(reason, 0) + 1
            if reason == OVERFLOW:
                self._items.clear()
            self._owner._forget(self)
            self._lot.unpark_all()
            if self._sink is not None:
                self._sink.ended(reason)

    async def next(self) -> Message | None:
        """The next live message, or None once the subscription has ended."""
        while not self._items:
            if self.ended is not None:
                return None
            await self._lot.park()
        return self._items.popleft()

    def close(self) -> None:
        """The reader is gone: unregister without a reason anyone will read."""
        self._owner._forget(self)
        self.ended = self.ended or CLOSED

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


class Broadcast:
    """Every broadcast queue of the server; ``open`` it once the committer runs."""

    def __init__(self, catalog: Catalog, *, max_key_updates: int | None = None, listener_buffer: int = 1024) -> None:
        self.catalog = catalog
        self.committer = catalog.committer
        self.max_key_updates = max_key_updates
        self.listener_buffer = listener_buffer
        self.store: SequenceStore | None = None
        self.queues: set[str] = set()
        self._by_queue: dict[str, dict[Subscription, None]] = {}
        self._by_key: dict[tuple[str, str], dict[Subscription, None]] = {}
        self._stopping = False
        # Versions written but not yet fanned out: (queue, id, sequence) -> how many.
        self._in_flight: dict[tuple[str, str, int], int] = {}
        self._creating: dict[str, trio.Event] = {}  # queues whose create is not durable yet
        # For the metrics: versions fanned out, copies handed to listeners, listeners subscribed
        # since start, and listeners ended by reason (OVERFLOW: closed for lagging).
        self.fanned_out = 0
        self.deliveries = 0
        self.subscribed = 0
        self.ended: dict[str, int] = {}

    async def open(self) -> None:
        """Create the spaces if needed and load the queue names (the only in-memory state)."""
        self.store = SequenceStore(*await open_spaces(self.catalog))
        self.queues = set(self.store.queue_names())

    # -- queues ------------------------------------------------------------------------------

    async def create(self, queue: str) -> None:
        """Create a queue; an existing one and its history are left alone."""
        creating = self._creating.get(queue)
        if creating is not None:  # answer a second create only once the first is durable
            await creating.wait()
            if queue in self.queues:
                return
        if queue in self.queues:
            return
        self.queues.add(queue)
        store = self._store()
        done = self._creating[queue] = trio.Event()
        try:
            await self.committer.write(lambda txn: store.add_queue(txn, queue))
        except BaseException:
            self.queues.discard(queue)
            raise
        finally:
            del self._creating[queue]
            done.set()

    async def close(self, queue: str) -> bool:
        """Drop a queue and its history (counters stay); False if there was no such queue."""
        if queue not in self.queues:
            return False
        self.queues.discard(queue)
        store = self._store()
        await self.committer.write(
            lambda txn: store.drop_queue(txn, queue),
            after_commit=lambda _r: self._end_matching(queue, None, CLOSED),
        )
        return True

    async def delete(self, queue: str, key: str) -> bool:
        """Purge one key's history (its counter stays); False if there is no such queue (S9)."""
        if queue not in self.queues:
            return False
        store = self._store()
        await self.committer.write(
            lambda txn: store.delete_key(txn, queue, key),
            after_commit=lambda _r: self._end_matching(queue, key, DELETED),
        )
        return True

    # -- sends -------------------------------------------------------------------------------

    async def send(self, queue: str, key: str, payload_json: str, sequence: int | None = None) -> int | None:
        """Store and fan out one version; its sequence once durable, None if no such queue.

        ``payload_json`` is the payload already serialised as JSON; ``sequence`` a custom
        number (stored as given, the counter untouched) or None for the next automatic one."""
        if queue not in self.queues:
            return None
        write, after, failed = self._send_write(queue, key, payload_json, sequence, False)
        try:
            sent: Message = await self.committer.write(write, after_commit=after)
        except BaseException:
            failed()
            raise
        return sent.sequence

    def publish_nowait(self, queue: str, key: str, payload_json: str) -> None:
        """Queue a send without waiting (for synchronous callers such as engine hooks); the queue
        is created if missing. Failures are logged: the caller has nobody to tell."""
        create = queue not in self.queues
        self.queues.add(queue)
        write, after, failed = self._send_write(queue, key, payload_json, None, create)

        def done(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                failed()
                log.error("publishing to broadcast queue '%s' failed: %s", queue, error)

        self.committer.submit(write, done, after_commit=after)

    def _send_write(
        self, queue: str, key: str, payload_json: str, sequence: int | None, create: bool
    ) -> tuple[Callable[[lmdb.Transaction], Message], Callable[[Message], None], Callable[[], None]]:
        """The write, its after-commit fan-out, and the clean-up if it fails.

        From the moment the write has run until its fan-out, the version is *in flight*: a
        snapshot taken then may already see it (a read transaction begun while the commit is
        being flushed sees the new pages), and the fan-out will deliver it too, so snapshots
        leave in-flight versions out (see :meth:`subscribe`)."""
        store = self._store()
        keep = self.max_key_updates
        marked: list[tuple[str, str, int]] = []

        def write(txn: lmdb.Transaction) -> Message:
            if create:
                store.add_queue(txn, queue)
            seq = store.next_sequence(txn, queue, key) if sequence is None else sequence
            store.store(txn, queue, key, seq, payload_json, keep)
            if not marked:  # a batch retried write by write runs this again
                marked.append((queue, key, seq))
                self._in_flight[marked[0]] = self._in_flight.get(marked[0], 0) + 1
            return message(key, seq, payload_json)

        def unmark() -> None:
            if marked:
                version = marked.pop()
                left = self._in_flight.get(version, 0) - 1
                if left > 0:
                    self._in_flight[version] = left
                else:
                    self._in_flight.pop(version, None)

        def after(sent: Message) -> None:
            unmark()
            self._fan_out(queue, sent)

        return write, after, unmark

    def _fan_out(self, queue: str, sent: Message) -> None:
        self.fanned_out += 1
        for sub in list(self._by_queue.get(queue, ())):
            sub.push(sent)
            self.deliveries += 1
        for sub in list(self._by_key.get((queue, sent.id), ())):
            sub.push(sent)
            self.deliveries += 1

    # -- listeners ---------------------------------------------------------------------------

    def subscribe(
        self, queue: str, key: str | None, start: Start, sink: Sink | None = None
    ) -> tuple[list[Message], Subscription] | None:
        """The preload for ``start`` and a live subscription, atomically; None if no such queue.
        With a ``sink``, live messages are handed to it during the fan-out instead of buffered.

        Synchronous on purpose: no other task runs between the snapshot and the registration, so
        a caller that sends the preload before its next ``await`` sends it before any live one."""
        if queue not in self.queues:
            return None
        preload = [] if start is None else self._store().history(queue, key, start)
        if self._in_flight and preload:
            in_flight = self._in_flight
            preload = [m for m in preload if (queue, m.id, m.sequence) not in in_flight]
        sub = Subscription(self, queue, key, self.listener_buffer, sink)
        self.subscribed += 1
        if self._stopping:
            sub.end(SHUTDOWN)
            return preload, sub
        channel = self._by_queue.setdefault(queue, {}) if key is None else self._by_key.setdefault((queue, key), {})
        channel[sub] = None
        return preload, sub

    def listener_count(self) -> int:
        return sum(len(c) for c in self._by_queue.values()) + sum(len(c) for c in self._by_key.values())

    def shutdown(self) -> None:
        """End every listener (long-polls answer, sockets close) and refuse new ones."""
        self._stopping = True
        for channel in [*self._by_queue.values(), *self._by_key.values()]:
            for sub in list(channel):
                sub.end(SHUTDOWN)

    def _end_matching(self, queue: str, key: str | None, reason: str) -> None:
        channels = [c for (q, k), c in self._by_key.items() if q == queue and (key is None or k == key)]
        if key is None:
            channels.append(self._by_queue.get(queue, {}))
        for channel in channels:
            for sub in list(channel):
                sub.end(reason)

    def _forget(self, sub: Subscription) -> None:
        if sub.key is None:
            channel = self._by_queue.get(sub.queue)
            if channel is not None:
                channel.pop(sub, None)
                if not channel:
                    del self._by_queue[sub.queue]
        else:
            k = (sub.queue, sub.key)
            channel = self._by_key.get(k)
            if channel is not None:
                channel.pop(sub, None)
                if not channel:
                    del self._by_key[k]

    def _store(self) -> SequenceStore:
        if self.store is None:
            raise RuntimeError("Broadcast.open() has not run")
        return self.store
