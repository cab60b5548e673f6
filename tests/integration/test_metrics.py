"""The Prometheus endpoint, scraped over real HTTP and parsed by prometheus_client's parser:
per-queue figures after real client traffic, connections and channels, memory and the
watermark, and a pair's state, epoch, peer seen, takeovers, redirects and refusals, and
its replication (in sync, lag)."""

from __future__ import annotations

import asyncio
import urllib.error

import aio_pika
import pika
import pytest
from pamqp import commands

from tests.integration.protocol_support import RawClient, scrape, unique
from tests.pairs import MakePair, raw_open
from tests.support import free_port, wait_until


def queue_labels(name: str) -> tuple[tuple[str, str], ...]:
    return (("queue", name), ("vhost", "/"))


async def test_queue_connection_and_memory_figures(make_server) -> None:
    metrics_port = free_port()
    server = make_server("metered", metrics={"listen": f"127.0.0.1:{metrics_port}"})
    server.start()
    name = unique("metered")
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=1)
        queue = await channel.declare_queue(name, auto_delete=True)
        for index in range(5):
            await channel.default_exchange.publish(
                aio_pika.Message(b"x" * 100 + bytes([index])), routing_key=name
            )
        first = await queue.get(timeout=5)
        await first.ack()
        held = await queue.get(timeout=5)  # delivered, not acked
        await asyncio.to_thread(second_connection, server.url)

        figures = await asyncio.to_thread(scrape, metrics_port)
        labels = queue_labels(name)
        assert figures[("rabbitmq_queue_messages_ready", labels)] == 3
        assert figures[("rabbitmq_queue_messages_unacked", labels)] == 1
        assert figures[("rabbitmq_queue_consumers", labels)] == 0
        assert figures[("rabbitmq_queue_messages_published_total", labels)] == 5
        assert figures[("rabbitmq_queue_messages_delivered_total", labels)] == 2
        assert figures[("rabbitmq_queue_messages_acked_total", labels)] == 1
        assert figures[("rabbitmq_connections", ())] == 1
        assert figures[("rabbitmq_channels", ())] == 1
        assert figures[("amqha_queued_message_bytes", ())] == 3 * 101
        assert figures[("amqha_memory_high_watermark_bytes", ())] == 2 * 1024**3
        # Four messages of 101 bytes, a connection, a channel and a queue at least.
        assert figures[("amqha_memory_used_bytes", ())] > 4 * 101 + 16 * 1024
        assert figures[("rabbitmq_alarms_memory_used_watermark", ())] == 0
        assert figures[("rabbitmq_process_resident_memory_bytes", ())] > 10 * 1024**2
        # A standalone server is always ACTIVE; nothing to count.
        assert figures[("amqha_pair_state", (("state", "ACTIVE"),))] == 1
        assert figures[("amqha_pair_state", (("state", "PASSIVE"),))] == 0
        assert figures[("amqha_pair_redirects_total", ())] == 0
        await held.ack()

        async def ack(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await message.ack()

        await queue.consume(ack)
        after = await asyncio.to_thread(
            wait_until,
            lambda: (
                (f := scrape(metrics_port))[("rabbitmq_queue_messages_acked_total", labels)] == 5
                and f
            ),
            10,
            0.05,
            "every message acked",
        )
        assert after[("rabbitmq_queue_consumers", labels)] == 1
        assert after[("rabbitmq_queue_messages_ready", labels)] == 0
    gone = await asyncio.to_thread(
        wait_until, lambda: (f := scrape(metrics_port))[("rabbitmq_connections", ())] == 0 and f
    )
    assert ("rabbitmq_queue_messages_ready", labels) not in gone, "the auto-delete queue went"


def second_connection(url: str) -> None:
    """A pika connection that comes and goes: connections count only what is open."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    connection.channel()
    connection.close()


def test_a_connection_is_not_counted_once_its_close_handshake_is_done(make_server) -> None:
    """After Close / Close-Ok the AMQP connection is closed, even while its socket waits
    for the client to hang up (up to a few seconds): the metrics no longer count it."""
    metrics_port = free_port()
    server = make_server("closing", metrics={"listen": f"127.0.0.1:{metrics_port}"})
    server.start()
    with RawClient(server.port) as kept, RawClient(server.port) as closing:
        kept.handshake()
        closing.handshake()
        assert scrape(metrics_port)[("rabbitmq_connections", ())] == 2
        closing.send(0, commands.Connection.Close(200, "bye", 0, 0))
        closing.expect(commands.Connection.CloseOk, 0)
        # The socket stays open: the client has not hung up yet.
        assert scrape(metrics_port)[("rabbitmq_connections", ())] == 1


def test_no_endpoint_unless_configured(make_server) -> None:
    port = free_port()
    make_server("quiet").start()
    with pytest.raises(urllib.error.URLError):
        scrape(port)


async def test_pair_figures_on_both_servers(make_pair: MakePair) -> None:
    pair = make_pair()
    ports = (free_port(), free_port())
    for server, port in zip(pair.servers, ports, strict=True):
        server.config["metrics"] = {"listen": f"127.0.0.1:{port}"}
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    for _ in range(3):
        await asyncio.to_thread(raw_open, pair.backup.port)
    active = await asyncio.to_thread(scrape, ports[0])
    passive = await asyncio.to_thread(scrape, ports[1])
    assert active[("amqha_pair_state", (("state", "ACTIVE"),))] == 1
    assert passive[("amqha_pair_state", (("state", "PASSIVE"),))] == 1
    assert passive[("amqha_pair_state", (("state", "ACTIVE"),))] == 0
    assert passive[("amqha_pair_redirects_total", ())] == 3
    assert passive[("amqha_pair_refusals_total", ())] == 0
    assert active[("amqha_pair_redirects_total", ())] == 0
    assert active[("amqha_pair_epoch", ())] == passive[("amqha_pair_epoch", ())] >= 1
    for figures in (active, passive):
        assert 0 <= figures[("amqha_pair_peer_seen_seconds", ())] < 60
    # Replication: the ACTIVE has an in-sync PASSIVE (wait_states waited for it), and the
    # PASSIVE says it follows in sync.
    assert active[("amqha_replication_in_sync", ())] == 1
    assert active[("amqha_replication_lag_changes", ())] >= 0
    assert passive[("amqha_replication_following_in_sync", ())] == 1
    # Becoming ACTIVE counts, at start-up too.
    assert active[("amqha_pair_takeovers_total", ())] == 1
    assert passive[("amqha_pair_takeovers_total", ())] == 0
    pair.kill(pair.primary)
    # The backup takes over on a client's vote once the primary is gone.
    await asyncio.to_thread(
        wait_until,
        lambda: isinstance(raw_open(pair.backup.port), commands.Connection.OpenOk),
        15,
        0.05,
        "the backup lets a client in",
    )
    after = await asyncio.to_thread(scrape, ports[1])
    assert after[("amqha_pair_state", (("state", "ACTIVE"),))] == 1
    # Alone, it confirms on its own store: unprotected, and the metric says so.
    assert after[("amqha_replication_in_sync", ())] == 0
    assert after[("amqha_pair_takeovers_total", ())] == 1
