"""The failover report's shared vocabulary and its pure decisions.

Owns: the v1 event-log schema (field names and kinds), the record order inside a node, the
report's tables (columns, types, sort keys), input path expansion, clock-offset estimation,
the report window and its days, the "did this node crash at the end of its log" rule, times
as text and the tables' CSV copies. Both implementations (``spark.job`` on Spark,
``spark.reference`` in plain Python) call these so that they differ only in how they scan the
events; the summary is ``spark.summary``'s, its text ``spark.text``'s.

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
    ("server", "string"),  # maintenance: the role put in or out of it
    ("on", "string"),  # maintenance: JSON true or false, read as its text
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
RECOVERY_TRIGGERS = ("MANUAL_RECOVER", "SWITCHOVER", "HANDOVER")
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
    "switchover",
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


def iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def minute_label(minute_start: int) -> str:
    return datetime.fromtimestamp(minute_start, UTC).strftime("%Y-%m-%dT%H:%M:00Z")


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
