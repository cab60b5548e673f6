"""The Prometheus endpoint: the broker's counters and the pair's state, as of a snapshot.

Owns: the ``metrics.listen`` HTTP listener (a small HTTP/1.1 responder on the broker's
loop: ``GET /metrics`` and nothing else), its bounds and basic auth, the snapshot cache,
and the metric names, which follow RabbitMQ's prometheus plugin where the meaning is the
same (``rabbitmq_queue_messages_ready``...) and are ``amqha_`` where it is not.

Bounds: a snapshot of the broker (one pass over the queues, on the loop) is taken at
most once per SNAPSHOT_PERIOD however many scrapes come, and turned into text on one
worker thread; every scrape in between is answered with those bytes. At most
MAX_CONNECTIONS sockets are open; past that the oldest one still sending its request is
dropped for the newcomer. A request must be in within REQUEST_TIMEOUT and at most
MAX_REQUEST bytes; from then on the answer is made, written as the socket drains and
taken within RESPONSE_TIMEOUT. A stop closes every socket at once.

Must not know: how the counters are kept (queues and channels count; nothing here runs on
the publish path). The loop's objects are read on the loop only; the worker thread sees
the snapshot's copies.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import hmac
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .server import Broker

log = logging.getLogger("amqha.metrics")

# A snapshot serves every scrape for this long after it was taken.
SNAPSHOT_PERIOD = 1.0
MAX_CONNECTIONS = 256
REQUEST_TIMEOUT = 10.0
RESPONSE_TIMEOUT = 60.0
MAX_REQUEST = 8192
# The answer goes out this much at a time, as the socket drains: a scraper that does not
# read holds at most this (and the kernel's buffer), not its own copy of the page.
CHUNK = 64 * 1024
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(slots=True)
class QueueFigures:
    vhost: str
    name: str
    ready: int
    unacked: int
    consumers: int
    published: int
    delivered: int
    acked: int


@dataclass
class Snapshot:
    """What scrapes report, copied on the broker's loop."""

    queues: list[QueueFigures] = field(default_factory=list)
    connections: int = 0
    channels: int = 0
    queued_bytes: int = 0
    memory_used: int = 0
    watermark: int = 0
    blocked: bool = False
    memory_blocked: bool = False
    store: dict[str, Any] = field(default_factory=dict)
    replication: dict[str, Any] = field(default_factory=dict)
    pair: dict[str, Any] = field(default_factory=dict)
    number: int = 0  # how many snapshots this endpoint has taken, this one included


def take_snapshot(broker: Broker) -> Snapshot:
    """Runs on the broker's loop."""
    connections = broker.open_connections()
    snapshot = Snapshot(
        connections=len(connections),
        channels=sum(len(c.channels) for c in connections),
        memory_used=broker.memory_in_use(),
        watermark=broker.config.limits.memory_high_watermark,
        blocked=broker.blocked,
        memory_blocked=broker.memory_over,
        store=broker.store_status(),
        replication=broker.replication_status(),
        pair=broker.pair.status(),
    )
    for vhost in broker.vhosts.values():
        for queue in vhost.queues.values():
            snapshot.queued_bytes += queue.bytes
            snapshot.queues.append(
                QueueFigures(
                    vhost.name,
                    queue.name,
                    queue.message_count,
                    queue.unacked,
                    queue.consumer_count,
                    queue.published,
                    queue.delivered,
                    queue.acked,
                )
            )
    return snapshot


def resident_memory() -> int:
    """This process's resident set size in bytes (Linux /proc)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_SIZE


class SnapshotCollector(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        yield GaugeMetricFamily("rabbitmq_queues", "Queues", value=len(snapshot.queues))
        yield from broker_metrics(snapshot)
        yield from pair_metrics(snapshot.pair)
        yield CounterMetricFamily(
            "amqha_metrics_snapshots",
            "Snapshots of the broker taken for scrapes (one pass over the queues each)",
            value=snapshot.number,
        )


def render(snapshot: Snapshot) -> bytes:
    """The Prometheus text of one snapshot; runs on the worker thread."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return queue_text(snapshot.queues).encode("utf-8", "replace") + generate_latest(registry)


# (figure, metric name, type, help): one line per queue each. Written straight as text:
# prometheus_client's generic writer took 2 s for 10,000 queues.
QUEUE_FAMILIES = (
    ("ready", "rabbitmq_queue_messages_ready", "gauge", "Messages ready to be delivered"),
    (
        "unacked",
        "rabbitmq_queue_messages_unacked",
        "gauge",
        "Messages delivered and not yet acknowledged",
    ),
    ("consumers", "rabbitmq_queue_consumers", "gauge", "Consumers on the queue"),
    ("published", "rabbitmq_queue_messages_published_total", "counter", "Messages enqueued"),
    (
        "delivered",
        "rabbitmq_queue_messages_delivered_total",
        "counter",
        "Messages delivered to consumers and Basic.Get",
    ),
    ("acked", "rabbitmq_queue_messages_acked_total", "counter", "Deliveries acknowledged"),
)


def label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def queue_text(queues: list[QueueFigures]) -> str:
    """The per-queue families in Prometheus text format (labels in name order, as
    prometheus_client writes them)."""
    labels = [f'{{queue="{label_value(q.name)}",vhost="{label_value(q.vhost)}"}} ' for q in queues]
    lines = []
    for key, name, kind, text in QUEUE_FAMILIES:
        lines.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
        lines.extend(
            f"{name}{label}{getattr(q, key)}\n" for label, q in zip(labels, queues, strict=True)
        )
    return "".join(lines)


def broker_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    yield GaugeMetricFamily("rabbitmq_connections", "Open connections", value=snapshot.connections)
    yield GaugeMetricFamily("rabbitmq_channels", "Open channels", value=snapshot.channels)
    yield GaugeMetricFamily(
        "rabbitmq_process_resident_memory_bytes",
        "Resident memory of the broker process",
        value=resident_memory(),
    )
    yield GaugeMetricFamily(
        "amqha_queued_message_bytes",
        "Bytes of message bodies held in queues (what the watermark applies to)",
        value=snapshot.queued_bytes,
    )
    yield GaugeMetricFamily(
        "amqha_memory_used_bytes",
        "Bytes counted against the memory watermark: messages, input being assembled, "
        "output held for sockets that do not drain, fixed costs (docs/limits.md)",
        value=snapshot.memory_used,
    )
    yield GaugeMetricFamily(
        "amqha_memory_high_watermark_bytes",
        "Counted bytes above which publishers are blocked",
        value=snapshot.watermark,
    )
    yield GaugeMetricFamily(
        "rabbitmq_alarms_memory_used_watermark",
        "1 while the memory watermark blocks publishers",
        value=int(snapshot.memory_blocked),
    )
    store = snapshot.store
    if store.get("enabled"):
        yield GaugeMetricFamily(
            "amqha_store_failing",
            "1 while the message store cannot write (publishes nacked, publishers blocked)",
            value=int(store["failing"]),
        )
        yield CounterMetricFamily(
            "amqha_store_write_failures",
            "Store writes that failed (a full or failing disk)",
            value=store["failures"],
        )
        yield GaugeMetricFamily(
            "amqha_store_unwritten_changes",
            "Changes of durable state not yet on disk",
            value=store["lsn"] - store["safe_lsn"],
        )
    replication = snapshot.replication
    feed = replication.get("feed")
    if feed is not None:
        yield GaugeMetricFamily(
            "amqha_replication_in_sync",
            "1 while an in-sync PASSIVE holds every confirmed message; 0: confirms rest on "
            "this server's store alone",
            value=int(feed["state"] == "in_sync"),
        )
        yield GaugeMetricFamily(
            "amqha_replication_lag_changes",
            "Changes the PASSIVE has not acked yet",
            value=feed["lag_changes"] or 0,
        )
        yield GaugeMetricFamily(
            "amqha_replication_lag_seconds",
            "Age of the oldest run the PASSIVE has not acked",
            value=feed["lag_seconds"] or 0.0,
        )
    follower = replication.get("follower")
    if follower is not None:
        yield GaugeMetricFamily(
            "amqha_replication_following_in_sync",
            "On a PASSIVE: 1 once it holds everything its ACTIVE confirmed",
            value=int(bool(follower["in_sync"])),
        )


PAIR_STATES = ("PRIMARY", "BACKUP", "ACTIVE", "PASSIVE")


def pair_metrics(status: dict[str, Any]) -> Iterator[Metric]:
    state = GaugeMetricFamily(
        "amqha_pair_state", "1 for the state this server is in", labels=["state"]
    )
    current = status.get("state")
    for name in sorted({*PAIR_STATES, *([current] if current else [])}):
        state.add_metric([name], int(name == current))
    yield state
    yield GaugeMetricFamily("amqha_pair_epoch", "The pair's epoch", value=status.get("epoch", 0))
    peer = status.get("peer") or {}
    last_seen = peer.get("last_seen")
    seen = GaugeMetricFamily(
        "amqha_pair_peer_seen_seconds",
        "Seconds since the peer's last state message (absent when never seen)",
    )
    if last_seen is not None:
        seen.add_metric([], max(0.0, time.time() - last_seen))
    yield seen
    for key, text in (
        ("takeovers", "Times this server became ACTIVE (start-up included)"),
        ("redirects", "Client connection attempts sent to the active server"),
        ("refusals", "Client connection attempts refused with no active server to name"),
    ):
        yield CounterMetricFamily(f"amqha_pair_{key}", text, value=status.get(key, 0))


class Pages:
    """The rendered page, refreshed at most once per SNAPSHOT_PERIOD; scrapes that come
    while it is being made wait for that one."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.page = b""
        self.fresh_until = float("-inf")
        self.taken = 0
        self.making: asyncio.Task[bytes] | None = None
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metrics")

    async def get(self) -> bytes:
        loop = asyncio.get_running_loop()
        if loop.time() < self.fresh_until:
            return self.page
        if self.making is None:
            self.making = loop.create_task(self._make(loop))
        # A scraper that leaves does not cancel the page the others wait for.
        return await asyncio.shield(self.making)

    async def _make(self, loop: asyncio.AbstractEventLoop) -> bytes:
        try:
            taken_at = loop.time()
            snapshot = take_snapshot(self.broker)
            self.taken += 1
            snapshot.number = self.taken
            self.page = await loop.run_in_executor(self.worker, render, snapshot)
            self.fresh_until = taken_at + SNAPSHOT_PERIOD
            return self.page
        finally:
            self.making = None

    def close(self) -> None:
        if self.making is not None:
            self.making.cancel()
        self.worker.shutdown(wait=False, cancel_futures=True)


class ScrapeConnection(asyncio.Protocol):
    """One HTTP connection: one request read (bounded in size and time), one answer
    written as the socket drains, then closed."""

    def __init__(self, endpoint: MetricsEndpoint) -> None:
        self.endpoint = endpoint
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.request = bytearray()
        self.answering = False
        self.answer: memoryview | None = None
        self.sent = 0
        self.paused = False
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=CHUNK)
        self.endpoint.opened(self)
        self.timer = self.loop.call_later(REQUEST_TIMEOUT, self.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        self.endpoint.closed(self)
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None:
            self.task.cancel()

    def abort(self) -> None:
        self.endpoint.closed(self)
        if self.transport is not None:
            self.transport.abort()

    def eof_received(self) -> bool:
        # A client that sent its request and shut its side still gets the answer.
        return self.answering

    def data_received(self, data: bytes) -> None:
        if self.answering:
            return
        self.request += data
        end = self.request.find(b"\r\n\r\n")
        if end < 0:
            if len(self.request) > MAX_REQUEST:
                self.answering = True
                self.respond("431 Request Header Fields Too Large", b"request too large\n")
            return
        self.answering = True
        head = bytes(self.request[:end])
        self.request = bytearray()
        # The request is in: from here the answer has RESPONSE_TIMEOUT, page making included.
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(RESPONSE_TIMEOUT, self.abort)
        self.task = self.loop.create_task(self.endpoint.answer(self, head))

    def respond(
        self, status: str, body: bytes, headers: dict[str, str] | None = None, head: bool = False
    ) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        lines = [
            f"HTTP/1.1 {status}",
            f"Content-Type: {CONTENT_TYPE}",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in (headers or {}).items()),
        ]
        self.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.answer = memoryview(b"" if head else body)
        self._write_more()

    def _write_more(self) -> None:
        if self.answer is None or self.transport is None:
            return
        while not self.paused and self.sent < len(self.answer):
            self.transport.write(self.answer[self.sent : self.sent + CHUNK])
            self.sent += CHUNK
        if self.sent >= len(self.answer):
            self.answer = None
            self.transport.close()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._write_more()


class MetricsEndpoint:
    """The HTTP listener; started with the broker when ``metrics.listen`` is set."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.server: asyncio.base_events.Server | None = None
        self.pages = Pages(broker)
        # Open connections, oldest first.
        self.connections: dict[ScrapeConnection, None] = {}
        auth = broker.config.metrics_auth
        self.credentials = None if auth is None else f"{auth[0]}:{auth[1]}".encode()

    async def start(self) -> None:
        address = self.broker.config.metrics_listen
        if address is None:
            return
        host, port = address
        self.server = await asyncio.get_running_loop().create_server(
            lambda: ScrapeConnection(self), host, port, reuse_address=True
        )
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def opened(self, connection: ScrapeConnection) -> None:
        if len(self.connections) >= MAX_CONNECTIONS:
            # A slow or half-sent request gives way to the newcomer: holding sockets open
            # cannot keep a scraper out.
            waiting = next((c for c in self.connections if not c.answering), None)
            if waiting is None:
                connection.abort()
                return
            waiting.abort()
        self.connections[connection] = None

    def closed(self, connection: ScrapeConnection) -> None:
        self.connections.pop(connection, None)

    async def answer(self, connection: ScrapeConnection, head: bytes) -> None:
        request_line, *header_lines = head.split(b"\r\n")
        parts = request_line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            connection.respond("400 Bad Request", b"bad request\n")
            return
        method, target, _version = parts
        if method not in (b"GET", b"HEAD"):
            connection.respond("405 Method Not Allowed", b"GET only\n", {"Allow": "GET, HEAD"})
            return
        if target.partition(b"?")[0] != b"/metrics":
            connection.respond("404 Not Found", b"see /metrics\n")
            return
        if not self._authorized(header_lines):
            connection.respond(
                "401 Unauthorized",
                b"credentials needed\n",
                {"WWW-Authenticate": 'Basic realm="amqha metrics", charset="UTF-8"'},
            )
            return
        try:
            page = await self.pages.get()
        except Exception:
            log.exception("metrics: the page could not be made")
            connection.respond("500 Internal Server Error", b"the page could not be made\n")
            return
        connection.respond("200 OK", page, head=method == b"HEAD")

    def _authorized(self, header_lines: list[bytes]) -> bool:
        if self.credentials is None:
            return True
        for line in header_lines:
            name, _, value = line.partition(b":")
            if name.strip().lower() != b"authorization":
                continue
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() != b"basic":
                return False
            try:
                given = base64.b64decode(token.strip(), validate=True)
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(given, self.credentials)
        return False

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for connection in list(self.connections):
            connection.abort()
        self.pages.close()
