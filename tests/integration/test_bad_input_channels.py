"""Bad input never breaks the broker: on channels, in names (any UTF-8, long multibyte
ones in error texts, ones that try to forge a line of the server's log) and in pathological
but legal topologies and headers.

As in test_bad_input.py: a raw client sends one kind of bad input per test and checks
exactly what the server answers; after every case a bystander connection and a fresh
aio-pika connection both still publish and consume, and the server process is alive.
"""

from __future__ import annotations

import asyncio
import struct

import aio_pika
import pytest
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.integration import bad_input_support
from tests.integration.bad_input_support import (
    PROTOCOL_HEADER,
    READ_TIMEOUT,
    Bystander,
    RawConnection,
    content_header,
    method_frame,
    publish,
    raw_frame,
    start_ok,
    unique,
)
from tests.support import ServerProcess

# This module's own server, and the two connections every case is checked with.
server = bad_input_support.server
bystander = bad_input_support.bystander
raw = bad_input_support.raw

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


# -- a publish and its content in one read ------------------------------------------------
# The server takes a Basic.Publish, its header and a body that arrive together in one
# call (its hot path); each failure at each of the three frames must end as it does
# frame by frame.


@pytest.mark.parametrize(
    ("exchange", "properties", "code", "ids"),
    [
        ("amq.peer", commands.Basic.Properties(), 403, (60, 40)),
        ("", commands.Basic.Properties(user_id="someone-else"), 406, (0, 0)),
    ],
    ids=["publish refused", "header refused"],
)
async def test_a_publish_refused_with_its_content_in_one_write_closes_only_the_channel(
    raw: RawConnection,
    exchange: str,
    properties: commands.Basic.Properties,
    code: int,
    ids: tuple[int, int],
) -> None:
    """The rest of the write (the refused publish's own content, another publish) is
    dropped with the closing channel; the other channel carries on."""
    await raw.handshake()
    await raw.open_channel(1)
    await raw.open_channel(2)
    await raw.send(
        1,
        commands.Basic.Publish(exchange=exchange, routing_key=unique("q")),
        ContentHeader(0, 5, properties),
        ContentBody(b"hello"),
        commands.Basic.Publish(exchange="", routing_key="x"),  # on the closing channel
        ContentHeader(0, 5, commands.Basic.Properties()),
        ContentBody(b"hello"),
    )
    close = await raw.expect(commands.Channel.Close, 1)
    assert (close.reply_code, close.class_id, close.method_id) == (code, *ids), close
    await raw.send(2, commands.Queue.Declare(queue=unique("ok"), auto_delete=True))
    await raw.expect(commands.Queue.DeclareOk, 2)


async def test_a_body_after_an_empty_message_in_the_same_write_is_505(
    raw: RawConnection,
) -> None:
    queue = unique("empty")
    await raw.handshake()
    await raw.open_channel(1)
    await raw.send(1, commands.Queue.Declare(queue=queue, auto_delete=True))
    await raw.expect(commands.Queue.DeclareOk, 1)
    await raw.send(
        1,
        commands.Basic.Publish(exchange="", routing_key=queue),
        ContentHeader(0, 0, commands.Basic.Properties()),
        ContentBody(b"extra"),
    )
    await raw.expect_connection_close(505)
