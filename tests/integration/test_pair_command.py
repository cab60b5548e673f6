"""``amqha pair`` (what ``make run`` starts): both servers, their pids, a killed one reported."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from amqha.client import connect
from config.local import FILES
from tests.pairs import MakePair, Pair, pair_info
from tests.support import ROOT

WAIT = 60.0  # seconds for any one line to appear, on a loaded machine


class Output:
    """The command's stdout, read on a thread; ``wait_for`` a pattern, bounded."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self.thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()

    def wait_for(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + WAIT
        with self.changed:
            while True:
                for line in self.lines:
                    if match := re.search(pattern, line):
                        return match
                left = deadline - time.monotonic()
                assert left > 0, f"no line matching {pattern!r} in:\n{''.join(self.lines)}"
                self.changed.wait(min(left, 1.0))


def start_command(pair: Pair) -> tuple[subprocess.Popen[str], Output]:
    """``amqha pair`` on the pair's two config files (neither server started by the test)."""
    for server in pair.servers:
        server.workdir.mkdir(parents=True, exist_ok=True)
        server.config_path.write_text(yaml.safe_dump(server.config))
    process = subprocess.Popen(
        [sys.executable, "-m", "amqha", "pair", "--config-dir", str(pair.workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    output = Output(process)
    return process, output


def serving(pair: Pair, output: Output) -> tuple[int, int]:
    """The two pids the command prints first, once both servers listen."""
    pids = output.wait_for(r"^amqha pair: primary pid (\d+), backup pid (\d+)")
    output.wait_for(rf"^\[primary\] .*listening on {pair.primary.address}")
    output.wait_for(rf"^\[backup \] .*listening on {pair.backup.address}")
    return int(pids.group(1)), int(pids.group(2))


@contextlib.contextmanager
def held(process: subprocess.Popen[str], pid: int) -> Iterator[None]:
    """One of the command's servers stopped (SIGSTOP) for the block. It is let go after,
    unless the command has ended: then it has reaped it, and the pid is no longer its."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if process.poll() is None:
            os.kill(pid, signal.SIGCONT)


def stop_command(process: subprocess.Popen[str]) -> None:
    """SIGTERM first: the command stops its two servers; a kill would leave them running."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=WAIT)


async def test_the_pair_command_names_its_pids_and_reports_a_killed_server(
    make_pair: MakePair,
) -> None:
    pair = make_pair(proxied=False)
    process, output = start_command(pair)
    try:
        primary_pid, _ = serving(pair, output)
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=WAIT)

        os.kill(primary_pid, signal.SIGKILL)  # a child of the command this test started
        ended = output.wait_for(r"^amqha pair: the primary ended \((.+?)\); the backup runs on")
        assert ended.group(1) == "killed by SIGKILL"
        restart = f"amqha start --role primary --config {pair.workdir / 'primary.yaml'}"
        assert restart in ended.string
        connection = await connect([pair.backup.url], retry_for=WAIT)
        async with connection:
            assert pair_info(connection)["name"] == "backup"
        assert process.poll() is None, "the command ended with the backup still running"

        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=WAIT) == 1
        output.thread.join(WAIT)
        last = output.lines[-1]
        assert last == "amqha pair: exit status 1: the primary killed by SIGKILL\n", last
    finally:
        stop_command(process)


def test_a_clean_stop_exits_zero(make_pair: MakePair) -> None:
    pair = make_pair(proxied=False)
    process, output = start_command(pair)
    try:
        primary_pid, backup_pid = serving(pair, output)
        # The backup held back while the command stops: the primary's end, with the backup
        # still there, is part of the stop and not to be reported as a failure.
        with held(process, backup_pid):
            process.send_signal(signal.SIGTERM)
            # Gone from /proc once the command has reaped it, with the backup still held;
            # any report is read below with the rest of the output.
            primary = Path(f"/proc/{primary_pid}")
            deadline = time.monotonic() + WAIT
            while primary.exists():
                assert time.monotonic() < deadline, "the primary was not reaped"
                time.sleep(0.05)
        assert process.wait(timeout=WAIT) == 0
        output.thread.join(WAIT)
        reports = [line for line in output.lines if line.startswith("amqha pair: ")]
        assert len(reports) == 1 and "primary pid" in reports[0], reports
    finally:
        stop_command(process)


def test_a_server_deaf_to_sigterm_is_killed_and_named(make_pair: MakePair) -> None:
    pair = make_pair(proxied=False)
    process, output = start_command(pair)
    try:
        _, backup_pid = serving(pair, output)
        # A stopped process leaves SIGTERM pending: the command waits its 10 s, then kills
        # the backup and reaps it, and says how it ended.
        with held(process, backup_pid):
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=WAIT) == 1
        output.thread.join(WAIT)
        last = output.lines[-1]
        assert last == "amqha pair: exit status 1: the backup killed by SIGKILL\n", last
        assert not Path(f"/proc/{backup_pid}").exists()
    finally:
        stop_command(process)


async def test_the_first_run_on_the_shipped_configs_makes_this_installs_credentials(
    make_pair: MakePair,
) -> None:
    """What `make run` does on a fresh checkout: the shipped configs (on free ports here)
    name a secret and two passwords under local/, which the command makes, 0600, before
    it starts the servers; they serve with them, and a second run keeps them."""
    pair = make_pair(proxied=False)
    shipped = {
        role: yaml.safe_load((ROOT / "config" / f"{role}.yaml").read_text())
        for role in ("primary", "backup")
    }
    for server, role in ((pair.primary, "primary"), (pair.backup, "backup")):
        config = shipped[role]
        config["server"].update(server.config["server"])
        config["failover"]["peer"] = server.config["failover"]["peer"]
        config["failover"]["peer_listen"] = server.config["failover"]["peer_listen"]
        config["events"] = {"path": str(server.data_dir / "events.jsonl")}
        server.config = config
    local = pair.workdir / "local"
    process, output = start_command(pair)
    try:
        made = output.wait_for(r"^amqha pair: made (.+) \(0600, kept out of git\)")
        assert made.group(1).split(", ") == [str(local / name) for name in FILES]
        serving(pair, output)
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=WAIT)
        assert stat.S_IMODE(local.stat().st_mode) == 0o700
        for name in FILES:
            assert stat.S_IMODE((local / name).stat().st_mode) == 0o600
        warnings = [line for line in output.lines if "amqha: WARNING: " in line]
        assert warnings == [], warnings
    finally:
        stop_command(process)
    values = {name: (local / name).read_text() for name in FILES}
    process, output = start_command(pair)
    try:
        serving(pair, output)
        assert not [line for line in output.lines if line.startswith("amqha pair: made")]
    finally:
        stop_command(process)
    assert {name: (local / name).read_text() for name in FILES} == values
