"""The pair's recent history for the web page, from both servers' event logs (pure).

Owns: each server's states as runs over a window, the spans where an ACTIVE had no
in-sync PASSIVE (unprotected), the service band's outages (no ACTIVE) and dual-active
spells, the incidents' markers (peer last seen, peer lost, survivor ACTIVE), and the
pair's unprotected time since UTC midnight. The definitions are the report's
(docs/report.md, "Unprotected time"; ``spark.runs``), taken with every server's clock
as it is: the page shows the last hours of one pair as its logs say them, where the report
also bounds clock offsets (docs/operations.md, "Web page").

Must not know: files, HTTP, the clock (``until`` is given).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from spark.model import RANK_STARTED, record_rank
from spark.runs import state_runs, unprotected_spans  # the report's rules (no Spark)
from spark.spans import clip as _clip
from spark.spans import measure as _measure
from spark.spans import union as _union

Row = dict[str, Any]
Span = tuple[float, float]
Run = tuple[str | None, float, float]  # (state, start, end); None: nothing recorded yet

DOWN = "DOWN"
STATES = ("PRIMARY", "BACKUP", "ACTIVE", "PASSIVE")
BULK = frozenset({"redirect", "refuse"})  # throttled, numerous: runs kept by their ends
PEER_EVENTS = ("peer_up", "peer_lost")
IN_SYNC, OUT_OF_SYNC = "in_sync", "out_of_sync"
DAY = 86400.0
HOURS = (1, 3, 12, 24)  # the windows the page offers; 3 unless asked
DEFAULT_HOURS = 3


def good(record: Any) -> bool:
    """A v1 record the history can use: a finite time, a server, an event, a known state."""
    if not isinstance(record, dict) or record.get("v") != 1:
        return False
    ts = record.get("ts")
    return (
        isinstance(ts, (int, float))
        and not isinstance(ts, bool)
        and math.isfinite(ts)
        and isinstance(record.get("node"), str)
        and bool(record.get("node"))
        and isinstance(record.get("event"), str)
        and record.get("state") in STATES
    )


def history_from_lines(lines: Iterable[bytes | str], since: float) -> list[Row]:
    """One server's records from its log's lines, for a history from ``since``: the good
    records at or after it; before it, the last record, the last transition and the last
    ACTIVE's ``sync`` record (the state it was in then, since when, and whether it was
    protected); and of each run of redirects and refusals in one state only the first and
    the last (the points inside say nothing the run's ends do not: docs/report.md, "One
    definition, two scans")."""
    before: dict[str, Row] = {}
    kept: list[Row] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not good(record):
            continue
        if record["ts"] < since:
            before["last"] = record
            if record["event"] in ("transition", "started") or (
                record["event"] == "sync" and record.get("side") == "active"
            ):
                before[record["event"]] = record
            continue
        if (
            record["event"] in BULK
            and len(kept) >= 2
            and kept[-1]["event"] in BULK
            and kept[-2]["event"] in BULK
            and kept[-1]["state"] == kept[-2]["state"] == record["state"]
        ):
            kept[-1] = record  # the run's last point moves on
            continue
        kept.append(record)
    earlier = {id(r): r for r in before.values()}
    return sorted(earlier.values(), key=lambda r: (r["ts"], record_rank(r["event"]))) + kept


# -- state runs ----------------------------------------------------------------------------


def _crashed(records: Sequence[Row], last_point: float, lost_claim: float | None) -> bool:
    """Dead from its last sign of life: its log ends without ``stopped``, its peer logged
    losing it after that, and it did not log losing its peer (a cut link shows in both
    logs; a crash in one), as ``spark.model.crashed_at_tail`` decides."""
    last_peer = next((r["event"] for r in reversed(records) if r["event"] in PEER_EVENTS), None)
    return (
        records[-1]["event"] != "stopped"
        and lost_claim is not None
        and lost_claim > last_point
        and last_peer != "peer_lost"
    )


def node_runs(records: Sequence[Row], markers: Sequence[float], crashed: bool) -> list[Run]:
    """A server's states as maximal runs on its own clock. A record holds its state until
    the next; the gap before a ``started`` is DOWN, as is the time after the last sign of
    life of a crashed server; before the first record, DOWN if that record is a
    ``started``, else unknown (None: the log read does not go back so far). A peer's
    ``last_seen`` about the server carries its state on."""
    points = sorted((r["ts"], record_rank(r["event"]), r["event"], r["state"]) for r in records)
    if not points and not markers:
        return []
    origin: str | None = DOWN if points and points[0][1] == RANK_STARTED else None
    return state_runs(points, markers, crashed, origin)


# -- interval sets -------------------------------------------------------------------------


def _counted(sets: Sequence[Sequence[Span]], lo: float, hi: float, wanted: int) -> list[Span]:
    """Where exactly ``wanted`` (or, for 2, at least 2) of the sets cover a time."""
    edges: dict[float, int] = {lo: 0, hi: 0}
    for spans in sets:
        for s, e in _clip(spans, lo, hi):
            edges[s] = edges.get(s, 0) + 1
            edges[e] = edges.get(e, 0) - 1
    times = sorted(edges)
    found: list[Span] = []
    count = 0
    for t, t_next in zip(times, times[1:], strict=False):
        count += edges[t]
        if not (count == wanted if wanted < 2 else count >= wanted):
            continue
        if found and found[-1][1] == t:
            found[-1] = (found[-1][0], t_next)
        else:
            found.append((t, t_next))
    return found


def midnight(ts: float) -> float:
    """The UTC midnight that begins ``ts``'s day."""
    return math.floor(ts / DAY) * DAY


# -- the pair ------------------------------------------------------------------------------


def pair_timeline(logs: Mapping[str, Sequence[Row]], since: float, until: float) -> dict:
    """The pair's history over ``since .. until`` from each server's records (its own log,
    in its order), for the page's timeline and its figure of unprotected time today (since
    the UTC midnight before ``until``; the logs should reach back to it). Drawn from
    ``start``: ``since``, or the first record if the logs begin later."""
    nodes = sorted(n for n, records in logs.items() if records)
    markers: dict[str, list[float]] = {n: [] for n in nodes}
    claims: dict[str, float] = {}
    for node in nodes:
        for r in logs[node]:
            peer = r.get("peer")
            if r["event"] == "peer_lost" and peer in markers and peer != node:
                claims[peer] = max(claims.get(peer, -math.inf), r["ts"])
                seen = r.get("last_seen")
                if isinstance(seen, (int, float)) and math.isfinite(seen):
                    markers[peer].append(float(seen))
    runs: dict[str, list[Run]] = {}
    unprotected: dict[str, list[Span]] = {}
    for node in nodes:
        records = sorted(logs[node], key=lambda r: (r["ts"], record_rank(r["event"])))
        last = max(records[-1]["ts"], max(markers[node], default=-math.inf))
        runs[node] = node_runs(records, markers[node], _crashed(records, last, claims.get(node)))
        unprotected[node] = unprotected_spans(runs[node], records)

    # The history starts where the logs do (a pair started an hour ago has no three hours),
    # and the service band where every server's lane is known.
    first = min((r["ts"] for n in nodes for r in logs[n]), default=until)
    start = min(max(since, first), until)
    known_from = max(
        (next((s for state, s, _ in runs[n] if state is not None), until) for n in nodes),
        default=until,
    )
    lo = min(max(start, known_from), until)
    active = [[(s, e) for state, s, e in runs[n] if state == "ACTIVE"] for n in nodes]
    recorded = any(r["event"] == "sync" for n in nodes for r in logs[n])
    today = midnight(until)
    everyone = [span for n in nodes for span in unprotected[n]]
    return {
        "since": since,
        "start": start,
        "until": until,
        "nodes": nodes,
        "lanes": [
            {"node": n, "state": state, "start": s, "end": e}
            for n in nodes
            for state, s, e in _clip_runs(runs[n], start, until)
        ],
        "unprotected": sorted(
            (
                {"node": n, "start": s, "end": e}
                for n in nodes
                for s, e in _clip(unprotected[n], start, until)
                if recorded
            ),
            key=lambda u: (u["start"], u["node"]),
        ),
        "service_since": lo,
        "outages": _spells(_counted(active, lo, until, 0)),
        "dual_active": _spells(_counted(active, lo, until, 2)),
        "markers": _markers(logs, nodes, start, until),
        "unprotected_today": {
            "recorded": recorded,
            "since": today,
            "seconds": _measure(_clip(_union(everyone), today, until)) if recorded else None,
        },
    }


def _clip_runs(runs: Sequence[Run], lo: float, hi: float) -> list[Run]:
    return [(state, max(s, lo), min(e, hi)) for state, s, e in runs if min(e, hi) > max(s, lo)]


def _spells(spans: Sequence[Span]) -> list[Row]:
    return [{"start": s, "end": e, "seconds": e - s} for s, e in spans]


def _markers(logs: Mapping[str, Sequence[Row]], nodes: Sequence[str], lo: float, hi: float):
    """Each peer_lost in the window: where its peer was last seen, where it was lost, and
    the survivor's ACTIVE transition when that is what followed (the report's incidents)."""
    found: list[Row] = []
    for node in nodes:
        resolvers = [
            r
            for r in logs[node]
            if r["event"] in ("peer_lost", "started", "stopped")
            or (r["event"] == "transition" and r["state"] == "ACTIVE")
        ]
        for r, following in zip(resolvers, [*resolvers[1:], None], strict=False):
            if r["event"] != "peer_lost" or not lo <= r["ts"] <= hi:
                continue
            peer = r.get("peer")
            seen = r.get("last_seen")
            if peer in nodes and isinstance(seen, (int, float)) and lo <= seen <= hi:
                found.append({"kind": "last_seen", "node": peer, "ts": seen, "by": node})
            found.append({"kind": "peer_lost", "node": node, "ts": r["ts"], "peer": peer})
            if (
                r["state"] != "ACTIVE"
                and following is not None
                and following["event"] == "transition"
            ):
                found.append(
                    {
                        "kind": "takeover",
                        "node": node,
                        "ts": following["ts"],
                        "trigger": following.get("trigger"),
                    }
                )
    return sorted(found, key=lambda m: m["ts"])
