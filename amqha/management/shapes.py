"""The management API's JSON, in RabbitMQ's shapes, from the broker's model (pure).

Owns: what GET /api/queues, /api/exchanges, /api/bindings, /api/vhosts, /api/nodes,
/api/overview, /api/connections, /api/channels, /api/consumers and the health checks
answer, made from the model's objects (``core`` queues, exchanges, bindings; the broker's
connections, their channels and consumers) and the pair's status dicts; the rates of the
message counters (``Rates``). Field names are RabbitMQ's where the meaning is the same; amqha's
own figures are under ``amqha`` (docs/operations.md, "Management API").

Must not know: HTTP, sockets, the clock (``now`` is given), who asks (``access``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..dual import dual_active

# What the API says it is: RabbitMQ's management API as of this version, for the tools
# that read it (a field they need that amqha lacks is left out, never invented).
MANAGEMENT_VERSION = "3.12.0"
# Rates are taken over the time between two looks at the counters, at least this far
# apart (seconds); a look sooner answers the last rates.
RATE_INTERVAL = 1.0


def node_name(server: str) -> str:
    """A server as a RabbitMQ node name: ``amqha@primary``."""
    return f"amqha@{server}"


# -- rates ------------------------------------------------------------------------------


@dataclass
class _Sample:
    at: float
    counts: tuple[int, ...]
    rates: tuple[float, ...]
    seen: int


@dataclass
class Rates:
    """Per-second rates of monotonic counters (a queue's published, delivered, acked),
    from the two latest looks at least RATE_INTERVAL apart. Keys not seen in a whole pass
    (a deleted queue) are forgotten at the next ``sweep``."""

    samples: dict[Any, _Sample] = field(default_factory=dict)
    pass_number: int = 0

    def look(self, key: Any, now: float, counts: tuple[int, ...]) -> tuple[float, ...]:
        sample = self.samples.get(key)
        if sample is None:
            self.samples[key] = _Sample(now, counts, (0.0,) * len(counts), self.pass_number)
            return (0.0,) * len(counts)
        sample.seen = self.pass_number
        elapsed = now - sample.at
        if elapsed >= RATE_INTERVAL:
            sample.rates = tuple(
                round(max(0, new - old) / elapsed, 1)
                for new, old in zip(counts, sample.counts, strict=True)
            )
            sample.at, sample.counts = now, counts
        return sample.rates

    def sweep(self) -> None:
        """End of a pass over every key: the ones not looked at are gone."""
        self.samples = {k: s for k, s in self.samples.items() if s.seen == self.pass_number}
        self.pass_number += 1


def _stats(published: int, delivered: int, acked: int, rates: tuple[float, ...]) -> dict:
    return {
        "publish": published,
        "publish_details": {"rate": rates[0]},
        "deliver_get": delivered,
        "deliver_get_details": {"rate": rates[1]},
        "ack": acked,
        "ack_details": {"rate": rates[2]},
    }


# -- queues, exchanges, bindings ------------------------------------------------------------


def queue_rates(rates: Rates, vhost: str, queue: Any, now: float) -> tuple[float, ...]:
    return rates.look(
        ("queue", vhost, queue.name), now, (queue.published, queue.delivered, queue.acked)
    )


def queue_shape(vhost: str, queue: Any, node: str, rates: tuple[float, ...]) -> dict[str, Any]:
    ready, unacked = queue.message_count, queue.unacked
    arguments = dict(queue.arguments)
    return {
        "name": queue.name,
        "vhost": vhost,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None,
        "arguments": _jsonable(arguments),
        "node": node,
        # As RabbitMQ names it: a queue declared quorum is one (amqha.core.kinds.new_queue).
        "type": "quorum" if arguments.get("x-queue-type") == "quorum" else "classic",
        "state": "running",
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "message_bytes_ready": queue.bytes,
        "consumers": queue.consumer_count,
        "message_stats": _stats(queue.published, queue.delivered, queue.acked, rates),
        "amqha": {"replicated": bool(queue.replicated)},
        **policy_fields(queue),
    }


def policy_fields(queue: Any) -> dict[str, Any]:
    """RabbitMQ's names of the policy and operator policy that apply to a queue, and
    what they change of its arguments (``core.policies``)."""
    limits = queue.limits
    effective = {
        key[2:]: value
        for key, value in limits.effective.items()
        if key.startswith("x-") and queue.arguments.get(key) != value
    }
    return {
        "policy": limits.policy,
        "operator_policy": limits.operator_policy,
        "effective_policy_definition": _jsonable(effective),
    }


def policy_shape(policy: Any) -> dict[str, Any]:
    return {
        "vhost": policy.vhost,
        "name": policy.name,
        "pattern": policy.pattern,
        "apply-to": policy.apply_to,
        "definition": _jsonable(dict(policy.definition)),
        "priority": policy.priority,
    }


def exchange_shape(vhost: str, exchange: Any) -> dict[str, Any]:
    return {
        "name": exchange.name,
        "vhost": vhost,
        "type": exchange.kind,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": _jsonable(dict(exchange.arguments)),
        "user_who_performed_action": "",
    }


def visible_exchanges(vhost: Any) -> Iterator[Any]:
    """Every exchange but the control plane's (docs/security.md)."""
    return (e for e in vhost.exchanges.values() if not e.control)


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """A binding's name in a URL, as RabbitMQ makes it: the key, and a hash of the
    arguments when there are any (``~`` alone for an empty key without arguments)."""
    if not arguments:
        return urllib.parse.quote(routing_key, safe="") or "~"
    digest = hashlib.sha256(
        json.dumps(_jsonable(arguments), sort_keys=True).encode("utf-8")
    ).digest()
    encoded = base64.urlsafe_b64encode(digest[:16]).decode().rstrip("=")
    return f"{urllib.parse.quote(routing_key, safe='')}~{encoded}"


def binding_shape(
    vhost: str, source: str, destination: str, kind: str, key: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    return {
        "source": source,
        "vhost": vhost,
        "destination": destination,
        "destination_type": kind,
        "routing_key": key,
        "arguments": _jsonable(dict(arguments)),
        "properties_key": properties_key(key, arguments),
    }


def bindings_of(vhost: Any) -> list[dict[str, Any]]:
    """Every binding of a vhost: the default exchange's one per queue first (as RabbitMQ
    lists them), then each exchange's, none of the control plane's (it has none)."""
    found = [
        binding_shape(vhost.name, "", name, "queue", name, {})
        for name in sorted(q.name for q in vhost.visible_queues())
    ]
    for exchange in visible_exchanges(vhost):
        if exchange.name == "":
            continue
        found.extend(shape for shape, _ in exchange_bindings(vhost.name, exchange))
    return found


def exchange_bindings(vhost: str, exchange: Any) -> Iterator[tuple[dict[str, Any], Any]]:
    """Each binding from ``exchange``: its shape, and the binding as the model holds it."""
    for binding in exchange.bindings.values():
        destination = binding.destination
        kind = "exchange" if hasattr(destination, "kind") else "queue"
        shape = binding_shape(
            vhost, exchange.name, destination.name, kind, binding.routing_key, binding.arguments
        )
        yield shape, binding


def vhost_shape(vhost: Any, rates: tuple[float, ...] = (0.0, 0.0, 0.0)) -> dict[str, Any]:
    queues = vhost.visible_queues()
    ready = sum(q.message_count for q in queues)
    unacked = sum(q.unacked for q in queues)
    return {
        "name": vhost.name,
        "description": "",
        "tags": [],
        "metadata": {"description": "", "tags": []},
        "tracing": False,
        "default_queue_type": "classic",
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "message_stats": _stats(
            sum(q.published for q in queues),
            sum(q.delivered for q in queues),
            sum(q.acked for q in queues),
            rates,
        ),
        "cluster_state": {},
    }


# -- the pair as two nodes ---------------------------------------------------------------


def _sync_of(replication: dict[str, Any]) -> dict[str, Any]:
    """What this server knows of replication: as ACTIVE, its feed to the PASSIVE; as
    PASSIVE, its own catching up."""
    feed = replication.get("feed")
    follower = replication.get("follower")
    if feed is not None:
        return {
            "side": "active",
            "peer_in_sync": feed.get("state") == "in_sync",
            "state": feed.get("state"),
            "lag_changes": feed.get("lag_changes"),
            "lag_bytes": feed.get("lag_bytes"),
            "lag_seconds": feed.get("lag_seconds"),
        }
    if follower is not None:
        return {
            "side": "passive",
            "in_sync": bool(follower.get("in_sync")),
            "state": follower.get("state"),
        }
    return {"side": None}


def nodes_shape(
    status: dict[str, Any],
    replication: dict[str, Any],
    own: dict[str, Any],
    now: float,
) -> list[dict[str, Any]]:
    """Both servers of the pair: this one from its own state (``own``: uptime, memory,
    alarms), the peer from what this server knows of it (its last state message, and the
    replication link as this side sees it). A standalone server is one node."""
    sync = _sync_of(replication)
    name = status.get("name") or own["name"]
    this_in_sync: bool | None = None
    peer_in_sync: bool | None = None
    if sync["side"] == "active":
        peer_in_sync = sync["peer_in_sync"]
    elif sync["side"] == "passive":
        this_in_sync = sync["in_sync"]
    this = {
        "name": node_name(name),
        "type": "disc",
        "running": True,
        "being_drained": False,
        "uptime": int(own["uptime"] * 1000),
        "mem_used": own["mem_used"],
        "mem_limit": own["mem_limit"],
        "mem_alarm": own["mem_alarm"],
        "disk_free_alarm": own["disk_alarm"],
        "partitions": [],
        "amqha": {
            "this_server": True,
            "role": status.get("role"),
            "state": status.get("state"),
            "epoch": status.get("epoch", 0),
            "serving": status.get("serving", status.get("state") == "ACTIVE"),
            "in_sync": this_in_sync,
            "listen": status.get("listen") or own.get("listen"),
            "replication": sync,
            # The settings the pair must share that differ from the peer's (by key).
            "config_drift": list(status.get("config_drift") or []),
            "maintenance": status.get("role") in (status.get("maintenance") or []),
        },
    }
    peer = status.get("peer")
    if peer is None and status.get("role") in (None, "standalone"):
        return [this]
    peer_name = (peer or {}).get("name") or own.get("peer_name") or "peer"
    last_seen = (peer or {}).get("last_seen")
    lag = (
        {k: sync.get(k) for k in ("lag_changes", "lag_bytes", "lag_seconds")}
        if sync["side"] == "active"
        else {}
    )
    peer_shape = {
        "name": node_name(peer_name),
        "type": "disc",
        "running": bool(peer and peer.get("alive")),
        "partitions": [],
        "amqha": {
            "this_server": False,
            "role": (peer or {}).get("role"),
            "state": (peer or {}).get("state"),
            "epoch": (peer or {}).get("epoch"),
            "alive": bool(peer and peer.get("alive")),
            "seen_seconds_ago": None if last_seen is None else round(max(0.0, now - last_seen), 3),
            "in_sync": peer_in_sync,
            # As this server's feed sees it: in_sync, catching_up, or none (no PASSIVE
            # subscribed); None where this server is not the ACTIVE.
            "replication_state": sync.get("state") if sync["side"] == "active" else None,
            "listen": (peer or {}).get("listen") or own.get("peer_listen"),
            "maintenance": (peer or {}).get("role") in (status.get("maintenance") or [])
            or _peer_role(status.get("role")) in (status.get("maintenance") or []),
            **lag,
        },
    }
    # Two servers ACTIVE as this server sees it: both named, and what resolves it.
    this["amqha"]["dual_active"] = dual_active([status])
    return [this, peer_shape]


def _peer_role(role: Any) -> str | None:
    return {"primary": "backup", "backup": "primary"}.get(role)


def config_match(status: dict[str, Any]) -> tuple[bool, str]:
    """Do the settings the pair must share match the peer's? (answer, why not)."""
    keys = list(status.get("config_drift") or [])
    if keys:
        return False, "config drift: the settings differ from the peer's: " + ", ".join(keys[:20])
    return True, "the settings the pair shares match the peer's (as last heard)"


def active_in_sync(status: dict[str, Any], replication: dict[str, Any]) -> tuple[bool, str]:
    """Is this server ACTIVE, serving, and its PASSIVE in sync (every confirm it sends is
    held by both)? (answer, why not)."""
    if status.get("role") == "standalone":
        return False, "standalone: no peer to be in sync with"
    if status.get("state") != "ACTIVE":
        return False, f"not ACTIVE (state {status.get('state')})"
    if not status.get("serving", True):
        return False, "ACTIVE but not serving (fenced or its heartbeat is late)"
    if not replication.get("enabled"):
        return False, "replication is off"
    sync = _sync_of(replication)
    if sync["side"] != "active" or not sync["peer_in_sync"]:
        state = sync.get("state") or "no PASSIVE subscribed"
        planned = [r for r in status.get("maintenance") or [] if r != status.get("role")]
        if planned:
            # A planned stop raises no alarm (docs/failover.md, "Maintenance").
            return True, f"unprotected (maintenance): the {planned[0]} is in maintenance ({state})"
        return False, f"the PASSIVE is not in sync ({state})"
    return True, "ACTIVE, PASSIVE in sync"


def is_active(status: dict[str, Any]) -> tuple[bool, str]:
    if status.get("state") != "ACTIVE":
        return False, f"not ACTIVE (state {status.get('state')})"
    if not status.get("serving", True):
        return False, "ACTIVE but not serving (fenced or its heartbeat is late)"
    return True, "ACTIVE"


def alarms(node: str, memory: bool, disk: bool) -> list[dict[str, str]]:
    found = []
    if memory:
        found.append({"node": node, "resource": "memory"})
    if disk:
        found.append({"node": node, "resource": "disk"})
    return found


# -- helpers ------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """AMQP field values as JSON: bytes as text, decimals and timestamps as strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def sorted_by_name(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(items, key=lambda item: (item.get("vhost", ""), item.get("name", "")))


# -- connections, channels and consumers as RabbitMQ shows them ---------------------------


def _address(transport: Any, what: str) -> tuple[str, int]:
    where = transport.get_extra_info(what) if transport is not None else None
    if not where:
        return "", 0
    return str(where[0]), int(where[1])


def connection_name(connection: Any) -> str:
    """``peer host:port -> local host:port``, as RabbitMQ names a connection."""
    peer_host, peer_port = _address(connection.transport, "peername")
    host, port = _address(connection.transport, "sockname")
    return f"{peer_host}:{peer_port} -> {host}:{port}"


def connection_shape(connection: Any, node: str) -> dict[str, Any]:
    peer_host, peer_port = _address(connection.transport, "peername")
    host, port = _address(connection.transport, "sockname")
    properties = _jsonable(dict(connection.client_properties))
    tls = connection.transport is not None and connection.transport.get_extra_info("sslcontext")
    return {
        "name": connection_name(connection),
        "node": node,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "user": connection.user.name,
        "vhost": connection.vhost.name,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "host": host,
        "port": port,
        "channels": len(connection.channels),
        "channel_max": connection.channel_max,
        "frame_max": connection.frame_max,
        "timeout": connection.heartbeat,
        "ssl": bool(tls),
        "state": "blocked" if connection.read_holds else "running",
        "client_properties": properties,
        "amqha": {"privileged": bool(connection.bypasses_gate)},
    }


def channel_shape(connection: Any, channel: Any, node: str) -> dict[str, Any]:
    name = connection_name(connection)
    return {
        "name": f"{name} ({channel.number})",
        "number": channel.number,
        "node": node,
        "user": connection.user.name,
        "vhost": connection.vhost.name,
        "connection_details": {
            "name": name,
            "peer_host": _address(connection.transport, "peername")[0],
            "peer_port": _address(connection.transport, "peername")[1],
        },
        "consumer_count": len(channel.consumers),
        "messages_unacknowledged": len(channel.unacked),
        "prefetch_count": channel.consumer_prefetch,
        "global_prefetch_count": channel.global_prefetch,
        "confirm": bool(channel.confirm),
        "transactional": channel.transaction is not None,
        "state": "running",
    }


def consumer_shape(connection: Any, channel: Any, consumer: Any) -> dict[str, Any]:
    name = connection_name(connection)
    peer_host, peer_port = _address(connection.transport, "peername")
    queue = consumer.queue
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": queue.name, "vhost": connection.vhost.name},
        "channel_details": {
            "name": f"{name} ({channel.number})",
            "number": channel.number,
            "connection_name": name,
            "peer_host": peer_host,
            "peer_port": peer_port,
            "user": connection.user.name,
        },
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "active": True,
        "activity_status": "up",
        "arguments": {},
    }
