"""The keys derived from the pair's shared secret, one per use (docs/security.md, "Keys").

Owns: HKDF (RFC 5869) with SHA-256 over ``failover.secret``, and the label of each use. A
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


@functools.lru_cache(maxsize=32)
def derive(secret: bytes, label: str) -> bytes:
    """The 32-byte key for ``label`` (HKDF-Extract with a fixed salt, then one block of
    HKDF-Expand with the label as its info)."""
    prk = hmac.new(_SALT, secret, hashlib.sha256).digest()
    return hmac.new(prk, label.encode() + b"\x01", hashlib.sha256).digest()
