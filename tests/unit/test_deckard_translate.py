"""Deckard request fields to tube arguments and back: the pure part of the facade."""

from __future__ import annotations

import json
import math

import pytest
from google.protobuf import any_pb2, wrappers_pb2

from boxqueue.facades.deckard import translate
from boxqueue.facades.deckard.errors import InvalidArgument
from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.facades.deckard.translate import MAX_SCORE, TIMELESS_MS
from boxqueue.spaces.msgpack_values import pack
from boxqueue.tubes.task import READY, Task, encode_task

NOW = 1_700_000_000_000


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, (1, -math.inf, math.inf, 300_000)),
        ({"amount": 0}, (1, -math.inf, math.inf, 300_000)),
        ({"amount": 1001, "ack_deadline_ms": 5}, (1000, -math.inf, math.inf, 5)),
        ({"min_score": -3, "max_score": -3}, (1, 0.0, 0.0, 300_000)),
        ({"min_score": 1e300, "max_score": 2.5}, (1, MAX_SCORE, 2.5, 300_000)),
        ({"score_filter": 1000}, (1, -math.inf, float(NOW - 1000), 300_000)),
        ({"score_filter": 1000, "max_score": 7}, (1, -math.inf, 7.0, 300_000)),
        ({"ack_deadline_ms": -10}, (1, -math.inf, math.inf, -10)),
    ],
)
def test_pull_bounds(fields, expected):
    assert translate.pull_bounds(pb.PullRequest(queue="q", **fields), NOW) == expected


def test_new_messages_ttl_and_scores():
    request = pb.AddRequest(
        messages=[
            pb.AddMessage(id="a", queue="q"),
            pb.AddMessage(id="b", queue="q", ttl_minutes=2, score=-1),
            pb.AddMessage(id="c", queue="q", timeless=True, score=4),
            pb.AddMessage(id="d", queue="q", timeless=True, ttl_minutes=1),
        ]
    )
    a, b, c, d = translate.new_messages(request, NOW, default_ttl_minutes=30)
    assert (a.expires, a.score) == (NOW + 30 * 60_000, None)  # K2, and 0 means "now"
    assert (b.expires, b.score) == (NOW + 120_000, -1)  # clamped later by the tube
    assert (c.expires, c.score) == (NOW + TIMELESS_MS, 4)
    assert d.expires == NOW + 60_000 + TIMELESS_MS


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (pb.AddMessage(id="x"), "invalid queue: message 1"),
        (pb.AddMessage(queue="q"), "invalid id: message 1"),
        (pb.AddMessage(id="x", queue="q", score=math.nan), "invalid score of message 1"),
    ],
)
def test_new_messages_checks_every_message_first(message, text):
    request = pb.AddRequest(messages=[pb.AddMessage(id="ok", queue="q"), message])
    with pytest.raises(InvalidArgument, match=text):
        translate.new_messages(request, NOW, 1)


def test_to_message_round_trips_the_stored_data():
    payload = {"p": ["type.googleapis.com/x.Y", b"\x00\xff"]}
    attrs = {"acks": 2, "nacks": 1, "cacks": 0, "cnacks": 1, "bp": "bp"}
    task = Task("m", "q", READY, NOW * 1000, 127, 5.0, 0, 1, NOW * 1000, 300, 0, 0, attrs)
    stored = encode_task(task.header(), 2, pack({"description": "desc", "metadata": {"k": "v"}, "payload": payload})
                         + pack("text"))
    wire = translate.to_message(task, stored)
    assert (wire.id, wire.queue, wire.description, wire.string_payload, wire.score, wire.breakpoint) == (
        "m", "q", "desc", "text", 5.0, "bp",
    )
    assert dict(wire.metadata) == {"k": "v"}
    assert (wire.payload["p"].type_url, wire.payload["p"].value) == ("type.googleapis.com/x.Y", b"\x00\xff")
    assert (wire.diagnostics.acks, wire.diagnostics.nacks, wire.diagnostics.consecutive_nacks) == (2, 1, 1)


def test_string_payload_of_a_task_from_another_api():
    """One string field is the payload; other data shows as JSON."""
    assert translate.body_text(["plain"]) == "plain"
    assert translate.body_text([]) == ""
    assert translate.body_text([{"a": 1}]) == '{"a": 1}'
    assert translate.body_text(["a", 2, b"\xff"]) == '["a", 2, "/w=="]'


def test_human_readable_falls_back_to_type_url_and_base64():
    known = any_pb2.Any()
    known.Pack(wrappers_pb2.StringValue(value="hé"))
    readable = translate.human_readable(
        {"k": known, "u": any_pb2.Any(type_url="x/y.Z", value=b"\xfb"), "e": any_pb2.Any()}
    )
    assert json.loads(readable["k"]) == {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": "hé"}
    assert json.loads(readable["u"]) == {"type_url": "x/y.Z", "value": "+w=="}
    assert json.loads(readable["e"]) == {}  # protobuf JSON of an empty Any
