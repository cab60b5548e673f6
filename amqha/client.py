"""Client helper for the pair: aio-pika connections that find the ACTIVE server.

``connect(urls)`` and ``connect_robust(urls)`` announce the ``connection.redirect``
capability (keeping aio-pika's default capabilities), follow a server's
Connection.Redirect (or the ``NOT_ACTIVE - active server is HOST:PORT`` close that
plain clients get), and fail over between the listed servers. The robust
connection reconnects to whichever server is ACTIVE after a failover, and
aio-pika restores its channels, queues and consumers there.

``connect_robust``, ``Publisher`` and ``Consumer`` also leave a server that stops
answering (a frozen one keeps its connections open): amqha.client_watch owns that rule,
the heartbeat their URLs ask for by default, and ``silent_after``.

Each failover is logged once, at INFO on ``amqha.client``: which server was lost,
which one serves now and how long it took, from the last frame heard from the lost
one. The attempts in between are logged at
DEBUG with the address each one tried; what aio-pika and aiormq log about a
connection while it fails over is passed on at DEBUG only (see ``FailoverLog``), and a
failover that lasts is reported at WARNING, with the last error, after ``warn_after``
seconds and then at doubling intervals.

``Publisher`` keeps each message until its confirm and sends the unconfirmed ones
again on the new ACTIVE after a failover (at least once; each message has a message
id); ``Consumer`` consumes through failovers and never sends the new ACTIVE an ack of
a delivery from the lost server; ``Deduplicator`` remembers recent message ids.
See docs/client.md.

Connection.Redirect is AMQP 0-9 (class 10, method 42); 0-9-1 dropped it and pamqp
does not know it, so importing this module registers it with pamqp's method table.
The frame is then decoded by aiormq's reader; the host it names is handed back
through a context variable set for each connection attempt.

    connection = await amqha.client.connect_robust(
        ["amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:guest@127.0.0.1:5673/"]
    )
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import typing
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aio_pika
import aiormq
from pamqp import base, commands
from yarl import URL

from amqha.client_watch import (
    DEFAULT_HEARTBEAT,
    DEFAULT_SILENT_AFTER,
    WatchedTransport,
    Watching,
    with_heartbeat,
)

from .gate import redirect_target

log = logging.getLogger("amqha.client")

DEFAULT_CAPABILITIES = {
    "authentication_failure_close": True,
    "basic.nack": True,
    "connection.blocked": True,
    "consumer_cancel_notify": True,
    "publisher_confirms": True,
}
REDIRECT_CAPABILITY = "connection.redirect"


class ConnectionRedirect(base.Frame):
    """Connection.Redirect (AMQP 0-9): the server names the server to use instead."""

    __slots__: typing.ClassVar[list[str]] = ["host", "known_hosts"]
    frame_id: typing.ClassVar[int] = 42
    index: typing.ClassVar[int] = 0x000A002A
    name: typing.ClassVar[str] = "Connection.Redirect"
    synchronous: typing.ClassVar[bool] = False
    _host = "shortstr"
    _known_hosts = "shortstr"

    def __init__(self, host: str = "", known_hosts: str = "") -> None:
        self.host = host
        self.known_hosts = known_hosts

    def unmarshal(self, data: bytes) -> None:
        super().unmarshal(data)
        slot = _redirects.get(None)
        if slot is not None:
            slot.append(self.host)


commands.INDEX_MAPPING.setdefault(ConnectionRedirect.index, ConnectionRedirect)

# Each connection attempt gets a fresh list; the frame decoder appends the host it was sent to.
_redirects: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "amqha_redirects", default=None
)


def client_properties(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    properties = dict(extra or {})
    capabilities = dict(DEFAULT_CAPABILITIES)
    capabilities.update(properties.get("capabilities") or {})
    capabilities[REDIRECT_CAPABILITY] = True
    properties["capabilities"] = capabilities
    return properties


def _with_address(url: URL, address: str) -> URL:
    host, _, port = address.rpartition(":")
    return url.with_host(host.strip("[]")).with_port(int(port))


class ServerList:
    """The listed servers, the one to try next, and redirects that jump the queue."""

    def __init__(self, urls: Sequence[str | URL]) -> None:
        if not urls:
            raise ValueError("give at least one server URL")
        self.urls = [URL(str(u)) for u in urls]
        self.position = 0
        self.redirected: URL | None = None

    def current(self) -> URL:
        return self.redirected or self.urls[self.position]

    def lost(self, url: URL, error: BaseException | None = None) -> None:
        """The server at ``url`` served and is gone: next, the server its closing named
        (``NOT_ACTIVE - active server is …``, a handover), else the listed one after it."""
        self.redirected = None
        listed = [(u.host, u.port) for u in self.urls]
        if (url.host, url.port) in listed:
            self.position = (listed.index((url.host, url.port)) + 1) % len(self.urls)
        target = redirect_target(error, [])
        if target is not None:
            self.redirected = _with_address(url, target)

    def failed(self, error: BaseException | None, redirects: list[str]) -> None:
        target = redirect_target(error, redirects)
        came_from = self.current()
        if target is not None and self.redirected is None:
            self.redirected = _with_address(came_from, target)
            return
        self.redirected = None
        self.position = (self.position + 1) % len(self.urls)


def watched_servers(urls: Sequence[str | URL] | str) -> ServerList:
    """The listed servers, each URL asking for a heartbeat unless it names one."""
    listed = [urls] if isinstance(urls, str) else urls
    if not listed:
        raise ValueError("give at least one server URL")
    return ServerList([with_heartbeat(URL(str(url)), DEFAULT_HEARTBEAT) for url in listed])


def address_of(url: URL) -> str:
    """``host:port`` of a server URL (an IPv6 host in brackets), as log lines name it."""
    host = url.host or ""
    return f"[{host}]:{url.port}" if ":" in host else f"{host}:{url.port}"


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "closed"
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class FailoverLog:
    """What one client logs about its failovers (docs/client.md, "What is logged").

    A failover opens when the server the client used is lost (``lost``) and closes when
    a server lets it in again (``served``), with one INFO line: the server lost, the one
    serving now, how long it took. Each failed attempt in between is logged at DEBUG,
    naming the address it tried; a failover still open after ``warn_after`` s is
    reported at WARNING with its last error, again after twice as long, and so on.
    While one is open (``quiet``), what aio-pika and aiormq log about this client's
    connection is passed on at DEBUG only.
    """

    def __init__(
        self,
        name: str = "connection",
        warn_after: float = 10.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.warn_after = warn_after
        self.clock = clock or time.monotonic
        self.failovers = 0
        self._reset()

    def _reset(self) -> None:
        self.lost_address: str | None = None
        self.started: float | None = None
        self.attempts = 0
        self.redirects = 0
        self.last_error: str | None = None
        self.next_warning = self.warn_after

    @property
    def quiet(self) -> bool:
        return self.started is not None

    def lost(self, address: str, error: BaseException | None, heard_ago: float = 0.0) -> None:
        """The server this client was using is gone; it last sent a frame ``heard_ago`` s
        ago, where the failover's clock starts (a frozen server fell silent before the
        client noticed)."""
        if self.started is not None:
            return
        self.started = self.clock() - heard_ago
        self.lost_address = address
        self.last_error = f"{address}: {_describe(error)}"
        log.debug("%s: lost %s (%s)", self.name, address, _describe(error))

    def attempt_failed(
        self, address: str, error: BaseException | None, redirected_to: str | None = None
    ) -> None:
        if self.started is None:  # the first connect: no failover, but the same bookkeeping
            self.started = self.clock()
        self.attempts += 1
        if redirected_to is not None:
            self.redirects += 1
            log.debug("%s: %s redirected us to %s", self.name, address, redirected_to)
        else:
            self.last_error = f"{address}: {_describe(error)}"
            log.debug("%s: attempt at %s failed (%s)", self.name, address, _describe(error))
        self._warn_if_long()

    def noted(self, text: str) -> None:
        """An error aio-pika or aiormq logged during the failover: kept as the last one."""
        self.last_error = text

    def _warn_if_long(self) -> None:
        assert self.started is not None
        waited = self.clock() - self.started
        if waited < self.next_warning:
            return
        since = f" since {self.lost_address} was lost" if self.lost_address else ""
        log.warning(
            "%s: no ACTIVE server for %.1f s%s (%d attempts; last error %s)",
            self.name,
            waited,
            since,
            self.attempts,
            self.last_error,
        )
        while self.next_warning <= waited:
            self.next_warning *= 2

    def served(self, address: str) -> None:
        """A server let this client in (and, for a robust connection, restored its channels)."""
        if self.started is None:
            return
        took = self.clock() - self.started
        if self.lost_address is not None:
            self.failovers += 1
            log.info(
                "%s failed over: lost %s, %s serves now, after %.3f s "
                "(%d failed attempts, %d redirects)",
                self.name,
                self.lost_address,
                address,
                took,
                self.attempts,
                self.redirects,
            )
        else:
            log.debug(
                "%s: connected to %s after %.3f s (%d failed attempts, %d redirects)",
                self.name,
                address,
                took,
                self.attempts,
                self.redirects,
            )
        self._reset()


# The failover log of the client whose task logs (set in the tasks that connect; the
# tasks aio-pika and aiormq start from there inherit it).
_current_failover: contextvars.ContextVar[FailoverLog | None] = contextvars.ContextVar(
    "amqha_failover", default=None
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
        failover = _current_failover.get()
        if failover is None or not failover.quiet:
            failover = _failover_in_args(record)
        if failover is None or not failover.quiet:
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
        token = _redirects.set(redirects)
        quiet = _current_failover.set(attempts)
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
            _current_failover.reset(quiet)
            _redirects.reset(token)
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
        _redirects.set(self._attempt_redirects)
        _current_failover.set(self.failover)
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


# -- at least once through failovers: Publisher, Consumer, Deduplicator (docs/client.md) ----


class PublisherFull(RuntimeError):
    """The publisher holds ``max_pending`` unconfirmed messages and was told to raise."""


class PublisherClosed(RuntimeError):
    """The publisher was closed before this message was confirmed."""


class PublishRefused(aio_pika.exceptions.DeliveryError):
    """The server refused the message (Basic.Nack or Basic.Reject): it was not sent again."""


class PublishFailed(RuntimeError):
    """The server closed the channel over this message alone (a missing exchange, a
    refused permission): it was not sent again. The server's error is the cause."""


@dataclass
class _Held:
    """One message the publisher keeps until its confirm."""

    seq: int
    exchange: str
    routing_key: str
    body: bytes
    properties: aiormq.spec.Basic.Properties
    confirmed: asyncio.Future[None]
    generation: int = 0  # the connection it was last sent on (0: not sent yet)
    sends: int = 0
    error: BaseException | None = None  # why its last send got no confirm


def _as_message(
    message: aio_pika.abc.AbstractMessage | bytes, persistent: bool
) -> aio_pika.abc.AbstractMessage:
    if isinstance(message, bytes | bytearray | memoryview):
        mode = (
            aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
        )
        return aio_pika.Message(bytes(message), delivery_mode=mode)
    return message


class _Link:
    """The loop of a Publisher or Consumer over connections: connect to the ACTIVE, open
    a channel and run on it until it is lost (or its server falls silent: see
    amqha.client_watch), connect again (the failover logged once); until closed."""

    publisher_confirms = False

    def __init__(
        self,
        urls: Sequence[str | URL] | str,
        name: str,
        setup: Callable[[aio_pika.abc.AbstractChannel], Awaitable[Any]] | None,
        attempt_timeout: float,
        warn_after: float,
        connect_kwargs: dict[str, Any],
        silent_after: float = DEFAULT_SILENT_AFTER,
    ) -> None:
        self.servers = watched_servers(urls)
        self.watching = Watching(silent_after)
        self.setup = setup
        self.attempt_timeout = attempt_timeout
        self.connect_kwargs = connect_kwargs
        self.failover = FailoverLog(name, warn_after)
        self.serving = asyncio.Event()
        self.closing = False
        self.task: asyncio.Task[None] | None = None
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.channel: aio_pika.abc.AbstractChannel | None = None
        self.underlay: aiormq.abc.AbstractChannel | None = None  # None while failing over
        self.server: str | None = None  # the address of the server in use
        self.channel_refused = False  # the server closed the last channel over an error
        self.setup_error: BaseException | None = None  # the server's answer to setup
        self._setup_failed = asyncio.Event()
        self._lost = asyncio.Event()

    @property
    def failovers(self) -> int:
        """How many times this client moved to another server after losing one."""
        return self.failover.failovers

    async def _start(self, timeout: float) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())
        waits = [
            asyncio.ensure_future(self.serving.wait()),
            asyncio.ensure_future(self._setup_failed.wait()),
        ]
        try:
            await asyncio.wait(
                [*waits, self.task], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for wait in waits:
                wait.cancel()
        if self.task.done():
            self.task.result()  # its error, if it had one
        if not self.serving.is_set():
            await self._stop()
            if self.setup_error is not None:
                raise RuntimeError(
                    f"{self.failover.name}: setup failed: {_describe(self.setup_error)}"
                ) from self.setup_error
            raise ConnectionError(f"{self.failover.name}: no ACTIVE server after {timeout} s")

    async def _run(self) -> None:
        _current_failover.set(self.failover)
        while not self.closing:
            if await self._open():
                await self._serve()

    async def _serve(self) -> None:
        """Run on the channel just opened until it is lost."""
        await self._until_lost()

    async def _open(self) -> bool:
        """One connection and channel to the ACTIVE; False when they failed (reported)."""
        wire = WatchedTransport()
        try:
            connection = await connect(
                self.servers,
                retry_for=max(self.attempt_timeout, 1.0),
                attempt_timeout=self.attempt_timeout,
                failover=self.failover,
                transport_factory=wire,
                **self.connect_kwargs,
            )
        except ConnectionError:
            return False
        address = address_of(connection.url)  # type: ignore[attr-defined]
        underlying = connection.transport.connection  # type: ignore[attr-defined,union-attr]
        self.watching.begin(underlying, wire, address, self.lost)
        try:
            channel = await connection.channel(publisher_confirms=self.publisher_confirms)
            self.underlay = await channel.get_underlay_channel()
            if self.setup is not None:
                await self.setup(channel)
            await self._on_channel(channel)
        except Exception as error:
            self.underlay = None
            await self.watching.end()
            if _alive(connection):
                # The server answered the setup with an error: the application's to fix.
                log.error(
                    "%s: setup on %s failed: %s", self.failover.name, address, _describe(error)
                )
                self.setup_error = error
                self._setup_failed.set()
                await _drop(connection)
                await asyncio.sleep(1.0)
            else:
                self.failover.attempt_failed(address, error)
                await _drop(connection)
            return False
        except BaseException:
            self.underlay = None
            await self.watching.end()
            await _drop(connection)
            raise
        self.connection, self.channel, self.server = connection, channel, address
        self._lost.clear()
        self.failover.served(address)
        self.serving.set()
        return True

    async def _on_channel(self, channel: aio_pika.abc.AbstractChannel) -> None:
        """What a fresh channel needs before it serves (qos, consume)."""

    async def _until_lost(self) -> None:
        """Until the connection or channel in use closes, ``lost()`` is called, or closing."""
        assert self.connection is not None and self.underlay is not None
        underlay = self.underlay
        transport = self.connection.transport  # type: ignore[attr-defined]
        watched = [asyncio.ensure_future(self._lost.wait()), underlay.closing]
        if transport is not None:
            watched.append(transport.connection.closing)
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in watched:
                future.cancel()
        self.serving.clear()
        self.underlay = None
        heard_ago, silence = await self.watching.end()
        if self.closing:
            return
        error = silence or next(
            (f.exception() for f in done if not f.cancelled() and f.exception() is not None),
            None,
        )
        if error is None and underlay.is_closed:  # woken by lost(): why the channel closed
            closing = underlay.closing
            if closing.done() and not closing.cancelled():
                error = closing.exception()
        if isinstance(error, aiormq.exceptions.ChannelClosed) and _alive(self.connection):
            # The server closed this channel only: an error of the application's (a
            # missing exchange, say), not a failover.
            log.warning(
                "%s: the server at %s closed the channel (%s); opening another",
                self.failover.name,
                self.server,
                _describe(error),
            )
            self.channel_refused = True
            await _drop(self.connection)
            await asyncio.sleep(1.0)
            return
        self.failover.lost(self.server or "?", error, heard_ago)
        self.servers.lost(self.connection.url, error)  # type: ignore[attr-defined]
        await _drop(self.connection)

    def lost(self) -> None:
        """The connection in use failed an operation: drop it and fail over."""
        self._lost.set()

    async def _stop(self) -> None:
        self.closing = True
        self._lost.set()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.watching.end()
        if self.connection is not None:
            await _drop(self.connection)
        self.serving.clear()
        self.underlay = None


def _alive(connection: aio_pika.abc.AbstractConnection | None) -> bool:
    transport = getattr(connection, "transport", None)
    return transport is not None and not transport.connection.is_closed


async def _drop(connection: aio_pika.abc.AbstractConnection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(connection.close(), 2.0)


class Publisher(_Link):
    """Publishes with confirms through failovers; at least once (docs/client.md).

    Each message is held from ``send`` until the server confirms it; the ones held when
    the server is lost are sent again, in order, on the next ACTIVE. A message without a
    message id gets one (a uuid4), kept across sends: a consumer can tell a duplicate by
    it (``Deduplicator``). At most ``max_pending`` messages are held; when that many
    wait for their confirm, ``send`` waits for one (``when_full="block"``) or raises
    ``PublisherFull`` (``"raise"``). A message the server nacks is not sent again: its
    future fails with ``PublishRefused``. A server that owes confirms and sends nothing
    for ``silent_after`` s is left for the next listed one (docs/client.md).

        async with Publisher(urls, max_pending=1000) as publisher:
            await publisher.publish(b"body", routing_key="orders")  # returns once confirmed
            confirmed = await publisher.send(b"next", routing_key="orders")  # held; not waited
            await publisher.flush()
    """

    publisher_confirms = True

    def __init__(
        self,
        urls: Sequence[str | URL] | str,
        *,
        max_pending: int = 1000,
        when_full: Literal["block", "raise"] = "block",
        persistent: bool = True,
        setup: Callable[[aio_pika.abc.AbstractChannel], Awaitable[Any]] | None = None,
        name: str = "publisher",
        attempt_timeout: float = 5.0,
        warn_after: float = 10.0,
        silent_after: float = DEFAULT_SILENT_AFTER,
        **connect_kwargs: Any,
    ) -> None:
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(
                f"max_pending must be a whole number of at least 1, not {max_pending!r}"
            )
        if when_full not in ("block", "raise"):
            raise ValueError(f'when_full must be "block" or "raise", not {when_full!r}')
        super().__init__(
            urls, name, setup, attempt_timeout, warn_after, connect_kwargs, silent_after
        )
        self.max_pending = max_pending
        self.when_full = when_full
        self.persistent = persistent
        self.resent = 0  # sends of a message already sent on a lost connection
        self.refused = 0
        self._held: OrderedDict[int, _Held] = OrderedDict()
        self._outbox: asyncio.Queue[_Held] = asyncio.Queue()
        self._slots = asyncio.Semaphore(max_pending)
        self._empty = asyncio.Event()
        self._empty.set()
        self._seq = 0
        self._generation = 0
        self._confirming: set[asyncio.Task[None]] = set()

    async def start(self, timeout: float = 30.0) -> Publisher:
        """Connect (at most ``timeout`` s, else ConnectionError) and start publishing."""
        await self._start(timeout)
        return self

    async def __aenter__(self) -> Publisher:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def pending(self) -> int:
        """Messages held: sent or to be sent, not confirmed yet."""
        return len(self._held)

    async def send(
        self,
        message: aio_pika.abc.AbstractMessage | bytes,
        routing_key: str,
        exchange: str = "",
    ) -> asyncio.Future[None]:
        """Hold the message and send it; the future resolves at its confirm.

        Returns once the message is held (after waiting for room with ``"block"``)."""
        if self.closing:
            raise PublisherClosed(f"{self.failover.name} is closed")
        if self.when_full == "raise" and self._slots.locked():
            raise PublisherFull(
                f"{self.failover.name}: {self.max_pending} messages await their confirm "
                f"(max_pending={self.max_pending}); wait for confirms (flush) or publish slower"
            )
        await self._slots.acquire()
        if self.closing:
            self._slots.release()
            raise PublisherClosed(f"{self.failover.name} is closed")
        outgoing = _as_message(message, self.persistent)
        if outgoing.message_id is None:
            outgoing.message_id = uuid.uuid4().hex  # type: ignore[misc]  # shown to the application
        self._seq += 1
        held = _Held(
            self._seq,
            exchange,
            routing_key,
            outgoing.body,
            outgoing.properties,
            asyncio.get_running_loop().create_future(),
        )
        self._held[held.seq] = held
        self._empty.clear()
        self._outbox.put_nowait(held)
        return held.confirmed

    async def publish(
        self,
        message: aio_pika.abc.AbstractMessage | bytes,
        routing_key: str,
        exchange: str = "",
    ) -> None:
        """Send and wait for the confirm, however many failovers it takes."""
        await asyncio.shield(await self.send(message, routing_key, exchange))

    async def flush(self, timeout: float | None = None) -> None:
        """Until every message held is confirmed (or refused)."""
        await asyncio.wait_for(self._empty.wait(), timeout)

    async def close(self, timeout: float = 10.0) -> None:
        """Wait up to ``timeout`` s for the held messages' confirms, then close; those
        still held fail with PublisherClosed (and are logged)."""
        if self.task is not None and not self.closing:
            with contextlib.suppress(TimeoutError):
                await self.flush(timeout)
        await self._stop()
        for task in list(self._confirming):
            task.cancel()
        await asyncio.gather(*self._confirming, return_exceptions=True)
        if self._held:
            log.warning(
                "%s closed with %d messages unconfirmed", self.failover.name, len(self._held)
            )
        for held in list(self._held.values()):
            self._settle(held, PublisherClosed(f"{self.failover.name} closed before the confirm"))

    async def _serve(self) -> None:
        assert self.underlay is not None
        self._generation += 1
        generation, channel = self._generation, self.underlay
        # What was held when the last server was lost goes first, in order; one at a
        # time after the server closed a channel over one of them, to find which.
        sender = asyncio.ensure_future(self._resend_then_send(channel, generation))
        try:
            await self._until_lost()
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    async def _resend_then_send(self, channel: aiormq.abc.AbstractChannel, generation: int) -> None:
        if self.channel_refused:
            for held in list(self._held.values()):
                if held.seq not in self._held:
                    continue
                await asyncio.wait([self._send(held, channel, generation)])
                if held.seq in self._held and isinstance(
                    held.error, aiormq.exceptions.ChannelClosed
                ):
                    self.refused += 1
                    failed = PublishFailed(f"the server refused it: {_describe(held.error)}")
                    failed.__cause__ = held.error
                    self._settle(held, failed)
                    return  # the channel is closed: the next one goes on from here
                if generation != self._generation or held.seq in self._held:
                    return  # lost meanwhile
            self.channel_refused = False
        else:
            for held in list(self._held.values()):
                self._send(held, channel, generation)
        await self._send_new(channel, generation)

    async def _send_new(self, channel: aiormq.abc.AbstractChannel, generation: int) -> None:
        while True:
            held = await self._outbox.get()
            if held.seq in self._held and held.generation != generation:
                self._send(held, channel, generation)

    def _send(
        self, held: _Held, channel: aiormq.abc.AbstractChannel, generation: int
    ) -> asyncio.Task[None]:
        if held.sends:
            self.resent += 1
        held.generation = generation
        held.sends += 1
        task = asyncio.ensure_future(self._confirm(held, channel, generation))
        self._confirming.add(task)
        task.add_done_callback(self._confirming.discard)
        return task

    async def _confirm(
        self, held: _Held, channel: aiormq.abc.AbstractChannel, generation: int
    ) -> None:
        try:
            await channel.basic_publish(
                held.body,
                exchange=held.exchange,
                routing_key=held.routing_key,
                properties=held.properties,
            )
        except aiormq.exceptions.DeliveryError as error:
            self.refused += 1
            self._settle(held, PublishRefused(error.message, error.frame))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            # No confirm from this connection: held, and sent again on the next one.
            held.error = error
            if generation == self._generation:
                self.lost()
        else:
            self._settle(held, None)

    def _settle(self, held: _Held, error: BaseException | None) -> None:
        if self._held.pop(held.seq, None) is None:
            return
        self._slots.release()
        if not self._held:
            self._empty.set()
        if held.confirmed.done():
            return
        if error is None:
            held.confirmed.set_result(None)
        else:
            held.confirmed.set_exception(error)
            held.confirmed.exception()  # an application that did not wait is told by the log


class Deduplicator:
    """The message ids of the last ``capacity`` messages handled, to drop duplicates.

    ``Publisher`` is at least once: a message whose confirm was lost with its server is
    sent again, with the same message id, and can reach the consumer twice (the second
    time possibly with ``redelivered`` false). Check ``seen`` before handling a message
    and ``add`` its id once handled; ids older than the last ``capacity`` are forgotten,
    so a duplicate arriving after that many others is not caught (docs/client.md).
    """

    def __init__(self, capacity: int = 100_000) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a whole number of at least 1, not {capacity!r}")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, message_id: str) -> None:
        self._ids[message_id] = None
        self._ids.move_to_end(message_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def seen(self, message_id: str | None) -> bool:
        """Whether this id was handled already; records it if not. A message without an
        id is never a duplicate."""
        if message_id is None:
            return False
        if message_id in self._ids:
            self._ids.move_to_end(message_id)
            return True
        self.add(message_id)
        return False


class Consumer(_Link):
    """Consumes ``queue`` through failovers (docs/client.md).

    ``callback`` gets each message (an aio-pika IncomingMessage); when it returns the
    message is acked, when it raises the message is requeued (and the error logged).
    After a failover the consumer resumes on the new ACTIVE by itself. A delivery that
    came from the lost server is never acked on the new one (its delivery tag means
    nothing there): that message comes again from the new server, and with a
    ``dedupe`` the handled ones are acked without calling ``callback`` twice.
    ``setup`` runs on every new channel before consuming (declare the queue there).
    A server silent past its heartbeat and ``silent_after`` is left (docs/client.md).
    """

    def __init__(
        self,
        urls: Sequence[str | URL] | str,
        queue: str,
        callback: Callable[[aio_pika.abc.AbstractIncomingMessage], Awaitable[Any]],
        *,
        prefetch: int = 50,
        dedupe: Deduplicator | None = None,
        setup: Callable[[aio_pika.abc.AbstractChannel], Awaitable[Any]] | None = None,
        name: str | None = None,
        attempt_timeout: float = 5.0,
        warn_after: float = 10.0,
        silent_after: float = DEFAULT_SILENT_AFTER,
        **connect_kwargs: Any,
    ) -> None:
        super().__init__(
            urls,
            name or f"consumer of {queue}",
            setup,
            attempt_timeout,
            warn_after,
            connect_kwargs,
            silent_after,
        )
        self.queue = queue
        self.callback = callback
        self.prefetch = prefetch
        self.dedupe = dedupe
        self.handled = 0
        self.duplicates = 0  # deliveries dropped by dedupe
        self.stale = 0  # acks not sent: their delivery came from a server since lost
        self._handling: set[asyncio.Task[None]] = set()
        self._consuming: tuple[aio_pika.abc.AbstractQueue, str] | None = None

    async def start(self, timeout: float = 30.0) -> Consumer:
        """Connect (at most ``timeout`` s, else ConnectionError) and start consuming."""
        await self._start(timeout)
        return self

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, timeout: float = 10.0) -> None:
        """Stop consuming; callbacks still running get up to ``timeout`` s to finish
        (their messages are acked if the channel is still open), then are cancelled."""
        self.closing = True
        if self._consuming is not None:
            queue, tag = self._consuming
            with contextlib.suppress(Exception):
                await asyncio.wait_for(queue.cancel(tag), 2.0)
        if self._handling:
            await asyncio.wait(list(self._handling), timeout=timeout)
        for task in list(self._handling):
            task.cancel()
        await asyncio.gather(*self._handling, return_exceptions=True)
        await self._stop()

    async def _on_channel(self, channel: aio_pika.abc.AbstractChannel) -> None:
        await channel.set_qos(prefetch_count=self.prefetch)
        queue = await channel.get_queue(self.queue, ensure=False)
        self._consuming = (queue, await queue.consume(self._deliver))

    async def _deliver(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        # aiormq cancels the consumer's tasks when their channel closes: the callback runs
        # in a task of its own, to its end (its ack is then dropped as stale).
        task = asyncio.ensure_future(self._handle(message))
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)
        await asyncio.shield(task)

    async def _handle(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        message_id = message.message_id
        if self.dedupe is not None and message_id is not None and message_id in self.dedupe:
            self.duplicates += 1
            await self._settle(message, ack=True)
            return
        try:
            await self.callback(message)
        except Exception:
            log.exception(
                "%s: the callback failed on message %s; it is requeued",
                self.failover.name,
                message_id,
            )
            await self._settle(message, ack=False)
            return
        self.handled += 1
        if self.dedupe is not None and message_id is not None:
            self.dedupe.add(message_id)
        await self._settle(message, ack=True)

    async def _settle(self, message: aio_pika.abc.AbstractIncomingMessage, ack: bool) -> None:
        """Ack (or requeue) on the channel the message came by, if that is the one in use."""
        if message.processed:  # the callback settled it itself
            return
        try:
            channel = message.channel
        except aiormq.exceptions.ChannelInvalidStateError:
            channel = None
        if channel is None or channel is not self.underlay:
            self.stale += 1
            log.debug(
                "%s: not settling message %s: it came from a server since lost",
                self.failover.name,
                message.message_id,
            )
            return
        try:
            if ack:
                await message.ack()
            else:
                await message.nack(requeue=True)
        except (aiormq.exceptions.AMQPError, ConnectionError):
            self.stale += 1  # lost while sending: the new ACTIVE delivers it again
