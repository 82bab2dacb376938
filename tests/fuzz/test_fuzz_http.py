"""Zaqar and Sonya under fuzz: random methods, paths, query strings, headers, content types and
bodies through a real HTTP client (httpx), random bytes as HTTP, and random WebSocket frames on
a Sonya listener. Every answer is a well-formed HTTP response without a server error (5xx), with
the body its content type says; the server goes on serving."""

from __future__ import annotations

import base64
import json
import os
import struct
from urllib.parse import quote

import httpx
import msgpack
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.conftest import (
    CLIENT,
    SENTINEL_NAME,
    SENTINEL_PROJECT,
    fuzz_settings,
    raw_connection,
    send_and_finish,
)

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "FOO"]
segment = (st.sampled_from(["q1", "fuzzq", "", "a" * 65, "%2F", "..", "x y", "ünï", "-_", "0"])
           | st.text(max_size=20)).filter(lambda s: s != SENTINEL_NAME)
ident = st.sampled_from(["0123456789abcdef0123456789abcdef", "nope", ""]) | st.text(max_size=12)

ZAQAR_PATHS = ["/", "/v1.1/", "/v1.1/ping", "/v1.1/health", "/v1.1/queues", "/v1.1/queues/{q}",
               "/v1.1/queues/{q}/stats", "/v1.1/queues/{q}/messages", "/v1.1/queues/{q}/messages/{i}",
               "/v1.1/queues/{q}/claims", "/v1.1/queues/{q}/claims/{i}", "/v1.1/pools", "/v1.1/pools/{q}",
               "/v1.1/flavors", "/v1.1/flavors/{q}", "/v1", "/v2/queues", "/v1.1/queues/{q}/"]
SONYA_PATHS = ["/queue/create/{q}", "/queue/close/{q}", "/queue/send/{q}", "/queue/delete/{q}/{i}",
               "/queue/listen/longpoll/{q}", "/queue/listen/longpoll/{q}/{i}", "/queue/generate_jwt/{q}/{i}",
               "/queue/listen/ws/{q}", "/", "/queue"]
QUERY_KEYS = ["limit", "marker", "echo", "include_claimed", "ids", "pop", "claim_id", "detailed", "sequence",
              "access_token", "x"]
CONTENT_TYPES = ["application/json", "application/x-msgpack", "application/msgpack", "text/plain",
                 "application/x-www-form-urlencoded", "application/json; charset=utf-8", "*/*+json", ""]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["messages", "ttl", "body", "grace", "limit", "id", "payload", "sequence", "weight", "uri",
                         "pool", "capabilities", "_flavor", "purpose", "op", "path", "value"]) | st.text(max_size=6),
        inner, max_size=5),
    max_leaves=25)


@st.composite
def bodies(draw) -> bytes:
    kind = draw(st.sampled_from(["json", "msgpack", "bytes", "empty", "shaped"]))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    if kind == "msgpack":
        try:
            return msgpack.packb(draw(json_values))
        except OverflowError:  # an integer msgpack cannot carry
            return msgpack.packb(None)
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "shaped":  # close to what the APIs accept
        return json.dumps(draw(st.sampled_from([
            {"messages": [{"ttl": 60, "body": 1}]}, [{"ttl": 60, "body": "x"}], {"ttl": 60, "grace": 60},
            {"id": "1", "payload": {"m": 1}}, {"weight": 1, "uri": "boxqueue://fuzzpool"}, {"pool": "p"},
            [{"op": "replace", "path": "/metadata", "value": {}}], {"id": 1, "payload": 1, "sequence": -1},
        ]))).encode()
    return b""


@st.composite
def http_requests(draw, paths: list[str]) -> dict:
    path = draw(st.sampled_from(paths)).replace("{q}", quote(draw(segment), safe="")).replace(
        "{i}", quote(draw(ident), safe=""))
    query = "&".join(f"{draw(st.sampled_from(QUERY_KEYS))}={quote(draw(st.text(max_size=10)))}"
                     for _ in range(draw(st.integers(0, 3))))
    headers = {}
    if draw(st.booleans()):
        headers["Client-ID"] = draw(st.sampled_from([CLIENT, "not-a-uuid", ""]))
    if draw(st.booleans()):
        headers["X-Project-Id"] = draw(st.sampled_from(["fuzzp", "", "p" * 300]) | st.text(
            alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=10)).replace(SENTINEL_PROJECT, "x")
    if draw(st.booleans()):
        headers["Content-Type"] = draw(st.sampled_from(CONTENT_TYPES))
    if draw(st.booleans()):
        headers["Accept"] = draw(st.sampled_from(["application/json", "application/x-msgpack", "text/html",
                                                  "application/xml", "*/*", ""]))
    if draw(st.booleans()):
        headers["Authorization"] = "Bearer " + draw(st.text(alphabet="abcdef.-_0123456789", max_size=20))
    return {"method": draw(st.sampled_from(METHODS)), "url": path + ("?" + query if query else ""),
            "headers": {k: v.strip() for k, v in headers.items()}, "content": draw(bodies())}


def check_answer(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.request.method, response.request.url, response.status_code,
                                        response.text[:500])
    kind = response.headers.get("content-type", "")
    if response.content and "json" in kind:
        json.loads(response.content)
    elif response.content and "msgpack" in kind:
        msgpack.unpackb(response.content)


@fuzz_settings(150)
@given(request=http_requests(ZAQAR_PATHS))
def test_zaqar_requests(target, memory_bounded, request):
    target.replayable(lambda: http_request(target.zaqar_port, request))
    with httpx.Client(base_url=f"http://127.0.0.1:{target.zaqar_port}", timeout=30) as client:
        check_answer(client.request(**request))
    target.check_alive()


@fuzz_settings(150)
@given(request=http_requests(SONYA_PATHS))
def test_sonya_requests(target, memory_bounded, request):
    target.replayable(lambda: http_request(target.sonya_port, request))
    with httpx.Client(base_url=f"http://127.0.0.1:{target.sonya_port}", timeout=30) as client:
        check_answer(client.request(**request))
    target.check_alive()


def http_request(port: int, request: dict) -> int:
    """Send an example's request again (for the memory check): one request."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        client.request(**request)
    return 1


HTTP_WORDS = [b"GET ", b"POST ", b"/v1.1/queues/q", b"/queue/listen/ws/q", b"/queue/listen/longpoll/fuzzws?sequence=1",
              b"/queue/listen/ws/fuzzws", b"?sequence=first", b" HTTP/1.1", b" HTTP/1.0", b"\r\n",
              b"Host: x", b"Content-Length: ", b"5", b"-1", b"99999999999", b"Transfer-Encoding: chunked",
              b"Connection: upgrade", b"Upgrade: websocket", b"Sec-WebSocket-Version: 13", b": ", b"\r\n\r\n",
              b"0\r\n\r\n", b"zz\r\n", b"{}", b"\x00", b"\xff"]


@fuzz_settings(80)
@given(data=st.lists(st.sampled_from(HTTP_WORDS) | st.binary(max_size=20), min_size=1, max_size=20).map(b"".join),
       which=st.sampled_from(["zaqar", "sonya"]))
def test_raw_http_bytes(target, memory_bounded, data, which):
    target_create_queue(target)  # so a long-poll or WebSocket head reaches Sonya's own listeners
    port = target.zaqar_port if which == "zaqar" else target.sonya_port
    target.replayable(lambda: raw_request(port, data))
    with raw_connection(port) as sock:
        answer = send_and_finish(sock, data)
    if answer:
        assert answer.startswith(b"HTTP/1."), answer[:200]
        status = int(answer.split(b" ", 2)[1])
        assert status < 500 or (status == 503 and b"Too many connections" in answer), answer[:300]
    target.check_alive()


def raw_request(port: int, data: bytes) -> int:
    with raw_connection(port) as sock:
        send_and_finish(sock, data)
    return 1


def ws_frame(opcode: int, payload: bytes, fin: bool = True, masked: bool = True, rsv: int = 0) -> bytes:
    first = (0x80 if fin else 0) | (rsv << 4) | (opcode & 0x0F)
    length = len(payload)
    mask_bit = 0x80 if masked else 0
    if length < 126:
        head = struct.pack("!BB", first, mask_bit | length)
    elif length < 65536:
        head = struct.pack("!BBH", first, mask_bit | 126, length)
    else:
        head = struct.pack("!BBQ", first, mask_bit | 127, length)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


frames = st.builds(ws_frame, st.integers(0, 15), st.binary(max_size=200), st.booleans(), st.booleans(),
                   st.integers(0, 7))


@fuzz_settings(80)
@given(sent=st.lists(frames | st.binary(min_size=1, max_size=30), min_size=1, max_size=6))
def test_websocket_frames(target, memory_bounded, sent):
    """Random frames (any opcode, masking, fragmentation, reserved bits) and bytes on a Sonya
    WebSocket listener: the server answers with well-formed frames and closes with a close frame
    or the connection's end; it goes on serving."""
    status, answer = websocket_session(target, sent)
    if status != 101:
        assert status == 404  # the queue does not exist yet: created below for the next examples
        target_create_queue(target)
        return
    target.replayable(lambda: websocket_again(target, sent))
    at = 0
    while at + 2 <= len(answer):  # every frame the server sent is well formed (unmasked)
        assert answer[at + 1] & 0x80 == 0
        length, start = answer[at + 1] & 0x7F, at + 2
        if length == 126:
            length, start = struct.unpack("!H", answer[at + 2:at + 4])[0], at + 4
        elif length == 127:
            length, start = struct.unpack("!Q", answer[at + 2:at + 10])[0], at + 10
        assert start + length <= len(answer), "a frame cut short"
        at = start + length
    target.check_alive()


def websocket_session(target, sent: list[bytes]) -> tuple[int, bytes]:
    """Open a listener on ``fuzzws``, send ``sent`` once it is open: the handshake's status and
    what the server sent after it."""
    with raw_connection(target.sonya_port) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(f"GET /queue/listen/ws/fuzzws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                     f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            assert chunk
            head += chunk
        head, rest = head.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        if status != 101:
            return status, rest
        return status, rest + send_and_finish(sock, b"".join(sent))


def websocket_again(target, sent: list[bytes]) -> int:
    """An example's session made again, for the memory check: the upgrade and the frames."""
    websocket_session(target, sent)
    return 1 + len(sent)


def target_create_queue(target) -> None:
    httpx.post(f"http://127.0.0.1:{target.sonya_port}/queue/create/fuzzws", timeout=30)


def test_the_sentinels_survive_http_fuzzing(target):
    target.check_sentinels()
