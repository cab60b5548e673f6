"""The pure decisions both report implementations share (spark.model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark.model import (
    ClockEvidence,
    ReportError,
    crashed_at_tail,
    estimate_offsets,
    expand_paths,
    parse_skew,
    report_window,
)

NODES = ["backup", "primary"]


def evidence(bounds: dict) -> ClockEvidence:
    found = ClockEvidence()
    found.add("primary", True, None, None)
    for (observer, peer), bound in bounds.items():
        found.add(observer, observer == "primary", peer, bound)
    return found


def offsets(bounds, given=None, estimate=True):
    found, warnings = estimate_offsets(NODES, evidence(bounds), given or {}, estimate)
    return found["backup"], warnings


def test_two_way_bounds_give_the_midpoint() -> None:
    # The primary heard the backup: backup - primary >= 29.9; the backup heard the primary:
    # primary - backup >= -30.1.
    found, warnings = offsets({("primary", "backup"): 29.9, ("backup", "primary"): -30.1})
    assert (found.seconds, found.source, warnings) == (pytest.approx(30.0), "estimated", [])


def test_one_way_bound_corrects_only_what_causality_needs() -> None:
    assert offsets({("primary", "backup"): 2.0})[0].seconds == 2.0
    assert offsets({("primary", "backup"): -3.0})[0].seconds == 0.0
    assert offsets({("backup", "primary"): 1.5})[0].seconds == -1.5
    assert offsets({("backup", "primary"): -3.0})[0].seconds == 0.0


def test_no_evidence_no_correction() -> None:
    found, _ = offsets({})
    assert (found.seconds, found.source) == (0.0, "none")
    nothing, _ = estimate_offsets(NODES, ClockEvidence(), {})
    assert {o.seconds for o in nothing.values()} == {0.0}


def test_contradicting_bounds_are_reported() -> None:
    found, warnings = offsets({("primary", "backup"): 5.0, ("backup", "primary"): -4.0})
    assert found.seconds == 4.5 and "disagree" in warnings[0]


def test_given_skew_wins_and_estimation_can_be_off() -> None:
    bounds = {("primary", "backup"): 29.9, ("backup", "primary"): -30.1}
    assert offsets(bounds, {"backup": 7.0})[0].source == "given"
    assert offsets(bounds, {"backup": 7.0})[0].seconds == 7.0
    assert offsets(bounds, estimate=False)[0].seconds == 0.0
    # A given offset for the reference node moves every estimate with it.
    found, _ = estimate_offsets(NODES, evidence(bounds), {"primary": 1.0})
    assert found["primary"].seconds == 1.0 and found["backup"].seconds == pytest.approx(31.0)


def test_reference_clock_is_the_primary_s() -> None:
    found = ClockEvidence()
    found.add("b", False, "a", 1.0)
    assert found.reference() == "b"  # the only node with evidence
    found.add("a", True, "b", -1.0)
    assert found.reference() == "a"  # a primary wins
    assert ClockEvidence().reference() is None


@pytest.mark.parametrize(
    ("last_event", "claim", "last_peer_event", "crashed"),
    [
        ("transition", 12.5, "peer_up", True),  # killed: only the peer noticed
        ("stopped", 12.5, "peer_up", False),  # stopped cleanly
        ("transition", None, "peer_up", False),  # nobody lost it: up and quiet
        ("transition", 9.0, "peer_up", False),  # lost before its last sign of life
        ("peer_lost", 12.5, "peer_lost", False),  # link cut: it lost its peer too
    ],
)
def test_crashed_at_tail(last_event, claim, last_peer_event, crashed) -> None:
    assert crashed_at_tail(last_event, 9.5, claim, last_peer_event) is crashed


def test_parse_skew() -> None:
    assert parse_skew(["backup=1.5", "primary=-2"]) == {"backup": 1.5, "primary": -2.0}
    for bad in ("backup", "=1", "backup=soon"):
        with pytest.raises(ReportError, match="NODE=SECONDS"):
            parse_skew([bad])


def test_report_window() -> None:
    assert report_window(None, None, 1.0, 5.0) == (1.0, 5.0)
    assert report_window(2.0, None, 1.0, 5.0) == (2.0, 5.0)
    assert report_window(None, None, None, None) is None
    with pytest.raises(ReportError, match="empty report window"):
        report_window(6.0, None, 1.0, 5.0)


def test_expand_paths(tmp_path: Path) -> None:
    for name in ("events.jsonl", "events.jsonl.1.gz", "notes.txt"):
        (tmp_path / "a" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "a" / name).write_text("")
    (tmp_path / "b.jsonl").write_text("")
    assert expand_paths([str(tmp_path / "a")]) == [
        str(tmp_path / "a" / "events.jsonl"),
        str(tmp_path / "a" / "events.jsonl.1.gz"),
    ]
    assert expand_paths([str(tmp_path / "*.jsonl")]) == [str(tmp_path / "b.jsonl")]
    assert expand_paths(["hdfs://nn/amqha/*/events.jsonl"]) == ["hdfs://nn/amqha/*/events.jsonl"]
    with pytest.raises(ReportError, match="no such file"):
        expand_paths([str(tmp_path / "missing")])
    with pytest.raises(ReportError, match="no file matches"):
        expand_paths([str(tmp_path / "*.gz")])
