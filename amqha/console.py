"""The admin console, client side: ``amqha console`` and ``ConsoleClient``.

Owns: ``ConsoleClient`` (aio-pika), which sends JSON requests to a server's reserved
``amq.console`` exchange (answered by ``amqha/console_service.py``), the ``amqha console``
command with its interactive prompt, its exit statuses and its JSON, and reading the pair
file ``amqha pair`` writes for it (docs/operations.md, "Console").

Must not know: the broker (it speaks AMQP to servers like any client).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import json
import logging
import shlex
import ssl
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, unquote, urlsplit

import aio_pika
import aiormq
import click

from .channel import REPLY_TO
from .console_service import COMMANDS
from .core.reserved import CONSOLE_EXCHANGE
from .dual import dual_active
from .ports import PAIR_FILE

log = logging.getLogger(__name__)

# -- client side --------------------------------------------------------------------------

# Exit statuses of `amqha console` (docs/operations.md, "Console"): scripts test them.
EXIT_OK = 0
EXIT_FAILED = 1  # the server refused or failed the command (no such queue, recover refused)
EXIT_USAGE = 2  # bad command line: unknown command, bad URL, missing argument
EXIT_DOWN = 3  # a server does not answer, or no server is ACTIVE
EXIT_NOT_IN_SYNC = 4  # the pair serves, but its PASSIVE does not hold everything confirmed
EXIT_NOT_AUTHORISED = 5  # logged in, but not allowed: not an administrator, vhost refused
EXIT_AUTH_FAILED = 6  # the login itself was refused: wrong user name or password
EXIT_SPLIT = 7  # two servers ACTIVE at once
EXIT_WITNESS = 8  # the pair serves, but a witness does not answer or fails verification

# Every error code the console prints (JSON ``error.code``), with its exit status.
ERROR_EXITS = {
    "usage": EXIT_USAGE,
    "connection_refused": EXIT_DOWN,
    "timeout": EXIT_DOWN,
    "name_not_resolved": EXIT_DOWN,
    "unreachable": EXIT_DOWN,
    "tls_error": EXIT_DOWN,
    "not_amqp": EXIT_DOWN,
    "connection_closed": EXIT_DOWN,
    "no_active": EXIT_DOWN,
    "peer_lost": EXIT_DOWN,
    "not_in_sync": EXIT_NOT_IN_SYNC,
    "auth_failed": EXIT_AUTH_FAILED,
    "access_refused": EXIT_NOT_AUTHORISED,
    "not_authorised": EXIT_NOT_AUTHORISED,
    "split": EXIT_SPLIT,
    "witness_unheard": EXIT_WITNESS,
}

# The file `amqha pair` writes with the addresses it started the servers on, and where
# their configs are (for the admin password); `amqha console` reads it by default.
DEFAULT_PORTS = (5672, 5673)


class ConsoleError(click.ClickException):
    """A console failure: a code for scripts (JSON ``error.code``), its exit status, and
    a message for a person."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = ERROR_EXITS.get(code, EXIT_FAILED)

    def as_json(self) -> dict[str, Any]:
        return {"ok": False, "error": {"code": self.code, "message": self.message}}


def usage(message: str) -> NoReturn:
    raise ConsoleError("usage", message)


@dataclass(frozen=True)
class Server:
    """One server as the console reaches it; ``where`` (HOST:PORT) never holds a password."""

    url: str
    where: str
    user: str
    vhost: str


def parse_server(text: str, password: Callable[[], str]) -> Server:
    """``--server``: an amqp:// or amqps:// URL, or HOST:PORT (or HOST) as a shorthand for
    admin with ``password()`` (the one `make run` made) on vhost /. Anything else is a
    usage error that says what is wrong."""
    text = text.strip()
    if "://" not in text:
        if not text or "/" in text or "@" in text:
            usage(f"--server {text!r}: give amqp://USER:PASSWORD@HOST:PORT/ or HOST:PORT")
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "5672")
        if not host:
            usage(f"--server {text!r}: no host before the port")
        port = _port(text, port_text)
        secret = quote(password(), safe="")
        return Server(f"amqp://admin:{secret}@{host}:{port}/", f"{host}:{port}", "admin", "/")
    parts = urlsplit(text)
    if parts.scheme not in ("amqp", "amqps"):
        usage(f"--server: scheme {parts.scheme!r} is not amqp or amqps")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as error:
        usage(f"--server {_hidden(text)}: {error}")
    if not host:
        usage(f"--server {_hidden(text)}: no host")
    port = port or (5671 if parts.scheme == "amqps" else 5672)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    user = unquote(parts.username or "guest")
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return Server(text, where, user, vhost)


def _port(text: str, port_text: str) -> int:
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        usage(f"--server {text!r}: the port must be a number from 1 to 65535")
    return int(port_text)


def _hidden(url: str) -> str:
    """A URL as it may be printed: the password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def read_pair_file(path: str | Path) -> dict[str, Any] | None:
    """What `amqha pair` wrote: {"servers": [HOST:PORT, ...], "config_dir": ...}; None if
    there is no such file or it does not hold that."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    servers = data.get("servers") if isinstance(data, dict) else None
    if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
        return None
    return data


def default_servers(pair_file: str | Path = PAIR_FILE, config_dir: str = "config") -> list[str]:
    """The pair `make run` started: the addresses in PAIR_FILE if `amqha pair` wrote it
    (it picks other ports when 5672/5673 are taken), else the loopback 5672 and 5673."""
    data = read_pair_file(pair_file)
    if data is None:
        return [f"127.0.0.1:{port}" for port in DEFAULT_PORTS]
    return list(data["servers"])


def admin_password(config_dir: str | Path) -> Callable[[], str]:
    """The admin password `make run` made under CONFIG_DIR/local/, read when needed."""

    def read() -> str:
        from config.local import ADMIN_PASSWORD, LOCAL, read_credential

        password = read_credential(config_dir, ADMIN_PASSWORD)
        if password is None:
            where = Path(config_dir) / LOCAL / ADMIN_PASSWORD
            usage(
                f"no {where} (the admin password `make run` makes): run from the folder"
                " `make run` ran in, or give --server amqp://USER:PASSWORD@HOST:PORT/"
            )
        return password

    return read


def connect_error(error: BaseException, server: Server, timeout: float) -> ConsoleError:
    """Why a console connection failed, in the console's codes: the cause, not a guess."""
    text = str(error)
    if isinstance(error, ConsoleError):
        return error
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return ConsoleError("timeout", f"down: no answer within {timeout:g} s (timeout)")
    if isinstance(
        error, aiormq.exceptions.ProbableAuthenticationError | aiormq.exceptions.AuthenticationError
    ):
        return ConsoleError(
            "auth_failed",
            f"auth failed: the login of '{server.user}' was refused (wrong user name or password)",
        )
    if isinstance(error, aiormq.exceptions.ConnectionNotAllowed) or (
        isinstance(error, aiormq.exceptions.InvalidFrameError) and "Connection.Close" in text
    ):
        return ConsoleError(
            "access_refused",
            f"refused: '{server.user}' may not open vhost '{server.vhost}' (there is no such"
            " vhost, or the user has no access to it)",
        )
    if isinstance(error, aiormq.exceptions.IncompatibleProtocolError):
        return ConsoleError("not_amqp", "down: what answers there does not speak AMQP 0-9-1")
    for cause in _chain(error):
        if isinstance(cause, ssl.SSLError) or "[SSL" in str(cause):
            return ConsoleError("tls_error", f"down: TLS error: {_errno_text(cause)}")
    code = error.args[0] if error.args and isinstance(error.args[0], int) else None
    if isinstance(error, ConnectionRefusedError) or code == errno.ECONNREFUSED:
        return ConsoleError(
            "connection_refused", "down: connection refused (nothing listens there)"
        )
    if code is not None and code < 0:  # getaddrinfo's EAI_* codes
        host = server.where.rsplit(":", 1)[0]
        return ConsoleError(
            "name_not_resolved", f"down: the name {host} does not resolve ({_errno_text(error)})"
        )
    if code in (errno.ETIMEDOUT,):
        return ConsoleError("timeout", f"down: connecting timed out ({_errno_text(error)})")
    if code is not None:
        return ConsoleError("unreachable", f"down: {_errno_text(error)}")
    if isinstance(error, aiormq.exceptions.AMQPError | ConnectionError | OSError | EOFError):
        return ConsoleError(
            "connection_closed", f"down: the connection closed ({text or type(error).__name__})"
        )
    return ConsoleError("failed", f"{type(error).__name__}: {text}")


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _errno_text(error: BaseException) -> str:
    if len(error.args) >= 2 and isinstance(error.args[0], int):
        return str(error.args[1])
    return str(error) or type(error).__name__


def _reply_text(error: BaseException) -> str:
    """The server's reply text out of an aiormq channel error (ACCESS_REFUSED - ...)."""
    text = str(error)
    start = text.find('"')
    return text[start + 1 : text.rfind('"')] if start >= 0 and text.endswith('"') else text


class ConsoleClient:
    """One administrator connection; answers are pushed to a private reply queue.

    A command that makes the server step down closes this connection right after the
    answer: the answer is delivered before the close, so it is read all the same. Every
    failure is raised as a ``ConsoleError`` naming its cause.
    """

    def __init__(self, server: Server | str, timeout: float = 5.0) -> None:
        if isinstance(server, str):
            server = parse_server(server, lambda: usage("a full URL is needed here"))
        self.server = server
        self.url = server.url
        self.where = server.where
        self.timeout = timeout
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.pending: dict[str, asyncio.Future[Any]] = {}

    async def __aenter__(self) -> ConsoleClient:
        try:
            await asyncio.wait_for(self._open(), self.timeout)
        except BaseException as error:
            await self.__aexit__(None, None, None)
            if isinstance(error, KeyboardInterrupt | asyncio.CancelledError):
                raise
            raise connect_error(error, self.server, self.timeout) from None
        return self

    async def _open(self) -> None:
        self.connection = await aio_pika.connect(self.url, timeout=self.timeout)
        self.channel = await self.connection.channel()
        # A channel the server closes (403 for a user who may not use the console) fails
        # the requests waiting on it at once, with the server's reason.
        self.channel.close_callbacks.add(self._on_channel_closed)
        # Direct reply-to: answers come without a reply queue, so a vhost at its queue
        # limit still has a console (docs/operations.md, "Admin console").
        self.replies = await self.channel.get_queue(REPLY_TO, ensure=False)
        await self.replies.consume(self._on_reply, no_ack=True)
        self.user = self.server.user

    async def __aexit__(self, *exc: object) -> None:
        if self.connection is not None and not self.connection.is_closed:
            with contextlib.suppress(Exception):  # the server may have closed it first
                await self.connection.close()

    async def _on_channel_closed(self, *args: Any) -> None:
        error = next((a for a in args if isinstance(a, BaseException)), None)
        for future in self.pending.values():
            if not future.done():
                future.set_exception(error or ConnectionError("the channel closed"))

    async def _on_reply(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        future = self.pending.pop(message.correlation_id or "", None)
        if future is not None and not future.done():
            future.set_result(message.body)

    async def call(self, command: str, **args: Any) -> Any:
        answer = await self.request(json.dumps({"command": command, "args": args}).encode())
        if not answer.get("ok"):
            raise ConsoleError(answer.get("code", "refused"), answer.get("error", "refused"))
        return answer["result"]

    async def request(self, body: bytes) -> Any:
        """Publish one request body as it stands; the server's answer, decoded."""
        correlation_id = uuid.uuid4().hex
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[correlation_id] = future
        try:
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
            answer = await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            raise ConsoleError(
                "timeout", f"down: no answer from {self.where} within {self.timeout:g} s"
            ) from None
        except (
            aiormq.exceptions.ChannelAccessRefused,
            aiormq.exceptions.ChannelNotFoundEntity,
        ) as error:
            raise ConsoleError("not_authorised", f"refused: {_reply_text(error)}") from None
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as error:
            raise ConsoleError(
                "connection_closed", f"down: the connection closed ({_reply_text(error)})"
            ) from None
        finally:
            self.pending.pop(correlation_id, None)
        return json.loads(answer)


async def _status_all(servers: list[Server], timeout: float) -> list[tuple[Server, Any]]:
    async def one(server: Server) -> dict[str, Any]:
        try:
            async with ConsoleClient(server, timeout) as console:
                return dict(await console.call("status"))
        except ConsoleError as error:
            return {"error": {"code": error.code, "message": error.message}}

    answers = await asyncio.gather(*(one(server) for server in servers))
    return list(zip(servers, answers, strict=True))


def health(results: list[tuple[Server, Any]]) -> tuple[str, str]:
    """The pair's health from the servers' answers: ("healthy", text) or an error code
    (ERROR_EXITS) and why. A login refused comes first: nothing else can be known then."""
    for wanted in ("auth_failed", "access_refused", "not_authorised"):
        for server, status in results:
            if status.get("error", {}).get("code") == wanted:
                return wanted, f"{server.where}: {status['error']['message']}"
    for server, status in results:
        if "error" in status:
            return status["error"][
                "code"
            ], f"{server.where} does not answer: {status['error']['message']}"
    statuses = [status for _, status in results]
    active = [s for s in statuses if s.get("state") == "ACTIVE"]
    split = dual_active(statuses)  # both servers named, and what resolves it
    if split is not None:
        return "split", split
    if not active:
        peer_active = [
            s
            for s in statuses
            if (s.get("peer") or {}).get("state") == "ACTIVE" and (s.get("peer") or {}).get("alive")
        ]
        if len(statuses) == 1 and peer_active:
            return _sync_health(statuses)
        waiting = [s for s in statuses if s.get("takeover")]
        why = f": {waiting[0]['name']}'s {waiting[0]['takeover']}" if waiting else ""
        return "no_active", f"no server is ACTIVE{why}"
    leader = active[0]
    peer = leader.get("peer")
    if leader.get("role") != "standalone" and not (peer and peer.get("alive")):
        return "peer_lost", (
            f"{leader.get('name')} is ACTIVE alone: its peer is lost, nothing it confirms is"
            " held by a second server"
        )
    return _sync_health(statuses)


def _sync_health(statuses: list[dict[str, Any]]) -> tuple[str, str]:
    for status in statuses:
        replication = status.get("replication") or {}
        if not replication.get("enabled"):
            continue
        feed, follower = replication.get("feed"), replication.get("follower")
        if feed is not None and feed.get("state") != "in_sync":
            return (
                "not_in_sync",
                f"not in sync: {status.get('name')} is ACTIVE, {_replication_text(status)}",
            )
        if follower is not None and not follower.get("in_sync"):
            return "not_in_sync", (
                f"not in sync: {status.get('name')} is PASSIVE, {_replication_text(status)}"
            )
        if status.get("state") == "PASSIVE" and not status.get("in_sync", True):
            return "not_in_sync", f"not in sync: {status.get('name')} is PASSIVE and behind"
    for status in statuses:
        for problem in _witness_problems(status):
            return "witness_unheard", problem
    return "healthy", "healthy: one ACTIVE, its PASSIVE in sync"


def _witness_problems(status: dict[str, Any]) -> list[str]:
    """A server's witnesses that do not answer it, or whose answers fail verification."""
    witnesses = (status.get("witness") or {}).get("witnesses") or []
    return [
        f"{status.get('name')}'s witness {w.get('address')} {w['problem']}"
        for w in witnesses
        if isinstance(w, dict) and w.get("problem")
    ]


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
        elif feed.get("state") == "catching_up" and feed.get("lag_changes") is not None:
            text += f" (lag {feed.get('lag_changes')})"
    elif follower is not None:
        state = follower.get("state")
        if follower.get("in_sync"):
            text = "following, in sync"
        elif state == "closing":
            text = "following, snapshot on disk, not yet in sync"
        else:
            text = f"following, {str(state).replace('_', ' ')}"
        if follower.get("unapplied_runs"):
            # Acked (on its disk) and still to apply: a takeover applies them first.
            text += f", {follower['unapplied_runs']} runs to apply"
    else:
        text = ""
    quarantined = replication.get("quarantined") or []
    if quarantined:
        text += f", {len(quarantined)} quarantined"
    return text


def _print_status(results: list[tuple[Server, Any]], verdict: tuple[str, str]) -> None:
    header = (
        f"{'server':24} {'name':10} {'role':8} {'state':8} {'epoch':>5} {'peer':22} "
        f"{'clients':>7} {'queues':>6}  replication"
    )
    click.echo(header)
    for server, status in results:
        if "error" in status:
            click.echo(f"{server.where:24} {status['error']['message']}")
            continue
        peer = status.get("peer") or {}
        peer_text = (
            f"{peer.get('name')} {peer.get('state')}{'' if peer.get('alive') else ' (lost)'}"
            if peer
            else "not seen"
        )
        click.echo(
            f"{server.where:24} {status.get('name', ''):10} {status.get('role', ''):8} "
            f"{status.get('state', ''):8} {status.get('epoch', 0):>5} {peer_text:22} "
            f"{status.get('clients', 0):>7} {status.get('queues', 0):>6}"
            f"  {_replication_text(status)}"
        )
        if status.get("takeover"):
            click.echo(f"{'':24} {status.get('name')}: {status['takeover']}")
        for problem in _witness_problems(status):
            click.echo(f"{'':24} {problem}")
    click.echo(f"pair: {verdict[1]}")


# -- commands ---------------------------------------------------------------------------

# Each command's arguments: positional names, and its options (flag: True, else a value).
_SYNTAX: dict[str, tuple[tuple[str, ...], dict[str, bool]]] = {
    "status": ((), {}),
    "recover": ((), {}),
    "promote": ((), {"--force": True}),
    "connections": ((), {}),
    "queues": ((), {}),
    "exchanges": ((), {}),
    "bindings": ((), {}),
    "events": ((), {"--follow": True, "-f": True, "--limit": False}),
    "controller": (("stop|start",), {}),
    "purge": (("QUEUE",), {"--vhost": False}),
    "delete": (("QUEUE",), {"--vhost": False, "--if-empty": True, "--if-unused": True}),
    "close-connection": (("NAME",), {"--reason": False}),
    "federation": (("[add|remove]",), {}),
}
# ``federation add`` and ``federation remove``: their options (flag: True, else a value;
# --url may be given twice: a pair's two addresses).
_FEDERATION: dict[str, dict[str, bool]] = {
    "add": {
        "--exchange": False,
        "--upstream": False,
        "--url": False,
        "--vhost": False,
        "--no-bindings": True,
        "--forward": True,
        "--max-hops": False,
        "--delivery": False,
    },
    "remove": {"--exchange": False, "--upstream": False, "--vhost": False, "--drop-pending": True},
}
_REPEATED = ("--url",)


def syntax(command: str) -> str:
    if command == "federation":
        return " | ".join(
            " ".join(
                ["federation", action]
                + [f"[{o}]" if flag else f"[{o} {o[2:].upper()}]" for o, flag in known.items()]
            )
            for action, known in (("", {}), *_FEDERATION.items())
        ).replace("federation  ", "federation ")
    names, options = _SYNTAX[command]
    flags = " ".join(f"[{o}]" if flag else f"[{o} {o[2:].upper()}]" for o, flag in options.items())
    return " ".join(part for part in (command, *names, flags) if part)


def parse_words(words: list[str]) -> tuple[str, list[str], dict[str, Any]]:
    """A command line's words: the command, its positional arguments and its options."""
    if not words:
        usage(f"commands: {', '.join(COMMANDS)}")
    command, rest = words[0], list(words[1:])
    if command not in _SYNTAX:
        usage(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
    names, known = _SYNTAX[command]
    if command == "federation":
        action = rest[0] if rest and not rest[0].startswith("-") else None
        if action is not None and action not in _FEDERATION:
            usage("usage: federation | federation add ... | federation remove ...")
        known = _FEDERATION.get(action or "", {})
    positional: list[str] = []
    options: dict[str, Any] = {}
    while rest:
        word = rest.pop(0)
        if word.startswith("-") and word != "-":
            name, _, value = word.partition("=")
            if name not in known:
                usage(f"{command}: unknown option {name!r}; usage: {syntax(command)}")
            if known[name]:
                options[name] = True
            elif value or rest:
                given = value or rest.pop(0)
                if name in _REPEATED:
                    options.setdefault(name, []).append(given)
                else:
                    options[name] = given
            else:
                usage(f"{command}: {name} needs a value; usage: {syntax(command)}")
        else:
            positional.append(word)
    if command == "federation":
        if len(positional) > 1:
            usage("usage: federation | federation add ... | federation remove ...")
        return command, positional, options
    if len(positional) != len(names):
        usage(f"usage: {syntax(command)}")
    if command == "controller" and positional[0] not in ("stop", "start"):
        usage("usage: controller stop|start")
    return command, positional, options


async def run_command(
    servers: list[Server], words: list[str], timeout: float, as_json: bool
) -> int:
    """Run one command; its exit status (errors are raised as ``ConsoleError``)."""
    command, positional, options = parse_words(words)
    if command == "status":
        results = await _status_all(servers, timeout)
        verdict = health(results)
        if as_json:
            _echo_json(
                {
                    "servers": [{"server": s.where, **status} for s, status in results],
                    "health": {"code": verdict[0], "message": verdict[1]},
                }
            )
        else:
            _print_status(results, verdict)
        return ERROR_EXITS.get(verdict[0], EXIT_OK) if verdict[0] != "healthy" else EXIT_OK
    if command == "recover":
        results = await _status_all(servers, timeout)
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
                + _states(results),
            )
        async with ConsoleClient(target, timeout) as console:
            result = await console.call("recover")
        _done(as_json, "recover", target, result, f"recover: {result['result']}")
        return EXIT_OK
    if command == "promote":
        await _promote(servers, bool(options.get("--force")), timeout, as_json)
        return EXIT_OK
    if command == "controller":
        # Acts on exactly the first server named: never on another one because it is down.
        async with _reaching(servers[:1], timeout) as console:
            result = await console.call("controller", action=positional[0])
        _done(as_json, "controller", servers[0], result, str(result))
        return EXIT_OK
    if command == "events":
        limit = _limit(options.get("--limit", "50"))
        follow = bool(options.get("--follow") or options.get("-f"))
        await _events(servers, timeout, follow, as_json, limit)
        return EXIT_OK
    if command in ("purge", "delete"):
        target = await _active(servers, timeout, command)
        args: dict[str, Any] = {"queue": positional[0], "vhost": options.get("--vhost", "/")}
        if command == "delete":
            args.update(
                if_empty=bool(options.get("--if-empty")), if_unused=bool(options.get("--if-unused"))
            )
        async with ConsoleClient(target, timeout) as console:
            result = await console.call(command, **args)
        text = (
            f"purged {result['purged']} messages from queue '{result['queue']}' on {target.where}"
            if command == "purge"
            else f"deleted queue '{result['queue']}' ({result['messages']} messages) on {target.where}"
        )
        _done(as_json, command, target, result, text)
        return EXIT_OK
    if command == "federation" and positional:
        return await _federation_change(servers, positional[0], options, timeout, as_json)
    if command == "close-connection":
        await _close_connection(servers, positional[0], options.get("--reason"), timeout, as_json)
        return EXIT_OK
    # Reads one server's view: the first listed that answers.
    async with _reaching(servers, timeout) as console:
        if len(servers) > 1:
            click.echo(f"({console.where})", err=True)
        rows = await console.call(command)
    if as_json:
        _echo_json(rows)
    elif command == "federation":
        _print_rows([_federation_row(row) for row in rows])
    else:
        _print_rows(rows)
    return EXIT_OK


# The columns of `federation` as a table, in this order (--json has every field).
_FEDERATION_COLUMNS = (
    "exchange", "vhost", "upstream", "upstream_name", "source", "delivery", "state",
    "reason", "since", "attempts", "server", "bindings", "repairs", "buffer_depth", "in",
    "out", "dropped", "duplicates", "last_message", "active",
)  # fmt: skip


def _federation_row(link: dict[str, Any]) -> dict[str, Any]:
    """A link as a table row: its times in ISO 8601 (``confirmed`` bindings count the
    link's own probe binding: docs/federation.md, "What a link reports")."""
    row = {key: link.get(key) for key in _FEDERATION_COLUMNS}
    for key in ("since", "last_message"):
        if row[key] is not None:
            row[key] = iso_time(row[key])
    return row


_AUTH_CODES = ("auth_failed", "access_refused", "not_authorised")


def _federation_args(action: str, options: dict[str, Any]) -> dict[str, Any]:
    """``federation add|remove``'s options as the request's arguments (checked by the
    server, as the config's are)."""
    for required in ("--exchange", "--upstream"):
        if not options.get(required):
            usage(f"federation {action}: {required} is needed; usage: {syntax('federation')}")
    args: dict[str, Any] = {
        "action": action,
        "exchange": options["--exchange"],
        "upstream": options["--upstream"],
        "vhost": options.get("--vhost", "/"),
    }
    if action == "remove":
        if options.get("--drop-pending"):
            args["drop_pending"] = True
        return args
    if "--url" in options:
        args["urls"] = options["--url"]
    if options.get("--no-bindings"):
        args["bindings"] = False
    if options.get("--forward"):
        args["forward"] = True
    if "--max-hops" in options:
        text = str(options["--max-hops"])
        digits = text[1:] if text.startswith("-") else text
        # A number as a number (the server says if it is out of range); else as given.
        args["max_hops"] = int(text) if digits.isdigit() and len(digits) < 10 else text
    if "--delivery" in options:
        args["delivery"] = options["--delivery"]
    return args


async def _federation_order(
    servers: list[Server], timeout: float
) -> tuple[list[Server], list[tuple[Server, ConsoleError]]]:
    """The servers a run-time federation change goes to, the ACTIVE first, and those
    that do not answer. A refused login is raised: nothing is changed then."""
    if len(servers) == 1:
        return servers, []
    results = await _status_all(servers, timeout)
    for wanted in _AUTH_CODES:
        for server, status in results:
            error = status.get("error") or {}
            if error.get("code") == wanted:
                raise ConsoleError(wanted, f"{server.where}: {error.get('message')}")
    down = [
        (s, ConsoleError(status["error"]["code"], status["error"]["message"]))
        for s, status in results
        if "error" in status
    ]
    answering = [(s, status) for s, status in results if "error" not in status]
    if not answering:
        raise ConsoleError(
            down[0][1].code,
            "no server answered:\n  " + "\n  ".join(f"{s.where}: {e.message}" for s, e in down),
        )
    answering.sort(key=lambda item: item[1].get("state") != "ACTIVE")
    return [s for s, _ in answering], down


async def _federation_change(
    servers: list[Server], action: str, options: dict[str, Any], timeout: float, as_json: bool
) -> int:
    """``federation add|remove`` on every server named: each keeps its run-time
    federations (a pair's PASSIVE runs them once it leads). The ACTIVE is asked first: what
    it refuses changes nothing anywhere. A server that does not answer is named, and the
    exit status says so: the same command, run again, finishes the change."""
    args = _federation_args(action, options)
    order, missed = await _federation_order(servers, timeout)
    done: list[tuple[Server, dict[str, Any]]] = []
    absent: list[tuple[Server, ConsoleError]] = []
    for server in order:
        try:
            async with ConsoleClient(server, timeout) as console:
                result = await console.call("federation", **args)
        except ConsoleError as error:
            if action == "remove" and error.code == "not_found":
                absent.append((server, error))  # removed there before
                continue
            if not done and not absent:
                raise
            missed.append((server, error))
            continue
        done.append((server, result))
        if action == "remove":
            # The others delete nothing upstream the first did, and name the same queue.
            args.update(buffer_queue=result["buffer_queue"])
            if result.get("upstream_deleted"):
                args.update(upstream_deleted=True)
    if not done:
        raise absent[0][1] if absent else missed[0][1]
    ok = not missed
    if as_json:
        _echo_json(
            {
                "ok": ok,
                "command": f"federation {action}",
                "servers": [{"server": s.where, "result": r} for s, r in done],
                "missed": [{"server": s.where, **e.as_json()["error"]} for s, e in missed],
            }
        )
    else:
        for server, result in done:
            click.echo(f"{server.where}: {_federation_text(action, result)}")
        for server, failure in missed:
            click.echo(f"{server.where}: not changed: {failure.message}", err=True)
        if missed:
            click.echo("run the same command again once every server answers", err=True)
    if ok:
        return EXIT_OK
    return min(failure.exit_code for _, failure in missed)


def _federation_text(action: str, result: dict[str, Any]) -> str:
    link = f"exchange '{result['exchange']}' (vhost {result['vhost']}) <- '{result['upstream']}'"
    if action == "add":
        if result.get("unchanged"):
            return f"{link}: already there, unchanged"
        where = "running here" if result.get("running_here") else "runs when this server leads"
        return f"{link}: added ({where})"
    queue = f"buffer queue '{result['buffer_queue']}'"
    if result.get("upstream_deleted"):
        upstream = f"{queue} deleted upstream"
    elif result.get("pending"):
        upstream = f"{queue} NOT deleted: {result['pending']}"
    else:
        upstream = f"{queue} deleted by the ACTIVE, or once this server leads"
    forward = ""
    if result.get("forward_queue_removed"):
        forward = f"; forward queue removed ({result.get('dropped', 0)} messages dropped)"
    return f"{link}: removed; {upstream}{forward}"


def _limit(text: str) -> int:
    if not str(text).isdigit() or not 0 < int(text) <= 1000:
        usage("events: --limit takes a number from 1 to 1000")
    return int(text)


def _states(results: list[tuple[Server, Any]]) -> str:
    return "\n".join(
        f"  {s.where}: {status.get('name', '?')} "
        f"{status.get('state') or status.get('error', {}).get('message')}"
        for s, status in results
    )


def _done(as_json: bool, command: str, server: Server, result: Any, text: str) -> None:
    if as_json:
        _echo_json({"ok": True, "command": command, "server": server.where, "result": result})
    else:
        click.echo(text)


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


async def _active(servers: list[Server], timeout: float, command: str) -> Server:
    """The server a change to queues goes to: the ACTIVE one (or the only one named)."""
    if len(servers) == 1:
        return servers[0]
    results = await _status_all(servers, timeout)
    for server, status in results:
        if status.get("state") == "ACTIVE":
            return server
    verdict = health(results)
    code = (
        verdict[0]
        if verdict[0] in ("auth_failed", "access_refused", "not_authorised")
        else "no_active"
    )
    raise ConsoleError(code, f"{command}: no server is ACTIVE; status is:\n" + _states(results))


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
        _done(as_json, "close-connection", server, result, text)
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
        results = await _status_all(servers, timeout)
        candidates = [
            s for s, status in results if "error" not in status and status.get("state") != "ACTIVE"
        ]
        if len(candidates) != 1:
            raise ConsoleError(
                "refused",
                "promote: name the server to promote with --server URL; status is:\n"
                + _states(results),
            )
        target = candidates[0]
    async with ConsoleClient(target, timeout) as console:
        result = await console.call("promote", force=force)
    _done(as_json, "promote", target, result, f"promote: {result['result']}")


def _print_rows(rows: list[dict[str, Any]]) -> None:
    if not rows:
        click.echo("(none)")
        return
    # Every key any row has, in the order first seen (an orphan buffer queue's `orphan`).
    keys = list(dict.fromkeys(key for row in rows for key in row))
    cells = [{k: _cell(row.get(k)) for k in keys} for row in rows]
    widths = {k: max(len(k), *(len(c[k]) for c in cells)) for k in keys}
    click.echo("  ".join(k.ljust(widths[k]) for k in keys).rstrip())
    for cell in cells:
        click.echo("  ".join(cell[k].ljust(widths[k]) for k in keys).rstrip())


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, default=str) if value else ""
    return str(value)


def iso_time(ts: Any) -> str:
    """A log record's wall-clock time as ISO 8601 in UTC, to the millisecond."""
    try:
        moment = datetime.datetime.fromtimestamp(float(ts), tz=datetime.UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return str(ts)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# Fields of event records that hold a wall-clock time (seconds since the epoch).
_TIME_FIELDS = frozenset({"ts", "last_seen"})


def _format_event(event: dict[str, Any]) -> str:
    extra = {
        k: v
        for k, v in event.items()
        # The envelope (the pair is the same on every line of a server's log), and what
        # a record leaves out: a field with no value is not printed.
        if k not in ("v", "ts", "pair", "node", "role", "epoch", "state", "event") and v is not None
    }
    details = " ".join(
        f"{k}={iso_time(v) if k in _TIME_FIELDS else _cell(v)}" for k, v in extra.items()
    )
    return (
        f"{iso_time(event.get('ts'))} {event.get('node')} [{event.get('state')} "
        f"e{event.get('epoch')}] {event.get('event')} {details}"
    ).rstrip()


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
        _print_events(sorted((e for b in batches for e in b), key=_event_time)[-limit:], as_json)
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
            _print_events(sorted((e for b in batches for e in b), key=_event_time), as_json)


def _event_time(event: dict[str, Any]) -> float:
    ts = event.get("ts")
    return float(ts) if isinstance(ts, int | float) else 0.0


def _print_events(events: list[dict[str, Any]], as_json: bool) -> None:
    for event in events:
        if as_json:
            click.echo(json.dumps({"time": iso_time(event.get("ts")), **event}, default=str))
        else:
            click.echo(_format_event(event))


def _emit_error(error: ConsoleError, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(error.as_json(), indent=2))
    else:
        click.echo(f"error: {error.message}", err=True)


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
        _emit_error(error, as_json)
        return error.exit_code
    except Exception as error:  # a bug must still not print a traceback at an operator
        _emit_error(ConsoleError("failed", f"{type(error).__name__}: {error}"), as_json)
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
            _emit_error(ConsoleError("usage", error.format_message()), True)
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
    promote [--force]               make the server that is not ACTIVE serve, when its peer
                                    is down (--force: even if the peer is ACTIVE, which then
                                    steps down; messages queued there stay there)
    connections | queues | exchanges | bindings      one server's view
    events [--follow] [--limit N]   both servers' failover logs, merged in time order
    purge QUEUE [--vhost V]         drop a queue's ready messages (on the ACTIVE)
    delete QUEUE [--if-empty] [--if-unused] [--vhost V]
    close-connection NAME [--reason TEXT]   NAME as `connections` lists it (HOST:PORT)
    controller stop|start           stop or start the first server's failover controller
    federation                      the federation links (one server's view)
    federation add --exchange X --upstream NAME [--url URL ...] [--vhost V] [--no-bindings]
                   [--forward] [--max-hops N] [--delivery confirm|drop]
    federation remove --exchange X --upstream NAME [--vhost V] [--drop-pending]
                                    change the links at run time (every server named)

    \b
    Exit status: 0 done / healthy, 1 the command failed or was refused, 2 bad usage,
    3 a server down or none ACTIVE, 4 not in sync, 5 not authorised, 6 login refused,
    7 two servers ACTIVE (docs/operations.md).
    """
    # A server that is down is reported as such; aiormq's own error lines would repeat it.
    logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)
    logging.getLogger("aio_pika").setLevel(logging.CRITICAL)
    as_json = as_json or "--json" in words
    try:
        targets = _servers(servers, pair_file)
    except ConsoleError as error:
        _emit_error(error, as_json)
        sys.exit(error.exit_code)
    if words:
        sys.exit(_run(targets, list(words), timeout, as_json))
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
            _emit_error(ConsoleError("usage", str(error)), as_json)
        except KeyboardInterrupt:
            click.echo()
        sys.stdout.flush()
