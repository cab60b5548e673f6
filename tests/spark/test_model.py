"""The pure decisions both report implementations share (spark.model)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from spark.model import (
    ReportError,
    clock_constraints,
    crashed_at_tail,
    day_spans,
    estimate_offsets,
    expand_paths,
    pair_from_path,
    parse_skew,
    reference_node,
    report_window,
)
from spark.summary import percentiles

NODES = ["backup", "primary"]


def backup_offset(constraints, given=None, estimate=True):
    found, warnings = estimate_offsets(NODES, "primary", constraints, given or {}, estimate)
    return found["backup"], warnings


def test_two_sided_bounds_not_holding_zero_give_the_midpoint() -> None:
    # The primary heard the backup: backup - primary >= 29.9; the backup heard the primary:
    # backup - primary <= 30.1.
    found, warnings = backup_offset([("primary", "backup", -29.9), ("backup", "primary", 30.1)])
    assert (found.seconds, found.lower, found.upper) == (pytest.approx(30.0), 29.9, 30.1)
    assert (found.source, found.known, warnings) == ("estimated", False, [])


def test_bounds_holding_zero_leave_the_clocks_alone() -> None:
    found, _ = backup_offset([("primary", "backup", 0.8), ("backup", "primary", 0.001)])
    assert (found.seconds, found.lower, found.upper) == (0.0, -0.8, 0.001)
    assert found.known is False


def test_one_sided_bound_is_not_knowledge() -> None:
    found, _ = backup_offset([("primary", "backup", -2.0)])
    assert (found.seconds, found.lower, found.upper, found.known) == (2.0, 2.0, math.inf, False)
    assert found.as_json()["upper"] is None
    found, _ = backup_offset([("backup", "primary", -1.5)])
    assert (found.seconds, found.upper) == (-1.5, -1.5)
    found, _ = backup_offset([])
    assert (found.seconds, found.lower, found.upper) == (0.0, -math.inf, math.inf)


def test_narrow_interval_is_known() -> None:
    found, _ = backup_offset([("primary", "backup", -4.999), ("backup", "primary", 5.001)])
    assert found.known and found.seconds == pytest.approx(5.0)


def test_contradicting_bounds_are_reported() -> None:
    found, warnings = backup_offset([("primary", "backup", -5.0), ("backup", "primary", 4.0)])
    assert found.seconds == 4.5 and "drift" in warnings[0]


def test_given_skew_wins_and_estimation_can_be_off() -> None:
    bounds = [("primary", "backup", -29.9), ("backup", "primary", 30.1)]
    found, _ = backup_offset(bounds, {"backup": 7.0})
    assert (found.source, found.seconds, found.known) == ("given", 7.0, True)
    found, _ = backup_offset(bounds, estimate=False)
    assert (found.source, found.seconds, found.known) == ("trusted", 0.0, True)
    # A given offset for the reference node moves every estimate with it.
    found_all, _ = estimate_offsets(NODES, "primary", bounds, {"primary": 1.0})
    assert found_all["primary"].seconds == 1.0
    assert found_all["backup"].seconds == pytest.approx(31.0)


def _transition(ts, state, epoch, trigger):
    return {"ts": ts, "event": "transition", "state": state, "epoch": epoch, "trigger": trigger}


def test_clock_constraints_from_every_causal_pair() -> None:
    records = {
        "primary": [
            {"ts": 1.0, "event": "peer_up", "state": "PRIMARY", "peer": "backup", "last_seen": 0.9},
            _transition(2.0, "ACTIVE", 1, "PEER_BACKUP"),
            _transition(50.0, "ACTIVE", 3, "HANDOVER"),
            {
                "ts": 60.0,
                "event": "dual_active",
                "state": "ACTIVE",
                "peer": "backup",
                "peer_epoch": 4,
            },
        ],
        "backup": [
            _transition(2.5, "PASSIVE", 1, "PEER_ACTIVE"),
            _transition(40.0, "ACTIVE", 2, "CLIENT_REQUEST"),
            _transition(49.0, "PASSIVE", 2, "MANUAL_RECOVER"),
            _transition(55.0, "ACTIVE", 4, "CLIENT_REQUEST"),
        ],
    }
    assert sorted(clock_constraints(records)) == sorted(
        [
            ("primary", "backup", 1.0 - 0.9),  # peer_up: the backup sent first
            ("backup", "primary", 2.5 - 2.0),  # PEER_ACTIVE follows the primary's ACTIVE
            ("primary", "backup", 50.0 - 49.0),  # HANDOVER follows the backup's PASSIVE
            ("primary", "backup", 60.0 - 55.0),  # dual_active follows the backup's ACTIVE
        ]
    )


def test_reference_clock_is_the_primary_s() -> None:
    assert reference_node(["b", "a"], {"b": "primary", "a": "backup"}) == "b"
    assert reference_node(["b", "a"], {}) == "a"


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
    assert parse_skew(["eu-1/backup=1"]) == {"eu-1/backup": 1.0}
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
    for name in ("events.jsonl", "events.jsonl.1.gz", "events.jsonl.2", "notes.txt"):
        (tmp_path / "a" / "primary" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "a" / "primary" / name).write_text("")
    (tmp_path / "a" / "backup").mkdir()
    (tmp_path / "a" / "backup" / "events.jsonl").write_text("")
    (tmp_path / "b.jsonl").write_text("")
    (tmp_path / "empty").mkdir()
    # Directories are searched to any depth, as `make run` lays out var/.
    assert expand_paths([str(tmp_path / "a")]) == [
        str(tmp_path / "a" / "backup" / "events.jsonl"),
        str(tmp_path / "a" / "primary" / "events.jsonl"),
        str(tmp_path / "a" / "primary" / "events.jsonl.1.gz"),
        str(tmp_path / "a" / "primary" / "events.jsonl.2"),
    ]
    with pytest.raises(ReportError, match=f"{tmp_path / 'empty'}: no event log"):
        expand_paths([str(tmp_path / "empty")])
    assert expand_paths([str(tmp_path / "*.jsonl")]) == [str(tmp_path / "b.jsonl")]
    assert expand_paths(["hdfs://nn/amqha/*/events.jsonl"]) == ["hdfs://nn/amqha/*/events.jsonl"]
    with pytest.raises(ReportError, match="no such file"):
        expand_paths([str(tmp_path / "missing")])
    with pytest.raises(ReportError, match="no file matches"):
        expand_paths([str(tmp_path / "*.gz")])


def test_pair_from_path() -> None:
    assert pair_from_path("/logs/pair=eu-1/primary/events.jsonl") == "eu-1"
    assert pair_from_path("pair=a%2Fb/events.jsonl") == "a/b"
    assert pair_from_path("/logs/primary/events.jsonl") is None


def test_day_spans_split_at_utc_midnight() -> None:
    assert day_spans((86400 * 2 - 10, 86400 * 2 + 5)) == [
        ("1970-01-02", 86400 * 2 - 10, 86400 * 2),
        ("1970-01-03", 86400 * 2, 86400 * 2 + 5),
    ]
    assert day_spans((5.0, 5.0)) == [("1970-01-01", 5.0, 5.0)]


def test_percentiles_are_nearest_rank() -> None:
    found = percentiles([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (found["p50"], found["p90"], found["max"], found["count"]) == (3.0, 5.0, 5.0, 5)
    assert percentiles([])["p50"] is None
