"""What the pages and the timeline show of a day of freezes: the failovers with their causes
and gaps, the dual-active spells and the quarantines (messages, file, replayed or not) in
``summary.md`` and ``report.html``, and labels that do not cover each other when failovers
are close. The figures themselves are checked in test_failovers.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from amqha.quarantine import _SCHEMA, ReplayProgress
from spark import pages, reference, replayed, timeline
from spark.text import render_text
from tests.spark import scenarios
from tests.spark.scenarios import BACKUP_QUARANTINE

PAIR = "backup+primary"


def _report(name: str, folder: Path, quarantine: Path | None = None):
    servers = getattr(scenarios, name)()
    if quarantine is not None:  # the file the log names is this one
        for server in servers:
            server.lines = [
                line.replace(BACKUP_QUARANTINE, str(quarantine)) for line in server.lines
            ]
    report = reference.compute([str(s.write(folder)) for s in servers], estimate_skew=False)
    return report


def _quarantine_file(path: Path, messages: int) -> None:
    """A quarantine file as a server writes it: its messages table, one row a message."""
    db = sqlite3.connect(path)
    db.execute(_SCHEMA)
    db.executemany(
        "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?)",
        [("/", "q", i, b"", b"", b"%d" % i) for i in range(messages)],
    )
    db.commit()
    db.close()


def test_the_pages_show_freezes_dual_active_and_quarantines(tmp_path: Path) -> None:
    file = tmp_path / "quarantine" / "1700000062-backup.sqlite"
    file.parent.mkdir()
    _quarantine_file(file, 5)
    report = _report("zombie_day", tmp_path / "logs", quarantine=file)
    replayed.annotate(report.summary, report.tables)
    sections = pages.document(report.summary, report.tables, [])
    md = pages.markdown(sections)
    page = pages.page(sections, str(tmp_path))
    text = render_text(report.summary, report.tables)
    for shown in (md, page):
        assert "freeze (silence, gap 20.000s)" in shown
        assert "stopped (refused)" in shown
        assert "3 of 3 failover(s), those with a peer lost" in shown
        assert "Dual active" in shown and "Quarantines" in shown
        assert "3152" in shown and str(file) in shown and "not replayed" in shown
        assert "1 quarantine(s), 3152 message(s) quarantined" in shown
    # The one dual-active spell, 30 .. 60 s after the first freeze's takeover (#1).
    assert (
        "| backup+primary | 1 | 2023-11-14T22:13:50.000Z | 2023-11-14T22:14:20.000Z | 30.000 |"
        in md
    )
    assert "<td>backup+primary</td><td class=n>1</td>" in page
    assert f"3152 message(s) in {file} (not replayed)" in text
    listed = report.summary["pairs"][PAIR]["quarantines"]["listed"]
    assert [(q["messages"], q["replayed"]) for q in listed] == [(3152, "not replayed")]


def test_a_quarantine_file_says_how_far_it_was_replayed(tmp_path: Path) -> None:
    file = tmp_path / "1700000062-backup.sqlite"
    assert replayed.replay_state(str(file), 3) == replayed.NOT_HERE
    _quarantine_file(file, 3)
    assert replayed.replay_state(str(file), 3) == "not replayed"
    progress = ReplayProgress(str(file))  # what ``amqha quarantine replay`` records
    progress.confirmed(progress.left()[:1])
    progress.close()
    assert replayed.replay_state(str(file), 3) == "1 of 3 replayed"
    file.rename(str(file) + ".replayed")
    assert replayed.replay_state(str(file), 3) == "replayed"
    assert replayed.replay_state(None, 3) == "unknown (no file named)"


def test_labels_of_close_failovers_do_not_overlap(tmp_path: Path) -> None:
    """Seven handovers a second apart in a minute: every label of the band above the
    service row is drawn clear of the others, inside the lanes' axes (under the title)."""
    report = _report("flapping", tmp_path)
    pair = report.summary["pairs"][PAIR]
    fig, _ = timeline.figure(pair, report.tables, [])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    top = fig.axes[0]
    labels = [t for t in top.texts if t.get_text().startswith("#") or t.get_text()[0].isdigit()]
    assert len(labels) == 9  # 8 failovers and the pair's start-up outage
    boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(boxes):
        assert a.y1 <= top.get_window_extent(renderer).y1, labels[i].get_text()
        for j in range(i):
            assert not a.overlaps(boxes[j]), (labels[i].get_text(), labels[j].get_text())
    timeline._pyplot().close(fig)
    timeline.render(str(tmp_path / "timeline.png"), pair, report.tables, [])
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_label_lines_put_each_label_on_the_lowest_free_line() -> None:
    # Three labels 10 wide at 0, 5 and 12, one at 30: the second cannot share the first's
    # line, the third can (it starts after the first ends), the fourth too.
    assert timeline.label_lines([0, 5, 12, 30], [10] * 4, gap=1) == [0, 1, 0, 0]
    assert timeline.label_lines([5, 0], [10, 10], gap=0) == [1, 0]  # by start, not by order
    assert timeline.label_lines([], [], gap=1) == []


def test_the_freeze_scenarios_are_in_time_order() -> None:
    for name in ("frozen_active", "zombie_day"):
        for server in getattr(scenarios, name)():
            times = [json.loads(line)["ts"] for line in server.lines]
            assert times == sorted(times), (name, server.name)
