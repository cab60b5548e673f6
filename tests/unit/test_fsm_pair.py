"""Two failover state machines run against each other over a simulated peer link with a
fake clock (no event loop, no sleeping): start orders, crashes, cuts, failback, misconfigured
pairs and any interleaving of them (hypothesis); then which of the two leads when one is not
in sync, and the epochs each role leads in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failover.fsm import (
    PEER_EVENT,
    Accept,
    Action,
    Decision,
    Event,
    LogDualActive,
    LogMisconfigured,
    Machine,
    Outcome,
    PeerInfo,
    PersistEpoch,
    Redirect,
    RedirectClients,
    Refuse,
    Role,
    SendHandover,
    State,
    next_epoch,
    step,
)
from tests.unit.fsm_support import HEARTBEAT, LISTEN, TIMEOUT, hear, ours, peer

# --- two machines against each other --------------------------------------------------------

HANDOVER_MESSAGE = "HANDOVER"


@dataclass(frozen=True)
class StateMessage:
    """A state message on the wire: the sender's state, its boot and sequence number, and
    the last (boot, seq) it heard from its peer (None: none yet), as the controller sends."""

    info: PeerInfo
    boot: int
    seq: int
    heard: tuple[int, int] | None


@dataclass
class Server:
    """One server as its controller would drive it: the machine plus the effects of actions."""

    name: str
    role: Role
    listen: str
    machine: Machine
    persisted: int = 0
    alive: bool = True
    clients: int = 0
    inbox: list[StateMessage | str] = field(default_factory=list)
    reports: list[Action] = field(default_factory=list)
    boot: int = 1  # one per run: a restart takes the next
    seq: int = 0
    heard: tuple[int, int] | None = None  # the peer's last (boot, seq) received

    def state_message(self) -> StateMessage:
        machine = self.machine
        self.seq += 1
        info = PeerInfo(
            self.name, self.role, machine.state, machine.epoch, self.listen, machine.in_sync
        )
        return StateMessage(info, self.boot, self.seq, self.heard)


class PeerLink:
    """Two servers, a fake monotonic clock and the peer link between them.

    Every heartbeat each running server publishes its state to the other (both messages are
    taken before either is delivered, so they cross on the wire) unless the link is cut.
    Messages in flight are lost when the link is cut or their receiver crashes.

    After every step it checks: epochs never fall; a server persists its epoch before it
    serves or publishes it; a server leaving ACTIVE has redirected its clients; and once a
    heartbeat has crossed the link both ways since the last cut or crash, at most one server
    is ACTIVE.
    """

    def __init__(
        self,
        *servers: tuple[str, Role],
        started: bool = True,
        wire_names: dict[str, str] | None = None,
    ) -> None:
        # Servers are keyed by a label; `wire_names` lets two of them claim the same name.
        self.now = 0.0
        self.up = True
        self.exchanged = False
        self.servers: dict[str, Server] = {}
        for label, role in servers:
            name = (wire_names or {}).get(label, label)
            listen = LISTEN.get(label, f"{label}.example:5670")
            machine = self._fresh(name, role, 0)
            self.servers[label] = Server(name, role, listen, machine, alive=started)

    def _fresh(self, name: str, role: Role, epoch: int) -> Machine:
        return Machine.start(name, role, epoch, TIMEOUT, self.now)

    def __getitem__(self, name: str) -> Server:
        return self.servers[name]

    def other(self, server: Server) -> Server:
        (other,) = (s for s in self.servers.values() if s is not server)
        return other

    def states(self) -> dict[str, State | None]:
        return {label: s.machine.state if s.alive else None for label, s in self.servers.items()}

    def running(self) -> list[Server]:
        return [s for s in self.servers.values() if s.alive]

    # Operations: each returns what a client or console would see, then checks invariants.

    def tick(self, heartbeats: int = 1) -> None:
        for _ in range(heartbeats):
            self.now += HEARTBEAT
            running = self.running()
            crossing = self.up and len(running) == 2
            if crossing:
                messages = [(self.other(s), s.state_message()) for s in running]
                for receiver, message in messages:
                    receiver.inbox.append(message)
            for server in running:
                self._deliver(server)
            if crossing:
                # A PASSIVE that heard its ACTIVE across the link catches up within the
                # heartbeat (replication is not modelled: its controller is told so).
                for server in running:
                    peer = server.machine.peer
                    if (
                        server.machine.state is State.PASSIVE
                        and peer
                        and peer.state is State.ACTIVE
                    ):
                        server.machine = replace(server.machine, in_sync=True)
            self.exchanged = self.exchanged or crossing
            self._check()

    def client(self, name: str) -> Decision | None:
        server = self[name]
        if not server.alive:
            return None
        outcome = self._apply(server, step(server.machine, Event.CLIENT_REQUEST, self.now))
        if isinstance(outcome.decision, Accept):
            assert server.persisted == server.machine.epoch, "served before persisting"
            server.clients += 1
        return outcome.decision

    def recover(self, name: str) -> Decision | None:
        server = self[name]
        if not server.alive:
            return None
        return self._apply(server, step(server.machine, Event.MANUAL_RECOVER, self.now)).decision

    def crash(self, name: str) -> None:
        server = self[name]
        server.alive = False
        server.inbox.clear()
        server.clients = 0
        self.exchanged = False
        self._check()

    def start(self, name: str, role: Role | None = None) -> None:
        server = self[name]
        assert not server.alive
        server.role = role or server.role
        server.machine = self._fresh(server.name, server.role, server.persisted)
        server.boot, server.seq, server.heard = server.boot + 1, 0, None
        server.alive = True
        self._check()

    def cut(self) -> None:
        self.up = False
        self.exchanged = False
        for server in self.servers.values():
            server.inbox.clear()
        self._check()

    def heal(self) -> None:
        self.up = True
        self._check()

    def _deliver(self, server: Server) -> None:
        inbox, server.inbox = server.inbox, []
        for message in inbox:
            if message == HANDOVER_MESSAGE:
                self._apply(server, step(server.machine, Event.HANDOVER, self.now))
            else:
                assert isinstance(message, StateMessage)
                server.heard = (message.boot, message.seq)
                # The echo, as the controller takes it: only of this run of ours.
                heard = message.heard
                echo = heard[1] if heard is not None and heard[0] == server.boot else 0
                info = replace(message.info, echo=echo)
                event = PEER_EVENT[info.state]
                self._apply(server, step(server.machine, event, self.now, info))

    def _apply(self, server: Server, outcome: Outcome) -> Outcome:
        before, after = server.machine, outcome.machine
        assert after.epoch >= before.epoch, "epoch went down"
        for action in outcome.actions:
            if isinstance(action, PersistEpoch):
                server.persisted = action.epoch
            elif isinstance(action, SendHandover):
                receiver = self.other(server)
                if self.up and receiver.alive:
                    receiver.inbox.append(HANDOVER_MESSAGE)
            elif isinstance(action, RedirectClients):
                server.clients = 0
            else:
                server.reports.append(action)
        assert server.persisted == after.epoch, "epoch changed without PersistEpoch"
        if after.state is not State.ACTIVE:
            assert server.clients == 0, "a server that is not ACTIVE kept its clients"
        server.machine = after
        return outcome

    def _check(self) -> None:
        if self.exchanged:
            active = [s.name for s in self.running() if s.machine.state is State.ACTIVE]
            assert len(active) <= 1, f"dual active on a healthy link at {self.now}: {active}"


def pair(started: bool = True) -> PeerLink:
    return PeerLink(("alpha", Role.PRIMARY), ("beta", Role.BACKUP), started=started)


def settled(link: PeerLink) -> PeerLink:
    link.tick(2)
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}
    return link


def test_started_together_the_primary_leads() -> None:
    link = pair()
    link.tick()
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.BACKUP}
    link.tick()
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}
    assert link["alpha"].machine.epoch == 1
    assert link.client("beta") == Redirect("alpha.example:5672")
    assert link.client("alpha") == Accept()


def test_primary_started_first_serves_after_a_timeout_and_the_backup_joins_passive() -> None:
    link = pair(started=False)
    link.start("alpha")
    assert link.client("alpha") == Redirect(None)
    link.tick(int(TIMEOUT))
    assert link.client("alpha") == Accept()
    link.start("beta")
    link.tick()
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}
    assert link["alpha"].clients == 1


def test_backup_started_first_never_serves_and_the_primary_leads_when_it_comes() -> None:
    link = pair(started=False)
    link.start("beta")
    link.tick(10)
    assert link.client("beta") == Redirect(None)
    assert link.states() == {"alpha": None, "beta": State.BACKUP}
    link.start("alpha")
    link.tick(2)
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}


def test_primary_crash_backup_waits_for_a_client_after_the_timeout() -> None:
    link = settled(pair())
    link.client("alpha")
    link.crash("alpha")
    assert link.client("beta") == Redirect("alpha.example:5672")  # not yet expired
    link.tick(10)
    assert link.states() == {"alpha": None, "beta": State.PASSIVE}  # no client, no failover
    assert link.client("beta") == Accept()
    assert link.states() == {"alpha": None, "beta": State.ACTIVE}
    assert link["beta"].machine.epoch == 2 == link["beta"].persisted


def test_backup_crash_leaves_the_primary_serving_and_it_rejoins_passive() -> None:
    link = settled(pair())
    link.crash("beta")
    link.tick(10)
    assert link.client("alpha") == Accept()
    link.start("beta")
    link.tick(2)
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}
    assert link["alpha"].machine.epoch == 1


def test_primary_restarted_after_failover_comes_back_passive() -> None:
    link = settled(pair())
    link.crash("alpha")
    link.tick(int(TIMEOUT))
    link.client("beta")
    link.start("alpha")
    assert link.client("alpha") == Redirect(None)  # its grace: it has not heard beta yet
    link.tick()
    assert link.states() == {"alpha": State.PASSIVE, "beta": State.ACTIVE}
    assert link.client("alpha") == Redirect("beta.example:5673")
    assert link["alpha"].machine.epoch == 2  # adopted from the backup's term


def test_primary_restarted_before_failover_leads_again_without_dual_active() -> None:
    link = settled(pair())
    link.crash("alpha")
    link.start("alpha")
    link.tick()
    # beta's PASSIVE crossed alpha's first message: it had not heard this run of alpha's,
    # and might have been voted in before alpha's message reached it. alpha waits.
    assert link.states() == {"alpha": State.PRIMARY, "beta": State.PASSIVE}
    link.tick()
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}
    assert link["alpha"].machine.epoch == 3  # its own next (odd), not the backup's 2
    link.tick()
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}


def test_link_cut_with_clients_only_at_the_active_the_passive_never_serves() -> None:
    link = settled(pair())
    link.cut()
    for _ in range(10):
        link.tick()
        assert link.client("alpha") == Accept()
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}
    link.heal()
    link.tick()
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}
    assert link["alpha"].clients == 10


def test_link_cut_with_clients_only_at_the_passive_it_alone_serves_then_keeps_them() -> None:
    link = settled(pair())
    link.cut()
    link.tick(int(TIMEOUT))
    assert link.client("beta") == Accept()
    assert link["alpha"].clients == 0
    link.heal()
    link.tick()
    assert link.states() == {"alpha": State.PASSIVE, "beta": State.ACTIVE}
    assert link["beta"].clients == 1


def test_link_cut_with_clients_on_both_sides_heals_by_epoch() -> None:
    link = settled(pair())
    link.cut()
    link.tick(int(TIMEOUT))
    assert link.client("alpha") == Accept()
    assert link.client("beta") == Accept()
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.ACTIVE}
    assert (link["alpha"].machine.epoch, link["beta"].machine.epoch) == (1, 2)
    link.heal()
    link.tick()
    assert link.states() == {"alpha": State.PASSIVE, "beta": State.ACTIVE}
    assert (link["alpha"].clients, link["beta"].clients) == (0, 1)
    assert [type(report) for report in link["alpha"].reports] == [LogDualActive]
    assert [type(report) for report in link["beta"].reports] == [LogDualActive]
    assert link.client("alpha") == Redirect("beta.example:5673")


def test_failback_by_manual_recover_and_handover() -> None:
    link = settled(pair())
    link.crash("alpha")
    link.tick(int(TIMEOUT))
    link.client("beta")
    link.start("alpha")
    link.tick(2)  # beta must hear alpha PASSIVE, not the PRIMARY it restarted as
    assert link.recover("alpha") == Refuse(
        "recover runs on the backup while it is ACTIVE; this server is PASSIVE"
    )
    assert link.recover("beta") == Accept()
    assert link.states() == {"alpha": State.PASSIVE, "beta": State.PASSIVE}
    assert link["beta"].clients == 0
    link.tick()
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}
    assert link["alpha"].machine.epoch == 3
    link.tick()  # beta hears alpha ACTIVE
    assert link.client("beta") == Redirect("alpha.example:5672")
    assert link.client("alpha") == Accept()


def test_recover_is_refused_while_the_primary_is_down() -> None:
    link = settled(pair())
    link.crash("alpha")
    link.tick(int(TIMEOUT))
    link.client("beta")
    assert link.recover("beta") == Refuse("the primary is not heard from: keep serving")
    assert link.states() == {"alpha": None, "beta": State.ACTIVE}


@pytest.mark.parametrize(
    ("roles", "wire_names"),
    [
        ((Role.PRIMARY, Role.PRIMARY), {}),
        ((Role.BACKUP, Role.BACKUP), {}),
        ((Role.PRIMARY, Role.BACKUP), {"left": "twin", "right": "twin"}),
    ],
    ids=["two primaries", "two backups", "same names"],
)
def test_a_misconfigured_pair_never_pairs_and_never_serves(
    roles: tuple[Role, Role], wire_names: dict[str, str]
) -> None:
    link = PeerLink(("left", roles[0]), ("right", roles[1]), wire_names=wire_names)
    link.tick(10)
    for label, server in link.servers.items():
        assert server.machine.state in (State.PRIMARY, State.BACKUP)
        assert server.machine.peer is None
        assert [type(report) for report in server.reports] == [LogMisconfigured]
        decision = link.client(label)
        assert isinstance(decision, Refuse)
        assert decision.reason == server.machine.misconfigured


def test_a_misconfigured_pair_pairs_once_one_server_is_restarted_correctly() -> None:
    link = PeerLink(("alpha", Role.PRIMARY), ("beta", Role.PRIMARY))
    link.tick(10)
    assert link.states() == {"alpha": State.PRIMARY, "beta": State.PRIMARY}
    link.crash("beta")
    link.start("beta", Role.BACKUP)
    link.tick(2)
    assert link.states() == {"alpha": State.ACTIVE, "beta": State.PASSIVE}
    assert link["alpha"].machine.misconfigured is None


# Weights make the interesting schedules (failover, dual active, failback) common: a failover
# needs a crash or cut, a timeout of heartbeats and a client, all before the next restart.
OPERATION_WEIGHTS = {
    "tick": 3,
    "wait": 2,  # a whole timeout of heartbeats
    "client alpha": 3,
    "client beta": 3,
    "crash alpha": 1,
    "crash beta": 1,
    "start alpha": 2,
    "start beta": 2,
    "cut": 1,
    "heal": 1,
    "recover alpha": 1,
    "recover beta": 2,
}
OPERATIONS = tuple(op for op, weight in OPERATION_WEIGHTS.items() for _ in range(weight))


def run(link: PeerLink, operation: str) -> None:
    verb, _, name = operation.partition(" ")
    if verb in ("crash", "start") and link[name].alive is (verb == "start"):
        return
    actions: dict[str, Callable[[], object]] = {
        "tick": link.tick,
        "wait": lambda: link.tick(int(TIMEOUT)),
        "client": lambda: link.client(name),
        "crash": lambda: link.crash(name),
        "start": lambda: link.start(name),
        "cut": link.cut,
        "heal": link.heal,
        "recover": lambda: link.recover(name),
    }
    actions[verb]()


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(OPERATIONS), min_size=20, max_size=100))
def test_any_interleaving_keeps_one_active_on_a_healthy_link(operations: list[str]) -> None:
    """For any schedule of heartbeats, clients, crashes, restarts, cuts, heals and recovers:

    - once a heartbeat has crossed the link both ways since the last cut or crash, at most
      one server is ACTIVE, checked after every operation (so a dual active born while the
      link was down lasts at most until the first heartbeat after the heal);
    - epochs never fall, and a server persists its epoch before serving or publishing it;
    - a server leaving ACTIVE has redirected its clients;
    - with the link healed and both servers running, three heartbeats leave exactly one
      ACTIVE and one PASSIVE server (two, but for a restarted server that waits a
      heartbeat for its peer to echo it: docs/failover.md, "A restarted backup that led
      last waits to be heard too").
    """
    link = pair()
    for operation in operations:
        run(link, operation)
    link.heal()
    for server in link.servers.values():
        if not server.alive:
            link.start(server.name)
    link.tick(3)
    assert sorted(state for state in link.states().values() if state) == [
        State.ACTIVE,
        State.PASSIVE,
    ]


# -- who leads when one of them is not in sync (replication) ------------------------------


def test_a_passive_primary_not_in_sync_stays_passive_when_its_backup_returns() -> None:
    unsynced = replace(ours(Role.PRIMARY, State.PASSIVE, epoch=4), in_sync=False)
    outcome = hear(unsynced, peer(Role.BACKUP, State.BACKUP, 4))
    assert outcome.machine.state is State.PASSIVE and outcome.transition is None
    synced = hear(ours(Role.PRIMARY, State.PASSIVE, epoch=4), peer(Role.BACKUP, State.BACKUP, 4))
    assert synced.machine.state is State.ACTIVE


def test_a_restarted_backup_leads_when_the_passive_primary_is_not_in_sync() -> None:
    backup = ours(Role.BACKUP, State.BACKUP, epoch=4)
    unsynced_primary = replace(peer(Role.PRIMARY, State.PASSIVE, 4), in_sync=False)
    outcome = hear(backup, unsynced_primary)
    assert outcome.machine.state is State.ACTIVE
    assert outcome.transition is not None and "not in sync" in outcome.transition.reason
    waits = hear(backup, peer(Role.PRIMARY, State.PASSIVE, 4))
    assert waits.machine.state is State.BACKUP


def test_of_two_passive_servers_the_one_in_sync_leads() -> None:
    backup = ours(Role.BACKUP, State.PASSIVE, epoch=4)
    unsynced_primary = replace(peer(Role.PRIMARY, State.PASSIVE, 4), in_sync=False)
    assert hear(backup, unsynced_primary).machine.state is State.ACTIVE
    primary = replace(ours(Role.PRIMARY, State.PASSIVE, epoch=4), in_sync=False)
    assert hear(primary, peer(Role.BACKUP, State.PASSIVE, 4)).machine.state is State.PASSIVE


def test_the_two_roles_lead_in_disjoint_epochs() -> None:
    assert [next_epoch(Role.PRIMARY, n) for n in range(5)] == [1, 3, 3, 5, 5]
    assert [next_epoch(Role.BACKUP, n) for n in range(5)] == [2, 2, 4, 4, 6]


def test_a_primary_restarted_alone_never_leads_in_the_epoch_its_backup_may_have_taken() -> None:
    """Both servers down: the primary led in 1 and the backup took over in 2 unheard; the
    primary restarts alone (only its own 1 on disk) and leads by client vote after its
    grace: in 3, not in the backup's 2."""
    restarted = Machine.start("alpha", Role.PRIMARY, 1, TIMEOUT, now=0.0)
    voted = step(restarted, Event.CLIENT_REQUEST, TIMEOUT + 0.001)
    assert voted.decision == Accept()
    assert voted.machine.state is State.ACTIVE
    assert voted.machine.epoch == 3
    assert voted.actions == (PersistEpoch(3),)
