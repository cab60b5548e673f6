"""The peer links' reconnect loop (peering/agent.py, ``Reconnecting``) ends when its task
is cancelled, even when a connect step finishes with an error in the same turn as the
cancel (``asyncio.wait_for`` then raises that error and the cancel is not seen again)."""

from __future__ import annotations

import asyncio

import pytest

from peering.agent import Reconnecting, bounded


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


@pytest.mark.asyncio
async def test_a_cancel_in_the_turn_a_connect_fails_ends_the_link() -> None:
    link = OneStepLink()
    await link.start()
    task = link._task
    assert task is not None
    await asyncio.wait_for(link.connecting.wait(), 5)
    assert link.step is not None
    # The connect fails (a refused socket) and the task is cancelled (the loop's end at
    # shutdown), before the task runs again.
    link.step.set_exception(ConnectionRefusedError("refused"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert task.cancelled()
