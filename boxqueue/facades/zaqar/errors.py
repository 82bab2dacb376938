"""Zaqar's error responses: one exception carrying status, title and description.

Every refusal of the facade is raised as :class:`ZaqarError`; the app turns it into Zaqar's
``{"title", "description"}`` body in one place (:func:`facades.zaqar.app.error_response`).
"""

from __future__ import annotations

from typing import Any

BAD_BODY = "Invalid request body"
BAD_API = "Invalid API request"
NOT_FOUND = "Not found"
UNABLE_TO_DELETE = "Unable to delete"
LIMIT_TEXT = "Limit must be at least 1 and may not be greater than 20."


class ZaqarError(Exception):
    """A response Zaqar gives instead of the resource: status, title, optional description."""

    def __init__(self, status: int, title: str, description: str | None = None, *,
                 headers: dict[str, str] | None = None, extra: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {title}: {description}")
        self.status = status
        self.title = title
        self.description = description
        self.headers = headers or {}
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"title": self.title}
        if self.description is not None:
            doc["description"] = self.description
        doc.update(self.extra)
        return doc


def bad_body(description: str) -> ZaqarError:
    return ZaqarError(400, BAD_BODY, description)


def bad_api(description: str) -> ZaqarError:
    return ZaqarError(400, BAD_API, description)


def not_found(description: str) -> ZaqarError:
    return ZaqarError(404, NOT_FOUND, description)


def unavailable(description: str) -> ZaqarError:
    return ZaqarError(503, "Service temporarily unavailable", description + " Please try again in a few seconds.")
