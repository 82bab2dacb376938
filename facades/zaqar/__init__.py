"""The Zaqar facade: OpenStack Zaqar's v1.1 REST API over the engine's Zaqar spaces."""

from __future__ import annotations

import trio

from facades.asgi_serving import serve_asgi
from facades.zaqar.app import ZaqarApp
from facades.zaqar.queues import ZaqarQueues
from facades.zaqar.responses import Limits

__all__ = ["Limits", "ZaqarApp", "serve_zaqar"]


async def serve_zaqar(
    queues: ZaqarQueues,
    host: str,
    port: int,
    shutdown: trio.Event,
    *,
    limits: Limits | None = None,
    default_project: str | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API on ``host:port`` until ``shutdown``; started() with the bound port."""
    app = ZaqarApp(queues, limits, default_project)
    await serve_asgi(app.asgi, host, port, shutdown, name="Zaqar", task_status=task_status)
