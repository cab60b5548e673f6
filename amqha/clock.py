"""This process's wall clock: epoch seconds that a step of the system clock does not move
(docs/durability.md, "When a clock steps").

Owns: the one reading of the system's wall clock at import, advanced from then on by the
monotonic clock. Message deadlines, queue expiry, the event log's ``ts``, the times in
peer messages and the page's "now" all read ``now``: a step of the system clock while the
process runs (NTP, a VM restored, an operator's ``date -s``) moves none of them, and they
keep the rate of the monotonic clock (which NTP slews). ``stepped`` says how far the
system clock has moved away since, for the log and the metrics.

And the pair's time (``pair_now``): ``now`` plus the offset to the ACTIVE this server last
followed (``follow``), by which every message deadline and queue expiry is set and read.
A PASSIVE takes its ACTIVE's time from the state messages it hears, so a deadline it
receives means the same to it, even with its system clock an hour off, and it keeps that
time when it takes over (docs/durability.md, "When a clock steps").

Must not know: who reads it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable


def _base(samples: int = 8) -> float:
    """The wall clock less the monotonic one, from the reading taken in the shortest
    moment: a process descheduled between two reads (a busy machine) would otherwise
    start its clock milliseconds off its peer's, and the report would see two clocks."""
    best = None
    for _ in range(samples):
        before = time.monotonic()
        wall = time.time()
        after = time.monotonic()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) / 2)
    assert best is not None
    return best[1]


_BASE = _base()


def now() -> float:
    """Epoch seconds: the system's wall clock as it was when this process started, plus the
    monotonic time since."""
    return _BASE + time.monotonic()


def stepped() -> float:
    """How far the system's wall clock now is from ``now`` (positive: ahead), in seconds:
    the sum of the steps it took since this process started (0 without one)."""
    return time.time() - now()


_pair_offset = 0.0


def pair_now() -> float:
    """The pair's time: ``now`` plus the offset to the ACTIVE this server last followed
    (0 for a server that never followed one). Message deadlines are on it."""
    return _BASE + time.monotonic() + _pair_offset


def pair_offset() -> float:
    """How far the pair's time is from this process's ``now`` (positive: ahead)."""
    return _pair_offset


def follow(offset: float) -> None:
    """The pair's time is ``offset`` s from ``now`` from this moment (a PASSIVE hearing
    its ACTIVE, or a server starting with what it last followed)."""
    global _pair_offset
    _pair_offset = offset


def offset_to_follow(samples: Iterable[float], current: float, slack: float) -> float | None:
    """The pair time's new offset from the ACTIVE's latest state messages (each its
    ``pair_ts`` less this server's ``now`` at arrival), or None to keep ``current``.

    A message's time is the ACTIVE's when it was sent: its flight makes it look behind,
    never ahead, so the highest sample is the closest. Within ``slack`` of ``current``
    nothing moves."""
    best = max(samples, default=None)
    if best is None or abs(best - current) < slack:
        return None
    return best
