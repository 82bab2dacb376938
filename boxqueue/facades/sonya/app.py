"""The Sonya HTTP/WebSocket API (spec section 2, decisions S1-S11) as a Starlette application.

Translation only: every queue operation is a call on :class:`tubes.broadcast.Broadcast`, and the
statuses are mapped here. Success bodies are JSON; errors other than auth failures are plain text
as in Sonya; auth failures are 401/403 with a JSON body (S6); a wrong method is 405.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from boxqueue.facades.sonya.inputs import (
    MAX_BODY_BYTES,
    BadInput,
    check_content_type,
    parse_send,
    parse_sequence,
)
from boxqueue.facades.sonya.tokens import Denied, Tokens, bearer
from boxqueue.tubes.broadcast import (
    CLOSED,
    DELETED,
    FAILED,
    OVERFLOW,
    SHUTDOWN,
    Broadcast,
    Subscription,
)
from boxqueue.tubes.sequences import Message

log = logging.getLogger(__name__)

# WebSocket close codes by the reason a listener ended (S7).
CLOSE_CODES = {CLOSED: 1000, DELETED: 1000, OVERFLOW: 1008, SHUTDOWN: 1001, FAILED: 1011}
# A socket whose client stops reading holds a send this long before it is dropped.
SEND_TIMEOUT_S = 30.0
# How much of an oversized body is read and dropped before the 413 is sent.
DRAIN_BYTES = 4 * MAX_BODY_BYTES


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status, media_type="application/json")


def messages_response(items: list[Message]) -> Response:
    return Response("[" + ",".join(m.json for m in items) + "]", 200, media_type="application/json")


def denied_response(exc: Denied) -> Response:
    return JSONResponse({"error": exc.message}, exc.status)


def not_found_response() -> Response:
    return PlainTextResponse("Queue Not Found", 404)


class SonyaApi:
    """The endpoints over one broadcast engine."""

    def __init__(self, broadcast: Broadcast, tokens: Tokens, longpoll_max_wait_s: float) -> None:
        self.broadcast = broadcast
        self.tokens = tokens
        self.max_wait = longpoll_max_wait_s if longpoll_max_wait_s > 0 else math.inf

    def app(self) -> Starlette:
        q = "/queue"
        routes = [
            Route(q + "/create/{queue}", self.create, methods=["POST"]),
            Route(q + "/close/{queue}", self.close, methods=["POST"]),
            Route(q + "/send/{queue}", self.send, methods=["POST"]),
            Route(q + "/delete/{queue}/{id}", self.delete, methods=["POST"]),
            Route(q + "/listen/longpoll/{queue}", self.longpoll, methods=["GET"]),
            Route(q + "/listen/longpoll/{queue}/{id}", self.longpoll, methods=["GET"]),
            WebSocketRoute(q + "/listen/ws/{queue}", self.websocket),
            WebSocketRoute(q + "/listen/ws/{queue}/{id}", self.websocket),
            Route(q + "/listen/ws/{queue}", self.websocket_without_upgrade, methods=None),
            Route(q + "/listen/ws/{queue}/{id}", self.websocket_without_upgrade, methods=None),
        ]
        if self.tokens.secure:
            routes.append(Route(q + "/generate_jwt/{queue}/{id}", self.generate_jwt, methods=["POST"]))
        app = Starlette(routes=routes)
        app.router.redirect_slashes = False  # Sonya: /queue/create/x/ is simply not a route
        return app

    # -- auth --------------------------------------------------------------------------------

    def _authorize(self, conn: Request | WebSocket) -> None:
        token = bearer(conn.headers, conn.query_params)
        self.tokens.check_listen(token, conn.path_params["queue"], conn.path_params.get("id"))

    # -- management --------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        try:
            self._authorize(request)
        except Denied as exc:
            return denied_response(exc)
        try:
            await self.broadcast.create(request.path_params["queue"])
        except Exception:
            log.exception("create failed")
            return PlainTextResponse("Queue was not created", 500)
        return _json({"success": True}, 201)

    async def close(self, request: Request) -> Response:
        try:
            self._authorize(request)
        except Denied as exc:
            return denied_response(exc)
        try:
            existed = await self.broadcast.close(request.path_params["queue"])
        except Exception:
            log.exception("close failed")
            return PlainTextResponse("Queue was not closed", 500)
        return _json({"success": existed})

    async def delete(self, request: Request) -> Response:
        try:
            self.tokens.check_service(bearer(request.headers, request.query_params))
        except Denied as exc:
            return denied_response(exc)
        try:
            existed = await self.broadcast.delete(request.path_params["queue"], request.path_params["id"])
        except Exception:
            log.exception("delete failed")
            return PlainTextResponse("Queue was not deleted", 500)
        return _json({"success": existed})

    async def send(self, request: Request) -> Response:
        try:
            self._authorize(request)
            check_content_type(request.headers.get("content-type"))
            body = parse_send(await _read_body(request))
        except Denied as exc:
            return denied_response(exc)
        except BadInput as exc:
            return PlainTextResponse(exc.text, exc.status)
        try:
            seq = await self.broadcast.send(request.path_params["queue"], body.id, body.payload_json, body.sequence)
        except Exception:
            log.exception("send failed")
            return PlainTextResponse("Message was not sent", 500)
        if seq is None:
            return _json({"success": False})
        return _json({"success": True, "sequence_id": seq})

    async def generate_jwt(self, request: Request) -> Response:
        try:
            self.tokens.check_service(bearer(request.headers, request.query_params))
        except Denied as exc:
            return denied_response(exc)
        token, expiration = self.tokens.mint(request.path_params["queue"], request.path_params["id"])
        return _json({"token": token, "expiration": expiration})

    # -- listening ---------------------------------------------------------------------------

    def _subscribe(self, conn: Request | WebSocket) -> tuple[list[Message], Subscription] | None:
        start = parse_sequence(conn.query_params.getlist("sequence"))
        return self.broadcast.subscribe(conn.path_params["queue"], conn.path_params.get("id"), start)

    async def longpoll(self, request: Request) -> Response:
        """Stored versions at once if the preload has any, else the next live message; ``[]``
        when the wait limit passes or the queue or id goes away (spec 3.7, S4)."""
        try:
            self._authorize(request)
        except Denied as exc:
            return denied_response(exc)
        got = self._subscribe(request)
        if got is None:
            return not_found_response()
        preload, sub = got
        with sub:
            if preload:
                return messages_response(preload)
            received: list[Message] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_disconnect, request, nursery.cancel_scope)
                with trio.move_on_after(self.max_wait):
                    item = await sub.next()
                    if item is not None:
                        received.append(item)
                nursery.cancel_scope.cancel()
        return messages_response(received)

    async def websocket(self, ws: WebSocket) -> None:
        """Preload then live messages, one text frame each; closed 1000 when the queue or id goes
        away, 1008 when this listener overflows, 1001 on shutdown (spec 3.8, S7)."""
        try:
            self._authorize(ws)
        except Denied as exc:
            await ws.send_denial_response(denied_response(exc))
            return
        got = self._subscribe(ws)
        if got is None:
            await ws.send_denial_response(not_found_response())
            return
        preload, sub = got
        with sub:
            await ws.accept()
            code: int | None = None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_client, ws, nursery.cancel_scope)
                code = await _pump(ws, preload, sub)
                nursery.cancel_scope.cancel()
            if code is not None:
                with trio.move_on_after(SEND_TIMEOUT_S):
                    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                        await ws.close(code)

    async def websocket_without_upgrade(self, request: Request) -> Response:
        """A listen/ws path reached without a WebSocket handshake (spec 2.3 E7)."""
        try:
            self._authorize(request)
        except Denied as exc:
            return denied_response(exc)
        if request.path_params["queue"] not in self.broadcast.queues:
            return not_found_response()
        if request.method != "GET":
            return PlainTextResponse("Method Not Allowed", 405, headers={"Allow": "GET"})
        return PlainTextResponse("WebSocket upgrade expected", 400)


async def _read_body(request: Request) -> bytes:
    """The body, or 413 once it passes the limit. The excess is read and dropped (up to
    ``DRAIN_BYTES``) before answering, so a client still uploading gets the 413 rather than a
    reset connection; memory holds at most the limit."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            chunks.clear()
            if size > DRAIN_BYTES:
                break
            continue
        chunks.append(chunk)
    if size > MAX_BODY_BYTES:
        raise BadInput(413, "Payload too large")
    return b"".join(chunks)


async def _cancel_on_disconnect(request: Request, scope: trio.CancelScope) -> None:
    """A long-poll whose client left stops waiting (and lets go of its subscription)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _watch_client(ws: WebSocket, scope: trio.CancelScope) -> None:
    """Read what the client sends (pings are answered by the server; data is ignored) until it
    closes or goes away, then stop the sender."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            scope.cancel()
            return


async def _pump(ws: WebSocket, preload: list[Message], sub: Subscription) -> int | None:
    """Send the preload, then live messages; the close code to send, or None if the client is
    gone or stopped reading."""
    try:
        for item in preload:
            with trio.move_on_after(SEND_TIMEOUT_S) as timer:
                await ws.send_text(item.json)
            if timer.cancelled_caught:
                return None
        while True:
            live = await sub.next()
            if live is None:
                return CLOSE_CODES.get(sub.ended or CLOSED, 1000)
            with trio.move_on_after(SEND_TIMEOUT_S) as timer:
                await ws.send_text(live.json)
            if timer.cancelled_caught:
                return None
    except (WebSocketDisconnect, RuntimeError, OSError):
        return None
