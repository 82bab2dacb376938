"""Pre-encoded WebSocket frames (boxqueue/facades/sonya/frames.py) against wsproto's own connections:
the frame made once per message is byte for byte what a wsproto server connection with the same
negotiated extensions sends that listener, and a wsproto client reads it back."""

from __future__ import annotations

import json

import pytest
from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import TextMessage
from wsproto.extensions import PerMessageDeflate
from wsproto.handshake import client_extensions_handshake, server_extensions_handshake
from wsproto.utilities import split_comma_header

from boxqueue.facades.sonya.frames import FrameEncoder, accept_extensions
from boxqueue.tubes.sequences import message

# What clients offer: none, browsers and the websockets library, window sizes, both takeovers.
OFFERS = [
    None,
    "permessage-deflate; client_max_window_bits",
    "permessage-deflate",
    "permessage-deflate; server_max_window_bits=10",
    "permessage-deflate; server_max_window_bits=9; client_max_window_bits=9",
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
    "x-webkit-deflate-frame, permessage-deflate; client_max_window_bits",
]

PAYLOADS = ['"hello"', '{"n":1,"text":"héllo wörld ✓"}', json.dumps("x" * 300), json.dumps("abc" * 30_000), "null"]


def _messages() -> list:
    return [message("key", seq, payload) for seq, payload in enumerate(PAYLOADS * 2, start=1)]


def _server_connection(offer: str | None) -> tuple[Connection, bytes | None]:
    """A wsproto server connection negotiated the way hypercorn did it, but with our one change
    (server_no_context_takeover)."""
    if offer is None:
        return Connection(ConnectionType.SERVER, []), None
    deflate = PerMessageDeflate(server_no_context_takeover=True)
    header = server_extensions_handshake(split_comma_header(offer.encode()), [deflate])
    return Connection(ConnectionType.SERVER, [deflate]), header


@pytest.mark.parametrize("offer", OFFERS)
def test_frames_are_what_a_wsproto_connection_sends_each_listener(offer):
    header, _extensions, variant = accept_extensions([] if offer is None else split_comma_header(offer.encode()))
    server, expected_header = _server_connection(offer)
    assert header == expected_header
    if offer is None:
        assert variant is None
    else:
        assert b"server_no_context_takeover" in header
        assert variant == server._proto.extensions[0].server_max_window_bits
    encoder = FrameEncoder()
    # One connection sends every message in turn (its deflate state carries over, if it had any),
    # and the pre-encoded frames must still match each one.
    for item in _messages():
        assert encoder.text(item, variant) == server.send(TextMessage(item.json))


@pytest.mark.parametrize("offer", OFFERS)
def test_a_wsproto_client_reads_the_frames_back(offer):
    header, _extensions, variant = accept_extensions([] if offer is None else split_comma_header(offer.encode()))
    offered = [] if offer is None else [PerMessageDeflate(client_max_window_bits=15)]
    accepted = client_extensions_handshake([] if header is None else [header.decode()], offered)
    client = Connection(ConnectionType.CLIENT, accepted)
    encoder = FrameEncoder()
    items = _messages()
    client.receive_data(b"".join(encoder.text(item, variant) for item in items))
    got = [event.data for event in client.events() if isinstance(event, TextMessage)]
    assert got == [item.json for item in items]


def test_a_message_is_encoded_once_per_variant():
    encoder = FrameEncoder()
    item = message("k", 1, json.dumps("y" * 1000))
    plain = encoder.text(item, None)
    deflated = encoder.text(item, 15)
    assert encoder.text(item, None) is plain and encoder.text(item, 15) is deflated
    assert len(deflated) < len(plain)
    assert plain[0] == 0x81 and deflated[0] == 0xC1  # FIN + text; RSV1 marks compression
    assert set(item.encoded) == {("ws", None), ("ws", 15)}


def test_unusable_offers_leave_frames_uncompressed():
    for offers in ([], ["x-webkit-deflate-frame"], ["permessage-deflate; server_max_window_bits=8"]):
        header, extensions, variant = accept_extensions(offers)
        assert (header, extensions, variant) == (None, [], None)
