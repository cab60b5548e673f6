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

from tests.durability import PERSISTENT, Ledger, drain, keep_consuming, keep_publishing
from tests.pairs import ADMIN, Pair, poll, url_of
from tests.support import console_in_process

QUEUE = "orders"


async def declare(url: str) -> None:
    connection = await aiormq.connect(url)
    channel = await connection.channel()
    await channel.queue_declare(QUEUE, durable=True)
    await connection.close()


async def grown(ledger: Ledger, by: int, what: str) -> None:
    target = len(ledger.confirmed) + by
    await poll(lambda: len(ledger.confirmed) >= target, 120, what)


def recorded(pair: Pair, server: Any, event: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in pair.events(server)
        if e["event"] == event and all(e.get(k) == v for k, v in fields.items())
    ]


def check(ledger: Ledger, remaining: list[bytes]) -> None:
    lost, invented = ledger.check(remaining)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented, sorted(invented)[:5]


# The faults hit the store's files (a bad region of the disk): the event log, on the same
# disk, stays readable for the test.
@pytest.mark.parametrize("fault", ["fsync eio store.sqlite", "write eio store.sqlite"])
async def test_an_io_error_on_the_actives_disk_hands_the_service_to_its_passive(
    make_pair: Any, on_lazy_disks: Any, fault: str
) -> None:
    pair = make_pair()
    disks = on_lazy_disks(*pair.servers)
    pair.start()
    active, passive = await pair.settled(timeout=120)
    await declare(active.url)
    ledger, stop = Ledger(), asyncio.Event()
    urls = [server.url for server in pair.servers]
    tasks = [
        asyncio.create_task(keep_publishing(urls, QUEUE, ledger, "p", stop)),
        asyncio.create_task(keep_consuming(urls, QUEUE, ledger, stop, prefetch=50)),
    ]
    try:
        await grown(ledger, 300, "confirms before the fault")
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
        disks[pair.servers.index(active)].fault("clear")
        pair.kill(active)
        active.start()
        await pair.settled(timeout=120)
        await grown(ledger, 100, "confirms after the repair")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    check(ledger, [body for body, _ in await drain(passive.url, QUEUE)])


async def test_an_fsync_error_on_the_passives_disk_leaves_the_active_serving(
    make_pair: Any, on_lazy_disks: Any
) -> None:
    pair = make_pair()
    disks = on_lazy_disks(*pair.servers)
    pair.start()
    active, passive = await pair.settled(timeout=120)
    await declare(active.url)
    ledger, stop = Ledger(), asyncio.Event()
    urls = [server.url for server in pair.servers]
    tasks = [
        asyncio.create_task(keep_publishing(urls, QUEUE, ledger, "p", stop)),
        asyncio.create_task(keep_consuming(urls, QUEUE, ledger, stop, prefetch=50)),
    ]
    try:
        await grown(ledger, 300, "confirms before the fault")
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
        disks[pair.servers.index(passive)].fault("clear")
        pair.kill(passive)
        passive.start()
        await pair.settled(timeout=120)
        await grown(ledger, 100, "confirms after the repair")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    check(ledger, [body for body, _ in await drain(active.url, QUEUE)])


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


async def test_a_server_alone_stops_confirming_on_an_io_error_and_says_why(
    make_server: Any, on_lazy_disks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An I/O error on a server alone: the publish it was writing is nacked, publishers
    are blocked with the reason, consumers still served; clearing the fault is not
    enough (the store stays broken), a restart is, and every confirmed message is there."""
    server = make_server("solo")
    (disk,) = on_lazy_disks(server)
    server.start()
    await declare(server.url)
    caplog.set_level(logging.WARNING, logger="aiormq.connection")
    publisher = await aiormq.connect(server.url)
    channel = await publisher.channel(publisher_confirms=True)
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
    # Mended: the store stays broken (never written again by this process)...
    disk.fault("clear")
    await asyncio.sleep(0)
    assert "was unblocked" not in caplog.text
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
    server = make_server("solo")
    (disk,) = on_lazy_disks(server)
    server.start()
    await declare(server.url)
    caplog.set_level(logging.WARNING, logger="aiormq.connection")
    publisher = await aiormq.connect(server.url)
    channel = await publisher.channel(publisher_confirms=True)
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
