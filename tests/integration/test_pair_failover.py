"""Failover by client vote, the restarted primary's return as PASSIVE, and manual recovery."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import aio_pika
import click
import pytest

from amqha.client import connect, connect_robust
from amqha.console import ConsoleClient
from tests.pairs import (
    ADMIN,
    Knocker,
    MakePair,
    Pair,
    Publisher,
    client_vote,
    hold,
    lifetime,
    pair_info,
    pika_open_error,
    url_of,
)
from tests.support import ROOT


async def fail_over_to_backup(pair: Pair) -> None:
    """kill -9 the ACTIVE primary, vote the backup in, restart the primary (PASSIVE)."""
    pair.kill(pair.primary)
    assert (await client_vote([pair.backup]))["name"] == "backup"
    pair.primary.start()
    await pair.wait_states("PASSIVE", "ACTIVE")


async def test_backup_takes_over_only_when_a_client_asks(make_pair: MakePair) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    pair.kill(pair.primary)

    # Nobody asks: the backup notices the loss but stays PASSIVE, timeout after timeout.
    await pair.wait_states(None, "PASSIVE")
    await hold(lambda: pair.state(pair.backup) == "PASSIVE", 4 * pair.timeout, "backup waits")
    lost = [e for e in pair.events(pair.backup) if e["event"] == "peer_lost"]
    assert len(lost) == 1 and lost[0]["peer"] == "primary" and lost[0]["peer_state"] == "ACTIVE"
    status = await pair.status(pair.backup)  # the console is no client: it casts no vote
    assert status["state"] == "PASSIVE" and not status["peer"]["alive"]

    # The next client's connect is the vote: the backup becomes ACTIVE in a new epoch.
    connection = await connect([pair.backup.url], retry_for=5)
    async with connection:
        # Server properties went out with Connection.Start, before this Open cast the vote.
        assert pair_info(connection)["name"] == "backup"
        status = await pair.status(pair.backup)
        assert (status["state"], status["epoch"]) == ("ACTIVE", 2)
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("", exclusive=True)
        await channel.default_exchange.publish(aio_pika.Message(b"after"), routing_key=queue.name)
        assert (await queue.get(timeout=5)).body == b"after"
    vote = [e for e in pair.events(pair.backup) if e["event"] == "transition"][-1]
    assert (vote["from"], vote["to"], vote["trigger"]) == ("PASSIVE", "ACTIVE", "CLIENT_REQUEST")
    assert vote["ts"] > lost[0]["ts"]
    assert pair.epoch(pair.backup) == 2


@pytest.mark.timeout(120)  # the client once spun on the dead server's error, never yielding
async def test_a_robust_client_listing_the_dead_primary_first_reaches_the_backup(
    make_pair: MakePair,
) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    # The client tries the primary while it dies: its first attempt may be accepted by
    # the dying process and reset, an error whose chain loops (cause and context).
    assert pair.primary.process is not None
    os.kill(pair.primary.process.pid, signal.SIGKILL)

    connection = await asyncio.wait_for(
        connect_robust([pair.primary.url, pair.backup.url]), 20 * pair.timeout
    )
    pair.kill(pair.primary)  # reaped (it is dead by now)
    async with connection:
        assert pair_info(connection)["name"] == "backup"
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("dead-first", durable=True)
        await channel.default_exchange.publish(
            aio_pika.Message(b"after the kill", delivery_mode=2), routing_key=queue.name
        )
        message = await queue.get(timeout=10)
        assert message.body == b"after the kill"
        await message.ack()
    assert pair.state(pair.backup) == "ACTIVE"


async def test_restarted_primary_comes_back_passive(make_pair: MakePair) -> None:
    # The start-up grace is one timeout: a loaded machine's restart may take longer
    # than the suite's 0.4 s to hear its peer (tests/integration/test_pair_restart_grace.py).
    pair = make_pair(timeout=1.0).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    pair.kill(pair.primary)
    assert (await client_vote([pair.backup]))["name"] == "backup"
    backup_epoch = pair.epoch(pair.backup)
    assert backup_epoch == 2 and pair.epoch(pair.primary) == 1

    # Clients knock on the primary all through its restart: none may be let in.
    with Knocker(pair.primary) as knocker:
        pair.primary.start()
        await pair.wait_states("PASSIVE", "ACTIVE")
        await hold(lambda: pair.states() == ("PASSIVE", "ACTIVE"), 2 * pair.timeout, "settled")
    assert knocker.let_in == 0, "a client was let into the restarting primary"
    assert f"close 320 NOT_ACTIVE - active server is {pair.backup.address}" in knocker.answers

    records = lifetime(pair.events(pair.primary))
    moves = [(e["from"], e["to"], e["trigger"]) for e in records if e["event"] == "transition"]
    assert moves == [("PRIMARY", "PASSIVE", "PEER_ACTIVE")]
    assert pair.epoch(pair.primary) >= backup_epoch
    status = await pair.status(pair.primary)
    assert status["epoch"] >= backup_epoch and status["peer"]["state"] == "ACTIVE"

    # A client to the restarted primary is sent to the backup.
    assert (await client_vote([pair.primary]))["name"] == "backup"
    error = await asyncio.to_thread(pika_open_error, pair.primary.port)
    assert error is not None
    assert f"(320) 'NOT_ACTIVE - active server is {pair.backup.address}'" in error
    assert pair.states() == ("PASSIVE", "ACTIVE")


async def test_console_recover_fails_back_to_the_primary(make_pair: MakePair) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await fail_over_to_backup(pair)
    pids = [server.process.pid for server in pair.servers]
    epoch_before = pair.epoch(pair.backup)

    connection = await connect_robust([pair.primary.url, pair.backup.url])
    publisher = Publisher(connection, "recover-test")
    try:
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue("recover-test")
            assert pair_info(connection)["name"] == "backup"
            publisher.start()
            await publisher.confirmed_after(time.time(), 10, by="backup")

            asked = time.time()
            result = await asyncio.to_thread(
                subprocess.run,
                [
                    sys.executable,
                    "-m",
                    "amqha",
                    "console",
                    "--server",
                    url_of(pair.primary, ADMIN),
                    "--server",
                    url_of(pair.backup, ADMIN),
                    "recover",
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 0, result.stderr
            assert "handed over to the primary" in result.stdout
            await pair.wait_states("ACTIVE", "PASSIVE")
            # The client was moved: its publishes are confirmed by the primary now.
            await publisher.confirmed_after(asked, 10, by="primary")
            count = len(publisher.confirmed)
            await asyncio.wait_for(_more_confirms(publisher, count + 20), 10)
            assert pair_info(connection)["name"] == "primary"
    finally:
        await publisher.stop()

    assert [server.process.pid for server in pair.servers] == pids
    assert all(server.alive for server in pair.servers)
    primary, backup = await pair.status(pair.primary), await pair.status(pair.backup)
    assert (primary["state"], backup["state"]) == ("ACTIVE", "PASSIVE")
    assert primary["epoch"] > epoch_before
    console = [e for e in pair.events(pair.backup) if e["event"] == "console"]
    assert console[-1]["command"] == "recover" and console[-1]["user"] == "admin"
    back = [e for e in pair.events(pair.backup) if e["event"] == "transition"][-1]
    assert (back["from"], back["to"], back["trigger"]) == ("ACTIVE", "PASSIVE", "MANUAL_RECOVER")
    took = [e for e in pair.events(pair.primary) if e["event"] == "transition"][-1]
    assert (took["from"], took["to"], took["trigger"]) == ("PASSIVE", "ACTIVE", "HANDOVER")
    # The handover carries the epoch the primary takes over in, above the backup's. (Not
    # the records' times: the backup sends the handover before it writes its own record,
    # and the two processes' records may land in either order within a millisecond.)
    assert took["epoch"] > back["epoch"]

    # Nothing to recover now: refused, with the reason, and nothing moves.
    async with ConsoleClient(url_of(pair.primary, ADMIN)) as admin:
        with pytest.raises(click.ClickException, match="recover refused"):
            await admin.call("recover")
    assert pair.states() == ("ACTIVE", "PASSIVE")


async def _more_confirms(publisher: Publisher, count: int) -> None:
    while len(publisher.confirmed) < count:
        assert publisher.task is not None and not publisher.task.done()
        await asyncio.sleep(0.02)


async def test_controller_stop_fails_over_without_a_kill_and_start_resolves(
    make_pair: MakePair,
) -> None:
    """The console's ``controller stop|start``: failover and recovery with no process stopped."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    pids = [server.process.pid for server in pair.servers]
    async with ConsoleClient(url_of(pair.primary, ADMIN)) as admin:
        assert await admin.call("controller", action="stop") == "controller stopped"
        # The backup stops hearing the primary; a client's connect makes it ACTIVE.
        await hold(lambda: pair.state(pair.backup) == "PASSIVE", 2 * pair.timeout, "no vote yet")
        assert (await client_vote([pair.backup]))["name"] == "backup"
        assert pair.epoch(pair.backup) == 2
        started = time.time()
        assert await admin.call("controller", action="start") == "controller started"
    # The primary speaks again, ACTIVE in epoch 1: the backup's epoch 2 wins.
    await pair.wait_states("PASSIVE", "ACTIVE")
    yielded = [e for e in pair.events(pair.primary) if e["event"] == "dual_active"]
    assert len(yielded) == 1 and yielded[0]["ts"] >= started and "we yield" in yielded[0]["reason"]
    console = [e["command"] for e in pair.events(pair.primary) if e["event"] == "console"]
    assert console == ["controller stop", "controller start"]
    # And back to normal by hand.
    async with ConsoleClient(url_of(pair.backup, ADMIN)) as admin:
        result = await admin.call("recover")
    assert result["state"] == "PASSIVE"
    await pair.wait_states("ACTIVE", "PASSIVE")
    assert [server.process.pid for server in pair.servers] == pids
