"""Priority queues: a queue declared with ``x-max-priority`` above 0.

Owns: ``PriorityQueue``, one ``Lane`` per message priority in use (each kept as a plain
queue keeps its ready side), which lane's head is the queue's, and what Redelivered
means when deliveries are not in id order (see ``PriorityQueue``; docs/compat.md,
"Queue extensions: priorities and single active consumer").

Must not know: channels or sockets, the clock (``now`` is passed in), where dead letters
go, the store: as ``queue``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from . import release
from .changes import ChangeLog, Settled
from .dedup import in_id_order
from .message import Message
from .queue import Queue


class Lane:
    """The messages of one priority, kept as a plain queue keeps its ready side: the
    never-delivered ones in id order (with their deadlines once one has a deadline) and
    the returned ones in a heap by id; the head is whichever has the lower id."""

    __slots__ = ("ready", "expiries", "returned")

    # Lanes alive in this process: the memory watermark counts each (a lane lives only
    # while it holds a message, but one message may cost a lane on its own).
    held: ClassVar[int] = 0

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

    def let_go(self) -> None:
        """Empty the lane, its messages handed to ``release`` (freed a slice a turn if
        many) rather than freed in this call."""
        release.later(self.ready)
        self.ready = deque()
        if self.expiries is not None:
            release.later(self.expiries)
            self.expiries = None
        release.later(self.returned)
        self.returned = []

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

    def holds(self, msg_id: int) -> bool:
        if msg_id in self.outstanding:
            return True
        return any(
            in_id_order(lane.ready, msg_id) or any(e[0] == msg_id for e in lane.returned)
            for lane in self.lanes.values()
        )

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
        if len(wanted) >= self.count > release.AT_ONCE and all(
            message.msg_id in wanted
            for lane in self.lanes.values()
            for message, _ in lane.entries()
        ):
            # Every message of every lane (the ACTIVE purged the queue): let go of the
            # lanes whole, as ``Queue.discard`` lets go of its ready messages.
            self._clear_lanes()
            return
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
        for lane in self.lanes.values():
            lane.let_go()
        self.lanes = {}
        self._top = 0
        self.count = 0
        self.bytes = 0

    def messages(self) -> Iterator[tuple[Message, float | None]]:
        found = [
            (m, None if d == math.inf else d)
            for lane in self.lanes.values()
            for m, d in lane.entries()
        ]
        found += [(m, self.outstanding_deadlines.get(i)) for i, m in self.outstanding.items()]
        found.sort(key=lambda pair: pair[0].msg_id)
        return iter(found)
