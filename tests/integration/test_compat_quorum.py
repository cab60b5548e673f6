"""Quorum queues with real clients (aio-pika, aiormq and pika) against real servers: the
declare rules of RabbitMQ 3.10, ``x-delivery-count`` and ``x-delivery-limit``, and the
count kept through a kill -9 (the store) and a failover (the PASSIVE), with every
confirmed message accounted for (docs/compat.md, "Quorum queues"). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest

from tests.durability import PERSISTENT
from tests.integration.protocol_support import unique
from tests.pairs import MakePair, client_vote
from tests.support import ServerProcess

WAIT = 10.0
QUORUM = {"x-queue-type": "quorum"}


def delivery_count(message: aio_pika.abc.AbstractIncomingMessage) -> Any:
    return (message.headers or {}).get("x-delivery-count")


async def test_aio_pika_delivery_limit_one_delivers_twice_then_dead_letters(
    broker: ServerProcess,
) -> None:
    name, dead = unique("limited"), unique("dead")
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(unique("dlx"), "direct", auto_delete=True)
        dead_queue = await channel.declare_queue(dead, auto_delete=True)
        await dead_queue.bind(exchange, routing_key="gave-up")
        queue = await channel.declare_queue(
            name,
            durable=True,
            arguments={
                **QUORUM,
                "x-delivery-limit": 1,
                "x-dead-letter-exchange": exchange.name,
                "x-dead-letter-routing-key": "gave-up",
            },
        )
        await channel.default_exchange.publish(
            aio_pika.Message(b"job", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=name,
        )
        seen: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(seen.put)
        first = await asyncio.wait_for(seen.get(), WAIT)
        assert (delivery_count(first), first.redelivered) == (None, False)
        await first.nack(requeue=True)
        second = await asyncio.wait_for(seen.get(), WAIT)
        assert (delivery_count(second), second.redelivered) == (1, True)
        await second.nack(requeue=True)
        # Returned twice: over the limit, so dead-lettered, never delivered a third time.
        gone = await dead_queue.get(timeout=WAIT, fail=False)
        for _ in range(100):
            if gone is not None:
                break
            await asyncio.sleep(0.05)
            gone = await dead_queue.get(timeout=WAIT, fail=False)
        assert gone is not None and gone.body == b"job"
        death = gone.headers["x-death"][0]  # type: ignore[index]
        assert (death["reason"], death["queue"]) == ("delivery_limit", name)  # type: ignore[index]
        assert gone.headers["x-first-death-reason"] == "delivery_limit"
        assert seen.empty()
        declared = await channel.declare_queue(name, passive=True)
        assert declared.declaration_result.message_count == 0
        await queue.delete(if_unused=False)


def test_pika_counts_returns_from_get_reject_and_a_closed_channel(broker: ServerProcess) -> None:
    """Basic.Get shows 0 on a first delivery (RabbitMQ 3.10); each return counts, a closed
    channel's return too; without a limit nothing is dropped."""
    name = unique("counted")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(name, durable=True, arguments=dict(QUORUM))
        channel.basic_publish("", name, b"m", pika.BasicProperties(delivery_mode=2))
        counts = []
        for _ in range(3):
            method, properties, _ = channel.basic_get(name, auto_ack=False)
            counts.append(((properties.headers or {}).get("x-delivery-count"), method.redelivered))
            channel.basic_reject(method.delivery_tag, requeue=True)
        other = connection.channel()
        method, _, _ = other.basic_get(name, auto_ack=False)
        other.close()  # the unacked message goes back: a fourth return
        method, properties, body = channel.basic_get(name, auto_ack=True)
        counts.append(((properties.headers or {}).get("x-delivery-count"), method.redelivered))
        assert counts == [(0, False), (1, True), (2, True), (4, True)]
        assert body == b"m"
        channel.queue_delete(name)
    finally:
        connection.close()


def test_pika_limit_zero_without_a_dead_letter_exchange_drops_at_the_first_return(
    broker: ServerProcess,
) -> None:
    name = unique("once")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(name, durable=True, arguments={**QUORUM, "x-delivery-limit": 0})
        channel.basic_publish("", name, b"m", pika.BasicProperties(delivery_mode=2))
        method, _, _ = channel.basic_get(name, auto_ack=False)
        channel.basic_nack(method.delivery_tag, requeue=True)
        assert channel.queue_declare(name, passive=True).method.message_count == 0
        channel.queue_delete(name)
    finally:
        connection.close()


def declare_error(broker: ServerProcess, name: str, **declare: Any) -> tuple[int, str]:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.queue_declare(name, **declare)
        return caught.value.reply_code, caught.value.reply_text
    finally:
        if connection.is_open:
            connection.close()


@pytest.mark.parametrize(
    ("declare", "text"),
    [
        ({"durable": True, "arguments": {**QUORUM, "x-max-priority": 5}}, "'x-max-priority'"),
        ({"durable": True, "arguments": {**QUORUM, "x-queue-mode": "lazy"}}, "'x-queue-mode'"),
        ({"durable": True, "arguments": {**QUORUM, "x-max-age": "1D"}}, "'x-max-age'"),
        ({"durable": True, "exclusive": True, "arguments": dict(QUORUM)}, "'exclusive-owner'"),
        ({"durable": True, "auto_delete": True, "arguments": dict(QUORUM)}, "'auto-delete'"),
        ({"durable": False, "arguments": dict(QUORUM)}, "'non-durable'"),
        ({"durable": True, "arguments": {"x-delivery-limit": 3}}, "rabbit_classic_queue"),
    ],
)
def test_pika_what_rabbitmq_refuses_for_a_quorum_queue_is_a_406(
    broker: ServerProcess, declare: dict[str, Any], text: str
) -> None:
    code, reply = declare_error(broker, unique("refused"), **declare)
    assert code == 406 and text in reply, reply


@pytest.mark.parametrize("redeclare", [{}, {"x-queue-type": "classic"}])
def test_pika_a_quorum_queue_redeclared_without_its_type_is_inequivalent(
    broker: ServerProcess, redeclare: dict[str, Any]
) -> None:
    name = unique("typed")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        connection.channel().queue_declare(name, durable=True, arguments=dict(QUORUM))
        code, reply = declare_error(broker, name, durable=True, arguments=redeclare)
        assert code == 406 and "inequivalent arg 'x-queue-type'" in reply, reply
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments=dict(QUORUM))  # as declared: fine
        channel.queue_delete(name)
    finally:
        connection.close()


async def test_the_count_survives_a_kill_9(make_server: Any) -> None:
    """The count is in the store: after a kill -9, the next delivery's header counts every
    delivery before it, the one held when the server died included."""
    server: ServerProcess = make_server("counted").start()
    connection = await aiormq.connect(server.url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.queue_declare("jobs", durable=True, arguments=dict(QUORUM))
    await channel.basic_publish(b"job", routing_key="jobs", properties=PERSISTENT)
    for _ in range(2):
        got = await channel.basic_get("jobs", no_ack=False)
        await channel.basic_reject(got.delivery_tag, requeue=True)
    held = await channel.basic_get("jobs", no_ack=False)  # the third delivery, never settled
    assert held.header.properties.headers["x-delivery-count"] == 2
    # A confirm after them: the store has written everything up to it, in order.
    await channel.basic_publish(b"marker", routing_key="jobs", properties=PERSISTENT)
    server.kill()
    server.start()
    connection = await aiormq.connect(server.url)
    try:
        channel = await connection.channel()
        first = await channel.basic_get("jobs", no_ack=True)
        second = await channel.basic_get("jobs", no_ack=True)
        assert (first.body, first.header.properties.headers["x-delivery-count"]) == (b"job", 3)
        assert first.redelivered
        assert (second.body, second.header.properties.headers["x-delivery-count"]) == (
            b"marker",
            0,
        )
    finally:
        await connection.close()


async def test_the_count_and_the_limit_follow_a_failover(make_pair: MakePair) -> None:
    """The count is replicated: the PASSIVE that takes over delivers with the count the
    old ACTIVE reached (plus the delivery its dead connection held), and dead-letters at
    the limit; no confirmed message is lost."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    connection = await aio_pika.connect(pair.primary.url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.declare_queue(
        "jobs",
        durable=True,
        arguments={**QUORUM, "x-delivery-limit": 3, "x-dead-letter-exchange": "amq.fanout"},
    )
    dead = await channel.declare_queue("dead", durable=True)
    await dead.bind("amq.fanout")
    confirmed = []
    for body in (b"a", b"b"):
        await channel.default_exchange.publish(
            aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key="jobs",
        )
        confirmed.append(body)
    queue = await channel.get_queue("jobs")
    for _ in range(2):
        got = await queue.get(timeout=WAIT)
        assert got.body == b"a"
        await got.nack(requeue=True)
    held = await queue.get(timeout=WAIT)  # a's third delivery, held when the ACTIVE dies
    assert (held.body, delivery_count(held)) == (b"a", 2)
    # A confirmed publish after them: the PASSIVE holds every change up to it.
    await channel.default_exchange.publish(
        aio_pika.Message(b"c", delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key="jobs"
    )
    confirmed.append(b"c")
    pair.kill(pair.primary)
    assert (await client_vote([pair.backup]))["name"] == "backup"
    await pair.wait_states(None, "ACTIVE")

    connection = await aio_pika.connect(pair.backup.url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue("jobs")
        got = await queue.get(timeout=WAIT)
        # Three deliveries before this one: two nacks and the one the failover returned.
        assert (got.body, delivery_count(got), got.redelivered) == (b"a", 3, True)
        await got.nack(requeue=True)  # a fourth return: over the limit of 3
        rest = []
        for _ in range(len(confirmed)):
            message = await queue.get(timeout=WAIT, fail=False)
            if message is None:
                break
            rest.append((message.body, delivery_count(message)))
            await message.ack()
        assert rest == [(b"b", 0), (b"c", 0)]
        dead_queue = await channel.get_queue("dead")
        gave_up = await dead_queue.get(timeout=WAIT)
        assert gave_up.body == b"a"
        assert gave_up.headers["x-death"][0]["reason"] == "delivery_limit"  # type: ignore[index]
        await gave_up.ack()
    # Every confirmed message accounted for: b and c consumed, a dead-lettered.
    assert sorted(confirmed) == sorted([b"a", *(body for body, _ in rest)])
