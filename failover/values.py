"""The values of the failover state machine (``fsm``): what it is fed and what it returns.

Owns: the roles, states and events, the peer's state message as the machine sees it
(``PeerInfo``), one server's failover state (``Machine``, immutable), the transition, the
decisions (the answer to whoever raised the event) and the actions the controller carries
out, and the ``Outcome`` of one step.

Must not know: how the machine decides (``fsm``), sockets, asyncio, clocks, logging, files.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    PRIMARY = "primary"
    BACKUP = "backup"


class State(StrEnum):
    PRIMARY = "PRIMARY"
    BACKUP = "BACKUP"
    ACTIVE = "ACTIVE"
    PASSIVE = "PASSIVE"


class Event(StrEnum):
    PEER_PRIMARY = "PEER_PRIMARY"
    PEER_BACKUP = "PEER_BACKUP"
    PEER_ACTIVE = "PEER_ACTIVE"
    PEER_PASSIVE = "PEER_PASSIVE"
    CLIENT_REQUEST = "CLIENT_REQUEST"
    MANUAL_RECOVER = "MANUAL_RECOVER"
    HANDOVER = "HANDOVER"
    PROMOTE = "PROMOTE"
    FORCE_PROMOTE = "FORCE_PROMOTE"
    PEER_GONE = "PEER_GONE"
    WITNESS_AGREES = "WITNESS_AGREES"
    WITNESS_DISAGREES = "WITNESS_DISAGREES"
    PAUSED = "PAUSED"  # this process was frozen past its timeout; `now` is the thaw
    SWITCHOVER = "SWITCHOVER"  # planned: the drained ACTIVE hands the service to its peer


# The event a peer's state message raises: named here, not by coincidence of enum values.
PEER_EVENT: dict[State, Event] = {
    State.PRIMARY: Event.PEER_PRIMARY,
    State.BACKUP: Event.PEER_BACKUP,
    State.ACTIVE: Event.PEER_ACTIVE,
    State.PASSIVE: Event.PEER_PASSIVE,
}

_START_STATE: dict[Role, State] = {Role.PRIMARY: State.PRIMARY, Role.BACKUP: State.BACKUP}
_ROLE_OF_START_STATE: dict[State, Role] = {state: role for role, state in _START_STATE.items()}


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """The peer as its latest amq.peer state message describes it."""

    name: str
    role: Role
    state: State
    epoch: int
    listen: str  # the host:port clients should use to reach the peer
    in_sync: bool = True  # the peer holds everything its ACTIVE confirmed (replication)
    # The sequence number of our own latest state message (this boot of ours) the peer says
    # it has heard; 0: none. An echo at or above `Machine.thaw_seq` is news after a thaw.
    echo: int = 0
    # The peer is in maintenance (docs/failover.md, "Maintenance"): it never leads.
    maintenance: bool = False


@dataclass(frozen=True, slots=True)
class Machine:
    """One server's failover state. Immutable: `step()` returns a new one."""

    name: str
    role: Role
    state: State
    epoch: int
    timeout: float
    # Monotonic time after which the peer counts as gone; starts one timeout after start-up.
    peer_expiry: float
    peer: PeerInfo | None = None  # the last correctly configured peer message; None: never
    misconfigured: str | None = None  # why the last peer message was refused, if it was
    # Replication (docs/durability.md): whether this server holds everything its ACTIVE
    # peer confirmed (a PASSIVE that has caught up), and whether a PASSIVE that has not
    # may take over anyway (failover.takeover_unsynced).
    in_sync: bool = True
    takeover_unsynced: bool = False
    # The peer epoch of the dual active we last logged staying through: an ACTIVE loser
    # sends a few state messages before it hears us and yields, and that is one episode.
    # Epochs only grow, so a later split brain brings a new peer epoch and is logged again.
    dual_active_logged: int | None = None
    # The peer's process is known to be gone (PEER_GONE: its link dropped and its port
    # refuses connections), not merely silent; cleared when it is heard again.
    peer_gone: bool = False
    # A witness is configured (failover.witness), and whether, by its latest answers, a
    # majority of the witnesses has not heard the peer for twice the timeout.
    witnessed: bool = False
    witness_agrees: bool = False
    # The rule after a freeze: how long the peer's link to us may take to come back after
    # we thaw (its connect timeout and longest backoff; the controller sets it), the thaw
    # time of the freeze that fences this ACTIVE (None: not fenced; only ever set while
    # ACTIVE), and the first sequence number of our state messages sent after that thaw.
    reconnect: float = 0.0
    thawed: float | None = None
    thaw_seq: int = 0
    # When this server handed the service over (a switchover, a recover): until the peer
    # is heard ACTIVE, or a timeout has passed, a PASSIVE peer is one whose state message
    # crossed the handover, not one to lead beside.
    handed_over: float | None = None
    # When this server, not ACTIVE, was last found thawed from a freeze (PAUSED): a handover
    # read within a timeout (and the link's reconnect) after it may be one the peer sent
    # before it moved on (voted back in meanwhile), and is not taken.
    paused_at: float | None = None
    # This server is in maintenance (the controller sets it): no client vote, handover,
    # start-up rule or PROMOTE makes it ACTIVE; FORCE_PROMOTE still does.
    maintenance: bool = False

    @classmethod
    def start(cls, name: str, role: Role, epoch: int, timeout: float, now: float) -> Machine:
        """A server just started: PRIMARY or BACKUP by role, peer unheard but given a timeout."""
        if timeout <= 0:
            raise ValueError(f"failover timeout must be positive, got {timeout}")
        if epoch < 0:
            raise ValueError(f"epoch must not be negative, got {epoch}")
        return cls(name, role, _START_STATE[role], epoch, timeout, peer_expiry=now + timeout)

    def peer_alive(self, now: float) -> bool:
        """Whether a correctly configured peer has been heard within the last timeout."""
        return self.peer is not None and now < self.peer_expiry

    @property
    def fenced(self) -> bool:
        """An ACTIVE thawed from a freeze that has not yet earned serving again."""
        return self.thawed is not None


@dataclass(frozen=True, slots=True)
class Transition:
    from_state: State
    to_state: State
    trigger: Event
    reason: str


# Decisions: the answer to whoever raised the event (client, console, peer's handover).


@dataclass(frozen=True, slots=True)
class Accept:
    """Serve the client / the console command or handover took effect."""


@dataclass(frozen=True, slots=True)
class Redirect:
    """Send the client to `to`, the live ACTIVE peer's listen address; None: none is known."""

    to: str | None


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refuse the client or command, with a reason for a person to read."""

    reason: str


Decision = Accept | Redirect | Refuse


# Actions: what the controller carries out, in tuple order, before it answers the decision.


@dataclass(frozen=True, slots=True)
class PersistEpoch:
    """Store `epoch` durably in the data dir before serving or sending it in a state message."""

    epoch: int


@dataclass(frozen=True, slots=True)
class SendHandover:
    """Publish HANDOVER to the peer's amq.peer: the peer becomes ACTIVE (manual failback)."""


@dataclass(frozen=True, slots=True)
class RedirectClients:
    """Close this server's client connections with a redirect to `to` (None: no target).

    Peering and console connections stay: they bypass the failover gate.
    """

    to: str | None


@dataclass(frozen=True, slots=True)
class LogDualActive:
    """Write a `dual_active` event-log record."""

    peer: str
    peer_epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class LogMisconfigured:
    """Write a `misconfigured` event-log record and an error line."""

    peer: str
    peer_epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class Fence:
    """Stop serving: hold every client connection's reads, send no confirm (a freeze)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unfence:
    """Serve again after a freeze: release what was held. `reason`: what allowed it."""

    reason: str


Action = (
    PersistEpoch
    | SendHandover
    | RedirectClients
    | LogDualActive
    | LogMisconfigured
    | Fence
    | Unfence
)


@dataclass(frozen=True, slots=True)
class Outcome:
    machine: Machine
    transition: Transition | None = None
    decision: Decision | None = None  # None for peer state messages: nobody waits on them
    actions: tuple[Action, ...] = ()
