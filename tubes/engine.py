"""The tube engine: spaces, tubes, task states, consumers, monitors, recovery, the change hook.

One engine serves box.queue, Deckard and Zaqar: three vocabularies for the same tubes, so a task
put through one API can be taken through another. The engine knows:

* **spaces**: the queue spaces a user declares (the 1.5 layout, D12) and the spaces it owns (the
  tube layout of :mod:`tubes.task`: Deckard's, Zaqar's and each Zaqar pool's), each with the
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

import functools
import logging
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import lmdb
import trio

from errcodes import ER, BoxError
from spaces.catalog import Catalog
from spaces.later import Later
from spaces.msgpack_values import pack
from spaces.space import INSERT, REPLACE, Space, StorageError, decode_tuple
from tubes.kinds import BOX_QUEUE_KIND, MED_PRI, TubeKind, back_score
from tubes.task import (
    BURIED,
    DELAYED,
    DONE,
    F_CREATED,
    HEADER_FIELDS,
    HUMAN,
    QUEUE15,
    READY,
    STATUS_ORDER,
    TAKEN,
    TUBE_FORMAT,
    TUBE_KEY,
    TUBE_LAYOUT,
    Layout,
    Task,
    encode_task,
    split_data,
)
from tubes.tube import Claim, Tube

log = logging.getLogger(__name__)

IDLE_WAIT = 3600.0
INTERNAL_ERROR_RETRY_US = 5_000_000
MAX_TIME_US = 2**63 - 1  # every stored time fits a signed 64-bit integer

# (space id, tube, task id, status before or None, status after or None, stored tuple or None)
ChangeHook = Callable[[int, str, str, str | None, str | None, bytes | None], None]

# The layout of a user's queue space (D12): index parts by field number.
_LAYOUT = ((0,), (1, 2, 4, 5), (1, 3))
_UNIQUE_LAYOUT = (1, 2, 12)

# The engine's own records: which spaces it owns, tubes that exist on their own, live claims.
OWNED_SPACES = "tube_spaces"
TUBE_RECORDS = "tube_records"
CLAIM_RECORDS = "tube_claims"
_RECORD_KEYS = {
    OWNED_SPACES: [[0, "string"]],
    TUBE_RECORDS: [[0, "unsigned"], [1, "string"]],
    CLAIM_RECORDS: [[0, "unsigned"], [1, "string"], [2, "string"]],
}

# The version (4) and variant (10) bits of a random UUID.
_UUID4_CLEAR = ~((0xF << 76) | (0x3 << 62))
_UUID4_SET = (0x4 << 76) | (0x2 << 62)

Mutate = Callable[[Task], None]
Tail = tuple[int, bytes]  # fields past the header, as msgpack: how many, and their bytes


def proc_error(text: str) -> BoxError:
    """The queue's errors reach the client as ER_PROC_LUA with the original texts (D8)."""
    return BoxError(ER.PROC_LUA, message=text)


def now_us() -> int:
    return time.time_ns() // 1000


def is_queue_space(space: Space) -> bool:
    """A space with the 1.5 layout's indexes (D12)."""
    parts = tuple(space.indexes[i].fieldnos for i in sorted(space.indexes))
    return parts[:3] == _LAYOUT and (len(parts) == 3 or (len(parts) == 4 and parts[3] == _UNIQUE_LAYOUT))


def has_tube_layout(space: Space) -> bool:
    fmt = tuple((f.name, f.type) for f in space.defn.format)
    return (
        fmt[: len(TUBE_FORMAT)] == tuple((f.name, f.type) for f in TUBE_FORMAT)
        and space.primary is not None
        and space.primary.fieldnos == tuple(p[0] for p in TUBE_KEY)
    )


def pack_tail(count: int, values: Iterable[Any]) -> Tail:
    return count, b"".join(pack(v) for v in values)


class QueueSpace:
    """A space holding tasks: its layout and the kind of its tubes."""

    __slots__ = ("space", "layout", "kind", "owned")

    def __init__(self, space: Space, layout: Layout, kind: TubeKind, owned: bool) -> None:
        self.space = space
        self.layout = layout
        self.kind = kind
        self.owned = owned

    @property
    def id(self) -> int:
        return self.space.id


class BatchError(RuntimeError):
    """A write of several tasks failed part-way; the committer rolls the batch back."""


class QueueEngine:
    """All tubes of all queue spaces of one server."""

    def __init__(self, catalog: Catalog, kinds: dict[str, TubeKind] | None = None) -> None:
        self.catalog = catalog
        self.committer = catalog.committer
        self.kinds = dict(kinds or {})
        self.tubes: dict[tuple[int, str], Tube] = {}
        self._where: dict[tuple[int, str], Tube | list[Tube]] = {}  # (space id, task id) -> tube(s)
        self._held: dict[int, dict[Task, Tube]] = {}  # session -> the tasks it has taken
        self._owned: dict[int, QueueSpace] = {}
        self._checked: dict[int, tuple[Space, int, QueueSpace | None]] = {}  # D12 checks per schema
        self._records: dict[str, Space] = {}
        self._last_created = 0
        self._nursery: trio.Nursery | None = None
        self._recovered = False
        self.hooks: list[ChangeHook] = []
        self._random = random.Random()  # task ids: seeded from os.urandom
        self._upserting: dict[tuple[int, str, str], trio.Event] = {}

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
        self._checked.pop(space.id, None)
        record = [name, kind.name]
        owned = self._records[OWNED_SPACES]
        if owned.get(0, [name]) != pack(record):
            await self.committer.write(owned.prepare_put(pack(record), record, REPLACE))
        if self._recovered:
            self._recover_space(queue_space)
            await self._recover_records(queue_space)
            self._after_recovery([queue_space])
        return queue_space

    async def _open_records(self) -> None:
        """The engine's record spaces, created with the first space it owns."""
        for name, parts in _RECORD_KEYS.items():
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
            kind = self.kinds.get(kind_name) or _default_kind(kind_name)
            self._owned[space.id] = QueueSpace(space, TUBE_LAYOUT, kind, owned=True)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.open_owned()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._recover()
            task_status.started()
            await trio.sleep_forever()

    async def _recover(self) -> None:
        """Rebuild memory from LMDB. Tasks left taken by a session become ready (D10); those
        held by a claim or a deadline keep it (K13). Every tube holding tasks gets its monitor."""
        spaces = list(self.queue_spaces().values())
        for queue_space in spaces:
            self._recover_space(queue_space)
        for queue_space in spaces:
            if queue_space.owned:
                await self._recover_records(queue_space)
        self._recovered = True
        await self._return_left_taken(spaces)
        self._after_recovery(spaces)

    def _recover_space(self, queue_space: QueueSpace) -> None:
        space, layout = queue_space.space, queue_space.layout
        if space.primary is None:
            return
        loaded: dict[str, list[Task]] = {}
        for raw in space.pairs(0, 2, []):
            task = Task.from_fields(decode_tuple(raw), layout)
            loaded.setdefault(task.tube, []).append(task)
        for name, tasks in loaded.items():
            tasks.sort(key=_created)
            tube = self._tube(queue_space, name)
            for task in tasks:
                self._add(tube, task)
                if task.created > self._last_created:
                    self._last_created = task.created

    async def _recover_records(self, queue_space: QueueSpace) -> None:
        sid = queue_space.id
        for raw in self._records[TUBE_RECORDS].pairs(0, 1, [sid]):
            _sid, name, options = decode_tuple(raw)[:3]
            tube = self._tube(queue_space, name)
            tube.options = dict(options) if isinstance(options, dict) else {}
            tube.set_limit(int(tube.options.get("limit", 0)))
            if "kind" in tube.options:
                tube.kind = self.kind_named(tube.options["kind"])
        for raw in self._records[CLAIM_RECORDS].pairs(0, 1, [sid]):
            _sid, name, cid, ttl, grace, expires, updated = decode_tuple(raw)[:7]
            tube = self._tube(queue_space, name)
            claim = Claim(cid, ttl, grace, expires, updated)
            tube.place_claim(claim)
            claim.tasks.update(t.id for t in tube.tasks.values() if t.status == TAKEN and t.cid == cid)

    async def _return_left_taken(self, spaces: list[QueueSpace]) -> None:
        pending = []
        for queue_space in spaces:
            for (sid, _name), tube in list(self.tubes.items()):
                if sid != queue_space.id:
                    continue
                for task in [t for t in tube.tasks.values() if t.status == TAKEN and _is_session(t.cid)]:
                    pending.append(self._change(queue_space, tube, task, _made_ready, counter="ready_by_restart"))
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

    # -- lookups -------------------------------------------------------------------------------

    def queue_spaces(self) -> dict[int, QueueSpace]:
        """Every space holding tasks: the user's queue spaces and the engine's own."""
        found = {}
        for sid, space in self.catalog.spaces.items():
            queue_space = self._owned.get(sid)
            if queue_space is None and is_queue_space(space):
                queue_space = QueueSpace(space, QUEUE15, self.kinds.get("box.queue", BOX_QUEUE_KIND), owned=False)
            if queue_space is not None:
                found[sid] = queue_space
        return found

    def queue_space(self, space_id: Any) -> QueueSpace:
        """The queue space with this id, else ER_NO_SUCH_SPACE (D12)."""
        owned = self._owned.get(space_id) if type(space_id) is int else None
        if owned is not None and not owned.space.dropped:
            return owned
        space = self.catalog.spaces.get(space_id) if type(space_id) is int else None
        if space is None:
            raise BoxError(ER.NO_SUCH_SPACE, space_id)
        # Whether a space is laid out for the queue only changes with its indexes (DDL).
        known = self._checked.get(space_id)
        if known is None or known[0] is not space or known[1] != self.catalog.schema_version:
            queue_space = None
            if is_queue_space(space):
                queue_space = QueueSpace(space, QUEUE15, self.kinds.get("box.queue", BOX_QUEUE_KIND), owned=False)
            known = self._checked[space_id] = (space, self.catalog.schema_version, queue_space)
        if known[2] is None:
            raise BoxError(ER.NO_SUCH_SPACE, space_id)
        return known[2]

    def space(self, space_id: Any) -> Space:
        return self.queue_space(space_id).space

    def owned_spaces(self, kind_name: str | None = None) -> list[QueueSpace]:
        return [s for s in self._owned.values() if kind_name is None or s.kind.name == kind_name]

    def tube(self, space_id: int, name: str) -> Tube:
        return self._tube(self.queue_space(space_id), name)

    def kind_named(self, name: str) -> TubeKind:
        kind = self.kinds.get(name)
        if kind is None:
            kind = self.kinds[name] = _default_kind(name)
        return kind

    def _tube(self, queue_space: QueueSpace, name: str) -> Tube:
        key = (queue_space.id, name)
        tube = self.tubes.get(key)
        if tube is None:
            tube = self.tubes[key] = Tube(queue_space.id, name, queue_space.kind)
        return tube

    def existing_tube(self, space_id: int, name: str) -> Tube | None:
        return self.tubes.get((space_id, name))

    def find(self, space_id: int, task_id: Any) -> tuple[Tube, Task]:
        """The task with this id in the space (box.queue's calls name no tube)."""
        found = self._where.get((space_id, task_id)) if isinstance(task_id, str) else None
        if found is None:
            raise proc_error("Task not found")
        if type(found) is list:
            names = ", ".join(sorted(t.name for t in found))
            raise proc_error(f"Task id {task_id!r} is ambiguous in space {space_id}: tubes {names} hold one")
        return found, found.tasks[task_id]  # type: ignore[union-attr]

    def get(self, space_id: int, tube_name: str, task_id: str) -> Task | None:
        tube = self.tubes.get((space_id, tube_name))
        return None if tube is None else tube.tasks.get(task_id)

    def owned(self, space_id: int, task_id: Any, consumer: int, verb: str) -> tuple[Tube, Task]:
        """The three checks of the 1.5 module, in its order and with its texts."""
        tube, task = self.find(space_id, task_id)
        if task.status != TAKEN:
            raise proc_error("Task is not taken")
        if task.cid != consumer:
            raise proc_error(f"Only consumer that took the task can it {verb}")
        return tube, task

    def stored(self, queue_space: QueueSpace, task: Task) -> bytes | None:
        return queue_space.space.get(0, queue_space.layout.key(task))

    # -- memory --------------------------------------------------------------------------------

    def _add(self, tube: Tube, task: Task) -> None:
        tube.tasks[task.id] = task
        key = (tube.space_id, task.id)
        other = self._where.get(key)
        if other is None:
            self._where[key] = tube
        elif type(other) is list:
            other.append(tube)
        elif other is not tube:
            self._where[key] = [other, tube]  # type: ignore[list-item]
        self._enter(tube, task)

    def _remove(self, tube: Tube, task: Task) -> None:
        self._leave(tube, task)
        del tube.tasks[task.id]
        if not tube.tasks:
            tube.monitor_wakeup.set()  # its monitor ends, and the tube may be forgotten
        key = (tube.space_id, task.id)
        other = self._where.get(key)
        if other is tube:
            del self._where[key]
        elif type(other) is list:
            other.remove(tube)
            if len(other) == 1:
                self._where[key] = other[0]

    def _enter(self, tube: Tube, task: Task) -> None:
        tube.enter(task)
        if task.status == TAKEN and _is_session(task.cid):
            self._held.setdefault(task.cid, {})[task] = tube
        if task.event < tube.monitor_until:
            tube.monitor_wakeup.set()
        if not tube.monitor_running:
            self._start_monitor(tube)

    def _leave(self, tube: Tube, task: Task) -> None:
        tube.leave(task)
        if task.status == TAKEN and _is_session(task.cid):
            held = self._held.get(task.cid)
            if held is not None:
                held.pop(task, None)
                if not held:
                    del self._held[task.cid]

    def _next_created(self) -> int:
        created = now_us()
        if created <= self._last_created:
            created = self._last_created + 1
        self._last_created = created
        return created

    def new_id(self) -> str:
        """32 lowercase hex digits of a version 4 UUID, as 1.5's uuid_hex gave."""
        bits = self._random.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET
        return f"{bits:032x}"

    def _forget_if_unused(self, tube: Tube) -> None:
        """Forget a tube memory need not keep; a record that only named its kind goes too."""
        key = (tube.space_id, tube.name)
        if tube.unused() and self.tubes.get(key) is tube:
            del self.tubes[key]
            if tube.options is not None:
                tube.options = None
                self.committer.submit(self._record_write(TUBE_RECORDS, None, list(key)),
                                      _log_failure(f"deleting the record of tube {tube.name!r}"))

    # -- writes --------------------------------------------------------------------------------

    def _change(
        self,
        queue_space: QueueSpace,
        tube: Tube,
        task: Task,
        mutate: Mutate,
        *,
        counter: str | None = None,
        tail: Tail | None = None,
        after: Callable[[], None] | None = None,
    ) -> Later[bytes]:
        """Change ``task`` in memory (counting ``counter`` with it) and write it, keeping its
        stored attachments and data unless ``tail`` is given; the Later gives the stored tuple
        once durable, after ``after()`` has run. A write that fails undoes both."""
        before = task.copy()
        self._leave(tube, task)
        mutate(task)
        self._enter(tube, task)
        if counter is not None:
            tube.count(counter)
        header = task.header()
        keep = queue_space.layout.header
        if tail is None:

            def transform(old: bytes) -> bytes:
                return encode_task(header, *split_data(old, keep))
        else:

            def transform(old: bytes) -> bytes:
                return encode_task(header, *tail)

        def undo() -> None:
            if counter is not None:
                tube.uncount(counter)
            if tube.tasks.get(task.id) is task and task.header() == header:
                self._leave(tube, task)
                task.restore(before)
                self._enter(tube, task)

        later: Later[bytes] = Later()

        def done(raw: bytes | None, error: BaseException | None) -> None:
            if error is None and raw is None:
                error = proc_error("Task not found")
            if error is not None:
                undo()
                later.settle(None, error)
                return
            self._notify(tube, task.id, before.status, task.status, raw)
            if after is not None:
                after()
            later.settle(raw)

        try:
            self.committer.submit(queue_space.space.prepare_transform(queue_space.layout.key(task), transform), done)
        except BaseException:
            undo()
            raise
        return later

    def _delete(self, queue_space: QueueSpace, tube: Tube, task: Task, counters: tuple[str, ...] = ()) -> Later[bytes]:
        self._remove(tube, task)
        for counter in counters:
            tube.count(counter)

        def undo() -> None:
            for counter in counters:
                tube.uncount(counter)
            if task.id not in tube.tasks:
                self._add(tube, task)

        later: Later[bytes] = Later()

        def done(raw: bytes | None, error: BaseException | None) -> None:
            if error is not None:
                undo()
                later.settle(None, error)
                return
            self._notify(tube, task.id, task.status, None, None)
            later.settle(raw)

        try:
            self.committer.submit(queue_space.space.prepare_delete(0, queue_space.layout.key(task)), done)
        except BaseException:
            undo()
            raise
        return later

    def _batch(
        self,
        queue_space: QueueSpace,
        tube: Tube,
        *,
        changes: Iterable[tuple[Task, Mutate, Tail | None]] = (),
        deletes: Iterable[Task] = (),
        inserts: Iterable[tuple[Task, Tail]] = (),
        records: Iterable[Callable[[lmdb.Transaction], Any]] = (),
        counters: Iterable[str] = (),
        undo_extra: Callable[[], None] | None = None,
    ) -> Later[list[bytes | None]]:
        """Several changes of one tube as one write (one commit): ``changes`` and ``deletes``
        happen in memory now, ``inserts`` once durable; ``records`` are written with them. The
        Later gives the stored tuples: changed, then deleted, then inserted ones."""
        space, layout = queue_space.space, queue_space.layout
        keep = layout.header
        done_changes: list[tuple[Task, Task, list[Any]]] = []
        writes: list[Callable[[lmdb.Transaction], Any]] = []
        counted = list(counters)
        for counter in counted:
            tube.count(counter)
        for task, mutate, tail in changes:
            before = task.copy()
            self._leave(tube, task)
            mutate(task)
            self._enter(tube, task)
            header = task.header()
            done_changes.append((task, before, header))
            if tail is None:
                transform = _keeping_tail(header, keep)
            else:
                transform = _with_tail(header, tail)
            writes.append(space.prepare_transform(layout.key(task), transform))
        deleted = [t for t in deletes if tube.tasks.get(t.id) is t]
        for task in deleted:
            self._remove(tube, task)
            writes.append(space.prepare_delete(0, layout.key(task)))
        new = list(inserts)
        for task, (count, tail_raw) in new:
            raw = encode_task(task.header(), count, tail_raw)
            writes.append(space.prepare_put(raw, decode_tuple(raw), REPLACE))
        writes.extend(records)
        if new:
            tube.pending += 1

        def undo() -> None:
            for counter in counted:
                tube.uncount(counter)
            for task, before, header in reversed(done_changes):
                if tube.tasks.get(task.id) is task and task.header() == header:
                    self._leave(tube, task)
                    task.restore(before)
                    self._enter(tube, task)
            for task in deleted:
                if task.id not in tube.tasks:
                    self._add(tube, task)
            if undo_extra is not None:
                undo_extra()

        def write(txn: lmdb.Transaction) -> list[Any]:
            results = []
            try:
                for fn in writes:
                    results.append(fn(txn))
            except BoxError as exc:  # part of the batch is written: the committer must roll back
                raise BatchError(f"a write of tube {tube.name!r} failed: {exc.message}") from exc
            if any(r is None for r in results[: len(done_changes)]):
                raise BatchError(f"a task of tube {tube.name!r} is missing from its space")
            return results

        later: Later[list[bytes | None]] = Later()

        def done(results: list[Any] | None, error: BaseException | None) -> None:
            if new:
                tube.pending -= 1
            if error is not None:
                undo()
                later.settle(None, error)
                return
            assert results is not None
            for (task, before, _header), raw in zip(done_changes, results, strict=False):
                self._notify(tube, task.id, before.status, task.status, raw)
            for task in deleted:
                self._notify(tube, task.id, task.status, None, None)
            inserted = results[len(done_changes) + len(deleted):][: len(new)]
            self._place_inserted(queue_space, tube, [(task, raw) for (task, _tail), raw in zip(new, inserted, strict=True)])
            later.settle(results[: len(done_changes) + len(deleted) + len(new)])

        try:
            self.committer.submit(write, done)
        except BaseException:
            if new:
                tube.pending -= 1
            undo()
            raise
        return later

    def _place_inserted(self, queue_space: QueueSpace, tube: Tube, inserted: list[tuple[Task, bytes]]) -> None:
        """Tasks whose insert is durable become visible; if their tube was dropped meanwhile,
        they are deleted again (nothing outlives its tube)."""
        if not inserted:
            return
        if tube.dropped:
            deletes = [queue_space.space.prepare_delete(0, queue_space.layout.key(t)) for t, _raw in inserted]
            self.committer.submit(_all(deletes), _log_failure("deleting tasks put into a dropped tube"))
            return
        woke = False
        for task, raw in inserted:
            if task.id in tube.tasks:  # a concurrent put of the same key (upserts wait for each other)
                continue
            self._add(tube, task)
            if task.status == READY:
                woke = True
            self._notify(tube, task.id, None, task.status, raw)
        if woke:
            tube.wake_one_consumer()

    def _notify(self, tube: Tube, task_id: str, old: str | None, new: str | None, raw: bytes | None) -> None:
        for hook in self.hooks:
            try:
                hook(tube.space_id, tube.name, task_id, old, new, raw)
            except Exception:
                log.exception("task change hook failed")

    def _record_write(self, name: str, record: list[Any] | None, key: list[Any]) -> Callable[[lmdb.Transaction], Any]:
        space = self._records[name]
        if record is None:
            return space.prepare_delete(0, key)
        return space.prepare_put(pack(record), record, REPLACE)

    # -- producers -----------------------------------------------------------------------------

    def new_task(
        self,
        queue_space: QueueSpace,
        tube: Tube,
        *,
        delay: int = 0,
        ttl: int | None = None,
        ttr: int | None = None,
        ipri: Any = MED_PRI,
        pri: Any,
        task_id: str | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> Task:
        """A task not stored yet: ``ttl`` counts from its creation and includes ``delay``."""
        created = self._next_created()
        kind = tube.kind
        life = (kind.default_ttl if ttl is None else ttl) + delay
        life = min(max(life, 0), MAX_TIME_US - created)
        if delay > 0:
            status, event = DELAYED, min(now_us() + delay, created + life)
        else:
            status, event = READY, created + life
        if queue_space.layout is TUBE_LAYOUT and attrs is None:
            attrs = {}
        return Task(
            self.new_id() if task_id is None else task_id, tube.name, status, event, ipri, pri, 0, created,
            life, kind.default_ttr if ttr is None else ttr, 0, 0, attrs,
        )

    def tail(self, queue_space: QueueSpace, data: list[Any], attachments: dict[str, Any] | None = None) -> Tail:
        """The fields past the header: the attachments map in the tube layout, then the data."""
        if queue_space.layout is TUBE_LAYOUT:
            return pack_tail(len(data) + 1, [attachments or {}, *data])
        return pack_tail(len(data), data)

    def put(
        self,
        space_id: int,
        tube_name: str,
        *,
        delay: int,
        ttl: int | None,
        ttr: int | None,
        pri: int,
        data: list[Any],
        ipri: int | None = None,
        counter: str | None = None,
        kind: TubeKind | None = None,
    ) -> Later[bytes]:
        """box.queue's insert: the position comes from the tube's kind (``ipri`` None: the
        default lane; urgent passes its lane). ``counter`` counts when the put is durable;
        ``kind`` is the caller's, which a tube holding nothing yet takes."""
        queue_space = self.queue_space(space_id)
        tube = self._tube(queue_space, tube_name)
        records, options = self._adopt(queue_space, tube, kind)
        ipri_, pri_ = tube.kind.put_order(pri, ipri)
        task = self.new_task(queue_space, tube, delay=delay, ttl=ttl, ttr=ttr, ipri=ipri_, pri=pri_)
        if queue_space.layout is QUEUE15 and not records:
            return self._put_one(queue_space, tube, task, data, counter)
        later = self._batch(queue_space, tube, inserts=[(task, self.tail(queue_space, data))], records=records)
        return later.map(lambda results: _counted(tube, counter, results[0], options))

    def _put_one(self, queue_space: QueueSpace, tube: Tube, task: Task, data: list[Any], counter: str | None) -> Later[bytes]:
        """A put into a 1.5 space: one insert, placed once durable."""
        fields = task.header() + data
        raw = pack(fields)
        write = queue_space.space.prepare_put(raw, fields, INSERT)
        later: Later[bytes] = Later()
        tube.pending += 1

        def done(_result: Any, error: BaseException | None) -> None:
            tube.pending -= 1
            if error is not None:
                later.settle(None, error)
                return
            if counter is not None:
                tube.count(counter)
            self._place_inserted(queue_space, tube, [(task, raw)])
            later.settle(raw)

        try:
            self.committer.submit(write, done)
        except BaseException:
            tube.pending -= 1
            raise
        return later

    def put_many(
        self, space_id: int, tube_name: str, items: list[tuple[int | None, list[Any], dict[str, Any]]],
        kind: TubeKind | None = None,
    ) -> Later[list[Task]]:
        """Several tasks of the tube's default position, all or nothing: ``(ttl, data, attrs)``
        each (Zaqar's post). The tube's record is written with them if it needs one."""
        queue_space = self.queue_space(space_id)
        tube = self._tube(queue_space, tube_name)
        records, options = self._adopt(queue_space, tube, kind)
        ipri, pri = tube.kind.put_order(0, None)
        tasks = [self.new_task(queue_space, tube, ttl=ttl, ipri=ipri, pri=pri, attrs=attrs) for ttl, _d, attrs in items]
        inserts = [(task, self.tail(queue_space, data)) for task, (_t, data, _a) in zip(tasks, items, strict=True)]
        later = self._batch(queue_space, tube, inserts=inserts, records=records)
        return later.map(lambda _results: _counted(tube, None, tasks, options))

    def urgent_ipri(self, tube: Tube) -> int:
        """Ahead of the current head of the ready list (D2, section 2.2)."""
        head = tube.first_ready()
        if head is None or not tube.kind.urgent_lanes:
            return MED_PRI
        return max(int(head.ipri) - 1, 0)

    async def put_unique(
        self, space_id: int, tube_name: str, *, delay: int, ttl: int | None, ttr: int | None, pri: int, data: list[Any],
        kind: TubeKind | None = None,
    ) -> tuple[bytes, bool]:
        """A task, unless a ready (delayed, with a delay) task of the tube has the same first
        data field: then that one. Returns the stored tuple and whether it was inserted."""
        queue_space = self.queue_space(space_id)
        space = queue_space.space
        if 3 not in space.indexes:
            raise proc_error("Tarantool have to be configured to use queue.put_unique method")
        tube = self._tube(queue_space, tube_name)
        status = DELAYED if delay > 0 else READY
        if tube.unique_lock is None:
            tube.unique_lock = trio.Lock()
        async with tube.unique_lock:
            found = space.select(3, 0, [tube_name, status, data[0]], 0, 1)
            if found:
                return found[0], False
            put = self.put(space_id, tube_name, delay=delay, ttl=ttl, ttr=ttr, pri=pri, data=data, counter="put",
                           kind=kind)
            return await put, True

    async def upsert(
        self, space_id: int, items: list[tuple[str, str, float, int, dict[str, Any], list[Any]]],
        kind: TubeKind | None = None,
    ) -> tuple[int, int]:
        """Insert or refresh tasks by (tube, id), in one commit: ``(tube, id, pri, expires,
        attachments, data)`` each (Deckard's Add, K10). A new task is ready with ``pri``; an
        existing one keeps its state, priority, position and attrs, and gets the new
        attachments, data and expiry. Returns (created, updated). A tube over its limit then
        evicts the tasks closest to expiry (K8)."""
        queue_space = self.queue_space(space_id)
        keys = {(space_id, tube, task_id) for tube, task_id, *_rest in items}
        while True:
            busy = [self._upserting[k] for k in keys if k in self._upserting]
            if not busy:
                break
            await busy[0].wait()
        finished = trio.Event()
        for key in keys:
            self._upserting[key] = finished
        try:
            return await self._upsert(queue_space, items, kind)
        finally:
            for key in keys:
                del self._upserting[key]
            finished.set()

    async def _upsert(
        self, queue_space: QueueSpace, items: list[tuple[str, str, float, int, dict[str, Any], list[Any]]],
        kind: TubeKind | None,
    ) -> tuple[int, int]:
        by_tube: dict[str, list[tuple[str, float, int, dict[str, Any], list[Any]]]] = {}
        for tube_name, task_id, pri, expires, attachments, data in items:
            by_tube.setdefault(tube_name, []).append((task_id, pri, expires, attachments, data))
        created = updated = 0
        pending = []
        for tube_name, entries in by_tube.items():
            tube = self._tube(queue_space, tube_name)
            records, options = self._adopt(queue_space, tube, kind)
            new: dict[str, tuple[Task, Tail]] = {}
            changes: list[tuple[Task, Mutate, Tail | None]] = []
            for task_id, pri, expires, attachments, data in entries:
                tail = self.tail(queue_space, data, attachments)
                if task_id in new:
                    task = new[task_id][0]
                    task.ttl = _life(expires, task.created)
                    task.event = task.created + task.ttl
                    new[task_id] = (task, tail)
                    updated += 1
                    continue
                existing = tube.tasks.get(task_id)
                if existing is None:
                    task = self.new_task(queue_space, tube, ipri=MED_PRI, pri=pri, task_id=task_id)
                    task.ttl = _life(expires, task.created)
                    task.event = task.created + task.ttl
                    new[task_id] = (task, tail)
                    created += 1
                else:
                    changes.append((existing, _expiring_at(expires), tail))
                    updated += 1
            later = self._batch(queue_space, tube, changes=changes, inserts=list(new.values()), records=records)
            pending.append((tube, later.map(functools.partial(_counted, tube, None, options=options))))
        error: BaseException | None = None
        for _tube, later in pending:
            try:
                await later
            except BaseException as exc:  # every batch is awaited, the first error is raised
                error = error or exc
        if error is not None:
            raise error
        for tube, _later in pending:
            if tube.limit and len(tube.tasks) > tube.limit:
                await self._enforce_limit(queue_space, tube)
        return created, updated

    # -- consumers: box.queue's take and its verbs -------------------------------------------

    def take(self, space_id: int, tube_name: str, consumer: int, timeout: float) -> Awaitable[bytes | None]:
        """The first ready task in take order, waiting up to ``timeout`` seconds for one.

        A task ready now is taken without a task of its own (a :class:`Later`); only a take that
        has to wait is a coroutine."""
        queue_space = self.queue_space(space_id)
        tube = self._tube(queue_space, tube_name)
        taking = self._take_ready(queue_space, tube, consumer)
        if taking is not None:
            return taking
        if timeout <= 0:
            tube.count("take_timeout")
            return Later.done(None)
        return self._take_waiting(queue_space, tube_name, consumer, trio.current_time() + timeout)

    async def _take_waiting(self, queue_space: QueueSpace, tube_name: str, consumer: int, deadline: float) -> bytes | None:
        while True:
            tube = self._tube(queue_space, tube_name)
            waiter = trio.Event()
            tube.waiters.append(waiter)
            try:
                with trio.move_on_at(deadline):
                    await waiter.wait()
            finally:
                if not waiter.is_set():
                    try:
                        tube.waiters.remove(waiter)
                    except ValueError:
                        pass
            tube = self._tube(queue_space, tube_name)
            taking = self._take_ready(queue_space, tube, consumer)
            if taking is not None:
                return await taking
            if trio.current_time() >= deadline:
                tube.count("take_timeout")
                return None

    def _take_ready(self, queue_space: QueueSpace, tube: Tube, consumer: int) -> Later[bytes] | None:
        task = self._first_live_ready(tube)
        if task is None:
            return None
        event = min(now_us() + task.ttr, task.created + task.ttl)

        def taken(t: Task) -> None:
            t.status, t.event, t.cid, t.ctaken = TAKEN, event, consumer, t.ctaken + 1

        return self._change(queue_space, tube, task, taken, counter="take", after=tube.wake_one_consumer)

    def _first_live_ready(self, tube: Tube) -> Task | None:
        """The head of the ready list, skipping tasks already past their ttl (D7): the monitor,
        woken here, deletes those."""
        now = now_us()
        for key in tube.ready:
            task = tube.tasks[key[3]]
            if task.created + task.ttl > now:
                return task
            tube.monitor_wakeup.set()
        return None

    def ack(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "ack")
        return self._delete(self.queue_space(space_id), tube, task, ("ack",))

    def touch(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "touch")
        event = min(now_us() + task.ttr, task.expires)

        def touched(t: Task) -> None:
            t.event = event

        return self._change(self.queue_space(space_id), tube, task, touched, counter="touch")

    def done(self, space_id: int, task_id: Any, consumer: int, data: list[Any]) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "done")
        queue_space = self.queue_space(space_id)
        tail = None
        if queue_space.layout is QUEUE15:
            tail = pack_tail(len(data), data)
        else:  # the attachments stay
            raw = self.stored(queue_space, task)
            attachments = decode_tuple(raw)[13] if raw is not None else {}
            tail = self.tail(queue_space, data, attachments)

        def finished(t: Task) -> None:
            t.status, t.event = DONE, t.expires

        return self._change(queue_space, tube, task, finished, counter="done", tail=tail)

    def bury(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        tube, task = self.owned(space_id, task_id, consumer, "done")  # sic: 1.5's text (D8)

        def buried(t: Task) -> None:
            t.status, t.event, t.cbury = BURIED, t.expires, t.cbury + 1

        return self._change(self.queue_space(space_id), tube, task, buried, counter="bury")

    def dig(self, space_id: int, task_id: Any) -> Later[bytes]:
        tube, task = self.find(space_id, task_id)
        if task.status != BURIED:
            raise proc_error("Task is not buried")
        return self._change(self.queue_space(space_id), tube, task, _unburied, counter="dig",
                            after=tube.wake_one_consumer)  # D7

    async def kick(self, space_id: int, tube_name: str, count: int) -> int:
        """Up to ``count`` buried tasks, in take order, become ready (D5)."""
        queue_space = self.queue_space(space_id)
        tube = self._tube(queue_space, tube_name)
        if count <= 0:
            return 0
        chosen = tube.buried_in_order()[:count]
        pending = [
            self._change(queue_space, tube, task, _unburied, counter="dig", after=tube.wake_one_consumer)  # D7
            for task in chosen
        ]
        kicked = 0
        for later in pending:
            await later
            kicked += 1
        return kicked

    def release(self, space_id: int, task_id: Any, consumer: int, delay: int, ttl_s: float | None) -> Later[bytes]:
        """Back to ready (or delayed); a given ttl restarts the task's life from now (+delay)."""
        tube, task = self.owned(space_id, task_id, consumer, "release")
        now = now_us()
        ttl = task.ttl
        if ttl_s is not None and ttl_s > 0:
            ttl = int(ttl_s * 1_000_000) + (now - task.created) + max(delay, 0)

        def released(t: Task) -> None:
            t.ttl, t.cid = ttl, 0
            if delay > 0:
                t.status, t.event = DELAYED, min(now + delay, t.expires)
            else:
                t.status, t.event = READY, t.expires

        after = tube.wake_one_consumer if delay <= 0 else None
        return self._change(self.queue_space(space_id), tube, task, released, counter="release", after=after)

    def requeue(self, space_id: int, task_id: Any, consumer: int) -> Later[bytes]:
        """Back to ready behind every ready task of the tube, whatever their priority (D13)."""
        tube, task = self.owned(space_id, task_id, consumer, "release")  # sic: 1.5's text (D8)
        last = tube.last_ready()
        ipri, pri = tube.kind.requeue_order(None if last is None else int(last.ipri), task.ipri, task.pri)

        def requeued(t: Task) -> None:
            t.status, t.event, t.cid, t.ipri, t.pri = READY, t.expires, 0, ipri, pri

        return self._change(self.queue_space(space_id), tube, task, requeued, counter="requeue",
                            after=tube.wake_one_consumer)

    def delete(self, space_id: int, task_id: Any) -> Later[bytes]:
        tube, task = self.find(space_id, task_id)
        return self._delete(self.queue_space(space_id), tube, task, ("delete",))

    async def truncate(self, space_id: int, tube_name: str) -> int:
        """Every task of the tube is deleted; the tube itself (its record, its claims) stays."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        if tube is None or not tube.tasks:
            return 0
        doomed = list(tube.tasks.values())
        await self._batch(queue_space, tube, deletes=doomed)
        return len(doomed)

    async def release_consumer(self, consumer: int) -> None:
        """The consumer is gone (its connection closed): its taken tasks are ready at once (D11),
        counted as ``ready_by_disconnect`` in the same step."""
        held = list(self._held.get(consumer, {}).items())
        pending = []
        for task, tube in held:
            if task.status == TAKEN and task.cid == consumer and tube.tasks.get(task.id) is task:
                try:
                    queue_space = self.queue_space(tube.space_id)
                except BoxError:
                    continue  # its space is gone
                pending.append(self._change(queue_space, tube, task, _made_ready, counter="ready_by_disconnect",
                                            after=tube.wake_one_consumer))
        for later in pending:
            try:
                await later
            except Exception:
                log.exception("could not return a task of consumer %s to ready", consumer)

    # -- consumers: pulls, settles, claims (Deckard's and Zaqar's) --------------------------

    def free_tasks(self, tube: Tube, limit: int, low: float = -math.inf, high: float = math.inf) -> list[Task]:
        """Up to ``limit`` ready tasks that have not expired, in take order, with a priority
        in [low, high] (a Deckard score range: its tubes keep ipri at 127)."""
        now = now_us()
        keys = tube.ready if low == -math.inf and high == math.inf else tube.ready.irange(
            (MED_PRI, low), (MED_PRI, high, math.inf))
        chosen: list[Task] = []
        for key in keys:
            task = tube.tasks[key[3]]
            if task.created + task.ttl <= now:
                tube.monitor_wakeup.set()
                continue
            chosen.append(task)
            if len(chosen) >= limit:
                break
        return chosen

    def take_many(
        self, space_id: int, tube_name: str, limit: int, ttr: int, low: float = -math.inf, high: float = math.inf
    ) -> Later[list[tuple[Task, bytes]]]:
        """Up to ``limit`` ready tasks taken by nobody until ``ttr`` from now (a Deckard pull:
        an ack deadline with no session), with their stored tuples."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        chosen = [] if tube is None or limit <= 0 else self.free_tasks(tube, limit, low, high)
        if not chosen:
            return Later.done([])
        assert tube is not None
        deadline = min(now_us() + ttr, MAX_TIME_US)

        def pulled(t: Task) -> None:
            t.status, t.event, t.cid, t.ttr, t.ctaken = TAKEN, min(deadline, t.expires), 0, ttr, t.ctaken + 1

        later = self._batch(queue_space, tube, changes=[(t, pulled, None) for t in chosen])
        return later.map(lambda raws: [(t.copy(), raw) for t, raw in zip(chosen, raws, strict=True)])

    def untake(self, space_id: int, tube_name: str, ids: Iterable[str]) -> Later[list[bytes | None]]:
        """Taken tasks back to ready where they were, as if never taken."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        found = [] if tube is None else [t for i in ids if (t := tube.tasks.get(i)) is not None and t.status == TAKEN]
        if not found:
            return Later.done([])
        assert tube is not None

        def back(t: Task) -> None:
            t.status, t.event, t.cid, t.ctaken = READY, t.expires, 0, max(t.ctaken - 1, 0)

        return self._batch(queue_space, tube, changes=[(t, back, None) for t in found])

    def settle(
        self,
        space_id: int,
        tube_name: str,
        task_id: str,
        *,
        pri: float | None,
        delay: int = 0,
        unlock_pri: float | None = None,
        attrs: Callable[[dict[str, Any]], None] | None = None,
    ) -> Later[bool]:
        """A taken task (by anyone) released: ready at once with ``pri`` (None: the back of a
        tube of its kind), or locked for ``delay`` and then ready with ``unlock_pri`` (None: the
        back, at that time). ``attrs`` updates the task's attrs. False if it is not taken."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        task = None if tube is None else tube.tasks.get(task_id)
        if task is None or task.status != TAKEN:
            return Later.done(False)
        assert tube is not None
        now = now_us()

        def settled(t: Task) -> None:
            if attrs is not None:
                if t.attrs is None:
                    raise proc_error("this space keeps no attributes")
                attrs(t.attrs)
            t.cid = 0
            if delay > 0:
                t.status, t.event = DELAYED, min(now + delay, t.expires, MAX_TIME_US)
                if t.attrs is not None:
                    t.attrs["unlock"] = unlock_pri
            else:
                t.status, t.event = READY, t.expires
                t.pri = back_score() if pri is None else pri

        return self._change(queue_space, tube, task, settled, after=tube.wake_one_consumer).map(lambda _raw: True)

    def remove(self, space_id: int, tube_name: str, ids: Iterable[str], *, only_free: bool = False) -> Later[list[Task]]:
        """Delete the tasks with these ids (that exist; with ``only_free``, that are ready)."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        if tube is None:
            return Later.done([])
        found = [t for i in dict.fromkeys(ids) if (t := tube.tasks.get(i)) is not None]
        if only_free:
            found = [t for t in found if t.status == READY]
        if not found:
            return Later.done([])
        return self._batch(queue_space, tube, deletes=found).map(lambda _raws: found)

    def pop(self, space_id: int, tube_name: str, limit: int) -> Later[list[tuple[Task, bytes]]]:
        """Take and delete up to ``limit`` free tasks at once (Zaqar's pop)."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        chosen = [] if tube is None else self.free_tasks(tube, limit)
        if not chosen:
            return Later.done([])
        assert tube is not None
        return self._batch(queue_space, tube, deletes=chosen).map(
            lambda raws: list(zip(chosen, raws, strict=True)))

    def claim(
        self, space_id: int, tube_name: str, *, ttl: int, grace: int, limit: int
    ) -> Later[tuple[Claim, list[tuple[Task, bytes]]] | None]:
        """A new claim holding up to ``limit`` free tasks, in take order, until ``ttl`` from now;
        a task that would die before the claim lives ``grace`` past it. None if nothing is free."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        chosen = [] if tube is None else self.free_tasks(tube, limit)
        if not chosen:
            return Later.done(None)
        assert tube is not None
        now = now_us()
        claim = Claim(uuid.uuid4().hex, ttl, grace, now + ttl, now)
        tube.place_claim(claim)
        holding = _held_by(claim, now)
        record = self._record_write(CLAIM_RECORDS, claim.record(space_id, tube_name), [])
        later = self._batch(queue_space, tube, changes=[(t, holding, None) for t in chosen], records=[record],
                            undo_extra=lambda: tube.unplace_claim(claim))
        return later.map(lambda raws: (claim, [(t, raw) for t, raw in zip(chosen, raws, strict=True) if raw]))

    def live_claim(self, space_id: int, tube_name: str, claim_id: str) -> Claim | None:
        tube = self.tubes.get((space_id, tube_name))
        claim = None if tube is None else tube.claims.get(claim_id)
        return claim if claim is not None and claim.expires > now_us() else None

    def claimed_tasks(self, space_id: int, tube_name: str, claim: Claim) -> list[Task]:
        """The live tasks a claim holds, in creation order."""
        tube = self.tubes.get((space_id, tube_name))
        if tube is None:
            return []
        now = now_us()
        tasks = [t for i in claim.tasks if (t := tube.tasks.get(i)) is not None and t.expires > now]
        return sorted(tasks, key=_created)

    def renew_claim(self, space_id: int, tube_name: str, claim_id: str, *, ttl: int, grace: int) -> Later[bool]:
        """The claim lasts ``ttl`` from now; its tasks get the same extension as at claiming."""
        queue_space = self.queue_space(space_id)
        claim = self.live_claim(space_id, tube_name, claim_id)
        if claim is None:
            return Later.done(False)
        tube = self.tubes[(space_id, tube_name)]
        now = now_us()
        before = (claim.ttl, claim.grace, claim.expires, claim.updated)
        tube.unplace_claim(claim)
        claim.ttl, claim.grace, claim.expires, claim.updated = ttl, grace, now + ttl, now
        tube.place_claim(claim)
        holding = _held_by(claim, now)
        tasks = [tube.tasks[i] for i in sorted(claim.tasks)]

        def undo() -> None:
            tube.unplace_claim(claim)
            claim.ttl, claim.grace, claim.expires, claim.updated = before
            tube.place_claim(claim)

        record = self._record_write(CLAIM_RECORDS, claim.record(space_id, tube_name), [])
        return self._batch(queue_space, tube, changes=[(t, holding, None) for t in tasks], records=[record],
                           undo_extra=undo).map(lambda _raws: True)

    def release_claim(self, space_id: int, tube_name: str, claim_id: str) -> Later[None]:
        """The claim ends now: its tasks are free (and no longer show it)."""
        queue_space = self.queue_space(space_id)
        tube = self.tubes.get((space_id, tube_name))
        claim = None if tube is None else tube.claims.get(claim_id)
        if claim is None:
            return Later.done(None)
        assert tube is not None
        tasks = [tube.tasks[i] for i in sorted(claim.tasks)]
        tube.unplace_claim(claim)
        record = self._record_write(CLAIM_RECORDS, None, [space_id, tube_name, claim_id])
        later = self._batch(queue_space, tube, changes=[(t, _made_ready, None) for t in tasks], records=[record],
                            undo_extra=lambda: tube.place_claim(claim))
        return later.map(lambda _raws: None)

    # -- tubes that exist on their own, limits ---------------------------------------------

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
        doomed = [tube.tasks[key[2]] for key in tube.by_expiry[:excess]]
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
        """The flat list of section 5.1: counters in the order they first moved, then tasks.*."""
        out: list[Any] = []
        for (sid, name), tube in self.tubes.items():
            if space_id is not None and sid != space_id:
                continue
            if tube_name is not None and name != tube_name:
                continue
            if not tube.stats:
                continue
            prefix = f"space{sid}.{name}."
            for counter, value in tube.stats.items():
                out += [prefix + counter, value]
            out += [prefix + "tasks.total", len(tube.tasks)]
            for status in STATUS_ORDER:
                out += [prefix + "tasks." + HUMAN[status], tube.counts[status]]
        return out

    # -- monitors ------------------------------------------------------------------------------

    def _start_monitor(self, tube: Tube) -> None:
        if self._nursery is None or tube.monitor_running:
            return
        tube.monitor_running = True
        self._nursery.start_soon(self._monitor, tube)

    async def _monitor(self, tube: Tube) -> None:
        """Delays and locks ending, deadlines passing, tasks and claims expiring, each at its
        own time, for one tube; ends when the tube holds nothing timed."""
        key = (tube.space_id, tube.name)
        try:
            while self.tubes.get(key) is tube and (tube.tasks or tube.claims):
                tube.monitor_wakeup = trio.Event()
                tube.monitor_until = -math.inf  # busy: every change counts as earlier
                try:
                    await self._act(self.queue_space(tube.space_id), tube, now_us())
                except BoxError as exc:
                    if exc.code == ER.NO_SUCH_SPACE:
                        return  # the space is gone
                    raise
                except Exception:
                    log.exception("monitor of tube %r of space %d failed", tube.name, tube.space_id)
                    await trio.sleep(0.1)
                    continue
                if tube.monitor_wakeup.is_set():
                    continue
                when = tube.next_time()
                if when == math.inf and not tube.tasks and not tube.claims:
                    return
                tube.monitor_until = when
                wait = IDLE_WAIT if when == math.inf else (when - now_us()) / 1_000_000
                with trio.move_on_after(max(wait, 0)):
                    await tube.monitor_wakeup.wait()
        finally:
            tube.monitor_running = False
            tube.monitor_until = math.inf
            self._forget_if_unused(tube)

    async def _act(self, queue_space: QueueSpace, tube: Tube, now: int) -> None:
        due = [tube.tasks[key[2]] for key in tube.timeline.irange(maximum=(now, math.inf))]
        expired = [t for t in due if now >= t.created + t.ttl]
        counters: list[str] = []
        if tube.kind.name == "box.queue" or tube.stats:  # another kind's tube shows box.queue's
            for task in expired:  # counters once box.queue has used it
                counters += ["ttl.total", "ttl." + HUMAN[task.status]]
        changes = []
        for task in due:
            if now >= task.created + task.ttl:
                continue
            if task.status in (DELAYED, TAKEN):
                changes.append((task, self._ready_again(tube, task), None))
            else:
                log.error("Internal error: unexpected task status %r of task %s", task.status, task.id)
                changes.append((task, _retry_later(now), None))
        ended = [tube.claims[cid] for _t, cid in tube.claim_times.irange(maximum=(now, "\U0010ffff"))]
        records = []
        for claim in ended:
            tube.unplace_claim(claim)
            records.append(self._record_write(CLAIM_RECORDS, None, [tube.space_id, tube.name, claim.id]))
        if not (expired or changes or records):
            return

        def put_back_claims() -> None:
            for claim in ended:
                tube.place_claim(claim)

        await self._batch(queue_space, tube, changes=changes, deletes=expired, records=records, counters=counters,
                          undo_extra=put_back_claims)
        if any(task.status == READY for task, _m, _t in changes):
            tube.wake_one_consumer()

    def _ready_again(self, tube: Tube, task: Task) -> Mutate:
        """A delay or lock ending (with the priority the lock gave), or a deadline passing (a
        Deckard tube's task then goes to the front, K7; a session's cid is cleared, a claim's id
        stays for Zaqar to show)."""
        timeout_pri = tube.kind.timeout_pri if task.status == TAKEN else None

        def ready(t: Task) -> None:
            if t.status == DELAYED and t.attrs and "unlock" in t.attrs:
                unlock = t.attrs.pop("unlock")
                t.pri = back_score() if unlock is None else unlock
            elif timeout_pri is not None:
                t.pri = timeout_pri
            if type(t.cid) is not str:
                t.cid = 0
            t.status, t.event = READY, t.created + t.ttl

        return ready


def has_tube_layout_format(space: Space) -> bool:
    fmt = tuple((f.name, f.type) for f in space.defn.format)
    return fmt[: len(TUBE_FORMAT)] == tuple((f.name, f.type) for f in TUBE_FORMAT)


def _default_kind(name: str) -> TubeKind:
    from tubes.kinds import deckard_kind, zaqar_kind

    if name == "deckard":
        return deckard_kind(1440)
    if name == "zaqar":
        return zaqar_kind(3600, 300)
    return BOX_QUEUE_KIND


def _is_session(cid: Any) -> bool:
    return type(cid) is int and cid > 0


def _created(task: Task) -> int:
    return task.created


def _life(expires: int, created: int) -> int:
    return min(max(expires - created, 0), MAX_TIME_US - created)


def _expiring_at(expires: int) -> Mutate:
    """A new expiry; a delay, lock or deadline that ends before it still ends when it did."""

    def expiring(t: Task) -> None:
        old = t.created + t.ttl
        t.ttl = _life(expires, t.created)
        if t.status in (DELAYED, TAKEN) and t.event < old:
            t.event = min(t.event, t.created + t.ttl)
        else:
            t.event = t.created + t.ttl

    return expiring


def _held_by(claim: Claim, now: int) -> Mutate:
    """Taken by ``claim``: a task that would die before the claim lives ``grace`` past it."""

    def holding(t: Task) -> None:
        if t.created + t.ttl < claim.expires:
            t.ttl = claim.expires + claim.grace - t.created
            if t.attrs is not None:
                t.attrs["lifetime"] = claim.ttl + claim.grace
        if t.status != TAKEN:
            t.ctaken += 1
        t.status, t.cid, t.ttr = TAKEN, claim.id, claim.ttl
        t.event = min(claim.expires, t.created + t.ttl)

    return holding


def _made_ready(task: Task) -> None:
    task.status, task.event, task.cid = READY, task.created + task.ttl, 0


def _unburied(task: Task) -> None:
    task.status = READY  # cbury counts buries only (D6)


def _retry_later(now: int) -> Mutate:
    def later(t: Task) -> None:
        t.event = now + INTERNAL_ERROR_RETRY_US

    return later


def _keeping_tail(header: list[Any], keep: int) -> Callable[[bytes], bytes]:
    def transform(old: bytes) -> bytes:
        return encode_task(header, *split_data(old, keep))

    return transform


def _with_tail(header: list[Any], tail: Tail) -> Callable[[bytes], bytes]:
    def transform(_old: bytes) -> bytes:
        return encode_task(header, *tail)

    return transform


def _counted(tube: Tube, counter: str | None, result: Any, options: dict[str, Any] | None = None) -> Any:
    """A put is durable: count it; a tube whose record was written with it has it now."""
    if counter is not None:
        tube.count(counter)
    if options is not None and tube.options is None and not tube.dropped:
        tube.options = options
    return result


def _all(writes: list[Callable[[lmdb.Transaction], Any]]) -> Callable[[lmdb.Transaction], None]:
    def write(txn: lmdb.Transaction) -> None:
        for fn in writes:
            fn(txn)

    return write


def _log_failure(what: str) -> Callable[[Any, BaseException | None], None]:
    def done(_result: Any, error: BaseException | None) -> None:
        if error is not None:
            log.error("%s failed: %s", what, error)

    return done


__all__ = [
    "F_CREATED", "HEADER_FIELDS", "QueueEngine", "QueueSpace", "ChangeHook", "StorageError", "proc_error", "now_us",
]
