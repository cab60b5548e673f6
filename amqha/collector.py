"""Python's cyclic garbage collector, kept from pausing a server that holds millions of
messages (docs/performance.md, "The garbage collector").

Owns: timing each full collection (``gc.callbacks``), freezing the objects that outlive a
slow one (``gc.freeze``: later collections leave them out) and, from then on, what is
alive at each look (once a second), and thawing them (``gc.unfreeze``) once few are
left. ``decide`` is the rule, pure; ``Collector`` applies it when the broker's loop asks
(``check``).

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


class Collector:
    """Times full collections; ``check`` (from the loop, every second) freezes or thaws."""

    def __init__(self) -> None:
        self.last_full = 0.0  # seconds the last full collection took, until acted on
        self.slowest = 0.0
        self.freezes = 0
        self.thaws = 0
        self._started = 0.0

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

    def check(self) -> str | None:
        action = decide(self.last_full, gc.get_freeze_count())
        if action == "freeze":
            first = not gc.get_freeze_count()
            gc.freeze()
            self.freezes += 1
            if first:
                log.info(
                    "garbage collector: a full collection took %.3f s; the %d objects alive"
                    " are left out of later ones until fewer than %d are left",
                    self.last_full,
                    gc.get_freeze_count(),
                    THAW_BELOW,
                )
        elif action == "thaw":
            gc.unfreeze()
            self.thaws += 1
            log.info("garbage collector: few frozen objects left: collected as before")
        self.last_full = 0.0
        return action

    def status(self) -> dict[str, Any]:
        return {
            "frozen_objects": gc.get_freeze_count(),
            "slowest_full_collection_s": round(self.slowest, 3),
            "freezes": self.freezes,
            "thaws": self.thaws,
        }
