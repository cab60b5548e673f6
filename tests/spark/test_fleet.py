"""Several pairs read together: grouped by pair (a record's ``pair``, else a ``pair=NAME``
directory), per-day rows, the fleet summary, SLO breaches, and Parquet partitions that a
re-run replaces instead of adding to."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import job, output, reference
from tests.spark import scenarios
from tests.spark.compare import assert_same_report, same
from tests.spark.logs import Server

# The two stories' availabilities, as worked out in test_report.
CRASH = 1 - (1.01 + 4.5) / 20
RECOVERY = 1 - (1.01 + 4.5 + 0.04) / 60


def fleet(folder: Path) -> list[str]:
    """eu-1 names itself in its records (crash_takeover); us-1's records name no pair but sit
    under pair=us-1/ (console_recovery). Both pairs' servers are called primary and backup."""
    paths = []
    for server in scenarios.crash_takeover():
        named = Server(server.name, server.role, pair="eu-1")
        for line in server.lines:
            named.raw(line.replace('"event":', '"pair": "eu-1", "event":', 1))
        paths.append(str(named.write(folder / "eu")))
    for server in scenarios.console_recovery():
        paths.append(str(server.write(folder / "pair=us-1")))
    return paths


def test_pairs_are_reported_apart(tmp_path: Path) -> None:
    report = reference.compute(fleet(tmp_path), estimate_skew=False, slo=99.95)
    pairs = report.summary["pairs"]
    assert sorted(pairs) == ["eu-1", "us-1"]
    same(pairs["eu-1"]["availability"], CRASH)
    same(pairs["us-1"]["availability"], RECOVERY)
    # Read as one service they overlapped: here no pair is ever dual active.
    assert all(p["dual_active"]["seconds"] == 0 for p in pairs.values())
    assert {r["pair"] for r in report.tables["incidents"]} == {"eu-1", "us-1"}
    daily = [(d["pair"], d["day"], d["incidents"], d["redirects"]) for d in report.tables["daily"]]
    assert daily == [("eu-1", "2023-11-14", 1, 2), ("us-1", "2023-11-14", 1, 5)]

    found = report.summary["fleet"]
    assert found["pairs"] == 2
    same(found["availability"], 1 - (5.51 + 5.55) / 80)
    assert [w["pair"] for w in found["worst"]] == ["eu-1", "us-1"]  # worst first
    delays = found["takeover_delay_s"]
    assert (delays["count"], delays["p50"], delays["max"]) == (2, 1.5, 1.5)
    breaches = found["slo"]["breaches"]
    assert [(b["pair"], b["day"]) for b in breaches] == [
        ("eu-1", "2023-11-14"),
        ("us-1", "2023-11-14"),
    ]


def test_unnamed_pairs_are_one(tmp_path: Path) -> None:
    for server in scenarios.crash_takeover():
        server.write(tmp_path / "a")
    for server in scenarios.crash_takeover():
        server.write(tmp_path / "b")
    report = reference.compute([str(tmp_path)], estimate_skew=False)
    assert list(report.summary["pairs"]) == ["backup+primary"]


@pytest.mark.spark
def test_spark_equals_reference_on_a_fleet(tmp_path: Path, spark_session, whole) -> None:
    paths = fleet(tmp_path)
    assert_same_report(
        job.compute(spark_session, paths, slo=99.95, whole=whole),
        reference.compute(paths, slo=99.95),
    )


@pytest.mark.spark
def test_a_rerun_replaces_its_partitions(tmp_path: Path, spark_session, read_as) -> None:
    paths = fleet(tmp_path / "logs")
    out = str(tmp_path / "out")
    job.run_report(paths, out)
    job.run_report(paths, out)  # the same window again: nothing doubles
    eu_only = [p for p in paths if "/eu/" in p]
    job.run_report(eu_only, out)  # eu-1's partitions replaced, us-1's kept

    frame = spark_session.read.schema(output.table_schema("incidents")).parquet(
        str(tmp_path / "out" / "incidents" / "parquet")
    )
    assert sorted(r["pair"] for r in frame.collect()) == ["eu-1", "us-1"]
    daily = spark_session.read.schema(output.table_schema("daily")).parquet(
        str(tmp_path / "out" / "daily" / "parquet")
    )
    assert sorted((r["pair"], r["day"]) for r in daily.collect()) == [
        ("eu-1", "2023-11-14"),
        ("us-1", "2023-11-14"),
    ]


@pytest.mark.spark
def test_spark_equals_reference_on_a_generated_fleet(tmp_path: Path, spark_session, whole) -> None:
    """Pairs with skewed backups, rotated gzip logs, storms, every kind of incident."""
    from bench.fleet import generate_fleet

    written = generate_fleet(tmp_path, events=6000, pairs=4, days=2, seed=7)
    report = reference.compute([str(tmp_path)], slo=99.99)
    assert sorted(report.summary["pairs"]) == sorted(written)
    assert report.summary["events"] == sum(written.values())
    assert report.summary["fleet"]["incidents"] > 0
    assert_same_report(job.compute(spark_session, [str(tmp_path)], slo=99.99, whole=whole), report)
