"""Freezes longer than every timeout the pair has (SIGSTOP ... SIGCONT), of the ACTIVE, of
the PASSIVE and of both in turn, with publishers knocking on both addresses: after the
thaw's first heartbeat never two servers confirming, no confirmed message lost, none in a
quarantine file (docs/failover.md, "Freezes"). Real processes, real signals.

The pair runs with short timings so that a freeze of seconds outlasts them all: failover
heartbeat 0.1 s and timeout 0.4 s, and an AMQP heartbeat of 1 s on the pair's own links
(``failover.link_heartbeat``): a server closes a link silent for 2 s, and the peering calls
a link with no frame for 3 x (1 + 1) s stuck. Long freezes (30 s, 120 s) belong to the
fault schedule, not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiormq
from pamqp import commands

from amqha.console import ConsoleClient, ConsoleError
from amqha.quarantine import read_quarantine
from tests.durability import PERSISTENT, Ledger, drain
from tests.pairs import ADMIN, MakePair, Pair, hold, poll, url_of
from tests.support import ServerProcess


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (SIGSTOP), as /proc says."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


LINK_HEARTBEAT = 1
# Past the peering's stuck verdict (6 s after the last frame, checked every second) and a
# server's 2 s close of a silent link, with a margin for a loaded machine.
FREEZE = 7.5
WINDOW = 10  # publishes in flight per publisher


@dataclass
class Confirms:
    """Every confirm the publishers received: (monotonic time, server, body)."""

    ledger: Ledger = field(default_factory=Ledger)
    seen: list[tuple[float, str, bytes]] = field(default_factory=list)
    # The publishers' connections open now, by server.
    open: dict[str, int] = field(default_factory=dict)

    def by(self, name: str, after: float = 0.0, before: float = float("inf")) -> int:
        return sum(1 for at, server, _ in self.seen if server == name and after < at < before)

    def switches(self, after: float, before: float = float("inf")) -> int:
        """How often the confirming server changed between ``after`` and ``before``: two
        servers confirming in one period interleave, and change many times."""
        names = [server for at, server, _ in sorted(self.seen) if after < at < before]
        return sum(1 for a, b in zip(names, names[1:], strict=False) if a != b)


async def answered(
    channel: aiormq.abc.AbstractChannel, queue: str, body: bytes
) -> tuple[Any, float]:
    """The broker's answer to one publish, and the moment it came."""
    answer = channel.basic_publish(body, routing_key=queue, properties=PERSISTENT)
    return await asyncio.wait_for(answer, 3.0), time.monotonic()


async def knock_and_publish(
    server: ServerProcess, queue: str, confirms: Confirms, stop: asyncio.Event
) -> None:
    """Publish persistent messages with confirms to this one address, over and over: a
    PASSIVE's refusal (a client's vote) and a frozen server's silence are retried."""
    number = 0
    for _ in range(100_000):
        if stop.is_set():
            return
        try:
            connection = await asyncio.wait_for(aiormq.connect(server.url), 2.0)
        except Exception:
            await asyncio.sleep(0.05)
            continue
        confirms.open[server.name] = confirms.open.get(server.name, 0) + 1
        try:
            channel = await asyncio.wait_for(connection.channel(publisher_confirms=True), 2.0)
            while not stop.is_set():
                bodies = [f"{server.name}-{number + i}".encode() for i in range(WINDOW)]
                number += WINDOW
                confirms.ledger.sent.update(bodies)
                results = await asyncio.gather(
                    *(answered(channel, queue, body) for body in bodies), return_exceptions=True
                )
                failed = False
                for body, outcome in zip(bodies, results, strict=True):
                    result, at = outcome if isinstance(outcome, tuple) else (outcome, 0.0)
                    if isinstance(result, commands.Basic.Ack):
                        confirms.ledger.confirmed.add(body)
                        # When this confirm came, not when its window ended: a window
                        # whose other publishes fail at a handover ends seconds later.
                        confirms.seen.append((at, server.name, body))
                    elif isinstance(result, aiormq.exceptions.DeliveryError):
                        confirms.ledger.nacked.add(body)
                    else:
                        failed = True
                if failed:
                    break
        except Exception:
            pass
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 1.0)
            confirms.open[server.name] -= 1


@contextlib.asynccontextmanager
async def publishers(pair: Pair, queue: str) -> AsyncIterator[Confirms]:
    confirms = Confirms()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(knock_and_publish(server, queue, confirms, stop))
        for server in pair.servers
    ]
    try:
        yield confirms
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def frozen_pair(
    make_pair: MakePair, proxied: bool = False, link_heartbeat: int = LINK_HEARTBEAT
) -> tuple[Pair, str]:
    """A started pair, its PASSIVE in sync, and a durable queue on it."""
    pair = make_pair(proxied=proxied, failover_extra={"link_heartbeat": link_heartbeat})
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    queue = f"freeze-{uuid.uuid4().hex[:8]}"
    connection = await aiormq.connect(pair.primary.url)
    channel = await connection.channel()
    await channel.queue_declare(queue, durable=True)
    await connection.close()
    return pair, queue


async def freeze(
    server: ServerProcess,
    seconds: float,
    during: asyncio.Future | None = None,
    once_stopped: Callable[[], None] | None = None,
) -> float:
    """SIGSTOP, ``once_stopped()``, ``seconds`` (``during`` awaited meanwhile), SIGCONT;
    the thaw's time."""
    assert server.process is not None
    pid = server.process.pid
    frozen_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        if once_stopped is not None:
            await asyncio.to_thread(once_stopped)
        if during is not None:
            await asyncio.wait_for(during, seconds)
        await asyncio.sleep(max(0.0, frozen_at + seconds - time.monotonic()))
    finally:
        os.kill(pid, signal.SIGCONT)
    return time.monotonic()


async def assert_nothing_confirmed_lost(pair: Pair, confirms: Confirms, queue: str) -> None:
    """Settled: the ACTIVE holds every confirmed message, and no quarantine file holds a
    confirmed one (what a frozen server held unconfirmed may be set aside)."""
    active, _ = await pair.settled(timeout=60)
    remaining = [body for body, _ in await drain(active.url, queue)]
    lost, invented = confirms.ledger.check(remaining)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented
    quarantined = {row[5] for path in pair.quarantine_files() for row in read_quarantine(str(path))}
    assert not quarantined & confirms.ledger.confirmed, "a confirmed message was quarantined"


def paused_gap(pair: Pair, server: ServerProcess) -> float:
    """The longest pause ``server`` recorded (a loaded machine may add short ones after a
    freeze: a scheduling gap above the timeout is one too)."""
    return max((e["gap"] for e in pair.events(server) if e["event"] == "paused"), default=0.0)


async def test_the_active_the_new_active_then_the_passive_frozen_never_two_confirming(
    make_pair: MakePair,
) -> None:
    """Three freezes past every timeout, publishers knocking at both addresses throughout.
    1. The zombie: the ACTIVE primary frozen past the stuck limit, the backup voted in, the
       thaw: the old ACTIVE never confirms again and becomes PASSIVE.
    2. The other in turn: the backup, ACTIVE now, frozen; the primary voted in; the same.
    3. The PASSIVE (the backup) frozen while its ACTIVE confirms alone: at the thaw no
       vote takes it on silence measured across its freeze; it never confirms."""
    pair, queue = await frozen_pair(make_pair)
    primary, backup = pair.primary, pair.backup
    async with publishers(pair, queue) as confirms:
        await poll(lambda: confirms.by("primary") >= 50, 30, "the primary confirming")

        async def frozen_active_replaced(frozen: ServerProcess, other: ServerProcess) -> float:
            since = time.monotonic()
            takeover = asyncio.ensure_future(
                poll(
                    lambda: confirms.by(other.name, after=since) >= 50,
                    FREEZE,
                    f"{other.name} confirming",
                )
            )
            thaw = await freeze(frozen, FREEZE, takeover)
            await poll(lambda: pair.state(frozen) == "PASSIVE", 30, f"{frozen.name} PASSIVE")
            await pair.settled(timeout=60)
            serving = confirms.by(other.name, after=thaw)
            await poll(
                lambda: confirms.by(other.name, after=thaw) >= serving + 50,
                30,
                f"{other.name} serving after the thaw",
            )
            assert confirms.by(frozen.name, after=thaw) == 0, (
                f"{frozen.name}, frozen ACTIVE, confirmed after the thaw"
            )
            assert confirms.switches(after=thaw + pair.heartbeat) == 0
            assert paused_gap(pair, frozen) > FREEZE * 0.9
            return thaw

        await frozen_active_replaced(primary, backup)
        assert pair.epoch(backup) == 2
        await frozen_active_replaced(backup, primary)
        assert pair.epoch(primary) == 3

        frozen_at = time.monotonic()
        alone = asyncio.ensure_future(
            poll(
                lambda: confirms.by("primary", after=frozen_at + 3) >= 50,
                FREEZE,
                "the primary confirming alone",
            )
        )
        thaw = await freeze(backup, FREEZE, alone)
        await poll(lambda: confirms.by("primary", after=thaw) >= 50, 30, "the primary serving")
        await pair.settled(timeout=60)
        assert confirms.by("backup", after=frozen_at) == 0, "the frozen PASSIVE confirmed"
        assert confirms.switches(after=frozen_at) == 0
        assert pair.states() == ("ACTIVE", "PASSIVE") and pair.epoch(primary) == 3
    await assert_nothing_confirmed_lost(pair, confirms, queue)


async def test_a_thawed_active_whose_peer_comes_back_late_stays_fenced_then_yields(
    make_pair: MakePair,
) -> None:
    """The zombie again, with the backup's link to the thawed ACTIVE slow to come back
    (its connection attempt lost, as when the frozen server's listen backlog overflowed):
    silent for more than a timeout after the thaw, the old ACTIVE still does not serve,
    and yields once it hears the backup ACTIVE in a higher epoch."""
    pair, queue = await frozen_pair(make_pair, proxied=True)
    to_primary = pair.proxies[1]  # how the backup reaches the primary
    async with publishers(pair, queue) as confirms:
        await poll(lambda: confirms.by("primary") >= 50, 30, "the primary confirming")
        # Cut once it is frozen (not before: the ACTIVE would confirm alone what its
        # backup never gets): nothing the backup says once it leads reaches the primary
        # before the heal (a refused connect is not evidence, and a link that merely
        # drops does not take the backup out of sync).
        takeover = asyncio.ensure_future(
            poll(lambda: confirms.by("backup") >= 50, FREEZE, "the backup confirming")
        )
        thaw = await freeze(pair.primary, FREEZE, takeover, lambda: to_primary.cut("refuse"))
        # Silent for twice the failover timeout after the thaw, confirming nothing, then
        # the link heals.
        await hold(
            lambda: confirms.by("primary", after=thaw) == 0,
            2 * pair.timeout,
            "the thawed ACTIVE, its peer silent, confirms nothing",
        )
        await asyncio.to_thread(to_primary.heal)
        await pair.wait_states("PASSIVE", "ACTIVE", timeout=30)
        after = confirms.by("backup", after=thaw)
        await poll(lambda: confirms.by("backup", after=thaw) >= after + 50, 30, "backup serving")
        assert confirms.by("primary", after=thaw) == 0, "the old ACTIVE confirmed after the thaw"
    fences = [e for e in pair.events(pair.primary) if e["event"] == "freeze_fence"]
    assert fences and fences[0]["fenced"] is True
    assert not any(e["fenced"] is False for e in fences), "the fence was lifted"
    await assert_nothing_confirmed_lost(pair, confirms, queue)


async def test_a_passive_thawed_into_its_peers_silence_is_not_voted_in(
    make_pair: MakePair,
) -> None:
    """The PASSIVE frozen past the failover timeout (not long enough for any link to be
    closed: it is still in sync), and its ACTIVE's state cannot reach it for a while after
    the thaw; clients knock at it from the first instant. The silence it measured was its
    own freeze: it stays PASSIVE, and the pair never fails over."""
    pair = make_pair(failover_extra={"link_heartbeat": LINK_HEARTBEAT})
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    to_backup = pair.proxies[0]  # how the primary's state reaches the backup
    votes: list[str] = []

    async def knock(until: float) -> None:
        for _ in range(10_000):
            if time.monotonic() >= until:
                return
            try:
                connection = await asyncio.wait_for(aiormq.connect(pair.backup.url), 2.0)
            except Exception as error:
                votes.append(type(error).__name__)
            else:
                votes.append("open")
                with contextlib.suppress(Exception):
                    await connection.close()
            await asyncio.sleep(0.01)

    assert pair.backup.process is not None
    pid = pair.backup.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # Frozen through three of its peer's timeouts (state T: stopped by a signal).
        await poll(lambda: stopped(pid), 10, "the backup stopped")
        await hold(lambda: stopped(pid), 3 * pair.timeout, "the backup frozen")
        await asyncio.to_thread(to_backup.cut, "refuse")
        # Connections queued while it is frozen: their Open is read the moment it thaws.
        knocking = asyncio.ensure_future(knock(time.monotonic() + 2 * pair.timeout + 2.0))
        await asyncio.sleep(0.3)
    finally:
        os.kill(pid, signal.SIGCONT)

    def took_over() -> list[dict]:
        return [
            e
            for e in pair.events(pair.backup)
            if e["event"] == "transition" and e["to"] == "ACTIVE"
        ]

    await hold(lambda: not took_over(), 2 * pair.timeout, "the thawed backup not ACTIVE")
    await asyncio.to_thread(to_backup.heal)
    await knocking
    await pair.settled(timeout=30)
    assert "open" not in votes
    assert votes, "no client knocked"
    assert not took_over()
    assert pair.states() == ("ACTIVE", "PASSIVE")
    assert paused_gap(pair, pair.backup) > 3 * pair.timeout


async def test_both_frozen_the_active_thawed_alone_serves_again_by_a_clients_vote(
    make_pair: MakePair,
) -> None:
    """The PASSIVE frozen, then the ACTIVE, and the ACTIVE thawed while its peer stays
    frozen (silent, its port still accepting: no evidence). The ACTIVE never serves again
    because time passed: once its peer has been silent for the grace after the thaw it
    closes the clients it holds, and the first to reconnect votes it back. The PASSIVE,
    thawed last, stays PASSIVE."""
    pair, queue = await frozen_pair(make_pair)
    primary, backup = pair.primary, pair.backup
    assert primary.process is not None and backup.process is not None
    async with publishers(pair, queue) as confirms:
        await poll(lambda: confirms.by("primary") >= 50, 30, "the primary confirming")
        os.kill(backup.process.pid, signal.SIGSTOP)
        try:
            since = time.monotonic()
            # The ACTIVE drops its silent PASSIVE's link and confirms alone, then freezes.
            await poll(
                lambda: confirms.by("primary", after=since + 3) >= 20, 30, "confirming alone"
            )
            # A client that waits on its connection as long as it takes (no timeout of its
            # own): held by the fence, it is closed so that it reconnects and votes.
            patient = await aiormq.connect(primary.url)
            channel = await patient.channel()
            await channel.confirm_delivery()
            confirms.ledger.sent.add(b"patient")
            waiting = asyncio.ensure_future(
                channel.basic_publish(b"patient", routing_key=queue, properties=PERSISTENT)
            )
            thaw = await freeze(primary, 3 * pair.timeout + 1.0)
            with contextlib.suppress(Exception):
                if isinstance(await asyncio.wait_for(waiting, 30), commands.Basic.Ack):
                    confirms.ledger.confirmed.add(b"patient")
            await poll(lambda: patient.is_closed, 30, "the held client closed")
            assert "votes it back" in str(patient.closing.exception())
            await poll(
                lambda: any(
                    e["event"] == "freeze_fence" and e["fenced"] is False
                    for e in pair.events(primary)
                ),
                30,
                "the primary serving again",
            )
            await poll(lambda: confirms.by("primary", after=thaw) >= 50, 30, "confirms again")
        finally:
            os.kill(backup.process.pid, signal.SIGCONT)
        await pair.settled(timeout=60)
        assert confirms.by("backup") == 0
    fences = [e for e in pair.events(primary) if e["event"] == "freeze_fence"]
    assert [e["fenced"] for e in fences] == [True, False]
    assert "client vote" in fences[-1]["reason"]
    assert pair.states() == ("ACTIVE", "PASSIVE") and pair.epoch(primary) == 1
    assert pair.log_lines(primary, "so that they reconnect and vote")
    await assert_nothing_confirmed_lost(pair, confirms, queue)


async def test_a_frozen_passive_holds_the_actives_confirms_for_a_timeout_not_a_link_heartbeat(
    make_pair: MakePair,
) -> None:
    """The in-sync PASSIVE frozen, its links' AMQP heartbeat a minute (their own verdict
    would take three): the ACTIVE stops waiting for it once it has acked nothing for the
    failover timeout, says so, and confirms alone while the PASSIVE is still frozen. Thawed,
    the PASSIVE is told, subscribes again and is in sync once more; nothing confirmed is
    lost, and the PASSIVE never confirms."""
    pair, queue = await frozen_pair(make_pair, link_heartbeat=60)
    async with publishers(pair, queue) as confirms:
        await poll(lambda: confirms.by("primary") >= 50, 30, "the primary confirming")
        assert pair.backup.process is not None
        frozen_at = time.monotonic()
        os.kill(pair.backup.process.pid, signal.SIGSTOP)
        try:
            # Confirms resume while the backup is still frozen (thawed as soon as they do).
            await poll(
                lambda: (
                    records_after(pair, pair.primary, "sync", frozen_at)
                    and confirms.by("primary", after=time.monotonic() - 0.5) >= 20
                ),
                60,
                "the primary confirming alone",
            )
        finally:
            os.kill(pair.backup.process.pid, signal.SIGCONT)
        dropped = [
            r for r in pair.events(pair.primary) if r["event"] == "sync" and r["side"] == "active"
        ][-1]
        assert dropped["sync"] == "out_of_sync" and "acked nothing for" in dropped["reason"]
        await pair.wait_in_sync(pair.backup, timeout=60)
        await poll(lambda: confirms.by("primary", after=time.monotonic() - 0.5) >= 20, 30, "more")
        assert confirms.by("backup", after=frozen_at) == 0, "the frozen PASSIVE confirmed"
        assert pair.states() == ("ACTIVE", "PASSIVE")
    await assert_nothing_confirmed_lost(pair, confirms, queue)


def records_after(pair: Pair, server: ServerProcess, event: str, since: float) -> list[dict]:
    """``event`` records ``server`` wrote since monotonic time ``since``."""
    wall = time.time() - (time.monotonic() - since)
    return [r for r in pair.events(server) if r["event"] == event and r["ts"] >= wall]


async def test_a_switchovers_target_frozen_as_it_is_handed_the_service_never_confirms_beside(
    make_pair: MakePair,
) -> None:
    """The PASSIVE frozen past every timeout the moment the ACTIVE is asked to switch over
    (its last state messages still say in sync): whether the handover went out or the
    switchover failed, the ACTIVE serves again within the freeze (the clients vote it back
    in), and at the thaw the frozen server does not take the handover it reads late: it
    never confirms, never two servers confirm, nothing confirmed is lost."""
    pair, queue = await frozen_pair(make_pair)
    primary, backup = pair.primary, pair.backup
    async with publishers(pair, queue) as confirms:
        await poll(lambda: confirms.by("primary") >= 50, 30, "the primary confirming")
        await pair.settled(timeout=60)
        stopped = threading.Event()

        async def ask() -> str:
            await asyncio.to_thread(stopped.wait, 30)
            try:
                async with ConsoleClient(url_of(primary, ADMIN), 20) as console:
                    return str((await console.call("switchover"))["result"])
            except ConsoleError as refused:
                return str(refused)

        asked = asyncio.ensure_future(ask())
        since = time.monotonic()
        thaw = await freeze(backup, FREEZE, once_stopped=stopped.set)
        print("switchover:", await asked)
        assert confirms.by("primary", after=since + 2, before=thaw) >= 50, "no service"
        await pair.settled(timeout=60)
        await poll(lambda: confirms.by("primary", after=thaw) >= 50, 30, "the primary serving")
        assert confirms.by("backup", after=since) == 0, "the frozen server confirmed"
        assert confirms.switches(after=since) == 0
        assert pair.state(primary) == "ACTIVE" and pair.state(backup) == "PASSIVE"
    await assert_nothing_confirmed_lost(pair, confirms, queue)


async def test_the_server_that_handed_over_frozen_as_it_resumes_never_confirms_and_rejoins(
    make_pair: MakePair,
) -> None:
    """A switchover, then the server that handed the service over frozen past every
    timeout as it resumes (docs/durability.md, section 5, "Resuming after a handover"):
    the new ACTIVE serves on (its wait for the rejoin ends when the frozen one is lost),
    the frozen one never confirms, never two servers confirm; after the thaw it is the
    PASSIVE again, in sync, and nothing confirmed is lost."""
    pair, queue = await frozen_pair(make_pair)
    primary = pair.primary
    async with publishers(pair, queue) as confirms:
        await poll(lambda: confirms.by("primary") >= 50, 30, "the primary confirming")
        await pair.settled(timeout=60)
        async with ConsoleClient(url_of(primary, ADMIN), 40) as console:
            assert (await console.call("switchover", wait=20))["to"] == "backup"
        # Once the backup has taken the service: the old ACTIVE is resuming, or has.
        await pair.wait_states("PASSIVE", "ACTIVE", timeout=30)
        # And once its publisher has read all the old ACTIVE sent before it closed its
        # clients at the handover: any confirm of the primary's from now on is a fault.
        await poll(lambda: confirms.open.get("primary", 0) == 0, 30, "the handover's closes")
        since = time.monotonic()
        thaw = await freeze(primary, FREEZE)
        assert confirms.by("backup", after=since, before=thaw) >= 50, "no service"
        await poll(lambda: confirms.by("backup", after=thaw) >= 50, 30, "the backup serving")
        assert confirms.by("primary", after=since) == 0, "the frozen server confirmed"
        assert confirms.switches(after=since) == 0
        await poll(
            lambda: (
                records_after(pair, primary, "sync", thaw - 1.0)
                and pair.state(primary) == "PASSIVE"
                and pair.in_sync(primary)
            ),
            60,
            "the thawed server in sync again",
        )
    await assert_nothing_confirmed_lost(pair, confirms, queue)
