"""Outages, dual-active and unprotected spells with their ranges over the clock offsets.

Owns: a pair's ACTIVE time as spans at the offsets used, at some offset in the intervals and
at every one (a server's freezes are no ACTIVE time), the outage and dual-active spans they
make, the spell rows split at midnight with the range each one's duration has over the
offsets' intervals, and the unprotected rows and per-day bounds of a pair (docs/report.md,
"Unprotected time"). Pure: no I/O, no Spark; must not know how the records were read.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark.failovers import frozen_spans
from spark.model import CLOCK_RESOLUTION_S, Offset
from spark.spans import Span, minus
from spark.spans import clip as _clip
from spark.spans import counted as _counted
from spark.spans import measure as _measure
from spark.spans import shift as _shift
from spark.spans import union as _union

Row = dict[str, Any]
Run = tuple[str, float, float]


@dataclass(frozen=True)
class Spells:
    """Spans on the reference clock: at the offsets used (``point``), at some offset in the
    intervals (``possible``) and at every one (``certain``)."""

    point: list[Span]
    possible: list[Span]
    certain: list[Span]


NO_SPELLS = Spells([], [], [])


def active_spells(
    records: Mapping[str, Sequence[Row]],
    runs: Mapping[str, Sequence[Run]],
    offsets: Mapping[str, Offset],
    window: Span,
    known: bool,
) -> tuple[Spells, Spells]:
    """The pair's outages (no server ACTIVE) and dual active (two or more), from each node's
    ACTIVE runs less its freezes: a frozen ACTIVE serves nothing."""
    since, until = window
    # ACTIVE at the offsets used, at some offset in the intervals, and at every one.
    point_sets, possible_sets, certain_sets = [], [], []
    for node in sorted(runs):
        o = offsets[node]
        if known:  # within the resolution: the offsets used are the offsets
            o = Offset(o.seconds, o.source, o.seconds, o.seconds)
        active = minus(
            [(s, e) for state, s, e in runs[node] if state == "ACTIVE"],
            frozen_spans(records[node]),
        )
        point_sets.append(
            _clip([(_shift(s, o.seconds), _shift(e, o.seconds)) for s, e in active], since, until)
        )
        possible_sets.append(
            _clip(_union((_shift(s, o.upper), _shift(e, o.lower)) for s, e in active), since, until)
        )
        certain_sets.append(
            _clip([(_shift(s, o.lower), _shift(e, o.upper)) for s, e in active], since, until)
        )
    window = (since, until)
    outage = Spells(
        _counted(point_sets, window, lambda n: n == 0),
        _counted(certain_sets, window, lambda n: n == 0),
        _counted(possible_sets, window, lambda n: n == 0),
    )
    dual = Spells(
        _counted(point_sets, window, lambda n: n >= 2),
        _counted(possible_sets, window, lambda n: n >= 2),
        _counted(certain_sets, window, lambda n: n >= 2),
    )
    return outage, dual


def spell_rows(
    pair: str, spells: Spells, days: Sequence[tuple[str, float, float]], known: bool
) -> list[Row]:
    """Outage or dual-active rows, split at midnight. With every offset known they are the
    point spells; otherwise each stretch where one is possible is a row: its duration at the
    offsets used, and its range from what holds at every offset in the intervals to what
    holds at some."""
    point, possible, certain = spells.point, spells.possible, spells.certain
    rows = []
    for day, lo, hi in days:
        if known:
            for s, e in _clip(point, lo, hi):
                rows.append(spell_row(pair, day, s, e, e - s, e - s, e - s))
            continue
        for s, e in _clip(possible, lo, hi):
            here = _clip(point, s, e)
            start, end = (here[0][0], here[-1][1]) if here else (s, e)
            rows.append(
                spell_row(
                    pair, day, start, end, _measure(here), _measure(_clip(certain, s, e)), e - s
                )
            )
    return rows


def spell_row(pair: str, day: str, start, end, duration, least, most) -> Row:
    return {
        "pair": pair,
        "day": day,
        "start": start,
        "end": end,
        "duration_s": duration,
        "min_duration_s": least,
        "max_duration_s": most,
        # Uncertain: whether it happened at all, or how long, depends on the offsets.
        "uncertain": least != most and (least == 0.0 or most - least > CLOCK_RESOLUTION_S),
    }


def _moved_cover(
    spans: Sequence[Span], lower: float, upper: float, lo: float, hi: float
) -> tuple[float, float]:
    """The least and the most of ``lo .. hi`` that a node's spans (on its own clock) cover,
    moved onto the reference clock by any offset in ``lower .. upper``: they move together.
    The cover is piecewise linear in the offset, so its extremes are at the interval's ends
    or where a span's edge meets ``lo`` or ``hi``; swept in order, one pass."""
    if not spans:
        return 0.0, 0.0

    def cover(d: float) -> float:
        return sum(max(0.0, min(e - d, hi) - max(s - d, lo)) for s, e in spans)

    # The cover's slope in the offset: a span enters from the right (+1), stops growing once
    # one edge is inside, shrinks once both edges have passed their ends, is gone (back to 0).
    changes: dict[float, int] = defaultdict(int)
    for s, e in spans:
        first, second = sorted((s - lo, e - hi))
        changes[s - hi] += 1
        changes[first] -= 1
        changes[second] -= 1
        changes[e - lo] += 1
    xs = sorted(x for x in changes if math.isfinite(x))
    # Outside the breakpoints the cover is flat: an unbounded side ends at the last one.
    a = lower if math.isfinite(lower) else min(xs[0], upper)
    b = upper if math.isfinite(upper) else max(xs[-1], a)
    value = least = most = cover(a)
    slope = sum(c for x, c in changes.items() if x <= a)
    at = a
    for x in xs:
        if x <= a:
            continue
        if x >= b:
            break
        value += slope * (x - at)
        at, slope = x, slope + changes[x]
        least, most = min(least, value), max(most, value)
    end = cover(b)
    return max(0.0, min(least, end)), max(most, end)


def unprotected_rows(
    pair: str,
    own: Mapping[str, Sequence[Span]],
    offsets: Mapping[str, Offset],
    window: Span,
    days: Sequence[tuple[str, float, float]],
    exact: bool,
) -> tuple[list[Row], dict[str, tuple[float, float, float]]]:
    """The unprotected rows, one per node and stretch, split at midnight; and per day the
    pair's (seconds, least, most): the pair is unprotected while any of its ACTIVE servers
    is. A node's spans all move with its clock's offset, so their lengths are its clock's:
    only where they fall (which day, inside the window or not) can depend on the offset. A
    row's range is the least and the most of it its node's spans cover over the offset's
    interval; the pair's is an envelope of its nodes' (two ACTIVE servers at once may or may
    not overlap). ``exact``: every offset known, the point used."""
    rows: list[Row] = []
    points: list[Span] = []
    possibles: list[Span] = []
    certains: list[Span] = []
    placed: dict[str, list[tuple[float, str, float, float]]] = defaultdict(list)  # day: rows
    moved = False  # some node's spans move with an offset that is not known
    for node in sorted(own):
        spans = own[node]
        o = offsets[node]
        lower, upper = (o.seconds, o.seconds) if exact or o.known else (o.lower, o.upper)
        point = _clip([(_shift(s, o.seconds), _shift(e, o.seconds)) for s, e in spans], *window)
        possible = _clip(_union((_shift(s, upper), _shift(e, lower)) for s, e in spans), *window)
        points += point
        possibles += possible
        certains += _clip([(_shift(s, lower), _shift(e, upper)) for s, e in spans], *window)
        moved = moved or (lower != upper and bool(spans))
        starts = [s for s, _ in spans]
        ends = [e for _, e in spans]
        for day, lo, hi in days:
            for s, e in _clip(possible, lo, hi):
                here = _clip(point, s, e)
                start, end = (here[0][0], here[-1][1]) if here else (s, e)
                duration = _measure(here)
                if lower == upper:
                    least = most = duration
                else:  # the spans that can fall here: start before e + upper, end after s + lower
                    near = spans[
                        bisect.bisect_right(ends, s + lower) : bisect.bisect_left(starts, e + upper)
                    ]
                    least, most = _moved_cover(near, lower, upper, s, e)
                rows.append(
                    {**spell_row(pair, day, start, end, duration, least, most), "node": node}
                )
                placed[day].append((s, node, least, most))
    by_day = _unprotected_by_day(
        days, _union(points), _union(possibles), _union(certains), placed, moved
    )
    return rows, by_day


def _unprotected_by_day(
    days: Sequence[tuple[str, float, float]],
    point_all: list[Span],
    possible_all: list[Span],
    certain_all: list[Span],
    placed: Mapping[str, list[tuple[float, str, float, float]]],
    moved: bool,
) -> dict[str, tuple[float, float, float]]:
    """Per day the pair's unprotected (seconds, least, most), from its nodes' spans taken
    together and each node's rows (``placed``, by day: start, node, least, most)."""
    by_day = {}
    for day, lo, hi in days:
        seconds = _measure(_clip(point_all, lo, hi))
        if not moved:
            by_day[day] = (seconds, seconds, seconds)
            continue
        # Where one node's spans can fall and no other's, its bounds are the pair's; where
        # several can, at least the most any one covers and what each covers at every
        # offset, at most their sum.
        least = most = 0.0
        found = sorted(placed.get(day, []))
        i = 0
        for s, e in _clip(possible_all, lo, hi):
            per_node: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
            while i < len(found) and found[i][0] < e:
                _, node, row_least, row_most = found[i]
                per_node[node][0] += row_least
                per_node[node][1] += row_most
                i += 1
            least += max(
                max((b[0] for b in per_node.values()), default=0.0),
                _measure(_clip(certain_all, s, e)),
            )
            most += min(sum(b[1] for b in per_node.values()), e - s)
        by_day[day] = (seconds, least, most)
    return by_day
