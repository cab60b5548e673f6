"""The keys derived from the pair's shared secret, one per use (docs/security.md, "Keys").

Owns: HKDF (RFC 5869) with SHA-256 over ``failover.secret``, the label of each use, and
the peering login's proof (a challenge-response on the peer's Connection.Start nonce). A
key made for one use never verifies another's messages: a witness, which holds the pair's
secret to answer pings, learns nothing it could sign a state message or a peering login
with, and a signature captured on one channel means nothing on another. Both servers and
every witness derive the same way from the same secret.

Must not know: sockets, clocks, where the secret comes from. Pure: bytes in, bytes out.
"""

from __future__ import annotations

import functools
import hashlib
import hmac

_SALT = b"amqha pair secret v1"
# One label per use of the secret.
WITNESS = "witness datagrams"
PEER_MESSAGES = "peer state messages"
PEERING_LOGIN = "peering login"


# A peering login's password field when it carries a proof rather than a password.
PROOF_PREFIX = "amqha-proof:"


def peering_login_proof(secret: bytes, server_nonce: bytes, user: str) -> str:
    """What a server sends as its peering login's password: HMAC-SHA256 with the peering
    login key over the nonce the peer gave at Connection.Start and the user name. It
    proves the pair's secret for this connection only; the password is never sent."""
    key = derive(secret, PEERING_LOGIN)
    mac = hmac.new(key, b"amqha peering login\x00" + server_nonce + user.encode(), hashlib.sha256)
    return PROOF_PREFIX + mac.hexdigest()


def peering_login_holds(secret: bytes, server_nonce: bytes, user: str, given: str) -> bool:
    if not secret or not server_nonce:
        return False
    expected = peering_login_proof(secret, server_nonce, user)
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))


@functools.lru_cache(maxsize=32)
def derive(secret: bytes, label: str) -> bytes:
    """The 32-byte key for ``label`` (HKDF-Extract with a fixed salt, then one block of
    HKDF-Expand with the label as its info)."""
    prk = hmac.new(_SALT, secret, hashlib.sha256).digest()
    return hmac.new(prk, label.encode() + b"\x01", hashlib.sha256).digest()
