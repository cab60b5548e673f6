"""A pair with a witness on loopback (docs/failover.md, "The witness"): real servers, a real
``amqha witness`` process, and a UDP relay in the test that stands where an attacker on the
path would, between the primary and the witness.

- a ping of the ACTIVE captured and replayed never makes the witness vouch for it: a frozen
  ACTIVE is replaced while the replay goes on;
- a witness on another secret is named by the servers (a log line, and ``console status``
  says the witness is misconfigured, not that the pair is healthy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiormq
import pytest

from tests.durability import Ledger, drain, publish_confirmed
from tests.pairs import (
    ADMIN,
    PAIR_SECRET,
    MakePair,
    Pair,
    client_vote,
    hold,
    poll,
    url_of,
    witness_hears_both,
)
from tests.support import ROOT, free_port, until


class Witness:
    """``amqha witness`` as a process of its own, on a loopback UDP port."""

    def __init__(self, workdir: Path, secret: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.secret_path = workdir / "witness.secret"
        self.secret_path.write_text(secret)
        self.log_path = workdir / "witness.log"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Witness:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "amqha",
                "witness",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--secret-file",
                str(self.secret_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        log.close()
        deadline = time.monotonic() + 30
        while "listening on" not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"witness did not start: {self.log_path.read_text()}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


class Relay(asyncio.DatagramProtocol):
    """Between a server and its witness: forwards both ways and keeps every datagram the
    server sent (what an attacker on the path captures); ``replay`` sends one again."""

    def __init__(self, witness_port: int) -> None:
        self.witness = ("127.0.0.1", witness_port)
        self.server: Any = None  # the server's address, from its first datagram
        self.captured: list[bytes] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.forwarding = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        assert self.transport is not None
        if addr == self.witness:
            if self.server is not None and self.forwarding:
                self.transport.sendto(data, self.server)
            return
        self.server = addr
        self.captured.append(data)
        if self.forwarding:
            self.transport.sendto(data, self.witness)

    def replay(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.sendto(data, self.witness)


@pytest.fixture
def witnesses(tmp_path: Path) -> Iterator[list[Witness]]:
    made: list[Witness] = []
    yield made
    for witness in made:
        witness.stop()
        print(f"--- witness log ---\n{witness.log_path.read_text(errors='replace')[-3000:]}")


def witnessed_pair(make_pair: MakePair, addresses: tuple[str, str], timeout: float) -> Pair:
    pair = make_pair(proxied=False, heartbeat=0.2, timeout=timeout)
    for server, address in zip(pair.servers, addresses, strict=True):
        server.config["failover"] = {**server.config["failover"], "witness": [address]}
    return pair


def records(pair: Pair, server: Any, event: str) -> list[dict[str, Any]]:
    return [e for e in pair.events(server) if e["event"] == event]


async def test_a_replayed_ping_of_a_frozen_active_does_not_keep_it_in_office(
    make_pair: MakePair, witnesses: list[Witness], tmp_path: Path
) -> None:
    """The primary reaches the witness through a relay that captures its pings. Frozen
    (SIGSTOP), its latest ping (and every earlier one) is replayed to the witness
    throughout: the witness still calls it silent, and the backup takes over on a client's
    vote while the replay goes on; every message confirmed before the freeze is on it."""
    witness = Witness(tmp_path / "witness", PAIR_SECRET).start()
    witnesses.append(witness)
    loop = asyncio.get_running_loop()
    relay_transport, relay = await loop.create_datagram_endpoint(
        lambda: Relay(witness.port), local_addr=("127.0.0.1", 0)
    )
    relay_port = relay_transport.get_extra_info("sockname")[1]
    pair = witnessed_pair(
        make_pair, (f"127.0.0.1:{relay_port}", f"127.0.0.1:{witness.port}"), timeout=1.0
    ).start()
    replaying: asyncio.Task[None] | None = None
    try:
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=60)
        await pair.wait_in_sync(pair.backup, timeout=60)
        await until(lambda: len(relay.captured) >= 20, 30, "the primary's pings through the relay")
        connection = await aiormq.connect(pair.primary.url)
        await (await connection.channel()).queue_declare("kept", durable=True)
        await connection.close()
        ledger = Ledger()
        await publish_confirmed(pair.primary.url, "kept", ledger, "k", asyncio.Event(), limit=200)
        assert len(ledger.confirmed) == 200
        await pair.wait_in_sync(pair.backup, timeout=60)

        assert pair.primary.process is not None
        pid = pair.primary.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            captured = list(relay.captured)

            async def replay() -> None:
                # The latest ping as often as the primary pinged, and every earlier one
                # now and then: 20 s at most (the test's bound, far past any timeout).
                for round_ in range(400):
                    relay.replay(captured[-1])
                    if round_ % 20 == 0:
                        for data in captured[-40:]:
                            relay.replay(data)
                    await asyncio.sleep(0.05)

            frozen_at = time.monotonic()
            replaying = asyncio.create_task(replay())
            took_over = await client_vote([pair.backup], retry_for=30)
            assert not replaying.done(), "the takeover came only after the replay ended"
            print(f"replaced {time.monotonic() - frozen_at:.1f} s after the freeze, replayed")
        finally:
            if replaying is not None:
                replaying.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await replaying
            os.kill(pid, signal.SIGCONT)
        assert took_over["name"] == "backup"
        vote = records(pair, pair.backup, "transition")[-1]
        assert (vote["from"], vote["to"]) == ("PASSIVE", "ACTIVE")
        assert vote["reason"].endswith("the witness agrees")

        remaining = [body for body, _ in await drain(pair.backup.url, "kept")]
        lost, invented = ledger.check(remaining)
        assert not lost and not invented and len(remaining) == 200
        # The primary, woken, learns it was overtaken and follows.
        await pair.wait_states("PASSIVE", "ACTIVE", timeout=60)
    finally:
        relay_transport.close()


async def test_a_witness_on_another_secret_is_named_misconfigured_not_healthy(
    make_pair: MakePair, witnesses: list[Witness], tmp_path: Path
) -> None:
    """Both servers name a witness that holds another secret: each logs that its answers
    fail verification (once, then at most every 30 s, not per heartbeat), the witness logs
    the pings it refuses, and ``console status`` says the witness is misconfigured (exit 8),
    not healthy."""
    witness = Witness(tmp_path / "witness", "another-secret-0123456789").start()
    witnesses.append(witness)
    address = f"127.0.0.1:{witness.port}"
    pair = witnessed_pair(make_pair, (address, address), timeout=1.0).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=60)
    await pair.wait_in_sync(pair.backup, timeout=60)
    for server in pair.servers:
        lines = await poll(
            lambda server=server: pair.log_lines(server, "misconfigured"), 60, "a log line"
        )
        assert f"witness {address} misconfigured" in lines[0]
        assert "failed verification" in lines[0]
    assert "datagrams refused" in witness.log_path.read_text()

    servers = [a for s in pair.servers for a in ("--server", url_of(s, ADMIN))]
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "amqha", "console", *servers, "--json", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    status = json.loads(result.stdout)
    assert status["health"]["code"] == "witness_unheard", status["health"]
    assert "misconfigured" in status["health"]["message"]
    assert result.returncode == 8
    for server in status["servers"]:
        (seen,) = server["witness"]["witnesses"]
        assert seen["address"] == address and seen["problem"].startswith("misconfigured")
    # Throttled: a handful of lines over 15 heartbeats, not one per heartbeat.
    await hold(
        lambda: len(pair.log_lines(pair.primary, "misconfigured")) <= 2,
        15 * pair.heartbeat,
        "at most two misconfigured lines",
    )


async def test_with_a_witness_a_rejecting_firewall_between_the_servers_makes_no_second_active(
    make_pair: MakePair, witnesses: list[Witness], tmp_path: Path
) -> None:
    """The peer link goes through proxies that are then shut: the backup's link drops and
    the primary's port, as the backup reaches it, refuses (what a firewall's TCP-reset or
    ICMP reject looks like: evidence of death). The witness still hears the primary: the
    backup counts its peer lost, yet refuses every client's vote; the primary keeps
    serving and confirming, and nothing it confirmed is lost."""
    witness = Witness(tmp_path / "witness", PAIR_SECRET).start()
    witnesses.append(witness)
    address = f"127.0.0.1:{witness.port}"
    # A 3 s timeout: the witness calls the primary gone after 6 s unheard, far past any
    # pause of a loaded machine's (at 1 s, a 2 s stall of the primary's loop on a busy
    # machine was, rightly, a death to the witness).
    pair = make_pair(proxied=True, heartbeat=0.2, timeout=3.0)
    for server in pair.servers:
        server.config["failover"] = {**server.config["failover"], "witness": [address]}
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=60)
    await pair.wait_in_sync(pair.backup, timeout=60)
    connection = await aiormq.connect(pair.primary.url)
    await (await connection.channel()).queue_declare("kept", durable=True)
    await connection.close()
    ledger = Ledger()

    await witness_hears_both(pair)
    for proxy in pair.proxies:
        proxy.stop()  # its port now refuses: the kernel answers with a reset
    lost = await poll(lambda: records(pair, pair.backup, "peer_lost"), 60, "a peer_lost record")
    assert lost[0]["evidence"] == "refused"
    # Clients knock on the backup for several timeouts: no vote is let in. A knock is
    # refused, or sent on to the primary while the backup still counts it alive (a pause of
    # the backup's own on a loaded machine restarts its peer's clock: docs/failover.md,
    # "Freezes"); the backup never serves it.
    for _ in range(10):
        try:
            served_by = await client_vote([pair.backup], retry_for=0.5)
        except Exception:  # refused, whatever the client's error
            continue
        assert served_by["name"] == "primary", served_by
    refusals = records(pair, pair.backup, "refuse")
    assert refusals and all("witness" in r["reason"] for r in refusals)
    assert pair.state(pair.backup) == "PASSIVE"
    assert not [t for t in records(pair, pair.backup, "transition") if t["to"] == "ACTIVE"]
    # The primary, heard by the witness, serves on and confirms.
    await publish_confirmed(pair.primary.url, "kept", ledger, "k", asyncio.Event(), limit=100)
    assert len(ledger.confirmed) == 100
    assert pair.state(pair.primary) == "ACTIVE"
    remaining = [body for body, _ in await drain(pair.primary.url, "kept")]
    lost_messages, invented = ledger.check(remaining)
    assert not lost_messages and not invented
