"""The switchover's wait (failover/switchover.py; docs/failover.md, "Planned switchover",
step 4): the controller's loop around the real state machine. The broker's side is played by
a stand-in that answers the three things the loop asks of it (is it drained, is its PASSIVE
in sync on the feed, hold the clients or read them), because the moment under test cannot be
placed with real processes: a stale state message from the PASSIVE arriving between the
drain's last look and the step. tests/integration/test_switchover.py meets it by chance
(a cut as the switchover drains)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from amqha.gate import ConsoleRefused
from failover import fsm
from failover.switchover import Switchover

# The longest any of these switchovers may take: each waits at most a fraction of it.
BOUND_S = 10.0


class DrainingBroker:
    """Drained after one look; at that look, ``on_look`` runs (a message arriving meanwhile).
    Its PASSIVE stays in sync on the feed throughout."""

    def __init__(self, on_look: Callable[[], None]) -> None:
        self.on_look: Callable[[], None] | None = on_look
        self.held: list[bool] = []

    def passive_in_sync(self) -> bool:
        return True

    def undrained(self) -> str | None:
        if self.on_look is None:
            return None
        hook, self.on_look = self.on_look, None
        hook()
        return "a confirm waits for the PASSIVE"

    def hold_clients(self, hold: bool) -> None:
        self.held.append(hold)


class Controller(Switchover):
    """The switchover mixed into a controller that applies the machine's outcomes and keeps
    its records in a list."""

    def __init__(self, machine: fsm.Machine) -> None:
        self.machine = machine
        self.loop = asyncio.get_running_loop()
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.init_switchover()

    def apply(self, outcome: fsm.Outcome) -> fsm.Decision | None:
        self.machine = outcome.machine
        return outcome.decision

    def _write(self, event: str, **fields: Any) -> None:
        self.records.append((event, fields))

    def passive_sync(self, in_sync: bool) -> None:
        """A state message from the PASSIVE saying whether it is in sync."""
        assert self.machine.peer is not None
        self.machine = replace(self.machine, peer=replace(self.machine.peer, in_sync=in_sync))


def _active(loop: asyncio.AbstractEventLoop) -> fsm.Machine:
    passive = fsm.PeerInfo("beta", fsm.Role.BACKUP, fsm.State.PASSIVE, 3, "beta.example:5673")
    return fsm.Machine(
        "alpha", fsm.Role.PRIMARY, fsm.State.ACTIVE, 3, 3.0, loop.time() + 1000, passive
    )


async def test_a_stale_state_message_at_the_step_is_waited_out_within_the_wait() -> None:
    """The drain ends, but a state message saying "not in sync" came in meanwhile (sent
    before the PASSIVE was back in sync); the next one, 0.2 s later, says in sync. Asked
    with a wait, the switchover waits for it and hands over, with no failed record."""
    controller = Controller(_active(asyncio.get_running_loop()))

    def stale_then_fresh() -> None:
        controller.passive_sync(False)
        controller.loop.call_later(0.2, controller.passive_sync, True)

    controller.broker = DrainingBroker(stale_then_fresh)
    answer = await asyncio.wait_for(controller._switchover(5.0, "admin"), BOUND_S)
    assert answer["state"] == "PASSIVE" and answer["to"] == "beta"
    assert controller.machine.state is fsm.State.PASSIVE
    phases = [fields["phase"] for event, fields in controller.records if event == "switchover"]
    assert phases == ["requested", "handed_over"]
    # Held for the first drain, read again when the step was refused, held for the second.
    assert controller.broker.held == [True, False, True]


@pytest.mark.parametrize(
    ("wait", "said"),
    [
        (0.0, "switchover failed, this server serves on: the backup is not in sync"),
        (0.5, "switchover refused after waiting 0.5 s: the backup is not in sync"),
    ],
    ids=["no wait", "outlasted"],
)
async def test_a_refused_step_with_no_wait_left_fails_with_its_reason(
    wait: float, said: str
) -> None:
    """The same stale message with no wait: the switchover fails at once, saying why. With
    a wait, but the PASSIVE's messages saying "not in sync" from then on: it waits out its
    wait, then fails with the machine's reason. Either way the clients are read again."""
    controller = Controller(_active(asyncio.get_running_loop()))
    controller.broker = DrainingBroker(lambda: controller.passive_sync(False))
    with pytest.raises(ConsoleRefused, match=said):
        await asyncio.wait_for(controller._switchover(wait, "admin"), BOUND_S)
    assert controller.machine.state is fsm.State.ACTIVE
    assert controller.broker.held == [True, False]
    assert [fields["phase"] for _, fields in controller.records] == ["requested", "failed"]
