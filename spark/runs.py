"""A node's points and what they say on its own clock: its state runs and its unprotected spans.

Owns: a point's order inside a node (``record_key``), the state runs a node's points make
(``state_runs``) and the spans of its ACTIVE runs with no in-sync PASSIVE
(``unprotected_spans``; docs/report.md, "Unprotected time"). The report and the management
page's timeline draw from the same two rules. Pure: no I/O, no Spark; must not know clock
offsets, pairs or the report's tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from spark.model import (
    DOWN,
    IN_SYNC,
    OUT_OF_SYNC,
    RANK_MARKER,
    RANK_ORIGIN,
    RANK_STARTED,
    SYNC_EVENT,
    record_rank,
)
from spark.spans import Span

Point = tuple[float, int, str, str]  # (ts, rank, event, state): also the order inside a node
Row = dict[str, Any]


def record_key(record: Mapping[str, Any]) -> Point:
    return (record["ts"], record_rank(record["event"]), record["event"], record["state"])


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


MAINTENANCE_EVENT = "maintenance"


def maintenance_spans(records: Sequence[Row]) -> list[Span]:
    """When, on a node's own clock, its peer was in maintenance by the node's own records
    (``maintenance`` records of the other role, applied ones: a refused one has a
    ``result``); one left on runs to the end of the log (docs/report.md, "Unprotected
    time")."""
    spans: list[Span] = []
    since: float | None = None
    for r in records:
        if r["event"] != MAINTENANCE_EVENT or r.get("result") is not None:
            continue
        if r.get("server") == r.get("role"):
            continue
        on = r.get("on") in (True, "true")  # a string column reads JSON true as its text
        if on and since is None:
            since = r["ts"]
        elif not on and since is not None:
            spans.append((since, r["ts"]))
            since = None
    if since is not None:
        spans.append((since, math.inf))
    return spans


def overlap(spans: Sequence[Span], within: Sequence[Span]) -> list[Span]:
    """The parts of ``spans`` inside ``within`` (both sorted and disjoint)."""
    out: list[Span] = []
    j = 0
    for s, e in spans:
        while j < len(within) and within[j][1] <= s:
            j += 1
        k = j
        while k < len(within) and within[k][0] < e:
            lo, hi = max(s, within[k][0]), min(e, within[k][1])
            if hi > lo:
                out.append((lo, hi))
            k += 1
    return out
