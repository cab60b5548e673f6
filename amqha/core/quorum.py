"""Quorum queues: each message's delivery count, its ``x-delivery-count`` header and
``x-delivery-limit``.

Owns: ``DeliveryCounter``, the ``counter`` of a queue declared ``x-queue-type: quorum``
(the queue tells it of each delivery and settlement: ``queue.DeliveryCounting``), the
counts it keeps and replicates as ``Redelivered``, the header it writes on a delivered
copy, and which messages the delivery limit dead-letters (docs/compat.md, "Quorum
queues").

The count is replicated state of the message, as in RabbitMQ (docs/durability.md,
section 1). A FIFO queue hands messages out head first, so every message still held
whose id is at or below ``delivered_mark`` went out at least once: that first delivery
costs nothing beyond the ``Delivered`` every queue emits. A message handed out again
emits ``Redelivered`` with its new count, kept in ``deliveries`` (only counts of 2 and
more are kept). A message returned to the queue (nack or reject with requeue, recover,
cancel, a closed channel, or a failover: its consumer's connection went with the old
ACTIVE) has been delivered as many times as it was returned, so ``x-delivery-count`` on
its next delivery is its count so far. RabbitMQ 3.10's values: no header on a consumer's
first delivery, ``x-delivery-count: 0`` on a first Basic.Get, then 1, 2... A message
returned more times than the limit is dead-lettered with reason ``delivery_limit``
(dropped without a dead-letter exchange) instead of going back: with
``x-delivery-limit: 1`` it is delivered twice.

A quorum queue is a plain ``Queue`` (never a priority one: docs/compat.md), so the
counter reads its ready side and its ``delivered_mark`` as the plain queue keeps them.

Must not know: consumers, channels, the clock, the store, where dead letters go.
"""

from __future__ import annotations

from collections.abc import Iterable

from .changes import Redelivered, Settled
from .message import Message
from .queue import Queue


class DeliveryCounter:
    """The delivery counts of one quorum queue's messages. It holds no reference to its
    queue (the queue passes itself), so a deleted queue is freed at once."""

    __slots__ = ("limit", "deliveries")

    def __init__(self, limit: int | None) -> None:
        # x-delivery-limit (None: none).
        self.limit = limit
        # msg_id -> how many times it was handed out, for those handed out twice or more.
        self.deliveries: dict[int, int] = {}

    def count(self, queue: Queue, msg_id: int) -> int:
        """How many times message ``msg_id`` was handed out (see the module docstring)."""
        count = self.deliveries.get(msg_id)
        if count is not None:
            return count
        return 1 if msg_id <= queue.delivered_mark else 0

    def _exhausted(self, queue: Queue, msg_id: int) -> bool:
        limit = self.limit
        return limit is not None and self.count(queue, msg_id) > limit

    # -- what the queue tells it (``queue.DeliveryCounting``) ----------------------------

    def handed_out(
        self, queue: Queue, message: Message, redelivered: bool, no_ack: bool, get: bool
    ) -> Message:
        """The head left for one delivery; what to deliver: a copy with
        ``x-delivery-count`` on a delivery after the first, and on any Basic.Get."""
        msg_id = message.msg_id
        deliveries = self.deliveries
        recorded = deliveries.pop(msg_id, None) if deliveries else None
        # Delivered before: its id is at or below the mark (a returned message's always
        # is), so ``redelivered`` says it.
        before = recorded or (1 if redelivered else 0)
        if before and not no_ack:
            # (A no-ack delivery settles the message: there is no count left to keep.)
            count = before + 1
            deliveries[msg_id] = count
            if queue.log is not None:
                queue.log.emit(Redelivered(queue.vhost, queue.name, msg_id, count))
        if before or get:
            return with_delivery_count(message, before)
        return message

    def drop_exhausted(self, queue: Queue) -> None:
        """Dead-letter the messages at the head returned more times than the limit
        without the ACTIVE seeing the return (a failover, a restart)."""
        if self.limit is None:
            return
        dropped = []
        while queue.message_count and self._exhausted(queue, _head_id(queue)):
            dropped.append(queue.drop_head("delivery_limit"))
        if dropped and queue.log is not None:
            queue.log.emit(Settled(queue.vhost, queue.name, tuple(dropped), "delivery_limit"))

    def requeued(self, queue: Queue, msg_ids: Iterable[int]) -> list[int]:
        """Those returned more times than the limit are dead-lettered (reason
        ``delivery_limit``); the others go back to their positions."""
        back: list[int] = []
        over: list[int] = []
        for msg_id in msg_ids:
            (over if self._exhausted(queue, msg_id) else back).append(msg_id)
        if over:
            queue.reject(over, "delivery_limit")
        return back

    def forget(self, msg_ids: Iterable[int]) -> None:
        deliveries = self.deliveries
        if deliveries:
            for msg_id in msg_ids:
                deliveries.pop(msg_id, None)

    def purged(self, queue: Queue) -> None:
        held = queue.outstanding
        self.deliveries = {i: c for i, c in self.deliveries.items() if i in held}

    def clear(self) -> None:
        self.deliveries = {}

    def count_delivery(self, queue: Queue, msg_id: int, count: int) -> None:
        """A ``Redelivered`` from the change stream (a store, a peer)."""
        queue.mark_delivered(msg_id)
        if count > self.deliveries.get(msg_id, 1):
            self.deliveries[msg_id] = count


def _head_id(queue: Queue) -> int:
    returned = queue.returned
    ready = queue.ready
    if returned and (not ready or returned[0][0] < ready[0].msg_id):
        return returned[0][0]
    return ready[0].msg_id


def with_delivery_count(message: Message, count: int) -> Message:
    """A copy of ``message`` for one delivery, its headers holding ``x-delivery-count``
    (the queue keeps the message as published)."""
    headers = dict(message.headers())
    headers["x-delivery-count"] = count
    copy = message.rewritten(message.address, headers)
    copy.msg_id = message.msg_id
    return copy
