"""Maintenance in the state machine (docs/failover.md, "Maintenance"): a server in
maintenance never becomes ACTIVE but by FORCE_PROMOTE, wherever the table would have made
it; its peer leads where the primary would have, and hands nothing over to it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from failover.fsm import IN_MAINTENANCE, Accept, Event, Refuse, Role, State, step
from tests.unit.fsm_support import EXPIRED, NOW, assert_unchanged, hear, ours, peer

REFUSED = Refuse(IN_MAINTENANCE)


@pytest.mark.parametrize("role", [Role.PRIMARY, Role.BACKUP])
@pytest.mark.parametrize("state", [State.PRIMARY, State.PASSIVE])
def test_no_client_vote_makes_a_server_in_maintenance_active(role: Role, state: State) -> None:
    if state is State.PRIMARY and role is Role.BACKUP:
        state = State.BACKUP
    machine = replace(ours(role, state), maintenance=True)
    outcome = step(machine, Event.CLIENT_REQUEST, EXPIRED)
    if state is State.BACKUP:  # a starting backup never serves first, maintenance or not
        assert outcome.machine.state is State.BACKUP
        return
    assert_unchanged(outcome, machine)
    assert outcome.decision == REFUSED
    # Evidence of death changes nothing: the vote still refuses.
    gone = step(machine, Event.PEER_GONE, NOW).machine
    assert step(gone, Event.CLIENT_REQUEST, NOW).decision == REFUSED


@pytest.mark.parametrize("state", [State.PRIMARY, State.BACKUP, State.PASSIVE])
def test_promote_refuses_a_server_in_maintenance_and_force_takes_it_saying_so(
    state: State,
) -> None:
    role = Role.BACKUP if state is State.BACKUP else Role.PRIMARY
    machine = replace(ours(role, state), maintenance=True)
    refused = step(machine, Event.PROMOTE, EXPIRED)
    assert_unchanged(refused, machine)
    assert refused.decision == REFUSED
    forced = step(machine, Event.FORCE_PROMOTE, EXPIRED)
    assert forced.decision == Accept() and forced.machine.state is State.ACTIVE
    assert (
        forced.transition is not None and "forced while in maintenance" in forced.transition.reason
    )


def test_a_passive_in_maintenance_refuses_a_handover() -> None:
    machine = replace(
        ours(Role.PRIMARY, State.PASSIVE, peer=peer(Role.BACKUP, State.ACTIVE)), maintenance=True
    )
    outcome = step(machine, Event.HANDOVER, NOW)
    assert_unchanged(outcome, machine)
    assert outcome.decision == REFUSED


def test_a_primary_in_maintenance_does_not_lead_at_start_and_the_backup_does() -> None:
    primary = replace(ours(Role.PRIMARY, State.PRIMARY), maintenance=True)
    for seen in (State.BACKUP, State.PASSIVE):
        stays = hear(primary, peer(Role.BACKUP, seen))
        assert stays.machine.state is State.PRIMARY and stays.transition is None
    backup = ours(Role.BACKUP, State.BACKUP)
    told = replace(peer(Role.PRIMARY, State.PRIMARY), maintenance=True)
    leads = hear(backup, told)
    assert leads.machine.state is State.ACTIVE
    assert leads.transition is not None and "in maintenance" in leads.transition.reason
    # Not in sync itself, the backup does not lead either: nobody serves, nothing is lost.
    unsynced = replace(backup, in_sync=False)
    assert hear(unsynced, told).machine.state is State.BACKUP
    # The primary, seeing the backup ACTIVE, follows.
    follows = hear(primary, peer(Role.BACKUP, State.ACTIVE, epoch=2))
    assert follows.machine.state is State.PASSIVE


def test_of_two_passive_servers_the_one_not_in_maintenance_leads() -> None:
    primary = replace(ours(Role.PRIMARY, State.PASSIVE), maintenance=True)
    assert hear(primary, peer(Role.BACKUP, State.PASSIVE)).machine.state is State.PASSIVE
    backup = ours(Role.BACKUP, State.PASSIVE)
    told = replace(peer(Role.PRIMARY, State.PASSIVE), maintenance=True)
    assert hear(backup, told).machine.state is State.ACTIVE
    # A PASSIVE backup seeing the primary restart in maintenance leads too.
    restarted = replace(peer(Role.PRIMARY, State.PRIMARY), maintenance=True)
    assert hear(backup, restarted).machine.state is State.ACTIVE
    # A PASSIVE primary in maintenance seeing the backup restart does not lead.
    assert hear(primary, peer(Role.BACKUP, State.BACKUP)).machine.state is State.PASSIVE


@pytest.mark.parametrize("role", [Role.PRIMARY, Role.BACKUP])
def test_an_active_hands_nothing_to_a_peer_in_maintenance(role: Role) -> None:
    other = Role.BACKUP if role is Role.PRIMARY else Role.PRIMARY
    passive = replace(peer(other, State.PASSIVE, epoch=3), maintenance=True)
    machine = ours(role, State.ACTIVE, epoch=3, peer=passive)
    events = [Event.SWITCHOVER] + ([Event.MANUAL_RECOVER] if role is Role.BACKUP else [])
    for event in events:
        outcome = step(machine, event, NOW)
        assert_unchanged(outcome, machine)
        assert isinstance(outcome.decision, Refuse)
        assert f"the {other.value} is in maintenance" in outcome.decision.reason


def test_without_maintenance_the_table_is_as_before() -> None:
    """The flag off changes no cell this file touches (the start-up and both-PASSIVE rules)."""
    assert hear(
        ours(Role.PRIMARY, State.PRIMARY), peer(Role.BACKUP, State.BACKUP)
    ).machine.state is (State.ACTIVE)
    assert hear(
        ours(Role.BACKUP, State.BACKUP), peer(Role.PRIMARY, State.PRIMARY)
    ).machine.state is (State.BACKUP)
    assert hear(
        ours(Role.BACKUP, State.PASSIVE), peer(Role.PRIMARY, State.PASSIVE)
    ).machine.state is (State.PASSIVE)
