"""A deterministic simulation of a pair running the replication protocol.

Owns: the simulated world of one schedule — two servers, each with a change log, a disk
(writes that complete after a delay, an fsync boundary that kill -9 respects, a write
that fails now and then), the feed and the follower on one ordered link per
subscription (delays; a drop loses what is in flight), the pair's choice of who leads
(after ``failover/fsm.py``'s table), a confirming publisher and an acking consumer, and
the oracle that checks what the clients were told against what the pair ends with.

The protocol's rules are not modelled but run: each server's feed uses
``amqha.core.sync.Leader`` (or a subclass given to ``simulate``), its follower
``Eligibility``, and its publisher's confirms ``amqha.core.confirms.Confirms``. The
shells around them copy ``amqha/replication.py`` and ``Broker`` (``ConfirmPipeline.advance``,
``lead``, ``follow``, ``before_reset``, the unprotected mark) step for step.

Time is a tick counter and every choice comes from ``random.Random(seed)``: one seed is
one schedule, and running it again gives the same trace (``Result.trace``). Must not
know: asyncio, sockets, clocks, threads, files.
"""

from __future__ import annotations

import collections
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amqha.core.confirms import Confirms
from amqha.core.sync import Eligibility, Leader, Phase, SentRun
from failover.fsm import Role, next_epoch

# A change: (kind, message id). RESET starts a snapshot: what a store held is replaced.
ENQ, SETTLE, RESET = 0, 1, 2
Change = tuple[int, int]
ID_BLOCK_BITS = 40  # server.py: a block of 2**40 message ids per (epoch, role)
PRIMARY, BACKUP = 0, 1
START, ACTIVE, PASSIVE = "start", "active", "passive"
TIMEOUT = 6  # ticks of silence before a client vote may take over (failover.timeout)
DRAIN_TICKS = 5000  # after the faults, at most: the pair settles, the disks and links drain


@dataclass
class Result:
    seed: int
    failures: list[str]
    trace: str  # a hash of every event, in order
    ticks: int = 0
    confirmed: int = 0
    nacked: int = 0
    lost: int = 0
    quarantined: int = 0  # confirmed, missing from the ACTIVE, kept in a quarantine file
    returned_in_flight: int = 0  # acked by the consumer, back: the ack was not safe yet
    returned_unprotected: int = 0  # acked while the ACTIVE confirmed alone, back
    failovers: int = 0
    kills: int = 0
    in_sync_declared: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


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
            self._send(0, [], 0, False, None, leader.sync_lsn)
            node.world.result.in_sync_declared += 1
            node.world.event(f"{node.name} feed: in sync at {leader.sync_lsn}")
            node.feed_sync(True, "in sync")
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


class World:
    def __init__(
        self,
        seed: int,
        leader_class: type[Leader],
        double_failures: bool = False,
        active_write_failures: bool = False,
        evidence: bool = False,
    ) -> None:
        self.seed = seed
        # A killed server's port refuses at once (docs/failover.md, "Evidence"): its peer
        # counts it lost on the next tick instead of after TIMEOUT ticks.
        self.lost_after = 1 if evidence else TIMEOUT
        # Kill a server while its peer is down too; fail writes on the ACTIVE's disk
        # (docs/durability.md, "The simulator": what each of these finds).
        self.double_failures = double_failures
        self.active_write_failures = active_write_failures
        self.rng = rng = random.Random(seed)
        self.leader_class = leader_class
        self.tick = 0
        self.result = Result(seed, [], "")
        self.hash = hashlib.blake2b(digest_size=16)
        self.keep_log = False
        # The schedule's shape.
        self.steps = rng.randint(150, 400)
        self.prefetch = rng.choice((1, 2, 3, 4, 16))
        self.run_changes = rng.choice((1, 2, 3, 5, 8))
        self.disk_delay = rng.choice((0, 1, 2, 4, 8))
        self.net_delay = rng.choice((1, 2, 3, 6))
        self.fail_rate = rng.choice((0.0, 0.0, 0.002, 0.01))
        self.kill_rate = rng.choice((0.0, 0.003, 0.01, 0.03))
        self.drop_rate = rng.choice((0.0, 0.003, 0.01, 0.03))
        self.publish_rate = rng.choice((0.3, 0.6, 1.0))
        self.burst = rng.choice((1, 2, 4, 8))
        self.consume_rate = rng.choice((0.0, 0.2, 0.5))
        self.queue_cap = rng.choice((10, 30, 60))  # publishers wait while the queue is this long
        self.window = rng.choice((2, 8, 32))  # and while this many publishes are unconfirmed
        self.restart_rate = rng.choice((0.02, 0.1, 0.3))
        # Kill at the protocol's moments (snapshot acked, in sync declared, eligible).
        self.moment_kill = rng.choice((0.0, 0.3, 0.7, 1.0))
        self.kill_at: list[tuple[int, int]] = []  # (tick, node index)
        self.nodes = [Node(self, PRIMARY), Node(self, BACKUP)]
        self.links: list[Link] = []
        self.link_count = 0
        self.closing: list[tuple[int, Link, int]] = []  # (tick, link, side): who notices
        # The oracle's records.
        self.published: set[int] = set()
        self.confirmed_ids: dict[int, tuple[int, int]] = {}  # id -> (node, epoch)
        self.epoch_confirmer: dict[int, int] = {}
        self.acked: dict[int, int] = {}  # id -> 0 in flight, 1 safe alone, 2 safe on both
        self.consumed: set[int] = set()

    # -- the trace ------------------------------------------------------------------------

    def event(self, text: str) -> None:
        line = f"{self.tick} {text}"
        self.hash.update(line.encode())
        if self.keep_log:
            self.result.log.append(line)

    def note(self, text: str) -> None:
        """Detail for a replayed schedule's log only (not in the trace's hash)."""
        if self.keep_log:
            self.result.log.append(f"{self.tick}   {text}")

    def fail(self, text: str) -> None:
        self.event(f"FAILURE {text}")
        if len(self.result.failures) < 20:
            self.result.failures.append(f"tick {self.tick}: {text}")

    def moment(self, what: str, node: Node) -> None:
        """A moment the old rule got wrong: kill the ACTIVE (or the PASSIVE) soon."""
        if self.tick >= self.steps or self.rng.random() >= self.moment_kill:
            return
        active = node if node.state == ACTIVE else self.nodes[1 - node.index]
        victim = active if self.rng.random() < 0.8 else self.nodes[1 - active.index]
        self.kill_at.append((self.tick + self.rng.randint(0, 4), victim.index))

    # -- the network ----------------------------------------------------------------------

    def send(self, link: Link, way: int, message: tuple[Any, ...]) -> None:
        if not link.open:
            return
        at = max(link.arrive[way], self.tick + self.rng.randint(1, self.net_delay))
        link.arrive[way] = at
        (link.to_follower if way == 0 else link.to_leader).append((at, message))

    def close(self, link: Link, why: str) -> None:
        """The connection is gone: what is in flight is lost; each side notices soon."""
        if not link.open:
            return
        link.open = False
        link.to_follower.clear()
        link.to_leader.clear()
        self.event(f"link {link.number} closed ({why})")
        for side in (0, 1):
            self.closing.append((self.tick + self.rng.randint(0, 3), link, side))

    def connect(self, follower_node: Node) -> None:
        follower = follower_node.follower
        assert follower is not None
        peer = self.nodes[1 - follower_node.index]
        if not peer.up or peer.state != ACTIVE or peer.feed.link is not None:
            # Refused (not ACTIVE, or a subscriber still live): try again later.
            follower.connect_at = self.tick + self.rng.randint(1, 4)
            return
        self.link_count += 1
        link = Link(self.link_count, follower_node, peer)
        self.links.append(link)
        self.event(f"link {link.number}: {follower_node.name} subscribes to {peer.name}")
        follower.subscribed(link)
        peer.feed.subscribe(link)

    def network_tick(self) -> None:
        for link in list(self.links):
            while link.open and link.to_follower and link.to_follower[0][0] <= self.tick:
                _, message = link.to_follower.popleft()
                follower = link.follower.follower
                if link.follower.up and follower is not None:
                    follower.on_message(link, message)
            while link.open and link.to_leader and link.to_leader[0][0] <= self.tick:
                _, message = link.to_leader.popleft()
                if link.leader.up:
                    link.leader.feed.acked(link, message[1])
        due = [entry for entry in self.closing if entry[0] <= self.tick]
        self.closing = [entry for entry in self.closing if entry[0] > self.tick]
        for _, link, side in due:
            if side == 0 and link.leader.up:
                link.leader.feed.unsubscribed(link)
            elif side == 1 and link.follower.up:
                follower = link.follower.follower
                if follower is not None and follower.link is link:
                    follower.link = None
                    follower.connect_at = self.tick + self.rng.randint(1, 6)
        self.links = [link for link in self.links if link.open]
        for node in self.nodes:
            follower = node.follower
            if (
                node.up
                and follower is not None
                and follower.link is None
                and follower.connect_at <= self.tick
            ):
                self.connect(node)

    # -- faults ---------------------------------------------------------------------------

    def kill(self, node: Node) -> None:
        if not node.up:
            return
        peer = self.nodes[1 - node.index]
        if not self.double_failures and not (peer.up and peer.state != START):
            return  # one server down (or still starting) at a time
        self.result.kills += 1
        self.event(f"kill -9 {node.name} ({node.state}, epoch {node.epoch})")
        node.up = False
        node.down_since = self.tick
        for link in list(self.links):
            if link.follower is node or link.leader is node:
                self.close(link, f"{node.name} killed")

    def restart(self, node: Node) -> None:
        node.up = True
        node.boot()
        self.event(f"restart {node.name}: {len(node.disk)} on disk, epoch {node.epoch}")

    def faults(self) -> None:
        rng = self.rng
        due = [index for at, index in self.kill_at if at <= self.tick]
        self.kill_at = [(at, index) for at, index in self.kill_at if at > self.tick]
        for index in due:
            self.kill(self.nodes[index])
        for node in self.nodes:
            if node.up:
                if rng.random() < self.kill_rate:
                    self.kill(node)
            elif self.tick - node.down_since > 2 and rng.random() < self.restart_rate:
                self.restart(node)
        if self.links and rng.random() < self.drop_rate:
            self.close(self.links[rng.randrange(len(self.links))], "dropped")

    # -- the pair (failover/fsm.py's table, for these events) ----------------------------

    def silent(self, node: Node, peer: Node) -> bool:
        return not peer.up and self.tick - max(peer.down_since, node.up_since) >= self.lost_after

    def pair_tick(self) -> None:
        for node in self.nodes:
            if not node.up:
                continue
            peer = self.nodes[1 - node.index]
            if peer.up:
                node.epoch = max(node.epoch, peer.epoch)  # epoch adoption
                node.heard_peer = True
            self.decide(node, peer)

    def decide(self, node: Node, peer: Node) -> None:
        if node.state == START:
            if peer.up and peer.state == ACTIVE:
                self.become_passive(node, "the peer is ACTIVE")
            elif peer.up and peer.state == PASSIVE:
                if node.index == PRIMARY:
                    if node.in_sync_for_pair():
                        self.become_active(node, "PRIMARY + PEER_PASSIVE")
                elif not peer.in_sync_for_pair() and node.in_sync_for_pair():
                    self.become_active(node, "the primary is PASSIVE and not in sync")
            elif peer.up and peer.state == START:
                if node.index == PRIMARY:
                    if node.in_sync_for_pair():
                        self.become_active(node, "PRIMARY + PEER_BACKUP")
                elif not peer.in_sync_for_pair() and node.in_sync_for_pair():
                    self.become_active(node, "BACKUP + PEER_PRIMARY, the primary incomplete")
            elif self.silent(node, peer) and node.index == PRIMARY and node.in_sync_for_pair():
                self.become_active(node, "client vote, peer silent")
        elif node.state == PASSIVE:
            if peer.up and peer.state == START and peer.index == BACKUP:
                if node.in_sync_for_pair():
                    self.become_active(node, "PASSIVE + PEER_BACKUP")
            elif peer.up and peer.state == START and peer.index == PRIMARY:
                if not peer.in_sync_for_pair() and node.in_sync_for_pair():
                    self.become_active(node, "PASSIVE + PEER_PRIMARY, the primary incomplete")
            elif peer.up and peer.state == PASSIVE:
                mine, theirs = node.in_sync_for_pair(), peer.in_sync_for_pair()
                if (mine and not theirs) or (mine == theirs and node.index == PRIMARY):
                    self.become_active(node, "both PASSIVE")
            elif self.silent(node, peer) and node.in_sync_for_pair():
                self.become_active(node, "client vote, peer silent, in sync")
        elif (
            peer.up and peer.state == ACTIVE and (node.epoch, peer.index) < (peer.epoch, node.index)
        ):
            self.become_passive(node, "dual active: the peer stays")

    def become_active(self, node: Node, why: str) -> None:
        role = Role.PRIMARY if node.index == PRIMARY else Role.BACKUP
        node.epoch = next_epoch(role, node.epoch)  # failover/fsm.py's rule
        if node.state == PASSIVE:
            self.result.failovers += 1
        self.event(f"{node.name} ACTIVE in epoch {node.epoch} ({why})")
        node.lead()

    def become_passive(self, node: Node, why: str) -> None:
        self.event(f"{node.name} PASSIVE ({why})")
        node.follow()

    # -- the clients ----------------------------------------------------------------------

    def clients_tick(self) -> None:
        rng = self.rng
        for node in self.nodes:
            if not (node.up and node.state == ACTIVE):
                continue
            if rng.random() < self.publish_rate:
                room = min(self.queue_cap - len(node.queue), self.window - len(node.seq_ids))
                for _ in range(min(rng.randint(1, self.burst), room)):
                    self.publish(node)
            if rng.random() < self.consume_rate:
                self.deliver(node)
            if node.delivered and rng.random() < self.consume_rate:
                self.consumer_ack(node, node.delivered.pop(rng.randrange(len(node.delivered))))

    def publish(self, node: Node) -> None:
        msg_id = node.next_id
        node.next_id += 1
        if msg_id in self.published:
            self.fail(f"{node.name} gave out message id {msg_id:#x} twice")
        self.published.add(msg_id)
        node.queue[msg_id] = None
        lsn = node.log_change((ENQ, msg_id))
        seq = node.confirms.publish()
        node.confirms.wait_for(seq, lsn)
        node.seq_ids[seq] = msg_id

    def deliver(self, node: Node) -> None:
        for msg_id in node.queue:
            if msg_id not in node.delivered:
                break
        else:
            return
        node.delivered.append(msg_id)
        state = self.acked.get(msg_id)
        if state is not None:
            self.returned(msg_id, state, f"delivered again by {node.name}")

    def returned(self, msg_id: int, state: int, where: str) -> None:
        if state == 2:
            self.fail(f"message {msg_id:#x}, acked once both servers had the ack, {where}")
        elif state == 1:
            self.result.returned_unprotected += 1
        else:
            self.result.returned_in_flight += 1
        self.acked[msg_id] = 0  # counted once

    def consumer_ack(self, node: Node, msg_id: int) -> None:
        if msg_id not in node.queue:
            return
        del node.queue[msg_id]
        lsn = node.log_change((SETTLE, msg_id))
        self.consumed.add(msg_id)
        self.acked.setdefault(msg_id, 0)
        node.settles.append((lsn, msg_id))
        self.note(f"{node.name}: consumer acks {msg_id:#x} at LSN {lsn}")

    def confirmed(self, node: Node, msg_id: int, ack: bool) -> None:
        if not ack:
            self.result.nacked += 1
            return
        self.result.confirmed += 1
        self.confirmed_ids[msg_id] = (node.index, node.epoch)
        other = self.epoch_confirmer.setdefault(node.epoch, node.index)
        if other != node.index:
            self.fail(f"both servers confirmed in epoch {node.epoch}")

    def settle_safe(self, node: Node, msg_id: int) -> None:
        if self.acked.get(msg_id) == 0:
            self.acked[msg_id] = 2 if node.feed.leader.in_sync else 1
            self.note(f"{node.name}: ack of {msg_id:#x} safe, state {self.acked[msg_id]}")

    # -- one schedule ---------------------------------------------------------------------

    def turn(self, faults: bool) -> None:
        if faults:
            self.faults()
        self.pair_tick()
        if faults:
            self.clients_tick()
        for node in self.nodes:
            if node.up:
                node.take_changes()
        for node in self.nodes:
            node.disk_tick()
        self.network_tick()
        self.tick += 1

    def settled(self) -> bool:
        active = [n for n in self.nodes if n.up and n.state == ACTIVE]
        if len(active) != 1:
            return False
        passive = self.nodes[1 - active[0].index]
        return (
            passive.up
            and passive.follower is not None
            and passive.follower.eligibility.in_sync
            and not any(n.writes or n.buffer for n in self.nodes)
            and not any(link.to_follower or link.to_leader for link in self.links)
        )

    def run(self) -> Result:
        self.event(f"seed {self.seed}")
        while self.tick < self.steps:
            self.turn(True)
        self.kill_at.clear()
        for node in self.nodes:
            if not node.up:
                self.restart(node)
        for _ in range(DRAIN_TICKS):
            if self.settled():
                break
            self.turn(False)
        self.check()
        result = self.result
        result.ticks = self.tick
        result.trace = self.hash.hexdigest()
        return result

    def check(self) -> None:
        """The oracle, once the pair has settled after the faults."""
        active = [n for n in self.nodes if n.up and n.state == ACTIVE]
        if len(active) != 1:
            self.fail(f"no single ACTIVE after the faults: {[n.state for n in self.nodes]}")
            return
        if not self.settled():
            self.fail("the PASSIVE did not get in sync after the faults")
        queue = active[0].queue
        quarantined = {msg_id for node in self.nodes for msg_id in node.quarantined}
        for msg_id in self.confirmed_ids:
            if msg_id in queue or msg_id in self.consumed:
                continue
            if msg_id in quarantined:
                self.result.quarantined += 1
                continue
            self.result.lost += 1
            node, epoch = self.confirmed_ids[msg_id]
            self.fail(
                f"confirmed message {msg_id:#x} (by {self.nodes[node].name} in epoch {epoch}) lost"
            )
        for msg_id in queue:
            if msg_id not in self.published:
                self.fail(f"message {msg_id:#x} was never published")
            state = self.acked.get(msg_id)
            if state:
                self.returned(msg_id, state, "on the ACTIVE at the end")


def simulate(
    seed: int,
    leader_class: type[Leader] = Leader,
    log: bool = False,
    double_failures: bool = False,
    active_write_failures: bool = False,
    evidence: bool = False,
) -> Result:
    """Run one schedule: ``seed`` decides everything."""
    world = World(seed, leader_class, double_failures, active_write_failures, evidence)
    world.keep_log = log
    return world.run()
