"""The federation of one server: a link per configured exchange, run while it leads.

Owns: making the links of the ``federation`` section, starting them when the server leads (or at
start when standalone) and stopping them when it follows, and the status of every
configured link ("What a link reports").

Must not know: how a link connects or routes (``link``), the pair's state machine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from config.loader import ServerConfig
from config.tls import client_context

from .link import Link

log = logging.getLogger("amqha.federation")


class Federation:
    """Every link of this server's ``federation`` section.

    ``set_leading(True)`` starts the links, ``set_leading(False)`` stops them (a PASSIVE
    keeps none); ``close()`` stops them for good; ``status()`` lists every configured link,
    running or not."""

    def __init__(
        self, broker: Any, on_event: Callable[[str, dict[str, Any]], None] | None = None
    ) -> None:
        config: ServerConfig = broker.config
        federation = config.federation
        self.broker = broker
        self.name = config.global_name
        self.id = config.federation_id if federation.exchanges else ""
        peer_tls = config.failover.peer_tls
        tls = None if peer_tls is None else client_context(peer_tls, config.source)
        self.links = [
            Link(
                broker,
                exchange,
                federation.upstream(exchange.upstream).urls,
                self.name,
                self.id,
                federation.reconcile,
                federation.probe,
                federation.prefetch,
                on_event,
                tls=tls,
            )
            for exchange in federation.exchanges
        ]
        self.leading = False
        self._change: asyncio.Task[None] | None = None

    def set_leading(self, leading: bool) -> None:
        """Start the links (this server leads) or stop them (it follows)."""
        if leading == self.leading or not self.links:
            self.leading = leading
            return
        self.leading = leading
        previous = self._change
        self._change = asyncio.get_running_loop().create_task(self._apply(previous, leading))

    async def _apply(self, previous: asyncio.Task[None] | None, leading: bool) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        if leading:
            log.info("federation: %s starts %d links", self.name, len(self.links))
            for link in self.links:
                link.start()
        else:
            log.info("federation: %s stops its links (it no longer leads)", self.name)
            await asyncio.gather(*(link.stop() for link in self.links), return_exceptions=True)

    async def close(self) -> None:
        self.leading = False
        if self._change is not None:
            await asyncio.gather(self._change, return_exceptions=True)
        await asyncio.gather(*(link.stop() for link in self.links), return_exceptions=True)

    def status(self) -> list[dict[str, Any]]:
        """One dict per configured link (``Link.status``), with whether this server runs it."""
        return [{**link.status(), "active": self.leading} for link in self.links]
