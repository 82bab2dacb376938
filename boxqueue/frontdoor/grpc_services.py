"""The standard gRPC services every Deckard server offers beside Deckard: health checking
(``grpc.health.v1.Health``) and server reflection (``grpc.reflection.v1alpha`` and ``v1``), as
methods of :class:`boxqueue.frontdoor.grpc_connections.GrpcServer`.

Health answers as grpcio's ``HealthServicer`` does: ``Check`` of a service it does not know is
``NOT_FOUND``; ``Watch`` sends the status at once (``SERVICE_UNKNOWN`` for an unknown service) and
again each time it changes, until the client leaves. Reflection reuses grpcio-reflection's
servicer for the answers (the descriptors come from protobuf's default pool); the two protocol
versions are the same messages under another package name, so one servicer answers both.
"""

from __future__ import annotations

from typing import TypeVar

import trio
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2

from boxqueue.frontdoor.grpc_connections import Call, GrpcError, Method, Send, Status

M = TypeVar("M", bound=Message)

HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
REFLECTION_V1ALPHA = reflection.SERVICE_NAME
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    """Each service's status, and ``grpc.health.v1.Health`` over them."""

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {}
        self._changed = trio.Event()

    def set(self, service: str, status: int) -> None:
        self.statuses[service] = status
        self._changed.set()
        self._changed = trio.Event()

    def set_all(self, status: int) -> None:
        for service in list(self.statuses):
            self.set(service, status)

    def methods(self) -> dict[str, Method]:
        return {f"/{HEALTH}/Check": Method(unary=self._check), f"/{HEALTH}/Watch": Method(stream=self._watch)}

    async def _check(self, data: bytes, call: Call) -> bytes:
        request = parse(health_pb2.HealthCheckRequest, data)
        status = self.statuses.get(request.service)
        if status is None:
            raise GrpcError(Status.NOT_FOUND, "unknown service")
        return health_pb2.HealthCheckResponse(status=status).SerializeToString()

    async def _watch(self, requests: trio.abc.ReceiveChannel[bytes], send: Send, call: Call) -> None:
        try:
            data = await requests.receive()
        except trio.EndOfChannel:
            raise GrpcError(Status.INVALID_ARGUMENT, "no request message") from None
        service = parse(health_pb2.HealthCheckRequest, data).service
        sent = None
        while True:
            changed = self._changed
            status = self.statuses.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            if status != sent:
                await send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
                sent = status
            await changed.wait()  # until the client leaves (its reset cancels this call)


def reflection_methods(service_names: tuple[str, ...]) -> dict[str, Method]:
    """Server reflection, ``v1alpha`` and ``v1``, listing ``service_names`` (and itself)."""
    servicer = reflection.ReflectionServicer((*service_names, REFLECTION_V1ALPHA, REFLECTION_V1))

    async def info(requests: trio.abc.ReceiveChannel[bytes], send: Send, call: Call) -> None:
        async for data in requests:
            request = parse(reflection_pb2.ServerReflectionRequest, data)
            # The servicer yields one answer per request it reads: hand it one at a time, so a
            # client that waits for each answer before its next request is served.
            for answer in servicer.ServerReflectionInfo(iter((request,)), None):
                await send(answer.SerializeToString())

    method = Method(stream=info)
    return {f"/{REFLECTION_V1ALPHA}/ServerReflectionInfo": method, f"/{REFLECTION_V1}/ServerReflectionInfo": method}


def parse(message_type: type[M], data: bytes) -> M:
    """``data`` as a ``message_type``; bytes that are not one end the call with ``INTERNAL`` and
    the cause, as Deckard's Go server answers (grpcio would say a bare ``UNKNOWN``)."""
    try:
        return message_type.FromString(data)
    except Exception as exc:  # DecodeError, and whatever else a parser may raise
        raise GrpcError(Status.INTERNAL,
                        f"cannot decode the request as {message_type.DESCRIPTOR.full_name}: {exc}") from None
