"""The iproto listeners: accept connections, give each a session and a :class:`Connection`."""

from __future__ import annotations

import logging
import ssl
from functools import partial

import trio

from boxqueue.iproto.connection import Connection
from boxqueue.iproto.dispatch import Dispatcher
from boxqueue.iproto.greeting import binary_greeting
from boxqueue.iproto.group_sends import GroupSends
from boxqueue.iproto.listening import serve_tcp
from boxqueue.iproto.session import Session
from boxqueue.iproto.socket_io import StreamIO
from boxqueue.measures import Histogram
from boxqueue.spaces.catalog import Catalog

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
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int | None = None,
        latency: Histogram | None = None,
        group_sends: GroupSends | None = None,
    ) -> None:
        self.catalog = catalog
        self.dispatcher = dispatcher
        self.max_packet = max_packet
        self.max_inflight = max_inflight
        self.grace = grace
        self.ssl_context = ssl_context  # every listener of this server speaks TLS
        self.max_connections = max_connections  # per listener
        self.connections: set[Connection] = set()
        self.accepted = 0  # connections since start
        self.latency = latency  # of every request on every connection (see Connection)
        self.group_sends = group_sends  # answers to writes sent at their group's end (group_sends.py)
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
        await serve_tcp(
            host, port, partial(self._serve_connection, read_only=read_only), connection_nursery,
            name="read-only iproto" if read_only else "iproto", ssl_context=self.ssl_context,
            max_connections=self.max_connections, task_status=task_status,
        )

    async def _serve_connection(self, stream: trio.abc.Stream, peer_text: str, *, read_only: bool) -> None:
        sid = await self.catalog.next_session_id()
        session = Session(sid, self.catalog.access.guest, peer_text, read_only)
        greeting, session.salt = binary_greeting(self.catalog.instance_uuid)
        # Plain TCP: the connection reads and writes the socket directly (socket_io.DirectSocket);
        # TLS goes through the SSLStream.
        io = StreamIO(stream) if isinstance(stream, trio.SSLStream) else None
        conn = Connection(stream, self.dispatcher, session, greeting, self.max_packet, self.max_inflight, io,
                          self.latency, self.group_sends)
        self.accepted += 1
        self.connections.add(conn)
        self._no_connections = trio.Event()
        try:
            await conn.serve(self.grace)
        except Exception:  # a fault of one connection closes it, never the server
            log.exception("iproto connection %s failed; closed", peer_text)
        finally:
            self.connections.discard(conn)
            if not self.connections:
                self._no_connections.set()

    def stop_reading(self) -> None:
        for conn in list(self.connections):
            conn.stop_reading()

    async def wait_closed(self) -> None:
        await self._no_connections.wait()
