"""One loop timer for every queue's message TTL and x-expires (docs/limits.md).

Owns: a heap keyed on each queue's next due time, so idle queues cost nothing.

Must not know: frames, the broker beyond the callback it is given.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable

from .core.queue import Queue
from .logtext import escaped

log = logging.getLogger("amqha.server")


class QueueTimers:
    """One loop timer for all queues: a heap of (due, queue), the earliest armed.

    A queue is pushed when its due time may have moved earlier (``schedule``); an entry
    that no longer matches the queue's ``timer_due`` is stale and skipped. Work is
    proportional to what falls due, never to the number of queues.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_due: Callable[[Queue, float], None],
        clock: Callable[[], float],
    ) -> None:
        self.loop = loop
        self.on_due = on_due
        # Due times are on this clock (the wall clock, as deadlines are); the loop's timer
        # is armed for the same moment on its own clock.
        self.clock = clock
        self.heap: list[tuple[float, int, Queue]] = []
        self.order = itertools.count()
        self.handle: asyncio.TimerHandle | None = None
        self.armed_for = 0.0

    def schedule(self, queue: Queue) -> None:
        due = queue.next_due()
        if due is None or queue.deleted:
            return
        if queue.timer_due is not None and queue.timer_due <= due:
            return
        queue.timer_due = due
        heapq.heappush(self.heap, (due, next(self.order), queue))
        if self.handle is None or due < self.armed_for:
            self._arm(due)

    def _arm(self, due: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed_for = due
        self.handle = self.loop.call_later(max(0.0, due - self.clock()), self._fire)

    def _fire(self) -> None:
        self.handle = None
        heap = self.heap
        now = self.clock()
        due_now = []
        while heap and heap[0][0] <= now:
            due, _, queue = heapq.heappop(heap)
            if queue.timer_due == due and not queue.deleted:
                queue.timer_due = None
                due_now.append(queue)
        # Rescheduled only after the pass: a message that expires strictly after ``now``
        # is due again at once, and must wait for the next turn of the loop.
        for queue in due_now:
            try:
                self.on_due(queue, now)
            except Exception:
                log.exception(
                    "timer of queue '%s' failed; it is retried in 1 s", escaped(queue.name)
                )
                queue.timer_due = now + 1.0
                heapq.heappush(heap, (now + 1.0, next(self.order), queue))
                continue
            self.schedule(queue)
        if heap and (self.handle is None or heap[0][0] < self.armed_for):
            self._arm(heap[0][0])

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
