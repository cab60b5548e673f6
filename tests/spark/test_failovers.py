"""Failovers: one row per failover with its key, cause and client-visible outage, the key on
the outages and incidents it explains, failbacks counted once each, and a window with no
record giving no figure. Known answers from the reference, then the Spark job equal to it.

Times are seconds after ``T0``; the stories are in ``tests.spark.scenarios``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from spark import job, reference
from spark.cli import report
from spark.model import TABLES
from spark.text import render_text
from tests.spark import scenarios
from tests.spark.compare import assert_same_report, same
from tests.spark.logs import T0, Server

PAIR = "backup+primary"

# scenario: [(cause, evidence, from, to, start, end, outage, least, most, dual active)]
FAILOVERS = {
    # The process is gone (its port refused): it served until its last message at most
    # and was gone by the loss.
    "killed_refused": [
        ("crash", "refused", "primary", "backup", 9.5, 10.5, 0.3, 0.3, 1.0, 0.0),
    ],
    # A host gone dark: only silence; it may have served until the loss at 12.5 s.
    "host_silent": [
        ("silence", "silence", "primary", "backup", 9.5, 14.0, 1.5, 1.5, 4.5, 0.0),
    ],
    # Both alive: the primary logs on through the loss and serves; no outage, dual active.
    "link_cut_silence": [
        ("cut link", "silence", "primary", "backup", 12.5, 15.0, 0.0, 0.0, 0.0, 5.02),
    ],
    # An ACTIVE that stops serving when it loses its witness and peer: its fence ends what
    # it can confirm (12.6 s), though it stays up.
    "witnessed_cut": [
        ("cut link", None, "primary", "backup", 12.5, 14.0, 1.4, 1.4, 1.4, 6.0),
    ],
    "clean_stop": [
        ("stopped", "refused", "primary", "backup", 10.0, 10.3, 0.3, 0.3, 0.3, 0.0),
    ],
    "forced_dual": [
        ("dual active", None, "primary", "backup", 10.0, 10.0, 0.0, 0.0, 0.0, 2.0),
    ],
    # A loss logged before the field existed is a timeout: the only way there was.
    "console_recovery": [
        ("silence", None, "primary", "backup", 9.5, 14.0, 1.5, 1.5, 4.5, 0.0),
        ("manual", None, "backup", "primary", 45.01, 45.05, 0.04, 0.04, 0.04, 0.0),
    ],
    # A loss healed before the takeover (both heard again) led to none: the switchover
    # starts at its own handover, with no loss, evidence or takeover delay.
    "healed_blip_switchover": [
        ("switchover", None, "primary", "backup", 20.0, 20.03, 0.03, 0.03, 0.03, 0.0),
    ],
    # Frozen, not dead: it served nothing from its last tick (10 s), the gap's start.
    "frozen_active": [
        ("freeze", "silence", "primary", "backup", 9.95, 14.0, 4.0, 4.0, 4.05, 0.0),
    ],
    # Every takeover a row: two freezes and the SIGTERM between them; the zombie's dual
    # active (30 .. 60) is the first freeze's, never more than the pair's.
    "zombie_day": [
        ("freeze", "silence", "primary", "backup", 9.95, 14.0, 4.0, 4.0, 4.05, 30.0),
        ("stopped", "refused", "primary", "backup", 80.0, 80.5, 0.5, 0.5, 0.5, 0.0),
        ("freeze", None, "backup", "primary", 99.95, 104.0, 4.0, 4.0, 4.05, 0.0),
    ],
    "three_recovers": [
        row
        for k in range(3)
        for row in (
            ("crash", "refused", "primary", "backup", 100 * k + 9.5, 100 * k + 10.5, 0.3, 0.3)
            + (1.0, 0.0),
            ("manual", None, "backup", "primary", 100 * k + 45.01, 100 * k + 45.05, 0.04)
            + (0.04, 0.04, 0.0),
        )
    ],
}


def _write(name: str, folder: Path) -> list[str]:
    return [str(server.write(folder)) for server in getattr(scenarios, name)()]


@pytest.mark.parametrize("name", FAILOVERS)
def test_each_cause_has_its_known_answer(name: str, tmp_path: Path) -> None:
    report = reference.compute(_write(name, tmp_path), estimate_skew=False)
    rows = report.tables["failovers"]
    same(
        [
            (
                f["cause"],
                f["evidence"],
                f["from_node"],
                f["to_node"],
                f["start"] - T0,
                f["end"] - T0,
                f["outage_s"],
                f["min_outage_s"],
                f["max_outage_s"],
                f["dual_active_s"],
            )
            for f in rows
        ],
        FAILOVERS[name],
        name,
    )
    assert [f["incident"] for f in rows] == list(range(1, len(rows) + 1))
    for f in rows:
        assert f["uncertain"] == (f["max_outage_s"] - f["min_outage_s"] > 0.01)
    summary = report.summary["pairs"][PAIR]["failovers"]
    assert summary["count"] == len(rows)
    assert sum(summary["by_cause"].values()) == len(rows)
    daily = report.tables["daily"]
    same(sum(d["client_outage_s"] for d in daily), sum(f["outage_s"] for f in rows), "daily")
    assert sum(d["failovers"] for d in daily) == len(rows)


def test_every_takeover_has_one_row_and_the_counts_agree(tmp_path: Path) -> None:
    """Each transition to ACTIVE after the pair's first start is one row, whoever was ACTIVE
    just before (a freeze's zombie, a SIGTERM between two freezes); the summary, the days and
    the takeover figures count the same rows; a row's dual active is its own spell's."""
    servers = scenarios.zombie_day()
    paths = [str(server.write(tmp_path)) for server in servers]
    report = reference.compute(paths, estimate_skew=False)
    rows = report.tables["failovers"]
    transitions = sorted(
        (round(r["ts"] - T0, 3), r["node"])
        for server in servers
        for r in map(json.loads, server.lines)
        if r["event"] == "transition" and r["to"] == "ACTIVE" and r["trigger"] != "PEER_BACKUP"
    )
    assert sorted((round(f["end"] - T0, 3), f["to_node"]) for f in rows) == transitions
    pair = report.summary["pairs"][PAIR]
    assert pair["failovers"]["count"] == len(rows) == 3
    assert pair["failovers"]["by_cause"]["freeze"] == 2
    assert pair["failovers"]["by_cause"]["stopped"] == 1
    assert sum(d["failovers"] for d in report.tables["daily"]) == len(rows)
    delays = report.summary["fleet"]["takeover_delay_s"]
    assert delays["count"] == sum(1 for f in rows if f["takeover_delay_s"] is not None) == 3
    text = render_text(report.summary, report.tables)
    assert "failovers   3: freeze 2, stopped 1" in text
    assert "(3 of 3 failover(s), those with a peer lost)" in text
    assert "freeze (silence, gap 20.000s)" in text
    freezes = pair["freezes"]
    same(
        [(f["node"], f["start"] - T0, f["end"] - T0) for f in freezes["listed"]],
        [("primary", 10.0, 30.0), ("backup", 100.0, 120.02)],
        "freezes",
    )
    same(freezes["seconds"], 40.02, "freezes")
    assert "freezes     2, 40.020s in all" in text
    total = pair["dual_active"]["seconds"]
    same(total, 30.0, "dual active")
    assert all(f["dual_active_s"] <= total for f in rows)
    same(sum(f["dual_active_s"] for f in rows), total, "dual active of the rows")
    # The frozen ACTIVE served nothing: each freeze up to its takeover is an outage of its
    # failover (the frozen primary's gap after the takeover is not dual active).
    outages = [(o["start"] - T0, o["end"] - T0, o["incident"]) for o in report.tables["outages"]]
    same(
        outages,
        [(0.0, 1.01, None), (10.0, 14.0, 1), (80.0, 80.5, 2), (100.0, 104.0, 3)],
        "outages",
    )


def test_outages_and_incidents_carry_the_failover_key(tmp_path: Path) -> None:
    """The outage a failover caused and the loss that led to it carry its key; the pair's
    first start (no server ACTIVE yet) is an outage of no failover."""
    tables = reference.compute(_write("three_recovers", tmp_path), estimate_skew=False).tables
    assert [(round(o["start"] - T0, 2), o["incident"]) for o in tables["outages"]] == [
        (0.0, None),
        (9.5, 1),
        (45.01, 2),
        (109.5, 3),
        (145.01, 4),
        (209.5, 5),
        (245.01, 6),
    ]
    assert [i["incident"] for i in tables["incidents"]] == [1, 3, 5]


def test_three_recovers_count_three_failbacks(tmp_path: Path) -> None:
    """A ``recover`` writes three records (the command, the backup's MANUAL_RECOVER, the
    primary's HANDOVER); the day counts one failback for it."""
    report = reference.compute(_write("three_recovers", tmp_path), estimate_skew=False)
    (day,) = report.tables["daily"]
    assert (day["recoveries"], day["recover_commands"], day["failovers"]) == (3, 3, 6)
    assert len(report.tables["recoveries"]) == 9  # every record is still listed
    refused = reference.compute(_write("console_recovery", tmp_path / "c")).tables["daily"]
    assert [(d["recoveries"], d["recover_commands"]) for d in refused] == [(1, 2)]


def test_the_text_lists_every_failover_and_hides_no_row(tmp_path: Path) -> None:
    report = reference.compute(_write("three_recovers", tmp_path), estimate_skew=False)
    text = render_text(report.summary, report.tables)
    for k in range(1, 7):
        assert f"#{k} " in text
    assert "crash (refused)" in text and "manual" in text
    assert "more in" not in text and "..." not in text.replace(" .. ", "")


def test_a_window_with_no_record_gives_no_figure(tmp_path: Path) -> None:
    paths = _write("console_recovery", tmp_path)
    report = reference.compute(paths, since=T0 - 10 * 86400, until=T0 - 9 * 86400)
    pair = report.summary["pairs"][PAIR]
    assert pair["no_data"] and pair["availability"] is None
    assert report.summary["fleet"]["availability"] is None
    assert report.summary["fleet"]["no_data_pairs"] == [PAIR]
    assert all(not rows for rows in report.tables.values())
    assert any("no data" in w for w in report.summary["warnings"])
    text = render_text(report.summary, report.tables)
    assert "NO DATA" in text and "0.0000%" not in text


def test_a_window_before_the_logs_warns_that_it_counts_as_an_outage(tmp_path: Path) -> None:
    paths = _write("console_recovery", tmp_path)
    report = reference.compute(paths, since=T0 - 100)
    assert not report.summary["pairs"][PAIR]["no_data"]
    assert any("starts 100s before" in w for w in report.summary["warnings"])


@pytest.mark.spark
@pytest.mark.parametrize("name", FAILOVERS)
def test_spark_equals_reference_on_failovers(
    name: str, tmp_path: Path, spark_session, whole
) -> None:
    paths = _write(name, tmp_path)
    assert_same_report(job.compute(spark_session, paths, whole=whole), reference.compute(paths))


@pytest.mark.spark
def test_spark_equals_reference_on_a_window_without_records(
    tmp_path: Path, spark_session, whole
) -> None:
    paths = _write("console_recovery", tmp_path)
    window = {"since": T0 - 10 * 86400, "until": T0 - 9 * 86400}
    assert_same_report(
        job.compute(spark_session, paths, whole=whole, **window),
        reference.compute(paths, **window),
    )


def _named(folder: Path, pair: str, story: str) -> None:
    for server in getattr(scenarios, story)():
        named = Server(server.name, server.role, pair=pair)
        named.lines = [line[:-1] + f', "pair": "{pair}"}}' for line in server.lines]
        named.write(folder / pair)


@pytest.mark.spark
def test_cli_draws_each_pair_and_writes_the_pages(tmp_path: Path, spark_session) -> None:
    """Two pairs and no --pair: a timeline each, named after it, and the run says so;
    summary.md and a report.html with its pictures inside; ISO times beside epoch ones;
    failovers.csv."""
    _named(tmp_path / "logs", "eu-1", "three_recovers")
    _named(tmp_path / "logs", "eu-2", "link_cut_silence")
    out = tmp_path / "out"
    args = ["--events", str(tmp_path / "logs"), "--out", str(out), "--no-skew-estimate"]
    result = CliRunner().invoke(report, args)
    assert result.exit_code == 0, result.output
    for pair in ("eu-1", "eu-2"):
        assert (out / f"timeline-{pair}.png").read_bytes()[:4] == b"\x89PNG"
        assert f"timeline-{pair}.png" in result.stderr
    assert not (out / "timeline.png").exists()
    md = (out / "summary.md").read_text()
    assert "| eu-1 | 6 |" in md and "cut link" in md
    assert "## Dual active" in md and "| eu-2 | 1 |" in md and "| 5.020 |" in md
    assert "## Quarantines" in md and "Dual active" in (out / "report.html").read_text()
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3 and "cut link" in page
    with open(out / "failovers" / "failovers.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert [(r["pair"], r["incident"], r["cause"]) for r in rows] == [
        ("eu-1", str(k), "crash" if k % 2 else "manual") for k in range(1, 7)
    ] + [("eu-2", "1", "cut link")]
    assert rows[0]["start_iso"] == "2023-11-14T22:13:29.500Z"
    columns = [c for c, _ in TABLES["failovers"][0]]
    assert list(rows[0]) == [
        h for c in columns for h in ((c, f"{c}_iso") if c in ("start", "end", "lost_ts") else (c,))
    ]


@pytest.mark.spark
def test_cli_warns_on_stderr_of_a_window_without_records(tmp_path: Path, spark_session) -> None:
    _write("console_recovery", tmp_path / "logs")
    out = tmp_path / "out"
    args = ["--events", str(tmp_path / "logs"), "--out", str(out), "--since", "2020-01-01"]
    args += ["--until", "2020-01-02", "-q"]
    result = CliRunner().invoke(report, args)
    assert result.exit_code == 0, result.output
    assert "warning" in result.stderr and "no data" in result.stderr
    assert "0.0000%" not in result.stdout and "NO DATA" in result.stdout
    assert "no data" in (out / "summary.md").read_text()
    assert "NO DATA" in (out / "summary.txt").read_text()
