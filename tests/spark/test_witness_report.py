"""The report counts what a witness did (docs/failover.md, "The witness"): the takeovers it
agreed to and the times an ACTIVE stopped serving without it; the Spark job agrees."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import job, reference
from spark.text import render_text
from tests.spark import scenarios
from tests.spark.compare import assert_same_report

PAIR = "backup+primary"


def logs(folder: Path) -> list[str]:
    return [str(server.write(folder)) for server in scenarios.witnessed_cut()]


def test_the_witness_takeover_and_fence_are_counted(tmp_path: Path) -> None:
    report = reference.compute(logs(tmp_path))
    summary = report.summary["pairs"][PAIR]
    assert summary["witness"] == {"agreed_takeovers": 1, "fences": 1}
    text = render_text(report.summary, report.tables)
    assert "witness     1 takeover(s) it agreed to, 1 time(s) an ACTIVE stopped" in text


def test_a_pair_without_a_witness_says_nothing_of_one(tmp_path: Path) -> None:
    paths = [str(server.write(tmp_path)) for server in scenarios.crash_takeover()]
    report = reference.compute(paths)
    assert report.summary["pairs"][PAIR]["witness"] == {"agreed_takeovers": 0, "fences": 0}
    assert "witness " not in render_text(report.summary, report.tables)


@pytest.mark.spark
def test_spark_counts_the_witness_as_the_reference_does(
    tmp_path: Path, spark_session, whole
) -> None:
    paths = logs(tmp_path)
    assert_same_report(job.compute(spark_session, paths, whole=whole), reference.compute(paths))
