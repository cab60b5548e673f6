"""amqha.client's Publisher and Consumer through kill -9s of the ACTIVE, what a failover
logs, and the publisher's bound (docs/client.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import aio_pika
import pytest

from amqha.client import Consumer, Publisher, PublisherFull, PublishFailed, connect_robust
from tests.integration.test_management import managed, until_value
from tests.pairs import MakePair, pair_info, poll
from tests.support import ServerProcess, soak_size

FAILED_OVER = re.compile(r"^(.+) failed over: lost (\S+), (\S+) serves now, after [\d.]+ s")


def declare(queue: str) -> Any:
    async def setup(channel: aio_pika.abc.AbstractChannel) -> None:
        await channel.declare_queue(queue, durable=True)

    return setup


class Received:
    """What a consumer callback saw: each delivery's message id and redelivered flag."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[str, bool]] = []
        self.ids: set[str] = set()

    async def __call__(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        assert message.message_id is not None
        self.deliveries.append((message.message_id, bool(message.redelivered)))
        self.ids.add(message.message_id)

    @property
    def duplicates(self) -> list[tuple[str, bool]]:
        """Deliveries after the first of the same message id."""
        seen: set[str] = set()
        found = []
        for message_id, redelivered in self.deliveries:
            if message_id in seen:
                found.append((message_id, redelivered))
            seen.add(message_id)
        return found


def failover_lines(records: list[logging.LogRecord], name: str) -> list[tuple[str, str]]:
    """(lost, serving) of each amqha.client failover line of the client called ``name``."""
    found = []
    for record in records:
        match = FAILED_OVER.match(record.getMessage())
        if record.name == "amqha.client" and match and match.group(1) == name:
            found.append((match.group(2), match.group(3)))
    return found


def library_warnings(records: list[logging.LogRecord]) -> list[str]:
    return [
        f"{r.name} {r.levelname}: {r.getMessage()}"
        for r in records
        if r.name.startswith(("aio_pika", "aiormq")) and r.levelno >= logging.WARNING
    ]


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


@pytest.mark.soak
@pytest.mark.timeout(300)
async def test_publisher_and_consumer_ride_kills_of_the_active_and_lose_nothing(
    make_pair: MakePair, logged: pytest.LogCaptureFixture
) -> None:
    """Each round (6 in ``make test``, 20 in ``make soak``): the PASSIVE in sync (by its
    event log), 30 messages sent, the ACTIVE killed with some of them unconfirmed, every
    one confirmed after the failover, the killed server restarted. At the end every
    confirmed message was consumed."""
    kills = soak_size(6, 20)
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    urls = [pair.primary.url, pair.backup.url]
    received = Received()
    confirmed: set[str] = set()
    sent: set[str] = set()
    started = time.monotonic()
    async with (
        Publisher(urls, setup=declare("ride"), max_pending=100) as publisher,
        Consumer(urls, "ride", received, prefetch=10, setup=declare("ride")) as consumer,
    ):
        waited = {"settle": 0.0, "round": 0.0, "failover": 0.0}
        for number in range(kills):
            mark = time.monotonic()
            # Read every 0.1 s: the event logs grow, and the restarting server needs the CPU.
            active, _ = await pair.settled(timeout=60, interval=0.1)
            # A kill while the consumer still fails over from the last one would make one
            # failover of two: each kill must find it consuming.
            await poll(
                lambda n=number: consumer.failovers == n,
                60,
                "the consumer back after the last kill",
            )
            waited["settle"] += time.monotonic() - mark
            mark = time.monotonic()
            futures = await _send_round(publisher, f"round{number}", sent, confirmed)
            waited["round"] += time.monotonic() - mark
            mark = time.monotonic()
            pair.kill(active)
            # Restarted at once (it takes seconds to start here, the failover a fraction
            # of one); the next round's settled() waits for it to be in sync.
            active.start(wait=False)
            await publisher.flush(60)  # through the failover: no error reaches us
            waited["failover"] += time.monotonic() - mark
            assert all(f.done() and f.exception() is None for f in futures)
            assert publisher.pending == 0
        await poll(lambda: confirmed <= received.ids, 60, "every confirmed message consumed")
        # The consumer may have had everything before the last kill and be reconnecting still.
        await poll(lambda: consumer.failovers == kills, 60, "the consumer back after each kill")
    took = time.monotonic() - started

    lost = confirmed - received.ids
    assert not lost, f"{len(lost)} confirmed messages never consumed"
    assert received.ids <= sent, "a message consumed that was never sent"
    assert confirmed == sent and publisher.refused == 0
    assert publisher.failovers == kills and consumer.failovers == kills
    records = logged.records
    assert len(failover_lines(records, "publisher")) == kills
    assert len(failover_lines(records, "consumer of ride")) == kills
    assert not library_warnings(records)
    duplicates = received.duplicates
    print(
        f"{kills} kills in {took:.1f} s: {len(confirmed)} confirmed, 0 lost, "
        f"{publisher.resent} sent again, {len(duplicates)} duplicates delivered "
        f"({sum(not r for _, r in duplicates)} of them with redelivered false), "
        f"{consumer.stale} acks not sent to a new server; waits (s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in waited.items())
    )


async def _send_round(
    publisher: Publisher, prefix: str, sent: set[str], confirmed: set[str]
) -> list[asyncio.Future[None]]:
    """30 messages; the kill comes once the first ones are confirmed, the rest in flight."""
    futures = []
    for index in range(30):
        message = aio_pika.Message(f"{prefix}-{index}".encode(), delivery_mode=2)
        future = await publisher.send(message, routing_key="ride")
        assert message.message_id is not None
        sent.add(message.message_id)
        future.add_done_callback(
            lambda f, i=message.message_id: confirmed.add(i) if not f.exception() else None
        )
        futures.append(future)
        if index == 9:
            await poll(lambda: futures[0].done(), 30, "a confirm in this round")
    return futures


@pytest.mark.timeout(120)
async def test_a_publish_during_a_failover_returns_once_confirmed_by_the_new_active(
    make_pair: MakePair, logged: pytest.LogCaptureFixture
) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    urls = [pair.primary.url, pair.backup.url]
    received = Received()
    async with (
        Publisher(urls, setup=declare("during")) as publisher,
        Consumer(urls, "during", received, setup=declare("during")),
    ):
        await publisher.publish(b"before", routing_key="during")
        kill = pair.kill(pair.primary)
        # Published while the ACTIVE is gone: each call returns once confirmed.
        messages = [aio_pika.Message(b"during-%d" % n, delivery_mode=2) for n in range(20)]
        await asyncio.wait_for(
            asyncio.gather(*(publisher.publish(m, routing_key="during") for m in messages)), 60
        )
        assert publisher.server == pair.backup.address and pair.state(pair.backup) == "ACTIVE"
        ids = {m.message_id for m in messages}
        await poll(lambda: ids <= received.ids, 30, "the messages published during it consumed")
    records = [r for r in logged.records if r.created >= kill.before]
    lines = failover_lines(records, "publisher")
    assert lines == [(pair.primary.address, pair.backup.address)]
    assert not library_warnings(records)


@pytest.mark.timeout(120)
async def test_a_robust_connection_logs_one_line_per_failover_naming_the_right_servers(
    make_pair: MakePair, logged: pytest.LogCaptureFixture
) -> None:
    """What users saw: about 22 aio-pika warnings per failover, some naming the wrong
    address. Now: one amqha.client line; no library warning; each attempt logged at
    DEBUG names the address it tried."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    connection = await connect_robust([pair.primary.url, pair.backup.url])
    try:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("robust-log", durable=True)
        await queue.consume(_ack)
        stop = asyncio.Event()
        publishing = asyncio.ensure_future(_keep_publishing(channel, "robust-log", stop))
        await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key="robust-log")
        kill = pair.kill(pair.primary)
        # The line comes once the channels are restored on the new server.
        await poll(lambda: failover_lines(logged.records, "connection"), 60, "the failover logged")
        assert _on(connection) == "backup"
        await asyncio.wait_for(
            channel.default_exchange.publish(aio_pika.Message(b"y"), routing_key="robust-log"), 30
        )
        stop.set()
        await asyncio.wait_for(publishing, 10)
    finally:
        await connection.close()
    records = [r for r in logged.records if r.created >= kill.before]
    assert failover_lines(records, "connection") == [(pair.primary.address, pair.backup.address)]
    assert not library_warnings(records)
    tried = [r.getMessage() for r in records if " attempt at " in r.getMessage()]
    assert tried, "the attempts of the failover are logged at DEBUG"
    for line in tried:
        match = re.search(r"attempt at ([\d.]+):(\d+) failed.*\('([\d.]+)', (\d+)\)", line)
        if match:  # a refused connect names the address the kernel refused: the one tried
            assert match.group(1, 2) == match.group(3, 4), line


async def _ack(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    # A delivery from the lost server cannot be acked: the application's own concern here.
    with contextlib.suppress(aio_pika.exceptions.ChannelInvalidStateError):
        await message.ack()


def _on(connection: aio_pika.abc.AbstractConnection) -> str | None:
    with contextlib.suppress(Exception):
        return str(pair_info(connection)["name"])
    return None


async def _keep_publishing(
    channel: aio_pika.abc.AbstractChannel, queue: str, stop: asyncio.Event
) -> None:
    """Publishes as an application on a robust channel does: errors during the failover
    are its own to retry."""
    while not stop.is_set():
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                channel.default_exchange.publish(aio_pika.Message(b"z"), routing_key=queue), 5
            )
        await asyncio.sleep(0.005)


@contextlib.contextmanager
def stopped(server: ServerProcess) -> Iterator[None]:
    """SIGSTOP the server (it confirms nothing) until the block ends."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when_full", ["block", "raise"])
async def test_a_full_publisher_blocks_or_raises_as_told(make_server: Any, when_full: str) -> None:
    server = make_server().start()
    async with Publisher([server.url], max_pending=5, when_full=when_full) as publisher:  # type: ignore[arg-type]
        held = []
        with stopped(server):
            held = [await publisher.send(b"m%d" % n, routing_key="bound") for n in range(5)]
            assert publisher.pending == 5
            if when_full == "raise":
                with pytest.raises(PublisherFull, match="5 messages await their confirm"):
                    await publisher.send(b"one too many", routing_key="bound")
                assert publisher.pending == 5
            else:
                blocked = asyncio.ensure_future(publisher.send(b"sixth", routing_key="bound"))
                # Nothing can be confirmed while the server is stopped: it stays blocked.
                done, _ = await asyncio.wait({blocked}, timeout=0.5)
                assert not done and publisher.pending == 5
        if when_full == "block":
            held.append(await asyncio.wait_for(blocked, 30))
        await publisher.flush(30)
        assert all(f.done() and f.exception() is None for f in held)
        assert publisher.pending == 0
        await publisher.publish(b"room again", routing_key="bound")


@pytest.mark.timeout(120)
async def test_a_delivery_from_the_lost_server_is_not_acked_on_the_new_one(
    make_pair: MakePair, logged: pytest.LogCaptureFixture
) -> None:
    """The callback of a message from the primary is still running when the primary is
    killed: when it returns, its ack (a delivery tag of the dead server's channel) is not
    sent to the backup, whose channel would close on it (unknown delivery tag); the
    backup delivers the message again and the consumer carries on."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    urls = [pair.primary.url, pair.backup.url]
    release = asyncio.Event()
    calls: list[tuple[str, str | None]] = []

    async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        calls.append((message.body.decode(), message.message_id))
        if len(calls) == 1:
            await release.wait()

    async with (
        Publisher(urls, setup=declare("held")) as publisher,
        Consumer(urls, "held", handle, prefetch=1, setup=declare("held")) as consumer,
    ):
        await publisher.publish(b"first", routing_key="held")
        await poll(lambda: calls, 30, "the first delivery in the callback")
        pair.kill(pair.primary)
        await poll(lambda: consumer.failovers == 1, 60, "the consumer on the backup")
        await poll(lambda: len(calls) == 2, 30, "the message delivered again by the backup")
        release.set()  # the first callback returns: its ack belongs to the dead server
        await poll(lambda: consumer.stale == 1, 30, "the stale ack dropped")
        await publisher.publish(b"second", routing_key="held")
        await poll(lambda: len(calls) == 3, 30, "the next message consumed")
        assert consumer.failovers == 1 and consumer.server == pair.backup.address
    assert [body for body, _ in calls] == ["first", "first", "second"]
    assert calls[0][1] == calls[1][1], "the message came again with its message id"
    assert not [r for r in logged.records if "closed the channel" in r.getMessage()]
    assert not library_warnings(logged.records)


@pytest.mark.timeout(120)
async def test_a_message_the_server_refuses_fails_alone_with_the_servers_error(
    make_server: Any, logged: pytest.LogCaptureFixture
) -> None:
    """A publish to a missing exchange closes the channel, and the messages in flight with
    it get no confirm: they are sent again one at a time, so only the culprit fails (with
    the server's reply), the others are confirmed, and nothing is counted as a failover."""
    server = make_server().start()
    async with Publisher([server.url], setup=declare("refusals")) as publisher:
        before = [await publisher.send(b"a%d" % n, routing_key="refusals") for n in range(5)]
        bad = await publisher.send(b"bad", routing_key="refusals", exchange="missing")
        after = [await publisher.send(b"b%d" % n, routing_key="refusals") for n in range(5)]
        with pytest.raises(PublishFailed, match="NOT_FOUND - no exchange 'missing'"):
            await asyncio.wait_for(asyncio.shield(bad), 60)
        await publisher.flush(60)
        assert all(f.exception() is None for f in before + after)
        assert publisher.failovers == 0 and publisher.refused == 1
        await publisher.publish(b"carries on", routing_key="refusals")
    assert not failover_lines(logged.records, "publisher")
    warned = [r.getMessage() for r in logged.records if r.levelno == logging.WARNING]
    assert warned and all("closed the channel (ChannelNotFoundEntity" in w for w in warned)


@pytest.mark.timeout(60)
async def test_a_setup_the_server_refuses_fails_the_start_with_its_answer(
    make_server: Any,
) -> None:
    server = make_server().start()

    async def setup(channel: aio_pika.abc.AbstractChannel) -> None:
        await channel.declare_queue("not-declared-anywhere", passive=True)

    with pytest.raises(RuntimeError, match="setup failed: .*NOT_FOUND"):
        await Consumer([server.url], "q", _ack, setup=setup).start(timeout=30)


class Headers:
    """What a consumer callback saw: each delivery's body, message id and headers."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, str | None, dict[str, Any]]] = []

    async def __call__(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.deliveries.append((message.body, message.message_id, dict(message.headers)))

    def of(self, body: bytes) -> list[tuple[str | None, dict[str, Any]]]:
        return [(i, h) for b, i, h in self.deliveries if b == body]


@pytest.mark.timeout(120)
async def test_a_deduplicating_publisher_sends_the_message_id_as_the_deduplication_header(
    make_server: Any,
) -> None:
    """With ``deduplicate=True`` each message carries ``x-deduplication-header`` equal to
    its message id, beside the application's own headers, whose dict is left as it was;
    the same message published twice carries the same id and header both times. Without
    it, no such header."""
    server = make_server().start()
    urls = [server.url]
    seen = Headers()
    async with (
        Publisher(urls, setup=declare("dedup-header"), deduplicate=True) as publisher,
        Publisher(urls, setup=declare("dedup-header"), name="plain") as plain,
        Consumer(urls, "dedup-header", seen, setup=declare("dedup-header")),
    ):
        headers: dict[str, Any] = {"app": "kept"}
        message = aio_pika.Message(b"with headers", headers=headers, delivery_mode=2)
        await publisher.publish(message, routing_key="dedup-header")
        assert headers == {"app": "kept"} and message.headers is headers
        await publisher.publish(message, routing_key="dedup-header")  # the same message again
        await publisher.publish(b"bytes", routing_key="dedup-header")
        own = aio_pika.Message(b"own id", message_id="order-17")
        await publisher.publish(own, routing_key="dedup-header")
        await plain.publish(b"plain", routing_key="dedup-header")
        await poll(lambda: len(seen.deliveries) == 5, 30, "the five messages consumed")
    twice = seen.of(b"with headers")
    assert len(twice) == 2 and twice[0] == twice[1]
    assert twice[0] == (
        message.message_id,
        {"app": "kept", "x-deduplication-header": message.message_id},
    )
    [(bytes_id, bytes_headers)] = seen.of(b"bytes")
    assert bytes_id and bytes_headers == {"x-deduplication-header": bytes_id}
    assert seen.of(b"own id") == [("order-17", {"x-deduplication-header": "order-17"})]
    [(plain_id, plain_headers)] = seen.of(b"plain")
    assert plain_id and "x-deduplication-header" not in plain_headers


@pytest.mark.timeout(120)
async def test_a_message_sent_again_after_a_failover_keeps_its_deduplication_header(
    make_pair: MakePair,
) -> None:
    """Messages sent to a stopped ACTIVE get no confirm; it is killed, and the publisher
    sends them again on the backup: each with the message id and the
    ``x-deduplication-header`` it had, which a deduplicating queue drops a copy by."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    urls = [pair.primary.url, pair.backup.url]
    seen = Headers()
    async with (
        Publisher(urls, setup=declare("dedup-again"), deduplicate=True) as publisher,
        Consumer(urls, "dedup-again", seen, setup=declare("dedup-again")),
    ):
        await publisher.publish(b"before", routing_key="dedup-again")
        messages = [aio_pika.Message(b"again-%d" % n, delivery_mode=2) for n in range(5)]
        assert pair.primary.process is not None
        os.kill(pair.primary.process.pid, signal.SIGSTOP)  # it reads nothing more
        futures = [await publisher.send(m, routing_key="dedup-again") for m in messages]
        pair.kill(pair.primary)  # the sends die unread with it
        await asyncio.wait_for(asyncio.gather(*futures), 60)
        assert publisher.resent >= 5 and publisher.server == pair.backup.address
        await poll(lambda: len(seen.deliveries) >= 6, 30, "the messages consumed")
    for message in messages:
        found = seen.of(message.body)
        assert found, f"{message.body!r} consumed"
        for message_id, headers in found:
            assert message_id == message.message_id
            assert headers == {"x-deduplication-header": message.message_id}


# Connection.Close (class 10, method 50) as a method frame on channel 0, up to its size.
_CONNECTION_CLOSE = (b"\x01\x00\x00", b"\x00\x0a\x00\x32")


def _close_waiting(sock: socket.socket) -> bool:
    """Whether the server's Connection.Close is among the bytes the client has not read."""
    try:
        waiting = sock.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    at = waiting.find(_CONNECTION_CLOSE[0])
    while at >= 0:
        if waiting[at + 7 : at + 11] == _CONNECTION_CLOSE[1]:
            return True
        at = waiting.find(_CONNECTION_CLOSE[0], at + 1)
    return False


@pytest.mark.timeout(120)
async def test_confirms_read_with_the_servers_close_count_and_nothing_is_sent_twice(
    make_server: Any,
) -> None:
    """The server confirms messages and then closes the connection (a switchover's last
    step, an operator's close); the client reads the confirms and the close in one go (its
    socket was not read meanwhile, as on a busy machine). Every confirm sent before the
    close counts: no message is sent again, and the queue holds each once."""
    server, api = managed(make_server)
    queue, count = "closing-confirms", 3000
    async with Publisher(
        [server.url], setup=declare(queue), persistent=False, max_pending=count
    ) as publisher:
        watch = publisher.watching.watch
        assert watch is not None and watch.transport.writer is not None
        transport = watch.transport.writer.transport
        transport.pause_reading()
        sock = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
        futures = [await publisher.send(b"m%d" % n, routing_key=queue) for n in range(count)]
        # Transient messages are confirmed as they are routed: all of them, once the queue
        # holds them all. Then the server's close, behind those confirms, unread.
        await until_value(
            lambda: api.get(f"/api/queues/%2F/{queue}"),
            lambda q: q["messages"] == count,
            30,
            "every message in the queue",
        )
        [listed] = await api.get("/api/connections")
        status, _ = await api.call("DELETE", f"/api/connections/{quote(listed['name'], safe='')}")
        assert status == 204
        with sock:
            await poll(lambda: _close_waiting(sock), 10, "the server's close sent")
        transport.resume_reading()
        await publisher.flush(30)
        assert all(f.done() and f.exception() is None for f in futures)
        assert publisher.resent == 0
    stored = await api.get(f"/api/queues/%2F/{queue}")
    assert stored["messages"] == count
