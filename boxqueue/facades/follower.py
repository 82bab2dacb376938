"""The HTTP and gRPC facades of a follower: every call is sent to the leader.

A follower holds the leader's data but its tube engine waits on standby (it is rebuilt from
LMDB when the node is promoted), so its Zaqar, Sonya and Deckard listeners answer as services do
behind a load balancer whose backend is not the primary: Zaqar and Sonya with ``503 Service
Unavailable``, ``Retry-After: 1`` and ``X-Boxqueue-Leader`` naming the leader's URL for this
facade (when one is elected), Deckard with ``UNAVAILABLE`` and the leader's address in the
``boxqueue-leader`` trailing metadata; its health service says NOT_SERVING. Every request is
answered this way, reads too: the queues' state lives in the leader's engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from boxqueue.frontdoor.asgi_serving import answer_lifespan
from boxqueue.frontdoor.grpc_connections import Call, GrpcError, Method, Status

LEADER_HEADER = "x-boxqueue-leader"
LEADER_METADATA = "boxqueue-leader"

LeaderUrl = Callable[[], str | None]


def unavailable_app(leader_url: LeaderUrl, api: str) -> Any:
    """An ASGI app answering everything with 503 (Zaqar's JSON error document, or Sonya's plain
    text), naming the leader."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013})  # try again later
            return
        leader = leader_url()
        where = f"the leader is {leader}" if leader else "no leader is elected yet"
        if api == "zaqar":
            body = json.dumps({"title": "Service Unavailable",
                               "description": f"This node is a follower of its replica set: {where}."}).encode()
            kind = b"application/json; charset=UTF-8"
        else:
            body = f"This node is a follower of its replica set: {where}.\n".encode()
            kind = b"text/plain; charset=utf-8"
        headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode()), (b"retry-after", b"1")]
        if leader:
            headers.append((LEADER_HEADER.encode(), leader.encode()))
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def unavailable_methods(paths: Iterable[str], leader_url: LeaderUrl) -> dict[str, Method]:
    """Every method in ``paths`` answers UNAVAILABLE, naming the leader."""

    async def refuse(_request: bytes, call: Call) -> bytes:
        leader = leader_url()
        where = f"the leader is {leader}" if leader else "no leader is elected yet"
        trailing = ((LEADER_METADATA, leader),) if leader else ()
        raise GrpcError(Status.UNAVAILABLE, f"this node is a follower of its replica set: {where}", trailing)

    method = Method(unary=refuse)
    return dict.fromkeys(paths, method)
