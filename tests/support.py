"""Test harness: real ``amqha`` processes on loopback, free ports, bounded waits.

Every process is started here and stopped here, by its own pid; nothing else is
ever signalled. Every wait is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests import forks
from tests.forks import FORKS, Forked

ROOT = Path(__file__).resolve().parent.parent

USERS = [
    {"name": "guest", "password": "guest", "vhosts": ["/", "other"]},
    {"name": "admin", "password": "admin", "vhosts": ["/"], "tags": ["administrator"]},
    {"name": "peering", "password": "peering", "vhosts": ["/"], "tags": ["peering"]},
    {"name": "limited", "password": "limited", "vhosts": ["other"]},
]


# Ports are drawn below the kernel's ephemeral range (32768-60999 by default), where
# outgoing client sockets take their local ports: a port handed out here cannot be taken
# by some connection's local end before the server binds it. None is handed out twice.
_PORT_RANGE = (20000, 32000)
_handed_out: set[int] = set()


def port_range() -> tuple[int, int]:
    """The ports this test process draws from: the whole range, or, when pytest-xdist runs
    the suite in several worker processes, this worker's own slice of it (so two workers
    never hand out the same port between the check that it is free and the bind)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count < 2:
        return _PORT_RANGE
    low, high = _PORT_RANGE
    width = (high - low) // count
    index = int(worker[2:]) % count
    return low + index * width, low + (index + 1) * width


def free_port() -> int:
    ports = port_range()
    for _ in range(1000):
        port = random.randrange(*ports)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {ports}")


def soak_size(quick: int, full: int) -> int:
    """A soak-sized loop's count: ``quick`` (enough to show the point) in ``make test``,
    ``full`` under ``make soak`` (``SOAK=1``), which runs the tests marked ``soak``."""
    return full if os.environ.get("SOAK") == "1" else quick


def console_in_process(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``amqha console ARGS`` through click's test runner, in a thread of this process (the
    console runs its own event loop): the same command, exit status and output as
    ``python -m amqha console ARGS``, without a Python start each time. A traceback the
    command lets out is raised here."""
    import threading

    from click.testing import CliRunner

    from amqha.cli import main

    results: list[Any] = []
    thread = threading.Thread(
        target=lambda: results.append(CliRunner().invoke(main, ["console", *args])),
        name="console",
    )
    thread.start()
    thread.join(timeout)
    assert results, f"amqha console {' '.join(args)} still running after {timeout} s"
    result = results[0]
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def wait_for_port(port: int, timeout: float = 15.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout} s")


def wait_until(
    predicate: Any, timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns a truthy value, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not true after {timeout} s: {what or predicate}")
        time.sleep(interval)


async def until(predicate: Any, timeout: float, what: str) -> None:
    """Await (polling every 20 ms) until ``predicate()`` is true, at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not true after {timeout} s: {what}")
        await asyncio.sleep(0.02)


def start_to_exit(
    config: Path, *args: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``amqha start --config CONFIG`` run to its end: for configurations it must refuse."""
    return subprocess.run(
        [sys.executable, "-m", "amqha", "start", "--config", str(config), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class ServerProcess:
    """One ``amqha start`` process with its own config file, data dir and log.

    ``host``: the address it listens on (loopback unless a test host in a network
    namespace); ``prefix``: what its command runs under (``ip netns exec NAME``, which
    execs it, so the pid is still the server's); ``client``: the user of ``url``."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        port: int | None = None,
        host: str = "127.0.0.1",
        prefix: tuple[str, ...] = (),
        client: str = "guest",
        **overrides: Any,
    ) -> None:
        self.workdir = Path(workdir)
        self.name = name
        self.host = host
        self.prefix = prefix
        self.client = client
        self.port = port or free_port()
        self.data_dir = self.workdir / name
        self.config_path = self.workdir / f"{name}.yaml"
        self.log_path = self.workdir / f"{name}.log"
        self.log_start = 0  # the offset of the last started process's output in it
        self.config: dict[str, Any] = {
            "server": {
                "name": name,
                "listen": f"{host}:{self.port}",
                "data_dir": str(self.data_dir),
            },
            "users": USERS,
        }
        for section, values in overrides.items():
            if isinstance(values, dict):
                self.config.setdefault(section, {}).update(values)
            else:
                self.config[section] = values
        self.process: subprocess.Popen[bytes] | Forked | None = None
        # What runs the server after the interpreter (a test's own launcher may replace it),
        # and from which tree of the code (another release's: tests/test_rolling_upgrade.py).
        self.command: tuple[str, ...] = forks.COMMAND
        self.code: Path = ROOT
        # Further environment for this server's process alone (a faked clock:
        # tests/integration/test_clock_step.py).
        self.env: dict[str, str] = {}

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def password(self, user: str, default: str) -> str:
        """``user``'s password in this server's config (``default`` if it has none)."""
        for entry in self.config.get("users", ()):
            if entry.get("name") == user and "password" in entry:
                return str(entry["password"])
        return default

    @property
    def url(self) -> str:
        return f"amqp://{self.client}:{self.password(self.client, self.client)}@{self.address}/"

    @property
    def events_path(self) -> Path:
        return Path(self.config.get("events", {}).get("path", self.data_dir / "events.jsonl"))

    def start(self, wait: bool = True, extra_args: tuple[str, ...] = ()) -> ServerProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config))
        # Where this process's output starts: an earlier one's banner is not its own.
        self.log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        arguments = ["--config", str(self.config_path), *extra_args]
        plain = not self.prefix and self.command == forks.COMMAND and self.code == ROOT
        if plain and not self.env and FORKS.usable(env):  # tests/forks.py: the same process, forked
            self.process = FORKS.spawn([*self.command[2:], *arguments], ROOT, self.log_path, env)
            if wait:
                self.wait_ready()
            return self
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        if self.code != ROOT:  # found before the installed tree
            env["PYTHONPATH"] = os.pathsep.join([str(self.code), env.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            [*self.prefix, sys.executable, *self.command, *arguments],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.code,
            env=env,
        )
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until this process says it listens (a connect alone could reach another listener).

        The banner is looked for in this process's own output: a restarted server's log
        still holds the one before's, and its port answers before its failover controller
        has started (so an event log read then would still be the process before's).
        A start takes under a second on a quiet machine; the bound is for one whose two
        cores are shared with parallel test workers and more (15 s was seen to pass)."""
        deadline = time.monotonic() + timeout
        banner = f"listening on {self.address}".encode()
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.log()}"
                )
            if banner in self.own_output():
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection((self.host, self.port), timeout=0.5),
                ):
                    return
            time.sleep(0.02)
        raise TimeoutError(
            f"{self.name} not listening on {self.port} after {timeout} s:\n{self.log()}"
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def own_output(self) -> bytes:
        """What the process last started has written to the log."""
        if not self.log_path.exists():
            return b""
        with open(self.log_path, "rb") as log:
            log.seek(self.log_start)
            return log.read()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """kill -9: no shutdown, no flush, exactly like a crash."""
        if self.alive:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and the exit status. A clean stop flushes the store: on a disk busy with
        other writes (a fresh venv's) that takes seconds, hence the long wait. One that
        does not end in time has its threads' stacks written to its log (SIGUSR1) before
        the kill -9, and the error says where it hung."""
        assert self.process is not None
        if self.alive:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=2)
            self.kill()
            raise AssertionError(
                f"{self.name} did not stop within {timeout} s of SIGTERM; its stacks:\n"
                + self.log()[-6000:]
            ) from None

    def stop(self) -> None:
        """A clean stop (SIGTERM), a kill -9 if it takes over 5 s."""
        if self.alive:
            with contextlib.suppress(Exception):
                self.terminate(timeout=5)
            self.kill()

    def discard(self) -> None:
        """The end of a fixture's server once its test is over: kill -9, at once. Nothing
        checks how it stops (a test that checks a clean stop calls ``terminate`` or
        ``stop`` itself), and a clean stop costs up to seconds per server."""
        self.kill()


def rabbitmqadmin() -> str | None:
    """RabbitMQ's command-line tool: the one on PATH (Debian's rabbitmq-server installs it),
    else the one the set-up fetched from that package (tests/fetch_rabbitmqadmin); None
    where neither is there."""
    fetched = ROOT / "build" / "tools" / "rabbitmqadmin"
    return shutil.which("rabbitmqadmin") or (str(fetched) if os.access(fetched, os.X_OK) else None)


RABBITMQADMIN_MISSING = (
    "rabbitmqadmin is not installed (Debian's rabbitmq-server package has it; "
    "make test's set-up fetches it where apt-get can)"
)


# amqplib (Node.js), for the tests that show what its users read. Installed once with npm
# into var/ (it has no dependencies of its own); tests that need it skip, with the reason,
# where node or the package cannot be had.
AMQPLIB_VERSION = "2.3.1"
NODE_MODULES = ROOT / "var" / "node" / "node_modules"


def amqplib_modules() -> Path | str:
    """The node_modules directory holding amqplib, or why it cannot be had here.

    Test processes running side by side (pytest-xdist workers) install it one at a time: the
    first installs under a lock on var/node, the others wait and then find it there."""
    if shutil.which("node") is None:
        return "node is not installed"
    NODE_MODULES.parent.mkdir(parents=True, exist_ok=True)
    with open(NODE_MODULES.parent / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (NODE_MODULES / "amqplib" / "package.json").exists():
            return NODE_MODULES
        if shutil.which("npm") is None:
            return "npm is not installed, and amqplib is not in var/node"
        return _npm_install_amqplib()


def _npm_install_amqplib() -> Path | str:
    try:
        done = subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(NODE_MODULES.parent),
                "--no-save",
                "--no-package-lock",
                f"amqplib@{AMQPLIB_VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"npm install amqplib@{AMQPLIB_VERSION} failed: {error}"
    if done.returncode != 0 or not (NODE_MODULES / "amqplib").exists():
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        return f"npm install amqplib@{AMQPLIB_VERSION} failed: {tail}"
    return NODE_MODULES


def amqplib_run(modules: Path, script: str, *args: str, timeout: float = 30.0) -> Any:
    """Run a Node.js script with amqplib on its path; it prints one JSON line, returned."""
    done = subprocess.run(
        ["node", "-e", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, NODE_PATH=str(modules)),
    )
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"node printed nothing (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])
