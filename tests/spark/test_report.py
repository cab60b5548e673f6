"""The failover report on hand-built logs: the reference gives the answers worked out by hand
below, and the Spark job gives exactly the reference's tables and summary.

Times are seconds after ``T0``; the scenarios are described in ``tests.spark.scenarios``.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from spark import job, output, reference
from spark.model import REPORT_STATES, ReportError, UnknownVersionError
from spark.text import render_text
from tests.spark import scenarios
from tests.spark.compare import assert_same_report, same, spark_tables
from tests.spark.logs import T0

MINUTE_0 = 1_699_999_980  # the minute holding T0 .. T0 + 40 s
MINUTE_1 = 1_700_000_040  # T0 + 40 s .. T0 + 100 s


@dataclass
class Known:
    """A scenario's answers, worked out by hand from its story."""

    window: float
    availability: float
    outages: list[tuple[float, float]]
    state_seconds: dict[str, dict[str, float]]
    incidents: list[tuple]  # node, peer, detection, outcome, takeover, trigger
    per_minute: list[tuple]  # node, minute start, redirects, refusals
    events: int
    dual_active: list[tuple[float, float]] = field(default_factory=list)
    recoveries: list[tuple] = field(default_factory=list)  # at, node, event, trigger
    misconfigurations: int = 0
    dual_active_events: int = 0
    bad_lines: int = 0


def write(servers, folder: Path) -> list[str]:
    return [str(server.write(folder)) for server in servers]


CASES = {
    # Primary killed at ~10 s (last heard 9.5 s): DOWN from then, as the backup's peer_lost
    # says; outage until the client vote makes the backup ACTIVE at 14 s.
    "crash_takeover": Known(
        window=20.0,
        availability=1 - (1.01 + 4.5) / 20,
        outages=[(0.0, 1.01), (9.5, 14.0)],
        state_seconds={
            "primary": {"PRIMARY": 1.01, "ACTIVE": 8.49, "DOWN": 10.5},
            "backup": {"DOWN": 0.5, "BACKUP": 0.6, "PASSIVE": 12.9, "ACTIVE": 6.0},
        },
        incidents=[("backup", "primary", 3.0, "takeover", 1.5, "CLIENT_REQUEST")],
        per_minute=[("backup", MINUTE_0, 2, 0)],
        events=11,
    ),
    # Then the primary restarts at 30 s (DOWN 9.5 .. 30), PRIMARY until it sees the ACTIVE
    # backup and goes PASSIVE at 31.01 s; stopped at 58 s.
    "restart_passive": Known(
        window=60.0,
        availability=1 - (1.01 + 4.5) / 60,
        outages=[(0.0, 1.01), (9.5, 14.0)],
        state_seconds={
            "primary": {"PRIMARY": 2.02, "ACTIVE": 8.49, "DOWN": 20.5 + 2.0, "PASSIVE": 26.99},
            "backup": {"DOWN": 0.5, "BACKUP": 0.6, "PASSIVE": 12.9, "ACTIVE": 46.0},
        },
        incidents=[("backup", "primary", 3.0, "takeover", 1.5, "CLIENT_REQUEST")],
        per_minute=[("backup", MINUTE_0, 2, 0), ("primary", MINUTE_1, 2, 1)],
        events=19,
    ),
    # Failback at 45 s: no server ACTIVE between the backup's MANUAL_RECOVER (45.01 s) and
    # the primary's HANDOVER (45.05 s).
    "console_recovery": Known(
        window=60.0,
        availability=1 - (1.01 + 4.5 + 0.04) / 60,
        outages=[(0.0, 1.01), (9.5, 14.0), (45.01, 45.05)],
        state_seconds={
            "primary": {"PRIMARY": 2.02, "ACTIVE": 8.49 + 14.95, "DOWN": 20.5, "PASSIVE": 14.04},
            "backup": {"DOWN": 0.5 + 1.0, "BACKUP": 0.6, "PASSIVE": 12.9 + 13.99, "ACTIVE": 31.01},
        },
        incidents=[("backup", "primary", 3.0, "takeover", 1.5, "CLIENT_REQUEST")],
        per_minute=[
            ("backup", MINUTE_0, 2, 0),
            ("backup", MINUTE_1, 1, 0),
            ("primary", MINUTE_1, 2, 0),
        ],
        recoveries=[
            (35.0, "backup", "console", None),
            (45.0, "backup", "console", None),
            (45.01, "backup", "transition", "MANUAL_RECOVER"),
            (45.05, "primary", "transition", "HANDOVER"),
        ],
        events=24,
    ),
    # restart_passive logged under a throttle: a record stands for itself and the ones of its
    # kind it says were left out (``unrecorded``).
    # Both sides lose each other; the primary stays ACTIVE, the backup goes ACTIVE at 15 s:
    # dual active until the primary steps down at 20.02 s. Nobody is DOWN in between.
    "link_cut": Known(
        window=31.0,
        availability=1 - 1.01 / 31,
        outages=[(0.0, 1.01)],
        dual_active=[(15.0, 20.02)],
        state_seconds={
            "primary": {"PRIMARY": 1.01, "ACTIVE": 19.01, "PASSIVE": 9.98, "DOWN": 1.0},
            "backup": {"DOWN": 0.5, "BACKUP": 0.6, "PASSIVE": 13.9, "ACTIVE": 16.0},
        },
        incidents=[
            ("backup", "primary", 3.0, "takeover", 2.5, "CLIENT_REQUEST"),
            ("primary", "backup", 3.0, "already_active", 0.0, None),
        ],
        per_minute=[("backup", MINUTE_0, 2, 0), ("primary", MINUTE_0, 2, 0)],
        misconfigurations=1,
        dual_active_events=1,
        events=20,
    ),
    # Many redirects a second with state changes among them (see the scenario): PRIMARY
    # 0 .. 0.4, 1.2 .. 1.3 and 3.5 .. 3.9; ACTIVE 2.3 .. 2.4; DOWN from the last redirect
    # before the restart (3.1) to it (3.5).
    "dense_bulk": Known(
        window=6.0,
        availability=1 - 0.05 / 6,
        outages=[(0.0, 0.05)],
        dual_active=[(2.3, 2.4)],
        state_seconds={
            "primary": {"PRIMARY": 0.9, "PASSIVE": 4.6, "ACTIVE": 0.1, "DOWN": 0.4},
            "backup": {"BACKUP": 0.05, "ACTIVE": 5.95},
        },
        incidents=[],
        per_minute=[("primary", MINUTE_0, 17, 4)],
        events=32,
    ),
}
# restart_passive logged under a throttle: a record stands for itself and the ones of its
# kind it says were left out (``unrecorded``).
CASES["throttled"] = replace(
    CASES["restart_passive"],
    per_minute=[("backup", MINUTE_0, 43, 0), ("primary", MINUTE_1, 2, 10)],
)


def build(name: str, folder: Path) -> list[str]:
    return write(getattr(scenarios, name)(), folder)


PAIR = "backup+primary"  # logs that name no pair: named after their servers


def check_known(report: reference.Report, known: Known) -> None:
    summary, tables = report.summary["pairs"][PAIR], report.tables
    assert report.summary["events"] == known.events
    assert report.summary["bad_lines"] == known.bad_lines
    same(summary["window"]["seconds"], known.window, "window")
    same(summary["availability"], known.availability, "availability")
    same([(o["start"] - T0, o["end"] - T0) for o in tables["outages"]], known.outages, "outages")
    same(
        [(d["start"] - T0, d["end"] - T0) for d in tables["dual_active"]],
        known.dual_active,
        "dual_active",
    )
    expected_seconds = {
        node: {state: states.get(state, 0.0) for state in REPORT_STATES}
        for node, states in known.state_seconds.items()
    }
    same(summary["state_seconds"], expected_seconds, "state_seconds")
    same(
        [
            (
                i["node"],
                i["peer"],
                i["detection_delay_s"],
                i["outcome"],
                i["takeover_delay_s"],
                i["trigger"],
            )
            for i in tables["incidents"]
        ],
        known.incidents,
        "incidents",
    )
    same(
        [
            (r["node"], r["minute_start"], r["redirects"], r["refusals"])
            for r in tables["redirects_per_minute"]
        ],
        known.per_minute,
        "redirects_per_minute",
    )
    same(
        [(r["ts"] - T0, r["node"], r["event"], r["trigger"]) for r in tables["recoveries"]],
        known.recoveries,
        "recoveries",
    )
    assert summary["misconfigurations"] == known.misconfigurations
    assert summary["dual_active"]["events"] == known.dual_active_events
    # Time in states adds up to the window for every server.
    for node, states in summary["state_seconds"].items():
        same(sum(states.values()), known.window, f"{node} total")


@pytest.mark.parametrize("name", CASES)
def test_reference_gives_the_known_answer(name: str, tmp_path: Path) -> None:
    # These stories are about states, on synced clocks: trusted here. Their 0.1 s message
    # delays leave the offsets 0.19 s wide, which the skew tests below deal with.
    check_known(reference.compute(build(name, tmp_path), estimate_skew=False), CASES[name])


@pytest.mark.spark
@pytest.mark.parametrize("name", CASES)
def test_spark_equals_reference(name: str, tmp_path: Path, spark_session, whole) -> None:
    paths = build(name, tmp_path)
    assert_same_report(job.compute(spark_session, paths, whole=whole), reference.compute(paths))


def test_console_recovery_details(tmp_path: Path) -> None:
    report = reference.compute(build("console_recovery", tmp_path))
    assert report.summary["pairs"][PAIR]["manual_recoveries"] == {
        "recover_commands": 2,
        "manual_recover_transitions": 1,
        "handovers": 1,
        "switchovers": 0,
    }
    refused, accepted = (r for r in report.tables["recoveries"] if r["event"] == "console")
    assert refused["result"].startswith("refused")
    assert (accepted["user"], accepted["command"], accepted["result"]) == ("admin", "recover", "ok")


def test_link_cut_misconfiguration(tmp_path: Path) -> None:
    (row,) = reference.compute(build("link_cut", tmp_path)).tables["misconfigurations"]
    assert (row["ts"] - T0, row["node"], row["peer"], row["peer_epoch"]) == (
        5.0,
        "primary",
        "primary-2",
        0,
    )


# ---------------------------------------------------------------- throttled records


def counted(report) -> tuple[list[tuple], list[tuple], tuple]:
    """Redirects and refusals per minute, per day and in the pair's summary."""
    tables = spark_tables(report) if isinstance(report, output.SparkReport) else report.tables
    summary = report.summary["pairs"][PAIR]
    return (
        [
            (r["node"], r["minute_start"], r["redirects"], r["refusals"])
            for r in tables["redirects_per_minute"]
        ],
        [(r["day"], r["redirects"], r["refusals"]) for r in tables["daily"]],
        (summary["redirects"], summary["refusals"]),
    )


# The throttled scenario's day: 2023-11-14 (UTC), T0 - 20 s .. T0 + 100 s.
THROTTLED = (
    [("backup", MINUTE_0, 43, 0), ("primary", MINUTE_1, 2, 10)],
    [("2023-11-14", 45, 10)],
    (45, 10),
)


def test_throttled_records_count_the_ones_left_out(tmp_path: Path) -> None:
    report = reference.compute(build("throttled", tmp_path), estimate_skew=False)
    assert counted(report) == THROTTLED
    assert report.summary["events"] == 19  # records, not what they stand for
    assert "redirects   45, refusals 10" in render_text(report.summary, report.tables)


@pytest.mark.spark
def test_throttled_records_count_the_ones_left_out_in_spark(
    tmp_path: Path, spark_session, whole
) -> None:
    paths = build("throttled", tmp_path)
    report = job.compute(spark_session, paths, estimate_skew=False, whole=whole)
    assert counted(report) == THROTTLED
    # The timeline's bars add the same minutes up.
    assert sum(b["redirects"] + b["refusals"] for b in report.activity[PAIR]) == 55


# ---------------------------------------------------------------- torn and garbage lines


def torn_logs(folder: Path) -> list[str]:
    """crash_takeover with the primary's last line torn by the kill, a garbage line in the
    middle of the backup's log, and the backup's log rotated to gzip."""
    primary, backup = scenarios.crash_takeover()
    backup.lines.insert(3, "this is not JSON")
    primary_path = primary.write(folder, torn='{"v":1,"ts":1700000009.9,"node":"prim')
    backup_path = backup.write(folder)
    gz = backup_path.with_name("events.jsonl.1.gz")
    gz.write_bytes(gzip.compress(backup_path.read_bytes()))
    backup_path.unlink()
    return [str(primary_path), str(gz.parent)]


def test_torn_last_line_is_counted_not_fatal(tmp_path: Path) -> None:
    report = reference.compute(torn_logs(tmp_path), estimate_skew=False)
    check_known(report, _with_bad_lines(2))
    assert report.summary["bad_lines_by_file"] == {
        str(tmp_path / "primary" / "events.jsonl"): 1,
        str(tmp_path / "backup" / "events.jsonl.1.gz"): 1,
    }


def _with_bad_lines(count: int) -> Known:
    known = CASES["crash_takeover"]
    return Known(**{**known.__dict__, "bad_lines": count})


@pytest.mark.spark
def test_torn_last_line_spark_equals_reference(tmp_path: Path, spark_session, whole) -> None:
    paths = torn_logs(tmp_path)
    assert_same_report(job.compute(spark_session, paths, whole=whole), reference.compute(paths))


# ---------------------------------------------------------------- no valid record


def empty_logs(folder: Path) -> list[str]:
    (folder / "primary").mkdir()
    (folder / "primary" / "events.jsonl").write_bytes(b"not json\n")
    return [str(folder / "primary")]


def test_no_valid_record_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no valid event record .1 bad line"):
        reference.compute(empty_logs(tmp_path))


@pytest.mark.spark
def test_no_valid_record_is_an_error_in_spark(tmp_path: Path, spark_session, whole) -> None:
    with pytest.raises(ReportError, match="no valid event record .1 bad line"):
        job.compute(spark_session, empty_logs(tmp_path), whole=whole)


# ---------------------------------------------------------------- skewed clocks


def skewed_logs(folder: Path) -> list[str]:
    """link_cut with the backup's clock 30 s ahead of the primary's."""
    return write(scenarios.link_cut(backup_skew=30.0), folder)


def test_skew_is_estimated_from_causal_records(tmp_path: Path) -> None:
    report = reference.compute(skewed_logs(tmp_path))
    offset = report.summary["pairs"][PAIR]["clock_offsets"]["backup"]
    # The primary heard the backup 0.1 s after it sent (lower bound 30 - 0.1); the backup
    # went PASSIVE 0.09 s after the primary went ACTIVE (upper bound 30 + 0.09): the interval
    # is wider than the resolution, so the offset is not known and its midpoint is used.
    same((offset["lower"], offset["upper"]), (29.9, 30.09))
    same(offset["seconds"], 29.995)
    assert (offset["source"], offset["known"]) == ("estimated", False)
    dual = report.tables["dual_active"]
    assert len(dual) == 1 and dual[0]["uncertain"]
    # The true 5.02 s lies in the range given.
    assert dual[0]["min_duration_s"] <= 5.02 <= dual[0]["max_duration_s"]


def test_given_skew_overrides_the_estimate(tmp_path: Path) -> None:
    report = reference.compute(skewed_logs(tmp_path), skew={"backup": 30.0})
    offset = report.summary["pairs"][PAIR]["clock_offsets"]["backup"]
    assert (offset["source"], offset["known"]) == ("given", True)
    check_known(report, CASES["link_cut"])


def test_uncorrected_skew_distorts_the_report(tmp_path: Path) -> None:
    report = reference.compute(skewed_logs(tmp_path), estimate_skew=False)
    backup_incident = next(i for i in report.tables["incidents"] if i["node"] == "backup")
    # The backup's loss looks 30 s later than its peer's last message plus the timeout.
    same(backup_incident["detection_delay_s"], 33.0)
    assert report.summary["pairs"][PAIR]["window"]["seconds"] == pytest.approx(61.0)


@pytest.mark.spark
@pytest.mark.parametrize(
    "options", [{}, {"skew": {"backup": 30.0}}, {"estimate_skew": False}], ids=str
)
def test_skewed_spark_equals_reference(tmp_path: Path, spark_session, options, whole) -> None:
    paths = skewed_logs(tmp_path)
    assert_same_report(
        job.compute(spark_session, paths, whole=whole, **options),
        reference.compute(paths, **options),
    )


# ---------------------------------------------------------------- report window


WINDOW = (T0 + 10.0, T0 + 50.0)


def test_window_clips_everything(tmp_path: Path) -> None:
    report = reference.compute(build("console_recovery", tmp_path), *WINDOW, estimate_skew=False)
    tables = report.tables
    same(
        [(o["start"] - T0, o["end"] - T0) for o in tables["outages"]],
        [(10.0, 14.0), (45.01, 45.05)],
    )
    same(report.summary["pairs"][PAIR]["availability"], 1 - 4.04 / 40)
    same(
        report.summary["pairs"][PAIR]["state_seconds"]["primary"],
        {"PRIMARY": 1.01, "BACKUP": 0.0, "ACTIVE": 4.95, "PASSIVE": 14.04, "DOWN": 20.0},
    )
    # Minutes are listed whole when they overlap the window: 22:13 (T0 - 20 s .. T0 + 40 s)
    # brings the backup's redirects at 5 and 6 s.
    assert [
        (r["node"], r["minute_start"], r["redirects"]) for r in tables["redirects_per_minute"]
    ] == [("backup", MINUTE_0, 2), ("backup", MINUTE_1, 1), ("primary", MINUTE_1, 2)]
    assert len(tables["incidents"]) == 1 and len(tables["recoveries"]) == 4


@pytest.mark.spark
def test_window_spark_equals_reference(tmp_path: Path, spark_session, whole) -> None:
    paths = build("console_recovery", tmp_path)
    assert_same_report(
        job.compute(spark_session, paths, *WINDOW, whole=whole),
        reference.compute(paths, *WINDOW),
    )


# ---------------------------------------------------------------- unknown version


def future_logs(folder: Path) -> tuple[list[str], Path]:
    primary, backup = scenarios.crash_takeover()
    backup.raw('{"v":2,"ts":1700000021.0,"node":"backup","event":"started","state":"BACKUP"}')
    paths = write((primary, backup), folder)
    return paths, folder / "backup" / "events.jsonl"


def test_unknown_version_is_an_error_naming_file_and_version(tmp_path: Path) -> None:
    paths, culprit = future_logs(tmp_path)
    with pytest.raises(UnknownVersionError, match="version 2") as error:
        reference.compute(paths)
    assert str(culprit) in str(error.value)


@pytest.mark.spark
def test_unknown_version_spark(tmp_path: Path, spark_session, whole) -> None:
    paths, culprit = future_logs(tmp_path)
    with pytest.raises(UnknownVersionError, match="version 2") as error:
        job.compute(spark_session, paths, whole=whole)
    assert str(culprit) in str(error.value)
