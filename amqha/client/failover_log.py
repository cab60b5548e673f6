"""What one client of the pair logs about its failovers (docs/client.md, "What is logged").

Owns: ``FailoverLog`` (one INFO line per failover, on ``amqha.client``: the server lost,
the one serving now, how long it took; each attempt at DEBUG; a failover that lasts at
WARNING, with its last error, after ``warn_after`` s and then at doubling intervals), the
failover log of the task that logs, and an error as a log line words it.

Must not know: aio-pika, connections, publishers and consumers.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable

log = logging.getLogger("amqha.client")


def describe(error: BaseException | None) -> str:
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
        self.last_error = f"{address}: {describe(error)}"
        log.debug("%s: lost %s (%s)", self.name, address, describe(error))

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
            self.last_error = f"{address}: {describe(error)}"
            log.debug("%s: attempt at %s failed (%s)", self.name, address, describe(error))
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
current_failover: contextvars.ContextVar[FailoverLog | None] = contextvars.ContextVar(
    "amqha_failover", default=None
)
