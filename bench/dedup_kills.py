"""Exactly once through kill -9s: deduplicating Publishers, a deduplicating queue; JSON.

    python -m bench.dedup_kills [--dedup/--no-dedup] [--kills 20] [--messages 200000] [--seed 1]

A real pair with the test timings and a durable queue, declared with
``x-message-deduplication: true`` under ``--dedup`` (the default) and with no argument
under ``--no-dedup``. Ten ``amqha.client.Publisher``s (``deduplicate=True``, persistent
messages, confirms, at most 100 unconfirmed each) send ``--messages`` messages in all,
each with a message id of its own, and nothing consumes meanwhile. The messages go in
``--kills`` + 1 slices; in each slice but the last, once the PASSIVE is in sync, the
ACTIVE is killed with -9 at a seeded random point (10% to 90% of the slice confirmed),
with up to 1000 messages in flight; the publishers carry on through the failover, the killed server is
restarted, and the next slice waits until it is an in-sync PASSIVE again. Then the
queue is drained by a consumer and counted by message id:

- ``lost``: confirmed, never seen: must be 0;
- ``duplicates``: copies beyond the first (``duplicated_ids``: ids seen more than once):
  the copies a Publisher sent again after a failover; 0 is exactly once;
- ``unexpected``: seen, never published (or without a message id): must be 0.

``exactly_once`` is all three 0. Without ``--dedup`` duplicates are expected (at least
once); with it, from a broker that drops the copy (docs/client.md, "Exactly once"), none.
It exits non-zero if anything was lost or unexpected. One JSON line on stdout; progress
on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import aio_pika
import aiormq

from amqha.client import Publisher
from bench.soak import _replay_quarantine
from tests.durability import take_all
from tests.pairs import Pair, poll
from tests.support import ServerProcess

QUEUE = "dedup-kills"
PUBLISHERS = 10
MAX_PENDING = 100  # per publisher: at most 1000 unconfirmed at a kill
BODY = b"x" * 100
ROUND_TIMEOUT = 120.0  # bound on each wait: a slice sent, a takeover, a settle


def say(text: str) -> None:
    print(f"[dedup_kills] {text}", file=sys.stderr, flush=True)


class Numbers:
    """The message numbers the publishers take, one each, up to what the kill loop allows."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.taken = 0  # numbers handed out
        self.allowed = 0
        self.changed = asyncio.Condition()

    async def take(self) -> int | None:
        """The next number, once allowed; None once all are taken."""
        async with self.changed:
            await self.changed.wait_for(
                lambda: self.taken < self.allowed or self.taken >= self.total
            )
            if self.taken >= self.total:
                return None
            self.taken += 1
            return self.taken - 1

    async def allow(self, upto: int) -> None:
        async with self.changed:
            self.allowed = min(upto, self.total)
            self.changed.notify_all()


class Ledger:
    """What the publishers sent and what was confirmed, by message id."""

    def __init__(self) -> None:
        self.sent: set[str] = set()
        self.held = 0  # sends that returned: the message is held by its publisher
        self.confirmed: set[str] = set()
        self.failed: dict[str, str] = {}

    def settled(self, message_id: str, future: asyncio.Future[None]) -> None:
        if future.cancelled():
            self.failed[message_id] = "cancelled"
        elif future.exception() is not None:
            self.failed[message_id] = repr(future.exception())
        else:
            self.confirmed.add(message_id)


async def keep_sending(publisher: Publisher, numbers: Numbers, ledger: Ledger) -> None:
    while (number := await numbers.take()) is not None:
        message_id = f"m{number:09d}"
        ledger.sent.add(message_id)
        message = aio_pika.Message(
            BODY, message_id=message_id, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
        )
        future = await publisher.send(message, routing_key=QUEUE)
        ledger.held += 1
        future.add_done_callback(partial(ledger.settled, message_id))


def confirmed_at_least(ledger: Ledger, count: int) -> bool:
    return len(ledger.confirmed) >= count


def is_active(pair: Pair, server: ServerProcess) -> bool:
    return pair.state(server) == "ACTIVE"


async def declare(url: str, dedup: bool) -> None:
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        arguments: dict[str, Any] | None = {"x-message-deduplication": True} if dedup else None
        await channel.queue_declare(QUEUE, durable=True, arguments=arguments)
    finally:
        await connection.close()


async def dedup_kills(
    workdir: Path, dedup: bool, kills: int, messages: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    pair = Pair(workdir).start()
    publishers: list[Publisher] = []
    try:
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=60)
        await declare(pair.primary.url, dedup)
        urls = [pair.primary.url, pair.backup.url]
        ledger = Ledger()
        numbers = Numbers(messages)
        for index in range(PUBLISHERS):
            publisher = Publisher(
                urls, deduplicate=True, max_pending=MAX_PENDING, name=f"publisher-{index}"
            )
            publishers.append(await publisher.start())
        senders = [asyncio.create_task(keep_sending(p, numbers, ledger)) for p in publishers]
        # Slice i ends at bounds[i]; the kill of round i comes inside slice i.
        bounds = [messages * (i + 1) // (kills + 1) for i in range(kills + 1)]
        moments: list[float] = []
        started = time.monotonic()
        for number in range(kills):
            active, _ = await pair.settled(timeout=ROUND_TIMEOUT, interval=0.1)
            first = bounds[number - 1] if number else 0
            fraction = rng.uniform(0.1, 0.9)
            point = first + int((bounds[number] - first) * fraction)
            await numbers.allow(bounds[number])
            await poll(partial(confirmed_at_least, ledger, point), ROUND_TIMEOUT, "the point")
            kill = pair.kill(active)
            moments.append(round(fraction, 3))
            await poll(
                partial(is_active, pair, pair.other(active)), ROUND_TIMEOUT, "the other ACTIVE"
            )
            active.start(wait=False)  # the next round's settled() waits for it in sync
            say(
                f"kill {number + 1}/{kills}: {kill.node} at {ledger.held} sent, "
                f"{len(ledger.confirmed)} confirmed"
            )
        await numbers.allow(messages)
        await asyncio.wait_for(asyncio.gather(*senders), ROUND_TIMEOUT * 10)
        for publisher in publishers:
            await publisher.flush(ROUND_TIMEOUT)
        publishing_s = time.monotonic() - started
        resent = sum(p.resent for p in publishers)
        failovers = sum(p.failovers for p in publishers)
        for publisher in publishers:
            await publisher.close()
        active, _ = await pair.settled(timeout=ROUND_TIMEOUT * 3, interval=0.1)
        # Messages a restarted server confirmed alone while voted ACTIVE before it heard
        # its peer (a dual active) were quarantined: replayed, as an operator would.
        quarantined = _replay_quarantine(pair, active.url)
        say(f"draining {QUEUE} from {active.name}")
        drained = await take_all(active.url, QUEUE, limit=messages * 3 + 1000)
    finally:
        for publisher in publishers:
            if not publisher.closing:
                await publisher.close(timeout=1.0)
        pair.stop()
    seen = Counter(got.header.properties.message_id for got in drained)
    lost = ledger.confirmed - seen.keys()
    unexpected = sum(n for i, n in seen.items() if i is None or i not in ledger.sent)
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    return {
        "dedup": dedup,
        "kills": kills,
        "messages": messages,
        "seed": seed,
        "publishers": PUBLISHERS,
        "kill_moments": moments,
        "publishing_s": round(publishing_s, 1),
        "sent": len(ledger.sent),
        "confirmed": len(ledger.confirmed),
        "failed": len(ledger.failed),
        "resent": resent,
        "failovers": failovers,
        "quarantined_and_replayed": quarantined,
        "drained": len(drained),
        "lost": len(lost),
        "duplicates": duplicates,
        "duplicated_ids": sum(n > 1 for n in seen.values()),
        "unexpected": unexpected,
        "exactly_once": not lost and not duplicates and not unexpected,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dedup_kills", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--dedup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="declare the queue with x-message-deduplication: true (default: on)",
    )
    parser.add_argument("--kills", type=int, default=20, help="kill -9s of the ACTIVE")
    parser.add_argument("--messages", type=int, default=200_000, help="messages in all")
    parser.add_argument("--seed", type=int, default=1, help="the kill moments' random seed")
    options = parser.parse_args(argv)
    if options.kills < 0 or options.messages < options.kills + 1:
        parser.error("--kills must be >= 0 and --messages > --kills")
    # aiormq warns of every connection a kill cuts, with its traceback: ten per kill.
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="amqha-dedup-kills-") as tmp:
        result = asyncio.run(
            dedup_kills(Path(tmp), options.dedup, options.kills, options.messages, options.seed)
        )
    print(json.dumps(result))
    return 1 if result["lost"] or result["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
