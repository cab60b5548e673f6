"""Bad input never breaks the broker: before the handshake, in the framing, in the methods
and in the content sequence.

A raw client (tests/integration/bad_input_support.py) sends one kind of broken input per
test and checks exactly what the server answers. After every case a connection opened
before the bad one (``bystander``) and a fresh aio-pika connection both still publish and
consume, and the server process is alive. Channels, names, pathological topologies and
names in the log: test_bad_input_channels.py.
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

# This module's own server, and the two connections every case is checked with.
server = bad_input_support.server
bystander = bad_input_support.bystander
raw = bad_input_support.raw

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
