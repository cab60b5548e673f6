"""The broker starts, serves a real aio-pika client, and stops cleanly on SIGTERM."""

import aio_pika

from tests.support import ServerProcess


async def test_publish_consume_roundtrip(broker: ServerProcess) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("smoke-roundtrip", auto_delete=True)
        for number in range(5):
            await channel.default_exchange.publish(
                aio_pika.Message(str(number).encode()), routing_key=queue.name
            )
        bodies = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    bodies.append(message.body)
                if len(bodies) == 5:
                    break
    assert bodies == [b"0", b"1", b"2", b"3", b"4"]


def test_sigterm_closes_clients_with_320(make_server) -> None:
    import pika

    server = make_server("stopper").start()
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.port))
    assert server.terminate() == 0
    try:
        connection.process_data_events(time_limit=5)
        closed_with = None
    except pika.exceptions.ConnectionClosedByBroker as error:
        closed_with = error.reply_code
    assert closed_with == 320
    assert "shutting down" in server.log()
