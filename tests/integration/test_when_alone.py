"""``replication.when_alone: hold`` (docs/durability.md, "The contract"): with its PASSIVE
killed, the ACTIVE confirms nothing; the PASSIVE restarted, the held confirms come once it
is in sync; then a kill -9 of the ACTIVE loses nothing confirmed and quarantines nothing.
The default, ``confirm``, confirms alone meanwhile (the same steps, for contrast). A bad
value is refused naming the file and the key."""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq
import pytest

from tests.durability import drain
from tests.integration.test_replication import replication
from tests.pairs import MakePair, client_vote, poll

QUEUE = "alone"
PERSISTENT = aiormq.spec.Basic.Properties(delivery_mode=2)


async def _publish(url: str, count: int, prefix: str) -> tuple[Any, list[asyncio.Future[Any]]]:
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.queue_declare(QUEUE, durable=True)
    futures = [
        asyncio.ensure_future(
            channel.basic_publish(
                f"{prefix}-{n}".encode(), routing_key=QUEUE, properties=PERSISTENT
            )
        )
        for n in range(count)
    ]
    return connection, futures


async def _held_confirms(pair: Any, active: Any, count: int) -> dict[str, Any]:
    """The ACTIVE's feed status once it holds ``count`` confirms (bounded: 30 s)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        feed = (await replication(pair, active)).get("feed") or {}
        if feed.get("held_confirms") == count:
            return feed
        assert asyncio.get_running_loop().time() < deadline, f"not {count} held: {feed}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("mode", ["hold", "confirm"])
async def test_with_no_passive_in_sync_the_active_holds_its_confirms_or_not(
    make_pair: MakePair, mode: str
) -> None:
    pair = make_pair(replication={"when_alone": mode}).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    active, passive = await pair.settled(timeout=60)
    connection, before = await _publish(active.url, 50, "before")
    await asyncio.wait_for(asyncio.gather(*before), 30)  # in sync: confirmed

    pair.kill(passive)
    alone_connection, alone = await _publish(active.url, 50, "alone")
    if mode == "confirm":
        await asyncio.wait_for(asyncio.gather(*alone), 30)
    else:
        # Every one of them read and stored, and held: the feed says so; none confirmed.
        held = await _held_confirms(pair, active, 50)
        assert held["held_since"] is not None
        done = sum(f.done() for f in alone)
        assert done == 0, f"{done} confirms went out with no PASSIVE in sync"
        passive.start()
        await asyncio.wait_for(asyncio.gather(*alone), 60)  # once it is in sync
        await pair.settled(timeout=60)
    confirmed = {f"before-{n}".encode() for n in range(50)} | {
        f"alone-{n}".encode() for n, f in enumerate(alone) if f.done() and f.result()
    }
    for each in (connection, alone_connection):
        await each.close()
    if mode == "confirm":
        return  # what follows is the hold mode's promise
    pair.kill(active)
    await client_vote([passive], retry_for=30)
    await poll(lambda: pair.state(passive) == "ACTIVE", 30, "the takeover")
    remaining = {body for body, _ in await drain(passive.url, QUEUE)}
    assert confirmed <= remaining, f"{len(confirmed - remaining)} confirmed messages lost"
    assert pair.quarantine_files() == []
