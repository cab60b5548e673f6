"""Certificates for the TLS tests, made fresh by trustme in each test's folder.

Nothing is committed, so nothing expires. ``Pki`` writes a CA, a server certificate for
the loopback names (127.0.0.1, ::1, localhost) and a client certificate, as PEM files,
and makes the client-side ``ssl.SSLContext`` objects the tests connect with.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import trustme

LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")


class Pki:
    """One CA and the files issued by it under ``folder`` (``name`` keeps two CAs apart)."""

    def __init__(self, folder: Path, name: str = "ca") -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.authority = trustme.CA(organization_name=f"amqha tests {name}")
        self.ca = self._write(f"{name}.pem", self.authority.cert_pem.bytes())
        server = self.authority.issue_cert(*LOOPBACK_NAMES)
        self.server_cert = self._write(
            f"{name}-server.pem", b"".join(blob.bytes() for blob in server.cert_chain_pems)
        )
        self.server_key = self._write(f"{name}-server.key", server.private_key_pem.bytes())
        client = self.authority.issue_cert("client@amqha.test")
        self.client_cert = self._write(
            f"{name}-client.pem", b"".join(blob.bytes() for blob in client.cert_chain_pems)
        )
        self.client_key = self._write(f"{name}-client.key", client.private_key_pem.bytes())

    def _write(self, name: str, data: bytes) -> str:
        path = self.folder / name
        path.write_bytes(data)
        return str(path)

    def listener(self, port: int, client_certs: str = "none") -> dict[str, str]:
        """A ``tls`` config section for a server presenting this CA's server certificate."""
        return {
            "listen": f"127.0.0.1:{port}",
            "cert": self.server_cert,
            "key": self.server_key,
            "ca": self.ca,
            "client_certs": client_certs,
        }

    def client_context(self, with_cert: bool = False) -> ssl.SSLContext:
        """What a client that trusts this CA connects with (and presents its cert, if asked)."""
        context = ssl.create_default_context(cafile=self.ca)
        if with_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context
