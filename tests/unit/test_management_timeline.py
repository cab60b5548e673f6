"""The page's timeline and unprotected time (``amqha.management.timeline``): the report's
definitions on the report's hand-built stories, compared with the report's reference
(``spark.reference``, pure Python), and what a page needs beyond the report: a window that
ends now, logs read from part way, markers, redirect runs kept by their ends."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from amqha.management import timeline
from spark import reference
from tests.spark import scenarios
from tests.spark.logs import T0

PAIR = "backup+primary"
STORIES = (
    "sync_caught_up",
    "unprotected_takeover",
    "crash_unprotected",
    "split_quarantine",
    "crash_takeover",
    "restart_passive",
    "throttled",
    "dense_bulk",
    "link_cut",
)


def logs_of(name: str) -> dict[str, list[dict]]:
    return {
        server.name: [json.loads(line) for line in server.lines]
        for server in getattr(scenarios, name)()
    }


@pytest.mark.parametrize("read", [False, True], ids=["records", "read"])
@pytest.mark.parametrize("name", STORIES)
def test_the_same_figures_as_the_report(name: str, read: bool, tmp_path: Path) -> None:
    """The report's reference on a story and the page's timeline on the same logs, given
    as records or read as the API reads them (runs of redirects kept by their ends). The
    page takes each server's clock as it is: the report too, told not to estimate offsets
    (with estimates, ``dense_bulk``'s one-sided bound on the backup's offset adds an
    uncertain outage row, 0 s at the offsets used, where the page draws none)."""
    servers = getattr(scenarios, name)()
    report = reference.compute([str(s.write(tmp_path)) for s in servers], estimate_skew=False)
    summary = report.summary["pairs"][PAIR]
    window = summary["window"]
    if read:
        logs = {s.name: timeline.history_from_lines(s.lines, -math.inf) for s in servers}
        assert sum(map(len, logs.values())) <= sum(len(s.lines) for s in servers)
    else:
        logs = {s.name: [json.loads(line) for line in s.lines] for s in servers}
    found = timeline.pair_timeline(logs, window["since"], window["until"])
    # The stories lie within one UTC day, so "today" is the report's whole window.
    assert found["unprotected_today"]["since"] <= window["since"]
    recorded = summary["unprotected"]["recorded"]
    assert found["unprotected_today"]["recorded"] is recorded
    if recorded:
        assert math.isclose(
            found["unprotected_today"]["seconds"], summary["unprotected"]["seconds"], abs_tol=1e-6
        )
    else:
        assert found["unprotected_today"]["seconds"] is None
    spans = sorted((u["node"], u["start"], u["end"]) for u in found["unprotected"])
    expected = sorted((r["node"], r["start"], r["end"]) for r in report.tables["unprotected"])
    assert len(spans) == len(expected)
    for mine, theirs in zip(spans, expected, strict=True):
        assert mine[0] == theirs[0]
        assert math.isclose(mine[1], theirs[1], abs_tol=1e-6)
        assert math.isclose(mine[2], theirs[2], abs_tol=1e-6)
    for table in ("outages", "dual_active"):
        mine = [(o["start"], o["end"]) for o in found[table]]
        theirs = [(o["start"], o["end"]) for o in report.tables[table]]
        assert len(mine) == len(theirs), table
        for a, b in zip(mine, theirs, strict=True):
            assert math.isclose(a[0], b[0], abs_tol=1e-6) and math.isclose(a[1], b[1], abs_tol=1e-6)
    lanes = sorted(
        (lane["node"], lane["state"], lane["start"], lane["end"]) for lane in found["lanes"]
    )
    states = sorted(
        (r["node"], r["state"], r["start"], r["end"]) for r in report.tables["state_intervals"]
    )
    assert [(n, s) for n, s, _, _ in lanes] == [(n, s) for n, s, _, _ in states]


def test_known_answer_of_a_takeover_with_no_in_sync_passive() -> None:
    found = timeline.pair_timeline(logs_of("unprotected_takeover"), T0, T0 + 60)
    assert [(u["node"], u["start"] - T0, u["end"] - T0) for u in found["unprotected"]] == [
        ("primary", pytest.approx(1.01), pytest.approx(3.0)),
        ("backup", pytest.approx(14.0), pytest.approx(33.0)),
    ]
    assert found["unprotected_today"]["seconds"] == pytest.approx(20.99)
    # Before the primary's first ACTIVE, and after its kill: no ACTIVE from its last state
    # message (9.5 s) to the takeover.
    assert [(o["start"] - T0, o["end"] - T0) for o in found["outages"]] == [
        (0.0, pytest.approx(1.01)),
        (pytest.approx(9.5), pytest.approx(14.0)),
    ]
    kinds = [(m["kind"], m["node"], m["ts"] - T0) for m in found["markers"]]
    assert kinds == [
        ("last_seen", "primary", pytest.approx(9.5)),
        ("peer_lost", "backup", pytest.approx(12.5)),
        ("takeover", "backup", pytest.approx(14.0)),
    ]
    backup = [
        (lane["state"], lane["start"] - T0) for lane in found["lanes"] if lane["node"] == "backup"
    ]
    assert ("ACTIVE", pytest.approx(14.0)) in backup


def test_a_window_that_ends_now_counts_the_unprotected_active_until_now() -> None:
    # The backup took over at 14 s and the primary never came back: still unprotected (and
    # so was the primary, ACTIVE from 1.01 s to its last sign of life at 9.5 s).
    logs = logs_of("crash_takeover")
    for record in logs["backup"]:
        assert record["event"] != "sync"
    logs["backup"].append(
        {
            **logs["backup"][-2],
            "event": "sync",
            "side": "active",
            "sync": "out_of_sync",
            "state": "ACTIVE",
            "ts": T0 + 14.001,
        }
    )
    logs["backup"] = [r for r in logs["backup"] if r["event"] != "stopped"]
    found = timeline.pair_timeline(logs, T0 - 3600, T0 + 100)
    assert found["unprotected_today"]["seconds"] == pytest.approx(8.49 + 86.0)
    assert found["unprotected"][-1]["end"] == T0 + 100


def test_no_sync_record_is_not_recorded_rather_than_zero() -> None:
    found = timeline.pair_timeline(logs_of("crash_takeover"), T0, T0 + 60)
    assert found["unprotected_today"] == {
        "recorded": False,
        "since": timeline.midnight(T0 + 60),
        "seconds": None,
    }
    assert found["unprotected"] == []


def test_unprotected_today_starts_at_utc_midnight() -> None:
    midnight = timeline.midnight(T0) + timeline.DAY
    logs = {
        "a": [
            {"v": 1, "ts": midnight - 100, "node": "a", "event": "started", "state": "PRIMARY"},
            {"v": 1, "ts": midnight - 90, "node": "a", "event": "transition", "state": "ACTIVE"},
            {
                "v": 1,
                "ts": midnight - 90,
                "node": "a",
                "event": "sync",
                "state": "ACTIVE",
                "side": "active",
                "sync": "out_of_sync",
            },
            {
                "v": 1,
                "ts": midnight + 30,
                "node": "a",
                "event": "sync",
                "state": "ACTIVE",
                "side": "active",
                "sync": "in_sync",
            },
        ]
    }
    found = timeline.pair_timeline(logs, midnight - 3600, midnight + 600)
    assert found["unprotected_today"]["since"] == midnight
    assert found["unprotected_today"]["seconds"] == pytest.approx(30.0)
    assert [(u["start"], u["end"]) for u in found["unprotected"]] == [
        (midnight - 90, midnight + 30)
    ]


def lines(*records: dict) -> list[str]:
    return [json.dumps(r) for r in records]


def test_history_keeps_what_came_before_and_the_ends_of_redirect_runs() -> None:
    def r(ts: float, event: str, state: str, **more) -> dict:
        return {"v": 1, "ts": ts, "node": "b", "event": event, "state": state, **more}

    text = lines(
        r(1, "started", "BACKUP"),
        r(2, "transition", "ACTIVE"),
        r(3, "sync", "ACTIVE", side="active", sync="out_of_sync"),
        r(4, "peer_up", "ACTIVE"),
        r(10, "redirect", "ACTIVE"),
        r(11, "redirect", "ACTIVE"),
        r(12, "refuse", "ACTIVE"),
        r(13, "redirect", "ACTIVE"),
        r(14, "sync", "ACTIVE", side="active", sync="in_sync"),
    )
    kept = timeline.history_from_lines([*text, "not json", '{"v": 2}', "[]"], since=5)
    assert [(k["ts"], k["event"]) for k in kept] == [
        (1, "started"),
        (2, "transition"),
        (3, "sync"),
        (4, "peer_up"),
        (10, "redirect"),
        (13, "redirect"),
        (14, "sync"),
    ]
    # Read from part way, the ACTIVE run still starts at its transition: unprotected 2 .. 14.
    found = timeline.pair_timeline({"b": kept}, 5, 20)
    assert [(u["start"], u["end"]) for u in found["unprotected"]] == [(5, 14)]
    assert found["unprotected_today"]["seconds"] == pytest.approx(12.0)


def test_a_log_read_from_part_way_leaves_the_lane_unknown_before_it() -> None:
    logs = {
        "a": [{"v": 1, "ts": 50.0, "node": "a", "event": "peer_up", "state": "PASSIVE"}],
        "b": [
            {"v": 1, "ts": 20.0, "node": "b", "event": "started", "state": "PRIMARY"},
            {"v": 1, "ts": 21.0, "node": "b", "event": "transition", "state": "ACTIVE"},
        ],
    }
    found = timeline.pair_timeline(logs, 0, 100)
    # Drawn from where the logs begin; the lane of "a" is not known before its first record.
    assert found["start"] == 20.0
    lanes = [(lane["node"], lane["state"], lane["start"], lane["end"]) for lane in found["lanes"]]
    assert lanes == [
        ("a", None, 20.0, 50.0),
        ("a", "PASSIVE", 50.0, 100),
        ("b", "PRIMARY", 20.0, 21.0),
        ("b", "ACTIVE", 21.0, 100),
    ]
    # No outage is claimed where a lane is unknown.
    assert found["service_since"] == 50.0
    assert found["outages"] == []
