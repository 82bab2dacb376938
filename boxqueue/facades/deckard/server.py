"""The Deckard listener: grpcio's thread-pool server, owned by a trio task.

:meth:`DeckardFacade.run` is a trio task (started in the server's nursery). It opens a nursery
for the engine calls that need a task, builds grpcio's server (Deckard, the standard health
service and server reflection, with Deckard's 4 MiB message limits) over a pool of threads, and
reports the bound port. Each call runs on a pool thread and reaches the engine through
:class:`facades.deckard.trio_bridge.TrioBridge`. When the task is cancelled it stops the gRPC
server (calls in flight get a grace period, with the engine still running), and only then
closes the calls' nursery.

An early measurement preferred this server to grpcio's asyncio server in a thread of its own;
``bench/grpc_servers.py`` (2026-11-27) found the opposite, and this pairing the dearest of the
candidates: which server Deckard moves to is open (docs/performance.md, "Where the time still
goes").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures

import grpc
import trio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from boxqueue.facades.deckard.auth import BearerToken, PemFiles
from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.facades.deckard.metering import MeteringInterceptor
from boxqueue.facades.deckard.service import MAX_MESSAGE_BYTES, DeckardService, deckard_handlers
from boxqueue.facades.deckard.trio_bridge import TrioBridge
from boxqueue.facades.follower import UnavailableService
from boxqueue.measures import RequestMeter
from boxqueue.tubes.engine import QueueEngine

log = logging.getLogger(__name__)

GRACE_S = 5.0
WORKERS = 32  # pool threads: calls in progress at once (each waits for the engine, not the CPU)
# Limits against abuse: calls waiting for a pool thread beyond this many are refused with
# RESOURCE_EXHAUSTED (so queued calls cannot grow memory without bound); streams per HTTP/2
# connection; request metadata (gRPC's default, stated).
MAX_CONCURRENT_CALLS = 1024
MAX_STREAMS_PER_CONNECTION = 128
MAX_METADATA_BYTES = 8192
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Deckard"].full_name
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


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
        tls: PemFiles | None = None,
        max_connections: int | None = None,
        meter: RequestMeter | None = None,
        follower: Callable[[], str | None] | None = None,
    ) -> None:
        """``follower``: this node follows a replica set's leader (the callable names the
        leader's Deckard address): every Deckard call is UNAVAILABLE (facades.follower)."""
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
        self.meter = meter

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        calls_scope = trio.CancelScope(shield=True)  # closed by us, after the server has stopped

        async def own_calls(*, task_status: trio.TaskStatus[trio.Nursery]) -> None:
            with calls_scope:
                async with trio.open_nursery() as calls:
                    task_status.started(calls)
                    await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            calls = await nursery.start(own_calls)
            bridge = TrioBridge(calls, trio.lowlevel.current_trio_token())
            pool = futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="deckard")
            server, health_service = self._server(bridge, pool)
            address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
            try:
                try:
                    if self.tls is None:
                        port = server.add_insecure_port(address)
                    else:
                        credentials = grpc.ssl_server_credentials(
                            [(self.tls.key, self.tls.chain)], root_certificates=self.tls.client_ca,
                            require_client_auth=self.tls.require_client_cert,
                        )
                        port = server.add_secure_port(address, credentials)
                except RuntimeError as exc:
                    raise OSError(f"Deckard listener {self.host}:{self.port}: {exc}") from exc
                if port == 0:
                    raise OSError(f"Deckard listener {self.host}:{self.port}: could not bind")
                server.start()
                log.info("Deckard facade listening on %s:%d%s", self.host, port, " (TLS)" if self.tls else "")
                task_status.started(port)
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    health_service.enter_graceful_shutdown()
                    stopped = server.stop(self.grace)
                    # A limiter of its own: this wait must not take a token the commits share.
                    await trio.to_thread.run_sync(stopped.wait, limiter=trio.CapacityLimiter(1))
                    bridge.close()
                    pool.shutdown(wait=False)
                    calls_scope.cancel()

    def _server(self, bridge: TrioBridge, pool: futures.ThreadPoolExecutor) -> tuple[grpc.Server, health.HealthServicer]:
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_metadata_size", MAX_METADATA_BYTES),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
            ("grpc.so_reuseport", 0),
        ]
        if self.max_connections is not None:
            options.append(("grpc.max_allowed_incoming_connections", self.max_connections))
        interceptors: list[grpc.ServerInterceptor] = []
        if self.meter is not None:  # first: a call refused for its token is counted too
            interceptors.append(MeteringInterceptor(self.meter))
        if self.token is not None:
            interceptors.append(BearerToken(self.token))
        server = grpc.server(
            pool,
            options=options,
            interceptors=interceptors or None,
            maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS,
        )
        if self.follower is not None:
            server.add_generic_rpc_handlers((UnavailableService(SERVICE_NAME, self.follower),))
        else:
            service = DeckardService(
                self.engine, self.space_id, bridge, default_ttl_minutes=self.default_ttl_minutes,
                allow_flush=self.allow_flush,
            )
            server.add_generic_rpc_handlers((deckard_handlers(service),))
        health_service = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
        names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
        reflection.enable_server_reflection((*names, REFLECTION_V1), server)
        server.add_generic_rpc_handlers((_reflection_v1((*names, REFLECTION_V1)),))
        status = (health_pb2.HealthCheckResponse.NOT_SERVING if self.follower is not None
                  else health_pb2.HealthCheckResponse.SERVING)
        for name in ("", *names):
            health_service.set(name, status)
        return server, health_service


def _reflection_v1(service_names: tuple[str, ...]) -> grpc.GenericRpcHandler:
    """``grpc.reflection.v1`` as well as ``v1alpha`` (Deckard registers both; newer tools ask
    for v1 first). The two protocols are the same messages under another package name, so the
    v1alpha servicer answers both."""
    servicer = reflection.ReflectionServicer(service_names)
    return grpc.method_handlers_generic_handler(
        REFLECTION_V1,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
