"""The deterministic simulator of failover under freezes (tests/sim/freeze.py): the real
machine in a copy of its controller's shell, two servers, delays, link resets, kills and
freezes. The rule after a freeze keeps one server serving at a time over its schedules;
the shell before it does not. ``make simulate`` runs many more."""

from __future__ import annotations

from tests.sim.freeze import simulate_freezes

# Found by these schedules: a PASSIVE thawed, its heartbeat thread had seen the gap, and a
# client's Open was read before the report reached the loop: the vote counted silence
# across the freeze (FailoverController._freeze_not_yet_reported now feeds PAUSED first).
OPEN_BEFORE_THE_REPORT = 3281


def test_the_rule_keeps_one_server_serving_over_300_schedules() -> None:
    failing = [(seed, simulate_freezes(seed).failures[:1]) for seed in range(300)]
    assert [each for each in failing if each[1]] == []


def test_the_schedules_exercise_the_rule() -> None:
    results = [simulate_freezes(seed) for seed in range(40)]
    assert sum(r.freezes for r in results) > 100
    assert sum(r.fenced for r in results) > 20  # ACTIVEs thawed and fenced
    assert sum(r.takeovers for r in results) > 40
    assert sum(r.kills for r in results) > 0


def test_the_shell_before_the_rule_serves_beside_its_peer_and_the_seed_replays() -> None:
    found = next(seed for seed in range(200) if not simulate_freezes(seed, old=True).ok)
    first, again = simulate_freezes(found, old=True), simulate_freezes(found, old=True)
    assert any(
        "serves beside it" in f or "voted in on silence across its freeze" in f
        for f in first.failures
    )
    assert again.failures == first.failures and again.trace == first.trace
    assert simulate_freezes(found).ok


def test_an_open_read_before_the_freeze_report_does_not_vote() -> None:
    assert simulate_freezes(OPEN_BEFORE_THE_REPORT).ok


def test_one_seed_is_one_schedule() -> None:
    for seed in (3, 99):
        assert simulate_freezes(seed).trace == simulate_freezes(seed).trace
    assert simulate_freezes(1).trace != simulate_freezes(2).trace
