"""The Sonya facade: Sonya's HTTP long-poll and WebSocket API over the broadcast tubes."""

from __future__ import annotations

import h11
import trio

from boxqueue.facades.sonya.app import SonyaApi
from boxqueue.facades.sonya.longpolls import LongPolls
from boxqueue.facades.sonya.socket_listeners import WebSocketListeners
from boxqueue.facades.sonya.tokens import Tokens
from boxqueue.frontdoor.asgi_serving import PLAIN, Handler, Listening, serve_asgi
from boxqueue.frontdoor.http_meter import ASGIApp, MeteredApp
from boxqueue.measures import RequestMeter
from boxqueue.tubes.broadcast import Broadcast


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
    meter: RequestMeter | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API on ``host:port`` until ``shutdown`` is set (end the broadcast's listeners
    first so open long-polls are answered); started() with the bound port. With a ``meter``,
    every request is counted in it (by endpoint, status and time)."""
    tokens = Tokens(service_token, jwt_ttl_s)
    app: ASGIApp = SonyaApi(broadcast, tokens, longpoll_max_wait_s).app()
    if meter is not None:
        app = MeteredApp(app, meter)
    sockets = WebSocketListeners(broadcast, tokens, meter)
    polls = LongPolls(broadcast, tokens, longpoll_max_wait_s, shutdown, meter, listening.keep_alive_timeout_s)

    def takeover(request: h11.Request) -> Handler | None:
        return sockets.takeover(request) or polls.takeover(request)

    await serve_asgi(app, host, port, shutdown, name="Sonya", takeover=takeover, listening=listening,
                     task_status=task_status)
