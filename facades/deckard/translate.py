"""Deckard's request fields to scored-tube arguments, and stored messages back to ``Message``.

The tube stores four data fields after its header, chosen here: description, string payload,
metadata (a map of strings) and payload (name -> [type_url, value bytes]). Payload ``Any`` values
are kept as their two fields, so they come back byte for byte, whatever the bytes are.
"""

from __future__ import annotations

import base64
import json
import math
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

from facades.deckard.errors import InvalidArgument
from facades.deckard.generated import deckard_service_pb2 as pb
from tubes.scored import MAX_SCORE, MIN_SCORE, TIMELESS_MS, NewMessage
from tubes.scored_message import ScoredMessage, message_data

DEFAULT_ACK_DEADLINE_MS = 300_000
MAX_PULL = 1000
MINUTE_MS = 60_000


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
        payload = {name: [value.type_url, value.value] for name, value in m.payload.items()}
        data = [m.description, m.string_payload, dict(m.metadata), payload]
        out.append(NewMessage(m.queue, m.id, given_score(m.score, f"score of message {n}"), expires, data))
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


def to_message(message: ScoredMessage, stored: bytes, *, description: bool = True) -> pb.Message:
    """The wire ``Message`` of a stored message; its score is the one it is ordered by (K4)."""
    desc, string_payload, metadata, payload = (message_data(stored) + [None] * 4)[:4]
    return pb.Message(
        id=message.id,
        queue=message.queue,
        description=(desc or "") if description else "",
        string_payload=string_payload or "",
        metadata=metadata or {},
        score=message.score,
        breakpoint=message.breakpoint,
        payload={name: any_pb2.Any(type_url=url, value=value) for name, (url, value) in (payload or {}).items()},
        diagnostics=pb.MessageDiagnostics(
            acks=message.acks,
            nacks=message.nacks,
            consecutive_acks=message.consecutive_acks,
            consecutive_nacks=message.consecutive_nacks,
        ),
    )


def fitting(messages: list[pb.Message], limit: int) -> int:
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
