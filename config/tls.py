"""TLS contexts built from the config: the amqps listener's and the peering link's.

Owns: turning ``TlsListener`` and ``PeerTls`` into ``ssl.SSLContext`` objects (stdlib ssl,
TLS 1.2 or later, the system's default ciphers), and wording what is wrong with a
certificate, a key or a CA file as ``FILE: KEY: PROBLEM``. The loader builds each context
once to check it, so a bad certificate stops the server at start, not at the first client.

Must not know: sockets, the event loop, the broker.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from .schema import ConfigError, PeerTls, TlsListener


def server_context(listener: TlsListener, source: str) -> ssl.SSLContext:
    # Not create_default_context: that would trust the system's CAs for client certificates.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, listener.cert, listener.key, source, "tls")
    if listener.ca is not None:
        try:
            context.load_verify_locations(cafile=listener.ca)
        except ssl.SSLError as error:
            raise ConfigError(
                source, "tls.ca", f"not a CA certificate file: {_reason(error)}"
            ) from None
    context.verify_mode = {
        "none": ssl.CERT_NONE,
        "optional": ssl.CERT_OPTIONAL,
        "required": ssl.CERT_REQUIRED,
    }[listener.client_certs]
    return context


def client_context(
    peer_tls: PeerTls, source: str, prefix: str = "failover.peer_tls"
) -> ssl.SSLContext:
    # Only the configured CA is trusted for the peer, not the system's (a cafile replaces them);
    # the peer's name is checked against its certificate.
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=peer_tls.ca)
    except ssl.SSLError as error:
        raise ConfigError(
            source, f"{prefix}.ca", f"not a CA certificate file: {_reason(error)}"
        ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if peer_tls.cert is not None and peer_tls.key is not None:
        _load_chain(context, peer_tls.cert, peer_tls.key, source, prefix)
    return context


def _load_chain(context: ssl.SSLContext, cert: str, key: str, source: str, prefix: str) -> None:
    # OpenSSL says "PEM lib" whichever of the two files is wrong: look at them first.
    if b"-----BEGIN CERTIFICATE-----" not in Path(cert).read_bytes():
        raise ConfigError(source, f"{prefix}.cert", f"no PEM certificate in {cert!r}")
    if b"PRIVATE KEY-----" not in Path(key).read_bytes():
        raise ConfigError(source, f"{prefix}.key", f"no PEM private key in {key!r}")

    def no_passphrase() -> str:
        # Without this OpenSSL would prompt on the terminal for an encrypted key.
        raise ConfigError(source, f"{prefix}.key", "the key is encrypted; give an unencrypted key")

    try:
        context.load_cert_chain(cert, key, password=no_passphrase)
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                source, f"{prefix}.key", f"{key!r} is not the key of {prefix}.cert {cert!r}"
            ) from None
        raise ConfigError(
            source, f"{prefix}.cert", f"cannot load the certificate and key: {_reason(error)}"
        ) from None


def _reason(error: ssl.SSLError) -> str:
    return str(error.reason or error.strerror or error)
