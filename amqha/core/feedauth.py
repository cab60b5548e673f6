"""Proof of the pair's secret on the replication link, both ways.

Owns the byte layouts of the proofs; the feed (``amqha/replication.py``, and the
channel that takes the subscription) and the follower compute and check them.

- The ACTIVE gives every client connection a fresh random nonce in Connection.Start
  (server property ``amqha_nonce``).
- The PASSIVE subscribes to ``amq.replication`` with a nonce of its own and a proof:
  HMAC-SHA256 with the pair's secret over a label and both nonces. A login with the
  peering password alone, or a replay of an old subscription (the server's nonce is new
  on every connection), is refused.
- Both sides derive the session key from the secret and both nonces. Every run the
  ACTIVE sends carries a MAC with that key over its delivery tag, its flags (the end of
  the snapshot, the in-sync marker's LSN) and its body: a server that does not hold the
  secret cannot feed a PASSIVE, and a run cannot be changed, replayed or reordered
  without the PASSIVE refusing it. Keyed BLAKE2b: a MAC in one pass, faster than HMAC.
- A server that handed the service over may ask to resume where it left off rather than
  take a snapshot (docs/durability.md, section 5, "Resuming after a handover"): the
  point it names (the epoch it led in, its last LSN) carries a MAC with the session key,
  so that only the pair's peer can ask for it.

See docs/security.md, "The replication link". Pure: no sockets, clocks or logging.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

NONCE_PROPERTY = "amqha_nonce"  # Connection.Start server property: the server's nonce
NONCE_ARGUMENT = "x-amqha-nonce"  # Basic.Consume argument: the subscriber's nonce
PROOF_ARGUMENT = "x-amqha-proof"  # Basic.Consume argument: the subscriber's proof
MAC_HEADER = "amqha-mac"  # each run's MAC
RESUME_ARGUMENT = "x-amqha-resume"  # Basic.Consume argument: "EPOCH:LSN:MAC"
NONCE_BYTES = 16
_SUBSCRIBE = b"amqha replication subscribe\n"
_SESSION = b"amqha replication session\n"
_RUN_HEAD = struct.Struct(">QBq")
_RESUME = struct.Struct(">27sQQ")
_RESUME_LABEL = b"amqha replication resume\n"


def parse_nonce(value: object) -> bytes | None:
    """A nonce as sent (hex text), or None if it is not one."""
    if not isinstance(value, str) or len(value) != 2 * NONCE_BYTES:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def subscribe_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> str:
    """What the PASSIVE sends to prove it holds ``secret``."""
    return hmac.new(secret, _SUBSCRIBE + server_nonce + client_nonce, hashlib.sha256).hexdigest()


def proof_holds(secret: bytes, server_nonce: bytes, client_nonce: bytes, proof: object) -> bool:
    if not secret or not isinstance(proof, str):
        return False
    return hmac.compare_digest(subscribe_proof(secret, server_nonce, client_nonce), proof)


def session_key(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, _SESSION + server_nonce + client_nonce, hashlib.sha256).digest()


def run_mac(key: bytes, tag: int, snapshot_end: bool, marker_lsn: int | None, body: bytes) -> str:
    """The MAC of one run as delivered: its tag, its flags and its bytes."""
    mac = hashlib.blake2b(
        _RUN_HEAD.pack(tag, snapshot_end, -1 if marker_lsn is None else marker_lsn),
        key=key[:64],
        digest_size=16,
    )
    mac.update(body)
    return mac.hexdigest()


def run_mac_holds(
    key: bytes, tag: int, snapshot_end: bool, marker_lsn: int | None, body: bytes, mac: object
) -> bool:
    if not isinstance(mac, str):
        return False
    return hmac.compare_digest(run_mac(key, tag, snapshot_end, marker_lsn, body), mac)


def _resume_mac(key: bytes, epoch: int, lsn: int) -> str:
    return hashlib.blake2b(
        _RESUME.pack(_RESUME_LABEL, epoch, lsn), key=key[:64], digest_size=16
    ).hexdigest()


def resume_argument(key: bytes, epoch: int, lsn: int) -> str:
    """What a server that handed the service over in ``epoch`` at its LSN ``lsn`` sends
    to resume from there."""
    return f"{epoch}:{lsn}:{_resume_mac(key, epoch, lsn)}"


def parse_resume(key: bytes, value: object) -> tuple[int, int] | None:
    """The (epoch, lsn) a subscriber asks to resume from, if its MAC holds; else None
    (a snapshot, as for any subscription)."""
    if not isinstance(value, str):
        return None
    parts = value.split(":")
    if len(parts) != 3 or not all(part.isdigit() and len(part) <= 19 for part in parts[:2]):
        return None
    epoch, lsn = int(parts[0]), int(parts[1])
    if epoch >= 1 << 64 or lsn >= 1 << 64:
        return None
    if not hmac.compare_digest(_resume_mac(key, epoch, lsn), parts[2]):
        return None
    return epoch, lsn
