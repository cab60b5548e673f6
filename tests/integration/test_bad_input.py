"""Bad input never breaks the broker.

A raw client (asyncio streams on 127.0.0.1, frames built with pamqp.frame.marshal and
read back with pamqp.frame.unmarshal) sends one kind of broken input per test and
checks exactly what the server answers. After every case a connection opened before
the bad one (``bystander``) and a fresh aio-pika connection both still publish and
consume, and the server process is alive.
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
from pamqp.body import ContentBody
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


# -- before the handshake -------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x01\x01\x00\x09",  # AMQP 0-9 framing
        b"AMQP\x00\x00\x09\x00",  # 0-9-0
        b"AMQP\x00\x01\x00\x00",  # AMQP 1.0
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
    ids=["0-9", "0-9-0", "1.0", "http"],
)
async def test_wrong_protocol_header_gets_ours_and_a_close(
    raw: RawConnection, header: bytes
) -> None:
    await raw.send_raw(header)
    assert await raw.expect_eof() == PROTOCOL_HEADER


async def test_random_bytes_instead_of_a_header(raw: RawConnection) -> None:
    await raw.send_raw(bytes.fromhex("9f3c07e1d2aa5b60c4f81e2d3344556677") * 4)
    assert await raw.expect_eof() == PROTOCOL_HEADER


async def test_header_in_pieces_then_a_split_start_ok(raw: RawConnection) -> None:
    """The header arrives in two reads and the second also holds part of Start-Ok."""
    start_ok = frame.marshal(
        commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"
        ),
        0,
    )
    await raw.send_raw(PROTOCOL_HEADER[:4])
    await asyncio.sleep(0.05)
    await raw.send_raw(PROTOCOL_HEADER[4:] + start_ok[:10])
    await raw.expect(commands.Connection.Start)
    await raw.send_raw(start_ok[10:])
    await raw.expect(commands.Connection.Tune)


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


@pytest.mark.parametrize(
    ("mechanism", "response"),
    [
        (b"PLAIN", "\0nobody\0pässwörd".encode()),
        (b"PLAIN", "\0guest\0güest".encode()),
        (b"PLAIN", b"\0\xff\xfe\0\xff"),
        (b"PLAIN", b"no separators"),
        (b"AMQPLAIN", b"\x05LOGINS\x00\x00\x00\x02\xff\xfe\x08PASSWORDS\x00\x00\x00\x01\xff"),
        (b"AMQPLAIN", b"\x05LOGINS\x00\x00\x00\x05nobody"),
        (b"CRAM-MD5", b"guest"),
    ],
    ids=[
        "unknown-user-non-ascii",
        "wrong-non-ascii",
        "binary",
        "no-separators",
        "amqplain-binary",
        "amqplain-truncated",
        "unsupported-mechanism",
    ],
)
async def test_refused_login_is_403(raw: RawConnection, mechanism: bytes, response: bytes) -> None:
    await raw.send_raw(PROTOCOL_HEADER)
    await raw.expect(commands.Connection.Start)
    await raw.send_raw(start_ok(mechanism, response))
    close = await raw.expect_connection_close(403)
    assert close.reply_text.startswith("ACCESS_REFUSED")


async def test_truncated_handshake_frame_then_eof(raw: RawConnection) -> None:
    await raw.send_raw(PROTOCOL_HEADER)
    await raw.expect(commands.Connection.Start)
    start_ok = frame.marshal(
        commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"
        ),
        0,
    )
    await raw.send_raw(start_ok[: len(start_ok) // 2])
    raw.writer.write_eof()
    assert await raw.expect_eof() == b""


# -- framing ----------------------------------------------------------------------------------


async def test_random_bytes_after_the_handshake_are_a_frame_error(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.send_raw(bytes.fromhex("9f3c07e1d2aa5b60c4f81e2d3344556677"))
    await raw.expect_connection_close(501)


async def test_truncated_frame_then_eof_leaves_no_trace(
    raw: RawConnection, bystander: Bystander
) -> None:
    await raw.handshake()
    await raw.open_channel()
    name = unique("never-declared")
    declare = frame.marshal(commands.Queue.Declare(queue=name), 1)
    await raw.send_raw(declare[:-3])
    raw.writer.write_eof()
    assert await raw.expect_eof() == b""
    with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
        await bystander.declare_queue(name, passive=True)


async def test_oversized_frame_is_refused_on_its_header(raw: RawConnection) -> None:
    """Only the 7-byte header is sent: the Close must come without waiting for a payload."""
    tune = await raw.handshake()
    assert tune.frame_max == 131072
    await raw.send_raw(struct.pack(">BHI", 1, 0, 0x7FFFFFF0))
    close = await raw.expect_connection_close(501)
    assert "frame_max" in close.reply_text


async def test_oversized_frame_before_the_handshake_ends(raw: RawConnection) -> None:
    await raw.send_raw(PROTOCOL_HEADER)
    await raw.expect(commands.Connection.Start)
    await raw.send_raw(struct.pack(">BHI", 1, 0, 0xFFFFFFFF))
    await raw.expect_connection_close(501)


async def test_oversized_frame_on_a_channel_before_the_payload(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(publish(1) + struct.pack(">BHI", 3, 1, 131072 - 7))
    await raw.expect_connection_close(501)


async def test_frame_max_negotiated_in_tune_ok_applies(raw: RawConnection) -> None:
    await raw.handshake(frame_max=4096)
    await raw.open_channel()
    queue = unique("fm")
    await raw.send(1, commands.Queue.Declare(queue=queue, auto_delete=True))
    await raw.expect(commands.Queue.DeclareOk, 1)
    # A body frame of exactly frame_max is fine ...
    fits = b"x" * (4096 - 8)
    await raw.send_raw(publish(1, queue) + content_header(1, len(fits)) + raw_frame(3, 1, fits))
    await raw.send(1, commands.Basic.Get(queue=queue, no_ack=True))
    get_ok = await raw.expect(commands.Basic.GetOk, 1)
    assert get_ok.routing_key == queue
    await raw.expect(ContentHeader, 1)
    assert (await raw.expect(ContentBody, 1)).value == fits
    # ... one byte more is not.
    await raw.send_raw(publish(1, queue) + content_header(1, 4089) + raw_frame(3, 1, b"x" * 4089))
    await raw.expect_connection_close(501)


async def test_bad_end_byte_is_501(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.send_raw(raw_frame(1, 1, frame.marshal(commands.Channel.Open(), 1)[7:-1], b"\x00"))
    close = await raw.expect_connection_close(501)
    assert "end byte" in close.reply_text


async def test_heartbeat_on_a_channel_is_501(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(raw_frame(8, 1, b""))
    await raw.expect_connection_close(501)


@pytest.mark.parametrize("channel", [0, 1])
async def test_unknown_frame_type_is_501(raw: RawConnection, channel: int) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(raw_frame(5, channel, b"\x00\x00"))
    await raw.expect_connection_close(501)


# -- methods ------------------------------------------------------------------------------


async def test_unknown_class_is_540(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(method_frame(1, 99, 10))
    await raw.expect_connection_close(540, 99, 10)


async def test_unknown_class_on_channel_zero_is_540(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.send_raw(method_frame(0, 77, 1, b"\x00"))
    await raw.expect_connection_close(540, 77, 1)


async def test_unknown_method_of_a_known_class_is_503(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(method_frame(1, 50, 99))
    await raw.expect_connection_close(503, 50, 99)


QUEUE_DECLARE_HEAD = struct.pack(">H", 0) + b"\x05bad-q" + b"\x00"


@pytest.mark.parametrize(
    "arguments",
    [
        # One entry "k" with the type tag '?', which no table value has.
        QUEUE_DECLARE_HEAD + struct.pack(">I", 4) + b"\x01k?\x00",
        # A table announcing 1000 bytes in a frame that has 7.
        QUEUE_DECLARE_HEAD + struct.pack(">I", 1000) + b"\x01kt\x01",
        # A key longer than the table.
        QUEUE_DECLARE_HEAD + struct.pack(">I", 3) + b"\x09ab",
        # The queue name is not UTF-8.
        struct.pack(">H", 0) + b"\x02\xc3\x28" + b"\x00" + struct.pack(">I", 0),
        # Cut off in the middle of the queue name.
        struct.pack(">H", 0) + b"\x05ba",
    ],
    ids=["bad-type-tag", "table-too-long", "key-too-long", "not-utf8", "cut-short"],
)
async def test_undecodable_queue_declare_is_502(raw: RawConnection, arguments: bytes) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(method_frame(1, 50, 10, arguments))
    await raw.expect_connection_close(502, 50, 10)


async def test_queue_declare_with_a_table_of_130974_voids_is_502(raw: RawConnection) -> None:
    """One 128 KiB Queue.Declare whose arguments hold an array of one-byte void entries:
    decoding it cost the loop 2.5 s of CPU (four such clients stalled every other one for
    seconds); it is refused once its tables pass the entry cap."""
    await raw.handshake()
    await raw.open_channel()
    voids = b"V" * 130_974
    table = b"\x06x-voidA" + struct.pack(">I", len(voids)) + voids
    await raw.send_raw(
        method_frame(1, 50, 10, QUEUE_DECLARE_HEAD + struct.pack(">I", len(table)) + table)
    )
    close = await raw.expect_connection_close(502, 50, 10)
    assert "field tables hold more than 4096 entries" in close.reply_text


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x00\x3c", b"\x00\x3c\x00\x28\x00\x00\x01"],
    ids=["empty", "half-index", "publish-cut-short"],
)
async def test_short_method_payload_is_502(raw: RawConnection, payload: bytes) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(raw_frame(1, 1, payload))
    await raw.expect_connection_close(502)


# -- content sequence -----------------------------------------------------------------------


async def test_content_header_without_publish_is_505(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(content_header(1, 3))
    await raw.expect_connection_close(505)


async def test_body_without_publish_is_505(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(raw_frame(3, 1, b"abc"))
    await raw.expect_connection_close(505)


async def test_body_before_header_is_505(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(publish(1) + raw_frame(3, 1, b"abc"))
    await raw.expect_connection_close(505)


@pytest.mark.parametrize("after_header", [False, True], ids=["before-header", "mid-body"])
async def test_method_while_content_is_expected_is_505(
    raw: RawConnection, after_header: bool
) -> None:
    await raw.handshake()
    await raw.open_channel()
    sequence = publish(1)
    if after_header:
        sequence += content_header(1, 10) + raw_frame(3, 1, b"12345")
    await raw.send_raw(sequence + frame.marshal(commands.Queue.Declare(queue=unique("q")), 1))
    await raw.expect_connection_close(505, 50, 10)


async def test_content_header_on_channel_zero_is_505(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.send_raw(content_header(0, 3))
    await raw.expect_connection_close(505)


async def test_body_longer_than_announced_is_501(raw: RawConnection, bystander: Bystander) -> None:
    queue = await bystander.declare_queue(unique("too-long"), auto_delete=True)
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(
        publish(1, queue.name)
        + content_header(1, 4)
        + raw_frame(3, 1, b"12")
        + raw_frame(3, 1, b"345")
    )
    await raw.expect_connection_close(501)
    # Nothing of the broken message reached the queue.
    declared = await bystander.declare_queue(queue.name, passive=True)
    assert declared.declaration_result.message_count == 0
    await queue.delete()


async def test_malformed_properties_are_refused_before_anyone_decodes_them(
    raw: RawConnection, bystander: Bystander
) -> None:
    """A header whose properties cannot be decoded would poison whoever decodes it
    later (dead-lettering in the broker's sweep, a consumer's client): it is a 502 at once."""
    queue = await bystander.declare_queue(
        unique("bad-props"),
        auto_delete=True,
        arguments={"x-message-ttl": 20, "x-dead-letter-exchange": "amq.fanout"},
    )
    await raw.handshake()
    await raw.open_channel()
    content_type_without_bytes = struct.pack(">HHQH", 60, 0, 3, 0x8000)
    await raw.send_raw(
        publish(1, queue.name)
        + raw_frame(2, 1, content_type_without_bytes)
        + raw_frame(3, 1, b"abc")
    )
    await raw.expect_connection_close(502)
    # Message TTL (the broker's periodic sweep) still works for everyone.
    probe = await bystander.declare_queue(
        unique("ttl-probe"), auto_delete=True, arguments={"x-message-ttl": 20}
    )
    assert bystander.channel is not None
    await bystander.channel.default_exchange.publish(aio_pika.Message(b"x"), probe.name)
    async with asyncio.timeout(READ_TIMEOUT):
        while True:
            declared = await bystander.declare_queue(probe.name, passive=True)
            if declared.declaration_result.message_count == 0:
                break
            await asyncio.sleep(0.02)


async def test_second_header_is_505(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel()
    await raw.send_raw(publish(1) + content_header(1, 4) + content_header(1, 4))
    await raw.expect_connection_close(505)


# -- channels -----------------------------------------------------------------------------


async def test_method_on_a_channel_never_opened_is_504(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.send(7, commands.Queue.Declare(queue=unique("q")))
    await raw.expect_connection_close(504, 50, 10)


async def test_content_on_a_channel_never_opened_is_504(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.send_raw(content_header(3, 1))
    await raw.expect_connection_close(504)


async def test_channel_open_twice_is_504(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel(1)
    await raw.send(1, commands.Channel.Open())
    await raw.expect_connection_close(504, 20, 10)


async def test_channel_reopened_after_close_is_fine(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel(1)
    await raw.send(1, commands.Channel.Close(200, "bye", 0, 0))
    await raw.expect(commands.Channel.CloseOk, 1)
    await raw.open_channel(1)


async def test_channel_above_channel_max_is_refused(raw: RawConnection) -> None:
    tune = await raw.handshake()
    await raw.send(tune.channel_max + 1, commands.Channel.Open())
    await raw.expect_connection_close(530, 20, 10)


async def test_channel_method_before_open_ok_is_refused(raw: RawConnection) -> None:
    await raw.send_raw(PROTOCOL_HEADER)
    await raw.expect(commands.Connection.Start)
    await raw.send(1, commands.Channel.Open())
    close = await raw.expect(commands.Connection.Close)
    assert close.reply_code == 504
    await raw.send(0, commands.Connection.CloseOk())
    assert await raw.expect_eof() == b""


async def test_queue_argument_that_is_not_utf8_is_406_on_the_channel(raw: RawConnection) -> None:
    """x-overflow as a longstr of bytes that are not UTF-8: a bad argument like any other
    (it raised UnicodeDecodeError and reset the connection)."""
    await raw.handshake()
    await raw.open_channel(1)
    value = b"\xffdrop-head"
    table = b"\x0ax-overflowS" + struct.pack(">I", len(value)) + value
    head = struct.pack(">H", 0) + shortstr(unique("overflow")) + b"\x00"
    await raw.send_raw(method_frame(1, 50, 10, head + struct.pack(">I", len(table)) + table))
    close = await raw.expect(commands.Channel.Close, 1)
    assert (close.reply_code, close.class_id, close.method_id) == (406, 50, 10)
    assert "x-overflow" in close.reply_text and "not UTF-8" in close.reply_text
    await raw.send(1, commands.Channel.CloseOk())
    await raw.open_channel(2)


async def test_soft_error_closes_only_the_channel(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel(1)
    await raw.open_channel(2)
    await raw.send(1, commands.Queue.Declare(queue=unique("missing"), passive=True))
    close = await raw.expect(commands.Channel.Close, 1)
    assert (close.reply_code, close.class_id, close.method_id) == (404, 50, 10)
    # Frames on the closing channel are dropped until Close-Ok; channel 2 carries on.
    await raw.send(1, commands.Queue.Declare(queue=unique("ignored")))
    await raw.send(2, commands.Queue.Declare(queue=unique("ok"), auto_delete=True))
    await raw.expect(commands.Queue.DeclareOk, 2)
    await raw.send(1, commands.Channel.CloseOk())
    await raw.open_channel(1)


# -- names pamqp's own validation would refuse ----------------------------------------------


def shortstr(text: str) -> bytes:
    data = text.encode()
    return bytes((len(data),)) + data


@pytest.mark.parametrize(
    "name",
    ["очередь", "queue!$%&", "q" * 255, "é" * 127],
    ids=["cyrillic", "symbols", "255", "2-byte"],
)
async def test_any_utf8_queue_name_is_declared_and_answered(raw: RawConnection, name: str) -> None:
    """AMQP names are any shortstr (RabbitMQ takes them all); pamqp's domain regex and
    127-character limit are client-side checks the broker must not trip over."""
    await raw.handshake()
    await raw.open_channel()
    declare = struct.pack(">H", 0) + shortstr(name) + b"\x04" + struct.pack(">I", 0)  # exclusive
    await raw.send_raw(method_frame(1, 50, 10, declare))
    declare_ok = await raw.expect(commands.Queue.DeclareOk, 1)
    assert (declare_ok.queue, declare_ok.message_count, declare_ok.consumer_count) == (name, 0, 0)
    await raw.send_raw(
        method_frame(1, 60, 40, struct.pack(">H", 0) + b"\x00" + shortstr(name) + b"\x00")
        + content_header(1, 2)
        + raw_frame(3, 1, b"hi")
    )
    await raw.send_raw(method_frame(1, 60, 70, struct.pack(">H", 0) + shortstr(name) + b"\x01"))
    get_ok = await raw.expect(commands.Basic.GetOk, 1)
    assert get_ok.routing_key == name
    await raw.expect(ContentHeader, 1)
    assert (await raw.expect(ContentBody, 1)).value == b"hi"


async def test_error_text_naming_a_long_multibyte_name_fits_a_shortstr(raw: RawConnection) -> None:
    name = "ü" * 127
    await raw.handshake()
    await raw.open_channel()
    passive = struct.pack(">H", 0) + shortstr(name) + b"\x01" + struct.pack(">I", 0)
    await raw.send_raw(method_frame(1, 50, 10, passive))
    close = await raw.expect(commands.Channel.Close, 1)
    assert (close.reply_code, close.class_id, close.method_id) == (404, 50, 10)
    assert close.reply_text.startswith("NOT_FOUND - no queue 'üü")
    assert len(close.reply_text.encode()) <= 255
    await raw.send(1, commands.Channel.CloseOk())
    await raw.open_channel(1)


async def test_connection_error_text_naming_a_long_multibyte_vhost_fits(raw: RawConnection) -> None:
    vhost = "é" * 127
    await raw.send_raw(PROTOCOL_HEADER)
    await raw.expect(commands.Connection.Start)
    await raw.send(
        0,
        commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"
        ),
    )
    tune = await raw.expect(commands.Connection.Tune)
    await raw.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
    # Connection.Open: virtual-host, capabilities (empty), insist (off).
    await raw.send_raw(method_frame(0, 10, 40, shortstr(vhost) + b"\x00\x00"))
    close = await raw.expect_connection_close(530, 10, 40)
    assert len(close.reply_text.encode()) <= 255


# -- pathological but legal topologies and headers -------------------------------------------


async def wait_for_count(bystander: Bystander, queue: str, count: int) -> None:
    async with asyncio.timeout(READ_TIMEOUT):
        while True:
            declared = await bystander.declare_queue(queue, passive=True)
            if declared.declaration_result.message_count == count:
                return
            await asyncio.sleep(0.02)


async def test_dead_letter_loop_with_ttl_zero_and_a_consumer(
    raw: RawConnection, bystander: Bystander, server: ServerProcess
) -> None:
    """A queue that dead-letters to itself with TTL 0 used to recurse until Python gave up,
    and the publisher was closed with 502."""
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        name = unique("ttl0-loop")
        queue = await channel.declare_queue(
            name, exclusive=True, arguments={"x-message-ttl": 0, "x-dead-letter-exchange": ""}
        )
        received: list[bytes] = []

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            received.append(message.body)

        await queue.consume(on_message, no_ack=True)
        confirmation = await channel.default_exchange.publish(aio_pika.Message(b"x"), name)
        assert isinstance(confirmation, commands.Basic.Ack)
        await channel.default_exchange.publish(aio_pika.Message(b"y"), name)
        assert not connection.is_closed
        # TTL 0 still reaches a consumer that is ready when the message arrives.
        async with asyncio.timeout(READ_TIMEOUT):
            while len(received) < 2:
                await asyncio.sleep(0.01)
        assert received == [b"x", b"y"]


async def test_forged_x_death_count_does_not_stop_the_sweep(
    raw: RawConnection, bystander: Bystander
) -> None:
    """x-death comes from the publisher; its count used to go through int(), and a count
    like "many" raised inside the broker's periodic sweep, which then never ran again."""
    assert bystander.channel is not None
    channel = bystander.channel
    exchange = await channel.declare_exchange(unique("dlx"), "fanout", auto_delete=True)
    parked = await channel.declare_queue(unique("parked"), auto_delete=True)
    await parked.bind(exchange)
    source = await channel.declare_queue(
        unique("forged"),
        auto_delete=True,
        arguments={"x-message-ttl": 20, "x-dead-letter-exchange": exchange.name},
    )
    forged = [{"queue": source.name, "reason": "expired", "count": "many"}]
    await channel.default_exchange.publish(
        aio_pika.Message(b"forged", headers={"x-death": forged}), source.name
    )
    await wait_for_count(bystander, parked.name, 1)
    message = await parked.get(no_ack=True)
    assert message.headers["x-death"][0]["count"] == 1
    probe = await channel.declare_queue(
        unique("ttl-probe"), auto_delete=True, arguments={"x-message-ttl": 20}
    )
    await channel.default_exchange.publish(aio_pika.Message(b"x"), probe.name)
    await wait_for_count(bystander, probe.name, 0)


async def test_binary_header_is_dead_lettered_by_the_sweep(
    raw: RawConnection, bystander: Bystander
) -> None:
    """A longstr header that is not UTF-8 made re-encoding fail inside the TTL sweep."""
    assert bystander.channel is not None
    channel = bystander.channel
    exchange = await channel.declare_exchange(unique("dlx"), "fanout", auto_delete=True)
    parked = await channel.declare_queue(unique("parked"), auto_delete=True)
    await parked.bind(exchange)
    source = await channel.declare_queue(
        unique("binary"),
        auto_delete=True,
        arguments={"x-message-ttl": 20, "x-dead-letter-exchange": exchange.name},
    )
    await raw.handshake()
    await raw.open_channel()
    table = b"\x03binS" + struct.pack(">I", 3) + b"\xff\x00\xfe"
    header = struct.pack(">HHQH", 60, 0, 2, 0x2000) + struct.pack(">I", len(table)) + table
    await raw.send_raw(publish(1, source.name) + raw_frame(2, 1, header) + raw_frame(3, 1, b"hi"))
    await wait_for_count(bystander, parked.name, 1)
    message = await parked.get(no_ack=True)
    assert message.body == b"hi"
    assert bytes(message.headers["bin"]) == b"\xff\x00\xfe"
    assert message.headers["x-death"][0]["reason"] == "expired"
    probe = await channel.declare_queue(
        unique("ttl-probe"), auto_delete=True, arguments={"x-message-ttl": 20}
    )
    await channel.default_exchange.publish(aio_pika.Message(b"x"), probe.name)
    await wait_for_count(bystander, probe.name, 0)


async def test_after_a_framing_error_the_socket_closes_without_waiting_for_close_ok(
    raw: RawConnection,
) -> None:
    # The stream is misaligned after a bad end byte: no Close-Ok could be parsed from it.
    await raw.handshake()
    await raw.send_raw(raw_frame(1, 1, frame.marshal(commands.Channel.Open(), 1)[7:-1], b"\x00"))
    close = await raw.expect(commands.Connection.Close)
    assert close.reply_code == 501
    assert await raw.expect_eof() == b""


async def test_garbage_on_a_closing_channel_is_dropped_not_escalated(raw: RawConnection) -> None:
    await raw.handshake()
    await raw.open_channel()
    missing = unique("missing")
    await raw.send(1, commands.Queue.Declare(queue=missing, passive=True))
    close = await raw.expect(commands.Channel.Close, 1)
    assert close.reply_code == 404
    # What the client had in flight before it read our Close: an unknown method, an
    # undecodable one, a stray body. All dropped; the connection stays up.
    await raw.send_raw(method_frame(1, 60, 999))
    await raw.send_raw(method_frame(1, 50, 10, b"\xff\xff"))
    await raw.send_raw(raw_frame(3, 1, b"stray body"))
    await raw.send(1, commands.Channel.CloseOk())
    await raw.open_channel(1)
    await raw.send(1, commands.Queue.Declare(queue=unique("after"), auto_delete=True))
    await raw.expect(commands.Queue.DeclareOk, 1)


# -- names in the server's log ---------------------------------------------------------------

LOG_LINE_START = "2026-01-01 00:00:00,000 badinput ERROR amqha.server:"


async def name_in_an_error(raw: RawConnection, kind: str, name: str) -> None:
    """Make the server log an error whose reply text names ``name`` as a ``kind``."""
    if kind == "vhost":
        await raw.send_raw(PROTOCOL_HEADER)
        await raw.expect(commands.Connection.Start)
        await raw.send_raw(start_ok(b"PLAIN", b"\0guest\0guest"))
        tune = await raw.expect(commands.Connection.Tune)
        await raw.send(
            0,
            commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0),
            commands.Connection.Open(virtual_host=name),
        )
        await raw.expect(commands.Connection.Close)  # 530: no such vhost
        return
    await raw.handshake()
    await raw.open_channel()
    no_table = struct.pack(">I", 0)
    if kind == "queue":
        arguments = struct.pack(">H", 0) + shortstr(name) + b"\x01" + no_table
        await raw.send_raw(method_frame(1, 50, 10, arguments))  # passive: 404
        await raw.expect(commands.Channel.Close, 1)
    elif kind == "exchange":
        arguments = struct.pack(">H", 0) + shortstr(name) + shortstr("direct") + b"\x01" + no_table
        await raw.send_raw(method_frame(1, 40, 10, arguments))  # passive: 404
        await raw.expect(commands.Channel.Close, 1)
    else:
        queue = unique("tags")
        await raw.send(1, commands.Queue.Declare(queue=queue, auto_delete=True))
        await raw.expect(commands.Queue.DeclareOk, 1)
        consume = method_frame(
            1, 60, 20, struct.pack(">H", 0) + shortstr(queue) + shortstr(name) + b"\x00" + no_table
        )
        await raw.send_raw(consume + consume)  # the second reuses the tag: 530
        await raw.expect(commands.Basic.ConsumeOk, 1)
        await raw.expect(commands.Connection.Close)


@pytest.mark.parametrize("kind", ["queue", "exchange", "consumer-tag", "vhost"])
async def test_a_client_chosen_name_cannot_forge_a_log_line(
    raw: RawConnection, server: ServerProcess, kind: str
) -> None:
    """A name with a newline in it was logged as it stood: everything after the newline
    read as a line of the server's own. Control characters are escaped now."""
    name = f"{kind}\n{LOG_LINE_START} forged by a {kind} name\x1b[2J"
    await name_in_an_error(raw, kind, name)
    escaped = f"{kind}\\n{LOG_LINE_START} forged by a {kind} name\\x1b[2J"
    async with asyncio.timeout(READ_TIMEOUT):
        while escaped not in server.log():
            await asyncio.sleep(0.05)
    log = server.log()
    assert not [line for line in log.splitlines() if line.startswith(LOG_LINE_START)]
    assert "\x1b" not in log
