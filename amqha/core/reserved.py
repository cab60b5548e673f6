"""The names every vhost reserves, and the exchange that routes by queue name.

Owns: the standard exchanges (``amq.direct``...), the control-plane exchanges and who may
publish there (docs/security.md), the replication feed's queue name (docs/durability.md),
the argument that marks a hidden queue (docs/federation.md, "Forwarding"), and
``DefaultExchange``, the nameless exchange every queue but a hidden one or a federation
buffer queue is bound to by its own name.

Must not know: the vhost's rules for declaring, deleting or binding these (``vhost``),
channels, the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pamqp import exceptions

from . import names
from .queue import Queue
from .routing import ALTERNATE_EXCHANGE, DirectExchange

PEER_EXCHANGE = "amq.peer"
CONSOLE_EXCHANGE = "amq.console"
FEDERATION_EXCHANGE = "amq.federation"
# The queue a PASSIVE subscribes to for the replication feed (docs/durability.md): the
# channel routes its Basic.Consume and acks to the feed, never to a queue of this name.
FEED_QUEUE = "amq.replication"
# The client product the pair's peering link names itself by (failover/controller.py): a
# peering login that says so carries the peer's state messages, and its server side is
# marked as control traffic like its client side (amqha/netmark.py; docs/failover.md, "On
# a full link"); the replication link, a peering login too, is bulk.
PEERING_PRODUCT = "amqha peering"
# Direct reply-to (RabbitMQ's extension): a consumer on this pseudo-queue receives, without
# any queue, the messages published to the default exchange with the routing key its
# channel's requests carry in reply_to (the name followed by a token naming the channel).
REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO + "."
# The argument that marks a hidden queue: set by ``declare_hidden_queue`` only (a client
# declare naming it is refused), kept in the queue's declared arguments so the store and a
# PASSIVE restore the queue hidden too.
HIDDEN = "x-amqha-hidden"

STANDARD_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)

# The control plane: the exchange, the type a passive declare sees, and the one tag whose
# holders may publish there (the pair's peers, the pair's administrators). Nothing can bind
# to or from these, dead-letter or fall back to them: see docs/security.md.
CONTROL_EXCHANGES = {
    PEER_EXCHANGE: ("fanout", "peering"),
    CONSOLE_EXCHANGE: ("direct", "administrator"),
    FEDERATION_EXCHANGE: ("direct", "federation"),
}

# Arguments that name another exchange a message may be sent on to.
EXCHANGE_REFERENCES = (ALTERNATE_EXCHANGE,)

# Exchanges no client may delete, declare differently or bind into the default exchange.
UNDELETABLE = (
    frozenset(name for name, _ in STANDARD_EXCHANGES) | frozenset(CONTROL_EXCHANGES) | {""}
)


class DefaultExchange(DirectExchange):
    """The nameless direct exchange: every queue but a hidden one is bound to it by its
    own name."""

    def __init__(self, queues: dict[str, Queue], hidden: set[str]) -> None:
        super().__init__("", durable=True)
        self._queues = queues
        self._hidden = hidden

    def route(self, routing_key: str, headers: Callable[[], dict[str, Any]]) -> tuple:
        queue = self._queues.get(routing_key)
        if queue is None or (self._hidden and routing_key in self._hidden):
            return ()
        if routing_key.startswith(names.BUFFER_PREFIX):
            return ()  # a federation buffer queue takes only what its bindings route
        return (queue,)


def hidden_refusal(name: str) -> exceptions.AMQPAccessRefused:
    """What a client meets that names a hidden queue, by any route."""
    return exceptions.AMQPAccessRefused(
        f"ACCESS_REFUSED - queue '{name}' is the server's own (a hidden federation queue)"
    )
