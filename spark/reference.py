"""Pure-Python reference of the failover report.

Owns: the metrics written out as plain loops over one process's memory, for small logs and as
the oracle the Spark job (``spark.job``) is tested against: the same input must give the same
tables and summary. Shared decisions (schema, clock offsets, window, crash at the end of a log,
summary) come from ``spark.model``; this module must not import Spark.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark.model import (
    DOWN,
    FIELDS,
    MINUTE,
    PEER_EVENTS,
    RANK_MARKER,
    RANK_ORIGIN,
    RANK_STARTED,
    RECOVER_COMMAND,
    RECOVERY_TRIGGERS,
    REPORT_STATES,
    SCHEMA_VERSION,
    STATES,
    TABLES,
    ClockEvidence,
    UnknownVersionError,
    build_summary,
    crashed_at_tail,
    estimate_offsets,
    expand_paths,
    minute_label,
    record_rank,
    report_window,
)

_KINDS = {name: {"long": int, "double": float, "string": str}[kind] for name, kind in FIELDS}
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_JSON_SPACE = " \t\r\n"
_DECODER = json.JSONDecoder()
_RECOVER = re.compile(RECOVER_COMMAND)
# Redirects and refusals, the bulk of a log: kept as points only; other records are kept whole.
_BULK = frozenset({"redirect", "refuse"})
_NOT_RECORDS = (RANK_ORIGIN, RANK_MARKER)

Point = tuple[float, int, str, str]  # (ts, rank, event, state): also the order inside a node


@dataclass
class Report:
    summary: dict
    tables: dict[str, list[dict[str, Any]]]


@dataclass
class _Events:
    files: list[str]
    count: int = 0
    bad_by_file: dict[str, int] = field(default_factory=dict)
    bad_version: tuple[str, int] | None = None
    points: dict[str, list[Point]] = field(default_factory=lambda: defaultdict(list))
    records: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))


def _lines(path: str) -> Iterator[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as stream:
        yield from stream


def _as_text(value: object) -> str:
    """Spark reads a non-string JSON value in a string column as its JSON text."""
    return json.dumps(value, separators=(",", ":"))


def _typed(obj: dict) -> bool:
    """Coerce ``obj``'s v1 fields in place the way Spark's JSON reader does; False if one
    does not fit its type (Spark's corrupt record), that field then being None."""
    fits = True
    for key, value in obj.items():
        kind = _KINDS.get(key)
        if kind is None or value is None:
            continue
        if type(value) is kind:
            if kind is int and not _LONG_MIN <= value <= _LONG_MAX:
                obj[key], fits = None, False
        elif kind is str:
            obj[key] = _as_text(value)
        elif kind is float and type(value) is int:
            try:
                obj[key] = float(value)
            except OverflowError:
                obj[key], fits = None, False
        else:
            obj[key], fits = None, False
    return fits


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _good(obj: dict) -> bool:
    last_seen = obj.get("last_seen")
    return (
        obj.get("v") == SCHEMA_VERSION
        and _finite(obj.get("ts"))
        and bool(obj.get("node"))
        and bool(obj.get("event"))
        and obj.get("state") in STATES
        and (last_seen is None or math.isfinite(last_seen))
    )


def read(paths: Iterable[str]) -> _Events:
    files = expand_paths(paths)
    events = _Events(files)
    for path in files:
        bad = 0
        for line in _lines(path):
            text = line.strip(_JSON_SPACE)
            if not text:
                continue
            try:
                obj, _ = _DECODER.raw_decode(text)
            except ValueError:
                bad += 1
                continue
            if not isinstance(obj, dict):
                bad += 1
                continue
            fits = _typed(obj)
            version = obj.get("v")
            if version is not None and version != SCHEMA_VERSION:
                found = (path, version)
                if events.bad_version is None or found < events.bad_version:
                    events.bad_version = found
                continue
            if not (fits and _good(obj)):
                bad += 1
                continue
            events.count += 1
            node, event = obj["node"], obj["event"]
            events.points[node].append((obj["ts"], record_rank(event), event, obj["state"]))
            if event not in _BULK:
                events.records[node].append(obj)
        if bad:
            events.bad_by_file[path] = bad
    if events.bad_version is not None:
        raise UnknownVersionError(*events.bad_version)
    return events


def _key(record: Mapping) -> Point:
    return (record["ts"], record_rank(record["event"]), record["event"], record["state"])


def _merge_flagged(
    boundaries: Sequence[tuple[float, int]], window: tuple[float, float], wanted
) -> list[dict]:
    """Sweep +1/-1 ACTIVE boundaries; maximal intervals whose ACTIVE count satisfies
    ``wanted``."""
    delta: dict[float, int] = defaultdict(int)
    for t, d in [(window[0], 0), (window[1], 0), *boundaries]:
        delta[t] += d
    times = sorted(delta)
    found: list[dict] = []
    count = 0
    for t, t_next in zip(times, times[1:], strict=False):
        count += delta[t]
        if not wanted(count):
            continue
        if found and found[-1]["end"] == t:
            found[-1]["end"] = t_next
        else:
            found.append({"start": t, "end": t_next})
    for row in found:
        row["duration_s"] = row["end"] - row["start"]
    return found


def compute(
    paths: Iterable[str],
    since: float | None = None,
    until: float | None = None,
    skew: Mapping[str, float] | None = None,
    estimate_skew: bool = True,
) -> Report:
    events = read(paths)
    nodes = sorted(events.points)
    given = dict(skew or {})

    evidence = ClockEvidence()
    for node, records in events.records.items():
        for r in records:
            if estimate_skew and r["event"] in PEER_EVENTS:
                last_seen = r.get("last_seen")
                bound = None if last_seen is None else last_seen - r["ts"]
                evidence.add(node, r.get("role") == "primary", r.get("peer"), bound)
    offsets, warnings = estimate_offsets(nodes, evidence, given, estimate_skew)
    base = evidence.default_offset(given)

    def offset_of(name: str | None) -> float:
        return offsets[name].seconds if name in offsets else base

    # Redirects and refusals per minute of the node's own clock, counted before correcting.
    per_minute: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for node in nodes:
        for ts, _, event, _ in events.points[node]:
            if event in _BULK:
                per_minute[(node, math.floor(ts / MINUTE) * MINUTE)][event == "refuse"] += 1

    points = events.points
    for node in nodes:
        shift = offset_of(node)
        points[node] = [(ts - shift, rank, e, s) for ts, rank, e, s in points[node]]
    records: dict[str, list[dict]] = {}
    for node in nodes:
        shift = offset_of(node)
        shifted = []
        for r in events.records[node]:
            r = dict(r, ts=r["ts"] - shift)
            if r.get("last_seen") is not None:
                r["last_seen"] = r["last_seen"] - offset_of(r.get("peer"))
            shifted.append(r)
        shifted.sort(key=_key)
        records[node] = shifted

    window = report_window(
        since,
        until,
        min((p[0] for ps in points.values() for p in ps), default=None),
        max((p[0] for ps in points.values() for p in ps), default=None),
    )
    tables: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
    redirects = refusals = dual_events = 0

    if window is not None:
        since, until = window
        length = until - since

        # Signs of life: a peer_lost says its peer sent a state message at last_seen.
        markers: dict[str, list[float]] = defaultdict(list)
        claims: dict[str, float] = {}
        for node in nodes:
            for r in records[node]:
                peer = r.get("peer")
                if r["event"] == "peer_lost" and peer in points and peer != node:
                    claims[peer] = max(claims.get(peer, r["ts"]), r["ts"])
                    if r.get("last_seen") is not None:
                        markers[peer].append(r["last_seen"])

        for node in nodes:
            stream = [(-math.inf, RANK_ORIGIN, "", "")]
            stream += points[node]
            stream += [(m, RANK_MARKER, "", "") for m in markers[node]]
            stream.sort()
            last_event = next(p[2] for p in reversed(stream) if p[1] not in _NOT_RECORDS)
            last_peer_event = next((p[2] for p in reversed(stream) if p[2] in PEER_EVENTS), None)
            crashed = crashed_at_tail(last_event, stream[-1][0], claims.get(node), last_peer_event)
            runs = tables["state_intervals"]
            carry = DOWN
            for i, (ts, rank, event, state) in enumerate(stream):
                if rank != RANK_MARKER:
                    carry = DOWN if rank == RANK_ORIGIN or event == "stopped" else state
                if i + 1 < len(stream):
                    end = stream[i + 1][0]
                    held = DOWN if stream[i + 1][1] == RANK_STARTED else carry
                else:
                    end = until
                    held = DOWN if crashed else carry
                start, end = max(ts, since), min(end, until)
                if end <= start:
                    continue
                last = runs[-1] if runs else None
                if last and last["node"] == node and last["state"] == held:
                    last["end"] = end
                else:
                    runs.append({"node": node, "state": held, "start": start, "end": end})
        for run in tables["state_intervals"]:
            run["duration_s"] = run["end"] - run["start"]

        spent: dict[tuple[str, str], float] = defaultdict(float)
        for run in tables["state_intervals"]:
            spent[(run["node"], run["state"])] += run["duration_s"]
        for node in nodes:
            for state in REPORT_STATES:
                seconds = spent[(node, state)]
                tables["state_time"].append(
                    {
                        "node": node,
                        "state": state,
                        "seconds": seconds,
                        "fraction": seconds / length if length > 0 else None,
                    }
                )

        boundaries = [
            b
            for run in tables["state_intervals"]
            if run["state"] == "ACTIVE"
            for b in ((run["start"], 1), (run["end"], -1))
        ]
        tables["outages"] = _merge_flagged(boundaries, window, lambda n: n == 0)
        tables["dual_active"] = _merge_flagged(boundaries, window, lambda n: n >= 2)

        for node in nodes:
            resolvers = [
                r
                for r in records[node]
                if r["event"] in ("peer_lost", "started", "stopped")
                or (r["event"] == "transition" and r["state"] == "ACTIVE")
            ]
            for r, following in zip(resolvers, [*resolvers[1:], None], strict=True):
                if r["event"] != "peer_lost" or not since <= r["ts"] <= until:
                    continue
                active_ts = trigger = None
                if r["state"] == "ACTIVE":
                    outcome, active_ts = "already_active", r["ts"]
                elif following is not None and following["event"] == "transition":
                    outcome, active_ts = "takeover", following["ts"]
                    trigger = following.get("trigger")
                elif following is not None and following["event"] in ("started", "stopped"):
                    outcome = "survivor_down"
                else:
                    outcome = "unresolved"
                last_seen = r.get("last_seen")
                tables["incidents"].append(
                    {
                        "node": node,
                        "peer": r.get("peer"),
                        "peer_state": r.get("peer_state"),
                        "epoch": r.get("epoch"),
                        "last_seen": last_seen,
                        "lost_ts": r["ts"],
                        "detection_delay_s": None if last_seen is None else r["ts"] - last_seen,
                        "active_ts": active_ts,
                        "takeover_delay_s": None if active_ts is None else active_ts - r["ts"],
                        "outcome": outcome,
                        "trigger": trigger,
                    }
                )

        for (node, minute), (n_redirects, n_refusals) in per_minute.items():
            start = minute - offset_of(node)
            if not (start <= until and start + MINUTE > since):
                continue  # the minute does not overlap the window
            tables["redirects_per_minute"].append(
                {
                    "node": node,
                    "minute_start": minute,
                    "minute": minute_label(minute),
                    "redirects": n_redirects,
                    "refusals": n_refusals,
                }
            )
            redirects += n_redirects
            refusals += n_refusals

        for node in nodes:
            for r in records[node]:
                if not since <= r["ts"] <= until:
                    continue
                event = r["event"]
                if (event == "console" and _RECOVER.search(r.get("command") or "")) or (
                    event == "transition" and r.get("trigger") in RECOVERY_TRIGGERS
                ):
                    tables["recoveries"].append(
                        {
                            "ts": r["ts"],
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
                            "ts": r["ts"],
                            "node": node,
                            "peer": r.get("peer"),
                            "peer_epoch": r.get("peer_epoch"),
                            "reason": r.get("reason"),
                        }
                    )
                elif event == "dual_active":
                    dual_events += 1

    for name, (_, order) in TABLES.items():
        tables[name].sort(key=lambda row, order=order: tuple(row[c] for c in order))

    summary = build_summary(
        files=events.files,
        events=events.count,
        bad_lines_by_file=events.bad_by_file,
        nodes=nodes,
        offsets=offsets,
        warnings=warnings,
        window=window,
        tables=tables,
        redirects=redirects,
        refusals=refusals,
        dual_active_events=dual_events,
    )
    return Report(summary, tables)
