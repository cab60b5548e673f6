"""Real partitions: each server on a test host of its own (a network namespace), the
clients on the bridge between them, and faults made by the kernel (tests/netns.py).

Every scenario ends with the loss check: each message a publisher had confirmed is on the
ACTIVE or in a quarantine file (counted), and nothing is there that nobody sent. What two
servers do when they cannot tell a dead peer from a cut link is the Binary Star rule
(docs/failover.md, "Partitions"): a client's vote can make a second ACTIVE, and the heal
resolves it by epoch, the loser's writes kept in quarantine.

Run by ``make partitions`` (root, iproute2 and nftables); skipped with the reason
elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiormq
import pytest

from amqha.client import Consumer, Publisher
from amqha.quarantine import read_quarantine
from tests import netns
from tests.durability import Ledger, drain, publish_confirmed
from tests.pairs import Pair, hold, poll, witness_hears_both
from tests.sites import Site
from tests.support import ServerProcess

REASON = netns.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

QUEUE = "orders"
# Bound on each wait for the pair to move: after a minute of cuts a TCP connection may sit
# in retransmission backoff for tens of seconds before it sends again.
STEP = 120.0


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    made = Site(tmp_path / "pair")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def witnessed(tmp_path: Path) -> Iterator[Site]:
    made = Site(tmp_path / "pair", witness=True)
    try:
        yield made
    finally:
        made.close()


# Seconds added to every chunk of the peer links, each way. A PASSIVE catches up a live
# backlog one prefetch window of runs per round trip: at 50 ms a way, a minute of
# confirming alone took minutes to drain (docs/failover.md, "Partitions").
RELAY_DELAY = 0.005


@pytest.fixture(params=[False, True], ids=["alone", "witness"])
def relayed(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Site]:
    made = Site(tmp_path / "pair", witness=request.param, relay_delay=RELAY_DELAY)
    try:
        yield made
    finally:
        made.close()


async def started(site: Site) -> Pair:
    pair = site.pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=STEP)
    await pair.wait_in_sync(pair.backup, timeout=STEP)
    connection = await aiormq.connect(pair.primary.url)
    await (await connection.channel()).queue_declare(QUEUE, durable=True)
    await connection.close()
    if site.witness is not None:
        await witness_hears_both(pair)  # the premise of every witness scenario
    return pair


class Publishers:
    """One confirming publisher per server, each using only its own server and trying
    again until stopped (a PASSIVE refuses it; a server cut off stalls it)."""

    def __init__(self, servers: list[ServerProcess]) -> None:
        self.ledger = Ledger()
        self.stop = asyncio.Event()
        self.tasks = [
            asyncio.ensure_future(self._keep(server.url, server.name[0])) for server in servers
        ]

    async def _keep(self, url: str, prefix: str) -> None:
        for attempt in range(100_000):
            if self.stop.is_set():
                return
            await publish_confirmed(
                url, QUEUE, self.ledger, f"{prefix}{attempt}", self.stop, window=10
            )
            await asyncio.sleep(0.1)

    def confirmed(self, prefix: str) -> int:
        return sum(body.startswith(prefix.encode()) for body in self.ledger.confirmed)

    async def grows(self, prefix: str, what: str) -> None:
        """Until a publisher whose bodies start with ``prefix`` has more confirms."""
        before = self.confirmed(prefix)
        await poll(lambda: self.confirmed(prefix) > before, STEP, what)

    async def close(self) -> None:
        """Stop; a publisher stalled on a dead link is cancelled (its pending publishes
        were never confirmed, so they are not counted)."""
        self.stop.set()
        _, pending = await asyncio.wait(self.tasks, timeout=15)
        for task in pending:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(BaseException):
                await task


def quarantined(pair: Pair) -> set[bytes]:
    return {row[5] for path in pair.quarantine_files() for row in read_quarantine(path)}


async def loss_check(pair: Pair, ledger: Ledger) -> dict[str, int]:
    """Settled, the ACTIVE drained: no confirmed message lost (on the ACTIVE or kept in
    quarantine), none invented, no error in either server's log. Returns the counts."""
    active, _ = await pair.settled(timeout=STEP)
    remaining = [body for body, _ in await drain(active.url, QUEUE)]
    kept = quarantined(pair)
    lost, invented = ledger.check(remaining)
    lost -= kept
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented, f"{len(invented)} messages nobody sent, e.g. {sorted(invented)[:5]}"
    for server in pair.servers:
        assert "Traceback" not in server.log(), server.log()
    return {
        "confirmed": len(ledger.confirmed),
        "on_active": len(remaining),
        "quarantined": len(kept & ledger.confirmed),
    }


def records(pair: Pair, server: ServerProcess, event: str, since: float = 0.0) -> list[dict]:
    return [e for e in pair.events(server) if e["event"] == event and e["ts"] >= since]


async def test_the_peer_link_cut_with_clients_on_both_sides(site: Site) -> None:
    """Binary Star's unsolvable case: both servers serve their own clients, and on heal
    the higher epoch (the backup, voted in) stays; the primary's writes from the split
    are quarantined and counted, nothing confirmed is lost."""
    pair = await started(site)
    publishers = Publishers(pair.servers)
    try:
        await publishers.grows("p", "confirms on the primary")
        cut = time.time()
        site.net.drop(site.a, site.b)  # everything between the two hosts, both ways
        await pair.wait_states("ACTIVE", "ACTIVE", timeout=STEP)
        lost = records(pair, pair.backup, "peer_lost", cut)
        assert lost and lost[0]["evidence"] == "silence"  # a cut is no proof of death
        await publishers.grows("b", "confirms on the backup during the split")
        await publishers.grows("p", "confirms on the primary during the split")
        site.net.heal(site.a)
        await pair.wait_states("PASSIVE", "ACTIVE", timeout=STEP)
        yielded = records(pair, pair.primary, "dual_active", cut)
        assert yielded and "we yield" in yielded[0]["reason"]
    finally:
        await publishers.close()
    counts = await loss_check(pair, publishers.ledger)
    assert counts["quarantined"] > 0  # the primary's split-brain writes, kept
    assert pair.epoch(pair.backup) == 2


async def test_the_active_cut_from_everything(site: Site) -> None:
    """The ACTIVE's link goes down (no reset, no refusal: silence). The backup takes
    over on a client's vote after the timeout; when the link comes back the old ACTIVE
    yields to the higher epoch, and nothing confirmed is lost."""
    pair = await started(site)
    publishers = Publishers(pair.servers)
    try:
        await publishers.grows("p", "confirms on the primary")
        cut = time.time()
        site.net.link(site.a, up=False)
        await pair.wait_states(None, "ACTIVE", timeout=STEP)
        assert records(pair, pair.backup, "peer_lost", cut)[0]["evidence"] == "silence"
        await publishers.grows("b", "confirms on the backup")
        site.net.link(site.a, up=True)
        await pair.wait_states("PASSIVE", "ACTIVE", timeout=STEP)
    finally:
        await publishers.close()
    await loss_check(pair, publishers.ledger)


async def test_asymmetric_the_active_hears_the_backup_but_not_the_other_way(
    site: Site,
) -> None:
    """The primary's connection to the backup is dropped one way (its packets to the
    backup's port), the backup's connections to the primary work: the backup hears nothing,
    a client votes it in, the primary hears it ACTIVE in a higher epoch and yields at once,
    without waiting for a heal."""
    pair = await started(site)
    publishers = Publishers(pair.servers)
    try:
        await publishers.grows("p", "confirms on the primary")
        cut = time.time()
        site.net.drop(site.a, site.b, direction="out", port=pair.backup.port)
        # The primary cannot follow yet (its connections to the backup are dropped): the
        # states, not the sync, until the heal.
        await poll(lambda: pair.states() == ("PASSIVE", "ACTIVE"), STEP, "the primary yields")
        assert records(pair, pair.backup, "peer_lost", cut)[0]["evidence"] == "silence"
        yielded = records(pair, pair.primary, "dual_active", cut)
        assert yielded and "we yield" in yielded[0]["reason"]
        await publishers.grows("b", "confirms on the backup")
        site.net.heal(site.a)
    finally:
        await publishers.close()
    await loss_check(pair, publishers.ledger)


async def test_a_flapping_peer_link_makes_no_failover_storm(relayed: Site) -> None:
    """For a minute: the peer links (through a relay that delays them 5 ms each way) lose
    30% of their packets both ways, are cut and healed every few seconds, and the
    primary's way out is held to 8 Mbit/s (a token bucket); clients on the ACTIVE only.
    The primary stays ACTIVE throughout (nobody votes at the backup), and nothing
    confirmed is lost; with a witness, the ACTIVE never stops serving either (it reaches
    the witness throughout)."""
    await flapping(relayed)
    if relayed.witness is not None:
        assert not records(relayed.pair, relayed.pair.primary, "witness_fence")


async def flapping(site: Site) -> None:
    pair = await started(site)
    publishers = Publishers([pair.primary])
    site.net.limit(site.a, "8mbit")

    def serving() -> bool:
        return pair.state(pair.primary) == "ACTIVE" and pair.state(pair.backup) == "PASSIVE"

    try:
        await publishers.grows("p", "confirms on the primary")
        began = time.monotonic()
        for _ in range(20):  # bounded: about a minute
            if time.monotonic() - began > 60:
                break
            # Each phase lasts its time while the primary is seen to serve on throughout.
            site.net.drop(site.a, site.r, percent=30)
            await hold(serving, 2.0, "the primary ACTIVE through 30% loss")
            site.net.drop(site.a, site.r)
            await hold(serving, 1.0, "the primary ACTIVE through a cut")
            site.net.heal(site.a)
        site.net.unlimit(site.a)  # the minute is over: the network is whole again
        await publishers.grows("p", "confirms on the primary after the flapping")
    finally:
        await publishers.close()
    for server in pair.servers:
        assert not records(pair, server, "dual_active")
    moves = [e for e in records(pair, pair.backup, "transition") if e["to"] == "ACTIVE"]
    assert moves == []
    await loss_check(pair, publishers.ledger)


# --- with a witness: never two servers confirming in one period ----------------------------


async def test_with_a_witness_a_cut_peer_link_makes_no_second_active(witnessed: Site) -> None:
    """The peer link cut, clients on both sides: the backup's vote is refused (the witness
    still hears the primary), the primary serves on alone, nothing is quarantined."""
    site = witnessed
    pair = await started(site)
    publishers = Publishers(pair.servers)
    try:
        await publishers.grows("p", "confirms on the primary")
        cut = time.time()
        site.net.drop(site.a, site.b)
        await poll(lambda: records(pair, pair.backup, "peer_lost", cut), STEP, "the loss")
        await publishers.grows("p", "confirms on the primary, alone")
        await publishers.grows("p", "more confirms on the primary, alone")
        status = await pair.status(pair.backup)
        assert status["state"] == "PASSIVE" and not status["witness"]["agrees_peer_gone"]
        assert publishers.confirmed("b") == 0
        site.net.heal(site.a)
        await publishers.grows("p", "confirms on the primary after the heal")
    finally:
        await publishers.close()
    for server in pair.servers:
        assert not records(pair, server, "dual_active", cut)
    counts = await loss_check(pair, publishers.ledger)
    assert counts["quarantined"] == 0 and pair.states() == ("ACTIVE", "PASSIVE")


async def test_with_a_witness_the_active_cut_off_stops_before_the_backup_starts(
    witnessed: Site,
) -> None:
    """The ACTIVE's link down: it loses its peer and the witness, fences itself (confirms
    nothing), and only then may the backup take over, the witness having not heard the
    primary for twice the timeout. Back on the network it serves nobody and yields: every
    message it ever confirmed is on the new ACTIVE, none in quarantine."""
    site = witnessed
    pair = await started(site)
    publishers = Publishers(pair.servers)
    try:
        await publishers.grows("p", "confirms on the primary")
        cut = time.time()
        site.net.link(site.a, up=False)
        await pair.wait_states(None, "ACTIVE", timeout=STEP)
        vote = records(pair, pair.backup, "transition", cut)[-1]
        assert vote["reason"].endswith("the witness agrees")
        await publishers.grows("b", "confirms on the backup")
        site.net.link(site.a, up=True)
        await poll(lambda: pair.states() == ("PASSIVE", "ACTIVE"), STEP, "the primary yields")
        fence = records(pair, pair.primary, "witness_fence", cut)
        assert fence and fence[0]["fenced"] and fence[0]["ts"] < vote["ts"]
    finally:
        await publishers.close()
    counts = await loss_check(pair, publishers.ledger)
    assert counts["quarantined"] == 0


async def test_with_a_witness_a_one_way_partition_changes_nothing(witnessed: Site) -> None:
    """The backup cannot hear the primary, the witness hears both: the backup's vote is
    refused, the primary serves on, no second ACTIVE, nothing quarantined."""
    site = witnessed
    pair = await started(site)
    publishers = Publishers(pair.servers)
    try:
        await publishers.grows("p", "confirms on the primary")
        cut = time.time()
        site.net.drop(site.a, site.b, direction="out", port=pair.backup.port)
        await poll(lambda: records(pair, pair.backup, "peer_lost", cut), STEP, "the loss")
        await publishers.grows("p", "confirms on the primary")
        await publishers.grows("p", "more confirms on the primary")
        assert pair.states() == ("ACTIVE", "PASSIVE") and publishers.confirmed("b") == 0
        site.net.heal(site.a)
    finally:
        await publishers.close()
    for server in pair.servers:
        assert not records(pair, server, "dual_active", cut)
    counts = await loss_check(pair, publishers.ledger)
    assert counts["quarantined"] == 0


BULK = 32 * 1024  # one message of the bulk that fills the primary's way out
BULK_COUNT = 384  # 12 MiB: at 1 Mbit/s, over a minute and a half of the link
BULK_TAKERS = 16  # connections: one flow's queue is bounded by the kernel, not sixteen


async def test_with_a_witness_a_full_link_holds_no_heartbeat_back(witnessed: Site) -> None:
    """The peer link cut, so the ACTIVE serves on its witness's word alone, and its way out
    held to 1 Mbit/s with a deep queue that sixteen consumers of large messages keep full
    (a second and more of bulk ahead of anything unmarked): its pings to the witness are
    marked as control traffic and pass the bulk (docs/failover.md, "On a full link"), so
    it never stops serving. Unmarked, they waited in that queue past the timeout, and the
    ACTIVE fenced itself within seconds of the bulk starting."""
    site = witnessed
    pair = await started(site)
    publishers = Publishers([pair.primary])
    connections = [await aiormq.connect(pair.primary.url) for _ in range(BULK_TAKERS)]
    received: list[int] = []

    async def take(message: Any) -> None:
        received.append(len(message.body))

    try:
        channel = await connections[0].channel()
        await channel.queue_declare("bulk")  # not durable: the cut PASSIVE needs none of it
        for _ in range(BULK_COUNT):  # before the limit: its acks would hold these back
            await channel.basic_publish(b"x" * BULK, routing_key="bulk")
        takers = [await connection.channel() for connection in connections]
        for taker in takers:
            await taker.basic_qos(prefetch_count=4)
        await publishers.grows("p", "confirms on the primary")
        cut = time.time()
        site.net.drop(site.a, site.b)
        await poll(lambda: records(pair, pair.primary, "peer_lost", cut), STEP, "the loss")
        site.net.pin_neighbours(site.a, site.w)  # no ARP in the full queue: see there
        site.net.limit(site.a, "1mbit", control_first=True)
        # All at once: each reply waits behind the bulk the ones before it started.
        await asyncio.gather(*(t.basic_consume("bulk", take, no_ack=True) for t in takers))
        # The premise: more than a second of bulk (at 1 Mbit/s) queued ahead of the pings.
        await poll(lambda: site.net.backlog(site.a) > 128_000, STEP, "a second of bulk queued")
        await hold(
            lambda: not records(pair, pair.primary, "witness_fence", cut),
            8.0,
            "the primary serving with its way out full",
        )
        assert len(received) < BULK_COUNT  # the bulk kept the link full all along
        assert pair.state(pair.primary) == "ACTIVE"
        await publishers.grows("p", "confirms on the primary, its way out full")
        site.net.unlimit(site.a)
        site.net.heal(site.a)
        await poll(lambda: len(received) == BULK_COUNT, STEP, "the rest of the bulk")
    finally:
        for connection in connections:
            with contextlib.suppress(Exception):
                await connection.close()
        await publishers.close()
    assert not records(pair, pair.primary, "witness_fence", cut)
    counts = await loss_check(pair, publishers.ledger)
    assert counts["quarantined"] == 0


async def test_the_client_helpers_ride_the_active_cut_off(site: Site) -> None:
    """amqha.client's Publisher and Consumer (docs/client.md) while the ACTIVE's link is
    down: they notice the silence by the AMQP heartbeat (1 s, asked in the URLs), move to
    the backup that their own connects vote in, and carry on there; after the heal (the
    old ACTIVE yields) every message the publisher had confirmed was consumed or kept in
    quarantine, and no publish raised."""
    pair = await started(site)
    urls = [f"{server.url}?heartbeat=1" for server in pair.servers]
    sent: set[bytes] = set()
    confirmed: set[bytes] = set()
    received: set[bytes] = set()
    stop = asyncio.Event()

    async def handle(message: Any) -> None:
        received.add(message.body)

    async def keep_sending(publisher: Publisher) -> None:
        for number in range(1_000_000):
            if stop.is_set():
                return
            body = b"c%d" % number
            sent.add(body)
            future = await publisher.send(body, routing_key=QUEUE)
            future.add_done_callback(
                lambda f, b=body: confirmed.add(b) if not f.exception() else None
            )
            await asyncio.sleep(0.005)

    async with (
        Publisher(urls, max_pending=200) as publisher,
        Consumer(urls, QUEUE, handle, prefetch=20) as consumer,
    ):
        sending = asyncio.ensure_future(keep_sending(publisher))
        try:
            await poll(lambda: len(confirmed) >= 50, STEP, "confirms on the primary")
            assert publisher.server == pair.primary.address
            site.net.link(site.a, up=False)
            await pair.wait_states(None, "ACTIVE", timeout=STEP)
            await poll(
                lambda: publisher.server == pair.backup.address and publisher.pending < 200,
                STEP,
                "the publisher confirmed by the backup",
            )
            before = len(confirmed)
            await poll(lambda: len(confirmed) > before + 50, STEP, "more confirms on the backup")
            await poll(lambda: consumer.server == pair.backup.address, STEP, "the consumer moved")
            site.net.link(site.a, up=True)
            await pair.wait_states("PASSIVE", "ACTIVE", timeout=STEP)
        finally:
            stop.set()
            await asyncio.wait_for(sending, STEP)  # a publish never raised
        await publisher.flush(STEP)
        kept = quarantined(pair)
        await poll(lambda: confirmed <= received | kept, STEP, "every confirmed message consumed")
    assert received <= sent, "a message consumed that nobody sent"
    assert publisher.failovers == 1 and consumer.failovers == 1
    print(
        f"{len(confirmed)} confirmed, 0 lost, {publisher.resent} sent again, "
        f"{len(kept & confirmed)} kept in quarantine"
    )
