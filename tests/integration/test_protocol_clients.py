"""Standard clients, unchanged, each running a short realistic workload against the
same broker: aio-pika (RPC), aiormq (work queue), pika's BlockingConnection (pub/sub),
pika's asyncio adapter (confirmed publish and acked consume), py-amqp (topic routing),
and every one of them publishing into one exchange that aio-pika reads back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from datetime import UTC, datetime

import aio_pika
import aiormq
import amqp
import pika
from pika.adapters.asyncio_connection import AsyncioConnection

from tests.integration.protocol_support import unique


async def test_aio_pika_rpc_request_reply(broker) -> None:
    server_connection = await aio_pika.connect(broker.url)
    client_connection = await aio_pika.connect(broker.url)
    async with server_connection, client_connection:
        server_channel = await server_connection.channel()
        requests = await server_channel.declare_queue(unique("rpc"), auto_delete=True)

        async def serve(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                number = json.loads(message.body)
                await server_channel.default_exchange.publish(
                    aio_pika.Message(
                        json.dumps(number * number).encode(),
                        correlation_id=message.correlation_id,
                    ),
                    routing_key=message.reply_to,
                )

        await requests.consume(serve)
        client_channel = await client_connection.channel()
        replies = await client_channel.declare_queue(exclusive=True)
        waiting: dict[str, asyncio.Future] = {}

        async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            waiting.pop(message.correlation_id).set_result(json.loads(message.body))

        await replies.consume(on_reply, no_ack=True)

        async def call(number: int) -> int:
            correlation_id = unique("call")
            waiting[correlation_id] = asyncio.get_running_loop().create_future()
            await client_channel.default_exchange.publish(
                aio_pika.Message(
                    json.dumps(number).encode(),
                    correlation_id=correlation_id,
                    reply_to=replies.name,
                ),
                routing_key=requests.name,
            )
            return await waiting[correlation_id]

        async with asyncio.timeout(10):
            results = await asyncio.gather(*(call(n) for n in range(20)))
        assert results == [n * n for n in range(20)]


async def test_aiormq_work_queue_with_two_workers(broker) -> None:
    connection = await aiormq.connect(broker.url)
    try:
        producer = await connection.channel()
        name = (await producer.queue_declare(unique("work"), auto_delete=True)).queue
        done: list[tuple[int, bytes]] = []
        workers = []
        for worker_id in range(2):
            channel = await connection.channel()
            await channel.basic_qos(prefetch_count=1)

            async def work(message, worker_id=worker_id, channel=channel) -> None:
                done.append((worker_id, message.body))
                await channel.basic_ack(message.delivery_tag)

            await channel.basic_consume(name, work)
            workers.append(channel)
        for n in range(40):
            await producer.basic_publish(f"task-{n}".encode(), routing_key=name)
        async with asyncio.timeout(10):
            while len(done) < 40:
                await asyncio.sleep(0.01)
        assert sorted(body for _, body in done) == sorted(f"task-{n}".encode() for n in range(40))
        assert {worker for worker, _ in done} == {0, 1}
    finally:
        await connection.close()


def test_pika_blocking_publish_subscribe(broker) -> None:
    parameters = pika.ConnectionParameters("127.0.0.1", broker.port)
    publisher = pika.BlockingConnection(parameters)
    subscriber = pika.BlockingConnection(parameters)
    try:
        exchange = unique("news")
        channel = subscriber.channel()
        channel.exchange_declare(exchange, "fanout", auto_delete=True)
        queues = []
        for _ in range(3):
            name = channel.queue_declare("", exclusive=True).method.queue
            channel.queue_bind(name, exchange)
            queues.append(name)
        publishing = publisher.channel()
        publishing.confirm_delivery()
        for n in range(5):
            publishing.basic_publish(exchange, "", f"headline {n}".encode())
        for name in queues:
            got = []
            for method, _properties, body in channel.consume(name, inactivity_timeout=5):
                assert method is not None, "subscriber waited in vain"
                got.append(body)
                channel.basic_ack(method.delivery_tag)
                if len(got) == 5:
                    break
            channel.cancel()
            assert got == [f"headline {n}".encode() for n in range(5)]
    finally:
        publisher.close()
        subscriber.close()


async def test_pika_asyncio_adapter_publishes_with_confirms_and_consumes(broker) -> None:
    loop = asyncio.get_running_loop()
    finished: asyncio.Future = loop.create_future()
    name = unique("pika-asyncio")
    state: dict = {"acked": 0, "received": []}
    total = 10

    def fail(_connection, error) -> None:
        if not finished.done():
            finished.set_exception(RuntimeError(f"connection failed: {error!r}"))

    def on_open(connection) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel) -> None:
        state["channel"] = channel
        channel.queue_declare(name, auto_delete=True, callback=on_declared)

    def on_declared(_frame) -> None:
        channel = state["channel"]
        channel.confirm_delivery(on_confirm, callback=lambda _frame: publish_all(channel))

    def publish_all(channel) -> None:
        for n in range(total):
            channel.basic_publish("", name, f"m{n}".encode())

    def on_confirm(frame) -> None:
        method = frame.method
        assert isinstance(method, pika.spec.Basic.Ack)
        state["acked"] = method.delivery_tag
        if state["acked"] == total:
            state["channel"].basic_consume(name, on_message)

    def on_message(channel, method, _properties, body) -> None:
        state["received"].append(body)
        channel.basic_ack(method.delivery_tag)
        if len(state["received"]) == total and not finished.done():
            finished.set_result(True)

    parameters = pika.ConnectionParameters("127.0.0.1", broker.port)
    connection = AsyncioConnection(
        parameters,
        on_open_callback=on_open,
        on_open_error_callback=fail,
        custom_ioloop=loop,
    )
    try:
        async with asyncio.timeout(10):
            await finished
        assert state["received"] == [f"m{n}".encode() for n in range(total)]
    finally:
        closed = loop.create_future()
        connection.add_on_close_callback(lambda *_: closed.done() or closed.set_result(True))
        if connection.is_open:
            connection.close()
            async with asyncio.timeout(5):
                await closed


def test_py_amqp_topic_routing_with_consumer_and_get(broker) -> None:
    connection = amqp.Connection(broker.address, userid="guest", password="guest")
    connection.connect()
    try:
        channel = connection.channel()
        exchange = unique("logs")
        channel.exchange_declare(exchange, "topic", auto_delete=True)
        errors, _, _ = channel.queue_declare("", exclusive=True)
        everything, _, _ = channel.queue_declare("", exclusive=True)
        channel.queue_bind(errors, exchange, "*.error")
        channel.queue_bind(everything, exchange, "#")
        for key in ("db.error", "web.info", "web.error", "cron.debug"):
            channel.basic_publish(amqp.Message(key.encode()), exchange, key)
        received = []

        def on_message(message) -> None:
            received.append(message.body)
            channel.basic_ack(message.delivery_tag)

        channel.basic_consume(errors, callback=on_message)
        deadline = time.monotonic() + 10
        while len(received) < 2:
            assert time.monotonic() < deadline, f"only {received} arrived"
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.2)
        assert received == [b"db.error", b"web.error"]
        got = []
        while (message := channel.basic_get(everything, no_ack=True)) is not None:
            got.append(message.body)
        assert got == [b"db.error", b"web.info", b"web.error", b"cron.debug"]
    finally:
        connection.close()


async def test_every_client_publishes_and_properties_survive(broker) -> None:
    """One exchange, five publishing clients, one aio-pika reader: bodies and
    properties arrive exactly as each client sent them."""
    reader = await aio_pika.connect(broker.url)
    async with reader:
        channel = await reader.channel()
        exchange = await channel.declare_exchange(unique("mixed"), "direct", auto_delete=True)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, "in")
        stamp = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
        expected_headers = {"client": None, "n": 7}

        sender = await aio_pika.connect(broker.url)
        async with sender:
            sending = await sender.channel(publisher_confirms=True)
            target = await sending.get_exchange(exchange.name, ensure=False)
            await target.publish(
                aio_pika.Message(
                    b"aio-pika",
                    headers={"client": "aio-pika", "n": 7},
                    content_type="text/plain",
                    correlation_id="c-aio-pika",
                    priority=3,
                    timestamp=stamp,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key="in",
            )

        raw = await aiormq.connect(broker.url)
        try:
            raw_channel = await raw.channel()
            await raw_channel.basic_publish(
                b"aiormq",
                exchange=exchange.name,
                routing_key="in",
                properties=aiormq.spec.Basic.Properties(
                    headers={"client": "aiormq", "n": 7},
                    content_type="text/plain",
                    correlation_id="c-aiormq",
                    priority=3,
                    timestamp=stamp,
                    delivery_mode=2,
                ),
            )
        finally:
            await raw.close()

        blocking = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        try:
            pika_channel = blocking.channel()
            pika_channel.confirm_delivery()
            pika_channel.basic_publish(
                exchange.name,
                "in",
                b"pika",
                pika.BasicProperties(
                    headers={"client": "pika", "n": 7},
                    content_type="text/plain",
                    correlation_id="c-pika",
                    priority=3,
                    timestamp=int(stamp.timestamp()),
                    delivery_mode=2,
                ),
            )
        finally:
            blocking.close()

        py_amqp = amqp.Connection(broker.address, userid="guest", password="guest")
        py_amqp.connect()
        try:
            py_amqp.channel().basic_publish(
                amqp.Message(
                    b"py-amqp",
                    application_headers={"client": "py-amqp", "n": 7},
                    content_type="text/plain",
                    correlation_id="c-py-amqp",
                    priority=3,
                    timestamp=int(stamp.timestamp()),
                    delivery_mode=2,
                ),
                exchange.name,
                "in",
            )
        finally:
            py_amqp.close()

        received = []
        async with asyncio.timeout(10):
            while len(received) < 4:
                message = await queue.get(no_ack=True, fail=False)
                if message is None:
                    await asyncio.sleep(0.01)
                else:
                    received.append(message)
        for message in received:
            client = message.body.decode()
            assert message.headers == {**expected_headers, "client": client}
            assert message.content_type == "text/plain"
            assert message.correlation_id == f"c-{client}"
            assert message.priority == 3
            assert message.timestamp == stamp
            assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert sorted(m.body for m in received) == [b"aio-pika", b"aiormq", b"pika", b"py-amqp"]
