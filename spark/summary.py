"""The report's JSON summary: each pair's figures and the fleet's.

Owns: the summary's shape (the input, the pairs, the fleet, the warnings), the fleet's
totals, worst pairs, takeover delay percentiles, SLO breaches and unprotected time over the
pairs that record it (docs/report.md). Must not know Spark or files: it reads the pairs'
summaries and the daily rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from spark.model import CAUSES, SCHEMA_VERSION


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
