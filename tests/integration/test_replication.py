"""Replication to the PASSIVE: real pairs, real clients, real kill -9s.

Every test that kills a server checks that no confirmed message went missing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq

from tests.durability import PERSISTENT, Ledger, drain, publish_confirmed
from tests.pairs import Pair, client_vote


async def declare(url: str, queue: str, **arguments: Any) -> None:
    connection = await aiormq.connect(url)
    channel = await connection.channel()
    await channel.queue_declare(queue, durable=True, arguments=arguments or None)
    await connection.close()


async def replication(pair: Pair, server: Any) -> dict[str, Any]:
    return (await pair.status(server)).get("replication", {})


async def wait_in_sync(pair: Pair, active: Any, timeout: float = 30.0) -> None:
    async def in_sync() -> bool:
        feed = (await replication(pair, active)).get("feed") or {}
        return feed.get("state") == "in_sync"

    deadline = asyncio.get_running_loop().time() + timeout
    while not await in_sync():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no in-sync passive after {timeout} s: {await replication(pair, active)}")
        await asyncio.sleep(0.05)


async def test_confirmed_messages_survive_a_kill_9_of_the_active(make_pair: Any) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "orders")
    await wait_in_sync(pair, pair.primary)
    connection = await aiormq.connect(pair.primary.url)
    channel = await connection.channel()
    for n in range(2000):
        if n % 100 == 0:
            await asyncio.gather(
                *(
                    channel.basic_publish(f"o-{k}".encode(), routing_key="orders", properties=PERSISTENT)
                    for k in range(n, n + 100)
                )
            )
    pair.kill(pair.primary)
    await client_vote([pair.backup], retry_for=20)
    await pair.wait_states(None, "ACTIVE", timeout=20)
    found = [body for body, _ in await drain(pair.backup.url, "orders")]
    assert found == [f"o-{k}".encode() for k in range(2000)]
