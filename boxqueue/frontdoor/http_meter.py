"""Counts an HTTP facade's requests for the metrics: an ASGI middleware around its app.

Each request is recorded once answered: its operation (what the app put in the scope under
``OPERATION``, else the name of the Starlette endpoint that served it, else ``unrouted``), its
status (4xx and 5xx are errors, counted by status code) and its time. WebSocket sessions are
recorded when they end, as their handshake was answered.
"""

from __future__ import annotations

from typing import Any

from boxqueue.measures import RequestMeter

OPERATION = "boxqueue.operation"  # scope key: the name of the operation a request ran

ASGIApp = Any


class MeteredApp:
    def __init__(self, app: ASGIApp, meter: RequestMeter) -> None:
        self.app = app
        self.meter = meter

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        status = [0]

        async def watching_send(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                status[0] = message["status"]
            elif kind == "websocket.accept":
                status[0] = 101
            elif kind == "websocket.close" and not status[0]:
                status[0] = 403  # refused before the handshake was accepted
            await send(message)

        started = self.meter.begin()
        try:
            await self.app(scope, receive, watching_send)
        finally:
            code = status[0] or 500
            self.meter.record(operation_of(scope), started, str(code) if code >= 400 else None,
                              f"{scope.get('method', 'WEBSOCKET')} {scope.get('path', '')}")


def operation_of(scope: dict[str, Any]) -> str:
    named = scope.get(OPERATION)
    if named:
        return str(named)
    endpoint = scope.get("endpoint")
    name = getattr(endpoint, "__name__", None)
    return name if name else "unrouted"
