"""Bad lines: counted, never fatal, and counted the same way by Spark and the reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import job, reference
from tests.spark.compare import assert_same_report

GOOD = '{"v":1,"ts":1700000000.5,"node":"a","role":"primary","epoch":0,"state":"PRIMARY",'
LINES = [
    GOOD + '"event":"started"}',
    "",  # blank lines are not records
    "   ",
    GOOD + '"event":"peer_up","peer":"b","last_seen":1700000000.4}',
    '{"v":1,"ts":"yesterday","node":"a","state":"ACTIVE","event":"x"}',  # ts not a number
    '{"v":1,"ts":1700000001,"node":"a","state":"ACTIVE","event":"x","epoch":1.5}',  # epoch
    '{"v":1,"ts":NaN,"node":"a","state":"ACTIVE","event":"x"}',  # not a time
    '{"v":1,"ts":1700000001,"node":"a","state":"RUNNING","event":"x"}',  # unknown state
    '{"v":1,"ts":1700000001,"node":"a","state":"ACTIVE"}',  # no event
    '{"ts":1700000001,"node":"a","state":"ACTIVE","event":"x"}',  # no version
    "null",
    "[1, 2]",
    "{'v': 1}",  # not JSON
    '{"v":1,"ts":1700000002,"node":"a","state":"ACTIVE","event":"transition"} trailing',
    '{"v":1,"ts":1700000003,"node":"a","state":"ACTIVE","event":"x","user":42}',  # 42 -> "42"
]


def write(folder: Path) -> list[str]:
    path = folder / "events.jsonl"
    path.write_text("\n".join(LINES) + "\n" + GOOD[:40], encoding="utf-8")
    return [str(path)]


def test_reference_counts_bad_lines(tmp_path: Path) -> None:
    summary = reference.compute(write(tmp_path)).summary
    # started, peer_up, the line with trailing text (as Spark reads it), the user 42 line
    assert summary["events"] == 4
    assert summary["bad_lines"] == 10  # 9 broken lines above, and the torn last one


@pytest.mark.spark
def test_spark_counts_bad_lines_like_the_reference(tmp_path: Path, spark_session, whole) -> None:
    paths = write(tmp_path)
    assert_same_report(job.compute(spark_session, paths, whole=whole), reference.compute(paths))
