"""How a client of the pair reaches a server: the listed servers and the redirects.

Owns: Connection.Redirect (AMQP 0-9, class 10, method 42; 0-9-1 dropped it and pamqp does
not know it, so importing this module registers it with pamqp's method table; the frame
is decoded by aiormq's reader, and the host it names is handed back through a context
variable set for each connection attempt), the client properties that announce the
``connection.redirect`` capability, ``ServerList`` (the server to try next), a server's
``host:port`` as log lines name it (docs/client.md).

Must not know: connecting, failover logs, publishers and consumers.
"""

from __future__ import annotations

import contextvars
import typing
from collections.abc import Sequence
from typing import Any

from pamqp import base, commands
from yarl import URL

from amqha.client_watch import DEFAULT_HEARTBEAT, with_heartbeat
from amqha.gate import redirect_target

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
        slot = attempt_redirects.get(None)
        if slot is not None:
            slot.append(self.host)


commands.INDEX_MAPPING.setdefault(ConnectionRedirect.index, ConnectionRedirect)

# Each connection attempt gets a fresh list; the frame decoder appends the host it was sent to.
attempt_redirects: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
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
