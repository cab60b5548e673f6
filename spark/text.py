"""The report's summary as text: what ``amqha report`` prints and writes to summary.txt.

Owns: the summary's text (each pair in detail when there are few, then the fleet), one line
per failover, outage, dual-active or unprotected spell, incident and quarantine, and the
words ``spark.pages`` shares with it (a failover's evidence, what the takeover figures
cover). Must not know Spark, files or how the figures are computed: it reads the summary
and the tables (docs/report.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spark.model import REPORT_STATES, iso


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
    if u["planned_seconds"]:
        text += (
            f"; planned (a server in maintenance) {u['planned_seconds']:.3f}s,"
            f" unplanned {u['unplanned_seconds']:.3f}s"
        )
    return text


def _clock_lines(p: Mapping) -> list[str]:
    lines = []
    for node, o in p["clock_offsets"].items():
        seconds = round(o["seconds"], 6) + 0.0  # no "-0.000000"
        text = f"    clock       {node}: {seconds:+.6f}s ({o['source']})"
        if not o["known"]:
            text += f", NOT KNOWN: between {_bound(o['lower'])} and {_bound(o['upper'])}"
        lines.append(text)
    return lines


def _spell_lines(p: Mapping) -> list[str]:
    """Availability with its outages, dual active and unprotected time."""
    availability = _percent(p["availability"])
    if p["min_availability"] != p["max_availability"]:
        availability += (
            f" (between {_percent(p['min_availability'])} and {_percent(p['max_availability'])})"
        )
    out, dual = p["outages"], p["dual_active"]
    return [
        f"    availability {availability}  (outages: {out['count']}, {out['seconds']:.3f}s total,"
        f" longest {_seconds(out['longest_s'])}"
        + (f", {out['uncertain']} uncertain" if out["uncertain"] else "")
        + ")",
        f"    dual active {dual['count']} interval(s), {dual['seconds']:.3f}s"
        + (
            f", {dual['uncertain']} uncertain, up to {dual['max_seconds']:.3f}s"
            if dual["uncertain"]
            else ""
        )
        + f" ({dual['events']} dual_active event(s))",
        f"    unprotected {_unprotected_text(p['unprotected'])}",
    ]


def _pause_lines(p: Mapping) -> list[str]:
    """Freezes, quarantines and the witness, each when there is any."""
    lines = []
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
    return lines


def _incident_text(row: Mapping) -> str:
    return (
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
    )


def _quarantine_text(r: Mapping) -> str:
    return (
        f"      quarantine {iso(r['ts'])} {r['node']}: {r['messages']} message(s)"
        f" in {r['path']}" + (f" ({r['replayed']})" if r.get("replayed") else "")
    )


def _event_lines(p: Mapping, mine: Mapping[str, Sequence[Mapping]]) -> list[str]:
    """Failovers and incidents counted, then the pair's rows of each spell table."""
    fo, inc = p["failovers"], p["incidents"]
    lines = [
        f"    failovers   {fo['count']}: "
        + ", ".join(f"{c} {n}" for c, n in fo["by_cause"].items() if n)
        + (f"; client outage {fo['outage_seconds']:.3f}s in all" if fo["count"] else "")
    ]
    lines.extend(_listed(mine["failovers"], "failovers", lambda row: "      " + failover_text(row)))
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
    lines.extend(_listed(mine["incidents"], "incidents", _incident_text))
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
    lines.extend(_listed(mine["quarantines"], "quarantines", _quarantine_text))
    return lines


def _state_lines(p: Mapping) -> list[str]:
    """Time in each state, redirects and refusals, recoveries and misconfigurations."""
    lines = ["    time in state"]
    for node, states in p["state_seconds"].items():
        lines.append(
            f"      {node:<10} "
            + "  ".join(f"{state} {states.get(state, 0.0):.3f}s" for state in REPORT_STATES)
        )
    rec = p["manual_recoveries"]
    lines.append(f"    redirects   {p['redirects']}, refusals {p['refusals']}")
    lines.append(
        f"    recoveries  {rec['manual_recover_transitions']} failback(s) done,"
        f" {rec['recover_commands']} recover command(s), {rec['switchovers']} planned"
        f" switchover(s), {rec['handovers']} handover(s);"
        f" misconfigurations {p['misconfigurations']}"
    )
    return lines


def _pair_text(p: Mapping, tables: Mapping[str, Sequence[Mapping]]) -> list[str]:
    name = p["pair"]
    mine = {t: [r for r in rows if r["pair"] == name] for t, rows in tables.items()}
    lines = [f"  pair {name}: {', '.join(p['nodes'])}; {p['events']} events"]
    w = p["window"]
    lines.append(f"    window      {iso(w['since'])} .. {iso(w['until'])} ({w['seconds']:.3f}s)")
    if p.get("no_data"):
        lines.append("    NO DATA     no record of this pair in the window: no figure")
        return lines
    return [
        *lines,
        *_clock_lines(p),
        *_spell_lines(p),
        *_pause_lines(p),
        *_event_lines(p, mine),
        *_state_lines(p),
    ]


def takeovers_of(takeovers: int, failovers: int) -> str:
    """How many failovers the takeover figures cover: those a loss led to (the others, a
    manual one or a dual active, have no loss to time them from)."""
    return f"{takeovers} of {failovers} failover(s), those with a peer lost"


def _input_lines(summary: Mapping) -> list[str]:
    lines = [
        f"  input       {len(summary['files'])} file(s), {summary['events']} events,"
        f" {summary['bad_lines']} bad line(s)"
    ]
    if len(summary["files"]) > LISTED_ROWS:
        lines.append("    (every file read is listed in summary.json)")
    else:
        lines.extend(f"    {f}" for f in summary["files"])
    return lines


def _fleet_lines(fleet: Mapping, pairs: int) -> list[str]:
    """The fleet's failovers, figures, unprotected time, quarantines and takeover delays."""
    lines = []
    failovers = fleet["failovers"]
    if pairs > 1:
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
            f" over {unprotected['pairs_recorded']} pair(s) with sync records, planned"
            f" {unprotected['planned_seconds']:.3f}s (a server in maintenance)"
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
    return lines


def _worst_lines(fleet: Mapping) -> list[str]:
    lines = ["  worst pairs"]
    for w in fleet["worst"]:
        unprotected_s = w["unprotected_seconds"]
        lines.append(
            f"    {w['pair']:<24} {_percent(w['availability'])}"
            f" outage {w['outage_seconds']:.3f}s dual active {w['dual_active_seconds']:.3f}s"
            " unprotected " + ("not recorded" if unprotected_s is None else f"{unprotected_s:.3f}s")
        )
    return lines


def _slo_lines(slo: Mapping) -> list[str]:
    lines = [
        f"  slo {slo['target_percent']}%  {len(slo['breaches'])} pair-day(s) broke it,"
        f" {len(slo['possible_breaches'])} may have"
    ]
    if len(slo["breaches"]) > LISTED_ROWS:
        lines.append("    (every one is listed in summary.md and summary.json)")
    else:
        for b in slo["breaches"]:
            lines.append(f"    {b['pair']} {b['day']} {_percent(b['availability'])}")
    return lines


def render_text(summary: Mapping, tables: Mapping[str, Sequence[Mapping]]) -> str:
    """The human summary printed on stdout: each pair in detail when there are few, then the
    fleet."""
    lines = ["amqha failover report", *_input_lines(summary)]
    pairs = summary["pairs"]
    if len(pairs) <= DETAILED_PAIRS:
        for p in pairs.values():
            lines.extend(_pair_text(p, tables))
    fleet = summary["fleet"]
    lines.extend(_fleet_lines(fleet, len(pairs)))
    if len(pairs) > 1:
        lines.extend(_worst_lines(fleet))
    if fleet["uncertain_pairs"]:
        lines.append(
            "  uncertain   figures of "
            + ", ".join(fleet["uncertain_pairs"])
            + " depend on clock offsets the logs do not pin down (see clock lines)"
        )
    if fleet["slo"] is not None:
        lines.extend(_slo_lines(fleet["slo"]))
    for warning in summary["warnings"]:
        lines.append(f"  warning: {warning}")
    return "\n".join(lines) + "\n"
