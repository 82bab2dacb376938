"""Task events (S8, S11): a work tube's task changes published as broadcast messages.

The queue engine calls its change hooks after each change is durable; this hook turns the change
of a task in one of the chosen tubes into a message of the broadcast queue named after the tube,
keyed by task id, so a client can follow one task from put to ack by long-poll or WebSocket. The
publish is queued on the group committer right away, so a task's messages keep the order of its
changes.

The event is its own committer write, queued right after the task's change is durable; the
task's reply can go out before it commits. A crash in that gap would lose the event, so at start
:func:`catch_up` compares each task with the last event published for it and publishes the
difference (``previous`` is then the last status published), before the engine's own recovery
publishes its changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from boxqueue.spaces import iterators as it
from boxqueue.spaces.msgpack_values import unpack
from boxqueue.spaces.space import decode_tuple
from boxqueue.tubes.broadcast import Broadcast
from boxqueue.tubes.engine import ChangeHook, QueueEngine
from boxqueue.tubes.task import F_ID, F_STATUS, F_TUBE, HEADER_FIELDS, HUMAN, data_json_default

DELETED = "deleted"  # the status reported when a task leaves the space (ack, delete, truncate)



def event_payload(old: str | None, new: str | None, raw: bytes | None, data_at: int = HEADER_FIELDS) -> str:
    """``{"status": .., "previous": .., "data": [..] or null}`` as JSON text; the data fields
    start at ``data_at`` (the layout of the task's space)."""
    data = None
    if raw is not None:
        fields = unpack(raw)
        data = fields[data_at:] if isinstance(fields, list) else None
    body = {
        "status": HUMAN.get(new, new) if new is not None else DELETED,
        "previous": HUMAN.get(old, old) if old is not None else None,
        "data": data,
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=data_json_default)


def task_event_hook(broadcast: Broadcast, engine: QueueEngine, tubes: Iterable[str]) -> ChangeHook:
    """A hook for ``QueueEngine.hooks`` publishing the changes of tasks in ``tubes`` (of any
    queue space)."""
    chosen = frozenset(tubes)

    def hook(space_id: int, tube: str, task_id: str, old: str | None, new: str | None, raw: bytes | None) -> None:
        if tube in chosen:
            data_at = engine.queue_space(space_id).layout.data_at if raw is not None else HEADER_FIELDS
            broadcast.publish_nowait(tube, task_id, event_payload(old, new, raw, data_at))

    return hook


def catch_up(broadcast: Broadcast, engine: QueueEngine, tubes: Iterable[str]) -> int:
    """Publish what a crash kept from being published: for every task of the chosen tubes whose
    current status is not the last one published, and every id whose last event is not
    ``deleted`` though its task is gone. Run at start, before the engine recovers; returns the
    number of events queued."""
    chosen = frozenset(tubes)
    store = broadcast.store
    if not chosen or store is None or broadcast.max_key_updates == 0:
        return 0
    last: dict[tuple[str, str], str | None] = {}
    for tube in chosen:
        if tube in broadcast.queues:
            for m in store.history(tube, None, "last"):
                status = json.loads(m.json)["payload"]
                last[(tube, m.id)] = status.get("status") if isinstance(status, dict) else None
    queued = 0
    present: set[tuple[str, str]] = set()
    for queue_space in engine.queue_spaces().values():
        space, data_at = queue_space.space, queue_space.layout.data_at
        if space.primary is None:
            continue
        for raw in space.pairs(0, it.ALL, []):
            fields = decode_tuple(raw)
            tube, task_id, status = fields[F_TUBE], fields[F_ID], fields[F_STATUS]
            if tube not in chosen:
                continue
            present.add((tube, task_id))
            before = last.get((tube, task_id))
            if before != HUMAN.get(status, status):
                broadcast.publish_nowait(tube, task_id, event_payload(_code(before), status, raw, data_at))
                queued += 1
    for (tube, task_id), before in last.items():
        if (tube, task_id) not in present and before != DELETED:
            broadcast.publish_nowait(tube, task_id, event_payload(_code(before), None, None))
            queued += 1
    return queued


def _code(human: str | None) -> str | None:
    """A published status name back to the stored status code (event_payload takes codes)."""
    if human is None:
        return None
    for code, name in HUMAN.items():
        if name == human:
            return code
    return human
