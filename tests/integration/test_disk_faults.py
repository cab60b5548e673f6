"""A disk that fails under a running server (tests/lazyfs.py): an I/O error on an fsync or
a write, a full disk. What each does is docs/durability.md, section 9: an I/O error breaks
the store for good (a retried fsync can lie), the server confirms nothing more and says
why, and an ACTIVE hands the service to its in-sync PASSIVE; a full disk is waited out.
Each test checks that no confirmed message is lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiormq
import pytest
from pamqp import commands

from tests.durability import (
    PERSISTENT,
    Ledger,
    declare_durable,
    drain,
    grown,
    nothing_lost,
    through_failovers,
)
from tests.pairs import ADMIN, Pair, poll, url_of
from tests.support import console_in_process

QUEUE = "orders"


def recorded(pair: Pair, server: Any, event: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in pair.events(server)
        if e["event"] == event and all(e.get(k) == v for k, v in fields.items())
    ]


async def loaded(
    make_pair: Any, on_lazy_disks: Any
) -> tuple[Pair, list[Any], Ledger, asyncio.Event, list[asyncio.Task[None]]]:
    """A pair on disks that fail on command, settled, its workload running through every
    failover: (pair, disks, ledger, stop, tasks)."""
    pair = make_pair()
    disks = on_lazy_disks(*pair.servers)
    pair.start()
    active, _ = await pair.settled(timeout=120)
    await declare_durable(active.url, QUEUE)
    ledger, stop = Ledger(), asyncio.Event()
    tasks = through_failovers([s.url for s in pair.servers], QUEUE, ledger, stop)
    await grown(ledger, 300, "confirms before the fault")
    return pair, disks, ledger, stop, tasks


async def mended(pair: Pair, server: Any, disk: Any, ledger: Ledger) -> None:
    """The fault cleared and ``server`` restarted: the pair whole again, confirming."""
    disk.fault("clear")
    pair.kill(server)
    server.start()
    await pair.settled(timeout=120)
    await grown(ledger, 100, "confirms after the repair")


# The faults hit the store's files (a bad region of the disk): the event log, on the same
# disk, stays readable for the test.
@pytest.mark.parametrize("fault", ["fsync eio store.sqlite", "write eio store.sqlite"])
async def test_an_io_error_on_the_actives_disk_hands_the_service_to_its_passive(
    make_pair: Any, on_lazy_disks: Any, fault: str
) -> None:
    pair, disks, ledger, stop, tasks = await loaded(make_pair, on_lazy_disks)
    active, passive = await pair.settled(timeout=120)
    try:
        disks[pair.servers.index(active)].fault(fault)
        await poll(lambda: recorded(pair, active, "disk_failed"), 60, "the disk_failed record")
        await poll(lambda: pair.state(passive) == "ACTIVE", 60, "the handover")
        assert recorded(pair, active, "switchover", phase="handed_over")
        await grown(ledger, 300, "confirms on the new ACTIVE")
        # Said where an operator looks: the console's verdict, the metric, the log.
        status = await asyncio.to_thread(
            console_in_process,
            "--server",
            url_of(active, ADMIN),
            "--server",
            url_of(passive, ADMIN),
            "status",
        )
        assert status.returncode == 3 and "disk failed" in status.stdout, status.stdout
        assert "the store's disk failed" in active.log()
        # Never two servers confirming: after the first confirm by the new ACTIVE, none by
        # the old one.
        servers = [server for _, server in ledger.confirm_times]
        first = servers.index(passive.name)
        assert active.name not in servers[first:]
        # Mended and restarted, the old ACTIVE catches up and the pair is whole again.
        await mended(pair, active, disks[pair.servers.index(active)], ledger)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    await nothing_lost(passive.url, QUEUE, ledger)


async def test_an_fsync_error_on_the_passives_disk_leaves_the_active_serving(
    make_pair: Any, on_lazy_disks: Any
) -> None:
    pair, disks, ledger, stop, tasks = await loaded(make_pair, on_lazy_disks)
    active, passive = await pair.settled(timeout=120)
    try:
        disks[pair.servers.index(passive)].fault("fsync eio store.sqlite")
        await poll(lambda: recorded(pair, passive, "disk_failed"), 60, "the disk_failed record")
        # The ACTIVE no longer waits for it: it confirms alone (when_alone: confirm).
        await poll(
            lambda: recorded(pair, active, "sync", side="active", sync="out_of_sync"),
            60,
            "the ACTIVE's feed out of sync",
        )
        await grown(ledger, 300, "confirms on the ACTIVE alone")
        assert pair.state(active) == "ACTIVE" and pair.state(passive) == "PASSIVE"
        await mended(pair, passive, disks[pair.servers.index(passive)], ledger)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    await nothing_lost(active.url, QUEUE, ledger)


async def publish_until_nacked(channel: Any, prefix: str, limit: int) -> tuple[set[bytes], int]:
    """Persistent publishes one at a time until one is nacked: (confirmed, nacks)."""
    confirmed: set[bytes] = set()
    for n in range(limit):
        body = f"{prefix}-{n}".encode()
        try:
            await asyncio.wait_for(
                channel.basic_publish(body, routing_key=QUEUE, properties=PERSISTENT), 30
            )
        except aiormq.exceptions.DeliveryError:
            return confirmed, 1
        confirmed.add(body)
    return confirmed, 0


async def alone(make_server: Any, on_lazy_disks: Any, caplog: pytest.LogCaptureFixture) -> Any:
    """A server alone on a disk that fails on command, its queue declared, and a confirming
    publisher's connection (whose Connection.Blocked aiormq logs): (server, disk,
    connection, channel)."""
    server = make_server("solo")
    (disk,) = on_lazy_disks(server)
    server.start()
    await declare_durable(server.url, QUEUE)
    caplog.set_level(logging.WARNING, logger="aiormq.connection")
    publisher = await aiormq.connect(server.url)
    return server, disk, publisher, await publisher.channel(publisher_confirms=True)


async def test_a_server_alone_stops_confirming_on_an_io_error_and_says_why(
    make_server: Any, on_lazy_disks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An I/O error on a server alone: the publish it was writing is nacked, publishers
    are blocked with the reason, consumers still served; clearing the fault is not
    enough (the store stays broken), a restart is, and every confirmed message is there."""
    server, disk, publisher, channel = await alone(make_server, on_lazy_disks, caplog)
    kept, nacks = await publish_until_nacked(channel, "before", 50)
    assert len(kept) == 50 and not nacks
    disk.fault("fsync eio store.sqlite")
    confirmed, nacks = await publish_until_nacked(channel, "after", 50)
    assert nacks == 1 and not confirmed  # the first publish after the fault is refused
    await poll(
        lambda: 'blocked by: "the message store\'s disk failed"' in caplog.text,
        30,
        "Connection.Blocked with the reason",
    )
    assert "the store's disk failed" in server.log()
    status = await asyncio.to_thread(
        console_in_process, "--server", url_of(server, ADMIN), "status"
    )
    assert status.returncode == 3 and "disk failed" in status.stdout, status.stdout
    # Consumers are still served what it held.
    consumer = await aiormq.connect(server.url)
    reader = await consumer.channel()
    got = []
    for _ in range(10):
        message = await reader.basic_get(QUEUE, no_ack=False)
        await reader.basic_ack(message.delivery_tag)
        got.append(message.body)
    await consumer.close()
    assert set(got) <= kept and len(got) == 10
    # Mended: the store stays broken (never written again by this process: its unit test,
    # tests/unit/test_store_broken.py)...
    disk.fault("clear")
    with contextlib.suppress(Exception):
        await asyncio.wait_for(publisher.close(), 2)
    # ...until a restart: every confirmed message not consumed is there.
    server.kill()
    server.start()
    remaining = {body for body, _ in await drain(server.url, QUEUE)}
    assert kept - set(got) <= remaining, len(kept - set(got) - remaining)


async def test_a_full_disk_is_waited_out_without_a_restart(
    make_server: Any, on_lazy_disks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """No room on the disk (ENOSPC) is not a failed disk: the publish is nacked and
    publishers blocked, and once there is room again the store writes and they are
    unblocked, with no restart."""
    server, disk, publisher, channel = await alone(make_server, on_lazy_disks, caplog)
    disk.fault("write enospc store.sqlite")
    confirmed, nacks = await publish_until_nacked(channel, "full", 50)
    assert nacks == 1 and not confirmed
    await poll(lambda: "was blocked by" in caplog.text, 30, "Connection.Blocked")
    disk.fault("clear")
    await poll(lambda: "was unblocked" in caplog.text, 30, "Connection.Unblocked")
    result = await asyncio.wait_for(
        channel.basic_publish(b"room", routing_key=QUEUE, properties=PERSISTENT), 30
    )
    assert isinstance(result, commands.Basic.Ack)
    await publisher.close()
    assert "the store's disk failed" not in server.log()
