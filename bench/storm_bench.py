"""A reconnect storm: many clients on the ACTIVE, kill -9, how long until each serves again.

    python -m bench.storm_bench [--clients 1000] [--workers 4] [--kills 2]

The pair runs with the shipped timings (as ``bench.failover_bench``). ``--clients``
clients, half publishers and half consumers, each on its own connection
(``amqha.client.connect_robust`` with both servers' URLs), are spread over ``--workers``
client processes so that the clients' own CPU is not one core's. Publisher ``k`` sends a
persistent message with confirms to consumer ``k``'s durable queue every ``PERIOD``
seconds; a consumer acks what it gets.

Measured:

- the ACTIVE server's resident memory before the clients connect and once they are all
  connected and idle (no message sent yet): the memory one idle connection costs;
- per kill -9 of the ACTIVE: for every client, the seconds from the kill to its first
  success on the survivor (a publisher's first confirm, a consumer's first delivery);
  p50, p99 and max over all clients and per kind, and how many did not serve again
  within ``RESUME_TIMEOUT``; the killed server is started again and the pair settles
  before the next kill.

Printed: JSON. Figures only: nothing asserts a time. Every process started here is
stopped here, by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PERIOD = 1.0  # seconds between two publishes of one publisher
RESUME_TIMEOUT = 60.0  # how long after a kill a worker waits for all its clients
SETTLE_TIMEOUT = 120.0


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# -- a worker process: its share of the clients ---------------------------------------------


class Worker:
    """``count`` clients, numbered from ``first``; reads commands on stdin, answers one
    JSON line on stdout per command."""

    def __init__(self, urls: list[str], first: int, count: int) -> None:
        self.urls = urls
        self.first, self.count = first, count
        self.connections: list[Any] = []
        self.successes: dict[int, list[float]] = {}  # client -> times of its successes
        self.kinds: dict[int, str] = {}
        self.go = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.held: list[Any] = []

    async def connect(self) -> None:
        from amqha.client import connect_robust

        async def one(index: int) -> None:
            connection = await connect_robust(self.urls)
            self.connections.append(connection)
            channel = await connection.channel(publisher_confirms=True)
            pair = index // 2
            queue = await channel.declare_queue(f"storm-{pair}", durable=True)
            # aio-pika's robust connection holds its channels weakly: one nobody holds
            # is not restored after a reconnect.
            self.held.append((channel, queue))
            self.successes[index] = []
            if index % 2:
                self.kinds[index] = "consumer"

                async def got(message: Any) -> None:
                    self.successes[index].append(time.time())
                    await message.ack()

                await queue.consume(got)
            else:
                self.kinds[index] = "publisher"
                self.tasks.append(asyncio.create_task(self.publish(index, channel, queue.name)))

        indexes = range(self.first, self.first + self.count)
        for start in range(0, self.count, 50):  # 50 handshakes at a time
            await asyncio.gather(*(one(i) for i in indexes[start : start + 50]))

    async def publish(self, index: int, channel: Any, queue: str) -> None:
        import aio_pika

        await self.go.wait()
        body = b"x" * 100
        while True:
            try:
                await channel.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=2), routing_key=queue, timeout=10
                )
                self.successes[index].append(time.time())
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(0.05)  # a failover: the robust connection comes back
                continue
            await asyncio.sleep(PERIOD)

    async def resumed(self, since: float) -> dict[str, Any]:
        """Each client's first success after ``since`` (None: none within the timeout)."""
        deadline = time.time() + RESUME_TIMEOUT
        while time.time() < deadline:
            if all(any(t > since for t in s) for s in self.successes.values()):
                break
            await asyncio.sleep(0.1)
        return {
            str(index): [self.kinds[index], next((t - since for t in s if t > since), None)]
            for index, s in self.successes.items()
        }

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        await self.connect()
        answer({"connected": len(self.connections)})
        while line := (await reader.readline()).decode().split():
            if line[0] == "go":
                self.go.set()
                since = time.time()
                while not all(any(t > since for t in s) for s in self.successes.values()):
                    await asyncio.sleep(0.1)
                answer({"serving": True})
            elif line[0] == "kill":
                answer({"resumed": await self.resumed(float(line[1]))})
            elif line[0] == "stop":
                break
        for task in self.tasks:
            task.cancel()
        for connection in self.connections:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 5)
        answer({"stopped": True})


def answer(value: dict[str, Any]) -> None:
    print(json.dumps(value), flush=True)


# -- the parent: the pair, the workers, the kills -------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    from bench.failover_bench import percentile as nearest_rank

    return nearest_rank(values, fraction)


def figures(times: list[float | None]) -> dict[str, Any]:
    done = [t for t in times if t is not None]
    if not done:
        return {"clients": len(times), "resumed": 0}
    return {
        "clients": len(times),
        "resumed": len(done),
        "p50_s": round(percentile(done, 0.5), 3),
        "p99_s": round(percentile(done, 0.99), 3),
        "max_s": round(max(done), 3),
    }


def storm_pair(workdir: Path, scrypt: bool) -> tuple[Any, dict[str, float]]:
    """The shipped timings and limits (``bench.failover_bench``), and the clients' user:
    its password as an scrypt hash (as ``amqha passwd`` writes it) or in clear."""
    from bench.failover_bench import shipped, shipped_pair
    from config.passwords import hash_password
    from tests.pairs import Pair
    from tests.support import USERS

    _, timings = shipped_pair(workdir)
    user: dict[str, Any] = {"name": CLIENT_USER, "vhosts": ["/"]}
    if scrypt:
        user["password_hash"] = hash_password(CLIENT_PASSWORD)
    else:
        user["password"] = CLIENT_PASSWORD
    pair = Pair(
        workdir,
        heartbeat=timings["heartbeat"],
        timeout=timings["timeout"],
        proxied=False,
        limits=shipped("primary").get("limits", {}),
        users=[*USERS, user],
    )
    return pair, timings


CLIENT_USER, CLIENT_PASSWORD = "storm", "storm-pw-0"


DEFAULT_SIZES = {"clients": 1000, "workers": 4, "kills": 2}
QUICK_SIZES = {"clients": 100, "workers": 2, "kills": 1}


def run(sizes: dict[str, int] | None = None, scrypt: bool = True) -> dict[str, Any]:
    """The storm with ``sizes`` (``make bench``'s entry; the defaults without)."""
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    keep = os.environ.get("STORM_KEEP")  # a folder to keep the servers' logs in
    with (
        contextlib.nullcontext(keep)
        if keep
        else tempfile.TemporaryDirectory(prefix="amqha-storm-bench-")
    ) as workdir:
        return asyncio.run(
            _run(sizes["clients"], sizes["workers"], sizes["kills"], Path(workdir), scrypt)
        )


async def _run(
    clients: int, workers: int, kills: int, workdir: Path, scrypt: bool
) -> dict[str, Any]:
    pair, timings = storm_pair(workdir, scrypt)
    procs: list[subprocess.Popen[str]] = []
    result: dict[str, Any] = {
        "clients": clients,
        "workers": workers,
        "password": "scrypt hash" if scrypt else "plain",
        **timings,
    }
    try:
        pair.start()
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=SETTLE_TIMEOUT)
        await pair.wait_in_sync(pair.backup, timeout=SETTLE_TIMEOUT)
        active = pair.primary
        assert active.process is not None
        before = rss_kib(active.process.pid)
        urls = ",".join(
            f"amqp://{CLIENT_USER}:{CLIENT_PASSWORD}@{s.address}/" for s in pair.servers
        )
        share = clients // workers
        started = time.monotonic()
        for number in range(workers):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.storm_bench", "--worker", urls,
                     str(number * share), str(share)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                )
            )  # fmt: skip
        for proc in procs:
            read(proc, "connected")
        result["connect_all_s"] = round(time.monotonic() - started, 2)
        await asyncio.sleep(2)  # idle: what the connections hold, not messages in flight
        connected = rss_kib(active.process.pid)
        result["active_rss_mib"] = {"before": before // 1024, "connected": connected // 1024}
        result["kib_per_idle_connection"] = round((connected - before) / (share * workers), 1)
        for proc in procs:
            send(proc, "go")
        for proc in procs:
            read(proc, "serving")
        result["kills"] = []
        for _ in range(kills):
            result["kills"].append(await one_kill(pair, procs))
            print(f"[storm] {json.dumps(result['kills'][-1])}", file=sys.stderr, flush=True)
        for proc in procs:
            send(proc, "stop")
        for proc in procs:
            read(proc, "stopped")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        pair.stop()
    return result


async def one_kill(pair: Any, procs: list[subprocess.Popen[str]]) -> dict[str, Any]:
    states = pair.states()
    active = pair.primary if states[0] == "ACTIVE" else pair.backup
    kill = pair.kill(active)
    for proc in procs:
        send(proc, f"kill {kill.before}")
    times: dict[str, list[float | None]] = {"publisher": [], "consumer": []}
    late: list[str] = []
    for proc in procs:
        for index, (kind, seconds) in read(proc, "resumed").items():
            times[kind].append(seconds)
            if seconds is None:
                late.append(index)
    if late and os.environ.get("STORM_DEBUG"):
        survivor = pair.other(active)
        done = subprocess.run(
            [sys.executable, "-m", "amqha", "console", "--server",
             f"amqp://admin:admin@{survivor.address}/", "connections"],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        print(f"[storm] not resumed: {late}\n{done.stdout}{done.stderr}", file=sys.stderr)
    active.start()
    settled = ("PASSIVE", "ACTIVE") if active is pair.primary else ("ACTIVE", "PASSIVE")
    await pair.wait_states(*settled, timeout=SETTLE_TIMEOUT)
    await pair.wait_in_sync(active, timeout=SETTLE_TIMEOUT)
    return {
        "killed": active.name,
        "all": figures(times["publisher"] + times["consumer"]),
        "publishers": figures(times["publisher"]),
        "consumers": figures(times["consumer"]),
    }


def send(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def read(proc: subprocess.Popen[str], key: str) -> Any:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"a storm worker ended (exit {proc.poll()}) before saying {key}")
    return json.loads(line)[key]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--worker":
        import logging

        if os.environ.get("STORM_DEBUG"):
            logging.basicConfig(
                level=logging.DEBUG,
                filename=f"{os.environ.get('STORM_KEEP', '/tmp')}/worker-{args[2]}.log",
                format="%(asctime)s %(name)s %(levelname)s %(message)s",
            )
        else:
            logging.disable(logging.CRITICAL)  # each failover of each client would say so
        asyncio.run(Worker(args[1].split(","), int(args[2]), int(args[3])).run())
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.storm_bench", description=__doc__)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument(
        "--plain", action="store_true", help="the clients' password in clear, not scrypt"
    )
    options = parser.parse_args(args)
    sizes = {"clients": options.clients, "workers": options.workers, "kills": options.kills}
    result = run(sizes, scrypt=not options.plain)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
