"""A virtual host: its exchanges, queues and bindings, and the rules for changing them.

Owns: declare/delete/bind/unbind with AMQP's rules and reply codes (raised as pamqp
exceptions: soft ones close a channel, hard ones the connection), routing a message
through exchange-to-exchange bindings to queues, and dead-lettering.

Must not know: channels, sockets, the clock (``now`` is passed in). An exclusive
queue's owner is an opaque object (the connection) compared by identity.
"""

from __future__ import annotations

import datetime
import secrets
import struct
from collections.abc import Callable
from typing import Any

from pamqp import exceptions

from ..wire import address_of
from .message import Message
from .queue import Queue, QueueArgumentError
from .routing import EXCHANGE_CLASSES, ControlExchange, DirectExchange, Exchange

PEER_EXCHANGE = "amq.peer"
CONSOLE_EXCHANGE = "amq.console"

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
}

# Exchanges no client may delete, declare differently or bind into the default exchange.
UNDELETABLE = (
    frozenset(name for name, _ in STANDARD_EXCHANGES) | frozenset(CONTROL_EXCHANGES) | {""}
)

ALTERNATE_EXCHANGE = "alternate-exchange"
# Arguments that name another exchange a message may be sent on to.
_EXCHANGE_REFERENCES = (ALTERNATE_EXCHANGE,)


class DefaultExchange(DirectExchange):
    """The nameless direct exchange: every queue is bound to it by its own name."""

    def __init__(self, queues: dict[str, Queue]) -> None:
        super().__init__("", durable=True)
        self._queues = queues

    def route(self, routing_key: str, headers: Callable[[], dict[str, Any]]) -> tuple:
        queue = self._queues.get(routing_key)
        return (queue,) if queue is not None else ()


def _inequivalent(what: str, name: str, arg: str) -> exceptions.AMQPPreconditionFailed:
    return exceptions.AMQPPreconditionFailed(
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for {what} '{name}' in vhost"
    )


class VHost:
    def __init__(self, name: str, wall_clock: Callable[[], float]) -> None:
        self.name = name
        # Only x-death's "time" field reads it; injected so the model stays clock-free.
        self.wall_clock = wall_clock
        self.queues: dict[str, Queue] = {}
        # At most this many queues (0: no limit); a declare past it is refused with 406.
        self.max_queues = 0
        self.exchanges: dict[str, Exchange] = {"": DefaultExchange(self.queues)}
        for exchange_name, kind in STANDARD_EXCHANGES:
            self.exchanges[exchange_name] = EXCHANGE_CLASSES[kind](exchange_name, durable=True)
        for exchange_name, (kind, tag) in CONTROL_EXCHANGES.items():
            self.exchanges[exchange_name] = ControlExchange(exchange_name, kind, tag)
        # Exchanges that have at least one exchange as a destination: routing through
        # them needs the recursive walk, all others take the one-hop fast path.
        self._has_exchange_destinations: set[str] = set()
        self.on_queue_deleted: Callable[[Queue], None] | None = None
        # Where dead letters are routed to; set by the broker so it can wake consumers.
        self.deliver_routed: Callable[[Message, tuple[Queue, ...]], None] | None = None

    # -- the control plane ---------------------------------------------------------

    def set_control_receiver(self, name: str, receiver: Any) -> None:
        """Where publishes to control exchange ``name`` go: ``receiver(message, user)``."""
        exchange = self.exchanges[name]
        assert isinstance(exchange, ControlExchange)
        exchange.receiver = receiver

    def _refuse_control_reference(self, name: Any, what: str) -> None:
        target = self.exchanges.get(name) if isinstance(name, str) else None
        if target is not None and target.control:
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - {what} '{name}' is refused: it belongs to the server's "
                "control plane"
            )

    # -- exchanges -----------------------------------------------------------------

    def get_exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise exceptions.AMQPNotFound(
                f"NOT_FOUND - no exchange '{name}' in vhost '{self.name}'"
            )
        return exchange

    def declare_exchange(
        self,
        name: str,
        kind: str,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Exchange:
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise exceptions.AMQPNotFound(
                    f"NOT_FOUND - no exchange '{name}' in vhost '{self.name}'"
                )
            return existing
        if name == "" or (name.startswith("amq.") and existing is None):
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.'"
                if name
                else "ACCESS_REFUSED - operation not permitted on the default exchange"
            )
        if kind not in EXCHANGE_CLASSES:
            # A channel error, as in RabbitMQ since 3.12: one bad declare does not close
            # every channel of the connection (docs/compat.md).
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - unknown exchange type '{kind}'"
            )
        for key in _EXCHANGE_REFERENCES:
            self._refuse_control_reference((arguments or {}).get(key), key)
        if existing is not None:
            if existing.kind != kind:
                raise _inequivalent("exchange", name, "type")
            if existing.durable != durable:
                raise _inequivalent("exchange", name, "durable")
            if existing.auto_delete != auto_delete:
                raise _inequivalent("exchange", name, "auto_delete")
            if existing.internal != internal:
                raise _inequivalent("exchange", name, "internal")
            if existing.arguments.get(ALTERNATE_EXCHANGE) != (arguments or {}).get(
                ALTERNATE_EXCHANGE
            ):
                raise _inequivalent("exchange", name, ALTERNATE_EXCHANGE)
            return existing
        exchange = EXCHANGE_CLASSES[kind](name, durable, auto_delete, internal, arguments or {})
        self.exchanges[name] = exchange
        return exchange

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        if name in UNDELETABLE or name.startswith("amq."):
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - exchange '{name}' is reserved and cannot be deleted"
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            return  # deleting what is not there succeeds, as in RabbitMQ
        if if_unused and exchange.bindings:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - exchange '{name}' in use"
            )
        del self.exchanges[name]
        self._has_exchange_destinations.discard(name)
        for other in list(self.exchanges.values()):
            if other.unbind_destination(exchange):
                self._after_unbind(other)

    def _after_unbind(self, exchange: Exchange) -> None:
        if not any(isinstance(b.destination, Exchange) for b in exchange.bindings.values()):
            self._has_exchange_destinations.discard(exchange.name)
        if exchange.auto_delete and not exchange.bindings and exchange.name in self.exchanges:
            self.delete_exchange(exchange.name)

    # -- queues --------------------------------------------------------------------

    def get_queue(self, name: str, owner: object | None = None) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise exceptions.AMQPNotFound(f"NOT_FOUND - no queue '{name}' in vhost '{self.name}'")
        self._check_owner(queue, owner)
        return queue

    @staticmethod
    def _check_owner(queue: Queue, owner: object | None) -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not owner:
            raise exceptions.AMQPResourceLocked(
                f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue "
                f"'{queue.name}' in vhost"
            )

    def declare_queue(
        self,
        name: str,
        owner: object,
        now: float,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Queue:
        if passive:
            queue = self.get_queue(name, owner)
            queue.last_used = now
            return queue
        if not name:
            name = "amq.gen-" + secrets.token_urlsafe(16)
        elif name.startswith("amq."):
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.'"
            )
        arguments = arguments or {}
        self._refuse_control_reference(
            arguments.get("x-dead-letter-exchange"), "dead-letter exchange"
        )
        _check_queue_type(name, arguments)
        existing = self.queues.get(name)
        if existing is not None:
            self._check_owner(existing, owner)
            if existing.durable != durable:
                raise _inequivalent("queue", name, "durable")
            if (existing.exclusive_owner is not None) != exclusive:
                raise _inequivalent("queue", name, "exclusive")
            if existing.auto_delete != auto_delete:
                raise _inequivalent("queue", name, "auto_delete")
            for key in set(existing.arguments) | set(arguments):
                if key == "x-queue-type":
                    continue  # checked above: classic is the only type, named or not
                if key.startswith("x-") and existing.arguments.get(key) != arguments.get(key):
                    raise _inequivalent("queue", name, key)
            existing.last_used = now
            return existing
        if self.max_queues and len(self.queues) >= self.max_queues:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - cannot declare queue '{name}': queue limit in vhost "
                f"'{self.name}' ({self.max_queues}) is reached"
            )
        try:
            queue = Queue(name, durable, owner if exclusive else None, auto_delete, arguments, now)
        except QueueArgumentError as error:
            raise exceptions.AMQPPreconditionFailed(f"PRECONDITION_FAILED - {error}") from error
        queue.on_dead_letter = self._dead_letter
        self.queues[name] = queue
        return queue

    def delete_queue(
        self,
        name: str,
        owner: object | None,
        if_unused: bool = False,
        if_empty: bool = False,
    ) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        self._check_owner(queue, owner)
        if if_unused and queue.consumers:
            raise exceptions.AMQPPreconditionFailed(f"PRECONDITION_FAILED - queue '{name}' in use")
        if if_empty and queue.messages:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - queue '{name}' not empty"
            )
        return self.remove_queue(queue)

    def remove_queue(self, queue: Queue) -> int:
        """Delete a queue unconditionally (exclusive owner gone, auto-delete, x-expires)."""
        if self.queues.get(queue.name) is not queue:
            return 0
        del self.queues[queue.name]
        queue.deleted = True
        count = queue.purge()
        for exchange in list(self.exchanges.values()):
            if exchange.unbind_destination(queue):
                self._after_unbind(exchange)
        if self.on_queue_deleted is not None:
            self.on_queue_deleted(queue)
        return count

    # -- bindings ------------------------------------------------------------------

    def _bindable_source(self, name: str) -> Exchange:
        exchange = self._bindable_or_missing(name)
        if exchange is None:
            raise exceptions.AMQPNotFound(
                f"NOT_FOUND - no exchange '{name}' in vhost '{self.name}'"
            )
        return exchange

    def _bindable_or_missing(self, name: str) -> Exchange | None:
        if name == "":
            raise exceptions.AMQPAccessRefused(
                "ACCESS_REFUSED - operation not permitted on the default exchange"
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            return None
        if exchange.control:
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - exchange '{name}' belongs to the server's control plane: "
                "nothing can be bound to it or from it"
            )
        return exchange

    def bind_queue(
        self,
        queue_name: str,
        exchange_name: str,
        routing_key: str,
        arguments: dict[str, Any],
        owner: object,
    ) -> None:
        queue = self.get_queue(queue_name, owner)
        exchange = self._bindable_source(exchange_name)
        try:
            exchange.bind(queue, routing_key, arguments)
        except ValueError as error:
            raise exceptions.AMQPPreconditionFailed(f"PRECONDITION_FAILED - {error}") from error

    def unbind_queue(
        self,
        queue_name: str,
        exchange_name: str,
        routing_key: str,
        arguments: dict[str, Any],
        owner: object,
    ) -> None:
        """Unbinding is idempotent, as in RabbitMQ: where the queue or the exchange is not
        there (an auto-delete one already gone, say) nothing is bound, and that succeeds."""
        exchange = self._bindable_or_missing(exchange_name)
        queue = self.queues.get(queue_name)
        if queue is not None:
            self._check_owner(queue, owner)
        if exchange is None or queue is None:
            return
        if exchange.unbind(queue, routing_key, arguments):
            self._after_unbind(exchange)

    def bind_exchange(
        self, destination_name: str, source_name: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        destination = self._bindable_source(destination_name)
        source = self._bindable_source(source_name)
        try:
            source.bind(destination, routing_key, arguments)
        except ValueError as error:
            raise exceptions.AMQPPreconditionFailed(f"PRECONDITION_FAILED - {error}") from error
        self._has_exchange_destinations.add(source.name)

    def unbind_exchange(
        self, destination_name: str, source_name: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        destination = self._bindable_or_missing(destination_name)
        source = self._bindable_or_missing(source_name)
        if destination is None or source is None:
            return  # idempotent, as unbind_queue
        if source.unbind(destination, routing_key, arguments):
            self._after_unbind(source)

    # -- routing -------------------------------------------------------------------

    def route(self, exchange: Exchange, routing_key: str, message: Message) -> tuple[Queue, ...]:
        """The queues a message reaches, each once, following exchange-to-exchange bindings
        and, from an exchange that routes it nowhere, that exchange's alternate exchange."""
        found = exchange.route(routing_key, message.headers)
        if exchange.name not in self._has_exchange_destinations and (
            found or ALTERNATE_EXCHANGE not in exchange.arguments
        ):
            return found
        queues: dict[Queue, None] = {}
        seen: set[int] = {id(exchange)}
        pending = list(found) or self._alternate_of(exchange)
        while pending:
            destination = pending.pop()
            if isinstance(destination, Exchange):
                if id(destination) in seen:
                    continue
                seen.add(id(destination))
                reached = destination.route(routing_key, message.headers)
                pending.extend(reached or self._alternate_of(destination))
            else:
                queues[destination] = None
        return tuple(queues)

    def _alternate_of(self, exchange: Exchange) -> list[Exchange]:
        """RabbitMQ's rule: an exchange with no destination for a message hands it to its
        alternate exchange (if that exists), which may hand it on to its own."""
        name = exchange.arguments.get(ALTERNATE_EXCHANGE)
        alternate = self.exchanges.get(name) if isinstance(name, str) else None
        if alternate is None or alternate.control:
            return []
        return [alternate]

    # -- dead letters --------------------------------------------------------------

    def _dead_letter(self, queue: Queue, message: Message, reason: str) -> None:
        limits = queue.limits
        exchange = self.exchanges.get(limits.dead_letter_exchange or "")
        if exchange is None or limits.dead_letter_exchange is None or exchange.control:
            return
        original_key = message.routing_key
        routing_key = limits.dead_letter_routing_key or original_key
        headers = dict(message.headers())
        deaths = [dict(d) for d in headers.get("x-death") or [] if isinstance(d, dict)]
        for death in deaths:
            if death.get("queue") == queue.name and death.get("reason") == reason:
                # x-death may come from a publisher: a count that is not an integer restarts.
                count = death.get("count")
                death["count"] = (count if type(count) is int else 0) + 1
                deaths.remove(death)
                deaths.insert(0, death)
                break
        else:
            death = {
                "count": 1,
                "reason": reason,
                "queue": queue.name,
                "time": datetime.datetime.fromtimestamp(int(self.wall_clock()), datetime.UTC),
                "exchange": message.exchange,
                "routing-keys": [original_key],
            }
            expiration = message.expiration_text()
            if expiration is not None:
                # The TTL is dropped so the dead letter does not expire again on arrival.
                death["original-expiration"] = expiration
            deaths.insert(0, death)
        headers["x-death"] = deaths
        headers.setdefault("x-first-death-reason", reason)
        headers.setdefault("x-first-death-queue", queue.name)
        headers.setdefault("x-first-death-exchange", message.exchange)
        try:
            dead = message.rewritten(
                address_of(exchange.name, routing_key), headers, drop_expiration=True
            )
        except (TypeError, ValueError, OverflowError, struct.error):
            # A header this server cannot write back (a key longer than a shortstr): such
            # a message is dropped, as if it had no dead-letter exchange.
            return
        targets = tuple(
            target
            for target in self.route(exchange, routing_key, dead)
            if not _is_cycle(target.name, deaths)
        )
        if self.deliver_routed is not None and targets:
            self.deliver_routed(dead, targets)


# Queue types RabbitMQ knows that this server does not build yet, and what they are.
_UNBUILT_QUEUE_TYPES = {
    "quorum": "quorum queues (replicated durable queues) are not available on this server yet",
    "stream": "stream queues are not available on this server",
}


def _check_queue_type(name: str, arguments: dict[str, Any]) -> None:
    kind = arguments.get("x-queue-type", "classic")
    if isinstance(kind, bytes):
        kind = kind.decode(errors="replace")
    if kind == "classic":
        return
    if kind in _UNBUILT_QUEUE_TYPES:
        problem = _UNBUILT_QUEUE_TYPES[kind]
    else:
        problem = f"unknown queue type {kind!r} (this server has 'classic')"
    raise exceptions.AMQPPreconditionFailed(
        f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '{name}': {problem}"
    )


def _is_cycle(queue_name: str, deaths: list[dict[str, Any]]) -> bool:
    """RabbitMQ's rule: a dead letter that would reach a queue it already died in is
    dropped, unless a consumer rejected it somewhere in between (a deliberate retry
    loop). Without it, TTL 0 or x-max-length 0 on such a loop recurses without end."""
    for death in deaths:
        if death.get("reason") == "rejected":
            return False
        if death.get("queue") == queue_name:
            return True
    return False
