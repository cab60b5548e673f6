"""The planned switchover (``amqha console switchover``; docs/failover.md, "Planned
switchover") on a real pair under confirming publishers and acking consumers: back and
forth, nothing confirmed lost and no message stored twice (a drained switchover leaves no
confirm in doubt); refused with its reason when the PASSIVE is not there; a kill of
either server as it runs loses nothing and, with deduplication, stores nothing twice;
each step in the event log; the management API's route for administrators only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

import aio_pika
import pytest

from amqha.client import Consumer, Publisher
from amqha.console import ConsoleClient, ConsoleError
from tests.integration.test_dedup import message_ids
from tests.integration.test_management import MGMT_USERS, Api
from tests.integration.test_replication import replay
from tests.pairs import ADMIN, MakePair, client_vote, hold, poll, url_of
from tests.support import ROOT, free_port, soak_size

QUEUE = "switch"


def declare(channel_setup_queue: str = QUEUE) -> Any:
    async def setup(channel: aio_pika.abc.AbstractChannel) -> None:
        await channel.declare_queue(channel_setup_queue, durable=True)

    return setup


class Received:
    def __init__(self) -> None:
        self.first: list[str] = []  # deliveries not marked redelivered
        self.ids: set[str] = set()  # every message id delivered
        self.redelivered = 0
        # Each delivery: message id, redelivered, the body, the delivery tag, when.
        self.deliveries: list[tuple[str, bool, bytes, int, float]] = []

    async def __call__(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.ids.add(message.message_id or "")
        self.deliveries.append(
            (
                message.message_id or "",
                bool(message.redelivered),
                message.body,
                message.delivery_tag or 0,
                time.monotonic(),
            )
        )
        if message.redelivered:
            self.redelivered += 1
        else:
            self.first.append(message.message_id or "")

    def twice(self) -> list[list[tuple[str, bool, bytes, int, float]]]:
        """The deliveries of each message delivered more than once as new."""
        counted: dict[str, int] = {}
        for message_id in self.first:
            counted[message_id] = counted.get(message_id, 0) + 1
        return [
            [d for d in self.deliveries if d[0] == message_id]
            for message_id, times in counted.items()
            if times > 1
        ]


class Sending:
    """Publishers sending persistent messages to ``QUEUE`` until stopped: the message ids
    sent, and each one's confirm."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.futures: list[asyncio.Future[None]] = []
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, publishers: list[Publisher]) -> None:
        self.tasks = [
            asyncio.create_task(self._keep_sending(p, f"p{i}")) for i, p in enumerate(publishers)
        ]

    async def _keep_sending(self, publisher: Publisher, name: str) -> None:
        number = 0
        while not self.stopping.is_set():
            message = aio_pika.Message(f"{name}-{number}".encode(), delivery_mode=2)
            self.futures.append(await publisher.send(message, routing_key=QUEUE))
            self.sent.append(message.message_id or "")
            number += 1
            if number % 20 == 0:
                await asyncio.sleep(0.005)

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.gather(*self.tasks)

    async def all_confirmed(self, publishers: list[Publisher]) -> None:
        """Every message sent is confirmed, none failed."""
        for publisher in publishers:
            await publisher.flush(60)
        assert all(f.done() and f.exception() is None for f in self.futures)


async def switchover(server: Any, wait: float = 30.0) -> dict[str, Any]:
    async with asyncio.timeout(wait + 30), ConsoleClient(url_of(server, ADMIN), wait + 20) as c:
        return await c.call("switchover", wait=wait)


async def backlog(url: str, also_unreplicated: bool = False) -> None:
    """1000 confirmed messages of 40 KB (ids b0 ... b999) on the durable queue ``backlog``;
    ``also_unreplicated``: a queue left out of replication (``local``) declared too."""
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("backlog", durable=True)
        if also_unreplicated:
            await channel.declare_queue(
                "local", durable=True, arguments={"x-amqha-replicate": False}
            )
        body = b"x" * 40_000
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=2, message_id=f"b{n}"),
                    routing_key="backlog",
                )
                for n in range(1000)
            )
        )


def switchover_records(pair: Any, server: Any) -> list[str]:
    return [e["phase"] for e in pair.events(server) if e["event"] == "switchover"]


@pytest.mark.soak
async def test_switchovers_back_and_forth_under_load_lose_and_duplicate_nothing(
    make_pair: MakePair,
) -> None:
    """Each round (6 in ``make test``, 20 in ``make soak``): the ACTIVE hands over to its
    PASSIVE while 3 publishers send and 2 consumers ack; at the end every confirmed
    message was consumed, none was delivered twice as new (none stored twice), no
    confirm failed, and the publishers never saw an error."""
    rounds = soak_size(6, 20)
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    urls = [pair.primary.url, pair.backup.url]
    received = Received()
    sending = Sending()
    sent = sending.sent

    publishers = [Publisher(urls, setup=declare(), max_pending=100) for _ in range(3)]
    consumers = [Consumer(urls, QUEUE, received, prefetch=20, setup=declare()) for _ in range(2)]
    for each in (*publishers, *consumers):
        await each.__aenter__()
    sending.start(publishers)
    took: list[float] = []
    try:
        for _ in range(rounds):
            active, passive = await pair.settled(timeout=60, interval=0.1)
            target = len(sent) + 300
            await poll(lambda: len(sent) >= target, 60, "messages sent")  # noqa: B023
            started = time.monotonic()
            result = await switchover(active)
            took.append(time.monotonic() - started)
            assert result["to"] == passive.config["server"]["name"]
            await poll(lambda: pair.state(passive) == "ACTIVE", 30, "the new ACTIVE")  # noqa: B023
    finally:
        await sending.stop()
    await sending.all_confirmed(publishers)
    await poll(lambda: set(sent) <= received.ids, 60, "every message consumed")
    for each in (*publishers, *consumers):
        await each.__aexit__(None, None, None)

    twice = received.twice()
    assert not twice, (
        f"{len(twice)} messages delivered twice as new; sent again by the publishers:"
        f" {[p.resent for p in publishers]}; the first five: {twice[:5]}"
    )
    assert set(received.first) <= set(sent)
    assert pair.quarantine_files() == []
    for server in pair.servers:
        phases = switchover_records(pair, server)
        assert phases.count("requested") == phases.count("handed_over") > 0
        assert "failed" not in phases
    # Each server that handed over rejoined by resuming, with no snapshot; or, where the
    # new ACTIVE took it for lost meanwhile (a busy machine: silent for the 0.4 s
    # timeout), from a snapshot, as a lost peer must (the resume is for a server that
    # followed throughout), and the log says so.
    resumed = [
        e
        for server in pair.servers
        for e in pair.events(server)
        if e["event"] == "sync" and "resumed where this server handed" in e.get("reason", "")
    ]
    lost = [
        line
        for server in pair.servers
        for line in server.log().splitlines()
        if "no resume after the handover: the server that handed the service over is lost" in line
    ]
    assert len(lost) <= sum(
        e["event"] == "peer_lost" for server in pair.servers for e in pair.events(server)
    )
    assert len(resumed) + len(lost) == rounds and resumed, [
        line
        for server in pair.servers
        for line in server.log().splitlines()
        if "stepping down" in line or "snapshot" in line
    ]
    print(
        f"{rounds} switchovers: {len(sent)} confirmed, 0 lost, 0 stored twice, "
        f"{sum(p.resent for p in publishers)} sent again (never read by the old ACTIVE), "
        f"{received.redelivered} redelivered; command took "
        f"{min(took):.3f}-{max(took):.3f} s"
    )


@pytest.mark.parametrize("fault", ["stopped", "cut"])
async def test_a_slow_drain_keeps_its_clients_and_stores_nothing_twice(
    make_pair: MakePair, fault: str
) -> None:
    """The PASSIVE stalls as the switchover drains (``stopped`` for longer than the
    clients' ``silent_after``, as a busy machine may stall it; not long enough for the pair
    to fail over): the drain waits that long without reading its clients, yet they do not
    leave the ACTIVE as a silent server (it tells them it is alive). Or its link is
    ``cut`` for a moment as it drains: it drops out of sync, and the switchover (asked
    with a wait) waits for it again and hands over once it is back in sync, with no
    failed step. Either way none gives up a connection that was still confirming and sends
    its messages again, so no message is stored twice, and each client moves to the new
    ACTIVE once, by the redirect."""
    pair = make_pair(heartbeat=0.3, timeout=8.0).start()
    active, passive = await pair.settled(timeout=60, interval=0.1)
    urls = [pair.primary.url, pair.backup.url]
    received = Received()
    sending = Sending()
    sent = sending.sent

    publishers = [Publisher(urls, setup=declare(), max_pending=100) for _ in range(2)]
    consumer = Consumer(urls, QUEUE, received, prefetch=20, setup=declare())
    for each in (*publishers, consumer):
        await each.__aenter__()
    sending.start(publishers)
    try:
        await poll(lambda: len(sent) >= 300, 60, "messages sent")
        # proxies[i] carries server i's links to the other: the PASSIVE's subscription.
        # Delayed, its acks take long enough for the PASSIVE to be stopped as it drains.
        link = pair.proxies[pair.servers.index(passive)]
        link.delay(0.3)
        assert passive.process is not None
        try:
            asked = asyncio.ensure_future(switchover(active))
            await poll(
                lambda: "requested" in switchover_records(pair, active) or asked.done(),
                30,
                "the drain begun",
                interval=0.005,
            )
            if fault == "stopped":
                os.kill(passive.process.pid, signal.SIGSTOP)
                try:
                    # Longer than the clients' silent_after (1.2 s), shorter than the
                    # pair's timeout (8 s): the drain waits all along, the ACTIVE serving.
                    await hold(
                        lambda: not asked.done() and pair.state(active) == "ACTIVE",
                        2.0,
                        "the drain waiting for the stopped PASSIVE",
                    )
                finally:
                    os.kill(passive.process.pid, signal.SIGCONT)
            else:
                link.cut()
                try:
                    await poll(
                        lambda: "left the drain" in active.log() or asked.done(),
                        30,
                        "the PASSIVE out of the drain",
                    )
                finally:
                    link.heal()
        finally:
            link.delay(0)
        result = await asked
        assert result["to"] == passive.config["server"]["name"]
        await poll(lambda: pair.state(passive) == "ACTIVE", 30, "the new ACTIVE")
        target = len(sent) + 200
        await poll(lambda: len(sent) >= target, 60, "messages sent on the new ACTIVE")
    finally:
        await sending.stop()
    await sending.all_confirmed(publishers)
    await poll(lambda: set(sent) <= received.ids, 60, "every message consumed")
    for each in (*publishers, consumer):
        await each.__aexit__(None, None, None)
    if fault == "stopped":
        # The drain waited for the stopped PASSIVE: longer than a client waits for a
        # silent server.
        assert result["drained_s"] >= 2.0
    else:
        assert "left the drain" in active.log()
    assert switchover_records(pair, active)[:2] == ["requested", "handed_over"]
    twice = received.twice()
    assert not twice, (
        f"{len(twice)} messages delivered twice as new; sent again by the publishers:"
        f" {[p.resent for p in publishers]}; the first five: {twice[:5]}"
    )
    assert [each.failovers for each in (*publishers, consumer)] == [1, 1, 1]


async def test_a_switchover_is_refused_with_its_reason_when_the_passive_is_away(
    make_pair: MakePair,
) -> None:
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    pair.kill(pair.backup)
    with pytest.raises(ConsoleError, match="switchover refused: the backup is"):
        await switchover(pair.primary, wait=0)
    servers = [a for s in pair.servers for a in ("--server", url_of(s, ADMIN))]
    done = subprocess.run(
        [sys.executable, "-m", "amqha", "console", *servers, "--json", "switchover"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert '"ok": false' in done.stdout and "switchover refused" in done.stdout
    with pytest.raises(ConsoleError, match="after waiting 0.5 s"):
        await switchover(pair.primary, wait=0.5)
    assert pair.state(pair.primary) == "ACTIVE"
    # The call, the command line's, the one that waited.
    assert switchover_records(pair, pair.primary) == ["failed", "failed", "failed"]


@pytest.mark.soak
@pytest.mark.parametrize("victim", ["active", "passive"])
async def test_a_kill_as_the_switchover_runs_loses_nothing_and_stores_nothing_twice(
    make_pair: MakePair, victim: str
) -> None:
    """The switchover asked and a server killed at once (1 round in ``make test``, 4 in
    ``make soak``; the second and later a little after the ask), under a deduplicating
    Publisher and a deduplicating queue: whichever way the race goes (handed over, or failed and
    served on, or a failover), once the pair has healed the queue holds every confirmed
    message, each once (docs/compat.md, "Message deduplication")."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    urls = [pair.primary.url, pair.backup.url]
    arguments = {"x-message-deduplication": True}

    async def setup(channel: aio_pika.abc.AbstractChannel) -> None:
        await channel.declare_queue(QUEUE, durable=True, arguments=arguments)

    sent: list[str] = []
    futures: list[asyncio.Future[None]] = []
    async with Publisher(urls, setup=setup, max_pending=100, deduplicate=True) as publisher:
        for round_ in range(soak_size(1, 4)):
            active, passive = await pair.settled(timeout=60, interval=0.1)
            for number in range(200):
                message = aio_pika.Message(f"{round_}-{number}".encode(), delivery_mode=2)
                futures.append(await publisher.send(message, routing_key=QUEUE))
                sent.append(message.message_id or "")
            asked = asyncio.create_task(switchover(active, wait=5))
            await asyncio.sleep(0.01 * round_)
            killed = active if victim == "active" else passive
            pair.kill(killed)
            # The answer may die with the server, or the drain fail: both are allowed.
            with contextlib.suppress(
                ConsoleError, OSError, TimeoutError, aio_pika.exceptions.AMQPError
            ):
                await asyncio.wait_for(asked, 60)
            killed.start(wait=False)
            await publisher.flush(60)
        assert all(f.done() and f.exception() is None for f in futures)
    active, _ = await pair.settled(timeout=60, interval=0.1)
    for path in pair.quarantine_files():  # a dual active's: replayed through the check
        await asyncio.to_thread(replay, path, active.url)
    held = await message_ids(active.url, QUEUE)
    assert set(sent) <= set(held), f"{len(set(sent) - set(held))} confirmed messages lost"
    assert len(held) == len(set(held)), "a message stored twice"


async def test_the_management_api_switches_over_for_an_administrator_only(
    make_pair: MakePair,
) -> None:
    """POST /api/amqha/switchover: refused to a management or monitoring login (403) and
    for a bad body (400); an administrator's moves the service, as the console's does."""
    pair = make_pair(proxied=False, users=MGMT_USERS)
    port = free_port()
    pair.primary.config["management"] = {"listen": f"127.0.0.1:{port}"}
    pair.start()
    await pair.settled(timeout=60)
    api = Api(port)
    for user in ("mgmt", "watcher", "guest"):
        status, _ = await api.call("POST", "/api/amqha/switchover", user, json={"wait": 5})
        assert status in (401, 403), (user, status)
    status, body = await api.call("POST", "/api/amqha/switchover", json={"wait": "soon"})
    assert status == 400 and "wait" in body["reason"]
    status, body = await api.call("POST", "/api/amqha/switchover", json={"wait": 30})
    assert status == 200, body
    assert body["to"] == "backup" and body["state"] == "PASSIVE"
    await poll(lambda: pair.state(pair.backup) == "ACTIVE", 30, "the backup ACTIVE")
    status, body = await api.call("POST", "/api/amqha/switchover", json={"wait": 0})
    assert status == 409 and "this server is PASSIVE" in body["reason"]


async def test_nothing_is_confirmed_on_one_copy_while_the_old_active_rejoins(
    make_pair: MakePair,
) -> None:
    """The old ACTIVE rejoins as PASSIVE right after the handover. Here it cannot resume
    (a queue left out of replication: its messages go to a quarantine with a snapshot's
    reset), so it takes a snapshot of a backlog (about 40 MB): a message published to the
    new ACTIVE meanwhile is confirmed only once the old one is in sync again, never on
    the new one alone."""
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    primary, backup = pair.primary, pair.backup
    await backlog(primary.url, also_unreplicated=True)
    await pair.wait_in_sync(backup, timeout=60)
    await switchover(primary)
    # The switchover answers once it has handed over; the backup serves once it has read
    # the handover, a moment later: on a busy machine, later than a connect made at once.
    await poll(lambda: pair.state(backup) == "ACTIVE", 30, "the backup ACTIVE")
    connection = await aio_pika.connect(backup.url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        published = time.time()
        await channel.default_exchange.publish(
            aio_pika.Message(b"during", delivery_mode=2), routing_key="backlog", timeout=60
        )
        confirmed = time.time()

    def in_sync_again() -> list[float]:
        return [
            e["ts"]
            for e in pair.events(backup)
            if e["event"] == "sync" and e["side"] == "active" and e["sync"] == "in_sync"
        ]

    synced = await poll(in_sync_again, 60, "the old ACTIVE in sync again")
    # Published while the old ACTIVE was still catching up (the backlog saw to that) ...
    assert published < synced[-1], (published, synced)
    # ... and confirmed only after it was in sync: the record is written before the
    # confirms it releases go out.
    assert confirmed >= synced[-1], (confirmed, synced)
    status = await pair.status(backup)
    assert status["replication"]["feed"]["when_alone"] == "confirm"  # the configured mode back
    assert status["replication"]["feed"]["resumes"] == 0


async def test_the_old_active_resumes_without_a_snapshot_and_a_kill_right_after_loses_nothing(
    make_pair: MakePair,
) -> None:
    """After a switchover the old ACTIVE, drained, holds the new one's state at the
    takeover: it resumes from there (docs/durability.md, section 5, "Resuming after a
    handover"), sent only what changed since, with no snapshot of the 40 MB backlog. The
    new ACTIVE is killed the moment the old one is in sync again, with messages
    confirmed after the resume: the old one is voted in and serves every confirmed
    message; nothing is quarantined. Then, the backup restarted, the primary hands over
    again and resumes again."""
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    primary, backup = pair.primary, pair.backup
    await backlog(primary.url)
    await pair.wait_in_sync(backup, timeout=60)
    await switchover(primary)
    await pair.wait_in_sync(primary, timeout=60)
    feed = (await pair.status(backup))["replication"]["feed"]
    assert feed["resumes"] == 1 and feed["snapshots"] == 0, feed
    follower = (await pair.status(primary))["replication"]["follower"]
    assert follower["resumed"] and follower["last_snapshot_seconds"] is None, follower
    assert any(
        "resumed where this server handed" in e.get("reason", "") for e in pair.events(primary)
    )

    # Confirmed on the new ACTIVE after the resume, so on both disks; then it dies.
    connection = await aio_pika.connect(backup.url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        for n in range(50):
            await channel.default_exchange.publish(
                aio_pika.Message(b"after", delivery_mode=2, message_id=f"a{n}"),
                routing_key="backlog",
                timeout=30,
            )
    pair.kill(backup)
    await client_vote([primary], retry_for=30)
    await pair.wait_states("ACTIVE", None, timeout=30)
    ids = await message_ids(primary.url, "backlog")
    expected = {f"b{n}" for n in range(1000)} | {f"a{n}" for n in range(50)}
    assert set(ids) == expected and len(ids) == len(expected)
    assert pair.quarantine_files() == []

    # The backup restarts and catches up (a snapshot: it was killed); the primary hands
    # the service over again and resumes again, from the restarted backup this time.
    backup.start()
    active, passive = await pair.settled(timeout=60, interval=0.1)
    assert (active, passive) == (primary, backup)
    connection = await aio_pika.connect(primary.url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.default_exchange.publish(
            aio_pika.Message(b"live", delivery_mode=2, message_id="live"),
            routing_key="backlog",
            timeout=30,
        )
    await switchover(primary)
    await pair.wait_in_sync(primary, timeout=60)
    assert (await pair.status(backup))["replication"]["feed"]["resumes"] == 1
