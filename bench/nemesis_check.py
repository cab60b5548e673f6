"""The checker of ``make nemesis``: what the clients saw, against what they were promised.

Owns: the history of one run (every message sent with its unique id, which were
confirmed, which failed, every delivery, what the quarantine files hold) and the verdict
on it: lost, duplicated, unexpected and in-doubt messages; and the interval arithmetic
for the run's figures (dual-active and dual-confirm seconds, unavailable seconds,
takeovers). Pure: no I/O, no clock; bench/nemesis.py records the history and reads the
event logs (docs/operations.md, "Fault schedule (make nemesis)").

The words:

- **lost**: confirmed, never delivered (to a consumer, or by the drain at the end), and
  in no quarantine file. Must be 0.
- **unexpected**: delivered, never sent. Must be 0.
- **in doubt**: sent, never confirmed (nacked, or the publisher closed while it was held):
  it may or may not be delivered; neither is an error. A confirmed message is also in
  doubt at its publisher when the publisher lost its server while holding it: it was
  sent again and may be stored twice (docs/client.md, "Publisher: at least once").
- **duplicated**: delivered more than once. A duplicate is *explained* when the message
  was in doubt at its publisher, or a later delivery of it was flagged redelivered, or a
  consumer it was delivered to lost its server after that delivery (the ack may not have
  arrived); any other is *unexplained*.
- **quarantined only**: confirmed, never delivered, kept in a quarantine file: not lost,
  but served only after ``amqha quarantine replay`` (docs/durability.md, section 5).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Interval = tuple[float, float]
SAMPLE = 10  # ids shown per kind of failure


@dataclass(frozen=True)
class Delivery:
    """One delivery of message ``id`` to ``consumer`` (``drain``: the read at the end)."""

    id: str
    at: float
    consumer: str
    redelivered: bool = False


@dataclass
class History:
    # id -> whether its publisher lost its server while holding it (in doubt there)
    sent: dict[str, bool] = field(default_factory=dict)
    confirmed: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)  # nacked, or closed while held
    deliveries: list[Delivery] = field(default_factory=list)
    quarantined: set[str] = field(default_factory=set)  # ids in quarantine files
    # consumer -> times it noticed its server was lost
    consumer_failovers: dict[str, list[float]] = field(default_factory=dict)


def check(history: History) -> dict[str, Any]:
    """The verdict on one run's history (the words in the module's docstring)."""
    counts = Counter(d.id for d in history.deliveries)
    delivered = set(counts)
    sent = set(history.sent)
    lost = history.confirmed - delivered - history.quarantined
    unexpected = delivered - sent
    in_doubt = sent - history.confirmed
    duplicated = {i for i, n in counts.items() if n > 1}
    of: dict[str, list[Delivery]] = {i: [] for i in duplicated}
    for delivery in history.deliveries:
        if delivery.id in of:
            of[delivery.id].append(delivery)
    unexplained = {i for i in duplicated if not _explained(i, of[i], history)}
    return {
        "sent": len(sent),
        "confirmed": len(history.confirmed),
        "delivered": len(delivered),
        "deliveries": len(history.deliveries),
        "lost": len(lost),
        "unexpected": len(unexpected),
        "duplicated": len(duplicated),
        "duplicate_deliveries": sum(counts[i] - 1 for i in duplicated),
        "duplicated_unexplained": len(unexplained),
        "in_doubt": len(in_doubt),
        "in_doubt_delivered": len(in_doubt & delivered),
        "confirmed_in_doubt": sum(history.sent.get(i, False) for i in history.confirmed),
        "quarantined": len(history.quarantined & sent),
        "quarantined_only": len((history.confirmed & history.quarantined) - delivered),
        "samples": {
            "lost": sorted(lost)[:SAMPLE],
            "unexpected": sorted(unexpected)[:SAMPLE],
            "duplicated_unexplained": sorted(unexplained)[:SAMPLE],
        },
    }


def _explained(message: str, deliveries: list[Delivery], history: History) -> bool:
    if history.sent.get(message, False):
        return True
    mine = sorted(deliveries, key=lambda d: d.at)
    if any(d.redelivered for d in mine[1:]):
        return True
    for earlier in mine[:-1]:
        if any(t >= earlier.at for t in history.consumer_failovers.get(earlier.consumer, ())):
            return True
    return False


def failed(verdict: dict[str, Any]) -> bool:
    """A run fails when a confirmed message is lost or a message nobody sent appears."""
    return bool(verdict["lost"] or verdict["unexpected"])


# -- intervals ------------------------------------------------------------------------------


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, disjoint ones (empty ones dropped)."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def intersect(first: Iterable[Interval], second: Iterable[Interval]) -> list[Interval]:
    a, b = merged(first), merged(second)
    return merged(
        (max(x[0], y[0]), min(x[1], y[1])) for x in a for y in b if x[0] < y[1] and y[0] < x[1]
    )


def subtract(base: Iterable[Interval], removed: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    cuts = merged(removed)
    for start, end in merged(base):
        at = start
        for cut_start, cut_end in cuts:
            if cut_end <= at or cut_start >= end:
                continue
            if cut_start > at:
                out.append((at, cut_start))
            at = max(at, cut_end)
        if at < end:
            out.append((at, end))
    return out


def measure(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in merged(intervals))


def dual_active_seconds(
    first: Iterable[Interval], second: Iterable[Interval], asleep: Iterable[Interval] = ()
) -> float:
    """Seconds both servers were ACTIVE (their event logs' intervals), less the times one
    of them was frozen by the schedule (``asleep``): a frozen server confirms nothing."""
    return measure(subtract(intersect(first, second), asleep))


def spells(times: Iterable[float], gap: float) -> list[Interval]:
    """``times`` grouped into spells: consecutive times less than ``gap`` s apart share
    one; each spell runs from its first time to its last."""
    out: list[Interval] = []
    for t in sorted(times):
        if out and t - out[-1][1] < gap:
            out[-1] = (out[-1][0], t)
        else:
            out.append((t, t))
    return out


def dual_confirm_seconds(
    first: Iterable[float], second: Iterable[float], gap: float = 1.0
) -> float:
    """Seconds during which clients got confirms from both servers: the overlap of each
    server's confirm spells (``spells``). One failover, however quick, makes none: the
    old server's spell ends before the new one's starts."""
    return measure(intersect(spells(first, gap), spells(second, gap)))


def unavailable_seconds(
    confirms: Iterable[float], start: float, end: float, grain: float = 1.0
) -> float:
    """Seconds between ``start`` and ``end`` in gaps of more than ``grain`` s in which no
    publisher got a confirm (each such gap counted whole)."""
    times = [start, *sorted(t for t in confirms if start <= t <= end), end]
    return sum(b - a for a, b in zip(times, times[1:], strict=False) if b - a > grain)


def takeovers(events: Iterable[dict[str, Any]], since: float) -> int:
    """Transitions to ACTIVE at or after ``since`` in one server's event log."""
    return sum(
        1
        for e in events
        if e.get("event") == "transition" and e.get("to") == "ACTIVE" and e.get("ts", 0) >= since
    )
