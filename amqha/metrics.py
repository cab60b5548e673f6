"""The Prometheus endpoint: the broker's counters and the pair's state, read on scrape.

Owns: the ``metrics.listen`` HTTP listener (prometheus_client's own server, on its own
thread), the collector that turns one snapshot of the broker into metric families, and
the metric names, which follow RabbitMQ's prometheus plugin where the meaning is the same
(``rabbitmq_queue_messages_ready``...) and are ``amqha_`` where it is not.

Must not know: how the counters are kept (queues and channels count; nothing here runs on
the publish path). The snapshot is taken on the broker's loop, so the loop's objects are
never read from the HTTP thread; a scrape costs the loop one pass over the queues.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .server import Broker

log = logging.getLogger("amqha.metrics")

# A scrape waits this long for the loop to take its snapshot.
SNAPSHOT_TIMEOUT = 5.0
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
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
    """What one scrape reports, copied on the broker's loop."""

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


class BrokerCollector(Collector):
    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop

    def _snapshot(self) -> Snapshot:
        future: concurrent.futures.Future[Snapshot] = concurrent.futures.Future()

        def take() -> None:
            try:
                future.set_result(take_snapshot(self.broker))
            except Exception as error:
                future.set_exception(error)

        self.loop.call_soon_threadsafe(take)
        return future.result(SNAPSHOT_TIMEOUT)

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        yield from queue_metrics(snapshot.queues)
        yield from broker_metrics(snapshot)
        yield from pair_metrics(snapshot.pair)


def queue_metrics(queues: list[QueueFigures]) -> Iterator[Metric]:
    labels = ["vhost", "queue"]
    gauges = {
        "ready": GaugeMetricFamily(
            "rabbitmq_queue_messages_ready", "Messages ready to be delivered", labels=labels
        ),
        "unacked": GaugeMetricFamily(
            "rabbitmq_queue_messages_unacked",
            "Messages delivered and not yet acknowledged",
            labels=labels,
        ),
        "consumers": GaugeMetricFamily(
            "rabbitmq_queue_consumers", "Consumers on the queue", labels=labels
        ),
    }
    counters = {
        "published": CounterMetricFamily(
            "rabbitmq_queue_messages_published", "Messages enqueued", labels=labels
        ),
        "delivered": CounterMetricFamily(
            "rabbitmq_queue_messages_delivered",
            "Messages delivered to consumers and Basic.Get",
            labels=labels,
        ),
        "acked": CounterMetricFamily(
            "rabbitmq_queue_messages_acked", "Deliveries acknowledged", labels=labels
        ),
    }
    for figures in queues:
        values = [figures.vhost, figures.name]
        for key, family in (*gauges.items(), *counters.items()):
            family.add_metric(values, getattr(figures, key))
    yield from gauges.values()
    yield from counters.values()
    yield GaugeMetricFamily("rabbitmq_queues", "Queues", value=len(queues))


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


class MetricsEndpoint:
    """The HTTP listener; started with the broker when ``metrics.listen`` is set."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.httpd: WSGIServer | None = None

    def start(self) -> None:
        address = self.broker.config.metrics_listen
        if address is None:
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BrokerCollector(self.broker, asyncio.get_running_loop()))
        host, port = address
        self.httpd, _thread = start_http_server(port, host, registry)
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    @property
    def port(self) -> int:
        assert self.httpd is not None
        return int(self.httpd.server_address[1])

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
