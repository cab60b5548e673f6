"""``make soak``: kill -9 the ACTIVE of a real pair, over and over, under load; print JSON.

    python -m bench.soak [--kills 100] [--out FILE]

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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiormq

from amqha.quarantine import read_quarantine
from tests.durability import Ledger, drain, keep_consuming, keep_publishing
from tests.pairs import Pair


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.02)


async def soak(workdir: Path, kills: int) -> dict[str, Any]:
    pair = Pair(workdir).start()
    try:
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
        connection = await aiormq.connect(pair.primary.url)
        channel = await connection.channel()
        await channel.queue_declare("soak", durable=True)
        await connection.close()
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
        quarantined = 0
        for path in pair.quarantine_files():
            quarantined += len(read_quarantine(str(path)))
            replayed = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "amqha",
                    "quarantine",
                    "replay",
                    str(path),
                    "--url",
                    active.url,
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if replayed.returncode != 0:
                raise RuntimeError(f"replay of {path} failed: {replayed.stderr}")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="amqha-soak-") as tmp:
        result = asyncio.run(soak(Path(tmp), options.kills))
    text = json.dumps(result, indent=2)
    print(text)
    if options.out is not None:
        options.out.write_text(text + "\n")
    if result["lost"] or result["invented"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
