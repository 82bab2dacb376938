"""Certificates made at run time (trustme) and TLS-capable raw clients for the security tests."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass
class Certs:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate signed by the CA
    and one signed by another CA, all as PEM files in ``folder``."""

    folder: Path
    ca: trustme.CA
    server_cert: Path
    server_key: Path
    ca_file: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path

    @classmethod
    def make(cls, folder: Path) -> Certs:
        folder.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("client@boxqueue.test")
        stranger = trustme.CA().issue_cert("stranger@elsewhere.test")

        def write(name: str, blob: trustme.Blob) -> Path:
            path = folder / name
            blob.write_to_path(str(path))
            return path

        ca_file = write("ca.pem", ca.cert_pem)
        server_cert = folder / "server.pem"
        server_cert.write_bytes(b"".join(b.bytes() for b in server.cert_chain_pems))
        client_cert = folder / "client.pem"
        client_cert.write_bytes(b"".join(b.bytes() for b in client.cert_chain_pems))
        stranger_cert = folder / "stranger.pem"
        stranger_cert.write_bytes(b"".join(b.bytes() for b in stranger.cert_chain_pems))
        return cls(
            folder, ca, server_cert, write("server.key", server.private_key_pem), ca_file,
            client_cert, write("client.key", client.private_key_pem),
            stranger_cert, write("stranger.key", stranger.private_key_pem),
        )

    def tls_section(self, section: str, *, client_certs: bool = True, extra: str = "") -> str:
        ca = f'ca_file = "{self.ca_file}"\n' if client_certs else ""
        return f'[{section}.tls]\ncert_file = "{self.server_cert}"\nkey_file = "{self.server_key}"\n{ca}{extra}'

    def client_context(self, *, cert: bool = True, stranger: bool = False) -> ssl.SSLContext:
        """What a client trusting the CA uses, presenting the client certificate (or the
        stranger's, or none)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if stranger:
            context.load_cert_chain(str(self.stranger_cert), str(self.stranger_key))
        elif cert:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def tls_socket(port: int, context: ssl.SSLContext, timeout: float = 30.0) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        return context.wrap_socket(raw, server_hostname="127.0.0.1")
    except BaseException:
        raw.close()
        raise


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data
