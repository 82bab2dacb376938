"""The Sonya facade's input rules (spec 1.1, 2.2, 3.5) and token reading (section 4)."""

from __future__ import annotations

import pytest

from boxqueue.facades.sonya.inputs import BadInput, check_content_type, parse_send, parse_sequence
from boxqueue.facades.sonya.tokens import Denied, Tokens, bearer


@pytest.mark.parametrize("value", ["application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "application/problem+json", "text/x+json"])
def test_json_content_types(value):
    check_content_type(value)


@pytest.mark.parametrize("value", [None, "", "text/plain", "application/jsonx", "json", "/json", "application/"])
def test_other_content_types_are_400(value):
    with pytest.raises(BadInput) as err:
        check_content_type(value)
    assert (err.value.status, err.value.text) == (400, "Content type error")


def test_send_body_is_parsed_and_payload_reserialised():
    body = parse_send(b'{"id": "k", "payload": {"b": [1, 2.5], "a": "\xc3\xbc"}, "extra": 1}')
    assert (body.id, body.sequence, body.payload_json) == ("k", None, '{"b":[1,2.5],"a":"\u00fc"}')
    assert parse_send(b'{"id":"","payload":null,"sequence":null}').payload_json == "null"
    assert parse_send(b'{"id":"k","payload":0,"sequence":18446744073709551615}').sequence == 2**64 - 1


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[]", b'"x"', b'{"payload":1}', b'{"id":5,"payload":1}', b'{"id":"k"}',
     b'{"id":"k","payload":1,"sequence":0}', b'{"id":"k","payload":1,"sequence":true}',
     b'{"id":"k","payload":1,"sequence":2.0}', b'{"id":"k","payload":Infinity}',
     b'{"id":"k","payload":1,"sequence":18446744073709551616}'],
)
def test_bad_send_bodies(raw):
    with pytest.raises(BadInput) as err:
        parse_send(raw)
    assert err.value.status == 400 and err.value.text.startswith("Json deserialize error")


@pytest.mark.parametrize(
    ("values", "expected"),
    [(["1"], 1), (["first"], "first"), (["last"], "last"), (["18446744073709551615"], 2**64 - 1),
     ([], None), (["0"], None), (["-1"], None), (["Last"], None), ([""], None), (["1", "2"], None),
     (["18446744073709551616"], None), (["٣"], None), ([" 1"], None)],
)
def test_sequence_param(values, expected):
    assert parse_sequence(values) == expected


def test_bearer_header_first_then_query():
    assert bearer({"authorization": "Bearer abc"}, {"access_token": "q"}) == "abc"
    assert bearer({"authorization": "Bearer "}, {"access_token": "q"}) == ""
    assert bearer({"authorization": "bearer abc"}, {"access_token": "q"}) == "q"
    assert bearer({}, {}) is None


@pytest.mark.filterwarnings("ignore::jwt.InsecureKeyLengthWarning")
def test_tokens_round_trip_and_open_mode():
    tokens = Tokens("secret", 60)
    token, _exp = tokens.mint("q", "k")
    tokens.check_key(token, "q", "k")
    with pytest.raises(Denied) as err:
        tokens.check_key(token, "q", "other")
    assert err.value.status == 403
    with pytest.raises(Denied) as err:
        tokens.check_service(token)
    assert err.value.status == 401
    open_mode = Tokens(None, 60)
    open_mode.check_service(None)
    open_mode.check_key(None, "q", "k")
