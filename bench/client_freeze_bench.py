"""A frozen ACTIVE as a client sees it: SIGSTOP of the ACTIVE to the first confirm on the backup.

    python -m bench.client_freeze_bench [--freezes N] [--silent-after S]

The pair runs with the shipped timings and limits of config/primary.yaml and
config/backup.yaml (heartbeat 0.2 s, timeout 0.6 s), on free loopback ports with
temporary data dirs. One ``amqha.client.Publisher`` with its default settings (URLs
without a heartbeat, ``silent_after`` 1.2 s) sends persistent messages continuously, so
confirms are always outstanding. Each round stops the ACTIVE with SIGSTOP (so the freezes
alternate between the two servers) and measures the time from just before the stop to
the first message the other server confirms. Nothing at the socket level tells the
client: its watch does (docs/client.md, "A silent server"), and its connection to the
other server is the vote that takes over. The frozen server is then killed (SIGKILL
ends a stopped process) and restarted, and the round waits for it to be PASSIVE in sync.

Printed (JSON): every sample, p50 / p99 / max (nearest rank), the survivor's takeover
time from its event log, the outage each failover line stated, confirmed messages
missing from the survivor at the end (0 expected), and the target (p99 <= 2 s). Figures
only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika

from amqha.client import Publisher
from amqha.client_watch import DEFAULT_SILENT_AFTER
from bench.failover_bench import percentile, shipped_pair
from tests.durability import drain
from tests.pairs import Pair, poll

TARGETS = {"p99_s": 2.0}
ROUND_TIMEOUT = 30.0  # bound on each wait: a failover, a restart, a settle
QUEUE = "client-freeze-bench"
STATED = re.compile(r"failed over: lost \S+, \S+ serves now, after ([\d.]+) s")


def say(text: str) -> None:
    print(f"[client_freeze] {text}", file=sys.stderr, flush=True)


class StatedOutages(logging.Handler):
    """The outage each failover line of amqha.client states."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.stated: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = STATED.search(record.getMessage())
        if match:
            self.stated.append(float(match.group(1)))


class Sending:
    """Sends through the publisher until stopped; (wall clock, server address) per confirm."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self.confirms: list[tuple[float, str | None]] = []
        self.confirmed: set[bytes] = set()
        self.stopping = False
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        number = 0
        while not self.stopping:
            body = b"%d" % number
            number += 1
            future = await self.publisher.send(body, routing_key=QUEUE)
            future.add_done_callback(lambda f, b=body: self._confirmed(f, b))
            await asyncio.sleep(0.002)

    def _confirmed(self, future: asyncio.Future[None], body: bytes) -> None:
        if not future.cancelled() and future.exception() is None:
            self.confirms.append((time.time(), self.publisher.server))
            self.confirmed.add(body)

    async def stop(self) -> None:
        self.stopping = True
        await asyncio.wait_for(self.task, ROUND_TIMEOUT)


def run(freezes: int = 20, silent_after: float = DEFAULT_SILENT_AFTER) -> dict[str, Any]:
    handler = StatedOutages()
    client_log = logging.getLogger("amqha.client")
    quiet = [logging.getLogger(name) for name in ("aio_pika", "aiormq")]
    levels = [client_log.level, *(logger.level for logger in quiet)]
    client_log.setLevel(logging.INFO)
    client_log.addHandler(handler)
    client_log.propagate = False
    for logger in quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        with tempfile.TemporaryDirectory(prefix="amqha-client-freeze-bench-") as workdir:
            return asyncio.run(_run(freezes, Path(workdir), handler, silent_after))
    finally:
        client_log.removeHandler(handler)
        client_log.propagate = True
        for logger, level in zip([client_log, *quiet], levels, strict=True):
            logger.setLevel(level)


async def _declare(channel: aio_pika.abc.AbstractChannel) -> None:
    await channel.declare_queue(QUEUE, durable=True, arguments={"x-max-length": 100_000})


async def _run(
    freezes: int, workdir: Path, handler: StatedOutages, silent_after: float
) -> dict[str, Any]:
    pair, timings = shipped_pair(workdir)
    samples: list[dict[str, Any]] = []
    missing = None
    try:
        pair.start()
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=ROUND_TIMEOUT)
        urls = [s.url for s in pair.servers]
        async with Publisher(urls, setup=_declare, silent_after=silent_after) as publisher:
            sending = Sending(publisher)
            for number in range(freezes):
                samples.append(await _one_freeze(pair, publisher, sending))
                sample = samples[-1]
                say(
                    f"freeze {number + 1}/{freezes}: {sample['frozen']} -> {sample['survivor']} "
                    f"confirmed after {sample['confirmed_s']:.3f} s"
                )
            await sending.stop()
            await publisher.flush(ROUND_TIMEOUT)
            active, _ = await pair.settled(timeout=ROUND_TIMEOUT)
            held = {body for body, _ in await drain(active.url, QUEUE)}
            missing = len(sending.confirmed - held)
            confirmed = len(sending.confirmed)
    finally:
        pair.stop()
    times = [s["confirmed_s"] for s in samples]
    result: dict[str, Any] = {
        "freezes": freezes,
        "silent_after_s": silent_after,
        "heartbeat_s": timings["heartbeat"],
        "timeout_s": timings["timeout"],
        "samples_s": [round(value, 4) for value in times],
        "p50_s": round(percentile(times, 0.50), 4),
        "p99_s": round(percentile(times, 0.99), 4),
        "max_s": round(max(times), 4),
        "takeover_p50_s": round(percentile([s["takeover_s"] for s in samples], 0.50), 4),
        "stated_outage_s": handler.stated,
        "frozen": [s["frozen"] for s in samples],
        "published_confirmed": confirmed,
        "confirmed_missing": missing,
        "targets": TARGETS,
    }
    result["met"] = result["p99_s"] <= TARGETS["p99_s"] and missing == 0
    return result


async def _one_freeze(pair: Pair, publisher: Publisher, sending: Sending) -> dict[str, Any]:
    active, survivor = await pair.settled(timeout=ROUND_TIMEOUT)
    mark = time.time()
    await poll(
        lambda: any(at > mark and by == active.address for at, by in sending.confirms),
        ROUND_TIMEOUT,
        f"a confirm from {active.name} before the freeze",
    )
    assert active.process is not None
    stopped_at = time.time()
    os.kill(active.process.pid, signal.SIGSTOP)
    confirmed = await poll(
        lambda: min(
            (at for at, by in sending.confirms if at > stopped_at and by == survivor.address),
            default=None,
        ),
        ROUND_TIMEOUT,
        f"a confirm from {survivor.name} while {active.name} is frozen",
    )
    takeover = next(
        e["ts"]
        for e in reversed(pair.events(survivor))
        if e["event"] == "transition" and e["to"] == "ACTIVE"
    )
    pair.kill(active)  # SIGKILL ends a stopped process
    active.start(wait=False)  # the next round's settled() waits for it
    return {
        "frozen": active.name,
        "survivor": survivor.name,
        "confirmed_s": confirmed - stopped_at,
        "takeover_s": takeover - stopped_at,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.client_freeze_bench", description=__doc__
    )
    parser.add_argument("--freezes", type=int, default=20, help="SIGSTOP rounds (default 20)")
    parser.add_argument(
        "--silent-after",
        type=float,
        default=DEFAULT_SILENT_AFTER,
        help=f"the publisher's silent_after (default {DEFAULT_SILENT_AFTER})",
    )
    args = parser.parse_args(argv)
    print(json.dumps(run(args.freezes, args.silent_after), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
