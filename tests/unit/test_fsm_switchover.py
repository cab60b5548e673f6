"""The planned switchover's cells (docs/failover.md, "Planned switchover"): the ACTIVE of
either role hands the service to its in-sync PASSIVE; every other state refuses, and so
does an ACTIVE whose peer is not heard, not PASSIVE, not in sync, or that is fenced or
misconfigured."""

from __future__ import annotations

from dataclasses import replace

import pytest

from failover.fsm import (
    STALE_HANDOVER,
    Accept,
    Event,
    RedirectClients,
    Refuse,
    Role,
    SendHandover,
    State,
    Transition,
    step,
)
from tests.unit.fsm_support import EXPIRED, LISTEN, NOW, assert_unchanged, cell, ours, peer


@cell(State.ACTIVE, Event.SWITCHOVER)
@pytest.mark.parametrize("role", [Role.PRIMARY, Role.BACKUP])
def test_an_active_of_either_role_hands_over_to_its_in_sync_passive(role: Role) -> None:
    other = Role.BACKUP if role is Role.PRIMARY else Role.PRIMARY
    passive = peer(other, State.PASSIVE, epoch=3)
    machine = ours(role, State.ACTIVE, epoch=3, peer=passive)
    outcome = step(machine, Event.SWITCHOVER, NOW)
    assert outcome.decision == Accept()
    assert outcome.machine.state is State.PASSIVE and outcome.machine.epoch == 3
    words = "backup" if role is Role.PRIMARY else "primary"
    assert outcome.transition == Transition(
        State.ACTIVE,
        State.PASSIVE,
        Event.SWITCHOVER,
        f"planned switchover: handing the service to the {words}",
    )
    listen = LISTEN[passive.name]
    assert outcome.actions == (SendHandover(), RedirectClients(listen))

    refusals = {
        f"the {words} is not heard from": ours(role, State.ACTIVE),
        f"the {words} is PRIMARY, not PASSIVE": ours(
            role, State.ACTIVE, peer=replace(passive, state=State.PRIMARY)
        ),
        f"the {words} is not in sync: it would serve without messages this server confirmed": ours(
            role, State.ACTIVE, peer=replace(passive, in_sync=False)
        ),
        "two primaries": ours(role, State.ACTIVE, peer=passive, misconfigured="two primaries"),
    }
    for reason, refusing in refusals.items():
        refused = step(refusing, Event.SWITCHOVER, NOW)
        assert_unchanged(refused, refusing)
        assert refused.decision == Refuse(reason)
    expired = step(machine, Event.SWITCHOVER, EXPIRED)
    assert_unchanged(expired, machine)
    fenced = replace(machine, thawed=NOW - 1)
    assert isinstance(step(fenced, Event.SWITCHOVER, NOW).decision, Refuse)


def _refused_on(state: State, role: Role) -> None:
    machine = ours(role, state, peer=peer(Role.BACKUP, State.ACTIVE))
    outcome = step(machine, Event.SWITCHOVER, NOW)
    assert_unchanged(outcome, machine)
    assert outcome.decision == Refuse(
        f"a switchover runs on the ACTIVE server; this server is {state.value}"
    )


@cell(State.PRIMARY, Event.SWITCHOVER)
def test_a_starting_primary_refuses_a_switchover() -> None:
    _refused_on(State.PRIMARY, Role.PRIMARY)


@cell(State.BACKUP, Event.SWITCHOVER)
def test_a_starting_backup_refuses_a_switchover() -> None:
    _refused_on(State.BACKUP, Role.BACKUP)


@cell(State.PASSIVE, Event.SWITCHOVER)
def test_a_passive_refuses_a_switchover() -> None:
    _refused_on(State.PASSIVE, Role.PRIMARY)


def test_a_peer_state_that_crossed_the_handover_does_not_take_the_service_back() -> None:
    """The primary hands over; the backup's last state message, sent before it read the
    handover, still says PASSIVE. The primary must not lead beside it ("both PASSIVE: the
    primary leads"): it waits for the backup to take the service, for a timeout at most."""
    backup = peer(Role.BACKUP, State.PASSIVE, epoch=1)
    machine = ours(Role.PRIMARY, State.ACTIVE, epoch=1, peer=backup)
    handed = step(machine, Event.SWITCHOVER, NOW).machine
    crossed = step(handed, Event.PEER_PASSIVE, NOW + 0.01, backup)
    assert crossed.machine.state is State.PASSIVE and crossed.transition is None
    # The backup took it: heard ACTIVE, the mark goes, and the pair is back to its rules.
    took = step(
        crossed.machine, Event.PEER_ACTIVE, NOW + 0.02, replace(backup, state=State.ACTIVE, epoch=2)
    )
    assert took.machine.state is State.PASSIVE and took.machine.handed_over is None
    # A handover never taken (the backup died with it): after a timeout the primary leads.
    late = step(crossed.machine, Event.PEER_PASSIVE, NOW + 0.01 + 3.5, backup)
    assert late.machine.state is State.ACTIVE


def test_a_handover_read_right_after_a_freeze_is_not_taken() -> None:
    """Frozen as its peer handed over, the PASSIVE reads the handover at the thaw: the
    peer may have been voted back in meanwhile, so it is not taken within a timeout (and
    the link's reconnect) of the thaw; after that a handover is taken as ever."""
    machine = ours(Role.BACKUP, State.PASSIVE, peer=peer(Role.PRIMARY, State.ACTIVE))
    thawed = step(machine, Event.PAUSED, NOW).machine
    assert thawed.paused_at == NOW
    refused = step(thawed, Event.HANDOVER, NOW + 0.1)
    assert refused.machine.state is State.PASSIVE
    assert refused.decision == Refuse(STALE_HANDOVER)
    later = step(thawed, Event.HANDOVER, NOW + 3.5)
    assert later.machine.state is State.ACTIVE
