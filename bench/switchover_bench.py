"""Planned switchovers back and forth under load; JSON.

    python -m bench.switchover_bench [--switchovers 20] [--seconds-between 2] [--clients 10]

A real pair with the test timings and a durable queue. Ten ``amqha.client.Publisher``s
(persistent messages, confirms, at most 100 unconfirmed each; ``--clients``) send without
pause and as many ``amqha.client.Consumer``s ack what they get. Every ``--seconds-between`` seconds the
ACTIVE is asked ``amqha console switchover`` (``--wait 30``: its PASSIVE must be in sync),
primary to backup and back. At the end the publishers are flushed, the consumers take
the rest, and the queue is checked by message id:

- ``lost``: confirmed, never consumed: must be 0;
- ``stored_twice``: a message id delivered more than once as new (not marked
  redelivered): a switchover has no in-doubt confirm, so 0;
- ``redelivered``: deliveries marked redelivered (an ack on its way at a handover);
- ``interruption_s``: per switchover, the longest time no publisher got a confirm, from
  just before the command to two seconds after its answer; its p50, p99 and max;
- ``command_s``: how long each command took (the drain and the handover);
- ``unprotected``: the ``sync`` records of each new ACTIVE with no in-sync PASSIVE, and how
  long until one was in sync again (the old ACTIVE resumes where it handed over, with
  no snapshot: docs/durability.md, section 5);
- ``resumed``: how many of the switchovers' old ACTIVEs resumed rather than took a
  snapshot;
- ``phases_s``: where a switchover's time goes on the servers (``switchover_phases``);
- ``client_failover_s``: each client's move to the new ACTIVE, lost to let in, as
  ``amqha.client`` logs it (10 publishers and 10 consumers in this one process).

One JSON line on stdout; progress on stderr. Exits non-zero if anything was lost or
stored twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika

from amqha.client import Consumer, Publisher
from amqha.console import ConsoleClient
from tests.pairs import ADMIN, Pair, poll, url_of

QUEUE = "switchover-bench"
PUBLISHERS = CONSUMERS = 10
TIMEOUT = 120.0


def say(text: str) -> None:
    print(f"[switchover_bench] {text}", file=sys.stderr, flush=True)


class Ledger:
    def __init__(self) -> None:
        self.sent: set[str] = set()
        self.confirmed: set[str] = set()
        self.confirm_times: list[float] = []
        self.failed = 0
        self.first: dict[str, int] = {}
        self.redelivered = 0

    def settled(self, message_id: str, future: asyncio.Future[None]) -> None:
        if future.exception() is None:
            self.confirmed.add(message_id)
            self.confirm_times.append(time.monotonic())
        else:
            self.failed += 1

    async def consumed(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        if message.redelivered:
            self.redelivered += 1
        else:
            key = message.message_id or ""
            self.first[key] = self.first.get(key, 0) + 1


async def setup(channel: aio_pika.abc.AbstractChannel) -> None:
    await channel.declare_queue(QUEUE, durable=True)


async def keep_sending(publisher: Publisher, ledger: Ledger, stop: asyncio.Event) -> None:
    number = 0
    while not stop.is_set():
        message = aio_pika.Message(f"{publisher.failover.name}-{number}".encode(), delivery_mode=2)
        future = await publisher.send(message, routing_key=QUEUE)
        message_id = message.message_id or ""
        ledger.sent.add(message_id)
        future.add_done_callback(lambda f, i=message_id: ledger.settled(i, f))
        number += 1
        if number % 50 == 0:
            await asyncio.sleep(0)


def longest_gap(times: list[float], start: float, end: float) -> float:
    inside = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in zip(inside, inside[1:], strict=False))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class FailoverTimes(logging.Handler):
    """How long each client's failover took, as ``amqha.client`` logs it."""

    AFTER = re.compile(r" failed over: .* after ([0-9.]+) s")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = self.AFTER.search(record.getMessage())
        if found:
            self.seconds.append(float(found.group(1)))


async def switchover_bench(
    workdir: Path, switchovers: int, between: float, clients_each: int = PUBLISHERS
) -> dict[str, Any]:
    client_log = logging.getLogger("amqha.client")
    failovers = FailoverTimes()
    client_log.addHandler(failovers)
    client_log.setLevel(logging.INFO)
    client_log.propagate = False
    pair = Pair(workdir).start()
    ledger = Ledger()
    stop = asyncio.Event()
    clients: list[Any] = []
    try:
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=60)
        urls = [pair.primary.url, pair.backup.url]
        for index in range(clients_each):
            publisher = Publisher(urls, setup=setup, max_pending=100, name=f"publisher-{index}")
            clients.append(await publisher.start())
        for _ in range(clients_each):
            consumer = Consumer(urls, QUEUE, ledger.consumed, prefetch=50, setup=setup)
            clients.append(await consumer.start())
        publishers = clients[:clients_each]
        senders = [asyncio.create_task(keep_sending(p, ledger, stop)) for p in publishers]
        windows: list[tuple[float, float]] = []
        command_s: list[float] = []
        for number in range(switchovers):
            active, passive = await pair.settled(timeout=TIMEOUT, interval=0.1)
            await asyncio.sleep(between)
            asked = time.monotonic()
            async with ConsoleClient(url_of(active, ADMIN), 60.0) as console:
                result = await console.call("switchover", wait=30)
            answered = time.monotonic()
            command_s.append(answered - asked)
            windows.append((asked - 0.5, answered + 2.0))
            await poll(lambda: pair.state(passive) == "ACTIVE", TIMEOUT, "the new ACTIVE")  # noqa: B023
            say(f"switchover {number + 1}/{switchovers}: {result['result']}")
        await asyncio.sleep(2.5)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*senders), TIMEOUT)
        for publisher in publishers:
            await publisher.flush(TIMEOUT)
        await poll(lambda: ledger.confirmed <= ledger.first.keys(), TIMEOUT, "all consumed")
        resent = sum(p.resent for p in publishers)
        unprotected = [
            {"node": server.name, "reason": e.get("reason")}
            for server in pair.servers
            for e in pair.events(server)
            if e["event"] == "sync" and e.get("side") == "active" and e.get("sync") == "out_of_sync"
        ]
        phases = switchover_phases(pair)
        resumed = sum(
            1
            for server in pair.servers
            for e in pair.events(server)
            if e["event"] == "sync" and "resumed where this server handed" in e.get("reason", "")
        )
    finally:
        for client in clients:
            await client.close(timeout=5.0)
        pair.stop()
    interruptions = [longest_gap(ledger.confirm_times, a, b) for a, b in windows]
    lost = ledger.confirmed - ledger.first.keys()
    stored_twice = sum(n - 1 for n in ledger.first.values() if n > 1)
    return {
        "switchovers": switchovers,
        "publishers": clients_each,
        "consumers": clients_each,
        "sent": len(ledger.sent),
        "confirmed": len(ledger.confirmed),
        "failed": ledger.failed,
        "resent": resent,
        "lost": len(lost),
        "stored_twice": stored_twice,
        "redelivered": ledger.redelivered,
        "interruption_s": {
            "p50": round(statistics.median(interruptions), 3),
            "p99": round(percentile(interruptions, 0.99), 3),
            "max": round(max(interruptions), 3),
        },
        "command_s": {
            "p50": round(statistics.median(command_s), 3),
            "max": round(max(command_s), 3),
        },
        "unprotected_records": len(unprotected),
        "resumed": resumed,
        "phases_s": phases,
        "client_failover_s": {
            "count": len(failovers.seconds),
            "p50": round(statistics.median(failovers.seconds), 3) if failovers.seconds else None,
            "p99": round(percentile(failovers.seconds, 0.99), 3) if failovers.seconds else None,
        },
    }


def switchover_phases(pair: Pair) -> dict[str, dict[str, float]]:
    """Where a switchover's time goes, from both event logs (wall clock, one machine):
    ``drain`` (asked to handed over: the old ACTIVE's record), ``takeover`` (asked to the
    peer ACTIVE on HANDOVER) and ``rejoin`` (the peer ACTIVE to its feed in sync again:
    the old ACTIVE resumed, or caught up); p50 and max of each."""
    found: dict[str, list[float]] = {"drain": [], "takeover": [], "rejoin": []}
    for server in pair.servers:
        other = pair.backup if server is pair.primary else pair.primary
        theirs = pair.events(other)
        requested: float | None = None
        for record in pair.events(server):
            if record["event"] != "switchover":
                continue
            if record["phase"] == "requested":
                requested = record["ts"]
            elif record["phase"] == "handed_over" and requested is not None:
                asked = requested
                found["drain"].append(record["ts"] - asked)
                took = _first(theirs, asked, event="transition", trigger="HANDOVER")
                if took is not None:
                    found["takeover"].append(took - asked)
                    synced = _first(theirs, took, event="sync", side="active", sync="in_sync")
                    if synced is not None:
                        found["rejoin"].append(synced - took)
                requested = None
    return {
        name: {"p50": round(statistics.median(values), 4), "max": round(max(values), 4)}
        for name, values in found.items()
        if values
    }


def _first(records: list[dict[str, Any]], since: float, **fields: Any) -> float | None:
    """The time of the first record from ``since`` on with these fields, or None."""
    return next(
        (
            r["ts"]
            for r in records
            if r["ts"] >= since and all(r.get(k) == v for k, v in fields.items())
        ),
        None,
    )


DEFAULT_SIZES = {"switchovers": 20, "between": 2.0}
QUICK_SIZES = {"switchovers": 4, "between": 1.0}


def run(sizes: dict[str, Any] | None = None) -> dict[str, Any]:
    """``make bench``'s entry (``bench.run``)."""
    sizes = sizes or DEFAULT_SIZES
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="amqha-switchover-") as tmp:
        return asyncio.run(switchover_bench(Path(tmp), sizes["switchovers"], sizes["between"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.switchover_bench",
        description="Planned switchovers back and forth under load; JSON.",
    )
    parser.add_argument("--switchovers", type=int, default=20, help="switchovers to make")
    parser.add_argument(
        "--seconds-between", type=float, default=2.0, help="load between two switchovers"
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=PUBLISHERS,
        help="publishers, and as many consumers (default 10 of each)",
    )
    options = parser.parse_args(argv)
    if options.switchovers < 1:
        parser.error("--switchovers must be at least 1")
    if options.clients < 1:
        parser.error("--clients must be at least 1")
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="amqha-switchover-") as tmp:
        result = asyncio.run(
            switchover_bench(
                Path(tmp), options.switchovers, options.seconds_between, options.clients
            )
        )
    print(json.dumps(result))
    return 1 if result["lost"] or result["stored_twice"] else 0


if __name__ == "__main__":
    sys.exit(main())
