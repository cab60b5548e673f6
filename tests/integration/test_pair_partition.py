"""The peer link cut while both servers live: the client vote decides who serves.

Both proxies on the peer link are cut; clients still reach both servers directly. Clients
on one side only: only that side serves. Clients on both: dual active, resolved by epoch
once the link heals. Every case shows in the two event logs.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from amqha.client import connect_robust
from tests.pairs import (
    MakePair,
    Pair,
    Publisher,
    connect_plain,
    hold,
    pair_info,
    pika_open_error,
)


def kinds(pair: Pair, server, since: float) -> list[str]:
    return [e["event"] for e in pair.events(server) if e["ts"] >= since]


def moves(pair: Pair, server, since: float) -> list[tuple[str, str, str]]:
    return [
        (e["from"], e["to"], e["trigger"])
        for e in pair.events(server)
        if e["event"] == "transition" and e["ts"] >= since
    ]


async def wait_event(pair: Pair, server, event: str, since: float, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in pair.events(server) if e["event"] == event and e["ts"] >= since]
        if found:
            return found[0]
        await asyncio.sleep(0.02)
    raise TimeoutError(f"no {event} in {server.name}'s event log after {timeout} s")


@pytest.mark.parametrize("mode", ["refuse", "blackhole"])
async def test_clients_only_on_the_active_side_keep_it_the_only_server(
    make_pair: MakePair, mode: str
) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    connection = await connect_robust([pair.primary.url])
    publisher = Publisher(connection, "partition-one-side")
    async with connection:
        publisher.start()
        try:
            cut = time.time()
            pair.cut(mode)
            for server in pair.servers:
                lost = await wait_event(pair, server, "peer_lost", cut)
                assert lost["state"] == ("ACTIVE" if server is pair.primary else "PASSIVE")
            # Several timeouts without the peer: nobody asks the backup, so it stands by,
            # and the primary serves its clients all along.
            await hold(lambda: pair.states() == ("ACTIVE", "PASSIVE"), 4 * pair.timeout, "cut")
            await publisher.confirmed_after(time.time(), 5, by="primary")
            assert (await pair.status(pair.backup))["clients"] == 0

            healed = time.time()
            pair.heal()
            for server in pair.servers:
                await wait_event(pair, server, "peer_up", healed)
            await hold(lambda: pair.states() == ("ACTIVE", "PASSIVE"), 2 * pair.timeout, "healed")
            await publisher.confirmed_after(time.time(), 5, by="primary")
        finally:
            await publisher.stop()
    for server in pair.servers:
        assert moves(pair, server, cut) == []
        assert "dual_active" not in kinds(pair, server, cut)
    assert pair.epoch(pair.primary) == pair.epoch(pair.backup) == 1


async def test_clients_only_on_the_passive_side_move_the_service_there(
    make_pair: MakePair,
) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    cut = time.time()
    pair.cut()
    await wait_event(pair, pair.backup, "peer_lost", cut)
    # A client that can only use the backup: refused until the peer is a timeout silent,
    # then its connect is the vote.
    client = await connect_plain(pair.backup)
    async with client:
        assert (await pair.status(pair.backup))["state"] == "ACTIVE"
        # The isolated primary still holds ACTIVE, but nobody is connected to it.
        primary = await pair.status(pair.primary)
        assert (primary["state"], primary["clients"]) == ("ACTIVE", 0)
        # The primary, too, finds its peer silent before the link heals (on a busy machine
        # the backup's vote can come before the primary's own timeout runs out).
        lost = await wait_event(pair, pair.primary, "peer_lost", cut)
        assert lost["state"] == "ACTIVE"

        healed = time.time()
        pair.heal()
        # The backup took a higher epoch with its vote: it stays, the primary yields.
        await pair.wait_states("PASSIVE", "ACTIVE")
        assert not client.is_closed
        dual = await wait_event(pair, pair.primary, "dual_active", healed)
        assert "we yield" in dual["reason"] and dual["peer"] == "backup"
    assert moves(pair, pair.backup, cut) == [("PASSIVE", "ACTIVE", "CLIENT_REQUEST")]
    assert moves(pair, pair.primary, cut) == [("ACTIVE", "PASSIVE", "PEER_ACTIVE")]
    assert pair.epoch(pair.backup) == pair.epoch(pair.primary) == 2


async def test_clients_on_both_sides_dual_active_resolves_by_epoch_on_heal(
    make_pair: MakePair,
) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    # Clients of the primary: an amqha.client publisher that lists only the primary, and
    # a pika-like plain client whose close we read on the wire.
    robust = await connect_robust([pair.primary.url])
    publisher = Publisher(robust, "partition-both-sides")
    async with robust:
        publisher.start()
        try:
            await publisher.confirmed_after(time.time(), 5, by="primary")
            cut = time.time()
            pair.cut()
            await wait_event(pair, pair.backup, "peer_lost", cut)
            backup_client = await connect_plain(pair.backup)
            async with backup_client:
                # Split brain: both serve their own clients.
                assert pair.states() == ("ACTIVE", "ACTIVE")
                await publisher.confirmed_after(time.time(), 5, by="primary")
                primary_client = await connect_plain(pair.primary)
                closed = asyncio.get_running_loop().create_future()
                primary_client.close_callbacks.add(
                    lambda _, error: closed.done() or closed.set_result(error)
                )
                epochs = (pair.epoch(pair.primary), pair.epoch(pair.backup))
                assert epochs == (1, 2)

                healed = time.time()
                pair.heal()
                await pair.wait_states("PASSIVE", "ACTIVE")
                # The loser (lower epoch) closed its clients naming the winner...
                error = await asyncio.wait_for(closed, 5)
                assert f"NOT_ACTIVE - active server is {pair.backup.address}" in str(error)
                # ...and the amqha.client publisher followed to the winner.
                await publisher.confirmed_after(healed, 10, by="backup")
                assert pair_info(robust)["name"] == "backup"
                assert not backup_client.is_closed
        finally:
            await publisher.stop()

    # The loser always logs it. The winner logs it once when it hears the loser still
    # ACTIVE (however many messages the loser sends before it yields); when the loser's
    # heal-time message comes after it yielded, there is nothing left to resolve there.
    loser = [e for e in pair.events(pair.primary) if e["event"] == "dual_active"]
    assert len(loser) == 1 and loser[0]["ts"] >= healed
    assert loser[0]["peer"] == "backup" and loser[0]["peer_epoch"] == 2
    assert "we yield (the higher epoch stays)" in loser[0]["reason"]
    winner = [e for e in pair.events(pair.backup) if e["event"] == "dual_active"]
    assert len(winner) <= 1
    assert all("we stay" in e["reason"] and e["peer_epoch"] == 1 for e in winner)
    assert moves(pair, pair.primary, cut) == [("ACTIVE", "PASSIVE", "PEER_ACTIVE")]
    assert moves(pair, pair.backup, cut) == [("PASSIVE", "ACTIVE", "CLIENT_REQUEST")]
    # After the heal a client of the old primary is sent to the backup.
    error_text = await asyncio.to_thread(pika_open_error, pair.primary.port)
    assert error_text is not None and pair.backup.address in error_text
