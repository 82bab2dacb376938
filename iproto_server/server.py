"""The iproto listeners: accept connections, give each a session and a :class:`Connection`."""

from __future__ import annotations

import logging
from functools import partial

import trio

from iproto_server.connection import Connection
from iproto_server.dispatch import Dispatcher
from iproto_server.greeting import binary_greeting
from iproto_server.session import Session
from measures import Histogram
from spaces.catalog import Catalog

log = logging.getLogger(__name__)


class IprotoServer:
    """Serves the binary protocol on any number of listeners (normal and read-only)."""

    def __init__(
        self,
        catalog: Catalog,
        dispatcher: Dispatcher,
        *,
        max_packet: int = 16 * 1024 * 1024,
        max_inflight: int = 768,
        grace: float = 5.0,
        latency: Histogram | None = None,
    ) -> None:
        self.catalog = catalog
        self.dispatcher = dispatcher
        self.max_packet = max_packet
        self.max_inflight = max_inflight
        self.grace = grace
        self.connections: set[Connection] = set()
        self.accepted = 0  # connections since start
        self.latency = latency  # of every request on every connection (see Connection)
        self._no_connections = trio.Event()
        self._no_connections.set()

    async def listen(
        self,
        host: str,
        port: int,
        connection_nursery: trio.Nursery,
        *,
        read_only: bool = False,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept on ``host:port`` until cancelled; connections live in ``connection_nursery``
        so that closing the listener does not cut them off."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        kind = "read-only iproto" if read_only else "iproto"
        log.info("%s listening on %s:%d", kind, host, bound)
        task_status.started(bound)
        await trio.serve_listeners(
            partial(self._serve_connection, read_only=read_only),
            listeners,
            handler_nursery=connection_nursery,
        )

    async def _serve_connection(self, stream: trio.SocketStream, *, read_only: bool) -> None:
        try:
            peer = stream.socket.getpeername()
            peer_text = f"{peer[0]}:{peer[1]}"
        except OSError:
            peer_text = ""
        sid = await self.catalog.next_session_id()
        session = Session(sid, self.catalog.access.guest, peer_text, read_only)
        greeting, session.salt = binary_greeting(self.catalog.instance_uuid)
        conn = Connection(stream, self.dispatcher, session, greeting, self.max_packet, self.max_inflight,
                          self.latency)
        self.accepted += 1
        self.connections.add(conn)
        self._no_connections = trio.Event()
        try:
            await conn.serve(self.grace)
        finally:
            self.connections.discard(conn)
            if not self.connections:
                self._no_connections.set()

    def stop_reading(self) -> None:
        for conn in list(self.connections):
            conn.stop_reading()

    async def wait_closed(self) -> None:
        await self._no_connections.wait()
