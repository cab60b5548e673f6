"""Fuzzing a real PASSIVE's replication link: a fake ACTIVE that holds the pair's secret
sends runs that authenticate but are mangled (bytes flipped, cut, inserted, repeated;
headers of the wrong type), so they reach the decoding and validation behind the MAC.

Property: the PASSIVE process stays up; it acks only runs that decode and validate; its
store opens again after a kill -9. Bounded in subscriptions and time; one seed per run,
printed on failure, replays the same mangling.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from amqha.core import codec
from amqha.core.changes import (
    Bound,
    Delivered,
    Enqueued,
    ExchangeDeclared,
    QueueDeclared,
    Reset,
    Settled,
)
from tests.fake_active import Delivery, FakeActive, signed
from tests.integration.test_replication import declare, replication, wait_in_sync
from tests.pairs import PAIR_SECRET, Pair
from tests.support import soak_size

SEED = 20261126
# Subscriptions of the fake ACTIVE, each with its mangled runs: 20 in make test, 80 in make
# soak (the seed is the same: make test's are the first 20 of make soak's).
SUBSCRIPTIONS = soak_size(20, 80)
SECONDS = 60.0


def base_runs() -> list[bytes]:
    """Runs the real ACTIVE could send: a snapshot and a live run."""
    messages = [
        Enqueued("/", "orders", n, b"\x00\x06orders", b"\x00" * 14, b"body-%d" % n, None, True)
        for n in range(1, 21)
    ]
    snapshot = codec.encode(
        0,
        [
            Reset(),
            ExchangeDeclared("/", "events", "topic", False, False, {"alternate-exchange": "x"}),
            QueueDeclared("/", "orders", False, {"x-max-length": 1000}),
            Bound("/", "events", "orders", False, "order.*", {}),
            Delivered("/", "orders", 3),
            *messages,
        ],
    )
    live = codec.encode(
        500,
        [*messages[:5], Settled("/", "orders", (1, 2, 3), "consumed")],
    )
    return [snapshot, live]


def mangle(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        how = rng.randrange(5)
        at = rng.randrange(len(data)) if data else 0
        if how == 0 and data:
            data[at] ^= 1 << rng.randrange(8)
        elif how == 1:
            del data[at:]
        elif how == 2:
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif how == 3 and data:
            end = min(len(data), at + rng.randint(1, 64))
            data[at:at] = data[at:end]
        else:
            data[at : at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f"])
    return bytes(data)


HEADERS: list[dict[str, Any]] = [
    {},
    {"amqha-snapshot-end": True},
    {"amqha-snapshot-end": "yes"},
    {"amqha-in-sync": "everything"},
    {"amqha-in-sync": -1},
]


@pytest.mark.soak
async def test_mangled_runs_that_authenticate_never_crash_the_passive_nor_get_acked(
    make_pair: Any,
) -> None:
    pair: Pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "orders")
    await wait_in_sync(pair, pair.primary)
    pair.kill(pair.primary)
    rng = random.Random(SEED)
    runs = base_runs()

    def script(key: bytes | None) -> list[Delivery]:
        assert key is not None, "the PASSIVE subscribed without a nonce"
        deliveries = []
        for tag in range(1, rng.randint(1, 4) + 1):
            body = rng.choice(runs)
            if rng.random() < 0.8:
                body = mangle(rng, body)
            deliveries.append(signed(key, tag, rng.choice(HEADERS), body))
        return deliveries

    started = time.monotonic()
    async with FakeActive(pair.primary.port, script, PAIR_SECRET.encode()) as fake:
        while fake.subscriptions < SUBSCRIPTIONS and time.monotonic() - started < SECONDS:
            assert pair.backup.process is not None and pair.backup.process.poll() is None, (
                f"the PASSIVE died (seed {SEED})"
            )
            await asyncio.sleep(0.1)
    assert fake.subscriptions >= 5, f"only {fake.subscriptions} subscriptions"
    assert pair.backup.process is not None and pair.backup.process.poll() is None
    for each in fake.acked:
        codec.decode(fake.sent[each])  # an acked run decodes and validates
    follower = (await replication(pair, pair.backup))["follower"]
    print(
        f"seed {SEED}: {fake.subscriptions} subscriptions, {len(fake.sent)} runs, "
        f"{len(fake.acked)} acked, follower {follower}"
    )
    assert follower["refused_runs"] > 0
    assert not follower["in_sync"]
    assert "Traceback" not in pair.backup.log(), f"seed {SEED}"
    # Whatever it stored, its store opens again.
    pair.kill(pair.backup)
    pair.backup.start()
    assert pair.backup.process is not None and pair.backup.process.poll() is None
