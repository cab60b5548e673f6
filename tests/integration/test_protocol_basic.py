"""Basic class: mandatory returns, consumers (no-ack, exclusive, tags, cancel, cancel
notification), get, ack/nack/reject/recover, and qos prefetch per consumer and per
channel. Mostly aiormq, which shows each method's reply as it is on the wire.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest
from aiormq import spec
from pamqp import commands, header

from tests.integration.protocol_support import RawClient, reply_code, unique, wait_until_async


@pytest.fixture
async def connection(broker):
    connection = await aiormq.connect(broker.url)
    yield connection
    await connection.close()


async def new_queue(channel, **arguments) -> str:
    return (await channel.queue_declare(exclusive=True, arguments=arguments or None)).queue


async def publish(channel, queue: str, *bodies: bytes) -> None:
    for body in bodies:
        await channel.basic_publish(body, routing_key=queue)


async def message_count(channel, queue: str) -> int:
    return (await channel.queue_declare(queue, passive=True)).message_count


class Inbox:
    """A consumer callback that keeps what it receives, unacknowledged."""

    def __init__(self) -> None:
        self.messages: list = []

    async def __call__(self, message) -> None:
        self.messages.append(message)

    @property
    def bodies(self) -> list[bytes]:
        return [m.body for m in self.messages]

    async def wait_for(self, count: int, timeout: float = 5.0) -> None:
        await wait_until_async(lambda: len(self.messages) >= count, timeout)


# -- publish: mandatory ---------------------------------------------------------------


def test_mandatory_unroutable_publish_is_returned_with_312_on_the_wire(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        properties = commands.Basic.Properties(message_id="m-1", headers={"h": "v"})
        raw.publish(
            1, "amq.direct", "nobody-home", b"bounce", properties=properties, mandatory=True
        )
        returned = raw.expect(commands.Basic.Return, 1)
        assert (returned.reply_code, returned.reply_text) == (312, "NO_ROUTE")
        assert (returned.exchange, returned.routing_key) == ("amq.direct", "nobody-home")
        content = raw.expect(header.ContentHeader, 1)
        assert content.properties.message_id == "m-1" and content.properties.headers == {"h": "v"}
        assert raw.read()[1].value == b"bounce"
        # Not mandatory: dropped without a word; the channel goes on.
        raw.publish(1, "amq.direct", "nobody-home", b"dropped")
        raw.call(1, commands.Queue.Declare(exclusive=True), commands.Queue.DeclareOk)


def test_mandatory_return_with_pika_confirms(broker) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError) as unroutable:
            channel.basic_publish("", unique("nobody"), b"lost", mandatory=True)
        (returned,) = unroutable.value.messages
        assert returned.method.reply_code == 312 and returned.body == b"lost"
        name = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", name, b"routed", mandatory=True)
        channel.basic_publish("", unique("nobody"), b"not mandatory")
        assert channel.queue_declare(name, passive=True).method.message_count == 1
    finally:
        connection.close()


async def test_mandatory_return_with_aio_pika(broker) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        with pytest.raises(aio_pika.exceptions.PublishError) as returned:
            await channel.default_exchange.publish(
                aio_pika.Message(b"lost", headers={"k": 1}), unique("nobody"), mandatory=True
            )
        assert returned.value.frame.reply_code == 312
        assert returned.value.message.body == b"lost"
        assert not channel.is_closed


# -- consumers --------------------------------------------------------------------------


async def test_no_ack_consumer_gets_everything_and_nothing_is_requeued(connection) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    await publish(channel, name, b"1", b"2", b"3")
    consumer_channel = await connection.channel()
    inbox = Inbox()
    await consumer_channel.basic_consume(name, inbox, no_ack=True)
    await inbox.wait_for(3)
    await consumer_channel.close()
    assert inbox.bodies == [b"1", b"2", b"3"]
    assert await message_count(channel, name) == 0


async def test_exclusive_consumer_excludes_others_with_403(broker, connection) -> None:
    channel = await connection.channel()
    name = unique("exclusive-consumer")
    await channel.queue_declare(name, auto_delete=True)
    await channel.basic_consume(name, Inbox(), exclusive=True)
    other = await connection.channel()
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as refused:
        await other.basic_consume(name, Inbox())
    assert reply_code(refused.value) == 403
    assert other.is_closed and not channel.is_closed

    shared = unique("shared-consumer")
    await channel.queue_declare(shared, auto_delete=True)
    await channel.basic_consume(shared, Inbox())
    late = await connection.channel()
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
        await late.basic_consume(shared, Inbox(), exclusive=True)


async def test_consumer_tag_chosen_by_the_client_is_used(connection) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    inbox = Inbox()
    mine = await channel.basic_consume(name, inbox, consumer_tag="my-tag")
    assert mine.consumer_tag == "my-tag"
    await publish(channel, name, b"x")
    await inbox.wait_for(1)
    assert inbox.messages[0].consumer_tag == "my-tag"


def test_server_chooses_tags_for_an_empty_one_and_refuses_a_reused_one_with_530(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        name = raw.call(1, commands.Queue.Declare(exclusive=True), commands.Queue.DeclareOk).queue
        tags = [
            raw.call(1, commands.Basic.Consume(queue=name), commands.Basic.ConsumeOk).consumer_tag
            for _ in range(2)
        ]
        assert all(tag.startswith("amq.ctag-") for tag in tags) and tags[0] != tags[1]
        raw.send(1, commands.Basic.Consume(queue=name, consumer_tag=tags[0]))
        close = raw.expect_connection_close(530)
        assert close.reply_text.startswith("NOT_ALLOWED")


async def test_cancel_stops_deliveries_and_unacked_can_still_be_acked(connection) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    inbox = Inbox()
    consume = await channel.basic_consume(name, inbox)
    await publish(channel, name, b"before")
    await inbox.wait_for(1)
    cancel_ok = await channel.basic_cancel(consume.consumer_tag)
    assert cancel_ok.consumer_tag == consume.consumer_tag
    await publish(channel, name, b"after")
    assert await message_count(channel, name) == 1
    await channel.basic_ack(inbox.messages[0].delivery_tag)
    assert await message_count(channel, name) == 1
    assert not channel.is_closed
    assert inbox.bodies == [b"before"]


async def test_deleting_the_queue_sends_basic_cancel_to_its_consumer(connection) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    cancelled: list = []
    channel.on_consumer_cancel_callbacks.add(cancelled.append)
    inbox = Inbox()
    consume = await channel.basic_consume(name, inbox)
    await publish(channel, name, b"held")
    await inbox.wait_for(1)
    deleter = await connection.channel()
    await deleter.queue_delete(name)
    await wait_until_async(lambda: cancelled, 5)
    assert isinstance(cancelled[0], spec.Basic.Cancel)
    assert cancelled[0].consumer_tag == consume.consumer_tag
    # A delivery from the deleted queue can still be acknowledged.
    await channel.basic_ack(inbox.messages[0].delivery_tag)
    await channel.basic_qos(prefetch_count=0)
    assert not channel.is_closed
    # The tag is free again on this channel.
    await channel.basic_consume(
        await new_queue(channel), Inbox(), consumer_tag=consume.consumer_tag
    )


async def test_consumers_share_a_queue_round_robin(connection) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    first, second = Inbox(), Inbox()
    await channel.basic_consume(name, first, no_ack=True)
    await channel.basic_consume(name, second, no_ack=True)
    await publish(channel, name, *(bytes([n]) for n in range(10)))
    await wait_until_async(lambda: len(first.messages) + len(second.messages) == 10, 5)
    assert len(first.messages) == len(second.messages) == 5
    assert sorted(first.bodies + second.bodies) == [bytes([n]) for n in range(10)]


# -- get, ack, nack, reject, recover ------------------------------------------------------


async def test_get_and_get_empty(connection) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    empty = await channel.basic_get(name)
    assert isinstance(empty.delivery, spec.Basic.GetEmpty)
    await publish(channel, name, b"a", b"b")
    first = await channel.basic_get(name, no_ack=True)
    second = await channel.basic_get(name)
    assert isinstance(first.delivery, spec.Basic.GetOk)
    assert (first.body, first.message_count, first.redelivered) == (b"a", 1, False)
    assert (second.body, second.message_count) == (b"b", 0)
    assert second.delivery_tag == first.delivery_tag + 1
    await channel.basic_ack(second.delivery_tag)
    assert isinstance((await channel.basic_get(name)).delivery, spec.Basic.GetEmpty)


async def get_all(channel, name: str, count: int) -> list:
    return [await channel.basic_get(name) for _ in range(count)]


async def test_ack_multiple_then_close_requeues_the_rest_as_redelivered(connection) -> None:
    setup = await connection.channel()
    name = await new_queue(setup)
    await publish(setup, name, b"1", b"2", b"3", b"4", b"5")
    channel = await connection.channel()
    got = await get_all(channel, name, 5)
    await channel.basic_ack(got[2].delivery_tag, multiple=True)
    await channel.basic_ack(got[4].delivery_tag)
    await channel.close()
    back = await setup.basic_get(name, no_ack=True)
    assert (back.body, back.redelivered) == (b"4", True)
    assert await message_count(setup, name) == 0


def test_unacked_messages_of_a_dropped_connection_come_back_redelivered(broker) -> None:
    name = unique("dropped")
    with RawClient(broker.port) as keeper:
        keeper.handshake()
        keeper.open_channel(1)
        keeper.call(
            1, commands.Queue.Declare(queue=name, auto_delete=False), commands.Queue.DeclareOk
        )
        keeper.publish(1, "", name, b"in flight")
        with RawClient(broker.port) as taker:
            taker.handshake()
            taker.open_channel(1)
            taker.send(1, commands.Basic.Get(queue=name))
            taker.expect(commands.Basic.GetOk, 1)
        # The socket is gone without Connection.Close: the delivery goes back.
        for _ in range(100):
            ok = keeper.call(
                1,
                commands.Basic.Get(queue=name, no_ack=True),
                commands.Basic.GetOk | commands.Basic.GetEmpty,
            )
            if isinstance(ok, commands.Basic.GetOk):
                break
            time.sleep(0.02)
        assert isinstance(ok, commands.Basic.GetOk) and ok.redelivered
        keeper.expect(header.ContentHeader, 1)
        assert keeper.read()[1].value == b"in flight"
        keeper.call(1, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)


async def test_nack_multiple_requeues_in_order_marked_redelivered(connection) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    await publish(channel, name, b"1", b"2", b"3")
    got = await get_all(channel, name, 3)
    await channel.basic_nack(got[1].delivery_tag, multiple=True, requeue=True)
    again = await get_all(channel, name, 2)
    assert [(m.body, m.redelivered) for m in again] == [(b"1", True), (b"2", True)]
    await channel.basic_nack(0, multiple=True, requeue=False)
    assert await message_count(channel, name) == 0


async def test_reject_with_and_without_requeue(connection) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    await publish(channel, name, b"keep", b"drop")
    keep, drop = await get_all(channel, name, 2)
    await channel.basic_reject(drop.delivery_tag, requeue=False)
    await channel.basic_reject(keep.delivery_tag, requeue=True)
    again = await channel.basic_get(name, no_ack=True)
    assert (again.body, again.redelivered) == (b"keep", True)
    assert await message_count(channel, name) == 0


async def test_ack_multiple_zero_settles_everything(connection) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    await publish(channel, name, b"1", b"2", b"3")
    await get_all(channel, name, 3)
    await channel.basic_ack(0, multiple=True)
    await channel.close()
    probe = await connection.channel()
    assert await message_count(probe, name) == 0


async def test_ack_multiple_zero_with_nothing_outstanding_settles_nothing(connection) -> None:
    """'Ack all' on a channel with no delivery unacked is legal: it used to raise
    IndexError in the broker and reset the connection."""
    channel = await connection.channel()
    name = await new_queue(channel)
    await publish(channel, name, b"kept")
    await channel.basic_ack(0, multiple=True)
    assert await message_count(channel, name) == 1
    assert not connection.is_closed


@pytest.mark.parametrize("how", ["unknown", "twice"])
async def test_acking_an_unknown_delivery_tag_is_406(connection, how) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    await publish(channel, name, b"x")
    message = await channel.basic_get(name)
    tag = message.delivery_tag + 100 if how == "unknown" else message.delivery_tag
    if how == "twice":
        await channel.basic_ack(tag)
    await channel.basic_ack(tag)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as failed:
        await channel.queue_declare(name, passive=True)
    assert reply_code(failed.value) == 406
    assert not connection.is_closed


async def test_acks_in_any_order_over_a_long_run_settle_exactly_their_own(connection) -> None:
    """The channel keeps its unacked tags in delivery order, read from a moving head and
    cut behind it once thousands are taken: acks out of order, a multiple ack over
    some already acked, a reject in the middle and a recover settle exactly what they
    name, past several cuts."""
    total = 10_000
    channel = await connection.channel()
    name = await new_queue(channel)
    for at in range(total):
        await channel.basic_publish(str(at).encode(), routing_key=name)
    inbox = Inbox()
    await channel.basic_consume(name, inbox)
    await inbox.wait_for(total, timeout=60.0)
    tags = [m.delivery_tag for m in inbox.messages]
    assert [m.body for m in inbox.messages] == [str(at).encode() for at in range(total)]
    # Odd positions of the first 6,000 first (the head cannot move), then the even ones.
    for at in [*range(1, 6000, 2), *range(0, 6000, 2)]:
        await channel.basic_ack(tags[at])
    await channel.basic_ack(tags[7999], multiple=True)  # 6,000-7,999; the rest stay
    await channel.basic_reject(tags[8500], requeue=False)
    await channel.basic_ack(tags[8001])
    recover_ok = await channel.basic_recover(requeue=True)
    assert isinstance(recover_ok, spec.Basic.RecoverOk)
    expected = [str(at).encode() for at in range(8000, total) if at not in (8001, 8500)]
    await inbox.wait_for(total + len(expected), timeout=60.0)
    again = inbox.messages[total:]
    assert [m.body for m in again] == expected and all(m.redelivered for m in again)
    await channel.basic_ack(again[-1].delivery_tag, multiple=True)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
        await channel.basic_ack(tags[0])
        await channel.queue_declare(name, passive=True)
    probe = await connection.channel()
    assert await message_count(probe, name) == 0


async def test_recover_redelivers_unacked_messages(connection) -> None:
    channel = await connection.channel()
    name = await new_queue(channel)
    inbox = Inbox()
    await channel.basic_consume(name, inbox)
    await publish(channel, name, b"1", b"2")
    await inbox.wait_for(2)
    await channel.basic_ack(inbox.messages[0].delivery_tag)
    recover_ok = await channel.basic_recover(requeue=True)
    assert isinstance(recover_ok, spec.Basic.RecoverOk)
    await inbox.wait_for(3)
    again = inbox.messages[2]
    assert (again.body, again.redelivered) == (b"2", True)
    assert again.delivery_tag > inbox.messages[1].delivery_tag


# -- qos ---------------------------------------------------------------------------------


class PrefetchWatch(Inbox):
    """Acks in delivery order, one at a time, and records the most deliveries that were
    ever unacknowledged at once, per consumer and in all."""

    def __init__(self) -> None:
        super().__init__()
        self.acked = 0
        self.most = 0
        self.unacked_by_tag: dict[str, int] = {}
        self.most_by_tag: dict[str, int] = {}

    async def __call__(self, message) -> None:
        self.messages.append(message)
        tag = message.consumer_tag
        self.unacked_by_tag[tag] = self.unacked_by_tag.get(tag, 0) + 1
        self.most_by_tag[tag] = max(self.most_by_tag.get(tag, 0), self.unacked_by_tag[tag])
        self.most = max(self.most, len(self.messages) - self.acked)

    async def ack_all_one_by_one(self, channel, total: int) -> None:
        async with asyncio.timeout(20):
            while self.acked < total:
                await self.wait_for(self.acked + 1)
                message = self.messages[self.acked]
                self.acked += 1
                self.unacked_by_tag[message.consumer_tag] -= 1
                await channel.basic_ack(message.delivery_tag)


async def test_per_consumer_prefetch_limits_unacked_deliveries(connection) -> None:
    setup = await connection.channel()
    name = await new_queue(setup)
    await publish(setup, name, *(bytes([n]) for n in range(20)))
    channel = await connection.channel()
    await channel.basic_qos(prefetch_count=3)
    watch = PrefetchWatch()
    await channel.basic_consume(name, watch)
    assert await message_count(setup, name) == 17
    await watch.ack_all_one_by_one(channel, 20)
    assert watch.most == 3
    assert watch.bodies == [bytes([n]) for n in range(20)]
    assert await message_count(setup, name) == 0


async def test_per_consumer_prefetch_applies_to_later_consumers_only(connection) -> None:
    setup = await connection.channel()
    first_queue, second_queue = await new_queue(setup), await new_queue(setup)
    await publish(setup, first_queue, *[b"a"] * 10)
    await publish(setup, second_queue, *[b"b"] * 10)
    channel = await connection.channel()
    await channel.basic_qos(prefetch_count=2)
    await channel.basic_consume(first_queue, Inbox())
    await channel.basic_qos(prefetch_count=5)
    await channel.basic_consume(second_queue, Inbox())
    assert await message_count(setup, first_queue) == 8
    assert await message_count(setup, second_queue) == 5


async def test_global_prefetch_limits_the_whole_channel(connection) -> None:
    setup = await connection.channel()
    queues = [await new_queue(setup) for _ in range(2)]
    for name in queues:
        await publish(setup, name, *[b"m"] * 10)
    channel = await connection.channel()
    await channel.basic_qos(prefetch_count=3, global_=False)
    await channel.basic_qos(prefetch_count=4, global_=True)
    watch = PrefetchWatch()
    for name in queues:
        await channel.basic_consume(name, watch)
    delivered = [10 - await message_count(setup, name) for name in queues]
    assert sum(delivered) == 4 and max(delivered) == 3
    await watch.ack_all_one_by_one(channel, 20)
    assert watch.most == 4
    assert max(watch.most_by_tag.values()) <= 3
    assert [await message_count(setup, name) for name in queues] == [0, 0]


async def test_prefetch_size_is_not_implemented_540(connection) -> None:
    channel = await connection.channel()
    with pytest.raises(aiormq.exceptions.ConnectionNotImplemented) as refused:
        await channel.basic_qos(prefetch_size=1024, prefetch_count=1)
    assert reply_code(refused.value) == 540


async def test_closing_a_consumer_channel_requeues_to_another_consumer(connection) -> None:
    setup = await connection.channel()
    name = await new_queue(setup)
    first = await connection.channel()
    await first.basic_qos(prefetch_count=1)
    first_inbox = Inbox()
    await first.basic_consume(name, first_inbox)
    await publish(setup, name, b"handed over")
    await first_inbox.wait_for(1)
    second = await connection.channel()
    second_inbox = Inbox()
    await second.basic_consume(name, second_inbox)
    await first.close()
    await second_inbox.wait_for(1)
    message = second_inbox.messages[0]
    assert (message.body, message.redelivered) == (b"handed over", True)


def _deliveries_before(
    raw: RawClient, channel: int, reply: type | None, count: int = 0
) -> tuple[list[int], Any]:
    """The delivery tags the server sends on ``channel`` until ``reply`` (returned with
    it), or until ``count`` deliveries when ``reply`` is None."""
    tags: list[int] = []
    for _ in range(1000):
        if reply is None and len(tags) >= count:
            return tags, None
        number, frame = raw.read()
        if number != channel:
            continue
        if isinstance(frame, commands.Basic.Deliver):
            tags.append(frame.delivery_tag)
        elif reply is not None and isinstance(frame, reply):
            return tags, frame
    raise AssertionError("the frames awaited never came, in 1000 frames")


def test_acks_in_one_read_make_room_for_as_many_after_it_and_a_cancel_behind_them_takes_none(
    broker,
) -> None:
    """A channel's consumers are woken once after a read's acks, not after each ack: a
    passive declare sent with two acks is answered before the two deliveries they make
    room for; acks followed by Basic.Cancel in the same write bring no delivery (the
    cancel is handled first), and those messages stay ready in the queue."""
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        name = raw.call(1, commands.Queue.Declare(exclusive=True), commands.Queue.DeclareOk).queue
        for n in range(6):
            raw.publish(1, "", name, b"%d" % n)
        raw.call(1, commands.Basic.Qos(prefetch_count=2), commands.Basic.QosOk)
        raw.send(1, commands.Basic.Consume(queue=name, consumer_tag="c"))
        assert _deliveries_before(raw, 1, None, 2)[0] == [1, 2]
        count = commands.Queue.Declare(queue=name, passive=True)
        raw.send(1, commands.Basic.Ack(1), commands.Basic.Ack(2), count)
        tags, declared = _deliveries_before(raw, 1, commands.Queue.DeclareOk)
        assert (tags, declared.message_count) == ([], 4)
        assert _deliveries_before(raw, 1, None, 2)[0] == [3, 4]
        raw.send(1, commands.Basic.Ack(3), commands.Basic.Ack(4), commands.Basic.Cancel("c"))
        assert _deliveries_before(raw, 1, commands.Basic.CancelOk)[0] == []
        assert raw.call(1, count, commands.Queue.DeclareOk).message_count == 2
