"""A peer that is not amqha (any other AMQP broker) is a misconfiguration, never a pair.

The foreign broker here is a few lines of pamqp: it completes the handshake, opens a
channel and swallows whatever is published, announcing another product, as a stock
AMQP broker placed at ``failover.peer`` by mistake would.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pika
import pika.exceptions
from pamqp import commands, frame

from failover.events import read_events
from tests.pairs import PAIR_SECRET
from tests.support import ServerProcess, free_port, wait_until


class ForeignBroker:
    """Speaks just enough AMQP 0-9-1 for a client to connect, open a channel and publish."""

    def __init__(self) -> None:
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.connections = 0
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ForeignBroker:
        self.thread.start()
        assert self.ready.wait(10), "foreign broker did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        self.ready.set()
        self.loop.run_forever()
        server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(Exception):
            await reader.readexactly(8)
            start = commands.Connection.Start(
                server_properties={
                    "product": "RabbitMQ",
                    "version": "3.12.0",
                    "capabilities": {"publisher_confirms": True, "basic.nack": True},
                },
                mechanisms="PLAIN",
                locales="en_US",
            )
            writer.write(frame.marshal(start, 0))
            buffer = b""
            for _ in range(10_000):
                data = await asyncio.wait_for(reader.read(65536), 30)
                if not data:
                    break
                buffer += data
                while True:
                    try:
                        used, channel, value = frame.unmarshal(buffer)
                    except Exception:
                        break
                    buffer = buffer[used:]
                    reply = {
                        commands.Connection.StartOk: commands.Connection.Tune(2047, 131072, 0),
                        commands.Connection.Open: commands.Connection.OpenOk(),
                        commands.Channel.Open: commands.Channel.OpenOk(),
                        commands.Confirm.Select: commands.Confirm.SelectOk(),
                    }.get(type(value))
                    if reply is not None:
                        writer.write(frame.marshal(reply, channel))
                await writer.drain()
        writer.close()


def test_a_peer_that_is_not_amqha_is_reported_and_never_paired(tmp_path) -> None:
    with ForeignBroker() as foreign:
        server = ServerProcess(
            tmp_path,
            "primary",
            failover={
                "role": "primary",
                "peer": f"127.0.0.1:{foreign.port}",
                "heartbeat": 0.1,
                "timeout": 0.4,
                "peer_user": "peering",
                "secret": PAIR_SECRET,
            },
        )
        try:
            server.start()
            misconfigured = wait_until(
                lambda: (
                    [e for e in read_events(server.events_path) if e["event"] == "misconfigured"]
                    if server.events_path.exists()
                    else None
                ),
                timeout=15,
                what="a misconfigured event",
            )
            assert "is not amqha" in misconfigured[0]["reason"]
            assert "'RabbitMQ'" in misconfigured[0]["reason"]
            assert "misconfigured pair" in server.log() and "ERROR" in server.log()

            # Well past the start-up grace, a client still cannot make it serve.
            for _ in range(3):
                try:
                    connection = pika.BlockingConnection(
                        pika.ConnectionParameters("127.0.0.1", server.port, connection_attempts=1)
                    )
                    connection.close()
                    raise AssertionError("a server paired with a foreign broker let a client in")
                except pika.exceptions.AMQPConnectionError as error:
                    assert "NOT_ACTIVE - no active server" in str(error)
                    assert "is not amqha" in str(error)
            states = {e["state"] for e in read_events(server.events_path)}
            assert "ACTIVE" not in states
        finally:
            server.stop()
