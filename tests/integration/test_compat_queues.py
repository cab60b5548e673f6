"""RabbitMQ's queue extensions with real clients (aio-pika and pika) against a real
broker: priority queues (``x-max-priority``), single active consumer
(``x-single-active-consumer``) and consumer priorities (``x-priority``).

The expected orders are the ones RabbitMQ 3.10 gives for the same steps (docs/compat.md).
Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest

from tests.integration.protocol_support import reply_code, unique
from tests.support import ServerProcess, wait_until

WAIT = 10.0


@pytest.fixture
def pika_connection(broker: ServerProcess) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        yield connection
    finally:
        if connection.is_open:
            connection.close()


def publish(channel: Any, queue: str, *items: tuple[str, int | None]) -> None:
    """Publish with pika (confirmed one by one on a channel in confirm mode)."""
    for body, priority in items:
        channel.basic_publish("", queue, body.encode(), pika.BasicProperties(priority=priority))


def get_all(channel: Any, queue: str) -> list[tuple[str, bool]]:
    found = []
    for _ in range(1000):
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return found
        found.append((body.decode(), method.redelivered))
    raise AssertionError(f"{queue} never emptied")


class Collector:
    """A pika consumer on its own connection, recording what it is given."""

    def __init__(
        self,
        url: str,
        queue: str,
        tag: str,
        log: list[tuple[str, str, bool]],
        priority: int | None = None,
        prefetch: int = 0,
        ack: bool = True,
    ) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.tag = tag
        self.log = log
        self.ack = ack
        self.held: list[int] = []
        if prefetch:
            self.channel.basic_qos(prefetch_count=prefetch)
        arguments = {"x-priority": priority} if priority is not None else None
        self.channel.basic_consume(queue, self._on, consumer_tag=tag, arguments=arguments)

    def _on(self, channel: Any, method: Any, _properties: Any, body: bytes) -> None:
        self.log.append((self.tag, body.decode(), method.redelivered))
        if self.ack:
            channel.basic_ack(method.delivery_tag)
        else:
            self.held.append(method.delivery_tag)

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()


def pump_until(collectors: list[Collector], log: list[Any], count: int) -> None:
    """Let every collector's connection run until ``log`` holds ``count`` deliveries."""
    deadline = time.monotonic() + WAIT
    while len(log) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} deliveries expected, got {log}")
        for collector in collectors:
            if collector.connection.is_open:
                collector.connection.process_data_events(0.01)


def pump_quietly(collectors: list[Collector], seconds: float = 0.3) -> None:
    """Run the connections a little longer: what should not arrive has its chance to."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for collector in collectors:
            if collector.connection.is_open:
                collector.connection.process_data_events(0.01)


# -- priority queues ---------------------------------------------------------------------


async def test_aio_pika_priority_order_and_requeue_within_a_priority(broker: ServerProcess) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(
            unique("prio"), auto_delete=True, arguments={"x-max-priority": 5}
        )
        for body, priority in [
            ("a", 1),
            ("b", 1),
            ("c", 1),
            ("x", 5),
            ("y", 5),
            ("none", None),
            ("over", 9),
        ]:
            await channel.default_exchange.publish(
                aio_pika.Message(body.encode(), priority=priority), routing_key=queue.name
            )
        taken = {}
        for _ in range(4):
            message = await queue.get(no_ack=False, timeout=WAIT)
            assert message is not None
            taken[message.body.decode()] = message
        # Above the maximum counts as the maximum: "over" is among the priority 5 ones.
        assert list(taken) == ["x", "y", "over", "a"]
        for name in ("a", "over", "x"):  # returned in another order than delivered
            await taken[name].nack(requeue=True)
        await taken["y"].ack()
        found = []
        while (message := await queue.get(no_ack=True, fail=False, timeout=WAIT)) is not None:
            found.append((message.body.decode(), message.redelivered))
        assert found == [
            ("x", True),
            ("over", True),
            ("a", True),
            ("b", False),
            ("c", False),
            ("none", False),
        ]


def test_pika_priority_queue_requeues_on_channel_close_into_each_priority(
    broker: ServerProcess, pika_connection: pika.BlockingConnection
) -> None:
    channel = pika_connection.channel()
    channel.confirm_delivery()
    queue = unique("prio-close")
    # Not auto-delete: the queue outlives its only consumer's channel.
    channel.queue_declare(queue, arguments={"x-max-priority": 3})
    publish(channel, queue, ("l1", 0), ("l2", 0), ("h1", 3), ("h2", 3), ("m1", 1))
    log: list[tuple[str, str, bool]] = []
    holder = Collector(broker.url, queue, "holder", log, prefetch=3, ack=False)
    try:
        pump_until([holder], log, 3)
        assert [body for _, body, _ in log] == ["h1", "h2", "m1"]
        holder.channel.close()
        # Back in their priorities, ahead of nothing newer in theirs, marked redelivered.
        publish(channel, queue, ("h3", 3))
        assert get_all(channel, queue) == [
            ("h1", True),
            ("h2", True),
            ("h3", False),
            ("m1", True),
            ("l1", False),
            ("l2", False),
        ]
    finally:
        holder.close()
        channel.queue_delete(queue)


def test_pika_priority_queue_drop_head_ttl_and_dead_letters(
    pika_connection: pika.BlockingConnection,
) -> None:
    channel = pika_connection.channel()
    channel.confirm_delivery()
    dlx, dead, limited, timed = unique("dlx"), unique("dead"), unique("limited"), unique("timed")
    channel.exchange_declare(dlx, "fanout", auto_delete=True)
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(
        limited,
        auto_delete=True,
        arguments={"x-max-priority": 5, "x-max-length": 2, "x-dead-letter-exchange": dlx},
    )
    # As in RabbitMQ, drop-head drops the head: the oldest message of the highest priority.
    publish(channel, limited, ("a0", 0), ("b5", 5), ("c0", 0))
    assert get_all(channel, limited) == [("a0", False), ("c0", False)]
    channel.queue_declare(
        timed,
        auto_delete=True,
        arguments={"x-max-priority": 5, "x-message-ttl": 50, "x-dead-letter-exchange": dlx},
    )
    # One transaction: both arrive in the same instant, whatever the machine's load.
    tx = pika_connection.channel()
    tx.tx_select()
    publish(tx, timed, ("low", 0), ("high", 5))
    tx.tx_commit()
    # Both expire at the head, the highest priority first, and are dead-lettered in turn.
    found: list[tuple[str, bool]] = []
    wait_until(
        lambda: found.extend(get_all(channel, dead)) or len(found) >= 3,
        WAIT,
        what="three dead letters",
    )
    assert [body for body, _ in found] == ["b5", "high", "low"]
    assert channel.queue_declare(timed, passive=True).method.message_count == 0


@pytest.mark.parametrize("value", [256, -1, "5"])
def test_pika_x_max_priority_out_of_range_is_406(
    pika_connection: pika.BlockingConnection, value: Any
) -> None:
    channel = pika_connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        channel.queue_declare(unique("bad"), auto_delete=True, arguments={"x-max-priority": value})
    assert caught.value.reply_code == 406
    assert "x-max-priority" in caught.value.reply_text and "0 to 255" in caught.value.reply_text


async def test_aio_pika_x_max_priority_is_part_of_the_queue_identity(broker: ServerProcess) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        name = unique("ident")
        await channel.declare_queue(name, auto_delete=True, arguments={"x-max-priority": 3})
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed) as caught:
            await channel.declare_queue(name, auto_delete=True, arguments={"x-max-priority": 4})
        assert reply_code(caught.value) == 406 and "x-max-priority" in str(caught.value)
        channel = await connection.channel()
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await channel.declare_queue(
                unique("bad"), auto_delete=True, arguments={"x-max-priority": 1000}
            )


# -- single active consumer -----------------------------------------------------------------


async def test_aio_pika_single_active_consumer_hands_over_on_cancel(
    broker: ServerProcess,
) -> None:
    publisher = await aio_pika.connect(broker.url)
    first_connection = await aio_pika.connect(broker.url)
    second_connection = await aio_pika.connect(broker.url)
    async with publisher, first_connection, second_connection:
        channel = await publisher.channel(publisher_confirms=True)
        name = unique("sac")
        await channel.declare_queue(
            name, auto_delete=True, arguments={"x-single-active-consumer": True}
        )
        got: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

        async def consume(connection: aio_pika.abc.AbstractConnection, who: str) -> tuple:
            consumer_channel = await connection.channel()
            queue = await consumer_channel.get_queue(name, ensure=False)

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                await message.ack()
                await got.put((who, message.body.decode()))

            return queue, await queue.consume(on_message)

        first_queue, first_tag = await consume(first_connection, "first")
        await consume(second_connection, "second")
        declared = await channel.declare_queue(
            name, auto_delete=True, arguments={"x-single-active-consumer": True}
        )
        assert declared.declaration_result.consumer_count == 2
        for n in range(3):
            await channel.default_exchange.publish(aio_pika.Message(b"m%d" % n), name)
        assert [await asyncio.wait_for(got.get(), WAIT) for _ in range(3)] == [
            ("first", "m0"),
            ("first", "m1"),
            ("first", "m2"),
        ]
        await first_queue.cancel(first_tag)
        for n in range(3, 5):
            await channel.default_exchange.publish(aio_pika.Message(b"m%d" % n), name)
        assert [await asyncio.wait_for(got.get(), WAIT) for _ in range(2)] == [
            ("second", "m3"),
            ("second", "m4"),
        ]
        assert got.empty()


def test_pika_single_active_consumer_successor_gets_what_the_old_one_held_first(
    broker: ServerProcess, pika_connection: pika.BlockingConnection
) -> None:
    channel = pika_connection.channel()
    channel.confirm_delivery()
    queue = unique("sac-close")
    channel.queue_declare(queue, auto_delete=True, arguments={"x-single-active-consumer": True})
    log: list[tuple[str, str, bool]] = []
    active = Collector(broker.url, queue, "active", log, prefetch=1, ack=False)
    waiting = Collector(broker.url, queue, "waiting", log)
    try:
        publish(channel, queue, ("0", None), ("1", None), ("2", None))
        pump_until([active, waiting], log, 1)
        # The active consumer is blocked (prefetch 1): the waiting one still gets nothing.
        pump_quietly([active, waiting])
        assert log == [("active", "0", False)]
        active.close()
        pump_until([waiting], log, 4)
        assert log[1:] == [("waiting", "0", True), ("waiting", "1", False), ("waiting", "2", False)]
    finally:
        active.close()
        waiting.close()


def test_pika_single_active_consumer_next_is_the_highest_priority_then_the_earliest(
    broker: ServerProcess, pika_connection: pika.BlockingConnection
) -> None:
    channel = pika_connection.channel()
    channel.confirm_delivery()
    queue = unique("sac-prio")
    channel.queue_declare(queue, auto_delete=True, arguments={"x-single-active-consumer": True})
    log: list[tuple[str, str, bool]] = []
    consumers = {
        tag: Collector(broker.url, queue, tag, log, priority=priority)
        for tag, priority in (("A", 0), ("B", 0), ("C", 5), ("D", 5))
    }
    try:
        publish(channel, queue, ("0", None))
        pump_until(list(consumers.values()), log, 1)
        consumers["A"].channel.basic_cancel("A")
        publish(channel, queue, ("1", None))
        pump_until(list(consumers.values()), log, 2)
        consumers["C"].close()
        # A newcomer of a higher priority does not take over from the active consumer.
        consumers["E"] = Collector(broker.url, queue, "E", log, priority=100)
        publish(channel, queue, ("2", None))
        pump_until(list(consumers.values()), log, 3)
        assert [(tag, body) for tag, body, _ in log] == [("A", "0"), ("C", "1"), ("D", "2")]
    finally:
        for consumer in consumers.values():
            consumer.close()


async def test_aio_pika_exclusive_consumer_on_a_single_active_consumer_queue_is_403(
    broker: ServerProcess,
) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(
            unique("sac-excl"), auto_delete=True, arguments={"x-single-active-consumer": True}
        )

        async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            """Never called."""

        with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as caught:
            await queue.consume(ignore, exclusive=True)
        assert reply_code(caught.value) == 403 and "in exclusive use" in str(caught.value)
        channel = await connection.channel()
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed) as refused:
            await channel.declare_queue(
                unique("sac-bad"), auto_delete=True, arguments={"x-single-active-consumer": "yes"}
            )
        assert "x-single-active-consumer" in str(refused.value)


# -- consumer priorities ------------------------------------------------------------------------


def test_pika_a_blocked_higher_priority_consumer_lets_lower_ones_have_messages(
    broker: ServerProcess, pika_connection: pika.BlockingConnection
) -> None:
    channel = pika_connection.channel()
    channel.confirm_delivery()
    queue = unique("cprio")
    channel.queue_declare(queue, auto_delete=True)
    log: list[tuple[str, str, bool]] = []
    low = Collector(broker.url, queue, "low", log, priority=1, prefetch=100)
    high = Collector(broker.url, queue, "high", log, priority=10, prefetch=2, ack=False)
    plain = Collector(broker.url, queue, "plain", log, prefetch=100)
    collectors = [low, high, plain]
    try:
        publish(channel, queue, *((str(n), None) for n in range(6)))
        pump_until(collectors, log, 6)
        # high takes two and is blocked (prefetch 2); then low, above plain's 0.
        assert sorted((tag, body) for tag, body, _ in log) == [
            ("high", "0"),
            ("high", "1"),
            ("low", "2"),
            ("low", "3"),
            ("low", "4"),
            ("low", "5"),
        ]
        high.channel.basic_ack(high.held.pop(0))
        # A round trip on the same channel: the ack is in before anything is published.
        high.channel.basic_qos(prefetch_count=2)
        publish(channel, queue, *((str(n), None) for n in range(6, 9)))
        pump_until(collectors, log, 9)
        assert sorted((tag, body) for tag, body, _ in log[6:]) == [
            ("high", "6"),
            ("low", "7"),
            ("low", "8"),
        ]
    finally:
        for collector in collectors:
            collector.close()


async def test_aio_pika_the_highest_priority_consumers_share_round_robin(
    broker: ServerProcess,
) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(unique("cprio-rr"), auto_delete=True)
        got: list[tuple[str, str]] = []

        def record(who: str) -> Any:
            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                got.append((who, message.body.decode()))

            return on_message

        for who, priority in (("zero", None), ("a", 5), ("b", 5), ("minus", -1)):
            consumer_channel = await connection.channel()
            consumer_queue = await consumer_channel.get_queue(queue.name, ensure=False)
            arguments = {"x-priority": priority} if priority is not None else None
            await consumer_queue.consume(record(who), no_ack=True, arguments=arguments)
        for n in range(6):
            await channel.default_exchange.publish(aio_pika.Message(b"%d" % n), queue.name)
        deadline = asyncio.get_running_loop().time() + WAIT
        while len(got) < 6 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert sorted(got) == [
            ("a", "0"),
            ("a", "2"),
            ("a", "4"),
            ("b", "1"),
            ("b", "3"),
            ("b", "5"),
        ]

        bad_channel = await connection.channel()
        bad_queue = await bad_channel.get_queue(queue.name, ensure=False)
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed) as caught:
            await bad_queue.consume(record("bad"), arguments={"x-priority": "high"})
        assert reply_code(caught.value) == 406 and "x-priority" in str(caught.value)
