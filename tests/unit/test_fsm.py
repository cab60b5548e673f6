"""The failover state machine: one test per table cell, then two machines run against each
other over a simulated peer link with a fake clock (no event loop, no sleeping)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failover.fsm import (
    PEER_EVENT,
    TRANSITIONS,
    WAITING_FOR_VOTE,
    Accept,
    Action,
    Decision,
    Event,
    Fence,
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
    Transition,
    next_epoch,
    step,
    vote_outlook,
)

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


# --- the table, cell by cell -------------------------------------------------------------

CELL_TESTS: dict[tuple[State, Event], Callable[[], None]] = {}


def cell(state: State, event: Event) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def register(test: Callable[[], None]) -> Callable[[], None]:
        assert (state, event) not in CELL_TESTS, f"two tests claim {state} + {event}"
        CELL_TESTS[(state, event)] = test
        return test

    return register


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
    machine = ours(Role.PRIMARY, State.PRIMARY, epoch=4)
    backup = peer(Role.BACKUP, State.BACKUP, epoch=6)
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
def test_primary_hears_passive_backup_with_no_active_and_leads() -> None:
    machine = ours(Role.PRIMARY, State.PRIMARY, epoch=2)
    backup = peer(Role.BACKUP, State.PASSIVE, epoch=2)
    outcome = hear(machine, backup)
    assert outcome.machine.state is State.ACTIVE
    assert outcome.machine.epoch == 3
    assert outcome.transition == Transition(
        State.PRIMARY, State.ACTIVE, Event.PEER_PASSIVE, "the backup waits PASSIVE, none ACTIVE"
    )
    assert outcome.actions == (PersistEpoch(3),)


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
    whole = ours(Role.PRIMARY, State.PRIMARY, epoch=2)
    assert hear(whole, peer(Role.BACKUP, State.BACKUP, 2)).machine.state is State.ACTIVE


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


# --- two machines against each other --------------------------------------------------------

HANDOVER_MESSAGE = "HANDOVER"


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
    inbox: list[PeerInfo | str] = field(default_factory=list)
    reports: list[Action] = field(default_factory=list)

    def state_message(self) -> PeerInfo:
        machine = self.machine
        return PeerInfo(self.name, self.role, machine.state, machine.epoch, self.listen)


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
                assert isinstance(message, PeerInfo)
                event = PEER_EVENT[message.state]
                self._apply(server, step(server.machine, event, self.now, message))

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
    - with the link healed and both servers running, two heartbeats leave exactly one
      ACTIVE and one PASSIVE server.
    """
    link = pair()
    for operation in operations:
        run(link, operation)
    link.heal()
    for server in link.servers.values():
        if not server.alive:
            link.start(server.name)
    link.tick(2)
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
