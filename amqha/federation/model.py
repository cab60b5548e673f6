"""What a federation link decides, without doing it (pure).

Owns: which upstream bindings a downstream's local bindings ask for (equal ones made one,
counted, and refused where their path says so), the repairs that bring the upstream's
bindings to that set, a link's state (connecting, running, stalled, failed with reason,
since and attempts), the retry delay, the probe rule for a stalled link, and the link's
counters (docs/federation.md, "The link", "What a link reports").

Must not know: sockets, asyncio, the clock (times are passed in), the broker.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import names

CONNECTING = "connecting"
RUNNING = "running"
STALLED = "stalled"
FAILED = "failed"
# A link with no probe back for this many probe intervals is stalled.
PROBE_INTERVALS = 3
PROBE_HEADER = "amqha-probe"
# The headers a link acts on (docs/federation.md, "Loops and hops", "The link"): only a
# link's own connection may publish them; the server strips them from anyone else's.
LINK_HEADERS = frozenset({names.PATH_HEADER, PROBE_HEADER})
LINK_HEADER_MARK = b"amqha"  # in every one of their names: the cheap test on a publish


def frozen(value: Any) -> Hashable:
    """A hashable form of an argument value in which equal tables are equal whatever their
    key order; the type is kept (1, True and 1.0 stay different), bytes and text too."""
    if isinstance(value, Mapping):
        return ("table", tuple(sorted((str(k), frozen(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(frozen(item) for item in value))
    if isinstance(value, bytearray):
        return ("bytes", bytes(value))
    return (type(value).__name__, value)


class UpstreamBinding:
    """One binding of the buffer queue to the upstream exchange; ``key`` (routing key and
    arguments in a hashable form) is worked out once, when it is made, and two bindings
    are equal when their keys are."""

    __slots__ = ("routing_key", "arguments", "key")

    def __init__(
        self,
        routing_key: str,
        arguments: Mapping[str, Any],
        frozen_arguments: Hashable | None = None,
    ) -> None:
        self.routing_key = routing_key
        self.arguments = arguments
        self.key: tuple[str, Hashable] = (
            routing_key,
            frozen(arguments) if frozen_arguments is None else frozen_arguments,
        )

    def like(self, routing_key: str) -> UpstreamBinding:
        """These arguments under another routing key (their hashable form reused)."""
        return UpstreamBinding(routing_key, self.arguments, self.key[1])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UpstreamBinding) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"UpstreamBinding({self.routing_key!r}, {dict(self.arguments)!r})"


def upstream_binding(
    routing_key: str, arguments: Mapping[str, Any], local: str, upstream: str, max_hops: int
) -> UpstreamBinding | str:
    """The upstream binding a local binding asks for, or why it is not propagated
    (``loop``, ``max_hops``: names.crossing). The binding leaves ``local`` with the path it
    came with (a buffer queue's binding carries one) plus ``local``."""
    path = names.extended(names.path_of(arguments), local)
    refused = names.crossing(path, upstream, max_hops)
    if refused is not None:
        return refused
    carried = {k: v for k, v in arguments.items() if k != names.PATH_HEADER}
    carried[names.PATH_HEADER] = path
    return UpstreamBinding(routing_key, carried)


@dataclass
class Desired:
    """The upstream bindings the local ones ask for: each with how many local bindings
    ask for it, and the local bindings not propagated, by reason."""

    bindings: dict[tuple[str, Hashable], UpstreamBinding] = field(default_factory=dict)
    counts: dict[tuple[str, Hashable], int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)


def desired(
    local_bindings: Iterable[tuple[str, Mapping[str, Any]]],
    local: str,
    upstream: str,
    max_hops: int,
) -> Desired:
    """Normalise ``local_bindings`` ((routing key, arguments) of every binding to the
    local exchange): equal pairs make one upstream binding, counted."""
    result = Desired()
    bindings, counts = result.bindings, result.counts
    # The usual binding has no arguments: what it asks for upstream differs only in its
    # routing key, so the path and its rule are worked out once (10,000 bindings are
    # normalised in milliseconds: the link does it whenever they change).
    plain = upstream_binding("", {}, local, upstream, max_hops)
    plain_frozen = None if isinstance(plain, str) else plain.key[1]
    for routing_key, arguments in local_bindings:
        if not arguments:
            if isinstance(plain, str):
                result.refused[plain] = result.refused.get(plain, 0) + 1
                continue
            key = (routing_key, plain_frozen)
            if key in counts:
                counts[key] += 1
            else:
                bindings[key] = plain.like(routing_key)
                counts[key] = 1
            continue
        if PROBE_HEADER in arguments:
            continue  # a downstream link's probe binding: that link's own, never passed on
        made = upstream_binding(routing_key, arguments, local, upstream, max_hops)
        if isinstance(made, str):
            result.refused[made] = result.refused.get(made, 0) + 1
            continue
        key = made.key
        bindings.setdefault(key, made)
        counts[key] = counts.get(key, 0) + 1
    return result


def repairs(
    wanted: Mapping[tuple[str, Hashable], UpstreamBinding], actual: Iterable[UpstreamBinding]
) -> tuple[list[UpstreamBinding], list[UpstreamBinding]]:
    """(to bind, to unbind): what makes ``actual`` (the buffer queue's bindings upstream)
    equal to ``wanted``, each listed once, in a stable order."""
    have = {binding.key: binding for binding in actual}
    to_bind = [wanted[key] for key in sorted((k for k in wanted if k not in have), key=repr)]
    to_unbind = [have[key] for key in sorted((k for k in have if k not in wanted), key=repr)]
    return to_bind, to_unbind


def backoff(attempts: int, initial: float, cap: float, rng: random.Random) -> float:
    """The wait before retry number ``attempts`` (1 for the first): doubling from
    ``initial`` up to ``cap``, then somewhere in its upper half, so links that failed
    together do not retry together."""
    step = min(cap, initial * 2 ** min(max(attempts - 1, 0), 30))
    return step / 2 + rng.random() * step / 2


@dataclass
class LinkState:
    """A link's state as reported; ``attempts`` counts the failures since it last ran."""

    state: str = CONNECTING
    reason: str | None = None
    since: float = 0.0
    attempts: int = 0

    def connecting(self, now: float) -> None:
        if self.state != CONNECTING:
            self.state, self.since = CONNECTING, now
        self.reason = self.reason if self.attempts else None

    def running(self, now: float) -> None:
        self.state, self.reason, self.since, self.attempts = RUNNING, None, now, 0

    def failed(self, reason: str, now: float) -> None:
        if self.state != FAILED or self.reason != reason:
            self.since = now
        self.state, self.reason = FAILED, reason
        self.attempts += 1


@dataclass
class Probes:
    """Probes sent and back. A running link is stalled while no probe has come back for
    PROBE_INTERVALS probe intervals, counted from when it came up or the last one back."""

    interval: float
    up_at: float = 0.0
    last_back: float | None = None
    sent: int = 0
    back: int = 0

    def up(self, now: float) -> None:
        self.up_at, self.last_back = now, None

    def sent_one(self) -> None:
        self.sent += 1

    def came_back(self, now: float) -> None:
        self.back += 1
        self.last_back = now

    def stalled(self, now: float) -> bool:
        since = self.up_at if self.last_back is None else max(self.last_back, self.up_at)
        return now - since > PROBE_INTERVALS * self.interval


def shown_state(link: LinkState, probes: Probes, now: float) -> str:
    """``running`` is shown as ``stalled`` when the probes say so."""
    if link.state == RUNNING and probes.stalled(now):
        return STALLED
    return link.state


@dataclass
class Counters:
    """What a link took down (``received``: into the local exchange), sent up, dropped by
    reason, repaired, and received again (``duplicates``: redelivered by the upstream,
    so possibly routed here before)."""

    received: int = 0
    forwarded: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    repairs: int = 0
    duplicates: int = 0
    last_message: float | None = None

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def taken(self, now: float, redelivered: bool) -> None:
        self.received += 1
        self.last_message = now
        if redelivered:
            self.duplicates += 1


def message_crossing(
    headers: Mapping[str, Any] | None, upstream: str, local: str, max_hops: int
) -> tuple[list[str], str | None]:
    """The path a message taken down from ``upstream`` arrives with, and why it may not
    arrive at ``local`` (or None)."""
    path = names.extended(names.path_of(headers), upstream)
    return path, names.crossing(path, local, max_hops)


def probe_key(downstream: str, exchange: str) -> str:
    """The routing key (and probe header value) of a link's probes: its own, so a probe
    routed to another link's buffer queue is told apart."""
    return f"amqha.probe.{downstream}.{exchange}"
