"""The server process: storage, catalogue, procedures and listeners, wired from one config.

Everything runs under one root nursery. Shutdown (SIGTERM, SIGINT or :meth:`Server.stop`) stops
accepting, lets requests in flight finish within the grace period, closes the connections, then
lets the group committer commit what is queued and closes LMDB.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio

from boxqueue.config import Address, Config, SpaceConfig
from errcodes import BoxError
from facades.zaqar import serve_zaqar
from iproto_server.builtins import register_builtins
from iproto_server.dispatch import Dispatcher
from iproto_server.server import IprotoServer
from spaces import access as acl
from spaces.catalog import Catalog
from spaces.definitions import FieldDef
from spaces.procedures import Procedures
from spaces.space_procedures import space_method_resolver
from storage.commit import GroupCommitter
from storage.environment import Storage
from tubes import box_queue
from tubes.claims import ClaimQueues
from tubes.engine import QueueEngine

log = logging.getLogger(__name__)


@dataclass
class Ports:
    """Where the listeners ended up (useful with port 0)."""

    iproto: int | None = None
    read_only: int | None = None
    admin: int | None = None
    extra: dict[str, int] = field(default_factory=dict)


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


class Server:
    """One boxqueue process; :meth:`run` serves until :meth:`stop` or a signal."""

    def __init__(self, config: Config, *, handle_signals: bool = True) -> None:
        self.config = config
        self.handle_signals = handle_signals
        self.ports = Ports()
        self._stop = trio.Event()
        self.storage: Storage | None = None
        self.catalog: Catalog | None = None
        self.claim_queues: ClaimQueues | None = None

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
        config = self.config
        storage = self.storage = Storage(config.data_dir, config.wal.mode)
        try:
            committer = GroupCommitter(storage, rejections=(BoxError,))
            catalog = self.catalog = Catalog(storage, committer, configure_access(config))
            catalog.load()
            procedures = Procedures(catalog.functions)
            register_builtins(procedures, catalog)
            procedures.add_resolver(space_method_resolver(catalog))
            dispatcher = Dispatcher(catalog, procedures)
            self.procedures = procedures
            self.dispatcher = dispatcher
            iproto = IprotoServer(
                catalog,
                dispatcher,
                max_packet=config.iproto.max_packet_bytes,
                max_inflight=config.iproto.max_inflight_per_connection,
            )
            engine = self.engine = QueueEngine(catalog)
            box_queue.register(procedures, engine)
            # Shutdown goes from the top down: listeners, connections, the engine's monitors, and
            # last the committer, which commits whatever is still queued.
            async with trio.open_nursery() as root:
                await root.start(committer.run)
                await create_configured_spaces(catalog, config.spaces)
                async with trio.open_nursery() as engine_nursery:
                    await engine_nursery.start(engine.run)
                    if self.handle_signals:
                        engine_nursery.start_soon(self._watch_signals)
                    async with trio.open_nursery() as facades:
                        facades_stop = await self._start_facades(engine_nursery, facades)
                        async with trio.open_nursery() as connections:
                            with trio.CancelScope() as listening:
                                async with trio.open_nursery() as listeners:
                                    await self._start_listeners(listeners, connections, iproto)
                                    log.info("boxqueue is ready")
                                    task_status.started(self.ports)
                                    await self._stop.wait()
                                    listening.cancel()
                            iproto.stop_reading()
                            with trio.move_on_after(iproto.grace + 1):
                                await iproto.wait_closed()
                            connections.cancel_scope.cancel()
                        facades_stop.set()
                    engine_nursery.cancel_scope.cancel()
                root.cancel_scope.cancel()
        finally:
            storage.close()
            log.info("boxqueue stopped")

    async def _start_facades(self, engine_nursery: trio.Nursery, facades: trio.Nursery) -> trio.Event:
        """Start the HTTP facades; setting the returned event stops them gracefully."""
        stopping = trio.Event()
        zaqar = self.config.zaqar
        if zaqar is not None:
            assert self.catalog is not None
            queues = self.claim_queues = ClaimQueues(self.catalog)
            await engine_nursery.start(queues.run)
            self.ports.extra["zaqar"] = await facades.start(
                lambda task_status: serve_zaqar(
                    queues, zaqar.listen.host, zaqar.listen.port, stopping, task_status=task_status
                )
            )
        return stopping

    async def _start_listeners(self, listeners: trio.Nursery, connections: trio.Nursery, iproto: IprotoServer) -> None:
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
        not_yet = [
            name
            for name, present in (
                ("the admin console (iproto.admin_listen)", cfg.admin_listen is not None),
                ("the Deckard facade ([deckard])", self.config.deckard is not None),
                ("the Sonya facade ([sonya])", self.config.sonya is not None),
            )
            if present
        ]
        for name in not_yet:
            log.warning("%s is configured but not served by this version", name)
