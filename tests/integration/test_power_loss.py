"""Power cuts: each server's data dir on a disk that forgets what was not fsynced
(tests/lazyfs.py), under a publisher confirming through every failover and an acking
consumer. A power cut is the server's kill -9 and its disk's loss of every unsynced
write, at once. Of the ACTIVE, of the PASSIVE, of both at once: no confirmed message is
lost (docs/durability.md, section 9). ``make soak`` runs 50 cuts of each."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from amqha.quarantine import read_quarantine
from tests import lazyfs
from tests.durability import Ledger, declare_durable, grown, nothing_lost, through_failovers
from tests.pairs import Pair, poll
from tests.support import ServerProcess, soak_size

pytestmark = pytest.mark.soak

QUEUE = "orders"
ROUNDS = soak_size(2, 50)


@pytest.fixture
def lazy_pair(make_pair: Any, on_lazy_disks: Any) -> Any:
    """make_pair(**kwargs) -> (pair, disks): each server's data dir on its own disk."""

    def build(**kwargs: Any) -> tuple[Pair, list[lazyfs.LazyDisk]]:
        pair = make_pair(**kwargs)
        return pair, on_lazy_disks(*pair.servers)

    return build


async def cut(pair: Pair, server: Any, disk: lazyfs.LazyDisk) -> None:
    """A power cut of ``server``. Its event log is fsynced within a second of a record
    (docs/failover.md): once the disk holds its ``started`` record, the cut keeps a
    beginning of the log with that record, and loses at most what came after."""
    durable = disk.backing / server.data_dir.relative_to(disk.path) / "events.jsonl"
    await poll(
        lambda: durable.exists() and b'"started"' in durable.read_bytes(),
        30,
        f"{server.name}'s event log on its disk",
    )
    before = server.events_path.read_bytes()
    pair.kill(server)
    disk.power_cut()
    after = server.events_path.read_bytes()
    assert before.startswith(after) and b'"started"' in after


async def grown_in_sync(
    pair: Pair, ledger: Ledger, by: int, what: str
) -> tuple[ServerProcess, ServerProcess]:
    """``by`` more confirms, then (active, passive) once the pair is settled in sync again:
    on a loaded machine a late heartbeat can take the PASSIVE out of sync meanwhile, and
    then a cut of the ACTIVE rightly makes no takeover (its PASSIVE lacks what the ACTIVE
    confirmed alone). The cut follows within milliseconds of this check."""
    await grown(ledger, by, what)
    return await pair.settled(timeout=120)


async def settle_and_check(pair: Pair, ledger: Ledger, stop: asyncio.Event, tasks: Any) -> None:
    active, _ = await pair.settled(timeout=120)
    await grown(ledger, 200, "confirms after the last cut")
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    await nothing_lost(active.url, QUEUE, ledger)
    # Quarantined: only messages never confirmed (a dead ACTIVE's unconfirmed tail).
    quarantined = {row[5] for path in pair.quarantine_files() for row in read_quarantine(str(path))}
    assert not quarantined & ledger.confirmed, "a confirmed message was quarantined"


async def loaded(pair: Pair) -> tuple[Ledger, asyncio.Event, list[asyncio.Task[None]]]:
    """The pair started and settled, and its workload running through every failover."""
    pair.start()
    await pair.settled(timeout=120)
    await declare_durable(pair.primary.url, QUEUE)
    ledger, stop = Ledger(), asyncio.Event()
    return ledger, stop, through_failovers([s.url for s in pair.servers], QUEUE, ledger, stop)


@pytest.mark.parametrize("target", ["active", "passive"])
async def test_a_power_cut_of_one_server_loses_no_confirmed_message(
    lazy_pair: Any, target: str
) -> None:
    """Each round: the pair settled in sync, a power cut of the ACTIVE (the PASSIVE takes
    over and the publisher goes on there) or of the PASSIVE (the ACTIVE goes on), the
    server restarted on what its disk kept, back in sync."""
    pair, disks = lazy_pair()
    ledger, stop, tasks = await loaded(pair)
    try:
        for _ in range(ROUNDS):
            await pair.settled(timeout=120)
            active, passive = await grown_in_sync(pair, ledger, 300, "confirms before the cut")
            victim, survivor = (active, passive) if target == "active" else (passive, active)
            await cut(pair, victim, disks[pair.servers.index(victim)])
            if target == "active":
                await poll(lambda s=survivor: pair.state(s) == "ACTIVE", 60, "the takeover")
            await grown(ledger, 200, "confirms on the survivor")
            victim.start()
        await settle_and_check(pair, ledger, stop, tasks)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert not pair.quarantine_files() or target == "active"


@pytest.mark.parametrize("when_alone", ["confirm", "hold"])
async def test_a_power_cut_of_both_loses_no_confirmed_message(
    lazy_pair: Any, when_alone: str
) -> None:
    """Rounds of three kinds, drawn at random: both servers cut at once while in sync;
    both at once while the restarted PASSIVE still catches up; the ACTIVE cut, its
    PASSIVE taking over and confirming alone for a while (``when_alone: confirm``; with
    ``hold`` it confirms nothing alone), then that one cut too. Each time both restart on
    what their disks kept, and the pair comes back by its own rules (the start-up rules
    and the client vote). Every confirmed message is served after, or kept in a
    quarantine file and counted (docs/durability.md, section 9)."""
    pair, disks = lazy_pair(replication={"when_alone": when_alone})
    ledger, stop, tasks = await loaded(pair)
    rng = random.Random(ROUNDS)
    disk_of = dict(zip((s.name for s in pair.servers), disks, strict=True))
    kinds = []
    try:
        for _ in range(ROUNDS):
            kind = rng.choice(["in_sync", "catching_up", "one_then_the_other"])
            kinds.append(kind)
            await pair.settled(timeout=120)
            active, passive = await grown_in_sync(
                pair, ledger, rng.randrange(50, 400), "confirms before the cut"
            )
            if kind == "catching_up":
                await cut(pair, passive, disk_of[passive.name])
                passive.start()
                await grown(ledger, rng.randrange(1, 100), "confirms while it catches up")
            if kind == "one_then_the_other":
                await cut(pair, active, disk_of[active.name])
                await poll(lambda s=passive: pair.state(s) == "ACTIVE", 60, "the takeover")
                if when_alone == "confirm":
                    await grown(ledger, rng.randrange(50, 300), "confirms on one copy")
                await cut(pair, passive, disk_of[passive.name])
            else:
                await asyncio.gather(
                    *(cut(pair, s, disk_of[s.name]) for s in pair.servers if s.alive)
                )
            for server in pair.servers:
                if not server.alive:
                    server.start(wait=False)
            for server in pair.servers:
                server.wait_ready()
        await settle_and_check(pair, ledger, stop, tasks)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    print("rounds:", kinds)
