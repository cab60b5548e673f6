"""The outcomes the failover state machine's handlers are built from (``fsm``'s table).

Owns: moving to a state and becoming ACTIVE in a new epoch of this role's parity
(``next_epoch``), the answer to a client when this server does not serve, the handler
factories a table cell names its reason with (``stay``, ``go_active``, ``go_passive``,
``refuse``), the misconfiguration a peer message shows, the epoch adopted from a peer, and
what a fenced ACTIVE does with a peer message (``overtaken``, ``after_freeze``).

Must not know: which cell uses which (``fsm``), sockets, clocks, logging, files. Pure: values
in, values out (docs/failover.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .values import (
    _ROLE_OF_START_STATE,
    Action,
    Decision,
    Event,
    LogMisconfigured,
    Machine,
    Outcome,
    PeerInfo,
    PersistEpoch,
    Redirect,
    RedirectClients,
    Refuse,
    Role,
    State,
    Transition,
    Unfence,
)

Handler = Callable[[Machine, Event, float], Outcome]

NO_ACTIVE_KNOWN = Redirect(None)


def overtaken(machine: Machine, event: Event, peer: PeerInfo) -> Outcome:
    """A fenced ACTIVE hears its peer in an epoch above its own: the peer led after us,
    whatever it is now (restarted, say). We yield and never serve what we held."""
    reason = (
        f"frozen, then heard the peer {peer.name} {peer.state} in epoch {peer.epoch}, above "
        f"ours ({machine.epoch}): it led after us; we yield"
    )
    return move(machine, State.PASSIVE, event, reason, actions=(RedirectClients(None),))


def after_freeze(outcome: Outcome, peer: PeerInfo) -> Outcome:
    """A fenced ACTIVE still ACTIVE after the table ran on a peer message: it serves again
    if the message echoes one sent after the thaw (news, not a stale message)."""
    machine = outcome.machine
    if not machine.fenced or machine.state is not State.ACTIVE:
        return outcome
    if peer.echo < max(machine.thaw_seq, 1):
        return outcome
    why = f"the peer {peer.name} answered after the thaw: {peer.state} in epoch {peer.epoch}"
    return replace(
        outcome,
        machine=replace(machine, thawed=None),
        actions=(*outcome.actions, Unfence(why)),
    )


def unfence_if_not_active(outcome: Outcome) -> Outcome:
    """Only an ACTIVE is fenced: one that leaves ACTIVE drops the fence (its clients are
    closed with a redirect, what was held is never confirmed)."""
    machine = outcome.machine
    if machine.thawed is None or machine.state is State.ACTIVE:
        return outcome
    return replace(outcome, machine=replace(machine, thawed=None))


def misconfiguration(machine: Machine, peer: PeerInfo) -> str | None:
    if peer.name == machine.name:
        return f"peer has our name {peer.name!r}: two servers must not share a name"
    if peer.role == machine.role:
        return f"peer {peer.name!r} is also {peer.role}: a pair needs one primary, one backup"
    started_as = _ROLE_OF_START_STATE.get(peer.state)
    if started_as is not None and started_as != peer.role:
        return f"peer {peer.name!r} reports {peer.state} but is configured {peer.role}"
    return None


def report_misconfiguration(machine: Machine, peer: PeerInfo, reason: str) -> Outcome:
    if machine.misconfigured == reason:
        return Outcome(machine)
    report = LogMisconfigured(peer.name, peer.epoch, reason)
    return Outcome(replace(machine, misconfigured=reason), actions=(report,))


def adopt_epoch(outcome: Outcome, peer_epoch: int) -> Outcome:
    machine = outcome.machine
    if peer_epoch <= machine.epoch:
        return outcome
    # An ACTIVE that stays ACTIVE hearing a higher epoch (its peer led meanwhile, then
    # restarted or yielded) serves on in a new epoch above it, never in the peer's.
    epoch = next_epoch(machine.role, peer_epoch) if machine.state is State.ACTIVE else peer_epoch
    return replace(
        outcome,
        machine=replace(machine, epoch=epoch),
        actions=(*outcome.actions, PersistEpoch(epoch)),
    )


def move(
    machine: Machine,
    to: State,
    trigger: Event,
    reason: str,
    decision: Decision | None = None,
    actions: tuple[Action, ...] = (),
) -> Outcome:
    moved = replace(machine, state=to)
    return Outcome(moved, Transition(machine.state, to, trigger, reason), decision, actions)


def peer_led_last(role: Role, own: int, peer_epoch: int) -> bool:
    """Whether the peer led the highest epoch either server knows of: epochs are odd for
    the primary and even for the backup, and a PASSIVE takes its ACTIVE's, so the parity
    of the highest names the server that led last, the one whose store holds every
    message the pair confirmed (docs/failover.md, "Who led last")."""
    last = max(own, peer_epoch)
    return last > 0 and (last % 2 == 1) != (role is Role.PRIMARY)


def next_epoch(role: Role, above: int) -> int:
    """The first epoch above ``above`` that ``role`` may lead in: odd for the primary, even
    for the backup, so the two never serve in one epoch."""
    epoch = above + 1
    return epoch if (epoch % 2 == 1) == (role is Role.PRIMARY) else epoch + 1


def become_active(
    machine: Machine, trigger: Event, reason: str, decision: Decision | None = None
) -> Outcome:
    # A new term: above every epoch this server has held or heard, of its own role's parity
    # (see "Disjoint epochs" above), durable before serving.
    known = machine.peer.epoch if machine.peer is not None else 0
    epoch = next_epoch(machine.role, max(machine.epoch, known))
    active = replace(machine, state=State.ACTIVE, epoch=epoch)
    return Outcome(
        active,
        Transition(machine.state, State.ACTIVE, trigger, reason),
        decision,
        (PersistEpoch(epoch),),
    )


def not_serving(machine: Machine, now: float) -> Decision:
    peer = machine.peer
    if peer is not None and peer.state == State.ACTIVE and now < machine.peer_expiry:
        return Redirect(peer.listen)
    if machine.misconfigured is not None:
        return Refuse(machine.misconfigured)
    return NO_ACTIVE_KNOWN


# Handler factories: each table entry names its "why", which becomes the handler's docstring
# and, for transitions, the reason written to the event log.


def stay(why: str) -> Handler:
    def stay(machine: Machine, event: Event, now: float) -> Outcome:
        return Outcome(machine)

    stay.__doc__ = why
    return stay


def go_active(why: str) -> Handler:
    def go_active(machine: Machine, event: Event, now: float) -> Outcome:
        return become_active(machine, event, why)

    go_active.__doc__ = why
    return go_active


def go_passive(why: str) -> Handler:
    def go_passive(machine: Machine, event: Event, now: float) -> Outcome:
        return move(machine, State.PASSIVE, event, why)

    go_passive.__doc__ = why
    return go_passive


def refuse(why: str) -> Handler:
    refusal = Refuse(why)

    def refuse(machine: Machine, event: Event, now: float) -> Outcome:
        return Outcome(machine, decision=refusal)

    refuse.__doc__ = why
    return refuse
