"""The pictures: dense incidents are clustered, the redirect bars sit at their true time and
a minute that starts before the window is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import reference, timeline
from spark.metrics import minute_row
from tests.spark import scenarios


def test_two_hundred_incidents_become_few_markers() -> None:
    incidents = [{"lost_ts": 1000.0 + i * 5.0} for i in range(200)]  # one every 5 s
    span = 200 * 5.0
    clusters = timeline._clusters(incidents, span / timeline.CLUSTERS)
    assert len(clusters) <= timeline.CLUSTERS
    assert sum(len(c) for c in clusters) == 200


def test_a_minute_starting_before_the_window_is_kept_at_its_true_start() -> None:
    window = (1000.0, 2000.0)
    row = minute_row("p", "backup", 960, (3, 1), offset=0.0, window=window)
    assert row is not None and (row["at"], row["redirects"]) == (960.0, 3)
    moved = minute_row("p", "backup", 1020, (1, 0), offset=30.0, window=window)
    assert moved is not None and moved["at"] == 990.0 and moved["minute_start"] == 1020
    assert minute_row("p", "backup", 900, (1, 0), offset=0.0, window=window) is None


def test_pictures_are_drawn(tmp_path: Path) -> None:
    paths = [str(s.write(tmp_path)) for s in scenarios.console_recovery()]
    report = reference.compute(paths)
    (pair,) = report.summary["pairs"].values()
    activity = [
        {
            "node": r["node"],
            "at": r["at"],
            "redirects": r["redirects"],
            "refusals": r["refusals"],
            "width": 60,
        }
        for r in report.tables["redirects_per_minute"]
    ]
    timeline.render(str(tmp_path / "timeline.png"), pair, report.tables, activity)
    timeline.render_fleet(str(tmp_path / "fleet.png"), report.summary, report.tables["daily"])
    for name in ("timeline.png", "fleet.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_fleet_heat_map_marks_the_days_a_pair_was_unprotected(tmp_path: Path) -> None:
    """A pair that took over with no in-sync PASSIVE gets a ``u`` on that day, and the
    title carries the fleet's unprotected time; a pair whose logs have no sync records
    gets no mark and no figure (not recorded is not 0)."""
    unprotected_paths = [str(s.write(tmp_path / "u")) for s in scenarios.unprotected_takeover()]
    unrecorded_paths = [str(s.write(tmp_path / "n")) for s in scenarios.console_recovery()]
    for paths, marked in ((unprotected_paths, True), (unrecorded_paths, False)):
        report = reference.compute(paths)
        daily = report.tables["daily"]
        order = sorted(report.summary["pairs"])
        days = sorted({d["day"] for d in daily})
        cells = {(d["pair"], d["day"]): d for d in daily}
        marks = timeline.fleet_marks(order, days, cells)
        unprotected = report.summary["fleet"]["unprotected"]
        if marked:
            assert marks and all(m.startswith("u") for m in marks.values()), marks
            assert unprotected["seconds"] > 0
            assert f"unprotected {unprotected['seconds']:.1f} s" in timeline.fleet_title(
                report.summary
            )
        else:
            assert "u" not in "".join(marks.values()), marks
            assert unprotected["pairs_recorded"] == 0
            assert "unprotected" not in timeline.fleet_title(report.summary)
        timeline.render_fleet(str(tmp_path / "fleet.png"), report.summary, daily)
        assert (tmp_path / "fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_fleet_map_counts_nines_and_writes_each_figure() -> None:
    """The colour is the count of nines, so 99.98% and 100% differ; the figure in a cell is
    cut, never rounded up to 100."""
    assert timeline.nines(0.99) == pytest.approx(2.0)
    assert timeline.nines(0.9998) == pytest.approx(3.699, abs=1e-3)
    assert timeline.nines(1.0) == timeline.NINES_CAP > 5 > timeline.nines(0.99998)
    assert [timeline.cell_figure(a) for a in (1.0, 0.9998, 0.99996, 0.995, 0.93)] == [
        "100",
        "99.98",
        "99.996",
        "99.5",
        "93",
    ]
    assert timeline.cell_figure(0.999999) != "100"


def test_a_picture_of_a_pair_without_data_says_so(tmp_path: Path) -> None:
    paths = [str(s.write(tmp_path)) for s in scenarios.console_recovery()]
    report = reference.compute(paths, since=1.0, until=2.0)
    (pair,) = report.summary["pairs"].values()
    timeline.render(str(tmp_path / "timeline.png"), pair, report.tables, [])
    timeline.render_fleet(str(tmp_path / "fleet.png"), report.summary, report.tables["daily"])
    for name in ("timeline.png", "fleet.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
