"""The Zaqar facade: OpenStack Zaqar's v1.1 REST API over the engine's Zaqar spaces."""

from __future__ import annotations

import trio

from facades.asgi_serving import PLAIN, Listening, serve_asgi
from facades.zaqar.app import ZaqarApp
from facades.zaqar.auth import TokenAuth
from facades.zaqar.queues import ZaqarQueues
from facades.zaqar.responses import Limits

__all__ = ["Limits", "TokenAuth", "ZaqarApp", "serve_zaqar"]


async def serve_zaqar(
    queues: ZaqarQueues,
    host: str,
    port: int,
    shutdown: trio.Event,
    *,
    limits: Limits | None = None,
    default_project: str | None = None,
    auth: TokenAuth | None = None,
    listening: Listening = PLAIN,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API on ``host:port`` until ``shutdown``; started() with the bound port."""
    app = ZaqarApp(queues, limits, default_project, auth)
    await serve_asgi(app.asgi, host, port, shutdown, name="Zaqar", listening=listening, task_status=task_status)
