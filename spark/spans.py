"""Sets of time spans, each a sorted list of disjoint ``(start, end)``: their union, clip,
measure, and where a given number of sets overlap (the report's and the management page's
timeline's). Owns nothing else; must not know records, servers or Spark.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

Span = tuple[float, float]


def union(spans: Iterable[Span]) -> list[Span]:
    merged: list[Span] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def clip(spans: Iterable[Span], lo: float, hi: float) -> list[Span]:
    return [(max(s, lo), min(e, hi)) for s, e in spans if min(e, hi) > max(s, lo)]


def measure(spans: Iterable[Span]) -> float:
    return sum(e - s for s, e in spans)


def counted(
    sets: Sequence[Sequence[Span]], window: Span, wanted: Callable[[int], bool]
) -> list[Span]:
    """Maximal spans of the window where the number of sets covering a time is ``wanted``."""
    delta: dict[float, int] = defaultdict(int)
    delta[window[0]] += 0
    delta[window[1]] += 0
    for spans in sets:
        for s, e in spans:
            delta[s] += 1
            delta[e] -= 1
    times = sorted(delta)
    found: list[Span] = []
    count = 0
    for t, t_next in zip(times, times[1:], strict=False):
        count += delta[t]
        if not wanted(count) or t_next <= window[0] or t >= window[1]:
            continue
        if found and found[-1][1] == t:
            found[-1] = (found[-1][0], t_next)
        else:
            found.append((t, t_next))
    return clip(found, *window)


def shift(x: float, by: float) -> float:
    return x if math.isinf(x) else x - by


def minus(spans: Iterable[Span], holes: Sequence[Span]) -> list[Span]:
    """``spans`` less every span of ``holes``."""
    left: list[Span] = []
    for start, end in spans:
        for h_start, h_end in sorted(holes):
            if h_end <= start or h_start >= end:
                continue
            if h_start > start:
                left.append((start, h_start))
            start = max(start, h_end)
            if start >= end:
                break
        if end > start:
            left.append((start, end))
    return left
