"""The ``amqha console`` command: its options, one command line or the prompt.

Owns: the click command (docs/operations.md, "Console"): the servers it talks to (the
``--server`` options, else the pair file's or the default pair), running one command
line into its exit status without ever a traceback, a bad option answered in JSON with
``--json``, and the interactive prompt. ``amqha/cli.py`` loads it only for ``amqha
console``: a server never imports click or aio-pika.

Must not know: what each command does (``console_commands.py``), the broker.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import sys

import click

from .console import (
    EXIT_FAILED,
    EXIT_USAGE,
    ConsoleError,
    Server,
    admin_password,
    default_servers,
    parse_server,
    read_pair_file,
)
from .console_commands import run_command
from .console_service import COMMANDS
from .console_text import emit_error
from .console_words import syntax
from .ports import PAIR_FILE


def _servers(texts: tuple[str, ...], pair_file: str) -> list[Server]:
    """The --server options as servers, or the default pair (PAIR_FILE, or 5672/5673)."""
    data = read_pair_file(pair_file)
    config_dir = str(data.get("config_dir") or "config") if data else "config"
    password = admin_password(config_dir)
    return [parse_server(text, password) for text in (texts or default_servers(pair_file))]


def _run(servers: list[Server], words: list[str], timeout: float, as_json: bool) -> int:
    """One command, its errors printed (JSON with --json) and turned into its exit status;
    never a traceback, whatever the input."""
    if "--json" in words:
        words = [w for w in words if w != "--json"]
        as_json = True
    try:
        return asyncio.run(run_command(servers, words, timeout, as_json))
    except ConsoleError as error:
        emit_error(error, as_json)
        return error.exit_code
    except Exception as error:  # a bug must still not print a traceback at an operator
        emit_error(ConsoleError("failed", f"{type(error).__name__}: {error}"), as_json)
        return EXIT_FAILED


class _ConsoleCommand(click.Command):
    """With --json, even a bad option of the console itself is answered in JSON."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wanted = "--json" in args  # the parser consumes ``args``
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:
            if not wanted:
                raise
            emit_error(ConsoleError("usage", error.format_message()), True)
            ctx.exit(EXIT_USAGE)


@click.command(cls=_ConsoleCommand, context_settings={"ignore_unknown_options": True})
@click.option(
    "--server",
    "servers",
    multiple=True,
    metavar="URL",
    help="Server to talk to, as an administrator: amqp[s]://USER:PASSWORD@HOST:PORT/VHOST, or"
    " HOST:PORT for admin with config/local/admin.password (repeat for both; default: the"
    f" servers in {PAIR_FILE}, written by `amqha pair`, else 127.0.0.1:5672 and :5673).",
)
@click.option(
    "--pair-file",
    default=PAIR_FILE,
    show_default=True,
    metavar="FILE",
    help="Where `amqha pair` wrote its servers' addresses (read when no --server is given).",
)
@click.option(
    "--timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True, max=3600),
    help="Seconds to wait for a connection or an answer.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (errors too).")
@click.argument("words", nargs=-1, type=click.UNPROCESSED)
def console(
    servers: tuple[str, ...], pair_file: str, timeout: float, as_json: bool, words: tuple[str, ...]
) -> None:
    """Administer the pair. With no command, an interactive prompt.

    \b
    status                          both servers: role, state, epoch, peer, clients; health
    recover                         fail back to the primary (backup ACTIVE -> PASSIVE)
    config-diff                     the settings both servers must share, where they differ
    switchover [--wait S]           hand the service from the ACTIVE to its in-sync PASSIVE
                                    (planned: publishers wait, nothing confirmed twice);
                                    --wait: until the PASSIVE is in sync, at most S s
    maintenance on|off SERVER       SERVER (primary, backup) is never voted in nor promoted
                                    while on; its stop raises no alarm (switch over first)
    promote [--force]               make the server that is not ACTIVE serve, when its peer
                                    is down (--force: even if the peer is ACTIVE, which then
                                    steps down; messages queued there stay there)
    connections | queues | exchanges | bindings      one server's view
    events [--follow] [--limit N]   both servers' failover logs, merged in time order
    purge QUEUE [--vhost V]         drop a queue's ready messages (on the ACTIVE)
    delete QUEUE [--if-empty] [--if-unused] [--vhost V]
    close-connection NAME [--reason TEXT]   NAME as `connections` lists it (HOST:PORT)
    users                           every user, where it was made, its tags and vhosts
    user add NAME [--tags T1,T2] [--password-hash HASH]   make or change a user at run
                                    time (replicated); the password from stdin or a prompt
    user delete NAME                closes its connections
    vhost add|delete NAME           a vhost made at run time (delete: with its queues)
    permission set|clear VHOST USER give or take a vhost (full rights)
    controller stop|start           stop or start the first server's failover controller
    federation                      the federation links (one server's view)
    federation add --exchange X --upstream NAME [--url URL ...] [--vhost V] [--no-bindings]
                   [--forward] [--max-hops N] [--delivery confirm|drop]
    federation remove --exchange X --upstream NAME [--vhost V] [--drop-pending]
                                    change the links at run time (every server named)

    \b
    Exit status: 0 done / healthy, 1 the command failed or was refused, 2 bad usage,
    3 a server down or none ACTIVE, 4 not in sync, 5 not authorised, 6 login refused,
    7 two servers ACTIVE, 8 a witness not heard, 9 the two servers' shared settings
    differ (docs/operations.md).
    """
    # A server that is down is reported as such; aiormq's own error lines would repeat it.
    logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)
    logging.getLogger("aio_pika").setLevel(logging.CRITICAL)
    as_json = as_json or "--json" in words
    try:
        targets = _servers(servers, pair_file)
    except ConsoleError as error:
        emit_error(error, as_json)
        sys.exit(error.exit_code)
    if words:
        sys.exit(_run(targets, list(words), timeout, as_json))
    _prompt(targets, timeout, as_json)


def _prompt(targets: list[Server], timeout: float, as_json: bool) -> None:
    """The interactive prompt: one command a line until ``quit``, end of input or Ctrl-C."""
    click.echo(
        f"amqha console ({', '.join(s.where for s in targets)}); 'help' lists commands,"
        " 'quit' leaves"
    )
    while True:
        try:
            line = input("amqha> ").strip()
        except (EOFError, KeyboardInterrupt):
            click.echo()
            return
        if line in ("quit", "exit"):
            return
        if not line:
            continue
        if line == "help":
            click.echo(" | ".join(syntax(c) for c in COMMANDS) + " | quit")
            continue
        try:
            _run(targets, shlex.split(line), timeout, as_json)
        except ValueError as error:  # shlex: an unclosed quote
            emit_error(ConsoleError("usage", str(error)), as_json)
        except KeyboardInterrupt:
            click.echo()
        sys.stdout.flush()
