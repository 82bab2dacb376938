"""Regression tests for what the fuzz tests (tests/fuzz/) found, each with the real client."""

from __future__ import annotations

import socket
import time

import msgpack
import pytest
import tarantool

from tests.integration.deckard_fixtures import Deckard, pb, queue_name
from tests.integration.security_fixtures import read_exactly
from tests.serverproc import ServerProcess, free_port


@pytest.fixture(scope="module")
def deckard(tmp_path_factory):
    port = free_port()
    proc = ServerProcess(tmp_path_factory.mktemp("findings"), extra_config=f'[deckard]\nlisten = "127.0.0.1:{port}"\n')
    proc.start()
    client = Deckard(port)
    yield client
    client.close()
    assert proc.stop() == 0
    assert "Traceback" not in proc.log()


@pytest.mark.parametrize("deadline", [-5000, -(2**63), 2**62, 2**63 - 1])
def test_pull_with_any_ack_deadline(deckard, deadline):
    """A negative ack deadline (Deckard accepts it: the message times out on the next sweep) or a
    huge one made the stored ttr leave its unsigned 64-bit field: the Pull failed with INTERNAL."""
    queue = queue_name()
    deckard.stub.Add(pb.AddRequest(messages=[pb.AddMessage(id="m", queue=queue, string_payload="p")]))
    pulled = deckard.stub.Pull(pb.PullRequest(queue=queue, amount=1, ack_deadline_ms=deadline))
    assert [m.id for m in pulled.messages] == ["m"]
    if deadline < 0:  # already past: back in the queue at once
        until = time.monotonic() + 10
        while time.monotonic() < until:
            again = deckard.stub.Pull(pb.PullRequest(queue=queue, amount=1))
            if again.messages:
                break
            time.sleep(0.1)
        assert [m.id for m in again.messages] == ["m"]
    else:
        assert not deckard.stub.Pull(pb.PullRequest(queue=queue, amount=1)).messages


def test_invalid_utf8_in_a_header_string_does_not_stop_the_server(tmp_path):
    """A header string that is not UTF-8 (key 0x22, typed str in Tarantool's header check) raised
    UnicodeDecodeError out of the decoder, which ended the whole process."""
    proc = ServerProcess(tmp_path)
    proc.start()
    try:
        header = b"\x83\x00\x40\x01\x07\x22\xa2\xce\x41"  # {type: PING, sync: 7, 0x22: b"\xceA" as str}
        with socket.create_connection(("127.0.0.1", proc.port), timeout=15) as s:
            read_exactly(s, 128)
            s.sendall(msgpack.packb(len(header)) + header)
            s.settimeout(15)
            answer = msgpack.Unpacker(strict_map_key=False)
            while True:
                answer.feed(s.recv(4096))
                items = list(answer)
                if len(items) >= 3:
                    break
        _length, head, _body = items[:3]
        assert head[0x01] == 7  # answered (Tarantool does not check strings for UTF-8 either)
        c = tarantool.Connection("127.0.0.1", proc.port)
        assert c.ping() >= 0
        c.close()
    finally:
        assert proc.stop() == 0
        assert "Traceback" not in proc.log()
