"""Task events (S8, S11): a work tube's task changes published as broadcast messages.

The queue engine calls its change hooks after each change is durable; this hook turns the change
of a task in one of the chosen tubes into a message of the broadcast queue named after the tube,
keyed by task id, so a client can follow one task from put to ack by long-poll or WebSocket. The
publish is queued on the group committer right away, so a task's messages keep the order of its
changes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

from spaces.msgpack_values import unpack
from tubes.broadcast import Broadcast
from tubes.engine import ChangeHook
from tubes.task import HEADER_FIELDS, HUMAN

DELETED = "deleted"  # the status reported when a task leaves the space (ack, delete, truncate)


def _json_default(value: Any) -> Any:
    """Task data is msgpack: bytes become text when they are UTF-8, else base64; the rest str()."""
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    return str(value)


def event_payload(old: str | None, new: str | None, raw: bytes | None) -> str:
    """``{"status": .., "previous": .., "data": [..] or null}`` as JSON text."""
    data = None
    if raw is not None:
        fields = unpack(raw)
        data = fields[HEADER_FIELDS:] if isinstance(fields, list) else None
    body = {
        "status": HUMAN.get(new, new) if new is not None else DELETED,
        "previous": HUMAN.get(old, old) if old is not None else None,
        "data": data,
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=_json_default)


def task_event_hook(broadcast: Broadcast, tubes: Iterable[str]) -> ChangeHook:
    """A hook for ``QueueEngine.hooks`` publishing the changes of tasks in ``tubes``."""
    chosen = frozenset(tubes)

    def hook(space_id: int, tube: str, task_id: str, old: str | None, new: str | None, raw: bytes | None) -> None:
        if tube in chosen:
            broadcast.publish_nowait(tube, task_id, event_payload(old, new, raw))

    return hook
