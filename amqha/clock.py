"""This process's wall clock: epoch seconds that a step of the system clock does not move
(docs/durability.md, "When a clock steps").

Owns: the one reading of the system's wall clock at import, advanced from then on by the
monotonic clock. Message deadlines, queue expiry, the event log's ``ts``, the times in
peer messages and the page's "now" all read ``now``: a step of the system clock while the
process runs (NTP, a VM restored, an operator's ``date -s``) moves none of them, and they
keep the rate of the monotonic clock (which NTP slews). ``stepped`` says how far the
system clock has moved away since, for the log and the metrics.

Must not know: who reads it.
"""

from __future__ import annotations

import time

_WALL_AT_START = time.time()
_MONOTONIC_AT_START = time.monotonic()
_BASE = _WALL_AT_START - _MONOTONIC_AT_START


def now() -> float:
    """Epoch seconds: the system's wall clock as it was when this process started, plus the
    monotonic time since."""
    return _BASE + time.monotonic()


def stepped() -> float:
    """How far the system's wall clock now is from ``now`` (positive: ahead), in seconds:
    the sum of the steps it took since this process started (0 without one)."""
    return time.time() - now()
