"""A session: one client connection's identity, user and end-of-life callbacks."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

import cython

from boxqueue.spaces.access import User
from boxqueue.spaces.procedures import CallContext

log = logging.getLogger(__name__)


@cython.cclass
class Session:
    """Created per connection; ``id`` is positive and never reused, not even across restarts.

    A compiled class (``session.pxd``): the dispatcher reads its fields on every request."""

    def __init__(self, sid: int, user: User, peer: str = "", read_only: bool = False) -> None:
        self.id = sid
        self.user = user
        self.peer = peer
        self.read_only = read_only
        self.salt = os.urandom(32)
        self._on_disconnect: list[Callable[[], Any]] = []
        self.closed = False
        self.context = CallContext(sid, user, read_only, self.on_disconnect)
        self.takeover = None  # a JOIN or SUBSCRIBE request: the connection becomes a replication stream

    def set_user(self, user: User) -> None:
        self.user = user
        self.context.user = user

    def on_disconnect(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` (plain or async) once, when the connection closes."""
        if self.closed:
            raise RuntimeError("session is closed")
        self._on_disconnect.append(callback)

    async def close(self) -> None:
        """Run the disconnect callbacks, newest first; a failing one does not stop the others."""
        self.closed = True
        callbacks, self._on_disconnect = self._on_disconnect, []
        for callback in reversed(callbacks):
            try:
                result = callback()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("on_disconnect callback of session %d failed", self.id)
