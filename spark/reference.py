"""Pure-Python reference of the failover report.

Owns: reading every line of every log into one process's memory, keeping every record as a
point, grouping them by pair and counting redirects per minute, for small logs and as the
oracle the Spark job (``spark.job``) is tested against: the same input must give the same
tables and summary. The job reduces the bulk of the logs before the figures are computed; this
module does not, so agreement checks that reduction. The figures themselves come from
``spark.metrics``; this module must not import Spark.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from spark.metrics import PairInput, Point, minute_row, pair_clocks, pair_report, record_key
from spark.model import (
    FIELDS,
    MINUTE,
    SCHEMA_VERSION,
    STATES,
    TABLES,
    UnknownVersionError,
    build_summary,
    expand_paths,
    no_valid_record,
    pair_from_path,
    record_rank,
    unnamed_pair,
)

_KINDS = {name: {"long": int, "double": float, "string": str}[kind] for name, kind in FIELDS}
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_JSON_SPACE = " \t\r\n"
_DECODER = json.JSONDecoder()
# Redirects and refusals, the bulk of a log: kept as points only; other records are kept whole.
_BULK = frozenset({"redirect", "refuse"})


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
    # keyed by (pair, node); the pair is None for logs that name none
    points: dict[tuple[str | None, str], list[Point]] = field(
        default_factory=lambda: defaultdict(list)
    )
    records: dict[tuple[str | None, str], list[dict]] = field(
        default_factory=lambda: defaultdict(list)
    )
    per_minute: dict[tuple[str | None, str, int], list[int]] = field(
        default_factory=lambda: defaultdict(lambda: [0, 0])
    )


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
        from_path = pair_from_path(path)
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
            key = (obj.get("pair") or from_path, node)
            events.points[key].append((obj["ts"], record_rank(event), event, obj["state"]))
            if event in _BULK:
                minute = math.floor(obj["ts"] / MINUTE) * MINUTE
                events.per_minute[(*key, minute)][event == "refuse"] += 1
            else:
                events.records[key].append(obj)
        if bad:
            events.bad_by_file[path] = bad
    if events.bad_version is not None:
        raise UnknownVersionError(*events.bad_version)
    return events


def _pairs(events: _Events) -> dict[str, PairInput]:
    """The logs grouped by pair; logs that name none are one pair named after its nodes."""
    unnamed = unnamed_pair(node for pair, node in events.points if pair is None)

    def name(pair: str | None) -> str:
        return unnamed if pair is None else pair

    pairs: dict[str, PairInput] = {}
    for (pair, node), points in events.points.items():
        found = pairs.setdefault(name(pair), PairInput(name(pair), {}, {}, 0))
        found.points.setdefault(node, []).extend(points)
        found.records.setdefault(node, []).extend(events.records.get((pair, node), []))
        found.events += len(points)
    for found in pairs.values():
        for node in found.points:
            found.points[node].sort()
            found.records[node].sort(key=record_key)
    return pairs


def compute(
    paths: Iterable[str],
    since: float | None = None,
    until: float | None = None,
    skew: Mapping[str, float] | None = None,
    estimate_skew: bool = True,
    slo: float | None = None,
) -> Report:
    events = read(paths)
    if events.count == 0:
        raise no_valid_record(events.files, sum(events.bad_by_file.values()))
    pairs = _pairs(events)
    unnamed = unnamed_pair(node for pair, node in events.points if pair is None)
    minutes: dict[tuple[str, str], list[tuple[int, tuple[int, int]]]] = defaultdict(list)
    for (pair, node, minute), counts in events.per_minute.items():
        minutes[(unnamed if pair is None else pair, node)].append((minute, tuple(counts)))

    tables: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
    summaries = {}
    for name, pair in sorted(pairs.items()):
        clocks = pair_clocks(pair, since, until, skew or {}, estimate_skew)
        rows = []
        for node in pair.nodes:
            for minute, counts in sorted(minutes[(name, node)]):
                row = minute_row(
                    name, node, minute, counts, clocks.offsets[node].seconds, clocks.window
                )
                if row is not None:
                    rows.append(row)
        by_day: dict[str, tuple[int, int]] = {}
        for row in rows:
            r, f = by_day.get(row["day"], (0, 0))
            by_day[row["day"]] = (r + row["redirects"], f + row["refusals"])
        found = pair_report(pair, clocks, by_day)
        summaries[name] = found.summary
        for table, table_rows in found.tables.items():
            tables[table].extend(table_rows)
        tables["redirects_per_minute"].extend(rows)

    for table, (_, order) in TABLES.items():
        tables[table].sort(key=lambda row, order=order: tuple(row[c] for c in order))
    summary = build_summary(
        files=events.files,
        events=events.count,
        bad_lines_by_file=events.bad_by_file,
        pairs=summaries,
        daily=tables["daily"],
        takeover_delays=[
            i["takeover_delay_s"] for i in tables["incidents"] if i["outcome"] == "takeover"
        ],
        slo=slo,
    )
    return Report(summary, tables)
