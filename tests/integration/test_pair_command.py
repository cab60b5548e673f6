"""``amqha pair`` (what ``make run`` starts): both servers, their pids, a killed one reported."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from amqha.client import connect
from config.local import FILES
from tests.pairs import MakePair, Pair, hold, pair_info
from tests.support import ROOT, free_port, start_to_exit

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


def start_command(
    pair: Pair, *options: str, sigint_ignored: bool = False
) -> tuple[subprocess.Popen[str], Output]:
    """``amqha pair`` on the pair's two config files (neither server started by the test),
    its pair file in the pair's folder. ``sigint_ignored``: started as a shell script's
    background job is, with SIGINT ignored."""
    for server in pair.servers:
        server.workdir.mkdir(parents=True, exist_ok=True)
        server.config_path.write_text(yaml.safe_dump(server.config))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "amqha",
            "pair",
            "--config-dir",
            str(pair.workdir),
            "--pair-file",
            str(pair.workdir / "pair.json"),
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if sigint_ignored
        else None,
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


async def test_a_server_started_again_by_hand_is_followed_and_stopped_with_the_pair(
    make_pair: MakePair,
) -> None:
    """The restart line the command prints, run by hand: the command follows that server
    (its data dir's lock names it) as its own. With the other server killed too, the
    command runs on and keeps the pair file; Ctrl-C stops the server it follows."""
    pair = make_pair(proxied=False)
    process, output = start_command(pair)
    by_hand: subprocess.Popen[bytes] | None = None
    try:
        primary_pid, backup_pid = serving(pair, output)
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=WAIT)
        os.kill(primary_pid, signal.SIGKILL)
        line = output.wait_for(r"Start the primary again with: (amqha start .*)$")
        words = line.group(1).split()
        by_hand = subprocess.Popen(
            [sys.executable, "-m", "amqha", *words[1:]],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        followed = output.wait_for(r"the primary runs again \(pid (\d+), started by hand\)")
        assert int(followed.group(1)) == by_hand.pid
        await pair.settled(timeout=WAIT)

        os.kill(backup_pid, signal.SIGKILL)
        output.wait_for(r"the backup ended \(killed by SIGKILL\)")
        # A few turns of the command's loop: it must not end while the primary it follows runs.
        await hold(lambda: process.poll() is None, 1.0, "the command running")
        assert (pair.workdir / "pair.json").exists()

        process.send_signal(signal.SIGINT)
        process.wait(timeout=WAIT)
        assert by_hand.wait(timeout=WAIT) == 0  # stopped by SIGTERM, cleanly
        assert not (pair.workdir / "pair.json").exists()
    finally:
        stop_command(process)
        if by_hand is not None and by_hand.poll() is None:
            by_hand.kill()
            by_hand.wait(timeout=WAIT)


def test_a_second_server_on_one_data_dir_is_refused_naming_the_first(
    make_pair: MakePair,
) -> None:
    """Two servers writing one store would corrupt it: the second refuses to start, and
    names the pid that holds the data dir."""
    pair = make_pair(proxied=False)
    server = pair.primary
    server.start()
    refused = start_to_exit(server.config_path, "--role", "primary")
    assert refused.returncode == 1
    assert f"in use by another amqha server (pid {server.process.pid})" in refused.stderr, (
        refused.stderr
    )
    assert server.process.poll() is None  # the first one serves on


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
        # The pids, and the serving line if both listened before the SIGTERM: no report
        # of a server's end.
        reports = [
            line
            for line in output.lines
            if line.startswith("amqha pair: ")
            and not line.startswith(("amqha pair: serving:", "amqha pair: the pair's page:"))
        ]
        assert len(reports) == 1 and "primary pid" in reports[0], reports
    finally:
        stop_command(process)


def test_ctrl_c_stops_a_command_started_with_sigint_ignored(make_pair: MakePair) -> None:
    """A script's background job inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt: the command handles SIGINT itself, stops both servers and exits 0."""
    pair = make_pair(proxied=False)
    process, output = start_command(pair, sigint_ignored=True)
    try:
        primary_pid, backup_pid = serving(pair, output)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=WAIT) == 0
        for pid in (primary_pid, backup_pid):
            assert not Path(f"/proc/{pid}").exists(), f"server {pid} still runs"
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


# -- ports: from the command line, free ones for taken ones, a server that cannot listen ----


def console_status(pair: Pair) -> subprocess.CompletedProcess[str]:
    """``amqha console status`` with no --server: the servers the pair file names, as admin
    with the password under the pair's config folder."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "amqha",
            "console",
            "--pair-file",
            str(pair.workdir / "pair.json"),
            "status",
        ],
        capture_output=True,
        text=True,
        timeout=WAIT,
        cwd=ROOT,
    )


def healthy_status(pair: Pair) -> subprocess.CompletedProcess[str]:
    """The console's status once it says healthy (exit 0), at most WAIT s."""
    deadline = time.monotonic() + WAIT
    while True:
        status = console_status(pair)
        if status.returncode == 0:
            return status
        assert time.monotonic() < deadline, status.stdout + status.stderr
        time.sleep(0.2)


def admin_password_for_the_console(pair: Pair) -> None:
    """The test configs give admin a plain password; the console reads it where `make run`
    keeps it."""
    local = pair.workdir / "local"
    local.mkdir(parents=True, exist_ok=True)
    (local / "admin.password").write_text("admin\n")


@contextlib.contextmanager
def occupied(port: int) -> Iterator[socket.socket]:
    """Something else listening on ``port`` for the block."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield sock


def test_ports_from_the_command_line_move_every_listener_and_the_console_finds_them(
    make_pair: MakePair,
) -> None:
    pair = make_pair(proxied=False)
    admin_password_for_the_console(pair)
    metrics = {}
    for server in pair.servers:
        metrics[server.name] = free_port()
        server.config["metrics"] = {"listen": f"127.0.0.1:{metrics[server.name]}"}
        server.config["management"] = {"listen": f"127.0.0.1:{free_port()}"}
    first, second = free_port(), free_port()
    page_ports = (free_port(), free_port())
    process, output = start_command(
        pair, "--ports", f"{first},{second}", "--page-ports", "{},{}".format(*page_ports)
    )
    try:
        serving = output.wait_for(r"^amqha pair: serving: (.*)$")
        assert serving.group(1) == (
            f"primary 127.0.0.1:{first}, backup 127.0.0.1:{second}; the console finds them"
            f" in {pair.workdir / 'pair.json'}: amqha console status --pair-file"
            f" {pair.workdir / 'pair.json'}"
        )
        # The pages where --page-ports put them, whatever --ports did: said, and there.
        pages = output.wait_for(r"^amqha pair: the pair's page: primary (\S+), backup (\S+)$")
        assert pages.groups() == tuple(f"http://127.0.0.1:{port}/" for port in page_ports)
        for url in pages.groups():
            with urllib.request.urlopen(url, timeout=WAIT) as page:
                assert b"<html" in page.read().lower()
        # The metrics listeners moved with them: by the same offset, or to a free port.
        for role, port in (("primary", first), ("backup", second)):
            line = output.wait_for(rf"^\[{role:7}\] .*metrics on http://127\.0\.0\.1:(\d+)/metrics")
            moved = int(line.group(1))
            shift = port - (pair.primary if role == "primary" else pair.backup).port
            assert moved != metrics[role]
            if moved != metrics[role] + shift:
                assert output.wait_for(rf"^amqha pair: {role}'s metrics\.listen cannot follow")
            with urllib.request.urlopen(f"http://127.0.0.1:{moved}/metrics", timeout=WAIT) as page:
                assert b"amqha_pair_state" in page.read()
        status = healthy_status(pair)
        rows = [line.split() for line in status.stdout.splitlines()]
        assert [row[:4] for row in rows[1:3]] == [
            [f"127.0.0.1:{first}", "primary", "primary", "ACTIVE"],
            [f"127.0.0.1:{second}", "backup", "backup", "PASSIVE"],
        ]
        assert status.stdout.splitlines()[-1] == "pair: healthy: one ACTIVE, its PASSIVE in sync"
    finally:
        stop_command(process)
    assert process.returncode == 0
    assert not (pair.workdir / "pair.json").exists()  # the addresses went with the servers


def test_a_taken_port_is_replaced_by_a_free_one_and_said(make_pair: MakePair) -> None:
    pair = make_pair(proxied=False)
    admin_password_for_the_console(pair)
    taken = pair.primary.port
    with occupied(taken):
        process, output = start_command(pair)
        try:
            moved = output.wait_for(
                rf"^amqha pair: 127\.0\.0\.1:{taken} \(primary's server\.listen\) is taken:"
                r" using 127\.0\.0\.1:(\d+) instead$"
            )
            port = int(moved.group(1))
            output.wait_for(
                rf"^amqha pair: serving: primary 127\.0\.0\.1:{port}, backup {pair.backup.address};"
            )
            status = healthy_status(pair)
            assert (
                f"127.0.0.1:{port}" in status.stdout and f"127.0.0.1:{taken}" not in status.stdout
            )
        finally:
            stop_command(process)
    assert process.returncode == 0


def test_a_server_that_cannot_listen_stops_the_command_with_its_reason(
    make_pair: MakePair,
) -> None:
    """Named ports are taken as given: the server that cannot listen on its port ends the
    command, which stops the other; no pair is left with one server."""
    pair = make_pair(proxied=False)
    first, second = free_port(), free_port()
    with occupied(first):
        process, output = start_command(pair, "--ports", f"{first},{second}")
        try:
            _, backup_pid = (
                int(pid)
                for pid in output.wait_for(
                    r"^amqha pair: primary pid (\d+), backup pid (\d+)"
                ).groups()
            )
            assert process.wait(timeout=WAIT) == 1
        finally:
            stop_command(process)
    output.thread.join(WAIT)
    reports = [line for line in output.lines if line.startswith("amqha pair: ")]
    assert reports[1:] == [
        f"amqha pair: the primary could not start (Error: cannot listen on 127.0.0.1:{first}:"
        " address already in use); stopping the backup\n",
        "amqha pair: exit status 1: the primary exited with status 1\n",
    ], reports
    assert not Path(f"/proc/{backup_pid}").exists()
    assert not (pair.workdir / "pair.json").exists()


def test_bad_ports_are_a_usage_error(make_pair: MakePair) -> None:
    pair = make_pair(proxied=False)
    for ports, problem in (
        ("5672", "expected PRIMARY,BACKUP as two port numbers, got '5672'"),
        ("5672,5672", "the two servers need two ports, got 5672 twice"),
        ("0,70000", "port 0 is out of range 1..65535"),
    ):
        process, output = start_command(pair, "--ports", ports)
        assert process.wait(timeout=WAIT) == 2
        output.thread.join(WAIT)
        text = "".join(output.lines)
        assert f"Error: Invalid value for --ports: {problem}" in text, text
        assert "Traceback" not in text


def test_a_second_pair_on_the_same_folders_is_refused_while_the_first_runs(
    make_pair: MakePair,
) -> None:
    """The pair file names the command that wrote it: while that process lives, another
    pair would share its data dirs, and is refused; a file left by one that is gone is not
    in the way."""
    pair = make_pair(proxied=False)
    pair_file = pair.workdir / "pair.json"
    pair.workdir.mkdir(parents=True, exist_ok=True)
    # A live process that does nothing until killed (its stdin stays open: read blocks).
    running = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        pair_file.write_text(json.dumps({"servers": [], "config_dir": "x", "pid": running.pid}))
        process, output = start_command(pair)
        assert process.wait(timeout=WAIT) == 1
        output.thread.join(WAIT)
        assert "".join(output.lines) == (
            f"Error: a pair started here runs already (amqha pair, pid {running.pid}; its"
            f" servers are in {pair_file}): stop it first (its servers use the same data"
            " dirs), or use `amqha console` on it\n"
        )
    finally:
        running.kill()
        running.wait(WAIT)
        running.stdin.close()  # type: ignore[union-attr]
    process, output = start_command(pair)
    try:
        serving(pair, output)
    finally:
        stop_command(process)
    assert process.returncode == 0
