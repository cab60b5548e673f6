"""Federation links' down time per pair and day (docs/report.md, "Federation links"): known
answers on hand-built logs (the stories are in ``tests.spark.scenarios``), and the Spark
job equal to the reference on each, both ways it reads its input."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import job, reference
from tests.spark import scenarios
from tests.spark.compare import assert_same_report, same

PAIR = "backup+primary"
DAY_1, DAY_2 = "2023-11-14", "2023-11-15"

# (day, link, upstream, seconds watched, down_s, downs, failures), worked out by hand.
CASES = {
    "federation_links": [
        (DAY_1, "market", "central", 18.0, 8.0, 2, 2),
        (DAY_1, "rpc", "central", 17.5, 10.5, 1, 1),
    ],
    "federation_midnight": [
        (DAY_1, "market", "central", scenarios.MIDNIGHT - 2.0, 10.0, 1, 0),
        (DAY_2, "market", "central", 100.0, 20.0, 0, 0),
    ],
}


def build(name: str, folder: Path) -> list[str]:
    return [str(server.write(folder)) for server in getattr(scenarios, name)()]


def rows(report) -> list[tuple]:
    return [
        (
            r["day"],
            r["link"],
            r["upstream"],
            r["seconds"],
            r["down_s"],
            r["downs"],
            r["failures"],
        )
        for r in report.tables["federation_links"]
    ]


@pytest.mark.parametrize("name", CASES)
def test_reference_gives_the_known_answer(name: str, tmp_path: Path) -> None:
    # Synced clocks, trusted as in test_report: the stories' 0.1 s message delays alone
    # leave an estimated offset 0.19 s wide, which would move the link's times with it.
    report = reference.compute(build(name, tmp_path), estimate_skew=False)
    same(rows(report), CASES[name], "federation_links")
    for row in report.tables["federation_links"]:
        assert row["pair"] == PAIR
        same(row["down_fraction"], row["down_s"] / row["seconds"], "down_fraction")


def test_logs_without_federation_records_have_no_rows(tmp_path: Path) -> None:
    report = reference.compute(build("crash_takeover", tmp_path))
    assert report.tables["federation_links"] == []


@pytest.mark.spark
@pytest.mark.parametrize("name", CASES)
def test_spark_equals_reference(name: str, tmp_path: Path, spark_session, whole) -> None:
    paths = build(name, tmp_path)
    spark_report = job.compute(spark_session, paths, estimate_skew=False, whole=whole)
    assert_same_report(spark_report, reference.compute(paths, estimate_skew=False))
    same(rows(spark_report), CASES[name], "federation_links")
