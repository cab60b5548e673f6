"""Every figure of one pair, from that pair's few points and records.

Owns: per-node state runs, outages and dual-active spells with their ranges over the clock
offsets' intervals (a server's freezes are no ACTIVE time), unprotected time (an ACTIVE with
no in-sync PASSIVE), incidents, recoveries, misconfigurations, quarantines, time in state and
the daily rows, split at UTC midnight of the pair's reference clock; the failover rows are
``spark.failovers``', the interval sets ``spark.spans``'. The input is small: each node's
non-bulk records, and points in which runs of redirects and refusals may be reduced to their
first and last (``spark.job`` reduces them; ``spark.reference`` passes them all, and the two
must agree). Also the whole report from every record held in memory (``Collected``), which is
how the reference works and how the Spark job finishes a small input. Pure: no I/O, no Spark.
"""

from __future__ import annotations

import bisect
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark.failovers import failovers as failover_rows
from spark.failovers import frozen_spans
from spark.model import (
    CAUSES,
    CLOCK_RESOLUTION_S,
    DOWN,
    FEDERATION_EVENT,
    IN_SYNC,
    LINK_DOWN_KINDS,
    LINK_FAILED,
    LINK_UP,
    MINUTE,
    OUT_OF_SYNC,
    OUTCOMES,
    PEER_EVENTS,
    RANK_MARKER,
    RANK_ORIGIN,
    RANK_STARTED,
    RECOVER_COMMAND,
    RECOVERY_TRIGGERS,
    REPORT_STATES,
    SYNC_EVENT,
    TABLES,
    Offset,
    clock_constraints,
    crashed_at_tail,
    day_of,
    day_spans,
    estimate_offsets,
    given_for,
    iso,
    minute_label,
    record_rank,
    reference_node,
    report_window,
    unnamed_pair,
)
from spark.spans import Span, minus
from spark.spans import clip as _clip
from spark.spans import counted as _counted
from spark.spans import measure as _measure
from spark.spans import shift as _shift
from spark.spans import union as _union
from spark.summary import build_summary

Point = tuple[float, int, str, str]  # (ts, rank, event, state): also the order inside a node
Row = dict[str, Any]
_RECOVER = re.compile(RECOVER_COMMAND)


def record_key(record: Mapping[str, Any]) -> Point:
    return (record["ts"], record_rank(record["event"]), record["event"], record["state"])


@dataclass
class PairInput:
    """One pair's input, each node on its own clock: ``points`` sorted (every record, or runs
    of bulk records reduced to their ends), ``records`` the non-bulk records in point order."""

    name: str
    points: dict[str, list[Point]]
    records: dict[str, list[Row]]
    events: int

    @property
    def nodes(self) -> list[str]:
        return sorted(self.points)


@dataclass
class PairClocks:
    reference: str
    offsets: dict[str, Offset]
    warnings: list[str]
    window: tuple[float, float]

    @property
    def known(self) -> bool:
        return all(o.known for o in self.offsets.values())


@dataclass
class PairReport:
    summary: dict[str, Any]
    tables: dict[str, list[Row]] = field(default_factory=dict)


def pair_clocks(
    pair: PairInput,
    since: float | None,
    until: float | None,
    given: Mapping[str, float],
    estimate: bool,
) -> PairClocks:
    """The pair's clock offsets and its window on the reference clock."""
    roles = {
        node: next((r["role"] for r in rows if r.get("role")), "")
        for node, rows in pair.records.items()
    }
    reference = reference_node(pair.nodes, roles)
    constraints = clock_constraints(pair.records) if estimate else []
    offsets, warnings = estimate_offsets(
        pair.nodes, reference, constraints, given_for(pair.name, pair.nodes, given), estimate
    )
    # By default the window spans the logs, as far as they surely reach whatever the offsets:
    # an edge that moves with an unknown offset would make an outage of the move.
    first = min(pts[0][0] - offsets[n].lower for n, pts in pair.points.items())
    last = max(pts[-1][0] - offsets[n].upper for n, pts in pair.points.items())
    window = report_window(since, until, first, last)
    assert window is not None  # a pair has points
    return PairClocks(reference, offsets, warnings, window)


# ---------------------------------------------------------------- state runs


def _node_runs(
    points: Sequence[Point], markers: Sequence[float], crashed: bool
) -> list[tuple[str, float, float]]:
    return state_runs(points, markers, crashed)  # type: ignore[return-value]


def state_runs(
    points: Sequence[Point], markers: Sequence[float], crashed: bool, origin: str | None = DOWN
) -> list[tuple[str | None, float, float]]:
    """A node's states as maximal runs on its own clock, from before its first point
    (``origin``: DOWN, or None where a log read from part way does not say) to after its
    last (held, or DOWN if it crashed). A point holds its state until the next point, except
    that the gap before a ``started`` is DOWN (a crash leaves no ``stopped``); peers'
    ``last_seen`` about the node are points that carry the state on. The management page's
    timeline draws its lanes with it."""
    stream: list[Point] = [(-math.inf, RANK_ORIGIN, "", "")]
    stream += points
    stream += [(m, RANK_MARKER, "", "") for m in markers]
    stream.sort()
    runs: list[tuple[str | None, float, float]] = []
    carry: str | None = origin
    for i, (ts, rank, event, state) in enumerate(stream):
        if rank == RANK_ORIGIN:
            carry = origin
        elif rank != RANK_MARKER:
            carry = DOWN if event == "stopped" else state
        if i + 1 < len(stream):
            end = stream[i + 1][0]
            held = DOWN if stream[i + 1][1] == RANK_STARTED else carry
        else:
            end = math.inf
            held = DOWN if crashed else carry
        if end <= ts:
            continue
        if runs and runs[-1][0] == held:
            runs[-1] = (held, runs[-1][1], end)
        else:
            runs.append((held, ts, end))
    return runs


# ---------------------------------------------------------------- spells with ranges


def _spell_rows(
    pair: str,
    point: list[Span],
    possible: list[Span],
    certain: list[Span],
    days: Sequence[tuple[str, float, float]],
    known: bool,
) -> list[Row]:
    """Outage or dual-active rows, split at midnight. With every offset known they are the
    point spells; otherwise each stretch where one is possible is a row: its duration at the
    offsets used, and its range from what holds at every offset in the intervals to what
    holds at some."""
    rows = []
    for day, lo, hi in days:
        if known:
            for s, e in _clip(point, lo, hi):
                rows.append(_spell(pair, day, s, e, e - s, e - s, e - s))
            continue
        for s, e in _clip(possible, lo, hi):
            here = _clip(point, s, e)
            start, end = (here[0][0], here[-1][1]) if here else (s, e)
            rows.append(
                _spell(pair, day, start, end, _measure(here), _measure(_clip(certain, s, e)), e - s)
            )
    return rows


def _spell(pair: str, day: str, start, end, duration, least, most) -> Row:
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


# ---------------------------------------------------------------- unprotected time


def unprotected_spans(
    runs: Sequence[tuple[str | None, float, float]], records: Sequence[Row]
) -> list[Span]:
    """A node's unprotected spans on its own clock: in each of its ACTIVE runs, from the run's
    start or an ``out_of_sync`` record to the next ``in_sync`` record or the run's end. Only
    the ACTIVE's own records count (``side`` "active", written while ACTIVE); a crash ends
    the run, and the span with it, where the state runs say (docs/report.md, "Unprotected
    time"). The management page's timeline draws the same spans from the same rule."""
    marks = [
        (r["ts"], r.get("sync") == IN_SYNC)
        for r in records
        if r["event"] == SYNC_EVENT
        and r.get("side") == "active"
        and r["state"] == "ACTIVE"
        and r.get("sync") in (IN_SYNC, OUT_OF_SYNC)
    ]
    spans: list[Span] = []
    i = 0
    for state, start, end in runs:
        if state != "ACTIVE":
            continue
        while i < len(marks) and marks[i][0] < start:
            i += 1
        since: float | None = start
        while i < len(marks) and marks[i][0] <= end:
            ts, in_sync = marks[i]
            i += 1
            if in_sync and since is not None:
                spans.append((since, ts))
                since = None
            elif not in_sync and since is None:
                since = ts
        if since is not None:
            spans.append((since, end))
    return [(s, e) for s, e in spans if e > s]


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


def _unprotected(
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
                rows.append({**_spell(pair, day, start, end, duration, least, most), "node": node})
                placed[day].append((s, node, least, most))
    by_day = {}
    point_all, possible_all, certain_all = _union(points), _union(possibles), _union(certains)
    for day, lo, hi in days:
        seconds = _measure(_clip(point_all, lo, hi))
        if not moved:
            by_day[day] = (seconds, seconds, seconds)
            continue
        # Where one node's spans can fall and no other's, its bounds are the pair's; where
        # several can, at least the most any one covers and what each covers at every
        # offset, at most their sum.
        least = most = 0.0
        found = sorted(placed[day])
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
    return rows, by_day


# ---------------------------------------------------------------- federation links


def _run_end(runs: Sequence[tuple[str, float, float]], ts: float) -> float:
    """The end of the node's state run holding ``ts`` (``ts`` itself when none holds it)."""
    for _, start, end in runs:
        if start <= ts < end:
            return end
    return ts


def federation_links(
    name: str,
    records: Mapping[str, Sequence[Row]],
    runs: Mapping[str, Sequence[tuple[str, float, float]]],
    offsets: Mapping[str, Offset],
    window: Span,
    days: Sequence[tuple[str, float, float]],
) -> list[Row]:
    """Per federation link (``link``, ``upstream``) and day, its down time (docs/report.md,
    "Federation links"). A node's link is up from its ``link_up`` to its next
    ``link_down`` or ``link_failed``, and at most to the end of the state run it came up in
    (a server that steps down or dies takes its links with it); the pair's link is up while
    one of its nodes' is. It is watched from its first record on; the rest of the window,
    it is down. On the offsets used, with no range: a link's records are its server's own."""
    since, until = window
    up: dict[tuple[str, str], list[Span]] = defaultdict(list)
    first: dict[tuple[str, str], float] = {}
    failures: dict[tuple[str, str, str], int] = defaultdict(int)
    for node, node_records in records.items():
        d = offsets[node].seconds
        opened: dict[tuple[str, str], float] = {}
        for r in node_records:
            kind, link, upstream = r.get("kind"), r.get("link"), r.get("upstream")
            if r["event"] != FEDERATION_EVENT or link is None or upstream is None:
                continue
            if kind != LINK_UP and kind not in LINK_DOWN_KINDS:
                continue
            key, ts = (link, upstream), r["ts"]
            first[key] = min(first.get(key, math.inf), _shift(ts, d))
            if kind == LINK_UP:
                opened.setdefault(key, ts)
                continue
            start = opened.pop(key, None)
            if start is not None:
                up[key].append((_shift(start, d), _shift(min(ts, _run_end(runs[node], start)), d)))
            if kind == LINK_FAILED and since <= _shift(ts, d) <= until:
                failures[(link, upstream, day_of(_shift(ts, d)))] += 1
        for key, start in opened.items():
            up[key].append((_shift(start, d), _shift(_run_end(runs[node], start), d)))
    rows: list[Row] = []
    for key in sorted(first):
        watched = max(since, first[key])
        if watched >= until:
            continue
        down = _counted([_union(up[key])], (watched, until), lambda n: n == 0)
        for day, lo, hi in days:
            if hi <= watched:
                continue
            seconds = hi - max(lo, watched)
            down_s = _measure(_clip(down, lo, hi))
            rows.append(
                {
                    "pair": name,
                    "day": day,
                    "link": key[0],
                    "upstream": key[1],
                    "seconds": seconds,
                    "down_s": down_s,
                    "down_fraction": down_s / seconds if seconds > 0 else None,
                    "downs": sum(1 for s, _ in down if lo <= s < hi),
                    "failures": failures[(*key, day)],
                }
            )
    return rows


def _keyed(rows: list[Row], failovers: Sequence[Row], start: str, end: str) -> None:
    """Give each row the key of the failover whose span (its start to its new ACTIVE) it
    meets; None for none (the pair's start, an outage nobody ended)."""
    spans = sorted((f["start"], f["end"], f["incident"]) for f in failovers)
    for row in rows:
        found = [k for s, e, k in spans if row[start] <= e and s <= row[end]]
        row["incident"] = found[0] if found else None


# ---------------------------------------------------------------- the pair


def pair_report(
    pair: PairInput,
    clocks: PairClocks,
    bulk_by_day: Mapping[str, tuple[int, int]],
) -> PairReport:
    """The pair's tables and summary. ``bulk_by_day`` holds redirects and refusals per day
    of the window (each implementation counts them per minute itself)."""
    name, nodes = pair.name, pair.nodes
    offsets = clocks.offsets
    since, until = clocks.window
    length = until - since
    days = day_spans(clocks.window)
    known = clocks.known
    tables: dict[str, list[Row]] = {t: [] for t in TABLES if t != "redirects_per_minute"}

    def at(node: str, ts: float) -> float:
        return ts - offsets[node].seconds

    # Signs of life and claims of death: a peer_lost says its peer sent a state message at
    # last_seen (on the peer's clock) and that the observer missed it from ts (on its own).
    markers: dict[str, list[float]] = defaultdict(list)
    claims: dict[str, float] = {}
    for node in nodes:
        for r in pair.records[node]:
            peer = r.get("peer")
            if r["event"] == "peer_lost" and peer in pair.points and peer != node:
                claims[peer] = max(claims.get(peer, -math.inf), at(node, r["ts"]))
                if r.get("last_seen") is not None:
                    markers[peer].append(r["last_seen"])

    runs: dict[str, list[tuple[str, float, float]]] = {}
    for node in nodes:
        points = pair.points[node]
        last = max(points[-1][0], max(markers[node], default=-math.inf))
        last_event = points[-1][2]
        last_peer_event = next((p[2] for p in reversed(points) if p[2] in PEER_EVENTS), None)
        crashed = crashed_at_tail(last_event, at(node, last), claims.get(node), last_peer_event)
        runs[node] = _node_runs(points, markers[node], crashed)

    spent: dict[tuple[str, str, str], float] = defaultdict(float)
    for node in nodes:
        d = offsets[node].seconds
        shifted = [(state, _shift(s, d), _shift(e, d)) for state, s, e in runs[node]]
        for day, lo, hi in days:
            for state, s, e in shifted:
                s, e = max(s, lo), min(e, hi)
                if e > s:
                    tables["state_intervals"].append(
                        {
                            "pair": name,
                            "day": day,
                            "node": node,
                            "state": state,
                            "start": s,
                            "end": e,
                            "duration_s": e - s,
                        }
                    )
                    spent[(day, node, state)] += e - s
    for day, lo, hi in days:
        for node in nodes:
            for state in REPORT_STATES:
                seconds = spent[(day, node, state)]
                tables["state_time"].append(
                    {
                        "pair": name,
                        "day": day,
                        "node": node,
                        "state": state,
                        "seconds": seconds,
                        "fraction": seconds / (hi - lo) if hi > lo else None,
                    }
                )

    # ACTIVE at the offsets used, at some offset in the intervals, and at every one.
    point_sets, possible_sets, certain_sets = [], [], []
    for node in nodes:
        o = offsets[node]
        if known:  # within the resolution: the offsets used are the offsets
            o = Offset(o.seconds, o.source, o.seconds, o.seconds)
        # A frozen ACTIVE serves nothing: its freezes are outages (or not dual active).
        active = minus(
            [(s, e) for state, s, e in runs[node] if state == "ACTIVE"],
            frozen_spans(pair.records[node]),
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
    outage = _counted(point_sets, window, lambda n: n == 0)
    outage_possible = _counted(certain_sets, window, lambda n: n == 0)
    outage_certain = _counted(possible_sets, window, lambda n: n == 0)
    dual = _counted(point_sets, window, lambda n: n >= 2)
    dual_possible = _counted(possible_sets, window, lambda n: n >= 2)
    dual_certain = _counted(certain_sets, window, lambda n: n >= 2)
    tables["outages"] = _spell_rows(name, outage, outage_possible, outage_certain, days, known)
    tables["dual_active"] = _spell_rows(name, dual, dual_possible, dual_certain, days, known)

    # Unprotected time is recorded only by logs with sync records (replication on, a server
    # that writes them): without any it is not known, which is not 0.
    recorded = any(r["event"] == SYNC_EVENT for node in nodes for r in pair.records[node])
    unprotected_by_day: dict[str, tuple[float, float, float]] = {}
    if recorded:
        own = {node: unprotected_spans(runs[node], pair.records[node]) for node in nodes}
        tables["unprotected"], unprotected_by_day = _unprotected(
            name, own, offsets, clocks.window, days, known
        )

    for node in nodes:
        resolvers = [
            r
            for r in pair.records[node]
            if r["event"] in ("peer_lost", "started", "stopped")
            or (r["event"] == "transition" and r["state"] == "ACTIVE")
        ]
        for r, following in zip(resolvers, [*resolvers[1:], None], strict=True):
            lost_ts = at(node, r["ts"])
            if r["event"] != "peer_lost" or not since <= lost_ts <= until:
                continue
            active_ts = trigger = None
            if r["state"] == "ACTIVE":
                outcome, active_ts = "already_active", lost_ts
            elif following is not None and following["event"] == "transition":
                outcome, active_ts = "takeover", at(node, following["ts"])
                trigger = following.get("trigger")
            elif following is not None and following["event"] in ("started", "stopped"):
                outcome = "survivor_down"
            else:
                outcome = "unresolved"
            peer = r.get("peer")
            seen = r.get("last_seen")
            delay = least = most = last_seen = None
            if seen is not None:
                theirs = offsets.get(peer, offsets[node])
                mine = offsets[node]
                last_seen = seen - theirs.seconds
                delay = lost_ts - last_seen
                if known:
                    least = most = delay
                else:
                    raw = r["ts"] - seen
                    least = raw + theirs.lower - mine.upper
                    most = raw + theirs.upper - mine.lower
            tables["incidents"].append(
                {
                    "pair": name,
                    "day": day_of(lost_ts),
                    "node": node,
                    "peer": peer,
                    "peer_state": r.get("peer_state"),
                    "epoch": r.get("epoch"),
                    "last_seen": last_seen,
                    "lost_ts": lost_ts,
                    "detection_delay_s": delay,
                    "min_detection_delay_s": least,
                    "max_detection_delay_s": most,
                    "active_ts": active_ts,
                    "takeover_delay_s": None if active_ts is None else active_ts - lost_ts,
                    "outcome": outcome,
                    "trigger": trigger,
                    "uncertain": least is not None and most - least > CLOCK_RESOLUTION_S,
                }
            )

    tables["failovers"] = failover_rows(
        name, nodes, runs, pair.records, offsets, clocks.window, known, dual
    )
    tables["federation_links"] = federation_links(
        name, pair.records, runs, offsets, clocks.window, days
    )
    for table, start, end in (
        ("outages", "start", "end"),
        ("dual_active", "start", "end"),
        ("incidents", "lost_ts", "lost_ts"),
    ):
        _keyed(tables[table], tables["failovers"], start, end)
    # A dual active that began after its takeover (a frozen ACTIVE that woke and served on)
    # is the spell of the last failover before it with dual-active time of its own.
    for row in tables["dual_active"]:
        if row["incident"] is None:
            row["incident"] = max(
                (
                    f["incident"]
                    for f in tables["failovers"]
                    if f["dual_active_s"] and f["end"] < row["end"]
                ),
                default=None,
            )

    dual_events: dict[str, int] = defaultdict(int)
    # The witness (docs/failover.md): takeovers it agreed to, and the times an ACTIVE stopped
    # serving because it had lost both its peer and its witnesses (or was overtaken).
    witness = {"agreed_takeovers": 0, "fences": 0}
    for node in nodes:
        for r in pair.records[node]:
            ts = at(node, r["ts"])
            if not since <= ts <= until:
                continue
            event = r["event"]
            if event == "transition" and (r.get("reason") or "").endswith(WITNESS_AGREES):
                witness["agreed_takeovers"] += 1
            elif event == "witness_fence" and r.get("reason") is not None:
                witness["fences"] += 1
            place = {"pair": name, "day": day_of(ts)}
            if (event == "console" and _RECOVER.search(r.get("command") or "")) or (
                event == "transition" and r.get("trigger") in RECOVERY_TRIGGERS
            ):
                tables["recoveries"].append(
                    {
                        **place,
                        "ts": ts,
                        "node": node,
                        "event": event,
                        "trigger": r.get("trigger"),
                        "from_state": r.get("from"),
                        "to_state": r.get("to"),
                        "user": r.get("user"),
                        "command": r.get("command"),
                        "result": r.get("result"),
                    }
                )
            elif event == "misconfigured":
                tables["misconfigurations"].append(
                    {
                        **place,
                        "ts": ts,
                        "node": node,
                        "peer": r.get("peer"),
                        "peer_epoch": r.get("peer_epoch"),
                        "reason": r.get("reason"),
                    }
                )
            elif event == "dual_active":
                dual_events[place["day"]] += 1
            elif event == "quarantine":
                tables["quarantines"].append(
                    {
                        **place,
                        "ts": ts,
                        "node": node,
                        "messages": r.get("messages"),
                        "path": r.get("path"),
                    }
                )

    for table, (_, order) in TABLES.items():
        if table in tables:
            tables[table].sort(key=lambda row, order=order: tuple(row[c] for c in order))

    for day, lo, hi in days:
        seconds = hi - lo
        out_point = _measure(_clip(outage, lo, hi))
        out_most = _measure(_clip(outage_possible, lo, hi))
        out_least = _measure(_clip(outage_certain, lo, hi))
        today = [i for i in tables["incidents"] if i["day"] == day]
        takeovers = [i["takeover_delay_s"] for i in today if i["outcome"] == "takeover"]
        redirects, refusals = bulk_by_day.get(day, (0, 0))
        quarantined = [q for q in tables["quarantines"] if q["day"] == day]
        unprotected, least, most = unprotected_by_day.get(day, (None, None, None))
        tables["daily"].append(
            {
                "pair": name,
                "day": day,
                "seconds": seconds,
                "availability": 1 - out_point / seconds if seconds > 0 else None,
                "min_availability": 1 - out_most / seconds if seconds > 0 else None,
                "max_availability": 1 - out_least / seconds if seconds > 0 else None,
                "outages": sum(1 for o in tables["outages"] if o["day"] == day),
                "outage_s": out_point,
                "dual_active_s": _measure(_clip(dual, lo, hi)),
                "max_dual_active_s": _measure(_clip(dual_possible, lo, hi)),
                "unprotected_s": unprotected,
                "unprotected_fraction": (
                    unprotected / seconds if unprotected is not None and seconds > 0 else None
                ),
                "min_unprotected_s": least,
                "max_unprotected_s": most,
                "quarantines": len(quarantined),
                "quarantined_messages": sum(q["messages"] or 0 for q in quarantined),
                "incidents": len(today),
                "takeovers": len(takeovers),
                "max_takeover_delay_s": max(takeovers, default=None),
                "redirects": redirects,
                "refusals": refusals,
                "recoveries": sum(
                    1
                    for r in tables["recoveries"]
                    if r["day"] == day and r["trigger"] == "MANUAL_RECOVER"
                ),
                "recover_commands": sum(
                    1 for r in tables["recoveries"] if r["day"] == day and r["event"] == "console"
                ),
                "failovers": sum(1 for f in tables["failovers"] if f["day"] == day),
                "client_outage_s": sum(
                    f["outage_s"] for f in tables["failovers"] if f["day"] == day
                ),
                "uncertain": any(
                    row["uncertain"]
                    for t in ("outages", "dual_active", "unprotected", "incidents")
                    for row in tables[t]
                    if row["day"] == day
                ),
            }
        )

    # A window that misses the logs altogether has no figure: its time is not an outage
    # (nothing says the servers were down), only unobserved.
    first = min(pts[0][0] - offsets[n].seconds for n, pts in pair.points.items())
    last = max(pts[-1][0] - offsets[n].seconds for n, pts in pair.points.items())
    no_data = until < first or since > last
    # Each server's freezes (its paused gaps) in the window: no ACTIVE time (above).
    freezes = sorted(
        (
            {"node": node, "start": max(at(node, s), since), "end": min(at(node, e), until)}
            for node in nodes
            for s, e in frozen_spans(pair.records[node])
            if min(at(node, e), until) > max(at(node, s), since)
        ),
        key=lambda f: (f["start"], f["node"]),
    )
    warnings = list(clocks.warnings)
    if no_data:
        warnings.append(
            f"no data: no record of this pair in the window {iso(since)} .. {iso(until)}"
            f" (its logs run {iso(first)} .. {iso(last)}); no figure is given"
        )
        for table in tables:
            tables[table] = []
        outage = outage_possible = outage_certain = dual = dual_possible = dual_certain = []
        dual_events.clear()
        bulk_by_day = {}
        recorded = False
        freezes = []
        witness = {"agreed_takeovers": 0, "fences": 0}
    else:
        if since < first - 1.0:
            warnings.append(
                f"the window starts {first - since:.0f}s before this pair's first record"
                f" ({iso(first)}): no server was running then, which counts as an outage"
            )
        if until > last + 1.0:
            warnings.append(
                f"the window ends {until - last:.0f}s after this pair's last record"
                f" ({iso(last)}): what the servers last logged is taken to hold until then"
            )
    incidents = tables["incidents"]
    failovers = tables["failovers"]
    outages, duals = tables["outages"], tables["dual_active"]
    recoveries = tables["recoveries"]
    out_total = _measure(outage)
    unprotected_rows, quarantines = tables["unprotected"], tables["quarantines"]
    summary = {
        "pair": name,
        "nodes": nodes,
        "events": pair.events,
        "reference_clock": clocks.reference,
        "clock_offsets": {n: o.as_json() for n, o in sorted(offsets.items())},
        "window": {"since": since, "until": until, "seconds": length},
        "availability": 1 - out_total / length if length > 0 else None,
        "min_availability": 1 - _measure(outage_possible) / length if length > 0 else None,
        "max_availability": 1 - _measure(outage_certain) / length if length > 0 else None,
        "uncertain": any(r["uncertain"] for r in (*outages, *duals, *unprotected_rows, *incidents)),
        "outages": {
            "count": len(outages),
            "seconds": out_total,
            "min_seconds": _measure(outage_certain),
            "max_seconds": _measure(outage_possible),
            "longest_s": max((o["duration_s"] for o in outages), default=None),
            "uncertain": sum(1 for o in outages if o["uncertain"]),
        },
        "dual_active": {
            "count": len(duals),
            "seconds": _measure(dual),
            "min_seconds": _measure(dual_certain),
            "max_seconds": _measure(dual_possible),
            "uncertain": sum(1 for d in duals if d["uncertain"]),
            "events": sum(dual_events.values()),
        },
        "unprotected": _unprotected_summary(unprotected_rows, tables["daily"], length)
        if recorded
        else dict.fromkeys(UNPROTECTED_KEYS, None) | {"recorded": False},
        "freezes": {
            "count": len(freezes),
            "seconds": sum(f["end"] - f["start"] for f in freezes),
            "listed": freezes,
        },
        "quarantines": {
            "count": len(quarantines),
            "messages": sum(q["messages"] or 0 for q in quarantines),
            "listed": [
                {"ts": q["ts"], "node": q["node"], "messages": q["messages"], "path": q["path"]}
                for q in quarantines
            ],
        },
        "incidents": {
            "count": len(incidents),
            "by_outcome": {o: sum(1 for i in incidents if i["outcome"] == o) for o in OUTCOMES},
            "detection_delay_s": _stats(i["detection_delay_s"] for i in incidents),
            "takeover_delay_s": _stats(
                i["takeover_delay_s"] for i in incidents if i["outcome"] == "takeover"
            ),
        },
        "state_seconds": {
            node: {
                state: sum(
                    r["seconds"]
                    for r in tables["state_time"]
                    if r["node"] == node and r["state"] == state
                )
                for state in REPORT_STATES
            }
            for node in nodes
        },
        "redirects": sum(r for r, _ in bulk_by_day.values()),
        "refusals": sum(f for _, f in bulk_by_day.values()),
        "manual_recoveries": {
            "recover_commands": sum(1 for r in recoveries if r["event"] == "console"),
            "manual_recover_transitions": sum(
                1 for r in recoveries if r["trigger"] == "MANUAL_RECOVER"
            ),
            "handovers": sum(1 for r in recoveries if r["trigger"] == "HANDOVER"),
        },
        "misconfigurations": len(tables["misconfigurations"]),
        "witness": witness,
        "failovers": {
            "count": len(failovers),
            "by_cause": {c: sum(1 for f in failovers if f["cause"] == c) for c in CAUSES},
            "outage_seconds": sum(f["outage_s"] for f in failovers),
            "longest_outage_s": max((f["outage_s"] for f in failovers), default=None),
        },
        "no_data": no_data,
        "warnings": warnings,
    }
    if no_data:
        summary["availability"] = summary["min_availability"] = summary["max_availability"] = None
    return PairReport(summary, tables)


UNPROTECTED_KEYS = (
    "recorded",
    "seconds",
    "fraction",
    "min_seconds",
    "max_seconds",
    "spans",
    "longest_s",
    "uncertain",
)


def _unprotected_summary(rows: Sequence[Row], daily: Sequence[Row], length: float) -> dict:
    """The pair's unprotected time over the window: its days' sums."""
    seconds = sum(d["unprotected_s"] for d in daily)
    return {
        "recorded": True,
        "seconds": seconds,
        "fraction": seconds / length if length > 0 else None,
        "min_seconds": sum(d["min_unprotected_s"] for d in daily),
        "max_seconds": sum(d["max_unprotected_s"] for d in daily),
        "spans": len(rows),
        "longest_s": max((r["duration_s"] for r in rows), default=None),
        "uncertain": sum(1 for r in rows if r["uncertain"]),
    }


def _stats(values: Iterable[float | None]) -> dict[str, float | int | None]:
    present = [v for v in values if v is not None]
    return {
        "count": len(present),
        "mean": sum(present) / len(present) if present else None,
        "max": max(present) if present else None,
    }


def minute_row(
    pair: str, node: str, minute: int, counts: tuple[int, int], offset: float, window: Span
) -> Row | None:
    """A minute of redirects and refusals (on the node's clock), placed at its true start;
    None when it does not overlap the window."""
    start = minute - offset
    if not (start <= window[1] and start + 60 > window[0]):
        return None
    return {
        "pair": pair,
        "day": day_of(start),
        "node": node,
        "minute_start": minute,
        "minute": minute_label(minute),
        "at": start,
        "redirects": counts[0],
        "refusals": counts[1],
    }


# ---------------------------------------------------------------- every record in memory

BULK = frozenset({"redirect", "refuse"})
# How a takeover the witness agreed to ends its reason (failover/fsm.py).
WITNESS_AGREES = "the witness agrees"


@dataclass
class Collected:
    """Every good record of some logs, as points, the non-bulk ones whole too, and redirects
    and refusals counted per minute; keyed by (pair, node), the pair None for logs that name
    none. About a hundred bytes a record: names are shared, not copied."""

    files: list[str]
    count: int = 0
    bad_by_file: dict[str, int] = field(default_factory=dict)
    points: dict[tuple[str | None, str], list[Point]] = field(
        default_factory=lambda: defaultdict(list)
    )
    records: dict[tuple[str | None, str], list[Row]] = field(
        default_factory=lambda: defaultdict(list)
    )
    per_minute: dict[tuple[str | None, str, int], list[int]] = field(
        default_factory=lambda: defaultdict(lambda: [0, 0])
    )

    def add(self, pair: str | None, node: str, record: Row) -> None:
        """A good record (typed, ``ts`` finite, ``node``, ``event`` and ``state`` set,
        ``unrecorded`` absent or a count). A redirect or refusal counts for itself and the
        ones of its kind its server left out before it (``unrecorded``), in its minute."""
        event = sys.intern(record["event"])
        ts = record["ts"]
        key = (pair, node)
        self.count += 1
        self.points[key].append((ts, record_rank(event), event, sys.intern(record["state"])))
        if event in BULK:
            minute = math.floor(ts / MINUTE) * MINUTE
            counts = self.per_minute[(pair, node, minute)]
            counts[event == "refuse"] += 1 + (record.get("unrecorded") or 0)
        else:
            self.records[key].append(record)

    def bad(self, file: str, lines: int = 1) -> None:
        self.bad_by_file[file] = self.bad_by_file.get(file, 0) + lines

    def pairs(self) -> dict[str, PairInput]:
        """The records grouped by pair, each node's in order; logs that name no pair are one
        pair named after its nodes. The lists are taken over, not copied: sorted in place."""
        unnamed = unnamed_pair(node for pair, node in self.points if pair is None)
        pairs: dict[str, PairInput] = {}
        for (pair, node), points in self.points.items():
            name = unnamed if pair is None else pair
            found = pairs.setdefault(name, PairInput(name, {}, {}, 0))
            records = self.records.get((pair, node), [])
            if node in found.points:  # a node under its pair's name and in unnamed logs too
                found.points[node].extend(points)
                found.records[node].extend(records)
            else:
                found.points[node] = points
                found.records[node] = list(records)
            found.events += len(points)
        for found in pairs.values():
            for node in found.points:
                found.points[node].sort()
                found.records[node].sort(key=record_key)
        return pairs

    def minutes(self) -> dict[tuple[str, str], list[tuple[int, tuple[int, int]]]]:
        """Redirects and refusals per (pair, node), by minute on the node's clock."""
        unnamed = unnamed_pair(node for pair, node in self.points if pair is None)
        found: dict[tuple[str, str], list[tuple[int, tuple[int, int]]]] = defaultdict(list)
        for (pair, node, minute), (redirects, refusals) in self.per_minute.items():
            found[(unnamed if pair is None else pair, node)].append((minute, (redirects, refusals)))
        for rows in found.values():
            rows.sort()
        return found


def report_of(
    collected: Collected,
    since: float | None,
    until: float | None,
    given: Mapping[str, float],
    estimate: bool,
    slo: float | None,
) -> tuple[dict[str, Any], dict[str, list[Row]], dict[str, PairClocks]]:
    """The summary, every table (sorted) and each pair's clocks, from every record."""
    pairs = collected.pairs()
    minutes = collected.minutes()
    tables: dict[str, list[Row]] = {name: [] for name in TABLES}
    summaries = {}
    clocks = {}
    for name, pair in sorted(pairs.items()):
        clocks[name] = pair_clocks(pair, since, until, given, estimate)
        rows = []
        for node in pair.nodes:
            offset = clocks[name].offsets[node].seconds
            for minute, counts in minutes.get((name, node), []):
                row = minute_row(name, node, minute, counts, offset, clocks[name].window)
                if row is not None:
                    rows.append(row)
        by_day: dict[str, tuple[int, int]] = {}
        for row in rows:
            r, f = by_day.get(row["day"], (0, 0))
            by_day[row["day"]] = (r + row["redirects"], f + row["refusals"])
        found = pair_report(pair, clocks[name], by_day)
        summaries[name] = found.summary
        for table, table_rows in found.tables.items():
            tables[table].extend(table_rows)
        tables["redirects_per_minute"].extend(rows)
    for table, (_, order) in TABLES.items():
        tables[table].sort(key=lambda row, order=order: tuple(row[c] for c in order))
    summary = build_summary(
        files=collected.files,
        events=collected.count,
        bad_lines_by_file=collected.bad_by_file,
        pairs=summaries,
        daily=tables["daily"],
        takeover_delays=[
            f["takeover_delay_s"] for f in tables["failovers"] if f["takeover_delay_s"] is not None
        ],
        slo=slo,
    )
    return summary, tables, clocks
