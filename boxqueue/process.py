"""The server process: storage, catalogue, procedures and listeners, wired from one config.

Everything runs under one root nursery. Shutdown (SIGTERM, SIGINT or :meth:`Server.stop`) stops
accepting, lets requests in flight finish within the grace period, closes the connections, then
lets the group committer commit what is queued and closes LMDB.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from boxqueue.config import Address, Config, MetricsConfig, SonyaConfig, SpaceConfig, ZaqarConfig
from boxqueue.errcodes import BoxError
from boxqueue.iproto.builtins import register_builtins
from boxqueue.iproto.console import ConsoleServer
from boxqueue.iproto.dispatch import Dispatcher
from boxqueue.iproto.group_sends import GroupSends
from boxqueue.iproto.request_stats import RequestStats
from boxqueue.iproto.server import IprotoServer
from boxqueue.iproto.session import Session
from boxqueue.lua_box.engine import LuaEngine, LuaLimits
from boxqueue.lua_box.persisted_functions import DB_NAME as FUNCTIONS_DB
from boxqueue.measures import Histogram, RequestMeter
from boxqueue.metrics.observed import READY, RECOVERING, STOPPING, Observed
from boxqueue.spaces import access as acl
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.definitions import FieldDef
from boxqueue.spaces.procedures import CallContext, Procedures
from boxqueue.spaces.space_procedures import space_method_resolver
from boxqueue.storage.commit import GroupCommitter
from boxqueue.storage.environment import Storage
from boxqueue.task_roots import python_root
from boxqueue.task_tree import dump_on_signal
from boxqueue.tls import server_context
from boxqueue.tubes import box_queue, pools, queue_module, sequences, stream_procedures
from boxqueue.tubes.broadcast import Broadcast
from boxqueue.tubes.engine import QueueEngine, QueueSpace
from boxqueue.tubes.kinds import BOX_QUEUE_KIND, TubeKind, deckard_kind, zaqar_kind
from boxqueue.tubes.migration import migrate
from boxqueue.tubes.pools import PoolCatalog
from boxqueue.tubes.task_events import catch_up, task_event_hook

if TYPE_CHECKING:
    from boxqueue.facades.zaqar.queues import ZaqarQueues
    from boxqueue.frontdoor.asgi_serving import Listening

log = logging.getLogger(__name__)

# The HTTP facades and the metrics listener (hypercorn, the ASGI apps) are imported when their
# section is configured: a server without them starts sooner (about a third of the imports).

# What an incarnation of the process serves as: alone (no [replication]), or as a replica set's
# leader or one of its followers (see boxqueue/replication/node.py).
ALONE, LEADER, FOLLOWER = "alone", "leader", "follower"


@dataclass
class Ports:
    """Where the listeners ended up (useful with port 0)."""

    iproto: int | None = None
    read_only: int | None = None
    admin: int | None = None
    extra: dict[str, int] = field(default_factory=dict)  # deckard, zaqar, sonya, metrics


def metered_statements(run: Callable[..., Awaitable[Any]], meter: RequestMeter) -> Callable[..., Awaitable[Any]]:
    """The console's statement runner, counting each statement (ok, or its error code) in ``meter``."""

    async def run_statement(ctx: Any, line: str, set_delimiter: Callable[[str], None]) -> Any:
        started = meter.begin()
        outcome = None
        try:
            outcome = await run(ctx, line, set_delimiter)
            return outcome
        finally:
            error = None if outcome is not None and outcome.ok else getattr(outcome, "error", None)
            if outcome is not None and outcome.ok:
                meter.record("statement", started)
            elif error is not None:
                meter.record("statement", started, str(error.code), error.message)
            else:
                meter.record("statement", started, "exception", "the statement was interrupted")

    return run_statement


def configure_access(config: Config) -> acl.AccessControl:
    access = acl.AccessControl()
    for user in config.users:
        created = access.add_user(user.name, user.password)
        for grant in user.grants:
            bits = 0
            for privilege in grant.privileges:
                bits |= acl.PRIVILEGE_BITS[privilege]
            created.grant(bits, grant.object_type, grant.object_name or "")
    if config.guest_grants is not None:
        access.set_guest_grants(
            [
                (sum(acl.PRIVILEGE_BITS[p] for p in set(g.privileges)), g.object_type, g.object_name or "")
                for g in config.guest_grants
            ]
        )
    elif config.users:
        access.set_guest_grants([])
    return access


async def create_configured_spaces(catalog: Catalog, spaces: tuple[SpaceConfig, ...]) -> None:
    """Create the spaces and indexes of the config that the catalogue does not have yet."""
    for sc in spaces:
        existing = catalog.by_name.get(sc.name)
        if existing is None and sc.id is not None:
            existing = catalog.spaces.get(sc.id)
        if existing is None:
            fmt = tuple(FieldDef(f.name, f.type, f.is_nullable) for f in sc.format)
            existing, _ = await catalog.create_space(
                sc.name, space_id=sc.id, format=fmt, engine=sc.engine, temporary=sc.temporary
            )
            log.info("created space '%s' (id %d) from the configuration", sc.name, existing.id)
        for ic in sc.indexes:
            if ic.name in existing.index_by_name:
                continue
            parts = [
                {"field": p.field, "type": p.type, "is_nullable": p.is_nullable, "collation": p.collation}
                if (p.is_nullable or p.collation)
                else [p.field, p.type]
                for p in ic.parts
            ]
            await catalog.create_index(existing, ic.name, index_type=ic.type, unique=ic.unique, parts=parts)


def cfg_view(config: Config) -> dict[str, object]:
    """What ``box.cfg`` shows in Lua: the running configuration, read-only."""
    iproto = config.iproto

    def address(a: Address | None) -> str | None:
        return None if a is None else f"{a.host}:{a.port}"

    view: dict[str, object] = {
        "listen": address(iproto.listen),
        "read_only_listen": address(iproto.read_only_listen),
        "admin_listen": address(iproto.admin_listen),
        "work_dir": str(config.data_dir),
        "wal_mode": config.wal.mode,
        "read_only": False,
        "lua_time_limit_s": config.lua.time_limit_s,
        "lua_memory_limit_bytes": config.lua.memory_limit_bytes,
    }
    return {k: v for k, v in view.items() if v is not None}


def http_listening(section: ZaqarConfig | SonyaConfig | MetricsConfig) -> Listening:
    """How an HTTP listener accepts: TLS, its connection limit, the head and body timeouts (the
    metrics listener's section has the same keys)."""
    from boxqueue.frontdoor.asgi_serving import Listening

    tls = section.tls
    context = server_context(tls, alpn=("http/1.1",)) if tls is not None else None
    return Listening(ssl_context=context, max_connections=section.max_connections,
                     header_timeout_s=section.header_timeout_s, keep_alive_timeout_s=section.keep_alive_timeout_s,
                     body_timeout_s=section.body_timeout_s)


class Server:
    """One boxqueue process; :meth:`run` serves until :meth:`stop` or a signal."""

    def __init__(self, config: Config, *, handle_signals: bool = True) -> None:
        self.config = config
        self.handle_signals = handle_signals
        self.ports = Ports()
        self.observed = Observed()  # what the metrics listener reads, filled in as parts start
        self._stop = trio.Event()
        self.storage: Storage | None = None
        self.catalog: Catalog | None = None
        self.deckard_space: QueueSpace | None = None
        self.zaqar_space: QueueSpace | None = None
        self.broadcast: Broadcast | None = None
        self.zaqar_queues: ZaqarQueues | None = None
        self.replica: Any = None  # replication.node.ReplicaNode, in a replica set
        self.served = False  # it was ready once (an error after that is not a start-up refusal)

    def stop(self) -> None:
        self._stop.set()

    async def _watch_signals(self) -> None:
        import signal

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received signal %d, shutting down", signum)
                self.stop()
                return

    async def run(self, *, task_status: trio.TaskStatus[Ports] = trio.TASK_STATUS_IGNORED) -> None:
        """The metrics listener starts first, so it can report "recovering" while storage opens
        and the engine rebuilds its tubes; it stops last."""
        config = self.config
        access = configure_access(config)
        metrics_stop = trio.Event()
        async with trio.open_nursery() as outermost:
            dumping = trio.CancelScope()  # the task tree on SIGUSR1, until the server has stopped
            if self.handle_signals:
                async def dump() -> None:
                    with dumping:
                        await dump_on_signal()

                outermost.start_soon(dump)
            metrics = config.metrics
            if metrics is not None:
                from boxqueue.metrics.app import serve_metrics

                listen = metrics.listen
                self.ports.extra["metrics"] = await outermost.start(
                    lambda task_status: serve_metrics(
                        self.observed, listen.host, listen.port, metrics_stop,
                        access=access if config.users else None, public=metrics.public,
                        listening=http_listening(metrics),
                        task_status=task_status,
                    )
                )
            try:
                # Off the event loop: opening may take a while (a log to replay) and the metrics
                # answer meanwhile.
                wal = config.wal
                storage = self.storage = await trio.to_thread.run_sync(
                    partial(
                        Storage,
                        config.data_dir,
                        wal.mode,
                        checkpoint_interval_s=wal.checkpoint_interval_s,
                        checkpoint_bytes=wal.checkpoint_bytes,
                    )
                )
                self.observed.storage = storage
                try:
                    if config.replication is None:
                        await self._serve(storage, access, task_status, ALONE)
                    else:
                        await self._serve_replica_set(storage, access, task_status)
                finally:
                    self.observed.state = STOPPING
                    self.observed.storage = None  # the metrics stop reading LMDB before it closes
                    storage.close()
                    log.info("boxqueue stopped")
            finally:
                self.observed.state = STOPPING
                metrics_stop.set()
                dumping.cancel()

    async def _serve_replica_set(self, storage: Storage, access: acl.AccessControl,
                                 task_status: trio.TaskStatus[Ports]) -> None:
        """Serve as the leader or as a follower, as etcd decides, one incarnation after another."""
        from boxqueue.replication.etcd import EtcdClient
        from boxqueue.replication.node import ReplicaNode

        rep = self.config.replication
        assert rep is not None
        async with EtcdClient(list(rep.etcd.endpoints), timeout=max(1.0, rep.etcd.lease_ttl_s / 2)) as etcd:
            node = self.replica = ReplicaNode(rep, etcd, storage)
            self.observed.replica = node
            async with trio.open_nursery() as nursery:
                await nursery.start(node.election.run)
                await node.publish_facades(self._facade_urls())
                nursery.start_soon(node.follow_leader_facades)
                if self.handle_signals:
                    nursery.start_soon(self._watch_signals)
                first = True
                while not self._stop.is_set():
                    role = LEADER if node.leading() else FOLLOWER
                    log.info("serving as %s (term %d, leader %s)", role, node.state.term, node.state.leader)
                    await self._serve(storage, access, task_status if first else trio.TASK_STATUS_IGNORED, role)
                    first = False
                with trio.move_on_after(2):
                    await node.election.resign()
                nursery.cancel_scope.cancel()

    async def _until_stopped_or_changed(self, role: str) -> None:
        """Until the server stops, or (in a replica set) this incarnation's role no longer holds."""
        async with trio.open_nursery() as nursery:
            async def then_stop(wait: Callable[[], Awaitable[None]]) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(then_stop, self._stop.wait)
            if role == LEADER:
                nursery.start_soon(then_stop, self.replica.wait_until_not_leading)
            elif role == FOLLOWER:
                nursery.start_soon(then_stop, self.replica.wait_until_leading)

    async def _serve(self, storage: Storage, access: acl.AccessControl, task_status: trio.TaskStatus[Ports],
                     role: str) -> None:
        config = self.config
        observed = self.observed
        node = self.replica
        try:
            committer = GroupCommitter(storage, rejections=(BoxError,))
            catalog = self.catalog = Catalog(storage, committer, access)
            if role == FOLLOWER:
                catalog.writes.set_read_only(f"a follower of the replica set (leader: {node.state.leader})")
            observed.committer, observed.catalog = committer, catalog
            if storage.log is not None:
                wal_log = storage.log
                observed.gauges.add(
                    "boxqueue_wal_bytes", "Bytes in the write-ahead log since its last checkpoint", lambda: wal_log.size,
                    label="log since checkpoint (bytes)",
                )
                observed.gauges.add_counter(
                    "boxqueue_wal_checkpoints", "Checkpoints of the write-ahead log", lambda: committer.checkpoints,
                    label="checkpoints",
                )
            catalog.load()
            procedures = Procedures(catalog.functions)
            register_builtins(procedures, catalog, replication=node.info if node is not None else None)
            if node is not None:
                from boxqueue.replication.node import register_procedures

                register_procedures(procedures, node)
            procedures.add_resolver(space_method_resolver(catalog))
            stats = RequestStats()
            lua = self.lua = LuaEngine(
                catalog,
                procedures,
                LuaLimits(config.lua.time_limit_s, config.lua.memory_limit_bytes),
                cfg=cfg_view(config),
                stats=stats,
            )

            def eval_handler(session: Session, expr: str, args: list) -> Any:
                return lua.eval(session.context, expr, args)

            dispatcher = Dispatcher(catalog, procedures, eval_handler=eval_handler, stats=stats)
            iproto_tls = server_context(config.iproto.tls) if config.iproto.tls is not None else None
            console_meter = observed.meter("console")
            console = ConsoleServer(
                catalog, metered_statements(lua.console, console_meter), require_login=bool(config.users),
                max_statement_bytes=config.iproto.max_packet_bytes,
                ssl_context=iproto_tls, max_connections=config.iproto.max_connections, meter=console_meter,
            )
            self.procedures = procedures
            self.dispatcher = dispatcher
            group_sends = GroupSends()
            committer.around_answers = (group_sends.begin, group_sends.end)
            iproto = IprotoServer(
                catalog,
                dispatcher,
                max_packet=config.iproto.max_packet_bytes,
                max_inflight=config.iproto.max_inflight_per_connection,
                ssl_context=iproto_tls,
                max_connections=config.iproto.max_connections,
                # Latency per chunk costs two clock reads per chunk: only when someone looks.
                latency=Histogram() if config.metrics is not None else None,
                group_sends=group_sends,
            )
            engine = self.engine = QueueEngine(catalog, self._kinds())
            queue_procedures = box_queue.register(procedures, engine, config.iproto.max_waiting_takes_per_connection)
            queue_procedures.standby = role == FOLLOWER
            stream_procedures.register(procedures, engine, catalog)
            modern_queue = queue_module.register(
                procedures, engine, queue_procedures, lua.operations.grant, self._task_changed_in_lua(lua, catalog))
            observed.stats, observed.lua, observed.iproto, observed.engine = stats, lua, iproto, engine
            # Spaces whose data only the engine changes (boxqueue/spaces/ownership.py), before any listener.
            for rule in (engine.space_owner, sequences.space_owner, pools.space_owner):
                catalog.ownership.add_rule(rule, list(catalog.spaces.values()))
            leading = None
            if role == LEADER:
                leading = self._lead(storage, committer, dispatcher)
            # Shutdown goes from the top down: listeners, connections, the engine's monitors, and
            # last the committer, which commits whatever is still queued.
            async with trio.open_nursery() as root:
                await root.start(committer.run)
                await catalog.empty_memory_index_databases()
                # stats, lua and the queue module are compiled: see task_roots.py.
                await root.start(python_root, stats.run)
                await root.start(python_root, lua.run)
                root.start_soon(python_root, modern_queue.run)
                if role == FOLLOWER:
                    root.start_soon(self._follow, storage, committer, catalog)
                else:
                    observed.state = RECOVERING
                    if leading is not None:
                        await leading.begin_term()
                    await create_configured_spaces(catalog, config.spaces)
                    await self._own_spaces(engine)
                    await self._open_broadcast(engine)
                async with trio.open_nursery() as engine_nursery:
                    if role != FOLLOWER:
                        await engine_nursery.start(engine.run)
                        await self._open_zaqar_queues()
                    if leading is not None:
                        # Before any listener or facade opens: no client write is answered
                        # without the quorum (the start-up writes above answered no client).
                        await leading.start_quorum(root)
                    if self.handle_signals and role == ALONE:
                        engine_nursery.start_soon(self._watch_signals)
                    async with trio.open_nursery() as facades:
                        facades_stop = (await self._start_facades(engine_nursery, facades) if role != FOLLOWER
                                        else await self._start_follower_facades(facades))
                        async with trio.open_nursery() as connections:
                            with trio.CancelScope() as listening:
                                async with trio.open_nursery() as listeners:
                                    await self._start_listeners(listeners, connections, iproto, console,
                                                                engine=role != FOLLOWER)
                                    observed.state = READY
                                    self.served = True
                                    log.info("boxqueue is ready" if role == ALONE else f"boxqueue is ready, as {role}")
                                    task_status.started(self.ports)
                                    await self._until_stopped_or_changed(role)
                                    observed.state = STOPPING
                                    if leading is not None:
                                        leading.end()
                                    listening.cancel()
                            # The HTTP facades drain at the same time as the iproto connections.
                            facades_stop()
                            iproto.stop_reading()
                            with trio.move_on_after(iproto.grace + 1):
                                await iproto.wait_closed()
                            connections.cancel_scope.cancel()
                    engine_nursery.cancel_scope.cancel()
                root.cancel_scope.cancel()
        finally:
            if node is not None:
                node.relays = node.applier = node.quorum = None

    @staticmethod
    def _task_changed_in_lua(lua: LuaEngine, catalog: Catalog) -> queue_module.TaskChanged:
        """How tarantool/queue's on_task_change callbacks run: a Lua job as admin."""
        ctx = CallContext(0, catalog.access.users["admin"])

        async def task_changed(tube: str, task: list[Any], what: str) -> None:
            result = lua.eval(ctx, "return require('queue')._task_changed(...)", [tube, task, what])
            if not isinstance(result, list):
                await result

        return task_changed

    def _kinds(self) -> dict[str, TubeKind]:
        """The kinds of tubes, with the defaults the configuration gives them."""
        kinds = {BOX_QUEUE_KIND.name: BOX_QUEUE_KIND}
        if self.config.deckard is not None:
            kind = deckard_kind(self.config.deckard.default_ttl_minutes)
            kinds[kind.name] = kind
        if self.config.zaqar is not None:
            from boxqueue.facades.zaqar.responses import Limits

            limits = Limits.configured(dict(self.config.zaqar.limits))
            kind = zaqar_kind(limits.default_message_ttl, limits.default_claim_ttl)
            kinds[kind.name] = kind
        return kinds

    async def _own_spaces(self, engine: QueueEngine) -> None:
        """The spaces of the facades' queues, owned by the engine (created if new), and what the
        three-engine layout left moved into them; before the engine recovers."""
        await engine.open_owned()
        if self.config.deckard is not None:
            self.deckard_space = await engine.own_space(self.config.deckard.space, engine.kinds["deckard"])
        if self.config.zaqar is not None:
            self.zaqar_space = await engine.own_space(self.config.zaqar.space, engine.kinds["zaqar"])
        assert self.catalog is not None
        await migrate(self.catalog, engine, deckard=self.deckard_space, zaqar=self.zaqar_space,
                      zaqar_kind=engine.kinds.get("zaqar"))

    async def _open_broadcast(self, engine: QueueEngine) -> None:
        """The broadcast tubes behind the Sonya facade, with the task-event hook in place before
        the engine recovers (so the restart's own transitions are published too)."""
        sonya = self.config.sonya
        if sonya is None:
            return
        assert self.catalog is not None
        broadcast = self.broadcast = Broadcast(
            self.catalog, max_key_updates=sonya.max_key_updates, listener_buffer=sonya.listener_buffer
        )
        await broadcast.open()
        self.observed.broadcast = broadcast
        for tube in sonya.task_events:  # S11: a tube's event queue exists with the tube
            await broadcast.create(tube)
        if sonya.task_events:
            caught_up = catch_up(broadcast, engine, sonya.task_events)
            if caught_up:
                log.info("published %d task events a stop had left unpublished", caught_up)
            engine.hooks.append(task_event_hook(broadcast, engine, sonya.task_events))

    async def _connect_pool(self, space_name: str) -> None:
        """A Zaqar pool's space is one of the engine's Zaqar spaces."""
        await self.engine.own_space(space_name, self.engine.kinds["zaqar"])

    def _facade_urls(self) -> dict[str, str]:
        """Where this member's facades listen, as clients reach them."""
        config = self.config
        host = config.replication.peer.uri.host if config.replication is not None else "127.0.0.1"
        urls = {}
        for api, section, scheme in (("zaqar", config.zaqar, "http"), ("sonya", config.sonya, "http"),
                                     ("deckard", config.deckard, "grpc"), ("metrics", config.metrics, "http")):
            if section is not None:
                listen = section.listen
                shown = host if listen.host in ("0.0.0.0", "::") else listen.host
                tls = getattr(section, "tls", None) is not None
                urls[api] = f"{scheme}{'s' if tls and scheme == 'http' else ''}://{Address(shown, listen.port)}"
        return urls

    async def _start_follower_facades(self, facades: trio.Nursery) -> Callable[[], None]:
        """A follower's Zaqar and Sonya: every request answered 503, naming the leader."""
        from boxqueue.facades.follower import unavailable_app
        from boxqueue.frontdoor.asgi_serving import serve_asgi

        stopping = trio.Event()
        node = self.replica
        for api, section, name in (("zaqar", self.config.zaqar, "Zaqar"), ("sonya", self.config.sonya, "Sonya")):
            if section is None:
                continue
            app = unavailable_app(partial(node.leader_facade_url, api), api)
            self.ports.extra[api] = await facades.start(
                lambda task_status, app=app, section=section, name=name: serve_asgi(
                    app, section.listen.host, section.listen.port, stopping, name=f"{name} (follower)",
                    listening=http_listening(section), task_status=task_status,
                )
            )
        return stopping.set

    async def _open_zaqar_queues(self) -> None:
        """Zaqar's queues and pools, with the writes opening them makes: a start-up write, done
        before a leader's quorum is installed (no client waits on it)."""
        if self.config.zaqar is not None and self.zaqar_space is not None:
            from boxqueue.facades.zaqar.queues import ZaqarQueues

            assert self.catalog is not None
            pools = PoolCatalog(self.catalog, connect=self._connect_pool)
            queues = self.zaqar_queues = ZaqarQueues(self.engine, self.zaqar_space, self.engine.kinds["zaqar"], pools)
            await queues.open()

    async def _start_facades(self, engine_nursery: trio.Nursery, facades: trio.Nursery) -> Callable[[], None]:
        """Start the HTTP facades; returns what stops them gracefully (answering long-polls)."""
        stopping = trio.Event()
        zaqar = self.config.zaqar
        queues = self.zaqar_queues
        if zaqar is not None and queues is not None:
            from boxqueue.facades.zaqar import TokenAuth, serve_zaqar
            from boxqueue.facades.zaqar.responses import Limits

            self.ports.extra["zaqar"] = await facades.start(
                lambda task_status: serve_zaqar(
                    queues,
                    zaqar.listen.host,
                    zaqar.listen.port,
                    stopping,
                    limits=Limits.configured(dict(zaqar.limits)),
                    default_project=zaqar.default_project,
                    auth=TokenAuth((t.token, t.project, t.admin) for t in zaqar.tokens) if zaqar.auth == "token" else None,
                    listening=http_listening(zaqar),
                    meter=self.observed.meter("zaqar"),
                    task_status=task_status,
                )
            )
        broadcast = self.broadcast
        sonya = self.config.sonya
        if sonya is not None and broadcast is not None:
            from boxqueue.facades.sonya import serve_sonya

            self.ports.extra["sonya"] = await facades.start(
                lambda task_status: serve_sonya(
                    broadcast,
                    sonya.listen.host,
                    sonya.listen.port,
                    stopping,
                    service_token=sonya.service_token,
                    jwt_ttl_s=sonya.jwt_ttl_s,
                    longpoll_max_wait_s=sonya.longpoll_max_wait_s,
                    listening=http_listening(sonya),
                    meter=self.observed.meter("sonya"),
                    task_status=task_status,
                )
            )

        def stop() -> None:
            if broadcast is not None:
                broadcast.shutdown()
            stopping.set()

        return stop

    def _lead(self, storage: Storage, committer: GroupCommitter, dispatcher: Dispatcher) -> Any:
        from boxqueue.replication.leading import Leading

        return Leading(self.replica, storage, committer, dispatcher)

    async def _follow(self, storage: Storage, committer: GroupCommitter, catalog: Catalog) -> None:
        """A follower's applier, following whoever etcd says leads (until cancelled)."""
        from boxqueue.replication.applier import Applier

        node = self.replica
        rep = node.config
        applier = node.applier = Applier(
            storage, committer, catalog, name=rep.name, user=rep.user, password=rep.password,
            heartbeat_s=rep.heartbeat_s, known_term=lambda: node.state.term, instance_uuid=catalog.instance_uuid,
            reloads={FUNCTIONS_DB: self.lua.define_persisted_again},
        )
        while True:
            uri = node.state.leader_uri
            if uri is None or node.state.leader == node.name:
                await node.wait_for_change()
                continue
            address = Address.parse(uri)
            with trio.CancelScope() as following:
                async def on_leader_change(scope: trio.CancelScope = following, uri: str = uri) -> None:
                    while node.state.leader_uri == uri:
                        await node.wait_for_change()
                    scope.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(on_leader_change)
                    await applier.follow(address.host, address.port)

    async def _start_listeners(self, listeners: trio.Nursery, connections: trio.Nursery, iproto: IprotoServer,
                               console: ConsoleServer, *, engine: bool = True) -> None:
        cfg = self.config.iproto

        async def start(address: Address, read_only: bool) -> int:
            return await listeners.start(
                lambda task_status: iproto.listen(
                    address.host, address.port, connections, read_only=read_only, task_status=task_status
                )
            )

        if cfg.listen is not None:
            self.ports.iproto = await start(cfg.listen, False)
        if cfg.read_only_listen is not None:
            self.ports.read_only = await start(cfg.read_only_listen, True)
        admin = cfg.admin_listen
        if admin is not None:
            self.ports.admin = await listeners.start(
                lambda task_status: console.listen(admin.host, admin.port, connections, task_status=task_status)
            )
        deckard = self.config.deckard
        if deckard is not None and (self.deckard_space is not None or not engine):
            from boxqueue.facades.deckard.server import (
                DeckardFacade,  # grpcio loads only when served
            )

            node = self.replica
            facade = DeckardFacade(
                self.engine,
                self.deckard_space.id if self.deckard_space is not None else 0,
                deckard.listen.host,
                deckard.listen.port,
                default_ttl_minutes=deckard.default_ttl_minutes,
                allow_flush=deckard.allow_flush,
                token=deckard.token,
                tls=server_context(deckard.tls, alpn=("h2",)) if deckard.tls is not None else None,
                max_connections=deckard.max_connections,
                timeouts=(deckard.header_timeout_s, deckard.body_timeout_s, deckard.idle_timeout_s),
                meter=self.observed.meter("deckard"),
                follower=None if engine else (lambda: node.leader_facade_url("deckard")),
            )
            self.ports.extra["deckard"] = await listeners.start(facade.run)
