"""The replicated paths: amqha's pair beside a 3-node RabbitMQ cluster with quorum queues.

    python -m bench.quorum_bench [--quick]

Both answer "a failover loses no confirmed message": amqha's ACTIVE with its PASSIVE in
sync (a confirm waits for both stores), and RabbitMQ's quorum queue on three nodes
(Debian's rabbitmq-server, each node with its own ports and data dir on loopback,
clustered with ``join_cluster``; a confirm waits for a majority of them). The same raw
client (``bench.rawclient``) on 127.0.0.1 talks to the ACTIVE and to the node that
declared the queue (its leader), with 100-byte persistent messages:

- ``publish``: no confirms (msg/s: the first publish until the queue holds them all);
- ``publish_confirms``: at most 100 unconfirmed, after a warm-up;
- ``consume_ack_each`` and ``consume_ack_multiple`` (every 100th, multiple=true), with
  prefetch 1000 (msg/s: Basic.Consume to the last delivery).

Rounds alternate between the two, both running all along, and each figure keeps its
best round (the machine is shared: the best is the least disturbed); ``ratios`` is
amqha ÷ RabbitMQ per path, above 1 meaning amqha is faster. Every wait is bounded; a
measurement that fails is reported as an error and the others still run; the nodes
and the pair are stopped at the end whatever happened.

Must not know: either broker's insides (both are seen from the wire).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import rabbitmq, rawclient
from bench.broker_bench import measure, queue_name, run_async, wait_for_count
from bench.durable_bench import consume_seconds, side_by_side, top_up
from bench.replication_bench import until_in_sync
from tests.pairs import Pair
from tests.support import free_port

HOST = "127.0.0.1"
BODY = b"x" * 100
NODES = 3
QUORUM = {"x-queue-type": "quorum"}
DEFAULT_SIZES = {"messages": 100_000, "warm_up": 10_000, "rounds": 2}
QUICK_SIZES = {"messages": 10_000, "warm_up": 1_000, "rounds": 1}
THROUGHPUT_KEYS = (
    "publish_msgs_per_s",
    "publish_confirms_msgs_per_s",
    "consume_ack_each_msgs_per_s",
    "consume_ack_multiple_msgs_per_s",
)
LIMIT = 600.0  # no single measurement may take longer, in seconds
TARGET_RATIO = 2.5  # every path, amqha's pair over the quorum-queue cluster


def say(text: str) -> None:
    print(f"[quorum_bench] {text}", file=sys.stderr, flush=True)


async def paths(port: int, arguments: dict[str, Any] | None, sizes: dict[str, int]) -> dict:
    """The four paths on a fresh durable queue (declared with ``arguments``)."""
    results: dict[str, Any] = {}
    count = sizes["messages"]
    publisher = await rawclient.connect(HOST, port)
    await publisher.open_channel()
    confirmer = await rawclient.connect(HOST, port)
    await confirmer.open_channel(confirm=True)
    queue = queue_name("replicated")
    await confirmer.declare_queue(queue, durable=True, arguments=arguments)
    frames = rawclient.publish_frames(1, queue, BODY, persistent=True)

    async def publish() -> None:
        started = time.perf_counter()
        await publisher.publish(frames, count, limit=LIMIT)
        await wait_for_count(publisher, queue, count)
        results["publish_msgs_per_s"] = count / (time.perf_counter() - started)
        await publisher.purge_queue(queue)

    async def publish_confirms() -> None:
        await confirmer.publish_confirmed(frames, sizes["warm_up"], window=100, limit=LIMIT)
        await confirmer.purge_queue(queue)
        started = time.perf_counter()
        nacked = await confirmer.publish_confirmed(frames, count, window=100, limit=LIMIT)
        results["publish_confirms_msgs_per_s"] = count / (time.perf_counter() - started)
        if nacked:
            results["publish_confirms_nacked"] = nacked

    async def consume(ack: str) -> None:
        await top_up(confirmer, queue, frames, count)
        results[f"consume_ack_{ack}_msgs_per_s"] = count / await consume_seconds(
            port, queue, count, ack
        )

    try:
        await measure(results, "publish", publish, LIMIT, say)
        await measure(results, "publish+confirms", publish_confirms, LIMIT, say)
        await measure(results, "consume ack each", lambda: consume("each"), LIMIT, say)
        await measure(results, "consume ack multiple", lambda: consume("multiple"), LIMIT, say)
        await measure(results, "delete the queue", lambda: confirmer.delete_queue(queue), 60, say)
    finally:
        await publisher.close()
        await confirmer.close()
    return results


def best_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    best: dict[str, Any] = {}
    for key in THROUGHPUT_KEYS:
        values = [r[key] for r in rounds if isinstance(r.get(key), int | float)]
        if values:
            best[key] = round(max(values))
            best[key.replace("_msgs_per_s", "_median")] = round(statistics.median(values))
    errors = {k: v for r in rounds for k, v in r.get("errors", {}).items()}
    if errors:
        best["errors"] = errors
    best["rounds"] = [{k: round(v) for k, v in r.items() if k in THROUGHPUT_KEYS} for r in rounds]
    return best


def start_cluster() -> list[rabbitmq.RabbitNode]:
    """Three nodes sharing a cookie and an epmd, the second and third joined to the first.
    On a failure, the nodes started so far are stopped before it is raised."""
    cookie, epmd_port = secrets.token_hex(16), free_port()
    nodes = [
        rabbitmq.RabbitNode(name=f"quorum{n}", cookie=cookie, epmd_port=epmd_port)
        for n in range(NODES)
    ]
    try:
        for node in nodes:
            node.start(wait=False)  # they boot side by side
        for node in nodes:
            node.wait_serving()
        for node in nodes[1:]:
            node.join(nodes[0])
        status = nodes[0].ctl("cluster_status")
        missing = [node.nodename for node in nodes if node.nodename not in status]
        if missing:
            raise RuntimeError(f"not in the cluster after join_cluster: {missing}")
    except BaseException:
        stop_cluster(nodes)
        raise
    return nodes


def stop_cluster(nodes: list[rabbitmq.RabbitNode]) -> None:
    for node in reversed(nodes):
        node.stop()
    if nodes:
        rabbitmq.stop_epmd(nodes[0].epmd_port, nodes[0].env)


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if isinstance(numerator, int | float) and isinstance(denominator, int | float) and denominator:
        return round(numerator / denominator, 2)
    return None


def run(sizes: dict[str, int] | None = None) -> dict[str, Any]:
    sizes = dict(DEFAULT_SIZES, **(sizes or {}))
    load_at_start = os.getloadavg()
    available, how = rabbitmq.ensure_installed()
    rabbit: dict[str, Any] = rabbitmq.describe(None, how)
    amqha: dict[str, Any] = {}
    if not available:
        say(f"RabbitMQ unavailable: {how}")
    rounds: dict[str, list[dict[str, Any]]] = {"amqha": [], "rabbitmq": []}
    with tempfile.TemporaryDirectory(prefix="amqha-quorumbench-") as tmp:
        pair = Pair(Path(tmp) / "pair", heartbeat=0.2, timeout=0.6, proxied=False)
        nodes: list[rabbitmq.RabbitNode] = []
        try:
            say("amqha: starting a replicating pair")
            pair.start()
            asyncio.run(pair.wait_states("ACTIVE", "PASSIVE", timeout=60))
            active = pair.primary
            if available:
                try:
                    say(f"rabbitmq: starting {NODES} nodes and clustering them")
                    started = time.perf_counter()
                    nodes = start_cluster()
                    rabbit = rabbitmq.describe(nodes[0], how) | {
                        "nodes": NODES,
                        "queue_type": "quorum",
                        "cluster_start_s": round(time.perf_counter() - started, 1),
                    }
                except Exception as error:
                    say(f"RabbitMQ cluster failed: {error!r}")
                    rabbit = rabbitmq.describe(None, f"{how}; cluster failed: {error!r}")
            for number in range(sizes["rounds"]):
                say(f"round {number + 1}: amqha's pair (PASSIVE in sync)")
                asyncio.run(until_in_sync(active, 120))
                rounds["amqha"].append(run_async(paths(active.port, None, sizes)))
                if nodes:
                    say(f"round {number + 1}: RabbitMQ, a quorum queue on {NODES} nodes")
                    rounds["rabbitmq"].append(run_async(paths(nodes[0].port, QUORUM, sizes)))
        finally:
            pair.stop()
            stop_cluster(nodes)
    amqha.update(best_of(rounds["amqha"]))
    if rounds["rabbitmq"]:
        rabbit.update(best_of(rounds["rabbitmq"]))
    table = (
        {
            key.replace("_msgs_per_s", "_amqha_over_quorum"): _ratio(
                amqha.get(key), rabbit.get(key)
            )
            for key in THROUGHPUT_KEYS
        }
        if rounds["rabbitmq"]
        else {}
    )
    goals = {
        f"every_path_ge_{TARGET_RATIO}x_quorum": (
            None if not table else all((r or 0) >= TARGET_RATIO for r in table.values())
        )
    }
    return side_by_side(sizes, load_at_start, amqha, rabbit, table, goals)


def summary_rows(result: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    """(measurement, amqha, RabbitMQ, ratio with above 1 meaning amqha is faster)."""
    amqha, rabbit, table = result["amqha"], result["rabbitmq"], result.get("ratios", {})
    return [
        (
            f"replicated {key}",
            amqha.get(key),
            rabbit.get(key),
            table.get(key.replace("_msgs_per_s", "_amqha_over_quorum")),
        )
        for key in THROUGHPUT_KEYS
    ]


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    options = parser.parse_args()
    print(json.dumps(run(QUICK_SIZES if options.quick else None), indent=2))
