"""The metrics listener: ``GET /metrics`` (Prometheus text format), the dashboard at ``/`` with its
files, ``/api/snapshot`` (JSON) and ``/api/events`` (server-sent events, one snapshot a second).

Served through :func:`facades.asgi_serving.serve_asgi`, the one HTTP stack of the facades, so
whatever that stack gains (TLS, connection limits) this listener has too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST, ProcessCollector, generate_latest
from prometheus_client.core import Metric
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from facades.asgi_serving import PLAIN, Listening, serve_asgi
from metrics.auth import BasicAuth
from metrics.collector import BoxqueueCollector, tube_families
from metrics.dashboard_data import PAGE_SIZE, Dashboard
from metrics.observed import Observed

log = logging.getLogger(__name__)

EVENT_INTERVAL_S = 1.0


class _Collected:
    """Families already collected, in the shape ``generate_latest`` reads (a ``collect()``)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class MetricsApp:
    def __init__(self, observed: Observed, dashboard: Dashboard, stopping: trio.Event) -> None:
        self.observed = observed
        self.dashboard = dashboard
        self.stopping = stopping
        self.collector = BoxqueueCollector(observed)
        self.process = ProcessCollector(registry=None)  # CPU, memory, open files of this process
        self.limiter = trio.CapacityLimiter(1)  # one scrape written at a time; others queue

    def asgi(self, access: Any = None, public: bool = False) -> Any:
        app = Starlette(routes=[
            Route("/metrics", self.metrics, methods=["GET", "HEAD"]),
            Route("/api/snapshot", self.snapshot, methods=["GET"]),
            Route("/api/events", self.events, methods=["GET"]),
            Mount("/", StaticFiles(packages=[("metrics", "dashboard")], html=True)),
        ])
        if access is None:
            return app
        return BasicAuth(app, access, frozenset({"/metrics"}) if public else frozenset())

    async def metrics(self, request: Request) -> Response:
        """The figures are read on the event loop (the tubes a thousand at a time, with a yield
        between); the families are built and written in a worker thread (with 10,000 tubes that
        is most of the cost), so requests keep being served meanwhile."""
        fixed = list(self.collector.collect_fixed())
        rows, totals = await self.collector.read_tubes_paced()

        def write() -> bytes:
            families = fixed + list(tube_families(rows, totals)) + list(self.process.collect())
            return generate_latest(_Collected(families))  # type: ignore[arg-type]

        body = await trio.to_thread.run_sync(write, limiter=self.limiter)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    def _view(self, request: Request) -> dict[str, Any]:
        query = request.query_params

        def number(name: str, default: int) -> int:
            try:
                return int(query.get(name, default))
            except ValueError:
                return default

        return {"query": query.get("q", ""), "sort": query.get("sort", "name"),
                "page": number("page", 0), "size": number("size", PAGE_SIZE)}

    async def snapshot(self, request: Request) -> Response:
        return JSONResponse(self.dashboard.snapshot(**self._view(request), with_history=True))

    async def events(self, request: Request) -> Response:
        view = self._view(request)

        async def stream() -> AsyncIterator[str]:
            first = True
            while not self.stopping.is_set():
                data = self.dashboard.snapshot(**view, with_history=first)
                first = False
                yield f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
                with trio.move_on_after(EVENT_INTERVAL_S):
                    await self.stopping.wait()

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def serve_metrics(
    observed: Observed,
    host: str,
    port: int,
    shutdown: trio.Event,
    *,
    access: Any = None,
    public: bool = False,
    listening: Listening = PLAIN,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown``; started() with the bound port. ``access``: the users to check
    (HTTP basic); None serves everyone. ``listening``: TLS, connection limit, head timeout."""
    dashboard = Dashboard(observed)
    app = MetricsApp(observed, dashboard, shutdown)
    async with trio.open_nursery() as nursery:
        await nursery.start(dashboard.run)
        await serve_asgi(app.asgi(access, public), host, port, shutdown, name="metrics", graceful_s=2.0,
                         listening=listening, task_status=task_status)
        nursery.cancel_scope.cancel()
