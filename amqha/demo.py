"""``make demo``: a scripted tour of the primary/backup pair, printed step by step.

    python -m amqha.demo

Starts the pair from config/primary.yaml and config/backup.yaml (data dirs and event logs
in a temporary folder; other ports if 5672/5673 are taken), publishes through
``amqha.client``, kills the primary with SIGKILL, shows the backup taking over, restarts the
primary (it comes back PASSIVE), fails back with ``amqha console recover``, prints both
event logs and stops both servers. Every wait is bounded; the tour takes some seconds.

Owns nothing the broker uses: it drives the real ``amqha start`` and ``amqha console``
commands as a user would, and only ever signals the processes it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import aio_pika
import yaml

from amqha.client import connect_robust
from amqha.ports import ROLES, plan
from config.local import ADMIN_PASSWORD, ensure_credentials, read_credential
from failover.events import read_events

WAIT = 10.0  # bound on every wait in the tour


def say(text: str = "") -> None:
    print(text, flush=True)


def step(number: int, title: str, *explanation: str) -> None:
    say()
    say(f"== {number}. {title}")
    for line in explanation:
        say(f"   {line}")


class Server:
    """One ``amqha start`` child process with its config written to the temp folder."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        self.config = config
        self.name: str = config["server"]["name"]
        self.port = int(config["server"]["listen"].rsplit(":", 1)[1])
        self.config_path = workdir / f"{self.name}.yaml"
        self.log_path = workdir / f"{self.name}.log"
        self.events_path = Path(config["events"]["path"])
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, user: str = "guest", password: str = "guest") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.port}/"

    def start(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "amqha", "start", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log_path.read_text()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            time.sleep(0.02)
        raise TimeoutError(f"{self.name} not listening on {self.port} after {WAIT} s")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(WAIT)

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def state(self) -> str | None:
        """The state by the event log: the last start or transition record."""
        if not self.events_path.exists():
            return None
        state = None
        for record in read_events(self.events_path):
            if record["event"] == "started":
                state = record["state"]
            elif record["event"] == "transition":
                state = record["to"]
        return state


def pair_configs(workdir: Path) -> list[dict[str, Any]]:
    """The shipped configs, with data and event logs moved to ``workdir``, and this
    tour's own secret and passwords in ``workdir/local`` (the configs read them there)."""
    ensure_credentials(workdir)
    folder = resources.files("config")
    configs = [
        yaml.safe_load((folder / f"{role}.yaml").read_text()) for role in ("primary", "backup")
    ]
    # Every listener that is taken here (AMQP, metrics, management...) moves to a free
    # port, and each server's peer addresses follow: the planner `amqha pair` uses.
    moved = plan(dict(zip(ROLES, configs, strict=True)))
    for note in moved.notes:
        say(f"   ({note})")
    for role, config in zip(ROLES, configs, strict=True):
        for key, value in moved.overrides[role].items():
            section = config
            *path, last = key.split(".")
            for name in path:
                section = section[name]
            section[last] = value
    for config in configs:
        name = config["server"]["name"]
        config["server"]["data_dir"] = str(workdir / name)
        config["events"] = {"path": str(workdir / name / "events.jsonl")}
    return configs


async def wait_states(servers: list[Server], *states: str) -> None:
    deadline = time.monotonic() + WAIT
    while [s.state() for s in servers] != list(states):
        if time.monotonic() >= deadline:
            now = [s.state() for s in servers]
            raise TimeoutError(f"expected {list(states)} after {WAIT} s, logs say {now}")
        await asyncio.sleep(0.02)


def console(servers: list[Server], *words: str) -> None:
    """Run the real ``amqha console`` command and show what it prints."""
    password = read_credential(servers[0].config_path.parent, ADMIN_PASSWORD)
    assert password is not None
    arguments = [part for s in servers for part in ("--server", s.url("admin", password))]
    say(f"   $ amqha console {' '.join(words)}")
    result = subprocess.run(
        [sys.executable, "-m", "amqha", "console", *arguments, *words],
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
    )
    for line in (result.stdout + result.stderr).splitlines():
        say(f"     {line}")


def served_by(connection: aio_pika.abc.AbstractConnection) -> str:
    transport = connection.transport  # type: ignore[attr-defined]
    info = transport.connection.server_properties["amqha"]
    return str(info["name"])


class Publisher:
    """Publishes with confirms in the background; remembers when and where each was confirmed."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel) -> None:
        self.channel = channel
        self.confirmed: list[tuple[float, str]] = []
        self.task: asyncio.Task[None] | None = None

    def start(self, connection: aio_pika.abc.AbstractConnection) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(connection))

    async def _run(self, connection: aio_pika.abc.AbstractConnection) -> None:
        number = 0
        while True:
            number += 1
            try:
                await asyncio.wait_for(
                    self.channel.default_exchange.publish(
                        aio_pika.Message(f"tick {number}".encode()), routing_key="demo"
                    ),
                    2.0,
                )
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(0.01)
                continue
            self.confirmed.append((time.time(), served_by(connection)))
            await asyncio.sleep(0.01)

    async def first_after(self, since: float, by: str) -> float:
        deadline = time.monotonic() + WAIT * 2
        while time.monotonic() < deadline:
            for ts, server in self.confirmed:
                if ts > since and server == by:
                    return ts
            await asyncio.sleep(0.01)
        raise TimeoutError(f"no publish confirmed by {by} within {WAIT * 2} s")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


def format_event(record: dict[str, Any]) -> str:
    stamp = (
        time.strftime("%H:%M:%S", time.localtime(record["ts"]))
        + f".{int(record['ts'] * 1000) % 1000:03d}"
    )
    head = (
        f"{stamp} {record['node']:8} {record['state']:8} e{record['epoch']:<3} {record['event']:12}"
    )
    kind = record["event"]
    if kind == "transition":
        return (
            f"{head} {record['from']} -> {record['to']} on {record['trigger']}: {record['reason']}"
        )
    if kind in ("peer_up", "peer_lost"):
        return f"{head} peer {record['peer']} ({record['peer_state']})"
    if kind in ("dual_active", "misconfigured"):
        return f"{head} {record['reason']}"
    if kind == "console":
        return f"{head} {record['user']}: {record['command']} -> {record['result']}"
    if kind in ("started", "stopped"):
        return f"{head} listen {record['listen']}, peer {record['peer']}"
    extra = {
        k: v
        for k, v in record.items()
        if k not in ("v", "ts", "node", "role", "epoch", "state", "event")
    }
    return f"{head} {json.dumps(extra)}"


def print_events(servers: list[Server]) -> None:
    for server in servers:
        records = read_events(server.events_path)
        redirects = [r for r in records if r["event"] in ("redirect", "refuse")]
        say(f"   --- {server.events_path} ({len(records)} records) ---")
        for record in records:
            if record["event"] not in ("redirect", "refuse"):
                say(f"   {format_event(record)}")
        if redirects:
            say(
                f"   (and {len(redirects)} redirect/refuse records: clients sent on or told to retry)"
            )


async def tour(workdir: Path) -> None:
    step(
        1,
        "Start the pair",
        "Two processes: `amqha start --config primary.yaml` and the same with backup.yaml.",
        "Each publishes its state to the other's amq.peer exchange every heartbeat.",
    )
    servers = [Server(config, workdir) for config in pair_configs(workdir)]
    primary, backup = servers
    try:
        for server in servers:
            server.start()
            say(f"   started {server.name} (pid {server.pid}) on 127.0.0.1:{server.port}")
        await wait_states(servers, "ACTIVE", "PASSIVE")
        say("   the primary saw a fresh backup and went ACTIVE; the backup saw it and went PASSIVE")
        console(servers, "status")

        step(
            2,
            "Publish through amqha.client",
            "connect_robust() lists both servers and follows the passive's redirect to the active.",
        )
        connection = await connect_robust([backup.url(), primary.url()])
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("demo", arguments={"x-max-length": 1000})
        for number in range(3):
            await channel.default_exchange.publish(
                aio_pika.Message(f"hello {number}".encode()), routing_key="demo"
            )
        say(f"   listed the backup first, landed on: {served_by(connection)}")
        say("   3 messages published and confirmed; a publisher keeps going in the background")
        publisher = Publisher(channel)
        publisher.start(connection)

        step(
            3,
            "kill -9 the primary",
            "No goodbye: the backup only notices that state messages stop coming.",
            "After one timeout of silence, the next client that asks it to serve is the 'vote'.",
        )
        killed_at = time.time()
        primary.kill()
        say(f"   kill -9 {primary.pid} ({primary.name})")
        first = await publisher.first_after(killed_at, backup.name)
        await wait_states([backup], "ACTIVE")
        say(
            f"   the publisher's next confirmed message came from the backup {first - killed_at:.2f} s after the kill"
        )
        console([backup], "status")

        step(
            4,
            "Restart the primary",
            "It hears the ACTIVE backup before it would take any client, and stays PASSIVE:",
            "a crashed primary never takes the service back by itself.",
        )
        primary.start()
        say(f"   started {primary.name} again (pid {primary.pid})")
        await wait_states(servers, "PASSIVE", "ACTIVE")
        console(servers, "status")

        step(
            5,
            "Fail back by hand: amqha console recover",
            "The ACTIVE backup hands over to the healthy PASSIVE primary and redirects its",
            "clients there. No process is stopped.",
        )
        asked = time.time()
        console(servers, "recover")
        await wait_states(servers, "ACTIVE", "PASSIVE")
        back = await publisher.first_after(asked, primary.name)
        say(f"   the publisher moved with it: confirmed by the primary {back - asked:.2f} s later")
        console(servers, "status")
        await publisher.stop()
        await connection.close()

        step(6, "The failover event logs", "One JSON line per event; the Spark report reads these.")
        print_events(servers)
    finally:
        step(7, "Stop both servers")
        for server in servers:
            code = server.stop()
            if code is not None:
                say(f"   {server.name}: exit code {code}")


def main() -> int:
    # The client libraries log every refused or redirected attempt of a failover; the
    # tour says what happens in its own words.
    for name in ("aio_pika", "aiormq", "amqha.client"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="amqha-demo-") as workdir:
        say(f"amqha demo: a primary/backup pair on loopback, data in {workdir}")
        try:
            asyncio.run(tour(Path(workdir)))
        except (TimeoutError, RuntimeError) as error:
            say(f"demo stopped: {error}")
            return 1
    say()
    say(f"done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
