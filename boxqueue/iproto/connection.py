"""One client connection: read requests, answer them by sync as they finish.

The receive loop decodes requests and answers the quick ones inline, writing the answers to a
whole chunk of pipelined requests in one send. Writes wait for their commit and answer from its
callback; calls that may block run as tasks in the connection's nursery. At most ``max_inflight``
requests wait at a time: when all slots are busy the loop stops reading, which pushes back on the
client instead of growing memory. Answers to writes leave at the end of their group, sent by the
committing task (group_sends.py) on a plain socket; a sender task writes the other answers that
arrive later (calls, TLS connections, what a full socket did not take).

When the client goes away, its pending requests are cancelled (writes already queued still commit)
and the session's disconnect callbacks run. On server shutdown the connection stops reading, lets
the requests in flight finish within the grace period, flushes and closes.

With a latency histogram, requests are timed per chunk, and one chunk in ``SAMPLE_EVERY`` (and
the first of each connection) is timed: a clock read, even per chunk, would cost a visible share
of a compiled request, so the other chunks cost one decrement of a local counter. The requests of
a timed chunk answered inline all wait for the same send, so each is observed once with the
chunk's time; its writes are observed together once every write submitted up to then is
answered, at the send that carries the answers (answers to writes come in commit order, which is
the order they were submitted); its requests run as tasks are observed when they end.

Compiled with Cython (``boxqueue/compiled.py``), with ``socket_io`` and ``group_sends``: with
clients that wait for each answer, every request is a chunk of its own, and the loop's own lines
were interpreted once per request (``bench/served_cost.py --inflight 1``: a ping 39,807 -> 38,588
instructions, a replace 85,030 -> 82,327). The tasks it starts (the sender loop, a call's
``_run``) have a Python coroutine at their root (``boxqueue/task_roots.py`` says why): one
interpreted frame a step for those, none for the receive loop, which ``serve`` awaits.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any

import trio

from boxqueue.iproto import codec
from boxqueue.iproto.dispatch import Dispatcher
from boxqueue.iproto.group_sends import GroupSends
from boxqueue.iproto.outbox import Outbox
from boxqueue.iproto.session import Session
from boxqueue.iproto.socket_io import DirectSocket, StreamIO
from boxqueue.measures import Histogram
from boxqueue.task_roots import python_root

log = logging.getLogger(__name__)

RECEIVE_SIZE = 64 * 1024  # under malloc's mmap threshold: a bigger buffer costs an mmap per read
# A connection whose socket was empty when read after its last chunk (a client sending one request
# at a time) waits for data before its next this many reads instead of trying a read that fails;
# one that found data there (pipelined requests) keeps reading first, which costs neither a
# failed system call nor trio's wait (an epoll registration and a task switch, about 1,400
# instructions a ping under pipelined load, `bench/served_cost.py`).
WAITS_AFTER_A_MISS = 32
SAMPLE_EVERY = 16  # chunks of requests: one in this many is timed (with a latency histogram)


class Connection:
    def __init__(
        self,
        stream: trio.abc.Stream,
        dispatcher: Dispatcher,
        session: Session,
        greeting: bytes,
        max_packet: int,
        max_inflight: int,
        io: StreamIO | None = None,
        latency: Histogram | None = None,
        group_sends: GroupSends | None = None,
    ) -> None:
        self.stream = stream
        self.dispatcher = dispatcher
        self.session = session
        self.greeting = greeting
        self.io = io if io is not None else DirectSocket(stream)  # StreamIO: a TLS stream
        self.decoder = codec.RequestDecoder(max_packet)
        self.outbox = Outbox(max_inflight)
        if group_sends is not None and isinstance(self.io, DirectSocket):
            # Answers to writes go out at the end of their group, from the committing task.
            self.outbox.sends = group_sends
            self.outbox.send_now = self._send_now
        self._reading = trio.CancelScope()
        self._sending = False
        self._drained = trio.Event()
        self.latency = latency
        # Timed chunks whose writes are not all answered: (writes answered by then, start, writes).
        self._writes_of_chunks: deque[tuple[int, float, int]] = deque()
        self._tasks_started = 0
        self._tasks_done = 0
        self._tasks_answered = 0  # the outbox counts every answer; these were tasks'

    def stop_reading(self) -> None:
        """Server shutdown: accept no more requests on this connection."""
        self._reading.cancel()

    async def serve(self, grace: float = 5.0) -> None:
        try:
            await self.stream.send_all(self.greeting)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        client_left = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(python_root, self._send_loop, nursery.cancel_scope)
                with self._reading:
                    client_left = await self._receive_loop(nursery)
                if client_left:
                    nursery.cancel_scope.cancel()
                else:
                    # Shutting down or closing after a framing error: finish what is in flight.
                    with trio.move_on_after(grace):
                        while self.outbox.inflight:
                            await self._slot_freed()
                        await self._flush()
                    nursery.cancel_scope.cancel()
        finally:
            # No more sends from a group's end; the outbox no longer holds this connection.
            self.outbox.sends = self.outbox.send_now = None
            with trio.CancelScope(shield=True):
                await self.session.close()
                self.io.detach()
                await self.stream.aclose()

    # -- receiving -----------------------------------------------------------------------------

    async def _receive_loop(self, nursery: trio.Nursery) -> bool:
        """Returns True when the client closed the connection."""
        receive = self.io.receive
        receive_when_ready = self.io.receive_when_ready
        checkpoint = trio.lowlevel.checkpoint
        decoder = self.decoder
        handle_all = self.dispatcher.handle_all
        session = self.session
        outbox = self.outbox
        countdown = 1 if self.latency is not None else -1  # -1: never reaches 0
        sample: tuple[float, int, int, int] | None = None
        drained = False  # the last read emptied the socket
        waits_ahead = 0  # drained reads that wait for data before reading (see WAITS_AFTER_A_MISS)
        io = self.io
        while True:
            try:
                if drained and waits_ahead > 0:  # wait for the next request (a checkpoint)
                    waits_ahead -= 1
                    data = await receive_when_ready(RECEIVE_SIZE)
                else:
                    await checkpoint()  # the direct socket never yields when data is there: be fair here
                    data = await receive(RECEIVE_SIZE)
                    if drained and io.missed:
                        waits_ahead = WAITS_AFTER_A_MISS
            except OSError:
                return True
            if not data:
                return True
            drained = len(data) < RECEIVE_SIZE
            countdown -= 1
            if countdown == 0:
                countdown = SAMPLE_EVERY
                sample = self._sample_begins()
            decoder.feed(data)
            while True:
                pending, tasks, framing_error = handle_all(
                    session, decoder, outbox, outbox.max_inflight - outbox.inflight
                )
                outbox.inflight += pending
                if tasks is not None:
                    self._tasks_started += len(tasks)
                    started = None if sample is None else sample[0]
                    for task in tasks:
                        nursery.start_soon(python_root, self._run, task, started)
                if framing_error is not None:
                    outbox.out += self.dispatcher.error(0, framing_error.error)
                    outbox.wake_sender()
                    return False
                if outbox.inflight < outbox.max_inflight:
                    break  # the decoder holds no more complete requests
                while outbox.inflight >= outbox.max_inflight:
                    outbox.wake_sender()  # let the sender answer what is ready meanwhile
                    await self._slot_freed()
            if sample is not None:
                self._sample_ends(sample)
                sample = None
            if session.takeover is not None:
                return await self._replicate(nursery)
            if outbox.out and not self._sending:
                # Answer this chunk's quick requests now, without waking the sender task; a full
                # socket buffer blocks here, which stops reading: the client is pushed back.
                try:
                    await self._send_pending()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return True

    async def _replicate(self, nursery: trio.Nursery) -> bool:
        """The client sent JOIN or SUBSCRIBE: answer what came before it, then hand the
        connection to the replication stream until it ends (the client left)."""
        with trio.move_on_after(5):
            while self.outbox.inflight:
                await self._slot_freed()
        await self._flush()
        request, self.session.takeover = self.session.takeover, None
        await self.dispatcher.replication(self.session, request, self.io, self.decoder.take_buffered())
        return True

    async def _slot_freed(self) -> None:
        """Wait until a pending request is answered."""
        event = self.outbox.reader_waiting = trio.Event()
        await event.wait()

    async def _run(self, pending: Coroutine[Any, Any, bytes], started: float | None) -> None:
        """A request that may wait (``started``: the time of its chunk, if that chunk is timed)."""
        try:
            packet = await pending
        except BaseException:
            self.outbox.inflight -= 1  # cancelled with its connection: nobody is answered
            self._tasks_done += 1
            raise
        self._tasks_answered += 1
        self._tasks_done += 1
        self.outbox.reply_later(packet)
        if started is not None and self.latency is not None:
            self.latency.observe(time.perf_counter() - started)

    # -- latency -------------------------------------------------------------------------------

    def _sample_begins(self) -> tuple[float, int, int, int]:
        """A chunk to time: its start, and the counters its requests will move."""
        outbox = self.outbox
        return time.perf_counter(), self.decoder.packets, outbox.inflight + outbox.answers, self._tasks_started

    def _sample_ends(self, sample: tuple[float, int, int, int]) -> None:
        """Observe the timed chunk's inline answers; note its writes, answered later."""
        latency = self.latency
        assert latency is not None
        started, packets, pending_before, tasks_before = sample
        outbox = self.outbox
        deferred = outbox.inflight + outbox.answers - pending_before  # left pending by this chunk
        inline = self.decoder.packets - packets - deferred
        writes = deferred - (self._tasks_started - tasks_before)
        if inline > 0:
            latency.observe(time.perf_counter() - started, inline)
        if writes > 0:
            # Answered in commit order: these are done when every write in flight now is.
            writes_answered = outbox.answers - self._tasks_answered
            writes_in_flight = outbox.inflight - (self._tasks_started - self._tasks_done)
            self._writes_of_chunks.append((writes_answered + writes_in_flight, started, writes))
            self._writes_answered()

    def _writes_answered(self) -> None:
        """Observe the chunks whose writes are all answered by now."""
        chunks = self._writes_of_chunks
        answered = self.outbox.answers - self._tasks_answered
        if chunks and chunks[0][0] <= answered:
            now = time.perf_counter()
            latency = self.latency
            assert latency is not None
            while chunks and chunks[0][0] <= answered:
                _last, started, writes = chunks.popleft()
                latency.observe(now - started, writes)

    # -- sending -------------------------------------------------------------------------------

    async def _flush(self) -> None:
        while self.outbox.out or self._sending:
            self.outbox.wake_sender()
            self._drained = trio.Event()
            await self._drained.wait()

    async def _send_pending(self) -> None:
        """Write everything answered; only one task sends at a time (``_sending``). The buffer
        being sent is taken out of the outbox, so answers arriving meanwhile go to a fresh one."""
        outbox = self.outbox
        if self._writes_of_chunks:
            self._writes_answered()
        self._sending = True
        try:
            while outbox.out:
                await self.io.send_all(outbox.take())
        finally:
            self._sending = False
            if not outbox.out:
                self._drained.set()

    def _send_now(self) -> None:
        """Send what is answered without waiting (a group's end, see group_sends.py); what the
        socket does not take, or an error, is left to the sender task."""
        outbox = self.outbox
        if self._sending or not outbox.out:
            return  # a send is under way: it takes what was added
        if self._writes_of_chunks:
            self._writes_answered()
        io = self.io
        assert isinstance(io, DirectSocket)
        data = outbox.take()
        try:
            sent = io.send_some(data)
        except OSError:
            sent = 0  # the sender task meets the error and closes the connection
        if sent < len(data):
            outbox.out = data[sent:] if sent else data  # nothing was added meanwhile: no await
            outbox.wake_sender()
        else:
            self._drained.set()

    async def _send_loop(self, scope: trio.CancelScope) -> None:
        """Sends what is answered outside the receive loop (commits, calls)."""
        outbox = self.outbox
        try:
            while True:
                while not outbox.out or self._sending:
                    event = outbox.sender_waiting = trio.Event()
                    await event.wait()
                await self._send_pending()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            # The client is gone: nothing more can be answered.
            outbox.take()
            self._drained.set()
            scope.cancel()
