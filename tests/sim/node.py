"""One simulated server of the pair (``Node``) and a replication link between two (``Link``).

Owns: a server's change log, its disk (writes that complete after a delay, an fsync boundary
that kill -9 respects, a write that fails now and then), its confirm release, its roles, and
its feed and follower on one ordered link per subscription. These shells copy
``amqha/replication.py`` and ``Broker`` (``ConfirmPipeline.advance``, ``lead``, ``follow``,
``before_reset``, the unprotected mark) step for step around the protocol's rules, which run
as they are: the feed's ``amqha.core.sync.Leader`` (or a subclass given to ``simulate``),
the follower's ``Eligibility`` and the publisher's confirms ``amqha.core.confirms.Confirms``.

Time, every random choice, the network's deliveries, the faults, who leads, the clients and
the oracle are the ``World``'s (model.py). Must not know: asyncio, sockets, clocks, threads,
files.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amqha.core.confirms import Confirms
from amqha.core.sync import Eligibility, Leader, Phase, SentRun

if TYPE_CHECKING:
    from .model import World

# A change: (kind, message id). RESET starts a snapshot: what a store held is replaced.
ENQ, SETTLE, RESET = 0, 1, 2
Change = tuple[int, int]
ID_BLOCK_BITS = 40  # server.py: a block of 2**40 message ids per (epoch, role)
PRIMARY, BACKUP = 0, 1
START, ACTIVE, PASSIVE = "start", "active", "passive"


class Link:
    """One replication connection, follower to leader: two ordered streams."""

    __slots__ = ("number", "follower", "leader", "to_follower", "to_leader", "open", "arrive")

    def __init__(self, number: int, follower: Node, leader: Node) -> None:
        self.number = number
        self.follower = follower
        self.leader = leader
        self.to_follower: collections.deque[tuple[int, tuple[Any, ...]]] = collections.deque()
        self.to_leader: collections.deque[tuple[int, tuple[Any, ...]]] = collections.deque()
        self.open = True
        self.arrive = [0, 0]  # the last arrival tick each way: TCP keeps the order


class Feed:
    """The ACTIVE's side, as ``replication.Feed``: snapshot, live runs, acks, drop."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.leader: Leader = node.world.leader_class()
        self.link: Link | None = None
        self.snapshot: list[Change] | None = None
        self.snapshot_lsn = 0
        self.pending: collections.deque[tuple[int, list[Change]]] = collections.deque()
        self.next_tag = 1

    def subscribe(self, link: Link) -> None:
        assert self.link is None
        node = self.node
        self.link = link
        self.leader.subscribe()
        self.snapshot_lsn = node.lsn  # the state holds every change logged, taken or not
        self.snapshot = [(RESET, 0)] + [(ENQ, msg_id) for msg_id in node.queue]
        self.pending.clear()
        self.next_tag = 1
        node.world.event(
            f"{node.name} feed: subscribed, snapshot of {len(node.queue)} at {node.lsn}"
        )
        self.push()

    def drop(self, reason: str, cancel: bool = True) -> None:
        link, self.link = self.link, None
        leader = self.leader
        node = self.node
        mark = None
        if leader.in_sync:
            mark = leader.unprotected_from(self._backlog_first_id(), node.next_id)
        was_in_sync = leader.drop()
        self.snapshot = None
        self.pending.clear()
        if link is None:
            return
        if cancel and link.open:
            node.world.send(link, 0, ("cancel",))
        if was_in_sync:
            assert mark is not None
            node.mark_unprotected(True, mark)
            node.feed_sync(False, reason)
        node.world.event(f"{node.name} feed: dropped ({reason})")

    def unsubscribed(self, link: Link) -> None:
        if self.link is link:
            self.drop("the passive's link closed", cancel=False)

    def _backlog_first_id(self) -> int | None:
        for _, changes in self.pending:
            found = _first_msg_id(changes)
            if found is not None:
                return found
        return None

    def live(self, first: int, changes: list[Change]) -> None:
        if self.link is None:
            return
        last = first + len(changes) - 1
        if last <= self.snapshot_lsn:
            return
        if first <= self.snapshot_lsn:
            changes = changes[self.snapshot_lsn - first + 1 :]
            first = self.snapshot_lsn + 1
        self.pending.append((first, changes))
        self.push()

    def push(self) -> None:
        world = self.node.world
        while self.link is not None and len(self.leader.unacked) < world.prefetch:
            if self.snapshot is not None:
                size = world.run_changes
                changes, self.snapshot = self.snapshot[:size], self.snapshot[size:]
                end = not self.snapshot
                if end:
                    self.snapshot = None
                self._send(0, changes, self.snapshot_lsn, end, None)
            elif self.pending:
                first, changes = self.pending[0]
                size = world.run_changes
                if len(changes) > size:
                    self.pending[0] = (first + size, changes[size:])
                    changes = changes[:size]
                else:
                    self.pending.popleft()
                last = first + len(changes) - 1
                self._send(first, changes, last, False, _first_msg_id(changes))
            else:
                return

    def _send(
        self,
        first: int,
        changes: list[Change],
        last: int,
        end: bool,
        first_msg_id: int | None,
        marker: int | None = None,
    ) -> None:
        assert self.link is not None
        tag = self.next_tag
        self.next_tag += 1
        self.leader.sent(tag, SentRun(last, end, first_msg_id, 0.0, len(changes)))
        self.node.world.send(self.link, 0, ("run", tag, first, changes, end, marker))

    def acked(self, link: Link, tag: int) -> None:
        if self.link is not link:
            return
        node = self.node
        leader = self.leader
        before = leader.phase
        synced = leader.acked(tag, False, node.safe_lsn)
        if before is Phase.SNAPSHOT and leader.phase is not Phase.SNAPSHOT:
            node.world.moment("snapshot_acked", node)
        if synced.declared:
            # As ``Feed._declare``: the mark is cleared before the marker goes out.
            node.world.result.in_sync_declared += 1
            node.world.event(f"{node.name} feed: in sync at {leader.sync_lsn}")
            node.feed_sync(True, "in sync")
            self._send(0, [], 0, False, None, leader.sync_lsn)
            node.world.moment("declared", node)
        elif synced.moved:
            node.feed_sync(True, "")
        self.push()


def _first_msg_id(changes: list[Change]) -> int | None:
    for kind, msg_id in changes:
        if kind == ENQ:
            return msg_id
    return None


class Follower:
    """The PASSIVE's side, as ``replication.Follower``: store, ack, the marker."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.eligibility = Eligibility()
        self.link: Link | None = None
        self.connect_at = node.world.tick + 1

    def subscribed(self, link: Link) -> None:
        self.link = link
        self.eligibility.subscribed()

    def ended(self, why: str) -> None:
        if self.eligibility.ended():
            self.node.world.event(f"{self.node.name} follower: not in sync ({why})")

    def close(self, why: str) -> None:
        link, self.link = self.link, None
        if link is not None:
            self.node.world.close(link, why)
        self.connect_at = self.node.world.tick + self.node.world.rng.randint(1, 6)

    def on_message(self, link: Link, message: tuple[Any, ...]) -> None:
        if link is not self.link:
            return
        node = self.node
        world = node.world
        if message[0] == "cancel":
            self.ended("the ACTIVE cancelled")
            self.close("cancelled")
            return
        _, tag, _first, changes, end, marker = message
        if marker is not None:
            world.send(link, 1, ("ack", tag))
            node.incomplete = False  # Broker._follower_sync: clear_incomplete
            if self.eligibility.declared(marker):
                world.event(f"{node.name} follower: eligible at {marker}")
                world.moment("eligible", node)
            return
        if changes and changes[0][0] == RESET:
            self.ended("a new snapshot")
            node.before_reset()
        lsn = node.replicated(changes)

        def stored(ok: bool) -> None:
            if not ok:
                self.ended("the store failed")
                self.close("store failed")
                return
            if link.open and link is self.link:
                world.send(link, 1, ("ack", tag))

        node.when_safe(lsn, stored)


class Node:
    def __init__(self, world: World, index: int) -> None:
        self.world = world
        self.index = index
        self.name = ("primary", "backup")[index]
        # Durable: survives kill -9.
        self.epoch = 0
        self.disk: dict[int, None] = {}
        self.mark: int | None = None
        self.incomplete = False  # the data dir's mark: killed while taking a snapshot
        self.quarantined: list[int] = []
        self.up = True
        self.life = 0
        self.down_since = 0
        self.boot()

    def boot(self) -> None:
        self.life += 1
        self.up_since = self.world.tick
        self.state = START
        self.queue: dict[int, None] = dict.fromkeys(self.disk)
        self.next_id = max(self.disk, default=0) + 1
        self.lsn = 0
        self.store_lsn = 0
        self.safe_lsn = 0
        self.buffer: list[Change] = []
        self.writes: collections.deque[tuple[int, int, int, list[Change], bool]] = (
            collections.deque()
        )
        self.waiting: collections.deque[tuple[int, Callable[[bool], None]]] = collections.deque()
        self.leading = False
        self.feed = Feed(self)
        self.follower: Follower | None = None
        self.confirms = Confirms()
        self.seq_ids: dict[int, int] = {}
        self.delivered: list[int] = []
        self.settles: collections.deque[tuple[int, int]] = collections.deque()
        self.heard_peer = False

    # -- the log and the store -----------------------------------------------------------

    def log_change(self, change: Change) -> int:
        self.lsn += 1
        self.buffer.append(change)
        return self.lsn

    def take_changes(self) -> None:
        """The end of a turn: the changes go to the feed, then to the store."""
        if not self.buffer:
            return
        changes, self.buffer = self.buffer, []
        first = self.lsn - len(changes) + 1
        self.feed.live(first, changes)
        world = self.world
        done = world.tick + world.rng.randint(0, world.disk_delay)
        if self.writes:
            done = max(done, self.writes[-1][0])
        fail = (
            world.tick < world.steps
            and (self.state != ACTIVE or world.active_write_failures)
            and world.rng.random() < world.fail_rate
        )
        self.writes.append((done, first, self.lsn, changes, fail))

    def disk_tick(self) -> None:
        while self.up and self.writes and self.writes[0][0] <= self.world.tick:
            _, first, last, changes, fail = self.writes.popleft()
            if fail:
                self.world.event(f"{self.name} store: write {first}-{last} failed")
            else:
                for kind, msg_id in changes:
                    if kind == ENQ:
                        self.disk[msg_id] = None
                    elif kind == SETTLE:
                        self.disk.pop(msg_id, None)
                    else:
                        self.disk.clear()
            self.stored(last, (first, last) if fail else None)

    def stored(self, last: int, failed: tuple[int, int] | None) -> None:
        self.store_lsn = max(self.store_lsn, last)
        if failed is not None:
            self.refuse_range(*failed)
        self.release_confirms()

    def refuse_range(self, first: int, last: int) -> None:
        """``ConfirmPipeline.refuse``: what waits on a failed write is refused at once."""
        if self.confirms.refuse_range(first, last):
            self.emit_confirms()
        self.settles = collections.deque(
            (lsn, msg_id) for lsn, msg_id in self.settles if not first <= lsn <= last
        )
        refused = [done for lsn, done in self.waiting if first <= lsn <= last]
        self.waiting = collections.deque(
            (lsn, done) for lsn, done in self.waiting if not first <= lsn <= last
        )
        for done in refused:
            done(False)

    def release_confirms(self) -> None:
        """``ConfirmPipeline.advance``: the store's LSN and, gating, the PASSIVE's."""
        safe = self.feed.leader.watermark(self.store_lsn)
        if safe <= self.safe_lsn:
            return
        self.safe_lsn = safe
        world = self.world
        self.confirms.progress(safe)
        self.emit_confirms()
        settles = self.settles
        while settles and settles[0][0] <= safe:
            _, msg_id = settles.popleft()
            world.settle_safe(self, msg_id)
        waiting = self.waiting
        while waiting and waiting[0][0] <= safe:
            _, done = waiting.popleft()
            done(True)

    def emit_confirms(self) -> None:
        seq_ids = self.seq_ids
        for ack, seq, _ in self.confirms.due():
            # In publish order: a multiple ack covers every publish up to ``seq``.
            while seq_ids and next(iter(seq_ids)) <= seq:
                first = next(iter(seq_ids))
                self.world.confirmed(self, seq_ids.pop(first), ack or first != seq)

    def when_safe(self, lsn: int, done: Callable[[bool], None]) -> None:
        if lsn <= self.safe_lsn:
            done(True)
        else:
            self.waiting.append((lsn, done))

    def replicated(self, changes: list[Change]) -> int:
        """Changes from the ACTIVE: applied here, logged, to the store now."""
        for change in changes:
            self.apply(change)
            self.log_change(change)
        self.take_changes()
        return self.lsn

    def apply(self, change: Change) -> None:
        kind, msg_id = change
        if kind == ENQ:
            self.queue[msg_id] = None
            self.next_id = max(self.next_id, msg_id + 1)
        elif kind == SETTLE:
            self.queue.pop(msg_id, None)
        else:
            self.queue.clear()

    # -- roles (Broker.lead / follow / before_reset) ------------------------------------

    def lead(self) -> None:
        self.next_id = max(self.next_id, (self.epoch * 2 + self.index) << ID_BLOCK_BITS)
        self.leading = True
        self.incomplete = False
        follower, self.follower = self.follower, None
        if follower is not None and follower.link is not None:
            self.world.close(follower.link, "leading")
        self.state = ACTIVE
        if not self.feed.leader.in_sync:
            self.mark_unprotected(True)

    def follow(self) -> None:
        self.leading = False
        self.state = PASSIVE
        self.feed.drop("no longer ACTIVE")
        # Step-down closes the clients: what was not confirmed never will be.
        self.confirms = Confirms()
        self.seq_ids.clear()
        self.delivered.clear()
        self.settles.clear()
        self.follower = Follower(self)

    def feed_sync(self, in_sync: bool, reason: str) -> None:
        if reason and in_sync:
            self.mark_unprotected(False)
        self.release_confirms()

    def mark_unprotected(self, unprotected: bool, first_id: int | None = None) -> None:
        if not self.leading:
            return
        if unprotected:
            if self.mark is None:
                self.mark = self.next_id if first_id is None else first_id
                self.world.event(f"{self.name}: unprotected mark {self.mark:#x}")
        elif self.mark is not None:
            self.mark = None
            self.world.event(f"{self.name}: unprotected mark cleared")

    def before_reset(self) -> None:
        self.incomplete = True  # on disk before the snapshot's first change
        mark = self.mark
        if mark is not None:
            kept = [msg_id for msg_id in self.queue if msg_id >= mark]
            self.quarantined += kept
            self.mark = None
            if kept:
                self.world.event(f"{self.name}: quarantined {len(kept)} from {mark:#x}")

    def in_sync_for_pair(self) -> bool:
        """The failover machine's ``in_sync``: a PASSIVE's eligibility; otherwise whether
        its store is whole (not killed while taking a snapshot: the data dir's mark)."""
        if self.state == PASSIVE and self.follower is not None:
            return self.follower.eligibility.in_sync
        return not self.incomplete
