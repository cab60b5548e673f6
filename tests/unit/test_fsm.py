"""The failover state machine, one test per table cell: what each state does with the
peer's state messages, a client, recover and handover; that every cell of the table has a
test (the cells of promotion, a dead, frozen or witnessed peer are claimed in
test_fsm_peer_down.py); and step's own rules (misconfiguration, start, the peer's expiry).
Two machines against each other: test_fsm_pair.py."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest

from failover.fsm import (
    TRANSITIONS,
    Accept,
    Event,
    LogDualActive,
    LogMisconfigured,
    Machine,
    PersistEpoch,
    Redirect,
    RedirectClients,
    Refuse,
    Role,
    SendHandover,
    State,
    Transition,
    step,
)

# The cells of promotion and of a dead, frozen or witnessed peer are claimed there.
from tests.unit import test_fsm_peer_down, test_fsm_switchover  # noqa: F401
from tests.unit.fsm_support import (
    CELL_TESTS,
    EXPIRED,
    NOW,
    TIMEOUT,
    assert_heard,
    assert_unchanged,
    cell,
    hear,
    ours,
    peer,
)

# --- the table, cell by cell -------------------------------------------------------------


@cell(State.PRIMARY, Event.PEER_PRIMARY)
def test_primary_hears_primary_is_misconfigured_and_never_reaches_the_table() -> None:
    machine = Machine.start("alpha", Role.PRIMARY, 1, TIMEOUT, now=NOW)
    stray = peer(Role.PRIMARY, State.PRIMARY, epoch=4, name="gamma")
    outcome = hear(machine, stray)
    reason = "peer 'gamma' is also primary: a pair needs one primary, one backup"
    assert outcome.machine == replace(machine, misconfigured=reason)
    assert outcome.transition is None and outcome.decision is None
    assert outcome.actions == (LogMisconfigured("gamma", 4, reason),)
    with pytest.raises(AssertionError):
        TRANSITIONS[(State.PRIMARY, Event.PEER_PRIMARY)](machine, Event.PEER_PRIMARY, NOW)


@cell(State.PRIMARY, Event.PEER_BACKUP)
def test_primary_hears_fresh_backup_and_leads_in_a_new_epoch() -> None:
    machine = ours(Role.PRIMARY, State.PRIMARY, epoch=5)
    backup = peer(Role.BACKUP, State.BACKUP, epoch=4)
    outcome = hear(machine, backup)
    assert outcome.machine.state is State.ACTIVE
    assert outcome.machine.epoch == 7
    assert outcome.transition == Transition(
        State.PRIMARY, State.ACTIVE, Event.PEER_BACKUP, "the peer is a fresh backup: we lead"
    )
    assert outcome.actions == (PersistEpoch(7),)
    assert outcome.decision is None
    assert_heard(outcome, backup)


@cell(State.PRIMARY, Event.PEER_ACTIVE)
def test_primary_hears_active_backup_and_follows_adopting_its_epoch() -> None:
    machine = ours(Role.PRIMARY, State.PRIMARY, epoch=1)
    backup = peer(Role.BACKUP, State.ACTIVE, epoch=3)
    outcome = hear(machine, backup)
    assert outcome.machine.state is State.PASSIVE
    assert outcome.machine.epoch == 3
    assert outcome.transition == Transition(
        State.PRIMARY,
        State.PASSIVE,
        Event.PEER_ACTIVE,
        "the backup took over while we were down",
    )
    assert outcome.actions == (PersistEpoch(3),)
    assert_heard(outcome, backup)


@cell(State.PRIMARY, Event.PEER_PASSIVE)
def test_primary_hears_passive_backup_that_heard_it_with_no_active_and_leads() -> None:
    machine = ours(Role.PRIMARY, State.PRIMARY, epoch=2)
    backup = replace(peer(Role.BACKUP, State.PASSIVE, epoch=2), echo=1)
    outcome = hear(machine, backup)
    assert outcome.machine.state is State.ACTIVE
    assert outcome.machine.epoch == 3
    assert outcome.transition == Transition(
        State.PRIMARY, State.ACTIVE, Event.PEER_PASSIVE, "the backup waits PASSIVE, none ACTIVE"
    )
    assert outcome.actions == (PersistEpoch(3),)
    assert_heard(outcome, backup)


def test_primary_waits_for_a_passive_backup_that_has_not_heard_this_run() -> None:
    """A PASSIVE message sent before the backup heard this run of ours (echo 0): the
    backup may be voted in before our first message reaches it. We stay PRIMARY, not
    serving, and lead on its next message, which echoes ours."""
    machine = Machine.start("alpha", Role.PRIMARY, 1, TIMEOUT, now=NOW)
    unheard = peer(Role.BACKUP, State.PASSIVE, epoch=1)
    waiting = hear(machine, unheard, NOW + 0.1)
    assert waiting.machine.state is State.PRIMARY
    assert waiting.machine.epoch == 1
    assert waiting.transition is None and waiting.actions == ()
    assert_heard(waiting, unheard, NOW + 0.1)
    assert step(waiting.machine, Event.CLIENT_REQUEST, NOW + 0.2).decision == Redirect(None)

    led = hear(waiting.machine, replace(unheard, echo=1), NOW + 1.1)
    assert led.machine.state is State.ACTIVE
    assert led.machine.epoch == 3
    assert led.transition == Transition(
        State.PRIMARY, State.ACTIVE, Event.PEER_PASSIVE, "the backup waits PASSIVE, none ACTIVE"
    )
    assert led.actions == (PersistEpoch(3),)


def test_primary_waiting_for_an_echo_follows_a_backup_voted_in_meanwhile() -> None:
    """The race the echo closes: the backup's PASSIVE message was sent before it heard us,
    and a client voted it in before our first message reached it. We never led: we
    follow it, and nothing it confirmed is set aside."""
    machine = Machine.start("alpha", Role.PRIMARY, 1, TIMEOUT, now=NOW)
    waiting = hear(machine, peer(Role.BACKUP, State.PASSIVE, epoch=1), NOW + 0.1)
    assert waiting.machine.state is State.PRIMARY
    voted_in = peer(Role.BACKUP, State.ACTIVE, epoch=2)
    follows = hear(waiting.machine, voted_in, NOW + 0.2)
    assert follows.machine.state is State.PASSIVE
    assert follows.machine.epoch == 2
    assert follows.transition == Transition(
        State.PRIMARY, State.PASSIVE, Event.PEER_ACTIVE, "the backup took over while we were down"
    )
    assert follows.actions == (PersistEpoch(2),)


@cell(State.PRIMARY, Event.CLIENT_REQUEST)
def test_started_primary_waits_a_timeout_then_the_client_vote_makes_it_active() -> None:
    machine = Machine.start("alpha", Role.PRIMARY, 0, TIMEOUT, now=0.0)

    waiting = step(machine, Event.CLIENT_REQUEST, TIMEOUT - 0.001)
    assert_unchanged(waiting, machine)
    assert waiting.decision == Redirect(None)

    voted = step(machine, Event.CLIENT_REQUEST, TIMEOUT)
    assert voted.decision == Accept()
    assert voted.machine.state is State.ACTIVE
    assert voted.machine.epoch == 1
    assert voted.actions == (PersistEpoch(1),)
    assert voted.transition == Transition(
        State.PRIMARY,
        State.ACTIVE,
        Event.CLIENT_REQUEST,
        "no peer heard for a timeout: client vote",
    )

    misconfigured = replace(machine, misconfigured="two primaries")
    refused = step(misconfigured, Event.CLIENT_REQUEST, 10 * TIMEOUT)
    assert_unchanged(refused, misconfigured)
    assert refused.decision == Refuse("two primaries")


@cell(State.PRIMARY, Event.MANUAL_RECOVER)
def test_recover_is_refused_on_a_started_primary() -> None:
    machine = ours(Role.PRIMARY, State.PRIMARY)
    outcome = step(machine, Event.MANUAL_RECOVER, NOW)
    assert_unchanged(outcome, machine)
    assert outcome.decision == Refuse(
        "recover runs on the backup while it is ACTIVE; this server is PRIMARY"
    )


@cell(State.PRIMARY, Event.HANDOVER)
def test_handover_is_refused_on_a_started_primary() -> None:
    machine = ours(Role.PRIMARY, State.PRIMARY)
    outcome = step(machine, Event.HANDOVER, NOW)
    assert_unchanged(outcome, machine)
    assert outcome.decision == Refuse(
        "a handover is taken only while PASSIVE; this server is PRIMARY"
    )


@cell(State.BACKUP, Event.PEER_PRIMARY)
def test_backup_hears_started_primary_and_waits_for_it_to_lead() -> None:
    machine = ours(Role.BACKUP, State.BACKUP, epoch=1)
    primary = peer(Role.PRIMARY, State.PRIMARY, epoch=5)
    outcome = hear(machine, primary)
    assert outcome.machine.state is State.BACKUP
    assert outcome.transition is None
    assert outcome.machine.epoch == 5  # adopted: a restart must not serve below it
    assert outcome.actions == (PersistEpoch(5),)
    assert_heard(outcome, primary)


@cell(State.BACKUP, Event.PEER_BACKUP)
def test_backup_hears_backup_is_misconfigured_and_never_reaches_the_table() -> None:
    machine = Machine.start("beta", Role.BACKUP, 2, TIMEOUT, now=NOW)
    stray = peer(Role.BACKUP, State.BACKUP, epoch=1, name="delta")
    outcome = hear(machine, stray)
    reason = "peer 'delta' is also backup: a pair needs one primary, one backup"
    assert outcome.machine == replace(machine, misconfigured=reason)
    assert outcome.transition is None
    assert outcome.actions == (LogMisconfigured("delta", 1, reason),)
    with pytest.raises(AssertionError):
        TRANSITIONS[(State.BACKUP, Event.PEER_BACKUP)](machine, Event.PEER_BACKUP, NOW)


@cell(State.BACKUP, Event.PEER_ACTIVE)
def test_backup_hears_active_primary_and_goes_passive() -> None:
    machine = ours(Role.BACKUP, State.BACKUP, epoch=0)
    primary = peer(Role.PRIMARY, State.ACTIVE, epoch=1)
    outcome = hear(machine, primary)
    assert outcome.machine.state is State.PASSIVE
    assert outcome.machine.epoch == 1
    assert outcome.transition == Transition(
        State.BACKUP, State.PASSIVE, Event.PEER_ACTIVE, "the primary is ACTIVE: normal start"
    )
    assert outcome.actions == (PersistEpoch(1),)
    assert_heard(outcome, primary)


@cell(State.BACKUP, Event.PEER_PASSIVE)
def test_backup_hears_passive_primary_and_waits_for_it_to_lead() -> None:
    machine = ours(Role.BACKUP, State.BACKUP, epoch=2)
    primary = peer(Role.PRIMARY, State.PASSIVE, epoch=2)
    outcome = hear(machine, primary)
    assert outcome.machine.state is State.BACKUP
    assert outcome.transition is None
    assert outcome.actions == ()
    assert_heard(outcome, primary)


@cell(State.BACKUP, Event.CLIENT_REQUEST)
def test_started_backup_never_serves_first() -> None:
    machine = Machine.start("beta", Role.BACKUP, 0, TIMEOUT, now=0.0)
    long_after = step(machine, Event.CLIENT_REQUEST, 100 * TIMEOUT)
    assert_unchanged(long_after, machine)
    assert long_after.decision == Redirect(None)

    heard_primary = ours(Role.BACKUP, State.BACKUP, peer=peer(Role.PRIMARY, State.PRIMARY))
    assert step(heard_primary, Event.CLIENT_REQUEST, NOW).decision == Redirect(None)

    misconfigured = replace(machine, misconfigured="two backups")
    refused = step(misconfigured, Event.CLIENT_REQUEST, NOW)
    assert_unchanged(refused, misconfigured)
    assert refused.decision == Refuse("two backups")


@cell(State.BACKUP, Event.MANUAL_RECOVER)
def test_recover_is_refused_on_a_started_backup() -> None:
    machine = ours(Role.BACKUP, State.BACKUP)
    outcome = step(machine, Event.MANUAL_RECOVER, NOW)
    assert_unchanged(outcome, machine)
    assert outcome.decision == Refuse(
        "recover runs on the backup while it is ACTIVE; this server is BACKUP"
    )


@cell(State.BACKUP, Event.HANDOVER)
def test_handover_is_refused_on_a_started_backup() -> None:
    machine = ours(Role.BACKUP, State.BACKUP)
    outcome = step(machine, Event.HANDOVER, NOW)
    assert_unchanged(outcome, machine)
    assert outcome.decision == Refuse(
        "a handover is taken only while PASSIVE; this server is BACKUP"
    )


@cell(State.ACTIVE, Event.PEER_PRIMARY)
def test_active_backup_hears_restarted_primary_and_stays() -> None:
    machine = ours(Role.BACKUP, State.ACTIVE, epoch=3)
    primary = peer(Role.PRIMARY, State.PRIMARY, epoch=2)
    outcome = hear(machine, primary)
    assert outcome.machine.state is State.ACTIVE
    assert outcome.machine.epoch == 3
    assert outcome.transition is None and outcome.actions == ()
    assert_heard(outcome, primary)


@cell(State.ACTIVE, Event.PEER_BACKUP)
def test_active_primary_hears_restarted_backup_and_stays() -> None:
    machine = ours(Role.PRIMARY, State.ACTIVE, epoch=3)
    backup = peer(Role.BACKUP, State.BACKUP, epoch=3)
    outcome = hear(machine, backup)
    assert outcome.machine.state is State.ACTIVE
    assert outcome.transition is None and outcome.actions == ()
    assert_heard(outcome, backup)


@cell(State.ACTIVE, Event.PEER_ACTIVE)
def test_dual_active_higher_epoch_stays_and_on_equal_epochs_the_primary() -> None:
    primary_ahead = hear(
        ours(Role.PRIMARY, State.ACTIVE, epoch=5), peer(Role.BACKUP, State.ACTIVE, 4)
    )
    stay_reason = "peer beta also ACTIVE in epoch 4; we stay (the higher epoch stays)"
    assert primary_ahead.machine.state is State.ACTIVE
    assert primary_ahead.transition is None
    assert primary_ahead.actions == (LogDualActive("beta", 4, stay_reason),)
    # The loser's further messages before it yields are the same episode: logged once.
    again = hear(primary_ahead.machine, peer(Role.BACKUP, State.ACTIVE, 4))
    assert again.machine.state is State.ACTIVE and again.actions == ()
    # A later split brain comes with a higher peer epoch, and is logged again.
    later = hear(again.machine, peer(Role.BACKUP, State.ACTIVE, 5))
    later_reason = "peer beta also ACTIVE in epoch 5; we stay (equal epochs: the primary stays)"
    assert later.actions == (LogDualActive("beta", 5, later_reason),)

    backup = peer(Role.BACKUP, State.ACTIVE, epoch=6)
    primary_behind = hear(ours(Role.PRIMARY, State.ACTIVE, epoch=5), backup)
    yield_reason = "peer beta also ACTIVE in epoch 6; we yield (the higher epoch stays)"
    assert primary_behind.machine.state is State.PASSIVE
    assert primary_behind.machine.epoch == 6
    assert primary_behind.transition == Transition(
        State.ACTIVE, State.PASSIVE, Event.PEER_ACTIVE, yield_reason
    )
    assert primary_behind.actions == (
        LogDualActive("beta", 6, yield_reason),
        RedirectClients("beta.example:5673"),
        PersistEpoch(6),
    )

    primary_tied = hear(
        ours(Role.PRIMARY, State.ACTIVE, epoch=5), peer(Role.BACKUP, State.ACTIVE, 5)
    )
    tied_stay = "peer beta also ACTIVE in epoch 5; we stay (equal epochs: the primary stays)"
    assert primary_tied.machine.state is State.ACTIVE
    assert primary_tied.actions == (LogDualActive("beta", 5, tied_stay),)

    backup_tied = hear(
        ours(Role.BACKUP, State.ACTIVE, epoch=5), peer(Role.PRIMARY, State.ACTIVE, 5)
    )
    tied_reason = "peer alpha also ACTIVE in epoch 5; we yield (equal epochs: the primary stays)"
    assert backup_tied.machine.state is State.PASSIVE
    assert backup_tied.machine.epoch == 5
    assert backup_tied.actions == (
        LogDualActive("alpha", 5, tied_reason),
        RedirectClients("alpha.example:5672"),
    )


@cell(State.ACTIVE, Event.PEER_PASSIVE)
def test_active_hears_passive_peer_and_stays() -> None:
    machine = ours(Role.PRIMARY, State.ACTIVE, epoch=3)
    backup = peer(Role.BACKUP, State.PASSIVE, epoch=3)
    outcome = hear(machine, backup)
    assert outcome.machine.state is State.ACTIVE
    assert outcome.transition is None and outcome.actions == ()
    assert_heard(outcome, backup)


@cell(State.ACTIVE, Event.CLIENT_REQUEST)
def test_active_accepts_clients() -> None:
    machine = ours(Role.BACKUP, State.ACTIVE, epoch=2)
    outcome = step(machine, Event.CLIENT_REQUEST, NOW + 100 * TIMEOUT)
    assert_unchanged(outcome, machine)
    assert outcome.decision == Accept()


@cell(State.ACTIVE, Event.MANUAL_RECOVER)
def test_recover_hands_an_active_backup_back_to_its_healthy_passive_primary() -> None:
    primary = peer(Role.PRIMARY, State.PASSIVE, epoch=2)
    machine = ours(Role.BACKUP, State.ACTIVE, epoch=2, peer=primary)
    outcome = step(machine, Event.MANUAL_RECOVER, NOW)
    assert outcome.decision == Accept()
    assert outcome.machine.state is State.PASSIVE
    assert outcome.machine.epoch == 2
    assert outcome.transition == Transition(
        State.ACTIVE,
        State.PASSIVE,
        Event.MANUAL_RECOVER,
        "manual recovery: handing the service back to the primary",
    )
    assert outcome.actions == (SendHandover(), RedirectClients("alpha.example:5672"))

    refusals = {
        "the primary is already ACTIVE: nothing to do": ours(
            Role.PRIMARY, State.ACTIVE, peer=peer(Role.BACKUP, State.PASSIVE)
        ),
        "the primary is not heard from: keep serving": ours(Role.BACKUP, State.ACTIVE),
        "the primary is PRIMARY, not PASSIVE": ours(
            Role.BACKUP, State.ACTIVE, peer=peer(Role.PRIMARY, State.PRIMARY)
        ),
        "two backups": ours(Role.BACKUP, State.ACTIVE, peer=primary, misconfigured="two backups"),
    }
    for reason, refusing in refusals.items():
        refused = step(refusing, Event.MANUAL_RECOVER, NOW)
        assert_unchanged(refused, refusing)
        assert refused.decision == Refuse(reason)

    expired = step(machine, Event.MANUAL_RECOVER, EXPIRED)
    assert_unchanged(expired, machine)
    assert expired.decision == Refuse("the primary is not heard from: keep serving")


@cell(State.ACTIVE, Event.HANDOVER)
def test_handover_is_refused_when_already_active() -> None:
    machine = ours(Role.PRIMARY, State.ACTIVE)
    outcome = step(machine, Event.HANDOVER, NOW)
    assert_unchanged(outcome, machine)
    assert outcome.decision == Refuse(
        "a handover is taken only while PASSIVE; this server is ACTIVE"
    )


@cell(State.PASSIVE, Event.PEER_PRIMARY)
def test_passive_backup_hears_restarted_primary_and_lets_it_lead() -> None:
    machine = ours(Role.BACKUP, State.PASSIVE, epoch=3)
    primary = peer(Role.PRIMARY, State.PRIMARY, epoch=3)
    outcome = hear(machine, primary)
    assert outcome.machine.state is State.PASSIVE
    assert outcome.transition is None and outcome.actions == ()
    assert_heard(outcome, primary)


@cell(State.PASSIVE, Event.PEER_BACKUP)
def test_passive_primary_hears_restarted_backup_and_holds_the_service() -> None:
    machine = ours(Role.PRIMARY, State.PASSIVE, epoch=2)
    backup = peer(Role.BACKUP, State.BACKUP, epoch=2)
    outcome = hear(machine, backup)
    assert outcome.machine.state is State.ACTIVE
    assert outcome.machine.epoch == 3
    assert outcome.transition == Transition(
        State.PASSIVE,
        State.ACTIVE,
        Event.PEER_BACKUP,
        "the backup restarted: we hold the service",
    )
    assert outcome.actions == (PersistEpoch(3),)


@cell(State.PASSIVE, Event.PEER_ACTIVE)
def test_passive_hears_active_peer_and_stays() -> None:
    machine = ours(Role.BACKUP, State.PASSIVE, epoch=1)
    primary = peer(Role.PRIMARY, State.ACTIVE, epoch=1)
    outcome = hear(machine, primary)
    assert outcome.machine.state is State.PASSIVE
    assert outcome.transition is None and outcome.actions == ()
    assert_heard(outcome, primary)


@cell(State.PASSIVE, Event.PEER_PASSIVE)
def test_both_passive_the_primary_takes_active_and_the_backup_stays() -> None:
    primary = hear(ours(Role.PRIMARY, State.PASSIVE, epoch=3), peer(Role.BACKUP, State.PASSIVE, 3))
    assert primary.machine.state is State.ACTIVE
    assert primary.machine.epoch == 5  # the primary leads in odd epochs only
    assert primary.transition == Transition(
        State.PASSIVE,
        State.ACTIVE,
        Event.PEER_PASSIVE,
        "both servers PASSIVE: the primary leads",
    )
    assert primary.actions == (PersistEpoch(5),)

    backup = hear(ours(Role.BACKUP, State.PASSIVE, epoch=3), peer(Role.PRIMARY, State.PASSIVE, 3))
    assert backup.machine.state is State.PASSIVE
    assert backup.transition is None and backup.actions == ()


@cell(State.PASSIVE, Event.CLIENT_REQUEST)
def test_passive_redirects_to_the_active_until_it_expires_then_the_client_vote() -> None:
    active = peer(Role.PRIMARY, State.ACTIVE, epoch=4)
    machine = ours(Role.BACKUP, State.PASSIVE, epoch=4, peer=active)

    redirected = step(machine, Event.CLIENT_REQUEST, EXPIRED - 0.001)
    assert_unchanged(redirected, machine)
    assert redirected.decision == Redirect("alpha.example:5672")

    voted = step(machine, Event.CLIENT_REQUEST, EXPIRED)
    assert voted.decision == Accept()
    assert voted.machine.state is State.ACTIVE
    assert voted.machine.epoch == 6  # the backup leads in even epochs only
    assert voted.actions == (PersistEpoch(6),)
    assert voted.transition == Transition(
        State.PASSIVE,
        State.ACTIVE,
        Event.CLIENT_REQUEST,
        "no peer heard for a timeout: client vote",
    )

    handing_over = replace(machine, peer=peer(Role.PRIMARY, State.PASSIVE, epoch=4))
    assert step(handing_over, Event.CLIENT_REQUEST, NOW).decision == Redirect(None)

    misconfigured = replace(machine, misconfigured="same name")
    refused = step(misconfigured, Event.CLIENT_REQUEST, EXPIRED)
    assert_unchanged(refused, misconfigured)
    assert refused.decision == Refuse("same name")

    # The takeover rule: a PASSIVE not in sync with its ACTIVE refuses the client vote...
    unsynced = replace(machine, in_sync=False)
    kept = step(unsynced, Event.CLIENT_REQUEST, EXPIRED)
    assert_unchanged(kept, unsynced)
    assert isinstance(kept.decision, Refuse) and "not in sync" in kept.decision.reason
    # ... and still redirects while the ACTIVE is heard.
    assert step(unsynced, Event.CLIENT_REQUEST, NOW).decision == Redirect("alpha.example:5672")
    # failover.takeover_unsynced lets it through, and the reason says so.
    allowed = step(replace(unsynced, takeover_unsynced=True), Event.CLIENT_REQUEST, EXPIRED)
    assert allowed.machine.state is State.ACTIVE and allowed.decision == Accept()
    assert allowed.transition is not None and "NOT in sync" in allowed.transition.reason


def test_a_server_restarted_with_an_incomplete_store_does_not_take_over() -> None:
    """Killed while it took its peer's snapshot, a server restarts not in sync (its data
    dir says so): its store may hold part of the snapshot, so the client vote is refused
    and it does not lead when it sees its peer; the peer, whose store is whole, leads."""
    started = replace(ours(Role.PRIMARY, State.PRIMARY, epoch=2), in_sync=False)
    outcome = step(started, Event.CLIENT_REQUEST, EXPIRED)
    assert_unchanged(outcome, started)
    assert isinstance(outcome.decision, Refuse) and "not in sync" in outcome.decision.reason
    for peer_state in (State.BACKUP, State.PASSIVE):
        assert hear(started, peer(Role.BACKUP, peer_state, 2)).machine.state is State.PRIMARY
    # The backup, at its start or PASSIVE, leads when the primary is not in sync...
    incomplete_primary = replace(peer(Role.PRIMARY, State.PRIMARY, 2), in_sync=False)
    for backup_state in (State.BACKUP, State.PASSIVE):
        backup = ours(Role.BACKUP, backup_state, epoch=2)
        led = hear(backup, incomplete_primary)
        assert led.machine.state is State.ACTIVE and led.machine.epoch == 4  # even: a backup
        # ... unless its own store is incomplete too: nobody leads without an operator.
        both = hear(replace(backup, in_sync=False), incomplete_primary)
        assert both.machine.state is backup_state
    # A whole primary still leads as before.
    whole = ours(Role.PRIMARY, State.PRIMARY, epoch=3)
    assert hear(whole, peer(Role.BACKUP, State.BACKUP, 3)).machine.state is State.ACTIVE


def test_both_starting_the_server_that_led_last_leads() -> None:
    """Both servers lost and restarted: the one that led the highest epoch (odd: the
    primary; even: the backup) holds every message the pair confirmed, some perhaps
    confirmed alone. It leads, and the other does not lead on its own store."""
    primary = ours(Role.PRIMARY, State.PRIMARY, epoch=1)
    backup_led = peer(Role.BACKUP, State.BACKUP, epoch=2)
    waits = hear(primary, backup_led)
    assert waits.machine.state is State.PRIMARY and waits.transition is None
    assert not waits.machine.in_sync and waits.machine.epoch == 2  # says so, adopts
    # So does a primary that followed it (its epoch taken from the backup's).
    assert not hear(replace(primary, epoch=2), backup_led).machine.in_sync
    # The backup leads on hearing the primary, whatever the order of the two messages,
    # once the primary's message echoes one of the backup's run.
    backup = ours(Role.BACKUP, State.BACKUP, epoch=2)
    flagged = replace(peer(Role.PRIMARY, State.PRIMARY, 2), in_sync=False)
    for told in (replace(peer(Role.PRIMARY, State.PRIMARY, 1), echo=1), flagged):
        leads = hear(backup, told)
        assert leads.machine.state is State.ACTIVE and leads.machine.epoch == 4
        assert leads.transition is not None and "led last" in leads.transition.reason
    # The primary led last: it leads, the backup does not.
    primary_led = ours(Role.PRIMARY, State.PRIMARY, epoch=3)
    assert hear(primary_led, peer(Role.BACKUP, State.BACKUP, 2)).machine.state is State.ACTIVE
    stays = hear(ours(Role.BACKUP, State.BACKUP, epoch=2), peer(Role.PRIMARY, State.PRIMARY, 3))
    assert stays.machine.state is State.BACKUP and not stays.machine.in_sync
    # A last leader whose store is incomplete, or in maintenance, is not deferred to.
    incomplete = replace(backup_led, in_sync=False)
    assert hear(primary, incomplete).machine.state is State.ACTIVE
    resting = replace(backup_led, maintenance=True)
    assert hear(primary, resting).machine.state is State.ACTIVE


def test_a_restarted_backup_that_led_last_waits_for_the_primary_to_hear_it() -> None:
    """The mirror of the restarted primary's rule, after a double failure: the primary's
    PRIMARY message was sent before it heard this run of ours, and the primary, restarted
    first, may be voted in on our silence before our first message reaches it. We stay
    BACKUP, not serving; on its next message we lead if it echoes ours, or follow it if it
    was voted in meanwhile."""
    backup = Machine.start("beta", Role.BACKUP, 2, TIMEOUT, now=NOW)
    unheard = peer(Role.PRIMARY, State.PRIMARY, epoch=1)
    waiting = hear(backup, unheard, NOW + 0.1)
    assert waiting.machine.state is State.BACKUP and waiting.machine.epoch == 2
    assert waiting.transition is None and waiting.actions == ()
    assert step(waiting.machine, Event.CLIENT_REQUEST, NOW + 0.2).decision == Redirect(None)

    led = hear(waiting.machine, replace(unheard, echo=1), NOW + 1.1)
    assert led.machine.state is State.ACTIVE and led.machine.epoch == 4
    assert led.transition == Transition(
        State.BACKUP,
        State.ACTIVE,
        Event.PEER_PRIMARY,
        "both starting, and the backup led last: the backup leads",
    )

    voted_in = peer(Role.PRIMARY, State.ACTIVE, epoch=3)
    follows = hear(waiting.machine, voted_in, NOW + 0.3)
    assert follows.machine.state is State.PASSIVE and follows.machine.epoch == 3
    # A primary that cannot be voted in (not in sync) needs no echo: the backup leads...
    incomplete = replace(unheard, in_sync=False)
    assert hear(backup, incomplete, NOW + 0.1).machine.state is State.ACTIVE
    # ... unless the pair lets a server not in sync be voted in.
    lenient = replace(backup, takeover_unsynced=True)
    assert hear(lenient, incomplete, NOW + 0.1).machine.state is State.BACKUP
    assert hear(lenient, replace(incomplete, echo=1), NOW + 1.1).machine.state is State.ACTIVE


def test_promote_refuses_a_passive_server_not_in_sync_and_force_overrides() -> None:
    unsynced = replace(ours(Role.BACKUP, State.PASSIVE, epoch=3), in_sync=False)
    refused = step(unsynced, Event.PROMOTE, EXPIRED)
    assert_unchanged(refused, unsynced)
    assert isinstance(refused.decision, Refuse) and "not in sync" in refused.decision.reason
    forced = step(unsynced, Event.FORCE_PROMOTE, EXPIRED)
    assert forced.machine.state is State.ACTIVE and forced.decision == Accept()
    assert forced.transition is not None
    assert forced.transition.reason.endswith("forced while NOT in sync")


@cell(State.PASSIVE, Event.MANUAL_RECOVER)
def test_recover_is_refused_on_a_passive_server() -> None:
    machine = ours(Role.PRIMARY, State.PASSIVE, peer=peer(Role.BACKUP, State.ACTIVE))
    outcome = step(machine, Event.MANUAL_RECOVER, NOW)
    assert_unchanged(outcome, machine)
    assert outcome.decision == Refuse(
        "recover runs on the backup while it is ACTIVE; this server is PASSIVE"
    )


@cell(State.PASSIVE, Event.HANDOVER)
def test_passive_takes_the_handover_in_a_new_epoch() -> None:
    machine = ours(Role.PRIMARY, State.PASSIVE, epoch=2, peer=peer(Role.BACKUP, State.PASSIVE, 3))
    outcome = step(machine, Event.HANDOVER, NOW)
    assert outcome.decision == Accept()
    assert outcome.machine.state is State.ACTIVE
    assert outcome.machine.epoch == 5  # above the peer's 3, odd: the primary's
    assert outcome.actions == (PersistEpoch(5),)
    assert outcome.transition == Transition(
        State.PASSIVE, State.ACTIVE, Event.HANDOVER, "the peer handed the service over"
    )

    misconfigured = replace(machine, misconfigured="same name")
    refused = step(misconfigured, Event.HANDOVER, NOW)
    assert_unchanged(refused, misconfigured)
    assert refused.decision == Refuse("same name")


def test_the_table_has_every_state_event_pair_and_each_has_its_own_test() -> None:
    every_pair = set(product(State, Event))
    assert set(TRANSITIONS) == every_pair
    assert set(CELL_TESTS) == every_pair


def test_every_handler_says_why() -> None:
    for (state, event), handler in TRANSITIONS.items():
        assert handler.__doc__, f"{state} + {event} has no why"


CONSOLE_AND_CLIENT_EVENTS = (
    Event.CLIENT_REQUEST,
    Event.MANUAL_RECOVER,
    Event.HANDOVER,
    Event.PROMOTE,
    Event.FORCE_PROMOTE,
)


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("event", CONSOLE_AND_CLIENT_EVENTS)
def test_a_refused_event_leaves_the_machine_unchanged(state: State, event: Event) -> None:
    # The misconfiguration closes every route to ACTIVE, and only an ACTIVE backup recovers:
    # so everything here is refused except the ACTIVE server's own client.
    role = Role.BACKUP if state is State.BACKUP else Role.PRIMARY
    other = Role.BACKUP if role is Role.PRIMARY else Role.PRIMARY
    machine = ours(role, state, peer=peer(other, State.PASSIVE), misconfigured="misconfigured")
    outcome = step(machine, event, EXPIRED + 100 * TIMEOUT)
    if (state, event) == (State.ACTIVE, Event.CLIENT_REQUEST):
        assert outcome.decision == Accept()
    else:
        assert isinstance(outcome.decision, Refuse)
    assert_unchanged(outcome, machine)


# --- step's own rules ----------------------------------------------------------------------


def test_peer_events_need_a_matching_state_message_and_others_none() -> None:
    machine = ours(Role.PRIMARY, State.ACTIVE)
    with pytest.raises(ValueError, match="needs the peer's state message"):
        step(machine, Event.PEER_ACTIVE, NOW)
    with pytest.raises(ValueError, match="does not match"):
        step(machine, Event.PEER_ACTIVE, NOW, peer(Role.BACKUP, State.PASSIVE))
    with pytest.raises(ValueError, match="does not match"):
        step(machine, Event.CLIENT_REQUEST, NOW, peer(Role.BACKUP, State.PASSIVE))


def test_a_peer_with_our_name_is_misconfigured() -> None:
    machine = ours(Role.PRIMARY, State.PRIMARY)
    twin = peer(Role.BACKUP, State.BACKUP, name="alpha")
    outcome = hear(machine, twin)
    reason = "peer has our name 'alpha': two servers must not share a name"
    assert outcome.machine.state is State.PRIMARY
    assert outcome.machine.misconfigured == reason
    assert outcome.machine.peer is None
    assert outcome.actions == (LogMisconfigured("alpha", 1, reason),)


def test_a_peer_whose_start_state_contradicts_its_role_is_misconfigured() -> None:
    machine = ours(Role.BACKUP, State.BACKUP)
    confused = peer(Role.PRIMARY, State.BACKUP, name="alpha")
    outcome = hear(machine, confused)
    assert outcome.machine.misconfigured == "peer 'alpha' reports BACKUP but is configured primary"
    assert outcome.machine.state is State.BACKUP


def test_a_misconfiguration_is_reported_once_and_changes_neither_peer_nor_epoch() -> None:
    machine = Machine.start("alpha", Role.PRIMARY, 2, TIMEOUT, now=0.0)
    stray = peer(Role.PRIMARY, State.ACTIVE, epoch=9, name="gamma")
    first = hear(machine, stray, now=1.0)
    again = hear(first.machine, stray, now=2.0)
    assert len(first.actions) == 1
    assert_unchanged(again, first.machine)
    assert again.machine.epoch == 2
    assert again.machine.peer is None
    assert again.machine.peer_expiry == TIMEOUT


def test_a_correctly_configured_peer_clears_a_misconfiguration() -> None:
    machine = ours(Role.PRIMARY, State.PRIMARY, misconfigured="two primaries")
    backup = peer(Role.BACKUP, State.BACKUP)
    outcome = hear(machine, backup)
    assert outcome.machine.state is State.ACTIVE
    assert_heard(outcome, backup)


def test_an_active_server_keeps_serving_when_a_stray_appears() -> None:
    machine = ours(Role.PRIMARY, State.ACTIVE, peer=peer(Role.BACKUP, State.PASSIVE))
    stray = peer(Role.PRIMARY, State.PRIMARY, name="gamma")
    outcome = hear(machine, stray)
    assert outcome.machine.state is State.ACTIVE
    assert step(outcome.machine, Event.CLIENT_REQUEST, NOW).decision == Accept()


def test_start_sets_the_start_state_and_a_timeout_of_grace() -> None:
    primary = Machine.start("alpha", Role.PRIMARY, 7, TIMEOUT, now=10.0)
    assert primary == Machine("alpha", Role.PRIMARY, State.PRIMARY, 7, TIMEOUT, 10.0 + TIMEOUT)
    assert Machine.start("beta", Role.BACKUP, 0, TIMEOUT, now=0.0).state is State.BACKUP
    assert not primary.peer_alive(10.0)
    with pytest.raises(ValueError, match="timeout"):
        Machine.start("alpha", Role.PRIMARY, 0, 0.0, now=0.0)
    with pytest.raises(ValueError, match="epoch"):
        Machine.start("alpha", Role.PRIMARY, -1, TIMEOUT, now=0.0)


def test_peer_alive_until_the_expiry() -> None:
    machine = ours(Role.BACKUP, State.PASSIVE, peer=peer(Role.PRIMARY, State.ACTIVE))
    assert machine.peer_alive(EXPIRED - 0.001)
    assert not machine.peer_alive(EXPIRED)


def test_enum_values_are_the_wire_and_log_spellings() -> None:
    assert [role.value for role in Role] == ["primary", "backup"]
    assert [state.value for state in State] == ["PRIMARY", "BACKUP", "ACTIVE", "PASSIVE"]
    assert all(event.value == event.name for event in Event)
