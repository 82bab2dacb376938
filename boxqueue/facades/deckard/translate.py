"""Deckard's request fields to engine arguments, and stored tasks back to ``Message``.

A Deckard message is a task of the Deckard space (tube = queue, task id = message id, K10):

* ``score`` is the task's priority ``pri`` (ipri stays 127), clamped to [0, 2^53] (K3);
* ``string_payload`` is the task's one data field, so box.queue and Zaqar see it as the data or
  the body; a task put through another API shows its data here: one string field as it is,
  anything else as JSON (one field as its value, several as a list; bytes as UTF-8 text, or base64
  when they are not);
* ``description``, ``metadata`` and ``payload`` (name -> [type_url, value bytes], so Any values
  come back byte for byte) are the task's attachments, kept in LMDB only;
* diagnostics and the breakpoint are the task's attrs (``acks``, ``nacks``, ``cacks``,
  ``cnacks``, ``bp``).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from typing import Any

# Imported so the JSON rendering knows the well-known types clients pack most often.
from google.protobuf import (  # noqa: F401
    any_pb2,
    duration_pb2,
    empty_pb2,
    json_format,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)

from boxqueue.facades.deckard.errors import InvalidArgument
from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.tubes.task import TUBE_LAYOUT, Task, data_json_default, stored_parts

DEFAULT_ACK_DEADLINE_MS = 300_000
_NO_DIAGNOSTICS = pb.MessageDiagnostics()  # copied into each message given it
MAX_PULL = 1000
MINUTE_MS = 60_000
MIN_SCORE = 0.0
MAX_SCORE = float(2**53)
TIMELESS_MS = 100 * 36525 * 24 * 3600 * 1000 // 100  # 100 years of 365.25 days, in ms


class NewMessage:
    """One message of an Add: ``score`` None means "now" (Deckard's default algorithm). A plain
    class: one is made per message added, and its compiled ``__init__`` costs far less than a
    dataclass's generated one."""

    __slots__ = ("queue", "id", "score", "expires", "attachments", "data")

    def __init__(self, queue: str, id: str, score: float | None, expires: int, attachments: dict[str, Any],
                 data: list[Any]) -> None:
        self.queue = queue
        self.id = id
        self.score = score
        self.expires = expires  # ms since the epoch
        self.attachments = attachments
        self.data = data


def clamp_score(score: float) -> float:
    """Scores live in [0, 2^53] (K3); NaN is refused before it gets here."""
    return min(max(float(score), MIN_SCORE), MAX_SCORE)


def require(value: str, what: str) -> str:
    """Deckard's validation of queue names and ids (K6, K12)."""
    if not value:
        raise InvalidArgument(f"invalid {what}: it must not be empty")
    return value


def given_score(score: float, what: str = "score") -> float | None:
    """A request score: 0 means "not given" (proto3), NaN is refused, the rest is clamped later."""
    if math.isnan(score):
        raise InvalidArgument(f"invalid {what}: NaN is not a score")
    return None if score == 0 else score


def new_messages(request: pb.AddRequest, now_ms: int, default_ttl_minutes: int) -> list[NewMessage]:
    """Every message of an Add, checked before anything is written (nothing stored half)."""
    out = []
    for n, m in enumerate(request.messages):
        if not m.queue:
            raise InvalidArgument(f"invalid queue: message {n} (id {m.id!r}) has an empty queue name")
        if not m.id:
            raise InvalidArgument(f"invalid id: message {n} of queue {m.queue!r} has an empty id")
        ttl = m.ttl_minutes
        if ttl == 0 and not m.timeless:
            ttl = default_ttl_minutes  # K2
        expires = now_ms + ttl * MINUTE_MS + (TIMELESS_MS if m.timeless else 0)
        attachments = {
            "description": m.description,
            "metadata": dict(m.metadata),
            "payload": {name: [value.type_url, value.value] for name, value in m.payload.items()},
        }
        score = given_score(m.score, f"score of message {n}")
        out.append(NewMessage(m.queue, m.id, score, expires, attachments, [m.string_payload]))
    return out


def pull_bounds(request: pb.PullRequest, now_ms: int) -> tuple[int, float, float, int]:
    """amount, min score, max score and ack deadline of a Pull, as Deckard reads them
    (section 2.2, K11): 0 means "unset" for both bounds, negatives mean 0, both are capped."""
    amount = min(max(request.amount, 1), MAX_PULL)
    if math.isnan(request.min_score) or math.isnan(request.max_score):
        raise InvalidArgument("invalid score bounds: NaN is not a score")
    max_score = request.max_score
    if max_score == 0 and request.score_filter > 0:
        max_score = float(now_ms - request.score_filter)
    low = -math.inf if request.min_score == 0 else min(max(request.min_score, MIN_SCORE), MAX_SCORE)
    high = math.inf if max_score == 0 else min(max(max_score, MIN_SCORE), MAX_SCORE)
    deadline = request.ack_deadline_ms or DEFAULT_ACK_DEADLINE_MS
    return amount, low, high, deadline


def body_text(data: list[Any]) -> str:
    """``string_payload`` of a task: its one string field, else its data as JSON."""
    if len(data) == 1 and isinstance(data[0], str):
        return data[0]
    if not data:
        return ""
    return json.dumps(data[0] if len(data) == 1 else data, ensure_ascii=False, default=data_json_default)


def to_message(task: Task, stored: bytes, *, description: bool = True, into: Any = None) -> pb.Message:
    """The wire ``Message`` of a stored task; its score is the one it is ordered by (K4).
    ``into``: the repeated field of an answer it is added to (made there, not made and copied)."""
    attachments, data = stored_parts(stored, TUBE_LAYOUT)
    attrs = task.attrs
    # Fields left at their defaults are not given (each one given costs the constructor); the
    # diagnostics are always present, as Deckard sends them.
    diagnostics = pb.MessageDiagnostics(
        acks=attrs.get("acks", 0),
        nacks=attrs.get("nacks", 0),
        consecutive_acks=attrs.get("cacks", 0),
        consecutive_nacks=attrs.get("cnacks", 0),
    ) if attrs else _NO_DIAGNOSTICS
    make = pb.Message if into is None else into.add
    message = make(id=task.id, queue=task.tube, string_payload=body_text(data), score=float(task.pri),
                   diagnostics=diagnostics)
    if attachments:
        if description and attachments.get("description"):
            message.description = attachments["description"]
        if attachments.get("metadata"):
            message.metadata.update(attachments["metadata"])
        for name, (url, value) in (attachments.get("payload") or {}).items():
            message.payload[name].CopyFrom(any_pb2.Any(type_url=url, value=value))
    if attrs and attrs.get("bp"):
        message.breakpoint = attrs["bp"]
    return message


def count_settle(attrs: dict[str, Any], *, nack: bool, breakpoint: str) -> None:
    """An Ack or Nack in a message's diagnostics (and an Ack's breakpoint)."""
    if nack:
        attrs["nacks"] = attrs.get("nacks", 0) + 1
        attrs["cnacks"] = attrs.get("cnacks", 0) + 1
        attrs["cacks"] = 0
    else:
        attrs["acks"] = attrs.get("acks", 0) + 1
        attrs["cacks"] = attrs.get("cacks", 0) + 1
        attrs["cnacks"] = 0
        attrs["bp"] = breakpoint


def fitting(messages: Sequence[pb.Message], limit: int) -> int:
    """How many of ``messages``, from the first, fit in a response of ``limit`` bytes (at
    least one: a single message too large fails at the gRPC layer, as in Deckard)."""
    size = 0
    for n, message in enumerate(messages):
        size += message.ByteSize() + 6  # field tag and length prefix
        if size > limit and n > 0:
            return n
    return len(messages)


def human_readable(payload: Any) -> dict[str, str]:
    """Each payload value as JSON (K5): protobuf's JSON form when its type is known and its bytes
    parse, else an object with the type URL and the value in base64."""
    out = {}
    for name, value in payload.items():
        try:
            out[name] = json_format.MessageToJson(value, indent=None)
        except Exception:  # unknown type, or bytes that are not that type
            out[name] = json.dumps(
                {"type_url": value.type_url, "value": base64.b64encode(value.value).decode("ascii")}
            )
    return out
