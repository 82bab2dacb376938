"""The Sonya facade: Sonya's HTTP long-poll and WebSocket API over the broadcast tubes."""

from __future__ import annotations

import trio

from facades.asgi_serving import serve_asgi
from facades.sonya.app import SonyaApi
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
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API on ``host:port`` until ``shutdown`` is set (end the broadcast's listeners
    first so open long-polls are answered); started() with the bound port."""
    app = SonyaApi(broadcast, Tokens(service_token, jwt_ttl_s), longpoll_max_wait_s).app()
    await serve_asgi(app, host, port, shutdown, name="Sonya", task_status=task_status)
