"""The dashboard's figures as JSON: totals per API, storage, recent errors, a page of tubes, the
replica set as this node sees it, and a short history of totals for the plots (one sample a
second, kept for ten minutes)."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import trio

from boxqueue.metrics.collector import REQUEST_NAMES, lmdb_figures
from boxqueue.metrics.observed import APIS, Observed
from boxqueue.metrics.tube_rows import Entry, oldest_ready_created, row_of, tube_entries
from boxqueue.tubes.task import READY
from boxqueue.tubes.tube import TALLIES, Tube

log = logging.getLogger(__name__)

HISTORY_S = 600
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
SORTS = ("name", "depth", "ready", "oldest")


def api_totals(o: Observed) -> dict[str, dict[str, Any]]:
    """Per API: connections open, requests and errors so far, latency sum and count."""
    out: dict[str, dict[str, Any]] = {}
    stats, iproto = o.stats, o.iproto
    if stats is not None and iproto is not None:
        latency = iproto.latency
        open_connections = list(iproto.connections)
        out["iproto"] = {
            "connections": len(open_connections), "accepted": iproto.accepted,
            "in_progress": sum(c.outbox.inflight for c in open_connections),
            "requests": sum(stats.by_type), "errors": stats.errors,
            "latency_sum": latency.sum if latency is not None else 0.0,
            "latency_count": latency.count if latency is not None else 0,
        }
    for api in APIS:
        meter = o.meters.get(api)
        if meter is None:
            continue
        with meter._lock:
            out[api] = {
                "connections": meter.open if api == "console" else None,
                "accepted": meter.accepted if api == "console" else None,
                "in_progress": meter.in_progress,
                "requests": sum(meter.requests.values()), "errors": sum(meter.errors.values()),
                "latency_sum": meter.latency.sum, "latency_count": meter.latency.count,
            }
    return out


def task_totals(o: Observed) -> dict[str, int]:
    totals = dict.fromkeys(TALLIES, 0)
    if o.engine is not None:
        for tally in list(o.engine.tallies.values()):
            for name, n in zip(TALLIES, tally, strict=True):
                totals[name] += n
    return totals


def recent_errors(o: Observed, limit: int = 20) -> list[dict[str, Any]]:
    found: list[tuple[float, str, str, str, str]] = []
    if o.stats is not None:
        for at, rtype, code, message in list(o.stats.recent_errors):
            found.append((at, "iproto", REQUEST_NAMES.get(rtype, "undecoded"), str(code), message))
    for meter in list(o.meters.values()):
        with meter._lock:
            found.extend((e.at, e.api, e.operation, e.code, e.message) for e in meter.recent)
    found.sort(key=lambda e: e[0], reverse=True)
    return [{"at": at, "api": api, "operation": op, "code": code, "message": message[:300]}
            for at, api, op, code, message in found[:limit]]


def storage_figures(o: Observed) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if o.storage is not None:
        out.update(lmdb_figures(o.storage))
        out["wal_mode"] = o.storage.wal_mode
    committer = o.committer
    if committer is not None:
        out.update(commits=committer.batches, writes=committer.writes,
                   commit_seconds=committer.commit_seconds.sum)
    engine = o.engine
    if engine is not None:
        progress = engine.recovery
        out["recovery"] = {"state": progress.state, "total": progress.total, "loaded": progress.loaded,
                           "fraction": progress.fraction(), "seconds_left": progress.seconds_left(),
                           "seconds": progress.seconds}
    plugged = {}  # shown under its label
    for name, (_doc, read) in list(o.gauges.gauges.items()) + list(o.gauges.counters.items()):
        try:
            plugged[o.gauges.labels.get(name, name)] = float(read())
        except Exception:  # a plugged figure that fails is left out, not the page
            continue
    out["plugged"] = plugged
    return out


def other_figures(o: Observed) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if o.lua is not None:
        usage = o.lua.usage
        out["lua"] = {"jobs": usage.jobs + o.lua.quick_jobs, "failed": usage.failed, "seconds": usage.seconds,
                      "time_limit_hits": usage.time_limit_hits, "memory_limit_hits": usage.memory_limit_hits,
                      "memory": o.lua.memory_used()}
    if o.broadcast is not None:
        b = o.broadcast
        out["sonya"] = {"queues": len(b.queues), "listeners": b.listener_count(), "messages": b.fanned_out,
                        "deliveries": b.deliveries, "closed_for_lag": b.ended.get("overflow", 0)}
    return out


def upstream_of(info: dict[str, Any]) -> dict[str, Any] | None:
    """A follower's stream from its leader (``upstream`` of the leader's entry in
    ``box.info.replication``), None on a leader or before a follower has a leader."""
    return next((e["upstream"] for e in info["replication"].values() if "upstream" in e), None)


def lag_of(role: str, stream: dict[str, Any] | None) -> tuple[int | None, float | None]:
    """(records, seconds) a member is behind the leader: none for the leader, its stream's lag
    for a member with one, unknown otherwise."""
    if role == "leader":
        return 0, 0.0
    if stream is not None:
        return stream["lag_records"], stream["lag"]
    return None, None


def replica_figures(o: Observed) -> dict[str, Any] | None:
    """This node's election and every peer as this node sees it; None outside a replica set.

    A peer's role is what this node can vouch for: the leader it follows or leads as, and, on the
    leader, the followers whose stream is up; any other peer is "unknown" (a follower does not
    see the other followers). A peer's lag is how far it is behind the leader, known on the
    leader for every follower with a stream and on a follower for itself."""
    node = o.replica
    if node is None:
        return None
    info = node.info()
    election = info["election"]
    me, state, term, leader = info["name"], election["state"], election["term"], election["leader_name"]
    up = upstream_of(info)
    peers = []
    for rid, entry in sorted(info["replication"].items()):
        name = entry["name"]
        stream = up if name == me and state != "leader" else entry.get("downstream")
        if name == me:
            role = state if state in ("leader", "follower") else "unknown"
        elif name == leader:
            role = "leader"
        elif state == "leader" and stream is not None and stream["status"] == "follow":
            role = "follower"
        else:
            role = "unknown"
        lag_records, lag_s = lag_of(role, stream)
        peers.append({"id": rid, "name": name, "self": name == me, "role": role,
                      "term": None if role == "unknown" else term,
                      # box.info says 0 for a peer this node has no stream with: not known here
                      "lsn": entry["lsn"] if name == me or "upstream" in entry or "downstream" in entry else None,
                      "status": stream["status"] if stream is not None else None,
                      "message": stream.get("message") if stream is not None else None,
                      "lag_records": lag_records, "lag_s": lag_s})
    return {"id": info["id"], "name": me, "state": state, "term": term, "leader": leader,
            "ro": info["ro"], "lsn": info["lsn"], "quorum": info["synchro"]["quorum"],
            "queue_len": info["synchro"]["queue"]["len"], "peers": peers}


def select_tubes(entries: list[Entry], query: str, sort: str, page: int, size: int) -> tuple[int, list[Entry]]:
    """The tubes whose ``space/tube`` contains ``query`` (any case), sorted, one page of them.
    Only the "oldest" order reads more than a tube's counts."""
    if query:
        needle = query.lower()
        entries = [e for e in entries if needle in f"{e[0]}/{e[1]}".lower()]
    if sort == "depth":
        entries.sort(key=lambda e: (-sum(e[2].counts.values()), e[0], e[1]))
    elif sort == "ready":
        entries.sort(key=lambda e: (-e[2].counts[READY], e[0], e[1]))
    elif sort == "oldest":
        entries.sort(key=lambda e: (_created_or_never(e[2]), e[0], e[1]))
    else:
        entries.sort(key=lambda e: (e[0], e[1]))
    start = page * size
    return len(entries), entries[start:start + size]


def _created_or_never(tube: Tube) -> float:
    created = oldest_ready_created(tube)
    return float("inf") if created is None else created


class Dashboard:
    """Builds the page's snapshots and keeps the history of totals its plots show."""

    def __init__(self, observed: Observed) -> None:
        self.observed = observed
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_S)

    def sample(self) -> dict[str, Any]:
        o = self.observed
        apis = api_totals(o)
        point = {"t": time.time(), "tasks": task_totals(o),
                 "requests": {api: t["requests"] for api, t in apis.items()},
                 "errors": {api: t["errors"] for api, t in apis.items()}}
        self.history.append(point)
        return point

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """One history sample a second, until cancelled. A failing sample is logged and skipped:
        what only draws the plots must never stop the server."""
        task_status.started()
        failures = 0
        while True:
            try:
                self.sample()
            except Exception:
                failures += 1
                if failures <= 3:
                    log.exception("the dashboard's history sample failed")
            await trio.sleep(1)

    def snapshot(self, *, query: str = "", sort: str = "name", page: int = 0, size: int = PAGE_SIZE,
                 with_history: bool = False) -> dict[str, Any]:
        o = self.observed
        entries = tube_entries(o.engine, o.catalog) if o.engine is not None and o.catalog is not None else []
        all_tubes = len(entries)
        size = min(max(size, 1), MAX_PAGE_SIZE)
        matching, page_entries = select_tubes(entries, query, sort if sort in SORTS else "name", max(page, 0), size)
        now_us = time.time_ns() // 1000
        shown = [row_of(entry, now_us) for entry in page_entries]
        out: dict[str, Any] = {
            "t": time.time(),
            "state": o.state,
            "uptime": time.time() - o.started,
            "apis": api_totals(o),
            "tasks": task_totals(o),
            "storage": storage_figures(o),
            "errors": recent_errors(o),
            "tubes": {"all": all_tubes, "matching": matching, "page": max(page, 0), "size": size,
                      "rows": [r.as_json() for r in shown]},
            "replica": replica_figures(o),
            **other_figures(o),
        }
        if with_history:
            out["history"] = list(self.history)
        return out
