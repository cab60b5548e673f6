"""Memory and CPU bounds, one attack per test, each against a real broker process.

Every client here is a ``RawClient`` on a blocking socket, so "never reads" means
exactly that. Assertions are on behaviour (the broker stops reading, stops
delivering, blocks publishers, refuses with the right code) and on the RSS of the
process we started, read from /proc with a generous margin; the exact figures are
in bench/memory_attacks.py.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest
from pamqp import body as content_body
from pamqp import commands, frame, header

from tests.integration.protocol_support import Closed, RawClient, fresh_scrape, scrape, unique
from tests.support import ServerProcess, free_port, wait_until

MiB = 1024 * 1024
# What the RSS of a broker may grow beyond the configured limit in these tests: the
# interpreter's own allocations, kernel-side socket buffers are not in RSS.
RSS_MARGIN = 80 * MiB


def rss(server: ServerProcess) -> int:
    assert server.process is not None
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def publish_frames(routing_key: str, body: bytes, mandatory: bool = False) -> bytes:
    return b"".join(
        frame.marshal(value, 1)
        for value in (
            commands.Basic.Publish(exchange="", routing_key=routing_key, mandatory=mandatory),
            header.ContentHeader(0, len(body), commands.Basic.Properties()),
            *([content_body.ContentBody(body)] if body else []),
        )
    )


def send_until_blocked(client: RawClient, data: bytes, limit: int) -> int:
    """Send ``data`` repeatedly until the server stops reading (a send times out) or
    ``limit`` bytes went out; returns the bytes sent."""
    client.sock.settimeout(1.0)
    sent = 0
    while sent < limit:
        try:
            client.sock.sendall(data)
        except TimeoutError:
            return sent
        sent += len(data)
    return sent


def message_count(server: ServerProcess, queue: str, vhost: str = "/") -> int:
    with RawClient(server.port) as client:
        client.handshake(vhost=vhost)
        client.open_channel(1)
        ok = client.call(
            1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk
        )
        return ok.message_count


def alive_and_serving(server: ServerProcess) -> None:
    with RawClient(server.port) as client:
        client.handshake()
        client.open_channel(1)
        client.call(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)


# -- output -------------------------------------------------------------------------


def test_a_publisher_that_never_reads_its_returns_is_no_longer_read(make_server) -> None:
    server = make_server("returns", limits={"output_buffer": "256KiB"}).start()
    before = rss(server)
    with RawClient(server.port) as publisher:
        publisher.handshake()
        publisher.open_channel(1)
        batch = publish_frames(unique("nowhere"), b"r" * 10_000, mandatory=True) * 100
        sent = send_until_blocked(publisher, batch, 300 * MiB)
        # Unread returns fill the socket both ways; then the broker stops reading us.
        assert sent < 300 * MiB
        assert rss(server) - before < RSS_MARGIN
        alive_and_serving(server)


def test_a_consumer_that_never_reads_gets_only_what_its_socket_holds(make_server) -> None:
    server = make_server("slow", limits={"output_buffer": "256KiB"}).start()
    queue = unique("backlog")
    total = 40_000
    with RawClient(server.port) as publisher:
        publisher.handshake()
        publisher.open_channel(1)
        publisher.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
        publisher.send_raw(publish_frames(queue, b"m" * 1000) * total)
        publisher.call(1, commands.Basic.Qos(prefetch_count=0), commands.Basic.QosOk)
    wait_until(lambda: message_count(server, queue) == total, what="all published")
    with RawClient(server.port) as consumer:
        consumer.handshake()
        consumer.open_channel(1)
        consumer.send(1, commands.Basic.Consume(queue=queue, no_ack=True, consumer_tag="c"))
        # The broker writes until the socket is full, then stops: most stay queued.
        stuck = wait_until(
            lambda: _stable_count(server, queue), timeout=15, what="delivery stopped"
        )
        assert 0 < stuck < total
        delivered = 0
        deadline = time.monotonic() + 30
        while delivered < total and time.monotonic() < deadline:
            _, value = consumer.read()
            delivered += isinstance(value, commands.Basic.Deliver)
        assert delivered == total, "reading again resumes delivery of the rest"


def _stable_count(server: ServerProcess, queue: str) -> int | None:
    first = message_count(server, queue)
    time.sleep(0.2)
    second = message_count(server, queue)
    return second if first == second and second else None


# -- the memory watermark -------------------------------------------------------------


def _blocked_after(server: ServerProcess, batch: bytes, limit: int) -> int:
    """Publish ``batch`` repeatedly until Connection.Blocked arrives; the bytes sent."""
    with RawClient(server.port) as publisher:
        publisher.handshake(capabilities={"connection.blocked": True})
        publisher.open_channel(1)
        sent = 0
        publisher.sock.settimeout(1.0)
        while sent < limit:
            try:
                publisher.sock.sendall(batch)
            except TimeoutError:
                break
            sent += len(batch)
        publisher.expect(commands.Connection.Blocked, 0, timeout=10)
        return sent


def test_one_byte_messages_count_their_overhead_and_block_publishers(make_server) -> None:
    watermark = 16 * MiB
    server = make_server("tiny", limits={"memory_high_watermark": watermark}).start()
    queue = unique("tiny")
    with RawClient(server.port) as setup:
        setup.handshake()
        setup.open_channel(1)
        setup.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    before = rss(server)
    # 16 MiB of one-byte bodies would be 16M messages; the overhead blocks far sooner.
    sent = _blocked_after(server, publish_frames(queue, b"x") * 1000, 2_000_000 * 40)
    assert sent < 2_000_000 * 40
    assert message_count(server, queue) < 200_000
    assert rss(server) - before < watermark + RSS_MARGIN


def test_big_headers_with_empty_bodies_block_publishers(make_server) -> None:
    watermark = 16 * MiB
    server = make_server("headers", limits={"memory_high_watermark": watermark}).start()
    queue = unique("headers")
    with RawClient(server.port) as setup:
        setup.handshake()
        setup.open_channel(1)
        setup.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    properties = commands.Basic.Properties(headers={"h": "v" * 60_000})
    one = b"".join(
        frame.marshal(value, 1)
        for value in (
            commands.Basic.Publish(exchange="", routing_key=queue),
            header.ContentHeader(0, 0, properties),
        )
    )
    before = rss(server)
    sent = _blocked_after(server, one * 10, len(one) * 3000)
    assert sent < len(one) * 3000
    assert message_count(server, queue) < 1000
    assert rss(server) - before < watermark + RSS_MARGIN


def test_a_header_above_max_header_size_is_406(make_server) -> None:
    server = make_server("maxheader", limits={"max_header_size": "8KiB"}).start()
    with RawClient(server.port) as client:
        client.handshake()
        client.open_channel(1)
        properties = commands.Basic.Properties(headers={"h": "v" * 9000})
        client.publish(1, "", "anywhere", b"body", properties=properties)
        close = client.expect(commands.Channel.Close, 1)
        assert close.reply_code == 406
        assert "max header size 8192" in close.reply_text


def _start_big_body(client: RawClient, queue: str) -> bytes:
    """Open a publisher and announce a 120 MiB body; returns one full body frame."""
    client.handshake(capabilities={"connection.blocked": True})
    client.open_channel(1)
    client.send(
        1,
        commands.Basic.Publish(exchange="", routing_key=queue),
        header.ContentHeader(0, 120 * MiB, commands.Basic.Properties()),
    )
    return frame.marshal(content_body.ContentBody(b"b" * (131072 - 8)), 1)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_publishers_that_leave_half_way_through_a_body_while_blocked_are_released(
    make_server, loop: str
) -> None:
    metrics_port = free_port()
    server = make_server(
        "halfsent",
        limits={"memory_high_watermark": 8 * MiB},
        metrics={"listen": f"127.0.0.1:{metrics_port}"},
    ).start(extra_args=("--no-uvloop",) if loop == "asyncio" else ())
    queue = unique("halfsent")

    def used() -> float:
        return scrape(metrics_port)[("amqha_memory_used_bytes", ())]

    with RawClient(server.port) as watcher:
        watcher.handshake(capabilities={"connection.blocked": True})
        watcher.open_channel(1)
        watcher.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
        watcher.publish(1, "", queue, b"first")
        idle = wait_until(lambda: message_count(server, queue) == 1 and used(), what="published")
        # Two bodies partly sent and read (their close comes as a FIN), then one sent until
        # the broker stops reading it, which leaves with a reset (SO_LINGER 0, as when a
        # process exits with frames unread).
        graceful = [RawClient(server.port), RawClient(server.port)]
        for count, client in enumerate(graceful, 1):
            body = _start_big_body(client, queue)
            client.send_raw(body * 24)  # 3 MiB of 120
            wait_until(lambda count=count: used() > idle + count * 3 * MiB, what="body read")
        reset = RawClient(server.port)
        body = _start_big_body(reset, queue)
        sent = send_until_blocked(reset, body * 8, 60 * MiB)
        assert sent < 60 * MiB
        for client in (*graceful, watcher):
            client.expect(commands.Connection.Blocked, 0, timeout=10)
        assert fresh_scrape(metrics_port)[("rabbitmq_connections", ())] == 4
        reset.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        for client in (*graceful, reset):
            client.close()

        # The broker reads none of them, yet sees them go and drops their partial bodies.
        watcher.expect(commands.Connection.Unblocked, 0, timeout=15)
        figures = fresh_scrape(metrics_port)
        assert figures[("rabbitmq_connections", ())] == 1
        assert figures[("rabbitmq_alarms_memory_used_watermark", ())] == 0
        assert figures[("amqha_memory_used_bytes", ())] < idle + MiB
        watcher.publish(1, "", queue, b"second")
        wait_until(lambda: message_count(server, queue) == 2, what="published again")


def test_arguments_are_capped_and_counted_against_the_watermark(make_server) -> None:
    metrics_port = free_port()
    server = make_server(
        "arguments",
        limits={"max_arguments_size": "16KiB"},
        metrics={"listen": f"127.0.0.1:{metrics_port}"},
    ).start()
    queue = unique("args")
    with RawClient(server.port) as client:
        client.handshake()
        client.open_channel(1)
        client.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
        before = fresh_scrape(metrics_port)[("amqha_memory_used_bytes", ())]
        # Within the limit: held, and counted.
        for index in range(100):
            client.call(
                1,
                commands.Queue.Bind(
                    queue=queue,
                    exchange="amq.direct",
                    routing_key=f"k{index}",
                    arguments={"x": "v" * 10_000},
                ),
                commands.Queue.BindOk,
            )
        after = fresh_scrape(metrics_port)[("amqha_memory_used_bytes", ())]
        assert after - before >= 100 * 10_000
        # Past it, each of the four ways to leave arguments behind is refused.
        big = {"x": "v" * 20_000}
        for method, what in (
            (
                commands.Queue.Bind(queue=queue, exchange="amq.direct", arguments=big),
                f"a binding of queue '{queue}'",
            ),
            (commands.Queue.Declare(queue="big", arguments=big), "queue 'big'"),
            (commands.Exchange.Declare(exchange="big", arguments=big), "exchange 'big'"),
            (
                commands.Exchange.Bind(
                    destination="amq.fanout", source="amq.direct", arguments=big
                ),
                "a binding of exchange 'amq.fanout'",
            ),
        ):
            client.send(1, method)
            close = client.expect(commands.Channel.Close, 1)
            assert close.reply_code == 406
            assert close.reply_text.startswith(f"PRECONDITION_FAILED - the arguments of {what}")
            assert "more than limits.max_arguments_size (16384)" in close.reply_text
            client.send(1, commands.Channel.CloseOk())
            client.open_channel(1)
        client.call(1, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
    # The queue's bindings went with it, and so did their count.
    gone = fresh_scrape(metrics_port)[("amqha_memory_used_bytes", ())]
    assert gone < before + 100_000


# -- before Connection.Tune ------------------------------------------------------------


def test_a_frame_over_4096_before_tune_is_refused_on_its_header(broker) -> None:
    with RawClient(broker.port) as client:
        client.start()
        # A StartOk claiming 128 KiB: refused on the 7-byte header, the rest never sent.
        client.send_raw(struct.pack(">BHI", 1, 0, 131072 - 8) + b"\x00" * 100)
        close = client.expect_connection_close(501)
        assert "exceeds frame_max 4096" in close.reply_text
        client.wait_closed()
    alive_and_serving(broker)


def test_many_unauthenticated_big_partial_frames_are_refused_unheld(make_server) -> None:
    server = make_server("partial").start()
    before = rss(server)
    clients = []
    try:
        for _ in range(300):
            client = RawClient(server.port)
            clients.append(client)
            client.start()
            # Half of a 128 KiB frame: it would be held whole while the rest is awaited.
            client.send_raw(struct.pack(">BHI", 1, 0, 131072 - 8) + b"\x00" * 60_000)
        for client in clients:
            client.expect_connection_close(501)
        assert rss(server) - before < 12 * MiB
        alive_and_serving(server)
    finally:
        for client in clients:
            client.close()


# -- limits with RabbitMQ's codes -------------------------------------------------------


def test_node_connection_limit_closes_sockets_at_once(make_server) -> None:
    server = make_server("node", limits={"max_connections": 3}).start()
    held = [RawClient(server.port) for _ in range(3)]
    try:
        for client in held:
            client.start()
        with RawClient(server.port) as extra:
            extra.send_raw(b"AMQP\x00\x00\x09\x01")
            with pytest.raises(Closed):
                extra.read(timeout=5)
        assert "connection limit (3) reached" in server.log()
    finally:
        for client in held:
            client.close()
    wait_until(lambda: _can_connect(server), what="a slot is free again")


def _can_connect(server: ServerProcess) -> bool:
    try:
        alive_and_serving(server)
    except (Closed, OSError):
        return False
    return True


def test_vhost_and_user_connection_limits_are_530_at_open(make_server) -> None:
    server = make_server(
        "conns", limits={"vhost": {"max_connections": 2}, "user": {"max_connections": 3}}
    ).start()
    clients = [RawClient(server.port) for _ in range(3)]
    try:
        clients[0].handshake()
        clients[1].handshake()
        clients[2].start()
        clients[2].start_ok()
        tune = clients[2].expect(commands.Connection.Tune, 0)
        clients[2].send(
            0,
            commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0),
            commands.Connection.Open(virtual_host="/"),
        )
        close = clients[2].expect_connection_close(530)
        assert close.reply_text == (
            "NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
            "connection limit (2) is reached"
        )
        # Another vhost is not full, but the user is at its limit of 3.
        clients[2].close()
        clients[2] = RawClient(server.port)
        clients[2].handshake(vhost="other")
        with RawClient(server.port) as fourth:
            fourth.start()
            fourth.start_ok()
            tune = fourth.expect(commands.Connection.Tune, 0)
            fourth.send(
                0,
                commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0),
                commands.Connection.Open(virtual_host="other"),
            )
            close = fourth.expect_connection_close(530)
            assert "user connection limit (3) is reached" in close.reply_text
    finally:
        for client in clients:
            client.close()


def test_user_channel_limit_is_530(make_server) -> None:
    server = make_server("chans", limits={"user": {"max_channels": 3}}).start()
    with RawClient(server.port) as first, RawClient(server.port) as second:
        first.handshake()
        second.handshake()
        first.open_channel(1)
        first.open_channel(2)
        second.open_channel(1)
        second.send(2, commands.Channel.Open())
        close = second.expect_connection_close(530)
        assert close.reply_text == (
            "NOT_ALLOWED - number of channels opened for user 'guest' has reached "
            "the maximum allowed user limit of (3)"
        )
        # Closing a channel frees its place.
        first.call(1, commands.Channel.Close(200, "", 0, 0), commands.Channel.CloseOk)
        with RawClient(server.port) as third:
            third.handshake()
            third.open_channel(1)


def test_vhost_queue_limit_is_406(make_server) -> None:
    server = make_server("queues", limits={"vhost": {"max_queues": 3}}).start()
    with RawClient(server.port) as client:
        client.handshake(vhost="other")
        client.open_channel(1)
        names = [unique("q") for _ in range(4)]
        for name in names[:3]:
            client.call(1, commands.Queue.Declare(queue=name), commands.Queue.DeclareOk)
        # Redeclaring an existing queue is not a new one.
        client.call(1, commands.Queue.Declare(queue=names[0]), commands.Queue.DeclareOk)
        client.send(1, commands.Queue.Declare(queue=names[3]))
        close = client.expect(commands.Channel.Close, 1)
        assert close.reply_code == 406
        assert close.reply_text == (
            f"PRECONDITION_FAILED - cannot declare queue '{names[3]}': queue limit in "
            "vhost 'other' (3) is reached"
        )


def test_consumers_per_channel_limit_is_530(make_server) -> None:
    server = make_server("consumers", limits={"max_consumers_per_channel": 2}).start()
    with RawClient(server.port) as client:
        client.handshake()
        client.open_channel(1)
        queue = unique("q")
        client.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
        for tag in ("a", "b"):
            client.call(
                1, commands.Basic.Consume(queue=queue, consumer_tag=tag), commands.Basic.ConsumeOk
            )
        client.send(1, commands.Basic.Consume(queue=queue, consumer_tag="c"))
        close = client.expect_connection_close(530)
        assert close.reply_text == "NOT_ALLOWED - reached maximum (2) of consumers per channel"


def test_a_transaction_holds_at_most_one_messages_worth_of_bodies(make_server) -> None:  # type: ignore[no-untyped-def]
    """A transaction commits as one change and is replicated as one run: one Tx.Commit
    of 200 MB peaked at 946 MB on an ACTIVE. Its bodies are bounded like one message's
    (limits.max_message_size): past that the channel is closed with 406 and the reason,
    and a transaction within it still commits on the same connection."""
    server = make_server("tx", limits={"max_message_size": "64KiB"}).start()
    with RawClient(server.port) as client:
        client.handshake()
        client.open_channel(1)
        client.call(1, commands.Queue.Declare(queue="txq", durable=True), commands.Queue.DeclareOk)
        client.call(1, commands.Tx.Select(), commands.Tx.SelectOk)
        for _ in range(10):
            client.publish(1, "", "txq", b"x" * 10_000)
        closed = client.expect(commands.Channel.Close, 1)
        assert closed.reply_code == 406
        assert "transaction holds more than 65536 bytes" in closed.reply_text
        client.send(1, commands.Channel.CloseOk())
        client.open_channel(2)
        client.call(2, commands.Tx.Select(), commands.Tx.SelectOk)
        for _ in range(5):
            client.publish(2, "", "txq", b"x" * 10_000)
        client.call(2, commands.Tx.Commit(), commands.Tx.CommitOk)
        declared = client.call(
            2, commands.Queue.Declare(queue="txq", passive=True), commands.Queue.DeclareOk
        )
        assert declared.message_count == 5
