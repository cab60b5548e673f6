"""The witness over UDP: a server's client of its witnesses, and ``amqha witness`` itself.

Owns: the datagram endpoints (one connected socket per witness on the server's side, one
listening socket on the witness's; both marked as control traffic, ``amqha.netmark``),
nonces (an answer counts only if it echoes a ping of ours still outstanding), the
server's boot, sequence numbers and the challenge each witness gave it last, what a
server makes known of witnesses that do not answer or whose answers fail verification
(a log line at most every ``SILENT_LOG`` seconds, and ``status``), and the witness's
record of whom it heard when. The protocol and its rules
are ``witness`` (docs/failover.md, "The witness").

Must not know: the state machine, the broker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
import signal
import time
from collections.abc import Callable
from typing import Any

from amqha.netmark import mark_transport

from .witness import (
    REFUSAL,
    Answer,
    BadDatagram,
    PeerSeen,
    Ping,
    Sender,
    encode_answer,
    encode_ping,
    encode_refusal,
    parse_answer,
    parse_ping,
    parse_refusal,
)

log = logging.getLogger("amqha.witness")

OUTSTANDING = 8  # pings per witness whose answer still counts
MAX_SERVERS = 1024  # servers a witness keeps track of (only signed pings add one)
# A witness unheard (no valid answer) for this many pings is reported as not answering.
SILENT_PINGS = 10
# At most one log line per witness this often while it stays silent or misconfigured.
SILENT_LOG = 30.0
# A witness tells at most this many senders a second that it refused their ping (a note
# shorter than the ping: a flood of forged pings is not amplified).
REFUSALS_PER_SECOND = 10


def _mark(transport: asyncio.BaseTransport, what: str) -> None:
    """The socket's datagrams marked ahead of bulk traffic (``amqha.netmark``)."""
    problem = mark_transport(transport)
    if problem is not None:
        log.warning("%s: %s; they may wait behind bulk traffic", what, problem)


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, owner: WitnessClient, index: int) -> None:
        self.owner = owner
        self.index = index
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.owner.received(self.index, data)

    def error_received(self, exc: Exception) -> None:
        pass  # a witness down answers with ICMP: the missing answer says it already


class WitnessClient:
    """Pings each witness every heartbeat; each valid answer goes to ``on_answer``."""

    def __init__(
        self,
        addresses: tuple[tuple[str, int], ...],
        secret: bytes,
        pair: str,
        name: str,
        on_answer: Callable[[int, Answer], None],
    ) -> None:
        self.addresses = addresses
        self.secret = secret
        self.pair = pair
        self.name = name
        self.on_answer = on_answer
        self.endpoints: list[_Endpoint | None] = [None] * len(addresses)
        self.nonces = [collections.deque(maxlen=OUTSTANDING) for _ in addresses]
        self.answers = [0] * len(addresses)
        self.refused = 0  # datagrams that were not a valid answer to one of our pings
        self._opening: set[int] = set()
        self._logged: list[str | None] = [None] * len(addresses)  # the last error said
        # Freshness (failover/witness.py): one boot per run, a sequence number per ping,
        # and the challenge each witness gave us last, echoed in the next ping.
        self.boot = secrets.token_hex(8)
        self.seq = 0
        self.challenges = [""] * len(addresses)
        # Per witness: pings since its last valid answer, answers that failed verification
        # since then, and why it is not heard (None: it answers).
        self.unanswered = [0] * len(addresses)
        self.bad = [0] * len(addresses)
        self.problem: list[str | None] = [None] * len(addresses)
        self._said_at = [float("-inf")] * len(addresses)
        self._bad_reason = ""
        self.clock: Callable[[], float] = time.monotonic

    async def _open(self, index: int) -> None:
        host, port = self.addresses[index]
        try:
            transport, endpoint = await asyncio.get_running_loop().create_datagram_endpoint(
                lambda: _Endpoint(self, index), remote_addr=(host, port)
            )
        except OSError as error:
            if str(error) != self._logged[index]:  # once per distinct error, not per heartbeat
                self._logged[index] = str(error)
                log.warning("witness %s:%d: cannot reach it (%s)", host, port, error)
            return
        finally:
            self._opening.discard(index)
        self._logged[index] = None
        self.endpoints[index] = endpoint
        _mark(transport, f"witness {host}:{port}: pings")

    def ping(self, state: str, epoch: int, silent_for: float) -> None:
        for index, endpoint in enumerate(self.endpoints):
            if endpoint is None or endpoint.transport is None:
                if index not in self._opening:
                    self._opening.add(index)
                    asyncio.get_running_loop().create_task(self._open(index))
                continue
            nonce = secrets.token_hex(8)
            self.nonces[index].append(nonce)
            self.seq += 1
            ping = Ping(
                self.pair,
                self.name,
                state,
                epoch,
                nonce,
                silent_for,
                self.boot,
                self.seq,
                self.challenges[index],
            )
            endpoint.transport.sendto(encode_ping(self.secret, ping))
            self.unanswered[index] += 1
            self._judge(index)

    def received(self, index: int, data: bytes) -> None:
        refusal = parse_refusal(data)
        if refusal is not None:
            self.refused += 1
            self.bad[index] += 1
            self._bad_reason = f"the witness says it refused our ping: {refusal}"
            return
        try:
            answer = parse_answer(self.secret, data)
        except BadDatagram as error:
            self.refused += 1
            self.bad[index] += 1
            self._bad_reason = str(error)
            return
        nonces = self.nonces[index]
        if answer.pair != self.pair or answer.to != self.name or answer.nonce not in nonces:
            self.refused += 1
            return
        nonces.remove(answer.nonce)
        self.answers[index] += 1
        self.unanswered[index] = 0
        self.bad[index] = 0
        if answer.challenge:
            self.challenges[index] = answer.challenge
        self._judge(index)
        if answer.counted:
            # An answer to a ping the witness did not count (our first, or one after a
            # lost answer) says nothing of whether it hears us: it only gives the
            # challenge our next ping echoes. The rule that an ACTIVE stops before the
            # witness can call it silent holds only for answers to pings it heard.
            self.on_answer(index, answer)

    def _judge(self, index: int) -> None:
        """Why witness ``index`` is not heard now, logged when it changes and then at most
        every ``SILENT_LOG`` seconds while it lasts (docs/failover.md, "The witness")."""
        host, port = self.addresses[index]
        problem = None
        if self.unanswered[index] >= SILENT_PINGS:
            if self.bad[index]:
                problem = (
                    f"misconfigured: {self.bad[index]} answers failed verification "
                    f"({self._bad_reason}); does it hold this pair's secret and run this "
                    "version?"
                )
            else:
                problem = f"unreachable: no answer to the last {self.unanswered[index]} pings"
        before, self.problem[index] = self.problem[index], problem
        now = self.clock()
        if problem is None:
            if before is not None:
                log.warning("witness %s:%d answers again", host, port)
            return
        changed = before is None or before.split(":")[0] != problem.split(":")[0]
        if changed or now - self._said_at[index] >= SILENT_LOG:
            self._said_at[index] = now
            log.warning("witness %s:%d %s", host, port, problem)

    def status(self) -> list[dict[str, Any]]:
        """Each witness: its address, valid answers so far, and why it is not heard."""
        return [
            {
                "address": f"{host}:{port}",
                "answers": self.answers[index],
                "problem": self.problem[index],
            }
            for index, (host, port) in enumerate(self.addresses)
        ]

    def close(self) -> None:
        for endpoint in self.endpoints:
            if endpoint is not None and endpoint.transport is not None:
                endpoint.transport.close()


class WitnessServer(asyncio.DatagramProtocol):
    """``amqha witness``: answers each signed ping with what it heard of the pair."""

    def __init__(self, secret: bytes, clock: Callable[[], float] = time.monotonic) -> None:
        self.secret = secret
        self.clock = clock
        self.seen: dict[tuple[str, str], tuple[float, str, int]] = {}
        # Per pair: when this witness first heard any of its servers. A server it never
        # heard has been silent at most that long here: a witness that was up before the
        # pair started has not heard a server that is still fetching its first challenge,
        # yet it was not silent for the witness's whole uptime.
        self.pairs: dict[str, float] = {}
        # Per server: its boots' sequence numbers and the challenges it may echo.
        self.senders: dict[tuple[str, str], Sender] = {}
        # Servers this witness called silent to their peer, until they step down.
        self.overtaken: set[tuple[str, str]] = set()
        self.transport: asyncio.DatagramTransport | None = None
        self.pings = 0
        self.refused = 0
        self.stale = 0  # signed pings answered but not heard (replayed, or not yet fresh)
        self._refusal_said = float("-inf")
        self._refusals_unsaid = 0
        self._notes_second = 0.0
        self._notes = 0

    def _note(self, reason: str, addr: Any) -> None:
        """Tell the sender of a witness datagram we could not verify why, so the server
        can say its witness is misconfigured rather than down (rate-limited)."""
        now = self.clock()
        if now - self._notes_second >= 1.0:
            self._notes_second, self._notes = now, 0
        if self._notes >= REFUSALS_PER_SECOND or self.transport is None:
            return
        self._notes += 1
        hint = "is the secret the same?" if "signature" in reason else "is the version the same?"
        self.transport.sendto(encode_refusal(f"{reason}: {hint}"), addr)

    def _refusal(self, reason: str, addr: Any) -> None:
        """A datagram that fails verification, logged at most every ``SILENT_LOG`` seconds
        (a server on another secret, or another version, is otherwise never heard)."""
        now = self.clock()
        self._refusals_unsaid += 1
        if now - self._refusal_said < SILENT_LOG:
            return
        where = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else "?"
        log.warning(
            "witness: %d datagrams refused (latest from %s: %s): a server on another secret "
            "or version is not heard",
            self._refusals_unsaid,
            where,
            reason,
        )
        self._refusal_said = now
        self._refusals_unsaid = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            ping = parse_ping(self.secret, data)
        except BadDatagram as error:
            self.refused += 1
            self._refusal(str(error), addr)
            if data.startswith(b"AW") and not data.startswith(REFUSAL):
                self._note(str(error), addr)
            return
        now = self.clock()
        key = (ping.pair, ping.name)
        if key not in self.senders and len(self.senders) >= MAX_SERVERS:
            self.refused += 1
            return
        sender = self.senders.setdefault(key, Sender())
        # Only a fresh ping is news of its sender (failover/witness.py, ``Sender``); a stale
        # one is answered, with the current challenge, so a server (re)starting, or one
        # whose answer was lost, becomes fresh on its next ping.
        counted = sender.fresh(ping)
        if counted:
            # A boot this witness has not heard of a server it has heard before: the
            # server restarted. What was said of its earlier process (overtaken) is not said
            # of this one, which starts PRIMARY or BACKUP and follows its start-up rules;
            # its first ping is not counted (no challenge yet), and by its second it may
            # already be ACTIVE.
            restarted = bool(sender.boots) and ping.boot not in sender.boots
            sender.heard(ping, secrets.token_hex(8))
            if restarted:
                self.overtaken.discard(key)
            if key not in self.seen:
                log.info("witness: first ping from %s of pair %s", ping.name, ping.pair)
                if (ping.pair, "*") in self.overtaken:  # called silent before we heard it
                    self.overtaken.discard((ping.pair, "*"))
                    self.overtaken.add(key)
            self.seen[key] = (now, ping.state, ping.epoch)
            self.pairs.setdefault(ping.pair, now)
            self.pings += 1
            if ping.state != "ACTIVE":
                self.overtaken.discard(key)
        else:
            self.stale += 1
            if sender.latest() is None:
                sender.challenges.append(secrets.token_hex(8))
        known_for = now - self.pairs.get(ping.pair, now)
        peers = {
            name: PeerSeen(now - at, state, epoch)
            for (pair, name), (at, state, epoch) in self.seen.items()
            if pair == ping.pair and name != ping.name
        }
        if ping.silent_for > 0:
            # Whoever we call silent now may be taken over from: remember it. A stale ping
            # may ask too: marking a server overtaken only makes it more careful.
            for name, seen in peers.items():
                if seen.age >= ping.silent_for:
                    self.overtaken.add((ping.pair, name))
            if not peers and known_for >= ping.silent_for:
                self.overtaken.add((ping.pair, "*"))
        answer = Answer(
            ping.pair,
            ping.name,
            ping.nonce,
            known_for,
            peers,
            key in self.overtaken,
            sender.latest() or "",
            counted,
        )
        if self.transport is not None:
            self.transport.sendto(encode_answer(self.secret, answer), addr)


async def open_witness(host: str, port: int, secret: bytes) -> asyncio.DatagramTransport:
    """A witness listening on ``host:port``, its answers marked as control traffic."""
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: WitnessServer(secret), local_addr=(host, port)
    )
    _mark(transport, "witness: answers")
    return transport


async def serve_witness(host: str, port: int, secret: bytes) -> None:
    """Run a witness until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    transport = await open_witness(host, port, secret)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    print(f"amqha witness listening on {host}:{port} (udp)", flush=True)
    try:
        await stop.wait()
    finally:
        transport.close()
