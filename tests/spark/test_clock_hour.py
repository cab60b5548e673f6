"""A server whose clock is an hour off its peer's (docs/report.md, "Clock offsets"): the
report's known answers hold on the same stories as tests.spark.test_skew and
tests.spark.test_unprotected, with the backup's clock 1 h ahead or 1 h behind.

The logs say when each record was written on its own server's clock, and the records
that cross between the servers (a peer's ``last_seen``, a handover after the PASSIVE's
transition) bound the offset: an hour is found as 5 s is, to the same 2 ms when both
servers logged their ``peer_up``. A server's clock that steps while it runs does not
show in its log at all (docs/durability.md, "When a clock steps").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import job, reference
from tests.spark import scenarios
from tests.spark.compare import assert_same_report, same
from tests.spark.logs import T0
from tests.spark.test_skew import TRUE_AVAILABILITY, TRUE_OUTAGES, never_dual_active

PAIR = "backup+primary"
HOUR = 3600.0


def evidence(skew: float, both: bool, folder: Path) -> list[str]:
    story = scenarios._evidence_story(
        skew, primary_peer_up=both, backup_peer_up=True, primary_blip=False
    )
    return [str(s.write(folder)) for s in story]


@pytest.mark.parametrize("skew", [HOUR, -HOUR], ids=["ahead", "behind"])
def test_an_hour_off_with_evidence_on_both_sides(skew: float, tmp_path: Path) -> None:
    report = reference.compute(evidence(skew, True, tmp_path))
    found = report.summary["pairs"][PAIR]["clock_offsets"]["backup"]
    same((found["lower"], found["upper"], found["seconds"]), (skew - 0.001, skew + 0.001, skew))
    assert found["known"] is True
    never_dual_active(report)
    same(
        [(o["start"] - T0, o["end"] - T0, o["duration_s"]) for o in report.tables["outages"]],
        [(s, e, e - s) for s, e in TRUE_OUTAGES],
    )
    pair = report.summary["pairs"][PAIR]
    same(pair["availability"], TRUE_AVAILABILITY)
    same(pair["window"]["seconds"], 40.0)
    (incident,) = report.tables["incidents"]
    same(incident["detection_delay_s"], 3.0)
    assert not pair["uncertain"]


@pytest.mark.parametrize("skew", [HOUR, -HOUR], ids=["ahead", "behind"])
def test_an_hour_off_with_evidence_on_one_side(skew: float, tmp_path: Path) -> None:
    """Only the backup logged a peer record: the offset's interval is 0.1 s wide around the
    hour, every figure that moves with it is uncertain and its range holds the truth."""
    report = reference.compute(evidence(skew, False, tmp_path))
    found = report.summary["pairs"][PAIR]["clock_offsets"]["backup"]
    assert found["lower"] <= skew <= found["upper"]
    assert found["upper"] - found["lower"] < 0.2
    never_dual_active(report)
    rows = report.tables["outages"]
    assert len(rows) == len(TRUE_OUTAGES)
    for row, (start, end) in zip(rows, TRUE_OUTAGES, strict=True):
        assert row["min_duration_s"] <= end - start <= row["max_duration_s"]
    pair = report.summary["pairs"][PAIR]
    assert pair["min_availability"] <= TRUE_AVAILABILITY <= pair["max_availability"]


@pytest.mark.parametrize("skew", [HOUR, -HOUR], ids=["ahead", "behind"])
def test_unprotected_time_an_hour_off(skew: float, tmp_path: Path) -> None:
    """Each span is on its own server's clock, so its length is exact whatever the offset:
    1.01 .. 3.0 s on the primary, 14 .. 33 s on the backup, 20.99 s in all, as with synced
    clocks. On the pair's reference clock the backup's lies where it truly was, to within
    its offset's interval (the logs bound the hour to a few ms, one-sided here)."""
    paths = [str(s.write(tmp_path)) for s in scenarios.unprotected_takeover(backup_skew=skew)]
    report = reference.compute(paths)
    found = report.summary["pairs"][PAIR]["clock_offsets"]["backup"]
    assert found["lower"] <= skew <= found["upper"]
    width = found["upper"] - found["lower"]
    rows = report.tables["unprotected"]
    assert [r["node"] for r in rows] == ["primary", "backup"]
    same([r["duration_s"] for r in rows], [1.99, 19.0], "durations")
    truth = [(1.01, 3.0), (14.0, 33.0)]
    for row, (start, end) in zip(rows, truth, strict=True):
        assert abs(row["start"] - T0 - start) <= width + 1e-6, (row, start)
        assert abs(row["end"] - T0 - end) <= width + 1e-6, (row, end)
    unprotected = report.summary["pairs"][PAIR]["unprotected"]
    same(unprotected["seconds"], 20.99)
    assert unprotected["min_seconds"] - 1e-6 <= 20.99 <= unprotected["max_seconds"] + 1e-6


@pytest.mark.spark
@pytest.mark.parametrize("skew", [HOUR, -HOUR], ids=["ahead", "behind"])
def test_spark_equals_reference_an_hour_off(
    skew: float, tmp_path: Path, spark_session, whole
) -> None:
    paths = evidence(skew, True, tmp_path)
    assert_same_report(job.compute(spark_session, paths, whole=whole), reference.compute(paths))
