"""Broker throughput, latency, memory and start time: amqha beside RabbitMQ, same clients.

Two clients, the same five measurements each, 100-byte messages on one queue through
the default exchange:

- publish without confirms (msg/s: first publish to the queue holding them all),
- publish with confirms, at most 100 unconfirmed (msg/s),
- consume with prefetch 1000, acking each delivery, and acking every 100th with
  multiple=true (msg/s: Basic.Consume to the last delivery),
- round trip: publish one, wait for its delivery, repeat (p50 / p99 in ms),
- connect: TCP connect to Connection.OpenOk (median in ms).

The clients are aio-pika (what an application sees) and ``bench.rawclient`` (what the
broker can do when the client costs next to nothing). Beside those: the RSS a queued
message costs amqha (and RabbitMQ's VM) at 1M queued, and the time from process spawn
to the first AMQP connection that succeeds.

Beside each throughput figure: the CPU time the broker process (RabbitMQ: its Erlang
VM) and the benchmark's own process spent per message. On a shared machine msg/s moves
with other load, CPU per message much less; and with aio-pika the client's CPU per
message shows that the client, not the broker, is the bound.

Both brokers run during the client suites, taking turns, each round amqha then RabbitMQ,
so that a burst of load from elsewhere hits both alike; the best round of each figure is
kept. Everything is on 127.0.0.1. Every loop is bounded in count and time; a measurement
that fails is reported as an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika

from bench import rabbitmq, rawclient
from tests.support import ServerProcess

HOST = "127.0.0.1"
BODY = b"x" * 100

DEFAULT_SIZES = {
    "raw_messages": 200_000,
    "aio_pika_messages": 50_000,
    "roundtrips": 2_000,
    "connects": 30,
    "rss_messages": 1_000_000,
    "starts": 5,
    "rounds": 2,
}
QUICK_SIZES = {
    "raw_messages": 20_000,
    "aio_pika_messages": 10_000,
    "roundtrips": 300,
    "connects": 10,
    "rss_messages": 100_000,
    "starts": 3,
    "rounds": 1,
}

THROUGHPUT_KEYS = (
    "publish_msgs_per_s",
    "publish_confirms_msgs_per_s",
    "consume_ack_each_msgs_per_s",
    "consume_ack_multiple_msgs_per_s",
)
LATENCY_KEYS = ("roundtrip_p50_ms", "roundtrip_p99_ms", "connect_ms")
CPU_KEYS = tuple(key.replace("_msgs_per_s", "_server_cpu_us_per_msg") for key in THROUGHPUT_KEYS)
# What the benchmark's own process spent per message: with aio-pika, the bound.
CLIENT_CPU_KEYS = tuple(
    key.replace("_msgs_per_s", "_client_cpu_us_per_msg") for key in THROUGHPUT_KEYS
)
LIMIT = 300.0  # no single measurement may take longer than this, in seconds


def say(text: str) -> None:
    print(f"[broker] {text}", file=sys.stderr, flush=True)


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_async(coro: Awaitable[Any]) -> Any:
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(coro)  # type: ignore[arg-type]


def vm_rss(pid: int) -> int:
    """Resident set size of a process in bytes, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int | None) -> float | None:
    """User plus system CPU time a process has used, from /proc/<pid>/stat."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def record_cpu(
    results: dict[str, Any], key: str, pid: int | None, before: float | None, count: int
) -> None:
    """The broker's CPU microseconds per message: unlike msg/s, barely moved by other load."""
    after = cpu_seconds(pid)
    if before is not None and after is not None:
        results[key] = round((after - before) / count * 1e6, 2)


def record_client_cpu(results: dict[str, Any], key: str, before: float, count: int) -> None:
    results[key] = round((time.process_time() - before) / count * 1e6, 2)


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def measure(
    results: dict[str, Any],
    name: str,
    step: Callable[[], Awaitable[Any]],
    limit: float = LIMIT,
    tell: Callable[[str], None] | None = None,
) -> None:
    """Run one measurement (at most ``limit`` s); its failure is recorded, not fatal for
    the others. ``tell`` prints progress (this module's ``say`` by default)."""
    tell = tell or say
    started = time.perf_counter()
    try:
        async with asyncio.timeout(limit):
            await step()
    except Exception as error:  # a broken measurement must not hide the others
        results.setdefault("errors", {})[name] = f"{type(error).__name__}: {error}"
        tell(f"  {name}: FAILED {type(error).__name__}: {error}")
        return
    tell(f"  {name}: done in {time.perf_counter() - started:.1f} s")


def queue_name(kind: str) -> str:
    return f"bench-{kind}-{uuid.uuid4().hex[:8]}"


async def wait_for_count(client: rawclient.RawClient, queue: str, count: int) -> None:
    """Poll the queue's message count until it holds ``count`` (bounded by the caller)."""
    while await client.declare_queue(queue, passive=True) < count:
        await asyncio.sleep(0.001)


# -- raw client ----------------------------------------------------------------------


async def raw_suite(port: int, pid: int | None, sizes: dict[str, int]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    count = sizes["raw_messages"]

    async def connects() -> None:
        samples = []
        for _ in range(sizes["connects"]):
            started = time.perf_counter()
            client = await rawclient.connect(HOST, port)
            samples.append(time.perf_counter() - started)
            await client.close()
        results["connect_ms"] = statistics.median(samples) * 1000

    publisher = await rawclient.connect(HOST, port)
    await publisher.open_channel()
    confirmer = await rawclient.connect(HOST, port)
    await confirmer.open_channel(confirm=True)
    queue = queue_name("raw")
    await publisher.declare_queue(queue)
    frames = rawclient.publish_frames(1, queue, BODY)

    async def publish() -> None:
        await publisher.publish(frames, min(count, 20_000))  # warm-up
        await wait_for_count(publisher, queue, min(count, 20_000))
        await publisher.purge_queue(queue)
        cpu = cpu_seconds(pid)
        started = time.perf_counter()
        await publisher.publish(frames, count)
        await wait_for_count(publisher, queue, count)
        results["publish_msgs_per_s"] = count / (time.perf_counter() - started)
        record_cpu(results, "publish_server_cpu_us_per_msg", pid, cpu, count)
        await publisher.purge_queue(queue)

    async def publish_confirms() -> None:
        cpu = cpu_seconds(pid)
        started = time.perf_counter()
        nacked = await confirmer.publish_confirmed(frames, count, window=100)
        results["publish_confirms_msgs_per_s"] = count / (time.perf_counter() - started)
        record_cpu(results, "publish_confirms_server_cpu_us_per_msg", pid, cpu, count)
        if nacked:
            results["publish_confirms_nacked"] = nacked

    async def consume(ack: str) -> None:
        held = await publisher.declare_queue(queue, passive=True)
        if held < count:
            await confirmer.publish_confirmed(frames, count - held, window=1000)
        consumer = await rawclient.connect(HOST, port)
        try:
            await consumer.open_channel()
            cpu = cpu_seconds(pid)
            elapsed = await consumer.consume(queue, count, ack=ack, prefetch=1000)
            results[f"consume_ack_{ack}_msgs_per_s"] = count / elapsed
            record_cpu(results, f"consume_ack_{ack}_server_cpu_us_per_msg", pid, cpu, count)
        finally:
            await consumer.close()

    async def roundtrip() -> None:
        rtt_queue = queue_name("raw-rtt")
        await publisher.declare_queue(rtt_queue)
        await publisher.roundtrips(rtt_queue, min(200, sizes["roundtrips"]))  # warm-up
        samples = await publisher.roundtrips(rtt_queue, sizes["roundtrips"])
        results["roundtrip_p50_ms"] = statistics.median(samples) * 1000
        results["roundtrip_p99_ms"] = percentile(samples, 0.99) * 1000
        await publisher.delete_queue(rtt_queue)

    try:
        await measure(results, "raw connect", connects)
        await measure(results, "raw publish", publish)
        await measure(results, "raw publish+confirms", publish_confirms)
        await measure(results, "raw consume ack each", lambda: consume("each"))
        await measure(results, "raw consume ack multiple", lambda: consume("multiple"))
        await measure(results, "raw roundtrip", roundtrip)
        with contextlib.suppress(Exception):
            await publisher.delete_queue(queue)
    finally:
        await publisher.close()
        await confirmer.close()
    return results


# -- aio-pika ------------------------------------------------------------------------


async def aio_pika_suite(
    url: str, port: int, pid: int | None, sizes: dict[str, int]
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    count = sizes["aio_pika_messages"]
    loop = asyncio.get_running_loop()

    async def connects() -> None:
        samples = []
        for _ in range(sizes["connects"]):
            started = time.perf_counter()
            connection = await aio_pika.connect(url)
            samples.append(time.perf_counter() - started)
            await connection.close()
        results["connect_ms"] = statistics.median(samples) * 1000

    connection = await aio_pika.connect(url)
    # The raw client fills queues for the consume runs and polls their counts.
    helper = await rawclient.connect(HOST, port)
    await helper.open_channel(confirm=True)
    queue = queue_name("aio-pika")
    frames = rawclient.publish_frames(1, queue, BODY)

    async def publish() -> None:
        channel = await connection.channel(publisher_confirms=False)
        await channel.declare_queue(queue)
        exchange = channel.default_exchange
        cpu, client = cpu_seconds(pid), time.process_time()
        started = time.perf_counter()
        for _ in range(count):
            await exchange.publish(aio_pika.Message(BODY), routing_key=queue)
        await wait_for_count(helper, queue, count)
        results["publish_msgs_per_s"] = count / (time.perf_counter() - started)
        record_cpu(results, "publish_server_cpu_us_per_msg", pid, cpu, count)
        record_client_cpu(results, "publish_client_cpu_us_per_msg", client, count)
        await helper.purge_queue(queue)
        await channel.close()

    async def publish_confirms() -> None:
        channel = await connection.channel(publisher_confirms=True)
        exchange = channel.default_exchange
        pending: set[asyncio.Future[Any]] = set()
        cpu, client = cpu_seconds(pid), time.process_time()
        started = time.perf_counter()
        for _ in range(count):
            if len(pending) >= 100:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
            pending.add(
                asyncio.ensure_future(exchange.publish(aio_pika.Message(BODY), routing_key=queue))
            )
        if pending:
            for task in await asyncio.gather(*pending, return_exceptions=True):
                if isinstance(task, BaseException):
                    raise task
        results["publish_confirms_msgs_per_s"] = count / (time.perf_counter() - started)
        record_cpu(results, "publish_confirms_server_cpu_us_per_msg", pid, cpu, count)
        record_client_cpu(results, "publish_confirms_client_cpu_us_per_msg", client, count)
        await channel.close()

    async def consume(ack: str) -> None:
        held = await helper.declare_queue(queue, passive=True)
        if held < count:
            await helper.publish_confirmed(frames, count - held, window=1000)
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1000)
        target = await channel.declare_queue(queue, passive=True)
        finished: asyncio.Future[None] = loop.create_future()
        received = 0

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal received
            received += 1
            if ack == "each":
                await message.ack()
            elif received % 100 == 0 or received == count:
                await message.ack(multiple=True)
            if received == count and not finished.done():
                finished.set_result(None)

        cpu, client = cpu_seconds(pid), time.process_time()
        started = time.perf_counter()
        tag = await target.consume(on_message)
        await finished
        results[f"consume_ack_{ack}_msgs_per_s"] = count / (time.perf_counter() - started)
        record_cpu(results, f"consume_ack_{ack}_server_cpu_us_per_msg", pid, cpu, count)
        record_client_cpu(results, f"consume_ack_{ack}_client_cpu_us_per_msg", client, count)
        await target.cancel(tag)
        await channel.close()

    async def roundtrip() -> None:
        channel = await connection.channel(publisher_confirms=False)
        rtt = await channel.declare_queue(queue_name("aio-pika-rtt"))
        arrived: list[asyncio.Future[None]] = []

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            if arrived and not arrived[0].done():
                arrived[0].set_result(None)

        tag = await rtt.consume(on_message, no_ack=True)
        exchange = channel.default_exchange
        samples = []
        total = sizes["roundtrips"]
        warm_up = min(200, total)
        for number in range(warm_up + total):
            waiter = loop.create_future()
            arrived[:] = [waiter]
            started = time.perf_counter()
            await exchange.publish(aio_pika.Message(BODY), routing_key=rtt.name)
            await waiter
            if number >= warm_up:
                samples.append(time.perf_counter() - started)
        results["roundtrip_p50_ms"] = statistics.median(samples) * 1000
        results["roundtrip_p99_ms"] = percentile(samples, 0.99) * 1000
        await rtt.cancel(tag)
        await rtt.delete()
        await channel.close()

    try:
        await measure(results, "aio-pika connect", connects)
        await measure(results, "aio-pika publish", publish)
        await measure(results, "aio-pika publish+confirms", publish_confirms)
        await measure(results, "aio-pika consume ack each", lambda: consume("each"))
        await measure(results, "aio-pika consume ack multiple", lambda: consume("multiple"))
        await measure(results, "aio-pika roundtrip", roundtrip)
        with contextlib.suppress(Exception):
            await helper.delete_queue(queue)
    finally:
        await helper.close()
        await connection.close()
    return results


# -- memory and start time -------------------------------------------------------------


async def rss_per_message(port: int, pid: int, count: int) -> dict[str, Any]:
    """RSS growth of ``pid`` for ``count`` queued 100-byte messages, less their bodies."""
    client = await rawclient.connect(HOST, port)
    try:
        await client.open_channel(confirm=True)
        queue = queue_name("rss")
        await client.declare_queue(queue)
        before = vm_rss(pid)
        nacked = await client.publish_confirmed(
            rawclient.publish_frames(1, queue, BODY), count, window=1000, limit=LIMIT
        )
        held = await client.declare_queue(queue, passive=True)
        after = vm_rss(pid)
        await client.delete_queue(queue)
    finally:
        await client.close()
    return {
        "messages": count,
        "queued": held,
        "nacked": nacked,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "rss_overhead_bytes_per_message": (after - before) / count - len(BODY),
    }


def amqha_start_to_serving(workdir: Path, starts: int) -> dict[str, Any]:
    """Process spawn to the first successful AMQP handshake, ``starts`` times."""
    samples = []
    for number in range(starts):
        server = ServerProcess(workdir, f"start-{number}")
        try:
            started = time.perf_counter()
            server.start(wait=False)
            deadline = started + 30.0
            while time.perf_counter() < deadline:
                if rawclient.ping(HOST, server.port, limit=1.0) is not None:
                    samples.append(time.perf_counter() - started)
                    break
                if not server.alive:
                    raise RuntimeError(f"amqha exited: {server.log()[-500:]}")
                time.sleep(0.005)
            else:
                raise TimeoutError("amqha did not serve AMQP in 30 s")
        finally:
            server.stop()
    return {"median_s": statistics.median(samples), "samples_s": samples}


# -- the runs ---------------------------------------------------------------------------


def best_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the best round: the machine is shared, so the best is the least disturbed."""
    best: dict[str, Any] = {}
    for key in (*THROUGHPUT_KEYS, *LATENCY_KEYS, *CPU_KEYS, *CLIENT_CPU_KEYS):
        values = [r[key] for r in rounds if isinstance(r.get(key), int | float)]
        if values:
            best[key] = max(values) if key in THROUGHPUT_KEYS else min(values)
    errors = {k: v for r in rounds for k, v in r.get("errors", {}).items()}
    if errors:
        best["errors"] = errors
    best["rounds"] = rounds
    return best


def client_suites(
    brokers: dict[str, tuple[str, int, int | None]], sizes: dict[str, int]
) -> dict[str, dict[str, Any]]:
    """Both clients against every broker, broker after broker within each round, so that
    a burst of load from elsewhere on the machine hits both sides alike."""
    raw: dict[str, list[dict[str, Any]]] = {name: [] for name in brokers}
    pika: dict[str, list[dict[str, Any]]] = {name: [] for name in brokers}
    for number in range(sizes["rounds"]):
        for name, (_, port, pid) in brokers.items():
            say(f"round {number + 1}: {name}, raw client")
            raw[name].append(run_async(raw_suite(port, pid, sizes)))
    for number in range(sizes["rounds"]):
        for name, (url, port, pid) in brokers.items():
            say(f"round {number + 1}: {name}, aio-pika")
            pika[name].append(run_async(aio_pika_suite(url, port, pid, sizes)))
    return {name: {"raw": best_of(raw[name]), "aio_pika": best_of(pika[name])} for name in brokers}


def amqha_rss(workdir: Path, sizes: dict[str, int]) -> dict[str, Any]:
    say(f"amqha: RSS per queued message at {sizes['rss_messages']}")
    server = ServerProcess(workdir, "rss").start()
    try:
        assert server.process is not None
        return run_async(rss_per_message(server.port, server.process.pid, sizes["rss_messages"]))
    finally:
        server.stop()


def run(sizes: dict[str, int] | None = None) -> dict[str, Any]:
    sizes = dict(DEFAULT_SIZES, **(sizes or {}))
    amqha: dict[str, Any] = {}
    available, how = rabbitmq.ensure_installed()
    rabbit = rabbitmq.describe(None, how)
    if not available:
        say(f"RabbitMQ unavailable: {how}")
    with tempfile.TemporaryDirectory(prefix="amqha-bench-") as tmp:
        workdir = Path(tmp)
        say("amqha: start to serving")
        try:
            amqha["start_to_serving"] = amqha_start_to_serving(workdir, sizes["starts"])
        except Exception as error:
            amqha.setdefault("errors", {})["start_to_serving"] = repr(error)
        try:
            amqha["rss"] = amqha_rss(workdir, sizes)
        except Exception as error:
            amqha.setdefault("errors", {})["rss"] = repr(error)
        node = rabbitmq.RabbitNode() if available else None
        server = ServerProcess(workdir, "bench")
        try:
            server.start()
            assert server.process is not None
            brokers = {"amqha": (server.url, server.port, server.process.pid)}
            if node is not None:
                try:
                    say("rabbitmq: starting a private node")
                    node.start()
                    rabbit = rabbitmq.describe(node, how)
                    rabbit["start_to_serving"] = {
                        "median_s": node.start_seconds,
                        "samples_s": [node.start_seconds],
                    }
                    beam = node.beam_pid()
                    if beam is not None:
                        say(f"rabbitmq: RSS per queued message at {sizes['rss_messages']}")
                        rabbit["rss"] = run_async(
                            rss_per_message(node.port, beam, sizes["rss_messages"])
                        )
                    brokers["rabbitmq"] = (node.url, node.port, beam)
                except Exception as error:
                    say(f"RabbitMQ failed: {error!r}")
                    rabbit = rabbitmq.describe(None, f"{how}; failed: {error!r}")
            suites = client_suites(brokers, sizes)
            amqha.update(suites["amqha"])
            rabbit.update(suites.get("rabbitmq", {}))
        finally:
            server.stop()
            if node is not None:
                node.stop()
    table = ratios(amqha, rabbit) if rabbit.get("available") else {}
    return {
        "sizes": sizes,
        "message_bytes": len(BODY),
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "amqha": amqha,
        "rabbitmq": rabbit,
        "ratios": table,
        "targets": targets(amqha, table),
    }


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if isinstance(numerator, int | float) and isinstance(denominator, int | float) and denominator:
        return round(numerator / denominator, 3)
    return None


def ratio_key(key: str) -> str:
    """The name of a figure's ratio, saying which way round it is."""
    if key in THROUGHPUT_KEYS:
        return key.replace("_msgs_per_s", "_amqha_over_rabbitmq")
    if key in CPU_KEYS:
        return key.replace("_us_per_msg", "_rabbitmq_over_amqha")
    return key.replace("_ms", "_rabbitmq_over_amqha")


def ratios(amqha: dict[str, Any], rabbit: dict[str, Any]) -> dict[str, Any]:
    """Throughput as amqha/RabbitMQ; latency and CPU per message as RabbitMQ/amqha.
    Either way, above 1 means amqha is better."""
    out: dict[str, Any] = {}
    for client in ("raw", "aio_pika"):
        ours, theirs = amqha.get(client, {}), rabbit.get(client, {})
        row = {}
        for key in (*THROUGHPUT_KEYS, *LATENCY_KEYS, *CPU_KEYS):
            if key in THROUGHPUT_KEYS:
                value = _ratio(ours.get(key), theirs.get(key))
            else:
                value = _ratio(theirs.get(key), ours.get(key))
            if value is not None or key not in CPU_KEYS:
                row[ratio_key(key)] = value
        out[client] = row
    return out


def targets(amqha: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """The issue's goals, each with the figure it is judged on."""
    raw, pika = table.get("raw", {}), table.get("aio_pika", {})

    def at_least_one(*values: Any) -> bool | None:
        known = [v for v in values if v is not None]
        return None if len(known) < len(values) else all(v >= 1.0 for v in known)

    rss = amqha.get("rss", {}).get("rss_overhead_bytes_per_message")
    start = amqha.get("start_to_serving", {}).get("median_s")
    return {
        "raw_publish_and_consume_ge_1x_rabbitmq": at_least_one(
            raw.get("publish_amqha_over_rabbitmq"),
            raw.get("publish_confirms_amqha_over_rabbitmq"),
            raw.get("consume_ack_each_amqha_over_rabbitmq"),
            raw.get("consume_ack_multiple_amqha_over_rabbitmq"),
        ),
        "aio_pika_end_to_end_ge_1x_rabbitmq": at_least_one(
            *(pika.get(k.replace("_msgs_per_s", "_amqha_over_rabbitmq")) for k in THROUGHPUT_KEYS)
        ),
        "roundtrip_p50_le_rabbitmq": at_least_one(
            raw.get("roundtrip_p50_rabbitmq_over_amqha"),
            pika.get("roundtrip_p50_rabbitmq_over_amqha"),
        ),
        "rss_overhead_le_400_bytes_per_message": None if rss is None else rss <= 400,
        "start_to_serving_le_1_s": None if start is None else start <= 1.0,
    }


def summary_rows(result: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    """(measurement, amqha, RabbitMQ, ratio with above 1 meaning amqha is better)."""
    amqha, rabbit, table = result["amqha"], result["rabbitmq"], result.get("ratios", {})
    rows = []
    for client in ("raw", "aio_pika"):
        keys = (*THROUGHPUT_KEYS, *LATENCY_KEYS, *CPU_KEYS)
        for key in keys:
            rows.append(
                (
                    f"{client} {key}",
                    amqha.get(client, {}).get(key),
                    rabbit.get(client, {}).get(key),
                    table.get(client, {}).get(ratio_key(key)),
                )
            )
    rows.append(
        (
            "rss overhead bytes/msg",
            amqha.get("rss", {}).get("rss_overhead_bytes_per_message"),
            rabbit.get("rss", {}).get("rss_overhead_bytes_per_message"),
            None,
        )
    )
    rows.append(
        (
            "start to serving s",
            amqha.get("start_to_serving", {}).get("median_s"),
            rabbit.get("start_to_serving", {}).get("median_s"),
            None,
        )
    )
    return rows


def amqha_only(sizes: dict[str, int], with_aio_pika: bool) -> dict[str, Any]:
    """amqha alone, for before/after figures while optimising (``python -m bench.broker_bench``)."""
    with tempfile.TemporaryDirectory(prefix="amqha-bench-") as tmp:
        server = ServerProcess(Path(tmp), "bench").start()
        try:
            assert server.process is not None
            brokers = {"amqha": (server.url, server.port, server.process.pid)}
            if not with_aio_pika:
                rounds = [
                    run_async(raw_suite(server.port, server.process.pid, sizes))
                    for _ in range(sizes["rounds"])
                ]
                return {"raw": best_of(rounds)}
            return client_suites(brokers, sizes)["amqha"]
        finally:
            server.stop()


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="amqha alone: raw client (and aio-pika) figures")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=DEFAULT_SIZES["raw_messages"])
    parser.add_argument("--aio-pika", action="store_true")
    options = parser.parse_args()
    figures = amqha_only(
        dict(DEFAULT_SIZES, rounds=options.rounds, raw_messages=options.messages),
        options.aio_pika,
    )
    for client in figures.values():
        client.pop("rounds", None)
    print(json.dumps(figures, indent=2))
