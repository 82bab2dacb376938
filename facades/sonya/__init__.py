"""The Sonya facade: Sonya's HTTP long-poll and WebSocket API over the broadcast tubes."""

from __future__ import annotations

import h11
import trio

from facades.asgi_serving import PLAIN, Handler, Listening, serve_asgi
from facades.sonya.app import SonyaApi
from facades.sonya.longpolls import LongPolls
from facades.sonya.socket_listeners import WebSocketListeners
from facades.sonya.tokens import Tokens
from tubes.broadcast import Broadcast


async def serve_sonya(
    broadcast: Broadcast,
    host: str,
    port: int,
    shutdown: trio.Event,
    *,
    service_token: str | None = None,
    jwt_ttl_s: int = 60,
    longpoll_max_wait_s: float = 30.0,
    listening: Listening = PLAIN,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API on ``host:port`` until ``shutdown`` is set (end the broadcast's listeners
    first so open long-polls are answered); started() with the bound port."""
    tokens = Tokens(service_token, jwt_ttl_s)
    app = SonyaApi(broadcast, tokens, longpoll_max_wait_s).app()
    sockets = WebSocketListeners(broadcast, tokens)
    polls = LongPolls(broadcast, tokens, longpoll_max_wait_s, shutdown)

    def takeover(request: h11.Request) -> Handler | None:
        return sockets.takeover(request) or polls.takeover(request)

    await serve_asgi(app, host, port, shutdown, name="Sonya", takeover=takeover, listening=listening,
                     task_status=task_status)
