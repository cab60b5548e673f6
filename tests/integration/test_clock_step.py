"""A step of one server's wall clock while its pair runs (docs/durability.md, "When a clock
steps"): libfaketime moves that process's wall clock by +1 h, back by 1 h and back by
another hour, its monotonic clock untouched, a publisher confirming all along.

Each case: no failover (no transition after the pair settled, the same server serves), no
confirmed message lost; a message's TTL and a queue's x-message-ttl hold across each step:
a 2 s message at a queue's head expires (within a bounded wait) and the long ones behind
it are still there after it did (a step forward expired them early, one back kept the
short one an hour); a queue's x-expires ends it after a step back. Then a kill -9 of the
ACTIVE: the survivor, whose clock never moved, expires what it must and keeps the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aio_pika
import aiormq
import pytest

from amqha.client import connect_robust
from amqha.console import ConsoleClient
from tests import faketime
from tests.durability import drain
from tests.faketime import fake_clock, set_offset
from tests.pairs import ADMIN, MakePair, Pair, Publisher, client_vote, poll, url_of
from tests.support import ServerProcess, console_in_process

# Messages that must outlive the test's steps: long beside any wait here, short beside
# the hour a step moves the wall clock.
LONG_TTL_MS = 300_000
SHORT_TTL_MS = 4_000
LONG_COUNT = 20
WAIT = 30.0  # the bound of every wait for the server to act

pytestmark = [
    pytest.mark.skipif(faketime.unavailable() is not None, reason=faketime.unavailable() or ""),
    pytest.mark.timeout(240),
]


async def step(server: ServerProcess, offset: Path, seconds: int, by: float) -> None:
    """Set the faked clock ``seconds`` from the real one (a step of ``by`` s), and wait
    (bounded) for the server to log that it saw one more step of that size."""
    line = f"the system clock stepped {by:+.1f} s"
    before = server.log().count(line)
    set_offset(offset, seconds)
    await poll(lambda: server.log().count(line) > before, WAIT, f"{server.name} logs: {line}")


async def count(url: str, queue: str) -> int | None:
    """Messages ready on ``queue`` (None: no such queue), asked within WAIT s."""
    return await asyncio.wait_for(_count(url, queue), WAIT)


async def _count(url: str, queue: str) -> int | None:
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        try:
            declared = await channel.queue_declare(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        return int(declared.message_count or 0)
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def fill(channel: aio_pika.abc.AbstractChannel, queue: str) -> None:
    """A short-lived message at ``queue``'s head, LONG_COUNT long-lived ones behind it."""
    publish = channel.default_exchange.publish
    await publish(aio_pika.Message(b"short", expiration=SHORT_TTL_MS / 1000), routing_key=queue)
    for i in range(LONG_COUNT):
        message = aio_pika.Message(
            b"long %d" % i,
            expiration=LONG_TTL_MS / 1000,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        await publish(message, routing_key=queue)


async def short_one_gone(url: str, queue: str, what: str) -> None:
    """The head's short message expires (a bounded wait), and the long ones stay."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    found = [await count(url, queue)]
    while found[-1] is None or found[-1] > LONG_COUNT:
        assert loop.time() < deadline, (
            f"{what}: the {SHORT_TTL_MS} ms message still on {queue} after {WAIT} s"
            f" (counts {found[-5:]}): kept late"
        )
        await asyncio.sleep(0.1)
        found.append(await count(url, queue))
    assert found[-1] == LONG_COUNT, f"{what}: {queue} has {found[-1]} of {LONG_COUNT}: early"


async def queue_ttl_holds(url: str, queue: str, what: str) -> None:
    """A queue's x-message-ttl (LONG_TTL_MS): a Basic.Get, which expires what is due,
    finds its messages all there."""
    connection = await aio_pika.connect(url, timeout=WAIT)
    async with connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        got = await declared.get(no_ack=True, fail=False)
        assert got is not None, f"{what}: {queue}'s messages expired early"
    assert await count(url, queue) == LONG_COUNT - 1, what


def transitions(pair: Pair) -> list[tuple[str, str, str]]:
    return [
        (e["node"], e["from"], e["to"])
        for server in pair.servers
        for e in pair.events(server)
        if e["event"] == "transition"
    ]


def no_takeover(pair: Pair, settled: list[tuple[str, str, str]]) -> None:
    assert transitions(pair) == settled, "a transition after the pair settled: a failover"
    assert [e for s in pair.servers for e in pair.events(s) if e["event"] == "peer_lost"] == []


@pytest.mark.parametrize("stepped", ["ACTIVE", "PASSIVE"])
async def test_a_clock_step_on_one_server(
    make_pair: MakePair, tmp_path: Path, stepped: str
) -> None:
    # A failover timeout above the stalls libfaketime itself causes: while its offset is
    # not 0, its wrapper of timed waits (CPython's GIL is one) stalls a thread for up to
    # a second (measured: a thread ticking every 0.1 s saw gaps of 0.33 s beside a busy
    # one, 0.11 s without libfaketime; a faked server "froze" for 0.5 and 1.0 s). Those
    # are no step of a clock; the server's timers never read the wall clock.
    pair = make_pair(heartbeat=0.25, timeout=2.0)
    target = pair.primary if stepped == "ACTIVE" else pair.backup
    offset = fake_clock(target, tmp_path)
    pair.start()
    active, passive = await pair.settled()
    assert active is pair.primary
    settled = transitions(pair)
    url = active.url

    connection = await connect_robust([pair.primary.url, pair.backup.url], retry_for=30)
    publisher: Publisher | None = None
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("confirmed", durable=True)
        for queue in ("per-message-1", "per-message-2", "per-message-3"):
            await channel.declare_queue(queue, durable=True)
        await channel.declare_queue(
            "queue-ttl", durable=True, arguments={"x-message-ttl": LONG_TTL_MS}
        )
        publisher = Publisher(connection, "confirmed").start()
        await fill(channel, "per-message-1")
        for i in range(LONG_COUNT):
            await channel.default_exchange.publish(
                aio_pika.Message(b"q %d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key="queue-ttl",
            )

        # +1 h: nothing expires early, the short one is not kept.
        await step(target, offset, 3600, 3600)
        await short_one_gone(url, "per-message-1", f"{stepped} +1 h")
        await queue_ttl_holds(url, "queue-ttl", f"{stepped} +1 h")

        # Back by an hour to the real time, then by another: the short one is not kept an
        # hour or two, and a queue with x-expires ends.
        await fill(channel, "per-message-2")
        await channel.declare_queue("expiring", durable=True, arguments={"x-expires": SHORT_TTL_MS})
        await step(target, offset, 0, -3600)
        await step(target, offset, -3600, -3600)
        await short_one_gone(url, "per-message-2", f"{stepped} -1 h")
        await expired(active, "expiring")
        assert await count(url, "per-message-1") == LONG_COUNT
        await publisher.confirmed_after(publisher.confirmed[-1][0], WAIT, by=active.name)
        no_takeover(pair, settled)
        assert pair.states() == ("ACTIVE", "PASSIVE")

        # A kill -9 of the ACTIVE (stepped or not): the survivor's deadlines are right.
        await fill(channel, "per-message-3")
        await pair.wait_in_sync(passive, timeout=WAIT)
        pair.kill(active)
        assert (await client_vote([passive], retry_for=WAIT))["name"] == passive.name
        await pair.wait_states(None, "ACTIVE", timeout=WAIT)
        await publisher.confirmed_after(publisher.confirmed[-1][0], WAIT, by=passive.name)
        await publisher.stop()
        survivor = passive.url
        await short_one_gone(survivor, "per-message-3", f"{stepped}: survivor")
        for queue in ("per-message-1", "per-message-2"):
            assert await count(survivor, queue) == LONG_COUNT, f"{queue} on the survivor"
        assert await count(survivor, "queue-ttl") == LONG_COUNT - 1

        # No confirmed message lost.
        confirmed = {str(seq).encode() for _, seq, _ in publisher.confirmed}
        kept = {body for body, _ in await drain(survivor, "confirmed")}
        assert confirmed - kept == set(), f"{len(confirmed - kept)} confirmed messages lost"
    finally:
        if publisher is not None:
            await publisher.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), 5)


async def expired(server: ServerProcess, queue: str) -> None:
    """Until ``queue`` (x-expires SHORT_TTL_MS) is gone, at most WAIT s. Asked through the
    console's listing, which is no use of the queue (a passive declare would renew its
    lease)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    async with ConsoleClient(url_of(server, ADMIN)) as console:
        while any(row["name"] == queue for row in await console.call("queues")):
            assert loop.time() < deadline, f"{queue} (x-expires) still there after {WAIT} s: late"
            await asyncio.sleep(0.1)


@pytest.mark.parametrize("hours", [1, -1])
async def test_a_passive_an_hour_off_its_active_keeps_the_actives_deadlines(
    make_pair: MakePair, tmp_path: Path, hours: int
) -> None:
    """The backup's system clock an hour ahead of (or behind) the primary's from its start,
    not stepped: as PASSIVE it takes its ACTIVE's time from the state messages, so the
    deadlines it receives mean the same to it. After a kill -9 of the ACTIVE it serves
    them right: the long ones not expired at once (an hour ahead would have), the short
    one not kept an hour (an hour behind would have)."""
    pair = make_pair(heartbeat=0.25, timeout=2.0)
    offset = fake_clock(pair.backup, tmp_path)
    set_offset(offset, 3600 * hours)
    pair.start()
    active, passive = await pair.settled()
    assert (active, passive) == (pair.primary, pair.backup)
    await poll(
        lambda: "following primary's time" in passive.log(), WAIT, "the backup takes its time"
    )
    connection = await aio_pika.connect(active.url, timeout=WAIT)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("per-message", durable=True)
        await fill(channel, "per-message")
    await pair.wait_in_sync(passive, timeout=WAIT)
    pair.kill(active)
    assert (await client_vote([passive], retry_for=WAIT))["name"] == passive.name
    await pair.wait_states(None, "ACTIVE", timeout=WAIT)
    await short_one_gone(passive.url, "per-message", f"a backup {hours:+d} h off")
    # Restarted (alone: an operator promotes it), it keeps the time it followed (its data
    # dir's pair_time): the long ones are still there.
    passive.kill()
    passive.start()
    promoted = await asyncio.to_thread(
        console_in_process, "--server", url_of(passive, ADMIN), "promote", "--force"
    )
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr
    await pair.wait_states(None, "ACTIVE", timeout=WAIT)
    assert await count(passive.url, "per-message") == LONG_COUNT
