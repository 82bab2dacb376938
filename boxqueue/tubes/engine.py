"""The tube engine: spaces, tubes, task states, consumers, monitors, recovery, the change hook.

One engine serves box.queue, Deckard and Zaqar: three vocabularies for the same tubes, so a task
put through one API can be taken through another. The engine knows:

* **spaces**: the queue spaces a user declares (the 1.5 layout, D12) and the spaces it owns (the
  tube layout of :mod:`boxqueue.tubes.task`: Deckard's, Zaqar's and each Zaqar pool's), each with the
  :class:`tubes.kinds.TubeKind` of its tubes;
* **states**: ready, delayed, taken, buried, done; a lock after a release is a delay that may end
  with a priority given at the release;
* **consumers**: an integer identity whose tasks go back to ready when
  :meth:`QueueEngine.release_consumer` is called (an iproto session that disconnects); a
  :class:`tubes.tube.Claim`, an identity that expires and extends the life of what it holds by
  its grace; or nobody, with only a deadline (a Deckard pull);
* **time**: one monitor task per tube, owned by the engine's nursery, acting at each event's time
  on one timeline (delay end, ttr / ack deadline / claim expiry, ttl, lock end);
* **limits**: a tube may keep at most ``limit`` tasks, evicting those closest to expiry.

Every state change is decided in memory first (so concurrent calls see it at once: a task being
taken cannot be taken twice), together with the statistics that count it, then written as one
storage write grouped with its neighbours by the group committer; the call returns when the write
is durable. If the write fails, the memory change and its counts are undone. Tasks become visible
to consumers only once their put is durable. After a change is durable the change hooks run.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import trio
import trio.lowlevel

import boxqueue.tubes.transitions as tr
from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces.msgpack_values import pack
from boxqueue.spaces.space import REPLACE, StorageError, decode_tuple
from boxqueue.tubes.engine_base import (
    CLAIM_RECORDS,
    OWNED_SPACES,
    RECORD_KEYS,
    TUBE_RECORDS,
    ChangeHook,
    QueueSpace,
    default_kind,
    has_tube_layout,
    has_tube_layout_format,
    now_us,
    proc_error,
)
from boxqueue.tubes.kinds import TubeKind
from boxqueue.tubes.recovery import RecoveryProgress
from boxqueue.tubes.streams import Streams
from boxqueue.tubes.task import (
    HUMAN,
    READY,
    STATUS_ORDER,
    TAKEN,
    TUBE_FORMAT,
    TUBE_KEY,
    TUBE_LAYOUT,
    Task,
    load_tasks,
    sort_by_created,
)
from boxqueue.tubes.tube import Claim

log = logging.getLogger(__name__)

RECOVERY_CHUNK = 10_000  # tasks loaded between two yields at start


class QueueEngine(Streams):
    """All tubes of all queue spaces of one server: the last of the engine's parts, each one a
    class over the one before it (``EngineBase``, ``Producers``, ``Consumers``, ``TaskVerbs``,
    ``TubeRecords``, ``Monitors``, ``Streams``), so that the compiled ones call each other in C."""

    recovery: RecoveryProgress

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recovery = RecoveryProgress()
        self._marking: set[tuple[Any, ...]] = set()  # sink marks being written (streams.py)
        self._records_lock = trio.Lock()

    # -- life ----------------------------------------------------------------------------------

    async def own_space(self, name: str, kind: TubeKind) -> QueueSpace:
        """The space ``name`` with the tube layout, created if missing, its tubes of ``kind``;
        recorded, so it stays the engine's across restarts. Its tasks are recovered at once when
        the engine already runs."""
        await self._open_records()
        space = self.catalog.by_name.get(name)
        if space is None:
            space, _ = await self.catalog.create_space(name, format=TUBE_FORMAT, if_not_exists=True)
        if space.primary is None and has_tube_layout_format(space):
            await self.catalog.create_index(space, "primary", index_type="TREE", unique=True, parts=TUBE_KEY)
        if not has_tube_layout(space) or len(space.indexes) != 1:
            raise BoxError(
                ER.SPACE_EXISTS, name, message=f"Space '{name}' already exists with another layout than a tube space's"
            )
        self.kinds.setdefault(kind.name, kind)
        known = self._owned.get(space.id)
        if known is not None:
            return known  # another API's space too: its tubes keep their own kinds
        queue_space = QueueSpace(space, TUBE_LAYOUT, kind, owned=True)
        self._owned[space.id] = queue_space
        self.catalog.ownership.mark(space)
        self._checked.pop(space.id, None)
        self._known.pop(space.id, None)
        record = [name, kind.name]
        owned = self._records[OWNED_SPACES]
        if owned.get(0, [name]) != pack(record):
            await self.committer.write(owned.prepare_put(pack(record), record, REPLACE))
        if self._recovered:
            await self._recover_space(queue_space, pace=False)
            await self._recover_records(queue_space)
            self._after_recovery([queue_space])
        return queue_space

    async def drop_owned_space(self, space_id: int) -> None:
        """One of the engine's spaces goes, with its tubes, their tasks and its record
        (tarantool/queue's drop of a tube, whose space is its own)."""
        queue_space = self._owned.get(space_id)
        if queue_space is None:
            raise BoxError(ER.NO_SUCH_SPACE, space_id)
        for tube in self.tubes_of(space_id):
            await self.drop_tube(space_id, tube.name)
        await self.committer.write(self._record_write(OWNED_SPACES, None, [queue_space.space.name]))
        del self._owned[space_id]
        self._checked.pop(space_id, None)
        self._known.pop(space_id, None)
        for key in [k for k in self.forgotten if k[0] == space_id]:
            del self.forgotten[key]
        await self.catalog.drop_space(queue_space.space)

    async def _open_records(self) -> None:
        """The engine's record spaces, created with the first space it owns (or a stream's first
        call); callers that come at once wait for the one creating them."""
        if len(self._records) == len(RECORD_KEYS):
            return
        async with self._records_lock:
            for name, parts in RECORD_KEYS.items():
                if name in self._records:
                    continue
                space = self.catalog.by_name.get(name)
                if space is None:
                    space, _ = await self.catalog.create_space(name, if_not_exists=True)
                if space.primary is None:
                    await self.catalog.create_index(space, "primary", index_type="TREE", unique=True, parts=parts)
                self._records[name] = space

    async def open_owned(self) -> None:
        """Take back the spaces recorded as the engine's (those of a previous run)."""
        if OWNED_SPACES not in self.catalog.by_name:
            return
        await self._open_records()
        for raw in self._records[OWNED_SPACES].pairs(0, 2, []):
            name, kind_name = decode_tuple(raw)[:2]
            space = self.catalog.by_name.get(name)
            if space is None or not has_tube_layout(space) or space.id in self._owned:
                continue
            kind = self.kinds.get(kind_name) or default_kind(kind_name)
            self._owned[space.id] = QueueSpace(space, TUBE_LAYOUT, kind, owned=True)
            self.catalog.ownership.mark(space)
            self._known.pop(space.id, None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.open_owned()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._recover()
                task_status.started()
                await trio.sleep_forever()
        finally:
            # Stopped: writes still being answered (a replica set's leader settles those under
            # way after its engine stops) start no monitor and no task any more.
            self._nursery = None

    async def _recover(self) -> None:
        """Rebuild memory from LMDB. Tasks left taken by a session become ready (D10); those
        held by a claim or a deadline keep it (K13). Every tube holding tasks gets its monitor.
        Tasks are loaded in chunks with a yield between them, so the metrics listener can report
        the progress (``self.recovery``) meanwhile; nothing else is served before this ends."""
        spaces = list(self.queue_spaces().values())
        self.recovery.begin(sum(s.space.len() for s in spaces if s.space.primary is not None))
        for queue_space in spaces:
            await self._recover_space(queue_space, pace=True)
        for queue_space in spaces:
            if queue_space.owned:
                await self._recover_records(queue_space)
            elif CLAIM_RECORDS in self._records:  # a Spark stream's claims on a 1.5 space
                self._recover_claims(queue_space)
        self._recovered = True
        await self._return_left_taken(spaces)
        self._after_recovery(spaces)
        self.recovery.finish()

    async def _recover_space(self, queue_space: QueueSpace, *, pace: bool) -> None:
        """Load the space's tasks into its tubes; ``pace``: in chunks, yielding between them
        (at start; a space taken over later is loaded in one step, unseen by requests).

        The cyclic collector is off meanwhile: the objects made here (the orderings' keys; tasks
        it does not track) are in no cycle, and each full collection it would make as they pile
        up walks all of them. (``gc.freeze`` after the load, which would also spare the first
        collection after it, made the soak test's server grow: left out.)"""
        collecting = gc.isenabled()
        gc.disable()
        try:
            await self._load_space(queue_space, pace=pace)
        finally:
            if collecting:
                gc.enable()

    async def _load_space(self, queue_space: QueueSpace, *, pace: bool) -> None:
        space, layout = queue_space.space, queue_space.layout
        if space.primary is None:
            return
        loaded: dict[str, list[Task]] = {}
        after: bytes | None = None
        while True:
            chunk, after = space.stored_after(after, RECOVERY_CHUNK)
            self._note_loaded(queue_space, load_tasks(chunk, layout, loaded))
            if pace:
                self.recovery.advance(len(chunk))
            if after is None:
                break
            if pace:
                await trio.lowlevel.checkpoint()
        placed = 0
        for name, tasks in loaded.items():
            sort_by_created(tasks)
            tube = self._tube(queue_space, name)
            self._add_all(tube, tasks)
            if tasks and tasks[-1].created > self._last_created:
                self._last_created = tasks[-1].created
            placed += len(tasks)
            if pace and placed >= RECOVERY_CHUNK:
                placed = 0
                await trio.lowlevel.checkpoint()

    async def _recover_records(self, queue_space: QueueSpace) -> None:
        sid = queue_space.id
        for raw in self._records[TUBE_RECORDS].pairs(0, 1, [sid]):
            _sid, name, options = decode_tuple(raw)[:3]
            tube = self._tube(queue_space, name)
            tube.options = dict(options) if isinstance(options, dict) else {}
            tube.set_limit(int(tube.options.get("limit", 0)))
            if "kind" in tube.options:
                tube.kind = self.kind_named(tube.options["kind"])
        self._recover_claims(queue_space)

    def _recover_claims(self, queue_space: QueueSpace) -> None:
        """The claims back, each with the tasks it holds: those whose stored headers show it, and
        for a listed claim those its record lists that are stored ready with the delivery count
        they had when claimed (the others left it: their headers were written since)."""
        for raw in self._records[CLAIM_RECORDS].pairs(0, 1, [queue_space.id]):
            fields = decode_tuple(raw)
            _sid, name, cid, ttl, grace, expires, updated = fields[:7]
            tube = self._tube(queue_space, name)
            claim = Claim(cid, ttl, grace, expires, updated, self.claim_holder(queue_space, cid))
            tube.place_claim(claim)
            claim.tasks.update(t.id for t in tube.tasks.values() if t.status == TAKEN and t.cid == claim.holder)
            if len(fields) > 8:
                claim.listed = dict(zip(fields[7], fields[8], strict=True))
                holding = tr.held_by(claim, updated)
                for task_id, ctaken in claim.listed.items():
                    task = tube.tasks.get(task_id)
                    if task is not None and task.status == READY and task.ctaken == ctaken:
                        self._leave(tube, task)
                        holding(task)
                        self._enter(tube, task)

    async def _return_left_taken(self, spaces: list[QueueSpace]) -> None:
        # The tasks loaded taken by a session are those ``_held`` notes (no session exists yet).
        by_id = {s.id: s for s in spaces}
        pending = []
        for held in list(self._held.values()):
            for task, tube in list(held.items()):
                queue_space = by_id.get(tube.space_id)
                if queue_space is not None:
                    pending.append(self._change(queue_space, tube, task, tr.made_ready, counter="ready_by_restart"))
        for later in pending:
            try:
                await later
            except Exception:
                log.exception("could not return a task left taken to ready")
        if pending:
            log.info("%d tasks left taken by the previous run are ready again", len(pending))

    def _after_recovery(self, spaces: list[QueueSpace]) -> None:
        ids = {s.id for s in spaces}
        for (sid, _name), tube in list(self.tubes.items()):
            if sid in ids:
                self._forget_if_unused(tube)
                if tube.tasks or tube.claims:
                    self._start_monitor(tube)
                if tube.limit and len(tube.tasks) > tube.limit and self._nursery is not None:
                    self._nursery.start_soon(self._enforce_limit_now, tube)

    # -- reading -------------------------------------------------------------------------------

    def meta(self, space_id: int, task_id: Any) -> list[Any]:
        tube, task = self.find(space_id, task_id)
        tube.count("meta")
        return [
            task.id, task.tube, HUMAN[task.status], task.event, task.ipri, task.pri, task.cid,
            task.created, task.ttl // 1_000_000, task.ttr // 1_000_000, task.cbury, task.ctaken, now_us(),
        ]

    def peek(self, space_id: int, task_id: Any) -> bytes:
        tube, task = self.find(space_id, task_id)
        tube.count("peek")
        raw = self.stored(self.queue_space(space_id), task)
        if raw is None:
            raise proc_error("Task not found")
        return raw

    def statistics(self, space_id: int | None = None, tube_name: str | None = None) -> list[Any]:
        """The flat list of section 5.1: counters in the order they first moved, then tasks.*.
        A forgotten tube's counters (:attr:`forgotten`) are listed with no tasks. (Plain loops: a
        monitoring client calls this often, mostly on tubes with nothing to list.)"""
        out: list[Any] = []
        if space_id is not None and tube_name is not None:
            key = (space_id, tube_name)
            tube = self.tubes.get(key)
            if tube is not None and tube.stats:
                _list_statistics(out, key, tube.stats, len(tube.tasks), tube.counts)
            remains = self.forgotten.get(key)
            if remains is not None and remains.stats:
                _list_statistics(out, key, remains.stats, 0, _NO_TASKS)
            return out
        for key, tube in self.tubes.items():
            if tube.stats and (space_id is None or key[0] == space_id) and (tube_name is None or key[1] == tube_name):
                _list_statistics(out, key, tube.stats, len(tube.tasks), tube.counts)
        for key, remains in self.forgotten.items():
            if remains.stats and (space_id is None or key[0] == space_id) and (tube_name is None or key[1] == tube_name):
                _list_statistics(out, key, remains.stats, 0, _NO_TASKS)
        return out


_NO_TASKS = dict.fromkeys(STATUS_ORDER, 0)


def _list_statistics(out: list[Any], key: tuple[int, str], stats: dict[str, int], total: int,
                     counts: dict[Any, int]) -> None:
    prefix = f"space{key[0]}.{key[1]}."
    for counter, value in stats.items():
        out += [prefix + counter, value]
    out += [prefix + "tasks.total", total]
    for status in STATUS_ORDER:
        out += [prefix + "tasks." + HUMAN[status], counts[status]]


__all__ = [
    "CLAIM_RECORDS", "OWNED_SPACES", "TUBE_RECORDS", "ChangeHook", "QueueEngine", "QueueSpace", "StorageError",
    "now_us", "proc_error",
]
