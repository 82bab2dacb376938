"""Tubes that exist on their own (a record in LMDB): a Zaqar queue, a tube whose kind is not its
space's, a tube with a limit (Deckard's max_elements, evicting the tasks closest to expiry, K8);
dropping a tube with everything it holds."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import lmdb

from boxqueue.tubes.engine_base import (
    CLAIM_RECORDS,
    TUBE_RECORDS,
    QueueSpace,
)
from boxqueue.tubes.kinds import TubeKind
from boxqueue.tubes.task_verbs import TaskVerbs
from boxqueue.tubes.tube import Tube

log = logging.getLogger(__name__)


class TubeRecords(TaskVerbs):
    def _adopt(
        self, queue_space: QueueSpace, tube: Tube, kind: TubeKind | None
    ) -> tuple[list[Callable[[lmdb.Transaction], Any]], dict[str, Any] | None]:
        """A tube that holds nothing yet takes the kind of the API putting into it (a tube's
        properties are those of the API that created it). Its record goes with its first tasks
        when its kind stores its tubes or is not its space's; returns it and its options."""
        if kind is not None and not tube.tasks and not tube.pending and tube.options is None:
            tube.kind = kind
        if tube.options is not None:
            return [], None
        foreign = tube.kind.name != queue_space.kind.name
        if not (tube.kind.stored_tubes or foreign):
            return [], None
        options = {"kind": tube.kind.name} if foreign else {}
        return [self._record_write(TUBE_RECORDS, [queue_space.id, tube.name, options], [])], options

    async def create_tube(self, space_id: int, tube_name: str, options: dict[str, Any],
                          kind: TubeKind | None = None) -> bool:
        """Store the tube with ``options``; False (and nothing changed) if it is stored already."""
        queue_space = self.queue_space(space_id)
        tube = self._tube(queue_space, tube_name)
        if tube.options is not None:
            return False
        _records, kind_options = self._adopt(queue_space, tube, kind)
        tube.options = {**(kind_options or {}), **options}
        try:
            await self.committer.write(self._record_write(TUBE_RECORDS, [space_id, tube_name, tube.options], []))
        except BaseException:
            tube.options = None
            self._forget_if_unused(tube)
            raise
        return True

    async def set_limit(self, space_id: int, tube_name: str, limit: int) -> None:
        """At most ``limit`` tasks (0: no limit), evicting at once those closest to expiry (K8)."""
        queue_space = self.queue_space(space_id)
        tube = self._tube(queue_space, tube_name)
        before_options, before_limit = tube.options, tube.limit
        options = dict(tube.options or {})
        if limit > 0:
            options["limit"] = limit
        else:
            options.pop("limit", None)
        stored = options if (options or tube.kind.stored_tubes) else None
        tube.options = stored
        tube.set_limit(limit)
        record = None if stored is None else [space_id, tube_name, stored]
        try:
            await self.committer.write(self._record_write(TUBE_RECORDS, record, [space_id, tube_name]))
        except BaseException:
            tube.options = before_options
            tube.set_limit(before_limit)
            raise
        if limit and len(tube.tasks) > limit:
            await self._enforce_limit(queue_space, tube)
        self._forget_if_unused(tube)

    async def _enforce_limit(self, queue_space: QueueSpace, tube: Tube) -> None:
        """Evict the tasks closest to expiry (then the oldest) down to the limit (K8)."""
        excess = len(tube.tasks) - tube.limit
        if tube.limit <= 0 or excess <= 0 or tube.by_expiry is None:
            return
        doomed = tube.by_expiry[:excess]
        await self._batch(queue_space, tube, deletes=doomed)
        log.debug("tube %r over its limit of %d: %d tasks evicted", tube.name, tube.limit, len(doomed))

    async def _enforce_limit_now(self, tube: Tube) -> None:
        try:
            await self._enforce_limit(self.queue_space(tube.space_id), tube)
        except Exception:
            log.exception("could not bring tube %r down to its limit", tube.name)

    async def drop_tube(self, space_id: int, tube_name: str) -> None:
        """The tube is gone: its tasks, its claims and its record. Tasks being put into it as it
        goes are deleted once written."""
        queue_space = self.queue_space(space_id)
        key = (space_id, tube_name)
        tube = self.tubes.get(key)
        if tube is None:
            return
        claims = list(tube.claims.values())
        options, limit = tube.options, tube.limit
        records = [self._record_write(TUBE_RECORDS, None, [space_id, tube_name])]
        for claim in claims:
            records.append(self._record_write(CLAIM_RECORDS, None, [space_id, tube_name, claim.id]))
            tube.unplace_claim(claim)
        tube.dropped = True
        del self.tubes[key]
        tube.options = None
        tube.set_limit(0)
        tube.monitor_wakeup.set()
        for waiter in tube.waiters:
            waiter.set()

        def undo() -> None:  # the write failed: the tube is back as it was
            tube.dropped = False
            tube.options = options
            tube.set_limit(limit)
            for claim in claims:
                tube.place_claim(claim)
            if key not in self.tubes:
                self.tubes[key] = tube
                self._start_monitor(tube)

        await self._batch(queue_space, tube, deletes=list(tube.tasks.values()), records=records, undo_extra=undo)

    def stored_tubes(self, space_id: int) -> list[Tube]:
        return [t for (sid, _n), t in self.tubes.items() if sid == space_id and t.options is not None]

    def tubes_of(self, space_id: int) -> list[Tube]:
        return [t for (sid, _n), t in self.tubes.items() if sid == space_id]

