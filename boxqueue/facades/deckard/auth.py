"""Who may call the Deckard listener: a bearer token and TLS.

``[deckard] token``: every call must carry ``authorization: Bearer <token>`` metadata (what grpcio's
``access_token_call_credentials`` sends, or plain metadata); a call without it, or with another
token, ends with ``UNAUTHENTICATED`` before the method runs. Health checks stay open (load
balancers and orchestrators probe them without credentials; they reveal nothing but "serving").
The comparison is ``hmac.compare_digest``: its time does not depend on where the tokens differ.

TLS is grpcio's own (``ssl_server_credentials``) from :class:`PemFiles`, with client certificates
required, or checked only when given, as Deckard's ``RequireAndVerifyClientCert`` and
``VerifyClientCertIfGiven`` do.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
DENIED = "missing or invalid authorization token (expected `authorization: Bearer <token>`)"


@dataclass(frozen=True)
class PemFiles:
    """What grpcio's server credentials take: the key, its chain, and the client CA (or None)."""

    key: bytes
    chain: bytes
    client_ca: bytes | None
    require_client_cert: bool


class BearerToken(grpc.ServerInterceptor):
    """Refuses calls without ``authorization: Bearer <token>`` (UNAUTHENTICATED)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def authorized(self, metadata: Any) -> bool:
        given = b""
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
        return hmac.compare_digest(given, self._expected)

    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or details.method.startswith(OPEN_PREFIXES) or self.authorized(details.invocation_metadata):
            return handler
        return _refusing(handler)


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that ends the call with UNAUTHENTICATED."""

    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)

    decode, encode = handler.request_deserializer, handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, decode, encode)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, decode, encode)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, decode, encode)
    return grpc.unary_unary_rpc_method_handler(refuse, decode, encode)
