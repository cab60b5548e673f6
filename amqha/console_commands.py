"""What each ``amqha console`` command does, on which server (docs/operations.md, "Console").

Owns: running one command line: the table of commands and their handlers, which server a
command goes to (the ACTIVE for a change to queues, the first named for the controller,
whichever holds a connection, the first that answers for a view), and following both
servers' event logs.

Must not know: the click command and its prompt (``console_cli.py``), how the words are
parsed (``console_words.py``), the words of the output (``console_text.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import click

from .console import (
    ERROR_EXITS,
    EXIT_CONFIG_DRIFT,
    EXIT_DOWN,
    EXIT_OK,
    ConsoleClient,
    ConsoleError,
    Server,
)
from .console_federation import federation_change, federation_row
from .console_health import health, status_all
from .console_text import (
    done,
    echo_json,
    event_time,
    print_events,
    print_rows,
    print_status,
    states,
)
from .console_words import events_limit, parse_words, wait_seconds


@dataclass(frozen=True)
class _Line:
    """One command line as it runs: the command, its arguments and options, the servers."""

    servers: list[Server]
    command: str
    positional: list[str]
    options: dict[str, Any]
    timeout: float
    as_json: bool


async def run_command(
    servers: list[Server], words: list[str], timeout: float, as_json: bool
) -> int:
    """Run one command; its exit status (errors are raised as ``ConsoleError``)."""
    command, positional, options = parse_words(words)
    line = _Line(servers, command, positional, options, timeout, as_json)
    return await _HANDLERS.get(command, _view)(line)


async def _status(line: _Line) -> int:
    results = await status_all(line.servers, line.timeout)
    verdict = health(results)
    if line.as_json:
        echo_json(
            {
                "servers": [{"server": s.where, **status} for s, status in results],
                "health": {"code": verdict[0], "message": verdict[1]},
            }
        )
    else:
        print_status(results, verdict)
    return ERROR_EXITS.get(verdict[0], EXIT_OK) if verdict[0] != "healthy" else EXIT_OK


async def _recover(line: _Line) -> int:
    results = await status_all(line.servers, line.timeout)
    target = next(
        (
            s
            for s, status in results
            if status.get("role") == "backup" and status.get("state") == "ACTIVE"
        ),
        None,
    )
    if target is None:
        raise ConsoleError(
            "refused",
            "recover needs the backup ACTIVE and the primary PASSIVE; status is:\n"
            + states(results),
        )
    async with ConsoleClient(target, line.timeout) as console:
        result = await console.call("recover")
    done(line.as_json, "recover", target, result, f"recover: {result['result']}")
    return EXIT_OK


async def _switchover(line: _Line) -> int:
    """Hands the service from the ACTIVE, whichever it is, to its in-sync PASSIVE."""
    wait = wait_seconds(line.options.get("--wait", "0"))
    target = await _active(line.servers, line.timeout, "switchover")
    # The answer comes once the drain is over (at most 10 s) or the wait ran out.
    async with ConsoleClient(target, line.timeout + wait + 15) as console:
        result = await console.call("switchover", wait=wait)
    done(line.as_json, "switchover", target, result, f"switchover: {result['result']}")
    return EXIT_OK


async def _maintenance(line: _Line) -> int:
    """Puts a server in maintenance or out of it, through the ACTIVE if one answers (else
    the first that does): the peer learns it from the next state message."""
    action, server = line.positional
    results = await status_all(line.servers, line.timeout)
    ordered = sorted(line.servers, key=lambda s: dict(results).get(s, {}).get("state") != "ACTIVE")
    async with _reaching(ordered, line.timeout) as console:
        result = await console.call("maintenance", on=action == "on", server=server)
        target = console.server
    done(line.as_json, "maintenance", target, result, f"maintenance: {result['result']}")
    return EXIT_OK


async def _config_diff(line: _Line) -> int:
    """The settings the servers named must share, where they differ, side by side."""
    if len(line.servers) < 2:
        raise ConsoleError(
            "usage", "config-diff needs both servers (--server twice, or amqha pair's)"
        )
    settings = []
    for server in line.servers:
        async with _reaching([server], line.timeout) as console:
            settings.append((server, await console.call("config-diff")))
    keys = sorted({k for _, each in settings for k in each})
    differ = [k for k in keys if len({each.get(k) for _, each in settings}) > 1]
    if line.as_json:
        echo_json(
            {
                "differ": [
                    {"key": k, **{s.where: each.get(k) for s, each in settings}} for k in differ
                ]
            }
        )
    elif not differ:
        click.echo(f"the {len(keys)} shared settings match")
    else:
        for key in differ:
            click.echo(key)
            for server, each in settings:
                click.echo(f"  {server.where}: {each.get(key, '(not set)')}")
    return EXIT_CONFIG_DRIFT if differ else EXIT_OK


async def _promote_command(line: _Line) -> int:
    await _promote(line.servers, bool(line.options.get("--force")), line.timeout, line.as_json)
    return EXIT_OK


async def _controller(line: _Line) -> int:
    # Acts on exactly the first server named: never on another one because it is down.
    async with _reaching(line.servers[:1], line.timeout) as console:
        result = await console.call("controller", action=line.positional[0])
    done(line.as_json, "controller", line.servers[0], result, str(result))
    return EXIT_OK


async def _events_command(line: _Line) -> int:
    count = events_limit(line.options.get("--limit", "50"))
    follow = bool(line.options.get("--follow") or line.options.get("-f"))
    await _events(line.servers, line.timeout, follow, line.as_json, count)
    return EXIT_OK


async def _queue_change(line: _Line) -> int:
    """``purge`` or ``delete``, on the ACTIVE."""
    command, options = line.command, line.options
    target = await _active(line.servers, line.timeout, command)
    args: dict[str, Any] = {"queue": line.positional[0], "vhost": options.get("--vhost", "/")}
    if command == "delete":
        args.update(
            if_empty=bool(options.get("--if-empty")), if_unused=bool(options.get("--if-unused"))
        )
    async with ConsoleClient(target, line.timeout) as console:
        result = await console.call(command, **args)
    text = (
        f"purged {result['purged']} messages from queue '{result['queue']}' on {target.where}"
        if command == "purge"
        else f"deleted queue '{result['queue']}' ({result['messages']} messages) on {target.where}"
    )
    done(line.as_json, command, target, result, text)
    return EXIT_OK


async def _access_change(line: _Line) -> int:
    """``user``, ``vhost`` or ``permission``: a change of who may log in where, on the
    ACTIVE (replicated; answered once safe). ``user add`` reads the password from standard
    input (one line), unless --password-hash gives a hash."""
    command, options = line.command, line.options
    action = line.positional[0]
    if command == "permission":
        args: dict[str, Any] = {"vhost": line.positional[1], "user": line.positional[2]}
    else:
        args = {"name": line.positional[1]}
    if command == "user" and action == "add":
        args["tags"] = options.get("--tags", "")
        if "--password-hash" in options:
            args["password_hash"] = options["--password-hash"]
        else:
            password = read_password(f"password for user '{args['name']}': ")
            if not password:
                raise ConsoleError("usage", "user add: an empty password (or --password-hash HASH)")
            args["password"] = password
    target = await _active(line.servers, line.timeout, command)
    async with ConsoleClient(target, line.timeout) as console:
        result = await console.call(command, action=action, **args)
    done(line.as_json, f"{command} {action}", target, result, f"{result['done']} on {target.where}")
    return EXIT_OK


def read_password(prompt: str) -> str:
    """A password: asked without echo at a terminal, else the first line of stdin."""
    if sys.stdin.isatty():
        return click.prompt(prompt, hide_input=True, default="", show_default=False)
    return sys.stdin.readline().rstrip("\n")


async def _federation(line: _Line) -> int:
    """``federation`` alone is a view; ``federation add|remove`` a change."""
    if not line.positional:
        return await _view(line)
    return await federation_change(
        line.servers, line.positional[0], line.options, line.timeout, line.as_json
    )


async def _close_connection_command(line: _Line) -> int:
    reason = line.options.get("--reason")
    await _close_connection(line.servers, line.positional[0], reason, line.timeout, line.as_json)
    return EXIT_OK


async def _view(line: _Line) -> int:
    """Reads one server's view: the first listed that answers."""
    async with _reaching(line.servers, line.timeout) as console:
        if len(line.servers) > 1:
            click.echo(f"({console.where})", err=True)
        rows = await console.call(line.command)
    if line.as_json:
        echo_json(rows)
    elif line.command == "federation":
        print_rows([federation_row(row) for row in rows])
    else:
        print_rows(rows)
    return EXIT_OK


# The commands that do more than show one server's view (``_view``), and what does it.
_HANDLERS: dict[str, Callable[[_Line], Awaitable[int]]] = {
    "status": _status,
    "recover": _recover,
    "switchover": _switchover,
    "maintenance": _maintenance,
    "config-diff": _config_diff,
    "promote": _promote_command,
    "controller": _controller,
    "events": _events_command,
    "purge": _queue_change,
    "delete": _queue_change,
    "federation": _federation,
    "close-connection": _close_connection_command,
    "user": _access_change,
    "vhost": _access_change,
    "permission": _access_change,
}


async def _active(servers: list[Server], timeout: float, command: str) -> Server:
    """The server a change to queues goes to: the ACTIVE one (or the only one named)."""
    if len(servers) == 1:
        return servers[0]
    results = await status_all(servers, timeout)
    for server, status in results:
        if status.get("state") == "ACTIVE":
            return server
    verdict = health(results)
    code = (
        verdict[0]
        if verdict[0] in ("auth_failed", "access_refused", "not_authorised")
        else "no_active"
    )
    raise ConsoleError(code, f"{command}: no server is ACTIVE; status is:\n" + states(results))


async def _close_connection(
    servers: list[Server], name: str, reason: str | None, timeout: float, as_json: bool
) -> None:
    """Close connection NAME on whichever server holds it (clients reach the ACTIVE,
    administrators either)."""
    failures: list[ConsoleError] = []
    for server in servers:
        try:
            async with ConsoleClient(server, timeout) as console:
                args = {"name": name} if reason is None else {"name": name, "reason": reason}
                result = await console.call("close-connection", **args)
        except ConsoleError as error:
            if error.code != "not_found" and error.exit_code != EXIT_DOWN:
                raise
            failures.append(ConsoleError(error.code, f"{server.where}: {error.message}"))
            continue
        text = f"closed connection {name} on {server.where}"
        done(as_json, "close-connection", server, result, text)
        return
    found = [e for e in failures if e.code == "not_found"]
    raise ConsoleError(
        "not_found" if found else failures[0].code,
        f"no connection '{name}':\n  " + "\n  ".join(e.message for e in failures),
    )


@contextlib.asynccontextmanager
async def _reaching(servers: list[Server], timeout: float) -> AsyncIterator[ConsoleClient]:
    """A console connection to the first of ``servers`` that accepts one; else the error
    of the first (a refused login outranks a server that is down) naming each and why."""
    failures: list[tuple[Server, ConsoleError]] = []
    for server in servers:
        client = ConsoleClient(server, timeout)
        try:
            await client.__aenter__()
        except ConsoleError as error:
            failures.append((server, error))
            continue
        try:
            yield client
        finally:
            await client.__aexit__(None, None, None)
        return
    worst = min(failures, key=lambda f: 0 if f[1].exit_code != EXIT_DOWN else 1)[1]
    raise ConsoleError(
        worst.code,
        "no server answered:\n  " + "\n  ".join(f"{s.where}: {e.message}" for s, e in failures),
    )


async def _promote(servers: list[Server], force: bool, timeout: float, as_json: bool) -> None:
    """Make a server ACTIVE by hand: the one named with --server, or else the only server
    that answers and is not ACTIVE."""
    if len(servers) == 1:
        target = servers[0]
    else:
        results = await status_all(servers, timeout)
        candidates = [
            s for s, status in results if "error" not in status and status.get("state") != "ACTIVE"
        ]
        if len(candidates) != 1:
            raise ConsoleError(
                "refused",
                "promote: name the server to promote with --server URL; status is:\n"
                + states(results),
            )
        target = candidates[0]
    async with ConsoleClient(target, timeout) as console:
        result = await console.call("promote", force=force)
    done(as_json, "promote", target, result, f"promote: {result['result']}")


async def _events(
    servers: list[Server], timeout: float, follow: bool, as_json: bool, limit: int
) -> None:
    """Both servers' event logs merged in time order (one failover spans both: the loss is
    in the survivor's log, the step-down in the other's); with ``follow``, as they grow,
    reconnecting to a server that comes back."""
    clients: dict[Server, ConsoleClient] = {}
    offsets: dict[Server, int] = {}
    failures: dict[Server, ConsoleError] = {}
    async with contextlib.AsyncExitStack() as stack:

        async def reach(server: Server) -> None:
            try:
                clients[server] = await stack.enter_async_context(ConsoleClient(server, timeout))
                failures.pop(server, None)
            except ConsoleError as error:
                if server not in failures:
                    click.echo(
                        f"({server.where}: {error.message}; its events are not shown)", err=True
                    )
                failures[server] = error

        async def read(server: Server, offset: int, count: int) -> list[dict[str, Any]]:
            try:
                answer = await clients[server].call("events", offset=offset, limit=count)
            except ConsoleError as error:
                if error.exit_code != EXIT_DOWN:
                    raise
                clients.pop(server, None)
                click.echo(f"({server.where}: {error.message})", err=True)
                failures[server] = error
                return []
            offsets[server] = answer["offset"]
            return list(answer["events"])

        await asyncio.gather(*(reach(server) for server in servers))
        if not clients:
            _, first = next(iter(failures.items()))
            raise ConsoleError(
                min((e for e in failures.values()), key=lambda e: e.exit_code == EXIT_DOWN).code,
                "no server answered:\n  "
                + "\n  ".join(f"{s.where}: {e.message}" for s, e in failures.items()),
            )
        batches = await asyncio.gather(*(read(s, -1, limit) for s in list(clients)))
        print_events(sorted((e for b in batches for e in b), key=event_time)[-limit:], as_json)
        rounds = 0
        while follow:
            await asyncio.sleep(0.5)
            rounds += 1
            if rounds % 4 == 0:  # every 2 s, a server that was down is tried again
                for server in [s for s in servers if s not in clients]:
                    await reach(server)
                    if server in clients and server not in offsets:
                        offsets[server] = -1
            batches = await asyncio.gather(
                *(read(s, offsets.get(s, -1), 200) for s in list(clients))
            )
            print_events(sorted((e for b in batches for e in b), key=event_time), as_json)
