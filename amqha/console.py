"""The admin console: requests over the reserved ``amq.console`` exchange, and the CLI.

Owns, server side: ``ConsoleService``, which consumes amq.console in-process and
answers JSON requests (status, recover, promote, connections, queues, events,
controller stop|start) to the requester's own exclusive reply queue. amq.console is a
control exchange: only users tagged ``administrator`` may publish to it (the channel
refuses others with 403), nothing can be bound to it, and the request is attributed to
the user its connection authenticated as (docs/security.md).

Owns, client side: ``ConsoleClient`` (aio-pika) and the ``amqha console`` command
with its interactive prompt.

Must not know: how failover decides (it asks the broker's ``gate.Pair``), frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shlex
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import aiormq
import click
from pamqp import commands
from pamqp.header import ContentHeader

from .core.message import Message
from .core.vhost import CONSOLE_EXCHANGE
from .gate import ConsoleRefused
from .wire import address_of

COMMANDS = ("status", "recover", "promote", "connections", "queues", "events", "controller")


class ConsoleService:
    """Answers console requests inside the server."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.handlers: dict[str, Callable[[dict[str, Any], str], Any]] = {
            "status": self.on_status,
            "recover": self.on_pair_command("recover"),
            "promote": self.on_pair_command("promote"),
            "connections": self.on_connections,
            "queues": self.on_queues,
            "events": self.on_events,
            "controller": self.on_pair_command("controller"),
        }

    def start(self) -> None:
        self.broker.receive_control(CONSOLE_EXCHANGE, self.on_request)

    def on_request(self, message: Message, connection: Any) -> None:
        properties = message.properties()
        reply_to = properties.reply_to
        user = connection.user.name
        try:
            request = json.loads(message.body)
            command = request["command"]
            handler = self.handlers[command]
            args = request.get("args") or {}
            if not isinstance(args, dict):
                # Every handler reads its arguments by name.
                raise TypeError(f"'args' must be a JSON object, not {type(args).__name__}")
            answer = {"ok": True, "result": handler(args, user)}
        except (ValueError, KeyError, TypeError, OverflowError) as error:
            # OverflowError: int() of a JSON number too large for a float (1e400 is inf).
            answer = {"ok": False, "error": f"bad request: {error!r}"}
        except ConsoleRefused as error:
            answer = {"ok": False, "error": str(error)}
        # Answers go only to a reply queue the asking connection owns: the console never
        # writes into application queues.
        queue = connection.exclusive_queues.get(reply_to) if reply_to else None
        if queue is not None:
            self._reply(queue, properties.correlation_id, answer)

    def _reply(self, queue: Any, correlation_id: str | None, answer: dict[str, Any]) -> None:
        body = json.dumps(answer, default=str).encode()
        header = ContentHeader(
            body_size=len(body),
            properties=commands.Basic.Properties(
                content_type="application/json", correlation_id=correlation_id
            ),
        ).marshal()
        self.broker.enqueue(Message(address_of("", queue.name), header, body), (queue,))

    # -- commands -------------------------------------------------------------------------

    def on_status(self, args: dict[str, Any], user: str) -> dict[str, Any]:
        broker = self.broker
        status = broker.pair.status()
        status.update(
            clients=len(broker.client_connections()),
            connections=len(broker.open_connections()),
            queues=sum(len(v.queues) for v in broker.vhosts.values()),
            queued_messages=sum(
                q.message_count for v in broker.vhosts.values() for q in v.queues.values()
            ),
            uptime=round(time.time() - broker.started, 1),
            control_received=broker.control_received,
            store=broker.store_status(),
        )
        return status

    def on_pair_command(self, command: str) -> Callable[[dict[str, Any], str], Any]:
        def on_command(args: dict[str, Any], user: str) -> Any:
            return self.broker.pair.command(command, args, user)

        return on_command

    def on_connections(self, args: dict[str, Any], user: str) -> list[dict[str, Any]]:
        return [c.describe() for c in self.broker.connections]

    def on_queues(self, args: dict[str, Any], user: str) -> list[dict[str, Any]]:
        return [
            {
                "vhost": vhost.name,
                "name": q.name,
                "messages": q.message_count,
                "unacked": q.unacked,
                "consumers": q.consumer_count,
                "durable": q.durable,
                "exclusive": q.exclusive_owner is not None,
            }
            for vhost in self.broker.vhosts.values()
            for q in vhost.queues.values()
        ]

    def on_events(self, args: dict[str, Any], user: str) -> dict[str, Any]:
        """Whole event-log lines from byte ``offset`` (the tail if negative) and the next offset."""
        return read_events(
            self.broker.config.event_log_path,
            int(args.get("offset", -1)),
            min(int(args.get("limit", 50)), 1000),
        )


def read_events(path: str, offset: int, limit: int) -> dict[str, Any]:
    """Whole event-log lines of ``path`` from byte ``offset`` (the last ``limit`` if
    negative), at most ``limit`` of them, and the offset after them (the console's
    ``events``, the management API's ``/api/amqha/events``)."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, 2)
            tail = offset < 0 or offset > size
            start = max(0, size - 64 * 1024) if tail else offset
            log.seek(start)
            data = log.read(1024 * 1024)
    except FileNotFoundError:
        return {"events": [], "offset": 0}
    end = data.rfind(b"\n") + 1  # only whole lines; a line being written waits
    lines = data[:end].splitlines()
    if tail:
        if start > 0:
            lines = lines[1:]  # the tail window may begin mid-line
        lines = lines[-limit:]
    else:
        lines = lines[:limit]
        end = sum(len(line) + 1 for line in lines)
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return {"events": events, "offset": start + end}


# -- client side --------------------------------------------------------------------------


class ConsoleClient:
    """One administrator connection; answers are pushed to a private reply queue.

    A command that makes the server step down closes this connection right after the
    answer: the answer is delivered before the close, so it is read all the same.
    """

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url
        self.timeout = timeout
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.pending: dict[str, asyncio.Future[Any]] = {}

    async def __aenter__(self) -> ConsoleClient:
        self.connection = await aio_pika.connect(self.url, timeout=self.timeout)
        self.channel = await self.connection.channel()
        self.replies = await self.channel.declare_queue(exclusive=True)
        await self.replies.consume(self._on_reply, no_ack=True)
        self.user = self.connection.url.user or "guest"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.connection is not None and not self.connection.is_closed:
            with contextlib.suppress(Exception):  # the server may have closed it first
                await self.connection.close()

    async def _on_reply(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        future = self.pending.pop(message.correlation_id or "", None)
        if future is not None and not future.done():
            future.set_result(message.body)

    async def call(self, command: str, **args: Any) -> Any:
        answer = await self.request(json.dumps({"command": command, "args": args}).encode())
        if not answer.get("ok"):
            raise click.ClickException(answer.get("error", "refused"))
        return answer["result"]

    async def request(self, body: bytes) -> Any:
        """Publish one request body as it stands; the server's answer, decoded."""
        correlation_id = uuid.uuid4().hex
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[correlation_id] = future
        exchange = await self.channel.get_exchange(CONSOLE_EXCHANGE, ensure=False)
        await exchange.publish(
            aio_pika.Message(
                body,
                content_type="application/json",
                reply_to=self.replies.name,
                correlation_id=correlation_id,
                user_id=self.user,
            ),
            routing_key="",
        )
        try:
            answer = await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            raise click.ClickException(
                f"no answer from {self.url} within {self.timeout} s"
            ) from None
        finally:
            self.pending.pop(correlation_id, None)
        return json.loads(answer)


def default_servers(config_dir: str = "config") -> tuple[str, ...]:
    """The loopback pair `make run` starts, as admin with the password it made in
    CONFIG_DIR/local/admin.password."""
    from config.local import ADMIN_PASSWORD, LOCAL, read_credential

    password = read_credential(config_dir, ADMIN_PASSWORD)
    if password is None:
        where = Path(config_dir) / LOCAL / ADMIN_PASSWORD
        raise click.UsageError(
            f"no --server given and no {where} (the admin password `make run` makes): run"
            " from the folder `make run` ran in, or give --server amqp://USER:PASSWORD@HOST:PORT/"
        )
    secret = quote(password, safe="")
    return tuple(f"amqp://admin:{secret}@127.0.0.1:{port}/" for port in (5672, 5673))


async def _status_all(servers: tuple[str, ...], timeout: float) -> list[tuple[str, Any]]:
    results = []
    for url in servers:
        try:
            async with ConsoleClient(url, timeout) as console:
                results.append((url, await console.call("status")))
        except click.ClickException as error:
            results.append((url, {"error": error.message}))
        except (ConnectionError, OSError, aiormq.exceptions.AMQPConnectionError):
            results.append((url, {"error": "down (nothing accepts connections there)"}))
        except Exception as error:
            results.append((url, {"error": f"{type(error).__name__}: {error}"}))
    return results


def _replication_text(status: dict[str, Any]) -> str:
    """One cell: an ACTIVE's feed, a PASSIVE's catch-up, quarantined files."""
    replication = status.get("replication") or {}
    if not replication.get("enabled"):
        return "off" if replication else ""
    feed, follower = replication.get("feed"), replication.get("follower")
    if feed is not None:
        text = {"in_sync": "in sync", "catching_up": "catching up", "none": "unprotected"}.get(
            feed.get("state"), str(feed.get("state"))
        )
        if feed.get("phase") == "closing":
            # The snapshot is acked and confirms wait for the PASSIVE; it is in sync
            # once it holds what was confirmed without it.
            text += f" (snapshot acked, in sync at LSN {feed.get('sync_lsn')})"
        elif feed.get("state") == "catching_up":
            text += f" (lag {feed.get('lag_changes')})"
    elif follower is not None:
        state = follower.get("state")
        if follower.get("in_sync"):
            text = "following, in sync"
        elif state == "closing":
            text = "following, snapshot applied, not yet in sync"
        else:
            text = f"following, {str(state).replace('_', ' ')}"
    else:
        text = ""
    quarantined = replication.get("quarantined") or []
    if quarantined:
        text += f", {len(quarantined)} quarantined"
    return text


def _print_status(results: list[tuple[str, Any]]) -> None:
    header = (
        f"{'server':24} {'name':10} {'role':8} {'state':8} {'epoch':>5} {'peer':22} "
        f"{'clients':>7} {'queues':>6}  replication"
    )
    click.echo(header)
    for url, status in results:
        where = url.rsplit("@", 1)[-1].rstrip("/")
        if "error" in status:
            click.echo(f"{where:24} {status['error']}")
            continue
        peer = status.get("peer") or {}
        peer_text = (
            f"{peer.get('name')} {peer.get('state')}{'' if peer.get('alive') else ' (lost)'}"
            if peer
            else "not seen"
        )
        click.echo(
            f"{where:24} {status.get('name', ''):10} {status.get('role', ''):8} {status.get('state', ''):8} "
            f"{status.get('epoch', 0):>5} {peer_text:22} {status.get('clients', 0):>7} {status.get('queues', 0):>6}"
            f"  {_replication_text(status)}"
        )


async def run_command(
    servers: tuple[str, ...], words: list[str], timeout: float, as_json: bool
) -> None:
    if not words:
        raise click.UsageError(f"commands: {', '.join(COMMANDS)}")
    command, rest = words[0], words[1:]
    if command == "status":
        results = await _status_all(servers, timeout)
        if as_json:
            click.echo(json.dumps(dict(results), indent=2, default=str))
        else:
            _print_status(results)
        return
    if command == "recover":
        results = await _status_all(servers, timeout)
        target = next(
            (url for url, s in results if s.get("role") == "backup" and s.get("state") == "ACTIVE"),
            None,
        )
        if target is None:
            raise click.ClickException(
                "recover needs the backup ACTIVE and the primary PASSIVE; status is:\n"
                + "\n".join(
                    f"  {u.rsplit('@', 1)[-1]}: {s.get('name', '?')} {s.get('state', s.get('error'))}"
                    for u, s in results
                )
            )
        async with ConsoleClient(target, timeout) as console:
            result = await console.call("recover")
        click.echo(f"recover: {result['result']}")
        return
    if command == "promote":
        await _promote(servers, rest, timeout)
        return
    if command not in COMMANDS:
        raise click.UsageError(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
    if command == "controller":
        if rest not in (["stop"], ["start"]):
            raise click.UsageError("controller stop|start")
        # Acts on exactly the first server named: never on another one because it is down.
        async with _reaching(servers[:1], timeout) as console:
            click.echo(await console.call("controller", action=rest[0]))
        return
    # Reads one server's view: the first listed that answers.
    async with _reaching(servers, timeout) as console:
        if len(servers) > 1:
            click.echo(f"({_where(console.url)})", err=True)
        if command == "events":
            await _events(console, follow="--follow" in rest or "-f" in rest, as_json=as_json)
        else:
            result = await console.call(command)
            if as_json:
                click.echo(json.dumps(result, indent=2, default=str))
            else:
                _print_rows(result)


def _where(url: str) -> str:
    return url.rsplit("@", 1)[-1].rstrip("/")


@contextlib.asynccontextmanager
async def _reaching(servers: tuple[str, ...], timeout: float) -> AsyncIterator[ConsoleClient]:
    """A console connection to the first of ``servers`` that accepts one; a clear error
    naming each server and why when none does."""
    failures = []
    for url in servers:
        client = ConsoleClient(url, timeout)
        try:
            await client.__aenter__()
        except (ConnectionError, OSError, aiormq.exceptions.AMQPConnectionError) as error:
            failures.append(f"{_where(url)}: down ({type(error).__name__}: {error})")
            continue
        except aiormq.exceptions.AMQPError as error:
            failures.append(f"{_where(url)}: refused ({error})")
            continue
        try:
            yield client
        finally:
            await client.__aexit__(None, None, None)
        return
    raise click.ClickException("no server answered:\n  " + "\n  ".join(failures))


async def _promote(servers: tuple[str, ...], rest: list[str], timeout: float) -> None:
    """Make a server ACTIVE by hand: the one named with --server, or else the only server
    that answers and is not ACTIVE."""
    if rest not in ([], ["--force"]):
        raise click.UsageError("promote [--force]")
    force = rest == ["--force"]
    results = await _status_all(servers, timeout)
    if len(servers) == 1:
        target = servers[0]
    else:
        candidates = [url for url, s in results if "error" not in s and s.get("state") != "ACTIVE"]
        if len(candidates) != 1:
            raise click.ClickException(
                "promote: name the server to promote with --server URL; status is:\n"
                + "\n".join(
                    f"  {u.rsplit('@', 1)[-1]}: {s.get('name', '?')} {s.get('state', s.get('error'))}"
                    for u, s in results
                )
            )
        target = candidates[0]
    async with ConsoleClient(target, timeout) as console:
        result = await console.call("promote", force=force)
    click.echo(f"promote: {result['result']}")


def _print_rows(rows: list[dict[str, Any]]) -> None:
    if not rows:
        click.echo("(none)")
        return
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in keys}
    click.echo("  ".join(k.ljust(widths[k]) for k in keys))
    for row in rows:
        click.echo("  ".join(str(row.get(k, "")).ljust(widths[k]) for k in keys))


def _format_event(event: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(event.get("ts", 0)))
    extra = {
        k: v
        for k, v in event.items()
        # The envelope (the pair is the same on every line of a server's log).
        if k not in ("v", "ts", "pair", "node", "role", "epoch", "state", "event")
    }
    details = " ".join(f"{k}={v}" for k, v in extra.items())
    return f"{stamp} {event.get('node')} [{event.get('state')} e{event.get('epoch')}] {event.get('event')} {details}"


async def _events(console: ConsoleClient, follow: bool, as_json: bool) -> None:
    answer = await console.call("events", offset=-1, limit=50)
    while True:
        for event in answer["events"]:
            click.echo(json.dumps(event) if as_json else _format_event(event))
        if not follow:
            return
        await asyncio.sleep(0.5)
        answer = await console.call("events", offset=answer["offset"], limit=200)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--server",
    "servers",
    multiple=True,
    metavar="URL",
    help="Server to talk to, as an administrator (repeat for both; default: the loopback pair"
    " as admin, with the password in config/local/admin.password).",
)
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for an answer.")
@click.option("--json", "as_json", is_flag=True, help="Print raw JSON.")
@click.argument("words", nargs=-1, type=click.UNPROCESSED)
def console(
    servers: tuple[str, ...], timeout: float, as_json: bool, words: tuple[str, ...]
) -> None:
    """Administer the pair: status, recover, promote [--force], connections, queues,
    events [--follow], controller stop|start. With no command, an interactive prompt.

    \b
    amqha console status                 both servers: role, state, epoch, peer, clients
    amqha console recover                fail back to the primary (backup ACTIVE -> PASSIVE)
    amqha console promote                make the server that is not ACTIVE serve, when its
                                         peer is down (--force: even if the peer is ACTIVE,
                                         which then steps down; messages queued there stay
                                         there)
    amqha console --server URL queues    one server's queues
    amqha console events --follow        the event log as it grows
    """
    servers = servers or default_servers()
    # A server that is down is reported in the table; aiormq's own error lines would repeat it.
    logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)
    if words:
        asyncio.run(run_command(servers, list(words), timeout, as_json))
        return
    click.echo(
        f"amqha console ({', '.join(s.rsplit('@', 1)[-1] for s in servers)}); 'help' lists commands, 'quit' leaves"
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
            click.echo(
                "status | recover | promote [--force] | connections | queues | events [--follow] "
                "| controller stop|start | quit"
            )
            continue
        try:
            asyncio.run(run_command(servers, shlex.split(line), timeout, as_json))
        except (click.ClickException, click.UsageError) as error:
            click.echo(f"error: {error.format_message()}", err=True)
        except KeyboardInterrupt:
            click.echo()
        sys.stdout.flush()
