"""The report's timeline picture (``timeline.png``).

Owns: drawing, with matplotlib's Agg backend, each server's state over the report window as
coloured bands, a "service" band with client-visible outages and dual-active spells, the
incidents (peer last seen, peer lost, survivor ACTIVE) and redirects + refusals over time.
It draws the small tables it is given and computes nothing; it must not know Spark.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from spark.model import iso  # noqa: E402

COLOURS = {
    "ACTIVE": "#2e9e44",
    "PASSIVE": "#4a7fc1",
    "PRIMARY": "#f2c94c",
    "BACKUP": "#f29e4c",
    "DOWN": "#c8c8c8",
}
OUTAGE = "#d62728"
DUAL = "#8e44ad"
SERVING = "#b9e3c0"
NODE_GREYS = ("#555555", "#a0a0a0", "#d0d0d0")
LABELLED_INCIDENTS = 30  # beyond this, numbers would only clutter
DAY = 86400.0


def _x(ts: float) -> float:
    """Epoch seconds to matplotlib date numbers (days since 1970-01-01 UTC)."""
    return ts / DAY


def _spans(rows: Sequence[Mapping[str, Any]], minimum: float) -> list[tuple[float, float]]:
    """(start, width) in date numbers, widened to ``minimum`` so that short spells show."""
    return [(_x(r["start"]), max(_x(r["end"]) - _x(r["start"]), minimum)) for r in rows]


def render(
    path: str,
    summary: Mapping[str, Any],
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    activity: Sequence[Mapping[str, Any]],
) -> None:
    window = summary["window"]
    nodes = list(summary["nodes"])
    if window is None:
        fig, ax = plt.subplots(figsize=(8, 2))
        ax.text(0.5, 0.5, "no events", ha="center", va="center", fontsize=14)
        ax.set_axis_off()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return

    lo, hi = window["since"], window["until"]
    span = max(hi - lo, 1e-3)
    minimum = span / DAY / 600
    rows = [*reversed(nodes), "service"]
    y = {name: i for i, name in enumerate(rows)}
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        sharex=True,
        figsize=(14, 2.2 + 0.75 * len(rows)),
        gridspec_kw={"height_ratios": [len(rows), 1.6], "hspace": 0.08},
    )

    for state, colour in COLOURS.items():
        bands = [r for r in tables["state_intervals"] if r["state"] == state]
        for node in nodes:
            mine = [r for r in bands if r["node"] == node]
            if mine:
                top.broken_barh(
                    _spans(mine, 0),
                    (y[node] - 0.35, 0.7),
                    facecolors=colour,
                    edgecolor="none",
                    hatch="///" if state == "DOWN" else None,
                )
    service = y["service"]
    top.broken_barh([(_x(lo), span / DAY)], (service - 0.35, 0.7), facecolors=SERVING)
    top.broken_barh(_spans(tables["outages"], minimum), (service - 0.35, 0.7), facecolors=OUTAGE)
    top.broken_barh(_spans(tables["dual_active"], minimum), (service - 0.35, 0.7), facecolors=DUAL)
    for outage in tables["outages"]:
        top.axvspan(_x(outage["start"]), _x(outage["end"]), color=OUTAGE, alpha=0.08, lw=0)

    for number, incident in enumerate(tables["incidents"], 1):
        row = y.get(incident["node"])
        if row is None:
            continue
        if incident["last_seen"] is not None and incident["peer"] in y:
            top.plot(_x(incident["last_seen"]), y[incident["peer"]] + 0.45, "kv", ms=6)
        top.plot(_x(incident["lost_ts"]), row + 0.45, "kx", ms=7, mew=2)
        if incident["active_ts"] is not None:
            top.plot(_x(incident["active_ts"]), row + 0.45, "k^", ms=6)
        if len(tables["incidents"]) <= LABELLED_INCIDENTS:
            top.annotate(
                f"#{number}",
                (_x(incident["lost_ts"]), row + 0.45),
                xytext=(5, 3),
                textcoords="offset points",
                fontsize=8,
            )
        top.axvline(_x(incident["lost_ts"]), color="k", lw=0.6, ls=":", alpha=0.6)

    top.set_yticks(range(len(rows)), rows)
    top.set_ylim(-0.6, len(rows) - 0.1)
    top.set_xlim(_x(lo), _x(lo) + span / DAY)
    availability = summary["availability"]
    top.set_title(
        "amqha failover timeline, "
        f"{iso(lo)} .. {iso(hi)} (UTC)\n"
        + ("availability -" if availability is None else f"availability {availability:.4%}")
        + f", {summary['incidents']['count']} incident(s),"
        f" {summary['outages']['count']} outage(s) {summary['outages']['seconds']:.3f}s,"
        f" dual active {summary['dual_active']['seconds']:.3f}s",
        fontsize=11,
    )
    legend = [
        *(
            Patch(facecolor=c, label=s, hatch="///" if s == "DOWN" else None)
            for s, c in COLOURS.items()
        ),
        Patch(facecolor=SERVING, label="served"),
        Patch(facecolor=OUTAGE, label="outage (no ACTIVE)"),
        Patch(facecolor=DUAL, label="dual active"),
        Line2D([], [], color="k", marker="v", ls="", label="peer last seen"),
        Line2D([], [], color="k", marker="x", ls="", mew=2, label="peer lost"),
        Line2D([], [], color="k", marker="^", ls="", label="survivor ACTIVE"),
    ]
    width = activity[0]["width"] if activity else 60
    share = width / max(len(nodes), 1)
    for index, (colour, node) in enumerate(zip(itertools.cycle(NODE_GREYS), nodes)):
        mine = [a for a in activity if a["node"] == node]
        if mine:
            bottom.bar(
                [_x(a["at"] + index * share) for a in mine],
                [a["redirects"] + a["refusals"] for a in mine],
                width=share / DAY,
                align="edge",
                color=colour,
                label=node,
            )
    bottom.set_ylabel(f"redirects +\nrefusals\nper {width // 60} min", fontsize=8)
    bottom.set_ylim(bottom=0)
    if activity:
        bottom.legend(fontsize=8, loc="upper right")
    bottom.grid(alpha=0.3)
    locator = mdates.AutoDateLocator()
    bottom.xaxis.set_major_locator(locator)
    bottom.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    fig.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=11, fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
