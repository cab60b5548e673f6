"""Connection and channel level protocol: handshake, authentication, tuning, heartbeats,
closing both ways, server properties, Connection.Blocked, and channel open/close/flow.

Raw-socket tests send exact frames and read exact replies; client-library tests check
that aio-pika, aiormq, pika and py-amqp see the same behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aio_pika
import aiormq
import amqp
import pika
import pika.exceptions
import pytest
from pamqp import commands, frame, header, heartbeat

from tests.integration.protocol_support import (
    ALL_CLIENT_CAPABILITIES,
    Closed,
    RawClient,
    reply_code,
    unique,
    wait_until_async,
)
from tests.support import ServerProcess

ADVERTISED = (
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "authentication_failure_close",
    "per_consumer_qos",
    "consumer_priorities",
)


def url(
    server: ServerProcess, user: str = "guest", password: str = "guest", vhost: str = ""
) -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{server.port}/{vhost}"


# -- Start, server properties, authentication -------------------------------------------


def test_start_offers_plain_and_amqplain_with_capabilities_and_pair_table(broker) -> None:
    with RawClient(broker.port) as raw:
        start = raw.start()
    assert (start.version_major, start.version_minor) == (0, 9)
    assert set(start.mechanisms.split()) == {"PLAIN", "AMQPLAIN"}
    assert "en_US" in start.locales.split()
    properties = start.server_properties
    assert properties["product"] == "amqha"
    capabilities = properties["capabilities"]
    assert {name: capabilities.get(name) for name in ADVERTISED} == dict.fromkeys(ADVERTISED, True)
    pair = properties["amqha"]
    assert pair["name"] == "solo"
    assert pair["known_hosts"] == broker.address
    assert {"role", "state"} <= set(pair)


async def test_aiormq_sees_the_server_properties(broker) -> None:
    connection = await aiormq.connect(broker.url)
    try:
        assert connection.basic_nack and connection.consumer_cancel_notify
        assert connection.publisher_confirms and connection.exchange_exchange_bindings
        assert connection.server_properties["amqha"]["name"] == "solo"
    finally:
        await connection.close()


def test_plain_login_reaches_open_ok(broker) -> None:
    with RawClient(broker.port) as raw:
        tune = raw.handshake()
        raw.open_channel(1)
    assert tune.frame_max == 131072 and tune.channel_max == 2047


def test_amqplain_login_with_py_amqp(broker) -> None:
    connection = amqp.Connection(
        broker.address, userid="guest", password="guest", login_method="AMQPLAIN"
    )
    connection.connect()
    try:
        channel = connection.channel()
        name, _, _ = channel.queue_declare("", exclusive=True)
        channel.basic_publish(amqp.Message(b"over amqplain"), routing_key=name)
        message = channel.basic_get(name, no_ack=True)
        assert message.body == b"over amqplain"
    finally:
        connection.close()


def test_amqplain_wrong_password_is_403_for_py_amqp(broker) -> None:
    connection = amqp.Connection(
        broker.address, userid="guest", password="wrong", login_method="AMQPLAIN"
    )
    with pytest.raises(amqp.exceptions.AccessRefused) as refused:
        connection.connect()
    assert refused.value.reply_code == 403


@pytest.mark.parametrize(
    ("user", "password", "mechanism"),
    [("guest", "wrong", "PLAIN"), ("nobody", "guest", "PLAIN"), ("guest", "guest", "EXTERNAL")],
)
def test_failed_login_is_connection_close_403(broker, user, password, mechanism) -> None:
    with RawClient(broker.port) as raw:
        raw.start()
        raw.start_ok(user, password, mechanism)
        close = raw.expect_connection_close(403)
        assert close.reply_text.startswith("ACCESS_REFUSED")
        raw.send(0, commands.Connection.CloseOk())
        assert raw.wait_closed() == []


async def test_wrong_password_with_aiormq_and_pika(broker) -> None:
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError) as aiormq_error:
        await aiormq.connect(url(broker, password="wrong"))
    assert "ACCESS_REFUSED" in str(aiormq_error.value)
    parameters = pika.ConnectionParameters(
        "127.0.0.1", broker.port, credentials=pika.PlainCredentials("guest", "wrong")
    )
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as pika_error:
        pika.BlockingConnection(parameters)
    assert "(403)" in str(pika_error.value)


def test_vhost_access_refused_is_530(broker) -> None:
    for vhost in ("/", "no-such-vhost"):
        with RawClient(broker.port) as raw:
            raw.start()
            raw.start_ok("limited", "limited")
            tune = raw.expect(commands.Connection.Tune)
            raw.send(
                0,
                commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0),
                commands.Connection.Open(virtual_host=vhost),
            )
            close = raw.expect_connection_close(530)
            assert (close.class_id, close.method_id) == (10, 40)
            assert close.reply_text.startswith("NOT_ALLOWED")
    parameters = pika.ConnectionParameters(
        "127.0.0.1", broker.port, "/", pika.PlainCredentials("limited", "limited")
    )
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as denied:
        pika.BlockingConnection(parameters)
    assert "(530)" in str(denied.value)
    connection = amqp.Connection(
        broker.address, userid="limited", password="limited", virtual_host="/"
    )
    with pytest.raises(amqp.exceptions.NotAllowed) as not_allowed:
        connection.connect()
    assert not_allowed.value.reply_code == 530


async def test_user_reaches_its_own_vhost_and_vhosts_are_separate(broker) -> None:
    name = unique("vhost-q")
    limited = await aio_pika.connect(url(broker, "limited", "limited", "other"))
    guest = await aio_pika.connect(url(broker))
    async with limited, guest:
        channel = await limited.channel()
        await channel.declare_queue(name, auto_delete=True)
        guest_channel = await guest.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as missing:
            await guest_channel.declare_queue(name, passive=True)
        assert reply_code(missing.value) == 404


# -- Tune ---------------------------------------------------------------------------------


def test_smaller_frame_max_from_tune_ok_cuts_deliveries_and_caps_client_frames(broker) -> None:
    payload = bytes(range(256)) * 40
    with RawClient(broker.port) as raw:
        raw.handshake(frame_max=4096)
        raw.open_channel(1)
        declare = raw.call(1, commands.Queue.Declare(exclusive=True), commands.Queue.DeclareOk)
        raw.publish(1, "", declare.queue, payload, frame_max=4096)
        raw.send(1, commands.Basic.Get(queue=declare.queue, no_ack=True))
        raw.expect(commands.Basic.GetOk, 1)
        raw.frame_sizes.clear()
        received = b""
        assert raw.expect(header.ContentHeader, 1).body_size == len(payload)
        while len(received) < len(payload):
            received += raw.read()[1].value
        assert received == payload
        assert len(raw.frame_sizes) > 3 and max(raw.frame_sizes) <= 4096
        raw.send_raw(b"\x01\x00\x01" + (4093).to_bytes(4, "big") + b"\x00" * 4093 + b"\xce")
        close = raw.expect_connection_close(501)
        assert close.reply_text.startswith("FRAME_ERROR")


def test_pika_asking_a_smaller_frame_max_moves_large_messages(broker) -> None:
    parameters = pika.ConnectionParameters("127.0.0.1", broker.port, frame_max=8192)
    connection = pika.BlockingConnection(parameters)
    try:
        assert connection._impl.params.frame_max == 8192
        channel = connection.channel()
        name = channel.queue_declare("", exclusive=True).method.queue
        payload = b"x" * 100_000
        channel.basic_publish("", name, payload)
        _, _, received = channel.basic_get(name, auto_ack=True)
        assert received == payload
    finally:
        connection.close()


def test_channel_over_negotiated_channel_max_is_refused_with_530(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake(channel_max=2)
        raw.open_channel(1)
        raw.open_channel(2)
        raw.send(3, commands.Channel.Open())
        close = raw.expect_connection_close(530)
        assert close.reply_text.startswith("NOT_ALLOWED")
        raw.send(0, commands.Connection.CloseOk())
        raw.wait_closed()


@pytest.mark.parametrize(("frame_max", "channel_max"), [(1024, 10), (131073, 10), (8192, 2048)])
def test_tune_ok_outside_the_server_limits_is_530(broker, frame_max, channel_max) -> None:
    with RawClient(broker.port) as raw:
        raw.start()
        raw.start_ok()
        raw.expect(commands.Connection.Tune)
        raw.send(0, commands.Connection.TuneOk(channel_max, frame_max, 0))
        raw.expect_connection_close(530)


# -- heartbeats -----------------------------------------------------------------------------


def test_heartbeat_comes_from_tune_ok_and_silent_peers_are_dropped(make_server) -> None:
    server = make_server("heartbeats", limits={"heartbeat": 1}).start()
    silent, talker, no_heartbeat = (RawClient(server.port) for _ in range(3))
    try:
        silent.handshake(heartbeat=1)
        talker.handshake(heartbeat=1)
        no_heartbeat.handshake(heartbeat=0)
        beats = {"silent": 0, "talker": 0}
        deadline = time.monotonic() + 10
        silent_closed = False
        while not silent_closed:
            assert time.monotonic() < deadline, "a silent peer was never disconnected"
            talker.send_heartbeat()
            try:
                if isinstance(talker.read(timeout=0.2)[1], heartbeat.Heartbeat):
                    beats["talker"] += 1
            except TimeoutError:
                pass
            try:
                if isinstance(silent.read(timeout=0.01)[1], heartbeat.Heartbeat):
                    beats["silent"] += 1
            except TimeoutError:
                pass
            except Closed:
                silent_closed = True
        assert beats["talker"] >= 1 and beats["silent"] >= 1
        talker.send(1, commands.Channel.Open())
        talker.expect(commands.Channel.OpenOk, 1)
        # heartbeat=0 in TuneOk: the server neither sends heartbeats nor drops it.
        no_heartbeat.send(1, commands.Channel.Open())
        assert isinstance(no_heartbeat.read()[1], commands.Channel.OpenOk)
    finally:
        for raw in (silent, talker, no_heartbeat):
            raw.close()


# -- Open, Close --------------------------------------------------------------------------


def test_open_with_insist_is_accepted(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.start()
        raw.start_ok()
        tune = raw.expect(commands.Connection.Tune)
        raw.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        # pamqp will not encode insist=1, so set the bit (last octet before the end byte).
        open_frame = frame.marshal(commands.Connection.Open(virtual_host="/"), 0)
        raw.send_raw(open_frame[:-2] + bytes([open_frame[-2] | 1]) + open_frame[-1:])
        raw.expect(commands.Connection.OpenOk, 0)
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    assert connection.is_open
    connection.channel().queue_declare("", exclusive=True)
    connection.close()


def test_client_close_is_answered_with_close_ok_then_the_socket_closes(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(0, commands.Connection.Close(200, "bye", 0, 0))
        raw.expect(commands.Connection.CloseOk, 0)
        assert raw.wait_closed() == []


def test_server_close_waits_for_close_ok_and_ignores_other_frames(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Basic.Recover(requeue=False))  # 540, a connection error
        close = raw.expect_connection_close(540)
        assert (close.class_id, close.method_id) == (60, 110)
        raw.send(2, commands.Channel.Open())
        raw.send(1, commands.Queue.Declare(exclusive=True))
        raw.send(0, commands.Connection.CloseOk())
        assert raw.wait_closed() == []


async def test_hard_error_closes_all_channels_other_connections_keep_working(broker) -> None:
    connection = await aiormq.connect(broker.url)
    bystander = await aiormq.connect(broker.url)
    try:
        first = await connection.channel()
        second = await connection.channel()
        # Basic.Recover with requeue=false is 540, a connection error (as in RabbitMQ).
        with pytest.raises((aiormq.exceptions.AMQPError, asyncio.CancelledError)):
            await first.basic_recover(requeue=False)
        with pytest.raises(aiormq.exceptions.ConnectionNotImplemented) as hard:
            await asyncio.wait_for(connection.closing, 5)
        assert reply_code(hard.value) == 540
        await wait_until_async(lambda: connection.is_closed, 5)
        assert second.is_closed
        channel = await bystander.channel()
        declared = await channel.queue_declare(exclusive=True)
        assert declared.queue.startswith("amq.gen-")
    finally:
        await bystander.close()


# -- Connection.Blocked / Unblocked -------------------------------------------------------


async def test_memory_watermark_blocks_publishers_until_queues_drain(make_server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="aiormq.connection")
    server = make_server("watermark", limits={"memory_high_watermark": "1MiB"}).start()
    consumer = await aio_pika.connect(server.url)
    publisher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.port))
    events: list[str] = []
    publisher.add_on_connection_blocked_callback(lambda *_: events.append("blocked"))
    publisher.add_on_connection_unblocked_callback(lambda *_: events.append("unblocked"))

    def pump_publisher(until: str) -> None:
        deadline = time.monotonic() + 10
        while until not in events:
            assert time.monotonic() < deadline, f"publisher never saw {until}: {events}"
            publisher.process_data_events(time_limit=0.05)

    try:
        async with asyncio.timeout(30):
            channel = await consumer.channel()
            queue = await channel.declare_queue(unique("watermark"), auto_delete=True)
            publishing = publisher.channel()
            for number in range(12):
                publishing.basic_publish("", queue.name, bytes([number]) * 100_000)
            pump_publisher("blocked")
            assert events == ["blocked"]
            # Blocked: this publish stays in the socket until the broker reads again.
            publishing.basic_publish("", queue.name, b"held back")
            publisher.process_data_events(time_limit=0.05)
            # Blocked as soon as a publish passes 1 MiB in use: what followed it waits unread.
            queued = (
                await channel.declare_queue(queue.name, passive=True)
            ).declaration_result.message_count
            assert 9 <= queued <= 12
            # The consumer never published a message: not told (aio-pika would open no
            # channel while told blocked), and still read (docs/limits.md).
            assert "was blocked" not in caplog.text

            bodies = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        bodies.append(message.body)
                    if len(bodies) == 13:
                        break
            pump_publisher("unblocked")
            assert events == ["blocked", "unblocked"]
            assert bodies[-1] == b"held back"
            assert [body[0] for body in bodies[:12]] == list(range(12))
            assert "was blocked" not in caplog.text and "was unblocked" not in caplog.text
    except BaseException:
        server.kill()  # a connection the broker no longer reads cannot close cleanly
        raise
    finally:
        with contextlib.suppress(Exception):
            publisher.close()
        with contextlib.suppress(Exception):
            await consumer.close()


# -- channels -----------------------------------------------------------------------------


def test_channel_close_both_ways_and_number_reuse(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.call(1, commands.Channel.Close(200, "done", 0, 0), commands.Channel.CloseOk)
        raw.open_channel(1)
        raw.send(1, commands.Queue.Declare(queue=unique("missing"), passive=True))
        close = raw.expect(commands.Channel.Close, 1)
        assert close.reply_code == 404 and (close.class_id, close.method_id) == (50, 10)
        # Until our Close-Ok the server drops everything else on that channel.
        raw.send(1, commands.Queue.Declare(exclusive=True))
        raw.send(1, commands.Channel.CloseOk())
        raw.open_channel(1)
        raw.call(1, commands.Queue.Declare(exclusive=True), commands.Queue.DeclareOk)


def test_method_on_a_channel_never_opened_is_504(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.send(5, commands.Queue.Declare(exclusive=True))
        close = raw.expect_connection_close(504)
        assert close.reply_text.startswith("CHANNEL_ERROR")


def test_second_channel_open_on_an_open_channel_is_504(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Channel.Open())
        raw.expect_connection_close(504)


def test_method_after_channel_close_ok_needs_a_new_open(broker) -> None:
    with RawClient(broker.port) as raw:
        raw.handshake()
        raw.open_channel(3)
        raw.call(3, commands.Channel.Close(200, "", 0, 0), commands.Channel.CloseOk)
        raw.send(3, commands.Basic.Qos(prefetch_count=1))
        raw.expect_connection_close(504)


async def test_channel_flow_stops_and_resumes_deliveries(broker) -> None:
    connection = await aiormq.connect(broker.url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        name = (await channel.queue_declare(exclusive=True)).queue
        delivered: list[bytes] = []
        await channel.basic_consume(
            name, lambda message: delivered.append(message.body), no_ack=True
        )
        flow_off = await channel.flow(active=False)
        assert flow_off.active is False
        await channel.basic_publish(b"paused", routing_key=name)
        # The publish is confirmed (enqueued) yet still queued: flow is off.
        assert (await channel.queue_declare(name, passive=True)).message_count == 1
        assert delivered == []
        flow_on = await channel.flow(active=True)
        assert flow_on.active is True
        await wait_until_async(lambda: delivered == [b"paused"], 5)
        assert (await channel.queue_declare(name, passive=True)).message_count == 0
    finally:
        await connection.close()


async def test_soft_error_closes_only_its_channel(broker) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        doomed = await connection.channel()
        survivor = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as missing:
            await doomed.declare_queue(unique("missing"), passive=True)
        assert reply_code(missing.value) == 404
        assert doomed.is_closed and not survivor.is_closed and not connection.is_closed
        queue = await survivor.declare_queue(exclusive=True)
        assert queue.name.startswith("amq.gen-")


def test_raw_client_gets_basic_cancel_only_with_the_capability(broker) -> None:
    seen = {}
    for capabilities in ({}, ALL_CLIENT_CAPABILITIES):
        with RawClient(broker.port) as raw:
            raw.handshake(capabilities=capabilities)
            raw.open_channel(1)
            raw.open_channel(2)
            name = raw.call(
                1, commands.Queue.Declare(exclusive=True), commands.Queue.DeclareOk
            ).queue
            consume = commands.Basic.Consume(queue=name, consumer_tag="watcher")
            raw.call(1, consume, commands.Basic.ConsumeOk)
            raw.send(2, commands.Queue.Delete(queue=name))
            raw.send(1, commands.Channel.Close(200, "", 0, 0))
            frames = [raw.read()[1] for _ in range(2 + bool(capabilities))]
            seen[bool(capabilities)] = [type(f).__name__ for f in frames], frames
    assert sorted(seen[False][0]) == ["CloseOk", "DeleteOk"]
    assert sorted(seen[True][0]) == ["Cancel", "CloseOk", "DeleteOk"]
    cancel = next(f for f in seen[True][1] if isinstance(f, commands.Basic.Cancel))
    assert cancel.consumer_tag == "watcher" and cancel.nowait
