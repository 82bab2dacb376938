"""One connection's answers not sent yet, and its requests still waiting for theirs.

The dispatcher writes quick answers straight into :attr:`Outbox.out`; a write's commit callback,
or a finished call, writes its answer there later and calls :meth:`Outbox.answered`, which wakes
the connection's sender task, and its receive loop when that waits for a free slot. The wake-ups
are trio events made by the waiting task itself, so an answer that nobody waits for costs no
event at all. Compiled with Cython (``outbox.pxd``): every answered write passes through here.
"""

from __future__ import annotations

import cython


@cython.cclass
class Outbox:
    def __init__(self, max_inflight: int) -> None:
        self.out = bytearray()
        self.inflight = 0
        self.max_inflight = max_inflight
        self.sender_waiting = None
        self.reader_waiting = None
        self.answers = 0  # pending requests answered so far (the connection measures latency by it)
        # Set by a connection that can send without waiting (a plain socket): answers written
        # while a group's callbacks run are sent at the group's end by ``send_now``
        # (boxqueue/iproto/group_sends.py), without waking the sender task.
        self.sends = None
        self.send_now = None
        self.send_queued = False

    def reply_later(self, packet: bytes) -> None:
        """The answer to a pending request, as whole response bytes."""
        self.out += packet
        self.answered()

    def answered(self) -> None:
        """A pending request's answer is now in :attr:`out`."""
        self.inflight -= 1
        self.answers += 1
        self.wake_sender()
        waiting = self.reader_waiting
        if waiting is not None:
            self.reader_waiting = None
            waiting.set()

    def wake_sender(self) -> None:
        waiting = self.sender_waiting
        if waiting is not None:
            sends = self.sends
            if sends is not None and sends.collecting:
                if not self.send_queued:  # sent when the group's callbacks are done
                    self.send_queued = True
                    sends.queued.append(self)
                return
            self.sender_waiting = None
            waiting.set()

    def take(self) -> bytearray:
        """Everything answered so far, for one send; later answers go to a fresh buffer."""
        data = self.out
        self.out = bytearray()
        return data
