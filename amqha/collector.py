"""Python's cyclic garbage collector, kept from pausing a server that holds millions of
messages (docs/performance.md, "The garbage collector").

Owns: timing each full collection (``gc.callbacks``), freezing the objects that outlive a
slow one (``gc.freeze``: later collections leave them out) and, from then on, what is
alive at each look (once a second), and thawing them (``gc.unfreeze``) once few are
left. ``decide`` is the rule, pure; ``Collector`` applies it when the broker's loop asks
(``check``). Counting the frozen objects walks every one of them, the GIL held
(``gc.get_freeze_count``: 18 ms at 2 million here), so they are counted at a look at most
once per ``COUNT_SPACING`` times the last count took (``count_due``, pure), and what
``status`` reports is that count, never a walk of its own.

Why: a full collection walks every object the collector tracks, and each queued message is
one. At five million messages one took over a second here, during which no thread runs:
the heartbeat thread missed its ticks, the server took itself for frozen and fenced
itself, its PASSIVE found it silent, and the replication link dropped and began a new
snapshot of the whole backlog, over and over (a 10,000,000-message backlog never filled).
Queued messages are freed by reference counting, frozen or not; what a frozen object
cannot be is collected as part of a cycle, so a cycle that dies while frozen (a closed
connection's) waits for the thaw.

Must not know: the broker, messages.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

log = logging.getLogger("amqha.server")

# A full collection longer than this freezes its survivors: far below the failover
# timeout, well above the collections of a server with a short backlog (a few ms).
SLOW = 0.05
# Frozen objects are thawed once fewer than this are still alive: a full collection over
# them takes a few tens of milliseconds.
THAW_BELOW = 200_000
# The frozen objects are counted again once this many times the last count's time has
# passed: the count costs at most 1% of the loop, however many are frozen.
COUNT_SPACING = 100


def decide(last_full: float, frozen: int) -> str | None:
    """``freeze`` after a full collection of ``last_full`` s that was slow, and at every
    look while many objects are frozen (so that a full collection walks only what came
    since the last look); ``thaw`` once ``frozen`` objects (those still alive) are few;
    else None."""
    if last_full > SLOW or frozen >= THAW_BELOW:
        return "freeze"
    if frozen:
        return "thaw"
    return None


def count_due(now: float, counted_at: float | None, took: float) -> bool:
    """Whether a look at ``now`` counts the frozen objects again: the first time, and
    then once ``COUNT_SPACING`` times what the last count took (at ``counted_at``) has
    passed. Between two counts the last one stands: each look still freezes while it
    was many, and a thaw waits for the next count (a count that took 0.1 s comes again
    10 s later)."""
    return counted_at is None or now - counted_at >= COUNT_SPACING * took


class Collector:
    """Times full collections; ``check`` (from the loop, every second) freezes or thaws."""

    def __init__(self) -> None:
        self.last_full = 0.0  # seconds the last full collection took, until acted on
        self.slowest = 0.0
        self.freezes = 0
        self.thaws = 0
        self._started = 0.0
        # The frozen objects alive at the last count, when it was (monotonic), what it took.
        self.frozen = 0
        self.counted_at: float | None = None
        self._count_took = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._on_collection)

    def remove(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            took = time.perf_counter() - self._started
            self.last_full = max(self.last_full, took)
            self.slowest = max(self.slowest, took)

    def _count(self) -> int:
        started = time.perf_counter()
        self.frozen = gc.get_freeze_count()
        self.counted_at = time.monotonic()
        self._count_took = time.perf_counter() - started
        return self.frozen

    def check(self) -> str | None:
        frozen = self.frozen
        if count_due(time.monotonic(), self.counted_at, self._count_took):
            frozen = self._count()
        action = decide(self.last_full, frozen)
        if action == "freeze":
            gc.freeze()
            self.freezes += 1
            if not frozen:
                log.info(
                    "garbage collector: a full collection took %.3f s; the %d objects alive"
                    " are left out of later ones until fewer than %d are left",
                    self.last_full,
                    self._count(),
                    THAW_BELOW,
                )
        elif action == "thaw":
            gc.unfreeze()
            self.frozen = 0
            self.thaws += 1
            log.info("garbage collector: few frozen objects left: collected as before")
        self.last_full = 0.0
        return action

    def status(self) -> dict[str, Any]:
        """What the last look saw: a status asked for many times a second never walks the
        frozen objects (``count_due``)."""
        return {
            "frozen_objects": self.frozen,
            "slowest_full_collection_s": round(self.slowest, 3),
            "freezes": self.freezes,
            "thaws": self.thaws,
        }
