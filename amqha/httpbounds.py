"""The bounded HTTP socket shared by the metrics endpoint and the management listener.

Owns: aiohttp's HTTP/1.1 protocol for one socket with a timer that aborts it (a request
that does not come in, an answer that is not taken: whoever sets the timer says which),
``drop`` (abort, never a close that waits for a peer that does not read), and the rule
for a request that cannot be parsed: the client's doing, so no traceback and no echo of
what it sent; each listener words the answer (``unparsable``). docs/limits.md and
docs/security.md give each listener's bounds.

Must not know: routes, logins, what a listener counts.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong


class BoundedSocket(web.RequestHandler):
    """One socket: dropped when its timer runs out; ``first_timeout`` is set from the
    moment it connects (the request's head must be in by then: aiohttp has no timer for
    it on every version it supports)."""

    __slots__ = ("timer",)

    first_timeout = 10.0

    def __init__(self, manager: web.Server, **options: Any) -> None:
        super().__init__(manager, **options)
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.drop_after(self.first_timeout)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.stop_timer()
        super().connection_lost(exc)

    def drop_after(self, seconds: float) -> None:
        """Abort the socket ``seconds`` from now, unless the timer is set again or stopped."""
        self.stop_timer()
        self.timer = asyncio.get_running_loop().call_later(seconds, self.drop)

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def drop(self) -> None:
        # abort, not close: close would wait for a client that does not read.
        if self.transport is not None:
            self.transport.abort()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        return self.unparsable(request, exc, 431 if isinstance(exc, LineTooLong) else 400)

    def unparsable(
        self, request: web.BaseRequest, error: HttpProcessingError, status: int
    ) -> web.StreamResponse:
        """The answer to a request that cannot be parsed (431: a line too long; 400)."""
        raise NotImplementedError
