"""The rule after a freeze in the pure machine (docs/failover.md, "Freezes"): what lifts
the fence of a thawed ACTIVE (a fresh answer from its peer, evidence of its death, a
client's vote under a PASSIVE's rules counted from the thaw), what makes it yield (its
peer in a higher epoch), and what never lifts it (a timeout passing, a stale message)."""

from __future__ import annotations

from dataclasses import replace

from failover.fsm import (
    PEER_EVENT,
    Accept,
    Event,
    Fence,
    LogDualActive,
    Machine,
    Outcome,
    PeerInfo,
    PersistEpoch,
    Redirect,
    RedirectClients,
    Refuse,
    Role,
    State,
    Unfence,
    step,
)

TIMEOUT = 3.0
RECONNECT = 2.0
THAW = 500.0
THAW_SEQ = 40  # the first of our state messages sent after the thaw
LISTEN = {"alpha": "alpha.example:5672", "beta": "beta.example:5673"}


def peer(role: Role, state: State, epoch: int, echo: int = 0) -> PeerInfo:
    name = "alpha" if role is Role.PRIMARY else "beta"
    return PeerInfo(name, role, state, epoch, LISTEN[name], echo=echo)


def fenced(
    role: Role = Role.PRIMARY, epoch: int = 1, witnessed: bool = False, **fields: object
) -> Machine:
    """An ACTIVE thawed at THAW after a long freeze; its peer last heard PASSIVE before."""
    other = Role.BACKUP if role is Role.PRIMARY else Role.PRIMARY
    name = "alpha" if role is Role.PRIMARY else "beta"
    machine = Machine(
        name,
        role,
        State.ACTIVE,
        epoch,
        TIMEOUT,
        peer_expiry=THAW - 20.0,  # silent for 20 s, as the frozen process measured it
        peer=peer(other, State.PASSIVE, epoch),
        reconnect=RECONNECT,
        witnessed=witnessed,
    )
    outcome = step(replace(machine, **fields), Event.PAUSED, THAW, thaw_seq=THAW_SEQ)  # type: ignore[arg-type]
    assert outcome.machine.fenced
    return outcome.machine


def hear(machine: Machine, info: PeerInfo, now: float) -> Outcome:
    return step(machine, PEER_EVENT[info.state], now, info)


def test_a_stale_message_leaves_the_fence_and_a_fresh_answer_lifts_it() -> None:
    machine = fenced()
    # A message from our socket buffer, sent before the peer heard anything from after
    # the thaw: it refreshes the peer's clock and says nothing of now.
    stale = hear(machine, peer(Role.BACKUP, State.PASSIVE, 1, echo=THAW_SEQ - 1), THAW + 0.01)
    assert stale.machine.fenced and stale.actions == ()
    assert stale.machine.peer_expiry == THAW + TIMEOUT + RECONNECT  # never shortened
    fresh = hear(stale.machine, peer(Role.BACKUP, State.PASSIVE, 1, echo=THAW_SEQ), THAW + 0.3)
    assert not fresh.machine.fenced and fresh.machine.state is State.ACTIVE
    assert [type(a) for a in fresh.actions] == [Unfence]
    assert step(fresh.machine, Event.CLIENT_REQUEST, THAW + 0.3).decision == Accept()


def test_a_timeout_passing_never_lifts_the_fence() -> None:
    machine = fenced()
    # Nothing but time and a witness that cannot agree: still fenced, however long.
    for later in (THAW + TIMEOUT, THAW + TIMEOUT + RECONNECT, THAW + 1000.0):
        outcome = step(machine, Event.WITNESS_DISAGREES, later)
        assert outcome.machine.fenced and outcome.actions == ()
    # Only a client's vote after the silence (the third way) lifts it, never the time alone.
    assert machine.fenced


def test_a_fenced_active_hearing_a_higher_epoch_active_yields_at_once() -> None:
    machine = fenced(epoch=1)
    # Even a stale message: the peer led in epoch 2 after us; yielding is always safe.
    outcome = hear(machine, peer(Role.BACKUP, State.ACTIVE, 2, echo=3), THAW + 0.01)
    assert outcome.machine.state is State.PASSIVE and not outcome.machine.fenced
    assert outcome.transition is not None and "we yield" in outcome.transition.reason
    assert RedirectClients(LISTEN["beta"]) in outcome.actions
    assert any(isinstance(a, LogDualActive) for a in outcome.actions)
    assert not any(isinstance(a, Unfence) for a in outcome.actions)
    assert outcome.machine.epoch == 2


def test_a_fenced_active_hearing_its_restarted_peer_in_a_higher_epoch_yields() -> None:
    # The peer took over in epoch 2 while we were frozen, then restarted: BACKUP, epoch 2.
    machine = fenced(epoch=1)
    outcome = hear(machine, peer(Role.BACKUP, State.BACKUP, 2, echo=THAW_SEQ), THAW + 0.5)
    assert outcome.machine.state is State.PASSIVE and not outcome.machine.fenced
    assert outcome.transition is not None and "led after us" in outcome.transition.reason
    assert RedirectClients(None) in outcome.actions
    assert not any(isinstance(a, Unfence) for a in outcome.actions)


def test_a_fenced_active_in_the_higher_epoch_stays_and_serves_on_a_fresh_answer() -> None:
    machine = fenced(role=Role.BACKUP, epoch=4)
    stale = hear(machine, peer(Role.PRIMARY, State.ACTIVE, 3, echo=1), THAW + 0.1)
    assert stale.machine.state is State.ACTIVE and stale.machine.fenced
    fresh = hear(stale.machine, peer(Role.PRIMARY, State.ACTIVE, 3, echo=THAW_SEQ), THAW + 0.2)
    assert fresh.machine.state is State.ACTIVE and not fresh.machine.fenced
    assert Unfence in [type(a) for a in fresh.actions]


def test_evidence_of_death_after_the_thaw_lifts_the_fence() -> None:
    machine = fenced()
    gone = step(machine, Event.PEER_GONE, THAW + 0.2)
    assert not gone.machine.fenced and gone.machine.peer_gone
    assert [type(a) for a in gone.actions] == [Unfence]
    assert step(gone.machine, Event.CLIENT_REQUEST, THAW + 0.2).decision == Accept()


def test_a_client_vote_lifts_the_fence_only_after_silence_counted_from_the_thaw() -> None:
    machine = fenced(epoch=3)
    grace_end = THAW + TIMEOUT + RECONNECT
    early = step(machine, Event.CLIENT_REQUEST, grace_end - 0.01)
    assert isinstance(early.decision, Refuse) and early.machine is machine
    voted = step(machine, Event.CLIENT_REQUEST, grace_end)
    assert voted.decision == Accept() and not voted.machine.fenced
    assert voted.machine.epoch == 3 and voted.transition is None  # it serves on in its epoch
    assert [type(a) for a in voted.actions] == [Unfence]
    # A stale message heard meanwhile restarted nothing early, and a fresh silence counts.
    heard = hear(machine, peer(Role.BACKUP, State.PASSIVE, 3, echo=1), THAW + 4.0).machine
    assert isinstance(step(heard, Event.CLIENT_REQUEST, grace_end).decision, Refuse)
    assert step(heard, Event.CLIENT_REQUEST, THAW + 4.0 + TIMEOUT).decision == Accept()


def test_a_client_vote_after_a_freeze_needs_the_witness_where_there_is_one() -> None:
    machine = fenced(witnessed=True)
    later = THAW + TIMEOUT + RECONNECT + 1.0
    refused = step(machine, Event.CLIENT_REQUEST, later)
    assert isinstance(refused.decision, Refuse) and "witness" in refused.decision.reason
    agrees = step(machine, Event.WITNESS_AGREES, later).machine
    assert agrees.fenced  # the witness alone lifts nothing
    assert step(agrees, Event.CLIENT_REQUEST, later).decision == Accept()


def test_a_misconfigured_or_peer_active_known_fenced_server_refuses_or_redirects() -> None:
    machine = replace(fenced(), misconfigured="peer 'alpha' is also primary")
    later = THAW + 100.0
    refused = step(machine, Event.CLIENT_REQUEST, later)
    assert refused.decision == Refuse("peer 'alpha' is also primary")
    # A fenced ACTIVE whose peer is heard ACTIVE in a lower epoch (it stays) sends no one
    # there, and it refuses until it has its answer.
    low = fenced(role=Role.BACKUP, epoch=4)
    heard = hear(low, peer(Role.PRIMARY, State.ACTIVE, 3, echo=1), THAW + 0.1).machine
    decision = step(heard, Event.CLIENT_REQUEST, THAW + 0.2).decision
    assert decision == Redirect(LISTEN["alpha"]) or isinstance(decision, Refuse)


def test_recover_is_refused_while_fenced_and_a_second_freeze_fences_again() -> None:
    machine = fenced(role=Role.BACKUP, epoch=2)
    recover = step(machine, Event.MANUAL_RECOVER, THAW + 0.1)
    assert isinstance(recover.decision, Refuse) and "frozen" in recover.decision.reason
    again = step(machine, Event.PAUSED, THAW + 30.0, thaw_seq=THAW_SEQ + 9)
    assert again.machine.fenced and again.machine.thaw_seq == THAW_SEQ + 9
    assert [type(a) for a in again.actions] == [Fence]
    # An echo of a message sent after the first thaw but before the second is stale now.
    old = hear(again.machine, peer(Role.PRIMARY, State.PASSIVE, 2, echo=THAW_SEQ), THAW + 30.1)
    assert old.machine.fenced


def test_an_active_hearing_a_higher_epoch_serves_on_in_one_of_its_own_above_it() -> None:
    # Not fenced (it resumed on the peer's death, say); the peer led in epoch 2 meanwhile
    # and comes back BACKUP: we never serve in epoch 2, the peer's, but in 3.
    machine = step(fenced(epoch=1), Event.PEER_GONE, THAW + 0.1).machine
    outcome = hear(machine, peer(Role.BACKUP, State.BACKUP, 2, echo=THAW_SEQ), THAW + 5.0)
    assert outcome.machine.state is State.ACTIVE and outcome.machine.epoch == 3
    assert outcome.actions[-1] == PersistEpoch(3)
    # A PASSIVE adopts the peer's epoch as it is.
    passive = replace(machine, state=State.PASSIVE)
    assert hear(passive, peer(Role.BACKUP, State.ACTIVE, 4), THAW + 5.0).machine.epoch == 4


def test_with_a_witness_evidence_alone_does_not_lift_the_fence() -> None:
    machine = fenced(witnessed=True)
    gone = step(machine, Event.PEER_GONE, THAW + 0.2)
    assert gone.machine.fenced and gone.machine.peer_gone and gone.actions == ()
    refused = step(gone.machine, Event.CLIENT_REQUEST, THAW + 0.2)
    assert isinstance(refused.decision, Refuse) and "witness" in refused.decision.reason
    agrees = step(gone.machine, Event.WITNESS_AGREES, THAW + 0.3).machine
    assert step(agrees, Event.CLIENT_REQUEST, THAW + 0.3).decision == Accept()
