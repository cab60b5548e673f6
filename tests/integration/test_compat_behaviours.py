"""Behaviours RabbitMQ users' clients depend on, each seen with real clients.

Connection.UpdateSecret, publisher confirms before Channel.CloseOk, the socket kept open
after Connection.CloseOk until the client closes it, channels closed or abandoned released
on both sides, idempotent deletes and unbinds, x-death as RabbitMQ writes it, Basic.Recover with
requeue=false, x-queue-type.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import weakref

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest
from pamqp import body, commands, frame, header

from tests.integration.protocol_support import RawClient, scrape, unique
from tests.support import ServerProcess, free_port, wait_until

# -- Connection.UpdateSecret --------------------------------------------------------------


async def test_aiormq_updates_its_secret_and_keeps_working(broker: ServerProcess) -> None:
    connection = await aiormq.connect(broker.url)
    try:
        reply = await connection.update_secret("refreshed-token", reason="token renewal")
        assert isinstance(reply, commands.Connection.UpdateSecretOk)
        channel = await connection.channel()
        declared = await channel.queue_declare(exclusive=True)
        assert declared.queue.startswith("amq.gen-")
    finally:
        await connection.close()


def test_pika_updates_its_secret_and_keeps_working(broker: ServerProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        connection.update_secret("new_secret", "reason")
        channel = connection.channel()
        assert channel.queue_declare("", exclusive=True).method.queue
    finally:
        connection.close()


def test_an_empty_secret_is_refused_with_530(broker: ServerProcess) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.send(0, commands.Connection.UpdateSecret(new_secret="", reason="empty"))
        close = raw.expect_connection_close(530)
        assert "refused" in close.reply_text


def test_update_secret_before_open_is_a_command_invalid(broker: ServerProcess) -> None:
    with RawClient(broker.port) as raw:
        raw.start()
        raw.start_ok()
        raw.expect(commands.Connection.Tune, 0)
        raw.send(0, commands.Connection.UpdateSecret(new_secret="x", reason="early"))
        raw.expect_connection_close(503)


# -- frame order at channel close ---------------------------------------------------------


def test_confirms_owed_on_a_channel_come_before_its_close_ok(broker: ServerProcess) -> None:
    queue = unique("confirm-order")
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.call(1, commands.Queue.Declare(queue=queue, exclusive=True), commands.Queue.DeclareOk)
        raw.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        # Publishes and the close in one write: the broker reads them in one turn.
        frames = b""
        for _ in range(20):
            frames += raw_publish_bytes(1, queue)
        raw.send_raw(frames + frame.marshal(commands.Channel.Close(200, "bye", 0, 0), 1))
        seen = []
        while True:
            _, value = raw.read()
            seen.append(value)
            if isinstance(value, commands.Channel.CloseOk):
                break
        acks = [value for value in seen if isinstance(value, commands.Basic.Ack)]
        assert acks and acks[-1].delivery_tag == 20
        assert all(not isinstance(v, commands.Basic.Ack) for v in seen[seen.index(acks[-1]) + 1 :])
        # Nothing follows the CloseOk on that channel.
        raw.send(0, commands.Connection.Close(200, "done", 0, 0))
        _, after = raw.read()
        assert isinstance(after, commands.Connection.CloseOk), after


def raw_publish_bytes(channel: int, routing_key: str) -> bytes:
    return b"".join(
        frame.marshal(item, channel)
        for item in (
            commands.Basic.Publish(exchange="", routing_key=routing_key),
            header.ContentHeader(0, 3, commands.Basic.Properties()),
            body.ContentBody(b"abc"),
        )
    )


# -- connection close: the socket stays until the client closes it ------------------------


def test_after_close_ok_late_frames_are_dropped_and_the_socket_stays(
    broker: ServerProcess,
) -> None:
    queue = unique("late-frames")
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
        raw.send(0, commands.Connection.Close(200, "bye", 0, 0))
        raw.expect(commands.Connection.CloseOk, 0)
        # A client still flushing its publishes: the server reads and drops them.
        for _ in range(200):
            raw.send_raw(raw_publish_bytes(1, queue))
        raw.sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            data = raw.sock.recv(1)
            raise AssertionError(f"the server closed or answered after Close-Ok: {data!r}")
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        ok = raw.call(
            1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk
        )
        assert ok.message_count == 0, "a frame sent after Connection.Close was acted on"
        raw.call(1, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)


def test_a_client_that_never_closes_after_close_ok_is_closed_by_the_server(
    broker: ServerProcess,
) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.send(0, commands.Connection.Close(200, "bye", 0, 0))
        raw.expect(commands.Connection.CloseOk, 0)
        assert raw.wait_closed(timeout=15) == []


# -- channels released on both sides -------------------------------------------------------


async def test_channels_closed_or_abandoned_are_released_on_both_sides(make_server) -> None:
    """aio-pika's own leak test, with the server's side counted too: channels closed one by
    one and channels left to the connection's close are gone from the server, and nothing
    the server sent or owes keeps the client's channel objects alive once the client has
    run its own close callbacks (which it schedules as tasks after Connection.close
    returns: aio-pika's test, which collects at once, races them; see docs/compat.md)."""
    metrics_port = free_port()
    server = make_server("released", metrics={"listen": f"127.0.0.1:{metrics_port}"})
    server.start()
    channels: weakref.WeakSet[aio_pika.abc.AbstractChannel] = weakref.WeakSet()
    connection = await aio_pika.connect(server.url)
    async with connection:
        for _ in range(5):
            channels.add(await connection.channel())
        for _ in range(3):
            async with connection.channel() as channel:
                channels.add(channel)
        busy = await connection.channel()  # abandoned with a consumer and an unacked delivery
        channels.add(busy)
        queue = await busy.declare_queue(unique("released"), auto_delete=True)
        await busy.default_exchange.publish(aio_pika.Message(b"held"), routing_key=queue.name)
        held: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(held.put)
        await asyncio.wait_for(held.get(), 5)
        del busy, queue, held, channel
        figures = await asyncio.to_thread(scrape, metrics_port)
        assert figures[("rabbitmq_channels", ())] == 6, "the three closed channels are gone"
    after = await asyncio.to_thread(
        wait_until,
        lambda: (f := scrape(metrics_port))[("rabbitmq_connections", ())] == 0 and f,
        10,
        0.05,
        "the connection gone from the server",
    )
    assert after[("rabbitmq_channels", ())] == 0
    assert after[("rabbitmq_queues", ())] == 0, "the abandoned consumer's auto-delete queue"
    for _ in range(100):  # loop turns for the client's close callbacks, no clock
        gc.collect()
        if not channels:
            break
        await asyncio.sleep(0)
    assert not list(channels)


# -- deletes of what does not exist -------------------------------------------------------


async def test_aiormq_deletes_of_missing_queue_and_exchange_succeed(broker: ServerProcess) -> None:
    connection = await aiormq.connect(broker.url)
    try:
        channel = await connection.channel()
        deleted = await channel.queue_delete(unique("never-declared"))
        assert isinstance(deleted, commands.Queue.DeleteOk) and deleted.message_count == 0
        assert isinstance(
            await channel.exchange_delete(unique("never-declared")), commands.Exchange.DeleteOk
        )
        assert not channel.is_closed
    finally:
        await connection.close()


def test_pika_deletes_of_missing_queue_and_exchange_succeed(broker: ServerProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        assert channel.queue_delete(unique("never-declared")).method.message_count == 0
        channel.exchange_delete(unique("never-declared"))
        assert channel.is_open
    finally:
        connection.close()


async def test_aio_pika_cleanup_unbinds_after_auto_delete_succeed(broker: ServerProcess) -> None:
    """aio-pika's RPC close and its suite's cleanups unbind after an auto-delete queue or
    exchange went: as in RabbitMQ, an unbind where nothing is bound succeeds."""
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        source = await channel.declare_exchange(unique("src"), auto_delete=True)
        middle = await channel.declare_exchange(unique("mid"), auto_delete=True)
        queue = await channel.declare_queue(unique("q"), auto_delete=True)
        await queue.bind(middle, "k")
        await middle.bind(source, "k")
        await queue.delete()
        await queue.unbind(middle, "k")  # the queue is gone
        # Unbinding the queue's last binding took the auto-delete middle exchange, and
        # with it the source's only binding: both are gone now.
        await middle.unbind(source, "k")
        underlay = await channel.get_underlay_channel()
        await underlay.queue_unbind(unique("never"), unique("never"), "k")
        await underlay.exchange_unbind(unique("never"), unique("never"), "k")
        assert not channel.is_closed
        # A queue that is there still refuses another connection's unbind (exclusive).
        mine = await channel.declare_queue(unique("mine"), exclusive=True)
        other = await aio_pika.connect(broker.url)
        async with other:
            theirs = await (await other.channel()).get_underlay_channel()
            with pytest.raises(aiormq.exceptions.ChannelLockedResource):
                await theirs.queue_unbind(mine.name, "amq.direct", "k")


def test_pika_unbinds_of_missing_queue_and_exchange_succeed(broker: ServerProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.queue_unbind(unique("never"), unique("never"), "k")
        channel.exchange_unbind(unique("never"), "amq.direct", "k")
        channel.exchange_unbind("amq.direct", unique("never"), "k")
        assert channel.is_open
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_unbind(unique("never"), "", "k")
        assert refused.value.reply_code == 403, "the default exchange is never unbound"
    finally:
        connection.close()


# -- x-death ----------------------------------------------------------------------------


async def test_aio_pika_reads_x_death_as_rabbitmq_writes_it(broker: ServerProcess) -> None:
    work, parking = unique("work"), unique("parking")
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(parking, auto_delete=True)
        queue = await channel.declare_queue(
            work,
            auto_delete=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": parking},
        )
        await channel.default_exchange.publish(
            aio_pika.Message(b"m", expiration=60, headers={"ratio": 0.5}),
            routing_key=work,
        )
        message = await queue.get(timeout=5)
        await message.reject(requeue=False)
        dead = await wait_for_get(channel, parking)
        assert dead.expiration is None
        assert dead.headers["ratio"] == 0.5
        (death,) = dead.headers["x-death"]
        assert death["count"] == 1 and death["reason"] == "rejected"
        assert death["queue"] == work and death["exchange"] == ""
        assert death["routing-keys"] == [work]
        assert death["original-expiration"] == "60000"
        assert isinstance(death["time"], datetime.datetime)
        assert dead.headers["x-first-death-queue"] == work
        assert dead.headers["x-first-death-reason"] == "rejected"
        assert dead.headers["x-first-death-exchange"] == ""
        await dead.ack()


async def wait_for_get(
    channel: aio_pika.abc.AbstractChannel, name: str
) -> aio_pika.IncomingMessage:
    queue = await channel.get_queue(name)
    for _ in range(250):
        message = await queue.get(fail=False)
        if message is not None:
            return message
        await asyncio.sleep(0.02)
    raise AssertionError(f"nothing reached {name}")


def test_pika_reads_x_death_time_as_a_timestamp(broker: ServerProcess) -> None:
    work, parking = unique("work"), unique("parking")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.queue_declare(parking, auto_delete=True)
        channel.queue_declare(
            work,
            auto_delete=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": parking},
        )
        properties = pika.BasicProperties(expiration="5000", headers={"keep": "me"})
        channel.basic_publish("", work, b"m", properties)
        method, _, _ = wait_until(lambda: channel.basic_get(work), what="the message in work")
        channel.basic_reject(method.delivery_tag, requeue=False)
        _, dead, _ = wait_until(lambda: channel.basic_get(parking, auto_ack=True), what="dead")
        assert dead.expiration is None and dead.headers["keep"] == "me"
        (death,) = dead.headers["x-death"]
        assert isinstance(death["time"], datetime.datetime)
        assert death["original-expiration"] == "5000"
        assert dead.headers["x-first-death-queue"] == work
    finally:
        connection.close()


# -- Basic.Recover with requeue=false -------------------------------------------------------


async def test_aiormq_recover_without_requeue_is_540(broker: ServerProcess) -> None:
    connection = await aiormq.connect(broker.url)
    channel = await connection.channel()
    with pytest.raises((aiormq.exceptions.AMQPError, asyncio.CancelledError)):
        await channel.basic_recover(requeue=False)
    with pytest.raises(aiormq.exceptions.ConnectionNotImplemented, match="requeue=false"):
        await asyncio.wait_for(connection.closing, 5)


def test_pika_recover_with_requeue_still_works_and_without_is_540(broker: ServerProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = connection.channel()
    channel.basic_recover(requeue=True)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
        channel.basic_recover(requeue=False)
    assert caught.value.reply_code == 540


# -- x-queue-type -----------------------------------------------------------------------------


async def test_aio_pika_classic_and_quorum_accepted_stream_refused_by_name(
    broker: ServerProcess,
) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        name = unique("typed")
        queue = await channel.declare_queue(
            name, auto_delete=True, arguments={"x-queue-type": "classic"}
        )
        # Declaring it again without the argument is the same queue.
        await channel.declare_queue(name, auto_delete=True)
        await queue.delete()
        # A quorum queue is RabbitMQ's replicated queue: here a replicated durable queue.
        quorum = await channel.declare_queue(
            unique("typed"), durable=True, arguments={"x-queue-type": "quorum"}
        )
        await quorum.delete()
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed, match="stream queues"):
            await channel.declare_queue(
                unique("typed"), durable=True, arguments={"x-queue-type": "stream"}
            )


def test_pika_non_durable_quorum_queue_is_a_406_as_in_rabbitmq(broker: ServerProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.queue_declare(unique("q"), durable=False, arguments={"x-queue-type": "quorum"})
        assert caught.value.reply_code == 406
        assert "quorum queue" in caught.value.reply_text
    finally:
        connection.close()


# -- several addresses, IPv6 ----------------------------------------------------------------


async def test_listens_on_a_list_of_addresses_ipv4_and_ipv6(make_server) -> None:
    server = make_server("multi")
    port, other = server.port, free_port()
    server.config["server"]["listen"] = [f"127.0.0.1:{port}", f"[::1]:{port}", f"[::]:{other}"]
    # [::] is not loopback: the test users' well-known passwords would be refused there;
    # guest/guest may stay (guest logs in from loopback only).
    server.config["users"] = [{"name": "guest", "password": "guest"}]
    server.start()
    for host, at in (("127.0.0.1", port), ("[::1]", port), ("127.0.0.1", other), ("[::1]", other)):
        connection = await aio_pika.connect(f"amqp://guest:guest@{host}:{at}/")
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(exclusive=True)

    def with_pika() -> None:
        connection = pika.BlockingConnection(pika.ConnectionParameters("::1", port))
        assert connection.channel().queue_declare("", exclusive=True).method.queue
        connection.close()

    await asyncio.to_thread(with_pika)


def test_the_cancel_notice_follows_delete_ok_on_the_deleting_channel(broker: ServerProcess) -> None:
    """py-amqp (kombu) raises ConsumerCancelled on a Basic.Cancel read while it waits for
    DeleteOk: RabbitMQ sends the notice after the reply."""
    queue = unique("deleted-under-consumer")
    with RawClient(broker.port) as raw:
        raw.handshake(capabilities={"consumer_cancel_notify": True})
        raw.open_channel(1)
        raw.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
        raw.call(
            1, commands.Basic.Consume(queue=queue, consumer_tag="c1"), commands.Basic.ConsumeOk
        )
        raw.send(1, commands.Queue.Delete(queue=queue))
        raw.expect(commands.Queue.DeleteOk, 1)
        cancel = raw.expect(commands.Basic.Cancel, 1)
        assert cancel.consumer_tag == "c1"
