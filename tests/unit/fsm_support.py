"""What the failover state machine's tests share: the fake clock's instants, the two
servers' names and addresses, a machine in a given state (``ours``), a peer's state message
(``peer``), and the register of table cells: each test of a (state, event) cell claims it
with ``cell``, and test_fsm.py checks that every cell of the table is claimed, once."""

from __future__ import annotations

from collections.abc import Callable

from failover.fsm import PEER_EVENT, Event, Machine, Outcome, PeerInfo, Role, State, step

TIMEOUT = 3.0
HEARTBEAT = 1.0
NOW = 100.0
HEARD_AT = NOW - HEARTBEAT  # the peer's last state message, comfortably within the timeout
EXPIRED = HEARD_AT + TIMEOUT  # the first instant the peer counts as gone

NAME = {Role.PRIMARY: "alpha", Role.BACKUP: "beta"}
LISTEN = {"alpha": "alpha.example:5672", "beta": "beta.example:5673"}


def ours(
    role: Role,
    state: State,
    *,
    epoch: int = 1,
    peer: PeerInfo | None = None,
    misconfigured: str | None = None,
) -> Machine:
    """This server, its peer last heard at HEARD_AT."""
    return Machine(NAME[role], role, state, epoch, TIMEOUT, HEARD_AT + TIMEOUT, peer, misconfigured)


def peer(role: Role, state: State, epoch: int = 1, name: str | None = None) -> PeerInfo:
    name = name or NAME[role]
    return PeerInfo(name, role, state, epoch, LISTEN.get(name, f"{name}.example:5670"))


def hear(machine: Machine, info: PeerInfo, now: float = NOW) -> Outcome:
    return step(machine, PEER_EVENT[info.state], now, info)


def assert_unchanged(outcome: Outcome, machine: Machine) -> None:
    assert outcome.machine is machine
    assert outcome.transition is None
    assert outcome.actions == ()


def assert_heard(outcome: Outcome, info: PeerInfo, now: float = NOW) -> None:
    assert outcome.machine.peer == info
    assert outcome.machine.peer_expiry == now + TIMEOUT
    assert outcome.machine.misconfigured is None


CELL_TESTS: dict[tuple[State, Event], Callable[[], None]] = {}


def cell(state: State, event: Event) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def register(test: Callable[[], None]) -> Callable[[], None]:
        assert (state, event) not in CELL_TESTS, f"two tests claim {state} + {event}"
        CELL_TESTS[(state, event)] = test
        return test

    return register
