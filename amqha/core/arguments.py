"""Queue arguments: what a declare's ``x-`` arguments and a consume's ``x-priority`` may
be, and what they mean.

Owns: the parsed arguments of a queue (``QueueLimits``: TTL, expiry, length limits,
overflow, dead-letter target, priorities, single active consumer, delivery limit), a
consumer's priority, which queue type takes which argument (RabbitMQ 3.10's lists), and
what a declare asks of replication (``x-amqha-replicate``, a quorum queue;
docs/durability.md). A wrong value is a ``QueueArgumentError`` (the vhost answers it with
a 406) or, for the type and replication rules, the pamqp exception the vhost raises.

Must not know: queues, their messages or consumers, the vhost, the clock, the store.
"""

from __future__ import annotations

from typing import Any

from pamqp import exceptions

from .routing import ArgumentBytes, arguments_size

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
# A quorum queue's x-dead-letter-strategy values (RabbitMQ 3.10); amqha dead-letters as
# with at-most-once whichever is named.
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
# The highest x-max-priority RabbitMQ accepts.
MAX_PRIORITY = 255


class QueueArgumentError(ValueError):
    """A queue argument with a wrong type or value (a 406 at the protocol level)."""


def _int_argument(arguments: dict[str, Any], key: str, minimum: int) -> int | None:
    if key not in arguments:
        return None
    value = arguments[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise QueueArgumentError(
            f"invalid arg '{key}' for queue: {value!r} (need an integer >= {minimum})"
        )
    return value


def _str_argument(arguments: dict[str, Any], key: str) -> str | None:
    if key not in arguments:
        return None
    value = arguments[key]
    if isinstance(value, bytes):  # a longstr that is not UTF-8 (wire.py keeps it as bytes)
        try:
            value = value.decode()
        except UnicodeDecodeError:
            raise QueueArgumentError(
                f"invalid arg '{key}' for queue: {value!r} (not UTF-8)"
            ) from None
    if not isinstance(value, str):
        raise QueueArgumentError(f"invalid arg '{key}' for queue: {value!r} (need a string)")
    return value


class QueueLimits:
    """The parsed x- arguments of a queue; the queue's arguments count in
    ``ArgumentBytes`` while it lives."""

    __slots__ = (
        "arguments_size",
        "message_ttl",
        "expires",
        "max_length",
        "max_length_bytes",
        "overflow",
        "dead_letter_exchange",
        "dead_letter_routing_key",
        "max_priority",
        "single_active_consumer",
        "delivery_limit",
        "effective",
        "policy",
        "operator_policy",
    )

    def __init__(
        self,
        arguments: dict[str, Any],
        policy: str | None = None,
        operator_policy: str | None = None,
    ) -> None:
        # The arguments these limits are read from: the queue's own, or merged with the
        # policy and the operator policy named (``core.policies``).
        self.effective = arguments
        self.policy = policy
        self.operator_policy = operator_policy
        self.arguments_size = arguments_size(arguments) if arguments else 0
        ArgumentBytes.held += self.arguments_size
        ttl = _int_argument(arguments, "x-message-ttl", 0)
        expires = _int_argument(arguments, "x-expires", 1)
        self.message_ttl = None if ttl is None else ttl / 1000.0
        self.expires = None if expires is None else expires / 1000.0
        self.max_length = _int_argument(arguments, "x-max-length", 0)
        self.max_length_bytes = _int_argument(arguments, "x-max-length-bytes", 0)
        self.overflow = _str_argument(arguments, "x-overflow") or "drop-head"
        if self.overflow not in OVERFLOW_MODES:
            raise QueueArgumentError(
                f"invalid arg 'x-overflow' for queue: '{self.overflow}' "
                f"(one of {', '.join(OVERFLOW_MODES)})"
            )
        self.dead_letter_exchange = _str_argument(arguments, "x-dead-letter-exchange")
        self.dead_letter_routing_key = _str_argument(arguments, "x-dead-letter-routing-key")
        if self.dead_letter_routing_key is not None and self.dead_letter_exchange is None:
            raise QueueArgumentError(
                "invalid arg 'x-dead-letter-routing-key' for queue: it needs x-dead-letter-exchange"
            )
        priority = arguments.get("x-max-priority", 0)
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or not (0 <= priority <= MAX_PRIORITY)
        ):
            raise QueueArgumentError(
                f"invalid arg 'x-max-priority' for queue: {priority!r} "
                f"(need an integer from 0 to {MAX_PRIORITY})"
            )
        self.max_priority = priority
        single = arguments.get("x-single-active-consumer", False)
        if not isinstance(single, bool):
            raise QueueArgumentError(
                f"invalid arg 'x-single-active-consumer' for queue: {single!r} (need true or false)"
            )
        self.single_active_consumer = single
        # A quorum queue's x-delivery-limit (None: none); its ``quorum.DeliveryCounter``
        # applies it.
        self.delivery_limit = _int_argument(arguments, "x-delivery-limit", 0)
        # Quorum arguments that have no effect here, checked as RabbitMQ checks them.
        _int_argument(arguments, "x-max-in-memory-length", 0)
        _int_argument(arguments, "x-max-in-memory-bytes", 0)
        _int_argument(arguments, "x-quorum-initial-group-size", 1)
        strategy = _str_argument(arguments, "x-dead-letter-strategy")
        if strategy is not None and strategy not in DEAD_LETTER_STRATEGIES:
            raise QueueArgumentError(
                f"invalid arg 'x-dead-letter-strategy' for queue: '{strategy}' "
                f"(one of {', '.join(DEAD_LETTER_STRATEGIES)})"
            )
        if arguments.get("x-queue-type") == "quorum" and self.overflow == "reject-publish-dlx":
            # RabbitMQ 3.10 takes it, logs it as invalid for a quorum queue and drops the
            # head instead (rabbit_quorum_queue:overflow/3).
            self.overflow = "drop-head"

    def __del__(self) -> None:
        ArgumentBytes.held -= self.arguments_size


def consumer_priority(arguments: dict[str, Any] | None, queue: str) -> int:
    """A Basic.Consume's ``x-priority`` (0 when absent): any integer, higher first."""
    if not arguments or "x-priority" not in arguments:
        return 0
    value = arguments["x-priority"]
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueueArgumentError(
            f"invalid arg 'x-priority' for a consumer of queue '{queue}': {value!r} "
            "(need an integer)"
        )
    return value


# Queue types RabbitMQ knows that this server does not build yet, and what they are.
_UNBUILT_QUEUE_TYPES = {
    "stream": "stream queues are not available on this server",
}
# Asks that a durable queue be replicated to the PASSIVE, or not (docs/durability.md).
REPLICATE = "x-amqha-replicate"


def replication_asked(
    name: str, arguments: dict[str, Any], durable: bool, exclusive: bool, auto_delete: bool
) -> bool | None:
    """What the arguments ask: True (``x-amqha-replicate: true`` or a quorum queue), False,
    or None (the vhost's default). A replicated queue must be durable and not exclusive."""
    asked = arguments.get(REPLICATE)
    if asked is not None and not isinstance(asked, bool):
        raise exceptions.AMQPPreconditionFailed(
            f"PRECONDITION_FAILED - invalid arg '{REPLICATE}' for queue '{name}': "
            f"{asked!r} (need true or false)"
        )
    if queue_type(arguments) == "quorum":
        if asked is False:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - queue '{name}': a quorum queue is replicated; "
                f"'{REPLICATE}: false' contradicts it"
            )
        asked = True
        # RabbitMQ's checks, in its order (rabbit_queue_type_util).
        for wrong, what in (
            (auto_delete, "auto-delete"),
            (exclusive, "exclusive-owner"),
            (not durable, "non-durable"),
        ):
            if wrong:
                raise exceptions.AMQPPreconditionFailed(
                    f"PRECONDITION_FAILED - invalid property '{what}' for quorum queue '{name}'"
                )
    if asked and (not durable or exclusive):
        raise exceptions.AMQPPreconditionFailed(
            f"PRECONDITION_FAILED - queue '{name}': '{REPLICATE}' needs a durable, "
            "non-exclusive queue"
        )
    return asked


def queue_type(arguments: dict[str, Any]) -> str:
    kind = arguments.get("x-queue-type", "classic")
    if isinstance(kind, bytes):
        kind = kind.decode(errors="replace")
    return str(kind)


# The arguments each queue type takes (RabbitMQ 3.10's lists, rabbit_*_queue.erl): one
# that another type takes and this one does not is a 406 naming the type, as there.
_CLASSIC_ARGUMENTS = frozenset(
    {
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-queue-type",
        "x-queue-master-locator",
    }
)
_QUORUM_ARGUMENTS = frozenset(
    {
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-overflow",
        "x-single-active-consumer",
        "x-queue-type",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-message-ttl",
        "x-queue-leader-locator",
    }
)
_STREAM_ARGUMENTS = frozenset(
    {
        "x-max-length-bytes",
        "x-queue-type",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
    }
)
_TYPE_ARGUMENTS = {
    "classic": ("rabbit_classic_queue", _CLASSIC_ARGUMENTS),
    "quorum": ("rabbit_quorum_queue", _QUORUM_ARGUMENTS),
}
_KNOWN_ARGUMENTS = _CLASSIC_ARGUMENTS | _QUORUM_ARGUMENTS | _STREAM_ARGUMENTS


def check_queue_type(name: str, arguments: dict[str, Any]) -> None:
    kind = queue_type(arguments)
    if kind in _TYPE_ARGUMENTS:
        module, taken = _TYPE_ARGUMENTS[kind]
        for key in arguments:
            if key in _KNOWN_ARGUMENTS and key not in taken:
                raise exceptions.AMQPPreconditionFailed(
                    f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' "
                    f"of queue type {module}"
                )
        return
    if kind in _UNBUILT_QUEUE_TYPES:
        problem = _UNBUILT_QUEUE_TYPES[kind]
    else:
        problem = f"unknown queue type {kind!r} (this server has 'classic' and 'quorum')"
    raise exceptions.AMQPPreconditionFailed(
        f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '{name}': {problem}"
    )
