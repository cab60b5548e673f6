"""Durable state on one server: real processes, real clients, real crashes.

A confirm is a promise: after a clean restart or a kill -9, every confirmed persistent
message on a durable queue is still there unless it was acked, and nothing appears that
was never published. Durable wiring survives; transient things do not.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import pytest
import yaml
from pamqp import commands

from tests.durability import (
    PERSISTENT,
    Ledger,
    consume_acking,
    declare_durable,
    drain,
    publish_confirmed,
)
from tests.support import ServerProcess, start_to_exit


def weak(line: str) -> bool:
    """A warning about the test users' well-known passwords (loopback only)."""
    return line.startswith("amqha: WARNING: ")


async def wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"not true after {timeout} s: {what}")
        await asyncio.sleep(0.02)


async def test_clean_restart_keeps_durable_wiring_and_every_confirmed_message(
    make_server: Any,
) -> None:
    server: ServerProcess = make_server("durable").start()
    connection = await aio_pika.connect(server.url)
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.declare_exchange("orders", "topic", durable=True)
    queue = await channel.declare_queue("orders.eu", durable=True)
    await queue.bind(exchange, "eu.#")
    transient_queue = await channel.declare_queue("scratch", durable=False)
    await transient_queue.bind(exchange, "eu.#")
    for start in range(0, 2000, 200):
        await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(
                        f"order-{n}".encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                    ),
                    "eu.fr",
                )
                for n in range(start, start + 200)
            )
        )
    # A transient message on the durable queue: the queue is kept, this message is not.
    await exchange.publish(aio_pika.Message(b"not-persistent"), "eu.fr")
    await connection.close()

    assert server.terminate() == 0
    server.start()
    assert "recovered 1 durable queues and 2000 persistent messages" in server.log()

    connection = await aio_pika.connect(server.url)
    channel = await connection.channel(publisher_confirms=True)
    # The exchange and the binding are back: a new publish still reaches the queue.
    exchange = await channel.declare_exchange("orders", "topic", passive=True)
    await exchange.publish(
        aio_pika.Message(b"after", delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "eu.de"
    )
    with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
        await channel.declare_queue("scratch", passive=True)
    await connection.close()
    found = [body for body, _ in await drain(server.url, "orders.eu")]
    assert found == [f"order-{n}".encode() for n in range(2000)] + [b"after"]


async def test_kill_9_under_a_confirming_publisher_and_an_acking_consumer_loses_nothing(
    make_server: Any,
) -> None:
    """Three crashes in the middle of group commits (several publishers, one consumer),
    each followed by a restart: no confirmed message is lost, none is invented."""
    server: ServerProcess = make_server("crash").start()
    await declare_durable(server.url, "work")
    ledger = Ledger()
    for round_number in range(3):
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(
                publish_confirmed(server.url, "work", ledger, f"r{round_number}p{p}", stop)
            )
            for p in range(3)
        ]
        tasks.append(asyncio.create_task(consume_acking(server.url, "work", ledger, stop)))
        target = len(ledger.confirmed) + 1500 + 700 * round_number
        await wait_for(lambda: len(ledger.confirmed) >= target, "confirms flowing")  # noqa: B023
        server.kill()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        server.start()
    remaining = [body for body, _ in await drain(server.url, "work")]
    lost, invented = ledger.check(remaining)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented
    assert len(ledger.confirmed) > 6000 and ledger.acked
    assert len(remaining) == len(set(remaining))


async def test_messages_delivered_before_a_crash_come_back_redelivered(
    make_server: Any,
) -> None:
    server: ServerProcess = make_server("redeliver").start()
    await declare_durable(server.url, "jobs")
    connection = await aiormq.connect(server.url)
    channel = await connection.channel(publisher_confirms=True)
    for n in range(10):
        await channel.basic_publish(f"job-{n}".encode(), routing_key="jobs", properties=PERSISTENT)
    reader = await connection.channel()
    for _ in range(4):
        got = await reader.basic_get("jobs", no_ack=False)
        assert got.delivery_tag is not None
    # A confirm after the gets: the store has written everything up to it, in order.
    await channel.basic_publish(b"marker", routing_key="jobs", properties=PERSISTENT)
    server.kill()
    server.start()
    found = await drain(server.url, "jobs")
    assert found == [(f"job-{n}".encode(), n < 4) for n in range(10)] + [(b"marker", False)]


async def test_a_durable_priority_queue_survives_a_kill_9_in_priority_order(
    make_server: Any,
) -> None:
    server: ServerProcess = make_server("priority").start()
    await declare_durable(server.url, "urgent", **{"x-max-priority": 9})
    connection = await aiormq.connect(server.url)
    channel = await connection.channel(publisher_confirms=True)
    published = [("a", 0), ("b", 9), ("c", 5), ("d", 9), ("e", 0), ("f", 5), ("g", None)]
    for body, priority in published:
        await channel.basic_publish(
            body.encode(),
            routing_key="urgent",
            properties=commands.Basic.Properties(delivery_mode=2, priority=priority),
        )
    reader = await connection.channel()
    got = await reader.basic_get("urgent", no_ack=False)
    assert got.body == b"b"  # delivered, never acked: back after the crash, marked
    # A confirm after the get: the store has written everything up to it, in order.
    await channel.basic_publish(b"marker", routing_key="urgent", properties=PERSISTENT)
    server.kill()
    server.start()
    assert await drain(server.url, "urgent") == [
        (b"b", True),
        (b"d", False),
        (b"c", False),
        (b"f", False),
        # At or below the highest id delivered before the crash (b's), a message of a
        # lower priority comes back marked as well: it may have been delivered.
        (b"a", True),
        (b"e", False),
        (b"g", False),
        (b"marker", False),
    ]


async def test_a_transaction_is_on_disk_when_commit_ok_arrives(make_server: Any) -> None:
    server: ServerProcess = make_server("tx").start()
    await declare_durable(server.url, "ledger")
    connection = await aiormq.connect(server.url)
    channel = await connection.channel(publisher_confirms=False)
    await channel.tx_select()
    for n in range(50):
        await channel.basic_publish(f"tx-{n}".encode(), routing_key="ledger", properties=PERSISTENT)
    await channel.tx_commit()
    server.kill()
    server.start()
    assert [body for body, _ in await drain(server.url, "ledger")] == [
        f"tx-{n}".encode() for n in range(50)
    ]


async def test_a_full_store_nacks_blocks_publishers_and_keeps_serving_consumers(
    make_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's disk budget (store.max_bytes) reached is a full disk: publishes it
    cannot store are nacked (never confirmed), publishers get Connection.Blocked,
    consumers are still served, and once space is freed publishing works again."""
    server: ServerProcess = make_server("full", store={"max_bytes": "2MiB"}).start()
    await declare_durable(server.url, "big")
    # aiormq logs the Connection.Blocked and Unblocked it receives.
    caplog.set_level(logging.WARNING, logger="aiormq.connection")
    publisher = await aiormq.connect(server.url)
    channel = await publisher.channel(publisher_confirms=True)
    body = b"x" * 20_000
    confirmed = nacked = 0
    for _ in range(400):  # 8 MB at most: four times the budget
        try:
            await asyncio.wait_for(
                channel.basic_publish(body, routing_key="big", properties=PERSISTENT), 30
            )
        except aiormq.exceptions.DeliveryError:
            nacked += 1
            break
        confirmed += 1
    assert nacked == 1 and 10 < confirmed < 400
    await wait_for(lambda: "was blocked by" in caplog.text, "Connection.Blocked", 30)

    # Consumers are still served: take everything that was confirmed, and ack it.
    consumer = await aiormq.connect(server.url)
    reader = await consumer.channel()
    taken = 0
    for _ in range(confirmed + 5):
        got = await reader.basic_get("big", no_ack=False)
        if got.delivery_tag is None:
            break
        await reader.basic_ack(got.delivery_tag)
        taken += 1
    assert taken >= confirmed
    await consumer.close()

    # With the space freed, the publisher is unblocked and its publishes confirmed.
    await wait_for(lambda: "was unblocked" in caplog.text, "Connection.Unblocked", 30)
    result = await asyncio.wait_for(
        channel.basic_publish(b"small", routing_key="big", properties=PERSISTENT), 30
    )
    assert isinstance(result, commands.Basic.Ack)
    await publisher.close()
    assert "the store could not write" in server.log()


def test_a_corrupt_store_is_one_line_naming_the_file(make_server: Any, tmp_path: Path) -> None:
    server: ServerProcess = make_server("corrupt")
    store = server.data_dir / "store.sqlite"
    store.parent.mkdir(parents=True)
    store.write_bytes(b"this is not a database, it is garbage" * 200)
    server.config_path.parent.mkdir(parents=True, exist_ok=True)
    server.config_path.write_text(yaml.safe_dump(server.config))
    result = start_to_exit(server.config_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip() and not weak(line)]
    assert len(lines) == 1 and str(store) in lines[0], result.stderr


def test_a_store_from_a_newer_version_is_refused_naming_the_file(make_server: Any) -> None:
    server: ServerProcess = make_server("newer").start()
    assert server.terminate() == 0
    store = server.data_dir / "store.sqlite"
    with sqlite3.connect(store) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        assert "meta" in tables
        db.execute("UPDATE meta SET value = '999' WHERE key = 'version'")
    result = start_to_exit(server.config_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip() and not weak(line)]
    assert len(lines) == 1 and str(store) in lines[0] and "newer" in lines[0], result.stderr
