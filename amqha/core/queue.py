"""Queues: holding messages in order and handing them to consumers.

Owns: the message list of one queue, its arguments (TTL, expiry, length limits,
overflow, dead-letter target), its consumers and the round-robin choice among the
ready ones, redelivery marks, when the queue next needs a timer (``next_due``), and
the counts the console shows.

Consumers cost O(1) each to add, remove and skip: a consumer found not ready is set
aside until its channel says it may be ready again (``wake``), so a delivery never
walks the consumers that cannot take it.

Must not know: channels or sockets (a consumer is anything with ``ready()`` and
``deliver()``), the clock (``now`` is passed in, in seconds), where dead letters go
(the vhost gives an ``on_dead_letter`` callback).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .message import Message

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")


class Consumer(Protocol):
    tag: str
    exclusive: bool

    def ready(self) -> bool: ...

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None: ...


class Redelivery:
    """A message put back on a queue after a delivery: it goes out again marked redelivered."""

    __slots__ = ("message",)

    def __init__(self, message: Message) -> None:
        self.message = message


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
    if isinstance(value, bytes):
        value = value.decode()
    if not isinstance(value, str):
        raise QueueArgumentError(f"invalid arg '{key}' for queue: {value!r} (need a string)")
    return value


class QueueLimits:
    """The parsed x- arguments of a queue."""

    __slots__ = (
        "message_ttl",
        "expires",
        "max_length",
        "max_length_bytes",
        "overflow",
        "dead_letter_exchange",
        "dead_letter_routing_key",
    )

    def __init__(self, arguments: dict[str, Any]) -> None:
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


DeadLetterFn = Callable[["Queue", Message, str], None]


class Queue:
    def __init__(
        self,
        name: str,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        now: float = 0.0,
    ) -> None:
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.limits = QueueLimits(self.arguments)
        self.messages: deque[Message | Redelivery] = deque()
        # Expiry times run parallel to ``messages``; kept only once some message can expire.
        self.expiries: deque[float] | None = None
        self.bytes = 0
        # Every consumer, in subscription order; ``_ready`` holds those that may take a
        # message, in round-robin order, ``_waiting`` those found not ready.
        self.consumers: dict[Consumer, None] = {}
        self._ready: OrderedDict[Consumer, None] = OrderedDict()
        self._waiting: set[Consumer] = set()
        self._exclusive_consumers = 0
        self.unacked = 0
        # Running totals for the metrics endpoint (counted by the broker and channels).
        self.published = 0
        self.delivered = 0
        self.acked = 0
        self.had_consumers = False
        self.deleted = False
        self.last_used = now
        self.on_dead_letter: DeadLetterFn | None = None
        # When the broker's timer for this queue is set to fire (None: no timer set), and
        # who to tell when ``next_due`` may have moved earlier.
        self.timer_due: float | None = None
        self.on_due_changed: Callable[[Queue], None] | None = None

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} messages={len(self.messages)}>"

    # -- counts ------------------------------------------------------------------

    @property
    def message_count(self) -> int:
        return len(self.messages)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    # -- enqueue -----------------------------------------------------------------

    def would_reject(self, message: Message) -> bool:
        """True when reject-publish overflow refuses this message."""
        limits = self.limits
        if limits.overflow == "drop-head":
            return False
        if limits.max_length is not None and len(self.messages) >= limits.max_length:
            return True
        return (
            limits.max_length_bytes is not None
            and self.bytes + len(message.body) > limits.max_length_bytes
        )

    def enqueue(self, message: Message, now: float, expiration: float | None = None) -> None:
        """Append a message (the caller checked ``would_reject``), then apply drop-head.

        ``expiration`` is the message's own TTL in seconds, if it has one.
        """
        ttl = self.limits.message_ttl
        if expiration is not None and (ttl is None or expiration < ttl):
            ttl = expiration
        if ttl is not None and self.expiries is None:
            self.expiries = deque(math.inf for _ in self.messages)
        self.messages.append(message)
        if self.expiries is not None:
            self.expiries.append(now + ttl if ttl is not None else math.inf)
            if len(self.messages) == 1 and self.on_due_changed is not None:
                self.on_due_changed(self)
        self.bytes += len(message.body)
        limits = self.limits
        if limits.max_length is not None or limits.max_length_bytes is not None:
            self._drop_over_limit()

    def _drop_over_limit(self) -> None:
        limits = self.limits
        while self.messages and (
            (limits.max_length is not None and len(self.messages) > limits.max_length)
            or (limits.max_length_bytes is not None and self.bytes > limits.max_length_bytes)
        ):
            self._dead_letter(self._pop_head()[0], "maxlen")

    def requeue(self, messages: Iterable[Message], now: float) -> None:
        """Put delivered-but-unsettled messages back at the head, in their original order."""
        for message in reversed(list(messages)):
            self.messages.appendleft(Redelivery(message))
            if self.expiries is not None:
                self.expiries.appendleft(math.inf)
            self.bytes += len(message.body)

    # -- dequeue -----------------------------------------------------------------

    def _pop_head(self) -> tuple[Message, bool]:
        item = self.messages.popleft()
        if self.expiries is not None:
            self.expiries.popleft()
            # A new head: with per-message TTLs it may expire before the old one did.
            if self.on_due_changed is not None and self.expiries:
                self.on_due_changed(self)
        if type(item) is Redelivery:
            message, redelivered = item.message, True
        else:
            message, redelivered = item, False  # type: ignore[assignment]
        self.bytes -= len(message.body)
        return message, redelivered

    def expire(self, now: float) -> int:
        """Dead-letter (or drop) expired messages at the head; returns how many."""
        expiries = self.expiries
        count = 0
        # Strictly past the deadline: a TTL 0 message still goes to a consumer ready at the
        # instant it arrives, and expires only if there is none (as in RabbitMQ).
        while expiries and expiries[0] < now:
            self._dead_letter(self._pop_head()[0], "expired")
            count += 1
        return count

    def next_expiry(self) -> float | None:
        if self.expiries:
            head = self.expiries[0]
            return None if head == math.inf else head
        return None

    def get(self, now: float) -> tuple[Message, bool] | None:
        """Basic.Get: the head message, expired ones skipped."""
        self.last_used = now
        if self.expiries is not None:
            self.expire(now)
        if not self.messages:
            return None
        return self._pop_head()

    def drain(self, now: float) -> None:
        """Hand messages to ready consumers, round-robin, until either runs out."""
        messages = self.messages
        if not messages or not self.consumers:
            return
        if self.expiries is not None:
            self.expire(now)
        ready = self._ready
        while messages:
            while True:
                if not ready:
                    return
                consumer = next(iter(ready))
                if consumer.ready():
                    break
                del ready[consumer]
                self._waiting.add(consumer)
            if len(ready) > 1:
                ready.move_to_end(consumer)
            message, redelivered = self._pop_head()
            consumer.deliver(self, message, redelivered)
            if self.expiries is not None:
                self.expire(now)

    def purge(self) -> int:
        count = len(self.messages)
        self.messages.clear()
        if self.expiries is not None:
            self.expiries.clear()
        self.bytes = 0
        return count

    # -- consumers ---------------------------------------------------------------

    def has_exclusive_consumer(self) -> bool:
        return self._exclusive_consumers > 0

    def add_consumer(self, consumer: Consumer, now: float) -> None:
        self.consumers[consumer] = None
        self._ready[consumer] = None
        if consumer.exclusive:
            self._exclusive_consumers += 1
        self.had_consumers = True
        self.last_used = now

    def wake(self, consumer: Consumer) -> None:
        """The consumer may be ready again (an ack, Channel.Flow, a drained socket)."""
        waiting = self._waiting
        if waiting and consumer in waiting:
            waiting.discard(consumer)
            self._ready[consumer] = None

    def remove_consumer(self, consumer: Consumer, now: float) -> bool:
        """Remove a consumer; True when that makes an auto-delete queue due for deletion."""
        if self.consumers.pop(consumer, False) is False:
            return False
        self._ready.pop(consumer, None)
        self._waiting.discard(consumer)
        if consumer.exclusive:
            self._exclusive_consumers -= 1
        self.last_used = now
        if not self.consumers and self.limits.expires is not None and self.on_due_changed:
            self.on_due_changed(self)
        return self.auto_delete and not self.consumers

    def clear_consumers(self) -> list[Consumer]:
        """Drop every consumer (the queue is deleted); returns them."""
        consumers = list(self.consumers)
        self.consumers.clear()
        self._ready.clear()
        self._waiting.clear()
        self._exclusive_consumers = 0
        return consumers

    def next_due(self) -> float | None:
        """When a timer must next look at this queue: its head's expiry, or its
        x-expires deadline while it has no consumers. None: nothing is due."""
        due = self.next_expiry()
        expires = self.limits.expires
        if expires is not None and not self.consumers:
            idle_at = self.last_used + expires
            if due is None or idle_at < due:
                due = idle_at
        return due

    def is_idle_expired(self, now: float) -> bool:
        """x-expires: unused (no consumers, no get, no redeclare) for the whole period."""
        expires = self.limits.expires
        return expires is not None and not self.consumers and now - self.last_used >= expires

    def _dead_letter(self, message: Message, reason: str) -> None:
        if self.limits.dead_letter_exchange is not None and self.on_dead_letter is not None:
            self.on_dead_letter(self, message, reason)

    def reject(self, message: Message, reason: str = "rejected") -> None:
        """Dead-letter, if configured, a message refused without requeue: by a consumer
        ("rejected") or by reject-publish-dlx overflow ("maxlen", as RabbitMQ marks it)."""
        self._dead_letter(message, reason)
