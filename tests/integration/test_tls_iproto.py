"""TLS on the iproto listeners ([iproto.tls], Tarantool Enterprise's ``ssl`` transport): the
``tarantool`` connector's own SSL options connect unchanged; with ``ca_file`` a client
certificate signed by it is required; the read-only port and the admin console take the same
options. Certificates are made at run time (trustme)."""

from __future__ import annotations

import socket

import pytest
import tarantool
from tarantool.error import DatabaseError, NetworkError, SslError

from tests.integration.security_fixtures import Certs, read_exactly, tls_socket
from tests.serverproc import ServerProcess, free_port

SPACE = """
[[space]]
id = 512
name = "kv"
indexes = [{ name = "pk", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] }]
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return Certs.make(tmp_path_factory.mktemp("certs"))


def tls_server(workdir, certs: Certs, *, client_certs: bool) -> ServerProcess:
    proc = ServerProcess(
        workdir,
        extra_config=SPACE + certs.tls_section("iproto", client_certs=client_certs),
        admin_port=free_port(),
        tls_client=certs.client_context(cert=client_certs),
    )
    return proc


@pytest.fixture(scope="module")
def mutual(tmp_path_factory, certs):
    proc = tls_server(tmp_path_factory.mktemp("tls-mutual"), certs, client_certs=True)
    proc.start()
    yield proc
    proc.stop()


def connector(port: int, certs: Certs, **ssl_options) -> tarantool.Connection:
    return tarantool.Connection("127.0.0.1", port, transport="ssl", connection_timeout=10, **ssl_options)


def test_the_connector_with_its_ssl_options(mutual, certs):
    c = connector(mutual.port, certs, ssl_cert_file=str(certs.client_cert), ssl_key_file=str(certs.client_key),
                  ssl_ca_file=str(certs.ca_file))
    try:
        assert c.ping() >= 0
        c.replace("kv", [1, "over tls"])
        assert list(c.select("kv", [1])[0]) == [1, "over tls"]
        assert c.call("box.session.id")[0] > 0
        big = "x" * 300_000  # several TLS records each way
        c.replace("kv", [2, big])
        assert c.select("kv", [2])[0][1] == big
    finally:
        c.close()


def test_a_client_certificate_is_required_with_ca_file(mutual, certs):
    with pytest.raises((NetworkError, SslError)):
        connector(mutual.port, certs, ssl_ca_file=str(certs.ca_file))  # no certificate
    with pytest.raises((NetworkError, SslError)):
        connector(mutual.port, certs, ssl_cert_file=str(certs.stranger_cert),
                  ssl_key_file=str(certs.stranger_key), ssl_ca_file=str(certs.ca_file))


def test_plain_tcp_gets_no_greeting(mutual):
    with socket.create_connection(("127.0.0.1", mutual.port), timeout=15) as s:
        s.sendall(b"\x00" * 64)  # not a ClientHello
        with pytest.raises((ConnectionError, OSError)):
            read_exactly(s, 128)


def test_the_server_goes_on_after_failed_handshakes(mutual, certs):
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", mutual.port), timeout=15) as s:
            s.sendall(b"\x16\x03\x01\x00\x05hello")  # a broken ClientHello
    c = connector(mutual.port, certs, ssl_cert_file=str(certs.client_cert), ssl_key_file=str(certs.client_key))
    try:
        assert c.ping() >= 0
    finally:
        c.close()


def test_read_only_port_over_tls(mutual, certs):
    c = connector(mutual.ro_port, certs, ssl_cert_file=str(certs.client_cert), ssl_key_file=str(certs.client_key),
                  ssl_ca_file=str(certs.ca_file))
    try:
        c.replace  # noqa: B018 - the connector is usable
        assert c.select("kv", []) is not None
        with pytest.raises(DatabaseError) as err:
            c.replace("kv", [3, "no"])
        assert err.value.code == 7  # ER_READONLY
    finally:
        c.close()


def test_admin_console_over_tls(mutual, certs):
    with tls_socket(mutual.admin_port, certs.client_context()) as s:
        greeting = read_exactly(s, 128)
        assert greeting.startswith(b"Tarantool") and b"Lua console" in greeting
        s.sendall(b"1 + 1\n")
        answer = b""
        while b"\n...\n" not in answer:
            answer += s.recv(4096)
        assert answer == b"---\n- 2\n...\n"
    with pytest.raises(OSError), tls_socket(mutual.admin_port, certs.client_context(cert=False)) as s:
        read_exactly(s, 128)  # no client certificate


def test_tls_without_client_certificates(tmp_path, certs):
    proc = tls_server(tmp_path, certs, client_certs=False)
    proc.start()
    try:
        c = connector(proc.port, certs, ssl_ca_file=str(certs.ca_file))  # checks the server
        try:
            c.replace("kv", [5, "server-only TLS"])
            assert c.select("kv", [5])[0][1] == "server-only TLS"
        finally:
            c.close()
        c = connector(proc.port, certs)  # the connector's default: no verification
        try:
            assert c.ping() >= 0
        finally:
            c.close()
    finally:
        assert proc.stop() == 0


def test_a_bad_certificate_file_stops_the_start(tmp_path, certs):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    proc = ServerProcess(tmp_path, extra_config=f'[iproto.tls]\ncert_file = "{bad}"\nkey_file = "{certs.server_key}"\n')
    with pytest.raises(RuntimeError):
        proc.start(timeout=15)
    assert proc.proc is not None and proc.proc.wait(15) == 2
    assert "cannot load the certificate" in proc.log()
    proc.proc = None
