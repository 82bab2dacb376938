"""Who may call the Deckard listener: a bearer token (TLS is the listener's, with ALPN ``h2``:
:func:`boxqueue.tls.server_context`).

``[deckard] token``: every call must carry ``authorization: Bearer <token>`` metadata (what grpcio's
``access_token_call_credentials`` sends, or plain metadata); a call without it, or with another
token, ends with ``UNAUTHENTICATED`` before the method runs. Health checks stay open (load
balancers and orchestrators probe them without credentials; they reveal nothing but "serving").
The comparison is ``hmac.compare_digest``: its time does not depend on where the tokens differ.

Client certificates are required, or checked only when given, as Deckard's
``RequireAndVerifyClientCert`` and ``VerifyClientCertIfGiven`` do (the TLS context's
``verify_mode``).
"""

from __future__ import annotations

import hmac

from boxqueue.frontdoor.grpc_connections import Call, GrpcError, Status

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
DENIED = "missing or invalid authorization token (expected `authorization: Bearer <token>`)"


class BearerToken:
    """Refuses calls without ``authorization: Bearer <token>`` (UNAUTHENTICATED)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def check(self, call: Call) -> None:
        """Raises GrpcError(UNAUTHENTICATED) unless ``call`` may run."""
        if call.method.startswith(OPEN_PREFIXES):
            return
        given = (call.value("authorization") or "").encode("latin-1")
        if not hmac.compare_digest(given, self._expected):
            raise GrpcError(Status.UNAUTHENTICATED, DENIED)
