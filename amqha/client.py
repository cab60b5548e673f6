"""Client helper for the pair: aio-pika connections that find the ACTIVE server.

``connect(urls)`` and ``connect_robust(urls)`` announce the ``connection.redirect``
capability (keeping aio-pika's default capabilities), follow a server's
Connection.Redirect (or the ``NOT_ACTIVE - active server is HOST:PORT`` close that
plain clients get), and fail over between the listed servers. The robust
connection reconnects to whichever server is ACTIVE after a failover, and
aio-pika restores its channels, queues and consumers there.

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
import re
import typing
from collections.abc import Sequence
from typing import Any

import aio_pika
import aiormq
from pamqp import base, commands
from yarl import URL

from peering.agent import error_chain

log = logging.getLogger("amqha.client")

DEFAULT_CAPABILITIES = {
    "authentication_failure_close": True,
    "basic.nack": True,
    "connection.blocked": True,
    "consumer_cancel_notify": True,
    "publisher_confirms": True,
}
REDIRECT_CAPABILITY = "connection.redirect"
_NOT_ACTIVE = re.compile(r"NOT_ACTIVE - active server is (\S+)")


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


def redirect_target(error: BaseException | None, redirects: list[str]) -> str | None:
    """Where a failed attempt was told to go: a Redirect frame, or a NOT_ACTIVE close text."""
    if redirects:
        return redirects[-1]
    for each in error_chain(error):
        match = _NOT_ACTIVE.search(str(each))
        if match:
            return match.group(1)
    return None


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

    def failed(self, error: BaseException | None, redirects: list[str]) -> None:
        target = redirect_target(error, redirects)
        came_from = self.current()
        if target is not None and self.redirected is None:
            self.redirected = _with_address(came_from, target)
            log.info("redirected from %s:%s to %s", came_from.host, came_from.port, target)
            return
        self.redirected = None
        self.position = (self.position + 1) % len(self.urls)


def _recorded(made: list[aio_pika.Connection]) -> Any:
    """A connection class for ``aio_pika.connect`` that keeps each connection it makes."""

    def make(*args: Any, **kwargs: Any) -> aio_pika.Connection:
        connection = aio_pika.Connection(*args, **kwargs)
        made.append(connection)
        return connection

    return make


async def connect(
    urls: Sequence[str | URL] | str,
    *,
    retry_for: float = 15.0,
    retry_interval: float = 0.05,
    attempt_timeout: float = 5.0,
    client_properties_extra: dict[str, Any] | None = None,
    **kwargs: Any,
) -> aio_pika.abc.AbstractConnection:
    """Connect to whichever listed server is ACTIVE, following redirects, for up to ``retry_for`` s."""
    servers = ServerList([urls] if isinstance(urls, str) else urls)
    properties = client_properties(client_properties_extra)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + retry_for
    last_error: BaseException | None = None
    while True:
        redirects: list[str] = []
        token = _redirects.set(redirects)
        url = servers.current()
        made: list[aio_pika.Connection] = []
        try:
            return await aio_pika.connect(
                url,
                client_properties=properties,
                timeout=attempt_timeout,
                connection_class=_recorded(made),
                **kwargs,
            )
        except (TimeoutError, aiormq.exceptions.AMQPError, ConnectionError, OSError) as error:
            last_error = error
            servers.failed(error, redirects)
            # Closed now: left to the garbage collector, a failed attempt's connection
            # schedules its own close on whatever loop runs then.
            for attempt in made:
                with contextlib.suppress(Exception):
                    await attempt.close()
        finally:
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
    """

    def __init__(self, servers: ServerList, **kwargs: Any) -> None:
        self.servers = servers
        self._attempt_redirects: list[str] = []
        super().__init__(servers.current(), **kwargs)

    async def connect(self, timeout: Any = None) -> None:
        # The reconnect task inherits this context: every attempt it makes reports here.
        _redirects.set(self._attempt_redirects)
        await super().connect(timeout)

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        error: BaseException | None
        try:
            error = closing.exception()
        except asyncio.CancelledError:
            error = None
        if not self._close_called:
            self.servers.failed(error, self._attempt_redirects)
            self._attempt_redirects.clear()
            self.url = self.servers.current()
        await super()._on_connection_close(closing)


async def connect_robust(
    urls: Sequence[str | URL] | str,
    *,
    reconnect_interval: float = 0.05,
    client_properties_extra: dict[str, Any] | None = None,
    **kwargs: Any,
) -> aio_pika.abc.AbstractRobustConnection:
    """A robust connection over the pair: reconnects to the ACTIVE server after a failover."""
    servers = ServerList([urls] if isinstance(urls, str) else urls)
    connection = FailoverRobustConnection(
        servers,
        client_properties=client_properties(client_properties_extra),
        reconnect_interval=reconnect_interval,
        fail_fast=False,
        **kwargs,
    )
    await connection.connect(timeout=kwargs.get("timeout"))
    return connection
