"""bench/replication_bench.py: the disk's share of a replicated round, measured on the
disk the servers write to, and the cap it puts on the ratio."""

from __future__ import annotations

from pathlib import Path

from bench import replication_bench


def test_the_disk_share_measures_both_ways_and_leaves_no_file(tmp_path: Path) -> None:
    share = replication_bench.disk_share(tmp_path, 100_000)
    assert share["fsync_us_alone"] > 0 and share["fsync_us_two_at_once"] > 0
    # 100 in flight at 100,000 msg/s: a round of 1 ms.
    assert share["standalone_round_us"] == 1000
    assert 0 < share["cap"] <= 1
    slower = share["fsync_us_two_at_once"] - share["fsync_us_alone"]
    # The fsync figures are rounded to whole microseconds, the cap is not.
    assert abs(share["cap"] - 1000 / (1000 + max(0, slower))) < 0.002
    assert list(tmp_path.iterdir()) == []
