"""The broker's side of the pair: the small interfaces between a broker and its pair.

Owns: the answers the gate gives a client's Connection.Open (``Accept`` or ``Redirect``),
the reply text of the 320 close that a server which is not ACTIVE sends and its reading
(``redirect_target``: where a client or a federation link was told to go), the ``Pair``
protocol the broker and the console call, ``Member``, what a pair's controller asks of
its broker (lead, follow, report sync), and ``Standalone``, the pair of a server that
runs alone (always serving, nothing to report).

Must not know: how a pair decides (``failover`` implements ``Pair``; the broker never
imports it), frames or sockets. See docs/architecture.md ("The gate").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Protocol

from .logtext import error_chain


class Accept:
    """The gate lets the client in."""


class Redirect:
    """The gate sends the client to another server (``to`` may be None: none known)."""

    def __init__(self, to: str | None, known_hosts: str = "", reason: str | None = None) -> None:
        self.to = to
        self.known_hosts = known_hosts
        self.reason = reason  # why no server can be named (a misconfigured pair), if known


ACCEPT = Accept()


def not_active_text(to: str | None, reason: str | None = None) -> str:
    """The reply text of the 320 close a client gets from a server that is not ACTIVE.

    Programs read it (``amqha.client`` does): keep the ``active server is HOST:PORT`` form.
    """
    if to:
        return f"NOT_ACTIVE - active server is {to}"
    if reason:
        return f"NOT_ACTIVE - no active server: {reason}"
    return "NOT_ACTIVE - no active server"


_NOT_ACTIVE = re.compile(r"NOT_ACTIVE - active server is (\S+)")


def redirect_target(error: BaseException | None, redirects: list[str]) -> str | None:
    """Where a failed attempt was told to go: a Redirect frame, or a NOT_ACTIVE close text."""
    if redirects:
        return redirects[-1]
    for each in error_chain(error):
        match = _NOT_ACTIVE.search(str(each))
        if match:
            return match.group(1)
    return None


class ConsoleRefused(Exception):
    """A console command the pair refuses; the text is shown to the administrator."""


class Pair(Protocol):
    """What the broker asks of the pair it belongs to."""

    def admit(self, client: str) -> Accept | Redirect:
        """A client (``client`` is its address) sent Connection.Open: serve it or send it on."""
        ...

    def serving(self) -> bool:
        """True while this server may accept and confirm application work."""
        ...

    def info(self) -> dict[str, Any]:
        """The pair as Connection.Start announces it: name, role, state, known_hosts."""
        ...

    def status(self) -> dict[str, Any]:
        """The console's ``status``: everything an operator needs about this server's side.

        The metrics endpoint reads ``state``, ``epoch``, ``takeovers``, ``redirects`` and
        ``refusals`` (client attempts sent on, or refused with no server to name) and
        ``peer.last_seen`` (wall clock, or None) from it; a pair may omit what it lacks.
        """
        ...

    def command(self, name: str, args: dict[str, Any], user: str) -> Any:
        """A pair command from the console (recover, promote, controller); raises
        ``ConsoleRefused`` with the reason when it is refused."""
        ...


class Closable(Protocol):
    """A connection as a pair's controller sees it: one it may close."""

    def close_forced(self, text: str) -> None: ...


# (side, in_sync, reason): "active" (this server's feed) or "passive" (this server
# following its ACTIVE) became or stopped being in sync; an empty reason: progress only.
OnSync = Callable[[str, bool, str], None]


class PairEvents(Protocol):
    """What a broker tells the controller of the pair it belongs to, for its event log
    (the controller attaches itself with ``Member.attach``)."""

    def sync_changed(self, side: str, in_sync: bool, reason: str) -> None:
        """``OnSync``'s arguments: this server's feed ("active") or following
        ("passive") became or stopped being in sync; an empty reason: progress only."""
        ...

    def quarantined(self, found: dict[str, Any]) -> None:
        """Messages the peer never had were set aside in a quarantine file."""
        ...

    def store_damaged(self, found: dict[str, Any]) -> None:
        """The store was found damaged at open and set aside (``path``, ``reason``): this
        server starts empty and is not in sync."""
        ...

    def disk_failed(self, reason: str) -> None:
        """The store's disk failed (an I/O error): this server confirms and stores nothing
        more until it is restarted; an ACTIVE hands the service to its in-sync PASSIVE."""
        ...

    def federation_event(self, fields: dict[str, Any]) -> None:
        """The fields of a `federation` event record (docs/federation.md)."""
        ...


class Member(Protocol):
    """What a pair's controller (``failover/controller.py``) asks of its broker; the
    broker implements it and never imports the controller."""

    def attach(self, events: PairEvents | None) -> None:
        """Tell ``events`` of sync, quarantine and federation from now on (None: no more)."""
        ...

    def lead(self, epoch: int, role_bit: int) -> None:
        """This server is ACTIVE in ``epoch``: serve, log changes, feed a PASSIVE."""
        ...

    def follow(self, url: str, connect_options: dict[str, Any]) -> None:
        """This server is PASSIVE: take the durable state from the ACTIVE at ``url``."""
        ...

    def following_in_sync(self) -> bool:
        """Whether this PASSIVE holds every change its ACTIVE confirmed (True when it
        follows nothing: replication off)."""
        ...

    def replication_status(self) -> dict[str, Any]: ...

    def passive_stalled(self, limit: float) -> None:
        """As ACTIVE: stop waiting for a PASSIVE that has acked nothing for ``limit`` s."""
        ...

    def receive_control(self, exchange: str, receiver: Callable[[Any, Any], None]) -> None:
        """Hand what is published to control exchange ``exchange`` to ``receiver(message,
        connection)``."""
        ...

    def client_connections(self) -> list[Any]:
        """Open connections the gate governs (``Closable``)."""
        ...

    def admin_connections(self) -> list[Any]:
        """Open administrator connections (``Closable``)."""
        ...

    def hold_all(self) -> None:
        """Stop reading clients and sending confirms (a frozen server waking)."""
        ...

    def hold_clients(self, hold: bool) -> None:
        """A planned switchover drains this ACTIVE: stop reading (``hold``) or read again
        its client connections, and any that opens meanwhile."""
        ...

    def passive_in_sync(self) -> bool:
        """Whether this ACTIVE's feed has an in-sync PASSIVE now."""
        ...

    def refollow(self) -> None:
        """This PASSIVE's ACTIVE leads in a new term: subscribe to it again, from a
        snapshot."""
        ...

    def hold_until_rejoined(self, seconds: float, handed_over_in: int | None = None) -> None:
        """This server just took the service by a handover: until the server that handed
        it over is its in-sync PASSIVE again (at most ``seconds``), no confirm goes out on
        this server alone. ``handed_over_in``: the epoch that server led in; it may
        resume from the point of the handover, with no snapshot."""
        ...

    def undrained(self) -> str | None:
        """Why this ACTIVE cannot hand over yet (None: drained): a confirm it owes not
        written, or a change not yet on its in-sync PASSIVE."""
        ...

    def release_held(self) -> None: ...


class Standalone:
    """The pair of a server configured without a peer: it always serves."""

    def __init__(self, name: str, address: str) -> None:
        self.name = name
        self.address = address

    def admit(self, client: str) -> Accept | Redirect:
        return ACCEPT

    def serving(self) -> bool:
        return True

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": "standalone",
            "state": "ACTIVE",
            "known_hosts": self.address,
        }

    def status(self) -> dict[str, Any]:
        return {**self.info(), "epoch": 0, "takeovers": 0, "redirects": 0, "refusals": 0}

    def command(self, name: str, args: dict[str, Any], user: str) -> Any:
        raise ConsoleRefused(f"{name}: this server runs standalone, it has no peer")
