"""``make nemesis``: a seeded fault schedule against a real pair under load, and a checker.

    python -m bench.nemesis [--duration 600] [--seed N|random|1,2,random] [--witness]
                            [--kinds kill,freeze,...] [--loopback] [--schedule FILE]

Owns: running one run per seed: the pair (each server on a test host of its own in a
network namespace, tests/sites.py, or on loopback where namespaces cannot be made), the
workload (``--publishers`` ``amqha.client.Publisher``s, confirms on, persistent, each
message with a unique id, and ``--consumers`` acking ``amqha.client.Consumer``s on
four durable queues; a fifth is read only at the end), applying the schedule (bench/nemesis_plan.py), healing, the
drain and the quarantine read at the end, and one JSON document per run. The verdict is
bench/nemesis_check.py's. A run whose checker finds a message lost or unexpected (or that
cannot finish) keeps both servers' logs, event logs and stores in a directory it prints,
and the command exits with status 1. See docs/operations.md, "Fault schedule (make
nemesis)".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika

from amqha.client import Consumer, Publisher
from amqha.console import ConsoleClient, ConsoleError
from amqha.quarantine import read_quarantine
from bench import nemesis_check as checker
from bench.nemesis_plan import (
    CLOCK_KINDS,
    CLOCK_STEP,
    DISK_KINDS,
    HOOK_KINDS,
    NETWORK_KINDS,
    PROCESS_KINDS,
    WITNESS_KINDS,
    Fault,
    from_json,
    schedule,
)
from tests import faketime, lazyfs, netns
from tests.durability import drain
from tests.pairs import PAIR_SECRET, Pair, poll, url_of
from tests.sites import HEARTBEAT, TIMEOUT, Site
from tests.support import ROOT, ServerProcess, free_port

# Four queues with consumers, and one that only the drain at the end reads: a backlog at
# rest in the stores through every fault.
CONSUMED = tuple(f"nemesis-{n}" for n in range(4))
QUEUES = (*CONSUMED, "nemesis-backlog")
STEP = 120.0  # bound on each wait for a process or the pair to move


def say(text: str) -> None:
    print(f"nemesis: {text}", file=sys.stderr, flush=True)


# -- the processes ----------------------------------------------------------------------------


class LocalWitness:
    """``amqha witness`` on loopback, for a run without namespaces."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.secret = workdir / "witness-secret"
        self.address = f"127.0.0.1:{free_port()}"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.secret.write_text(PAIR_SECRET)
        self.starts += 1
        log_path = self.workdir / f"witness-{self.starts}.log"
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "amqha", "witness", "--listen", self.address]
                + ["--secret-file", str(self.secret)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        deadline = time.monotonic() + 30
        while "listening on" not in log_path.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the witness did not start: {log_path.read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


class Cluster:
    """The pair under test, and its witness when asked for: on test hosts in network
    namespaces (``site``) or on loopback."""

    def __init__(
        self,
        workdir: Path,
        witness: bool,
        namespaces: bool,
        disks: bool = False,
        clocks: bool = False,
    ) -> None:
        self.site: Site | None = None
        self.disks: dict[str, lazyfs.LazyDisk] = {}
        self.clocks: dict[str, Path] = {}  # server name -> its faked clock's offset file
        self.local_witness: LocalWitness | None = None
        if namespaces:
            self.site = Site(workdir, witness=witness)
            self.pair = self.site.pair
        else:
            extra: dict[str, Any] = {}
            if witness:
                self.local_witness = LocalWitness(workdir)
                self.local_witness.start()
                extra["witness"] = [self.local_witness.address]
            self.pair = Pair(
                workdir,
                heartbeat=HEARTBEAT,
                timeout=TIMEOUT,
                proxied=False,
                failover_extra=extra,
            )
        self.witnessed = witness
        # server name -> [(SIGSTOP, SIGCONT)] wall-clock times
        self.asleep: dict[str, list[tuple[float, float]]] = {}
        if disks:  # each server's data dir on a disk that forgets (tests/lazyfs.py)
            for server in self.pair.servers:
                disk = lazyfs.LazyDisk(workdir / f"disk-{server.name}").mount()
                self.disks[server.name] = disk
                server.data_dir = disk.path / server.name
                server.config["server"]["data_dir"] = str(server.data_dir)
        if clocks:  # each server under libfaketime, its clock moved by clock_step
            for server in self.pair.servers:
                self.clocks[server.name] = faketime.fake_clock(server, workdir)

    async def start(self) -> None:
        self.pair.start()
        await self.pair.wait_states("ACTIVE", "PASSIVE", timeout=STEP)
        await self.pair.wait_in_sync(self.pair.backup, timeout=STEP)

    def role(self, target: str) -> ServerProcess:
        """The server that is ``active`` or ``passive`` now, by the event logs (the
        primary is taken as the ACTIVE when neither says so)."""
        primary, backup = self.pair.states()
        leads = backup == "ACTIVE" and primary != "ACTIVE"
        active = self.pair.backup if leads else self.pair.primary
        return active if target == "active" else self.pair.other(active)

    def host(self, server: ServerProcess) -> netns.Host:
        assert self.site is not None
        return self.site.a if server is self.pair.primary else self.site.b

    # -- faults on processes -------------------------------------------------------------

    def witness_process(self) -> subprocess.Popen[bytes] | None:
        """The witness's process while it runs."""
        process = self.site.witness if self.site is not None else None
        if self.local_witness is not None:
            process = self.local_witness.process
        return process if process is not None and process.poll() is None else None

    def witness_pid(self) -> int | None:
        process = self.witness_process()
        return process.pid if process is not None else None

    def kill_witness(self) -> None:
        process = self.witness_process()
        if process is not None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)

    def restart_witness(self) -> None:
        if self.site is not None:
            self.site.restart_witness()
        elif self.local_witness is not None:
            self.local_witness.start()

    async def restart(self, server: ServerProcess) -> None:
        """Start a killed server again; until it says it listens (bounded)."""
        banner = f"listening on {server.address}"
        before = server.log().count(banner)
        server.start(wait=False)
        await poll(
            lambda: server.log().count(banner) > before or not server.alive,
            STEP,
            f"{server.name} listening again",
        )
        if not server.alive:
            raise RuntimeError(f"{server.name} did not start again: {server.log()[-2000:]}")

    def heal_all(self) -> None:
        """Every process running (a stopped one continued) and the network whole."""
        for server in self.pair.servers:
            if server.alive:
                assert server.process is not None
                os.kill(server.process.pid, signal.SIGCONT)
        pid = self.witness_pid()
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        if self.site is not None:
            for host in self.site.net.hosts.values():
                with contextlib.suppress(Exception):
                    self.site.net.heal(host)

    def close(self) -> None:
        try:
            if self.site is not None:
                self.site.close(show_logs=False)
            else:
                self.pair.stop()
                if self.local_witness is not None:
                    self.local_witness.stop()
        finally:
            for server in self.pair.servers:
                server.kill()
            for disk in self.disks.values():
                # What was kept for a failed run stays readable in the disk's folder.
                disk.unmount()


async def apply(fault: Fault, cluster: Cluster, started: float) -> dict[str, Any]:
    """Apply one fault, hold it its time, heal it; what was done, with its times (s after
    the workload started)."""
    entry: dict[str, Any] = fault.to_json()
    entry["applied_at"] = round(time.time() - started, 3)
    pair = cluster.pair
    if fault.kind in HOOK_KINDS:
        entry.update(await switchover(cluster))
        entry["healed_at"] = round(time.time() - started, 3)
        return entry
    if fault.target == "witness":
        entry["server"] = "witness"
        await _witness_fault(fault, cluster, entry)
    elif fault.kind in DISK_KINDS:
        await _disk_fault(fault, cluster, entry)
    elif fault.kind in CLOCK_KINDS:
        role, sign = fault.target[:-1], fault.target[-1]
        server = cluster.role(role)
        entry["server"] = server.name
        offset = cluster.clocks[server.name]
        faketime.set_offset(offset, CLOCK_STEP if sign == "+" else -CLOCK_STEP)
        try:
            await asyncio.sleep(fault.seconds)
        finally:
            faketime.set_offset(offset, 0)
    else:
        server = cluster.role(fault.target)
        entry["server"] = server.name
        other = pair.other(server)
        if fault.kind == "kill":
            pair.kill(server)
            await asyncio.sleep(fault.seconds)
            await cluster.restart(server)
        elif fault.kind == "freeze":
            assert server.process is not None
            pid = server.process.pid
            stopped = time.time()
            os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(fault.seconds)
            finally:
                os.kill(pid, signal.SIGCONT)
                cluster.asleep.setdefault(server.name, []).append((stopped, time.time()))
        else:
            assert cluster.site is not None
            net, mine, theirs = cluster.site.net, cluster.host(server), cluster.host(other)
            if fault.kind == "partition":
                net.drop(mine, theirs)
            elif fault.kind == "one_way":
                net.drop(mine, theirs, direction="out", port=other.port)
            elif fault.kind == "isolate":
                net.link(mine, up=False)
            elif fault.kind == "witness_cut":
                net.drop(mine, cluster.site.w)
            try:
                await asyncio.sleep(fault.seconds)
            finally:
                net.heal(mine)
    entry["healed_at"] = round(time.time() - started, 3)
    return entry


async def _disk_fault(fault: Fault, cluster: Cluster, entry: dict[str, Any]) -> None:
    pair = cluster.pair
    if fault.kind == "power_cut":
        victims = list(pair.servers) if fault.target == "both" else [cluster.role(fault.target)]
        entry["server"] = "+".join(s.name for s in victims)
        for server in victims:
            pair.kill(server)
        for server in victims:
            cluster.disks[server.name].power_cut()
        await asyncio.sleep(fault.seconds)
        for server in victims:
            await cluster.restart(server)
        return
    server = cluster.role(fault.target)
    entry["server"] = server.name
    disk = cluster.disks[server.name]
    disk.fault("fsync eio store.sqlite")
    try:
        await asyncio.sleep(fault.seconds)
    finally:
        disk.fault("clear")
    # Mended: the server, whose store writes nothing more after an I/O error, restarted.
    pair.kill(server)
    await cluster.restart(server)


async def _witness_fault(fault: Fault, cluster: Cluster, entry: dict[str, Any]) -> None:
    if fault.kind == "kill":
        cluster.kill_witness()
        await asyncio.sleep(fault.seconds)
        cluster.restart_witness()
    elif fault.kind == "freeze":
        pid = cluster.witness_pid()
        if pid is None:
            entry["skipped"] = "the witness is not running"
            return
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(fault.seconds)
        finally:
            os.kill(pid, signal.SIGCONT)


async def switchover(cluster: Cluster) -> dict[str, Any]:
    """A planned switchover of the ACTIVE (``amqha console switchover --wait 5``, as an
    administrator): whom it handed the service to, or why it did not (its PASSIVE not in
    sync, a fault still healing, the ACTIVE unreachable): ``skipped``."""
    server = cluster.role("active")
    url = url_of(server, ("admin", server.password("admin", "admin")))
    try:
        async with asyncio.timeout(60), ConsoleClient(url, 40.0) as console:
            answer = await console.call("switchover", wait=5)
    except ConsoleError as refused:
        return {"server": server.name, "skipped": f"refused: {refused.message}"}
    except (TimeoutError, OSError, ConnectionError) as error:
        return {"server": server.name, "skipped": f"{type(error).__name__}: {error}"}
    return {"server": server.name, "to": answer.get("to")}


# -- the workload -----------------------------------------------------------------------------


async def declare(channel: aio_pika.abc.AbstractChannel) -> None:
    for queue in QUEUES:
        await channel.declare_queue(queue, durable=True)


@dataclass
class Workload:
    urls: list[str]
    publishers: int
    consumers: int
    rate: float  # messages a second, per publisher
    history: checker.History = field(default_factory=checker.History)
    confirms: dict[str, list[float]] = field(default_factory=dict)  # server address -> times
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    last_delivery: float = 0.0

    async def start(self) -> None:
        self.senders = [
            Publisher(self.urls, max_pending=100, setup=declare, name=f"publisher {n}")
            for n in range(self.publishers)
        ]
        self.readers = [
            Consumer(
                self.urls,
                CONSUMED[n % len(CONSUMED)],
                self._handler(f"consumer {n}"),
                prefetch=20,
                setup=declare,
                name=f"consumer {n}",
            )
            for n in range(self.consumers)
        ]
        await asyncio.gather(
            *(p.start(STEP) for p in self.senders), *(c.start(STEP) for c in self.readers)
        )
        self.tasks = [
            asyncio.ensure_future(self._publish(n, p)) for n, p in enumerate(self.senders)
        ]
        self.tasks.append(asyncio.ensure_future(self._watch_consumers()))

    def _handler(self, name: str) -> Any:
        async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            self.last_delivery = time.monotonic()
            self.history.deliveries.append(
                checker.Delivery(
                    message.body.decode(errors="replace"),
                    time.time(),
                    name,
                    bool(message.redelivered),
                )
            )

        return handle

    async def _publish(self, number: int, publisher: Publisher) -> None:
        for sequence in range(100_000_000):
            if self.stop.is_set():
                return
            message_id = f"p{number}-{sequence}"
            queue = QUEUES[(number + sequence) % len(QUEUES)]
            failovers = publisher.failovers
            self.history.sent[message_id] = False
            try:
                future = await publisher.send(
                    aio_pika.Message(
                        message_id.encode(),
                        message_id=message_id,
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    queue,
                )
            except Exception:
                self.history.failed.add(message_id)  # closed while waiting for room
                return
            future.add_done_callback(
                functools.partial(self._settled, message_id, failovers, publisher)
            )
            await asyncio.sleep(1 / self.rate)

    def _settled(
        self, message_id: str, failovers: int, publisher: Publisher, future: asyncio.Future[None]
    ) -> None:
        if future.cancelled() or future.exception() is not None:
            self.history.failed.add(message_id)
            return
        now = time.time()
        self.history.confirmed.add(message_id)
        self.confirms.setdefault(publisher.server or "?", []).append(now)
        if publisher.failovers != failovers:
            self.history.sent[message_id] = True

    async def _watch_consumers(self) -> None:
        seen = [0] * len(self.readers)
        while not self.stop.is_set():
            for n, consumer in enumerate(self.readers):
                if consumer.failovers > seen[n]:
                    seen[n] = consumer.failovers
                    self.history.consumer_failovers.setdefault(f"consumer {n}", []).append(
                        time.time()
                    )
            await asyncio.sleep(0.1)

    async def finish(self) -> None:
        """Stop publishing; every held message confirmed or failed (bounded); consumers
        run until nothing more arrives for 5 s (bounded), then stop."""
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(p.close(timeout=STEP) for p in self.senders), return_exceptions=True)
        began = time.monotonic()
        while time.monotonic() - began < STEP and time.monotonic() - self.last_delivery < 5.0:
            await asyncio.sleep(0.5)
        await asyncio.gather(*(c.close() for c in self.readers), return_exceptions=True)


# -- one run ----------------------------------------------------------------------------------


@dataclass
class Options:
    duration: float = 600.0
    seed: int = 1
    witness: bool = False
    kinds: tuple[str, ...] | None = None  # None: every kind this machine can make
    namespaces: bool = True  # where tests/netns.py can make them
    faults: list[Fault] | None = None  # a given schedule instead of a drawn one
    publishers: int = 10
    consumers: int = 10
    rate: float = 20.0
    heartbeat: int = 2  # the clients' AMQP heartbeat (0: none)
    settle: float = 180.0
    keep_dir: Path | None = None  # where a failed run's directory goes (a temporary one)


def fault_kinds(
    options: Options, namespaces: bool, disks: bool, clocks: bool = False
) -> tuple[str, ...]:
    kinds = PROCESS_KINDS + (NETWORK_KINDS if namespaces else ()) + HOOK_KINDS
    kinds += DISK_KINDS if disks else ()
    kinds += CLOCK_KINDS if clocks else ()
    if options.witness and namespaces:
        kinds += WITNESS_KINDS
    if options.kinds is None:
        return kinds
    missing = [k for k in options.kinds if k not in kinds and k not in HOOK_KINDS]
    for kind in missing:
        need = (
            "the power-loss filesystem (FUSE)"
            if kind in DISK_KINDS
            else "libfaketime"
            if kind in CLOCK_KINDS
            else "network namespaces (and a witness for witness_cut)"
        )
        say(f"fault kind {kind} skipped: it needs {need}")
    return tuple(k for k in options.kinds if k not in missing)


async def run(options: Options) -> dict[str, Any]:
    """One run: its JSON document (``passed`` false when the checker failed it)."""
    reason = netns.unavailable() if options.namespaces else "--loopback asked for"
    namespaces = reason is None
    if not namespaces:
        say(f"network faults skipped: {reason}; the pair runs on loopback")
    disk_reason = lazyfs.unavailable()
    if disk_reason is not None:
        say(f"disk faults skipped: {disk_reason}")
    clock_reason = faketime.unavailable()
    if clock_reason is not None:
        say(f"clock steps skipped: {clock_reason}")
    kinds = fault_kinds(options, namespaces, disk_reason is None, clock_reason is None)
    faults = (
        options.faults
        if options.faults is not None
        else schedule(options.seed, options.duration, kinds, options.witness)
    )
    if disk_reason is not None and any(f.kind in DISK_KINDS for f in faults):
        say("the schedule's disk faults are left out")
        faults = [f for f in faults if f.kind not in DISK_KINDS]
    if clock_reason is not None and any(f.kind in CLOCK_KINDS for f in faults):
        say("the schedule's clock steps are left out")
        faults = [f for f in faults if f.kind not in CLOCK_KINDS]
    workdir = Path(tempfile.mkdtemp(prefix=f"amqha-nemesis-{options.seed}-", dir=options.keep_dir))
    os.chmod(workdir, 0o755)
    result: dict[str, Any] = {
        "seed": options.seed,
        "duration_s": options.duration,
        "network": "namespaces" if namespaces else f"loopback ({reason})",
        "witness": options.witness,
        "kinds": list(kinds),
    }
    cluster: Cluster | None = None
    began = time.monotonic()
    try:
        cluster = Cluster(
            workdir,
            options.witness,
            namespaces,
            disks=any(f.kind in DISK_KINDS for f in faults),
            clocks=any(f.kind in CLOCK_KINDS for f in faults),
        )
        await cluster.start()
        result.update(await _exercise(cluster, options, faults))
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {error}"
    except asyncio.CancelledError:
        say(f"run with seed {options.seed} stopped: its logs and stores are in {workdir}")
        raise
    finally:
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.heal_all()
            cluster.close()
    result["seconds"] = round(time.monotonic() - began, 1)
    result["passed"] = "error" not in result and not checker.failed(result)
    if result["passed"]:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        result["kept"] = str(workdir)
        say(f"run with seed {options.seed} failed: logs, event logs and stores kept in {workdir}")
    return result


async def _exercise(cluster: Cluster, options: Options, faults: list[Fault]) -> dict[str, Any]:
    pair = cluster.pair
    query = f"?heartbeat={options.heartbeat}" if options.heartbeat else ""
    workload = Workload(
        [s.url + query for s in pair.servers], options.publishers, options.consumers, options.rate
    )
    await workload.start()
    started = time.time()
    applied: list[dict[str, Any]] = []
    errors: list[str] = []
    for fault in faults:
        wait = started + fault.at - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
        say(
            f"{time.time() - started:7.1f} s: {fault.kind} {fault.target} for {fault.seconds:.1f} s"
        )
        try:
            applied.append(await apply(fault, cluster, started))
        except Exception as error:
            errors.append(f"{fault.kind} at {fault.at}: {type(error).__name__}: {error}")
            applied.append({**fault.to_json(), "error": errors[-1]})
    wait = started + options.duration - time.time()
    if wait > 0:
        await asyncio.sleep(wait)
    faulted = time.time()
    # Heal: every process running and continued, the network whole; then the pair settles.
    cluster.heal_all()
    for server in pair.servers:
        if not server.alive:
            await cluster.restart(server)
    if cluster.witnessed and cluster.witness_pid() is None:
        cluster.restart_witness()
    settled = True
    try:
        await pair.settled(timeout=options.settle)
    except TimeoutError as error:
        settled = False
        errors.append(f"not settled: {error}")
    await workload.finish()
    actives = [s for s in pair.servers if pair.state(s) == "ACTIVE"] or list(pair.servers)
    for server in actives:
        for queue in QUEUES:
            try:
                left = await drain(server.url, queue, limit=10_000_000)
            except Exception as error:
                errors.append(f"drain of {queue} on {server.name}: {type(error).__name__}: {error}")
                continue
            workload.history.deliveries.extend(
                checker.Delivery(body.decode(errors="replace"), time.time(), "drain", again)
                for body, again in left
            )
    for path in pair.quarantine_files():
        workload.history.quarantined.update(
            row[5].decode(errors="replace") for row in read_quarantine(str(path))
        )
    verdict = checker.check(workload.history)
    return {
        **verdict,
        **_figures(cluster, workload, started, faulted),
        "settled": settled,
        "errors": errors,
        "schedule": applied,
    }


def _figures(
    cluster: Cluster, workload: Workload, started: float, faulted: float
) -> dict[str, Any]:
    pair = cluster.pair
    intervals = pair.active_intervals()
    first, second = (intervals[s.name] for s in pair.servers)
    asleep = [span for spans in cluster.asleep.values() for span in spans]
    by_server = [workload.confirms.get(s.address, []) for s in pair.servers]
    every = [t for times in workload.confirms.values() for t in times]
    return {
        "takeovers": sum(checker.takeovers(pair.events(s), started) for s in pair.servers),
        "dual_active_s": round(checker.dual_active_seconds(first, second, asleep), 3),
        "dual_active_records": sum(
            1 for s in pair.servers for e in pair.events(s) if e["event"] == "dual_active"
        ),
        "dual_confirm_s": round(checker.dual_confirm_seconds(by_server[0], by_server[1]), 3),
        "unavailable_s": round(checker.unavailable_seconds(every, started, faulted), 3),
        "client_failovers": sum(c.failovers for c in (*workload.senders, *workload.readers)),
    }


# -- the command ------------------------------------------------------------------------------


def seeds(text: str) -> list[int]:
    """``7``, ``random`` or ``1,2,random``: the runs' seeds (a random one is printed)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if part == "random":
            out.append(random.SystemRandom().randrange(1, 2**31))
            say(f"random seed {out[-1]} (run it again with SEED={out[-1]})")
        elif part.isdigit():
            out.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"a seed is a whole number or 'random', not {part!r}")
    return out


async def stoppable(options: Options) -> dict[str, Any]:
    """``run``; a SIGTERM or SIGINT (CI's time bound, Ctrl-C) cancels it, so that its
    processes are stopped and its namespaces removed before the command exits."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    try:
        return await run(options)
    except asyncio.CancelledError:
        say("stopped by a signal")
        sys.exit(143)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults per run")
    parser.add_argument(
        "--seed", type=seeds, default="random", help="N, random, or a list: 1,2,random"
    )
    parser.add_argument(
        "--witness", action="store_true", help="a witness for the pair (faults hit it too)"
    )
    parser.add_argument(
        "--kinds", help="fault kinds, comma-separated (default: all this machine can make)"
    )
    parser.add_argument(
        "--loopback", action="store_true", help="no network namespaces, no network faults"
    )
    parser.add_argument(
        "--schedule", type=Path, help="a JSON list of faults instead of a drawn schedule"
    )
    parser.add_argument("--publishers", type=int, default=10)
    parser.add_argument("--consumers", type=int, default=10)
    parser.add_argument("--rate", type=float, default=20.0, help="messages a second per publisher")
    parser.add_argument(
        "--heartbeat", type=int, default=2, help="the clients' AMQP heartbeat, s (0: none)"
    )
    parser.add_argument("--keep-dir", type=Path, help="where failed runs' directories go")
    options = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s"
    )
    logging.getLogger("amqha.client").setLevel(logging.INFO)
    faults = from_json(json.loads(options.schedule.read_text())) if options.schedule else None
    failed = False
    for seed in options.seed:
        say(f"run: seed {seed}, {options.duration:.0f} s of faults")
        result = asyncio.run(
            stoppable(
                Options(
                    duration=options.duration,
                    seed=seed,
                    witness=options.witness,
                    kinds=tuple(options.kinds.split(",")) if options.kinds else None,
                    namespaces=not options.loopback,
                    faults=faults,
                    publishers=options.publishers,
                    consumers=options.consumers,
                    rate=options.rate,
                    heartbeat=options.heartbeat,
                    keep_dir=options.keep_dir,
                )
            )
        )
        print(json.dumps(result), flush=True)
        failed = failed or not result["passed"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
