"""Replication's cost and speed: amqha alone beside amqha as a replicating pair.

    python -m bench.replication_bench [--quick]

Same raw client (bench/rawclient.py), 100-byte persistent messages, a durable queue,
publisher confirms with a window of 100, loopback:

- ``standalone``: one server with its store (the confirm waits for its fsync);
- ``replicated``: the ACTIVE of a pair with an in-sync PASSIVE (the confirm waits for
  both stores);
- ``ratio``: replicated ÷ standalone, the best round of each, and ``ratio_of_medians``
  (target >= 0.85, ``target_met``); the two take turns round by round, both running all along;
- ``wide_window``: the same with 1000 confirms in flight: with 100, a confirm waits for
  one round (the ACTIVE takes the window, then the longer of its commit and the
  PASSIVE's leg), so the PASSIVE's leg shows as latency; with 1000, what is left is
  the throughput cost of replicating;
- ``catch_up``: a PASSIVE restarted while the ACTIVE holds N persistent messages, from
  its start to in sync (msg/s, seconds, the runs it took, each server's CPU seconds),
  then until it has applied every run it kept (``apply_seconds``: from the snapshot's
  end on its disk; the PASSIVE's CPU seconds by then); all along a publisher with
  confirms (100 in flight) to a queue of its own: its rate with the PASSIVE in sync
  before the restart, its rate during the catch-up and the share (goal >= 0.7).
  ``--catch-up N`` sets the backlog (1,000,000 by default; 10,000,000 for the
  time to redundancy at that size; 0 leaves the catch-up and the takeover out, for
  runs of the ratios alone);
- ``takeover_at_in_sync``: the PASSIVE restarted again on that backlog, the ACTIVE
  killed -9 the moment it declares it in sync: seconds to the first publish the
  PASSIVE confirms (goal <= 1 s), and what it had left to apply;
- ``disk``: what sharing one disk costs the pair here. An fdatasync of 16 KiB alone and
  two at once (two threads, two files), and ``cap``: the ratio at WINDOW in flight that
  a pair on this disk would reach if replication cost nothing but the PASSIVE's fsync
  running beside the ACTIVE's (the standalone round, over that round lengthened by what
  the second fsync adds). Two servers on two machines do not pay it
  (docs/durability.md, section 8, "Where the round goes").

Failover time with replication on is ``bench.failover_bench`` (a pair replicates by
default). Prints JSON.

On two machines (the setting the 0.85 target is for: here both servers, their disks and
the client share one machine), start the servers there and name them::

    python -m bench.replication_bench --standalone amqp://USER:PASS@HOST_A:5674/ \
        --active amqp://ADMIN:PASS@HOST_A:5672/

a standalone server and the ACTIVE of a pair whose PASSIVE runs on another machine
(both ``amqha start``; the standalone on the ACTIVE's machine, so that the two differ by
replication alone). The bench then measures the two ratios on them, round by round as
above, from wherever it runs (the servers' CPU is not measured then); the ACTIVE's user
must be an administrator, as the console tells whether its PASSIVE is in sync.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pamqp import commands

from amqha.console import ConsoleClient
from bench import rawclient
from bench.broker_bench import cpu_seconds
from bench.run import sizes_from
from tests.pairs import ADMIN, Pair, url_of
from tests.support import ServerProcess

HOST = "127.0.0.1"
BODY = b"x" * 100
WINDOW = 100  # confirms in flight, as in durable_bench (beside RabbitMQ)
WIDE_WINDOW = 1000
TARGET = 0.85  # replicated ÷ standalone, ratio of medians, at WINDOW in flight
HELD_BYTES = 600  # the watermark's room per backlog message, with a margin
DEFAULT_SIZES = {"messages": 100_000, "rounds": 5, "catch_up": 1_000_000}
QUICK_SIZES = {"messages": 20_000, "rounds": 1, "catch_up": 100_000}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Target:
    """A server the rounds publish to: this bench's own on loopback (its pid, for its CPU),
    or one started elsewhere and named by its URL."""

    host: str
    port: int
    pid: int | None = None
    login: dict[str, str] = field(default_factory=dict)  # user, password, vhost
    console_url: str | None = None  # an administrator's, for the ACTIVE's feed state

    @classmethod
    def local(cls, server: ServerProcess) -> Target:
        assert server.process is not None
        return cls(HOST, server.port, server.process.pid, {}, url_of(server, ADMIN))

    @classmethod
    def from_url(cls, url: str) -> Target:
        """``amqp://USER:PASS@HOST:PORT/VHOST``; a clear error for anything else."""
        parts = urlsplit(url)
        if parts.scheme != "amqp" or not parts.hostname:
            raise SystemExit(
                f"replication bench: {url!r} is not an amqp://USER:PASS@HOST:PORT/ URL"
            )
        try:
            port = parts.port or 5672
        except ValueError:
            raise SystemExit(f"replication bench: {url!r} has no valid port") from None
        login = {"vhost": unquote(parts.path[1:]) if len(parts.path) > 1 else "/"}
        if parts.username is not None:
            login["user"] = unquote(parts.username)
            login["password"] = unquote(parts.password or "")
        return cls(parts.hostname, port, None, login, url)


async def confirmed_publish(
    target: Target, count: int, queue: str, window: int = WINDOW
) -> dict[str, Any]:
    pid = target.pid
    client = await rawclient.connect(target.host, target.port, **target.login)
    try:
        await client.open_channel(confirm=True)
        await client.rpc(commands.Queue.Declare(queue=queue, durable=True))
        frames = rawclient.publish_frames(1, queue, BODY, persistent=True)
        await client.publish_confirmed(frames, min(count, 5000), window=window)  # warm-up
        await client.rpc(commands.Queue.Purge(queue=queue))
        cpu = cpu_seconds(pid)
        started = time.perf_counter()
        nacked = await client.publish_confirmed(frames, count, window=window)
        elapsed = time.perf_counter() - started
        after = cpu_seconds(pid)
        await client.rpc(commands.Queue.Purge(queue=queue))
    finally:
        await client.close()
    return {
        "msgs_per_s": round(count / elapsed),
        "server_cpu_us_per_msg": None
        if cpu is None or after is None
        else round((after - cpu) / count * 1e6, 2),
        "nacked": nacked,
    }


async def fill(port: int, count: int, queue: str) -> None:
    client = await rawclient.connect(HOST, port)
    try:
        await client.open_channel(confirm=True)
        await client.rpc(commands.Queue.Declare(queue=queue, durable=True))
        frames = rawclient.publish_frames(1, queue, BODY, persistent=True)
        # At least 10,000 msg/s: 10M messages get over 16 minutes.
        await client.publish_confirmed(frames, count, window=1000, limit=max(120, count / 10_000))
    finally:
        await client.close()


LOAD_BEFORE = 5.0  # seconds of the steady publisher's rate measured before the restart


async def steady(port: int, stop: asyncio.Event, marks: list[tuple[float, int]]) -> None:
    """Confirmed persistent publishes, WINDOW in flight, to a queue of their own until
    ``stop``; ``marks`` gets (time, confirmed so far) after every WINDOW."""
    client = await rawclient.connect(HOST, port)
    try:
        await client.open_channel(confirm=True)
        await client.rpc(commands.Queue.Declare(queue="steady", durable=True))
        frames = rawclient.publish_frames(1, "steady", BODY, persistent=True)
        total = 0
        while not stop.is_set():
            await client.publish_confirmed(frames, WINDOW, window=WINDOW, limit=600)
            total += WINDOW
            marks.append((time.monotonic(), total))
    finally:
        await client.close()


def rate(marks: list[tuple[float, int]], start: float, end: float) -> float:
    inside = [(t, n) for t, n in marks if start <= t <= end]
    if len(inside) < 2:
        return 0.0
    return round((inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]))


async def catch_up_under_load(pair: Pair, active: ServerProcess) -> tuple[list[float], float, Any]:
    """Kill and restart the PASSIVE under a steady publisher: its rate before and during
    the catch-up (start to in sync), when the restart began, the ACTIVE's CPU then."""
    stop, marks = asyncio.Event(), []
    publisher = asyncio.create_task(steady(active.port, stop, marks))
    try:
        await asyncio.sleep(1 + LOAD_BEFORE)
        before = rate(marks, time.monotonic() - LOAD_BEFORE, time.monotonic())
        pair.kill(pair.backup)
        started = time.monotonic()
        assert active.process is not None
        active_cpu = cpu_seconds(active.process.pid)
        pair.backup.start(wait=False)
        # Its store's recovery of its older copy first.
        await asyncio.to_thread(pair.backup.wait_ready, 300)
        await until_in_sync(active, 1200)
        during = rate(marks, started, time.monotonic())
    finally:
        stop.set()
        await asyncio.wait_for(publisher, 60)
    return [before, during], started, active_cpu


async def feed_state(server: ServerProcess | str) -> dict[str, Any]:
    """The ACTIVE's feed, from its console (``server``, or an administrator's URL)."""
    url = server if isinstance(server, str) else url_of(server, ADMIN)
    async with ConsoleClient(url) as console:
        status = await console.call("status")
    return (status.get("replication") or {}).get("feed") or {}


async def follower_state(server: ServerProcess) -> dict[str, Any]:
    async with ConsoleClient(url_of(server, ADMIN)) as console:
        status = await console.call("status")
    return (status.get("replication") or {}).get("follower") or {}


async def until_in_sync(server: ServerProcess | str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    said = "no answer"
    while time.monotonic() < deadline:
        try:
            state = (await feed_state(server)).get("state")
            if state == "in_sync":
                return
            said = f"its feed is {state or 'not running'}"
        except Exception as error:
            said = f"{type(error).__name__}: {error}"
        await asyncio.sleep(0.02)
    raise TimeoutError(f"no in-sync passive after {timeout} s ({said})")


async def until_applied(server: ServerProcess, timeout: float) -> dict[str, Any]:
    """The follower's status once it has applied every run it kept."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = await follower_state(server)
        if state.get("unapplied_runs") == 0 and state.get("last_apply_seconds") is not None:
            return state
        await asyncio.sleep(0.05)
    raise TimeoutError(f"runs still to apply after {timeout} s")


TAKEOVER_LIMIT = 120.0  # seconds a takeover is given before the bench gives up on it


async def takeover_at_in_sync(pair: Pair, active: ServerProcess) -> dict[str, Any]:
    """The worst moment after a catch-up: the PASSIVE restarted (it takes a snapshot of
    the whole backlog) and the ACTIVE killed -9 the moment it declares the PASSIVE in
    sync. Seconds from the kill to the first publish the PASSIVE confirms (a raw client
    knocking every 10 ms: its first connection is the vote), and what the PASSIVE said
    it had still to apply when it went in sync."""
    passive = pair.backup
    pair.kill(passive)
    passive.start(wait=False)
    await asyncio.to_thread(passive.wait_ready, 300)
    await until_in_sync(active, 1200)
    pair.kill(active)
    killed = time.monotonic()
    frames = rawclient.publish_frames(1, "after-takeover", BODY, persistent=True)
    attempts = 0
    while True:
        attempts += 1
        try:
            client = await rawclient.connect(HOST, passive.port, limit=5)
            try:
                await client.open_channel(confirm=True)
                await client.rpc(commands.Queue.Declare(queue="after-takeover", durable=True))
                nacked = await client.publish_confirmed(frames, 1, window=1, limit=60)
            finally:
                await client.close()
            if not nacked:
                break
        except Exception:
            pass
        if time.monotonic() - killed > TAKEOVER_LIMIT:
            raise TimeoutError(f"no takeover {TAKEOVER_LIMIT} s after the kill")
        await asyncio.sleep(0.01)
    seconds = time.monotonic() - killed
    synced = [
        e
        for e in pair.events(passive)
        if e["event"] == "sync" and e.get("side") == "passive" and e.get("sync") == "in_sync"
    ]
    return {
        "seconds_kill_to_first_confirm": round(seconds, 3),
        "attempts": attempts,
        "in_sync_said": synced[-1].get("reason") if synced else None,
    }


SYNC_BYTES = 16 << 10  # about a run of 100 of these messages
SYNCS = 200


def _fsyncs(path: Path, out: list[float], start: threading.Barrier) -> None:
    """SYNCS overwrites of SYNC_BYTES, each made durable, in a file written once before
    (as SQLite reuses its log): the median seconds each."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, bytes(SYNC_BYTES * SYNCS))
        os.fsync(fd)
        seconds = []
        start.wait(30)
        for at in range(SYNCS):
            began = time.perf_counter()
            os.pwrite(fd, b"x" * SYNC_BYTES, at * SYNC_BYTES)
            os.fdatasync(fd)
            seconds.append(time.perf_counter() - began)
        out.append(statistics.median(seconds))
    finally:
        os.close(fd)
        path.unlink()


def disk_share(workdir: Path, standalone_msgs_per_s: float) -> dict[str, Any]:
    """The fsync's time alone and beside another, and the cap it puts on the ratio."""
    found: dict[int, list[float]] = {}
    for writers in (1, 2):
        out: list[float] = []
        start = threading.Barrier(writers)
        threads = [
            threading.Thread(target=_fsyncs, args=(workdir / f"sync-{i}", out, start))
            for i in range(writers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        found[writers] = out
    alone = found[1][0]
    beside = statistics.median(found[2])
    round_seconds = WINDOW / standalone_msgs_per_s
    return {
        "fsync_us_alone": round(alone * 1e6),
        "fsync_us_two_at_once": round(beside * 1e6),
        "standalone_round_us": round(round_seconds * 1e6),
        "cap": round(round_seconds / (round_seconds + max(0.0, beside - alone)), 3),
    }


def best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rounds, key=lambda r: r["msgs_per_s"])


def compare(alone: list[dict[str, Any]], replicated: list[dict[str, Any]]) -> dict[str, Any]:
    """Both setups' best rounds, every round, and the two ratios."""
    return {
        "standalone": best(alone) | {"rounds": [r["msgs_per_s"] for r in alone]},
        "replicated": best(replicated) | {"rounds": [r["msgs_per_s"] for r in replicated]},
        "ratio": round(best(replicated)["msgs_per_s"] / best(alone)["msgs_per_s"], 3),
        "ratio_of_medians": round(
            statistics.median(r["msgs_per_s"] for r in replicated)
            / statistics.median(r["msgs_per_s"] for r in alone),
            3,
        ),
    }


def catch_up_and_takeover(pair: Pair, active: ServerProcess, count: int, result: dict) -> None:
    """The catch-up of ``count`` messages under a publisher, then the takeover the moment
    the PASSIVE is in sync; into ``result``."""
    assert active.process is not None
    say(f"replication bench: catch-up of {count} messages")
    asyncio.run(fill(active.port, count, "backlog"))
    asyncio.run(until_in_sync(active, 600))
    # A publisher all along: its confirmed rate with the PASSIVE in sync, then
    # while the restarted PASSIVE catches up.
    rates, started, active_cpu = asyncio.run(catch_up_under_load(pair, active))
    seconds = time.monotonic() - started
    active_after = cpu_seconds(active.process.pid)
    assert pair.backup.process is not None
    passive_cpu = cpu_seconds(pair.backup.process.pid)
    follower = asyncio.run(follower_state(pair.backup))
    snapshot = follower.get("last_snapshot_seconds") or seconds
    applied = asyncio.run(until_applied(pair.backup, 1200))
    result["catch_up"] = {
        "messages": count,
        "seconds_from_start": round(seconds, 2),
        "publish_msgs_per_s_before": rates[0],
        "publish_msgs_per_s_during": rates[1],
        "publish_share_during": round(rates[1] / rates[0], 3) if rates[0] else None,
        "snapshot_seconds": snapshot,
        "msgs_per_s": round(count / snapshot),
        "runs": follower.get("runs"),
        # CPU seconds from the kill to in sync: on a shared machine these move
        # less than the seconds do. The PASSIVE's include its recovery.
        "active_cpu_s": None
        if active_cpu is None or active_after is None
        else round(active_after - active_cpu, 2),
        "passive_cpu_s": None if passive_cpu is None else round(passive_cpu, 2),
        "apply_seconds": applied.get("last_apply_seconds"),
        "passive_cpu_s_applied": round(cpu_seconds(pair.backup.process.pid) or 0, 2),
        "load_average": os.getloadavg(),
    }
    say("replication bench: takeover the moment the PASSIVE is in sync")
    result["takeover_at_in_sync"] = asyncio.run(takeover_at_in_sync(pair, active)) | {
        "backlog": count
    }


def take_turns(solo: Target, active: Target, sizes: dict[str, int]) -> dict[str, Any]:
    """The ratios at WINDOW and WIDE_WINDOW in flight: the standalone server and the ACTIVE
    take turns, round by round, so that whatever else the machines do falls on both; and
    the target beside them."""
    result: dict[str, Any] = {}
    assert active.console_url is not None
    for window, key in ((WINDOW, None), (WIDE_WINDOW, "wide_window")):
        if not sizes["rounds"]:
            break  # --rounds 0: the catch-up alone
        alone: list[dict[str, Any]] = []
        rounds: list[dict[str, Any]] = []
        for _ in range(sizes["rounds"]):
            alone.append(asyncio.run(confirmed_publish(solo, sizes["messages"], "b", window)))
            asyncio.run(until_in_sync(active.console_url, 60))
            rounds.append(asyncio.run(confirmed_publish(active, sizes["messages"], "b", window)))
        section = compare(alone, rounds) | {"window": window}
        if key is None:
            result.update(section)
        else:
            result[key] = section
    result["target_ratio_of_medians"] = TARGET
    if "ratio_of_medians" in result:
        result["target_met"] = result["ratio_of_medians"] >= TARGET
    return result


async def log_in(name: str, target: Target) -> None:
    """A named server answers and takes the login, or the bench stops saying why."""
    try:
        client = await rawclient.connect(target.host, target.port, limit=10, **target.login)
    except Exception as error:
        reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise SystemExit(
            f"replication bench: {name} {target.host}:{target.port}: no AMQP login ({reason})"
        ) from None
    await client.close()


def run_on(standalone: str, active: str, sizes: dict[str, int]) -> dict[str, Any]:
    """The ratios on servers started elsewhere (two machines), named by their URLs."""
    sizes = {**DEFAULT_SIZES, **sizes, "catch_up": 0}
    solo, leader = Target.from_url(standalone), Target.from_url(active)
    say(
        f"replication bench: {solo.host}:{solo.port} alone, {leader.host}:{leader.port} replicating"
    )
    for name, target in (("--standalone", solo), ("--active", leader)):
        asyncio.run(log_in(name, target))
    try:
        asyncio.run(until_in_sync(active, 60))  # the ACTIVE's URL: its console's too
    except TimeoutError as error:
        raise SystemExit(
            f"replication bench: --active {leader.host}:{leader.port}: {error}"
        ) from None
    result: dict[str, Any] = {"sizes": sizes, "message_bytes": len(BODY), "servers": "named"}
    result.update(take_turns(solo, leader, sizes))
    return result


def run(sizes: dict[str, int] | None = None) -> dict[str, Any]:
    sizes = dict(DEFAULT_SIZES, **(sizes or {}))
    result: dict[str, Any] = {"sizes": sizes, "message_bytes": len(BODY)}
    with tempfile.TemporaryDirectory(prefix="amqha-replbench-") as tmp:
        workdir = Path(tmp)
        say("replication bench: a standalone server and a replicating pair, round by round")
        solo = ServerProcess(workdir, "solo").start()
        # Room for the whole backlog in memory (each message is held there too, and counts
        # about 380 bytes against the watermark): the default 2 GiB blocks the publisher
        # near 5.5M messages, and a 10M fill never ends.
        watermark = max(2 << 30, sizes["catch_up"] * HELD_BYTES)
        pair = Pair(
            workdir / "pair",
            heartbeat=0.2,
            timeout=0.6,
            proxied=False,
            limits={"memory_high_watermark": watermark},
        ).start()
        try:
            asyncio.run(pair.wait_states("ACTIVE", "PASSIVE", timeout=30))
            active = pair.primary
            assert solo.process is not None and active.process is not None
            result.update(take_turns(Target.local(solo), Target.local(active), sizes))
            if "window" in result:
                median = statistics.median(result["standalone"]["rounds"])
                result["disk"] = disk_share(workdir, median)
            solo.stop()
            if sizes["catch_up"]:  # --catch-up 0: the ratios alone
                catch_up_and_takeover(pair, active, sizes["catch_up"], result)
        finally:
            solo.stop()
            pair.stop()
    result["load_average_at_end"] = os.getloadavg()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a quick look")
    parser.add_argument("--catch-up", type=int, help="the backlog a PASSIVE catches up on")
    parser.add_argument("--rounds", type=int, help="rounds of the confirmed-publish ratio")
    parser.add_argument("--messages", type=int, help="messages a round publishes")
    parser.add_argument(
        "--standalone",
        metavar="URL",
        help="a standalone server started elsewhere (amqp://USER:PASS@HOST:PORT/); with --active",
    )
    parser.add_argument(
        "--active",
        metavar="URL",
        help="the ACTIVE of a pair started elsewhere, as an administrator; with --standalone",
    )
    options = parser.parse_args()
    if (options.standalone is None) != (options.active is None):
        parser.error("--standalone and --active go together")
    for name in ("messages", "rounds", "catch_up"):
        value = getattr(options, name)
        least = 1 if name == "messages" else 0
        if value is not None and value < least:
            parser.error(f"--{name.replace('_', '-')} must be at least {least}, not {value}")
    if options.standalone is not None and options.catch_up:
        parser.error("--catch-up needs servers of the bench's own (not --standalone/--active)")
    if options.standalone is not None and options.rounds == 0:
        parser.error("--rounds must be at least 1 with --standalone/--active")
    sizes = sizes_from(options, QUICK_SIZES, DEFAULT_SIZES)
    if options.standalone is not None:
        result = run_on(options.standalone, options.active, sizes)
    else:
        result = run(sizes)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
