"""What the bad-input tests share (test_bad_input.py, test_bad_input_channels.py).

A raw client (asyncio streams on 127.0.0.1, frames built with pamqp.frame.marshal and
read back with pamqp.frame.unmarshal; every read is bounded), frames built by hand, and the
fixtures: a server for each module that uses them, a connection opened before the bad one
(``bystander``) and the raw connection (``raw``), after whose case the bystander and a
fresh aio-pika connection both still publish and consume, and the server process is alive.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aio_pika
import pytest
from pamqp import commands, frame
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from tests.support import ServerProcess

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
READ_TIMEOUT = 5.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Closed(Exception):
    """The server closed the socket."""


class RawConnection:
    """An AMQP peer that sends exactly what a test tells it to; every read is bounded."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int) -> RawConnection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def close(self) -> None:
        self.writer.close()
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                await self.writer.wait_closed()
        except (OSError, TimeoutError):
            pass

    # -- sending ------------------------------------------------------------------

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, channel: int, *values: Any) -> None:
        await self.send_raw(b"".join(frame.marshal(value, channel) for value in values))

    # -- reading ------------------------------------------------------------------

    async def read_exactly(self, count: int) -> bytes:
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                return await self.reader.readexactly(count)
        except asyncio.IncompleteReadError as error:
            raise Closed(f"closed after {error.partial!r}") from None
        except ConnectionResetError as error:
            raise Closed(str(error)) from None

    async def read_frame(self) -> tuple[int, Any]:
        """The next frame (heartbeats skipped) as (channel, pamqp object)."""
        while True:
            head = await self.read_exactly(7)
            (size,) = struct.unpack_from(">I", head, 3)
            rest = await self.read_exactly(size + 1)
            _, channel, value = frame.unmarshal(head + rest)
            if not isinstance(value, Heartbeat):
                return channel, value

    async def expect(self, kind: type, channel: int = 0) -> Any:
        got_channel, value = await self.read_frame()
        assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r}"
        assert got_channel == channel, f"{kind.__name__} on channel {got_channel}, not {channel}"
        return value

    async def expect_eof(self) -> bytes:
        """Everything the server still sends until it closes the socket."""
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                return await self.reader.read()
        except ConnectionResetError:
            return b""

    async def expect_connection_close(
        self, code: int, class_id: int | None = None, method_id: int | None = None
    ) -> commands.Connection.Close:
        """The next frame is Connection.Close with ``code``; answer Close-Ok, see the socket go."""
        close = await self.expect(commands.Connection.Close)
        assert close.reply_code == code, f"closed with {close.reply_code} {close.reply_text}"
        if class_id is not None:
            assert (close.class_id, close.method_id) == (class_id, method_id)
        await self.send(0, commands.Connection.CloseOk())
        assert await self.expect_eof() == b""
        return close

    # -- conversations ------------------------------------------------------------

    async def handshake(self, frame_max: int = 0, vhost: str = "/") -> commands.Connection.Tune:
        await self.send_raw(PROTOCOL_HEADER)
        await self.expect(commands.Connection.Start)
        await self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "bad-input-test"},
                mechanism="PLAIN",
                response="\0guest\0guest",
                locale="en_US",
            ),
        )
        tune = await self.expect(commands.Connection.Tune)
        await self.send(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=frame_max or tune.frame_max, heartbeat=0
            ),
            commands.Connection.Open(virtual_host=vhost),
        )
        await self.expect(commands.Connection.OpenOk)
        return tune

    async def open_channel(self, number: int = 1) -> None:
        await self.send(number, commands.Channel.Open())
        await self.expect(commands.Channel.OpenOk, number)


def method_frame(channel: int, class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    payload = struct.pack(">HH", class_id, method_id) + arguments
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


def raw_frame(kind: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + end


def content_header(channel: int, size: int) -> bytes:
    return frame.marshal(ContentHeader(0, size, commands.Basic.Properties()), channel)


def publish(channel: int, routing_key: str = "nowhere") -> bytes:
    return frame.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key), channel)


def start_ok(mechanism: bytes, response: bytes) -> bytes:
    """Connection.StartOk by hand, so the response can be any bytes."""
    arguments = (
        struct.pack(">I", 0)
        + bytes((len(mechanism),))
        + mechanism
        + struct.pack(">I", len(response))
        + response
        + b"\x05en_US"
    )
    return method_frame(0, 10, 11, arguments)


# -- the server and the well-behaved clients ----------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """This module's own broker: a bug found here cannot take the shared one down."""
    process = ServerProcess(tmp_path_factory.mktemp("bad-input"), "badinput")
    process.start()
    yield process
    process.stop()


async def round_trip(channel: aio_pika.abc.AbstractChannel, body: bytes) -> None:
    queue = await channel.declare_queue(unique("alive"), auto_delete=True)
    await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue.name)
    async with asyncio.timeout(READ_TIMEOUT):
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    assert message.body == body
                break
    await queue.delete(if_unused=False, if_empty=False)


class Bystander:
    """A connection opened before the bad input; it must not notice anything.

    ``declare_queue`` uses a channel of its own, so a test may provoke a channel error
    with it without closing the channel that ``round_trip`` checks.
    """

    def __init__(self, connection: aio_pika.abc.AbstractConnection) -> None:
        self.connection = connection
        self.channel: aio_pika.abc.AbstractChannel | None = None

    async def declare_queue(self, name: str, **options: Any) -> aio_pika.abc.AbstractQueue:
        channel = await self.connection.channel()
        return await channel.declare_queue(name, **options)


@pytest.fixture
async def bystander(server: ServerProcess) -> AsyncIterator[Bystander]:
    connection = await aio_pika.connect(server.url)
    watcher = Bystander(connection)
    watcher.channel = await connection.channel(publisher_confirms=True)
    await round_trip(watcher.channel, b"before")
    yield watcher
    await connection.close()


@pytest.fixture
async def raw(server: ServerProcess, bystander: Bystander) -> AsyncIterator[RawConnection]:
    connection = await RawConnection.connect(server.port)
    yield connection
    await connection.close()
    assert server.alive, server.log()
    assert bystander.channel is not None
    await round_trip(bystander.channel, b"bystander after")
    fresh = await aio_pika.connect(server.url)
    async with fresh:
        await round_trip(await fresh.channel(), b"fresh after")
