"""``make soak``: kill -9 the ACTIVE of a real pair, over and over, under load; print JSON.

    python -m bench.soak [--kills 100] [--backlog N [--seed S]] [--out FILE]

A confirming publisher (persistent messages, a durable queue) and an acking consumer
run through every failover (``amqha.client`` follows the ACTIVE). Before each kill the
PASSIVE is in sync; the killed server is restarted and catches up before the next kill,
alternating between the two servers. At the end the queue is drained and compared with
what was confirmed and acked:

- ``lost``: confirmed, never acked, and not in the queue: must be 0;
- ``invented``: in the queue but never published: must be 0;
- ``duplicates``: deliveries of a message the consumer had acked already (at least once:
  bounded by what was delivered and not yet acked at each kill);
- ``takeover_s``: from the kill to the first publish confirmed by the new ACTIVE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiormq

from amqha.quarantine import read_quarantine
from tests.durability import PERSISTENT, Ledger, drain, keep_consuming, keep_publishing
from tests.pairs import Pair


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.02)


async def _started_with_queue(pair: Pair) -> None:
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    connection = await aiormq.connect(pair.primary.url)
    channel = await connection.channel()
    await channel.queue_declare("soak", durable=True)
    await connection.close()


async def soak(workdir: Path, kills: int) -> dict[str, Any]:
    pair = Pair(workdir).start()
    try:
        await _started_with_queue(pair)
        ledger = Ledger()
        stop = asyncio.Event()
        urls = [pair.primary.url, pair.backup.url]
        tasks = [
            asyncio.create_task(keep_publishing(urls, "soak", ledger, "s", stop)),
            asyncio.create_task(keep_consuming(urls, "soak", ledger, stop)),
        ]
        takeovers: list[float] = []
        started = time.monotonic()
        for number in range(kills):
            active, _ = await pair.settled()
            target = len(ledger.confirmed) + 200
            await _until(lambda: len(ledger.confirmed) >= target, 60, "confirms")  # noqa: B023
            kill = pair.kill(active)
            other = pair.other(active)
            await _until(lambda: pair.state(other) == "ACTIVE", 30, "takeover")  # noqa: B023
            after, name = kill.after, other.name
            await _until(
                lambda: any(
                    t > after and by == name  # noqa: B023
                    for t, by in ledger.confirm_times[-50:]
                ),
                30,
                "a confirm by the new ACTIVE",
            )
            first = min(t for t, by in ledger.confirm_times if t > kill.after and by == other.name)
            takeovers.append(first - kill.before)
            active.start()
            print(
                f"kill {number + 1}/{kills}: {active.name}, takeover {takeovers[-1]:.3f} s, "
                f"{len(ledger.confirmed)} confirmed",
                file=sys.stderr,
                flush=True,
            )
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        active, _ = await pair.settled()
        # Messages a restarted server confirmed alone while voted ACTIVE before it heard
        # its peer (a dual active) were quarantined: replayed, as an operator would.
        quarantined = _replay_quarantine(pair, active.url)
        remaining = [body for body, _ in await drain(active.url, "soak")]
        lost, invented = ledger.check(remaining)
        ordered = sorted(takeovers)
        return {
            "kills": kills,
            "seconds": round(time.monotonic() - started, 1),
            "confirmed": len(ledger.confirmed),
            "acked": len(ledger.acked),
            "nacked": len(ledger.nacked),
            "lost": len(lost),
            "invented": len(invented),
            "duplicates": ledger.duplicates,
            "quarantined_and_replayed": quarantined,
            "dual_active_records": sum(
                e["event"] == "dual_active" for server in pair.servers for e in pair.events(server)
            ),
            "redelivered": ledger.redelivered,
            "takeover_s": {
                "p50": round(statistics.median(ordered), 3),
                "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
                "max": round(ordered[-1], 3),
            },
        }
    finally:
        pair.stop()


async def _follower(pair: Pair, server: Any) -> dict[str, Any]:
    try:
        status = await asyncio.wait_for(pair.status(server), 5)
    except Exception:
        return {}
    return dict((status.get("replication") or {}).get("follower") or {})


async def _fill(url: str, queue: str, ledger: Ledger, count: int) -> None:
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    for start in range(0, count, 1000):
        bodies = [b"backlog-%d" % n + b"." * 90 for n in range(start, min(count, start + 1000))]
        ledger.sent.update(bodies)
        results = await asyncio.gather(
            *(channel.basic_publish(b, routing_key=queue, properties=PERSISTENT) for b in bodies)
        )
        ledger.confirmed.update(b for b, r in zip(bodies, results, strict=True) if r)
        if start % 50_000 == 0:
            print(f"backlog: {start} of {count}", file=sys.stderr, flush=True)
    await connection.close()


async def soak_backlog(workdir: Path, kills: int, backlog: int, seed: int) -> dict[str, Any]:
    """The worst moments: a backlog of ``backlog`` messages (no consumer drains it) and a
    confirming publisher; each round restarts the killed server, then kills the ACTIVE
    at a random moment: while the restarted PASSIVE catches up, within 0.5 s of its in
    sync, or later. A kill during catch-up leaves the pair waiting for the killed server
    (restarted after 0.5-2 s): how often, and for how long, is reported."""
    rng = random.Random(seed)
    pair = Pair(workdir).start()
    try:
        await _started_with_queue(pair)
        ledger = Ledger()
        await _fill(pair.primary.url, "soak", ledger, backlog)
        stop = asyncio.Event()
        urls = [pair.primary.url, pair.backup.url]
        publisher = asyncio.create_task(keep_publishing(urls, "soak", ledger, "s", stop))
        moments: dict[str, int] = {"catching_up": 0, "within_0.5s_of_in_sync": 0, "later": 0}
        waits: list[float] = []
        takeovers: list[float] = []
        started = time.monotonic()
        active, passive = await pair.settled(timeout=120)
        pair.kill(passive)
        passive.start()
        for number in range(kills):
            # The PASSIVE was restarted (or just started): it catches up from a snapshot.
            plan = rng.choice(("catching_up", "in_sync", "later"))
            if plan == "catching_up":
                # A catch-up too short to be seen counts as what it was at the kill.
                await _until_async(
                    lambda: _catching_up_or_done(pair, passive),  # noqa: B023
                    120,
                    "the passive catching up",
                )
                await asyncio.sleep(rng.uniform(0, 0.5))
            else:
                await _until(lambda: pair.in_sync(passive), 180, "in sync")  # noqa: B023
                await asyncio.sleep(
                    rng.uniform(0, 0.5) if plan == "in_sync" else rng.uniform(0.5, 3)
                )
            in_sync = pair.in_sync(passive)
            moment = (
                "catching_up"
                if not in_sync
                else ("within_0.5s_of_in_sync" if plan == "in_sync" else "later")
            )
            moments[moment] += 1
            kill = pair.kill(active)
            if in_sync:
                await _until(lambda: pair.state(passive) == "ACTIVE", 60, "takeover")  # noqa: B023
                first = await _first_confirm_after(ledger, kill.after, passive.name)
                takeovers.append(first - kill.before)
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                active.start()
                active, passive = passive, active
            else:
                # The PASSIVE refuses the votes; the killed server comes back and leads.
                await asyncio.sleep(rng.uniform(0.5, 2.0))
                active.start()
                first = await _first_confirm_after(ledger, kill.after, None)
                waits.append(first - kill.before)
                await _until(lambda: pair.state(active) == "ACTIVE", 60, "the restart leads")  # noqa: B023
                # The PASSIVE resubscribes and catches up again; kill it too, so every
                # round starts from a restarted PASSIVE.
                pair.kill(passive)
                passive.start()
            print(
                f"kill {number + 1}/{kills}: {moment}, {len(ledger.confirmed)} confirmed",
                file=sys.stderr,
                flush=True,
            )
            # Whoever leads now: a restarted server voted ACTIVE before it heard its peer
            # (a dual active) may have kept the service; its peer's work is quarantined.
            active, passive = await _one_of_each(pair)
        stop.set()
        await asyncio.wait_for(asyncio.gather(publisher, return_exceptions=True), 60)
        active, _ = await pair.settled(timeout=180)
        quarantined = _replay_quarantine(pair, active.url)
        remaining = [body for body, _ in await drain(active.url, "soak", limit=10_000_000)]
        lost, invented = ledger.check(remaining)
        return {
            "kills": kills,
            "backlog": backlog,
            "seed": seed,
            "seconds": round(time.monotonic() - started, 1),
            "confirmed": len(ledger.confirmed),
            "remaining": len(remaining),
            "lost": len(lost),
            "invented": len(invented),
            "quarantined_and_replayed": quarantined,
            "kill_moments": moments,
            "takeover_s": _percentiles(takeovers),
            "waits_for_the_killed_server": {"count": len(waits), **_percentiles(waits)},
        }
    finally:
        pair.stop()


async def _one_of_each(pair: Pair) -> tuple[Any, Any]:
    """(ACTIVE, PASSIVE) once the pair has one of each, whichever is which."""
    await _until(
        lambda: set(pair.states()) == {"ACTIVE", "PASSIVE"},
        180,
        "one ACTIVE and one PASSIVE",
    )
    primary_leads = pair.state(pair.primary) == "ACTIVE"
    return (pair.primary, pair.backup) if primary_leads else (pair.backup, pair.primary)


async def _catching_up_or_done(pair: Pair, server: Any) -> bool:
    if pair.in_sync(server):
        return True
    return (await _follower(pair, server)).get("state") in ("catching_up", "closing")


async def _until_async(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.02)


async def _first_confirm_after(ledger: Ledger, after: float, by: str | None) -> float:
    def found() -> float | None:
        times = [t for t, name in ledger.confirm_times[-500:] if t > after and by in (None, name)]
        return min(times) if times else None

    await _until(lambda: found() is not None, 120, "a confirm after the kill")
    value = found()
    assert value is not None
    return value


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 3),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
        "max": round(ordered[-1], 3),
    }


def _replay_quarantine(pair: Pair, url: str) -> int:
    """Replay every quarantine file onto ``url``, as an operator would; how many."""
    quarantined = 0
    for path in pair.quarantine_files():
        quarantined += len(read_quarantine(str(path)))
        replayed = subprocess.run(
            [sys.executable, "-m", "amqha", "quarantine", "replay", str(path), "--url", url],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if replayed.returncode != 0:
            raise RuntimeError(f"replay of {path} failed: {replayed.stderr}")
    return quarantined


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument(
        "--backlog",
        type=int,
        default=0,
        help="keep this many messages queued and kill at the worst moments (catch-up, "
        "just after in sync); 0: the classic soak with an acking consumer",
    )
    parser.add_argument("--seed", type=int, default=1, help="the moments' random seed")
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="amqha-soak-") as tmp:
        if options.backlog:
            result = asyncio.run(
                soak_backlog(Path(tmp), options.kills, options.backlog, options.seed)
            )
        else:
            result = asyncio.run(soak(Path(tmp), options.kills))
    text = json.dumps(result, indent=2)
    print(text)
    if options.out is not None:
        options.out.write_text(text + "\n")
    if result["lost"] or result["invented"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
