"""peering.agent.bounded: a step cancelled with its link must not leave an error that nobody
reads (asyncio logs such an error with a traceback, and a clean stop must print none)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from peering.agent import bounded


async def _fails_when_cancelled(started: asyncio.Event) -> None:
    """As an aiormq connect whose socket is closed under it: cancelled, it ends with the
    connection error instead of CancelledError."""
    started.set()
    try:
        await asyncio.Event().wait()  # until cancelled
    except asyncio.CancelledError:
        raise ConnectionError("Server connection unexpectedly closed") from None


async def _unretrieved_after_cancel(wrap: Any) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        started = asyncio.Event()
        outer = asyncio.ensure_future(wrap(_fails_when_cancelled(started), 30))
        await asyncio.wait_for(started.wait(), 10)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        del outer
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    return [c for c in reported if "never retrieved" in c.get("message", "")]


async def test_wait_for_alone_leaves_the_error_unread() -> None:
    """The failure bounded guards against, shown with the standard wait_for: if this ever
    stops failing (a newer asyncio), bounded has nothing left to do."""
    assert await _unretrieved_after_cancel(asyncio.wait_for)


async def test_bounded_reads_the_error_of_a_step_cancelled_with_its_link() -> None:
    assert await _unretrieved_after_cancel(bounded) == []


async def test_bounded_returns_the_result_and_times_out_like_wait_for() -> None:
    async def value() -> int:
        return 7

    assert await bounded(value(), 5) == 7
    with pytest.raises(TimeoutError):
        await bounded(asyncio.Event().wait(), 0.05)
