"""RabbitMQ extensions in everyday use, each with two real clients: alternate exchanges and
direct reply-to (``amq.rabbitmq.reply-to``). Neither opens a way into the control plane."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest

from tests.integration.protocol_support import reply_code, unique
from tests.support import ServerProcess, wait_until

# -- alternate exchanges ----------------------------------------------------------------


async def test_aio_pika_unroutable_goes_to_the_alternate_and_is_not_returned(
    broker: ServerProcess,
) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        spare = await channel.declare_exchange(unique("spare"), "fanout", auto_delete=True)
        orders = await channel.declare_exchange(
            unique("orders"),
            "direct",
            auto_delete=True,
            arguments={"alternate-exchange": spare.name},
        )
        leftovers = await channel.declare_queue(exclusive=True)
        await leftovers.bind(spare)
        returned: list[aio_pika.abc.AbstractIncomingMessage] = []
        channel.return_callbacks.add(lambda _channel, message: returned.append(message))
        await orders.publish(aio_pika.Message(b"nobody"), routing_key="no-such-key", mandatory=True)
        message = await leftovers.get(timeout=5)
        assert message.body == b"nobody" and message.routing_key == "no-such-key"
        assert message.exchange == orders.name
        assert returned == [], "a message its alternate routed is not returned"


def test_pika_alternate_exchange_missing_means_returned(broker: ServerProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        name = unique("with-missing-ae")
        channel.exchange_declare(
            name, "direct", auto_delete=True, arguments={"alternate-exchange": unique("absent")}
        )
        channel.queue_declare(queue := unique("bound"), exclusive=True)
        channel.queue_bind(queue, name, "k")
        with pytest.raises(pika.exceptions.UnroutableError):
            channel.basic_publish(name, "other", b"m", mandatory=True)
        spare = unique("spare")
        channel.exchange_declare(spare, "fanout", auto_delete=True)
        channel.queue_declare(leftovers := unique("leftovers"), exclusive=True)
        channel.queue_bind(leftovers, spare)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.exchange_declare(
                name, "direct", auto_delete=True, arguments={"alternate-exchange": spare}
            )
        assert caught.value.reply_code == 406 and "alternate-exchange" in caught.value.reply_text
    finally:
        connection.close()


@pytest.mark.parametrize("control", ["amq.peer", "amq.console"])
async def test_guest_cannot_reach_the_control_plane_through_an_alternate(
    broker: ServerProcess, control: str
) -> None:
    connection = await aiormq.connect(broker.url)
    try:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.AMQPError) as caught:
            await channel.exchange_declare(
                unique("sneaky"), exchange_type="fanout", arguments={"alternate-exchange": control}
            )
        assert reply_code(caught.value) == 403
        assert "control plane" in str(caught.value)
    finally:
        await connection.close()


# -- direct reply-to ------------------------------------------------------------------


def test_direct_reply_to_is_announced(broker: ServerProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        capabilities = connection._impl.server_capabilities
        assert capabilities.get("direct_reply_to") is True
    finally:
        connection.close()


async def test_aio_pika_rpc_over_direct_reply_to(broker: ServerProcess) -> None:
    server = await aio_pika.connect(broker.url)
    client = await aio_pika.connect(broker.url)
    async with server, client:
        server_channel = await server.channel()
        requests = await server_channel.declare_queue(unique("rpc"), exclusive=True)

        async def answer(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                assert message.reply_to and message.reply_to.startswith("amq.rabbitmq.reply-to.")
                await server_channel.default_exchange.publish(
                    aio_pika.Message(message.body.upper(), correlation_id=message.correlation_id),
                    routing_key=message.reply_to,
                )

        await requests.consume(answer)
        channel = await client.channel()
        replies = await channel.get_queue("amq.rabbitmq.reply-to", ensure=False)
        got: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await replies.consume(got.put, no_ack=True)
        for word in (b"ping", b"pong"):
            await channel.default_exchange.publish(
                aio_pika.Message(
                    word, reply_to="amq.rabbitmq.reply-to", correlation_id=word.decode()
                ),
                routing_key=requests.name,
            )
            reply = await asyncio.wait_for(got.get(), 5)
            assert reply.body == word.upper() and reply.correlation_id == word.decode()


def test_pika_direct_reply_to_rules(broker: ServerProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        # A request naming the pseudo-queue needs the reply consumer first (406).
        channel.queue_declare(requests := unique("rpc"), exclusive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.basic_publish(
                "", requests, b"q", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
            )
            channel.queue_declare(unique("sync"), exclusive=True)
        assert caught.value.reply_code == 406
        channel = connection.channel()
        # The reply consumer is no-ack only.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=False)
        assert caught.value.reply_code == 406
        channel = connection.channel()
        replies: list[bytes] = []
        channel.basic_consume(
            "amq.rabbitmq.reply-to", lambda _c, _m, _p, body: replies.append(body), auto_ack=True
        )
        channel.queue_declare(requests := unique("rpc"), exclusive=True)
        channel.basic_publish(
            "", requests, b"q", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
        )
        got = wait_until(
            lambda: channel.basic_get(requests, auto_ack=True)[0] is not None or None,
            what="the request",
        )
        del got
        responder = connection.channel()
        # The request was taken above; publish one more to read its reply_to.
        channel.basic_publish(
            "", requests, b"q2", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
        )
        method, properties, _ = wait_until(
            lambda: (result := channel.basic_get(requests, auto_ack=True))[0] and result,
            what="the second request",
        )
        address = properties.reply_to
        assert address.startswith("amq.rabbitmq.reply-to.")
        # The address exists for a passive declare while its consumer does.
        assert responder.queue_declare(address, passive=True).method.queue == address
        responder.basic_publish("", address, b"answer")
        wait_until(
            lambda: connection.process_data_events(time_limit=0.05) or replies,
            what="the reply",
        )
        assert replies == [b"answer"]
        channel.close()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            responder.queue_declare(address, passive=True)
        assert caught.value.reply_code == 404
    finally:
        connection.close()


async def test_guest_cannot_reach_the_control_plane_through_a_reply_address(
    broker: ServerProcess,
) -> None:
    connection = await aiormq.connect(broker.url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.basic_consume("amq.rabbitmq.reply-to", lambda _m: None, no_ack=True)
        for key in ("amq.rabbitmq.reply-to.amq.peer", "amq.rabbitmq.reply-to.amq.console"):
            with pytest.raises(aiormq.exceptions.PublishError) as caught:
                await channel.basic_publish(b"x", routing_key=key, mandatory=True)
            assert caught.value.message.delivery.reply_text == "NO_ROUTE"
        other = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await other.queue_declare("amq.rabbitmq.reply-to.amq.console", passive=True)
    finally:
        await connection.close()
