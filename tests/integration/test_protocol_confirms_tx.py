"""Publisher confirms (acks, nacks, returns before acks) and transactions (publishes
and acks held until commit, discarded by rollback), and the rules between the two modes.
"""

from __future__ import annotations

import asyncio

import aiormq
import pika
import pytest
from aiormq import spec
from pamqp import commands, header

from tests.integration.protocol_support import RawClient, reply_code, unique


@pytest.fixture
async def connection(broker):
    connection = await aiormq.connect(broker.url)
    yield connection
    await connection.close()


async def message_count(channel, queue: str) -> int:
    return (await channel.queue_declare(queue, passive=True)).message_count


def confirmed_tags(frames: list, kind: type) -> set[int]:
    """The publish sequence numbers a list of Basic.Ack or Basic.Nack frames settles."""
    covered: set[int] = set()
    low = 0
    for frame in frames:
        if isinstance(frame, kind):
            first = low + 1 if frame.multiple else frame.delivery_tag
            covered |= set(range(first, frame.delivery_tag + 1))
        if isinstance(frame, spec.Basic.Ack | spec.Basic.Nack):
            low = max(low, frame.delivery_tag)
    return covered


# -- confirms ------------------------------------------------------------------------------


def test_confirms_on_the_wire_ack_nack_and_return_before_ack(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        arguments = {"x-max-length": 1, "x-overflow": "reject-publish"}
        name = raw.call(
            1, commands.Queue.Declare(exclusive=True, arguments=arguments), commands.Queue.DeclareOk
        ).queue
        for body in (b"fits", b"refused", b"refused too"):
            raw.publish(1, "", name, body)
        raw.publish(1, "amq.direct", "nowhere", b"unroutable")
        raw.publish(1, "amq.direct", "nowhere", b"returned", mandatory=True)
        frames = []
        while not confirmed_tags(frames, spec.Basic.Ack) | confirmed_tags(
            frames, spec.Basic.Nack
        ) >= {1, 2, 3, 4, 5}:
            frames.append(raw.read()[1])
    assert confirmed_tags(frames, spec.Basic.Ack) == {1, 4, 5}
    assert confirmed_tags(frames, spec.Basic.Nack) == {2, 3}
    kinds = [type(f) for f in frames]
    returned = kinds.index(commands.Basic.Return)
    ack_of_5 = next(
        i for i, f in enumerate(frames) if isinstance(f, spec.Basic.Ack) and f.delivery_tag == 5
    )
    assert returned < ack_of_5
    assert isinstance(frames[returned + 1], header.ContentHeader)


async def test_many_concurrent_publishes_are_all_confirmed(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    name = (await channel.queue_declare(exclusive=True)).queue
    results = await asyncio.gather(
        *(channel.basic_publish(str(n).encode(), routing_key=name) for n in range(200))
    )
    assert all(isinstance(result, spec.Basic.Ack) for result in results)
    assert await message_count(channel, name) == 200


def test_confirms_with_pika(broker) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        name = channel.queue_declare("", exclusive=True).method.queue
        for n in range(20):
            channel.basic_publish("", name, str(n).encode())
        assert channel.queue_declare(name, passive=True).method.message_count == 20
    finally:
        connection.close()


async def test_confirm_and_tx_do_not_mix(connection) -> None:
    confirming = await connection.channel(publisher_confirms=True)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as failed:
        await confirming.tx_select()
    assert reply_code(failed.value) == 406
    transactional = await connection.channel(publisher_confirms=False)
    await transactional.tx_select()
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as failed:
        await transactional.confirm_delivery()
    assert reply_code(failed.value) == 406
    assert not connection.is_closed


# -- transactions ------------------------------------------------------------------------


async def test_tx_publishes_are_invisible_until_commit(connection) -> None:
    observer = await connection.channel()
    name = (await observer.queue_declare(exclusive=True)).queue
    channel = await connection.channel(publisher_confirms=False)
    assert isinstance(await channel.tx_select(), spec.Tx.SelectOk)
    await channel.basic_publish(b"one", routing_key=name)
    await channel.basic_publish(b"two", routing_key=name)
    assert await message_count(observer, name) == 0
    assert isinstance((await observer.basic_get(name)).delivery, spec.Basic.GetEmpty)
    assert isinstance(await channel.tx_commit(), spec.Tx.CommitOk)
    assert await message_count(observer, name) == 2
    # The channel stays transactional: the next publishes wait for the next commit.
    await channel.basic_publish(b"three", routing_key=name)
    assert await message_count(observer, name) == 2
    await channel.tx_commit()
    bodies = [(await observer.basic_get(name, no_ack=True)).body for _ in range(3)]
    assert bodies == [b"one", b"two", b"three"]


async def test_tx_rollback_discards_publishes(connection) -> None:
    observer = await connection.channel()
    name = (await observer.queue_declare(exclusive=True)).queue
    channel = await connection.channel(publisher_confirms=False)
    await channel.tx_select()
    await channel.basic_publish(b"discarded", routing_key=name)
    assert isinstance(await channel.tx_rollback(), spec.Tx.RollbackOk)
    await channel.tx_commit()
    assert await message_count(observer, name) == 0
    await channel.basic_publish(b"kept", routing_key=name)
    await channel.tx_commit()
    assert (await observer.basic_get(name, no_ack=True)).body == b"kept"


async def test_acks_inside_a_transaction(connection) -> None:
    observer = await connection.channel()
    name = (await observer.queue_declare(exclusive=True)).queue
    for body in (b"a", b"b", b"c"):
        await observer.basic_publish(body, routing_key=name)
    channel = await connection.channel(publisher_confirms=False)
    await channel.tx_select()
    a, b, c = [await channel.basic_get(name) for _ in range(3)]
    # Rolled back: the ack never happened, so the tag is still ours to ack.
    await channel.basic_ack(a.delivery_tag)
    await channel.tx_rollback()
    await channel.basic_ack(a.delivery_tag)
    await channel.basic_ack(b.delivery_tag)
    # Rejected with requeue: back on the queue only at commit.
    await channel.basic_reject(c.delivery_tag, requeue=True)
    assert await message_count(observer, name) == 0
    await channel.tx_commit()
    assert await message_count(observer, name) == 1
    await channel.close()
    again = await observer.basic_get(name, no_ack=True)
    assert (again.body, again.redelivered) == (b"c", True)
    assert await message_count(observer, name) == 0


async def test_ack_multiple_zero_with_nothing_outstanding_commits(connection) -> None:
    """The same 'ack all' inside a transaction is settled at Tx.Commit: it raised there."""
    channel = await connection.channel(publisher_confirms=False)
    name = (await channel.queue_declare(exclusive=True)).queue
    await channel.tx_select()
    await channel.basic_ack(0, multiple=True)
    await channel.basic_publish(b"committed", routing_key=name)
    await channel.tx_commit()
    assert (await channel.queue_declare(name, passive=True)).message_count == 1
    assert not connection.is_closed


async def test_rolled_back_acks_leave_messages_unacked_until_the_channel_closes(
    connection,
) -> None:
    observer = await connection.channel()
    name = (await observer.queue_declare(exclusive=True)).queue
    await observer.basic_publish(b"kept", routing_key=name)
    channel = await connection.channel(publisher_confirms=False)
    await channel.tx_select()
    message = await channel.basic_get(name)
    await channel.basic_ack(message.delivery_tag)
    await channel.tx_rollback()
    await channel.close()
    again = await observer.basic_get(name, no_ack=True)
    assert (again.body, again.redelivered) == (b"kept", True)


@pytest.mark.parametrize("method", ["tx_commit", "tx_rollback"])
async def test_commit_or_rollback_without_select_is_406(connection, method) -> None:
    channel = await connection.channel(publisher_confirms=False)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as failed:
        await getattr(channel, method)()
    assert reply_code(failed.value) == 406
    assert channel.is_closed and not connection.is_closed


def test_transactions_with_pika(broker) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    try:
        channel = connection.channel()
        observer = connection.channel()
        name = unique("pika-tx")
        channel.queue_declare(name, auto_delete=True)
        channel.tx_select()
        channel.basic_publish("", name, b"rolled back")
        channel.tx_rollback()
        channel.basic_publish("", name, b"committed")
        assert observer.queue_declare(name, passive=True).method.message_count == 0
        channel.tx_commit()
        _, _, body = observer.basic_get(name, auto_ack=True)
        assert body == b"committed"
        assert observer.queue_declare(name, passive=True).method.message_count == 0
    finally:
        connection.close()
