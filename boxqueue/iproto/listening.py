"""Accepting connections for the iproto listeners (binary, read-only, admin console): the
per-listener connection limit and TLS.

With an :class:`ssl.SSLContext` every accepted socket is wrapped in a :class:`trio.SSLStream` and
its handshake completed (within ``handshake_timeout``) before the handler sees it, so the first
thing a client reads is still the greeting, as with Tarantool Enterprise's ``ssl`` transport. A
client that does not finish the handshake (plain TCP on a TLS port, no or a wrong client
certificate when ``ca_file`` is set) is closed without a greeting.

``max_connections`` counts this listener's open connections; one more is closed at once (the
client sees the connection end before a greeting) and the first refusal in each ten seconds is
logged. Everything else of the connection is the handler's.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
REFUSAL_LOG_INTERVAL_S = 10.0

Handler = Callable[[trio.abc.Stream, str], Awaitable[None]]


def peer_text(stream: trio.SocketStream) -> str:
    try:
        peer = stream.socket.getpeername()
        return f"{peer[0]}:{peer[1]}"
    except OSError:
        return ""


class Gate:
    """A listener's open connections, against its limit; the first refusal in each ten seconds is
    logged. The HTTP listeners' front door (``boxqueue/frontdoor/asgi_serving.py``) counts with it too."""

    def __init__(self, name: str, limit: int | None) -> None:
        self.name = name
        self.limit = limit
        self.open = 0
        self.refused = 0
        self._logged_at = -REFUSAL_LOG_INTERVAL_S

    def enter(self) -> bool:
        if self.limit is not None and self.open >= self.limit:
            self.refused += 1
            now = trio.current_time()
            if now - self._logged_at >= REFUSAL_LOG_INTERVAL_S:
                self._logged_at = now
                log.warning("%s: %d connections open (max_connections), refusing new ones (%d so far)",
                            self.name, self.open, self.refused)
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1


async def tls_handshake(stream: trio.SocketStream, context: ssl.SSLContext, peer: str, name: str,
                        timeout: float = HANDSHAKE_TIMEOUT_S) -> trio.SSLStream | None:
    """The TLS stream over ``stream`` once its handshake is done; None (and ``stream`` closed) if
    the client did not complete it in time. ``https_compatible``: closing does not wait to send
    close_notify to a client that has stopped reading."""
    tls = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
    with trio.move_on_after(timeout):
        try:
            await tls.do_handshake()
            return tls
        except trio.BrokenResourceError as exc:
            log.info("%s: TLS handshake with %s failed: %s", name, peer, exc.__cause__ or exc)
    await trio.aclose_forcefully(stream)
    return None


async def serve_tcp(
    host: str,
    port: int,
    handler: Handler,
    connection_nursery: trio.Nursery,
    *,
    name: str,
    ssl_context: ssl.SSLContext | None = None,
    max_connections: int | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept on ``host:port`` until cancelled; each admitted connection runs ``handler(stream,
    peer)`` in ``connection_nursery`` (so closing the listener does not cut it off)."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info("%s listening on %s:%d%s", name, host, bound, " (TLS)" if ssl_context is not None else "")
    gate = Gate(f"{name} {host}:{bound}", max_connections)

    async def admitted(stream: trio.SocketStream) -> None:
        if not gate.enter():
            await trio.aclose_forcefully(stream)
            return
        try:
            peer = peer_text(stream)
            served: trio.abc.Stream = stream
            if ssl_context is not None:
                tls = await tls_handshake(stream, ssl_context, peer, name)
                if tls is None:
                    return
                served = tls
            await handler(served, peer)
        finally:
            gate.leave()

    task_status.started(bound)
    await trio.serve_listeners(admitted, listeners, handler_nursery=connection_nursery)
