"""The Deckard listener: gRPC served by the front door over HTTP/2 on trio.

:meth:`DeckardFacade.run` is a trio task (started in the server's nursery). It serves Deckard's ten
methods, the standard health service and server reflection through
:class:`boxqueue.frontdoor.grpc_connections.GrpcServer`, with Deckard's 4 MiB message limits, and
reports the bound port. Each call runs in a trio task on the engine's own loop: no thread pool,
no hop between threads (grpcio's thread-pool server cost 2.8x the CPU per call with that hop;
``bench/grpc_servers.py``, docs/performance.md). When the task is cancelled the health service
says NOT_SERVING, every connection gets a GOAWAY, the calls in progress get a grace period, and
only then is the listener closed.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable

import trio

from boxqueue.facades.deckard.auth import BearerToken
from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.facades.deckard.metering import CallMeter
from boxqueue.facades.deckard.service import MAX_MESSAGE_BYTES, DeckardService, deckard_methods
from boxqueue.facades.follower import unavailable_methods
from boxqueue.frontdoor.grpc_connections import GrpcServer, Limits, Method
from boxqueue.frontdoor.grpc_services import (
    HEALTH,
    NOT_SERVING,
    REFLECTION_V1,
    REFLECTION_V1ALPHA,
    SERVING,
    Health,
    reflection_methods,
)
from boxqueue.measures import RequestMeter
from boxqueue.tubes.engine import QueueEngine

log = logging.getLogger(__name__)

GRACE_S = 5.0
# Limits against abuse: calls in progress at once in the server (one more is RESOURCE_EXHAUSTED,
# so calls cannot grow memory without bound); calls at once on one HTTP/2 connection; request
# metadata (gRPC's default, stated).
MAX_CONCURRENT_CALLS = 1024
MAX_STREAMS_PER_CONNECTION = 128
MAX_METADATA_BYTES = 8192
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Deckard"].full_name


class DeckardFacade:
    """Serves ``blipai.deckard.Deckard`` on ``host:port`` over the tubes of one space."""

    def __init__(
        self,
        engine: QueueEngine,
        space_id: int,
        host: str,
        port: int,
        *,
        default_ttl_minutes: int = 1440,
        allow_flush: bool = True,
        grace: float = GRACE_S,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        max_connections: int | None = None,
        timeouts: tuple[float, float, float] = (Limits.header_timeout_s, Limits.body_timeout_s, Limits.idle_timeout_s),
        meter: RequestMeter | None = None,
        follower: Callable[[], str | None] | None = None,
    ) -> None:
        """``tls``: a server context offering ALPN ``h2``. ``timeouts``: the connections' header, body
        and idle timeouts (:class:`boxqueue.frontdoor.grpc_connections.Limits`). ``follower``: this node follows a
        replica set's leader (the callable names the leader's Deckard address): every Deckard
        call is UNAVAILABLE (facades.follower)."""
        self.follower = follower
        self.engine = engine
        self.space_id = space_id
        self.host = host
        self.port = port
        self.default_ttl_minutes = default_ttl_minutes
        self.allow_flush = allow_flush
        self.grace = grace
        self.token = token  # `authorization: Bearer <token>` required on every call but health checks
        self.tls = tls
        self.max_connections = max_connections
        self.timeouts = timeouts
        self.meter = meter

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        health = Health()
        server = self._server(health)
        serving = trio.CancelScope(shield=True)  # cancelled by us, once the calls had their grace

        async def serve(*, task_status: trio.TaskStatus[int]) -> None:
            with serving:
                await server.serve(self.host, self.port, task_status=task_status)

        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve)
            log.info("Deckard facade listening on %s:%d%s", self.host, port, " (TLS)" if self.tls else "")
            task_status.started(port)
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    health.set_all(NOT_SERVING)
                    await server.stop(self.grace)
                serving.cancel()

    def _server(self, health: Health) -> GrpcServer:
        deckard: dict[str, Method]
        if self.follower is not None:
            paths = [f"/{SERVICE_NAME}/{m.name}" for m in pb.DESCRIPTOR.services_by_name["Deckard"].methods]
            deckard = unavailable_methods(paths, self.follower)
        else:
            service = DeckardService(self.engine, self.space_id, default_ttl_minutes=self.default_ttl_minutes,
                                     allow_flush=self.allow_flush)
            deckard = deckard_methods(service)
        methods = {**deckard, **health.methods(), **reflection_methods((SERVICE_NAME, HEALTH))}
        for name in ("", SERVICE_NAME, HEALTH, REFLECTION_V1ALPHA, REFLECTION_V1):
            health.set(name, NOT_SERVING if self.follower is not None else SERVING)
        token = BearerToken(self.token) if self.token is not None else None
        metered = [*deckard, f"/{HEALTH}/Check"]
        meter = CallMeter(self.meter, metered, token.check if token is not None else None)
        header_s, body_s, idle_s = self.timeouts
        limits = Limits(max_message_bytes=MAX_MESSAGE_BYTES, max_metadata_bytes=MAX_METADATA_BYTES,
                        max_streams=MAX_STREAMS_PER_CONNECTION, max_calls=MAX_CONCURRENT_CALLS,
                        max_connections=self.max_connections, preface_timeout_s=header_s, header_timeout_s=header_s,
                        body_timeout_s=body_s, idle_timeout_s=idle_s)
        return GrpcServer(methods, limits=limits, ssl_context=self.tls, guard=meter.begin,
                          finished=meter.finished, name="Deckard")
