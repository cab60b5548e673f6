"""The Prometheus endpoint, scraped over real HTTP and parsed by prometheus_client's parser:
per-queue figures after real client traffic, connections and channels, memory and the
watermark, and a pair's state, epoch, peer seen, takeovers, redirects and refusals, and
its replication (in sync, lag)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import aio_pika
import pika
import pytest
import yaml
from pamqp import commands

from tests.integration.protocol_support import RawClient, fresh_scrape, scrape, unique
from tests.pairs import MakePair, raw_open
from tests.support import ServerProcess, free_port, start_to_exit, wait_until


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
        assert figures[("amqha_queue_messages_delivered_total", labels)] == 2
        assert figures[("amqha_queue_messages_acked_total", labels)] == 1
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
                (f := scrape(metrics_port))[("amqha_queue_messages_acked_total", labels)] == 5 and f
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
        assert fresh_scrape(metrics_port)[("rabbitmq_connections", ())] == 1


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
    after = await asyncio.to_thread(fresh_scrape, ports[1])
    assert after[("amqha_pair_state", (("state", "ACTIVE"),))] == 1
    # Alone, it confirms on its own store: unprotected, and the metric says so.
    assert after[("amqha_replication_in_sync", ())] == 0
    assert after[("amqha_pair_takeovers_total", ())] == 1


def threads(server: ServerProcess) -> int:
    assert server.process is not None
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_half_sent_requests_neither_keep_a_scrape_out_nor_delay_a_stop(make_server) -> None:
    metrics_port = free_port()
    server = make_server("slowloris", metrics={"listen": f"127.0.0.1:{metrics_port}"})
    server.start()
    scrape(metrics_port)
    before = threads(server)
    held: list[socket.socket] = []
    try:
        # More than the endpoint keeps open: the oldest give way to newer ones.
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", metrics_port), timeout=5)
            held.append(sock)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert scrape(metrics_port)[("rabbitmq_connections", ())] == 0
        # No thread per request: the requests are read on the broker's loop.
        assert threads(server) <= before + 1
        # A stop closes them all at once (terminate waits 15 s at most, then kills).
        assert server.terminate() == 0
    finally:
        for sock in held:
            sock.close()


def test_basic_auth_refuses_a_scrape_without_the_credentials(make_server) -> None:
    metrics_port = free_port()
    server = make_server(
        "guarded",
        metrics={"listen": f"127.0.0.1:{metrics_port}", "username": "prom", "password": "scrape"},
    )
    server.start()
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    for credentials in (None, b"prom:wrong", b"other:scrape"):
        request = urllib.request.Request(url)
        if credentials is not None:
            request.add_header("Authorization", "Basic " + base64.b64encode(credentials).decode())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401
        assert refused.value.headers["WWW-Authenticate"].startswith("Basic ")
    request = urllib.request.Request(url)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"prom:scrape").decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        assert b"rabbitmq_connections 0.0" in response.read()


def test_scrapes_share_a_snapshot_taken_at_most_once_a_second(make_server) -> None:
    metrics_port = free_port()
    server = make_server("shared", metrics={"listen": f"127.0.0.1:{metrics_port}"})
    server.start()
    with RawClient(server.port) as client:
        client.handshake()
        client.open_channel(1)
        for index in range(200):
            client.call(1, commands.Queue.Declare(queue=f"q{index}"), commands.Queue.DeclareOk)
    first = scrape(metrics_port)[("amqha_metrics_snapshots_total", ())]
    began = time.monotonic()

    async def many() -> list[dict]:
        return await asyncio.gather(*(asyncio.to_thread(scrape, metrics_port) for _ in range(60)))

    pages = asyncio.run(many())
    elapsed = time.monotonic() - began
    last = max(page[("amqha_metrics_snapshots_total", ())] for page in pages)
    # Snapshots are a second apart at least: however many scrapes, no more walks than that.
    assert last - first <= elapsed + 1
    assert all(page[("rabbitmq_queues", ())] == 200 for page in pages)


def test_only_get_metrics_is_answered(make_server) -> None:
    metrics_port = free_port()
    make_server("narrow", metrics={"listen": f"127.0.0.1:{metrics_port}"}).start()

    def status(request: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=10) as sock:
            sock.sendall(request)
            answer = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    answer += chunk
        return answer.split(b"\r\n", 1)[0]

    # HTTP/1.1 requests name their Host (one without is a 400, RFC 9112 3.2).
    assert status(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") == b"HTTP/1.1 200 OK"
    assert status(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n") == b"HTTP/1.1 200 OK"
    assert status(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n") == b"HTTP/1.1 404 Not Found"
    # RabbitMQ's per-object page is the same page here; its management API is not here.
    assert status(b"GET /metrics/per-object HTTP/1.1\r\nHost: x\r\n\r\n") == b"HTTP/1.1 200 OK"
    for path in (b"/api/overview", b"/metrics/detailed", b"/metrics/", b"/"):
        request = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        assert status(request) == b"HTTP/1.1 404 Not Found", path
    assert (
        status(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n") == b"HTTP/1.1 405 Method Not Allowed"
    )
    # A request that cannot be parsed has no version to answer in: HTTP/1.0.
    assert status(b"nonsense\r\n\r\n").split(b" ", 1)[1] == b"400 Bad Request"
    too_big = b"GET /metrics HTTP/1.1\r\nX: " + b"x" * 10_000
    assert status(too_big).split(b" ", 1)[1] == b"431 Request Header Fields Too Large"


def scrape_path(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.read().decode()


async def test_one_client_on_a_pair_is_one_connection_and_one_channel(
    make_pair: MakePair,
) -> None:
    """The PASSIVE's peering and replication links are the pair's own, counted apart:
    one client with one channel reads as RabbitMQ would show it, 1 and 1."""
    pair = make_pair()
    ports = (free_port(), free_port())
    for server, port in zip(pair.servers, ports, strict=True):
        server.config["metrics"] = {"listen": f"127.0.0.1:{port}"}
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    connection = await aio_pika.connect(pair.primary.url)
    async with connection:
        channel = await connection.channel()
        name = unique("counted")
        queue = await channel.declare_queue(name, durable=True)
        await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key=name)
        got = await queue.get(timeout=10)
        await got.ack()
        active = await asyncio.to_thread(fresh_scrape, ports[0])
        passive = await asyncio.to_thread(fresh_scrape, ports[1])
        assert (active[("rabbitmq_connections", ())], active[("rabbitmq_channels", ())]) == (1, 1)
        assert active[("amqha_peer_links", ())] >= 1, "the PASSIVE's links, counted apart"
        assert active[("amqha_peer_link_channels", ())] >= 1
        assert passive[("rabbitmq_connections", ())] == 0
        labels = queue_labels(name)
        assert active[("amqha_queue_messages_delivered_total", labels)] == 1
        assert active[("amqha_queue_messages_acked_total", labels)] == 1
        # Names RabbitMQ 3.10 does not have are not given under its prefix.
        assert ("rabbitmq_queue_messages_delivered_total", labels) not in active
        assert ("rabbitmq_queue_messages_acked_total", labels) not in active
        per_object = await asyncio.to_thread(scrape_path, ports[0], "/metrics/per-object")
        assert f'rabbitmq_queue_messages_ready{{queue="{name}",vhost="/"}} 0' in per_object
    after = await asyncio.to_thread(
        wait_until,
        lambda: (f := fresh_scrape(ports[0]))[("rabbitmq_connections", ())] == 0 and f,
    )
    assert after[("rabbitmq_channels", ())] == 0
    assert after[("amqha_peer_links", ())] >= 1


def test_a_metrics_port_already_taken_is_one_line_naming_the_file_and_key(make_server) -> None:
    """Two servers given one metrics port (two configs copied from one): the second says
    which file and key, and which address, without a traceback."""
    metrics_port = free_port()
    first = make_server("first", metrics={"listen": f"127.0.0.1:{metrics_port}"}).start()
    second = make_server("second", metrics={"listen": f"127.0.0.1:{metrics_port}"})
    second.config_path.parent.mkdir(parents=True, exist_ok=True)
    second.config_path.write_text(yaml.safe_dump(second.config))
    result = start_to_exit(second.config_path)
    assert result.returncode == 1
    lines = [
        line
        for line in result.stderr.splitlines()
        if line.strip() and not line.startswith("amqha: WARNING: ")
    ]
    assert lines == [
        f"Error: {second.config_path}: metrics.listen: cannot listen on "
        f"127.0.0.1:{metrics_port}: Address already in use"
    ], result.stderr
    assert scrape(metrics_port)[("rabbitmq_connections", ())] == 0, "the first one still serves"
    assert first.alive
