"""WebSocket frames of Sonya messages, encoded once per message for every listener (sans-IO).

A server's frames are not masked (RFC 6455 5.1), so one message's text frame is the same bytes
for every listener that negotiated the same extensions. The only extension offered to clients is
permessage-deflate (RFC 7692). We accept it with ``server_no_context_takeover``, which a server
may add unasked (RFC 7692 7.1.1.1) and which browsers and the websockets library accept: each
message is then compressed on its own, so its compressed frame depends only on the window size
the client chose, not on what was sent to that client before. A listener's *variant* is that
window size, or None without compression; a message is encoded at most once per variant.

The encoding is wsproto's own (its frame protocol and deflate extension, one instance per
variant), so a frame is byte for byte what a wsproto connection would send that listener.
"""

from __future__ import annotations

from collections.abc import Iterable

from wsproto.extensions import Extension, PerMessageDeflate
from wsproto.frame_protocol import FrameProtocol
from wsproto.handshake import server_extensions_handshake

from boxqueue.tubes.sequences import Message

Variant = int | None  # the deflate window bits of a listener's frames, or None: not compressed


def accept_extensions(offers: Iterable[str]) -> tuple[bytes | None, list[Extension], Variant]:
    """Negotiate the client's ``Sec-WebSocket-Extensions`` offers (each item one offer): the
    response header value (None: no extension), the extensions for the connection's inbound
    frames, and the listener's variant."""
    deflate = PerMessageDeflate(server_no_context_takeover=True)
    header = server_extensions_handshake(list(offers), [deflate])
    if header is None or not deflate.enabled():
        return None, [], None
    return header, [deflate], deflate.server_max_window_bits


class FrameEncoder:
    """Text frames of messages, cached on each message per variant (``Message.encoded``)."""

    def __init__(self) -> None:
        self._protocols: dict[Variant, FrameProtocol] = {}

    def text(self, item: Message, variant: Variant) -> bytes:
        """The frame carrying ``item.json`` for listeners of ``variant``."""
        cache_key = ("ws", variant)
        frame = item.encoded.get(cache_key)
        if frame is None:
            frame = item.encoded[cache_key] = bytes(self._protocol(variant).send_data(item.json, True))
        return frame

    def _protocol(self, variant: Variant) -> FrameProtocol:
        proto = self._protocols.get(variant)
        if proto is None:
            extensions: list[Extension] = []
            if variant is not None:
                deflate = PerMessageDeflate(server_no_context_takeover=True, server_max_window_bits=variant)
                deflate.accept(deflate.name)  # enabled with exactly these parameters
                extensions.append(deflate)
            proto = self._protocols[variant] = FrameProtocol(client=False, extensions=extensions)
        return proto
