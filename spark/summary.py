"""The report's daily rows and JSON summary: each pair's figures per day and over its
window, and the fleet's.

Owns: a pair's daily rows (availability with its range, and each day's part of its other
tables) and its summary; the summary's shape (the input, the pairs, the fleet, the
warnings), the fleet's totals, worst pairs, takeover delay percentiles, SLO breaches and
unprotected time over the pairs that record it (docs/report.md). Pure: no I/O, no Spark;
must not know how the records were read: it reads a pair's tables and spans.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark.model import CAUSES, OUTCOMES, REPORT_STATES, SCHEMA_VERSION
from spark.spans import clip, measure
from spark.spells import NO_SPELLS, Spells

Row = dict[str, Any]


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
        "planned_seconds": sum(p["unprotected"]["planned_seconds"] for p in recorded)
        if recorded
        else None,
        "not_recorded": sorted(n for n, p in pairs.items() if not p["unprotected"]["recorded"]),
    }


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


# ---------------------------------------------------------------- a pair's days and window


@dataclass
class PairFigures:
    """What a pair's summary reads besides its tables: its outage and dual-active spans,
    its dual-active records, the witness's counts, its freezes, whether its logs record
    unprotected time, its redirects and refusals per day, and whether the window misses
    its logs (``no_data``: no figure)."""

    outage: Spells
    dual: Spells
    dual_events: int
    witness: dict[str, int]
    freezes: list[Row]
    recorded: bool
    bulk_by_day: Mapping[str, tuple[int, int]]
    no_data: bool
    warnings: list[str]
    # Per day, the unprotected seconds while the ACTIVE's peer was in maintenance (planned).
    planned_by_day: Mapping[str, float] = field(default_factory=dict)

    @staticmethod
    def unobserved(warnings: list[str]) -> PairFigures:
        """A window that misses the logs: nothing in it, and no figure."""
        return PairFigures(
            outage=NO_SPELLS,
            dual=NO_SPELLS,
            dual_events=0,
            witness={"agreed_takeovers": 0, "fences": 0},
            freezes=[],
            recorded=False,
            bulk_by_day={},
            no_data=True,
            warnings=warnings,
        )


def _on(rows: Sequence[Row], day: str) -> list[Row]:
    return [r for r in rows if r["day"] == day]


def daily_rows(
    name: str,
    days: Sequence[tuple[str, float, float]],
    tables: Mapping[str, Sequence[Row]],
    outage: Spells,
    dual: Spells,
    unprotected_by_day: Mapping[str, tuple[float, float, float]],
    bulk_by_day: Mapping[str, tuple[int, int]],
) -> list[Row]:
    """One row per day of the window: its availability with its range, and the day's part
    of every other table."""
    rows = []
    for day, lo, hi in days:
        seconds = hi - lo
        out_point = measure(clip(outage.point, lo, hi))
        out_most = measure(clip(outage.possible, lo, hi))
        out_least = measure(clip(outage.certain, lo, hi))
        today = _on(tables["incidents"], day)
        takeovers = [i["takeover_delay_s"] for i in today if i["outcome"] == "takeover"]
        redirects, refusals = bulk_by_day.get(day, (0, 0))
        quarantined = _on(tables["quarantines"], day)
        recoveries = _on(tables["recoveries"], day)
        failovers = _on(tables["failovers"], day)
        unprotected, least, most = unprotected_by_day.get(day, (None, None, None))
        rows.append(
            {
                "pair": name,
                "day": day,
                "seconds": seconds,
                "availability": 1 - out_point / seconds if seconds > 0 else None,
                "min_availability": 1 - out_most / seconds if seconds > 0 else None,
                "max_availability": 1 - out_least / seconds if seconds > 0 else None,
                "outages": len(_on(tables["outages"], day)),
                "outage_s": out_point,
                "dual_active_s": measure(clip(dual.point, lo, hi)),
                "max_dual_active_s": measure(clip(dual.possible, lo, hi)),
                "unprotected_s": unprotected,
                "unprotected_fraction": (
                    unprotected / seconds if unprotected is not None and seconds > 0 else None
                ),
                "min_unprotected_s": least,
                "max_unprotected_s": most,
                "quarantines": len(quarantined),
                "quarantined_messages": sum(q["messages"] or 0 for q in quarantined),
                "incidents": len(today),
                "takeovers": len(takeovers),
                "max_takeover_delay_s": max(takeovers, default=None),
                "redirects": redirects,
                "refusals": refusals,
                "recoveries": sum(1 for r in recoveries if r["trigger"] == "MANUAL_RECOVER"),
                "recover_commands": sum(1 for r in recoveries if r["event"] == "console"),
                "failovers": len(failovers),
                "client_outage_s": sum(f["outage_s"] for f in failovers),
                "uncertain": any(
                    row["uncertain"]
                    for t in ("outages", "dual_active", "unprotected", "incidents")
                    for row in _on(tables[t], day)
                ),
            }
        )
    return rows


UNPROTECTED_KEYS = (
    "recorded",
    "seconds",
    "fraction",
    "min_seconds",
    "max_seconds",
    "spans",
    "longest_s",
    "uncertain",
    "planned_seconds",
    "unplanned_seconds",
)


def _unprotected_summary(
    rows: Sequence[Row], daily: Sequence[Row], length: float, planned_by_day: Mapping[str, float]
) -> dict:
    """The pair's unprotected time over the window: its days' sums; the planned part (the
    peer in maintenance) and the rest apart."""
    seconds = sum(d["unprotected_s"] for d in daily)
    planned = min(seconds, sum(planned_by_day.get(d["day"], 0.0) for d in daily))
    return {
        "recorded": True,
        "seconds": seconds,
        "planned_seconds": planned,
        "unplanned_seconds": seconds - planned,
        "fraction": seconds / length if length > 0 else None,
        "min_seconds": sum(d["min_unprotected_s"] for d in daily),
        "max_seconds": sum(d["max_unprotected_s"] for d in daily),
        "spans": len(rows),
        "longest_s": max((r["duration_s"] for r in rows), default=None),
        "uncertain": sum(1 for r in rows if r["uncertain"]),
    }


def _stats(values: Iterable[float | None]) -> dict[str, float | int | None]:
    present = [v for v in values if v is not None]
    return {
        "count": len(present),
        "mean": sum(present) / len(present) if present else None,
        "max": max(present) if present else None,
    }


def _spell_summaries(
    tables: Mapping[str, Sequence[Row]], figures: PairFigures
) -> dict[str, dict[str, Any]]:
    outage, dual = figures.outage, figures.dual
    outages, duals = tables["outages"], tables["dual_active"]
    return {
        "outages": {
            "count": len(outages),
            "seconds": measure(outage.point),
            "min_seconds": measure(outage.certain),
            "max_seconds": measure(outage.possible),
            "longest_s": max((o["duration_s"] for o in outages), default=None),
            "uncertain": sum(1 for o in outages if o["uncertain"]),
        },
        "dual_active": {
            "count": len(duals),
            "seconds": measure(dual.point),
            "min_seconds": measure(dual.certain),
            "max_seconds": measure(dual.possible),
            "uncertain": sum(1 for d in duals if d["uncertain"]),
            "events": figures.dual_events,
        },
    }


def _record_summaries(tables: Mapping[str, Sequence[Row]], freezes: Sequence[Row]) -> dict:
    quarantines, incidents = tables["quarantines"], tables["incidents"]
    return {
        "freezes": {
            "count": len(freezes),
            "seconds": sum(f["end"] - f["start"] for f in freezes),
            "listed": freezes,
        },
        "quarantines": {
            "count": len(quarantines),
            "messages": sum(q["messages"] or 0 for q in quarantines),
            "listed": [
                {"ts": q["ts"], "node": q["node"], "messages": q["messages"], "path": q["path"]}
                for q in quarantines
            ],
        },
        "incidents": {
            "count": len(incidents),
            "by_outcome": {o: sum(1 for i in incidents if i["outcome"] == o) for o in OUTCOMES},
            "detection_delay_s": _stats(i["detection_delay_s"] for i in incidents),
            "takeover_delay_s": _stats(
                i["takeover_delay_s"] for i in incidents if i["outcome"] == "takeover"
            ),
        },
    }


def _state_seconds(state_time: Sequence[Row], nodes: Sequence[str]) -> dict:
    return {
        node: {
            state: sum(
                r["seconds"] for r in state_time if r["node"] == node and r["state"] == state
            )
            for state in REPORT_STATES
        }
        for node in nodes
    }


def _tail_summaries(tables: Mapping[str, Sequence[Row]], figures: PairFigures) -> dict:
    """Redirects and refusals, recoveries, misconfigurations, the witness, failovers."""
    recoveries, failovers = tables["recoveries"], tables["failovers"]
    bulk = figures.bulk_by_day
    return {
        "redirects": sum(r for r, _ in bulk.values()),
        "refusals": sum(f for _, f in bulk.values()),
        "manual_recoveries": {
            "recover_commands": sum(1 for r in recoveries if r["event"] == "console"),
            "manual_recover_transitions": sum(
                1 for r in recoveries if r["trigger"] == "MANUAL_RECOVER"
            ),
            "handovers": sum(1 for r in recoveries if r["trigger"] == "HANDOVER"),
            # planned switchovers handed over (each also one handover, on the peer)
            "switchovers": sum(1 for r in recoveries if r["trigger"] == "SWITCHOVER"),
        },
        "misconfigurations": len(tables["misconfigurations"]),
        "witness": figures.witness,
        "failovers": {
            "count": len(failovers),
            "by_cause": {c: sum(1 for f in failovers if f["cause"] == c) for c in CAUSES},
            "outage_seconds": sum(f["outage_s"] for f in failovers),
            "longest_outage_s": max((f["outage_s"] for f in failovers), default=None),
        },
    }


def pair_summary(
    head: Mapping[str, Any], tables: Mapping[str, Sequence[Row]], figures: PairFigures
) -> dict[str, Any]:
    """A pair's summary: ``head`` (its name, nodes, events, clocks and window), then its
    figures over the window, from its tables and ``figures``."""
    length = head["window"]["seconds"]
    outage = figures.outage
    spelled = _spell_summaries(tables, figures)
    uncertain = (
        *tables["outages"],
        *tables["dual_active"],
        *tables["unprotected"],
        *tables["incidents"],
    )
    summary = {
        **head,
        "availability": 1 - measure(outage.point) / length if length > 0 else None,
        "min_availability": 1 - measure(outage.possible) / length if length > 0 else None,
        "max_availability": 1 - measure(outage.certain) / length if length > 0 else None,
        "uncertain": any(r["uncertain"] for r in uncertain),
        **spelled,
        "unprotected": _unprotected_summary(
            tables["unprotected"], tables["daily"], length, figures.planned_by_day
        )
        if figures.recorded
        else dict.fromkeys(UNPROTECTED_KEYS, None) | {"recorded": False},
        **_record_summaries(tables, figures.freezes),
        "state_seconds": _state_seconds(tables["state_time"], head["nodes"]),
        **_tail_summaries(tables, figures),
        "no_data": figures.no_data,
        "warnings": figures.warnings,
    }
    if figures.no_data:
        summary["availability"] = summary["min_availability"] = summary["max_availability"] = None
    return summary
