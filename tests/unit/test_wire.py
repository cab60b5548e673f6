"""amqha.wire against pamqp: framing, decoding errors, and the hand-written encoders.

Every fast encoder must produce exactly the bytes pamqp produces for the same frames;
the reference frames here are built only with pamqp.frame.marshal and pamqp's classes.
"""

from __future__ import annotations

import importlib.util
import struct
import types
import typing
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from librt.strings import BytesWriter
from pamqp import base, commands, exceptions, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader, ProtocolHeader
from pamqp.heartbeat import Heartbeat

import amqha
from amqha import wire


def interpreted_wire() -> types.ModuleType:
    """amqha/wire.py run from its source, whether or not amqha.wire is compiled."""
    source = Path(amqha.__file__).with_name("wire.py")
    spec = importlib.util.spec_from_file_location("amqha_wire_source", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Redirect(base.Frame):
    """Connection.Redirect (AMQP 0-9, class 10 method 42), declared the way pamqp declares
    its own methods so that pamqp's generic marshal encodes it."""

    __slots__: typing.ClassVar[list[str]] = ["host", "known_hosts"]
    frame_id = 42
    index = 0x000A002A
    name = "Connection.Redirect"
    _host = "shortstr"
    _known_hosts = "shortstr"

    def __init__(self, host: str, known_hosts: str) -> None:
        self.host = host
        self.known_hosts = known_hosts


def reference_content(
    channel: int, properties: commands.Basic.Properties, body: bytes, frame_max: int
) -> bytes:
    """Content header and body frames as pamqp marshals them, the body cut at frame_max."""
    parts = [frame.marshal(ContentHeader(0, len(body), properties), channel)]
    chunk = frame_max - 8
    for start in range(0, len(body), chunk):
        parts.append(frame.marshal(ContentBody(body[start : start + chunk]), channel))
    return b"".join(parts)


def header_payload(properties: commands.Basic.Properties, body: bytes) -> bytes:
    return ContentHeader(0, len(body), properties).marshal()


# -- split_frames ---------------------------------------------------------------------


def marshalled(*frames: tuple[object, int]) -> bytes:
    return b"".join(frame.marshal(value, channel) for value, channel in frames)  # type: ignore[arg-type]


SAMPLE = marshalled(
    (commands.Channel.Open(), 1),
    (commands.Basic.Publish(exchange="amq.direct", routing_key="k"), 1),
    (ContentHeader(0, 5, commands.Basic.Properties(content_type="text/plain")), 1),
    (ContentBody(b"hello"), 1),
    (Heartbeat(), 0),
)


def test_split_several_frames_at_once() -> None:
    frames, used = wire.split_frames(SAMPLE, 131072)
    assert used == len(SAMPLE)
    assert [(f.kind, f.channel) for f in frames] == [(1, 1), (1, 1), (2, 1), (3, 1), (8, 0)]
    assert frames[3].payload == b"hello"
    assert frames[0].payload == struct.pack(">I", commands.Channel.Open.index) + b"\x010"


def test_split_byte_by_byte_gives_the_same_frames() -> None:
    buffer = bytearray()
    got = []
    for byte in SAMPLE:
        buffer.append(byte)
        frames, used = wire.split_frames(buffer, 131072)
        got += frames
        del buffer[:used]
    assert not buffer
    whole, _ = wire.split_frames(SAMPLE, 131072)
    assert [(f.kind, f.channel, f.payload) for f in got] == [
        (f.kind, f.channel, f.payload) for f in whole
    ]


def test_split_leaves_a_partial_frame_unconsumed() -> None:
    first = marshalled((commands.Channel.Open(), 1))
    data = first + SAMPLE[len(first) : len(first) + 9]
    frames, used = wire.split_frames(data, 131072)
    assert len(frames) == 1 and used == len(first)
    # A frame complete except for its end byte is still partial.
    frames, used = wire.split_frames(first[:-1], 131072)
    assert (frames, used) == ([], 0)


def test_frame_max_is_checked_on_the_header_alone() -> None:
    huge_header = struct.pack(">BHI", 1, 1, 0xFFFFFFF0)
    with pytest.raises(exceptions.AMQPFrameError, match="exceeds frame_max"):
        wire.split_frames(huge_header, 4096)


def test_frame_max_counts_the_whole_frame() -> None:
    exact = frame.marshal(ContentBody(b"x" * (4096 - 8)), 1)
    frames, used = wire.split_frames(exact, 4096)
    assert len(frames) == 1 and used == 4096
    over = frame.marshal(ContentBody(b"x" * (4096 - 7)), 1)
    with pytest.raises(exceptions.AMQPFrameError):
        wire.split_frames(over[:7], 4096)


def test_bad_end_byte_is_a_frame_error() -> None:
    good = marshalled((commands.Channel.Open(), 1))
    bad = good[:-1] + b"\x00"
    with pytest.raises(exceptions.AMQPFrameError, match="end byte"):
        wire.split_frames(good + bad, 131072)
    assert exceptions.AMQPFrameError.value == 501


# -- decode_method --------------------------------------------------------------------


def test_decode_method_round_trips_pamqp() -> None:
    sent = commands.Queue.Declare(queue="q1", durable=True, arguments={"x-max-length": 3})
    payload = frame.marshal(sent, 1)[7:-1]
    method = wire.decode_method(payload)
    assert isinstance(method, commands.Queue.Declare)
    assert (method.queue, method.durable, method.arguments) == ("q1", True, {"x-max-length": 3})


def test_unknown_class_is_540() -> None:
    with pytest.raises(exceptions.AMQPNotImplemented):
        wire.decode_method(struct.pack(">HH", 99, 10))
    assert exceptions.AMQPNotImplemented.value == 540


def test_unknown_method_of_a_known_class_is_503() -> None:
    with pytest.raises(exceptions.AMQPCommandInvalid):
        wire.decode_method(struct.pack(">HH", 60, 999))
    assert exceptions.AMQPCommandInvalid.value == 503


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x00\x32",
        # Queue.Declare whose arguments table has an unknown type tag.
        struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00" + struct.pack(">I", 4) + b"\x01k?\x00",
        # ... and one whose table length runs past the end of the frame.
        struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00" + struct.pack(">I", 400) + b"\x01kt\x01",
        # A shortstr that is not UTF-8.
        struct.pack(">HHH", 50, 10, 0) + b"\x02\xff\xfe\x00" + struct.pack(">I", 0),
        # Connection.Tune cut short.
        struct.pack(">HH", 10, 30) + b"\x00",
    ],
    ids=["empty", "half-index", "bad-tag", "table-too-long", "not-utf8", "truncated"],
)
def test_undecodable_arguments_are_502(payload: bytes) -> None:
    with pytest.raises(exceptions.AMQPSyntaxError):
        wire.decode_method(payload)
    assert exceptions.AMQPSyntaxError.value == 502


# -- decode_publish -------------------------------------------------------------------

EXCHANGE_NAMES = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:@#,/+ ",
    max_size=127,
)
ROUTING_KEYS = st.text(max_size=60).filter(lambda s: len(s.encode()) <= 255)


@settings(max_examples=300, deadline=None)
@given(EXCHANGE_NAMES, ROUTING_KEYS, st.booleans(), st.booleans(), st.integers(0, 65535))
def test_decode_publish_equals_pamqp(
    exchange: str, routing_key: str, mandatory: bool, immediate: bool, ticket: int
) -> None:
    method = commands.Basic.Publish(0, exchange, routing_key, mandatory, immediate)
    # The ticket is deprecated (pamqp only encodes 0) but must still be skipped when read.
    payload = bytearray(frame.marshal(method, 1)[7:-1])
    payload[4:6] = struct.pack(">H", ticket)
    payload = bytes(payload)
    fast = wire.decode_publish(payload)
    slow = wire.decode_method(payload)
    assert isinstance(slow, commands.Basic.Publish)
    assert (fast.exchange, fast.routing_key, fast.mandatory, fast.immediate) == (
        slow.exchange,
        slow.routing_key,
        slow.mandatory,
        slow.immediate,
    )
    assert fast.address == wire.address_of(exchange, routing_key)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_decode_publish_on_random_arguments(arguments: bytes) -> None:
    """Whatever the fast path accepts, pamqp decodes to the same values."""
    payload = struct.pack(">I", commands.Basic.Publish.index) + arguments
    try:
        fast = wire.decode_publish(payload)
    except exceptions.AMQPSyntaxError:
        return
    slow = commands.Basic.Publish()
    slow.unmarshal(payload[4:])
    assert (fast.exchange, fast.routing_key, fast.mandatory, fast.immediate) == (
        slow.exchange,
        slow.routing_key,
        slow.mandatory,
        slow.immediate,
    )


@pytest.mark.parametrize(
    "arguments",
    [
        b"",
        b"\x00\x00",
        b"\x00\x00\x05ab",
        b"\x00\x00\x00\x03k",
        b"\x00\x00\x00\x00\x00\x00",
        b"\x00\x00\x01\xff\x00\x00",
    ],
    ids=["empty", "ticket-only", "short-exchange", "short-key", "trailing", "not-utf8"],
)
def test_decode_publish_rejects_malformed(arguments: bytes) -> None:
    with pytest.raises(exceptions.AMQPSyntaxError):
        wire.decode_publish(struct.pack(">I", commands.Basic.Publish.index) + arguments)


def test_content_body_size_and_its_errors() -> None:
    payload = header_payload(commands.Basic.Properties(), b"x" * 70000)
    assert wire.content_body_size(payload) == 70000
    with pytest.raises(exceptions.AMQPFrameError):
        wire.content_body_size(payload[:13])
    with pytest.raises(exceptions.AMQPFrameError):
        wire.content_body_size(struct.pack(">H", 50) + payload[2:])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2**63 - 1), st.booleans(), st.integers(0, 2**64 - 1))
def test_acks_indexes_and_body_sizes_read_byte_by_byte_equal_pamqps(
    delivery_tag: int, multiple: bool, body_size: int
) -> None:
    ack = frame.marshal(commands.Basic.Ack(delivery_tag, multiple), 1)[7:-1]
    assert wire.decode_ack(ack) == (delivery_tag, multiple)
    assert wire.method_index(ack) == commands.Basic.Ack.index
    header = ContentHeader(0, body_size, commands.Basic.Properties()).marshal()
    assert wire.content_body_size(header) == body_size
    with pytest.raises(exceptions.AMQPSyntaxError):
        wire.check_properties(header[:13])


def test_decode_ack() -> None:
    payload = frame.marshal(commands.Basic.Ack(77, True), 1)[7:-1]
    assert wire.decode_ack(payload) == (77, True)
    with pytest.raises(exceptions.AMQPSyntaxError):
        wire.decode_ack(payload + b"\x00")


# -- encoders -------------------------------------------------------------------------

PROPERTIES = st.builds(
    commands.Basic.Properties,
    content_type=st.sampled_from([None, "text/plain", "application/json"]),
    headers=st.one_of(
        st.none(),
        st.dictionaries(st.text("abcxyz", min_size=1, max_size=5), st.integers(-5, 5), max_size=3),
    ),
    delivery_mode=st.sampled_from([None, 1, 2]),
    priority=st.one_of(st.none(), st.integers(0, 9)),
    correlation_id=st.one_of(st.none(), st.text("0123456789abcdef", max_size=16)),
    expiration=st.one_of(st.none(), st.integers(0, 10**6).map(str)),
    message_id=st.one_of(st.none(), st.text(max_size=10).filter(lambda s: len(s.encode()) < 256)),
)
FRAME_MAX = st.integers(4096, 9000)
BODIES = st.one_of(st.binary(max_size=64), st.binary(min_size=4000, max_size=20000))
# pamqp encodes a longlong as signed, so its reference stops at 2**63 - 1.
TAGS = st.integers(1, 2**63 - 1)
CONSUMER_TAGS = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 65535),
    CONSUMER_TAGS,
    TAGS,
    st.booleans(),
    EXCHANGE_NAMES,
    ROUTING_KEYS,
    PROPERTIES,
    BODIES,
    FRAME_MAX,
)
def test_deliver_frames_equal_pamqp(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    properties: commands.Basic.Properties,
    body: bytes,
    frame_max: int,
) -> None:
    ours = wire.deliver_frames(
        channel,
        wire.shortstr(consumer_tag),
        delivery_tag,
        redelivered,
        wire.address_of(exchange, routing_key),
        header_payload(properties, body),
        body,
        frame_max,
    )
    deliver = commands.Basic.Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    reference = frame.marshal(deliver, channel) + reference_content(
        channel, properties, body, frame_max
    )
    assert ours == reference


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 65535),
    TAGS,
    st.booleans(),
    EXCHANGE_NAMES,
    ROUTING_KEYS,
    st.integers(0, 2**32 - 1),
    PROPERTIES,
    BODIES,
    FRAME_MAX,
)
def test_get_ok_frames_equal_pamqp(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    message_count: int,
    properties: commands.Basic.Properties,
    body: bytes,
    frame_max: int,
) -> None:
    ours = wire.get_ok_frames(
        channel,
        delivery_tag,
        redelivered,
        wire.address_of(exchange, routing_key),
        message_count,
        header_payload(properties, body),
        body,
        frame_max,
    )
    get_ok = commands.Basic.GetOk(delivery_tag, redelivered, exchange, routing_key, message_count)
    assert ours == frame.marshal(get_ok, channel) + reference_content(
        channel, properties, body, frame_max
    )


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 65535),
    st.sampled_from([312, 313]),
    st.text(max_size=50).filter(lambda s: len(s.encode()) <= 255),
    EXCHANGE_NAMES,
    ROUTING_KEYS,
    PROPERTIES,
    BODIES,
    FRAME_MAX,
)
def test_return_frames_equal_pamqp(
    channel: int,
    reply_code: int,
    reply_text: str,
    exchange: str,
    routing_key: str,
    properties: commands.Basic.Properties,
    body: bytes,
    frame_max: int,
) -> None:
    ours = wire.return_frames(
        channel,
        reply_code,
        reply_text,
        wire.address_of(exchange, routing_key),
        header_payload(properties, body),
        body,
        frame_max,
    )
    returned = commands.Basic.Return(reply_code, reply_text, exchange, routing_key)
    assert ours == frame.marshal(returned, channel) + reference_content(
        channel, properties, body, frame_max
    )


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 65535), TAGS, st.booleans(), st.booleans())
def test_ack_and_nack_frames_equal_pamqp(
    channel: int, delivery_tag: int, multiple: bool, requeue: bool
) -> None:
    assert wire.ack_frame(channel, delivery_tag, multiple) == frame.marshal(
        commands.Basic.Ack(delivery_tag, multiple), channel
    )
    assert wire.nack_frame(channel, delivery_tag, multiple, requeue) == frame.marshal(
        commands.Basic.Nack(delivery_tag, multiple, requeue), channel
    )


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**63 - 1),
    st.dictionaries(st.text(max_size=20), st.one_of(st.booleans(), st.text(max_size=64))),
)
def test_a_header_of_headers_alone_equals_pamqp(body_size: int, headers: dict) -> None:
    """The replication feed's content header (a run's MAC and marks as headers): what
    pamqp reads from it, and what the link reads (keys in pamqp's order or not)."""
    ours = wire.headers_header(body_size, headers)
    read = ContentHeader()
    read.unmarshal(ours)
    assert (read.body_size, read.properties) == (
        body_size,
        commands.Basic.Properties(headers=headers),
    )
    assert wire.content_body_size(ours) == body_size
    assert wire.decode_properties(ours).headers == headers


@settings(max_examples=200, deadline=None)
@given(TAGS, st.text(max_size=255).filter(lambda t: len(t.encode()) < 256), st.booleans())
def test_the_delivery_tag_of_a_deliver_is_read_as_pamqp_writes_it(
    delivery_tag: int, consumer_tag: str, redelivered: bool
) -> None:
    deliver = commands.Basic.Deliver(consumer_tag, delivery_tag, redelivered, "x", "key")
    payload = frame.marshal(deliver, 1)[7:-1]
    assert wire.deliver_tag(payload) == delivery_tag
    for cut in (0, 4, 5, len(payload) - len("x") - len("key") - 3):
        with pytest.raises(exceptions.AMQPFrameError):
            wire.deliver_tag(payload[:cut])


def test_nack_defaults_to_no_requeue() -> None:
    assert wire.nack_frame(3, 9, False) == frame.marshal(commands.Basic.Nack(9, False, False), 3)


@pytest.mark.parametrize("frame_max", [4096, 4097, 10000])
@pytest.mark.parametrize("size", [0, 1, 4087, 4088, 4089, 8176, 8177, 30000])
def test_content_frames_split_at_frame_max(frame_max: int, size: int) -> None:
    body = bytes(i % 251 for i in range(size))
    properties = commands.Basic.Properties(content_type="application/octet-stream")
    ours = wire.content_frames(5, header_payload(properties, body), body, frame_max)
    assert ours == reference_content(5, properties, body, frame_max)
    frames, used = wire.split_frames(ours, frame_max)
    assert used == len(ours)
    assert all(len(f.payload) + 8 <= frame_max for f in frames)
    assert b"".join(f.payload for f in frames[1:]) == body


@pytest.mark.parametrize(
    "method",
    [
        commands.Connection.Close(501, "FRAME_ERROR - x", 0, 0),
        commands.Channel.Close(406, "PRECONDITION_FAILED - y", 50, 10),
        commands.Queue.DeclareOk("q", 3, 1),
        commands.Basic.ConsumeOk("ctag"),
        commands.Connection.Tune(2047, 131072, 60),
        commands.Connection.Start(
            server_properties={"product": "amqha", "capabilities": {"basic.nack": True}},
            mechanisms="PLAIN AMQPLAIN",
            locales="en_US",
        ),
    ],
    ids=lambda m: m.name,
)
def test_method_frame_equals_pamqp(method: base.Frame) -> None:
    assert wire.method_frame(7, method) == frame.marshal(method, 7)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60), st.text(max_size=120))
def test_redirect_frame_equals_pamqp(host: str, known_hosts: str) -> None:
    if len(host.encode()) > 255 or len(known_hosts.encode()) > 255:
        with pytest.raises(ValueError):
            wire.redirect_frame(host, known_hosts)
        return
    assert wire.redirect_frame(host, known_hosts) == frame.marshal(Redirect(host, known_hosts), 0)


def test_redirect_frame_decodes_as_class_10_method_42() -> None:
    data = wire.redirect_frame("127.0.0.1:5673", "127.0.0.1:5672,127.0.0.1:5673")
    (raw,), _ = wire.split_frames(data, 4096)
    assert (raw.kind, raw.channel) == (1, 0)
    assert struct.unpack_from(">HH", raw.payload) == wire.REDIRECT_CLASS_METHOD
    redirect = Redirect("", "")
    redirect.unmarshal(raw.payload[4:])
    assert (redirect.host, redirect.known_hosts) == (
        "127.0.0.1:5673",
        "127.0.0.1:5672,127.0.0.1:5673",
    )


def test_heartbeat_and_protocol_header_constants() -> None:
    assert Heartbeat().marshal() == wire.HEARTBEAT_FRAME
    assert frame.marshal(ProtocolHeader(), 0) == wire.PROTOCOL_HEADER


# -- check_properties -------------------------------------------------------------------

HEADER_PREFIX = struct.pack(">HHQ", 60, 0, 3)


@settings(max_examples=300, deadline=None)
@given(
    PROPERTIES,
    st.one_of(st.none(), st.datetimes(datetime(1971, 1, 1), datetime(2100, 1, 1))),
    st.sampled_from([None, "", "u", "é"]),
)
def test_check_properties_accepts_what_pamqp_marshals(
    properties: commands.Basic.Properties, timestamp: typing.Any, user_id: str | None
) -> None:
    properties.timestamp = timestamp
    properties.user_id = user_id
    wire.check_properties(header_payload(properties, b"abc"))


@settings(max_examples=1000, deadline=None)
@given(
    st.one_of(
        st.integers(0, 0xFFFF),
        st.sets(st.sampled_from(list(commands.Basic.Properties.flags.values())), max_size=3).map(
            sum
        ),
    ),
    st.binary(max_size=40),
)
def test_check_properties_passes_only_what_pamqp_decodes(flags: int, rest: bytes) -> None:
    payload = HEADER_PREFIX + struct.pack(">H", flags) + rest
    try:
        wire.check_properties(payload)
    except exceptions.AMQPSyntaxError:
        return
    ContentHeader().unmarshal(payload)


@pytest.mark.parametrize(
    ("flags", "rest"),
    [
        (0x8000, b""),  # content_type flagged, no bytes
        (0x8000, b"\x05abc"),  # content_type shorter than its length
        (0x8000, b"\x02\xc3\x28"),  # content_type not UTF-8
        (0x1000, b""),  # delivery_mode missing
        (0x2000, struct.pack(">I", 4) + b"\x01k?\x00"),  # headers with a bad type tag
        (0x2000, struct.pack(">I", 99) + b"\x01kt\x01"),  # headers longer than the frame
        (0x2000, b"\x00\x00"),  # headers table length cut short
        (0x0040, b"\x00\x00\x01"),  # timestamp cut short
        (0x0001, b""),  # a second flag word announced, not there
        (0x0010, b"\x04gu"),  # user_id cut short
    ],
    ids=[
        "no-bytes",
        "short-string",
        "not-utf8",
        "no-octet",
        "bad-tag",
        "table-too-long",
        "table-length-cut",
        "timestamp-cut",
        "flag-word-missing",
        "user-id-cut",
    ],
)
def test_check_properties_refuses_malformed(flags: int, rest: bytes) -> None:
    with pytest.raises(exceptions.AMQPSyntaxError):
        wire.check_properties(HEADER_PREFIX + struct.pack(">H", flags) + rest)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 65535),
    st.text(alphabet="abcXYZ019-_.:", max_size=200),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
)
def test_declare_ok_frame_equals_pamqp(
    channel: int, queue: str, message_count: int, consumer_count: int
) -> None:
    assert wire.declare_ok_frame(channel, queue, message_count, consumer_count) == frame.marshal(
        commands.Queue.DeclareOk(queue, message_count, consumer_count), channel
    )


@pytest.mark.parametrize("queue", ["очередь", "a!b", "é" * 127], ids=["cyrillic", "bang", "254"])
def test_declare_ok_frame_encodes_names_pamqp_refuses(queue: str) -> None:
    with pytest.raises(ValueError):
        commands.Queue.DeclareOk(queue, 1, 2)
    data = wire.declare_ok_frame(4, queue, 1, 2)
    _, channel, decoded = frame.unmarshal(data)
    assert channel == 4
    assert (decoded.queue, decoded.message_count, decoded.consumer_count) == (queue, 1, 2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("short", "short"),
        ("a" * 300, "a" * 255),
        ("é" * 200, "é" * 127),
        ("a" + "€" * 100, "a" + "€" * 84),
    ],
    ids=["short", "ascii", "two-byte", "three-byte"],
)
def test_reply_text_fits_a_shortstr_without_splitting_characters(text: str, expected: str) -> None:
    fitted = wire.reply_text(text)
    assert fitted == expected
    assert len(fitted.encode()) <= 255
    frame.marshal(commands.Channel.Close(404, fitted, 50, 10), 1)


# -- decode_properties --------------------------------------------------------------------

FIELD_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        st.text(max_size=20),
        st.binary(max_size=10).map(bytearray),
        st.datetimes(datetime(1971, 1, 1), datetime(2100, 1, 1)),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text("abcxyz", min_size=1, max_size=4), children, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    PROPERTIES,
    st.dictionaries(st.text(max_size=8).filter(lambda k: len(k.encode()) < 256), FIELD_VALUES),
    st.one_of(st.none(), st.datetimes(datetime(1971, 1, 1), datetime(2100, 1, 1))),
)
def test_decode_properties_equals_pamqp(
    properties: commands.Basic.Properties, headers: dict[str, typing.Any], timestamp: typing.Any
) -> None:
    properties.headers = headers or properties.headers
    properties.timestamp = timestamp
    payload = header_payload(properties, b"abc")
    expected = ContentHeader()
    expected.unmarshal(payload)
    decoded = wire.decode_properties(payload)
    for name in commands.Basic.Properties.__slots__:
        assert getattr(decoded, name) == getattr(expected.properties, name), name


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60))
def test_decode_properties_passes_only_what_pamqp_decodes(table: bytes) -> None:
    payload = HEADER_PREFIX + struct.pack(">HI", 0x2000, len(table)) + table
    try:
        decoded = wire.decode_properties(payload)
    except exceptions.AMQPSyntaxError:
        return
    expected = ContentHeader()
    expected.unmarshal(payload)
    assert decoded.headers == expected.properties.headers


def test_tables_nested_deeper_than_the_limit_are_502() -> None:
    def nested(depth: int) -> dict[str, typing.Any]:
        table: dict[str, typing.Any] = {}
        for _ in range(depth - 1):
            table = {"t": table}
        return table

    fits = header_payload(commands.Basic.Properties(headers=nested(wire.MAX_TABLE_DEPTH)), b"")
    assert wire.decode_properties(fits).headers == nested(wire.MAX_TABLE_DEPTH)
    deep = header_payload(commands.Basic.Properties(headers=nested(wire.MAX_TABLE_DEPTH + 1)), b"")
    with pytest.raises(exceptions.AMQPSyntaxError, match="nested deeper than 32"):
        wire.decode_properties(deep)
    with pytest.raises(exceptions.AMQPSyntaxError, match="nested deeper than 32"):
        wire.check_properties(deep)


def test_check_properties_returns_the_decoded_table_for_routing() -> None:
    payload = header_payload(commands.Basic.Properties(headers={"k": [1, {"a": "b"}]}), b"")
    decoded = wire.check_properties(payload)
    assert decoded is not None and decoded.headers == {"k": [1, {"a": "b"}]}
    assert wire.check_properties(header_payload(commands.Basic.Properties(), b"")) is None


# -- method frames' field tables ------------------------------------------------------

ARGUMENT_VALUES: dict[str, st.SearchStrategy[typing.Any]] = {
    "bit": st.booleans(),
    "octet": st.integers(0, 255),
    "short": st.integers(0, 2**16 - 1),
    "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**63 - 1),
    "shortstr": st.one_of(st.just(""), st.text("abc-_.:", max_size=20)),
    "longstr": st.text(max_size=40),
    "table": st.dictionaries(
        st.text(max_size=8).filter(lambda k: len(k.encode()) < 256), FIELD_VALUES, max_size=5
    ),
}


def method_with(draw: typing.Callable[..., typing.Any]) -> base.Frame:
    method_class = draw(st.sampled_from(list(commands.INDEX_MAPPING.values())))
    method = method_class.__new__(method_class)
    for name in method_class.__slots__:
        setattr(method, name, draw(ARGUMENT_VALUES[method_class.amqp_type(name)]))
    return method


@settings(max_examples=500, deadline=None)
@given(st.composite(method_with)())
def test_decode_method_equals_pamqp_for_every_method(method: base.Frame) -> None:
    try:
        payload = frame.marshal(method, 1)[7:-1]
    except ValueError:  # pamqp validates before it encodes (known_hosts must be empty...)
        assume(False)
    expected = type(method).__new__(type(method))
    expected.unmarshal(payload[4:])
    decoded = wire.decode_method(payload)
    assert type(decoded) is type(method)
    for name in method.__slots__:
        assert getattr(decoded, name) == getattr(expected, name), name


def declare_with_arguments(arguments: dict[str, typing.Any]) -> bytes:
    return frame.marshal(commands.Queue.Declare(queue="q", arguments=arguments), 1)[7:-1]


@pytest.mark.parametrize(
    "arguments",
    [
        lambda n: {f"k{i}": None for i in range(n)},
        lambda n: {"x-list": [None] * (n - 1)},
        lambda n: {"x-nested": {"inner": [{"a": 1}] * ((n - 2) // 2)}},
    ],
    ids=["entries", "array-items", "nested"],
)
def test_method_tables_hold_at_most_the_entry_cap(
    arguments: typing.Callable[[int], dict[str, typing.Any]],
) -> None:
    cap = wire.MAX_METHOD_TABLE_ENTRIES
    at_cap = arguments(cap)
    assert wire.decode_method(declare_with_arguments(at_cap)).arguments == at_cap
    over = declare_with_arguments(arguments(cap + 2))
    with pytest.raises(exceptions.AMQPSyntaxError, match=f"hold more than {cap} entries"):
        wire.decode_method(over)


def test_the_entry_cap_counts_every_table_of_a_method() -> None:
    half = wire.MAX_METHOD_TABLE_ENTRIES // 2
    tables = {f"k{i}": None for i in range(half + 1)}
    # Two tables under the cap each, over it together: the count runs across the frame.
    bind = commands.Queue.Bind(queue="q", exchange="x", arguments={"a": tables, "b": tables})
    with pytest.raises(exceptions.AMQPSyntaxError, match="entries"):
        wire.decode_method(frame.marshal(bind, 1)[7:-1])


def test_a_refused_method_table_is_decoded_no_further_than_the_cap() -> None:
    """130,974 one-byte void entries in one 128 KiB frame: pamqp's decoder copied the rest
    of the frame for every one of them; the refusal now comes after the cap's worth."""
    voids = b"V" * 130_974
    table = b"\x06x-voidA" + struct.pack(">I", len(voids)) + voids
    payload = (
        struct.pack(">I", commands.Queue.Declare.index)
        + b"\x00\x00\x01q\x00"
        + struct.pack(">I", len(table))
        + table
    )
    # Counted on the module interpreted from its source: a compiled one (amqha/compiled.py)
    # calls its own _value directly, past any patch.
    source = interpreted_wire()
    decoded_values = 0
    real_value = source._value

    def counting_value(*args: typing.Any) -> tuple[int, typing.Any]:
        nonlocal decoded_values
        decoded_values += 1
        return real_value(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(source, "_value", counting_value)
        with pytest.raises(exceptions.AMQPSyntaxError, match="hold more than 4096 entries"):
            source.decode_method(payload)
    assert wire.MAX_METHOD_TABLE_ENTRIES // 2 < decoded_values <= wire.MAX_METHOD_TABLE_ENTRIES
    with pytest.raises(exceptions.AMQPSyntaxError, match="hold more than 4096 entries"):
        wire.decode_method(payload)


def test_stored_and_content_header_tables_have_no_entry_cap() -> None:
    big = {f"k{i}": i for i in range(wire.MAX_METHOD_TABLE_ENTRIES + 10)}
    assert wire.decode_field_table(wire.field_table(big)) == big
    payload = header_payload(commands.Basic.Properties(headers=big), b"")
    assert wire.decode_properties(payload).headers == big


def test_without_headers_drops_only_the_named_headers() -> None:
    from amqha.wire import decode_properties, without_headers

    properties = commands.Basic.Properties(
        headers={"x-amqha-path": ["london"], "amqha-probe": "p", "app": 1},
        correlation_id="c",
        delivery_mode=2,
    )
    payload = ContentHeader(body_size=7, properties=properties).marshal()
    keys = frozenset({"x-amqha-path", "amqha-probe"})
    stripped = without_headers(payload, keys)
    decoded = decode_properties(stripped)
    assert decoded.headers == {"app": 1}
    assert (decoded.correlation_id, decoded.delivery_mode) == ("c", 2)
    assert stripped[4:12] == payload[4:12]  # the body size kept
    plain = ContentHeader(body_size=7, properties=commands.Basic.Properties(headers={"a": 1}))
    assert without_headers(plain.marshal(), keys) == plain.marshal()
    only = ContentHeader(
        body_size=0, properties=commands.Basic.Properties(headers={"amqha-probe": "x"})
    )
    assert decode_properties(without_headers(only.marshal(), keys)).headers is None


@pytest.mark.parametrize(
    ("put", "code", "top"),
    [(wire.put_u16, ">H", 2**16), (wire.put_u32, ">I", 2**32), (wire.put_u64, ">Q", 2**64)],
)
def test_unsigned_writes_give_structs_bytes_and_refuse_what_it_refused(put, code, top) -> None:
    """librt writes signed integers: the unsigned ones go as two's complement, the same
    bytes as struct's, at both ends and across the sign bit; out of range is refused."""
    for n in (0, 1, top // 2 - 1, top // 2, top // 2 + 1, 2**62 - 1, 2**62, top - 1):
        if n < top:
            out = BytesWriter()
            put(out, n)
            assert out.getvalue() == struct.pack(code, n), n
    for bad in (-1, top, top + 1):
        with pytest.raises((ValueError, OverflowError)):
            put(BytesWriter(), bad)
