"""The ``amqha`` command line: start a server, run the loopback pair, the console, the report."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
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
from failover.epoch import EpochFileError

from .console import console


class _Commands(click.Group):
    """Loads ``report`` (the Spark side) only when it is asked for: a server never imports it."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), "report"})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "report":
            from spark.cli import report

            return report
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
def start(role: str | None, config_path: str | None, log_level: str, no_uvloop: bool) -> None:
    """Start one broker and serve until SIGTERM or Ctrl-C."""
    from .server import install_uvloop, serve
    from .store import StoreError

    # Everything a server writes (store, event log, epoch, quarantine) is its user's
    # alone; the modules that make those files say so too, this covers any other.
    os.umask(0o077)
    if config_path is None:
        if role is None:
            raise click.UsageError("give --config FILE, or --role to use config/<role>.yaml")
        config_path = f"config/{role}.yaml"
    try:
        config = load_config(config_path, role=role)
    except ConfigError as error:
        raise click.ClickException(f"bad configuration: {error}") from None
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
    except StoreError as error:
        raise click.ClickException(f"cannot open the message store: {error}") from None
    except OSError as error:
        where = config.listen if config.tls is None else f"{config.listen} or {config.tls.listen}"
        raise click.ClickException(f"cannot listen on {where}: {error.strerror}") from None


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
    from config.loader import parse_host_port
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
def pair(config_dir: str) -> None:
    """Run the primary and the backup together on this machine; Ctrl-C stops both.

    The first run makes the files under CONFIG_DIR/local/ (0700) that the configs read
    (the shipped ones: the pair's secret and the admin and peering passwords), 0600
    each: nothing secret is shipped, and `amqha console` finds the admin password there.

    Each server's log lines are prefixed with its name. The two pids come first: kill -9
    the ACTIVE one to watch the other take over. A server that ends is reported (how, and
    the command that starts it again) while the other runs on; the exit status is 1 if
    either ended other than by Ctrl-C or SIGTERM.
    """
    from config.local import ensure_credentials, named_in

    configs = [Path(config_dir) / f"{role}.yaml" for role in ("primary", "backup")]
    made = ensure_credentials(config_dir, named_in(configs))
    if made:
        _say(
            f"made {', '.join(str(path) for path in made)} (0600, kept out of git): this"
            " install's own pair secret and passwords, which the configs read"
        )
    roles: dict[str, subprocess.Popen[bytes]] = {}
    for role in ("primary", "backup"):
        path = Path(config_dir) / f"{role}.yaml"
        try:
            load_config(path, role=role)
        except ConfigError as error:
            raise click.ClickException(f"bad configuration: {error}") from None
        process = subprocess.Popen(
            [sys.executable, "-m", "amqha", "start", "--role", role, "--config", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        roles[role] = process
        threading.Thread(target=_relay, args=(role, process), daemon=True).start()
    _say(f"primary pid {roles['primary'].pid}, backup pid {roles['backup'].pid}; Ctrl-C stops both")

    stopping = threading.Event()  # set by SIGTERM: the servers' endings are then expected

    def stop(*_: object) -> None:
        stopping.set()
        for process in roles.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    # Runs while either server lives: killing one to watch the other take over is the point.
    # A SIGTERM ends it too; the servers are then given 10 s each below.
    ended: set[str] = set()
    try:
        while not stopping.is_set() and any(p.poll() is None for p in roles.values()):
            for role, process in roles.items():
                if role not in ended and process.returncode is not None:
                    ended.add(role)
                    other = "backup" if role == "primary" else "primary"
                    _say(
                        f"the {role} ended ({_ending(process.returncode)}); the {other} runs"
                        f" on. Start the {role} again with: amqha start --role {role}"
                        f" --config {Path(config_dir) / f'{role}.yaml'}"
                    )
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
    clean = {0, -signal.SIGTERM, -signal.SIGINT}
    failed = [
        f"the {role} {_ending(p.returncode)}"
        for role, p in roles.items()
        if p.returncode not in clean
    ]
    if failed:
        _say(f"exit status 1: {', '.join(failed)}")
    sys.exit(1 if failed else 0)


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


def _relay(name: str, process: subprocess.Popen[bytes]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        sys.stdout.write(f"[{name:7}] {line.decode(errors='replace')}")
        sys.stdout.flush()


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


main.add_command(console)

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
