"""Connections the broker holds: client work held while the pair says this server is not
serving, and sockets not being read, looked at for their client's going.

Owns: the held client connections and the timer that looks again whether the pair
serves (``HeldConnections``); the connections not read for a reason that may last, and
one poll(2) over their sockets for a FIN or a reset that asyncio would only see by
reading (``HangupWatch``).

Must not know: frames, what holds a connection's reading (``connection.py``), the
failover state machine (the pair is asked ``serving()`` only). The broker holds one of
each (``Broker.held``, ``Broker.hangups``).
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable
from typing import Any, Protocol

# While the pair says this server is not serving, held connections are looked at this often.
HOLD_RECHECK = 0.05
# How often sockets not being read are looked at for their client's going, and the poll
# events that say it went: a FIN (POLLRDHUP, Linux; seen though unread bytes are ahead
# of it) or a reset (POLLHUP, POLLERR).
HANGUP_CHECK_INTERVAL = 0.5
HANGUP_EVENTS = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR


class Holdable(Protocol):
    """A connection, as what holds it sees it."""

    fileno: int
    transport: Any

    def hold(self) -> None: ...

    def release_hold(self) -> None: ...

    def hung_up(self) -> None: ...


class HeldConnections:
    """Client connections held until the pair serves again (then released) or steps
    down (then the broker closes them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, serving: Callable[[], bool]) -> None:
        self.loop = loop
        self.serving = serving
        self.held: set[Holdable] = set()
        self.timer: asyncio.TimerHandle | None = None

    def hold(self, connection: Holdable) -> None:
        """Hold a client connection's work: not read, its confirms not sent."""
        if connection not in self.held:
            self.held.add(connection)
            connection.hold()
        if self.timer is None:
            self.timer = self.loop.call_later(HOLD_RECHECK, self._recheck)

    def _recheck(self) -> None:
        self.timer = None
        if self.serving():
            self.release()
        elif self.held:
            self.timer = self.loop.call_later(HOLD_RECHECK, self._recheck)

    def release(self) -> None:
        held, self.held = self.held, set()
        for connection in held:
            connection.release_hold()

    def forget(self, connection: Holdable) -> None:
        self.held.discard(connection)


class HangupWatch:
    """Connections not read for a reason that may last, polled for their client's going."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.unread: set[Holdable] = set()
        self.timer: asyncio.TimerHandle | None = None

    def watch(self, connection: Holdable, watch: bool) -> None:
        if not watch:
            self.unread.discard(connection)
            return
        self.unread.add(connection)
        if self.timer is None:
            self.timer = self.loop.call_later(HANGUP_CHECK_INTERVAL, self._check)

    def _check(self) -> None:
        """One poll(2) over every unread socket: those whose client closed or reset it
        are closed, which releases what they held (a partial body, their channels)."""
        self.timer = None
        poller = select.poll()
        by_fd: dict[int, Holdable] = {}
        for connection in self.unread:
            transport = connection.transport
            # A closing transport's descriptor may already belong to a new socket.
            if connection.fileno >= 0 and transport is not None and not transport.is_closing():
                poller.register(connection.fileno, HANGUP_EVENTS)
                by_fd[connection.fileno] = connection
        for fd, events in poller.poll(0):
            if events & HANGUP_EVENTS:
                by_fd[fd].hung_up()
        if self.unread:
            self.timer = self.loop.call_later(HANGUP_CHECK_INTERVAL, self._check)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
