"""Queues: holding messages in order and handing them to consumers.

Owns: the messages of one queue until they are settled, its arguments (TTL, expiry,
length limits, overflow, dead-letter target, priorities, single active consumer), its
consumers and the choice among the ready ones (round-robin, highest ``x-priority``
first), redelivery marks, when the queue next needs a timer (``next_due``), and the
counts the console shows.

A queue owns a message from enqueue to settlement (RabbitMQ's backing queue is the
model): ``fetch`` hands it out and keeps it as outstanding under its ``msg_id``;
``ack``, ``reject`` and ``requeue`` take ids. A requeued message goes back to its own
position: the ready side is the deque of never-delivered messages (in id order) plus a
min-heap of returned ones, and the head is whichever has the lower id. A queue on a
``ChangeLog`` (a durable one) emits every change of its contents as a value (see
``changes``); the others emit nothing and cost what they always did.

Consumers cost O(1) each to add, remove and skip: a consumer found not ready is set
aside until its channel says it may be ready again (``wake``), so a delivery never
walks the consumers that cannot take it.

RabbitMQ's extensions (docs/compat.md) each take a structure of their own, chosen when
they appear, so a queue without them runs the code it always ran:

- ``x-max-priority``: a ``PriorityQueue`` (chosen at declare, ``new_queue``) keeps one
  lane per message priority, each ordered as a plain queue's ready side;
- consumer priorities (``x-priority``): the ready consumers move to ``RankedConsumers``
  when the first consumer with a priority other than 0 arrives;
- ``x-single-active-consumer``: only the active consumer is ever among the ready ones;
  the next one is chosen when it leaves.

Must not know: channels or sockets (a consumer is anything with ``no_ack``, ``ready()``
and ``deliver()``), the clock (``now`` is passed in, wall-clock seconds), where dead
letters go (the vhost gives an ``on_dead_letter`` callback), the store.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from .changes import ChangeLog, Delivered, Enqueued, Redelivered, Settled
from .message import Message
from .routing import ArgumentBytes, arguments_size

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
# A quorum queue's x-dead-letter-strategy values (RabbitMQ 3.10); amqha dead-letters as
# with at-most-once whichever is named.
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
# The highest x-max-priority RabbitMQ accepts.
MAX_PRIORITY = 255


class Consumer(Protocol):
    tag: str
    exclusive: bool
    no_ack: bool

    def ready(self) -> bool: ...

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None: ...


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
    )

    def __init__(self, arguments: dict[str, Any]) -> None:
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
        # A quorum queue's x-delivery-limit (None: none); QuorumQueue applies it.
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


DeadLetterFn = Callable[["Queue", Message, str], None]


class Queue:
    # x-single-active-consumer: the consumer that may receive. A class default, set on an
    # instance only when it has one: see the attribute count in ``__init__``.
    active_consumer: Consumer | None = None

    def __init__(
        self,
        name: str,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        now: float = 0.0,
        log: ChangeLog | None = None,
        vhost: str = "/",
    ) -> None:
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.limits = QueueLimits(self.arguments)
        # Where this queue's changes go (None: a transient queue, nothing is emitted).
        self.log = log
        # Whether the PASSIVE gets this queue's changes (set by the vhost: docs/durability.md).
        self.replicated = False
        self.vhost = vhost
        # Never-delivered messages in id order, and (a heap) the returned ones by id.
        self.ready: deque[Message] = deque()
        self.returned: list[tuple[int, float, Message]] = []
        # Deadlines (wall clock) parallel to ``ready``; kept once some message can expire.
        self.expiries: deque[float] | None = None
        # Delivered and not yet settled, by id; their deadlines while the queue has any.
        self.outstanding: dict[int, Message] = {}
        self.outstanding_deadlines: dict[int, float] = {}
        # The highest id ever delivered: a ready message at or below it (recovered from a
        # store or followed from a peer) has been delivered before.
        self.delivered_mark = 0
        self.bytes = 0
        # Every consumer, in subscription order, with its x-priority; ``_ready`` holds
        # those that may take a message, in round-robin order (``RankedConsumers`` once
        # one has a priority other than 0), ``_waiting`` those found not ready.
        self.consumers: dict[Consumer, int] = {}
        self._ready: OrderedDict[Consumer, None] | RankedConsumers = OrderedDict()
        self._waiting: set[Consumer] = set()
        self._exclusive_consumers = 0
        # Running totals for the metrics endpoint.
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
        # That is 29 attributes, the most CPython 3.11 keeps in the keys its instances
        # share: with one more, each queue reads its attributes from a dictionary of its
        # own, and delivering and acking a message costs 3.6% more instructions (two more
        # measured: bench.hotpath's consume phase under callgrind). What a queue needs
        # only for an extension lives in a subclass, a class default or ``limits``.

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} messages={self.message_count}>"

    @property
    def single_active(self) -> bool:
        return self.limits.single_active_consumer

    # -- counts ------------------------------------------------------------------

    @property
    def message_count(self) -> int:
        return len(self.ready) + len(self.returned)

    @property
    def unacked(self) -> int:
        return len(self.outstanding)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    # -- enqueue -----------------------------------------------------------------

    def would_reject(self, message: Message) -> bool:
        """True when reject-publish overflow refuses this message."""
        limits = self.limits
        if limits.overflow == "drop-head":
            return False
        if limits.max_length is not None and self.message_count >= limits.max_length:
            return True
        return (
            limits.max_length_bytes is not None
            and self.bytes + len(message.body) > limits.max_length_bytes
        )

    def enqueue(self, message: Message, now: float, expiration: float | None = None) -> None:
        """Append a message (the caller checked ``would_reject`` and gave it its
        ``msg_id``), then apply drop-head. ``expiration`` is the message's own TTL in
        seconds, if it has one."""
        ttl = self.limits.message_ttl
        if expiration is not None and (ttl is None or expiration < ttl):
            ttl = expiration
        if ttl is not None and self.expiries is None:
            self.expiries = deque(math.inf for _ in self.ready)
        self.ready.append(message)
        deadline = math.inf
        if self.expiries is not None:
            deadline = now + ttl if ttl is not None else math.inf
            self.expiries.append(deadline)
            if self.message_count == 1 and self.on_due_changed is not None:
                self.on_due_changed(self)
        self.bytes += len(message.body)
        log = self.log
        if log is not None:
            self._log_enqueued(log, message, deadline)
        limits = self.limits
        if limits.max_length is not None or limits.max_length_bytes is not None:
            self._drop_over_limit()

    def _log_enqueued(self, log: ChangeLog, message: Message, deadline: float) -> None:
        persistent = message.is_persistent()
        log.emit(
            Enqueued(
                self.vhost,
                self.name,
                message.msg_id,
                message.address,
                message.header,
                message.body,
                None if deadline == math.inf else deadline,
                persistent,
            ),
            persistent,
        )

    def restore(self, message: Message, deadline: float | None) -> None:
        """Put back a message known from the change stream (a store, a peer), in id order;
        nothing is emitted and no limit applies: it was checked when first enqueued."""
        if deadline is not None and self.expiries is None:
            self.expiries = deque(math.inf for _ in self.ready)
        self.ready.append(message)
        if self.expiries is not None:
            self.expiries.append(math.inf if deadline is None else deadline)
        self.bytes += len(message.body)

    def _drop_over_limit(self) -> None:
        limits = self.limits
        dropped = []
        while self.message_count and (
            (limits.max_length is not None and self.message_count > limits.max_length)
            or (limits.max_length_bytes is not None and self.bytes > limits.max_length_bytes)
        ):
            message = self._pop_head()[0]
            self._dead_letter(message, "maxlen")
            dropped.append(message.msg_id)
        if dropped and self.log is not None:
            self.log.emit(Settled(self.vhost, self.name, tuple(dropped), "maxlen"))

    # -- the head ------------------------------------------------------------------

    def _pop_head(self) -> tuple[Message, float, bool]:
        """The next message to hand out, its deadline and whether it was delivered before."""
        returned = self.returned
        ready = self.ready
        if returned and (not ready or returned[0][0] < ready[0].msg_id):
            _, deadline, message = heapq.heappop(returned)
            redelivered = True
        else:
            message = ready.popleft()
            redelivered = message.msg_id <= self.delivered_mark
            expiries = self.expiries
            if expiries is None:
                deadline = math.inf
            else:
                deadline = expiries.popleft()
                # A new head: with per-message TTLs it may expire before the old one did.
                if self.on_due_changed is not None and (expiries or returned):
                    self.on_due_changed(self)
        self.bytes -= len(message.body)
        return message, deadline, redelivered

    def _head_deadline(self) -> float:
        returned = self.returned
        ready = self.ready
        if returned and (not ready or returned[0][0] < ready[0].msg_id):
            return returned[0][1]
        if ready and self.expiries is not None:
            return self.expiries[0]
        return math.inf

    def expire(self, now: float) -> int:
        """Dead-letter (or drop) expired messages at the head; returns how many."""
        if self.expiries is None and not self.returned:
            return 0
        return self._expire_head(now)

    def _expire_head(self, now: float) -> int:
        expired = []
        # Strictly past the deadline: a TTL 0 message still goes to a consumer ready at the
        # instant it arrives, and expires only if there is none (as in RabbitMQ).
        while self.message_count and self._head_deadline() < now:
            message = self._pop_head()[0]
            self._dead_letter(message, "expired")
            expired.append(message.msg_id)
        if expired and self.log is not None:
            self.log.emit(Settled(self.vhost, self.name, tuple(expired), "expired"))
        return len(expired)

    def next_expiry(self) -> float | None:
        if self.message_count:
            head = self._head_deadline()
            return None if head == math.inf else head
        return None

    # -- handing out ---------------------------------------------------------------

    def _fetch(self, no_ack: bool) -> tuple[Message, bool]:
        """Take the head: settled at once (no_ack) or kept as outstanding under its id."""
        message, deadline, redelivered = self._pop_head()
        msg_id = message.msg_id
        if msg_id > self.delivered_mark:
            self.delivered_mark = msg_id
        self.delivered += 1
        log = self.log
        if no_ack:
            if log is not None:
                log.emit(Settled(self.vhost, self.name, (msg_id,), "consumed"))
        else:
            self.outstanding[msg_id] = message
            if deadline != math.inf:
                self.outstanding_deadlines[msg_id] = deadline
            if log is not None:
                log.emit(Delivered(self.vhost, self.name, msg_id))
        return message, redelivered

    def get(self, now: float, no_ack: bool = True) -> tuple[Message, bool] | None:
        """Basic.Get: the head message, expired ones skipped."""
        self.last_used = now
        self.expire(now)
        if not self.message_count:
            return None
        return self._fetch(no_ack)

    def drain(self, now: float) -> None:
        """Hand messages to ready consumers, round-robin, until either runs out."""
        if not self.consumers or not (self.ready or self.returned):
            return
        expiring = self.expiries is not None or self.returned
        if expiring:
            self.expire(now)
        if not expiring and self.log is None:
            # The usual transient case, inlined: nothing requeued, nothing can expire,
            # nothing to emit; ids come in order, so a message above the mark is new.
            messages = self.ready
            outstanding = self.outstanding
            while messages and not self.returned and self.expiries is None:
                consumer = self._next_consumer()
                if consumer is None:
                    return
                message = messages.popleft()
                self.bytes -= len(message.body)
                msg_id = message.msg_id
                redelivered = msg_id <= self.delivered_mark
                if not redelivered:
                    self.delivered_mark = msg_id
                self.delivered += 1
                if not consumer.no_ack:
                    outstanding[msg_id] = message
                consumer.deliver(self, message, redelivered)
            expiring = self.expiries is not None or self.returned
        while self.ready or self.returned:
            consumer = self._next_consumer()
            if consumer is None:
                return
            message, redelivered = self._fetch(consumer.no_ack)
            consumer.deliver(self, message, redelivered)
            if expiring:
                self.expire(now)

    def _next_consumer(self) -> Consumer | None:
        """The next ready consumer, round-robin; those found not ready are set aside
        until their channel wakes them (``wake``). None: nobody can take a message."""
        ready = self._ready
        while ready:
            consumer = next(iter(ready))
            if consumer.ready():
                if len(ready) > 1:
                    ready.move_to_end(consumer)
                return consumer
            del ready[consumer]
            self._waiting.add(consumer)
        return None

    def mark_delivered(self, msg_id: int) -> None:
        """A delivery known from the change stream (a store's mark, a peer's Delivered)."""
        if msg_id > self.delivered_mark:
            self.delivered_mark = msg_id

    # -- settling by id -------------------------------------------------------------

    def ack(self, msg_ids: list[int]) -> None:
        """Settle outstanding messages for good (acked by their consumer)."""
        pop = self.outstanding.pop
        deadlines = self.outstanding_deadlines
        for msg_id in msg_ids:
            pop(msg_id, None)
        if deadlines:
            for msg_id in msg_ids:
                deadlines.pop(msg_id, None)
        self.acked += len(msg_ids)
        if self.log is not None:
            self.log.emit(Settled(self.vhost, self.name, tuple(msg_ids), "ack"))

    def ack_one(self, msg_id: int) -> None:
        """``ack`` of one id, the usual case (an ack per message)."""
        self.outstanding.pop(msg_id, None)
        if self.outstanding_deadlines:
            self.outstanding_deadlines.pop(msg_id, None)
        self.acked += 1
        if self.log is not None:
            self.log.emit(Settled(self.vhost, self.name, (msg_id,), "ack"))

    def requeue(self, msg_ids: Iterable[int]) -> None:
        """Put outstanding messages back at their own positions, marked redelivered."""
        outstanding = self.outstanding
        deadlines = self.outstanding_deadlines
        returned = self.returned
        head_before = self._head_deadline() if self.on_due_changed is not None else None
        for msg_id in msg_ids:
            message = outstanding.pop(msg_id, None)
            if message is None:
                continue
            deadline = deadlines.pop(msg_id, math.inf) if deadlines else math.inf
            heapq.heappush(returned, (msg_id, deadline, message))
            self.bytes += len(message.body)
        if head_before is not None and self._head_deadline() < head_before:
            self.on_due_changed(self)  # type: ignore[misc]

    def reject(self, msg_ids: Iterable[int], reason: str = "rejected") -> None:
        """Settle outstanding messages refused without requeue: dead-lettered if the queue
        says where to."""
        outstanding = self.outstanding
        deadlines = self.outstanding_deadlines
        settled = []
        for msg_id in msg_ids:
            message = outstanding.pop(msg_id, None)
            if message is None:
                continue
            if deadlines:
                deadlines.pop(msg_id, None)
            self._dead_letter(message, reason)
            settled.append(msg_id)
        if settled and self.log is not None:
            self.log.emit(Settled(self.vhost, self.name, tuple(settled), reason))

    def refuse(self, message: Message) -> None:
        """A publish refused by reject-publish-dlx overflow: dead-lettered, never queued."""
        self._dead_letter(message, "maxlen")

    def discard(self, msg_ids: Iterable[int]) -> None:
        """Remove messages wherever they are, settled elsewhere (a peer's or a store's
        ``Settled``); nothing is emitted or dead-lettered."""
        wanted = set(msg_ids)
        for msg_id in wanted:
            if self.outstanding.pop(msg_id, None) is not None:
                self.outstanding_deadlines.pop(msg_id, None)
        ready = self.ready
        while ready and wanted and ready[0].msg_id in wanted:
            wanted.discard(ready[0].msg_id)
            self.bytes -= len(ready.popleft().body)
            if self.expiries is not None:
                self.expiries.popleft()
        if not wanted:
            return
        keep = [
            (message, deadline)
            for message, deadline in zip(
                ready,
                self.expiries if self.expiries is not None else [math.inf] * len(ready),
                strict=True,
            )
            if message.msg_id not in wanted
        ]
        if len(keep) != len(ready):
            ready.clear()
            ready.extend(message for message, _ in keep)
            if self.expiries is not None:
                self.expiries = deque(deadline for _, deadline in keep)
        self.returned = [entry for entry in self.returned if entry[0] not in wanted]
        heapq.heapify(self.returned)
        self.bytes = sum(len(m.body) for m in ready) + sum(
            len(entry[2].body) for entry in self.returned
        )

    def purge(self) -> int:
        """Drop every ready message (outstanding ones stay with their consumers)."""
        count = self.message_count
        if self.log is not None and count:
            ids = tuple(m.msg_id for m in self.ready) + tuple(e[0] for e in self.returned)
            self.log.emit(Settled(self.vhost, self.name, ids, "purged"))
        self.ready.clear()
        self.returned.clear()
        if self.expiries is not None:
            self.expiries.clear()
        self.bytes = 0
        return count

    def close(self) -> int:
        """The queue is deleted: drop everything it holds; returns the ready count."""
        count = self.message_count
        self.deleted = True
        self.ready.clear()
        self.returned.clear()
        if self.expiries is not None:
            self.expiries.clear()
        self.outstanding.clear()
        self.outstanding_deadlines.clear()
        self.bytes = 0
        return count

    def messages(self) -> list[tuple[Message, float | None]]:
        """Every message not yet settled, in id order, with its deadline (tests, snapshots)."""
        expiries = self.expiries
        found = [
            (m, None if expiries is None or expiries[i] == math.inf else expiries[i])
            for i, m in enumerate(self.ready)
        ]
        found += [(m, None if d == math.inf else d) for _, d, m in self.returned]
        found += [(m, self.outstanding_deadlines.get(i)) for i, m in self.outstanding.items()]
        found.sort(key=lambda pair: pair[0].msg_id)
        return found

    # -- consumers ---------------------------------------------------------------

    def has_exclusive_consumer(self) -> bool:
        return self._exclusive_consumers > 0

    def add_consumer(self, consumer: Consumer, now: float, priority: int = 0) -> None:
        """Subscribe ``consumer`` with its x-priority (higher first; 0 by default)."""
        self.consumers[consumer] = priority
        if self.single_active:
            # The first consumer is the active one; the others wait for it to leave.
            if self.active_consumer is None:
                self.active_consumer = consumer
                self._ready[consumer] = None
        else:
            if priority and not isinstance(self._ready, RankedConsumers):
                # For good: a drain holds on to ``_ready`` while it delivers.
                self._ready = RankedConsumers(self.consumers, self._ready)
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
        """Remove a consumer; True when that makes an auto-delete queue due for deletion.
        On a single-active-consumer queue, the next consumer (highest priority, then the
        earliest subscribed) becomes active when the active one leaves; the caller drains
        the queue once what the old one held is back (RabbitMQ's order)."""
        if consumer not in self.consumers:
            return False
        self._ready.pop(consumer, None)
        del self.consumers[consumer]
        self._waiting.discard(consumer)
        if consumer is self.active_consumer:
            self.active_consumer = None
            if self.consumers:
                best = max(self.consumers.values())
                self.active_consumer = next(c for c, p in self.consumers.items() if p == best)
                self._ready[self.active_consumer] = None
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
        if self.active_consumer is not None:
            self.active_consumer = None
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


class QuorumQueue(Queue):
    """A queue declared ``x-queue-type: quorum``: a plain queue that counts each message's
    deliveries, writes RabbitMQ's ``x-delivery-count`` header on a delivery after the
    first, and applies ``x-delivery-limit`` (docs/compat.md, "Quorum queues").

    The count is replicated state of the message, as in RabbitMQ (docs/durability.md,
    section 1). A FIFO queue hands messages out head first, so every message still held
    whose id is at or below ``delivered_mark`` went out at least once: that first
    delivery costs nothing beyond the ``Delivered`` every queue emits. A message handed
    out again emits ``Redelivered`` with its new count, kept in ``deliveries`` (only
    counts of 2 and more are kept). A message returned to the queue (nack or reject with
    requeue, recover, cancel, a closed channel, or a failover: its consumer's connection
    went with the old ACTIVE) has been delivered as many times as it was returned, so
    ``x-delivery-count`` on its next delivery is its count so far. RabbitMQ 3.10's values:
    no header on a consumer's first delivery, ``x-delivery-count: 0`` on a first
    Basic.Get, then 1, 2... A message returned more times than the limit is dead-lettered
    with reason ``delivery_limit`` (dropped without a dead-letter exchange) instead of
    going back: with ``x-delivery-limit: 1`` it is delivered twice.
    """

    def __init__(
        self,
        name: str,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        now: float = 0.0,
        log: ChangeLog | None = None,
        vhost: str = "/",
    ) -> None:
        super().__init__(name, durable, exclusive_owner, auto_delete, arguments, now, log, vhost)
        # msg_id -> how many times it was handed out, for those handed out twice or more.
        self.deliveries: dict[int, int] = {}

    def delivery_count(self, msg_id: int) -> int:
        """How many times message ``msg_id`` was handed out (see the class docstring)."""
        count = self.deliveries.get(msg_id)
        if count is not None:
            return count
        return 1 if msg_id <= self.delivered_mark else 0

    def _exhausted(self, msg_id: int) -> bool:
        limit = self.limits.delivery_limit
        return limit is not None and self.delivery_count(msg_id) > limit

    def _head_id(self) -> int:
        returned = self.returned
        ready = self.ready
        if returned and (not ready or returned[0][0] < ready[0].msg_id):
            return returned[0][0]
        return ready[0].msg_id

    def _drop_exhausted_heads(self) -> None:
        """Dead-letter the messages at the head returned more times than the limit
        without the ACTIVE seeing the return (a failover, a restart)."""
        if self.limits.delivery_limit is None:
            return
        dropped = []
        while self.message_count and self._exhausted(self._head_id()):
            message = self._pop_head()[0]
            self._dead_letter(message, "delivery_limit")
            dropped.append(message.msg_id)
        if dropped and self.log is not None:
            self.log.emit(Settled(self.vhost, self.name, tuple(dropped), "delivery_limit"))

    def _fetch(self, no_ack: bool) -> tuple[Message, bool]:
        message, redelivered, count = self._take(no_ack)
        if count:
            message = with_delivery_count(message, count)
        return message, redelivered

    def _take(self, no_ack: bool) -> tuple[Message, bool, int]:
        """``Queue._fetch`` and the count of deliveries before this one."""
        deliveries = self.deliveries
        mark = self.delivered_mark
        recorded = deliveries.get(self._head_id()) if deliveries else None
        message, redelivered = Queue._fetch(self, no_ack)
        msg_id = message.msg_id
        before = recorded or (1 if msg_id <= mark else 0)
        if before and not no_ack:
            # (A no-ack delivery settles the message: there is no count left to keep.)
            count = before + 1
            deliveries[msg_id] = count
            if self.log is not None:
                self.log.emit(Redelivered(self.vhost, self.name, msg_id, count))
        return message, redelivered, before

    def _may_be_exhausted(self) -> bool:
        """Whether the head may be over the limit: only a message delivered before can."""
        return (
            self.limits.delivery_limit is not None
            and bool(self.ready or self.returned)
            and self._head_id() <= self.delivered_mark
        )

    def get(self, now: float, no_ack: bool = True) -> tuple[Message, bool] | None:
        self.last_used = now
        self.expire(now)
        self._drop_exhausted_heads()
        if not self.message_count:
            return None
        message, redelivered, count = self._take(no_ack)
        return with_delivery_count(message, count), redelivered

    def drain(self, now: float) -> None:
        """As ``Queue.drain``, one message at a time through ``_fetch``."""
        if not self.consumers or not self.message_count:
            return
        self.expire(now)
        self._drop_exhausted_heads()
        while self.ready or self.returned:
            consumer = self._next_consumer()
            if consumer is None:
                return
            message, redelivered, count = self._take(consumer.no_ack)
            if count:
                message = with_delivery_count(message, count)
            consumer.deliver(self, message, redelivered)
            if self.expiries is not None or self.returned:
                self.expire(now)
            if self._may_be_exhausted():
                self._drop_exhausted_heads()

    def requeue(self, msg_ids: Iterable[int]) -> None:
        """Back to their positions, but those returned more times than the limit, which
        are dead-lettered (reason ``delivery_limit``)."""
        back: list[int] = []
        over: list[int] = []
        for msg_id in msg_ids:
            (over if self._exhausted(msg_id) else back).append(msg_id)
        if over:
            self.reject(over, "delivery_limit")
        if back:
            Queue.requeue(self, back)

    def count_delivery(self, msg_id: int, count: int) -> None:
        """A ``Redelivered`` from the change stream (a store, a peer)."""
        self.mark_delivered(msg_id)
        if count > self.deliveries.get(msg_id, 1):
            self.deliveries[msg_id] = count

    def ack(self, msg_ids: list[int]) -> None:
        Queue.ack(self, msg_ids)
        if self.deliveries:
            for msg_id in msg_ids:
                self.deliveries.pop(msg_id, None)

    def ack_one(self, msg_id: int) -> None:
        Queue.ack_one(self, msg_id)
        if self.deliveries:
            self.deliveries.pop(msg_id, None)

    def reject(self, msg_ids: Iterable[int], reason: str = "rejected") -> None:
        msg_ids = list(msg_ids)
        Queue.reject(self, msg_ids, reason)
        if self.deliveries:
            for msg_id in msg_ids:
                self.deliveries.pop(msg_id, None)

    def discard(self, msg_ids: Iterable[int]) -> None:
        msg_ids = list(msg_ids)
        Queue.discard(self, msg_ids)
        if self.deliveries:
            for msg_id in msg_ids:
                self.deliveries.pop(msg_id, None)

    def _pop_head(self) -> tuple[Message, float, bool]:
        # The head leaves the ready side: to a consumer (``_take`` keeps its new count),
        # or for good (expired, dropped by a length limit or the delivery limit).
        popped = Queue._pop_head(self)
        if self.deliveries:
            self.deliveries.pop(popped[0].msg_id, None)
        return popped

    def purge(self) -> int:
        held = self.outstanding
        self.deliveries = {i: c for i, c in self.deliveries.items() if i in held}
        return Queue.purge(self)

    def close(self) -> int:
        self.deliveries = {}
        return Queue.close(self)


def with_delivery_count(message: Message, count: int) -> Message:
    """A copy of ``message`` for one delivery, its headers holding ``x-delivery-count``
    (the queue keeps the message as published)."""
    headers = dict(message.headers())
    headers["x-delivery-count"] = count
    copy = message.rewritten(message.address, headers)
    copy.msg_id = message.msg_id
    return copy


def new_queue(
    name: str,
    durable: bool = False,
    exclusive_owner: object | None = None,
    auto_delete: bool = False,
    arguments: dict[str, Any] | None = None,
    now: float = 0.0,
    log: ChangeLog | None = None,
    vhost: str = "/",
) -> Queue:
    """A queue for these arguments: a ``QuorumQueue`` for ``x-queue-type: quorum``, a
    ``PriorityQueue`` when they give x-max-priority above 0 (with 0, every message has
    priority 0: a plain queue, as in RabbitMQ)."""
    arguments = arguments or {}
    kind: type[Queue] = Queue
    if arguments.get("x-queue-type") == "quorum":
        kind = QuorumQueue
    elif arguments.get("x-max-priority"):
        kind = PriorityQueue
    return kind(name, durable, exclusive_owner, auto_delete, arguments, now, log, vhost)


class RankedConsumers:
    """The ready consumers of a queue once consumer priorities are in use: a round-robin
    order per priority, the highest priority first. It offers what the queue does with
    the plain ``OrderedDict`` (set, pop, del, iterate, ``move_to_end``), so ``drain`` is
    the same code: the first consumer is one of the highest priority that is ready, and
    a lower one is reached only once every higher one was found not ready and set aside
    (RabbitMQ's consumer priorities, docs/compat.md)."""

    __slots__ = ("ranks", "levels", "order", "ranked", "level_of")

    def __init__(self, ranks: dict[Consumer, int], ready: Iterable[Consumer] = ()) -> None:
        # Every subscribed consumer's priority (the queue's ``consumers``).
        self.ranks = ranks
        self.levels: dict[int, OrderedDict[Consumer, None]] = {}
        # The priorities that have a ready consumer, negated, in ascending order, and
        # their levels in the same order (the highest first).
        self.order: list[int] = []
        self.ranked: list[OrderedDict[Consumer, None]] = []
        self.level_of: dict[Consumer, int] = {}
        for consumer in ready:
            self[consumer] = None

    def __setitem__(self, consumer: Consumer, _value: None) -> None:
        if consumer in self.level_of:
            return
        priority = self.ranks[consumer]
        level = self.levels.get(priority)
        if level is None:
            level = self.levels[priority] = OrderedDict()
            at = bisect.bisect(self.order, -priority)
            self.order.insert(at, -priority)
            self.ranked.insert(at, level)
        level[consumer] = None
        self.level_of[consumer] = priority

    def __delitem__(self, consumer: Consumer) -> None:
        priority = self.level_of.pop(consumer)
        level = self.levels[priority]
        del level[consumer]
        if not level:
            del self.levels[priority]
            at = self.order.index(-priority)
            del self.order[at]
            del self.ranked[at]

    def pop(self, consumer: Consumer, default: None = None) -> None:
        if consumer in self.level_of:
            del self[consumer]
        return default

    def move_to_end(self, consumer: Consumer) -> None:
        self.levels[self.level_of[consumer]].move_to_end(consumer)

    def __iter__(self) -> Iterator[Consumer]:
        return itertools.chain.from_iterable(self.ranked)

    def __len__(self) -> int:
        return len(self.level_of)

    def clear(self) -> None:
        self.levels.clear()
        self.order.clear()
        self.ranked.clear()
        self.level_of.clear()


class Lane:
    """The messages of one priority, kept as a plain queue keeps its ready side: the
    never-delivered ones in id order (with their deadlines once one has a deadline) and
    the returned ones in a heap by id; the head is whichever has the lower id."""

    __slots__ = ("ready", "expiries", "returned")

    # Lanes alive in this process: the memory watermark counts each (a lane lives only
    # while it holds a message, but one message may cost a lane on its own).
    held = 0

    def __init__(self) -> None:
        self.ready: deque[Message] = deque()
        self.expiries: deque[float] | None = None
        self.returned: list[tuple[int, float, Message]] = []
        Lane.held += 1

    def __del__(self) -> None:
        Lane.held -= 1

    def __len__(self) -> int:
        return len(self.ready) + len(self.returned)

    def append(self, message: Message, deadline: float) -> None:
        if deadline != math.inf and self.expiries is None:
            self.expiries = deque(math.inf for _ in self.ready)
        self.ready.append(message)
        if self.expiries is not None:
            self.expiries.append(deadline)

    def _returned_first(self) -> bool:
        returned = self.returned
        ready = self.ready
        return bool(returned) and (not ready or returned[0][0] < ready[0].msg_id)

    def head_deadline(self) -> float:
        if self._returned_first():
            return self.returned[0][1]
        return self.expiries[0] if self.expiries is not None else math.inf

    def discard_heads(self, wanted: set[int]) -> tuple[int, int]:
        """Remove the messages at the head of ``ready`` whose ids are in ``wanted`` (the
        usual case: settled in the order they were delivered); found ids leave the set.
        Returns how many were removed and their body bytes."""
        count = size = 0
        ready = self.ready
        expiries = self.expiries
        while ready and ready[0].msg_id in wanted:
            message = ready.popleft()
            if expiries is not None:
                expiries.popleft()
            wanted.discard(message.msg_id)
            count += 1
            size += len(message.body)
        return count, size

    def discard_anywhere(self, wanted: set[int]) -> tuple[int, int]:
        """``discard_heads`` for messages anywhere in the lane (a walk of all of it)."""
        count = size = 0
        removed = [m for m in self.ready if m.msg_id in wanted]
        if removed:
            gone = {m.msg_id for m in removed}
            if self.expiries is not None:
                kept = [
                    (m, d)
                    for m, d in zip(self.ready, self.expiries, strict=True)
                    if m.msg_id not in gone
                ]
                self.ready = deque(m for m, _ in kept)
                self.expiries = deque(d for _, d in kept)
            else:
                self.ready = deque(m for m in self.ready if m.msg_id not in gone)
            wanted -= gone
            count += len(removed)
            size += sum(len(m.body) for m in removed)
        returned = [entry for entry in self.returned if entry[0] in wanted]
        if returned:
            gone = {entry[0] for entry in returned}
            self.returned = [entry for entry in self.returned if entry[0] not in gone]
            heapq.heapify(self.returned)
            wanted -= gone
            count += len(returned)
            size += sum(len(entry[2].body) for entry in returned)
        return count, size

    def entries(self) -> Iterator[tuple[Message, float]]:
        """Every message with its deadline (inf: none)."""
        expiries = self.expiries
        if expiries is None:
            for message in self.ready:
                yield message, math.inf
        else:
            yield from zip(self.ready, expiries, strict=True)
        for _, deadline, message in self.returned:
            yield message, deadline


class PriorityQueue(Queue):
    """A queue with ``x-max-priority``: higher priorities first, each priority in its own
    order (RabbitMQ keeps one backing queue per priority). A message's priority is its
    ``priority`` property, 0 when it has none, the queue's maximum when above it. A
    requeued message goes back to its own position within its priority. Everything that
    works on the head (TTL, drop-head, Basic.Get, consumers) sees the highest priority's
    head, as in RabbitMQ: drop-head drops the oldest message of the highest priority.

    A lane is made when a message of its priority arrives and dropped once it holds
    none: a queue costs what its priorities holding messages cost, whatever its maximum,
    and an empty one (purged, drained) holds no lane at all.

    Redelivered: a returned message is marked, as in a plain queue. Deliveries here are
    not in id order, so the queue's own deliveries say nothing of the ready messages below
    them; only a mark from the change stream does (``mark_delivered``: a restart, a
    failover), and it marks every ready message at or below it, in every priority. After
    a restart, a lower-priority message that was never delivered may come back marked;
    one that was delivered always does.
    """

    def __init__(
        self,
        name: str,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        now: float = 0.0,
        log: ChangeLog | None = None,
        vhost: str = "/",
    ) -> None:
        super().__init__(name, durable, exclusive_owner, auto_delete, arguments, now, log, vhost)
        self.max_priority = self.limits.max_priority
        # The lanes holding messages, by priority; ``_top`` is the highest (0: none).
        self.lanes: dict[int, Lane] = {}
        self.count = 0
        self._top = 0
        # The highest delivered id known from the change stream (see the class docstring).
        self.streamed_mark = 0
        # Some message has had a deadline: expiry is looked at from then on.
        self.timed = False

    @property
    def message_count(self) -> int:
        return self.count

    def priority_of(self, message: Message) -> int:
        return min(message.priority(), self.max_priority)

    def _lane(self, priority: int) -> Lane:
        lane = self.lanes.get(priority)
        if lane is None:
            lane = self.lanes[priority] = Lane()
            if priority > self._top:
                self._top = priority
        return lane

    def _head_lane(self) -> Lane:
        """The highest lane that holds a message (the queue is not empty)."""
        return self.lanes[self._top]

    def _drop_if_empty(self, priority: int, lane: Lane) -> None:
        if lane.ready or lane.returned:
            return
        del self.lanes[priority]
        if priority == self._top:
            self._top = max(self.lanes) if self.lanes else 0

    # -- enqueue ---------------------------------------------------------------------

    def enqueue(self, message: Message, now: float, expiration: float | None = None) -> None:
        ttl = self.limits.message_ttl
        if expiration is not None and (ttl is None or expiration < ttl):
            ttl = expiration
        deadline = math.inf if ttl is None else now + ttl
        priority = message.priority()
        if priority > self.max_priority:
            priority = self.max_priority
        lane = self.lanes.get(priority)
        if lane is None:
            lane = self._lane(priority)
        if lane.expiries is None and deadline == math.inf:
            lane.ready.append(message)
        else:
            lane.append(message, deadline)
        self.count += 1
        self.bytes += len(message.body)
        if deadline != math.inf:
            self.timed = True
        if self.timed and self.on_due_changed is not None and self._head_lane() is lane:
            # The new message may be the head, and may expire before the old one.
            self.on_due_changed(self)
        log = self.log
        if log is not None:
            self._log_enqueued(log, message, deadline)
        limits = self.limits
        if limits.max_length is not None or limits.max_length_bytes is not None:
            self._drop_over_limit()

    def restore(self, message: Message, deadline: float | None) -> None:
        self._lane(self.priority_of(message)).append(
            message, math.inf if deadline is None else deadline
        )
        self.count += 1
        self.bytes += len(message.body)
        if deadline is not None:
            self.timed = True

    # -- the head --------------------------------------------------------------------

    def _pop_head(self) -> tuple[Message, float, bool]:
        top = self._top
        lane = self.lanes[top]
        returned = lane.returned
        ready = lane.ready
        if returned and (not ready or returned[0][0] < ready[0].msg_id):
            _, deadline, message = heapq.heappop(returned)
            redelivered = True
        else:
            message = ready.popleft()
            expiries = lane.expiries
            deadline = math.inf if expiries is None else expiries.popleft()
            redelivered = message.msg_id <= self.streamed_mark
        if not (ready or returned):
            self._drop_if_empty(top, lane)
        self.count -= 1
        self.bytes -= len(message.body)
        if self.timed and self.count and self.on_due_changed is not None:
            self.on_due_changed(self)
        return message, deadline, redelivered

    def _head_deadline(self) -> float:
        return self._head_lane().head_deadline() if self.count else math.inf

    def expire(self, now: float) -> int:
        return self._expire_head(now) if self.timed else 0

    def mark_delivered(self, msg_id: int) -> None:
        super().mark_delivered(msg_id)
        if msg_id > self.streamed_mark:
            self.streamed_mark = msg_id

    def drain(self, now: float) -> None:
        """As ``Queue.drain``, counting messages across the lanes."""
        if not self.consumers or not self.count:
            return
        if self.timed:
            self.expire(now)
        while self.count:
            consumer = self._next_consumer()
            if consumer is None:
                return
            message, redelivered = self._fetch(consumer.no_ack)
            consumer.deliver(self, message, redelivered)
            if self.timed:
                self.expire(now)

    # -- settling by id ----------------------------------------------------------------

    def requeue(self, msg_ids: Iterable[int]) -> None:
        outstanding = self.outstanding
        deadlines = self.outstanding_deadlines
        head_before = self._head_deadline() if self.on_due_changed is not None else None
        for msg_id in msg_ids:
            message = outstanding.pop(msg_id, None)
            if message is None:
                continue
            deadline = deadlines.pop(msg_id, math.inf) if deadlines else math.inf
            if deadline != math.inf:
                self.timed = True
            heapq.heappush(
                self._lane(self.priority_of(message)).returned, (msg_id, deadline, message)
            )
            self.count += 1
            self.bytes += len(message.body)
        if head_before is not None and self._head_deadline() < head_before:
            self.on_due_changed(self)  # type: ignore[misc]

    def discard(self, msg_ids: Iterable[int]) -> None:
        wanted = set(msg_ids)
        for msg_id in list(wanted):
            if self.outstanding.pop(msg_id, None) is not None:
                self.outstanding_deadlines.pop(msg_id, None)
                wanted.discard(msg_id)
        # The heads of every lane first: a walk of a whole lane only for what is left.
        for discard in (Lane.discard_heads, Lane.discard_anywhere):
            for priority, lane in list(self.lanes.items()):
                if not wanted:
                    return
                count, size = discard(lane, wanted)
                if count:
                    self.count -= count
                    self.bytes -= size
                    self._drop_if_empty(priority, lane)

    def purge(self) -> int:
        count = self.count
        if self.log is not None and count:
            ids = tuple(m.msg_id for lane in self.lanes.values() for m, _ in lane.entries())
            self.log.emit(Settled(self.vhost, self.name, ids, "purged"))
        self._clear_lanes()
        return count

    def close(self) -> int:
        count = super().close()
        self._clear_lanes()
        return count

    def _clear_lanes(self) -> None:
        self.lanes = {}
        self._top = 0
        self.count = 0
        self.bytes = 0

    def messages(self) -> list[tuple[Message, float | None]]:
        found = [
            (m, None if d == math.inf else d)
            for lane in self.lanes.values()
            for m, d in lane.entries()
        ]
        found += [(m, self.outstanding_deadlines.get(i)) for i, m in self.outstanding.items()]
        found.sort(key=lambda pair: pair[0].msg_id)
        return found
