"""The report's pictures: ``timeline.png`` of one pair and ``fleet.png``.

Owns: drawing, with matplotlib's Agg backend, a pair's servers' states over the window as
coloured bands (an ACTIVE with no in-sync PASSIVE striped in its lane, a freeze dotted), a
"service" band with client-visible outages and dual-active spells (uncertain ones hatched),
the labels above it laid out so that none covers another, the incidents (peer last seen,
peer lost, survivor ACTIVE; close ones clustered into one numbered marker) and redirects +
refusals over time; and the fleet's availability per pair per day as a heat map, worst pair
first. It draws the small tables it is given and
computes nothing; it must not know Spark. matplotlib is imported on first use (``warm_up``),
so that a report can load it while its JVM starts.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from spark.model import iso

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
UNPROTECTED = "#e67e22"
NODE_GREYS = ("#555555", "#a0a0a0", "#d0d0d0")
CLUSTERS = 60  # incidents closer than 1/CLUSTERS of the window share one marker
MIN_WIDTH = 1 / 200  # of the window: the narrowest an outage or unprotected span is drawn
LABELLED = 40  # up to this many spells or failovers in a picture, each gets its label
DAY = 86400.0


def warm_up() -> None:
    """Import matplotlib and draw once (fonts, the Agg renderer): the first picture's fixed
    cost, paid here when there is time to spare."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.set_title("x")
    fig.savefig(io.BytesIO(), format="png", dpi=10)
    plt.close(fig)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    """The pair's timeline as a PNG file."""
    fig, tight = figure(summary, tables, activity)
    fig.savefig(path, dpi=110, bbox_inches="tight" if tight else None)
    _pyplot().close(fig)


def figure(
    summary: Mapping[str, Any],
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    activity: Sequence[Mapping[str, Any]],
) -> tuple[Any, bool]:
    """The pair's timeline as a matplotlib figure, and whether to save it cut to its
    drawing (the picture has a legend below its axes)."""
    import matplotlib.dates as mdates
    from matplotlib.collections import PolyCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = _pyplot()
    window = summary["window"]
    nodes = list(summary["nodes"])
    if window is None or summary.get("no_data"):
        fig, ax = plt.subplots(figsize=(8, 2))
        ax.text(
            0.5,
            0.5,
            f"{summary['pair']}: no data (no record in the window)",
            ha="center",
            va="center",
            fontsize=14,
        )
        ax.set_axis_off()
        return fig, False

    lo, hi = window["since"], window["until"]
    span = max(hi - lo, 1e-3)
    # A spell is drawn at least this wide (about 5 px at the picture's width), so that a
    # 4 s outage or a 50 s unprotected span shows on a day; its label gives its true length.
    minimum = span / DAY * MIN_WIDTH
    rows = [*reversed(nodes), "service"]
    y = {name: i for i, name in enumerate(rows)}
    labels = _band_labels(tables, span)
    lines = 1 + max((line for *_, line in labels), default=0)
    height = 2.2 + 0.75 * len(rows) + LINE_POINTS / 72 * max(0, lines - 3)
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        sharex=True,
        figsize=(14, height),
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
    # Unprotected: the ACTIVE's lane striped over its lower half (the state stays readable).
    for uncertain in (False, True):
        for node in nodes:
            mine = [
                r
                for r in tables.get("unprotected", ())
                if r["node"] == node and r["uncertain"] == uncertain
            ]
            if mine:
                top.broken_barh(
                    _spans(mine, minimum),
                    (y[node] - 0.35, 0.35),
                    facecolors=UNPROTECTED,
                    edgecolor="#7a3e00",
                    linewidth=0,
                    alpha=0.5 if uncertain else 1.0,
                    hatch="xx" if uncertain else "\\\\",
                )
    # Freezes: the lane's upper half dotted dark where the process stood still.
    for node in nodes:
        frozen = [f for f in (summary.get("freezes") or {}).get("listed", ()) if f["node"] == node]
        if frozen:
            top.broken_barh(
                _spans(frozen, minimum),
                (y[node], 0.35),
                facecolors="#333333",
                edgecolor="white",
                linewidth=0,
                alpha=0.55,
                hatch="..",
            )
    service = y["service"]
    top.broken_barh([(_x(lo), span / DAY)], (service - 0.35, 0.7), facecolors=SERVING)
    for table, colour in (("outages", OUTAGE), ("dual_active", DUAL)):
        for uncertain in (False, True):
            rows_ = [r for r in tables[table] if r["uncertain"] == uncertain]
            top.broken_barh(
                _spans(rows_, minimum),
                (service - 0.35, 0.7),
                facecolors=colour,
                alpha=0.45 if uncertain else 1.0,
                hatch="xx" if uncertain else None,
            )
    for start, width in _spans(tables["outages"], minimum):
        top.axvspan(start, start + width, color=OUTAGE, alpha=0.12, lw=0)
    # The labels in the band above the service row (failovers, and outages no failover
    # explains), each on the lowest line where it overlaps no other.
    for x, text, colour, size, line in labels:
        top.annotate(
            text,
            (x, service + 0.35),
            xytext=(0, 2 + LINE_POINTS * line),
            textcoords="offset points",
            ha="left",
            fontsize=size,
            color=colour,
        )
    spans = tables.get("unprotected", ())
    for i, row in enumerate(spans if len(spans) <= LABELLED else ()):
        top.annotate(
            _short(row["duration_s"]),
            (_x(row["start"]), y[row["node"]] - 0.35),
            xytext=(2, -9 - 8 * (i % 2)),
            textcoords="offset points",
            fontsize=6,
            color="#7a3e00",
        )

    # Failovers, numbered as in the failovers table: the loss and the new ACTIVE on its lane
    # (their labels are in the band above the service row).
    for f in tables.get("failovers", ()):
        lane = y.get(f["to_node"])
        if lane is None:
            continue
        if f["lost_ts"] is not None:
            top.plot(_x(f["lost_ts"]), lane + 0.45, "kx", ms=6, mew=1.5)
        top.plot(_x(f["end"]), lane + 0.45, "k^", ms=6)
        top.axvline(_x(f["end"]), color="k", lw=0.6, ls=":", alpha=0.5)
    # Console recovers: a star on the server it was typed on (hollow when refused).
    for r in tables.get("recoveries", ()):
        if r["event"] != "console" or r["node"] not in y:
            continue
        refused = not _accepted(r, tables.get("recoveries", ()))
        top.plot(
            _x(r["ts"]),
            y[r["node"]] + 0.45,
            "*",
            ms=11,
            mec="k",
            mfc="white" if refused else "#ffd700",
            mew=0.8,
        )

    top.set_yticks(range(len(rows)), rows)
    top.set_ylim(-0.6, _band_top(service, lines, len(rows), height))
    top.set_xlim(_x(lo), _x(lo) + span / DAY)
    availability = summary["availability"]
    top.set_title(
        f"amqha failover timeline of {summary['pair']}, "
        f"{iso(lo)} .. {iso(hi)} (UTC)\n"
        + ("availability -" if availability is None else f"availability {availability:.4%}")
        + f", {summary['failovers']['count']} failover(s),"
        f" {summary['outages']['count']} outage(s) {summary['outages']['seconds']:.3f}s,"
        f" dual active {summary['dual_active']['seconds']:.3f}s,"
        + _unprotected_title(summary.get("unprotected")),
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
        Patch(facecolor=UNPROTECTED, hatch="\\\\", label="ACTIVE, no in-sync PASSIVE"),
        Patch(facecolor="#333333", alpha=0.55, hatch="..", label="frozen (paused)"),
        Patch(facecolor="#dddddd", hatch="xx", label="uncertain (clock offset)"),
        Line2D([], [], color="k", marker="x", ls="", mew=1.5, label="peer lost"),
        Line2D([], [], color="k", marker="^", ls="", label="#n failover: new ACTIVE"),
        Line2D([], [], color="k", marker="*", ls="", mfc="#ffd700", ms=10, label="console recover"),
    ]
    # Stacked bars, each at the true start of its bucket (minutes on the server's clock were
    # moved by its offset before grouping), so nothing is dropped or shifted; one collection
    # of rectangles per server, as a patch each would take seconds to draw.
    width = activity[0]["width"] if activity else 60
    base: dict[float, int] = {}
    servers = []
    for colour, node in zip(itertools.cycle(NODE_GREYS), nodes, strict=False):
        mine = [a for a in activity if a["node"] == node]
        if not mine:
            continue
        bars = []
        for a in mine:
            x0, x1 = _x(a["at"]), _x(a["at"] + width)
            y0 = base.get(a["at"], 0)
            y1 = y0 + a["redirects"] + a["refusals"]
            bars.append([(x0, y0), (x0, y1), (x1, y1), (x1, y0)])
            base[a["at"]] = y1
        bottom.add_collection(PolyCollection(bars, facecolors=colour, edgecolors="none"))
        servers.append(Patch(facecolor=colour, label=node))
    if base:
        bottom.set_ylim(0, max(base.values()) * 1.05)
    bottom.set_ylabel(f"redirects +\nrefusals\nper {width // 60} min", fontsize=8)
    bottom.set_ylim(bottom=0)
    if servers:
        bottom.legend(handles=servers, fontsize=8, loc="upper right")
    bottom.grid(alpha=0.3)
    locator = mdates.AutoDateLocator()
    bottom.xaxis.set_major_locator(locator)
    bottom.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    fig.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=7, fontsize=8)
    return fig, True


LINE_POINTS = 9  # from one line of labels to the next, in points
AXES_INCHES = 14 * 0.775  # the timeline's plotting width (the figure's, less its margins)
CHAR_WIDTH = 0.62  # a character's width in its font's size, a little more than DejaVu's mean


def label_lines(starts: Sequence[float], widths: Sequence[float], gap: float) -> list[int]:
    """The line of each label (0 the lowest): in order of their starts, each goes on the
    lowest line whose last label ends at least ``gap`` before it, or on a new line."""
    ends: list[float] = []
    lines = [0] * len(starts)
    for i in sorted(range(len(starts)), key=lambda i: (starts[i], i)):
        line = next((k for k, end in enumerate(ends) if starts[i] >= end + gap), len(ends))
        if line == len(ends):
            ends.append(-math.inf)
        ends[line] = starts[i] + widths[i]
        lines[i] = line
    return lines


def _band_labels(
    tables: Mapping[str, Sequence[Mapping[str, Any]]], span: float
) -> list[tuple[float, str, str, int, int]]:
    """The band's labels as (x, text, colour, font size, line): each failover's number,
    with its cause and client outage when there are few, at its takeover; and the length
    of each outage no failover explains (the pair's first start, one nobody ended)."""
    failovers = tables.get("failovers", ())
    few = len(failovers) <= LABELLED
    found = []
    for f in failovers:
        text = f"#{f['incident']}"
        if few:
            text += f" {f['cause']} {_short(f['outage_s'])}"
        colour = "#b00000" if f["outage_s"] else "black"
        found.append((_x(f["end"]), text, colour, 7 if few else 6))
    alone = [o for o in tables.get("outages", ()) if o.get("incident") is None]
    for o in alone if len(alone) <= LABELLED else ():
        found.append((_x(o["start"]), _short(o["duration_s"]), OUTAGE, 7))
    per_point = span / DAY / (AXES_INCHES * 72)  # date units a point of width takes
    widths = [len(text) * size * CHAR_WIDTH * per_point for _, text, _, size in found]
    lines = label_lines([x for x, *_ in found], widths, gap=3 * per_point)
    return [(*label, line) for label, line in zip(found, lines, strict=True)]


def _band_top(service: int, lines: int, rows: int, height: float) -> float:
    """The top of the lanes' y axis: room above the service row for ``lines`` lines of
    labels. The axes are about 0.77 of the figure's height (matplotlib's margins), the lanes
    ``rows`` parts of ``rows + 1.6``; a data unit is ``points / (top + 0.6)`` points."""
    points = 72 * 0.77 * height * rows / (rows + 1.6)
    need = (2 + LINE_POINTS * lines + 4) / points  # the labels' height in axes fractions
    base = service + 0.35
    return max(rows - 0.4, (base + 0.6 * need) / (1 - need))


def _short(seconds: float | None) -> str:
    """A duration as a label: 0.04s, 4.5s, 12m30s, 3h05m."""
    if seconds is None:
        return "?"
    if seconds < 10:
        return f"{seconds:.2g}s" if seconds < 1 else f"{seconds:.1f}s"
    if seconds < 600:
        return f"{seconds:.0f}s"
    if seconds < 3 * 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _accepted(console: Mapping[str, Any], recoveries: Sequence[Mapping[str, Any]]) -> bool:
    """A ``recover`` was accepted when its server handed over (MANUAL_RECOVER) right after."""
    return any(
        r["node"] == console["node"]
        and r["trigger"] == "MANUAL_RECOVER"
        and 0 <= r["ts"] - console["ts"] <= 5.0
        for r in recoveries
    )


def _unprotected_title(unprotected: Mapping[str, Any] | None) -> str:
    if not unprotected or not unprotected["recorded"]:
        return " unprotected not recorded"
    return f" unprotected {unprotected['seconds']:.3f}s"


def _clusters(incidents: Sequence[Mapping[str, Any]], gap: float) -> list[list[Mapping[str, Any]]]:
    """Incidents in time order, grouped while each is within ``gap`` of the previous one."""
    found: list[list[Mapping[str, Any]]] = []
    for incident in sorted(incidents, key=lambda i: i["lost_ts"]):
        if found and incident["lost_ts"] - found[-1][-1]["lost_ts"] <= gap:
            found[-1].append(incident)
        else:
            found.append([incident])
    return found


def fleet_marks(
    order: Sequence[str], days: Sequence[str], cells: Mapping[tuple[str, str], Mapping[str, Any]]
) -> dict[tuple[int, int], str]:
    """The text on each heat-map cell (row, column): ``u`` where the pair was unprotected
    (an ACTIVE with no in-sync PASSIVE) that day, ``?`` where a figure depends on clock
    offsets; a cell with neither has none."""
    marks: dict[tuple[int, int], str] = {}
    for i, p in enumerate(order):
        for j, day in enumerate(days):
            cell = cells.get((p, day))
            if cell is None:
                continue
            text = ("u" if (cell["unprotected_s"] or 0) > 0 else "") + (
                "?" if cell["uncertain"] else ""
            )
            if text:
                marks[(i, j)] = text
    return marks


def fleet_title(summary: Mapping[str, Any]) -> str:
    fleet = summary["fleet"]
    title = "availability per pair per day (worst first)"
    if fleet["availability"] is not None:
        title += f"; fleet {fleet['availability'] * 100:.4f}%"
    unprotected = fleet.get("unprotected") or {}
    if unprotected.get("pairs_recorded"):
        title += (
            f"\nunprotected {unprotected['seconds']:.1f} s over"
            f" {unprotected['pairs_recorded']} pair(s) with sync records"
        )
    return title


# The fleet map's scale: from 90% (1 nine) in steps of half a nine to the top step, 99.999%
# and above (100% is drawn there, at NINES_CAP).
NINES_FLOOR, NINES_TOP, NINES_CAP = 1.0, 5.5, 5.25


def nines(availability: float) -> float:
    """Availability as a count of nines: 0.99 is 2, 0.999 is 3; 100% is ``NINES_CAP``."""
    if availability >= 1.0:
        return NINES_CAP
    return min(NINES_CAP, max(0.0, -math.log10(1.0 - availability)))


def cell_figure(availability: float) -> str:
    """The figure written in a fleet map cell: as many decimals as it has nines, less one,
    cut (never rounded) so that 99.9996% does not read 100."""
    if availability >= 1.0:
        return "100"
    percent = availability * 100
    digits = min(4, max(0, math.floor(nines(availability)) - 1))
    scale = 10**digits
    return f"{math.floor(percent * scale) / scale:.{digits}f}"


def render_fleet(path: str, summary: Mapping[str, Any], daily: Sequence[Mapping[str, Any]]) -> None:
    """Availability per pair (rows, worst first) per day (columns) as a heat map whose colour
    is the count of nines (99%, 99.9%, 99.99%, ...), each cell with its figure; ``u`` if the
    pair was unprotected that day and ``?`` if a figure depends on clock offsets (see
    ``fleet_marks``). Grey: no data."""
    from matplotlib.colors import ListedColormap

    plt = _pyplot()
    pairs = summary["pairs"]
    order = sorted(
        pairs, key=lambda n: (pairs[n]["availability"] is None, pairs[n]["availability"] or 0, n)
    )
    days = sorted({d["day"] for d in daily})
    cells = {(d["pair"], d["day"]): d for d in daily}
    if not days:
        fig, ax = plt.subplots(figsize=(8, 2))
        ax.text(0.5, 0.5, "no data: no record in the window", ha="center", va="center")
        ax.set_axis_off()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return
    grid = [
        [
            math.nan
            if cells.get((p, day)) is None or cells[(p, day)]["availability"] is None
            else nines(cells[(p, day)]["availability"])
            for day in days
        ]
        for p in order
    ]
    width = max(6.0, 2.8 + 0.62 * len(days))
    height = min(1.6 + 0.3 * len(order), 60)
    fig, ax = plt.subplots(figsize=(width, height))
    # One colour per step of half a nine, red below 99% to dark green at 99.999% and above.
    steps = round((NINES_TOP - NINES_FLOOR) * 2)
    colours = plt.get_cmap("RdYlGn")([i / (steps - 1) for i in range(steps)])
    cmap = ListedColormap(colours).with_extremes(bad="#d9d9d9")
    image = ax.imshow(
        grid,
        aspect="auto",
        cmap=cmap,
        vmin=NINES_FLOOR,
        vmax=NINES_TOP,
        interpolation="nearest",
    )
    marks = fleet_marks(order, days, cells)
    size = 6 if len(days) > 14 else 7
    for i, p in enumerate(order):
        for j, day in enumerate(days):
            cell = cells.get((p, day))
            if cell is None or cell["availability"] is None:
                ax.text(j, i, "no data", ha="center", va="center", fontsize=size - 1)
                continue
            text = cell_figure(cell["availability"])
            if (i, j) in marks:
                text += f" {marks[(i, j)]}"
            dark = not 2.0 <= grid[i][j] < 4.5  # the scale's dark ends: white text
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=size,
                color="white" if dark else "black",
            )
    ax.set_yticks(range(len(order)), order, fontsize=7 if len(order) > 30 else 9)
    ax.set_xticks(range(len(days)), days, rotation=90, fontsize=7)
    ax.set_title(fleet_title(summary), fontsize=10)
    ax.set_xlabel("u: unprotected that day   ?: depends on clock offsets", fontsize=8)
    bar = fig.colorbar(
        image,
        ax=ax,
        ticks=[1, 2, 3, 4, 5],
        label="availability that day",
    )
    bar.ax.set_yticklabels(["90%", "99%", "99.9%", "99.99%", "99.999%+"])
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
