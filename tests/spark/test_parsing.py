"""Bad lines: counted, never fatal, and counted the same way by Spark and the reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import job, reference
from spark.model import UNRECORDED_MAX
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


# ``unrecorded``: how many records of its kind a throttled server left out before this one. A
# count is a whole number from 0 to UNRECORDED_MAX or nothing; anything else makes a bad line,
# as a field of the wrong type or a time that is not one does.
REDIRECT = GOOD + '"event":"redirect","client":"10.0.0.1:4000","to":"b:5672"'
REFUSE = GOOD + '"event":"refuse","client":"10.0.0.1:4001","reason":"not active"'
THROTTLED = [
    GOOD + '"event":"started"}',
    REDIRECT + ',"unrecorded":41}',  # 42 redirects
    REFUSE + ',"unrecorded":9}',  # 10 refusals
    REDIRECT + ',"unrecorded":null}',  # 1
    REDIRECT + ',"unrecorded":0}',  # 1
    REDIRECT + "}",  # 1
    REDIRECT + f',"unrecorded":{UNRECORDED_MAX}}}',  # 1 + UNRECORDED_MAX
    REDIRECT + ',"unrecorded":"41"}',  # not a number
    REDIRECT + ',"unrecorded":41.0}',  # not a whole number
    REDIRECT + ',"unrecorded":true}',
    REFUSE + ',"unrecorded":-1}',  # not a count
    REFUSE + f',"unrecorded":{UNRECORDED_MAX + 1}}}',  # more than a server can leave out
    REFUSE + ',"unrecorded":9223372036854775808}',  # not a long
    GOOD + '"event":"misconfigured","peer":"c","unrecorded":-3}',  # the same on any record
]


def write_throttled(folder: Path) -> list[str]:
    path = folder / "events.jsonl"
    path.write_text("\n".join(THROTTLED) + "\n", encoding="utf-8")
    return [str(path)]


def test_reference_counts_what_throttled_records_stand_for(tmp_path: Path) -> None:
    summary = reference.compute(write_throttled(tmp_path)).summary
    assert (summary["events"], summary["bad_lines"]) == (7, 7)
    (pair,) = summary["pairs"].values()
    assert (pair["redirects"], pair["refusals"]) == (42 + 1 + 1 + 1 + 1 + UNRECORDED_MAX, 10)


@pytest.mark.spark
def test_spark_counts_throttled_records_like_the_reference(
    tmp_path: Path, spark_session, whole
) -> None:
    paths = write_throttled(tmp_path)
    assert_same_report(job.compute(spark_session, paths, whole=whole), reference.compute(paths))
