"""HTTP basic authentication against the server's own chap-sha1 users.

The server keeps SHA1(SHA1(password)) of each user (``boxqueue.spaces.access``), so a password sent with
basic auth is checked by hashing it the same way and comparing the digests in constant time. With
``[[users]]`` configured, the dashboard and ``/metrics`` need a user with ``read`` on the
universe; ``metrics.public = true`` exempts ``/metrics`` (for scrapers), and the health checks
(``/health``, ``/health/leader``, ``/health/replica``) are always open (load balancers probe them).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Any

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from boxqueue.spaces import access as acl

REALM = 'Basic realm="boxqueue", charset="UTF-8"'
_NOBODY = acl.chap_sha1_hash("\x00 no such user \x00")  # compared against when the name is unknown


def credentials(header: str | None) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization: Basic ...`` header, None if absent or malformed."""
    if not header:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, sep, password = decoded.partition(":")
    return (name, password) if sep else None


def verify(access: acl.AccessControl, name: str, password: str) -> acl.User | None:
    """The user if the password matches its stored chap-sha1 hash (constant-time comparison)."""
    user = access.users.get(name)
    stored = user.password_hash if user is not None and user.type == "user" else None
    matches = hmac.compare_digest(acl.chap_sha1_hash(password), stored if stored is not None else _NOBODY)
    return user if matches and stored is not None else None


class BasicAuth:
    """ASGI middleware: every request needs a user with ``read`` on the universe, except the
    paths in ``public``."""

    def __init__(self, app: ASGIApp, access: acl.AccessControl, public: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.access = access
        self.public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.public:
            await self.app(scope, receive, send)
            return
        header = None
        for key, value in scope.get("headers", []):
            if key == b"authorization":
                header = value.decode("latin-1")
                break
        given = credentials(header)
        user = verify(self.access, *given) if given is not None else None
        if user is None:
            response: Any = PlainTextResponse("login required", 401, headers={"WWW-Authenticate": REALM})
        elif user.privileges_on(acl.UNIVERSE, "") & acl.READ == 0:
            response = PlainTextResponse(f"user '{user.name}' has no read access to the universe", 403)
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)
