"""Clock offsets from one-sided and two-sided evidence: known answers (see the stories in
``tests.spark.scenarios``), and the Spark job agreeing with the reference on them.

The true history of the three cases is the same: outages 0 .. 1 s (start-up), 9.5 .. 13.75 s
(kill -9 and takeover) and 30.0 .. 30.1 s (console handover); never dual active.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import job, reference
from tests.spark import scenarios
from tests.spark.compare import assert_same_report, same
from tests.spark.logs import T0

PAIR = "backup+primary"
TRUE_OUTAGES = [(0.0, 1.0), (9.5, 13.75), (30.0, 30.1)]
TRUE_AVAILABILITY = 1 - (1.0 + 4.25 + 0.1) / 40


def run(name: str, folder: Path) -> reference.Report:
    return reference.compute([str(s.write(folder)) for s in getattr(scenarios, name)()])


def offset(report: reference.Report) -> dict:
    return report.summary["pairs"][PAIR]["clock_offsets"]["backup"]


def outages(report: reference.Report) -> list[tuple]:
    return [
        (
            o["start"] - T0,
            o["end"] - T0,
            o["duration_s"],
            o["min_duration_s"],
            o["max_duration_s"],
            o["uncertain"],
        )
        for o in report.tables["outages"]
    ]


def never_dual_active(report: reference.Report) -> None:
    dual = report.summary["pairs"][PAIR]["dual_active"]
    assert report.tables["dual_active"] == []
    assert (dual["seconds"], dual["max_seconds"]) == (0, 0)


def test_synced_clocks_one_side_without_peer_up(tmp_path: Path) -> None:
    """The primary's only record about the backup is a peer_lost whose last_seen is the
    failover timeout (0.8 s) old: alone it allows the backup's clock to be 0.8 s behind, and
    the midpoint of that with the backup's 1 ms bound made the handover a 0.4 s dual active.
    The handover itself proves the backup was PASSIVE first (offset >= -0.1 s); the clocks
    may agree, so they are taken to, and what depends on the rest of the interval is
    uncertain."""
    report = run("synced_no_primary_peer_up", tmp_path)
    found = offset(report)
    same((found["lower"], found["upper"], found["seconds"]), (-0.1, 0.001, 0.0))
    assert (found["source"], found["known"]) == ("estimated", False)
    never_dual_active(report)
    same(
        outages(report),
        [
            (0.0, 1.0, 1.0, 1.0, 1.0, False),
            (9.5, 13.75, 4.25, 4.249, 4.35, True),
            (30.0, 30.1, 0.1, 0.0, 0.101, True),
        ],
    )
    pair = report.summary["pairs"][PAIR]
    same(pair["availability"], TRUE_AVAILABILITY)
    assert pair["min_availability"] < TRUE_AVAILABILITY < pair["max_availability"]
    assert pair["uncertain"] and report.summary["fleet"]["uncertain_pairs"] == [PAIR]


def test_skewed_clocks_one_side_without_peer_records(tmp_path: Path) -> None:
    """The backup runs 5 s ahead and the primary logged no peer record. The backup's records
    bound the offset from above only (<= 5.001 s); read alone they allow 0, which turned the
    handover into a 4.9 s dual active and the takeover's 4.25 s outage into 9.25 s. The
    handover bounds it from below (>= 4.9 s): the interval's midpoint is used, every figure
    that moves with it is uncertain and its range holds the truth."""
    report = run("skewed_one_side", tmp_path)
    found = offset(report)
    same((found["lower"], found["upper"], found["seconds"]), (4.9, 5.001, 4.9505))
    assert found["known"] is False
    never_dual_active(report)
    pair = report.summary["pairs"][PAIR]
    same(pair["window"]["seconds"], 40.0)
    same(
        outages(report),
        [
            (0.0, 1.0, 1.0, 1.0, 1.0, False),
            (9.5, 13.7995, 4.2995, 4.249, 4.35, True),
            (30.0495, 30.1, 0.0505, 0.0, 0.101, True),
        ],
    )
    for row, (start, end) in zip(report.tables["outages"], TRUE_OUTAGES, strict=True):
        assert row["min_duration_s"] <= end - start <= row["max_duration_s"]
    assert pair["min_availability"] <= TRUE_AVAILABILITY <= pair["max_availability"]
    (incident,) = report.tables["incidents"]
    assert incident["uncertain"]
    assert incident["min_detection_delay_s"] <= 3.0 <= incident["max_detection_delay_s"]


def test_skewed_clocks_evidence_on_both_sides(tmp_path: Path) -> None:
    """The backup runs 5 s ahead and both logged peer_up: the offset is known to 2 ms, the
    figures are the true ones and none is uncertain."""
    report = run("skewed_both_sides", tmp_path)
    found = offset(report)
    same((found["lower"], found["upper"], found["seconds"]), (4.999, 5.001, 5.0))
    assert found["known"] is True
    never_dual_active(report)
    same(
        outages(report),
        [(s, e, e - s, e - s, e - s, False) for s, e in TRUE_OUTAGES],
    )
    pair = report.summary["pairs"][PAIR]
    same(
        (pair["availability"], pair["min_availability"], pair["max_availability"]),
        (TRUE_AVAILABILITY,) * 3,
    )
    (incident,) = report.tables["incidents"]
    same(incident["detection_delay_s"], 3.0)
    assert not pair["uncertain"] and report.summary["fleet"]["uncertain_pairs"] == []


@pytest.mark.spark
@pytest.mark.parametrize(
    "name", ["synced_no_primary_peer_up", "skewed_one_side", "skewed_both_sides"]
)
def test_spark_equals_reference(name: str, tmp_path: Path, spark_session, whole) -> None:
    paths = [str(s.write(tmp_path)) for s in getattr(scenarios, name)()]
    assert_same_report(job.compute(spark_session, paths, whole=whole), reference.compute(paths))
