"""The Zaqar facade: OpenStack Zaqar's v1.1 REST API over the engine's Zaqar spaces."""

from __future__ import annotations

import trio

from boxqueue.facades.zaqar.app import ZaqarApp
from boxqueue.facades.zaqar.auth import TokenAuth
from boxqueue.facades.zaqar.queues import ZaqarQueues
from boxqueue.facades.zaqar.responses import Limits
from boxqueue.frontdoor.asgi_serving import PLAIN, Listening, serve_asgi
from boxqueue.frontdoor.http_meter import MeteredApp
from boxqueue.measures import RequestMeter

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
    meter: RequestMeter | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API on ``host:port`` until ``shutdown``; started() with the bound port. With a
    ``meter``, every request is counted in it (by handler name, status and time)."""
    app = ZaqarApp(queues, limits, default_project, auth)
    served = app.asgi if meter is None else MeteredApp(app.asgi, meter)
    await serve_asgi(served, host, port, shutdown, name="Zaqar", listening=listening, http1=True,
                     task_status=task_status)
