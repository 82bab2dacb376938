"""What clients send: the send body (spec 1.1, 2.2) and the ``sequence`` parameter (3.5).

Pure functions, so the rules are tested without a server. Errors carry the status and the plain
text body Sonya answers with (``Content type error``, ``Json deserialize error: ...``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from boxqueue.tubes.sequences import MAX_SEQUENCE

MAX_BODY_BYTES = 2 * 1024 * 1024  # actix's JSON limit; above it: 413


class BadInput(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


@dataclass(frozen=True)
class SendBody:
    id: str
    sequence: int | None
    payload_json: str  # the payload re-serialised compactly


def check_content_type(value: str | None) -> None:
    """``application/json`` or any ``*/*+json``, parameters allowed; else 400."""
    if value is None:
        raise BadInput(400, "Content type error")
    essence = value.split(";", 1)[0].strip().lower()
    kind, _, subtype = essence.partition("/")
    if not kind or not subtype or not (essence == "application/json" or subtype.endswith("+json")):
        raise BadInput(400, "Content type error")


def _no_constants(name: str) -> Any:
    raise ValueError(f"invalid number {name}")


def parse_send(body: bytes) -> SendBody:
    try:
        doc = json.loads(body, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput(400, f"Json deserialize error: {exc}") from None
    if not isinstance(doc, dict):
        raise BadInput(400, f"Json deserialize error: invalid type: {_kind(doc)}, expected struct Message")
    if "id" not in doc:
        raise BadInput(400, "Json deserialize error: missing field `id`")
    if not isinstance(doc["id"], str):
        raise BadInput(400, f"Json deserialize error: invalid type: {_kind(doc['id'])}, expected a string")
    if "payload" not in doc:
        raise BadInput(400, "Json deserialize error: missing field `payload`")
    seq = doc.get("sequence")
    if seq is not None and (type(seq) is not int or not 1 <= seq <= MAX_SEQUENCE):
        raise BadInput(400, f"Json deserialize error: invalid value: {json.dumps(seq)}, expected a nonzero u64")
    payload_json = json.dumps(doc["payload"], ensure_ascii=False, separators=(",", ":"))
    return SendBody(doc["id"], seq, payload_json)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean `{json.dumps(value)}`"
    if isinstance(value, int | float):
        return f"number `{value}`"
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return "null"


def parse_sequence(values: list[str]) -> int | str | None:
    """One ``sequence`` value: 1..2^64-1, ``first`` or ``last``; anything else (including a
    repeated parameter) means none, silently, as in Sonya."""
    if len(values) != 1:
        return None
    value = values[0]
    if value in ("first", "last"):
        return value
    if value.isascii() and value.isdigit():
        n = int(value)
        if 1 <= n <= MAX_SEQUENCE:
            return n
    return None
