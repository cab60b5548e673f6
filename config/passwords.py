"""Password hashes as they are written in a config file: making them and checking a login.

Owns: the accepted formats of ``password_hash``, parsing one (with a problem worded for
the config loader), hashing a new password (``amqha passwd``) and checking a password
against a stored hash or plain password in constant time.

Formats:

- ``$scrypt$ln=15,r=8,p=1$SALT$HASH`` (what ``amqha passwd`` writes): stdlib scrypt,
  ``n = 2**ln``, SALT and HASH in unpadded standard base64 (the PHC string format).
- A RabbitMQ hash as found in a definitions export (``rabbit_password_hashing_sha256`` or
  ``_sha512``): base64 of a 4-byte salt followed by SHA-256 (or SHA-512) of salt + password.
  Users can be carried over from a RabbitMQ broker unchanged.

Must not know: users, connections, the event loop. Checking an scrypt hash takes a tenth
of a second of CPU; the caller decides where to run it (``Verifier.costly``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from dataclasses import dataclass

SCRYPT_LN = 15  # n = 32768: 32 MiB and about 0.1 s per check
SCRYPT_R = 8
SCRYPT_P = 1
# A config could name any cost; past this a single login would hold more memory than a
# broker should spend on one (and hashlib refuses beyond its maxmem anyway).
SCRYPT_MAX_MEMORY = 256 * 1024 * 1024
# And at most this much work (n * r * p, four times the default's, about a second of
# CPU): p multiplies the time without the memory, so the memory cap alone let one hash
# cost 12 s (docs/security.md, "Password hashes").
SCRYPT_MAX_WORK = 4 * (1 << SCRYPT_LN) * SCRYPT_R * SCRYPT_P
SALT_BYTES = 16
KEY_BYTES = 32

_SCRYPT = re.compile(
    r"^\$scrypt\$ln=(\d+),r=(\d+),p=(\d+)\$([A-Za-z0-9+/]+={0,2})\$([A-Za-z0-9+/]+={0,2})$"
)
_RABBITMQ = {36: hashlib.sha256, 68: hashlib.sha512}  # 4-byte salt + digest


class BadHash(ValueError):
    """A ``password_hash`` in no accepted format (the message says what is wrong)."""


@dataclass(frozen=True)
class Verifier:
    """What a login's password is checked against."""

    scheme: str  # "plain", "scrypt", "rabbitmq-sha256", "rabbitmq-sha512"
    salt: bytes
    digest: bytes
    ln: int = 0
    r: int = 0
    p: int = 0

    @property
    def costly(self) -> bool:
        """True when a check is slow enough to keep off the event loop."""
        return self.scheme == "scrypt"

    def check(self, password: str) -> bool:
        candidate = password.encode("utf-8", "surrogateescape")
        if self.scheme == "plain":
            computed = candidate
        elif self.scheme == "scrypt":
            computed = _scrypt(candidate, self.salt, self.ln, self.r, self.p, len(self.digest))
        else:
            algorithm = hashlib.sha256 if self.scheme == "rabbitmq-sha256" else hashlib.sha512
            computed = algorithm(self.salt + candidate).digest()
        return hmac.compare_digest(computed, self.digest)


def plain(password: str) -> Verifier:
    return Verifier("plain", b"", password.encode("utf-8", "surrogateescape"))


def parse_hash(text: str) -> Verifier:
    """The verifier of a ``password_hash``; BadHash says why the text is not one."""
    text = text.strip()
    if text.startswith("$scrypt$"):
        match = _SCRYPT.match(text)
        if match is None:
            raise BadHash("expected '$scrypt$ln=N,r=N,p=N$SALT$HASH' (as 'amqha passwd' writes)")
        ln, r, p = (int(match.group(i)) for i in (1, 2, 3))
        if not 1 <= ln <= 24 or not 1 <= r <= 64 or not 1 <= p <= 16:
            raise BadHash(
                f"scrypt cost out of range (ln 1..24, r 1..64, p 1..16): ln={ln},r={r},p={p}"
            )
        if _scrypt_memory(ln, r) > SCRYPT_MAX_MEMORY:
            raise BadHash(
                f"scrypt cost ln={ln},r={r} needs {_scrypt_memory(ln, r) >> 20} MiB per login "
                f"(at most {SCRYPT_MAX_MEMORY >> 20} MiB)"
            )
        work = (1 << ln) * r * p
        if work > SCRYPT_MAX_WORK:
            raise BadHash(
                f"scrypt cost ln={ln},r={r},p={p} is n*r*p = {work}, more than the "
                f"{SCRYPT_MAX_WORK} accepted (4 times the default ln={SCRYPT_LN},"
                f"r={SCRYPT_R},p={SCRYPT_P})"
            )
        try:
            salt, digest = _b64(match.group(4)), _b64(match.group(5))
        except (binascii.Error, ValueError):
            raise BadHash("scrypt salt or hash is not valid base64") from None
        if len(salt) < 8 or len(digest) < 16:
            raise BadHash("scrypt salt or hash too short (at least 8 and 16 bytes)")
        return Verifier("scrypt", salt, digest, ln, r, p)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadHash(
            "not a password hash: expected '$scrypt$...' (from 'amqha passwd') "
            "or a RabbitMQ SHA-256/SHA-512 hash in base64"
        ) from None
    algorithm = _RABBITMQ.get(len(raw))
    if algorithm is None:
        raise BadHash(
            f"a base64 hash of {len(raw)} bytes is neither RabbitMQ SHA-256 (36 bytes) "
            "nor SHA-512 (68 bytes); MD5 hashes are not accepted"
        )
    scheme = "rabbitmq-sha256" if algorithm is hashlib.sha256 else "rabbitmq-sha512"
    return Verifier(scheme, raw[:4], raw[4:])


def hash_password(password: str, scheme: str = "scrypt") -> str:
    """A new salted hash of ``password`` in one of the accepted formats."""
    candidate = password.encode("utf-8", "surrogateescape")
    if scheme == "scrypt":
        salt = os.urandom(SALT_BYTES)
        digest = _scrypt(candidate, salt, SCRYPT_LN, SCRYPT_R, SCRYPT_P, KEY_BYTES)
        return (
            f"$scrypt$ln={SCRYPT_LN},r={SCRYPT_R},p={SCRYPT_P}"
            f"${_unpadded(salt)}${_unpadded(digest)}"
        )
    if scheme in ("rabbitmq-sha256", "rabbitmq-sha512"):
        algorithm = hashlib.sha256 if scheme == "rabbitmq-sha256" else hashlib.sha512
        salt = os.urandom(4)
        return base64.b64encode(salt + algorithm(salt + candidate).digest()).decode()
    raise ValueError(f"unknown hashing scheme {scheme!r}")


def _scrypt(password: bytes, salt: bytes, ln: int, r: int, p: int, size: int) -> bytes:
    return hashlib.scrypt(
        password,
        salt=salt,
        n=1 << ln,
        r=r,
        p=p,
        maxmem=_scrypt_memory(ln, r) + 1024 * 1024,
        dklen=size,
    )


def _scrypt_memory(ln: int, r: int) -> int:
    return 128 * r * (1 << ln)


def _b64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def _unpadded(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")
