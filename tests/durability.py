"""Workload for the tests that kill servers: a confirming publisher, an acking consumer,
and the ledger that says whether a confirmed message went missing or one was invented.

Both clients are plain aiormq and stop quietly when their server dies; the ledger is
what they saw, so the check after the crash compares the promises made with what the
restarted server holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import aiormq
from pamqp import commands

from amqha.client import connect as ha_connect

PERSISTENT = commands.Basic.Properties(delivery_mode=2)


@dataclass
class Ledger:
    sent: set[bytes] = field(default_factory=set)
    confirmed: set[bytes] = field(default_factory=set)
    nacked: set[bytes] = field(default_factory=set)
    acked: set[bytes] = field(default_factory=set)  # acks the consumer sent
    # (wall clock, server name) of each confirm
    confirm_times: list[tuple[float, str]] = field(default_factory=list)
    duplicates: int = 0  # deliveries of a message the consumer had acked already
    redelivered: int = 0

    def check(self, remaining: list[bytes]) -> tuple[set[bytes], set[bytes]]:
        """(lost, invented): confirmed and neither acked nor still queued; queued but
        never sent."""
        held = set(remaining)
        return self.confirmed - self.acked - held, held - self.sent


async def publish_confirmed(
    url: str,
    routing_key: str,
    ledger: Ledger,
    prefix: str,
    stop: asyncio.Event,
    window: int = 50,
    limit: int = 1_000_000,
    exchange: str = "",
) -> None:
    """Publish persistent messages ``window`` at a time, each awaited for its confirm,
    until ``stop`` or ``limit``; returns quietly when the connection dies."""
    number = 0
    with contextlib.suppress(Exception):
        connection = await aiormq.connect(url)
        try:
            channel = await connection.channel(publisher_confirms=True)
            while not stop.is_set() and number < limit:
                bodies = [f"{prefix}-{number + i}".encode() for i in range(window)]
                number += window
                ledger.sent.update(bodies)
                results = await asyncio.gather(
                    *(
                        channel.basic_publish(
                            body, exchange=exchange, routing_key=routing_key, properties=PERSISTENT
                        )
                        for body in bodies
                    ),
                    return_exceptions=True,
                )
                for body, result in zip(bodies, results, strict=True):
                    if isinstance(result, commands.Basic.Ack):
                        ledger.confirmed.add(body)
                    elif isinstance(result, aiormq.exceptions.DeliveryError):
                        ledger.nacked.add(body)
                if any(
                    isinstance(result, BaseException)
                    and not isinstance(result, aiormq.exceptions.DeliveryError)
                    for result in results
                ):
                    return
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 2)


async def consume_acking(
    url: str, queue: str, ledger: Ledger, stop: asyncio.Event, prefetch: int = 20
) -> None:
    """Consume and ack each message; returns quietly when the connection dies."""
    with contextlib.suppress(Exception):
        connection = await aiormq.connect(url)
        try:
            channel = await connection.channel()
            await channel.basic_qos(prefetch_count=prefetch)

            async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
                await channel.basic_ack(message.delivery.delivery_tag)
                ledger.acked.add(message.body)

            await channel.basic_consume(queue, on_message)
            while not stop.is_set() and not connection.is_closed:
                await asyncio.sleep(0.05)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 2)


async def drain(url: str, queue: str, limit: int = 1_000_000) -> list[tuple[bytes, bool]]:
    """Every message left on ``queue``, in order: (body, redelivered)."""
    return [(got.body, bool(got.redelivered)) for got in await take_all(url, queue, limit)]


async def take_all(
    url: str, queue: str, limit: int = 1_000_000
) -> list[aiormq.abc.DeliveredMessage]:
    """Every message left on ``queue``, in order, taken as it is read. The count the queue
    declares comes through a consumer (a round trip per message would take most of a
    kill test's time with a backlog); whatever is left after it, one Basic.Get at a time
    until the queue says it is empty."""
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        found: list[aiormq.abc.DeliveredMessage] = []
        declared = await channel.queue_declare(queue, passive=True)
        expected = min(declared.message_count or 0, limit)
        if expected:
            enough = asyncio.Event()

            async def take(message: aiormq.abc.DeliveredMessage) -> None:
                found.append(message)
                if len(found) >= expected:
                    enough.set()

            consuming = await channel.basic_consume(queue, take, no_ack=True)
            try:
                await asyncio.wait_for(enough.wait(), 60 + expected / 1000)
            except TimeoutError:
                raise AssertionError(
                    f"{queue} declared {expected} messages; {len(found)} came"
                ) from None
            await channel.basic_cancel(consuming.consumer_tag)
            await asyncio.sleep(0)  # deliveries that came before the CancelOk
        for _ in range(limit - len(found) + 1):
            got = await channel.basic_get(queue, no_ack=True)
            if got.delivery_tag is None:
                return found
            found.append(got)
        raise AssertionError(f"{queue} still had messages after {limit}")
    finally:
        await connection.close()


async def keep_publishing(
    urls: list[str], queue: str, ledger: Ledger, prefix: str, stop: asyncio.Event, window: int = 20
) -> None:
    """Publish persistent messages with confirms to whichever server is ACTIVE, through
    every failover (reconnecting with ``amqha.client``), until ``stop``."""
    number = 0
    while not stop.is_set():
        try:
            connection = await ha_connect(urls, retry_for=5.0, attempt_timeout=2.0)
        except ConnectionError:
            continue
        try:
            server = str(
                dict(connection.transport.connection.server_properties["amqha"]).get("name")  # type: ignore[attr-defined]
            )
            channel = await connection.channel(publisher_confirms=True)
            while not stop.is_set():
                bodies = [f"{prefix}-{number + i}".encode() for i in range(window)]
                number += window
                ledger.sent.update(bodies)
                results = await asyncio.gather(
                    *(
                        asyncio.wait_for(
                            channel.default_exchange.publish(
                                aio_pika.Message(
                                    body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                                ),
                                routing_key=queue,
                            ),
                            10.0,
                        )
                        for body in bodies
                    ),
                    return_exceptions=True,
                )
                failed = False
                now = time.time()
                for body, result in zip(bodies, results, strict=True):
                    if isinstance(result, commands.Basic.Ack):
                        ledger.confirmed.add(body)
                        ledger.confirm_times.append((now, server))
                    elif isinstance(result, aio_pika.exceptions.DeliveryError):
                        ledger.nacked.add(body)
                    else:
                        failed = True
                if failed:
                    break
        except Exception:
            pass
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 2)


async def keep_consuming(
    urls: list[str], queue: str, ledger: Ledger, stop: asyncio.Event, prefetch: int = 20
) -> None:
    """Consume and ack from whichever server is ACTIVE, through every failover: each
    server is tried in turn (a PASSIVE refuses us); a dead connection is noticed at once."""
    turn = 0
    while not stop.is_set():
        url = urls[turn % len(urls)]
        turn += 1
        try:
            connection = await asyncio.wait_for(aiormq.connect(url), 2.0)
        except Exception:
            await asyncio.sleep(0.05)
            continue
        try:
            channel = await connection.channel()
            await channel.basic_qos(prefetch_count=prefetch)

            async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
                if message.redelivered:
                    ledger.redelivered += 1
                await message.channel.basic_ack(message.delivery.delivery_tag)  # type: ignore[union-attr]
                if message.body in ledger.acked:
                    ledger.duplicates += 1
                ledger.acked.add(message.body)

            await channel.basic_consume(queue, on_message)
            while not stop.is_set() and not connection.is_closed and not channel.is_closed:
                await asyncio.sleep(0.05)
        except Exception:
            pass
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 2)


async def declare_durable(url: str, queue: str, **arguments: Any) -> None:
    connection = await aiormq.connect(url)
    channel = await connection.channel()
    await channel.queue_declare(queue, durable=True, arguments=arguments or None)
    await connection.close()


def through_failovers(
    urls: list[str], queue: str, ledger: Ledger, stop: asyncio.Event
) -> list[asyncio.Task[None]]:
    """A publisher confirming and a consumer acking on ``queue``, each following the ACTIVE
    through every failover, until ``stop``."""
    return [
        asyncio.create_task(keep_publishing(urls, queue, ledger, "p", stop)),
        asyncio.create_task(keep_consuming(urls, queue, ledger, stop, prefetch=50)),
    ]


async def grown(ledger: Ledger, by: int, what: str, timeout: float = 120.0) -> None:
    """Until ``by`` more publishes are confirmed (the service goes on), at most ``timeout`` s."""
    target = len(ledger.confirmed) + by
    deadline = time.monotonic() + timeout
    while len(ledger.confirmed) < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached after {timeout} s: {what}")
        await asyncio.sleep(0.02)


async def nothing_lost(url: str, queue: str, ledger: Ledger) -> None:
    """Drain ``queue`` at ``url``: every confirmed message was acked or is there, and
    nothing there was never sent."""
    lost, invented = ledger.check([body for body, _ in await drain(url, queue)])
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented, sorted(invented)[:5]
