"""The long-poll answers framed by hand (boxqueue/facades/sonya/socket_io.fast_response) are what h11
frames for the same request and answer, and the keep-alive rule is h11's."""

from __future__ import annotations

import re

import h11
import pytest

from boxqueue.facades.sonya.app import denied_response, messages_response, not_found_response
from boxqueue.facades.sonya.socket_io import fast_response, http_response, keep_alive
from boxqueue.facades.sonya.tokens import Denied
from boxqueue.frontdoor.asgi_serving import responder
from boxqueue.tubes.sequences import message

HEADS = [
    b"GET /queue/listen/longpoll/q/k?sequence=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /queue/listen/longpoll/q HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /queue/listen/longpoll/q HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close\r\n\r\n",
    b"GET /queue/listen/longpoll/q HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
    b"GET /queue/listen/longpoll/q HTTP/1.0\r\n\r\n",
    b"GET /queue/listen/longpoll/q HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
]

ANSWERS = [
    lambda: messages_response([message("k", 1, '{"a":"é"}'), message("k", 2, "null")]),
    lambda: messages_response([]),
    not_found_response,
    lambda: denied_response(Denied(403, "token is for another queue or id")),
]


def _without_date(data: bytes) -> bytes:
    return re.sub(rb"date: [^\r]*\r\n", b"", data)


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("answer", ANSWERS)
def test_hand_framed_answers_are_h11s(head, answer):
    conn = responder(head)
    request = h11.Connection(h11.SERVER)
    request.receive_data(head)
    parsed = request.next_event()
    expected = http_response(conn, answer())
    assert keep_alive(parsed) == (conn.our_state is h11.DONE)
    got = fast_response(answer(), keep_alive(parsed))
    assert _without_date(got) == _without_date(expected)
    assert re.search(rb"\r\ndate: \w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT\r\n", got)
