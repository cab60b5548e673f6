"""Failover time as a client sees it: kill -9 of the ACTIVE server to the next confirmed publish.

    python -m bench.failover_bench [--kills N]

The pair runs with the shipped timings and limits of config/primary.yaml and
config/backup.yaml (heartbeat 0.2 s, timeout 0.6 s) and the test users (the shipped
admin and peering passwords are made per install, in config/local/), on free loopback
ports with temporary data dirs. One ``amqha.client.connect_robust`` publisher with
confirms publishes continuously. Each round kills the ACTIVE server with SIGKILL (so the kills alternate
between the two), measures the time from just before the kill to the first publish
confirmed by the survivor, restarts the killed server and waits for it to settle PASSIVE.

A killed process's port refuses connections, and the survivor takes that as evidence
(docs/failover.md, "Evidence"): it takes over on the first client's vote without waiting
out the timeout. For comparison, Binary Star's default takes about 2 s.

Printed (JSON): every sample, p50 / p99 / max (nearest rank), the survivor's own takeover
time from its event log, and the targets (p50 <= 0.15 s, p99 <= 0.3 s). Figures only:
nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from amqha.client import connect_robust
from tests.pairs import Pair, Publisher

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"p50_s": 0.15, "p99_s": 0.3}
ROUND_TIMEOUT = 20.0  # bound on each wait: a takeover, a restart, a settle


def shipped(role: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "config" / f"{role}.yaml").read_text())


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: the smallest sample with at least ``fraction`` at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def say(text: str) -> None:
    print(f"[failover] {text}", file=sys.stderr, flush=True)


def run(kills: int = 20) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="amqha-failover-bench-") as workdir,
        _quiet_clients(),
    ):
        return asyncio.run(_run(kills, Path(workdir)))


@contextlib.contextmanager
def _quiet_clients() -> Iterator[None]:
    """The client libraries log every refused or redirected attempt of a failover."""
    loggers = [logging.getLogger(name) for name in ("aio_pika", "aiormq", "amqha.client")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def shipped_pair(workdir: Path) -> tuple[Pair, dict[str, float]]:
    """A pair (not started) with the shipped timings and limits, and those timings."""
    primary, backup = shipped("primary"), shipped("backup")
    timings = {key: primary["failover"][key] for key in ("heartbeat", "timeout")}
    if timings != {key: backup["failover"][key] for key in timings}:
        raise ValueError("config/primary.yaml and config/backup.yaml disagree on the timings")
    pair = Pair(
        workdir,
        heartbeat=timings["heartbeat"],
        timeout=timings["timeout"],
        proxied=False,
        limits=primary.get("limits", {}),
    )
    return pair, timings


async def _run(kills: int, workdir: Path) -> dict[str, Any]:
    pair, timings = shipped_pair(workdir)
    samples: list[dict[str, Any]] = []
    publisher: Publisher | None = None
    try:
        pair.start()
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=ROUND_TIMEOUT)
        connection = await connect_robust([s.url for s in pair.servers])
        channel = await connection.channel()
        await channel.declare_queue("failover-bench", arguments={"x-max-length": 10000})
        publisher = Publisher(connection, "failover-bench").start()
        for number in range(kills):
            samples.append(await _one_kill(pair, publisher))
            sample = samples[-1]
            say(
                f"kill {number + 1}/{kills}: {sample['killed']} -> {sample['survivor']} "
                f"confirmed after {sample['confirmed_s']:.3f} s"
            )
        await publisher.stop()
        await connection.close()
    finally:
        if publisher is not None:
            await publisher.stop()
        pair.stop()
    confirmed = [s["confirmed_s"] for s in samples]
    result: dict[str, Any] = {
        "kills": kills,
        "heartbeat_s": timings["heartbeat"],
        "timeout_s": timings["timeout"],
        "samples_s": [round(value, 4) for value in confirmed],
        "p50_s": round(percentile(confirmed, 0.50), 4),
        "p99_s": round(percentile(confirmed, 0.99), 4),
        "max_s": round(max(confirmed), 4),
        "takeover_p50_s": round(percentile([s["takeover_s"] for s in samples], 0.50), 4),
        "killed": [s["killed"] for s in samples],
        "published_confirmed": len(publisher.confirmed) if publisher else 0,
        # Publishes tried while no server was ACTIVE (each retried 10 ms later): not losses.
        "publish_attempts_failed": publisher.errors if publisher else 0,
        "targets": TARGETS,
    }
    result["met"] = result["p50_s"] <= TARGETS["p50_s"] and result["p99_s"] <= TARGETS["p99_s"]
    return result


async def _one_kill(pair: Pair, publisher: Publisher) -> dict[str, Any]:
    states = pair.states()
    active = pair.primary if states == ("ACTIVE", "PASSIVE") else pair.backup
    survivor = pair.other(active)
    # The publisher is on the ACTIVE server before the kill.
    await publisher.confirmed_after(time.time(), ROUND_TIMEOUT, by=active.name)
    kill = pair.kill(active)
    confirmed = await publisher.confirmed_after(kill.before, ROUND_TIMEOUT, by=survivor.name)
    takeover = next(
        e["ts"]
        for e in reversed(pair.events(survivor))
        if e["event"] == "transition" and e["to"] == "ACTIVE"
    )
    active.start()
    settled = ("PASSIVE", "ACTIVE") if active is pair.primary else ("ACTIVE", "PASSIVE")
    await pair.wait_states(*settled, timeout=ROUND_TIMEOUT)
    return {
        "killed": active.name,
        "survivor": survivor.name,
        "confirmed_s": confirmed - kill.before,
        "takeover_s": takeover - kill.before,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover_bench", description=__doc__)
    parser.add_argument("--kills", type=int, default=20, help="kill -9 rounds (default 20)")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.kills), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
