"""Forwards (docs/federation.md, "Forwarding"): every message routed through an exchange
also goes on a hidden queue, bound for an upstream, unless the path rule refuses it.

Owns: ``Forward``, one exchange's forward to one hidden queue, and whether it takes a
message (``add_forwards``: the hidden queues of an exchange's forwards that take one) (its ``x-amqha-path`` extended by this server, by ``names``' rule).

Must not know: how forwards are set or hidden queues made (``vhost``), routing, the
link that consumes the hidden queue (``amqha.federation``).
"""

from __future__ import annotations

from . import names
from .message import Message
from .queue import Queue


class Forward:
    """Messages routed through ``exchange`` also go on the hidden ``queue``, bound for
    ``upstream``, unless the path rule refuses them (docs/federation.md, "Loops and hops")."""

    __slots__ = ("exchange", "queue", "upstream", "local", "max_hops")

    def __init__(
        self, exchange: str, queue: Queue, upstream: str, local: str, max_hops: int
    ) -> None:
        self.exchange = exchange
        self.queue = queue
        self.upstream = upstream
        self.local = local
        self.max_hops = max_hops

    def takes(self, message: Message) -> bool:
        path = names.extended(names.path_of(message.headers()), self.local)
        return names.crossing(path, self.upstream, self.max_hops) is None


def add_forwards(
    forwards: dict[str, tuple[Forward, ...]], exchange: str, message: Message, queues: dict
) -> None:
    """Add to ``queues`` the hidden queues of ``exchange``'s forwards that take ``message``."""
    for forward in forwards.get(exchange, ()):
        if forward.takes(message):
            queues[forward.queue] = None
