"""The reconnect loops of the peer links (peering/agent.py, ``Reconnecting``) and of the
federation links (amqha/federation/link.py) end when their task is cancelled, even when a
connect step finishes with an error in the same turn as the cancel (``asyncio.wait_for``
then raises that error and the cancel is not seen again)."""

from __future__ import annotations

import asyncio

import pytest

from amqha.federation.link import Link
from config.schema import FederatedExchange
from peering.agent import Reconnecting, bounded
from tests.memory_peer import solo_broker


class OneStepLink(Reconnecting):
    """A link whose connect waits on a future the test resolves."""

    def __init__(self) -> None:
        super().__init__("amqp://127.0.0.1:1/", "test-link", 0.01, 0.02, 5.0, None, None)
        self.step: asyncio.Future[None] | None = None
        self.connecting = asyncio.Event()

    async def _open(self) -> None:
        self.step = asyncio.get_running_loop().create_future()
        self.connecting.set()
        await bounded(self.step, self.connect_timeout)

    async def _wait_closed(self) -> str:
        return "closed"

    async def _close(self) -> None:
        return None


async def refused_then_cancelled(link: OneStepLink | OneStepFederationLink) -> None:
    """The link's connect fails (a refused socket) and its task is cancelled (the loop's
    end at shutdown) before the task runs again: the task ends, cancelled."""
    task = link._task
    assert task is not None
    await asyncio.wait_for(link.connecting.wait(), 5)
    assert link.step is not None
    link.step.set_exception(ConnectionRefusedError("refused"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert task.cancelled()


@pytest.mark.asyncio
async def test_a_cancel_in_the_turn_a_connect_fails_ends_the_link() -> None:
    link = OneStepLink()
    await link.start()
    await refused_then_cancelled(link)


class OneStepFederationLink(Link):
    """A federation link whose session waits on a future the test resolves."""

    def __init__(self) -> None:
        spec = FederatedExchange("market", "central")
        super().__init__(solo_broker(), spec, ("amqp://127.0.0.1:1/",), "here", "id", 5.0, 5.0, 10)
        self.step: asyncio.Future[None] | None = None
        self.connecting = asyncio.Event()

    async def _session_run(self) -> None:
        self.step = asyncio.get_running_loop().create_future()
        self.connecting.set()
        await asyncio.wait_for(self.step, 5)


@pytest.mark.asyncio
async def test_a_cancel_in_the_turn_a_federation_connect_fails_ends_the_link() -> None:
    link = OneStepFederationLink()
    link.start()
    await refused_then_cancelled(link)
