"""Test hosts for a pair: each server on a host of its own (a network namespace of
tests/netns.py), the clients on the bridge between them, and optionally a witness host.

Owns: the ``Site`` (the network, the two server hosts, the pair on them, a witness and
relay processes on hosts of their own) and the strong per-run users a server off loopback
requires. Used by ``make partitions`` (tests/partitions) and ``make nemesis``
(bench/nemesis.py). Must not know: which faults a caller makes, or what it checks.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests import netns
from tests.pairs import PAIR_SECRET, Pair
from tests.support import ROOT, free_port

HEARTBEAT, TIMEOUT = 0.2, 0.6  # the shipped timings


def strong_users() -> list[dict[str, Any]]:
    """Off loopback a server refuses shipped passwords: these are made per test."""
    word = secrets.token_hex(8)
    return [
        {"name": "app", "password": f"app-{word}", "vhosts": ["/"]},
        {"name": "admin", "password": f"admin-{word}", "vhosts": ["/"], "tags": ["administrator"]},
        {"name": "peering", "password": f"peering-{word}", "vhosts": ["/"], "tags": ["peering"]},
    ]


class Site:
    """The network, its two server hosts and the pair on them; with ``witness``, a third
    host running ``amqha witness`` that both servers name."""

    def __init__(self, workdir: Path, witness: bool = False, relay_delay: float = 0.0) -> None:
        self.net = netns.Network()
        self.witness: subprocess.Popen[bytes] | None = None
        self.helpers: list[subprocess.Popen[bytes]] = []  # witness and relays
        try:
            self.a = self.net.add("primary")
            self.b = self.net.add("backup")
            extra: dict[str, Any] = {}
            if witness:
                self.w = self.net.add("witness")
                extra["witness"] = [self._start_witness(workdir)]
            self.pair = Pair(
                workdir,
                heartbeat=HEARTBEAT,
                timeout=TIMEOUT,
                proxied=False,
                hosts=(self.a.address, self.b.address),
                prefixes=(self.a.prefix, self.b.prefix),
                client="app",
                users=strong_users(),
                failover_extra=extra,
            )
            if relay_delay:
                self._relay(workdir, relay_delay)
        except Exception:
            self.stop_helpers()
            self.net.close()
            raise

    def _spawn(self, host: netns.Host, log_path: Path, *command: str) -> subprocess.Popen[bytes]:
        """A helper process on ``host``, once it says it listens (at most 30 s)."""
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [*host.prefix, sys.executable, "-m", *command],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        self.helpers.append(process)
        deadline = time.monotonic() + 30
        while "listening on" not in log_path.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} did not start: {log_path.read_text()}")
            time.sleep(0.05)
        return process

    def _start_witness(self, workdir: Path) -> str:
        workdir.mkdir(parents=True, exist_ok=True)
        secret = workdir / "witness-secret"
        secret.write_text(PAIR_SECRET)
        address = f"{self.w.address}:{free_port()}"
        self.witness_command = (
            "amqha",
            "witness",
            "--listen",
            address,
            "--secret-file",
            str(secret),
        )
        self.witness_logs = workdir
        self.witness = self._spawn(self.w, workdir / "witness.log", *self.witness_command)
        return address

    def restart_witness(self) -> None:
        """The witness started again at its address (after a kill), logging to a new file."""
        number = sum(1 for _ in self.witness_logs.glob("witness*.log")) + 1
        log = self.witness_logs / f"witness-{number}.log"
        self.witness = self._spawn(self.w, log, *self.witness_command)

    def _relay(self, workdir: Path, delay: float) -> None:
        """The peer links (peering and replication) through a host of their own, where a
        proxy process delays every chunk: each server's failover.peer names the relay."""
        self.r = self.net.add("relay")
        workdir.mkdir(parents=True, exist_ok=True)
        for server in self.pair.servers:
            other = self.pair.other(server)
            listen = f"{self.r.address}:{free_port()}"
            self._spawn(
                self.r,
                workdir / f"relay-to-{other.name}.log",
                *("tests.proxy", listen, other.address, "--delay", str(delay)),
            )
            server.config["failover"] = {**server.config["failover"], "peer": listen}

    def stop_helpers(self) -> None:
        """The witness and relay processes, by their pids."""
        for process in self.helpers:
            if process.poll() is not None:
                continue
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)

    def close(self, show_logs: bool = True) -> None:
        """Stop everything and remove the network; ``show_logs``: print each server's log
        tail and event log first (pytest shows them when a test failed)."""
        try:
            self.stop_helpers()
            self.pair.stop()
            for server in self.pair.servers if show_logs else ():
                print(f"--- {server.name} log (tail) ---")
                print("\n".join(server.log().splitlines()[-40:]))
                print(f"--- {server.name} events ---")
                for record in self.pair.events(server)[-60:]:
                    print(record)
        finally:
            self.net.close()
