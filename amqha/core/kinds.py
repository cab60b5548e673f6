"""Queue kinds: which queue a declare's arguments make.

Owns: ``new_queue``, the one place that picks a plain ``Queue``, a quorum queue (a
``Queue`` with a ``quorum.DeliveryCounter``) or a ``priority.PriorityQueue``, and gives
one declared with deduplication its memory (``dedup.InQueue`` or ``dedup.SeenCache``).

Must not know: how any of them works, the vhost's rules for a declare (``vhost``,
``arguments``).
"""

from __future__ import annotations

from typing import Any

from .changes import ChangeLog
from .dedup import BY_MESSAGE_ID, InQueue, SeenCache, queue_settings
from .priority import PriorityQueue
from .queue import Queue
from .quorum import DeliveryCounter


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
    """A queue for these arguments: one that counts deliveries (its ``counter``) for
    ``x-queue-type: quorum``, a ``PriorityQueue`` when they give x-max-priority above 0
    (with 0, every message has priority 0: a plain queue, as in RabbitMQ)."""
    arguments = arguments or {}
    kind: type[Queue] = Queue
    quorum = arguments.get("x-queue-type") == "quorum"
    if not quorum and arguments.get("x-max-priority"):
        kind = PriorityQueue
    dedup = queue_settings(name, arguments, durable)
    queue = kind(name, durable, exclusive_owner, auto_delete, arguments, now, log, vhost)
    if quorum:
        queue.counter = DeliveryCounter(queue.limits.delivery_limit)
    if dedup is not None:
        queue.dedup = SeenCache(dedup) if dedup.by == BY_MESSAGE_ID else InQueue(dedup)
    return queue
