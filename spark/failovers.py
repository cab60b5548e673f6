"""The failovers of one pair: each takeover, why it happened and what clients saw of it.

Owns: the freezes a server logged (``paused``: the gap its heartbeat ticks had) and the time
they take out of its ACTIVE runs; one row per takeover (a server becoming ACTIVE by a
transition when the last server ACTIVE before it was another), its cause, its client outage
as the logs bound it (the outage they prove and the longest they allow) and the dual-active
time of its own spell (docs/report.md, "Failovers"). Pure: no I/O, no Spark; must not know
how the records were read (every input is a non-bulk record or a state run's end, which both
scans keep whole).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark.model import CLOCK_RESOLUTION_S, MANUAL_TRIGGERS, Offset, day_of
from spark.spans import Span, clip, measure, shift

Row = dict[str, Any]

PAUSED = "paused"


def frozen_spans(records: Sequence[Row]) -> list[Span]:
    """A node's freezes on its own clock: each ``paused`` record says its heartbeat ticks
    stopped for ``gap`` seconds before it was written, so the process was stopped (it
    served nothing) from ``ts - gap`` to ``ts``."""
    spans = []
    for r in records:
        gap = r.get("gap")
        if r["event"] == PAUSED and isinstance(gap, int | float) and 0 < gap < math.inf:
            spans.append((r["ts"] - gap, r["ts"]))
    return sorted(spans)


@dataclass
class _Run:
    """An ACTIVE run of one node: on the reference clock (``start``, ``end``) and on the
    node's own (``raw_start``, ``raw_end``)."""

    node: str
    start: float
    end: float
    raw_start: float
    raw_end: float


def _spread(o: Offset, known: bool) -> tuple[float, float]:
    """How far below and above the point used the node's offset may lie."""
    if known or o.known:
        return 0.0, 0.0
    return o.seconds - o.lower, o.upper - o.seconds


@dataclass
class _Marks:
    """The records the failover rules read, indexed once per pair: on each node's own clock
    the transitions and stops by time; on the reference clock the losses (``peer_lost``),
    the witness fences, the starts, the freezes and each node's signs of life (its own
    records and the ``last_seen`` its peers logged of it), in time order."""

    ends: dict[tuple[str, float], Row]
    losses: list[tuple[float, str, Row]]
    heard: dict[tuple[str, str], list[float]]
    fences: dict[str, list[float]]
    starts: dict[str, list[float]]
    freezes: dict[str, list[Span]]
    alive: dict[str, list[float]]

    @classmethod
    def of(cls, records: Mapping[str, Sequence[Row]], offsets: Mapping[str, Offset]) -> _Marks:
        marks = cls(
            {}, [], defaultdict(list), defaultdict(list), defaultdict(list), {}, defaultdict(list)
        )
        for node, rows in records.items():
            d = offsets[node].seconds
            marks.freezes[node] = [(s - d, e - d) for s, e in frozen_spans(rows)]
            for r in rows:
                event = r["event"]
                marks.alive[node].append(r["ts"] - d)
                peer, seen = r.get("peer"), r.get("last_seen")
                if isinstance(peer, str) and peer in offsets and peer != node and seen is not None:
                    marks.alive[peer].append(seen - offsets[peer].seconds)
                if event in ("transition", "stopped"):
                    marks.ends.setdefault((node, r["ts"]), r)
                elif event == "peer_lost":
                    marks.losses.append((r["ts"] - d, node, r))
                elif event == "peer_up" and isinstance(peer, str):
                    marks.heard[(node, peer)].append(r["ts"] - d)
                elif event == "witness_fence" and r.get("reason") is not None:
                    marks.fences[node].append(r["ts"] - d)
                elif event == "started":
                    marks.starts[node].append(r["ts"] - d)
        marks.losses.sort(key=lambda x: (x[0], x[1]))
        for times in (*marks.alive.values(), *marks.heard.values()):
            times.sort()
        return marks

    def healed(self, node: str, peer: str, lost: float, by: float) -> bool:
        """Whether ``node`` heard ``peer`` again after losing it at ``lost``, before ``by``."""
        times = self.heard.get((node, peer), [])
        return bisect.bisect_right(times, lost) < bisect.bisect_left(times, by)

    @staticmethod
    def between(times: Sequence[float], lo: float, hi: float) -> list[float]:
        return list(times[bisect.bisect_left(times, lo) : bisect.bisect_right(times, hi)])

    def last_alive(self, node: str, lo: float, hi: float) -> float | None:
        """The node's last sign of life in ``lo .. hi``."""
        found = self.between(self.alive.get(node, []), lo, hi)
        return found[-1] if found else None


def failovers(
    name: str,
    nodes: Sequence[str],
    runs: Mapping[str, Sequence[tuple[str, float, float]]],
    records: Mapping[str, Sequence[Row]],
    offsets: Mapping[str, Offset],
    window: Span,
    known: bool,
    dual: Sequence[Span],
) -> list[Row]:
    """One row per takeover: each ACTIVE run a transition opened, when the server ACTIVE
    last before it (the other servers' ACTIVE run that ended last among those begun before
    it) was not this one (its own earlier run, as after a restart alone, is no failover).
    ``dual`` is the pair's dual-active time on the offsets used; a row's share is the part
    of it in its own spell."""
    since, until = window
    marks = _Marks.of(records, offsets)
    active: list[_Run] = []
    for node in nodes:
        d = offsets[node].seconds
        for state, s, e in runs[node]:
            if state == "ACTIVE":
                active.append(_Run(node, shift(s, d), shift(e, d), s, e))
    active.sort(key=lambda r: (r.start, r.node))
    rows: list[Row] = []
    for new in active:
        if not since <= new.start <= until:
            continue
        opened = marks.ends.get((new.node, new.raw_start))
        if opened is None or opened["event"] != "transition":
            continue
        before = [r for r in active if r.start < new.start]
        others = [r for r in before if r.node != new.node]
        if not others:
            continue
        old = max(others, key=lambda r: (r.end, r.start))
        if any(r.end >= old.end for r in before if r.node == new.node):
            continue  # this server was the last ACTIVE: it came back, nobody took over
        rows.append(_failover(name, old, new, opened, marks, offsets, window, known, dual))
    for number, row in enumerate(rows, 1):
        row["incident"] = number
    return rows


def _failover(
    name: str,
    old: _Run,
    new: _Run,
    opened: Row,
    marks: _Marks,
    offsets: Mapping[str, Offset],
    window: Span,
    known: bool,
    dual: Sequence[Span],
) -> Row:
    since, until = window
    mine, theirs = offsets[new.node], offsets[old.node]
    taken = new.start
    # How the old run ended: a transition or a stop it wrote (exact), or its last sign of
    # life (a crash, a freeze or a cut: it may have served a while after).
    ended = marks.ends.get((old.node, old.raw_end))
    last_alive = min(old.end, until)
    # The loss that led to it: the new ACTIVE's last peer_lost about the old in its run
    # (another server's if it logged none). A loss its server healed before the takeover
    # (it heard the old ACTIVE again: a blip, then a switchover, say) led to none.
    i = bisect.bisect_left(marks.losses, old.start, key=lambda x: x[0])
    j = bisect.bisect_right(marks.losses, taken, key=lambda x: x[0])
    losses = [
        (ts, node == new.node, node, r)
        for ts, node, r in marks.losses[i:j]
        if node != old.node
        and r.get("peer") == old.node
        and not marks.healed(node, old.node, ts, taken)
    ]
    own = [loss for loss in losses if loss[1]]
    loss = max(own or losses, default=None, key=lambda x: x[0])
    lost_ts = loss[0] if loss else None
    lost_at = math.inf if lost_ts is None else lost_ts
    evidence = loss[3].get("evidence") if loss else None
    # A freeze of the old ACTIVE that the takeover happened in (or, with a loss, that lasted
    # until the loss): it served nothing from the freeze's start, its last heartbeat tick.
    reached = taken if lost_ts is None else min(lost_ts, taken)
    # The freeze's start is the last heartbeat tick before it, which may come just before
    # the run's start (a run begun, then the process stopped within a heartbeat): any freeze
    # that overlaps the run counts, from the run's start at the earliest.
    frozen = [
        (max(s, old.start), e)
        for s, e in marks.freezes.get(old.node, [])
        if s <= taken and e >= reached and e > old.start
    ]
    freeze = max(frozen, default=None)
    # A witness fence stops the old ACTIVE confirming before its run ends.
    fenced = marks.between(marks.fences.get(old.node, []), old.start, min(last_alive, taken))
    if freeze is not None:
        # The latest it served is its last tick before the freeze (the process stopped
        # within a heartbeat after it); the earliest, its last sign of life before it.
        latest, latest_on = freeze[0], old.node
        seen = marks.last_alive(old.node, old.start, freeze[0])
        earliest = freeze[0] if seen is None else seen
    elif ended is not None or fenced or old.end > taken:
        # Exact when it said so (a transition, a stop, a fence), or still serving.
        earliest = latest = min([last_alive, *fenced])
        latest_on = old.node
    else:
        # A crash or a cut: it served at least until its last sign of life, at most until
        # it was known gone: the loss, or its own restart.
        earliest = last_alive
        bounds = [(lost_at, loss[2])] if loss and lost_at > earliest else []
        starts = marks.starts.get(old.node, [])
        k = bisect.bisect_right(starts, earliest)
        if k < len(starts):
            bounds.append((starts[k], old.node))
        latest, latest_on = min(bounds, default=(taken, new.node))
        latest = min(latest, taken)
    trigger = opened.get("trigger")
    if ended and ended.get("trigger") == "SWITCHOVER":
        cause = "switchover"  # planned: the old ACTIVE drained and handed over
    elif trigger in MANUAL_TRIGGERS or (ended and ended.get("trigger") == "MANUAL_RECOVER"):
        cause = "manual"
    elif freeze is not None:
        cause = "freeze"
    elif ended is not None and ended["event"] == "stopped" and old.end <= taken:
        cause = "stopped"
    elif loss is not None and old.end > lost_at:
        cause = "cut link"  # it logged on after the loss: alive, not restarted
    elif loss is not None:
        cause = "crash" if evidence == "refused" else "silence"
    elif old.end > taken:
        cause = "dual active"
    else:
        cause = "unknown"
    below_new, above_new = _spread(mine, known)
    below_old, above_old = _spread(theirs, known)
    # What the logs prove (nobody could confirm from the latest moment the old one could to
    # the transition), and the longest they allow (from its last sign of life).
    outage = max(0.0, taken - latest)
    most = max(0.0, taken - earliest) + below_new + above_old
    least = outage
    if latest_on != new.node:  # two clocks: the least moves with both offsets
        least = max(0.0, least - above_new - below_old)
    start = min(earliest, taken, lost_ts if lost_ts is not None else math.inf)
    detection = None
    timed = freeze is not None or (ended is None and old.end <= (lost_ts or -math.inf))
    if lost_ts is not None and timed and not fenced and latest <= lost_ts:
        detection = lost_ts - (freeze[0] if freeze is not None else earliest)
    # Dual active in this failover's own spell: while both its servers were ACTIVE after the
    # takeover (a freeze's gap is not: the frozen server served nothing).
    spell = clip(dual, max(taken, since), min(old.end, new.end, until))
    return {
        "pair": name,
        "day": day_of(max(start, since)),
        "incident": 0,  # numbered once all are found
        "start": start,
        "end": taken,
        "from_node": old.node,
        "to_node": new.node,
        "epoch": opened.get("epoch"),
        "trigger": trigger,
        "cause": cause,
        "evidence": evidence,
        "gap_s": None if freeze is None else freeze[1] - freeze[0],
        "lost_ts": lost_ts,
        "detection_delay_s": detection,
        "takeover_delay_s": None if lost_ts is None else taken - lost_ts,
        "outage_s": outage,
        "min_outage_s": least,
        "max_outage_s": most if math.isfinite(most) else None,
        "dual_active_s": measure(spell),
        "uncertain": not math.isfinite(most) or most - least > CLOCK_RESOLUTION_S,
    }
