"""Secure mode (spec section 4, S6, S10): the service token and per-(queue, id) JWTs.

The token is read from ``Authorization: Bearer <token>`` (exact, case-sensitive prefix) or, when
that header is missing or has another form, from the ``access_token`` query parameter (browsers
cannot set headers on a WebSocket). Management calls and whole-queue listening take the service
token; by-id listening takes a JWT signed HS256 with the service token's bytes, with claims
``sub`` (id), ``iss`` (queue) and ``exp``, checked with 60 s leeway. A token of the wrong kind is
401, a valid JWT for another queue or id is 403.

PyJWT does the JWT work: signature, ``exp`` with leeway and required claims are exactly the
checks Sonya's jsonwebtoken makes, and a maintained library gets the edge cases (algorithm
confusion, malformed segments) right where a hand-rolled HMAC would have to re-learn them.
"""

from __future__ import annotations

import hmac
import time
import warnings
from collections.abc import Mapping

import jwt

LEEWAY_S = 60

# The HMAC secret is the operator's service token, whatever its length (Sonya takes any string);
# PyJWT's advice to use 32 bytes or more is for the operator, not a reason to refuse the token.
warnings.filterwarnings("ignore", category=jwt.InsecureKeyLengthWarning)


class Denied(Exception):
    """Authentication failed; ``status`` is 401 or 403."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def bearer(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The token a request carries, header first (spec 4)."""
    header = headers.get("authorization")
    if header is not None and header.startswith("Bearer "):
        return header[len("Bearer "):]
    return query.get("access_token")


class Tokens:
    """Checks and mints tokens for one service token; ``None`` means open mode (no checks)."""

    def __init__(self, service_token: str | None, jwt_ttl_s: int) -> None:
        self.service_token = service_token
        self.jwt_ttl_s = jwt_ttl_s

    @property
    def secure(self) -> bool:
        return self.service_token is not None

    def check_service(self, token: str | None) -> None:
        if self.service_token is None:
            return
        if token is None:
            raise Denied(401, "missing token")
        if not hmac.compare_digest(token.encode(), self.service_token.encode()):
            raise Denied(401, "invalid service token")

    def check_key(self, token: str | None, queue: str, key: str) -> None:
        """A JWT for exactly (queue, key); the service token itself is not accepted (spec 4)."""
        if self.service_token is None:
            return
        if token is None:
            raise Denied(401, "missing token")
        try:
            claims = jwt.decode(
                token,
                self.service_token.encode(),
                algorithms=["HS256"],
                leeway=LEEWAY_S,
                options={"require": ["exp", "sub", "iss"], "verify_aud": False},
            )
        except jwt.ExpiredSignatureError:
            raise Denied(401, "token expired") from None
        except jwt.InvalidTokenError:
            raise Denied(401, "invalid token") from None
        if claims.get("iss") != queue or claims.get("sub") != key:
            raise Denied(403, "token is for another queue or id")

    def check_listen(self, token: str | None, queue: str, key: str | None) -> None:
        """Whole-queue listening takes the service token, by-id listening a JWT (spec 4)."""
        if key is None:
            self.check_service(token)
        else:
            self.check_key(token, queue, key)

    def mint(self, queue: str, key: str) -> tuple[str, int]:
        """A JWT for (queue, key) and its expiry in Unix seconds."""
        assert self.service_token is not None
        expiration = int(time.time()) + self.jwt_ttl_s
        token = jwt.encode({"sub": key, "iss": queue, "exp": expiration}, self.service_token.encode(), algorithm="HS256")
        return token, expiration
