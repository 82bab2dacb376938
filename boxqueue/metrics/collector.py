"""The Prometheus collector: every series is read from plain counters when scraped.

Series are named as ``tarantool/metrics`` names them where it has one (``tnt_net_*``,
``tnt_stats_op_total``, ``tnt_space_len``, ``tnt_info_uptime``, ``tnt_info_memory_lua``), and in
the same style (``boxqueue_*``) elsewhere. Families are built by ``prometheus_client``'s metric
family classes and written by its exposition code; nothing here formats text.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from boxqueue.measures import Histogram
from boxqueue.metrics.observed import APIS, READY, RECOVERING, STARTING, STOPPING, Observed
from boxqueue.metrics.tube_rows import STATES, TubeRow, tube_rows, tube_rows_paced
from boxqueue.replication.node import ELECTION_STATES
from boxqueue.tubes.tube import TALLIES

# Request types by name, as box.stat() and tnt_stats_op_total show them; PING, ID and the others
# appear under their own names in boxqueue_api_requests_total.
REQUEST_NAMES = {
    0: "ok", 1: "select", 2: "insert", 3: "replace", 4: "update", 5: "delete", 6: "call_16", 7: "auth",
    8: "eval", 9: "upsert", 10: "call", 11: "execute", 12: "nop", 13: "prepare", 14: "begin", 15: "commit",
    16: "rollback", 64: "ping", 73: "id",
}
STATE_NAMES = (STARTING, RECOVERING, READY, STOPPING)


def histogram_family(name: str, documentation: str, labels: list[str],
                     rows: Iterable[tuple[list[str], Histogram]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for values, histogram in rows:
        buckets = [(_bound(le), n) for le, n in histogram.cumulative()]
        family.add_metric(values, buckets, sum_value=histogram.sum)
    return family


def _bound(le: float) -> str:
    return "+Inf" if le == float("inf") else repr(float(le))


class BoxqueueCollector(Collector):
    def __init__(self, observed: Observed) -> None:
        self.observed = observed

    def collect(self) -> Iterator[Metric]:
        yield from self.collect_fixed()
        yield from tube_families(*self.read_tubes())

    def collect_fixed(self) -> Iterator[Metric]:
        """Every family except the per-tube ones: a few hundred samples whatever the load."""
        o = self.observed
        yield from self._state(o)
        yield from self._apis(o)
        yield from self._storage(o)
        yield from self._lua(o)
        yield from self._sonya(o)
        yield from self._plugged(o)
        yield from replication_families(o)

    def read_totals(self) -> list[tuple[str, list[int]]]:
        o = self.observed
        if o.engine is None or o.catalog is None:
            return []
        totals = []
        for sid, tally in sorted(o.engine.tallies.items()):
            space = o.catalog.spaces.get(sid)
            totals.append((space.name if space is not None else str(sid), list(tally)))
        return totals

    def read_tubes(self) -> tuple[list[TubeRow], list[tuple[str, list[int]]]]:
        """The tubes' figures, copied; :func:`tube_families` turns them into families anywhere,
        a worker thread included (with 10,000 tubes that is most of a scrape)."""
        o = self.observed
        if o.engine is None or o.catalog is None:
            return [], []
        return tube_rows(o.engine, o.catalog), self.read_totals()

    async def read_tubes_paced(self) -> tuple[list[TubeRow], list[tuple[str, list[int]]]]:
        """:meth:`read_tubes`, yielding to the event loop every thousand tubes."""
        o = self.observed
        if o.engine is None or o.catalog is None:
            return [], []
        return await tube_rows_paced(o.engine, o.catalog), self.read_totals()

    # -- the process -----------------------------------------------------------------------

    def _state(self, o: Observed) -> Iterator[Metric]:
        uptime = GaugeMetricFamily("tnt_info_uptime", "Seconds since the server started")
        uptime.add_metric([], time.time() - o.started)
        yield uptime
        state = GaugeMetricFamily("boxqueue_state", "1 for the state the server is in", labels=["state"])
        for name in STATE_NAMES:
            state.add_metric([name], 1.0 if o.state == name else 0.0)
        yield state
        yield GaugeMetricFamily("boxqueue_recovering", "1 until the engine has rebuilt every tube from LMDB",
                                value=1.0 if o.recovering else 0.0)
        engine = o.engine
        if engine is not None:
            progress = engine.recovery
            yield GaugeMetricFamily("boxqueue_recovery_tasks", "Tasks the start-up recovery loads",
                                    value=progress.total)
            yield GaugeMetricFamily("boxqueue_recovery_loaded_tasks", "Tasks the start-up recovery has loaded",
                                    value=progress.loaded)
            if progress.seconds is not None:
                yield GaugeMetricFamily("boxqueue_recovery_seconds", "How long the start-up recovery took",
                                        value=progress.seconds)

    # -- the APIs --------------------------------------------------------------------------

    def _apis(self, o: Observed) -> Iterator[Metric]:
        requests = CounterMetricFamily("boxqueue_api_requests", "Requests by API, operation and outcome",
                                       labels=["api", "operation", "outcome"])
        errors = CounterMetricFamily("boxqueue_api_errors", "Requests answered with an error, by API and code "
                                     "(iproto: Tarantool's error code; HTTP: the status; gRPC: the status name)",
                                     labels=["api", "code"])
        connections = GaugeMetricFamily("boxqueue_api_connections_current", "Connections (sessions) open now, "
                                        "for the APIs with connections of their own (iproto, console)",
                                        labels=["api"])
        accepted = CounterMetricFamily("boxqueue_api_connections", "Connections accepted since start",
                                       labels=["api"])
        in_progress = GaugeMetricFamily("boxqueue_api_requests_in_progress", "Requests begun and not answered yet "
                                        "(Sonya: long-polls waiting; a WebSocket listener counts until its "
                                        "handshake is answered)", labels=["api"])
        unexpected = CounterMetricFamily("boxqueue_unexpected_errors", "Exceptions that reached a client as an "
                                         "error without being an error of its protocol (bugs: each is logged "
                                         "with its traceback, at most ten a minute)", labels=["api"])
        latencies: list[tuple[list[str], Histogram]] = []
        stats, iproto = o.stats, o.iproto
        if stats is not None:
            unexpected.add_metric(["iproto"], stats.unexpected)
            by_type = stats.by_type
            failed = stats.errors_by_type
            for rtype, count in enumerate(by_type):
                if count:
                    name = REQUEST_NAMES.get(rtype, f"type_{rtype}")
                    bad = failed[rtype]
                    if count - bad:
                        requests.add_metric(["iproto", name, "ok"], count - bad)
                    if bad:
                        requests.add_metric(["iproto", name, "error"], bad)
            if failed[256]:
                requests.add_metric(["iproto", "undecoded", "error"], failed[256])
            for code, count in sorted(stats.errors_by_code.items()):
                errors.add_metric(["iproto", str(code)], count)
            yield from self._tarantool_stats(stats, iproto)
        if iproto is not None:
            open_connections = list(iproto.connections)
            connections.add_metric(["iproto"], len(open_connections))
            accepted.add_metric(["iproto"], iproto.accepted)
            in_progress.add_metric(["iproto"], sum(c.outbox.inflight for c in open_connections))
            if iproto.latency is not None:
                latencies.append((["iproto"], iproto.latency))
        for api in APIS:
            meter = o.meters.get(api)
            if meter is None:
                continue
            with meter._lock:
                rows = list(meter.requests.items())
                codes = list(meter.errors.items())
                latency = Histogram(meter.latency.bounds)
                latency.counts, latency.sum = list(meter.latency.counts), meter.latency.sum
                open_now, opened, running = meter.open, meter.accepted, meter.in_progress
            for (operation, outcome), count in sorted(rows):
                requests.add_metric([api, operation, outcome], count)
            for code, count in sorted(codes):
                errors.add_metric([api, code], count)
            if api == "console":
                connections.add_metric([api], open_now)
                accepted.add_metric([api], opened)
            in_progress.add_metric([api], running)
            latencies.append(([api], latency))
        yield requests
        yield errors
        yield unexpected
        yield connections
        yield accepted
        yield in_progress
        yield histogram_family(
            "boxqueue_api_request_duration_seconds",
            "Time from a request's arrival to its answer (iproto: per chunk of pipelined requests)",
            ["api"], latencies,
        )

    def _tarantool_stats(self, stats: Any, iproto: Any) -> Iterator[Metric]:
        yield CounterMetricFamily("tnt_net_requests", "Requests processed over iproto",
                                  value=sum(stats.by_type))
        if iproto is not None:
            yield CounterMetricFamily("tnt_net_connections", "iproto connections accepted", value=iproto.accepted)
            yield GaugeMetricFamily("tnt_net_connections_current", "iproto connections open now",
                                    value=len(iproto.connections))
        ops = CounterMetricFamily("tnt_stats_op", "Requests by type, as box.stat() counts them (iproto and Lua)",
                                  labels=["operation"])
        for name, total in stats.totals().items():
            ops.add_metric([name.lower()], total)
        yield ops

    # -- storage ---------------------------------------------------------------------------

    def _storage(self, o: Observed) -> Iterator[Metric]:
        committer, storage, catalog = o.committer, o.storage, o.catalog
        if committer is not None:
            yield CounterMetricFamily("boxqueue_commits", "Group commits (LMDB transactions)",
                                      value=committer.batches)
            yield CounterMetricFamily("boxqueue_commit_writes", "Writes committed", value=committer.writes)
            yield histogram_family("boxqueue_commit_batch_size", "Writes per group commit", [],
                                   [([], committer.batch_sizes)])
            yield histogram_family("boxqueue_commit_duration_seconds",
                                   "Time to apply and flush one group commit", [],
                                   [([], committer.commit_seconds)])
        if storage is not None:
            figures = lmdb_figures(storage)
            yield GaugeMetricFamily("boxqueue_lmdb_map_size_bytes", "LMDB map size", value=figures["map_size"])
            yield GaugeMetricFamily("boxqueue_lmdb_used_bytes", "LMDB pages in use, in bytes",
                                    value=figures["used"])
            yield GaugeMetricFamily("boxqueue_lmdb_file_bytes", "Disk space LMDB's data file takes",
                                    value=figures["file"])
        if catalog is not None and storage is not None and not o.recovering:
            length = GaugeMetricFamily("tnt_space_len", "Tuples in a space", labels=["name", "engine"])
            for space in list(catalog.spaces.values()):
                if space.primary is not None and not space.dropped:
                    length.add_metric([space.name, space.defn.engine], space.len())
            yield length

    # -- tubes -----------------------------------------------------------------------------

    # -- Lua and Sonya ---------------------------------------------------------------------

    def _lua(self, o: Observed) -> Iterator[Metric]:
        lua = o.lua
        if lua is None:
            return
        usage = lua.usage
        yield CounterMetricFamily("boxqueue_lua_jobs", "Lua jobs run (console statements, EVAL chunks, "
                                  "Lua functions called over CALL)", value=usage.jobs + lua.quick_jobs)
        yield CounterMetricFamily("boxqueue_lua_failed_jobs", "Lua jobs that ended with an error",
                                  value=usage.failed)
        yield CounterMetricFamily("boxqueue_lua_seconds", "Time spent running Lua (waits for box excluded) by "
                                  "the jobs that did not finish in their first stretch on the event loop",
                                  value=usage.seconds)
        hits = CounterMetricFamily("boxqueue_lua_limit_hits", "Lua jobs stopped by a limit", labels=["limit"])
        hits.add_metric(["time"], usage.time_limit_hits)
        hits.add_metric(["memory"], usage.memory_limit_hits)
        yield hits
        yield GaugeMetricFamily("tnt_info_memory_lua", "Memory the Lua runtime uses", value=lua.memory_used())

    def _sonya(self, o: Observed) -> Iterator[Metric]:
        broadcast = o.broadcast
        if broadcast is None:
            return
        yield GaugeMetricFamily("boxqueue_sonya_queues", "Broadcast queues", value=len(broadcast.queues))
        yield GaugeMetricFamily("boxqueue_sonya_listeners", "Listeners (long-polls and WebSockets) now",
                                value=broadcast.listener_count())
        yield CounterMetricFamily("boxqueue_sonya_subscriptions", "Listeners subscribed since start",
                                  value=broadcast.subscribed)
        yield CounterMetricFamily("boxqueue_sonya_messages", "Messages fanned out", value=broadcast.fanned_out)
        yield CounterMetricFamily("boxqueue_sonya_deliveries", "Copies of messages handed to listeners",
                                  value=broadcast.deliveries)
        ended = CounterMetricFamily("boxqueue_sonya_listeners_ended", "Listeners ended by the server, by reason "
                                    "(overflow: closed for lagging more than listener_buffer)", labels=["reason"])
        for reason in ("overflow", "closed", "deleted", "shutdown", "failed"):
            ended.add_metric([reason], broadcast.ended.get(reason, 0))
        yield ended

    def _plugged(self, o: Observed) -> Iterator[Metric]:
        for name, (documentation, read) in list(o.gauges.gauges.items()):
            yield GaugeMetricFamily(name, documentation, value=float(read()))
        for name, (documentation, read) in list(o.gauges.counters.items()):
            yield CounterMetricFamily(name, documentation, value=float(read()))


def replication_families(o: Observed) -> Iterator[Metric]:
    """The replica set's figures, named and labelled as tarantool/metrics names them
    (``info.lua``, ``replicas.lua``), so that its Grafana dashboards and alerts read a boxqueue
    replica set unchanged; nothing outside a replica set.

    As in tarantool/metrics (>= 1.0) a stream's series skip this node's own entry, ``id`` is the
    peer's replica id, ``tnt_replication_status`` is 1 only for "follow" (a stream connecting or
    loading counts as down) and ``tnt_election_state`` is follower=0, candidate=1, leader=2, not
    raft's wire values."""
    node = o.replica
    if node is None:
        return
    info = node.info()
    election, queue = info["election"], info["synchro"]["queue"]
    yield GaugeMetricFamily("tnt_info_lsn", "LSN of the last record in this node's log", value=info["lsn"])
    vclock = GaugeMetricFamily("tnt_info_vclock", "This node's vclock, by replica id", labels=["id"])
    for rid, lsn in sorted(info["vclock"].items()):
        vclock.add_metric([str(rid)], lsn)
    yield vclock
    yield GaugeMetricFamily("tnt_read_only", "1 while this node refuses writes (box.info.ro)",
                            value=1.0 if info["ro"] else 0.0)
    lag = GaugeMetricFamily("tnt_replication_lag", "Seconds a replication stream is behind (upstream: "
                            "this follower behind its leader; downstream: a follower behind this leader)",
                            labels=["stream", "id"])
    status = GaugeMetricFamily("tnt_replication_status", "1 while a replication stream's status is "
                               "\"follow\", else 0", labels=["stream", "id"])
    records = GaugeMetricFamily("boxqueue_replication_lag_records", "Log records a replication stream is "
                                "behind", labels=["stream", "id", "name"])
    for rid, entry in sorted(info["replication"].items()):
        if rid == info["id"]:
            continue
        for stream in ("upstream", "downstream"):
            figures = entry.get(stream)
            if figures is None:
                continue
            lag.add_metric([stream, str(rid)], figures["lag"])
            status.add_metric([stream, str(rid)], 1.0 if figures["status"] == "follow" else 0.0)
            records.add_metric([stream, str(rid), entry["name"]], figures["lag_records"])
    yield lag
    yield status
    yield records
    yield GaugeMetricFamily("tnt_election_state", "This node's election state: follower=0, candidate=1, "
                            "leader=2", value=ELECTION_STATES[election["state"]])
    yield GaugeMetricFamily("tnt_election_term", "The election term this node knows",
                            value=election["term"])
    yield GaugeMetricFamily("tnt_election_vote", "Replica id this node voted for (0: none; the lease "
                            "in etcd decides, nobody votes)", value=election["vote"])
    yield GaugeMetricFamily("tnt_election_leader", "Replica id of the leader (0: none known)",
                            value=election["leader"])
    yield GaugeMetricFamily("tnt_election_leader_idle", "Seconds since this node last heard from the "
                            "leader (0 on the leader)", value=election["leader_idle"])
    yield GaugeMetricFamily("tnt_synchro_queue_owner", "Replica id owning the synchronous queue (the "
                            "leader; 0 on a follower)", value=queue["owner"])
    yield GaugeMetricFamily("tnt_synchro_queue_term", "Term of the synchronous queue", value=queue["term"])
    yield GaugeMetricFamily("tnt_synchro_queue_len", "Writes waiting for their quorum",
                            value=queue["len"])


def lmdb_figures(storage: Any) -> dict[str, int]:
    """Map size, bytes in use (pages up to the last one used) and the disk space the data file
    takes (its allocated blocks, the reserve kept past the last page included)."""
    try:
        file_bytes = storage.allocated_bytes()
    except OSError:
        file_bytes = 0
    return {"map_size": storage.env.info()["map_size"], "used": storage.used_bytes(), "file": file_bytes}


def tube_families(rows: list[TubeRow], totals: list[tuple[str, list[int]]]) -> Iterator[Metric]:
    """Per tube: tasks by state, what happened to its tasks, waiting takes, the oldest ready
    task's age; per queue space: the totals, which never restart."""
    labels = ["space", "tube", "kind"]
    tasks = GaugeMetricFamily("boxqueue_tube_tasks", "Tasks of a tube by state", labels=[*labels, "state"])
    shown = ("puts", "takes", "acks", "releases", "buries", "expiries")
    counters = [
        CounterMetricFamily(f"boxqueue_tube_{name}", f"Tasks of a tube: {name} since the tube was loaded",
                            labels=labels)
        for name in shown
    ]
    waiting = GaugeMetricFamily("boxqueue_tube_waiting_takes", "Takes waiting for a task", labels=labels)
    oldest = GaugeMetricFamily("boxqueue_tube_oldest_ready_age_seconds",
                               "Age of the oldest ready task (0: none ready)", labels=labels)
    picks = [TALLIES.index(name) for name in shown]
    for row in rows:
        values = [row.space, row.tube, row.kind]
        for state, count in zip(STATES, row.counts, strict=True):
            tasks.add_metric([*values, state], count)
        for family, index in zip(counters, picks, strict=True):
            family.add_metric(values, row.tally[index])
        waiting.add_metric(values, row.waiting)
        oldest.add_metric(values, row.oldest_ready_s)
    yield tasks
    yield from counters
    yield waiting
    yield oldest
    by_space = CounterMetricFamily("boxqueue_space_tasks", "What happened to the tasks of a queue space since "
                                   "start, by event (never reset, unlike a tube's counters)",
                                   labels=["space", "event"])
    for name, tally in totals:
        for event, count in zip(TALLIES, tally, strict=True):
            by_space.add_metric([name, event], count)
    yield by_space
