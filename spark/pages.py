"""The report as pages for people: ``summary.md`` and a self-contained ``report.html``.

Owns: the summary and the small tables laid out as one document (warnings first, the fleet,
each pair, every failover, every dual-active spell, every quarantine, the pictures), rendered as Markdown and as HTML whose pictures are
embedded as base64 ``data:`` URIs, so the one file can be mailed or attached to a ticket.
Computes nothing (the figures are ``spark.metrics``'), reads no file but the pictures it is
given; must not know Spark.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark.model import iso
from spark.text import failover_why, takeovers_of

Table = tuple[list[str], list[list[str]]]  # header, rows of cells


@dataclass
class Section:
    title: str
    lines: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    pictures: list[tuple[str, str]] = field(default_factory=list)  # (caption, file name)


NA = "—"  # a cell that does not apply

# What each figure means, in a reader's words (the definitions: README, "What the figures mean").
GLOSSARY = (
    "**Availability**: the share of the window with a server of the pair ACTIVE."
    " **Outage**: no server ACTIVE, including a pair's start before its first server leads"
    " (the short outage at the start of a pair's logs). The Pairs table's range is the"
    " availability the servers' clock offsets allow; blank when the clocks leave no doubt.",
    "**Cause** of a failover: `crash` (the old ACTIVE's process was gone: with `refused`, the"
    " survivor found its port refusing), `freeze` (the old ACTIVE's process was stopped"
    " without dying, a VM paused or SIGSTOP: it logged the gap when it ran again, shown after"
    " the cause), `silence` (nothing heard from it for the peer"
    " timeout; it may have been frozen or cut off), `cut link` (both servers lived through it:"
    " the link between them was cut; clients on the old ACTIVE's side may have been served"
    " by both, shown as dual active), `switchover` (planned: `console switchover` drained the"
    " old ACTIVE and handed over), `manual` (`console recover` or `promote`), `stopped` (the"
    " old ACTIVE was stopped cleanly), `dual active` (the new ACTIVE took over while the old"
    " one was still ACTIVE, with no loss logged), `unknown` (no rule fits).",
    "**Detection**: from the old ACTIVE's last state message to the survivor's `peer lost`."
    " **Takeover**: from `peer lost` to the survivor becoming ACTIVE (the takeover"
    " percentiles count these, so manual failovers are not in them). **Failbacks**: `console"
    " recover` commands that handed the service back to the primary.",
    "**Dual active**: two servers ACTIVE at once, each confirming its own clients: what one"
    " accepted alone is quarantined when they meet. **Quarantine**: the messages a server"
    " accepted that its peer never had, kept in the file named for `amqha quarantine replay`;"
    " whether they were replayed is what the report's host sees of that file (a replay"
    " writes no log record).",
    "**Unprotected**: an ACTIVE with no in-sync PASSIVE (what it confirms is on one disk"
    " only). `not recorded`: the logs have no sync records, so no figure (not 0).",
    "**Timelines**: a lane per server coloured by state; the service row red where no server"
    " was ACTIVE and purple where two were; `#n` above it numbers the failovers as in the"
    " table, with their cause and client outage; the hatched orange spans, labelled with"
    " their length, are unprotected time; a dark dotted band on a lane is a freeze (the"
    " process stood still: it served nothing); a star is a `console recover` (hollow when"
    " refused); short spans are drawn wider than their length so that they show.",
)


def _s(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "no data" if value is None else f"{value * 100:.4f}%"


def _range(least: float | None, most: float | None) -> str:
    if least is None and most is None:
        return ""
    return f"{_s(least)} .. {'unbounded' if most is None else _s(most)}"


def document(
    summary: Mapping[str, Any],
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    pictures: Sequence[tuple[str, str]],
) -> list[Section]:
    """The report's sections, in reading order."""
    pairs = summary["pairs"]
    fleet = summary["fleet"]
    head = Section("amqha failover report")
    window = summary["window"]
    head.lines.append(
        f"Window {iso(window['since'])} .. {iso(window['until'])} (UTC);"
        f" {len(summary['files'])} file(s), {summary['events']} event(s),"
        f" {summary['bad_lines']} bad line(s)."
    )
    for warning in summary["warnings"]:
        head.lines.append(f"**Warning**: {warning}")
    sections = [head]

    by_cause = ", ".join(f"{c} {n}" for c, n in fleet["failovers"]["by_cause"].items() if n)
    delays = fleet["takeover_delay_s"]
    top = Section("Fleet")
    top.lines.append(
        f"{fleet['pairs']} pair(s); availability {_pct(fleet['availability'])};"
        f" outages {fleet['outage_seconds']:.3f} s; dual active"
        f" {fleet['dual_active_seconds']:.3f} s; {fleet['failovers']['count']} failover(s)"
        + (f" ({by_cause})" if by_cause else "")
        + f", client outage {fleet['failovers']['outage_seconds']:.3f} s in all;"
        f" {fleet['quarantines']['count']} quarantine(s),"
        f" {fleet['quarantines']['messages']} message(s) quarantined."
    )
    top.lines.append(
        f"Takeover delay p50 {_s(delays['p50'])} s, p90 {_s(delays['p90'])} s,"
        f" p99 {_s(delays['p99'])} s, max {_s(delays['max'])} s"
        f" ({takeovers_of(delays['count'], fleet['failovers']['count'])})."
    )
    if fleet["no_data_pairs"]:
        top.lines.append(
            "**No data** (no record in the window, so no figure): "
            + ", ".join(fleet["no_data_pairs"])
        )
    slo = fleet["slo"]
    if slo is not None:
        top.lines.append(
            f"Objective {slo['target_percent']}%: {len(slo['breaches'])} pair-day(s) below it,"
            f" {len(slo['possible_breaches'])} possibly below."
        )
        if slo["breaches"]:
            top.tables.append(
                (
                    ["pair", "day", "availability"],
                    [[b["pair"], b["day"], _pct(b["availability"])] for b in slo["breaches"]],
                )
            )
    sections.append(top)

    rows = []
    for name, p in pairs.items():
        u = p["unprotected"]
        rows.append(
            [
                name,
                "no data" if p.get("no_data") else _pct(p["availability"]),
                ""
                if p["min_availability"] == p["max_availability"]
                else f"{_pct(p['min_availability'])} .. {_pct(p['max_availability'])}",
                str(p["outages"]["count"]),
                _s(p["outages"]["seconds"]),
                str(p["failovers"]["count"]),
                _s(p["failovers"]["outage_seconds"]),
                _s(p["dual_active"]["seconds"]),
                str(p["quarantines"]["messages"]),
                "not recorded" if not u["recorded"] else _s(u["seconds"]),
                str(p["manual_recoveries"]["manual_recover_transitions"]),
            ]
        )
    section = Section("Pairs")
    section.tables.append(
        (
            [
                "pair",
                "availability",
                "range",
                "outages",
                "outage s",
                "failovers",
                "client outage s",
                "dual active s",
                "quarantined",
                "unprotected s",
                "failbacks",
            ],
            rows,
        )
    )
    sections.append(section)

    failovers = Section("Failovers")
    failovers.lines.append(
        "One row per failover, numbered per pair as on the timelines (# is the `incident` key"
        " of failovers.csv, outages.csv and incidents.csv, files written beside this page)."
        " Client outage: what the logs prove, from the latest moment the old ACTIVE could"
        " have confirmed (its transition or stop, the gap's start of a freeze, the survivor's"
        " loss of a crashed one) to the new ACTIVE's takeover; the range runs to the longest"
        " the logs allow (from the old ACTIVE's last sign of life) when the two differ. A"
        " client that reconnects late sees more. A dash: does not apply (no dual active; no"
        " detection or takeover in a manual failover)."
    )
    failovers.tables.append(
        (
            [
                "pair",
                "#",
                "start (UTC)",
                "end (UTC)",
                "from",
                "to",
                "cause",
                "client outage s",
                "range s",
                "dual active s",
                "detection s",
                "takeover s",
            ],
            [
                [
                    f["pair"],
                    str(f["incident"]),
                    iso(f["start"]),
                    iso(f["end"]),
                    f["from_node"],
                    f["to_node"],
                    f["cause"] + failover_why(f),
                    _s(f["outage_s"]),
                    _range(f["min_outage_s"], f["max_outage_s"]) if f["uncertain"] else NA,
                    _s(f["dual_active_s"]) if f["dual_active_s"] else NA,
                    _s(f["detection_delay_s"]) or NA,
                    _s(f["takeover_delay_s"]) or NA,
                ]
                for f in tables.get("failovers", ())
            ],
        )
    )
    sections.append(failovers)
    sections.append(_dual_active(pairs, tables))
    sections.append(_quarantines(tables))
    sections.append(Section("How to read this", lines=list(GLOSSARY)))
    if pictures:
        sections.append(Section("Pictures", pictures=list(pictures)))
    return sections


def _dual_active(
    pairs: Mapping[str, Mapping[str, Any]], tables: Mapping[str, Sequence[Mapping[str, Any]]]
) -> Section:
    section = Section("Dual active")
    section.lines.append(
        "Every spell with two servers ACTIVE at once (dual_active.csv), with the failover it"
        " followed (#). Per pair: "
        + "; ".join(
            f"{name} {p['dual_active']['count']} spell(s), {p['dual_active']['seconds']:.3f} s"
            for name, p in pairs.items()
        )
        + "."
    )
    section.tables.append(
        (
            ["pair", "#", "start (UTC)", "end (UTC)", "seconds", "range s"],
            [
                [
                    d["pair"],
                    NA if d["incident"] is None else str(d["incident"]),
                    iso(d["start"]),
                    iso(d["end"]),
                    _s(d["duration_s"]),
                    _range(d["min_duration_s"], d["max_duration_s"]) if d["uncertain"] else NA,
                ]
                for d in tables.get("dual_active", ())
            ],
        )
    )
    return section


def _quarantines(tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> Section:
    section = Section("Quarantines")
    rows = tables.get("quarantines", ())
    section.lines.append(
        f"{len(rows)} quarantine file(s), {sum(q['messages'] or 0 for q in rows)} message(s):"
        " what a server had accepted that its peer never had, kept for `amqha quarantine"
        " replay FILE --url URL` (quarantines.csv)."
    )
    section.tables.append(
        (
            ["pair", "time (UTC)", "server", "messages", "file", "replayed"],
            [
                [
                    q["pair"],
                    iso(q["ts"]),
                    q["node"],
                    NA if q["messages"] is None else str(q["messages"]),
                    q["path"] or NA,
                    q.get("replayed") or NA,
                ]
                for q in rows
            ],
        )
    )
    return section


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(sections: Sequence[Section]) -> str:
    out: list[str] = []
    for i, section in enumerate(sections):
        out.append(("# " if i == 0 else "## ") + section.title)
        out.append("")
        for line in section.lines:
            out.extend([line, ""])
        for header, rows in section.tables:
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" * len(header))
            out.extend("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows)
            if not rows:
                out.append("| " + " | ".join(["none"] + [""] * (len(header) - 1)) + " |")
            out.append("")
        for caption, name in section.pictures:
            out.extend([f"![{caption}]({name})", ""])
    return "\n".join(out)


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }
th { background: #eee; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0 1.5em; }
p.warning { color: #a00; }
"""


def _inline(text: str) -> str:
    escaped = html.escape(text)
    while escaped.count("**") >= 2:
        escaped = escaped.replace("**", "<strong>", 1).replace("**", "</strong>", 1)
    while escaped.count("`") >= 2:
        escaped = escaped.replace("`", "<code>", 1).replace("`", "</code>", 1)
    return escaped


def _numeric(text: str) -> bool:
    try:
        float(text.rstrip("%"))
    except ValueError:
        return False
    return True


def page(sections: Sequence[Section], folder: str) -> str:
    """The report as one HTML page; its pictures (files in ``folder``) embedded."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(sections[0].title)}</title><style>{_STYLE}</style></head><body>",
    ]
    for i, section in enumerate(sections):
        tag = "h1" if i == 0 else "h2"
        out.append(f"<{tag}>{html.escape(section.title)}</{tag}>")
        for line in section.lines:
            kind = ' class="warning"' if line.startswith("**Warning**") else ""
            out.append(f"<p{kind}>{_inline(line)}</p>")
        for header, rows in section.tables:
            out.append(
                "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
            )
            for row in rows:
                out.append(
                    "<tr>"
                    + "".join(
                        f"<td{' class=n' if _numeric(c) else ''}>{html.escape(c)}</td>" for c in row
                    )
                    + "</tr>"
                )
            if not rows:
                out.append(f'<tr><td colspan="{len(header)}">none</td></tr>')
            out.append("</table>")
        for caption, name in section.pictures:
            with open(os.path.join(folder, name), "rb") as stream:
                data = base64.b64encode(stream.read()).decode("ascii")
            out.append(f"<h3>{html.escape(caption)}</h3>")
            out.append(f'<img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write(
    folder: str,
    summary: Mapping[str, Any],
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    pictures: Sequence[tuple[str, str]],
) -> None:
    """``summary.md`` and ``report.html`` in ``folder``, beside the pictures."""
    sections = document(summary, tables, pictures)
    with open(os.path.join(folder, "summary.md"), "w", encoding="utf-8") as stream:
        stream.write(markdown(sections))
    with open(os.path.join(folder, "report.html"), "w", encoding="utf-8") as stream:
        stream.write(page(sections, folder))
