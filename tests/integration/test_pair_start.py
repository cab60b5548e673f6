"""The pair starts right in either order, and clients that reach the passive find the active.

Two real ``amqha`` processes on loopback, peered through proxies (tests/pairs.py).
"""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from pamqp import commands

from amqha.client import ConnectionRedirect, connect, connect_robust
from tests.pairs import (
    MakePair,
    Pair,
    hold,
    pair_info,
    pika_open_error,
    plain_connect,
    raw_open,
)


def transitions(pair: Pair, server) -> list[tuple[str, str, str]]:
    return [
        (e["from"], e["to"], e["trigger"])
        for e in pair.events(server)
        if e["event"] == "transition"
    ]


@pytest.mark.parametrize("first", ["primary", "backup"])
async def test_either_start_order_gives_primary_active_backup_passive(
    make_pair: MakePair, first: str
) -> None:
    pair = make_pair()
    early, late = (pair.primary, pair.backup) if first == "primary" else (pair.backup, pair.primary)
    early.start()
    # Alone for over a timeout with no client asking: the first server stays in its start state.
    start_state = "PRIMARY" if early is pair.primary else "BACKUP"
    await hold(lambda: pair.state(early) == start_state, 2 * pair.timeout, f"{early.name} waits")
    late.start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    # Settled for good: several timeouts later nothing has moved.
    await hold(lambda: pair.states() == ("ACTIVE", "PASSIVE"), 3 * pair.timeout, "pair settled")

    primary, backup = await pair.status(pair.primary), await pair.status(pair.backup)
    assert (primary["state"], backup["state"]) == ("ACTIVE", "PASSIVE")
    assert primary["epoch"] == backup["epoch"] == 1
    assert primary["peer"]["name"] == "backup" and primary["peer"]["alive"]
    assert backup["peer"]["name"] == "primary" and backup["peer"]["state"] == "ACTIVE"
    assert backup["peer"]["listen"] == pair.primary.address

    assert transitions(pair, pair.primary) == [("PRIMARY", "ACTIVE", "PEER_BACKUP")]
    assert transitions(pair, pair.backup) == [("BACKUP", "PASSIVE", "PEER_ACTIVE")]
    for server in pair.servers:
        kinds = [e["event"] for e in pair.events(server)]
        assert kinds[0] == "started" and "peer_up" in kinds
        assert "dual_active" not in kinds and "misconfigured" not in kinds


async def test_clients_reaching_the_passive_end_up_on_the_active(make_pair: MakePair) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    active_text = f"NOT_ACTIVE - active server is {pair.primary.address}"

    # amqha.client pointed at the passive only: redirected, and it works there.
    connection = await connect([pair.backup.url], retry_for=5)
    async with connection:
        assert pair_info(connection)["name"] == "primary"
        assert pair_info(connection)["state"] == "ACTIVE"
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("", exclusive=True)
        await channel.default_exchange.publish(aio_pika.Message(b"hi"), routing_key=queue.name)
        message = await queue.get(timeout=5)
        assert message.body == b"hi"
    robust = await connect_robust([pair.backup.url])
    async with robust:
        assert pair_info(robust)["name"] == "primary"

    # Plain aio-pika: refused before Tune, with the text (see test_compat_passive_refusal).
    with pytest.raises(Exception, match=active_text):
        await plain_connect(pair.backup.url, 5)
    # pika: 320 with the active's address in a text a program can read.
    error = await asyncio.to_thread(pika_open_error, pair.backup.port)
    assert error is not None and f"(320) '{active_text}'" in error
    # On the wire: a plain client gets Close 320, a redirect-capable one the Redirect frame.
    close = await asyncio.to_thread(raw_open, pair.backup.port)
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (320, active_text)
    redirect = await asyncio.to_thread(raw_open, pair.backup.port, True)
    assert isinstance(redirect, ConnectionRedirect)
    assert redirect.host == pair.primary.address
    assert set(redirect.known_hosts.split(",")) == {pair.primary.address, pair.backup.address}
    # The active lets the same raw client in.
    assert isinstance(
        await asyncio.to_thread(raw_open, pair.primary.port), commands.Connection.OpenOk
    )

    # Every attempt is counted; the event log records at most one a second.
    assert (await pair.status(pair.backup))["redirects"] >= 6
    redirects = [e for e in pair.events(pair.backup) if e["event"] == "redirect"]
    assert redirects
    assert all(e["to"] == pair.primary.address and e["state"] == "PASSIVE" for e in redirects)
    assert pair.states() == ("ACTIVE", "PASSIVE")
