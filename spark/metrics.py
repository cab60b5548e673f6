"""Every figure of one pair, from that pair's few points and records, and the whole report
from every record held in memory.

Owns: a pair's input and clocks (its offsets and window on the reference clock), each node's
state runs as the pair's records end them (a peer's ``last_seen`` carries a node on; a crash
at its log's tail ends it), time in state, the order the pair's tables are made in, and what
a window that misses the logs gives (no figure); the rest is its own module's: spells with
their ranges (``spark.spells``), the tables read off records (``spark.records``), the
failovers (``spark.failovers``), the daily rows and summary (``spark.summary``). The input is
small: each node's non-bulk records, and points in which runs of redirects and refusals may
be reduced to their first and last (``spark.job`` reduces them; ``spark.reference`` passes
them all, and the two must agree). Also the whole report from every record held in memory
(``Collected``), which is how the reference works and how the Spark job finishes a small
input. Pure: no I/O, no Spark; must not know how the records were read.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark.failovers import failovers as failover_rows
from spark.failovers import frozen_spans
from spark.model import (
    MINUTE,
    PEER_EVENTS,
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
from spark.records import federation_links, incident_rows, key_to_failovers, noted_records
from spark.runs import Point, maintenance_spans, overlap, record_key, state_runs, unprotected_spans
from spark.spans import Span, shift
from spark.spells import active_spells, spell_rows, unprotected_rows
from spark.summary import PairFigures, build_summary, daily_rows, pair_summary

Row = dict[str, Any]
Run = tuple[str, float, float]


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


def _pair_runs(pair: PairInput, offsets: Mapping[str, Offset]) -> dict[str, list[Run]]:
    """Each node's state runs on its own clock. Signs of life and claims of death: a
    peer_lost says its peer sent a state message at last_seen (on the peer's clock) and that
    the observer missed it from ts (on its own)."""

    def at(node: str, ts: float) -> float:
        return ts - offsets[node].seconds

    markers: dict[str, list[float]] = defaultdict(list)
    claims: dict[str, float] = {}
    for node in pair.nodes:
        for r in pair.records[node]:
            peer = r.get("peer")
            if r["event"] == "peer_lost" and peer in pair.points and peer != node:
                claims[peer] = max(claims.get(peer, -math.inf), at(node, r["ts"]))
                if r.get("last_seen") is not None:
                    markers[peer].append(r["last_seen"])
    runs: dict[str, list[Run]] = {}
    for node in pair.nodes:
        points = pair.points[node]
        last = max(points[-1][0], max(markers[node], default=-math.inf))
        last_event = points[-1][2]
        last_peer_event = next((p[2] for p in reversed(points) if p[2] in PEER_EVENTS), None)
        crashed = crashed_at_tail(last_event, at(node, last), claims.get(node), last_peer_event)
        runs[node] = state_runs(points, markers[node], crashed)  # type: ignore[assignment]
    return runs


def _state_tables(
    name: str,
    runs: Mapping[str, Sequence[Run]],
    offsets: Mapping[str, Offset],
    days: Sequence[tuple[str, float, float]],
) -> tuple[list[Row], list[Row]]:
    """The state intervals on the reference clock, split at midnight, and the time each node
    spent in each state each day."""
    intervals: list[Row] = []
    spent: dict[tuple[str, str, str], float] = defaultdict(float)
    for node in sorted(runs):
        d = offsets[node].seconds
        shifted = [(state, shift(s, d), shift(e, d)) for state, s, e in runs[node]]
        for day, lo, hi in days:
            for state, s, e in shifted:
                s, e = max(s, lo), min(e, hi)
                if e > s:
                    intervals.append(
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
    time = [
        {
            "pair": name,
            "day": day,
            "node": node,
            "state": state,
            "seconds": spent[(day, node, state)],
            "fraction": spent[(day, node, state)] / (hi - lo) if hi > lo else None,
        }
        for day, lo, hi in days
        for node in sorted(runs)
        for state in REPORT_STATES
    ]
    return intervals, time


# ---------------------------------------------------------------- the pair


def _freezes(pair: PairInput, offsets: Mapping[str, Offset], window: Span) -> list[Row]:
    """Each server's freezes (its paused gaps) in the window, on the reference clock."""
    since, until = window

    def at(node: str, ts: float) -> float:
        return ts - offsets[node].seconds

    return sorted(
        (
            {"node": node, "start": max(at(node, s), since), "end": min(at(node, e), until)}
            for node in pair.nodes
            for s, e in frozen_spans(pair.records[node])
            if min(at(node, e), until) > max(at(node, s), since)
        ),
        key=lambda f: (f["start"], f["node"]),
    )


def _coverage(pair: PairInput, clocks: PairClocks) -> tuple[bool, list[str]]:
    """Whether the window misses the pair's logs altogether (its time is then not an
    outage, nothing says the servers were down: only unobserved), and the clocks' warnings
    with what the window's edges beyond the logs mean."""
    offsets = clocks.offsets
    since, until = clocks.window
    first = min(pts[0][0] - offsets[n].seconds for n, pts in pair.points.items())
    last = max(pts[-1][0] - offsets[n].seconds for n, pts in pair.points.items())
    no_data = until < first or since > last
    warnings = list(clocks.warnings)
    if no_data:
        warnings.append(
            f"no data: no record of this pair in the window {iso(since)} .. {iso(until)}"
            f" (its logs run {iso(first)} .. {iso(last)}); no figure is given"
        )
        return no_data, warnings
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
    return no_data, warnings


def pair_report(
    pair: PairInput,
    clocks: PairClocks,
    bulk_by_day: Mapping[str, tuple[int, int]],
) -> PairReport:
    """The pair's tables and summary. ``bulk_by_day`` holds redirects and refusals per day
    of the window (each implementation counts them per minute itself)."""
    name, nodes, offsets, window = pair.name, pair.nodes, clocks.offsets, clocks.window
    days = day_spans(window)
    known = clocks.known
    tables: dict[str, list[Row]] = {t: [] for t in TABLES if t != "redirects_per_minute"}
    runs = _pair_runs(pair, offsets)
    tables["state_intervals"], tables["state_time"] = _state_tables(name, runs, offsets, days)
    outage, dual = active_spells(pair.records, runs, offsets, window, known)
    tables["outages"] = spell_rows(name, outage, days, known)
    tables["dual_active"] = spell_rows(name, dual, days, known)
    # Unprotected time is recorded only by logs with sync records (replication on, a server
    # that writes them): without any it is not known, which is not 0.
    recorded = any(r["event"] == SYNC_EVENT for node in nodes for r in pair.records[node])
    unprotected_by_day: dict[str, tuple[float, float, float]] = {}
    planned_by_day: dict[str, float] = {}
    if recorded:
        own = {node: unprotected_spans(runs[node], pair.records[node]) for node in nodes}
        tables["unprotected"], unprotected_by_day = unprotected_rows(
            name, own, offsets, window, days, known
        )
        # The part of it while the ACTIVE's peer was in maintenance, by the ACTIVE's own
        # records (one clock): planned, counted apart.
        planned = {
            node: overlap(own[node], maintenance_spans(pair.records[node])) for node in nodes
        }
        if any(planned.values()):
            _, by_day = unprotected_rows(name, planned, offsets, window, days, known)
            planned_by_day = {day: seconds for day, (seconds, _, _) in by_day.items()}
    tables["incidents"] = incident_rows(name, pair.records, offsets, window, known)
    tables["failovers"] = failover_rows(
        name, nodes, runs, pair.records, offsets, window, known, dual.point
    )
    tables["federation_links"] = federation_links(name, pair.records, runs, offsets, window, days)
    key_to_failovers(tables)
    noted = noted_records(name, pair.records, offsets, window)
    tables["recoveries"] = noted.recoveries
    tables["misconfigurations"] = noted.misconfigurations
    tables["quarantines"] = noted.quarantines
    for table, (_, order) in TABLES.items():
        if table in tables:
            tables[table].sort(key=lambda row, order=order: tuple(row[c] for c in order))
    tables["daily"] = daily_rows(name, days, tables, outage, dual, unprotected_by_day, bulk_by_day)
    no_data, warnings = _coverage(pair, clocks)
    since, until = window
    head = {
        "pair": name,
        "nodes": nodes,
        "events": pair.events,
        "reference_clock": clocks.reference,
        "clock_offsets": {n: o.as_json() for n, o in sorted(offsets.items())},
        "window": {"since": since, "until": until, "seconds": until - since},
    }
    if no_data:
        tables = {table: [] for table in tables}
        return PairReport(pair_summary(head, tables, PairFigures.unobserved(warnings)), tables)
    figures = PairFigures(
        outage=outage,
        dual=dual,
        dual_events=noted.dual_events,
        witness=noted.witness,
        freezes=_freezes(pair, offsets, window),
        recorded=recorded,
        planned_by_day=planned_by_day,
        bulk_by_day=bulk_by_day,
        no_data=False,
        warnings=warnings,
    )
    return PairReport(pair_summary(head, tables, figures), tables)


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
