"""TLS for the listeners, built once at start from the typed configuration and passed down.

Every listener terminates TLS itself (iproto, the read-only port, the admin console, the HTTP
front door, and Deckard's gRPC with ALPN ``h2``) with an :class:`ssl.SSLContext` made here. A
file that is not a certificate or a key stops the server at start with the file named (exit
status 2, like any configuration problem).

With ``ca_file`` the server asks for a client certificate and refuses the handshake without one
signed by that CA (Tarantool Enterprise's ``ssl_ca_file`` on a listener); Deckard's
``client_auth = "optional"`` checks a certificate only when one is given.

TLS 1.2 stays allowed: the ``tarantool`` connector pins its SSL transport to TLS 1.2.
"""

from __future__ import annotations

import ssl

from boxqueue.config import Config, ConfigError, DeckardTlsConfig, TlsConfig


def server_context(tls: TlsConfig, *, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
    """A server-side context for ``tls``; ``alpn`` lists the protocols offered (HTTP listeners:
    ``http/1.1``; Deckard: ``h2``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(str(tls.cert_file), None, f"cannot load the certificate and key {tls.key_file}: {exc}") from None
    if tls.ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(tls.ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(str(tls.ca_file), None, f"cannot load the CA certificates: {exc}") from None
        optional = isinstance(tls, DeckardTlsConfig) and tls.client_auth == "optional"
        context.verify_mode = ssl.CERT_OPTIONAL if optional else ssl.CERT_REQUIRED
    if tls.ciphers:
        try:
            context.set_ciphers(tls.ciphers)
        except ssl.SSLError as exc:
            raise ConfigError(str(tls.cert_file), None, f"bad ciphers {tls.ciphers!r}: {exc}") from None
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context


def check_all(config: Config) -> None:
    """Load every listener's certificates once at start, so a bad file is a ConfigError (exit
    status 2 with the file named) rather than a failure of one listener."""
    sections = (config.iproto, config.deckard, config.zaqar, config.sonya, getattr(config, "metrics", None))
    for section in sections:
        tls = getattr(section, "tls", None)
        if tls is not None:
            server_context(tls)
