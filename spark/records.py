"""The tables read off a pair's records one by one, each record placed on the reference clock.

Owns: the incidents (a ``peer_lost`` and what resolved it, with the detection delay's range
over the offsets' intervals), the recoveries, misconfigurations and quarantines, the
witness's counts (docs/failover.md, "The witness"), the federation links' down time
(docs/report.md, "Federation links"), and the failover each outage, dual-active spell and
incident belongs to. Pure: no I/O, no Spark; must not know how the records were read.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark.model import (
    CLOCK_RESOLUTION_S,
    FEDERATION_EVENT,
    LINK_DOWN_KINDS,
    LINK_FAILED,
    LINK_UP,
    RECOVER_COMMAND,
    RECOVERY_TRIGGERS,
    Offset,
    day_of,
)
from spark.spans import Span
from spark.spans import clip as _clip
from spark.spans import counted as _counted
from spark.spans import measure as _measure
from spark.spans import shift as _shift
from spark.spans import union as _union

Row = dict[str, Any]
_RECOVER = re.compile(RECOVER_COMMAND)
# How a takeover the witness agreed to ends its reason (failover/fsm.py).
WITNESS_AGREES = "the witness agrees"


# ---------------------------------------------------------------- incidents


def _resolution(
    r: Row, following: Row | None, offset: float
) -> tuple[str, float | None, str | None]:
    """What resolved a ``peer_lost``: its outcome, when the observer was ACTIVE (on the
    reference clock; ``offset`` is the observer's), and what triggered that."""
    if r["state"] == "ACTIVE":
        return "already_active", r["ts"] - offset, None
    if following is not None and following["event"] == "transition":
        return "takeover", following["ts"] - offset, following.get("trigger")
    if following is not None and following["event"] in ("started", "stopped"):
        return "survivor_down", None, None
    return "unresolved", None, None


def _incident(
    name: str, node: str, r: Row, following: Row | None, offsets: Mapping[str, Offset], known: bool
) -> Row:
    """A ``peer_lost`` as an incident row: the detection delay with its range over the
    offsets' intervals, and what resolved it."""
    lost_ts = r["ts"] - offsets[node].seconds
    outcome, active_ts, trigger = _resolution(r, following, offsets[node].seconds)
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
    return {
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


def incident_rows(
    name: str,
    records: Mapping[str, Sequence[Row]],
    offsets: Mapping[str, Offset],
    window: Span,
    known: bool,
) -> list[Row]:
    """One row per ``peer_lost`` in the window, resolved by the observer's next start, stop
    or transition to ACTIVE."""
    since, until = window
    rows = []
    for node in sorted(records):
        resolvers = [
            r
            for r in records[node]
            if r["event"] in ("peer_lost", "started", "stopped")
            or (r["event"] == "transition" and r["state"] == "ACTIVE")
        ]
        for r, following in zip(resolvers, [*resolvers[1:], None], strict=True):
            lost_ts = r["ts"] - offsets[node].seconds
            if r["event"] != "peer_lost" or not since <= lost_ts <= until:
                continue
            rows.append(_incident(name, node, r, following, offsets, known))
    return rows


# ---------------------------------------------------------------- recoveries and the rest


@dataclass
class Noted:
    """What the records of a pair's window note one by one: three tables, the dual-active
    records and the witness's counts."""

    recoveries: list[Row] = field(default_factory=list)
    misconfigurations: list[Row] = field(default_factory=list)
    quarantines: list[Row] = field(default_factory=list)
    dual_events: int = 0
    # The witness (docs/failover.md): takeovers it agreed to, and the times an ACTIVE stopped
    # serving because it had lost both its peer and its witnesses (or was overtaken).
    witness: dict[str, int] = field(default_factory=lambda: {"agreed_takeovers": 0, "fences": 0})


def _note(noted: Noted, place: Row, node: str, ts: float, r: Row) -> None:
    event = r["event"]
    if event == "transition" and (r.get("reason") or "").endswith(WITNESS_AGREES):
        noted.witness["agreed_takeovers"] += 1
    elif event == "witness_fence" and r.get("reason") is not None:
        noted.witness["fences"] += 1
    if (event == "console" and _RECOVER.search(r.get("command") or "")) or (
        event == "transition" and r.get("trigger") in RECOVERY_TRIGGERS
    ):
        noted.recoveries.append(
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
        noted.misconfigurations.append(
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
        noted.dual_events += 1
    elif event == "quarantine":
        noted.quarantines.append(
            {
                **place,
                "ts": ts,
                "node": node,
                "messages": r.get("messages"),
                "path": r.get("path"),
            }
        )


def noted_records(
    name: str, records: Mapping[str, Sequence[Row]], offsets: Mapping[str, Offset], window: Span
) -> Noted:
    """Recoveries (a ``recover`` typed at the console, a transition a recovery triggered),
    misconfigurations, quarantines, dual-active records and the witness's counts in the
    window."""
    since, until = window
    noted = Noted()
    for node in sorted(records):
        for r in records[node]:
            ts = r["ts"] - offsets[node].seconds
            if since <= ts <= until:
                _note(noted, {"pair": name, "day": day_of(ts)}, node, ts, r)
    return noted


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


# ---------------------------------------------------------------- the failovers' keys


def _keyed(rows: list[Row], failovers: Sequence[Row], start: str, end: str) -> None:
    """Give each row the key of the failover whose span (its start to its new ACTIVE) it
    meets; None for none (the pair's start, an outage nobody ended)."""
    spans = sorted((f["start"], f["end"], f["incident"]) for f in failovers)
    for row in rows:
        found = [k for s, e, k in spans if row[start] <= e and s <= row[end]]
        row["incident"] = found[0] if found else None


def key_to_failovers(tables: Mapping[str, list[Row]]) -> None:
    """Give the outages, dual-active spells and incidents their failover's key."""
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
