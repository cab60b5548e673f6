"""The admin console, client side: reaching a server as ``amqha console`` does.

Owns: ``ConsoleClient`` (aio-pika), which sends JSON requests to a server's reserved
``amq.console`` exchange (answered by ``amqha/console_service.py``); the console's exit
statuses and error codes (``ConsoleError``), the ``--server`` forms, reading the pair
file ``amqha pair`` writes for it and the admin password `make run` made, and why a
connection failed, in the console's codes (docs/operations.md, "Console"). The command
itself is ``console_cli.py``; what each command does, ``console_commands.py``.

Must not know: the broker (it speaks AMQP to servers like any client).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, unquote, urlsplit

import aio_pika
import aiormq
import click

from .core.reserved import CONSOLE_EXCHANGE, REPLY_TO
from .ports import PAIR_FILE

log = logging.getLogger(__name__)

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
EXIT_CONFIG_DRIFT = 9  # the pair serves, but the two servers' shared settings differ

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
    "disk_failed": EXIT_DOWN,
    "not_in_sync": EXIT_NOT_IN_SYNC,
    "auth_failed": EXIT_AUTH_FAILED,
    "access_refused": EXIT_NOT_AUTHORISED,
    "not_authorised": EXIT_NOT_AUTHORISED,
    "split": EXIT_SPLIT,
    "witness_unheard": EXIT_WITNESS,
    "config_drift": EXIT_CONFIG_DRIFT,
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
