"""The witness over UDP: a server's client of its witnesses, and ``amqha witness`` itself.

Owns: the datagram endpoints (one connected socket per witness on the server's side, one
listening socket on the witness's), nonces (an answer counts only if it echoes a ping of
ours still outstanding), and the witness's record of whom it heard when. The protocol and
its rules are ``witness`` (docs/failover.md, "The witness").

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

from .witness import (
    Answer,
    BadDatagram,
    PeerSeen,
    Ping,
    encode_answer,
    encode_ping,
    parse_answer,
    parse_ping,
)

log = logging.getLogger("amqha.witness")

OUTSTANDING = 8  # pings per witness whose answer still counts
MAX_SERVERS = 1024  # servers a witness keeps track of (only signed pings add one)


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

    async def _open(self, index: int) -> None:
        host, port = self.addresses[index]
        try:
            _, endpoint = await asyncio.get_running_loop().create_datagram_endpoint(
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

    def ping(self, state: str, epoch: int, silent_for: float) -> None:
        for index, endpoint in enumerate(self.endpoints):
            if endpoint is None or endpoint.transport is None:
                if index not in self._opening:
                    self._opening.add(index)
                    asyncio.get_running_loop().create_task(self._open(index))
                continue
            nonce = secrets.token_hex(8)
            self.nonces[index].append(nonce)
            ping = Ping(self.pair, self.name, state, epoch, nonce, silent_for)
            endpoint.transport.sendto(encode_ping(self.secret, ping))

    def received(self, index: int, data: bytes) -> None:
        try:
            answer = parse_answer(self.secret, data)
        except BadDatagram:
            self.refused += 1
            return
        nonces = self.nonces[index]
        if answer.pair != self.pair or answer.to != self.name or answer.nonce not in nonces:
            self.refused += 1
            return
        nonces.remove(answer.nonce)
        self.answers[index] += 1
        self.on_answer(index, answer)

    def close(self) -> None:
        for endpoint in self.endpoints:
            if endpoint is not None and endpoint.transport is not None:
                endpoint.transport.close()


class WitnessServer(asyncio.DatagramProtocol):
    """``amqha witness``: answers each signed ping with what it heard of the pair."""

    def __init__(self, secret: bytes, clock: Callable[[], float] = time.monotonic) -> None:
        self.secret = secret
        self.clock = clock
        self.started = clock()
        self.seen: dict[tuple[str, str], tuple[float, str, int]] = {}
        # Servers this witness called silent to their peer, until they step down.
        self.overtaken: set[tuple[str, str]] = set()
        self.transport: asyncio.DatagramTransport | None = None
        self.pings = 0
        self.refused = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            ping = parse_ping(self.secret, data)
        except BadDatagram:
            self.refused += 1
            return
        now = self.clock()
        key = (ping.pair, ping.name)
        if key not in self.seen and len(self.seen) >= MAX_SERVERS:
            self.refused += 1
            return
        if key not in self.seen:
            log.info("witness: first ping from %s of pair %s", ping.name, ping.pair)
            if (ping.pair, "*") in self.overtaken:  # called silent before we ever heard it
                self.overtaken.discard((ping.pair, "*"))
                self.overtaken.add(key)
        self.seen[key] = (now, ping.state, ping.epoch)
        self.pings += 1
        if ping.state != "ACTIVE":
            self.overtaken.discard(key)
        uptime = now - self.started
        peers = {
            name: PeerSeen(now - at, state, epoch)
            for (pair, name), (at, state, epoch) in self.seen.items()
            if pair == ping.pair and name != ping.name
        }
        if ping.silent_for > 0:
            # Whoever we call silent now may be taken over from: remember it.
            for name, seen in peers.items():
                if seen.age >= ping.silent_for:
                    self.overtaken.add((ping.pair, name))
            if not peers and uptime >= ping.silent_for:
                self.overtaken.add((ping.pair, "*"))
        answer = Answer(ping.pair, ping.name, ping.nonce, uptime, peers, key in self.overtaken)
        if self.transport is not None:
            self.transport.sendto(encode_answer(self.secret, answer), addr)


async def serve_witness(host: str, port: int, secret: bytes) -> None:
    """Run a witness until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: WitnessServer(secret), local_addr=(host, port)
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    print(f"amqha witness listening on {host}:{port} (udp)", flush=True)
    try:
        await stop.wait()
    finally:
        transport.close()
