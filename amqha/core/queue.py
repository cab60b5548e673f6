"""Queues: holding messages in order and handing them to consumers.

Owns: the messages of one queue until they are settled, what its arguments do (TTL,
expiry, length limits, overflow, dead-letter target, single active consumer; parsed in
``arguments``), its consumers and the choice among the ready ones (round-robin, highest
``x-priority`` first), redelivery marks, when the queue next needs a timer
(``next_due``), and the counts the console shows.

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

- ``x-max-priority``: a ``priority.PriorityQueue`` (chosen at declare,
  ``kinds.new_queue``) keeps one lane per message priority, each ordered as a plain
  queue's ready side;
- ``x-queue-type: quorum``: the queue's ``counter`` (a ``quorum.DeliveryCounter``; None
  on any other queue) counts each message's deliveries: the queue tells it of each
  delivery and settlement (``DeliveryCounting``), and it alone knows what a count means;
- consumer priorities (``x-priority``): the ready consumers move to ``RankedConsumers``
  when the first consumer with a priority other than 0 arrives;
- ``x-single-active-consumer``: only the active consumer is ever among the ready ones;
  the next one is chosen when it leaves.

Must not know: channels or sockets (a consumer is a ``Consumer``: ``no_ack``, ``ready()``
and ``deliver()``), the clock (``now`` is passed in, wall-clock seconds), where dead
letters go (the vhost gives an ``on_dead_letter`` callback), the store, what a
delivery count means (the ``counter`` does).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Protocol

from mypy_extensions import mypyc_attr

from . import release
from .arguments import QueueLimits
from .changes import ChangeLog, Delivered, Enqueued, Settled
from .dedup import InQueue, SeenCache, in_id_order, msg_id_of
from .message import Message


@mypyc_attr(allow_interpreted_subclasses=True)
class Consumer:
    """What a queue hands its messages to: a channel's Basic.Consume, a federation
    link's forwarder, a test's taker. A class rather than a Protocol: compiled, the
    queue calls ``ready`` and ``deliver`` through the class's table of methods, not by
    looking each name up per message (docs/performance.md, "Calls the compiler can
    bind"); an interpreted subclass still works, by name."""

    __slots__ = ("tag", "exclusive", "no_ack")

    def __init__(self, tag: str, exclusive: bool = False, no_ack: bool = False) -> None:
        self.tag = tag
        self.exclusive = exclusive
        self.no_ack = no_ack

    def ready(self) -> bool:
        """Whether it can take a message now."""
        raise NotImplementedError

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        """Take ``message`` (handed out by ``queue``)."""
        raise NotImplementedError


DeadLetterFn = Callable[["Queue", Message, str], None]

# ``discard`` finds ids behind the head one by one while they are at most one in this
# many of the ready messages; more, and one pass over the queue costs less.
FIND_SHARE = 64


class DeliveryCounting(Protocol):
    """What a queue that counts its messages' deliveries tells its ``counter`` (a quorum
    queue's: ``quorum.DeliveryCounter``), and asks of it. A plain queue has none."""

    # msg_id -> how many times it was handed out, for those handed out twice or more
    # (what ``apply`` replicates as ``Redelivered``).
    deliveries: dict[int, int]
    # The delivery limit (None: none): the queue's x-delivery-limit, or its policy's.
    limit: int | None

    def handed_out(
        self, queue: Queue, message: Message, redelivered: bool, no_ack: bool, get: bool
    ) -> Message:
        """``message`` left the queue for one delivery (``get``: a Basic.Get); returns
        what to deliver (a copy with its count, or ``message``)."""
        ...

    def drop_exhausted(self, queue: Queue) -> None:
        """Dead-letter the messages at the head delivered more times than the limit."""
        ...

    def requeued(self, queue: Queue, msg_ids: Iterable[int]) -> list[int]:
        """Settle those of ``msg_ids`` past the limit; returns the others, to requeue."""
        ...

    def forget(self, msg_ids: Iterable[int]) -> None:
        """These messages are settled or gone: their counts with them."""
        ...

    def purged(self, queue: Queue) -> None:
        """The ready messages were purged: only the outstanding ones keep a count."""
        ...

    def clear(self) -> None:
        """The queue is deleted."""
        ...

    def count_delivery(self, queue: Queue, msg_id: int, count: int) -> None:
        """A ``Redelivered`` from the change stream (a store, a peer)."""
        ...


# Whether this module runs compiled (amqha/compiled.py): from its extension file.
_COMPILED: Final = not __file__.endswith(".py")


class Queue:
    # x-single-active-consumer: the consumer that may receive. A class default, set on an
    # instance only when it has one: see the attribute count in ``__init__``.
    active_consumer: Consumer | None = None
    # A quorum queue's delivery counts (docs/compat.md, "Quorum queues"); set by
    # ``kinds.new_queue``. A class default, as ``active_consumer``.
    counter: DeliveryCounting | None = None
    # What drops copies of a message (``dedup.InQueue`` or ``dedup.SeenCache``); set by
    # ``kinds.new_queue`` for a queue declared with deduplication. A class default too.
    dedup: InQueue | SeenCache | None = None

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
        if _COMPILED:
            # A compiled class applies no class defaults: the three above, set here.
            self.active_consumer = None
            self.counter = None
            self.dedup = None
        # Interpreted, that is 29 attributes, the most CPython 3.11 keeps in the keys its
        # instances share: with one more, each queue reads its attributes from a
        # dictionary of its own, and delivering and acking a message costs 3.6% more
        # instructions (two more measured: bench.hotpath's consume phase under
        # callgrind). What a queue needs only for an extension lives in a subclass, a
        # class default or ``limits``.

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

    def holds(self, msg_id: int) -> bool:
        """Whether message ``msg_id`` is still in this queue, delivered or not."""
        if msg_id in self.outstanding:
            return True
        if in_id_order(self.ready, msg_id):
            return True
        return any(entry[0] == msg_id for entry in self.returned)

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

    def set_effective(
        self, arguments: dict[str, Any], policy: str | None, operator_policy: str | None
    ) -> None:
        """Read the limits from ``arguments`` (the queue's own merged with the policies
        named: ``core.policies``); QueueArgumentError leaves them as they were."""
        limits = QueueLimits(arguments, policy, operator_policy)
        self.limits = limits
        if self.counter is not None:
            self.counter.limit = limits.delivery_limit

    def enforce_limits(self) -> None:
        """Apply new length limits to the messages the queue holds (drop-head, each
        dropped one dead-lettered), as an enqueue would."""
        limits = self.limits
        if limits.overflow == "drop-head" and (
            limits.max_length is not None or limits.max_length_bytes is not None
        ):
            self._drop_over_limit()

    def _drop_over_limit(self) -> None:
        limits = self.limits
        dropped = []
        while self.message_count and (
            (limits.max_length is not None and self.message_count > limits.max_length)
            or (limits.max_length_bytes is not None and self.bytes > limits.max_length_bytes)
        ):
            dropped.append(self.drop_head("maxlen"))
        if dropped and self.log is not None:
            self.log.emit(Settled(self.vhost, self.name, tuple(dropped), "maxlen"))

    # -- the head ------------------------------------------------------------------

    def drop_head(self, reason: str) -> int:
        """Take the head out for good, dead-lettered with ``reason``; returns its id (the
        caller emits the ``Settled``)."""
        message = self._pop_head()[0]
        counter = self.counter
        if counter is not None:
            counter.forget((message.msg_id,))
        self._dead_letter(message, reason)
        return message.msg_id

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
            expired.append(self.drop_head("expired"))
        if expired and self.log is not None:
            self.log.emit(Settled(self.vhost, self.name, tuple(expired), "expired"))
        return len(expired)

    def next_expiry(self) -> float | None:
        if self.message_count:
            head = self._head_deadline()
            return None if head == math.inf else head
        return None

    # -- handing out ---------------------------------------------------------------

    def _fetch(self, no_ack: bool, get: bool = False) -> tuple[Message, bool]:
        """Take the head: settled at once (no_ack) or kept as outstanding under its id;
        ``get``: for a Basic.Get."""
        message, deadline, redelivered = self._pop_head()
        msg_id = message.msg_id
        if msg_id > self.delivered_mark:
            self.delivered_mark = msg_id
        self.delivered += 1
        log = self.log
        if no_ack:
            if log is not None:
                log.emit_settled(self, Settled(self.vhost, self.name, (msg_id,), "consumed"))
        else:
            self.outstanding[msg_id] = message
            if deadline != math.inf:
                self.outstanding_deadlines[msg_id] = deadline
            if log is not None:
                log.emit_delivered(self, Delivered(self.vhost, self.name, msg_id))
        counter = self.counter
        if counter is not None:
            message = counter.handed_out(self, message, redelivered, no_ack, get)
        return message, redelivered

    def get(self, now: float, no_ack: bool = True) -> tuple[Message, bool] | None:
        """Basic.Get: the head message, expired ones skipped."""
        self.last_used = now
        self.expire(now)
        if self.counter is not None:
            self.counter.drop_exhausted(self)
        if not self.message_count:
            return None
        return self._fetch(no_ack, True)

    def drain(self, now: float) -> None:
        """Hand messages to ready consumers, round-robin, until either runs out."""
        if not self.consumers or not (self.ready or self.returned):
            return
        expiring = self.expiries is not None or self.returned
        if expiring:
            self.expire(now)
        counter = self.counter
        if counter is not None:
            counter.drop_exhausted(self)
        elif not expiring and self.log is None:
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
            if counter is not None:
                # Whatever came back meanwhile: ``expire`` looks only where it may expire.
                self.expire(now)
                counter.drop_exhausted(self)
            elif expiring:
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
        outstanding = self.outstanding
        deadlines = self.outstanding_deadlines
        for msg_id in msg_ids:
            # ``in`` and ``del`` compile to C calls; ``pop`` is a method called by name.
            if msg_id in outstanding:
                del outstanding[msg_id]
        if deadlines:
            for msg_id in msg_ids:
                deadlines.pop(msg_id, None)
        self.acked += len(msg_ids)
        if self.log is not None:
            self.log.emit(Settled(self.vhost, self.name, tuple(msg_ids), "ack"))
        if self.counter is not None:
            self.counter.forget(msg_ids)

    def ack_one(self, msg_id: int) -> None:
        """``ack`` of one id, the usual case (an ack per message)."""
        outstanding = self.outstanding
        if msg_id in outstanding:
            del outstanding[msg_id]
        if self.outstanding_deadlines:
            self.outstanding_deadlines.pop(msg_id, None)
        self.acked += 1
        if self.log is not None:
            self.log.emit_settled(self, Settled(self.vhost, self.name, (msg_id,), "ack"))
        if self.counter is not None:
            self.counter.forget((msg_id,))

    def requeue(self, msg_ids: Iterable[int]) -> None:
        """Put outstanding messages back at their own positions, marked redelivered (those
        the ``counter`` finds past the delivery limit are dead-lettered instead)."""
        if self.counter is not None:
            msg_ids = self.counter.requeued(self, msg_ids)
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
        counter = self.counter
        if counter is not None:
            msg_ids = list(msg_ids)
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
        if counter is not None:
            counter.forget(msg_ids)

    def refuse(self, message: Message) -> None:
        """A publish refused by reject-publish-dlx overflow: dead-lettered, never queued."""
        self._dead_letter(message, "maxlen")

    def discard(self, msg_ids: Iterable[int]) -> None:
        """Remove messages wherever they are, settled elsewhere (a peer's or a store's
        ``Settled``); nothing is emitted or dead-lettered."""
        if type(msg_ids) is tuple and len(msg_ids) == 1 and self.counter is None:
            # The usual case on a PASSIVE: one ack of the head message, or of one
            # delivered (outstanding) on a server that restores its consumers' state.
            (msg_id,) = msg_ids
            if self.outstanding.pop(msg_id, None) is not None:
                self.outstanding_deadlines.pop(msg_id, None)
                return
            ready = self.ready
            if ready and ready[0].msg_id == msg_id:
                self.bytes -= len(ready.popleft().body)
                if self.expiries is not None:
                    self.expiries.popleft()
                return
        wanted = set(msg_ids)
        if self.counter is not None:
            self.counter.forget(wanted)
        if self.outstanding:
            for msg_id in list(wanted):
                if self.outstanding.pop(msg_id, None) is not None:
                    self.outstanding_deadlines.pop(msg_id, None)
                    wanted.discard(msg_id)  # a message is outstanding or ready, never both
        ready = self.ready
        if len(wanted) >= len(ready) > release.AT_ONCE and all(
            message.msg_id in wanted for message in ready
        ):
            # Every ready message at once (the ACTIVE purged the queue): let go of them
            # whole, freed a slice a turn, not rebuilt around none.
            self._drop_ready()
            ready = self.ready
        else:
            while ready and wanted and ready[0].msg_id in wanted:
                wanted.discard(ready[0].msg_id)
                self.bytes -= len(ready.popleft().body)
                if self.expiries is not None:
                    self.expiries.popleft()
            if not wanted:
                return
            if len(wanted) * FIND_SHARE <= len(ready):
                # A few ids behind the head (acks out of order: two consumers, a late one):
                # each found by bisection in the id-ordered ready messages and taken out
                # where it is; rebuilding a deep queue for each cost it a scan of every
                # message (77 ms an ack at 200,000 messages, on a PASSIVE applying them).
                self._take_out(wanted)
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
                # The messages that go are freed with the old deque, a slice a turn if many.
                release.later(ready)
                self.ready = ready = deque(message for message, _ in keep)
                if self.expiries is not None:
                    self.expiries = deque(deadline for _, deadline in keep)
        self.returned = [entry for entry in self.returned if entry[0] not in wanted]
        heapq.heapify(self.returned)
        self.bytes = sum(len(m.body) for m in ready) + sum(
            len(entry[2].body) for entry in self.returned
        )

    def _take_out(self, wanted: set[int]) -> None:
        """``discard`` of ids not at the head: found in ``ready`` by id, else in
        ``returned``."""
        ready, expiries = self.ready, self.expiries
        for msg_id in sorted(wanted):
            at = bisect.bisect_left(ready, msg_id, key=msg_id_of)
            if at < len(ready) and ready[at].msg_id == msg_id:
                self.bytes -= len(ready[at].body)
                del ready[at]
                if expiries is not None:
                    del expiries[at]
                wanted.discard(msg_id)
        if wanted and self.returned:
            gone = [entry for entry in self.returned if entry[0] in wanted]
            if gone:
                self.bytes -= sum(len(entry[2].body) for entry in gone)
                self.returned = [entry for entry in self.returned if entry[0] not in wanted]
                heapq.heapify(self.returned)

    def purge(self) -> int:
        """Drop every ready message (outstanding ones stay with their consumers)."""
        if self.counter is not None:
            self.counter.purged(self)
        count = self.message_count
        if self.log is not None and count:
            ids = tuple(m.msg_id for m in self.ready) + tuple(e[0] for e in self.returned)
            self.log.emit(Settled(self.vhost, self.name, ids, "purged"))
        self._drop_ready()
        self.returned.clear()
        self.bytes = 0
        return count

    def _drop_ready(self) -> None:
        """Let go of every ready message: a big queue's are freed a slice a turn
        (``release``), not all in this call."""
        release.later(self.ready)
        self.ready = deque()
        if self.expiries is not None:
            release.later(self.expiries)
            self.expiries = deque()

    def close(self) -> int:
        """The queue is deleted: drop everything it holds; returns the ready count."""
        if self.counter is not None:
            self.counter.clear()
        count = self.message_count
        self.deleted = True
        self._drop_ready()
        self.returned.clear()
        self.outstanding.clear()
        self.outstanding_deadlines.clear()
        self.bytes = 0
        return count

    def messages(self) -> Iterator[tuple[Message, float | None]]:
        """Every message not yet settled, in id order, with its deadline (snapshots,
        tests): the queue as it is now, yielded as asked. The ready messages are in id
        order already (``holds`` relies on it too), so millions of them are copied (a
        loop in C) and never sorted or paired up front: that held the GIL for over half a
        second at ten million messages, and a snapshot's start looked like a freeze."""
        expiries = None if self.expiries is None else list(self.expiries)
        rest = [(m, None if d == math.inf else d) for _, d, m in self.returned]
        rest += [(m, self.outstanding_deadlines.get(i)) for i, m in self.outstanding.items()]
        rest.sort(key=_first_id)
        return _in_id_order(list(self.ready), expiries, rest)

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


def _first_id(pair: tuple[Message, float | None]) -> int:
    return pair[0].msg_id


def _in_id_order(
    ready: list[Message],
    expiries: list[float] | None,
    rest: list[tuple[Message, float | None]],
) -> Iterator[tuple[Message, float | None]]:
    """``ready`` (in id order, with its ``expiries``, inf for none) merged with ``rest``
    (sorted), each as (message, deadline or None)."""
    inf = math.inf
    if expiries is None:
        own: Iterator[tuple[Message, float | None]] = zip(ready, itertools.repeat(None))
    else:
        own = ((m, None if d == inf else d) for m, d in zip(ready, expiries, strict=True))
    if rest:
        yield from heapq.merge(own, rest, key=_first_id)
    else:
        yield from own
