"""Zaqar's token authentication (``[zaqar] auth = "token"``), as Zaqar behind Keystone answers.

A request must carry ``X-Auth-Token`` naming one of the configured tokens; the token fixes the
project: without ``X-Project-Id`` the request is the token's project's, and another project is
refused (403). A missing or unknown token gets keystonemiddleware's 401 (its JSON body and its
``WWW-Authenticate: Keystone uri=...`` header), before any of Zaqar's own checks, as the
middleware runs in front of Zaqar. Every configured token is compared, in constant time, with
``hmac.compare_digest``, whatever the token given.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

from starlette.responses import Response

from facades.zaqar.errors import ZaqarError

_UNAUTHORIZED = json.dumps(
    {"error": {"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}}
).encode()


class TokenAuth:
    """The configured tokens and the project each one fixes."""

    def __init__(self, tokens: Iterable[tuple[str, str]]) -> None:
        self._tokens = [(token.encode(), project) for token, project in tokens]

    def project_of(self, token: str | None) -> str | None:
        """The project of ``token``, or None; every configured token is compared."""
        given = (token or "").encode("utf-8", "surrogateescape")
        found = None
        for known, project in self._tokens:
            if hmac.compare_digest(known, given) and found is None:
                found = project
        return found


def unauthorized(host: str) -> Response:
    """keystonemiddleware's answer to a request without a valid token."""
    return Response(
        _UNAUTHORIZED, 401, {"WWW-Authenticate": f'Keystone uri="http://{host}"'},
        media_type="application/json",
    )


def wrong_project(token_project: str, asked: str) -> ZaqarError:
    return ZaqarError(403, "Forbidden",
                      f"The token is for project {token_project!r}; it cannot act for project {asked!r}.")
