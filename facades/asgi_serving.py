"""Serve an ASGI application inside the server's own trio process (hypercorn's trio worker).

One HTTP stack for every HTTP facade: :func:`serve_asgi` binds the address, reports the bound
port through ``task_status`` (so port 0 works) and serves until ``shutdown`` is set; then it stops
accepting and gives the open requests ``graceful_s`` to finish before cancelling them. The caller
makes its long-lived requests finish first (the Sonya facade ends its listeners), so a graceful
stop answers them instead of cutting them off. A busy port raises OSError at start, like the
iproto listener.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

log = logging.getLogger(__name__)


def hypercorn_config(host: str, port: int, graceful_s: float) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.graceful_timeout = graceful_s
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 75
    config.backlog = 1024
    return config


async def serve_asgi(
    app: Any,
    host: str,
    port: int,
    shutdown: trio.Event,
    *,
    name: str = "HTTP",
    graceful_s: float = 5.0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until ``shutdown`` is set; started() with the bound port."""
    config = hypercorn_config(host, port, graceful_s)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(app, config, shutdown_trigger=shutdown.wait, task_status=task_status)
        )
        bound = int(binds[0].rsplit(":", 1)[1])
        log.info("%s listening on %s:%d", name, host, bound)
        task_status.started(bound)
