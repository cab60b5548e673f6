"""Message deduplication on real servers through a real client (aio-pika): the plugin's
interface (an ``x-message-deduplication`` exchange and queue argument, every copy still
confirmed), a bad argument refused with 406 naming it and nothing made, the keys a
durable queue's cache took surviving a restart, and exactly once through kill -9s of the
ACTIVE: ``Publisher(deduplicate=True)`` sends again what the kill left unconfirmed, the
new ACTIVE drops each copy and confirms it (docs/compat.md, "Message deduplication")."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import aiormq
import pytest

from amqha.client import Publisher
from tests.durability import take_all
from tests.integration.protocol_support import scrape
from tests.integration.test_replication import replay
from tests.pairs import MakePair, client_vote, poll
from tests.support import ServerProcess, free_port, soak_size

DEDUP = "x-message-deduplication"


async def message_ids(url: str, queue: str) -> list[str]:
    """The message ids of everything left on ``queue``, taken as it is read."""
    return [m.header.properties.message_id or "" for m in await take_all(url, queue)]


async def _publish(channel: Any, exchange: Any, key: Any, routing_key: str, **headers) -> None:
    if key is not None:
        headers["x-deduplication-header"] = key
    message = aio_pika.Message(b"m", headers=headers or None, delivery_mode=2)
    await exchange.publish(message, routing_key=routing_key)  # confirmed, or it raises


async def _count(channel: Any, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    return declared.declaration_result.message_count


async def test_the_plugins_exchange_and_queue_drop_copies_and_confirm_them(
    broker: ServerProcess,
) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(
            "dedup-x", DEDUP, arguments={"x-cache-size": 10, "x-cache-ttl": 60_000}
        )
        queue = await channel.declare_queue("dedup-x-q", auto_delete=True)
        await queue.bind(exchange, "#")
        for _ in range(5):
            await _publish(channel, exchange, "deduplicate-this", "#")
        await _publish(channel, exchange, None, "#")
        await _publish(channel, exchange, None, "#")
        assert await _count(channel, "dedup-x-q") == 3

        await channel.declare_queue("dedup-q", arguments={DEDUP: True}, auto_delete=True)
        default = channel.default_exchange
        for key in ("k", "k", 42, 42, 4.2, 4.2):
            await _publish(channel, default, key, "dedup-q")
        assert await _count(channel, "dedup-q") == 3
        first = await (await channel.get_queue("dedup-q")).get(no_ack=False)
        await _publish(channel, default, "k", "dedup-q")  # delivered, not acked: a copy
        await first.ack()
        await _publish(channel, default, "k", "dedup-q")  # acked: in again
        assert await _count(channel, "dedup-q") == 3


@pytest.mark.parametrize(
    "declare, named",
    [
        (("exchange", "bad-x", DEDUP, {}), "x-cache-size"),
        (("exchange", "bad-x", DEDUP, {"x-cache-size": 0}), "x-cache-size"),
        (("exchange", "bad-x", DEDUP, {"x-cache-size": 5, "x-cache-ttl": -1}), "x-cache-ttl"),
        (("queue", "bad-q", None, {DEDUP: "yes"}), DEDUP),
        (("queue", "bad-q", None, {"x-deduplication-by": "message-id"}), "x-cache-size"),
    ],
)
async def test_a_bad_argument_is_refused_naming_it_and_nothing_is_made(
    broker: ServerProcess, declare: tuple, named: str
) -> None:
    what, name, kind, arguments = declare
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match=named):
            if what == "exchange":
                await channel.declare_exchange(name, kind, arguments=arguments)
            else:
                await channel.declare_queue(name, arguments=arguments)
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            if what == "exchange":
                await channel.declare_exchange(name, passive=True)
            else:
                await channel.declare_queue(name, passive=True)


async def test_a_durable_queues_message_id_cache_survives_a_restart(make_server: Any) -> None:
    server = make_server().start()
    arguments = {"x-deduplication-by": "message-id", "x-cache-size": 100}
    for round_ in range(2):
        connection = await aio_pika.connect(server.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue("by-id", durable=True, arguments=arguments)
            body = b"first" if round_ == 0 else b"again"
            for message_id in ("a", "b"):
                message = aio_pika.Message(body, message_id=message_id, delivery_mode=2)
                await channel.default_exchange.publish(message, routing_key="by-id")
            if round_ == 0:
                assert await _count(channel, "by-id") == 2
                for _ in range(2):  # consumed: the keys stay
                    await queue.get(no_ack=True)
            else:
                # The kill may bring the consumed ones back (their acks were not on disk
                # yet: redelivered, never lost); the copies sent again are never there.
                bodies = []
                while (got := await queue.get(no_ack=True, fail=False)) is not None:
                    bodies.append(got.body)
                assert b"again" not in bodies and len(bodies) <= 2
        if round_ == 0:
            server.kill()
            server.start()


@pytest.mark.soak
async def test_kills_of_the_active_leave_each_message_once(make_pair: MakePair) -> None:
    """Each round (4 in ``make test``, 20 in ``make soak``): 200 messages under a
    deduplicating Publisher, the ACTIVE killed with some unconfirmed, the killed server
    restarted; at the end the queue holds every message id exactly once."""
    kills = soak_size(4, 20)
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    urls = [pair.primary.url, pair.backup.url]

    async def setup(channel: aio_pika.abc.AbstractChannel) -> None:
        await channel.declare_queue("once", durable=True, arguments={DEDUP: True})

    sent: list[str] = []
    started = time.monotonic()
    async with Publisher(urls, setup=setup, max_pending=200, deduplicate=True) as publisher:
        for number in range(kills):
            active, _ = await pair.settled(timeout=60, interval=0.1)
            futures = []
            for index in range(200):
                message = aio_pika.Message(f"{number}-{index}".encode(), delivery_mode=2)
                futures.append(await publisher.send(message, routing_key="once"))
                sent.append(message.message_id or "")
                if index == 50:
                    await asyncio.wait_for(futures[0], 30)
            pair.kill(active)
            active.start(wait=False)
            await publisher.flush(60)
            assert all(f.done() and f.exception() is None for f in futures)
        resent = publisher.resent
    active, _ = await pair.settled(timeout=60, interval=0.1)
    # A restarted server a client voted ACTIVE before it heard its peer (a dual active) set
    # aside what it confirmed alone: replayed as an operator would, through the same check.
    for path in pair.quarantine_files():
        await asyncio.to_thread(replay, path, active.url)
    seen = await message_ids(active.url, "once")
    lost = set(sent) - set(seen)
    duplicates = len(seen) - len(set(seen))
    print(
        f"{kills} kills in {time.monotonic() - started:.1f} s: {len(sent)} confirmed, "
        f"{resent} sent again, {len(lost)} lost, {duplicates} duplicates"
    )
    assert not lost and duplicates == 0 and set(seen) <= set(sent)
    assert resent > 0  # the kills left confirms unsent: copies reached the new ACTIVE


def _passive_syncs(pair: Any, server: Any) -> list[dict[str, Any]]:
    return [e for e in pair.events(server) if e["event"] == "sync" and e.get("side") == "passive"]


@pytest.mark.soak
async def test_kills_of_the_active_right_after_a_catch_up_leave_each_message_once(
    make_pair: MakePair,
) -> None:
    """A backlog, a deduplicating Publisher that keeps sending; each round (1 in ``make
    test``, 3 in ``make soak``): kill -9 and restart the PASSIVE, and the moment its event
    log says in sync (the snapshot, then the changes since, applied), kill -9 the ACTIVE
    and restart it. Every message once."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    urls = [pair.primary.url, pair.backup.url]

    async def setup(channel: aio_pika.abc.AbstractChannel) -> None:
        await channel.declare_queue("caught-up", durable=True, arguments={DEDUP: True})

    sent: list[str] = []
    futures: list[asyncio.Future[None]] = []
    stop = asyncio.Event()

    async def keep_sending(publisher: Publisher) -> None:
        number = 0
        while not stop.is_set():
            message = aio_pika.Message(b"x" * 2000, delivery_mode=2)
            futures.append(await publisher.send(message, routing_key="caught-up"))
            sent.append(message.message_id or "")
            number += 1
            if number % 50 == 0:
                await asyncio.sleep(0.01)

    async with Publisher(urls, setup=setup, max_pending=200, deduplicate=True) as publisher:
        sending = asyncio.create_task(keep_sending(publisher))
        try:
            for _ in range(soak_size(1, 3)):
                active, passive = await pair.settled(timeout=60, interval=0.1)
                target = len(sent) + 2000  # a backlog for the snapshot to carry
                await poll(lambda: len(sent) >= target, 60, "a backlog sent")  # noqa: B023
                pair.kill(passive)
                seen = len(_passive_syncs(pair, passive))
                passive.start()
                await poll(
                    lambda: any(
                        e.get("sync") == "in_sync"
                        for e in _passive_syncs(pair, passive)[seen:]  # noqa: B023
                    ),
                    60,
                    "the restarted passive in sync",
                    interval=0.005,
                )
                pair.kill(active)
                await client_vote([passive], retry_for=30)
                await poll(lambda: pair.state(passive) == "ACTIVE", 60, "the takeover")  # noqa: B023
                active.start(wait=False)
        finally:
            stop.set()
            await asyncio.wait_for(sending, 60)
        await publisher.flush(60)
        assert all(f.done() and f.exception() is None for f in futures)
        resent = publisher.resent
    active, _ = await pair.settled(timeout=60, interval=0.1)
    for path in pair.quarantine_files():  # a dual active's: replayed through the check
        await asyncio.to_thread(replay, path, active.url)
    seen_ids = await message_ids(active.url, "caught-up")
    lost = set(sent) - set(seen_ids)
    duplicates = len(seen_ids) - len(set(seen_ids))
    print(f"{len(sent)} confirmed, {resent} sent again, {len(lost)} lost, {duplicates} duplicates")
    assert not lost and duplicates == 0


async def test_each_deduplicating_exchange_and_queue_has_its_figures(make_server: Any) -> None:
    """Keys held, copies dropped and keys evicted, per exchange and per queue, scraped."""
    port = free_port()
    server = make_server("deduped", metrics={"listen": f"127.0.0.1:{port}"}).start()
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange("dx", DEDUP, arguments={"x-cache-size": 2})
        bound = await channel.declare_queue("dx-q", auto_delete=True)
        await bound.bind(exchange, "")
        for key in ("a", "a", "b", "c", "c"):  # 2 copies dropped, "a" evicted by "c"
            await _publish(channel, exchange, key, "")
        await channel.declare_queue("dq", arguments={DEDUP: True}, auto_delete=True)
        for key in ("k", "k", "k", "l"):
            await _publish(channel, channel.default_exchange, key, "dq")
        figures = await asyncio.to_thread(scrape, port)
    exchange_labels = (("kind", "exchange"), ("name", "dx"), ("vhost", "/"))
    queue_labels = (("kind", "queue"), ("name", "dq"), ("vhost", "/"))
    assert figures[("amqha_dedup_keys", exchange_labels)] == 2
    assert figures[("amqha_dedup_copies_dropped_total", exchange_labels)] == 2
    assert figures[("amqha_dedup_keys_evicted_total", exchange_labels)] == 1
    assert figures[("amqha_dedup_keys", queue_labels)] == 2
    assert figures[("amqha_dedup_copies_dropped_total", queue_labels)] == 2
