"""The ``amqha`` command line: start a server, run the loopback pair, the console, the report."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import click

from config import ConfigError, load_config
from config.schema import format_host_port
from failover.epoch import EpochFileError
from failover.maintenance import MaintenanceFileError

from .ports import PAIR_FILE


class _Commands(click.Group):
    """Loads ``report`` (the Spark side) and ``console`` (an AMQP client) only when asked
    for: a server never imports them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), "console", "report"})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "report":
            from spark.cli import report

            return report
        if name == "console":
            from .console_cli import console

            return console
        return super().get_command(ctx, name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="amqha")
def main() -> None:
    """amqha: an AMQP 0-9-1 broker that runs as a primary/backup high-availability pair.

    \b
    Start the loopback pair:   make run   (or: amqha pair --config-dir config)
    One server:                amqha start --config config/primary.yaml
    A password hash:           amqha passwd
    A witness for a pair:      amqha witness --listen HOST:PORT --secret-file FILE
    """


@main.command()
@click.option(
    "--role",
    type=click.Choice(["primary", "backup"]),
    help="Failover role (overrides failover.role).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="YAML config file (default: config/<role>.yaml).",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--no-uvloop", is_flag=True, help="Use the standard asyncio loop even if uvloop is installed."
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Replace one key of the config file, e.g. --set server.listen=127.0.0.1:6000 (VALUE"
    " is YAML; `amqha pair` moves ports with it).",
)
def start(
    role: str | None,
    config_path: str | None,
    log_level: str,
    no_uvloop: bool,
    settings: tuple[str, ...],
) -> None:
    """Start one broker and serve until SIGTERM or Ctrl-C."""
    from .ports import MetricsListenError
    from .server import install_uvloop, serve
    from .store_file import StoreError

    # Everything a server writes (store, event log, epoch, quarantine) is its user's
    # alone; the modules that make those files say so too, this covers any other.
    os.umask(0o077)
    # SIGUSR1: every thread's stack to stderr, for a server that will not stop or answer
    # (docs/operations.md, "A server that hangs"); the server goes on as before.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if config_path is None:
        if role is None:
            raise click.UsageError("give --config FILE, or --role to use config/<role>.yaml")
        config_path = f"config/{role}.yaml"
    try:
        config = load_config(config_path, role=role, overrides=_settings(settings))
    except ConfigError as error:
        raise click.ClickException(f"bad configuration: {error}") from None
    from .datadir import DataDirInUse, take

    try:
        _held = take(config.data_dir)  # for as long as this process runs
    except DataDirInUse as error:
        raise click.ClickException(f"cannot start: {error}") from None
    for line in config.weak_credentials:
        click.echo(
            f"amqha: WARNING: {line}; accepted only because every listener is loopback",
            err=True,
        )
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s {config.name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not no_uvloop:
        install_uvloop()
    pair = None
    if config.failover.role is not None and config.failover.peer is not None:
        from failover.controller import FailoverController

        pair = FailoverController
    try:
        asyncio.run(serve(config, pair=pair))
    except EpochFileError as error:
        raise click.ClickException(f"bad epoch file: {error}") from None
    except MaintenanceFileError as error:
        raise click.ClickException(f"bad maintenance file: {error}") from None
    except ConfigError as error:  # data_dir/federations.json, federation.id (federation.md)
        raise click.ClickException(f"cannot start: {error}") from None
    except StoreError as error:
        raise click.ClickException(f"cannot open the message store: {error}") from None
    except MetricsListenError as error:
        raise click.ClickException(f"{config_path}: metrics.listen: {error}") from None
    except OSError as error:
        raise click.ClickException(_listen_failure(config, error)) from None


def _settings(settings: tuple[str, ...]) -> dict[str, Any]:
    """``--set KEY=VALUE`` options as overrides; VALUE is read as YAML."""
    import yaml

    overrides: dict[str, Any] = {}
    for setting in settings:
        key, sign, text = setting.partition("=")
        if not sign or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {setting!r}", param_hint="--set")
        try:
            overrides[key.strip()] = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise click.BadParameter(
                f"{key}: not a YAML value: {getattr(error, 'problem', error)}", param_hint="--set"
            ) from None
    return overrides


def _listen_failure(config: Any, error: OSError) -> str:
    """Why a server cannot listen, naming the address that failed (AMQP, amqps, metrics:
    the error says which one), in one line."""
    text = error.strerror or str(error)
    bound = re.search(r"bind on address \('?\[?([^',\]]+)\]?'?, (\d+)[^)]*\): (.+)", text)
    if bound:
        host, port, reason = bound.groups()
        return f"cannot listen on {format_host_port(host, int(port))}: {reason}"
    where = config.listen if config.tls is None else f"{config.listen} or {config.tls.listen}"
    return f"cannot listen on {where}: {text}"


@main.command()
@click.option(
    "--listen",
    required=True,
    metavar="HOST:PORT",
    help="UDP address to answer on (the servers' failover.witness names it).",
)
@click.option(
    "--secret-file",
    required=True,
    type=click.Path(dir_okay=False),
    help="A file holding the pair's shared secret (the servers' failover.secret).",
)
def witness(listen: str, secret_file: str) -> None:
    """Run a witness for a pair: the third party that tells a dead server from a cut link.

    Each server of a pair whose failover.witness names this address pings it every
    heartbeat; it answers how long ago it heard the other one. A PASSIVE takes over only if
    a majority of its witnesses has not heard the ACTIVE for twice the timeout, and an
    ACTIVE that loses both its peer and its witnesses stops confirming (docs/failover.md).
    """
    from config.reading import parse_host_port
    from failover.witness_net import serve_witness

    try:
        host, port = parse_host_port("--listen", "--listen", listen)
    except ConfigError as error:
        raise click.BadParameter(error.problem, param_hint="--listen") from None
    try:
        secret = Path(secret_file).read_text().rstrip("\n").encode()
    except OSError as error:
        raise click.BadParameter(
            f"{secret_file}: {error.strerror}", param_hint="--secret-file"
        ) from None
    if not secret:
        raise click.BadParameter(f"{secret_file} is empty", param_hint="--secret-file")
    logging.basicConfig(level="INFO", format="%(asctime)s witness %(levelname)s: %(message)s")
    try:
        asyncio.run(serve_witness(host, port, secret))
    except OSError as error:
        raise click.ClickException(f"cannot listen on {listen}: {error.strerror}") from None


@main.command()
@click.option(
    "--config-dir",
    type=click.Path(file_okay=False, exists=True),
    default="config",
    show_default=True,
    help="Folder holding primary.yaml and backup.yaml.",
)
@click.option(
    "--ports",
    metavar="PRIMARY,BACKUP",
    default=None,
    help="The two servers' AMQP ports (their other listeners move by the same offset);"
    " default: the configs' own, any that is taken replaced by a free one.",
)
@click.option(
    "--page-ports",
    metavar="PRIMARY,BACKUP",
    default=None,
    help="The two servers' web page and management API ports (management.listen), "
    "whatever --ports does to the others; each page's link to the other follows.",
)
@click.option(
    "--pair-file",
    default=PAIR_FILE,
    show_default=True,
    metavar="FILE",
    help="Where to write the servers' addresses for `amqha console` (removed at the end).",
)
def pair(config_dir: str, ports: str | None, page_ports: str | None, pair_file: str) -> None:
    """Run the primary and the backup together on this machine; Ctrl-C stops both.

    The first run makes the files under CONFIG_DIR/local/ (0700) that the configs read
    (the shipped ones: the pair's secret and the admin and peering passwords), 0600
    each: nothing secret is shipped, and `amqha console` finds the admin password there.

    Ports: --ports PRIMARY,BACKUP puts the two AMQP listeners there and moves every other
    `listen` of the configs (tls, metrics...) by the same offset; --page-ports
    PRIMARY,BACKUP puts the web pages (management.listen) where you choose instead.
    Without them, a port that is taken is replaced by a free one, and each move is
    printed. Either way the servers'
    addresses are written to PAIR_FILE, where `amqha console` finds them.

    Each server's log lines are prefixed with its name. The two pids come first: kill -9
    the ACTIVE one to watch the other take over. A server that cannot start (a port it
    cannot listen on, a bad store) stops the command with its reason and exit status 1:
    a pair is never left with one server. A server that ends later is reported (how, and
    the command that starts it again) while the other runs on; started again with that
    command, by hand, it is followed as if it were its own (found by its data dir's lock):
    the command runs, and keeps PAIR_FILE, while any of its servers does, and Ctrl-C stops
    them all. The exit status is 1 if a server it started ended other than by Ctrl-C or
    SIGTERM.
    """
    from config.local import ensure_credentials, named_in

    from . import ports as pair_ports

    wanted = None
    if ports is not None:
        try:
            wanted = pair_ports.parse_ports(ports)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--ports") from None
    chosen = {}
    if page_ports is not None:
        try:
            chosen[pair_ports.PAGE] = pair_ports.parse_ports(page_ports)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--page-ports") from None
        if wanted is not None and set(wanted) & set(chosen[pair_ports.PAGE]):
            raise click.BadParameter(
                f"{page_ports} takes a port --ports gives the AMQP listeners",
                param_hint="--page-ports",
            )
    running = _running_pair(pair_file)
    if running is not None:
        raise click.ClickException(
            f"a pair started here runs already (amqha pair, pid {running}; its servers are in"
            f" {pair_file}): stop it first (its servers use the same data dirs), or use"
            " `amqha console` on it"
        )
    paths = {role: Path(config_dir) / f"{role}.yaml" for role in ("primary", "backup")}
    made = ensure_credentials(config_dir, named_in(paths.values()))
    if made:
        _say(
            f"made {', '.join(str(path) for path in made)} (0600, kept out of git): this"
            " install's own pair secret and passwords, which the configs read"
        )
    for role, path in paths.items():
        try:
            load_config(path, role=role)  # the file as it is first: its own errors named
        except ConfigError as error:
            raise click.ClickException(f"bad configuration: {error}") from None
    plan = pair_ports.plan(
        {role: _yaml(path) for role, path in paths.items()}, wanted, chosen=chosen
    )
    for note in plan.notes:
        _say(note)
    commands: dict[str, list[str]] = {}
    data_dirs: dict[str, str] = {}
    pages: dict[str, str] = {}  # each server's web page, where it has one
    for role, path in paths.items():
        overrides = plan.overrides[role]
        try:
            config = load_config(path, role=role, overrides=overrides)
        except ConfigError as error:
            raise click.ClickException(f"bad configuration: {error}") from None
        data_dirs[role] = config.data_dir
        if config.management is not None:
            scheme = "https" if config.management.tls else "http"
            pages[role] = (
                f"{scheme}://{format_host_port(config.management.host, config.management.port)}/"
            )
        commands[role] = [
            "start",
            "--role",
            role,
            "--config",
            str(path),
            *pair_ports.set_arguments(overrides),
        ]
    roles: dict[str, subprocess.Popen[bytes]] = {}
    relays: dict[str, _Relay] = {}
    for role in ("primary", "backup"):
        process = subprocess.Popen(
            [sys.executable, "-m", "amqha", *commands[role]],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        roles[role] = process
        relays[role] = _Relay(role, process)
    _say(f"primary pid {roles['primary'].pid}, backup pid {roles['backup'].pid}; Ctrl-C stops both")

    stopping = threading.Event()  # set by SIGINT or SIGTERM: the servers' endings are expected
    # A server started again by hand with the line printed for it: role -> its pid.
    adopted: dict[str, int] = {}

    def stop(*_: object) -> None:
        if stopping.is_set():
            return  # each server is sent one SIGTERM: a second, late in its stop, kills it
        stopping.set()
        # Ctrl-C reaches the whole process group, some shells or tools send it twice: the
        # servers have theirs, and this command must get through its stop and clean up.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for process in roles.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for pid in adopted.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    # SIGINT is handled here, not left to Python's KeyboardInterrupt: a command started in
    # the background by a script inherits SIGINT ignored (the shell does that), and Python
    # then never raises it; and an exception raised wherever the signal lands could skip
    # the stop. The handler only sets the flag and signals the servers; the loop below
    # sees the flag within one turn.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    written = False
    failed_start: str | None = None
    # Runs while either server lives: killing one to watch the other take over is the point.
    # A SIGTERM ends it too; the servers are then given 10 s each below.
    ended: set[str] = set()
    try:
        # Each server polled every turn: its end is reported the turn it is seen.
        while not stopping.is_set() and (
            any([p.poll() is None for p in roles.values()]) or adopted
        ):
            serving = all(relay.listening.is_set() for relay in relays.values())
            if serving and not written:
                written = _write_pair_file(pair_file, config_dir, plan.main)
                where = ", ".join(f"{role} {address}" for role, address in plan.main.items())
                console = "amqha console status" + (
                    "" if pair_file == PAIR_FILE else f" --pair-file {pair_file}"
                )
                _say(f"serving: {where}; the console finds them in {pair_file}: {console}")
                if pages:
                    _say("the pair's page: " + ", ".join(f"{r} {u}" for r, u in pages.items()))
            for role, process in roles.items():
                if role in ended or process.returncode is None:
                    continue
                ended.add(role)
                other = "backup" if role == "primary" else "primary"
                if not relays[role].listening.is_set():
                    # It never served: the pair must not run on as one server.
                    relays[role].done.wait(5)
                    failed_start = (
                        f"the {role} could not start ({relays[role].last or _ending(process.returncode)});"
                        f" stopping the {other}"
                    )
                    _say(failed_start)
                    stop()
                    break
                again = " ".join(["amqha", *commands[role]])
                _say(
                    f"the {role} ended ({_ending(process.returncode)}); the {other} runs"
                    f" on. Start the {role} again with: {again}"
                )
            if failed_start is None:
                _follow_restarted(ended, adopted, data_dirs, commands)
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    stop()
    for process in roles.values():
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()  # deaf to SIGTERM for 10 s: killed, and reaped to say so
            process.wait()
    for role, pid in adopted.items():
        _stop_adopted(role, pid, data_dirs[role])
    if written:
        _remove_pair_file(pair_file)
    clean = {0, -signal.SIGTERM, -signal.SIGINT}
    failed = [
        f"the {role} {_ending(p.returncode)}"
        for role, p in roles.items()
        if p.returncode not in clean
    ]
    if failed_start is not None and not failed:
        failed = [failed_start.split(";")[0]]
    if failed:
        _say(f"exit status 1: {', '.join(failed)}")
    sys.exit(1 if failed else 0)


def _follow_restarted(
    ended: set[str],
    adopted: dict[str, int],
    data_dirs: dict[str, str],
    commands: dict[str, list[str]],
) -> None:
    """A server of the pair that ended and was started again by hand (its data dir's
    lock names it) is followed from then on; one followed that ends is reported as ours
    are, with the line that starts it again."""
    from .datadir import holder

    for role in sorted(ended):
        pid = holder(data_dirs[role])
        known = adopted.get(role)
        if known is not None and pid != known:
            del adopted[role]
            other = "backup" if role == "primary" else "primary"
            again = " ".join(["amqha", *commands[role]])
            _say(
                f"the {role} (pid {known}, started by hand) ended; the {other} runs on."
                f" Start the {role} again with: {again}"
            )
            known = None
        if known is None and pid is not None:
            adopted[role] = pid
            _say(
                f"the {role} runs again (pid {pid}, started by hand): followed from now on;"
                " Ctrl-C stops it with the rest"
            )


def _stop_adopted(role: str, pid: int, data_dir: str) -> None:
    """A followed server, sent SIGTERM by ``stop``: given 10 s, then killed."""
    from .datadir import holder

    deadline = time.monotonic() + 10
    while holder(data_dir) == pid and time.monotonic() < deadline:
        time.sleep(0.05)
    if holder(data_dir) == pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _say(f"the {role} (pid {pid}) did not stop within 10 s of SIGTERM: killed")


def _yaml(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text())


def _write_pair_file(path: str, config_dir: str, servers: dict[str, str]) -> bool:
    """The servers' addresses for `amqha console`, and the folder of their configs (where
    the admin password is); written whole (beside it, then renamed)."""
    import json

    target = Path(path)
    data = {
        "servers": [servers[role] for role in ("primary", "backup") if role in servers],
        "config_dir": str(Path(config_dir).resolve()),
        "pid": os.getpid(),
    }
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(data) + "\n")
        os.replace(partial, target)
    except OSError as error:
        _say(f"cannot write {path} ({error.strerror}): give the console --server HOST:PORT")
        return False
    return True


def _running_pair(path: str) -> int | None:
    """The pid of the `amqha pair` that wrote PATH, if that process still runs."""
    from .console import read_pair_file

    data = read_pair_file(path)
    pid = data.get("pid") if data is not None else None
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # a file left by a pair that did not stop cleanly
    except PermissionError:
        pass  # another user's process: it runs
    return pid


def _remove_pair_file(path: str) -> None:
    """Remove the pair file if it is still this command's (another may have replaced it)."""
    from .console import read_pair_file

    data = read_pair_file(path)
    if data is not None and data.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            os.remove(path)


def _say(text: str) -> None:
    sys.stdout.write(f"amqha pair: {text}\n")
    sys.stdout.flush()


def _ending(code: int) -> str:
    """How a server process ended, in words: 'exited with status 2', 'killed by SIGKILL'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class _Relay:
    """Copies a server's output to ours, each line prefixed with its name, on a thread;
    notes when the server says it listens, and keeps its last line (the reason, when it
    could not start)."""

    def __init__(self, name: str, process: subprocess.Popen[bytes]) -> None:
        self.name = name
        self.listening = threading.Event()
        self.done = threading.Event()
        self.last: str | None = None
        threading.Thread(target=self._run, args=(process,), daemon=True).start()

    def _run(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        try:
            for raw in process.stdout:
                line = raw.decode(errors="replace")
                sys.stdout.write(f"[{self.name:7}] {line}")
                sys.stdout.flush()
                if line.strip():
                    self.last = line.strip()
                if " listening on " in line and line.startswith("amqha "):
                    self.listening.set()
        finally:
            self.done.set()


@main.command()
@click.option(
    "--scheme",
    type=click.Choice(["scrypt", "rabbitmq-sha256", "rabbitmq-sha512"]),
    default="scrypt",
    show_default=True,
    help="scrypt is the strong one; the RabbitMQ hashes are for sharing a user with RabbitMQ.",
)
@click.option(
    "--stdin", "from_stdin", is_flag=True, help="Read the password from the first line of stdin."
)
def passwd(scheme: str, from_stdin: bool) -> None:
    """Print a salted hash of a password, for a user's password_hash in the config.

    \b
    Asks for the password twice (nothing is echoed), or reads it with --stdin:
      amqha passwd
      printf '%s\\n' "$PASSWORD" | amqha passwd --stdin
    """
    from config.passwords import hash_password

    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.ClickException("an empty password is not accepted")
    click.echo(hash_password(password, scheme))


@main.group()
def quarantine() -> None:
    """Messages a server kept aside before taking its peer's state (docs/durability.md).

    \b
    A server about to take its peer's state writes the messages its peer never had
    (accepted while no in-sync passive held them, or on a queue left out of
    replication) to DATA_DIR/quarantine/*.sqlite first and records a `quarantine`
    event. List them, then replay them onto the ACTIVE (a queue it lacks is named:
    declare it first):
      amqha quarantine list var/primary
      amqha quarantine replay var/primary/quarantine/FILE.sqlite --url amqp://...
    """


@quarantine.command("list")
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
def quarantine_list(data_dir: str) -> None:
    """The quarantine files of a server's data dir, with their message counts."""
    from .quarantine import read_quarantine, replayed_count

    files = sorted(Path(data_dir, "quarantine").glob("*.sqlite*"))
    if not files:
        click.echo(f"no quarantine files in {data_dir}")
        return
    for path in files:
        try:
            rows = read_quarantine(str(path))
            replayed = replayed_count(str(path))
        except Exception as error:  # a file this command cannot read is named, not fatal
            click.echo(f"{path}: unreadable ({error})")
            continue
        queues = sorted({f"{vhost}/{queue}" for vhost, queue, *_ in rows})
        if path.suffix == ".replayed":
            state = "replayed"
        elif replayed:
            state = f"{replayed} replayed, {len(rows) - replayed} to replay"
        else:
            state = "to replay"
        click.echo(f"{path}: {len(rows)} messages on {', '.join(queues)} ({state})")


@quarantine.command("replay")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--url", required=True, help="The ACTIVE server (amqp://user:password@host:port/).")
def quarantine_replay(path: str, url: str) -> None:
    """Publish a quarantine file's messages to their queues on URL, with confirms.

    Each message goes to the queue it was on (the default exchange), with its own
    properties, but a user_id other than URL's user: the server takes a publish whose
    user_id is the login's only, so it is removed, and the command says from how many
    messages (replay as that user to keep it). Each message is marked replayed in the
    file as its confirm arrives: a replay that stops says how many are done and left, and
    running it again publishes only those. The file is renamed to FILE.replayed once
    every message is confirmed.
    """
    from .quarantine import ReplayProgress

    if path.endswith(".replayed"):
        raise click.ClickException(f"{path} was replayed already")
    progress = ReplayProgress(path)
    try:
        total, rows = progress.total(), progress.left()
        outcome = asyncio.run(_replay(rows, url, progress))
    finally:
        progress.close()
    for user_id, count in sorted(outcome.stripped.items()):
        click.echo(
            f"user_id {user_id!r} removed from {count} messages: the server takes only the"
            f" login's own ({outcome.login!r}); replay as {user_id!r} to keep it"
        )
    done = total - len(rows) + outcome.confirmed
    if outcome.failure is not None:
        raise click.ClickException(
            f"replay stopped: {outcome.failure}; {done} of {total} messages are replayed"
            f" ({outcome.confirmed} in this run), {total - done} left: run the same command"
            " again to publish only those"
        )
    os.replace(path, path + ".replayed")
    earlier = f" ({total - len(rows)} replayed before)" if len(rows) < total else ""
    click.echo(
        f"replayed {outcome.confirmed} messages to {len(set(r[:2] for r in rows))} queues" + earlier
    )


REPLAY_WINDOW = 256  # publishes in flight at once; their confirms are recorded together


class _ReplayOutcome:
    def __init__(self, login: str) -> None:
        self.login = login
        self.confirmed = 0
        self.stripped: dict[str, int] = {}  # user_id -> confirmed messages it was removed from
        self.failure: str | None = None


async def _replay(rows: list[Any], url: str, progress: Any) -> _ReplayOutcome:
    import aiormq
    from pamqp import commands

    from .wire import decode_properties

    outcome = _ReplayOutcome(unquote(urlsplit(url).username or "guest"))
    connections: dict[str, Any] = {}
    try:
        for vhost in dict.fromkeys(row[0] for row in rows):
            connection = await aiormq.connect(url.rstrip("/") + "/" + quote(vhost, safe=""))
            connections[vhost] = (connection, await connection.channel())
        # Every queue first: one that is not there (a queue left out of replication never
        # reached the ACTIVE) would drop its messages unrouted.
        missing = []
        for vhost, queue in dict.fromkeys(row[:2] for row in rows):
            probe = await connections[vhost][0].channel()
            try:
                await probe.queue_declare(queue, passive=True)
                await probe.close()
            except aiormq.exceptions.ChannelNotFoundEntity:
                missing.append(f"'{queue}' in vhost '{vhost}'")
        if missing:
            raise click.ClickException(
                f"no queue {', '.join(missing)} on the server: declare it as it was, then "
                "replay again (nothing was published)"
            )

        def publish(row: Any) -> tuple[Any, str | None]:
            vhost, queue, _msg_id, _address, header, body = row
            properties = decode_properties(header)
            stripped = properties.user_id
            if stripped is None or stripped == outcome.login:
                stripped = None
            else:
                properties.user_id = None
            sent = connections[vhost][1].basic_publish(
                body, routing_key=queue, properties=properties, mandatory=True
            )
            return sent, stripped

        for start in range(0, len(rows), REPLAY_WINDOW):
            window = rows[start : start + REPLAY_WINDOW]
            published = [publish(row) for row in window]
            answers = await asyncio.gather(*(sent for sent, _ in published), return_exceptions=True)
            acked = []
            for row, (_, stripped), answer in zip(window, published, answers, strict=True):
                if isinstance(answer, commands.Basic.Ack):
                    acked.append(row)
                    if stripped is not None:
                        outcome.stripped[stripped] = outcome.stripped.get(stripped, 0) + 1
                elif outcome.failure is None:
                    outcome.failure = _refusal(row, answer)
            progress.confirmed(acked)
            outcome.confirmed += len(acked)
            if outcome.failure is not None:
                break
    except (aiormq.exceptions.AMQPError, ConnectionError, OSError) as error:
        outcome.failure = f"{type(error).__name__}: {error}"
    finally:
        for connection, _ in connections.values():
            with contextlib.suppress(Exception):
                await connection.close()
    return outcome


def _refusal(row: Any, answer: Any) -> str:
    """Why the server did not confirm one replayed message, in words."""
    import aiormq

    vhost, queue, msg_id = row[:3]
    what = f"message {msg_id} for queue '{queue}' in vhost '{vhost}'"
    if isinstance(answer, aiormq.exceptions.DeliveryError):
        return f"{what} was nacked (its queue is full, or the server could not store it)"
    if isinstance(answer, BaseException):
        return f"{what} was refused ({type(answer).__name__}: {answer})"
    return f"{what} was returned unroutable"


if __name__ == "__main__":
    main()


@main.group()
def definitions() -> None:
    """RabbitMQ definitions files (definitions.json) and amqha (docs/operations.md,
    "Management API").

    \b
    Users come from the config file of both servers, so a definitions import (POST
    /api/definitions, rabbitmqadmin import) does not create them. Carry a RabbitMQ
    broker's users over first: print them as config lines, add them to both files'
    `users`, restart the pair, then import the file:
      amqha definitions users rabbit.json
    """


@definitions.command("users")
@click.argument("path", type=click.Path(dir_okay=False))
def definitions_users(path: str) -> None:
    """Print the users of definitions file PATH as config `users` entries (YAML)."""
    import json

    import yaml

    from .management.definitions import Refused, users_as_config

    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise click.ClickException(f"{path}: cannot read: {error.strerror}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise click.ClickException(f"{path}: not a JSON file: {error}") from None
    try:
        entries = users_as_config(body)
    except Refused as error:
        raise click.ClickException(f"{path}: {error}") from None
    click.echo("users:")
    for entry in entries:
        flow = yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=1000)
        click.echo(f"  - {flow.strip()}")
