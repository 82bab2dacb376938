"""Users, chap-sha1 AUTH and grants, through the real connector (also true on Tarantool 2.6)."""

import socket

import msgpack
import pytest
import tarantool
from tarantool.error import DatabaseError

from tests.integration.conftest import TARGET


def code_and_message(exc):
    """The server's error, unwrapped from the connector's connect-time wrapping."""
    while exc.args and isinstance(exc.args[0], DatabaseError):
        exc = exc.args[0]
    return exc.args[0], exc.args[1]


def connect(server, user=None, password=None):
    return tarantool.connect("127.0.0.1", server.port, user=user, password=password)


def test_user_with_password(server):
    c = connect(server, "alice", "secret")
    assert c.call("box.session.user").data == ["alice"]
    c.close()


def test_wrong_password(server):
    with pytest.raises(DatabaseError) as err:
        connect(server, "alice", "nope")
    assert code_and_message(err.value) == (47, "Incorrect password supplied for user 'alice'")


def test_unknown_user(server):
    with pytest.raises(DatabaseError) as err:
        connect(server, "mallory", "x")
    assert code_and_message(err.value) == (45, "User 'mallory' is not found")


def test_grants_per_space(server):
    admin = connect(server)
    admin.replace("test", (77, "seventy-seven"))
    c = connect(server, "reader", "r")
    assert [list(t) for t in c.select("test", 77)] == [[77, "seventy-seven"]]
    with pytest.raises(DatabaseError) as err:
        c.insert("test", (78, "x"))
    assert err.value.args[:2] == (42, "Write access to space 'test' is denied for user 'reader'")
    with pytest.raises(DatabaseError) as err:
        c.select(513, [])
    assert err.value.args[:2] == (42, "Read access to space 'hsh' is denied for user 'reader'")
    # the views show the user only what it may touch
    names = {row[2] for row in c.select(281, [])}
    assert "test" in names and "hsh" not in names
    c.close()
    admin.delete("test", 77)


def test_authenticate_on_an_open_connection(server):
    c = connect(server)
    assert c.call("box.session.user").data == ["guest"]
    c.authenticate("alice", "secret")
    assert c.call("box.session.user").data == ["alice"]
    c.close()


def _raw_auth(port, user, scramble_type):
    """AUTH with the scramble sent as a msgpack str of raw bytes, as the Node connector does."""
    from boxqueue.spaces.access import chap_sha1_scramble

    with socket.create_connection(("127.0.0.1", port)) as s:
        greeting = b""
        while len(greeting) < 128:
            greeting += s.recv(128 - len(greeting))
        import base64

        salt = base64.b64decode(greeting[64:108])
        scramble = chap_sha1_scramble("secret", salt)
        # a fixstr of 20 raw bytes (not UTF-8), or a bin
        scramble_packed = (b"\xb4" if scramble_type == "str" else b"\xc4\x14") + scramble
        body = b"\x82\x23" + msgpack.packb(user) + b"\x21\x92" + msgpack.packb("chap-sha1") + scramble_packed
        header = b"\x82\x00\x07\x01\xce\x00\x00\x00\x00"
        packet = b"\xce" + (len(header) + len(body)).to_bytes(4, "big") + header + body
        s.sendall(packet)
        reply = b""
        while len(reply) < 5 or len(reply) < 5 + int.from_bytes(reply[1:5], "big"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
        unpacker = msgpack.Unpacker(strict_map_key=False)
        unpacker.feed(reply[5:])
        header, body = list(unpacker)
        return header[0], body


@pytest.mark.parametrize("scramble_type", ["str", "bin"])
def test_auth_scramble_as_str_or_bin(server, scramble_type):
    code, body = _raw_auth(server.port, "alice", scramble_type)
    assert code == 0
    assert body == {}  # no DATA in an AUTH reply


def test_guest_with_empty_tuple(server):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.recv(128)
        body = b"\x82\x23\xa5guest\x21\x90"
        header = b"\x82\x00\x07\x01\x05"
        s.sendall(bytes([len(header) + len(body)]) + header + body)
        reply = s.recv(1024)
        assert reply[0] == 0xCE
        unpacker = msgpack.Unpacker(strict_map_key=False)
        unpacker.feed(reply[5:])
        header, body = list(unpacker)
        assert header[0] == 0 and header[1] == 5 and body == {}


@pytest.mark.skipif(TARGET != "ours", reason="users come from boxqueue's config")
def test_guest_has_no_rights_when_users_exist_and_none_granted(fresh_server):
    fresh_server.extra_config = (
        '[[users]]\nname = "alice"\npassword = "secret"\n'
        'grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]\n'
        '[[space]]\nname = "t"\nindexes = [{ name = "primary", parts = [{ field = 0, type = "unsigned" }] }]\n'
    )
    fresh_server.start()
    c = tarantool.Connection("127.0.0.1", fresh_server.port, fetch_schema=False)
    with pytest.raises(DatabaseError) as err:
        c.call("box.session.id")
    assert err.value.args[:2] == (42, "Execute access to function 'box.session.id' is denied for user 'guest'")
    assert c.ping(notime=True) == "Success"  # pings are always allowed
    c.close()
    a = tarantool.connect("127.0.0.1", fresh_server.port, user="alice", password="secret")
    assert a.insert("t", (1,)).data == [[1]]
    a.close()
