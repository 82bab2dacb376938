"""The Deckard listener: grpcio's asyncio server in one dedicated thread, owned by trio.

:meth:`DeckardFacade.run` is a trio task (started in the server's nursery). It opens a nursery
for the calls bridged from gRPC handlers, starts the gRPC thread with ``trio.to_thread`` (the
thread runs an asyncio loop serving Deckard, the standard health service and server
reflection, with Deckard's 4 MiB message limits) and reports the bound port. When the task is
cancelled it asks the thread to stop, waits for it (calls in flight get a grace period and keep
their engine calls running meanwhile), and only then closes the calls' nursery.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import grpc
import trio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from facades.deckard.generated import deckard_service_pb2 as pb
from facades.deckard.service import MAX_MESSAGE_BYTES, DeckardService, deckard_handlers
from facades.deckard.trio_bridge import TrioBridge
from tubes.engine import QueueEngine

log = logging.getLogger(__name__)

GRACE_S = 5.0
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
    ) -> None:
        self.engine = engine
        self.space_id = space_id
        self.host = host
        self.port = port
        self.default_ttl_minutes = default_ttl_minutes
        self.allow_flush = allow_flush
        self.grace = grace
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = threading.Event()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        calls_scope = trio.CancelScope(shield=True)  # closed by us, after the thread has stopped

        async def own_calls(*, task_status: trio.TaskStatus[trio.Nursery]) -> None:
            with calls_scope:
                async with trio.open_nursery() as calls:
                    task_status.started(calls)
                    await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            calls = await nursery.start(own_calls)
            bridge = TrioBridge(calls, trio.lowlevel.current_trio_token())
            thread_done = trio.Event()
            started: list[Any] = []
            bound = trio.Event()

            def report(port: int | None, error: BaseException | None) -> None:  # on trio
                started.extend((port, error))
                bound.set()

            async def thread() -> None:
                try:
                    # A limiter of its own: the thread lives as long as the listener, and must
                    # not hold one of the tokens the committer's flushes share.
                    await trio.to_thread.run_sync(
                        self._thread_main, bridge, report, limiter=trio.CapacityLimiter(1)
                    )
                finally:
                    thread_done.set()
                if started and started[1] is None and not self._stop_requested.is_set():
                    raise RuntimeError("the Deckard gRPC server stopped by itself")

            nursery.start_soon(thread)
            try:
                await bound.wait()
                port, error = started
                if error is not None:
                    raise OSError(f"Deckard listener {self.host}:{self.port}: {error}") from error
                log.info("Deckard facade listening on %s:%d", self.host, port)
                task_status.started(port)
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    self._request_stop()
                    await thread_done.wait()
                    bridge.close()
                    calls_scope.cancel()

    def _request_stop(self) -> None:
        """Ask the gRPC thread to stop (from the trio thread; safe before it has started)."""
        self._stop_requested.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop has already finished

    # -- the gRPC thread ----------------------------------------------------------------------

    def _thread_main(self, bridge: TrioBridge, report: Any) -> None:
        try:
            asyncio.run(self._serve(bridge, report))
        except BaseException as exc:  # a failure before the port was reported
            log.exception("the Deckard gRPC thread failed")
            try:
                trio.from_thread.run_sync(report, None, exc)
            except Exception:
                pass

    async def _serve(self, bridge: TrioBridge, report: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ]
        )
        service = DeckardService(
            self.engine, self.space_id, bridge, default_ttl_minutes=self.default_ttl_minutes,
            allow_flush=self.allow_flush,
        )
        server.add_generic_rpc_handlers((deckard_handlers(service),))
        health_service = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
        names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
        reflection.enable_server_reflection((*names, REFLECTION_V1), server)
        server.add_generic_rpc_handlers((_reflection_v1((*names, REFLECTION_V1)),))
        for name in ("", *names):
            await health_service.set(name, health_pb2.HealthCheckResponse.SERVING)
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as exc:
            trio.from_thread.run_sync(report, None, exc)
            return
        if port == 0:
            trio.from_thread.run_sync(report, None, RuntimeError("could not bind"))
            return
        await server.start()
        trio.from_thread.run_sync(report, port, None)
        stopping = asyncio.ensure_future(self._stop.wait())
        if self._stop_requested.is_set():
            self._stop.set()
        await stopping
        await health_service.enter_graceful_shutdown()
        await server.stop(self.grace)


def _reflection_v1(service_names: tuple[str, ...]) -> grpc.GenericRpcHandler:
    """``grpc.reflection.v1`` as well as ``v1alpha`` (Deckard registers both; newer tools ask
    for v1 first). The two protocols are the same messages under another package name, so the
    asyncio v1alpha servicer answers both."""
    servicer = reflection.aio.ReflectionServicer(service_names)
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
