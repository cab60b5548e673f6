"""Deduplication's cost: confirmed publish to a deduplicating queue beside a plain one.

    python -m bench.dedup_bench [--quick] [--messages N] [--rounds R]

The raw client (bench/rawclient.py), 100-byte persistent messages each with its own
``x-deduplication-header`` (a uuid4: no message is a copy), publisher confirms with 100
in flight, two durable queues on the same server:

- ``plain``: no arguments;
- ``dedup``: ``x-message-deduplication: true`` (RabbitMQ's deduplication plugin's
  argument: the broker keeps the header values of the messages in the queue);

on one server with its store (``standalone``) and on the ACTIVE of a pair with an in-sync
PASSIVE (``replicated``: the PASSIVE keeps the same state). Per setup: the best round of
each queue (msg/s from the first publish to the last confirm, after a warm-up, and the
broker's CPU µs per message), ``ratio`` dedup ÷ plain of the best rounds and
``ratio_of_medians``; the queues take turns round by round, the first of each round
alternating. Goal: dedup at most 15% slower (``ratio`` >= 0.85).

``deduplicating`` says whether the server dropped a copy: two messages with the same
header published to a fresh deduplicating queue, and what it then holds. A server that
ignores the argument still gives figures (both queues then do the same work), and
``met`` is null.

Must not know: the broker's insides (seen from the wire and /proc only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pamqp import commands

from bench import rawclient
from bench.broker_bench import cpu_seconds, run_async
from bench.replication_bench import until_in_sync
from bench.run import sizes_from
from tests.pairs import Pair
from tests.support import ServerProcess

HOST = "127.0.0.1"
BODY = b"x" * 100
WINDOW = 100  # confirms in flight, as in durable_bench and replication_bench
LIMIT = 600.0  # no single publish may take longer than this, in seconds
HEADER = "x-deduplication-header"
PLACEHOLDER = "@" * 32  # a uuid4's hex digits take its place in each message
QUEUES: dict[str, dict[str, Any]] = {
    "plain": {},
    "dedup": {"x-message-deduplication": True},
}
TARGET_RATIO = 0.85  # dedup at most 15% slower than plain

DEFAULT_SIZES = {"messages": 100_000, "rounds": 5}
QUICK_SIZES = {"messages": 10_000, "rounds": 1}


def say(text: str) -> None:
    print(f"[dedup] {text}", file=sys.stderr, flush=True)


def template(queue: str) -> bytes:
    """One persistent publish to ``queue`` with the header's value still a placeholder."""
    return rawclient.publish_frames(1, queue, BODY, persistent=True, headers={HEADER: PLACEHOLDER})


def unique(queue: str, count: int) -> list[bytes]:
    """``count`` publishes to ``queue``, each with a header value of its own."""
    frames = template(queue)
    placeholder = PLACEHOLDER.encode()
    assert frames.count(placeholder) == 1
    return [frames.replace(placeholder, uuid.uuid4().hex.encode()) for _ in range(count)]


async def declare(client: rawclient.RawClient, queue: str) -> None:
    await client.rpc(
        commands.Queue.Declare(queue=queue, durable=True, arguments=QUEUES[queue] or None)
    )


async def confirmed_publish(port: int, pid: int | None, queue: str, count: int) -> dict[str, Any]:
    """Warm-up, purge, then ``count`` messages timed to the last confirm; the queue is
    purged again after."""
    warm_up, messages = unique(queue, min(count, 5000)), unique(queue, count)
    client = await rawclient.connect(HOST, port)
    try:
        await client.open_channel(confirm=True)
        await declare(client, queue)
        await client.publish_confirmed_each(warm_up, window=WINDOW, limit=LIMIT)
        await client.purge_queue(queue)
        cpu = cpu_seconds(pid)
        started = time.perf_counter()
        nacked = await client.publish_confirmed_each(messages, window=WINDOW, limit=LIMIT)
        elapsed = time.perf_counter() - started
        after = cpu_seconds(pid)
        queued = await client.declare_queue(queue, passive=True)
        await client.purge_queue(queue)
    finally:
        await client.close()
    return {
        "msgs_per_s": round(count / elapsed),
        "server_cpu_us_per_msg": None
        if cpu is None or after is None
        else round((after - cpu) / count * 1e6, 2),
        "nacked": nacked,
        "queued": queued,
    }


async def deduplicating(port: int) -> bool:
    """Whether a fresh deduplicating queue keeps one of two messages with the same header."""
    client = await rawclient.connect(HOST, port)
    try:
        await client.open_channel(confirm=True)
        queue = f"dedup-probe-{uuid.uuid4().hex[:8]}"
        await client.rpc(
            commands.Queue.Declare(queue=queue, durable=True, arguments=QUEUES["dedup"])
        )
        frames = template(queue).replace(PLACEHOLDER.encode(), uuid.uuid4().hex.encode())
        await client.publish_confirmed(frames, 2, window=2, limit=60)
        held = await client.declare_queue(queue, passive=True)
        await client.delete_queue(queue)
    finally:
        await client.close()
    return held == 1


def compare(rounds: dict[str, list[dict[str, Any]]], dropped: bool) -> dict[str, Any]:
    """Each queue's best round and every round's rate; dedup ÷ plain, and whether that
    met the goal (None when the server did not deduplicate: nothing was measured)."""
    section: dict[str, Any] = {}
    for kind, results in rounds.items():
        best = max(results, key=lambda r: r["msgs_per_s"])
        section[kind] = best | {"rounds": [r["msgs_per_s"] for r in results]}
    plain, dedup = section["plain"], section["dedup"]
    section["ratio"] = round(dedup["msgs_per_s"] / plain["msgs_per_s"], 3)
    section["ratio_of_medians"] = round(
        statistics.median(dedup["rounds"]) / statistics.median(plain["rounds"]), 3
    )
    section["deduplicating"] = dropped
    section["met"] = section["ratio"] >= TARGET_RATIO if dropped else None
    return section


def run(sizes: dict[str, int] | None = None) -> dict[str, Any]:
    sizes = dict(DEFAULT_SIZES, **(sizes or {}))
    count = sizes["messages"]
    result: dict[str, Any] = {
        "sizes": sizes,
        "message_bytes": len(BODY),
        "window": WINDOW,
        "load_average_at_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="amqha-dedupbench-") as tmp:
        workdir = Path(tmp)
        say("a standalone server and a replicating pair; plain and dedup queues take turns")
        solo = ServerProcess(workdir, "solo").start()
        pair = Pair(workdir / "pair", heartbeat=0.2, timeout=0.6, proxied=False).start()
        try:
            run_async(pair.wait_states("ACTIVE", "PASSIVE", timeout=60))
            active = pair.primary
            assert solo.process is not None and active.process is not None
            setups = {
                "standalone": (solo, solo.process.pid),
                "replicated": (active, active.process.pid),
            }
            dropped = {name: run_async(deduplicating(s.port)) for name, (s, _) in setups.items()}
            say(f"a copy dropped by the dedup queue: {dropped}")
            rounds: dict[str, dict[str, list[dict[str, Any]]]] = {
                name: {kind: [] for kind in QUEUES} for name in setups
            }
            for number in range(sizes["rounds"]):
                order = list(QUEUES) if number % 2 == 0 else list(reversed(QUEUES))
                for name, (server, pid) in setups.items():
                    for kind in order:
                        if name == "replicated":
                            run_async(until_in_sync(active, 60))
                        figures = run_async(confirmed_publish(server.port, pid, kind, count))
                        rounds[name][kind].append(figures)
                        say(
                            f"round {number + 1}: {name} {kind}: {figures['msgs_per_s']} msg/s, "
                            f"{figures['server_cpu_us_per_msg']} us/msg"
                        )
            for name in setups:
                result[name] = compare(rounds[name], dropped[name])
        finally:
            solo.stop()
            pair.stop()
    result["target_ratio"] = TARGET_RATIO
    result["load_average_at_end"] = os.getloadavg()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dedup_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--messages", type=int, help="messages per timed publish")
    parser.add_argument("--rounds", type=int, help="rounds of each queue on each setup")
    options = parser.parse_args()
    print(json.dumps(run(sizes_from(options, QUICK_SIZES, DEFAULT_SIZES)), indent=2))


if __name__ == "__main__":
    main()
