"""The management listener's sockets: how many, whose, for how long, and which give way.

Owns: ``ManagedSocket`` (aiohttp's HTTP/1.1 protocol for one socket, with its state: has
it sent a request yet, is one being answered, did its last request log in), the
``SocketTable`` that admits a newcomer or makes room for it (docs/security.md,
"Management API: sockets"), and what a request that cannot be parsed costs: a short
answer and at most LOG_BURST log lines per LOG_WINDOW, never a traceback.

The rule: an operator who logs in is never kept out by sockets that have not logged in.

- A socket that has not logged in is closed after its answer (``answered``): it holds a
  place only while it sends a request or waits for the answer, never between requests.
- Its first request must be in within REQUEST_TIMEOUT, else it is dropped.
- One address holds at most PER_ADDRESS sockets that have not logged in; a newcomer past
  that takes the place of that address's oldest one.
- Past MAX_CONNECTIONS in all, a newcomer takes the place of the oldest socket that has
  not logged in; only when every socket has logged in is the newcomer refused.
- Which of those gives way first (``_victim``): one the loop has read and found silent,
  then one that has sent bytes but no login, then one whose request carries a login (until
  its answer), and last one the loop has not read yet; the oldest first in each. Sockets
  that never send go first; an operator's socket taken in with newcomers in one pass is
  not dropped before its request is read, and once its login is in, not for sockets that
  carry none (a flood of requests from its own address on a loaded machine).
- A socket whose last request logged in keeps its place between requests for aiohttp's
  ``keepalive_timeout``.

Must not know: routes, users, how a login is checked (the endpoint says ``answered``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..auth import LogLimiter, source_of
from ..httpbounds import BoundedSocket
from ..logtext import escaped

log = logging.getLogger("amqha.management")

MAX_CONNECTIONS = 256
PER_ADDRESS = 32
REQUEST_TIMEOUT = 10.0
CREDENTIALS = b"\nauthorization:"  # a request's login header, read before aiohttp parses it
HEAD = 8192  # how much of a read is looked at for it (aiohttp's limit on a header line)
LOG_BURST = 5
LOG_WINDOW = 60.0


class ManagedSocket(BoundedSocket):
    """One socket of the listener, counted by its ``SocketTable``."""

    __slots__ = ("table", "source", "sent", "ripe", "logged_in", "checking")

    first_timeout = REQUEST_TIMEOUT

    def __init__(self, manager: web.Server, table: SocketTable, **options: Any) -> None:
        super().__init__(manager, **options)
        self.table = table
        self.source = ""
        self.sent = False  # a byte has come in
        self.ripe = False  # the loop has read the socket once since it was opened
        self.logged_in = False  # the last request carried a good login (set on its login)
        self.checking = False  # a request carrying a login is in, not yet answered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.source = source_of(str(peer[0])) if peer else ""
        super().connection_made(transport)
        self.table.opened(self)
        # The transport starts reading in this pass of the loop, so the next pass reads
        # what is already in: the socket is ripe at the start of the pass after that.
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.call_soon, self._ripen)

    def _ripen(self) -> None:
        self.ripe = True

    def data_received(self, data: bytes) -> None:
        self.sent = True
        if not self.checking and not self.logged_in and CREDENTIALS in data[:HEAD].lower():
            self.checking = True  # before the request is parsed, let alone answered
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.table.closed(self)
        super().connection_lost(exc)

    def request_in(self, credentials: bool) -> None:
        """A request has been parsed (its first request was in time); ``credentials``:
        it carries a login (also when the header came in two reads)."""
        self.stop_timer()
        self.checking = self.checking or credentials

    def answered(self, response: web.StreamResponse, logged_in: bool) -> None:
        """The answer is made; without a login the socket closes once it is sent."""
        self.checking = False
        self.logged_in = logged_in
        if not self.logged_in:
            response.force_close()

    def unparsable(
        self, request: web.BaseRequest, error: HttpProcessingError, status: int
    ) -> web.StreamResponse:
        # One short line (at most LOG_BURST a minute, with a count of the ones left out).
        self.table.bad_request(request.remote, error)
        reason = "request too large" if status == 431 else "bad request"
        response = web.json_response({"error": "bad_request", "reason": reason}, status=status)
        response.force_close()
        return response


class SocketTable:
    """The open sockets, oldest first, and the rule that makes room for a newcomer."""

    def __init__(self, limit: int = MAX_CONNECTIONS, per_address: int = PER_ADDRESS) -> None:
        self.limit = limit
        self.per_address = per_address
        self.sockets: dict[ManagedSocket, None] = {}
        self.limiter = LogLimiter(LOG_BURST, LOG_WINDOW)
        self.bad_requests = 0

    def __len__(self) -> int:
        return len(self.sockets)

    def opened(self, newcomer: ManagedSocket) -> None:
        anonymous = [s for s in self.sockets if not s.logged_in]
        same = [s for s in anonymous if s.source == newcomer.source]
        if len(same) >= self.per_address:
            self._evict(_victim(same))
        if len(self.sockets) >= self.limit:
            victim = _victim([s for s in self.sockets if not s.logged_in])
            if victim is None:
                # Every place is held by a socket that logged in.
                newcomer.drop()
                return
            self._evict(victim)
        self.sockets[newcomer] = None

    def _evict(self, victim: ManagedSocket | None) -> None:
        if victim is not None:
            self.sockets.pop(victim, None)
            victim.drop()

    def closed(self, socket: ManagedSocket) -> None:
        self.sockets.pop(socket, None)

    def bad_request(self, remote: str | None, error: BaseException) -> None:
        self.bad_requests += 1
        logged, left_out = self.limiter.admit(time.monotonic())
        if logged:
            log.warning(
                "management: a request from %s could not be parsed (%s)%s",
                remote,
                escaped(str(error)[:200]),
                f"; {left_out} more not logged" if left_out else "",
            )

    def drop_all(self) -> None:
        for socket in list(self.sockets):
            socket.drop()


def _victim(candidates: list[ManagedSocket]) -> ManagedSocket | None:
    """Of sockets oldest first, the one to give way (None if none): the oldest read and
    found silent, else the oldest that has sent bytes but no login, else the oldest whose
    login is in, else the oldest not read yet."""
    return min(candidates, key=_standing, default=None)  # min keeps the first of a tie


SILENT, SENT, CHECKING, UNREAD = range(4)


def _standing(socket: ManagedSocket) -> int:
    if socket.checking:
        return CHECKING
    return SENT if socket.sent else SILENT if socket.ripe else UNREAD
