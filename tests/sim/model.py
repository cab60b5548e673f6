"""A deterministic simulation of a pair running the replication protocol.

Owns: the simulated world of one schedule — two servers (``node.py``: each with a change
log, a disk, its feed and its follower), one ordered link per subscription (delays; a drop
loses what is in flight), kill -9 and restart, the pair's choice of who leads (after
``failover/fsm.py``'s table), a confirming publisher and an acking consumer, and the oracle
that checks what the clients were told against what the pair ends with.

The protocol's rules are not modelled but run: each server's feed uses
``amqha.core.sync.Leader`` (or a subclass given to ``simulate``), its follower
``Eligibility``, and its publisher's confirms ``amqha.core.confirms.Confirms``. The
shells around them (node.py) copy ``amqha/replication.py`` and ``Broker`` step for step.

Time is a tick counter and every choice comes from ``random.Random(seed)``: one seed is
one schedule, and running it again gives the same trace (``Result.trace``). Must not
know: asyncio, sockets, clocks, threads, files.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from amqha.core.sync import Leader
from failover.fsm import Role, next_epoch

from .node import ACTIVE, BACKUP, ENQ, PASSIVE, PRIMARY, SETTLE, START, Link, Node

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
