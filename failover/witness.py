"""The witness: a third party that tells a dead peer from a cut link (docs/failover.md,
"The witness").

Owns: the two datagrams of the witness protocol and their signature (HMAC-SHA256 with
``keys.WITNESS``, a key derived from the pair's shared secret: never the secret itself),
the freshness of a ping (``Sender``), and ``WitnessView``, what the answers of one or more
witnesses say taken together. Each server sends its witnesses a ping every heartbeat (its
name, state and epoch, a fresh nonce, its boot and a sequence number that grows within the
boot, and the challenge of the witness's latest answer); a witness answers with how long
ago it last heard each other server of the pair, and what that server said then. A
witness that has never heard a server counts it silent since it first heard the pair.

A ping counts as hearing its sender only if it is fresh: it echoes one of the last
challenges the witness gave that sender, and its sequence number is above every one the
witness counted for that boot. A ping captured and sent again, now or after a restart of
either side, is answered but never heard (docs/failover.md, "The witness").

The rules the answers serve (the controller applies them; the state machine holds the
verdict): a PASSIVE takes over by client vote only if a majority of the witnesses has not
heard the ACTIVE for twice the failover timeout, and an ACTIVE that has lost its peer and
cannot reach a majority of witnesses for a timeout stops serving (it confirms nothing).
Two majorities share a witness, and the ACTIVE stops a timeout before that witness can call
it silent: two servers never serve in one period. A witness remembers telling a server's
peer that the server was silent (``overtaken``, until the server steps down): such a server
serves again only on its peer's own word, never on the witness's.

Must not know: sockets, asyncio, clocks, logging. Pure: values in, values out.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from . import keys

MAGIC = b"AW2"  # AW1 signed with the pair's secret itself and had no freshness
# A witness's note that it refused a ping it could not verify: unsigned (it holds no key
# the asker would accept), so a server only reports it, never acts on it.
REFUSAL = b"AWR"
REFUSAL_TEXT = 120
MAC_BYTES = 32
MAX_DATAGRAM = 4096
_CONTEXT = b"amqha-witness\x00"
# The challenges a witness gave a server that a ping may still echo: one is given per ping
# heard, so a ping captured this many heard pings ago is stale whatever it carries.
CHALLENGES = 4
# The boots of one server whose highest sequence number a witness remembers.
BOOTS = 4


class BadDatagram(ValueError):
    """A datagram that is not a witness message for us: ignored, never answered."""


@dataclass(frozen=True, slots=True)
class Ping:
    pair: str
    name: str
    state: str
    epoch: int
    nonce: str
    # A server that is not ACTIVE asks whether its peer has been silent this long; a
    # witness that answers yes records that it did (the peer is then "overtaken").
    silent_for: float = 0.0
    boot: str = ""  # one value per run of the sender: seq restarts with it
    seq: int = 0  # grows by one per ping within a boot
    echo: str = ""  # the challenge of the witness's latest answer to the sender ("" none)


@dataclass(frozen=True, slots=True)
class PeerSeen:
    """One other server of the pair, as a witness last heard it."""

    age: float  # seconds since the witness last heard it (or since it first heard the pair)
    state: str | None  # what it said then; None if the witness never heard it
    epoch: int | None


@dataclass(frozen=True, slots=True)
class Answer:
    pair: str
    to: str
    nonce: str
    # Seconds since the witness first heard any server of this pair ("uptime" on the wire):
    # how long a server it never heard has been silent at most.
    known_for: float
    peers: dict[str, PeerSeen]
    # This witness told the asker's peer that the asker was silent (a takeover may have
    # followed), and the asker has not stepped down since: it must not serve on the
    # witness's word alone any more.
    overtaken: bool = False
    challenge: str = ""  # what the asker's next ping echoes
    counted: bool = True  # the ping was fresh: the witness heard the asker


def _sign(secret: bytes, body: bytes) -> bytes:
    key = keys.derive(secret, keys.WITNESS)
    return MAGIC + hmac.new(key, _CONTEXT + body, hashlib.sha256).digest() + body


def _open(secret: bytes, data: bytes) -> dict[str, Any]:
    """``secret``: the pair's; datagrams are signed with the key derived for the witness."""
    if len(data) > MAX_DATAGRAM or not data.startswith(MAGIC):
        raise BadDatagram("not a witness datagram")
    mac, body = data[len(MAGIC) : len(MAGIC) + MAC_BYTES], data[len(MAGIC) + MAC_BYTES :]
    key = keys.derive(secret, keys.WITNESS)
    expected = hmac.new(key, _CONTEXT + body, hashlib.sha256).digest()
    if not hmac.compare_digest(mac, expected):
        raise BadDatagram("bad signature")
    try:
        fields = json.loads(body)
    except ValueError:
        raise BadDatagram("not JSON") from None
    if not isinstance(fields, dict):
        raise BadDatagram("not an object")
    return fields


def encode_refusal(reason: str) -> bytes:
    return REFUSAL + reason.encode("ascii", "replace")[:REFUSAL_TEXT]


def parse_refusal(data: bytes) -> str | None:
    """The reason a witness gave for refusing our ping, or None if ``data`` is no refusal."""
    if not data.startswith(REFUSAL) or len(data) > len(REFUSAL) + REFUSAL_TEXT:
        return None
    text = data[len(REFUSAL) :].decode("ascii", "replace")
    return "".join(c if c.isprintable() else "?" for c in text)


def _field(fields: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = fields.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise BadDatagram(f"{key}: wrong type")
    return value


def encode_ping(secret: bytes, ping: Ping) -> bytes:
    body: dict[str, Any] = {"k": "ping", "pair": ping.pair, "name": ping.name}
    body["state"] = ping.state
    body |= {"epoch": ping.epoch, "nonce": ping.nonce, "silent_for": ping.silent_for}
    body |= {"boot": ping.boot, "seq": ping.seq, "echo": ping.echo}
    return _sign(secret, json.dumps(body, separators=(",", ":")).encode())


def parse_ping(secret: bytes, data: bytes) -> Ping:
    fields = _open(secret, data)
    if fields.get("k") != "ping":
        raise BadDatagram("not a ping")
    epoch = _field(fields, "epoch", int)
    if not 0 <= epoch < 2**63:
        raise BadDatagram("epoch out of range")
    silent_for = float(_field(fields, "silent_for", (int, float)))
    if not 0.0 <= silent_for < 1e6:
        raise BadDatagram("silent_for out of range")
    seq = _field(fields, "seq", int)
    if not 0 <= seq < 2**63:
        raise BadDatagram("seq out of range")
    return Ping(
        _field(fields, "pair", str)[:200],
        _field(fields, "name", str)[:200],
        _field(fields, "state", str)[:20],
        epoch,
        _field(fields, "nonce", str)[:64],
        silent_for,
        _field(fields, "boot", str)[:64],
        seq,
        _field(fields, "echo", str)[:64],
    )


def encode_answer(secret: bytes, answer: Answer) -> bytes:
    peers = {
        name: {"age": round(seen.age, 4), "state": seen.state, "epoch": seen.epoch}
        for name, seen in answer.peers.items()
    }
    body: dict[str, Any] = {"k": "answer", "pair": answer.pair, "to": answer.to}
    body["nonce"] = answer.nonce
    body |= {"uptime": round(answer.known_for, 4), "peers": peers, "overtaken": answer.overtaken}
    body |= {"challenge": answer.challenge, "counted": answer.counted}
    return _sign(secret, json.dumps(body, separators=(",", ":")).encode())


def parse_answer(secret: bytes, data: bytes) -> Answer:
    fields = _open(secret, data)
    if fields.get("k") != "answer":
        raise BadDatagram("not an answer")
    uptime = _field(fields, "uptime", (int, float))
    peers_in = _field(fields, "peers", dict)
    peers: dict[str, PeerSeen] = {}
    for name, seen in peers_in.items():
        if not isinstance(seen, dict):
            raise BadDatagram("peers: expected objects")
        age = _field(seen, "age", (int, float))
        state, epoch = seen.get("state"), seen.get("epoch")
        if state is not None and not isinstance(state, str):
            raise BadDatagram("peers: state")
        if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool)):
            raise BadDatagram("peers: epoch")
        peers[str(name)] = PeerSeen(max(0.0, float(age)), state, epoch)
    overtaken = fields.get("overtaken")
    if not isinstance(overtaken, bool):
        raise BadDatagram("overtaken: wrong type")
    counted = fields.get("counted")
    if not isinstance(counted, bool):
        raise BadDatagram("counted: wrong type")
    return Answer(
        _field(fields, "pair", str),
        _field(fields, "to", str),
        _field(fields, "nonce", str),
        max(0.0, float(uptime)),
        peers,
        overtaken,
        _field(fields, "challenge", str)[:64],
        counted,
    )


@dataclass
class Sender:
    """What a witness keeps of one server to tell its fresh pings from stale ones."""

    challenges: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=CHALLENGES)
    )
    boots: dict[str, int] = field(default_factory=dict)  # boot -> highest seq heard

    def fresh(self, ping: Ping) -> bool:
        """The ping echoes a challenge still current and is newer than any heard of its
        boot. A replay fails one or the other: the same ping again repeats a sequence
        number already heard, an older one echoes a challenge given ``CHALLENGES`` heard
        pings ago, or one this witness (restarted since) never gave."""
        if not ping.echo or ping.echo not in self.challenges:
            return False
        return ping.seq > self.boots.get(ping.boot, -1)

    def heard(self, ping: Ping, challenge: str) -> None:
        """A fresh ping: its sequence number is spent, and a new challenge is current."""
        self.boots.pop(ping.boot, None)
        self.boots[ping.boot] = ping.seq
        while len(self.boots) > BOOTS:
            del self.boots[next(iter(self.boots))]
        self.challenges.append(challenge)

    def latest(self) -> str | None:
        return self.challenges[-1] if self.challenges else None


@dataclass(frozen=True, slots=True)
class Heard:
    """A witness's latest answer, at ``at`` (this server's monotonic clock)."""

    at: float
    peer: PeerSeen
    overtaken: bool = False


class WitnessView:
    """What a server's witnesses said last, taken together (a majority of them)."""

    def __init__(self, witnesses: int) -> None:
        if witnesses < 1:
            raise ValueError("a witness view needs at least one witness")
        self.witnesses = witnesses
        self.majority = witnesses // 2 + 1
        self.latest: dict[int, Heard] = {}  # witness index -> its latest answer

    def heard(self, index: int, now: float, answer: Answer, peer: str | None) -> None:
        """Witness ``index`` answered at ``now``. ``peer``: our peer's name (None: the only
        other server the witness knows of, if there is one)."""
        seen = answer.peers.get(peer) if peer is not None else None
        if seen is None and peer is None and len(answer.peers) == 1:
            seen = next(iter(answer.peers.values()))
        if seen is None:  # never heard: silent since the witness first heard the pair
            seen = PeerSeen(answer.known_for, None, None)
        self.latest[index] = Heard(now, seen, answer.overtaken)

    def _fresh(self, now: float, window: float) -> list[Heard]:
        return [heard for heard in self.latest.values() if now - heard.at <= window]

    def reachable(self, now: float, window: float) -> bool:
        """A majority of the witnesses answered within ``window``."""
        return len(self._fresh(now, window)) >= self.majority

    def peer_gone(self, now: float, window: float, silent_for: float) -> bool:
        """A majority answered within ``window``, each not having heard the peer for at
        least ``silent_for`` seconds (counted to now)."""
        silent = [
            heard
            for heard in self._fresh(now, window)
            if heard.peer.age + (now - heard.at) >= silent_for
        ]
        return len(silent) >= self.majority

    def overtaken(self, now: float, window: float) -> bool:
        """A witness told our peer we were silent, and we have not stepped down since."""
        return any(heard.overtaken for heard in self._fresh(now, window))

    def peer_leads_above(self, epoch: int, now: float, window: float) -> bool:
        """A witness heard the peer ACTIVE in an epoch above ``epoch`` (it took over)."""
        return any(
            heard.peer.state == "ACTIVE" and (heard.peer.epoch or 0) > epoch
            for heard in self._fresh(now, window)
        )
