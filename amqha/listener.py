"""The broker's listening sockets: AMQP on each configured address, amqps beside them.

Owns: one listener per configured address (``::`` serves IPv4 too, on one dual-stack
socket where the OS has them, else on a second socket bound to 0.0.0.0), the TLS
listener and its handshake bound, and closing them all at shutdown. Each accepted
socket gets a new protocol from the factory it was given (``Connection(broker)``).

Must not know: frames, what a connection does. The broker holds one
(``Broker.listener``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from config.schema import TlsListener
from config.tls import server_context

TLS_HANDSHAKE_TIMEOUT = 10.0
BACKLOG = 1024


class Listener:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, factory: Callable[[], asyncio.Protocol]
    ) -> None:
        self.loop = loop
        self.factory = factory
        self.servers: list[asyncio.base_events.Server] = []
        self.tls_server: asyncio.base_events.Server | None = None

    async def open(
        self, addresses: tuple[tuple[str, int], ...], tls: TlsListener | None, source: str
    ) -> None:
        """Listen on every address in ``addresses``, and for amqps as ``tls`` says."""
        for host, port in addresses:
            self.servers.extend(await self._listen(host, port))
        if tls is not None:
            self.tls_server = await self.loop.create_server(
                self.factory,
                tls.host,
                tls.port,
                ssl=server_context(tls, source),
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT,
                reuse_address=True,
                backlog=BACKLOG,
            )

    async def _listen(self, host: str, port: int) -> list[asyncio.base_events.Server]:
        if host != "::":
            return [await self._serve(host=host, port=port)]
        if socket.has_dualstack_ipv6():
            sock = socket.create_server(
                ("::", port), family=socket.AF_INET6, backlog=BACKLOG, dualstack_ipv6=True
            )
            return [await self._serve(sock=sock)]
        return [
            await self._serve(host="::", port=port),
            await self._serve(host="0.0.0.0", port=port),
        ]

    async def _serve(self, **where: Any) -> asyncio.base_events.Server:
        if "sock" in where:
            return await self.loop.create_server(self.factory, **where)
        return await self.loop.create_server(
            self.factory, reuse_address=True, backlog=BACKLOG, **where
        )

    @property
    def port(self) -> int:
        """The port of the first address listened on."""
        return self.servers[0].sockets[0].getsockname()[1]

    def close(self) -> None:
        """No new connections from now on."""
        for server in (*self.servers, self.tls_server):
            if server is not None:
                server.close()
