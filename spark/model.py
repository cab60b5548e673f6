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
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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
    ("pair", "string"),
    ("side", "string"),
    ("sync", "string"),
    ("messages", "long"),
    ("path", "string"),
    ("unrecorded", "long"),
    ("evidence", "string"),
    ("kind", "string"),
    ("link", "string"),
    ("upstream", "string"),
    ("gap", "double"),
)
CORRUPT_COLUMN = "_corrupt_record"

# A throttled server writes at most one redirect and one refusal a second (one misconfigured
# a minute); the next record of a kind carries ``unrecorded``, how many it left out since
# the last, and stands for 1 + that many. A count is 0 .. UNRECORDED_MAX or absent (null:
# none); any other value makes the line bad, as a wrong type or a time that is not one does:
# a billion left out in a second is no server's count, and the bound keeps every sum of
# counts far inside a long (Spark's ANSI arithmetic fails on overflow).
UNRECORDED_MAX = 1_000_000_000

# Order of a node's points at one instant: a start comes first and a stop last, so that a
# record written in the same microsecond as its process's start or stop falls inside its life.
RANK_ORIGIN = -1
RANK_STARTED = 0
RANK_RECORD = 1
RANK_MARKER = 2
RANK_STOPPED = 3

PEER_EVENTS = ("peer_up", "peer_lost")
# An ACTIVE's own replication records (docs/durability.md, section 5): ``side`` "active",
# ``sync`` one of these.
SYNC_EVENT = "sync"
IN_SYNC, OUT_OF_SYNC = "in_sync", "out_of_sync"
# A federation link's records (docs/federation.md, "What a link reports"): ``kind`` one of
# these, ``link`` the federated exchange, ``upstream`` the upstream it comes from.
FEDERATION_EVENT = "federation"
LINK_UP = "link_up"
LINK_FAILED = "link_failed"
LINK_DOWN_KINDS = ("link_down", LINK_FAILED)
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
# Every table carries its pair and day (UTC, on the pair's reference clock): the Parquet copies
# are partitioned by both. Figures that depend on an unknown clock offset carry their range
# (``min_*``/``max_*``) and an ``uncertain`` flag.
_PLACE = (("pair", "string"), ("day", "string"))
_SPELL = (
    ("start", "double"),
    ("end", "double"),
    ("duration_s", "double"),
    ("min_duration_s", "double"),
    ("max_duration_s", "double"),
    ("uncertain", "boolean"),
)
TABLES: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "daily": (
        (
            *_PLACE,
            ("seconds", "double"),
            ("availability", "double"),
            ("min_availability", "double"),
            ("max_availability", "double"),
            ("outages", "long"),
            ("outage_s", "double"),
            ("dual_active_s", "double"),
            ("max_dual_active_s", "double"),
            # null when the pair's logs have no sync record: not recorded, not 0
            ("unprotected_s", "double"),
            ("unprotected_fraction", "double"),
            ("min_unprotected_s", "double"),
            ("max_unprotected_s", "double"),
            ("quarantines", "long"),
            ("quarantined_messages", "long"),
            ("incidents", "long"),
            ("takeovers", "long"),
            ("max_takeover_delay_s", "double"),
            ("redirects", "long"),
            ("refusals", "long"),
            # failbacks done (accepted ``recover``: one each, not one per record of it)
            ("recoveries", "long"),
            ("recover_commands", "long"),  # ``recover`` typed at the console, accepted or not
            ("failovers", "long"),
            ("client_outage_s", "double"),  # the failovers' client-visible outages
            ("uncertain", "boolean"),
        ),
        ("pair", "day"),
    ),
    "failovers": (
        (
            *_PLACE,
            ("incident", "long"),
            ("start", "double"),
            ("end", "double"),
            ("from_node", "string"),
            ("to_node", "string"),
            ("epoch", "long"),
            ("trigger", "string"),
            ("cause", "string"),
            ("evidence", "string"),
            ("gap_s", "double"),
            ("lost_ts", "double"),
            ("detection_delay_s", "double"),
            ("takeover_delay_s", "double"),
            ("outage_s", "double"),
            ("min_outage_s", "double"),
            ("max_outage_s", "double"),
            ("dual_active_s", "double"),
            ("uncertain", "boolean"),
        ),
        ("pair", "incident"),
    ),
    "incidents": (
        (
            *_PLACE,
            ("incident", "long"),
            ("node", "string"),
            ("peer", "string"),
            ("peer_state", "string"),
            ("epoch", "long"),
            ("last_seen", "double"),
            ("lost_ts", "double"),
            ("detection_delay_s", "double"),
            ("min_detection_delay_s", "double"),
            ("max_detection_delay_s", "double"),
            ("active_ts", "double"),
            ("takeover_delay_s", "double"),
            ("outcome", "string"),
            ("trigger", "string"),
            ("uncertain", "boolean"),
        ),
        ("pair", "lost_ts", "node"),
    ),
    "outages": ((*_PLACE, ("incident", "long"), *_SPELL), ("pair", "start")),
    "dual_active": ((*_PLACE, ("incident", "long"), *_SPELL), ("pair", "start")),
    "unprotected": ((*_PLACE, ("node", "string"), *_SPELL), ("pair", "start", "node")),
    "state_intervals": (
        (
            *_PLACE,
            ("node", "string"),
            ("state", "string"),
            ("start", "double"),
            ("end", "double"),
            ("duration_s", "double"),
        ),
        ("pair", "node", "start"),
    ),
    "state_time": (
        (
            *_PLACE,
            ("node", "string"),
            ("state", "string"),
            ("seconds", "double"),
            ("fraction", "double"),
        ),
        ("pair", "day", "node", "state"),
    ),
    "redirects_per_minute": (
        (
            *_PLACE,
            ("node", "string"),
            ("minute_start", "long"),
            ("minute", "string"),
            ("at", "double"),
            ("redirects", "long"),
            ("refusals", "long"),
        ),
        ("pair", "node", "minute_start"),
    ),
    "recoveries": (
        (
            *_PLACE,
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
        ("pair", "ts", "node", "event"),
    ),
    "misconfigurations": (
        (
            *_PLACE,
            ("ts", "double"),
            ("node", "string"),
            ("peer", "string"),
            ("peer_epoch", "long"),
            ("reason", "string"),
        ),
        ("pair", "ts", "node"),
    ),
    "quarantines": (
        (
            *_PLACE,
            ("ts", "double"),
            ("node", "string"),
            ("messages", "long"),
            ("path", "string"),
        ),
        ("pair", "ts", "node"),
    ),
    # Per federation link (exchange and upstream) and day: the time it was watched (from its
    # first record on) and the part of it the link was down (docs/report.md, "Federation links").
    "federation_links": (
        (
            *_PLACE,
            ("link", "string"),
            ("upstream", "string"),
            ("seconds", "double"),
            ("down_s", "double"),
            ("down_fraction", "double"),
            ("downs", "long"),
            ("failures", "long"),
        ),
        ("pair", "day", "link", "upstream"),
    ),
}

OUTCOMES = ("takeover", "already_active", "survivor_down", "unresolved")
# Why a failover happened (docs/report.md, "Failovers"), in the order the rules are tried.
CAUSES = (
    "manual",
    "freeze",
    "stopped",
    "cut link",
    "crash",
    "silence",
    "dual active",
    "unknown",
)
MANUAL_TRIGGERS = ("HANDOVER", "PROMOTE", "FORCE_PROMOTE")


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

# Event logs and their rotations: events.jsonl, events.jsonl.3, events.jsonl.gz, ...
EVENT_LOG = re.compile(r"\.jsonl(\.\d+)?(\.gz)?$")
# A directory that names the pair of the logs below it (Hive style, as the Parquet output).
PAIR_DIRECTORY = r"(?:^|/)pair=([^/]+)/"


def _has_scheme(path: str) -> bool:
    parsed = urlparse(path)
    return len(parsed.scheme) > 1 and parsed.scheme != "file"


def local_path(uri: str) -> str:
    """A file URI as Spark reports it (``file:/x%20y``) turned back into a local path."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    return uri


def _logs_under(folder: str) -> list[str]:
    found = [
        os.path.join(root, name)
        for root, _, names in os.walk(folder)
        for name in names
        if EVENT_LOG.search(name)
    ]
    if not found:
        raise ReportError(f"{folder}: no event log (*.jsonl, *.jsonl.N, *.gz) in this directory")
    return sorted(found)


def expand_paths(paths: Iterable[str]) -> list[str]:
    """Local directories become the event logs anywhere below them, local globs are expanded,
    other Hadoop URIs (hdfs://, s3a://, ...) pass through for Spark to resolve. A local path
    that gives no file is an error naming it."""
    files: list[str] = []
    for path in paths:
        if _has_scheme(path):
            files.append(path)
            continue
        path = local_path(path)
        if os.path.isdir(path):
            files.extend(_logs_under(path))
        elif glob.has_magic(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise ReportError(f"{path}: no file matches")
            for match in matches:
                files.extend(_logs_under(match) if os.path.isdir(match) else [match])
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ReportError(f"{path}: no such file or directory")
    return [f if _has_scheme(f) else os.path.abspath(f) for f in dict.fromkeys(files)]


def pair_from_path(path: str) -> str | None:
    found = re.search(PAIR_DIRECTORY, path)
    return unquote(found.group(1)) if found else None


def unnamed_pair(nodes: Iterable[str]) -> str:
    """The pair of logs that name none: the servers' names, as ``server.pair`` defaults."""
    return "+".join(sorted(set(nodes)))


def no_valid_record(files: Sequence[str], bad: int) -> ReportError:
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return ReportError(f"{shown or 'no input'}: no valid event record ({bad} bad line(s))")


# ---------------------------------------------------------------- clock offsets

# Offsets known to within this are taken as known, and figures that move by no more than this
# across an offset's interval as certain.
CLOCK_RESOLUTION_S = 0.01


@dataclass(frozen=True)
class Offset:
    """How far a node's clock runs ahead of its pair's reference clock (subtract to correct).

    ``seconds`` is the offset the figures are computed with; the logs only prove that the
    offset lies in ``lower .. upper`` (infinite on a side they do not bound)."""

    seconds: float
    source: str  # reference | given | trusted | estimated
    lower: float = -math.inf
    upper: float = math.inf

    @property
    def known(self) -> bool:
        return self.upper - self.lower <= CLOCK_RESOLUTION_S

    def as_json(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "source": self.source,
            "lower": self.lower if math.isfinite(self.lower) else None,
            "upper": self.upper if math.isfinite(self.upper) else None,
            "known": self.known,
        }


def parse_skew(items: Iterable[str]) -> dict[str, float]:
    """``NODE=SECONDS`` (that node in every pair) or ``PAIR/NODE=SECONDS``."""
    given: dict[str, float] = {}
    for item in items:
        node, sep, value = item.partition("=")
        try:
            if not sep or not node:
                raise ValueError
            given[node] = float(value)
        except ValueError:
            raise ReportError(
                f"--skew {item!r}: expected NODE=SECONDS or PAIR/NODE=SECONDS"
            ) from None
    return given


def given_for(pair: str, nodes: Iterable[str], given: Mapping[str, float]) -> dict[str, float]:
    found = {}
    for node in nodes:
        value = given.get(f"{pair}/{node}", given.get(node))
        if value is not None:
            found[node] = value
    return found


# offset[a] - offset[b] <= c, as (a, b, c)
Constraint = tuple[str, str, float]
_PASSIVE_CAUSES_ACTIVE = ("HANDOVER", "PEER_PASSIVE")


def clock_constraints(records: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Constraint]:
    """Every ordering of two nodes' records that the logs prove, each on its own clock.

    - ``peer_up``/``peer_lost``: the peer sent its state (``last_seen``, its clock) before the
      observer logged it (``ts``).
    - A transition to ACTIVE caused by the peer being PASSIVE (``HANDOVER``, ``PEER_PASSIVE``)
      in epoch E comes after the peer's transition to PASSIVE in epoch E - 1, when there is
      one (a new term is the first of the role's parity above the peer's: E - 1 or E - 2;
      the peer cannot have been in E - 1 unless it was just before); the earliest such
      record is taken, so the bound holds whichever one caused it.
    - A transition to PASSIVE because the peer is ACTIVE (``PEER_ACTIVE``) in epoch E comes
      after the peer's transition to ACTIVE in E (the follower adopts the term).
    - A ``dual_active`` record about a peer in epoch E comes after that peer's transition to
      ACTIVE in E (it heard the peer's ACTIVE state).
    """
    nodes = set(records)
    entered: dict[tuple[str, str, int], float] = {}  # (node, state, epoch) -> earliest ts
    for node, rows in records.items():
        for r in rows:
            if r["event"] == "transition" and r.get("epoch") is not None:
                key = (node, r["state"], r["epoch"])
                entered[key] = min(entered.get(key, r["ts"]), r["ts"])
    found: list[Constraint] = []
    for node, rows in records.items():
        others = nodes - {node}
        for r in rows:
            event, peer = r["event"], r.get("peer")
            if event in PEER_EVENTS:
                if peer in others and r.get("last_seen") is not None:
                    found.append((node, peer, r["ts"] - r["last_seen"]))
            elif event == "transition" and r.get("epoch") is not None:
                epoch, trigger = r["epoch"], r.get("trigger")
                cause = None
                if r["state"] == "ACTIVE" and trigger in _PASSIVE_CAUSES_ACTIVE:
                    cause = ("PASSIVE", epoch - 1)
                elif r["state"] == "PASSIVE" and trigger == "PEER_ACTIVE":
                    cause = ("ACTIVE", epoch)
                if cause is not None:
                    for other in others:
                        before = entered.get((other, *cause))
                        if before is not None:
                            found.append((node, other, r["ts"] - before))
            elif event == "dual_active" and peer in others and r.get("peer_epoch") is not None:
                before = entered.get((peer, "ACTIVE", r["peer_epoch"]))
                if before is not None:
                    found.append((node, peer, r["ts"] - before))
    return found


def reference_node(nodes: Iterable[str], roles: Mapping[str, str]) -> str:
    """Times are given on the primary's clock: the first (by name) node that logged as
    primary, else the first node."""
    ordered = sorted(nodes)
    return next((n for n in ordered if roles.get(n) == "primary"), ordered[0])


def estimate_offsets(
    nodes: Iterable[str],
    reference: str,
    constraints: Iterable[Constraint],
    given: Mapping[str, float],
    estimate: bool = True,
) -> tuple[dict[str, Offset], list[str]]:
    """Each node's offset from the reference clock, as the interval the constraints between
    it and the reference allow. The figures use no correction when the interval allows it
    (clocks are taken to agree unless the records prove they cannot), else the interval's
    midpoint, or its one bound. ``given`` offsets (``--skew``) are exact and win; without
    ``estimate`` the clocks are trusted."""
    base = given.get(reference, 0.0)
    offsets = {reference: Offset(base, "given" if reference in given else "reference", base, base)}
    warnings: list[str] = []
    lower: dict[str, float] = {}
    upper: dict[str, float] = {}
    for a, b, c in constraints:
        if b == reference and a != reference:
            upper[a] = min(upper.get(a, math.inf), c)
        elif a == reference and b != reference:
            lower[b] = max(lower.get(b, -math.inf), -c)
    for node in sorted(set(nodes) - {reference}):
        if node in given:
            offsets[node] = Offset(given[node], "given", given[node], given[node])
            continue
        if not estimate:
            offsets[node] = Offset(base, "trusted", base, base)
            continue
        lo, hi = lower.get(node, -math.inf), upper.get(node, math.inf)
        if lo > hi:
            warnings.append(
                f"clock offset of {node}: the records bound it from below by {lo:.6f}s and from"
                f" above by {hi:.6f}s; clocks drift or records are not causal"
            )
            lo, hi = hi, lo
        if lo <= 0.0 <= hi:
            point = 0.0
        elif math.isfinite(lo) and math.isfinite(hi):
            point = (lo + hi) / 2
        else:
            point = lo if math.isfinite(lo) else hi
        offsets[node] = Offset(base + point, "estimated", base + lo, base + hi)
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


DAY_SECONDS = 86400


def day_of(ts: float) -> str:
    return datetime.fromtimestamp(math.floor(ts / DAY_SECONDS) * DAY_SECONDS, UTC).strftime(
        "%Y-%m-%d"
    )


def day_spans(window: tuple[float, float]) -> list[tuple[str, float, float]]:
    """The UTC days the window touches, each with its part of the window."""
    lo, hi = window
    spans = []
    start = math.floor(lo / DAY_SECONDS) * DAY_SECONDS
    while True:
        spans.append((day_of(start), max(lo, start), min(hi, start + DAY_SECONDS)))
        start += DAY_SECONDS
        if start >= hi:
            return spans


# ---------------------------------------------------------------- summary


def percentiles(values: Iterable[float]) -> dict[str, float | int | None]:
    """Nearest-rank percentiles: every figure is one of the values."""
    ordered = sorted(values)

    def rank(p: float) -> float | None:
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] if ordered else None

    return {
        "count": len(ordered),
        "p50": rank(50),
        "p90": rank(90),
        "p99": rank(99),
        "max": ordered[-1] if ordered else None,
    }


WORST_PAIRS = 10


def fleet_summary(
    pairs: Mapping[str, Mapping[str, Any]],
    daily: Sequence[Mapping[str, Any]],
    takeover_delays: Iterable[float],
    slo: float | None,
) -> dict[str, Any]:
    """Totals over the pairs, the worst ones, takeover delay percentiles and SLO breaches."""
    seconds = sum(
        p["window"]["seconds"] for p in pairs.values() if p["window"] and not p.get("no_data")
    )
    outage = sum(p["outages"]["seconds"] for p in pairs.values())
    ranked = sorted(
        (p for p in pairs.values() if p["availability"] is not None),
        key=lambda p: (p["availability"], p["pair"]),
    )
    fleet: dict[str, Any] = {
        "pairs": len(pairs),
        "pair_seconds": seconds,
        "availability": (1.0 - outage / seconds) if seconds else None,
        "outage_seconds": outage,
        "dual_active_seconds": sum(p["dual_active"]["seconds"] for p in pairs.values()),
        "incidents": sum(p["incidents"]["count"] for p in pairs.values()),
        "failovers": {
            "count": sum(p["failovers"]["count"] for p in pairs.values()),
            "by_cause": {
                c: sum(p["failovers"]["by_cause"][c] for p in pairs.values()) for c in CAUSES
            },
            "outage_seconds": sum(p["failovers"]["outage_seconds"] for p in pairs.values()),
        },
        "no_data_pairs": sorted(n for n, p in pairs.items() if p.get("no_data")),
        "unprotected": fleet_unprotected(pairs),
        "quarantines": {
            "count": sum(p["quarantines"]["count"] for p in pairs.values()),
            "messages": sum(p["quarantines"]["messages"] for p in pairs.values()),
        },
        "uncertain_pairs": sorted(n for n, p in pairs.items() if p["uncertain"]),
        "worst": [
            {
                "pair": p["pair"],
                "availability": p["availability"],
                "min_availability": p["min_availability"],
                "outage_seconds": p["outages"]["seconds"],
                "dual_active_seconds": p["dual_active"]["seconds"],
                "unprotected_seconds": p["unprotected"]["seconds"],
            }
            for p in ranked[:WORST_PAIRS]
        ],
        "takeover_delay_s": percentiles(takeover_delays),
        "slo": None,
    }
    if slo is not None:
        target = slo / 100
        fleet["slo"] = {
            "target_percent": slo,
            "breaches": [
                {"pair": d["pair"], "day": d["day"], "availability": d["availability"]}
                for d in daily
                if d["availability"] is not None and d["availability"] < target
            ],
            "possible_breaches": [
                {"pair": d["pair"], "day": d["day"], "min_availability": d["min_availability"]}
                for d in daily
                if d["availability"] is not None
                and d["availability"] >= target
                and d["min_availability"] < target
            ],
        }
    return fleet


def fleet_unprotected(pairs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Unprotected time over the pairs whose logs record it; the others are listed, never
    counted as 0."""
    recorded = [p for p in pairs.values() if p["unprotected"]["recorded"]]
    seconds = sum(p["unprotected"]["seconds"] for p in recorded)
    pair_seconds = sum(p["window"]["seconds"] for p in recorded)
    return {
        "pairs_recorded": len(recorded),
        "seconds": seconds if recorded else None,
        "fraction": seconds / pair_seconds if recorded and pair_seconds > 0 else None,
        "max_seconds": sum(p["unprotected"]["max_seconds"] for p in recorded) if recorded else None,
        "not_recorded": sorted(n for n, p in pairs.items() if not p["unprotected"]["recorded"]),
    }


def iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def minute_label(minute_start: int) -> str:
    return datetime.fromtimestamp(minute_start, UTC).strftime("%Y-%m-%dT%H:%M:00Z")


def build_summary(
    *,
    files: Sequence[str],
    events: int,
    bad_lines_by_file: Mapping[str, int],
    pairs: Mapping[str, Mapping[str, Any]],
    daily: Sequence[Mapping[str, Any]],
    takeover_delays: Iterable[float],
    slo: float | None,
) -> dict[str, Any]:
    """The JSON summary: the input, each pair's figures and the fleet's."""
    windows = [p["window"] for p in pairs.values()]
    return {
        "schema_version": SCHEMA_VERSION,
        "files": list(files),
        "events": events,
        "bad_lines": sum(bad_lines_by_file.values()),
        "bad_lines_by_file": dict(bad_lines_by_file),
        "window": {
            "since": min(w["since"] for w in windows),
            "until": max(w["until"] for w in windows),
        },
        "pairs": {name: dict(pairs[name]) for name in sorted(pairs)},
        "fleet": fleet_summary(pairs, daily, takeover_delays, slo),
        "warnings": [f"{name}: {w}" for name in sorted(pairs) for w in pairs[name]["warnings"]],
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.4f}%"


def _bound(value: float | None) -> str:
    return "unbounded" if value is None else f"{value:+.3f}s"


LISTED_ROWS = 20  # a table of a pair with more rows is counted in the text, not listed
DETAILED_PAIRS = 3  # beyond this, the text gives the fleet view only


def _listed(rows: Sequence[Mapping], table: str, line) -> list[str]:
    """Every row, or none and where they all are: never some of them."""
    if len(rows) > LISTED_ROWS:
        return [f"      {len(rows)} {table} rows: every one in {table}/{table}.csv"]
    return [line(row) for row in rows]


def _key(row: Mapping) -> str:
    return "" if row.get("incident") is None else f" [#{row['incident']}]"


def failover_why(row: Mapping) -> str:
    """A failover's evidence and a freeze's gap, in brackets after its cause."""
    said = [row["evidence"]] if row.get("evidence") else []
    if row.get("gap_s") is not None:
        said.append(f"gap {_seconds(row['gap_s'])}")
    return f" ({', '.join(said)})" if said else ""


def failover_text(row: Mapping) -> str:
    """One failover on one line: its key, when, who, why, and what clients saw."""
    text = (
        f"#{row['incident']} {iso(row['start'])} .. {iso(row['end'])}"
        f" {row['from_node']} -> {row['to_node']} {row['cause']}"
        + failover_why(row)
        + f", client outage {_seconds(row['outage_s'])}"
    )
    if row["uncertain"]:
        most = row["max_outage_s"]
        text += (
            f" (the logs bound it to {_seconds(row['min_outage_s'])} .."
            f" {'unbounded' if most is None else _seconds(most)})"
        )
    if row["dual_active_s"]:
        text += f", dual active {_seconds(row['dual_active_s'])}"
    if row["detection_delay_s"] is not None:
        text += f", detection {_seconds(row['detection_delay_s'])}"
    if row["takeover_delay_s"] is not None:
        text += f", takeover {_seconds(row['takeover_delay_s'])}"
    return text + (f" ({row['trigger']})" if row["trigger"] else "")


def _spell_text(kind: str, row: Mapping) -> str:
    text = (
        f"      {kind}{_key(row)} {iso(row['start'])} .. {iso(row['end'])}"
        f" {_seconds(row['duration_s'])}"
    )
    if row["uncertain"]:
        text += (
            f" UNCERTAIN ({_seconds(row['min_duration_s'])} .. {_seconds(row['max_duration_s'])}"
            " over the clock offset's interval)"
        )
    return text


NOT_RECORDED = "not recorded (no sync records: replication off, or servers that do not log it)"


def _unprotected_text(u: Mapping) -> str:
    if not u["recorded"]:
        return NOT_RECORDED
    text = (
        f"{u['seconds']:.3f}s ({_percent(u['fraction'])} of the window) with no in-sync"
        f" PASSIVE, {u['spans']} span(s), longest {_seconds(u['longest_s'])}"
    )
    if u["uncertain"]:
        text += f", {u['uncertain']} uncertain: {u['min_seconds']:.3f}s .. {u['max_seconds']:.3f}s"
    return text


def _pair_text(p: Mapping, tables: Mapping[str, Sequence[Mapping]]) -> list[str]:
    name = p["pair"]
    mine = {t: [r for r in rows if r["pair"] == name] for t, rows in tables.items()}
    lines = [f"  pair {name}: {', '.join(p['nodes'])}; {p['events']} events"]
    w = p["window"]
    lines.append(f"    window      {iso(w['since'])} .. {iso(w['until'])} ({w['seconds']:.3f}s)")
    if p.get("no_data"):
        lines.append("    NO DATA     no record of this pair in the window: no figure")
        return lines
    for node, o in p["clock_offsets"].items():
        seconds = round(o["seconds"], 6) + 0.0  # no "-0.000000"
        text = f"    clock       {node}: {seconds:+.6f}s ({o['source']})"
        if not o["known"]:
            text += f", NOT KNOWN: between {_bound(o['lower'])} and {_bound(o['upper'])}"
        lines.append(text)
    availability = _percent(p["availability"])
    if p["min_availability"] != p["max_availability"]:
        availability += (
            f" (between {_percent(p['min_availability'])} and {_percent(p['max_availability'])})"
        )
    out, dual = p["outages"], p["dual_active"]
    lines.append(
        f"    availability {availability}  (outages: {out['count']}, {out['seconds']:.3f}s total,"
        f" longest {_seconds(out['longest_s'])}"
        + (f", {out['uncertain']} uncertain" if out["uncertain"] else "")
        + ")"
    )
    lines.append(
        f"    dual active {dual['count']} interval(s), {dual['seconds']:.3f}s"
        + (
            f", {dual['uncertain']} uncertain, up to {dual['max_seconds']:.3f}s"
            if dual["uncertain"]
            else ""
        )
        + f" ({dual['events']} dual_active event(s))"
    )
    lines.append(f"    unprotected {_unprotected_text(p['unprotected'])}")
    freezes = p.get("freezes") or {}
    if freezes.get("count"):
        lines.append(
            f"    freezes     {freezes['count']}, {freezes['seconds']:.3f}s in all (paused gaps:"
            " a process that stood still serves nothing)"
        )
    quarantines = p["quarantines"]
    if quarantines["count"]:
        lines.append(
            f"    quarantine  {quarantines['count']} record(s),"
            f" {quarantines['messages']} message(s) kept for replay"
        )
    witness = p.get("witness") or {}
    if witness.get("agreed_takeovers") or witness.get("fences"):
        lines.append(
            f"    witness     {witness['agreed_takeovers']} takeover(s) it agreed to,"
            f" {witness['fences']} time(s) an ACTIVE stopped serving without it"
        )
    fo = p["failovers"]
    lines.append(
        f"    failovers   {fo['count']}: "
        + ", ".join(f"{c} {n}" for c, n in fo["by_cause"].items() if n)
        + (f"; client outage {fo['outage_seconds']:.3f}s in all" if fo["count"] else "")
    )
    lines.extend(_listed(mine["failovers"], "failovers", lambda row: "      " + failover_text(row)))
    inc = p["incidents"]
    lines.append(
        f"    incidents   {inc['count']} peer lost: "
        + ", ".join(f"{k} {v}" for k, v in inc["by_outcome"].items())
    )
    lines.append(
        f"                detection mean {_seconds(inc['detection_delay_s']['mean'])}"
        f" max {_seconds(inc['detection_delay_s']['max'])};"
        f" takeover mean {_seconds(inc['takeover_delay_s']['mean'])}"
        f" max {_seconds(inc['takeover_delay_s']['max'])}"
    )
    lines.extend(
        _listed(
            mine["incidents"],
            "incidents",
            lambda row: (
                f"     {_key(row)} {iso(row['lost_ts'])} {row['node']} lost {row['peer']}:"
                f" detection {_seconds(row['detection_delay_s'])}"
                + (
                    f" UNCERTAIN ({_seconds(row['min_detection_delay_s'])} .."
                    f" {_seconds(row['max_detection_delay_s'])})"
                    if row["uncertain"]
                    else ""
                )
                + f", {row['outcome']} {_seconds(row['takeover_delay_s'])}"
                + (f" ({row['trigger']})" if row["trigger"] else "")
            ),
        )
    )
    lines.extend(_listed(mine["outages"], "outages", lambda r: _spell_text("outage", r)))
    lines.extend(
        _listed(mine["dual_active"], "dual_active", lambda r: _spell_text("dual active", r))
    )
    lines.extend(
        _listed(
            mine["unprotected"],
            "unprotected",
            lambda r: _spell_text(f"unprotected ({r['node']} ACTIVE)", r),
        )
    )
    lines.extend(
        _listed(
            mine["quarantines"],
            "quarantines",
            lambda r: (
                f"      quarantine {iso(r['ts'])} {r['node']}: {r['messages']} message(s)"
                f" in {r['path']}" + (f" ({r['replayed']})" if r.get("replayed") else "")
            ),
        )
    )
    lines.append("    time in state")
    for node, states in p["state_seconds"].items():
        lines.append(
            f"      {node:<10} "
            + "  ".join(f"{state} {states.get(state, 0.0):.3f}s" for state in REPORT_STATES)
        )
    rec = p["manual_recoveries"]
    lines.append(f"    redirects   {p['redirects']}, refusals {p['refusals']}")
    lines.append(
        f"    recoveries  {rec['manual_recover_transitions']} failback(s) done,"
        f" {rec['recover_commands']} recover command(s), {rec['handovers']} handover(s);"
        f" misconfigurations {p['misconfigurations']}"
    )
    return lines


def takeovers_of(takeovers: int, failovers: int) -> str:
    """How many failovers the takeover figures cover: those a loss led to (the others, a
    manual one or a dual active, have no loss to time them from)."""
    return f"{takeovers} of {failovers} failover(s), those with a peer lost"


def render_text(summary: Mapping, tables: Mapping[str, Sequence[Mapping]]) -> str:
    """The human summary printed on stdout: each pair in detail when there are few, then the
    fleet."""
    lines = ["amqha failover report"]
    lines.append(
        f"  input       {len(summary['files'])} file(s), {summary['events']} events,"
        f" {summary['bad_lines']} bad line(s)"
    )
    if len(summary["files"]) > LISTED_ROWS:
        lines.append("    (every file read is listed in summary.json)")
    else:
        lines.extend(f"    {f}" for f in summary["files"])
    pairs = summary["pairs"]
    if len(pairs) <= DETAILED_PAIRS:
        for p in pairs.values():
            lines.extend(_pair_text(p, tables))
    fleet = summary["fleet"]
    failovers = fleet["failovers"]
    if len(pairs) > 1:
        lines.append(
            f"  failovers   {failovers['count']}: "
            + ", ".join(f"{c} {n}" for c, n in failovers["by_cause"].items() if n)
            + f"; client outage {failovers['outage_seconds']:.3f}s (failovers/failovers.csv)"
        )
    if fleet["no_data_pairs"]:
        lines.append(
            "  NO DATA     no record in the window, no figure: " + ", ".join(fleet["no_data_pairs"])
        )
    lines.append(
        f"  fleet       {fleet['pairs']} pair(s), availability"
        f" {'no data' if fleet['availability'] is None else _percent(fleet['availability'])},"
        f" outages {fleet['outage_seconds']:.3f}s, dual active"
        f" {fleet['dual_active_seconds']:.3f}s, {fleet['incidents']} incident(s)"
    )
    unprotected = fleet["unprotected"]
    if unprotected["pairs_recorded"]:
        lines.append(
            f"  unprotected {unprotected['seconds']:.3f}s ({_percent(unprotected['fraction'])})"
            f" over {unprotected['pairs_recorded']} pair(s) with sync records"
        )
    if unprotected["not_recorded"]:
        lines.append(
            "  unprotected not recorded for "
            + ", ".join(unprotected["not_recorded"])
            + " (no sync records)"
        )
    if fleet["quarantines"]["count"]:
        lines.append(
            f"  quarantine  {fleet['quarantines']['count']} record(s),"
            f" {fleet['quarantines']['messages']} message(s)"
        )
    delays = fleet["takeover_delay_s"]
    lines.append(
        f"  takeover    p50 {_seconds(delays['p50'])} p90 {_seconds(delays['p90'])}"
        f" p99 {_seconds(delays['p99'])} max {_seconds(delays['max'])}"
        f" ({takeovers_of(delays['count'], failovers['count'])})"
    )
    if len(pairs) > 1:
        lines.append("  worst pairs")
        for w in fleet["worst"]:
            unprotected_s = w["unprotected_seconds"]
            lines.append(
                f"    {w['pair']:<24} {_percent(w['availability'])}"
                f" outage {w['outage_seconds']:.3f}s dual active {w['dual_active_seconds']:.3f}s"
                " unprotected "
                + ("not recorded" if unprotected_s is None else f"{unprotected_s:.3f}s")
            )
    if fleet["uncertain_pairs"]:
        lines.append(
            "  uncertain   figures of "
            + ", ".join(fleet["uncertain_pairs"])
            + " depend on clock offsets the logs do not pin down (see clock lines)"
        )
    slo = fleet["slo"]
    if slo is not None:
        lines.append(
            f"  slo {slo['target_percent']}%  {len(slo['breaches'])} pair-day(s) broke it,"
            f" {len(slo['possible_breaches'])} may have"
        )
        if len(slo["breaches"]) > LISTED_ROWS:
            lines.append("    (every one is listed in summary.md and summary.json)")
        else:
            for b in slo["breaches"]:
                lines.append(f"    {b['pair']} {b['day']} {_percent(b['availability'])}")
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


# Times on the reference clock, as epoch seconds in the tables; each CSV has beside each one
# the same time in ISO 8601 UTC (``<column>_iso``), for people and spreadsheets.
TIME_COLUMNS = frozenset({"start", "end", "ts", "last_seen", "lost_ts", "active_ts", "at"})


def csv_header(columns: Sequence[str]) -> list[str]:
    header = []
    for column in columns:
        header.append(column)
        if column in TIME_COLUMNS:
            header.append(f"{column}_iso")
    return header


def write_csv(path: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """A table's rows in ``columns`` order, each time column followed by its ISO form."""
    times = [c in TIME_COLUMNS for c in columns]
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(csv_header(columns))
        for row in rows:
            cells: list[object] = []
            for value, is_time in zip(row, times, strict=True):
                cells.append(_cell(value))
                if is_time:
                    cells.append("" if value is None else iso(value))  # type: ignore[arg-type]
            writer.writerow(cells)
