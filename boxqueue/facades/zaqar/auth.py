"""Zaqar's token authentication (``[zaqar] auth = "token"``), as Zaqar behind Keystone answers.

A request must carry ``X-Auth-Token`` naming one of the configured tokens; the token fixes the
project: without ``X-Project-Id`` the request is the token's project's, and another project is
refused (403). A missing or unknown token gets keystonemiddleware's 401 (its JSON body and its
``WWW-Authenticate: Keystone uri=...`` header), before any of Zaqar's own checks, as the
middleware runs in front of Zaqar. Every configured token is compared, in constant time, with
``hmac.compare_digest``, whatever the token given.

Pools and flavors are an operator's API, as Zaqar's default policy has them (``pools:*`` and
``flavors:create/update/delete`` need the admin role; listing and reading flavors do not): only a
token marked ``admin = true`` may use them, others get Zaqar's 403 "Not authorized". Without
token authentication (``auth = "none"``) there is nobody to tell apart, and they stay open.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

from starlette.responses import Response

from boxqueue.facades.zaqar.errors import ZaqarError

_UNAUTHORIZED = json.dumps(
    {"error": {"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}}
).encode()


# Zaqar's handlers that need the admin role under its default policy.
ADMIN_ONLY = frozenset({
    "list_pools", "get_pool", "put_pool", "patch_pool", "delete_pool",
    "put_flavor", "patch_flavor", "delete_flavor",
})


class TokenAuth:
    """The configured tokens, the project each one fixes and whether it is an admin's."""

    def __init__(self, tokens: Iterable[tuple[str, str, bool]]) -> None:
        self._tokens = [(token.encode(), project, admin) for token, project, admin in tokens]

    def identify(self, token: str | None) -> tuple[str, bool] | None:
        """The project of ``token`` and whether it is an admin's, or None; every configured token
        is compared."""
        given = (token or "").encode("utf-8", "surrogateescape")
        found = None
        for known, project, admin in self._tokens:
            if hmac.compare_digest(known, given) and found is None:
                found = (project, admin)
        return found


def unauthorized(host: str) -> Response:
    """keystonemiddleware's answer to a request without a valid token."""
    return Response(
        _UNAUTHORIZED, 401, {"WWW-Authenticate": f'Keystone uri="http://{host}"'},
        media_type="application/json",
    )


def not_authorized() -> ZaqarError:
    """Zaqar's answer when its policy refuses the action (``errors.HTTPForbidden``)."""
    return ZaqarError(403, "Not authorized", "You are not authorized to complete this action.")


def wrong_project(token_project: str, asked: str) -> ZaqarError:
    return ZaqarError(403, "Forbidden",
                      f"The token is for project {token_project!r}; it cannot act for project {asked!r}.")
