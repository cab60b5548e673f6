"""Durable queues and persistent messages: amqha beside RabbitMQ, the same raw client.

Owns: the durable measurements, on a durable queue with persistent 100-byte messages
through the default exchange, ``bench.rawclient`` on 127.0.0.1, both brokers in the same
run:

- publish with confirms, at most 100 unconfirmed, after a warm-up (msg/s: the first
  publish to the last confirm);
- consume with prefetch 1000, acking each delivery and acking every 100th with
  multiple=true (msg/s: Basic.Consume to the last delivery);
- beside each: the CPU the broker process (RabbitMQ: its Erlang VM) spent per message;
- 1M persistent messages queued (confirm window 1000, its msg/s and CPU too): the RSS
  they cost beyond their bodies, the disk they cost (the data directory after a clean
  stop, less the empty broker's), the clean stop, and the restart: from spawning the
  process on the same data to the queue answering a passive declare with all of them.
  amqha is also killed with -9 right after the publish (its store's log still holds
  recent writes) and restarted the same way.

The throughput runs alternate brokers round by round and keep each figure's best round,
as ``bench.broker_bench`` does; the 1M runs take a fresh broker each. Every wait is
bounded in count and time; a measurement that fails is reported as an error, and the
others still run.

Must not know: the brokers' insides (both are seen from the wire, /proc and the disk).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import rabbitmq, rawclient
from bench.broker_bench import cpu_seconds, queue_name, record_cpu, run_async, vm_rss
from bench.broker_bench import measure as broker_measure
from tests.support import ServerProcess

HOST = "127.0.0.1"
BODY = b"x" * 100

DEFAULT_SIZES = {
    "messages": 100_000,  # per throughput measurement
    "warm_up": 20_000,
    "queued": 1_000_000,  # held across the restart
    "rounds": 2,
}
QUICK_SIZES = {"messages": 10_000, "warm_up": 2_000, "queued": 100_000, "rounds": 1}

THROUGHPUT_KEYS = (
    "publish_confirms_msgs_per_s",
    "consume_ack_each_msgs_per_s",
    "consume_ack_multiple_msgs_per_s",
)
CPU_KEYS = tuple(key.replace("_msgs_per_s", "_server_cpu_us_per_msg") for key in THROUGHPUT_KEYS)
LIMIT = 600.0  # no single measurement may take longer than this, in seconds
STOP_LIMIT = 300.0  # a clean stop with 1M messages may flush for a while
POLL = 0.005  # seconds between two attempts while waiting for a restarted broker
TARGET_PUBLISH_RATIO = 2.0


def say(text: str) -> None:
    print(f"[durable] {text}", file=sys.stderr, flush=True)


async def measure(results: dict[str, Any], name: str, step: Callable[[], Awaitable[Any]]) -> None:
    """broker_bench's measure, with this bench's limit and voice."""
    await broker_measure(results, name, step, LIMIT, say)


def disk_usage(path: Path, prefix: str = "") -> dict[str, int]:
    """Bytes under ``path`` (files whose name starts with ``prefix``): apparent (st_size)
    and allocated (st_blocks, what ``du`` counts)."""
    apparent = allocated = 0
    for root, _, names in os.walk(path):
        for name in names:
            if not name.startswith(prefix):
                continue
            try:
                stat = os.lstat(os.path.join(root, name))
            except OSError:  # gone between the listing and the stat
                continue
            apparent += stat.st_size
            allocated += stat.st_blocks * 512
    return {"apparent": apparent, "allocated": allocated}


# -- throughput ----------------------------------------------------------------------------


async def top_up(confirmer: rawclient.RawClient, queue: str, frames: bytes, count: int) -> None:
    """Publish (confirmed, 1000 in flight) until ``queue`` holds ``count`` messages."""
    held = await confirmer.declare_queue(queue, passive=True)
    if held < count:
        await confirmer.publish_confirmed(frames, count - held, window=1000, limit=LIMIT)


async def consume_seconds(port: int, queue: str, count: int, ack: str) -> float:
    """Consume ``count`` messages on a connection of its own, prefetch 1000, acking each or
    every 100th with multiple (``ack``): seconds from Basic.Consume to the last delivery."""
    consumer = await rawclient.connect(HOST, port)
    try:
        await consumer.open_channel()
        return await consumer.consume(queue, count, ack=ack, prefetch=1000, limit=LIMIT)
    finally:
        await consumer.close()


async def throughput_suite(port: int, pid: int | None, sizes: dict[str, int]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    count = sizes["messages"]
    confirmer = await rawclient.connect(HOST, port)
    await confirmer.open_channel(confirm=True)
    queue = queue_name("durable")
    await confirmer.declare_queue(queue, durable=True)
    frames = rawclient.publish_frames(1, queue, BODY, persistent=True)

    async def publish_confirms() -> None:
        await confirmer.publish_confirmed(frames, sizes["warm_up"], window=100, limit=LIMIT)
        await confirmer.purge_queue(queue)
        cpu = cpu_seconds(pid)
        started = time.perf_counter()
        nacked = await confirmer.publish_confirmed(frames, count, window=100, limit=LIMIT)
        results["publish_confirms_msgs_per_s"] = count / (time.perf_counter() - started)
        record_cpu(results, "publish_confirms_server_cpu_us_per_msg", pid, cpu, count)
        if nacked:
            results["publish_confirms_nacked"] = nacked

    async def consume(ack: str) -> None:
        await top_up(confirmer, queue, frames, count)
        cpu = cpu_seconds(pid)
        elapsed = await consume_seconds(port, queue, count, ack)
        results[f"consume_ack_{ack}_msgs_per_s"] = count / elapsed
        record_cpu(results, f"consume_ack_{ack}_server_cpu_us_per_msg", pid, cpu, count)

    try:
        await measure(results, "persistent publish+confirms", publish_confirms)
        await measure(results, "persistent consume ack each", lambda: consume("each"))
        await measure(results, "persistent consume ack multiple", lambda: consume("multiple"))
        await measure(results, "delete the queue", lambda: confirmer.delete_queue(queue))
    finally:
        await confirmer.close()
    return results


def best_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the best round: the machine is shared, so the best is the least disturbed."""
    best: dict[str, Any] = {}
    for key in (*THROUGHPUT_KEYS, *CPU_KEYS):
        values = [r[key] for r in rounds if isinstance(r.get(key), int | float)]
        if values:
            best[key] = max(values) if key in THROUGHPUT_KEYS else min(values)
    errors = {k: v for r in rounds for k, v in r.get("errors", {}).items()}
    if errors:
        best["errors"] = errors
    best["rounds"] = rounds
    return best


# -- 1M queued: memory, disk, stop and restart -------------------------------------------


async def fill(port: int, pid: int | None, queue: str, count: int) -> dict[str, Any]:
    """Declare ``queue`` durable and publish ``count`` persistent messages, confirm window 1000."""
    client = await rawclient.connect(HOST, port)
    try:
        await client.open_channel(confirm=True)
        await client.declare_queue(queue, durable=True)
        rss_before = vm_rss(pid) if pid is not None else None
        frames = rawclient.publish_frames(1, queue, BODY, persistent=True)
        figures: dict[str, Any] = {"messages": count}
        cpu = cpu_seconds(pid)
        started = time.perf_counter()
        figures["nacked"] = await client.publish_confirmed(frames, count, window=1000, limit=LIMIT)
        figures["publish_confirms_w1000_msgs_per_s"] = count / (time.perf_counter() - started)
        record_cpu(figures, "publish_confirms_w1000_server_cpu_us_per_msg", pid, cpu, count)
        figures["queued"] = await client.declare_queue(queue, passive=True)
        if pid is not None and rss_before is not None:
            rss_after = vm_rss(pid)
            figures["rss_before_bytes"] = rss_before
            figures["rss_after_bytes"] = rss_after
            figures["rss_overhead_bytes_per_message"] = round(
                (rss_after - rss_before) / count - len(BODY), 1
            )
    finally:
        await client.close()
    return figures


async def until_queue_holds(
    port: int, queue: str, count: int, spawned: float, alive: Callable[[], bool]
) -> tuple[float, int]:
    """Seconds from ``spawned`` (a perf_counter) to a passive declare of ``queue`` answering
    with at least ``count`` messages, and the count it answered; bounded by ``LIMIT``."""
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("the broker exited while starting")
        try:
            client = await rawclient.connect(HOST, port, limit=5.0)
        except (OSError, rawclient.ServerClosed):  # not listening yet, or not serving yet
            await asyncio.sleep(POLL)
            continue
        try:
            await client.open_channel()
            while time.monotonic() < deadline:
                held = await client.declare_queue(queue, passive=True)
                if held >= count:
                    return time.perf_counter() - spawned, held
                await asyncio.sleep(POLL)
        except (OSError, rawclient.ServerClosed):  # the queue is not there yet: a new channel
            pass
        finally:
            await client.close()
        await asyncio.sleep(POLL)
    raise TimeoutError(f"{queue} did not hold {count} messages {LIMIT} s after the spawn")


def disk_per_message(figures: dict[str, Any], count: int) -> None:
    empty, stopped = figures.get("disk_empty"), figures.get("disk_stopped")
    if empty is not None and stopped is not None:
        figures["disk_bytes_per_message"] = round(
            (stopped["allocated"] - empty["allocated"]) / count, 1
        )
        figures["disk_apparent_bytes_per_message"] = round(
            (stopped["apparent"] - empty["apparent"]) / count, 1
        )


def amqha_queued(workdir: Path, count: int) -> dict[str, Any]:
    """1M on a fresh amqha: fill, kill -9, restart, SIGTERM, restart."""
    figures: dict[str, Any] = {}
    server = ServerProcess(workdir, "queued")
    queue = queue_name("queued")

    def restart(kind: str) -> None:
        spawned = time.perf_counter()
        server.start(wait=False)
        assert server.process is not None
        seconds, held = run_async(
            until_queue_holds(server.port, queue, count, spawned, lambda: server.alive)
        )
        pid = server.process.pid
        figures[f"{kind}_restart_s"] = round(seconds, 3)
        figures[f"{kind}_restart_held"] = held
        figures[f"{kind}_restart_cpu_s"] = cpu_seconds(pid)
        figures[f"{kind}_restart_rss_bytes"] = vm_rss(pid)
        say(f"amqha: {kind} restart with {held} queued: {seconds:.2f} s")

    try:
        started = time.perf_counter()
        server.start()  # until its log says it listens, then a connect
        figures["empty_start_s"] = round(time.perf_counter() - started, 3)
        assert server.process is not None
        figures["disk_empty"] = disk_usage(server.data_dir)
        say(f"amqha: publishing {count} persistent messages")
        figures.update(run_async(fill(server.port, server.process.pid, queue, count)))
        figures["disk_live"] = disk_usage(server.data_dir)
        server.kill()
        restart("kill9")
        started = time.perf_counter()
        server.terminate(timeout=STOP_LIMIT)
        figures["stop_s"] = round(time.perf_counter() - started, 3)
        figures["disk_stopped"] = disk_usage(server.data_dir)
        figures["store_stopped"] = disk_usage(server.data_dir, prefix="store.sqlite")
        disk_per_message(figures, count)
        restart("clean")
        figures["restart_s"] = figures["clean_restart_s"]
    finally:
        server.stop()
    return figures


def rabbit_queued(count: int) -> dict[str, Any]:
    """1M on a fresh RabbitMQ node: fill, rabbitmqctl stop, restart on the same data."""
    figures: dict[str, Any] = {}
    node = rabbitmq.RabbitNode()
    queue = queue_name("queued")
    data = node.dir / "mnesia"
    try:
        node.start()
        figures["empty_start_s"] = node.start_seconds
        figures["disk_empty"] = disk_usage(data)
        say(f"rabbitmq: publishing {count} persistent messages")
        figures.update(run_async(fill(node.port, node.beam_pid(), queue, count)))
        figures["disk_live"] = disk_usage(data)
        started = time.perf_counter()
        node.shutdown(timeout=STOP_LIMIT)
        figures["stop_s"] = round(time.perf_counter() - started, 3)
        figures["disk_stopped"] = disk_usage(data)
        disk_per_message(figures, count)
        node.start(wait=False)
        process = node.process
        assert process is not None
        seconds, held = run_async(
            until_queue_holds(node.port, queue, count, node.spawned, lambda: process.poll() is None)
        )
        figures["clean_restart_s"] = figures["restart_s"] = round(seconds, 3)
        figures["clean_restart_held"] = held
        beam = node.beam_pid()
        if beam is not None:
            figures["clean_restart_cpu_s"] = cpu_seconds(beam)
            figures["clean_restart_rss_bytes"] = vm_rss(beam)
        say(f"rabbitmq: clean restart with {held} queued: {seconds:.2f} s")
    finally:
        node.stop()
    return figures


# -- the run ---------------------------------------------------------------------------------


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if isinstance(numerator, int | float) and isinstance(denominator, int | float) and denominator:
        return round(numerator / denominator, 3)
    return None


def ratios(amqha: dict[str, Any], rabbit: dict[str, Any]) -> dict[str, Any]:
    """Named for their direction; either way, above 1 means amqha is better."""
    table: dict[str, Any] = {}
    for key in THROUGHPUT_KEYS:
        table[key.replace("_msgs_per_s", "_amqha_over_rabbitmq")] = _ratio(
            amqha.get(key), rabbit.get(key)
        )
    for key in CPU_KEYS:
        table[key.replace("_us_per_msg", "_rabbitmq_over_amqha")] = _ratio(
            rabbit.get(key), amqha.get(key)
        )
    ours, theirs = amqha.get("queued", {}), rabbit.get("queued", {})
    table["publish_confirms_w1000_amqha_over_rabbitmq"] = _ratio(
        ours.get("publish_confirms_w1000_msgs_per_s"),
        theirs.get("publish_confirms_w1000_msgs_per_s"),
    )
    for key in (
        "publish_confirms_w1000_server_cpu_us_per_msg",
        "rss_overhead_bytes_per_message",
        "disk_bytes_per_message",
        "stop_s",
        "restart_s",
    ):
        name = key.removesuffix("_us_per_msg").removesuffix("_s")
        table[f"{name}_rabbitmq_over_amqha"] = _ratio(theirs.get(key), ours.get(key))
    return table


def targets(table: dict[str, Any]) -> dict[str, Any]:
    ratio = table.get("publish_confirms_amqha_over_rabbitmq")
    return {
        "persistent_publish_confirms_ge_2x_rabbitmq": (
            None if ratio is None else ratio >= TARGET_PUBLISH_RATIO
        )
    }


def side_by_side(
    sizes: dict[str, int],
    load_at_start: tuple[float, float, float],
    amqha: dict[str, Any],
    rabbit: dict[str, Any],
    table: dict[str, Any],
    goals: dict[str, Any],
) -> dict[str, Any]:
    """A bench's result as ``bench.run``'s table reads it: both sides, ratios, targets."""
    return {
        "sizes": sizes,
        "message_bytes": len(BODY),
        "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "amqha": amqha,
        "rabbitmq": rabbit,
        "ratios": table,
        "targets": goals,
    }


def run(sizes: dict[str, int] | None = None) -> dict[str, Any]:
    sizes = dict(DEFAULT_SIZES, **(sizes or {}))
    load_at_start = os.getloadavg()
    amqha: dict[str, Any] = {}
    available, how = rabbitmq.ensure_installed()
    rabbit = rabbitmq.describe(None, how)
    if not available:
        say(f"RabbitMQ unavailable: {how}")
    with tempfile.TemporaryDirectory(prefix="amqha-dbench-") as tmp:
        workdir = Path(tmp)
        server = ServerProcess(workdir, "throughput")
        node = rabbitmq.RabbitNode() if available else None
        rounds: dict[str, list[dict[str, Any]]] = {"amqha": [], "rabbitmq": []}
        try:
            server.start()
            assert server.process is not None
            brokers: dict[str, tuple[int, int | None]] = {
                "amqha": (server.port, server.process.pid)
            }
            if node is not None:
                try:
                    say("rabbitmq: starting a private node")
                    node.start()
                    rabbit = rabbitmq.describe(node, how)
                    brokers["rabbitmq"] = (node.port, node.beam_pid())
                except Exception as error:
                    say(f"RabbitMQ failed: {error!r}")
                    rabbit = rabbitmq.describe(None, f"{how}; failed: {error!r}")
            for number in range(sizes["rounds"]):
                for name, (port, pid) in brokers.items():
                    say(f"round {number + 1}: {name}")
                    rounds[name].append(run_async(throughput_suite(port, pid, sizes)))
        finally:
            server.stop()
            if node is not None:
                node.stop()
        amqha.update(best_of(rounds["amqha"]))
        if rounds["rabbitmq"]:
            rabbit.update(best_of(rounds["rabbitmq"]))
        try:
            amqha["queued"] = amqha_queued(workdir, sizes["queued"])
        except Exception as error:
            say(f"amqha 1M run failed: {error!r}")
            amqha.setdefault("errors", {})["queued"] = repr(error)
        if rabbit.get("available"):
            try:
                rabbit["queued"] = rabbit_queued(sizes["queued"])
            except Exception as error:
                say(f"rabbitmq 1M run failed: {error!r}")
                rabbit.setdefault("errors", {})["queued"] = repr(error)
    table = ratios(amqha, rabbit) if rabbit.get("available") else {}
    return side_by_side(sizes, load_at_start, amqha, rabbit, table, targets(table))


def summary_rows(result: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    """(measurement, amqha, RabbitMQ, ratio with above 1 meaning amqha is better)."""
    amqha, rabbit, table = result["amqha"], result["rabbitmq"], result.get("ratios", {})
    rows = []
    for key in THROUGHPUT_KEYS:
        ratio = table.get(key.replace("_msgs_per_s", "_amqha_over_rabbitmq"))
        rows.append((f"durable {key}", amqha.get(key), rabbit.get(key), ratio))
    for key in CPU_KEYS:
        ratio = table.get(key.replace("_us_per_msg", "_rabbitmq_over_amqha"))
        rows.append((f"durable {key}", amqha.get(key), rabbit.get(key), ratio))
    ours, theirs = amqha.get("queued", {}), rabbit.get("queued", {})
    for key, ratio_name in (
        ("publish_confirms_w1000_msgs_per_s", "publish_confirms_w1000_amqha_over_rabbitmq"),
        ("rss_overhead_bytes_per_message", "rss_overhead_bytes_per_message_rabbitmq_over_amqha"),
        ("disk_bytes_per_message", "disk_bytes_per_message_rabbitmq_over_amqha"),
        ("stop_s", "stop_rabbitmq_over_amqha"),
        ("empty_start_s", ""),
        ("restart_s", "restart_rabbitmq_over_amqha"),
        ("kill9_restart_s", ""),
    ):
        rows.append((f"queued {key}", ours.get(key), theirs.get(key), table.get(ratio_name)))
    return rows


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(
        prog="python -m bench.durable_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    options = parser.parse_args()
    print(json.dumps(run(QUICK_SIZES if options.quick else DEFAULT_SIZES), indent=2, default=str))
