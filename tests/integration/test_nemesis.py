"""``make nemesis`` end to end on a short fixed schedule, so the harness cannot rot: a real
pair on loopback, 10 publishers and 10 consumers, one freeze of the ACTIVE (shorter than
the clients' and the pair's stuck limits), one kill -9 of the ACTIVE, a power cut of both
servers and an I/O error on the ACTIVE's disk (each server's data dir on a disk that
forgets, tests/lazyfs.py); the checker then finds every confirmed message delivered and
nothing nobody sent (bench/nemesis.py)."""

from __future__ import annotations

from pathlib import Path

from bench import nemesis
from bench.nemesis_plan import Fault
from tests import lazyfs


async def test_a_short_fixed_schedule_loses_nothing(tmp_path: Path) -> None:
    faults = [
        Fault(2.0, "freeze", "active", 3.0),
        Fault(7.0, "kill", "active", 1.0),
        Fault(11.0, "power_cut", "both", 1.0),
        Fault(15.0, "disk_error", "active", 1.5),
    ]
    disks = lazyfs.unavailable() is None  # without FUSE the disk faults are left out
    result = await nemesis.run(
        nemesis.Options(
            duration=20.0,
            seed=0,
            namespaces=False,
            faults=faults if disks else faults[:2],
            keep_dir=tmp_path,
        )
    )
    print(result)
    assert "error" not in result, result.get("error")
    assert result["lost"] == 0 and result["unexpected"] == 0, result["samples"]
    assert result["confirmed"] > 1000 and result["delivered"] >= result["confirmed"]
    applied = result["schedule"]
    # The freeze hits the primary; the kill whichever is ACTIVE after it (clients that
    # notice a silent server vote the backup in during the freeze).
    kinds = ["freeze", "kill", "power_cut", "disk_error"] if disks else ["freeze", "kill"]
    assert [f["kind"] for f in applied] == kinds
    assert applied[0]["server"] == "primary" and applied[1]["server"] in ("primary", "backup")
    assert all("healed_at" in f and "error" not in f for f in applied)
    assert result["takeovers"] >= 1  # the kill: the backup takes over, or the restart leads
    assert result["settled"] and result["passed"] and "kept" not in result
