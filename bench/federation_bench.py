"""Exchange federation: amqha beside RabbitMQ's federation plugin, the same raw client.

Owns: two figures of one federated exchange, ``market`` (topic, durable), between two
brokers of each kind on 127.0.0.1, an upstream and a downstream that federates ``market``
from it with confirmed delivery (docs/federation.md):

- **rate**: a confirming publisher on the upstream's ``market`` (``window`` unconfirmed,
  persistent 256-byte messages) and a consumer (prefetch 1000, acking every 100th with
  multiple=true) on a durable queue bound to the downstream's ``market``; msg/s from the
  first publish to the last delivery downstream, the time to the last confirm upstream,
  and the CPU each broker spent per message;
- **binding latency**: a new Queue.Bind on the downstream to the first message through
  it, while the upstream gets a publish with that routing key every millisecond;
  ``bindings`` times, median and p90.

RabbitMQ (Debian's 3.10): two private nodes (``bench.rabbitmq``), ``rabbitmq_federation``
enabled offline, an upstream set with ``rabbitmqctl set_parameter federation-upstream``
(``ack-mode: on-confirm``, prefetch 1000) and a policy applying it to ``market``.
amqha: two standalone servers, the downstream with a ``federation:`` section whose link
logs in upstream as a user tagged ``federation``. A downstream that refuses the section
(a build without federation) makes the amqha side an ``error``, and the RabbitMQ side
still runs.

Before the rate run a durable queue is bound downstream and probes are published
upstream until one arrives (the link is up and the binding has travelled up); the queue
is purged once its count stays still. Every wait is bounded in count and time; a
measurement that fails is reported as an error, and the others still run.

Must not know: the brokers' insides (both are seen from the wire, /proc and their CLIs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pamqp import commands, frame

from bench import rabbitmq, rawclient
from bench.broker_bench import cpu_seconds, percentile, run_async
from bench.broker_bench import measure as broker_measure
from tests.support import ServerProcess

HOST = "127.0.0.1"
EXCHANGE = "market"
BODY = b"x" * 256
RATE_KEY = "rate.tick"
UPSTREAM_NAME = "central"  # the upstream's name in either broker's federation config

DEFAULT_SIZES = {"messages": 100_000, "window": 1000, "bindings": 20}
QUICK_SIZES = {"messages": 10_000, "window": 1000, "bindings": 5, "sync_bindings": 1000}

LIMIT = 600.0  # no single measurement may take longer than this, in seconds
LINK_LIMIT = 180.0  # from the exchanges declared to the first probe through the link
PROBE_EVERY = 0.01  # seconds between probes while waiting for the link
SETTLE = 0.5  # the queue's count must stay this long unchanged before the purge
BIND_LIMIT = 60.0  # one binding's wait for its first message
TICK = 0.001  # seconds between the binding latency's publishes
BIND_PAUSE = 0.2  # between two binding trials, for the previous unbind to travel up
EFA_PASSWORD = "efa-bench-password"


def say(text: str) -> None:
    print(f"[federation] {text}", file=sys.stderr, flush=True)


async def measure(results: dict[str, Any], name: str, step: Callable[[], Awaitable[Any]]) -> None:
    """broker_bench's measure, with this bench's limit and voice."""
    await broker_measure(results, name, step, LIMIT, say)


def cpu_total(pids: list[int | None]) -> float | None:
    """The CPU seconds these processes have used together (None if one is unreadable)."""
    values = [cpu_seconds(pid) for pid in pids]
    if any(value is None for value in values):
        return None
    return sum(value for value in values if value is not None)


def cpu_per_message(before: float | None, after: float | None, count: int) -> float | None:
    if before is None or after is None or not count:
        return None
    return round((after - before) / count * 1e6, 2)


# -- the wire: what both brokers are asked --------------------------------------------------


async def declare_exchange(client: rawclient.RawClient) -> None:
    await client.rpc(
        commands.Exchange.Declare(exchange=EXCHANGE, exchange_type="topic", durable=True)
    )


async def count_of(client: rawclient.RawClient, queue: str) -> int:
    return await client.declare_queue(queue, passive=True)


async def wait_for_link(
    publisher: rawclient.RawClient, watcher: rawclient.RawClient, queue: str
) -> tuple[float, int]:
    """Probe the upstream's exchange with ``RATE_KEY`` until ``queue`` (bound downstream)
    holds one; then, once its count has stayed still for ``SETTLE`` s, purge it. Returns
    the seconds to the first probe through and the probes sent; bounded by ``LINK_LIMIT``."""
    probe = rawclient.publish_frames(1, RATE_KEY, b"probe", exchange=EXCHANGE)
    started = time.perf_counter()
    sent = 0
    async with asyncio.timeout(LINK_LIMIT):
        while True:
            publisher._write(probe)
            sent += 1
            await asyncio.sleep(PROBE_EVERY)
            if await count_of(watcher, queue):
                break
        first = time.perf_counter() - started
        while publisher.confirmed < sent:  # the rate run counts confirms from here on
            await asyncio.sleep(0.01)
        held, still_since = await count_of(watcher, queue), time.monotonic()
        while time.monotonic() - still_since < SETTLE:
            await asyncio.sleep(0.05)
            now = await count_of(watcher, queue)
            if now != held:
                held, still_since = now, time.monotonic()
        await watcher.purge_queue(queue)
    return first, sent


async def rate(
    up_port: int,
    down_port: int,
    pids: dict[str, list[int | None]],
    sizes: dict[str, int],
    results: dict[str, Any],
) -> None:
    """The rate run: see the module's docstring."""
    count, window = sizes["messages"], sizes["window"]
    publisher = await rawclient.connect(HOST, up_port)
    consumer = await rawclient.connect(HOST, down_port)
    queue = f"bench-federation-{uuid.uuid4().hex[:8]}"
    try:
        await publisher.open_channel(confirm=True)
        await consumer.open_channel()
        await consumer.declare_queue(queue, durable=True)
        await consumer.rpc(
            commands.Queue.Bind(queue=queue, exchange=EXCHANGE, routing_key=RATE_KEY)
        )
        first, probes = await wait_for_link(publisher, consumer, queue)
        results["link_first_probe_s"] = round(first, 3)
        results["link_probes"] = probes
        say(f"  the link carries the binding: first probe through after {first:.2f} s")
        await consumer.rpc(commands.Basic.Qos(prefetch_count=1000))
        consumer.delivered = 0
        consumer.ack_mode = "multiple"
        consumer.target = count
        consumer.target_reached = consumer.loop.create_future()
        await consumer.rpc(commands.Basic.Consume(queue=queue, consumer_tag="rate"))
        frames = rawclient.publish_frames(1, RATE_KEY, BODY, exchange=EXCHANGE, persistent=True)
        before = {side: cpu_total(side_pids) for side, side_pids in pids.items()}
        client_before = time.process_time()
        started = time.perf_counter()
        publishing = asyncio.ensure_future(
            publisher.publish_confirmed(frames, count, window=window, limit=LIMIT)
        )
        confirmed_at: list[float] = []
        publishing.add_done_callback(lambda _: confirmed_at.append(time.perf_counter()))
        reached = consumer.target_reached
        async with asyncio.timeout(LIMIT):  # a failed publisher ends the wait at once
            await asyncio.wait({publishing, reached}, return_when=asyncio.FIRST_EXCEPTION)
            nacked = await publishing
            await reached
        elapsed = time.perf_counter() - started
        results["rate_msgs_per_s"] = round(count / elapsed, 1)
        results["rate_seconds"] = round(elapsed, 3)
        results["publish_confirms_msgs_per_s"] = round(count / (confirmed_at[0] - started), 1)
        results["delivered"] = consumer.delivered
        if nacked:
            results["nacked"] = nacked
        total_before = total_after = 0.0
        complete = True
        for side, side_pids in pids.items():
            after = cpu_total(side_pids)
            results[f"{side}_cpu_us_per_msg"] = cpu_per_message(before[side], after, count)
            if before[side] is None or after is None:
                complete = False
            else:
                total_before += before[side] or 0.0
                total_after += after
        if complete:
            results["brokers_cpu_us_per_msg"] = cpu_per_message(total_before, total_after, count)
        results["client_cpu_us_per_msg"] = round(
            (time.process_time() - client_before) / count * 1e6, 2
        )
        consumer.ack_mode = ""
        consumer.target = 0
        consumer.target_reached = None
        await consumer.rpc(commands.Basic.Cancel(consumer_tag="rate"))
        await consumer.delete_queue(queue)
    finally:
        await publisher.close()
        await consumer.close()


async def binding_latency(
    up_port: int, down_port: int, sizes: dict[str, int], results: dict[str, Any]
) -> None:
    """The binding latency runs: see the module's docstring."""
    publisher = await rawclient.connect(HOST, up_port)
    binder = await rawclient.connect(HOST, down_port)
    samples: list[float] = []
    run = uuid.uuid4().hex[:8]
    try:
        await publisher.open_channel()
        await binder.open_channel()
        for trial in range(sizes["bindings"]):
            key = f"bind.{run}.{trial}"
            queue = f"bench-federation-bind-{run}-{trial}"
            await binder.rpc(commands.Queue.Declare(queue=queue, exclusive=True))
            await binder.rpc(
                commands.Basic.Consume(queue=queue, consumer_tag=f"bind{trial}", no_ack=True)
            )
            frames = rawclient.publish_frames(1, key, b"tick", exchange=EXCHANGE)

            async def tick(frames: bytes = frames) -> None:
                while True:
                    publisher._write(frames)
                    await asyncio.sleep(TICK)

            ticker = asyncio.ensure_future(tick())
            try:
                await asyncio.sleep(0.01)  # the ticks are flowing upstream, to no queue yet
                waiter = binder.body_waiter = binder.loop.create_future()
                started = time.perf_counter()
                binder._write(
                    frame.marshal(
                        commands.Queue.Bind(queue=queue, exchange=EXCHANGE, routing_key=key),
                        binder.CHANNEL,
                    )
                )
                async with asyncio.timeout(BIND_LIMIT):
                    await waiter
                samples.append(time.perf_counter() - started)
                binder.body_waiter = None
                await binder.next_method(BIND_LIMIT)  # Queue.BindOk
            finally:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
            await binder.delete_queue(queue)
            await asyncio.sleep(BIND_PAUSE)
    finally:
        if samples:
            milliseconds = [sample * 1000 for sample in samples]
            results["bind_latency_median_ms"] = round(statistics.median(milliseconds), 2)
            results["bind_latency_p90_ms"] = round(percentile(milliseconds, 0.9), 2)
            results["bind_latency_samples_ms"] = [round(value, 2) for value in milliseconds]
        await publisher.close()
        await binder.close()


async def suite(
    up_port: int,
    down_port: int,
    pids: dict[str, list[int | None]],
    sizes: dict[str, int],
    federate: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Declare ``market`` on both sides, ``federate`` (RabbitMQ: the parameter and the
    policy), then the rate run and the binding latency runs."""
    results: dict[str, Any] = {}
    for port in (up_port, down_port):
        client = await rawclient.connect(HOST, port)
        try:
            await client.open_channel()
            await declare_exchange(client)
        finally:
            await client.close()
    if federate is not None:
        await federate()
    await measure(results, "rate", lambda: rate(up_port, down_port, pids, sizes, results))
    if "link_first_probe_s" not in results:
        results.setdefault("errors", {})["binding latency"] = "not run: no probe came through"
        return results
    await measure(
        results, "binding latency", lambda: binding_latency(up_port, down_port, sizes, results)
    )
    return results


# -- RabbitMQ -------------------------------------------------------------------------------


def rabbit_side(sizes: dict[str, int]) -> dict[str, Any]:
    available, how = rabbitmq.ensure_installed()
    if not available:
        say(f"RabbitMQ unavailable: {how}")
        return {**rabbitmq.describe(None, how), "error": f"RabbitMQ unavailable: {how}"}
    up = rabbitmq.RabbitNode(name="fed-upstream", plugins=("rabbitmq_federation",))
    down = rabbitmq.RabbitNode(name="fed-downstream", plugins=("rabbitmq_federation",))
    figures: dict[str, Any] = {}
    try:
        say("rabbitmq: starting two private nodes (rabbitmq_federation enabled offline)")
        up.start()
        down.start()
        figures.update(rabbitmq.describe(down, how))
        upstream = {
            # No path: the default vhost (a trailing "/" would name the vhost "").
            "uri": f"amqp://guest:guest@{HOST}:{up.port}",
            "ack-mode": "on-confirm",
            "prefetch-count": 1000,
        }
        figures["upstream_parameter"] = {**upstream, "uri": "amqp://guest:***@127.0.0.1/"}

        async def federate() -> None:
            await asyncio.to_thread(
                down.ctl,
                "set_parameter",
                "federation-upstream",
                UPSTREAM_NAME,
                json.dumps(upstream),
            )
            await asyncio.to_thread(
                down.ctl,
                "set_policy",
                "--apply-to",
                "exchanges",
                "federate-market",
                f"^{EXCHANGE}$",
                json.dumps({"federation-upstream": UPSTREAM_NAME}),
            )

        pids = {"upstream": [up.beam_pid()], "downstream": [down.beam_pid()]}
        figures.update(run_async(suite(up.port, down.port, pids, sizes, federate)))
    except Exception as error:
        say(f"rabbitmq side failed: {error!r}")
        figures["error"] = f"{type(error).__name__}: {error}"
    finally:
        if down.process is not None:
            figures["links"] = rabbit_links(down)
        up.stop()
        down.stop()
    return figures


def rabbit_links(node: rabbitmq.RabbitNode) -> list[dict[str, Any]] | str:
    """``rabbitmqctl federation_status``: each link's exchange, upstream, status, error."""
    try:
        status = json.loads(node.ctl("federation_status", "--formatter", "json"))
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as error:
        return f"federation_status failed: {error}"
    return [
        {key: link.get(key) for key in ("exchange", "upstream", "status", "error")}
        for link in status
    ]


# -- amqha ----------------------------------------------------------------------------------


def amqha_configs(workdir: Path) -> tuple[ServerProcess, ServerProcess]:
    """Two standalone servers: ``upstream`` (a user ``efa`` tagged ``federation``) and
    ``downstream`` federating ``market`` from it, ``delivery: confirm``."""
    upstream = ServerProcess(
        workdir,
        "upstream",
        users=[
            {"name": "guest", "password": "guest", "vhosts": ["/"]},
            {"name": "efa", "password": EFA_PASSWORD, "vhosts": ["/"], "tags": ["federation"]},
        ],
    )
    downstream = ServerProcess(
        workdir,
        "downstream",
        users=[{"name": "guest", "password": "guest", "vhosts": ["/"]}],
        federation={
            "upstreams": {
                UPSTREAM_NAME: {"urls": [f"amqp://efa:{EFA_PASSWORD}@{upstream.address}/"]}
            },
            "exchanges": [
                {
                    "exchange": EXCHANGE,
                    "upstream": UPSTREAM_NAME,
                    "bindings": True,
                    "forward": False,
                    "delivery": "confirm",
                }
            ],
        },
    )
    return upstream, downstream


def refusal(server: ServerProcess, error: Exception) -> str:
    """Why a server did not start, in one line: the last line of its log, or the error."""
    lines = [line for line in server.log().splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"{type(error).__name__}: {error}"


def amqha_side(sizes: dict[str, int]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="amqha-fbench-") as tmp:
        upstream, downstream = amqha_configs(Path(tmp))
        figures["configs"] = {
            "upstream": masked_config(upstream),
            "downstream": masked_config(downstream),
        }
        try:
            for server in (upstream, downstream):
                try:
                    server.start()
                except (RuntimeError, TimeoutError) as error:
                    reason = refusal(server, error)
                    say(f"amqha {server.name} did not start: {reason}")
                    figures["error"] = (
                        f"amqha {server.name} did not start (no federation in this build?): "
                        f"{reason}"
                    )
                    return figures
            assert upstream.process is not None and downstream.process is not None
            pids: dict[str, list[int | None]] = {
                "upstream": [upstream.process.pid],
                "downstream": [downstream.process.pid],
            }
            figures.update(run_async(suite(upstream.port, downstream.port, pids, sizes)))
            if "rate" in figures.get("errors", {}) and "rate_msgs_per_s" not in figures:
                figures["error"] = f"no rate measured: {figures['errors']['rate']}"
        finally:
            upstream.stop()
            downstream.stop()
    return figures


def masked_config(server: ServerProcess) -> dict[str, Any]:
    """A server's config as written, with its passwords masked: for the JSON."""
    text = json.dumps(server.config).replace(EFA_PASSWORD, "***")
    config: dict[str, Any] = json.loads(text)
    config["users"] = [{**user, "password": "***"} for user in config.get("users", ())]
    return config


def binding_sync(count: int, rtt: float) -> dict[str, Any]:
    """amqha alone: ``count`` new bindings made downstream (one client, one queue) over a
    link whose round trip to the upstream is ``rtt`` more (a delaying proxy between them):
    the time from the first bind to the link reporting every one bound upstream."""
    from tests.proxy import TcpProxy

    figures: dict[str, Any] = {"bindings": count, "added_rtt_ms": rtt * 1000}
    with tempfile.TemporaryDirectory(prefix="amqha-fbind-") as tmp:
        upstream, downstream = amqha_configs(Path(tmp))
        proxy = TcpProxy(upstream.port).start()
        proxy.delay(rtt / 2)  # each way
        links = downstream.config["federation"]["upstreams"][UPSTREAM_NAME]
        links["urls"] = [f"amqp://efa:{EFA_PASSWORD}@127.0.0.1:{proxy.port}/"]
        downstream.config["users"].append(
            {"name": "admin", "password": "admin", "vhosts": ["/"], "tags": ["administrator"]}
        )
        try:
            upstream.start()
            downstream.start()
            figures.update(run_async(_binding_sync(upstream, downstream, count, proxy)))
        except Exception as error:  # a figure missing says why
            figures["error"] = f"{type(error).__name__}: {error}"
        finally:
            downstream.stop()
            upstream.stop()
            proxy.stop()
    return figures


async def _binding_sync(
    upstream: ServerProcess, downstream: ServerProcess, count: int, proxy: Any
) -> dict[str, Any]:
    import aio_pika

    from amqha.console import ConsoleClient

    for server in (upstream, downstream):
        connection = await aio_pika.connect(f"amqp://guest:guest@{server.address}/")
        async with connection:
            channel = await connection.channel()
            await channel.declare_exchange(EXCHANGE, "topic", durable=True)
    admin = f"amqp://admin:admin@{downstream.address}/"

    async def link() -> dict[str, Any]:
        async with asyncio.timeout(30), ConsoleClient(admin) as console:
            return dict((await console.call("federation"))[0])

    async def until(check: Any, what: str, limit: float = 300.0) -> float:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while loop.time() < deadline:
            if check(await link()):
                return loop.time()
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{what}: not after {limit} s")

    await until(lambda status: status["state"] == "running", "the link running")
    # The link down (the proxy refuses) while the bindings are made here: then the time
    # from the link's return to all of them bound upstream is the link's own work.
    proxy.cut()
    await until(lambda status: status["state"] != "running", "the link down")
    connection = await aio_pika.connect(f"amqp://guest:guest@{downstream.address}/")
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("bench-bindings", durable=True)
        loop = asyncio.get_running_loop()
        started = loop.time()
        for i in range(count):
            await queue.bind(EXCHANGE, f"key.{i}")
        bound_here = loop.time()
        accepted = proxy.accepted
        proxy.heal()
        healed = loop.time()
        while proxy.accepted == accepted and loop.time() < healed + 60:
            await asyncio.sleep(0.001)  # the link's next attempt (after its backoff)
        connected = loop.time()
        done = await until(
            lambda status: (
                status["state"] == "running"
                and status["bindings"]["desired"] == count
                and status["bindings"]["confirmed"] == count + 1
            ),
            "every binding upstream",
        )
    return {
        "local_binds_s": round(bound_here - started, 3),
        "reconnected_to_all_bound_upstream_s": round(done - connected, 3),
        "healed_to_all_bound_upstream_s": round(done - healed, 3),
    }


# -- the run --------------------------------------------------------------------------------

RATE_KEYS = ("rate_msgs_per_s", "publish_confirms_msgs_per_s")
LOWER_IS_BETTER = (
    "bind_latency_median_ms",
    "bind_latency_p90_ms",
    "upstream_cpu_us_per_msg",
    "downstream_cpu_us_per_msg",
    "brokers_cpu_us_per_msg",
)


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if isinstance(numerator, int | float) and isinstance(denominator, int | float) and denominator:
        return round(numerator / denominator, 3)
    return None


def ratios(amqha: dict[str, Any], rabbit: dict[str, Any]) -> dict[str, Any]:
    """Named for their direction; either way, above 1 means amqha is better."""
    table: dict[str, Any] = {}
    for key in RATE_KEYS:
        table[key.replace("_msgs_per_s", "_amqha_over_rabbitmq")] = _ratio(
            amqha.get(key), rabbit.get(key)
        )
    for key in LOWER_IS_BETTER:
        name = key.removesuffix("_ms").removesuffix("_us_per_msg")
        table[f"{name}_rabbitmq_over_amqha"] = _ratio(rabbit.get(key), amqha.get(key))
    return table


def run(
    sizes: dict[str, int] | None = None, only: tuple[str, ...] = ("rabbitmq", "amqha")
) -> dict[str, Any]:
    sizes = dict(DEFAULT_SIZES, **(sizes or {}))
    load_at_start = os.getloadavg()
    rabbit: dict[str, Any] = {"skipped": "not asked for"}
    amqha: dict[str, Any] = {"skipped": "not asked for"}
    if "rabbitmq" in only:
        say("== RabbitMQ")
        rabbit = rabbit_side(sizes)
    if "amqha" in only:
        say("== amqha")
        amqha = amqha_side(sizes)
        say("== amqha: 10,000 bindings over a link with 100 ms more round trip")
        amqha["binding_sync"] = binding_sync(sizes.get("sync_bindings", 10_000), 0.1)
    return {
        "sizes": sizes,
        "message_bytes": len(BODY),
        "exchange": {"name": EXCHANGE, "type": "topic", "durable": True},
        "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "amqha": amqha,
        "rabbitmq": rabbit,
        "ratios": ratios(amqha, rabbit),
        "targets": {},
    }


def summary_rows(result: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    """(measurement, amqha, RabbitMQ, ratio with above 1 meaning amqha is better)."""
    amqha, rabbit, table = result["amqha"], result["rabbitmq"], result.get("ratios", {})
    rows = []
    for key in RATE_KEYS:
        ratio = table.get(key.replace("_msgs_per_s", "_amqha_over_rabbitmq"))
        rows.append((f"federation {key}", amqha.get(key), rabbit.get(key), ratio))
    for key in LOWER_IS_BETTER:
        name = key.removesuffix("_ms").removesuffix("_us_per_msg")
        ratio = table.get(f"{name}_rabbitmq_over_amqha")
        rows.append((f"federation {key}", amqha.get(key), rabbit.get(key), ratio))
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m bench.federation_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--messages", type=int, help="messages in the rate run (100,000)")
    parser.add_argument("--window", type=int, help="unconfirmed publishes at most (1000)")
    parser.add_argument("--bindings", type=int, help="binding latency trials (20)")
    parser.add_argument(
        "--only", default="rabbitmq,amqha", help="comma-separated subset of rabbitmq,amqha"
    )
    parser.add_argument("--out", type=Path, help="also save the JSON here")
    options = parser.parse_args(argv)
    sizes = dict(QUICK_SIZES if options.quick else DEFAULT_SIZES)
    for key in ("messages", "window", "bindings"):
        value = getattr(options, key)
        if value is not None:
            if value < 1:
                parser.error(f"--{key} must be at least 1, not {value}")
            sizes[key] = value
    only = tuple(name.strip() for name in options.only.split(",") if name.strip())
    unknown = [name for name in only if name not in ("rabbitmq", "amqha")]
    if unknown or not only:
        parser.error(
            f"--only: unknown side {', '.join(unknown) or '(none)'}; known: rabbitmq, amqha"
        )
    document = run(sizes, only)
    text = json.dumps(document, indent=2, default=str)
    if options.out is not None:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(text + "\n")
    print(text)
    return 0 if "error" not in document["rabbitmq"] else 1


if __name__ == "__main__":
    sys.exit(main())
