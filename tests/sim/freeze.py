"""A deterministic simulation of the pair's failover under freezes: the rule after a freeze.

Owns: the simulated world of one schedule — two servers, each running the real machine
(``failover/fsm.py``) inside a shell that copies ``FailoverController`` step for step
where it decides (the heartbeat's gap and PAUSED, the fence, the early PAUSED at a
client's Open, stale evidence dropped, the echo of our own sequence numbers, ``serving``);
the state links between them (one ordered stream each way, delays, resets, a link to a
frozen server declared stuck and dropped, reconnection after the thaw within the peer's
connect timeout and backoff); freezes (a server's clock and message handling stop, then
resume with its queued input), kill -9 with the evidence a refused port gives, restarts;
clients knocking at both servers (each knock a client's vote).

The oracle: never two servers serving (ACTIVE, not fenced, able to confirm) in one tick;
never two servers serving in one epoch; after the faults, exactly one serves.

The network is healthy apart from freezes and kills: resets reconnect within a heartbeat
and delays stay below a heartbeat, so a peer is silent for a timeout only when a server
is frozen or dead. (A cut link is Binary Star's unsolvable case: two ACTIVEs by design
without a witness, docs/failover.md, "Partitions".) Freezes are short (the peer never
misses a timeout) or long (the frozen server sees the gap): the band between, where a
server thaws unaware just as its peer's timeout ends, gives a dual active of at most a
network delay that the epoch rule ends, and is left out of the oracle's strict rule.

``old=True`` runs the shell that came before the rule (the fence lifted after a timeout
of silence after the pause, a PASSIVE's clock not restarted): the oracle finds it.

``restarts=True`` runs schedules of kills and fast restarts instead, with no freezes and
no link resets: nothing then excuses two servers serving at once, and the oracle fails
the first tick of it. A restarted primary meets its backup there just as the backup's
clock of its silence runs out; ``old_start=True`` lets it lead on any PASSIVE message,
whether or not the backup has heard this run of it (the rule before the echo,
docs/failover.md, "A restarted primary waits to be heard"), and a restarted backup that
led last likewise on any PRIMARY message: the oracle finds both (the backup's in seeds
348 and 350, the primary voted in meanwhile on the evidence of the backup's death).

Time is a tick counter; every choice comes from ``random.Random(seed)``. Must not know:
asyncio, sockets, clocks, threads, files.
"""

from __future__ import annotations

import collections
import hashlib
import random
from dataclasses import dataclass, field, replace

from failover import fsm

H = 4  # ticks between heartbeats (failover.heartbeat)
T = 12  # failover.timeout
CONNECT = T  # the peering's connect timeout
R = CONNECT + H  # a link to a thawed server is back within its connect timeout and backoff
D = 3  # the longest network delay (less than a heartbeat)
SETTLE_TICKS = 3000

# A state message: the sender's boot and sequence number, its state, and the (boot, seq)
# of the last message it heard from its peer (None: none yet), as the controller sends.
Message = tuple[int, int, fsm.PeerInfo, tuple[int, int] | None]


@dataclass
class FreezeResult:
    seed: int
    failures: list[str]
    trace: str
    freezes: int = 0
    kills: int = 0
    takeovers: int = 0
    fenced: int = 0  # thaws of an ACTIVE that fenced it
    yields: int = 0  # ACTIVE -> PASSIVE
    log: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass
class Link:
    """One state link: ``src`` publishes its state to ``dst``'s amq.peer."""

    src: Server
    dst: Server
    up: bool = False
    was_up: bool = False  # up since start: a refusal is evidence (docs/failover.md)
    reconnect_at: int = 0
    queue: collections.deque[tuple[int, Message]] = field(default_factory=collections.deque)
    last_arrival: int = 0
    dst_silent_since: int = 0  # the last tick dst was not frozen (aiormq's stuck clock)


class Server:
    def __init__(self, world: FreezeWorld, index: int) -> None:
        self.world = world
        self.index = index
        self.role = fsm.Role.PRIMARY if index == 0 else fsm.Role.BACKUP
        self.name = self.role.value
        self.listen = f"{self.name}:5672"
        self.persisted = 0
        self.up = True
        self.frozen_until: int | None = None
        self.down_since = 0
        self.frozen_since = 0
        self.thawed_at: int | None = None  # until the links to it have seen the thaw
        self.boot = 0
        self.start(0)

    def start(self, now: int) -> None:
        self.boot += 1
        self.active_since = -1  # the tick it last became ACTIVE
        self.paused_at: int | None = None  # the tick its last freeze past T was fed in
        self.voted_after_thaw = False  # its fence was lifted by a client's vote (rule c)
        self.machine = replace(
            fsm.Machine.start(self.name, self.role, self.persisted, T, now), reconnect=R
        )
        self.seq = 0
        self.last_seq = 0
        self.peer_boot: int | None = None
        self.peer_seq = -1
        self.last_tick = now
        self.next_tick = now
        self.pauses = 0
        self.pause_pending: tuple[int, int] | None = None
        self.early_pause_tick = -1
        self.early_pending: tuple[int, int] | None = None
        self.evidence: list[int] = []  # PEER_GONE reports queued for the loop: pauses then
        self.inbox_pause: list[int] = []  # on_pause calls queued for the loop
        # The shell that came before the rule.
        self.old_fence = False
        self.old_fence_seq = 0
        self.old_deadline = 0
        self.old_heard = -1

    @property
    def frozen(self) -> bool:
        return self.frozen_until is not None

    def serving(self, now: int) -> bool:
        """FailoverController.serving, for a running server."""
        if not self.up or self.frozen:
            return False
        if self.pause_pending is not None or now - self.last_tick > T:
            return False
        machine = self.machine
        return machine.state is fsm.State.ACTIVE and not machine.fenced and not self.old_fence

    # -- the heartbeat thread -------------------------------------------------------------

    def heartbeat(self, now: int) -> None:
        if now < self.next_tick:
            return
        gap = now - self.last_tick
        if gap > T:
            self.pauses += 1
            if not self.world.old or self.machine.state is fsm.State.ACTIVE:
                self.pause_pending = (gap, self.last_seq + 1)
            self.inbox_pause.append(gap)
        self.last_tick = now
        self.next_tick = now + H
        self.send_state(now)

    def send_state(self, now: int) -> None:
        self.seq += 1
        self.last_seq = self.seq
        link = self.world.link_from(self)
        heard = (self.peer_boot, self.peer_seq) if self.peer_boot is not None else None
        state = fsm.PeerInfo(
            self.name,
            self.role,
            self.machine.state,
            self.machine.epoch,
            self.listen,
            self.machine.in_sync,
        )
        self.world.send(link, (self.boot, self.seq, state, heard), now)

    # -- the broker's loop ----------------------------------------------------------------

    def loop(self, now: int, knock: bool) -> None:
        world = self.world
        for gap in self.inbox_pause:
            self.on_pause(gap, now)
        self.inbox_pause.clear()
        link = world.link_to(self)
        while link.queue and link.queue[0][0] <= now:
            _, message = link.queue.popleft()
            self.on_peer_message(message, now)
        for pauses in self.evidence:
            self.on_peer_gone(pauses, now)
        self.evidence.clear()
        if knock:
            self.admit(now)

    def loop_knock_first(self, now: int) -> None:
        """A client's Open read before anything else the thaw brought."""
        self.admit(now)
        self.loop(now, False)

    def apply(self, outcome: fsm.Outcome, now: int) -> fsm.Decision | None:
        for action in outcome.actions:
            if isinstance(action, fsm.PersistEpoch):
                self.persisted = action.epoch
        before = self.machine.state
        self.machine = outcome.machine
        world = self.world
        for action in outcome.actions:
            if isinstance(action, fsm.Fence):
                world.result.fenced += 1
                self.voted_after_thaw = False
            elif isinstance(action, fsm.Unfence):
                self.voted_after_thaw = isinstance(outcome.decision, fsm.Accept)
                world.event(f"{self.name} serves again: {action.reason}")
        transition = outcome.transition
        if transition is not None:
            world.event(
                f"{self.name} {transition.from_state} -> {transition.to_state} "
                f"epoch {self.machine.epoch}: {transition.reason}"
            )
            if transition.to_state is fsm.State.ACTIVE:
                world.result.takeovers += 1
                self.active_since = now
            if before is fsm.State.ACTIVE:
                world.result.yields += 1
                self.old_fence = False
            self.send_state(now)  # the controller pokes the heartbeat
        return outcome.decision

    def on_pause(self, gap: int, now: int) -> None:
        self.world.event(f"{self.name} paused {gap}")
        self.paused_at = now
        pending = self.pause_pending
        if self.world.old:
            if self.machine.state is fsm.State.ACTIVE and pending is not None:
                self.old_fence = True
                self.old_fence_seq = pending[1]
                self.old_deadline = now + T
                self.old_heard = -1
            self.pause_pending = None
            return
        thaw_seq = pending[1] if pending is not None else self.last_seq + 1
        self.apply(fsm.step(self.machine, fsm.Event.PAUSED, now, thaw_seq=thaw_seq), now)
        if self.pause_pending is pending:
            self.pause_pending = None

    def freeze_unreported(self, now: int) -> bool:
        return now - self.last_tick > T

    def early_pause(self, now: int) -> None:
        """FailoverController._freeze_not_yet_reported."""
        if self.world.old:
            return
        pending = self.pause_pending
        if pending is not None:
            if pending == self.early_pending:
                return
            self.early_pending = pending
            thaw_seq = pending[1]
        elif self.freeze_unreported(now):
            if self.last_tick == self.early_pause_tick:
                return
            self.early_pause_tick = self.last_tick
            thaw_seq = self.last_seq + 1
        else:
            return
        self.paused_at = now
        self.apply(fsm.step(self.machine, fsm.Event.PAUSED, now, thaw_seq=thaw_seq), now)

    def on_peer_message(self, message: Message, now: int) -> None:
        boot, seq, state, heard = message
        if boot == self.peer_boot and seq <= self.peer_seq:
            return
        self.peer_boot, self.peer_seq = boot, seq
        # The last of our messages the peer heard, in this boot of ours (the controller).
        echo = heard[1] if heard is not None and heard[0] == self.boot else 0
        if self.world.old:
            self.old_heard = now
            info = replace(state, echo=0)
        else:
            info = replace(state, echo=echo)
        if self.world.old_start and self.machine.state in (fsm.State.PRIMARY, fsm.State.BACKUP):
            info = replace(info, echo=max(info.echo, 1))  # as if every peer had heard us
        self.apply(fsm.step(self.machine, fsm.PEER_EVENT[info.state], now, info), now)
        if self.world.old and self.old_fence and echo >= self.old_fence_seq:
            self.old_fence = False

    def on_peer_gone(self, pauses: int, now: int) -> None:
        if not self.world.old and (pauses != self.pauses or self.freeze_unreported(now)):
            return
        self.apply(fsm.step(self.machine, fsm.Event.PEER_GONE, now), now)

    def admit(self, now: int) -> None:
        self.early_pause(now)
        self.apply(fsm.step(self.machine, fsm.Event.CLIENT_REQUEST, now), now)

    def old_tick(self, now: int) -> None:
        """The shell before the rule: the fence lifted after a timeout of silence."""
        if self.old_fence and now >= self.old_deadline and self.old_heard < self.old_deadline - T:
            self.old_fence = False


class FreezeWorld:
    def __init__(
        self, seed: int, old: bool = False, restarts: bool = False, old_start: bool = False
    ) -> None:
        self.seed = seed
        self.old = old
        # The schedules of kills and fast restarts (``restarts``): no freezes, so the pair
        # must never have two servers serving at once; ``old_start``: the restarted
        # primary leads on any PASSIVE message, heard or not (the rule before the echo).
        self.restarts = restarts
        self.old_start = old_start
        self.rng = rng = random.Random(seed)
        self.tick = 0
        self.result = FreezeResult(seed, [], "")
        self.hash = hashlib.blake2b(digest_size=16)
        self.keep_log = False
        self.steps = rng.randint(300, 1200)
        self.freeze_rate = rng.choice((0.005, 0.01, 0.03))
        self.long_share = rng.choice((0.3, 0.7, 1.0))
        self.kill_rate = rng.choice((0.0, 0.0, 0.002, 0.005))
        self.restart_rate = rng.choice((0.02, 0.1))
        self.reset_rate = rng.choice((0.0, 0.01, 0.03))
        self.knock_rate = rng.choice((0.1, 0.4, 1.0))
        self.delay = rng.randint(1, D)
        self.stuck = rng.choice((2 * T, 5 * T))  # the peering calls a silent link stuck
        self.closes = rng.choice((T + H, 3 * T))  # a server closes a silent inbound link
        if restarts:
            # Drawn after the rest: the other schedules stay as they were.
            self.freeze_rate = 0.0
            # Nor resets: two in a row may silence a link for a timeout, a cut link.
            self.reset_rate = 0.0
            self.kill_rate = rng.choice((0.005, 0.01, 0.02))
            # Killed, back within a few ticks: often about a timeout, as the backup's
            # clock of its silence runs out (the primary starts in well under a second).
            self.restart_rate = rng.choice((0.1, 0.2, 0.5))
        self.servers = [Server(self, 0), Server(self, 1)]
        a, b = self.servers
        self.links = [Link(a, b), Link(b, a)]
        for link in self.links:
            self.connect(link, 0)
        self.serving_epochs: dict[int, int] = {}
        self.dual_since: int | None = None  # the tick the current dual active began

    # -- the trace ------------------------------------------------------------------------

    def event(self, text: str) -> None:
        line = f"{self.tick} {text}"
        self.hash.update(line.encode())
        if self.keep_log:
            self.result.log.append(line)

    def fail(self, text: str) -> None:
        self.event(f"FAILURE {text}")
        if len(self.result.failures) < 10:
            self.result.failures.append(f"tick {self.tick}: {text}")

    # -- the links ------------------------------------------------------------------------

    def link_from(self, server: Server) -> Link:
        return self.links[server.index]

    def link_to(self, server: Server) -> Link:
        return self.links[1 - server.index]

    def send(self, link: Link, message: Message, now: int) -> None:
        if not link.up:
            return
        at = max(link.last_arrival, now + self.rng.randint(1, self.delay))
        link.last_arrival = at
        link.queue.append((at, message))

    def drop(self, link: Link, why: str, reconnect_at: int) -> None:
        if not link.up:
            return
        link.up = False
        link.queue.clear()
        link.reconnect_at = reconnect_at
        self.event(f"link {link.src.name}->{link.dst.name} down ({why})")

    def connect(self, link: Link, now: int) -> None:
        link.up = True
        link.was_up = True
        link.dst_silent_since = now
        self.event(f"link {link.src.name}->{link.dst.name} up")
        link.src.send_state(now)  # the state goes out the moment the link is up

    def network(self, now: int) -> None:
        rng = self.rng
        for link in self.links:
            src, dst = link.src, link.dst
            if link.up:
                if not src.up:
                    self.drop(link, "reset: we are down", now)
                    continue
                if not dst.up:
                    # A killed server's connections reset; its port refuses from now on.
                    self.drop(link, "reset: the peer is down", now + H)
                    if src.up and link.was_up:
                        src.evidence.append(src.pauses)
                    continue
                if not dst.frozen:
                    link.dst_silent_since = now
                elif now - link.dst_silent_since > self.stuck and not src.frozen:
                    self.drop(link, "stuck: no frame for the stuck limit", now)
                    continue
                if src.frozen and now - src.frozen_since > self.closes and not dst.frozen:
                    self.drop(link, "the peer closed our silent link", now)
                    continue
                if self.reset_rate and rng.random() < self.reset_rate:
                    self.drop(link, "reset", now + rng.randint(1, H))
                continue
            if not src.up or src.frozen or now < link.reconnect_at:
                continue
            if not dst.up:
                link.reconnect_at = now + H
                if link.was_up:
                    src.evidence.append(src.pauses)  # each failed reconnect: refused again
                continue
            if dst.frozen:
                continue  # the handshake waits for the frozen server
            if dst.thawed_at is not None and now == dst.thawed_at:
                # The attempt in flight at the thaw may have been lost (a full backlog
                # drops SYNs): back within the connect timeout and the backoff.
                link.reconnect_at = now + rng.randint(0, R)
                dst.thawed_at = None
                if link.reconnect_at > now:
                    continue
            self.connect(link, now)

    # -- faults ---------------------------------------------------------------------------

    def faults(self, now: int) -> None:
        rng = self.rng
        for server in self.servers:
            if server.frozen and server.frozen_until is not None and now >= server.frozen_until:
                server.frozen_until = None
                server.thawed_at = now
                self.event(f"{server.name} thawed")
        for server in self.servers:
            other = self.servers[1 - server.index]
            if not server.up:
                if now - server.down_since > 2 and rng.random() < self.restart_rate:
                    server.up = True
                    server.frozen_until = None
                    server.start(now)
                    self.event(f"{server.name} restarted, epoch {server.persisted}")
                continue
            if server.frozen:
                continue
            if rng.random() < self.freeze_rate:
                long = rng.random() < self.long_share
                length = rng.randint(T + H + 1, 8 * T) if long else rng.randint(1, T - H - D - 1)
                server.frozen_until = now + length
                server.frozen_since = now
                self.result.freezes += 1
                self.event(f"{server.name} frozen for {length}")
            elif self.kill_rate and rng.random() < self.kill_rate and other.up:
                server.up = False
                server.frozen_until = None
                server.down_since = now
                self.result.kills += 1
                self.event(f"{server.name} killed")

    # -- one schedule ---------------------------------------------------------------------

    def turn(self, faults: bool) -> None:
        now = self.tick
        if faults:
            self.faults(now)
        self.network(now)
        order = list(self.servers)
        self.rng.shuffle(order)
        for server in order:
            if not server.up or server.frozen:
                continue
            knock = self.rng.random() < self.knock_rate
            first = self.rng.random() < 0.3
            # After a thaw the loop and the heartbeat thread race: either may run first.
            if self.rng.random() < 0.5:
                server.heartbeat(now)
            if knock and first:
                server.loop_knock_first(now)
            else:
                server.loop(now, knock)
            server.heartbeat(now)
            if self.old:
                server.old_tick(now)
        self.check(now)
        self.tick += 1

    def check(self, now: int) -> None:
        serving = [s for s in self.servers if s.serving(now)]
        for server in serving:
            epoch = server.machine.epoch
            other = self.serving_epochs.setdefault(epoch, server.index)
            if other != server.index:
                self.fail(f"both servers served in epoch {epoch}")
        if len(serving) < 2:
            self.dual_since = None
            return
        if self.dual_since is None:
            self.dual_since = now
        low, high = sorted(serving, key=lambda s: s.machine.epoch)
        names = f"{low.name} epoch {low.machine.epoch}, {high.name} epoch {high.machine.epoch}"
        if self.restarts and now == self.dual_since:
            # No freeze, no cut link: nothing excuses it. The lower epoch yields once it
            # hears the other, and what it confirmed meanwhile ends in its quarantine.
            self.fail(f"two servers serving at once without a freeze: {names}")
        if (
            low.paused_at is not None
            and low.paused_at >= high.active_since
            and not low.voted_after_thaw
        ):
            self.fail(f"a server thawed after its peer took over serves beside it: {names}")
        newer, older = sorted(serving, key=lambda s: s.active_since, reverse=True)
        if (
            newer.paused_at is not None
            and older.active_since <= newer.paused_at
            and 0 <= newer.active_since - newer.paused_at < T + R
        ):
            self.fail(f"voted in on silence across its freeze beside a serving peer: {names}")
        if now - self.dual_since > R + H + 2 * D:
            self.fail(f"two servers serving for {now - self.dual_since} ticks: {names}")

    def run(self) -> FreezeResult:
        self.event(f"seed {self.seed}")
        while self.tick < self.steps:
            self.turn(True)
        for server in self.servers:
            if server.frozen:
                server.frozen_until = None
                server.thawed_at = self.tick
                self.event(f"{server.name} thawed")
        for server in self.servers:
            if not server.up:
                server.up = True
                server.start(self.tick)
                self.event(f"{server.name} restarted, epoch {server.persisted}")
        settled = 0
        for _ in range(SETTLE_TICKS):
            self.turn(False)
            states = sorted(s.machine.state.value for s in self.servers)
            if states == ["ACTIVE", "PASSIVE"] and any(s.serving(self.tick) for s in self.servers):
                settled += 1
                if settled > 4 * T:
                    break
            else:
                settled = 0
        else:
            states = [(s.name, s.machine.state.value, s.machine.fenced) for s in self.servers]
            self.fail(f"no single serving ACTIVE after the faults: {states}")
        self.result.trace = self.hash.hexdigest()
        return self.result


def simulate_freezes(
    seed: int, old: bool = False, log: bool = False, restarts: bool = False, old_start: bool = False
) -> FreezeResult:
    """Run one schedule of freezes (or, ``restarts``, of kills and fast restarts): ``seed``
    decides everything."""
    world = FreezeWorld(seed, old, restarts, old_start)
    world.keep_log = log
    return world.run()
