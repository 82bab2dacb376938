"""iproto under fuzz: random and mutated frames on fresh connections, and random text on the admin
console. Every answer must be a well-formed iproto response (a length prefix, a header map with
an integer code and the request's sync, a body map), and the server must go on serving."""

from __future__ import annotations

import msgpack
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.conftest import SENTINEL_SPACE, fuzz_settings, raw_connection, send_and_finish
from tests.integration.security_fixtures import read_exactly

REQUEST_TYPES = [0x40, 0x49, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D]
BODY_KEYS = [0x10, 0x11, 0x12, 0x13, 0x14, 0x20, 0x21, 0x22, 0x23, 0x27, 0x28, 0x5E, 0x5F, 0x54, 0x55]
NAMES = ["box.queue.put", "box.queue.take", "box.queue.ack", "box.queue.statistics", "box.queue.peek",
         "box.session.id", "box.info", "box.space.kv:select", "box.space.kv:replace", "box.space.kv:update",
         "box.space.queue:replace", "box.space.deckard:delete", "queue.meta", "nosuch", "box.space._space:select",
         # tarantool/queue's API, on the tube "fz" (never dropped: the sentinel tube is another)
         "queue.create_tube", "queue.identify", "queue.cfg", "queue.statistics", "queue.tube.fz:put",
         "queue.tube.fz:take", "queue.tube.fz:ack", "queue.tube.fz:release", "queue.tube.fz:touch",
         "queue.tube.fz:bury", "queue.tube.fz:kick", "queue.tube.fz:peek", "queue.tube.fz:delete",
         "queue.tube.fz:truncate", "queue.tube.fz:release_all", "queue.tube.fz:grant"]
SPACE_IDS = st.sampled_from([512, 0, 280, 281, 288, 289, 513, 99999]) | st.integers(-(2**63), 2**64 - 1).filter(
    lambda i: i != SENTINEL_SPACE)

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=True)
           | st.text(max_size=40) | st.binary(max_size=40))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=6)
                      | st.dictionaries(st.integers(0, 100) | st.text(max_size=8), inner, max_size=4), max_leaves=20)


@st.composite
def requests(draw) -> bytes:
    """A frame of the right shape with random contents: a type, a sync, body keys with values of
    any type (and sometimes the right type)."""
    rtype = draw(st.sampled_from(REQUEST_TYPES) | st.integers(0, 2**16))
    header = {0x00: rtype, 0x01: draw(st.integers(0, 2**64 - 1))}
    if draw(st.booleans()):
        header[0x05] = draw(st.integers(0, 2**32))
    body: dict = {}
    if draw(st.booleans()):
        body[0x10] = draw(SPACE_IDS)
    for key in draw(st.lists(st.sampled_from(BODY_KEYS), max_size=6)):
        if key == 0x10:
            continue
        if key in (0x22, 0x27):
            body[key] = draw(st.sampled_from(NAMES) | st.text(max_size=30))
        else:
            body[key] = draw(values)
    header_bytes = msgpack.packb(header)
    body_bytes = msgpack.packb(body, use_bin_type=True)
    return msgpack.packb(len(header_bytes) + len(body_bytes)) + header_bytes + body_bytes


@st.composite
def mutated(draw) -> bytes:
    frame = bytearray(draw(requests()))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(frame) - 1, 0)))
        if op == "flip" and frame:
            frame[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            frame[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and frame:
            del frame[at]
        elif op == "truncate":
            frame = frame[:at]
    return bytes(frame)


def check_responses(data: bytes) -> list[dict]:
    """Every complete response in ``data`` is well formed; returns their headers."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    headers = []
    items = list(unpacker)
    # length, header, body; a trailing partial response is possible only if the server was cut off
    for i in range(0, len(items) - 2, 3):
        length, header, body = items[i], items[i + 1], items[i + 2]
        assert isinstance(length, int) and length > 0
        assert isinstance(header, dict) and isinstance(header.get(0x00), int) and 0x01 in header, header
        assert isinstance(body, dict), body
        if header[0x00] & 0x8000:
            assert isinstance(body.get(0x31), str) or 0x52 in body, body  # an error with a message
        headers.append(header)
    return headers


def exchange(target, frames: list[bytes]) -> list[dict]:
    """Send the frames on a new connection; the answers, checked. The example is kept to be sent
    again for the module's memory check."""
    target.replayable(lambda: send_frames(target, frames))
    with raw_connection(target.proc.port) as sock:
        read_exactly(sock, 128)
        return check_responses(send_and_finish(sock, b"".join(frames)))


def send_frames(target, frames: list[bytes]) -> int:
    with raw_connection(target.proc.port) as sock:
        read_exactly(sock, 128)
        send_and_finish(sock, b"".join(frames))
    return len(frames)


@fuzz_settings(100)
@given(frames=st.lists(requests(), min_size=1, max_size=4))
def test_random_requests(target, memory_bounded, frames):
    headers = exchange(target, frames)
    assert len(headers) <= len(frames)
    target.check_alive()


@fuzz_settings(100)
@given(frames=st.lists(mutated(), min_size=1, max_size=4))
def test_mutated_frames(target, memory_bounded, frames):
    exchange(target, frames)
    target.check_sentinels()


@fuzz_settings(60)
@given(data=st.binary(min_size=1, max_size=2000))
def test_random_bytes(target, memory_bounded, data):
    exchange(target, [data])
    target.check_alive()


LUA_WORDS = ["box.space.kv", ":select", ":replace", ":get", ":len()", "(", ")", "{", "}", "1", "'x'", ",", "nil",
             "box.queue.statistics()", "return", "local", "=", "..", "#", "box.info", ".", "[", "]", "\\set",
             "delimiter", "\\help", "error('boom')", "string.rep('a', 10)", "function f() end", "pcall(", "end",
             "box.space.queue", ":truncate()", "box.space.deckard:drop()", "box.schema.space.create('x')"]


@fuzz_settings(60)
@given(lines=st.lists(st.lists(st.sampled_from(LUA_WORDS), max_size=8).map(" ".join)
                      | st.text(alphabet=st.characters(blacklist_characters="\n\r~"), max_size=60), min_size=1,
                      max_size=3))
def test_console_lines(target, memory_bounded, lines):
    """Each line gets one YAML document (an answer or ``- error: ...``); the console goes on."""
    target.replayable(lambda: len(console_documents(target, lines)))
    for document in console_documents(target, lines):
        assert document.startswith("---")
        yaml.safe_load(document)
    target.check_alive()


def console_documents(target, lines: list[str]) -> list[str]:
    """Each line's answer, on a new console connection."""
    documents = []
    with raw_connection(target.proc.admin_port) as sock:
        greeting = read_exactly(sock, 128)
        assert b"console" in greeting
        for line in lines:
            if line.strip().startswith("\\set") or line.strip() in ("\\q", "\\quit"):
                continue  # a delimiter or quit changes the framing this test reads by
            sock.sendall(line.encode("utf-8", "surrogatepass") + b"\n")
            data = b""
            sock.settimeout(15)
            while b"\n...\n" not in data:
                chunk = sock.recv(65536)
                assert chunk, f"console closed after {line!r}"
                data += chunk
            documents.append(data[: data.index(b"\n...\n") + 5].decode("utf-8", "replace"))
    return documents
