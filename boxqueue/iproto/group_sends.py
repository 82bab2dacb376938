"""Answers that a group of writes produced, sent by the committing task once the group is answered.

A write is answered from its commit callback, which writes the answer into the connection's
:class:`~boxqueue.iproto.outbox.Outbox`. Waking each connection's sender task for it would cost
a task switch and two trio events per answer, which, with clients sending one request at a time,
is a visible share of a request's CPU. While a group's callbacks run (:meth:`GroupSends.begin` to
:meth:`GroupSends.end`, which the group committer calls around them), an outbox whose sender is
idle notes itself here instead; at the end each noted connection sends its answers at once, one
non-blocking send per connection and group, in the committing task. Whatever the socket does not
take (a full buffer), and any error, goes to the connection's sender task as before.
"""

from __future__ import annotations

from typing import Any


class GroupSends:
    """The outboxes answered by the group whose callbacks are running (see the module's text)."""

    def __init__(self) -> None:
        self.collecting = False
        self.queued: list[Any] = []  # Outbox objects, each once (its ``send_queued`` flag)

    def begin(self) -> None:
        self.collecting = True

    def end(self) -> None:
        self.collecting = False
        queued = self.queued
        if queued:
            self.queued = []
            for outbox in queued:
                outbox.send_queued = False
                outbox.send_now()
