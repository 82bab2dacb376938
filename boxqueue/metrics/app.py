"""The metrics listener: ``GET /metrics`` (Prometheus text format), the dashboard at ``/`` with its
files, ``/api/snapshot`` (JSON), ``/api/events`` (server-sent events, one snapshot a second) and
the health checks ``/health``, ``/health/leader`` and ``/health/replica``.

Served through :func:`frontdoor.asgi_serving.serve_asgi`, the one HTTP stack of the facades, so
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

from boxqueue.frontdoor.asgi_serving import PLAIN, Listening, serve_asgi
from boxqueue.metrics.auth import BasicAuth
from boxqueue.metrics.collector import BoxqueueCollector, tube_families
from boxqueue.metrics.dashboard_data import PAGE_SIZE, Dashboard, lag_of, upstream_of
from boxqueue.metrics.observed import READY, Observed

log = logging.getLogger(__name__)

EVENT_INTERVAL_S = 1.0
# Load balancers and orchestrators probe these without credentials, as they probe Patroni's.
HEALTH_PATHS = frozenset({"/health", "/health/leader", "/health/replica"})
# HAProxy's ``option httpchk`` sends OPTIONS unless told otherwise; Patroni answers all three.
PROBE_METHODS = ["GET", "HEAD", "OPTIONS"]


def health(o: Observed) -> tuple[dict[str, Any], bool, bool]:
    """What ``/health`` says, and whether this node may take writes now (``/health/leader``) and
    whether it follows a leader now (``/health/replica``), in the manner of Patroni's endpoints.

    Neither holds until the server is ready: a starting leader still replays its log, a starting
    follower has not connected yet. A leader also needs its writes open: a follower elected
    leader keeps serving read-only for a moment while its leader incarnation starts, and a
    balancer must not send it writes then. A node outside a replica set is its own leader
    ("alone"). A follower counts as a replica only while its stream from the leader is up
    ("follow"), not while it connects or loads a snapshot; ``lag_records`` lets a check go
    further."""
    ready = o.state == READY
    writable = o.catalog is not None and o.catalog.writes.read_only_reason is None
    node = o.replica
    if node is None:
        lsn = o.storage.lsn if o.storage is not None else None
        body = {"role": "alone", "name": None, "term": None, "leader": None, "lsn": lsn,
                "lag_records": 0, "lag_s": 0.0, "state": o.state}
        return body, ready and writable, False
    info = node.info()
    election = info["election"]
    role = election["state"]
    up = upstream_of(info) if role == "follower" else None
    lag_records, lag_s = lag_of(role, up)
    body = {"role": role, "name": info["name"], "term": election["term"], "leader": election["leader_name"],
            "lsn": info["lsn"], "lag_records": lag_records, "lag_s": lag_s, "state": o.state}
    following = up is not None and up["status"] == "follow"
    return body, ready and writable and role == "leader", ready and following


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
            Route("/health", self.health, methods=PROBE_METHODS),
            Route("/health/leader", self.health_leader, methods=PROBE_METHODS),
            Route("/health/replica", self.health_replica, methods=PROBE_METHODS),
            Route("/api/snapshot", self.snapshot, methods=["GET"]),
            Route("/api/events", self.events, methods=["GET"]),
            Mount("/", StaticFiles(packages=[("boxqueue.metrics", "dashboard")], html=True)),
        ])
        if access is None:
            return app
        return BasicAuth(app, access, HEALTH_PATHS | ({"/metrics"} if public else set()))

    async def health(self, request: Request) -> Response:
        """Always 200 while the listener answers (a liveness check); the body says the rest."""
        return JSONResponse(health(self.observed)[0])

    async def health_leader(self, request: Request) -> Response:
        body, leader, _replica = health(self.observed)
        return JSONResponse(body, 200 if leader else 503)

    async def health_replica(self, request: Request) -> Response:
        body, _leader, replica = health(self.observed)
        return JSONResponse(body, 200 if replica else 503)

    async def metrics(self, request: Request) -> Response:
        """The figures are read on the event loop (the tubes a thousand at a time, with a yield
        between); the families are built and written in a worker thread (with 10,000 tubes that
        is most of the cost), so requests keep being served meanwhile."""
        fixed = list(self.collector.collect_fixed())
        rows, totals = await self.collector.read_tubes_paced()

        def write() -> bytes:
            families = fixed + list(tube_families(rows, totals)) + list(self.process.collect())
            return generate_latest(_Collected(families))

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
