"""Fuzzing one real broker with broken frames after a valid handshake.

Each example opens a fresh connection, does the handshake, opens channel 1, then sends
arbitrary frames, arbitrary bytes, or a valid conversation (declare, bind, publish with
content, get, ack, consume, confirm, tx ...) with bytes flipped, cut, inserted or
removed. It ends with its own Connection.Close and a half-close.

Property: the server answers only with well-formed frames no larger than the
negotiated frame_max; every Connection.Close / Channel.Close it sends carries a valid
AMQP reply code; it closes the socket within a bounded time (it never hangs the
connection); and the process stays up. A fresh client publishes and consumes every
``CHECK_EVERY`` examples and at the end.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.support import ServerProcess

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
VALID_REPLY_CODES = {
    200,
    311,
    312,
    313,
    320,
    402,
    403,
    404,
    405,
    406,
    501,
    502,
    503,
    504,
    505,
    506,
    530,
    540,
    541,
}
SOCKET_TIMEOUT = 5.0
CLOSE_DEADLINE = 15.0
CHECK_EVERY = 25
QUEUE, EXCHANGE = "fuzz-q", "fuzz-x"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # Mutated logins fail by the hundred here: refused at once, not after the usual delay.
    process = ServerProcess(tmp_path_factory.mktemp("fuzz"), "fuzz", auth={"failed_login_delay": 0})
    process.start()
    yield process
    process.stop()


def fresh_client_round_trip(server: ServerProcess, body: bytes) -> None:
    assert server.alive, server.log()[-3000:]
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", server.port, socket_timeout=SOCKET_TIMEOUT)
    )
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", queue, body)
        deadline = time.monotonic() + SOCKET_TIMEOUT
        while True:
            method, _properties, got = channel.basic_get(queue, auto_ack=True)
            if method is not None:
                assert got == body
                return
            assert time.monotonic() < deadline, "published message never arrived"
            connection.process_data_events(time_limit=0.02)
    finally:
        connection.close()


# -- one conversation ----------------------------------------------------------------------


def marshal(channel: int, *values: Any) -> bytes:
    return b"".join(frame.marshal(value, channel) for value in values)


def recv_frame(sock: socket.socket, buffer: bytearray) -> tuple[int, Any]:
    while True:
        while len(buffer) < 7 or len(buffer) < 8 + struct.unpack_from(">I", buffer, 3)[0]:
            chunk = sock.recv(65536)
            if not chunk:
                raise AssertionError(f"closed during the handshake after {bytes(buffer)!r}")
            buffer += chunk
        used, channel, value = frame.unmarshal(bytes(buffer))
        del buffer[:used]
        if value.name != "Heartbeat":
            return channel, value


def handshake(sock: socket.socket, frame_max: int) -> int:
    """Start .. Open-Ok, then Channel.Open 1; returns the frame_max in force."""
    buffer = bytearray()
    sock.sendall(PROTOCOL_HEADER)
    assert isinstance(recv_frame(sock, buffer)[1], commands.Connection.Start)
    sock.sendall(
        marshal(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "fuzz"},
                mechanism="PLAIN",
                response="\0guest\0guest",
                locale="en_US",
            ),
        )
    )
    tune = recv_frame(sock, buffer)[1]
    assert isinstance(tune, commands.Connection.Tune)
    negotiated = frame_max or tune.frame_max
    sock.sendall(
        marshal(
            0,
            commands.Connection.TuneOk(tune.channel_max, negotiated, 0),
            commands.Connection.Open(virtual_host="/"),
        )
        + marshal(1, commands.Channel.Open())
    )
    assert isinstance(recv_frame(sock, buffer)[1], commands.Connection.OpenOk)
    assert recv_frame(sock, buffer)[0] == 1
    assert not buffer
    return negotiated


def read_until_closed(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything the server sends until it closes; (bytes, reset) with a hard deadline."""
    data = bytearray()
    deadline = time.monotonic() + CLOSE_DEADLINE
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"server kept the connection open; got {bytes(data[-200:])!r}"
        sock.settimeout(min(remaining, SOCKET_TIMEOUT))
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(data), True
        except TimeoutError:
            continue
        if not chunk:
            return bytes(data), False
        data += chunk


def check_replies(data: bytes, reset: bool, frame_max: int) -> list[Any]:
    """Every frame the server sent is well-formed, within frame_max, with valid codes."""
    replies = []
    at = 0
    while at < len(data):
        if len(data) - at < 7:
            break
        size = struct.unpack_from(">I", data, at + 3)[0]
        if len(data) - at < size + 8:
            break
        assert size + 8 <= frame_max, f"server frame of {size + 8} bytes over {frame_max}"
        used, _channel, value = frame.unmarshal(data[at : at + size + 8])
        assert used == size + 8
        at += used
        if isinstance(value, commands.Connection.Close | commands.Channel.Close):
            assert value.reply_code in VALID_REPLY_CODES, (value.reply_code, value.reply_text)
        replies.append(value)
    if not reset:
        assert at == len(data), f"server sent a truncated frame: {data[at:]!r}"
    return replies


def converse_before_open(server: ServerProcess, payload: bytes) -> list[Any]:
    """Protocol header and Start, then ``payload`` in place of the rest of the handshake."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT) as sock:
        sock.sendall(PROTOCOL_HEADER)
        buffer = bytearray()
        assert isinstance(recv_frame(sock, buffer)[1], commands.Connection.Start)
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data, reset = read_until_closed(sock)
    return check_replies(bytes(buffer) + data, reset, 131072)


def converse(server: ServerProcess, frame_max: int, payload: bytes) -> list[Any]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT) as sock:
        negotiated = handshake(sock, frame_max)
        try:
            sock.sendall(payload + marshal(0, commands.Connection.Close(200, "fuzz done", 0, 0)))
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server already closed on an earlier part of the payload
        data, reset = read_until_closed(sock)
    return check_replies(data, reset, negotiated)


# -- inputs ---------------------------------------------------------------------------------

PROPERTIES = commands.Basic.Properties(
    content_type="text/plain",
    headers={"k": "v", "n": 7, "list": [1, "a"], "nested": {"t": True}},
    delivery_mode=2,
    expiration="60000",
    message_id="m-1",
    timestamp=None,
)
VALID_STEPS = [
    marshal(1, commands.Queue.Declare(queue=QUEUE, arguments={"x-max-length": 20})),
    marshal(1, commands.Exchange.Declare(exchange=EXCHANGE, exchange_type="topic")),
    marshal(1, commands.Queue.Bind(queue=QUEUE, exchange=EXCHANGE, routing_key="a.#")),
    marshal(
        1,
        commands.Basic.Publish(exchange=EXCHANGE, routing_key="a.b", mandatory=True),
        ContentHeader(0, 10, PROPERTIES),
        ContentBody(b"01234"),
        ContentBody(b"56789"),
    ),
    marshal(
        1,
        commands.Basic.Publish(exchange="", routing_key=QUEUE),
        ContentHeader(0, 0, commands.Basic.Properties()),
    ),
    marshal(1, commands.Basic.Get(queue=QUEUE)),
    marshal(1, commands.Basic.Ack(1)),
    marshal(1, commands.Basic.Nack(2, requeue=True)),
    marshal(1, commands.Basic.Reject(3, requeue=False)),
    marshal(1, commands.Basic.Qos(prefetch_count=2)),
    marshal(1, commands.Basic.Consume(queue=QUEUE, consumer_tag="fuzz-c")),
    marshal(1, commands.Basic.Cancel("fuzz-c")),
    marshal(1, commands.Basic.Recover(requeue=True)),
    marshal(1, commands.Confirm.Select()),
    marshal(1, commands.Tx.Select()),
    marshal(1, commands.Tx.Commit()),
    marshal(1, commands.Channel.Flow(active=False)),
    marshal(1, commands.Queue.Purge(queue=QUEUE)),
    marshal(1, commands.Queue.Unbind(queue=QUEUE, exchange=EXCHANGE, routing_key="a.#")),
    marshal(1, commands.Exchange.Bind(destination=EXCHANGE, source="amq.topic", routing_key="#")),
    marshal(2, commands.Channel.Open()),
    marshal(1, commands.Channel.Close(200, "", 0, 0)),
    marshal(0, commands.Connection.Blocked("x")),
    marshal(0, commands.Connection.UpdateSecretOk()),
]


def frames_of(data: bytes) -> list[tuple[int, int, bytes]]:
    """A marshalled step as (type, channel, payload) frames."""
    frames = []
    while data:
        kind, channel, size = struct.unpack_from(">BHI", data)
        frames.append((kind, channel, data[7 : 7 + size]))
        data = data[8 + size :]
    return frames


VALID_FRAMES = [frames_of(step) for step in VALID_STEPS]


def mutate(draw: st.DrawFn, data: bytearray) -> None:
    """One byte-level mutation of ``data`` in place."""
    if not data:
        return
    at = draw(st.integers(0, len(data) - 1))
    mutation = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
    if mutation == "flip":
        data[at] ^= draw(st.integers(1, 255))
    elif mutation == "set":
        data[at] = draw(st.sampled_from([0x00, 0xFF, 0xCE, 0x01, 0x02, 0x03, 0x08, 0x7F]))
    elif mutation == "cut":
        del data[at:]
    elif mutation == "insert":
        data[at:at] = draw(st.binary(min_size=1, max_size=9))
    else:
        del data[at : at + draw(st.integers(1, 9))]


@st.composite
def mutated_conversation(
    draw: st.DrawFn, valid: list[list[tuple[int, int, bytes]]], in_order: bool = False
) -> bytes:
    """Valid steps, then either the byte stream is damaged anywhere (framing included),
    or one frame's payload is damaged and the frame re-framed with its true size, so the
    damage reaches the method, property and body decoders."""
    if in_order:
        steps = valid[: draw(st.integers(1, len(valid)))]
    else:
        steps = draw(st.lists(st.sampled_from(valid), min_size=1, max_size=8))
    frames = [list(f) for step in steps for f in step]
    if draw(st.booleans()):
        data = bytearray(
            b"".join(struct.pack(">BHI", k, c, len(p)) + p + b"\xce" for k, c, p in frames)
        )
        for _ in range(draw(st.integers(1, 4))):
            mutate(draw, data)
        return bytes(data)
    for _ in range(draw(st.integers(1, 3))):
        target = frames[draw(st.integers(0, len(frames) - 1))]
        payload = bytearray(target[2])
        mutate(draw, payload)
        target[2] = bytes(payload)
    return b"".join(struct.pack(">BHI", k, c, len(p)) + p + b"\xce" for k, c, p in frames)


METHOD_INDEXES = sorted(commands.INDEX_MAPPING)


@st.composite
def arbitrary_frame(draw: st.DrawFn) -> bytes:
    kind = draw(st.one_of(st.sampled_from([1, 1, 1, 2, 3, 8]), st.integers(0, 255)))
    channel = draw(st.one_of(st.sampled_from([0, 1, 1, 2]), st.integers(0, 65535)))
    if kind == 1 and draw(st.booleans()):
        index = draw(st.one_of(st.sampled_from(METHOD_INDEXES), st.integers(0, 2**32 - 1)))
        payload = struct.pack(">I", index) + draw(st.binary(max_size=48))
    elif kind == 2 and draw(st.booleans()):
        payload = struct.pack(">HHQ", 60, 0, draw(st.integers(0, 64))) + draw(
            st.binary(max_size=24)
        )
    else:
        payload = draw(st.binary(max_size=64))
    size = len(payload)
    if draw(st.integers(0, 9)) == 0:
        size = draw(st.integers(0, 2**32 - 1))
    end = b"\xce" if draw(st.integers(0, 9)) else draw(st.binary(min_size=1, max_size=1))
    return struct.pack(">BHI", kind, channel, size) + payload + end


HANDSHAKE_FRAMES = [
    frames_of(step)
    for step in (
        marshal(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "fuzz", "capabilities": {"basic.nack": True}},
                mechanism="PLAIN",
                response="\0guest\0guest",
                locale="en_US",
            ),
        ),
        marshal(0, commands.Connection.TuneOk(2047, 4096, 0)),
        marshal(0, commands.Connection.Open(virtual_host="/")),
        marshal(1, commands.Channel.Open()),
        marshal(1, commands.Queue.Declare(queue="", exclusive=True)),
    )
]
AMQPLAIN_START_OK = frames_of(
    marshal(
        0,
        commands.Connection.StartOk(
            client_properties={},
            mechanism="AMQPLAIN",
            response="\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x05guest",
            locale="en_US",
        ),
    )
)
HANDSHAKE_INPUTS = st.one_of(
    mutated_conversation(HANDSHAKE_FRAMES, in_order=True),
    mutated_conversation([AMQPLAIN_START_OK, *HANDSHAKE_FRAMES[1:]], in_order=True),
    st.lists(arbitrary_frame(), min_size=1, max_size=4).map(b"".join),
)

INPUTS = st.one_of(
    mutated_conversation(VALID_FRAMES),
    st.lists(arbitrary_frame(), min_size=1, max_size=6).map(b"".join),
    st.binary(min_size=1, max_size=96),
)


def test_valid_steps_are_valid(server: ServerProcess) -> None:
    """The unmutated conversation is accepted as a whole: the fuzz starts from valid input.

    Placed before the fuzz test: a consumer of a fuzz connection the server is still
    tearing down could take the message this test gets."""
    replies = converse(server, 0, b"".join(VALID_STEPS[:-3]))
    closes = [r for r in replies if isinstance(r, commands.Connection.Close)]
    assert closes == []
    assert any(isinstance(r, commands.Basic.GetOk) for r in replies)
    assert isinstance(replies[-1], commands.Connection.CloseOk)


def test_server_survives_arbitrary_frames(server: ServerProcess) -> None:
    examples_run = 0

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(frame_max=st.sampled_from([0, 4096]), payload=INPUTS)
    def fuzz(frame_max: int, payload: bytes) -> None:
        nonlocal examples_run
        converse(server, frame_max, payload)
        assert server.alive, server.log()[-3000:]
        examples_run += 1
        if examples_run % CHECK_EVERY == 0:
            fresh_client_round_trip(server, b"still serving %d" % examples_run)

    fuzz()
    assert examples_run > CHECK_EVERY
    fresh_client_round_trip(server, b"after fuzzing")
    assert "Traceback" not in server.log(), server.log()[-5000:]


def test_server_survives_a_broken_handshake(server: ServerProcess) -> None:
    examples_run = 0

    @settings(
        max_examples=100,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(payload=HANDSHAKE_INPUTS)
    def fuzz(payload: bytes) -> None:
        nonlocal examples_run
        converse_before_open(server, payload)
        assert server.alive, server.log()[-3000:]
        examples_run += 1
        if examples_run % CHECK_EVERY == 0:
            fresh_client_round_trip(server, b"still serving %d" % examples_run)

    fuzz()
    assert examples_run > CHECK_EVERY
    fresh_client_round_trip(server, b"after fuzzing the handshake")
    assert "Traceback" not in server.log(), server.log()[-5000:]
