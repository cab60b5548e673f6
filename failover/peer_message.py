"""The amq.peer state message: encoding, signing, and validating it as data from the network.

Owns: the message's JSON fields, its signature (HMAC-SHA256 over the message type and the
body, with the key ``keys.PEER_MESSAGES`` derived from the pair's shared secret, carried in the ``amqha-mac`` header), and every check a
received message must pass before the state machine sees it: the signature, the types and
ranges of the fields (an epoch is an integer in [0, 2**63) and at most ``EPOCH_STEP_MAX``
above the highest epoch this server knows), ``listen`` among the addresses the config names
for the peer, the peer's configured name, and replays (a sequence number that does not grow
within one run of the peer).

Must not know: sockets, asyncio, clocks, logging, the broker. Pure: values in, values out.
See docs/security.md ("State messages").
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from amqha.core import protocol

from . import fsm, keys
from .maintenance import View

STATE_TYPE = "amqha.peer.state"
HANDOVER_TYPE = "amqha.peer.handover"
MAC_HEADER = "amqha-mac"

EPOCH_LIMIT = 2**63  # AMQP's signed 64-bit integer: Connection.Start carries the epoch
# A peer's epoch grows by one per takeover; one that leaps further is not a peer's.
EPOCH_STEP_MAX = 1000

_REQUIRED: dict[str, type] = {
    "name": str,
    "role": str,
    "state": str,
    "epoch": int,
    "listen": str,
    "boot": str,
    "seq": int,
}


class MalformedPeerMessage(ValueError):
    """A message on amq.peer that must not reach the state machine; the text says why,
    ``kind`` names the check it failed (a bounded set: the event log records each once)."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Expected:
    """What this server knows its peer must look like."""

    secret: bytes
    listen: frozenset[str]  # addresses the peer may announce (the config's peer_listen)
    name: str | None  # the peer's configured name, if the config names it


@dataclass(frozen=True, slots=True)
class StateMessage:
    peer: fsm.PeerInfo
    boot: str  # one value per run of the peer: seq restarts with it
    seq: int
    ts: float | None  # the peer's wall clock when it sent the message
    heard: tuple[str, int] | None  # the last (boot, seq) of ours the peer had received
    # The digests of the settings the pair must share (config.digest), if sent.
    config: dict[str, str] | None = None
    # The pair's maintenance view as the peer keeps it (docs/failover.md, "Maintenance").
    maintenance: View | None = None
    # The protocol the peer's release speaks (amqha.core.protocol; none sent: 1).
    protocol: int = 1
    # The peer's pair time when it sent the message (amqha.clock.pair_now; an older
    # release sends none): a PASSIVE takes its ACTIVE's.
    pair_ts: float | None = None


def signature(secret: bytes, kind: str, body: bytes) -> str:
    """``secret``: the pair's; the message is signed with the key derived for state messages."""
    key = keys.derive(secret, keys.PEER_MESSAGES)
    return hmac.new(key, kind.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def encode(secret: bytes, kind: str, fields: dict[str, Any]) -> tuple[bytes, str, dict[str, Any]]:
    """The body, the type and the headers of one signed message."""
    body = json.dumps(fields, separators=(",", ":")).encode()
    return body, kind, {MAC_HEADER: signature(secret, kind, body)}


def parse(
    expected: Expected,
    kind: str | None,
    body: bytes,
    headers: dict[str, Any] | None,
    known_epoch: int,
) -> StateMessage:
    """Validate one received message; raises ``MalformedPeerMessage`` with the reason."""
    if kind not in (STATE_TYPE, HANDOVER_TYPE):
        raise MalformedPeerMessage("type", f"unknown message type {kind!r}")
    mac = (headers or {}).get(MAC_HEADER)
    if isinstance(mac, bytes):
        mac = mac.decode("ascii", "replace")
    if not isinstance(mac, str) or not hmac.compare_digest(
        mac.encode("ascii", "replace"), signature(expected.secret, kind, body).encode()
    ):
        raise MalformedPeerMessage(
            "signature", "bad or missing signature (is failover.secret the same?)"
        )
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise MalformedPeerMessage("json", f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise MalformedPeerMessage("json", "not a JSON object")
    for key, type_ in _REQUIRED.items():
        value = data.get(key)
        if not isinstance(value, type_) or isinstance(value, bool):
            raise MalformedPeerMessage("field", f"field {key!r} missing or not {type_.__name__}")
    try:
        role, state = fsm.Role(data["role"]), fsm.State(data["state"])
    except ValueError as error:
        raise MalformedPeerMessage("field", str(error)) from None
    epoch = data["epoch"]
    if not 0 <= epoch < EPOCH_LIMIT:
        raise MalformedPeerMessage("epoch", f"epoch {epoch} out of range")
    if epoch > known_epoch + EPOCH_STEP_MAX:
        raise MalformedPeerMessage(
            "epoch_leap",
            f"epoch {epoch} leaps more than {EPOCH_STEP_MAX} above the highest known "
            f"({known_epoch})",
        )
    if data["listen"] not in expected.listen:
        raise MalformedPeerMessage(
            "listen",
            f"listen {data['listen']!r} is not an address the config names for the peer "
            f"({', '.join(sorted(expected.listen))})",
        )
    if expected.name is not None and data["name"] != expected.name:
        raise MalformedPeerMessage(
            "name", f"name {data['name']!r} is not the configured peer {expected.name!r}"
        )
    if data["seq"] < 0:
        raise MalformedPeerMessage("field", "negative seq")
    ts = data.get("ts")
    heard = data.get("heard")
    # Optional (servers without replication do not send it): whether the peer holds
    # everything its ACTIVE confirmed.
    in_sync = data.get("in_sync", True)
    if not isinstance(in_sync, bool):
        raise MalformedPeerMessage("field", "field 'in_sync' is not true or false")
    return StateMessage(
        fsm.PeerInfo(data["name"], role, state, epoch, data["listen"], in_sync),
        data["boot"],
        data["seq"],
        float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None,
        _heard(heard),
        _config(data.get("config")),
        _maintenance(data.get("maintenance")),
        _protocol(data.get("protocol")),
        _time(data.get("pair_ts")),
    )


def _time(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value == value:
        raise MalformedPeerMessage("field", "field 'pair_ts' is not a number")
    return float(value)


def _protocol(value: Any) -> int:
    try:
        return protocol.parse(value)
    except ValueError as error:
        raise MalformedPeerMessage("field", f"field 'protocol': {error}") from None


def _maintenance(value: Any) -> View | None:
    if value is None:
        return None
    try:
        return View.from_json(value)
    except ValueError as error:
        raise MalformedPeerMessage("field", f"field 'maintenance': {error}") from None


# Bounds on the ``config`` field: keys, and the length of a key and of a digest.
CONFIG_KEYS_MAX = 1000
CONFIG_KEY_LENGTH = 300
CONFIG_DIGEST_LENGTH = 64


def _config(value: Any) -> dict[str, str] | None:
    """Optional (a release before it sends none): the settings' digests."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or len(value) > CONFIG_KEYS_MAX
        or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= CONFIG_KEY_LENGTH
            and len(v) <= CONFIG_DIGEST_LENGTH
            for k, v in value.items()
        )
    ):
        raise MalformedPeerMessage("field", "field 'config' is not a map of settings to digests")
    return value


def _heard(value: Any) -> tuple[str, int] | None:
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    ):
        return value[0], value[1]
    return None
