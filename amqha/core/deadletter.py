"""Dead letters: the copy of a message that dies in a queue, and RabbitMQ's rule against
dead-letter cycles.

Owns: the dead letter's ``x-death`` entries (a new one, or the count of a repeated one
raised and moved first), its ``x-first-death-*`` headers, its address on the
dead-letter exchange, its TTL dropped (docs/compat.md, "Dead letters"), and which
destinations would close a cycle.

Must not know: exchanges, routing, queues (the vhost looks up the target, routes the
copy and enqueues it), the clock (``wall_clock`` is passed in).
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Callable
from typing import Any

from ..wire import address_of
from .message import Message

Deaths = list[dict[str, Any]]


def dead_letter(
    message: Message,
    queue_name: str,
    reason: str,
    exchange_name: str,
    routing_key: str,
    wall_clock: Callable[[], float],
) -> tuple[Message, Deaths] | None:
    """The copy of ``message``, dead in ``queue_name`` for ``reason``, addressed to
    ``exchange_name`` with ``routing_key``, and its ``x-death`` list; None when its
    headers cannot be written back (a key longer than a shortstr): such a message is
    dropped, as if it had no dead-letter exchange."""
    original_key = message.routing_key
    headers = dict(message.headers())
    deaths = [dict(d) for d in headers.get("x-death") or [] if isinstance(d, dict)]
    for death in deaths:
        if death.get("queue") == queue_name and death.get("reason") == reason:
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
            "queue": queue_name,
            "time": datetime.datetime.fromtimestamp(int(wall_clock()), datetime.UTC),
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
    headers.setdefault("x-first-death-queue", queue_name)
    headers.setdefault("x-first-death-exchange", message.exchange)
    try:
        dead = message.rewritten(
            address_of(exchange_name, routing_key), headers, drop_expiration=True
        )
    except (TypeError, ValueError, OverflowError, struct.error):
        return None
    return dead, deaths


def is_cycle(queue_name: str, deaths: Deaths) -> bool:
    """RabbitMQ's rule: a dead letter that would reach a queue it already died in is
    dropped, unless a consumer rejected it somewhere in between (a deliberate retry
    loop). Without it, TTL 0 or x-max-length 0 on such a loop recurses without end."""
    for death in deaths:
        if death.get("reason") == "rejected":
            return False
        if death.get("queue") == queue_name:
            return True
    return False
