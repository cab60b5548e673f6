"""The failover state machine when the peer is down, or may be: manual promotion (and
--force), evidence of the peer's death (PEER_GONE), the thaw after a freeze (PAUSED: more
in test_fsm_freeze.py) and the witness's verdict, with a refused port that never outvotes a
witness still hearing the peer. One test per table cell, as in test_fsm.py."""

from __future__ import annotations

from dataclasses import replace

from failover.fsm import (
    WAITING_FOR_VOTE,
    Accept,
    Event,
    Fence,
    Machine,
    PeerInfo,
    PersistEpoch,
    Redirect,
    RedirectClients,
    Refuse,
    Role,
    State,
    Transition,
    step,
    vote_outlook,
)
from tests.unit.fsm_support import (
    EXPIRED,
    LISTEN,
    NOW,
    TIMEOUT,
    assert_unchanged,
    cell,
    hear,
    ours,
    peer,
)

# Manual promotion: the way out for a server that will not serve while its peer is down.


def _promoted_backup_case(state: State) -> None:
    """A restarted backup (BACKUP) or a PASSIVE one whose ACTIVE primary went quiet."""
    role = Role.PRIMARY if state is State.PRIMARY else Role.BACKUP
    other = Role.BACKUP if role is Role.PRIMARY else Role.PRIMARY
    machine = ours(role, state, epoch=3, peer=peer(other, State.ACTIVE, 5))

    refused = step(machine, Event.PROMOTE, NOW)
    assert_unchanged(refused, machine)
    assert isinstance(refused.decision, Refuse)
    assert "--force" in refused.decision.reason

    lost = step(machine, Event.PROMOTE, EXPIRED)
    assert lost.decision == Accept()
    assert lost.machine.state is State.ACTIVE
    # Above the peer's last epoch, of this server's parity (odd: the primary's).
    assert lost.machine.epoch == (7 if role is Role.PRIMARY else 6)
    assert lost.actions == (PersistEpoch(lost.machine.epoch),)
    assert lost.transition == Transition(
        state, State.ACTIVE, Event.PROMOTE, "promoted by an administrator: the peer is not heard"
    )

    misconfigured = replace(machine, misconfigured="two backups")
    refused = step(misconfigured, Event.PROMOTE, EXPIRED)
    assert_unchanged(refused, misconfigured)
    assert refused.decision == Refuse("two backups")


def _forced_case(state: State) -> None:
    role = Role.PRIMARY if state is State.PRIMARY else Role.BACKUP
    other = Role.BACKUP if role is Role.PRIMARY else Role.PRIMARY
    machine = ours(role, state, epoch=3, peer=peer(other, State.ACTIVE, 5))
    forced = step(machine, Event.FORCE_PROMOTE, NOW)
    assert forced.decision == Accept()
    assert forced.machine.state is State.ACTIVE
    # The peer, ACTIVE in 5, yields by the dual-active rule (odd epochs: the primary's).
    assert forced.machine.epoch == (7 if role is Role.PRIMARY else 6)
    assert forced.actions == (PersistEpoch(forced.machine.epoch),)
    assert forced.transition is not None
    assert forced.transition.trigger is Event.FORCE_PROMOTE

    misconfigured = replace(machine, misconfigured="two backups")
    refused = step(misconfigured, Event.FORCE_PROMOTE, NOW)
    assert_unchanged(refused, misconfigured)
    assert refused.decision == Refuse("two backups")


@cell(State.PRIMARY, Event.PROMOTE)
def test_promote_a_started_primary_only_once_the_active_peer_is_gone() -> None:
    _promoted_backup_case(State.PRIMARY)


@cell(State.BACKUP, Event.PROMOTE)
def test_promote_a_restarted_backup_whose_primary_is_down() -> None:
    _promoted_backup_case(State.BACKUP)
    # A fresh backup that never heard a peer is promoted once its grace timeout has passed.
    fresh = Machine.start("beta", Role.BACKUP, 2, TIMEOUT, now=0.0)
    outcome = step(fresh, Event.PROMOTE, TIMEOUT)
    assert outcome.machine.state is State.ACTIVE
    assert outcome.machine.epoch == 4  # even: a backup's


@cell(State.PASSIVE, Event.PROMOTE)
def test_promote_a_passive_server_once_its_active_peer_is_gone() -> None:
    _promoted_backup_case(State.PASSIVE)
    # A live peer that is not ACTIVE (both waiting) does not block a promotion.
    waiting = ours(Role.BACKUP, State.PASSIVE, peer=peer(Role.PRIMARY, State.PASSIVE))
    outcome = step(waiting, Event.PROMOTE, NOW)
    assert outcome.machine.state is State.ACTIVE
    assert outcome.transition is not None
    assert outcome.transition.reason == "promoted by an administrator: the peer follows"


@cell(State.PRIMARY, Event.FORCE_PROMOTE)
def test_force_promote_a_started_primary_over_a_live_active_peer() -> None:
    _forced_case(State.PRIMARY)


@cell(State.BACKUP, Event.FORCE_PROMOTE)
def test_force_promote_a_backup_over_a_live_active_peer() -> None:
    _forced_case(State.BACKUP)


@cell(State.PASSIVE, Event.FORCE_PROMOTE)
def test_force_promote_a_passive_server_over_a_live_active_peer() -> None:
    _forced_case(State.PASSIVE)


@cell(State.ACTIVE, Event.PROMOTE)
def test_promote_is_refused_when_already_active() -> None:
    machine = ours(Role.BACKUP, State.ACTIVE)
    outcome = step(machine, Event.PROMOTE, NOW)
    assert_unchanged(outcome, machine)
    assert outcome.decision == Refuse("this server is already ACTIVE: nothing to promote")


@cell(State.ACTIVE, Event.FORCE_PROMOTE)
def test_force_promote_is_refused_when_already_active() -> None:
    machine = ours(Role.PRIMARY, State.ACTIVE)
    outcome = step(machine, Event.FORCE_PROMOTE, NOW)
    assert_unchanged(outcome, machine)
    assert outcome.decision == Refuse("this server is already ACTIVE: nothing to promote")


def test_a_forced_promotion_ends_in_one_active_by_the_epoch_rule() -> None:
    backup = ours(Role.BACKUP, State.PASSIVE, epoch=5, peer=peer(Role.PRIMARY, State.ACTIVE, 5))
    forced = step(backup, Event.FORCE_PROMOTE, NOW).machine
    primary = ours(Role.PRIMARY, State.ACTIVE, epoch=5, peer=peer(Role.BACKUP, State.PASSIVE, 5))
    told = step(
        primary,
        Event.PEER_ACTIVE,
        NOW,
        PeerInfo(forced.name, forced.role, forced.state, forced.epoch, LISTEN["beta"]),
    )
    assert told.machine.state is State.PASSIVE
    assert RedirectClients(LISTEN["beta"]) in told.actions


# --- PEER_GONE: the peer's link dropped and its port refuses (evidence, not silence) --------


@cell(State.PASSIVE, Event.PEER_GONE)
def test_passive_in_sync_takes_over_on_the_first_vote_once_its_peer_is_gone() -> None:
    active = peer(Role.PRIMARY, State.ACTIVE, epoch=3)
    machine = ours(Role.BACKUP, State.PASSIVE, epoch=3, peer=active)
    assert step(machine, Event.CLIENT_REQUEST, NOW).decision == Redirect("alpha.example:5672")

    gone = step(machine, Event.PEER_GONE, NOW)
    assert gone.transition is None and gone.actions == () and gone.decision is None
    assert gone.machine.peer_gone and not gone.machine.peer_alive(NOW)
    assert step(gone.machine, Event.PEER_GONE, NOW + 0.1).machine is gone.machine

    voted = step(gone.machine, Event.CLIENT_REQUEST, NOW)  # well before EXPIRED
    assert voted.decision == Accept()
    assert voted.machine.state is State.ACTIVE and voted.machine.epoch == 4
    assert voted.transition == Transition(
        State.PASSIVE,
        State.ACTIVE,
        Event.CLIENT_REQUEST,
        "the peer's process is gone (its link dropped, its port refuses): client vote",
    )

    # The evidence changes when, never whether: a PASSIVE not in sync still refuses.
    unsynced = step(replace(machine, in_sync=False), Event.PEER_GONE, NOW).machine
    refused = step(unsynced, Event.CLIENT_REQUEST, NOW)
    assert isinstance(refused.decision, Refuse) and refused.machine.state is State.PASSIVE

    # Nor over a misconfiguration.
    odd = step(replace(machine, misconfigured="same name"), Event.PEER_GONE, NOW).machine
    assert step(odd, Event.CLIENT_REQUEST, NOW).machine.state is State.PASSIVE

    # The peer heard again (it was restarted): the evidence is gone with it.
    back = hear(gone.machine, peer(Role.PRIMARY, State.PRIMARY, epoch=3), NOW + 0.2)
    assert not back.machine.peer_gone and back.machine.peer_alive(NOW + 0.2)


@cell(State.PRIMARY, Event.PEER_GONE)
def test_started_primary_whose_peer_is_gone_serves_on_the_first_vote() -> None:
    machine = Machine.start("alpha", Role.PRIMARY, 1, TIMEOUT, now=NOW)
    gone = step(machine, Event.PEER_GONE, NOW + 0.1)
    assert gone.transition is None and gone.machine.state is State.PRIMARY
    voted = step(gone.machine, Event.CLIENT_REQUEST, NOW + 0.1)
    assert voted.machine.state is State.ACTIVE and voted.machine.epoch == 3


@cell(State.BACKUP, Event.PEER_GONE)
def test_started_backup_whose_peer_is_gone_still_never_serves_first() -> None:
    machine = Machine.start("beta", Role.BACKUP, 0, TIMEOUT, now=NOW)
    gone = step(machine, Event.PEER_GONE, NOW)
    assert gone.transition is None and gone.machine.peer_gone
    refused = step(gone.machine, Event.CLIENT_REQUEST, NOW + 10 * TIMEOUT)
    assert refused.machine.state is State.BACKUP and refused.decision == Redirect(None)


@cell(State.ACTIVE, Event.PEER_GONE)
def test_active_whose_passive_is_gone_keeps_serving() -> None:
    machine = ours(Role.PRIMARY, State.ACTIVE, epoch=3, peer=peer(Role.BACKUP, State.PASSIVE, 3))
    gone = step(machine, Event.PEER_GONE, NOW)
    assert gone.transition is None and gone.actions == ()
    assert gone.machine.state is State.ACTIVE and not gone.machine.peer_alive(NOW)
    assert step(gone.machine, Event.CLIENT_REQUEST, NOW).decision == Accept()


# --- the rule after a freeze (PAUSED): more in test_fsm_freeze.py ---------------------------

RECONNECT = 2.0  # the peer's link to us may take this long to come back after our thaw


@cell(State.ACTIVE, Event.PAUSED)
def test_active_thawed_is_fenced_and_trusts_no_silence_across_the_freeze() -> None:
    machine = replace(
        ours(Role.PRIMARY, State.ACTIVE, epoch=3, peer=peer(Role.BACKUP, State.PASSIVE, 3)),
        reconnect=RECONNECT,
        peer_gone=True,
        witness_agrees=True,
    )
    thaw = EXPIRED + 20.0  # frozen long past the timeout
    paused = step(machine, Event.PAUSED, thaw, thaw_seq=7)
    assert paused.transition is None and paused.decision is None
    assert len(paused.actions) == 1 and isinstance(paused.actions[0], Fence)
    fenced = paused.machine
    assert fenced.fenced and fenced.thawed == thaw and fenced.thaw_seq == 7
    assert fenced.state is State.ACTIVE and fenced.epoch == 3
    # Silence and evidence from before the thaw are dropped: the clock restarts at the thaw.
    assert fenced.peer_expiry == thaw + TIMEOUT + RECONNECT
    assert not fenced.peer_gone and not fenced.witness_agrees
    refused = step(fenced, Event.CLIENT_REQUEST, thaw + TIMEOUT)
    assert isinstance(refused.decision, Refuse) and "frozen" in refused.decision.reason
    assert refused.machine is fenced


@cell(State.PASSIVE, Event.PAUSED)
def test_passive_thawed_is_not_voted_in_on_silence_across_its_freeze() -> None:
    active = peer(Role.PRIMARY, State.ACTIVE, epoch=3)
    machine = replace(ours(Role.BACKUP, State.PASSIVE, epoch=3, peer=active), reconnect=RECONNECT)
    thaw = EXPIRED + 20.0
    # Without the rule, the first client after the thaw votes it in: the peer "was silent".
    assert step(machine, Event.CLIENT_REQUEST, thaw).machine.state is State.ACTIVE
    paused = step(replace(machine, peer_gone=True), Event.PAUSED, thaw, thaw_seq=4)
    assert paused.transition is None and paused.actions == ()
    assert not paused.machine.fenced and not paused.machine.peer_gone
    assert paused.machine.peer_expiry == thaw + TIMEOUT + RECONNECT
    during = step(paused.machine, Event.CLIENT_REQUEST, thaw + TIMEOUT + RECONNECT - 0.01)
    assert during.machine.state is State.PASSIVE and during.transition is None
    # Silent for the whole grace counted from the thaw: the vote takes over, as always.
    after = step(paused.machine, Event.CLIENT_REQUEST, thaw + TIMEOUT + RECONNECT)
    assert after.machine.state is State.ACTIVE and after.decision == Accept()


@cell(State.PRIMARY, Event.PAUSED)
@cell(State.BACKUP, Event.PAUSED)
def test_a_starting_server_thawed_restarts_its_peer_clock_and_is_not_fenced() -> None:
    for role, state in ((Role.PRIMARY, State.PRIMARY), (Role.BACKUP, State.BACKUP)):
        machine = replace(ours(role, state), reconnect=RECONNECT, peer_gone=True)
        thaw = EXPIRED + 50.0
        paused = step(machine, Event.PAUSED, thaw, thaw_seq=2)
        assert paused.transition is None and paused.actions == ()
        assert paused.machine.state is state and not paused.machine.fenced
        assert paused.machine.peer_expiry == thaw + TIMEOUT + RECONNECT
        assert not paused.machine.peer_gone
        if state is State.PRIMARY:  # the start vote waits for the grace too
            vote = step(paused.machine, Event.CLIENT_REQUEST, thaw + 1.0)
            assert vote.machine.state is State.PRIMARY


# --- the witness: its verdict on the peer, fed in by the controller ------------------------


@cell(State.PASSIVE, Event.WITNESS_AGREES)
@cell(State.PASSIVE, Event.WITNESS_DISAGREES)
def test_passive_with_a_witness_takes_over_only_when_the_witness_agrees() -> None:
    active = peer(Role.PRIMARY, State.ACTIVE, epoch=3)
    machine = replace(ours(Role.BACKUP, State.PASSIVE, epoch=3, peer=active), witnessed=True)

    # Silent here for a timeout, but the witness still hears it: a cut link, not a death.
    refused = step(machine, Event.CLIENT_REQUEST, EXPIRED)
    assert isinstance(refused.decision, Refuse) and "witness" in refused.decision.reason
    assert refused.machine.state is State.PASSIVE

    agrees = step(machine, Event.WITNESS_AGREES, EXPIRED)
    assert agrees.transition is None and agrees.machine.witness_agrees
    assert step(agrees.machine, Event.WITNESS_AGREES, EXPIRED).machine is agrees.machine
    voted = step(agrees.machine, Event.CLIENT_REQUEST, EXPIRED)
    assert voted.machine.state is State.ACTIVE and voted.decision == Accept()
    assert voted.transition is not None
    assert voted.transition.reason == "no peer heard for a timeout: client vote, the witness agrees"

    # The witness hears the peer again: no vote.
    disagrees = step(agrees.machine, Event.WITNESS_DISAGREES, EXPIRED)
    assert not disagrees.machine.witness_agrees
    assert step(disagrees.machine, Event.CLIENT_REQUEST, EXPIRED).machine.state is State.PASSIVE

    # Evidence of death does not skip the witness (see the tests at the end of this file).
    gone = step(machine, Event.PEER_GONE, NOW).machine
    assert step(gone, Event.CLIENT_REQUEST, NOW).machine.state is State.PASSIVE

    # Still within the timeout, the witness's word alone changes nothing.
    early = step(agrees.machine, Event.CLIENT_REQUEST, NOW)
    assert early.machine.state is State.PASSIVE and early.decision == Redirect("alpha.example:5672")


@cell(State.PRIMARY, Event.WITNESS_AGREES)
@cell(State.PRIMARY, Event.WITNESS_DISAGREES)
def test_started_primary_with_a_witness_leads_alone_only_when_it_agrees() -> None:
    machine = replace(Machine.start("alpha", Role.PRIMARY, 1, TIMEOUT, now=NOW), witnessed=True)
    later = NOW + TIMEOUT
    assert step(machine, Event.CLIENT_REQUEST, later).machine.state is State.PRIMARY
    agrees = step(machine, Event.WITNESS_AGREES, later).machine
    assert step(agrees, Event.CLIENT_REQUEST, later).machine.state is State.ACTIVE
    disagrees = step(agrees, Event.WITNESS_DISAGREES, later).machine
    assert step(disagrees, Event.CLIENT_REQUEST, later).machine.state is State.PRIMARY


@cell(State.BACKUP, Event.WITNESS_AGREES)
@cell(State.BACKUP, Event.WITNESS_DISAGREES)
def test_started_backup_never_serves_first_whatever_the_witness_says() -> None:
    machine = replace(Machine.start("beta", Role.BACKUP, 0, TIMEOUT, now=NOW), witnessed=True)
    for event in (Event.WITNESS_AGREES, Event.WITNESS_DISAGREES):
        said = step(machine, event, NOW).machine
        assert step(said, Event.CLIENT_REQUEST, NOW + 10 * TIMEOUT).machine.state is State.BACKUP


@cell(State.ACTIVE, Event.WITNESS_AGREES)
@cell(State.ACTIVE, Event.WITNESS_DISAGREES)
def test_active_keeps_serving_its_clients_whatever_the_witness_says() -> None:
    machine = replace(
        ours(Role.PRIMARY, State.ACTIVE, epoch=3, peer=peer(Role.BACKUP, State.PASSIVE, 3)),
        witnessed=True,
    )
    for event in (Event.WITNESS_AGREES, Event.WITNESS_DISAGREES):
        said = step(machine, event, NOW)
        assert said.transition is None and said.actions == ()
        assert step(said.machine, Event.CLIENT_REQUEST, NOW).decision == Accept()


def test_the_vote_outlook_says_what_the_next_client_would_do_to_a_passive() -> None:
    """The console's status line for a PASSIVE, asked of the table itself."""
    active_primary = peer(Role.PRIMARY, State.ACTIVE)
    passive = ours(Role.BACKUP, State.PASSIVE, peer=active_primary)
    assert vote_outlook(passive, NOW) is None  # the peer is heard: nothing to wait for
    assert vote_outlook(passive, EXPIRED) == WAITING_FOR_VOTE
    behind = replace(passive, in_sync=False)
    assert vote_outlook(behind, EXPIRED) == (
        "no takeover by client vote: this server is not in sync with the ACTIVE it followed"
        " (it has not caught up): taking over would lose confirmed messages; `amqha console"
        " promote --force` or failover.takeover_unsynced overrides"
    )
    assert vote_outlook(ours(Role.PRIMARY, State.ACTIVE), EXPIRED) is None
    # The outlook changes nothing: the same vote still takes over.
    assert step(passive, Event.CLIENT_REQUEST, EXPIRED).machine.state is State.ACTIVE


# --- evidence with a witness: a refused port never outvotes a witness that hears the peer ---


def _witnessed_passive() -> Machine:
    return replace(
        ours(Role.BACKUP, State.PASSIVE, epoch=3, peer=peer(Role.PRIMARY, State.ACTIVE, 3)),
        witnessed=True,
    )


def test_with_a_witness_evidence_of_death_alone_takes_no_vote() -> None:
    """A firewall's reset looks like a dead process: the peer counts as lost at once, but
    while the witness still hears it (or cannot be reached) no client makes us ACTIVE."""
    gone = step(_witnessed_passive(), Event.PEER_GONE, NOW).machine
    assert gone.peer_gone and not gone.peer_alive(NOW)
    for machine in (gone, step(gone, Event.WITNESS_DISAGREES, NOW).machine):
        refused = step(machine, Event.CLIENT_REQUEST, NOW)
        assert refused.machine.state is State.PASSIVE and refused.transition is None
        assert isinstance(refused.decision, Refuse)
        assert "witness" in refused.decision.reason


def test_with_a_witness_evidence_and_its_agreement_take_the_vote() -> None:
    """The peer's port refuses and the witness has not heard it for twice the timeout: the
    vote goes through, saying both."""
    gone = step(_witnessed_passive(), Event.PEER_GONE, NOW).machine
    agrees = step(gone, Event.WITNESS_AGREES, NOW).machine
    voted = step(agrees, Event.CLIENT_REQUEST, NOW)
    assert voted.machine.state is State.ACTIVE and voted.transition is not None
    assert voted.transition.reason == (
        "the peer's process is gone (its link dropped, its port refuses): client vote, "
        "the witness agrees"
    )


def test_without_a_witness_evidence_still_takes_the_vote_at_once() -> None:
    machine = replace(_witnessed_passive(), witnessed=False)
    gone = step(machine, Event.PEER_GONE, NOW).machine
    assert step(gone, Event.CLIENT_REQUEST, NOW).machine.state is State.ACTIVE
