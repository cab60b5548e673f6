"""Unprotected time: an ACTIVE with no in-sync PASSIVE, from the ACTIVE's own ``sync``
records. Known answers on hand-built logs (the stories are in ``tests.spark.scenarios``),
the Spark job equal to the reference on each, logs without sync records reported as "not
recorded" (null, never 0), and a real pair's logs through a kill -9 and a takeover with no
in-sync PASSIVE.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from spark import job, output, reference
from spark.model import CLOCK_RESOLUTION_S
from spark.spells import _moved_cover
from spark.text import render_text
from tests.pairs import MakePair, client_vote, poll
from tests.spark import scenarios
from tests.spark.compare import assert_same_report, same
from tests.spark.logs import T0

PAIR = "backup+primary"


@dataclass
class Unprotected:
    """A story's unprotected spans (node, start, end in seconds after T0), worked out by hand."""

    spans: list[tuple[str, float, float]]
    seconds: float
    quarantines: list[tuple[float, str, int]] = field(default_factory=list)  # at, node, messages
    planned: float = 0.0  # of ``seconds``, while the ACTIVE's peer was in maintenance


CASES = {
    # One ACTIVE run: unprotected until the PASSIVE has caught up (1.01 .. 3.0), and again
    # while the PASSIVE resyncs (20 .. 25).
    "sync_caught_up": Unprotected([("primary", 1.01, 3.0), ("primary", 20.0, 25.0)], 6.99),
    # The backup takes over by client vote with no PASSIVE: unprotected from its transition
    # (14 s, before its own out_of_sync record) until the restarted primary is in sync (33 s).
    # The outage before it (no ACTIVE at all) is not unprotected time.
    "unprotected_takeover": Unprotected([("primary", 1.01, 3.0), ("backup", 14.0, 33.0)], 20.99),
    # The unprotected backup is killed: its span ends with its last sign of life (21.5 s).
    "crash_unprotected": Unprotected([("primary", 1.01, 3.0), ("backup", 14.0, 21.5)], 9.49),
    # Dual active, both unprotected: the pair's time is their union (12.6 .. 22 s).
    "split_quarantine": Unprotected(
        [("primary", 1.01, 2.0), ("primary", 12.6, 20.02), ("backup", 15.0, 22.0)],
        0.99 + 9.4,
        quarantines=[(20.5, "primary", 7)],
    ),
    # As sync_caught_up, with the backup in maintenance 19.5 .. 23 s by the primary's records:
    # 20 .. 23 of the second span is planned.
    "maintenance_patch": Unprotected(
        [("primary", 1.01, 3.0), ("primary", 20.0, 25.0)], 6.99, planned=3.0
    ),
}


def build(name: str, folder: Path, **story) -> list[str]:
    return [str(server.write(folder)) for server in getattr(scenarios, name)(**story)]


@pytest.mark.parametrize("estimate_skew", [True, False], ids=["estimated", "trusted"])
@pytest.mark.parametrize("name", CASES)
def test_reference_gives_the_known_answer(name: str, estimate_skew: bool, tmp_path: Path) -> None:
    known = CASES[name]
    report = reference.compute(build(name, tmp_path), estimate_skew=estimate_skew)
    summary = report.summary["pairs"][PAIR]
    rows = report.tables["unprotected"]
    same(
        [(r["node"], r["start"] - T0, r["end"] - T0, r["duration_s"]) for r in rows],
        sorted(((n, s, e, e - s) for n, s, e in known.spans), key=lambda x: x[1]),
        "unprotected",
    )
    # A span's length is one server's clock's: an offset the logs bound to 0.19 s moves
    # where it lies, not how long it is, and it lies well inside the window.
    assert not any(r["uncertain"] for r in rows)
    same(
        [(r["min_duration_s"], r["max_duration_s"]) for r in rows],
        [(r["duration_s"],) * 2 for r in rows],
    )
    unprotected = summary["unprotected"]
    assert unprotected["recorded"] is True
    same(unprotected["seconds"], known.seconds, "seconds")
    same(unprotected["fraction"], known.seconds / summary["window"]["seconds"], "fraction")
    assert unprotected["spans"] == len(known.spans)
    same(unprotected["planned_seconds"], known.planned, "planned")
    same(unprotected["unplanned_seconds"], known.seconds - known.planned, "unplanned")
    assert unprotected["min_seconds"] <= unprotected["seconds"] <= unprotected["max_seconds"]
    (daily,) = report.tables["daily"]
    same(daily["unprotected_s"], known.seconds, "daily")
    same(daily["unprotected_fraction"], known.seconds / daily["seconds"], "daily fraction")
    same(
        [(q["ts"] - T0, q["node"], q["messages"]) for q in report.tables["quarantines"]],
        known.quarantines,
        "quarantines",
    )
    assert (daily["quarantines"], daily["quarantined_messages"]) == (
        len(known.quarantines),
        sum(q[2] for q in known.quarantines),
    )
    fleet = report.summary["fleet"]["unprotected"]
    assert (fleet["pairs_recorded"], fleet["not_recorded"]) == (1, [])
    same(fleet["seconds"], known.seconds, "fleet")
    same(fleet["planned_seconds"], known.planned, "fleet planned")
    text = render_text(report.summary, report.tables)
    assert ("planned (a server in maintenance) 3.000s, unplanned 3.990s" in text) == bool(
        known.planned
    )


def test_one_server_alone_is_exact_when_the_other_is_not_unprotected(tmp_path: Path) -> None:
    # Spans of one server never overlap another's here: the pair's range is its total.
    report = reference.compute(build("unprotected_takeover", tmp_path))
    unprotected = report.summary["pairs"][PAIR]["unprotected"]
    same((unprotected["min_seconds"], unprotected["max_seconds"]), (20.99, 20.99))


def test_quarantine_is_listed_in_the_summary(tmp_path: Path) -> None:
    report = reference.compute(build("split_quarantine", tmp_path))
    quarantines = report.summary["pairs"][PAIR]["quarantines"]
    assert (quarantines["count"], quarantines["messages"]) == (1, 7)
    (listed,) = quarantines["listed"]
    assert listed["path"] == "/var/lib/amqha/primary/quarantine/1700000020-primary.sqlite"
    assert report.summary["fleet"]["quarantines"] == {"count": 1, "messages": 7}
    text = render_text(report.summary, report.tables)
    assert "7 message(s) in /var/lib/amqha/primary/quarantine/1700000020-primary.sqlite" in text
    assert "unprotected 10.390s" in text


def test_logs_without_sync_records_are_not_recorded(tmp_path: Path) -> None:
    report = reference.compute(build("crash_takeover", tmp_path))
    unprotected = report.summary["pairs"][PAIR]["unprotected"]
    assert unprotected["recorded"] is False
    assert all(unprotected[k] is None for k in unprotected if k != "recorded")
    assert report.tables["unprotected"] == []
    (daily,) = report.tables["daily"]
    assert [daily[c] for c in ("unprotected_s", "unprotected_fraction")] == [None, None]
    assert [daily[c] for c in ("min_unprotected_s", "max_unprotected_s")] == [None, None]
    fleet = report.summary["fleet"]["unprotected"]
    assert fleet == {
        "pairs_recorded": 0,
        "seconds": None,
        "fraction": None,
        "max_seconds": None,
        "planned_seconds": None,
        "not_recorded": [PAIR],
    }
    text = render_text(report.summary, report.tables)
    assert "unprotected not recorded" in text
    assert "unprotected 0" not in text


def test_a_window_edge_makes_a_moved_span_uncertain(tmp_path: Path) -> None:
    """The backup's clock 5 s ahead; the window ends at 20 s, inside its 14 .. 33 s span."""
    paths = build("unprotected_takeover", tmp_path, backup_skew=5.0)
    report = reference.compute(paths, until=T0 + 20.0)
    offset = report.summary["pairs"][PAIR]["clock_offsets"]["backup"]
    assert not offset["known"]
    backup = next(r for r in report.tables["unprotected"] if r["node"] == "backup")
    # On its clock the span starts at 19 s: 1 s before the window's end, plus the offset.
    same(backup["duration_s"], 1.0 + offset["seconds"])
    same(
        (backup["min_duration_s"], backup["max_duration_s"]),
        (1 + offset["lower"], 1 + offset["upper"]),
    )
    assert backup["uncertain"]
    same(backup["min_duration_s"], 5.9)  # the true 6 s lies in the range
    assert backup["min_duration_s"] <= 6.0 <= backup["max_duration_s"]


def test_moved_cover_is_the_extremes_over_the_offsets() -> None:
    """Against a dense scan of offsets: the sweep finds the least and most cover."""
    rng = random.Random(3)
    for _ in range(200):
        spans, at = [], rng.uniform(0, 5)
        for _ in range(rng.randrange(1, 5)):
            start = at + rng.uniform(0.1, 3)
            at = start + rng.uniform(0.1, 4)
            spans.append((start, at if rng.random() < 0.9 else math.inf))
            if math.isinf(at):
                break
        lower = rng.uniform(-6, 3)
        upper = lower + rng.uniform(0, 6)
        lo, hi = sorted((rng.uniform(0, 15), rng.uniform(0, 15)))
        least, most = _moved_cover(spans, lower, upper, lo, hi)
        scan = [lower + (upper - lower) * i / 2000 for i in range(2001)]
        covers = [sum(max(0.0, min(e - d, hi) - max(s - d, lo)) for s, e in spans) for d in scan]
        step = (upper - lower) / 2000
        assert min(covers) - step <= least <= min(covers) + 1e-9
        assert max(covers) - 1e-9 <= most <= max(covers) + step
    # Unbounded: the span may be anywhere, even outside.
    assert _moved_cover([(10.0, 20.0)], -math.inf, math.inf, 0.0, 100.0) == (0.0, 10.0)
    assert _moved_cover([(10.0, math.inf)], -math.inf, 0.0, 0.0, 100.0) == (0.0, 90.0)


# ---------------------------------------------------------------- Spark equals the reference


# (Logs without sync records go through Spark in test_not_recorded_is_null_in_the_tables.)
SPARK_CASES = {
    **{name: {} for name in CASES},
    "skewed_window": {
        "name": "unprotected_takeover",
        "story": {"backup_skew": 5.0},
        "until": T0 + 20.0,
    },
}


@pytest.mark.spark
@pytest.mark.parametrize("case", SPARK_CASES)
def test_spark_equals_reference(case: str, tmp_path: Path, spark_session, whole) -> None:
    options = dict(SPARK_CASES[case])
    name = options.pop("name", case)
    paths = build(name, tmp_path, **options.pop("story", {}))
    assert_same_report(
        job.compute(spark_session, paths, whole=whole, **options),
        reference.compute(paths, **options),
    )


def mixed_fleet(folder: Path) -> list[str]:
    """eu-1 replicates (sync_caught_up); us-1 runs servers that write no sync record."""
    paths = []
    for server in scenarios.sync_caught_up():
        paths.append(str(server.write(folder / "pair=eu-1")))
    for server in scenarios.crash_takeover():
        paths.append(str(server.write(folder / "pair=us-1")))
    return paths


@pytest.mark.spark
def test_not_recorded_is_null_in_the_tables(tmp_path: Path, spark_session, read_as) -> None:
    paths = mixed_fleet(tmp_path / "logs")
    out = tmp_path / "out"
    summary = job.run_report(paths, str(out))
    assert summary["fleet"]["unprotected"]["not_recorded"] == ["us-1"]
    assert summary["fleet"]["unprotected"]["pairs_recorded"] == 1
    same(summary["fleet"]["unprotected"]["seconds"], 6.99)
    worst = {w["pair"]: w["unprotected_seconds"] for w in summary["fleet"]["worst"]}
    assert worst["us-1"] is None and worst["eu-1"] == pytest.approx(6.99)
    daily = spark_session.read.schema(output.table_schema("daily")).parquet(
        str(out / "daily" / "parquet")
    )
    found = {r["pair"]: r for r in daily.collect()}
    assert found["us-1"]["unprotected_s"] is None
    assert found["us-1"]["unprotected_fraction"] is None
    assert found["eu-1"]["unprotected_s"] == pytest.approx(6.99)
    rows = spark_session.read.schema(output.table_schema("unprotected")).parquet(
        str(out / "unprotected" / "parquet")
    )
    assert sorted((r["pair"], r["node"], r["duration_s"]) for r in rows.collect()) == [
        ("eu-1", "primary", pytest.approx(1.99)),
        ("eu-1", "primary", pytest.approx(5.0)),
    ]
    with open(out / "daily" / "daily.csv", encoding="utf-8") as stream:
        header, *lines = [line.rstrip("\n").split(",") for line in stream]
    us = next(line for line in lines if line[0] == "us-1")
    assert us[header.index("unprotected_s")] == ""  # empty, not 0


# ---------------------------------------------------------------- a real pair


@pytest.mark.spark
async def test_a_real_takeover_is_unprotected_until_the_passive_caught_up(
    make_pair: MakePair, tmp_path: Path, spark_session
) -> None:
    pair = make_pair(proxied=False, heartbeat=0.2, timeout=0.6).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30.0)

    def primary_in_sync_record() -> dict | None:
        return next(
            (
                e
                for e in pair.events(pair.primary)
                if e["event"] == "sync" and e.get("side") == "active" and e["sync"] == "in_sync"
            ),
            None,
        )

    # Killed only once it has recorded its PASSIVE in sync (the backup may know it first:
    # it is in sync once its store has the snapshot, before its ack reaches the primary).
    await poll(primary_in_sync_record, 30.0, "the primary's in_sync record")
    pair.kill(pair.primary)
    # The backup was in sync: the client vote makes it ACTIVE, with no PASSIVE to follow it.
    assert (await client_vote([pair.backup]))["name"] == "backup"
    pair.primary.start()
    await pair.wait_states("PASSIVE", "ACTIVE", timeout=30.0)

    def caught_up() -> dict | None:
        return next(
            (
                e
                for e in pair.events(pair.backup)
                if e["event"] == "sync"
                and e.get("side") == "active"
                and e["sync"] == "in_sync"
                and e["state"] == "ACTIVE"
            ),
            None,
        )

    record = await poll(caught_up, 30.0, "the new ACTIVE's in_sync record")
    # Some protected time after it, seen from both sides: each server has heard a state
    # message the other sent two heartbeats after the in_sync record.
    after = record["ts"] + 2 * pair.heartbeat
    deadline = time.monotonic() + 30.0
    for _ in range(600):  # bounded in count and in time
        statuses = [await pair.status(server) for server in pair.servers]
        if all((s.get("peer") or {}).get("last_seen", 0) > after for s in statuses):
            break
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert all((s.get("peer") or {}).get("last_seen", 0) > after for s in statuses), statuses
    # The ACTIVE first: stopping its PASSIVE first would leave it unprotected until it stops.
    pair.backup.stop()
    pair.stop()

    logs = {s.name: pair.events(s) for s in pair.servers}
    takeover = next(e for e in logs["backup"] if e["event"] == "transition" and e["to"] == "ACTIVE")
    in_sync = next(
        e
        for e in logs["backup"]
        if e["event"] == "sync"
        and e["side"] == "active"
        and e["sync"] == "in_sync"
        and e["ts"] > takeover["ts"]
    )
    assert any(
        e["event"] == "sync"
        and e["side"] == "active"
        and e["sync"] == "out_of_sync"
        and takeover["ts"] <= e["ts"] < in_sync["ts"]
        for e in logs["backup"]
    )
    paths = [str(s.events_path) for s in pair.servers]
    expected = reference.compute(paths)
    assert_same_report(job.compute(spark_session, paths), expected)

    summary = expected.summary["pairs"][PAIR]
    assert summary["unprotected"]["recorded"] is True
    # Both servers share this machine's clock: whatever the offset's interval, the span is
    # the backup's own records, to the clocks' resolution.
    backup_rows = [r for r in expected.tables["unprotected"] if r["node"] == "backup"]
    assert backup_rows and not any(r["uncertain"] for r in backup_rows)
    start, end = backup_rows[0]["start"], backup_rows[-1]["end"]  # rows split at midnight
    assert abs(start - takeover["ts"]) <= CLOCK_RESOLUTION_S
    assert abs(end - in_sync["ts"]) <= CLOCK_RESOLUTION_S
    backup_seconds = sum(r["duration_s"] for r in backup_rows)
    same(backup_seconds, in_sync["ts"] - takeover["ts"])
    # The primary, ACTIVE at the start, was unprotected until the backup first caught up;
    # killed while in sync, it adds nothing more.
    primary_active = next(
        e for e in logs["primary"] if e["event"] == "transition" and e["to"] == "ACTIVE"
    )
    primary_in_sync = next(
        e
        for e in logs["primary"]
        if e["event"] == "sync" and e["side"] == "active" and e["sync"] == "in_sync"
    )
    primary_seconds = sum(
        r["duration_s"] for r in expected.tables["unprotected"] if r["node"] == "primary"
    )
    same(primary_seconds, primary_in_sync["ts"] - primary_active["ts"])
    same(summary["unprotected"]["seconds"], backup_seconds + primary_seconds, "pair total")
