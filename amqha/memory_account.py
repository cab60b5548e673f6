"""The broker's memory account and the alarm it raises (docs/limits.md).

Owns: what the process holds for its clients, counted as it changes (never by walking
queues or connections): message bytes plus a per-message overhead (``HELD.count``),
arguments of bindings, exchanges and queues (``ArgumentBytes``), deduplication keys
(``DedupBytes``), partial frames and
content being assembled, output held for sockets that do not drain, a fixed cost per
queue, connection, channel and priority lane in use. When that passes
``limits.memory_high_watermark`` the alarm is on (``over``) until it falls below, and the
account says so to the one it was given (``on_change``); the broker then blocks
publishers (``Broker.update_blocked``: whom it tells and holds is ``flow.py``'s).

Must not know: frames, connections, routing, the failover state machine. The broker
holds one (``Broker.memory``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .core.dedup import DedupBytes
from .core.message import HELD
from .core.priority import Lane
from .core.routing import ArgumentBytes

log = logging.getLogger("amqha.server")

# How often the watermark is re-checked while nothing publishes (publishes check at once).
MEMORY_CHECK_INTERVAL = 0.1
# Fixed costs counted against the watermark, measured with bench/memory_attacks.py:
# a queue with its limits, deques and dicts; a connection with its transport, buffers
# and handshake state; a channel with its maps.
QUEUE_COST = 2048
# A priority queue's lane (one per priority holding messages): its deque and heap with
# a first message, 896 B measured with tracemalloc.
LANE_COST = 1024
CONNECTION_COST = 16 * 1024
CHANNEL_COST = 1200

# What the account counts of the broker, each time it checks: (queues, connections,
# channels) in use.
Census = Callable[[], tuple[int, int, int]]


class MemoryAccount:
    """The memory account and the alarm (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        watermark: int,
        output_buffer: int,
        census: Census,
        on_change: Callable[[], None],
    ) -> None:
        self.loop = loop
        self.watermark = watermark
        self.output_buffer = output_buffer  # what a paused output may hold
        self.census = census
        self.on_change = on_change  # the alarm began or ended
        self.over = False
        # Memory counted beyond HELD.count (see the module docstring).
        self.input_bytes = 0  # partial frames and multi-frame bodies being assembled
        self.paused_outputs = 0  # connections whose socket stopped draining
        # What messages may hold before the watermark is reached, refreshed at each check:
        # a publish compares HELD.count with it and checks at once when past it.
        self.message_budget = watermark
        self.input_at_check = 0  # input_bytes when message_budget was last computed
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Check every MEMORY_CHECK_INTERVAL from now on."""
        self.timer = self.loop.call_later(MEMORY_CHECK_INTERVAL, self._tick)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def count_input(self, delta: int) -> None:
        """Bytes read and held in partial frames and bodies (``delta`` < 0 as they go).
        Past the budget they are checked at once, as a publish is: a body read faster
        than the timer ticks would otherwise run far past the watermark."""
        self.input_bytes += delta
        if (
            delta > 0
            and not self.over
            and HELD.count + self.input_bytes - self.input_at_check > self.message_budget
        ):
            self.check()

    def output_paused(self, delta: int) -> None:
        self.paused_outputs += delta

    def in_use(self) -> int:
        """The bytes counted against the watermark (see the module docstring)."""
        queues, connections, channels = self.census()
        return (
            HELD.count
            + ArgumentBytes.held
            + DedupBytes.held
            + self.input_bytes
            + self.paused_outputs * self.output_buffer
            + queues * QUEUE_COST
            + Lane.held * LANE_COST
            + connections * CONNECTION_COST
            + channels * CHANNEL_COST
        )

    def _tick(self) -> None:
        self.timer = self.loop.call_later(MEMORY_CHECK_INTERVAL, self._tick)
        self.check()

    def check(self) -> None:
        limit = self.watermark
        in_use = self.in_use()
        self.message_budget = limit - (in_use - HELD.count)
        self.input_at_check = self.input_bytes
        over = in_use > limit
        if over == self.over:
            return
        self.over = over
        log.warning(
            "memory watermark %s: %d bytes in use %s %d",
            "reached, blocking publishers" if over else "cleared, unblocking publishers",
            in_use,
            ">" if over else "<=",
            limit,
        )
        self.on_change()
