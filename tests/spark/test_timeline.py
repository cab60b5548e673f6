"""The pictures: dense incidents are clustered, the redirect bars sit at their true time and
a minute that starts before the window is kept."""

from __future__ import annotations

from pathlib import Path

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
