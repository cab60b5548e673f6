"""The failover report's shared vocabulary and its pure decisions.

Owns: the v1 event-log schema (field names and kinds), the record order inside a node, the
report's tables (columns, types, sort keys), input path expansion, clock-offset estimation,
the report window, the "did this node crash at the end of its log" rule, the summary and its
text rendering. Both implementations (``spark.job`` on Spark, ``spark.reference`` in plain
Python) call these so that they differ only in how they scan the events.

Must not know Spark: no pyspark import here.
"""

from __future__ import annotations

import csv
import glob
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlparse

SCHEMA_VERSION = 1

STATES = ("PRIMARY", "BACKUP", "ACTIVE", "PASSIVE")
DOWN = "DOWN"
REPORT_STATES = (*STATES, DOWN)

# Every v1 field and its kind; the Spark job derives its StructType from this table.
FIELDS: tuple[tuple[str, str], ...] = (
    ("v", "long"),
    ("ts", "double"),
    ("node", "string"),
    ("role", "string"),
    ("epoch", "long"),
    ("state", "string"),
    ("event", "string"),
    ("listen", "string"),
    ("peer", "string"),
    ("from", "string"),
    ("to", "string"),
    ("trigger", "string"),
    ("reason", "string"),
    ("peer_state", "string"),
    ("last_seen", "double"),
    ("client", "string"),
    ("peer_epoch", "long"),
    ("user", "string"),
    ("command", "string"),
    ("result", "string"),
)
CORRUPT_COLUMN = "_corrupt_record"

# Order of a node's points at one instant: a start comes first and a stop last, so that a
# record written in the same microsecond as its process's start or stop falls inside its life.
RANK_ORIGIN = -1
RANK_STARTED = 0
RANK_RECORD = 1
RANK_MARKER = 2
RANK_STOPPED = 3

PEER_EVENTS = ("peer_up", "peer_lost")
RECOVERY_TRIGGERS = ("MANUAL_RECOVER", "HANDOVER")
RECOVER_COMMAND = r"(?i)^\s*recover\b"
MINUTE = 60


def record_rank(event: str) -> int:
    if event == "started":
        return RANK_STARTED
    if event == "stopped":
        return RANK_STOPPED
    return RANK_RECORD


# The report's tables: columns with their kind, and the order rows are written and compared in.
TABLES: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "incidents": (
        (
            ("node", "string"),
            ("peer", "string"),
            ("peer_state", "string"),
            ("epoch", "long"),
            ("last_seen", "double"),
            ("lost_ts", "double"),
            ("detection_delay_s", "double"),
            ("active_ts", "double"),
            ("takeover_delay_s", "double"),
            ("outcome", "string"),
            ("trigger", "string"),
        ),
        ("lost_ts", "node"),
    ),
    "outages": ((("start", "double"), ("end", "double"), ("duration_s", "double")), ("start",)),
    "dual_active": (
        (("start", "double"), ("end", "double"), ("duration_s", "double")),
        ("start",),
    ),
    "state_intervals": (
        (
            ("node", "string"),
            ("state", "string"),
            ("start", "double"),
            ("end", "double"),
            ("duration_s", "double"),
        ),
        ("node", "start"),
    ),
    "state_time": (
        (("node", "string"), ("state", "string"), ("seconds", "double"), ("fraction", "double")),
        ("node", "state"),
    ),
    "redirects_per_minute": (
        (
            ("node", "string"),
            ("minute_start", "long"),
            ("minute", "string"),
            ("redirects", "long"),
            ("refusals", "long"),
        ),
        ("node", "minute_start"),
    ),
    "recoveries": (
        (
            ("ts", "double"),
            ("node", "string"),
            ("event", "string"),
            ("trigger", "string"),
            ("from_state", "string"),
            ("to_state", "string"),
            ("user", "string"),
            ("command", "string"),
            ("result", "string"),
        ),
        ("ts", "node", "event"),
    ),
    "misconfigurations": (
        (
            ("ts", "double"),
            ("node", "string"),
            ("peer", "string"),
            ("peer_epoch", "long"),
            ("reason", "string"),
        ),
        ("ts", "node"),
    ),
}

OUTCOMES = ("takeover", "already_active", "survivor_down", "unresolved")


class ReportError(Exception):
    """An input problem the report cannot work around; the CLI prints it and exits non-zero."""


class UnknownVersionError(ReportError):
    def __init__(self, file: str, version: int) -> None:
        super().__init__(
            f"{file}: event log schema version {version} is not supported "
            f"(this report reads v{SCHEMA_VERSION})"
        )
        self.file = file
        self.version = version


# ---------------------------------------------------------------- inputs


def _has_scheme(path: str) -> bool:
    parsed = urlparse(path)
    return len(parsed.scheme) > 1 and parsed.scheme != "file"


def local_path(uri: str) -> str:
    """A file URI as Spark reports it (``file:/x%20y``) turned back into a local path."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    return uri


def expand_paths(paths: Iterable[str]) -> list[str]:
    """Local directories become their ``*.jsonl*`` files, local globs are expanded, other
    Hadoop URIs (hdfs://, s3a://, ...) pass through for Spark to resolve."""
    files: list[str] = []
    for path in paths:
        if _has_scheme(path):
            files.append(path)
            continue
        path = local_path(path)
        if os.path.isdir(path):
            files.extend(sorted(glob.glob(os.path.join(glob.escape(path), "*.jsonl*"))))
        elif glob.has_magic(path):
            matches = sorted(p for p in glob.glob(path) if os.path.isfile(p))
            if not matches:
                raise ReportError(f"{path}: no file matches")
            files.extend(matches)
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ReportError(f"{path}: no such file or directory")
    return [f if _has_scheme(f) else os.path.abspath(f) for f in dict.fromkeys(files)]


# ---------------------------------------------------------------- clock offsets


@dataclass(frozen=True)
class Offset:
    """How far a node's clock runs ahead of the reference node's (subtract to correct)."""

    seconds: float
    source: str  # reference | given | estimated | none
    lower: float | None = None
    upper: float | None = None


def parse_skew(items: Iterable[str]) -> dict[str, float]:
    given: dict[str, float] = {}
    for item in items:
        node, sep, value = item.partition("=")
        try:
            if not sep or not node:
                raise ValueError
            given[node] = float(value)
        except ValueError:
            raise ReportError(f"--skew {item!r}: expected NODE=SECONDS") from None
    return given


@dataclass
class ClockEvidence:
    """What the ``peer_up``/``peer_lost`` records say about the clocks.

    ``bounds[(observer, peer)]`` is the largest ``last_seen - ts`` over the observer's records
    about the peer: the peer sent its state message (at ``last_seen`` on its clock) before the
    observer logged receiving it (``ts`` on its own), so
    ``offset[peer] - offset[observer] >= bound``.
    """

    bounds: dict[tuple[str, str], float] = field(default_factory=dict)
    observers: set[str] = field(default_factory=set)  # nodes that wrote such a record
    primaries: set[str] = field(default_factory=set)  # ... with role primary

    def add(self, observer: str, primary: bool, peer: str | None, bound: float | None) -> None:
        self.observers.add(observer)
        if primary:
            self.primaries.add(observer)
        if peer is not None and bound is not None and peer != observer:
            pair = (observer, peer)
            self.bounds[pair] = max(self.bounds.get(pair, bound), bound)

    def reference(self) -> str | None:
        """Times are reported on the primary's clock: the first (by name) node that logged a
        peer record as primary, else the first that logged one; None without evidence."""
        return min(self.primaries or self.observers, default=None)

    def default_offset(self, given: Mapping[str, float]) -> float:
        """The offset of a clock nothing is known about: the reference clock's."""
        reference = self.reference()
        return given.get(reference, 0.0) if reference is not None else 0.0


def estimate_offsets(
    nodes: Iterable[str],
    evidence: ClockEvidence,
    given: Mapping[str, float],
    estimate: bool = True,
) -> tuple[dict[str, Offset], list[str]]:
    """Clock offsets from causality (see ``ClockEvidence``), relative to the reference node.

    Records of both directions bracket a node's offset from the reference's, and the midpoint
    is taken, as NTP does; with one direction only, the correction is the smallest one that
    makes the records causal; without evidence a node's clock is taken to agree with the
    reference's. ``given`` offsets (``--skew``) win.
    """
    reference = evidence.reference()
    base = evidence.default_offset(given)
    offsets: dict[str, Offset] = {}
    warnings: list[str] = []
    for node in sorted(set(nodes)):
        if node in given:
            offsets[node] = Offset(given[node], "given")
            continue
        if node == reference:
            offsets[node] = Offset(base, "reference")
            continue
        lower = evidence.bounds.get((reference, node)) if reference is not None else None
        against = evidence.bounds.get((node, reference)) if reference is not None else None
        upper = None if against is None else -against
        if not estimate or (lower is None and upper is None):
            offsets[node] = Offset(base, "none", lower, upper)
            continue
        if lower is not None and upper is not None:
            if lower > upper:
                warnings.append(
                    f"clock offset of {node}: causal bounds disagree "
                    f"({lower:.6f} > {upper:.6f}); clocks drift or records are not causal"
                )
            relative = (lower + upper) / 2
        elif lower is not None:
            relative = max(lower, 0.0)
        else:
            relative = min(upper, 0.0)
        offsets[node] = Offset(base + relative, "estimated", lower, upper)
    return offsets, warnings


# ---------------------------------------------------------------- window and tails


def report_window(
    since: float | None, until: float | None, first: float | None, last: float | None
) -> tuple[float, float] | None:
    start = first if since is None else since
    end = last if until is None else until
    if start is None or end is None:
        return None
    if start > end:
        raise ReportError(f"empty report window: since {start} is after until {end}")
    return (start, end)


def crashed_at_tail(
    last_event: str,
    last_point: float,
    lost_claim: float | None,
    last_peer_event: str | None,
) -> bool:
    """A node whose log ends without ``stopped`` may be up and quiet, or dead.

    It is taken as dead from its last sign of life when a peer logged losing it after that
    and the node itself did not log losing the peer: a crash is one-sided, while a cut peer
    link shows up in both logs and leaves both servers running.
    """
    return (
        last_event != "stopped"
        and lost_claim is not None
        and lost_claim > last_point
        and last_peer_event != "peer_lost"
    )


# ---------------------------------------------------------------- summary


def _stats(values: Iterable[float | None]) -> dict[str, float | int | None]:
    present = [v for v in values if v is not None]
    return {
        "count": len(present),
        "mean": sum(present) / len(present) if present else None,
        "max": max(present) if present else None,
    }


def build_summary(
    *,
    files: Sequence[str],
    events: int,
    bad_lines_by_file: Mapping[str, int],
    nodes: Sequence[str],
    offsets: Mapping[str, Offset],
    warnings: Sequence[str],
    window: tuple[float, float] | None,
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    redirects: int,
    refusals: int,
    dual_active_events: int,
) -> dict:
    """The JSON summary, from the small tables (everything but redirects per minute)."""
    seconds = None if window is None else window[1] - window[0]
    outages = tables["outages"]
    outage_seconds = sum(o["duration_s"] for o in outages)
    dual = tables["dual_active"]
    incidents = tables["incidents"]
    recoveries = tables["recoveries"]
    state_seconds: dict[str, dict[str, float]] = {}
    for row in tables["state_time"]:
        state_seconds.setdefault(row["node"], {})[row["state"]] = row["seconds"]
    return {
        "schema_version": SCHEMA_VERSION,
        "files": list(files),
        "events": events,
        "bad_lines": sum(bad_lines_by_file.values()),
        "bad_lines_by_file": dict(bad_lines_by_file),
        "nodes": list(nodes),
        "clock_offsets": {
            node: {"seconds": o.seconds, "source": o.source, "lower": o.lower, "upper": o.upper}
            for node, o in sorted(offsets.items())
        },
        "window": None
        if window is None
        else {"since": window[0], "until": window[1], "seconds": seconds},
        "availability": (1.0 - outage_seconds / seconds) if seconds else None,
        "outages": {
            "count": len(outages),
            "seconds": outage_seconds,
            "longest_s": max((o["duration_s"] for o in outages), default=None),
        },
        "dual_active": {
            "count": len(dual),
            "seconds": sum(d["duration_s"] for d in dual),
            "events": dual_active_events,
        },
        "incidents": {
            "count": len(incidents),
            "by_outcome": {
                outcome: sum(1 for i in incidents if i["outcome"] == outcome)
                for outcome in OUTCOMES
            },
            "detection_delay_s": _stats(i["detection_delay_s"] for i in incidents),
            "takeover_delay_s": _stats(
                i["takeover_delay_s"] for i in incidents if i["outcome"] == "takeover"
            ),
        },
        "state_seconds": state_seconds,
        "redirects": redirects,
        "refusals": refusals,
        "manual_recoveries": {
            "recover_commands": sum(1 for r in recoveries if r["event"] == "console"),
            "manual_recover_transitions": sum(
                1 for r in recoveries if r["trigger"] == "MANUAL_RECOVER"
            ),
            "handovers": sum(1 for r in recoveries if r["trigger"] == "HANDOVER"),
        },
        "misconfigurations": len(tables["misconfigurations"]),
        "warnings": list(warnings),
    }


def iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def minute_label(minute_start: int) -> str:
    return datetime.fromtimestamp(minute_start, UTC).strftime("%Y-%m-%dT%H:%M:00Z")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


LISTED_ROWS = 10  # per table in the text summary; the CSV files have them all


def _listed(rows: Sequence[Mapping], table: str, line) -> list[str]:
    shown = [line(row) for row in rows[:LISTED_ROWS]]
    if len(rows) > LISTED_ROWS:
        shown.append(f"    ... {len(rows) - LISTED_ROWS} more in {table}/{table}.csv")
    return shown


def render_text(summary: Mapping, tables: Mapping[str, Sequence[Mapping]]) -> str:
    """The human summary printed on stdout."""
    lines = ["amqha failover report"]
    window = summary["window"]
    if window is None:
        lines.append("  no events")
    else:
        lines.append(
            f"  window      {iso(window['since'])} .. {iso(window['until'])}"
            f" ({window['seconds']:.3f}s)"
        )
    lines.append(
        f"  input       {len(summary['files'])} file(s), {summary['events']} events,"
        f" {summary['bad_lines']} bad line(s)"
    )
    for node, offset in summary["clock_offsets"].items():
        seconds = round(offset["seconds"], 6) + 0.0  # no "-0.000000"
        lines.append(f"  clock       {node}: {seconds:+.6f}s ({offset['source']})")
    availability = summary["availability"]
    lines.append(
        "  availability "
        + ("-" if availability is None else f"{availability * 100:.4f}%")
        + f"  (outages: {summary['outages']['count']},"
        f" {summary['outages']['seconds']:.3f}s total,"
        f" longest {_seconds(summary['outages']['longest_s'])})"
    )
    dual = summary["dual_active"]
    lines.append(
        f"  dual active {dual['count']} interval(s), {dual['seconds']:.3f}s"
        f" ({dual['events']} dual_active event(s))"
    )
    inc = summary["incidents"]
    lines.append(
        f"  incidents   {inc['count']} peer lost: "
        + ", ".join(f"{k} {v}" for k, v in inc["by_outcome"].items())
    )
    lines.append(
        f"              detection mean {_seconds(inc['detection_delay_s']['mean'])}"
        f" max {_seconds(inc['detection_delay_s']['max'])};"
        f" takeover mean {_seconds(inc['takeover_delay_s']['mean'])}"
        f" max {_seconds(inc['takeover_delay_s']['max'])}"
    )
    lines.extend(
        _listed(
            tables["incidents"],
            "incidents",
            lambda row: (
                f"    {iso(row['lost_ts'])} {row['node']} lost {row['peer']}:"
                f" detection {_seconds(row['detection_delay_s'])},"
                f" {row['outcome']} {_seconds(row['takeover_delay_s'])}"
                + (f" ({row['trigger']})" if row["trigger"] else "")
            ),
        )
    )
    lines.extend(
        _listed(
            tables["outages"],
            "outages",
            lambda row: (
                f"    outage {iso(row['start'])} .. {iso(row['end'])} {_seconds(row['duration_s'])}"
            ),
        )
    )
    lines.extend(
        _listed(
            tables["dual_active"],
            "dual_active",
            lambda row: (
                f"    dual active {iso(row['start'])} .. {iso(row['end'])}"
                f" {_seconds(row['duration_s'])}"
            ),
        )
    )
    lines.append("  time in state")
    for node, states in summary["state_seconds"].items():
        lines.append(
            f"    {node:<10} "
            + "  ".join(f"{state} {states.get(state, 0.0):.3f}s" for state in REPORT_STATES)
        )
    rec = summary["manual_recoveries"]
    lines.append(f"  redirects   {summary['redirects']}, refusals {summary['refusals']}")
    lines.append(
        f"  recoveries  {rec['recover_commands']} recover command(s),"
        f" {rec['handovers']} handover(s); misconfigurations {summary['misconfigurations']}"
    )
    for warning in summary["warnings"]:
        lines.append(f"  warning: {warning}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- output


def _cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    return value


def write_csv(path: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(v) for v in row])
