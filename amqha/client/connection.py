"""Connections over the pair: ``connect`` and ``connect_robust``.

Owns: connecting to whichever listed server is ACTIVE (following redirects, for up to
``retry_for`` s), ``FailoverRobustConnection`` (an aio-pika robust connection that moves
to the next server after a failover, each connection watched by amqha.client_watch), and
the quieting of what aio-pika and aiormq log about a connection while it fails over
(``QuietDuringFailover``: passed on at DEBUG on ``amqha.client.during_failover``;
docs/client.md, "What is logged").

Must not know: publishers, consumers and what they hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import aio_pika
import aiormq
from yarl import URL

from amqha.client_watch import DEFAULT_SILENT_AFTER, WatchedTransport, Watching
from amqha.gate import redirect_target

from .failover_log import FailoverLog, current_failover
from .servers import (
    ServerList,
    address_of,
    attempt_redirects,
    client_properties,
    watched_servers,
)

_passed_on = logging.getLogger("amqha.client.during_failover")
# Loggers of aio-pika and aiormq that speak of a connection failing over, and the highest
# level quieted on each. Those of aio_pika.robust_connection are dropped (each names the
# connection's URL, which is by then the next server's, not the one the attempt tried);
# FailoverLog logs each attempt with its own address instead. aiormq.channel's errors
# (an application's consumer callback failing) always go through.
QUIETED_LOGGERS = {
    "aio_pika.robust_connection": logging.CRITICAL,
    "aio_pika.robust_channel": logging.CRITICAL,
    "aio_pika.channel": logging.CRITICAL,
    "aio_pika.tools": logging.CRITICAL,
    "aio_pika.message": logging.CRITICAL,
    "aiormq.connection": logging.CRITICAL,
    "aiormq.channel": logging.WARNING,
}


def _failover_in_args(record: logging.LogRecord) -> FailoverLog | None:
    """The failover log of a FailoverRobustConnection named by a record (the connection
    itself, or a callback of one of its channels)."""
    args = record.args if isinstance(record.args, tuple) else ()
    for arg in args:
        for _ in range(4):
            if isinstance(arg, FailoverRobustConnection):
                return arg.failover
            arg = (
                getattr(arg, "callback", None)
                or getattr(arg, "__self__", None)
                or getattr(arg, "_connection", None)
            )
            if arg is None:
                break
    return None


def _connection_lost(record: logging.LogRecord) -> bool:
    """A record whose cause is the server's connection lost: aiormq logs it (its reader
    ended) the moment the socket dies, before the failover it starts has opened."""
    error = record.exc_info[1] if record.exc_info else None
    return isinstance(
        error, (aiormq.exceptions.AMQPConnectionError, ConnectionError, asyncio.IncompleteReadError)
    )


class QuietDuringFailover(logging.Filter):
    """Passes on at DEBUG what aio-pika and aiormq log (up to ``highest``) about a
    connection while it fails over; everything else, and everything outside a failover,
    goes through unchanged."""

    def __init__(self, highest: int = logging.CRITICAL) -> None:
        super().__init__()
        self.highest = highest

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > self.highest:
            return True
        failover = current_failover.get()
        if failover is None or not failover.quiet:
            failover = _failover_in_args(record) or failover
        if failover is None or not (failover.quiet or _connection_lost(record)):
            return True
        message = record.getMessage()
        if record.levelno >= logging.ERROR:
            failover.noted(message)
        if record.name != "aio_pika.robust_connection":
            _passed_on.debug("%s: %s (%s)", failover.name, message, record.name)
        return False


for _name, _highest in QUIETED_LOGGERS.items():
    logging.getLogger(_name).addFilter(QuietDuringFailover(_highest))


def _recorded(
    made: list[aio_pika.Connection], transport_factory: aiormq.TransportFactory | None = None
) -> Any:
    """A connection class for ``aio_pika.connect`` that keeps each connection it makes
    (and gives aiormq the transport factory, which aio-pika does not pass on)."""

    def make(*args: Any, **kwargs: Any) -> aio_pika.Connection:
        connection = aio_pika.Connection(*args, **kwargs)
        if transport_factory is not None:
            connection.kwargs["transport_factory"] = transport_factory
        made.append(connection)
        return connection

    return make


async def connect(
    urls: Sequence[str | URL] | str | ServerList,
    *,
    retry_for: float = 15.0,
    retry_interval: float = 0.05,
    attempt_timeout: float = 5.0,
    client_properties_extra: dict[str, Any] | None = None,
    failover: FailoverLog | None = None,
    transport_factory: aiormq.TransportFactory | None = None,
    **kwargs: Any,
) -> aio_pika.abc.AbstractConnection:
    """Connect to whichever listed server is ACTIVE, following redirects, for up to ``retry_for`` s.

    Each failed attempt is reported to ``failover`` (a log of its own when not given),
    which the caller tells when the server it reached serves (``FailoverLog.served``).
    A ``ServerList`` given as ``urls`` carries on from the server it was at. The
    connection is a plain aio-pika one: not watched, and with the URL's heartbeat (put
    one there: docs/client.md, "A silent server").
    """
    servers = (
        urls
        if isinstance(urls, ServerList)
        else ServerList([urls] if isinstance(urls, str) else urls)
    )
    properties = client_properties(client_properties_extra)
    own_log = failover is None
    attempts = failover or FailoverLog("connection")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + retry_for
    last_error: BaseException | None = None
    while True:
        redirects: list[str] = []
        token = attempt_redirects.set(redirects)
        quiet = current_failover.set(attempts)
        url = servers.current()
        made: list[aio_pika.Connection] = []
        try:
            connection = await aio_pika.connect(
                url,
                client_properties=properties,
                timeout=attempt_timeout,
                connection_class=_recorded(made, transport_factory),
                **kwargs,
            )
            if own_log:
                attempts.served(address_of(url))
            return connection
        except (TimeoutError, aiormq.exceptions.AMQPError, ConnectionError, OSError) as error:
            last_error = error
            attempts.attempt_failed(address_of(url), error, redirect_target(error, redirects))
            servers.failed(error, redirects)
            # Closed now: left to the garbage collector, a failed attempt's connection
            # schedules its own close on whatever loop runs then.
            for attempt in made:
                with contextlib.suppress(Exception):
                    await attempt.close()
        finally:
            current_failover.reset(quiet)
            attempt_redirects.reset(token)
        if loop.time() >= deadline:
            raise ConnectionError(
                f"no ACTIVE server among {len(servers.urls)} after {retry_for} s"
            ) from last_error
        if servers.redirected is None:
            await asyncio.sleep(retry_interval)


class FailoverRobustConnection(aio_pika.RobustConnection):
    """An aio-pika robust connection that moves between the pair's servers.

    aio-pika calls ``_on_connection_close`` after every failed attempt and every lost
    connection; that is where the next server is chosen (the redirect target, or the
    next one in the list). aio-pika's own loop then reconnects after ``reconnect_interval``.
    Each connection is watched (amqha.client_watch): a server silent for
    ``silent_after`` s has its socket cut, which aio-pika sees as a lost connection.
    """

    def __init__(
        self,
        servers: ServerList,
        name: str = "connection",
        warn_after: float = 10.0,
        silent_after: float = DEFAULT_SILENT_AFTER,
        **kwargs: Any,
    ) -> None:
        self.servers = servers
        self._attempt_redirects: list[str] = []
        self.failover = FailoverLog(name, warn_after)
        self.watching = Watching(silent_after)
        self.wire = WatchedTransport()
        super().__init__(servers.current(), **kwargs)
        self.kwargs["transport_factory"] = self.wire  # aio-pika passes it on to aiormq

    async def connect(self, timeout: Any = None) -> None:
        # The reconnect task inherits this context: every attempt it makes reports here.
        attempt_redirects.set(self._attempt_redirects)
        current_failover.set(self.failover)
        await super().connect(timeout)

    async def _on_connected(self) -> None:
        transport = self.transport
        if transport is not None:  # watched from now on: restoring channels can hang too
            await self.watching.end()
            self.watching.begin(transport.connection, self.wire, address_of(self.url))
        await super()._on_connected()  # the channels are restored by now
        self.failover.served(address_of(self.url))

    async def close(self, exc: aiormq.abc.ExceptionType | None = asyncio.CancelledError) -> None:
        await self.watching.end()
        await super().close(exc)

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        error: BaseException | None
        try:
            error = closing.exception()
        except asyncio.CancelledError:
            error = None
        heard_ago, silence = await self.watching.end()
        error = silence or error
        if not self._close_called:
            current = self.servers.current()
            if self.connected.is_set():
                self.failover.lost(address_of(current), error, heard_ago)
                self.servers.lost(current, error)
            else:
                target = redirect_target(error, self._attempt_redirects)
                self.failover.attempt_failed(address_of(current), error, target)
                self.servers.failed(error, self._attempt_redirects)
            self._attempt_redirects.clear()
            self.url = self.servers.current()
        await super()._on_connection_close(closing)


async def connect_robust(
    urls: Sequence[str | URL] | str,
    *,
    reconnect_interval: float = 0.05,
    client_properties_extra: dict[str, Any] | None = None,
    name: str = "connection",
    warn_after: float = 10.0,
    silent_after: float = DEFAULT_SILENT_AFTER,
    **kwargs: Any,
) -> aio_pika.abc.AbstractRobustConnection:
    """A robust connection over the pair: reconnects to the ACTIVE server after a failover.

    ``name`` starts its log lines; a failover still going on after ``warn_after`` s is
    reported at WARNING. A URL without a heartbeat asks for ``DEFAULT_HEARTBEAT`` s; a
    server that owes a frame and sends none for ``silent_after`` s is left
    (docs/client.md, "A silent server")."""
    servers = watched_servers(urls)
    connection = FailoverRobustConnection(
        servers,
        name=name,
        warn_after=warn_after,
        silent_after=silent_after,
        client_properties=client_properties(client_properties_extra),
        reconnect_interval=reconnect_interval,
        fail_fast=False,
        **kwargs,
    )
    await connection.connect(timeout=kwargs.get("timeout"))
    return connection
