"""The Prometheus endpoint: the broker's counters and the pair's state, as of a snapshot.

Owns: the ``metrics.listen`` HTTP listener (aiohttp's low-level server on the broker's
loop: ``GET /metrics`` and ``/metrics/per-object``, the same page, and a 404 for any other
path), its bounds and basic auth, the snapshot cache, and the metric names, which follow
RabbitMQ 3.10's prometheus plugin where the meaning is the same
(``rabbitmq_queue_messages_ready``...) and are ``amqha_`` where it is not (docs/operations.md).
``rabbitmq_connections`` and ``rabbitmq_channels`` count clients only, as RabbitMQ does: the
pair's own links (a PASSIVE's peering and replication connections) are
``amqha_peer_links`` and ``amqha_peer_link_channels``.

Bounds: a snapshot of the broker (one pass over the queues, on the loop) is taken at
most once per SNAPSHOT_PERIOD however many scrapes come, and turned into text on one
worker thread; every scrape in between is answered with those bytes. aiohttp parses the
requests with its size limits (HANDLER_OPTIONS); on top of it, ScrapeHandler keeps the
count and the time: at most MAX_CONNECTIONS sockets are open, past that the oldest one
still sending its request is dropped for the newcomer; a request must be in within
REQUEST_TIMEOUT; from then on the answer is made, written as the socket drains and
taken within RESPONSE_TIMEOUT. One request per connection. A stop gives answers under
way SHUTDOWN_TIMEOUT (twice at most: aiohttp waits that long for the answer, then that
long again for it to be cancelled), then closes every socket.

Must not know: how the counters are kept (queues and channels count; nothing here runs on
the publish path). The loop's objects are read on the loop only; the worker thread sees
the snapshot's copies.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hmac
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import clock
from .httpbounds import BoundedSocket
from .logtext import escaped
from .ports import MetricsListenError

if TYPE_CHECKING:
    from .host import MetricsSource

log = logging.getLogger("amqha.metrics")

# A snapshot serves every scrape for this long after it was taken.
SNAPSHOT_PERIOD = 1.0
MAX_CONNECTIONS = 256
REQUEST_TIMEOUT = 10.0
RESPONSE_TIMEOUT = 60.0
# aiohttp's shutdown_timeout: how long a stop lets answers under way finish.
SHUTDOWN_TIMEOUT = 0.5
# The answer goes out this much at a time, as the socket drains: a scraper that does not
# read holds at most this (and the kernel's buffer), not its own copy of the page.
CHUNK = 64 * 1024
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BASE_HEADERS = {"Content-Type": CONTENT_TYPE, "Server": "amqha"}
# aiohttp's RequestHandler options. A request's head is at most MAX_HEADERS lines of at
# most MAX_FIELD bytes after a request line of at most MAX_LINE (past it: 431): about
# 72 KiB held per connection while it arrives. One request per connection (every answer
# closes it); lingering_time 0: a body sent with a refused request is not read. The
# releases of aiohttp that time a connection's first request with keepalive_timeout do
# what ScrapeHandler's own timer does, at the same time.
MAX_LINE = 8192
MAX_FIELD = 4096
MAX_HEADERS = 16
HANDLER_OPTIONS: dict[str, Any] = {
    "max_line_size": MAX_LINE,
    "max_field_size": MAX_FIELD,
    "max_headers": MAX_HEADERS,
    "keepalive_timeout": REQUEST_TIMEOUT,
    "lingering_time": 0,
    "access_log": None,
}
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# What is answered: RabbitMQ's paths. The figures are per queue on both (RabbitMQ's
# /metrics sums them unless return_per_object_metrics is set).
PATHS = ("/metrics", "/metrics/per-object")


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
    peer_links: int = 0
    peer_link_channels: int = 0
    queued_bytes: int = 0
    memory_used: int = 0
    watermark: int = 0
    blocked: bool = False
    memory_blocked: bool = False
    store: dict[str, Any] = field(default_factory=dict)
    replication: dict[str, Any] = field(default_factory=dict)
    pair: dict[str, Any] = field(default_factory=dict)
    federation: list[dict[str, Any]] = field(default_factory=list)  # one per link
    # (kind "exchange" or "queue", vhost, name, keys held, hits, evictions): one per
    # deduplicating exchange or queue.
    dedup: list[tuple[str, str, str, int, int, int]] = field(default_factory=list)
    number: int = 0  # how many snapshots this endpoint has taken, this one included


def take_snapshot(broker: MetricsSource) -> Snapshot:
    """Runs on the broker's loop."""
    clients = []
    links = []
    for connection in broker.open_connections():
        user = connection.user
        (links if user is not None and "peering" in user.tags else clients).append(connection)
    snapshot = Snapshot(
        connections=len(clients),
        channels=sum(len(c.channels) for c in clients),
        peer_links=len(links),
        peer_link_channels=sum(len(c.channels) for c in links),
        memory_used=broker.memory.in_use(),
        watermark=broker.config.limits.memory_high_watermark,
        blocked=broker.blocked,
        memory_blocked=broker.memory.over,
        store=broker.store_status(),
        replication=broker.replication_status(),
        pair=broker.pair.status(),
    )
    federation = getattr(broker, "federation", None)
    if federation is not None:
        snapshot.federation = federation.status()
    for vhost in broker.vhosts.values():
        for exchange in vhost.exchanges.values():
            if exchange.dedup is not None:
                snapshot.dedup.append(_dedup_figures("exchange", vhost.name, exchange))
        for queue in vhost.visible_queues():
            if queue.dedup is not None:
                snapshot.dedup.append(_dedup_figures("queue", vhost.name, queue))
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


def _dedup_figures(kind: str, vhost: str, owner: Any) -> tuple[str, str, str, int, int, int]:
    memory = owner.dedup
    counters = memory.counters
    return (kind, vhost, owner.name, len(memory), counters.hits, counters.evictions)


def dedup_metrics(owners: list[tuple[str, str, str, int, int, int]]) -> Iterator[Metric]:
    """Per deduplicating exchange or queue: keys held, copies dropped, keys evicted."""
    labels = ["kind", "vhost", "name"]
    families = (
        GaugeMetricFamily("amqha_dedup_keys", "Deduplication keys held", labels=labels),
        CounterMetricFamily(
            "amqha_dedup_copies_dropped", "Messages dropped as copies", labels=labels
        ),
        CounterMetricFamily(
            "amqha_dedup_keys_evicted", "Keys evicted from a full cache", labels=labels
        ),
    )
    for kind, vhost, name, *figures in owners:
        for family, value in zip(families, figures, strict=True):
            family.add_metric([kind, vhost, name], value)
    yield from families


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
        yield from federation_metrics(snapshot.federation)
        yield from dedup_metrics(snapshot.dedup)
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
    # RabbitMQ 3.10 has no per-queue delivered or acked counter (later releases split
    # deliveries by ack mode and Basic.Get): amqha's own names.
    (
        "delivered",
        "amqha_queue_messages_delivered_total",
        "counter",
        "Messages delivered to consumers and Basic.Get",
    ),
    ("acked", "amqha_queue_messages_acked_total", "counter", "Deliveries acknowledged"),
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
    yield GaugeMetricFamily(
        "rabbitmq_connections", "Client connections currently open", value=snapshot.connections
    )
    yield GaugeMetricFamily(
        "rabbitmq_channels",
        "Channels of client connections currently open",
        value=snapshot.channels,
    )
    yield GaugeMetricFamily(
        "amqha_peer_links",
        "Connections of the pair's peer (peering user) open on this server",
        value=snapshot.peer_links,
    )
    yield GaugeMetricFamily(
        "amqha_peer_link_channels",
        "Channels of the pair's peer connections",
        value=snapshot.peer_link_channels,
    )
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
        yield GaugeMetricFamily(
            "amqha_store_disk_failed",
            "1 once the store's disk failed (an I/O error): nothing is stored or confirmed"
            " until a restart",
            value=int(bool(store.get("disk_failed"))),
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
    if feed is not None and feed.get("when_alone") == "hold":
        yield GaugeMetricFamily(
            "amqha_replication_held_confirms",
            "Publishes whose confirms wait for a PASSIVE in sync (replication.when_alone: hold)",
            value=feed.get("held_confirms") or 0,
        )
        since = feed.get("held_since")
        yield GaugeMetricFamily(
            "amqha_replication_held_seconds",
            "Seconds since confirms last went out for want of an in-sync PASSIVE (0: none held)",
            value=0.0 if since is None else max(0.0, clock.now() - since),
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
    yield GaugeMetricFamily(
        "amqha_config_drift_keys",
        "Settings the pair must share that differ from the peer's (0: they match)",
        value=len(status.get("config_drift") or []),
    )
    maintenance = GaugeMetricFamily(
        "amqha_pair_maintenance",
        "1 for a server of the pair in maintenance (never voted in; its stop is planned)",
        labels=["server"],
    )
    for role in ("primary", "backup"):
        maintenance.add_metric([role], int(role in (status.get("maintenance") or [])))
    yield maintenance
    peer = status.get("peer") or {}
    last_seen = peer.get("last_seen")
    seen = GaugeMetricFamily(
        "amqha_pair_peer_seen_seconds",
        "Seconds since the peer's last state message (absent when never seen)",
    )
    if last_seen is not None:
        seen.add_metric([], max(0.0, clock.now() - last_seen))
    yield seen
    for key, text in (
        ("takeovers", "Times this server became ACTIVE (start-up included)"),
        ("redirects", "Client connection attempts sent to the active server"),
        ("refusals", "Client connection attempts refused with no active server to name"),
    ):
        yield CounterMetricFamily(f"amqha_pair_{key}", text, value=status.get(key, 0))


LINK_STATES = ("connecting", "running", "stalled", "failed")
LINK_LABELS = ["exchange", "vhost", "upstream"]


def federation_metrics(links: list[dict[str, Any]]) -> Iterator[Metric]:
    """One series per configured federation link (docs/federation.md, "What a link
    reports"); none when this server federates nothing."""
    if not links:
        return
    state = GaugeMetricFamily(
        "amqha_federation_link_state",
        "1 for the state a federation link is in",
        labels=[*LINK_LABELS, "state"],
    )
    attempts = GaugeMetricFamily(
        "amqha_federation_link_attempts",
        "Failed connection attempts since the link last ran",
        labels=LINK_LABELS,
    )
    bindings = GaugeMetricFamily(
        "amqha_federation_bindings",
        "Upstream bindings the link's local ones ask for (desired) and bound (confirmed)",
        labels=[*LINK_LABELS, "kind"],
    )
    received = CounterMetricFamily(
        "amqha_federation_messages_in",
        "Messages taken down from the upstream and routed here",
        labels=LINK_LABELS,
    )
    sent = CounterMetricFamily(
        "amqha_federation_messages_out",
        "Messages forwarded upstream and confirmed there",
        labels=LINK_LABELS,
    )
    dropped = CounterMetricFamily(
        "amqha_federation_messages_dropped",
        "Messages taken down but not routed, by reason (loop, max_hops, ...)",
        labels=[*LINK_LABELS, "reason"],
    )
    repairs = CounterMetricFamily(
        "amqha_federation_binding_repairs",
        "Upstream bindings made or removed by a reconcile",
        labels=LINK_LABELS,
    )
    forward_depth = GaugeMetricFamily(
        "amqha_federation_forward_depth",
        "Messages waiting here to be forwarded upstream",
        labels=LINK_LABELS,
    )
    for link in links:
        labels = [str(link.get(key, "")) for key in LINK_LABELS]
        current = link.get("state")
        for name in LINK_STATES:
            state.add_metric([*labels, name], int(name == current))
        attempts.add_metric(labels, link.get("attempts", 0))
        for kind in ("desired", "confirmed"):
            bindings.add_metric([*labels, kind], (link.get("bindings") or {}).get(kind, 0))
        received.add_metric(labels, link.get("in", 0))
        sent.add_metric(labels, link.get("out", 0))
        for reason, count in sorted((link.get("dropped") or {}).items()):
            dropped.add_metric([*labels, reason], count)
        repairs.add_metric(labels, link.get("repairs", 0))
        forward = link.get("forward")
        if forward:
            forward_depth.add_metric(labels, forward.get("depth", 0))
    yield from (state, attempts, bindings, received, sent, dropped, repairs, forward_depth)


class Pages:
    """The rendered page, refreshed at most once per SNAPSHOT_PERIOD; scrapes that come
    while it is being made wait for that one."""

    def __init__(self, broker: MetricsSource) -> None:
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


class ScrapeHandler(BoundedSocket):
    """One scrape connection, with the endpoint's bounds on top of aiohttp's HTTP/1.1: the
    request must be in within REQUEST_TIMEOUT of the connection, its answer taken within
    RESPONSE_TIMEOUT of that; past either the socket is aborted (``BoundedSocket``)."""

    __slots__ = ("endpoint", "answering")

    first_timeout = REQUEST_TIMEOUT

    def __init__(self, manager: web.Server, endpoint: MetricsEndpoint, **options: Any) -> None:
        super().__init__(manager, **options)
        self.endpoint = endpoint
        self.answering = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.endpoint.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.endpoint.closed(self)
        super().connection_lost(exc)

    def request_in(self) -> None:
        """The request is parsed: from here its answer has RESPONSE_TIMEOUT, the page's
        making included."""
        self.answering = True
        self.drop_after(RESPONSE_TIMEOUT)

    def unparsable(
        self, request: web.BaseRequest, error: HttpProcessingError, status: int
    ) -> web.StreamResponse:
        log.debug("metrics: bad request from %s: %s", request.remote, escaped(error))
        return reply(status, b"request too large\n" if status == 431 else b"bad request\n")


class ScrapeServer(web.Server):
    """aiohttp's low-level server, making ScrapeHandler connections."""

    def __init__(self, endpoint: MetricsEndpoint) -> None:
        # handler_cancellation: a scraper that leaves stops its own answer (the page others
        # wait for is shielded in Pages.get).
        super().__init__(endpoint.answer, handler_cancellation=True)
        self.endpoint = endpoint

    def __call__(self) -> ScrapeHandler:
        return ScrapeHandler(
            self, self.endpoint, loop=asyncio.get_running_loop(), **HANDLER_OPTIONS
        )


def reply(status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    """A short answer, then the connection is closed."""
    response = web.Response(status=status, body=body, headers={**BASE_HEADERS, **(headers or {})})
    response.force_close()
    return response


class MetricsEndpoint:
    """The HTTP listener; started with the broker when ``metrics.listen`` is set."""

    def __init__(self, broker: MetricsSource) -> None:
        self.broker = broker
        self.runner: web.ServerRunner | None = None
        self.pages = Pages(broker)
        # Open connections, oldest first.
        self.connections: dict[ScrapeHandler, None] = {}
        auth = broker.config.metrics_auth
        self.credentials = None if auth is None else f"{auth[0]}:{auth[1]}".encode()

    async def start(self) -> None:
        address = self.broker.config.metrics_listen
        if address is None:
            return
        host, port = address
        self.runner = web.ServerRunner(ScrapeServer(self), shutdown_timeout=SHUTDOWN_TIMEOUT)
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, host, port, reuse_address=True).start()
        except OSError as error:
            raise MetricsListenError(f"{host}:{port}", error) from None
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    @property
    def port(self) -> int:
        assert self.runner is not None
        return int(self.runner.addresses[0][1])

    def opened(self, connection: ScrapeHandler) -> None:
        if len(self.connections) >= MAX_CONNECTIONS:
            # A slow or half-sent request gives way to the newcomer: holding sockets open
            # cannot keep a scraper out.
            waiting = next((c for c in self.connections if not c.answering), None)
            if waiting is None:
                connection.drop()
                return
            self.connections.pop(waiting)
            waiting.drop()
        self.connections[connection] = None

    def closed(self, connection: ScrapeHandler) -> None:
        self.connections.pop(connection, None)

    async def answer(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        if isinstance(connection, ScrapeHandler):
            connection.request_in()
        if request.method not in ("GET", "HEAD"):
            return reply(405, b"GET only\n", {"Allow": "GET, HEAD"})
        if request.path not in PATHS:
            return reply(404, b"see /metrics\n")
        if not self._authorized(request.headers.get("Authorization")):
            return reply(
                401,
                b"credentials needed\n",
                {"WWW-Authenticate": 'Basic realm="amqha metrics", charset="UTF-8"'},
            )
        try:
            page = await self.pages.get()
        except Exception:
            log.exception("metrics: the page could not be made")
            return reply(500, b"the page could not be made\n")
        response = web.StreamResponse(headers=BASE_HEADERS)
        response.content_length = len(page)
        response.force_close()
        try:
            await response.prepare(request)
            if request.method == "GET":
                # As the socket drains: a scraper that does not read holds at most CHUNK
                # (and the kernel's buffer), not its own copy of the page.
                view = memoryview(page)
                for offset in range(0, len(page), CHUNK):
                    await response.write(view[offset : offset + CHUNK])
            await response.write_eof()
        except ConnectionError:
            pass  # the scraper left, or was dropped
        return response

    def _authorized(self, header: str | None) -> bool:
        if self.credentials is None:
            return True
        if header is None:
            return False
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given = base64.b64decode(token.strip(), validate=True)
        except ValueError:  # binascii.Error, or a token that is not ASCII
            return False
        return hmac.compare_digest(given, self.credentials)

    async def stop(self) -> None:
        """Answers under way get SHUTDOWN_TIMEOUT to finish; then every socket is closed."""
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()
        for connection in list(self.connections):
            connection.drop()
        self.pages.close()
