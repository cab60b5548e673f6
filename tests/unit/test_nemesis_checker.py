"""The checker and the schedule of ``make nemesis`` (bench/nemesis_check.py,
bench/nemesis_plan.py), on histories and seeds whose answers are known."""

from __future__ import annotations

import pytest

from bench import nemesis_check as check
from bench.nemesis_plan import KINDS, Fault, from_json, longest_freeze, schedule

D = check.Delivery


def history(**kwargs: object) -> check.History:
    made = check.History()
    for key, value in kwargs.items():
        setattr(made, key, value)
    return made


def test_a_clean_run_has_nothing_to_report() -> None:
    verdict = check.check(
        history(
            sent={"a": False, "b": False},
            confirmed={"a", "b"},
            deliveries=[D("a", 1.0, "c0"), D("b", 2.0, "drain")],
        )
    )
    assert verdict["lost"] == verdict["unexpected"] == verdict["duplicated"] == 0
    assert (verdict["confirmed"], verdict["delivered"]) == (2, 2)
    assert not check.failed(verdict)


def test_confirmed_never_delivered_and_not_in_quarantine_is_lost() -> None:
    verdict = check.check(
        history(
            sent={"a": False, "b": False, "c": False},
            confirmed={"a", "b", "c"},
            deliveries=[D("a", 1.0, "c0")],
            quarantined={"b"},
        )
    )
    assert verdict["lost"] == 1 and verdict["samples"]["lost"] == ["c"]
    assert verdict["quarantined_only"] == 1  # b: kept, served only after a replay
    assert check.failed(verdict)


def test_delivered_but_never_sent_is_unexpected() -> None:
    verdict = check.check(
        history(sent={"a": False}, confirmed={"a"}, deliveries=[D("a", 1, "c0"), D("zz", 2, "c1")])
    )
    assert verdict["unexpected"] == 1 and verdict["samples"]["unexpected"] == ["zz"]
    assert verdict["lost"] == 0 and check.failed(verdict)


def test_sent_but_never_confirmed_is_in_doubt_whether_delivered_or_not() -> None:
    verdict = check.check(
        history(
            sent={"a": False, "b": False, "c": False},
            confirmed={"a"},
            failed={"b"},
            deliveries=[D("a", 1, "c0"), D("c", 2, "c0")],
        )
    )
    assert verdict["in_doubt"] == 2 and verdict["in_doubt_delivered"] == 1
    assert verdict["lost"] == 0 and verdict["unexpected"] == 0 and not check.failed(verdict)


def test_duplicates_are_explained_by_a_doubt_or_unexplained() -> None:
    verdict = check.check(
        history(
            # p: its publisher failed over while holding it (sent twice)
            sent={"p": True, "r": False, "f": False, "x": False},
            confirmed={"p", "r", "f", "x"},
            deliveries=[
                D("p", 1, "c0"),
                D("p", 2, "c1"),
                # r: delivered again flagged redelivered (the ack never arrived)
                D("r", 1, "c0"),
                D("r", 3, "c1", redelivered=True),
                # f: its consumer lost its server after the first delivery
                D("f", 1, "c2"),
                D("f", 5, "drain"),
                # x: twice, no doubt anywhere
                D("x", 1, "c0"),
                D("x", 2, "c1"),
                D("x", 3, "c1"),
            ],
            consumer_failovers={"c2": [4.0], "c0": [0.5]},
        )
    )
    assert verdict["duplicated"] == 4 and verdict["duplicate_deliveries"] == 5
    assert verdict["duplicated_unexplained"] == 1
    assert verdict["samples"]["duplicated_unexplained"] == ["x"]
    assert verdict["confirmed_in_doubt"] == 1
    assert not check.failed(verdict)  # duplicates are at least once, not a failure


def test_intervals() -> None:
    assert check.merged([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert check.intersect([(0, 10)], [(2, 3), (8, 12)]) == [(2, 3), (8, 10)]
    assert check.subtract([(0, 10)], [(2, 3), (9, 11)]) == [(0, 2), (3, 9)]
    assert check.measure([(0, 2), (1, 3)]) == 3


def test_dual_active_leaves_out_the_time_one_of_them_was_frozen() -> None:
    # Both ACTIVE by their logs from 10 to 30; the first was frozen 5-25.
    assert check.dual_active_seconds([(0, 30)], [(10, 40)]) == 20
    assert check.dual_active_seconds([(0, 30)], [(10, 40)], asleep=[(5, 25)]) == 5


def test_dual_confirm_one_failover_makes_none_interleaved_confirms_do() -> None:
    first = [0.0, 0.1, 0.2, 0.3]
    assert check.dual_confirm_seconds(first, [0.5, 0.6, 0.7]) == 0
    # A zombie: thawed, the old server confirms again from 5.0 to 6.0 while the new one
    # confirms throughout.
    zombie = [*first, 5.0, 5.5, 6.0]
    new = [0.5 + 0.9 * n for n in range(8)]  # 0.5 .. 6.8
    assert check.dual_confirm_seconds(zombie, new) == pytest.approx(1.0)


def test_unavailable_counts_gaps_longer_than_the_grain() -> None:
    confirms = [1.0, 1.5, 2.0, 6.0, 6.5]
    # 0-1 (1 s: not more than the grain), 2-6 (4 s), 6.5-10 (3.5 s)
    assert check.unavailable_seconds(confirms, 0.0, 10.0) == pytest.approx(7.5)
    assert check.unavailable_seconds([], 0.0, 10.0) == 10.0


def test_takeovers_count_transitions_to_active_since_the_start() -> None:
    events = [
        {"event": "transition", "to": "ACTIVE", "ts": 1.0},
        {"event": "transition", "to": "PASSIVE", "ts": 5.0},
        {"event": "transition", "to": "ACTIVE", "ts": 9.0},
        {"event": "paused", "ts": 9.5},
    ]
    assert check.takeovers(events, since=2.0) == 1


# -- the schedule -------------------------------------------------------------------------------


def test_a_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    kinds = ("kill", "freeze", "partition", "one_way", "isolate")
    first = schedule(7, 600, kinds)
    assert first == schedule(7, 600, kinds)
    assert first != schedule(8, 600, kinds)
    assert all(0 < f.at < 600 for f in first)
    # One after another: each starts after the last one's end.
    assert all(b.at > a.at + a.seconds for a, b in zip(first, first[1:], strict=False))
    assert {f.kind for f in first} <= set(kinds)


def test_freezes_scale_with_the_duration() -> None:
    assert longest_freeze(60) == 15 and longest_freeze(3600) == 120 and longest_freeze(1) == 1
    for duration in (60, 3600):
        freezes = [f for f in schedule(3, duration, ("freeze",)) if f.kind == "freeze"]
        assert freezes and all(0.1 <= f.seconds <= longest_freeze(duration) for f in freezes)


def test_the_witness_is_a_target_only_when_there_is_one() -> None:
    alone = schedule(5, 3600, ("kill", "freeze"))
    witnessed = schedule(5, 3600, ("kill", "freeze"), witness=True)
    assert {f.target for f in alone} == {"active", "passive"}
    assert "witness" in {f.target for f in witnessed}


def test_bad_schedules_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="fault kinds are"):
        schedule(1, 60, ("earthquake",))
    with pytest.raises(ValueError, match="duration must be positive"):
        schedule(1, 0, KINDS)
    with pytest.raises(ValueError, match="unknown fault kind"):
        from_json([{"at": 1, "kind": "flood"}])
    with pytest.raises(ValueError, match="target is active, passive, witness or both"):
        from_json([{"at": 1, "kind": "kill", "target": "the moon"}])
    with pytest.raises(ValueError, match="target both is for power_cut only"):
        from_json([{"at": 1, "kind": "kill", "target": "both"}])
    assert from_json([{"at": 1, "kind": "power_cut", "target": "both", "seconds": 2}]) == [
        Fault(1.0, "power_cut", "both", 2.0)
    ]
    with pytest.raises(ValueError, match="a clock_step's target is active or passive and"):
        from_json([{"at": 1, "kind": "clock_step", "target": "active"}])
    assert from_json([{"at": 1, "kind": "clock_step", "target": "passive-", "seconds": 3}]) == [
        Fault(1.0, "clock_step", "passive-", 3.0)
    ]
    assert from_json([{"at": 5, "kind": "kill", "seconds": 1}, {"at": 1, "kind": "freeze"}]) == [
        Fault(1.0, "freeze", "active", 0.0),
        Fault(5.0, "kill", "active", 1.0),
    ]


def test_the_disk_and_clock_kinds_draw_their_own_targets() -> None:
    drawn = schedule(9, 3600, ("power_cut", "disk_error", "clock_step"))
    targets = {
        kind: {f.target for f in drawn if f.kind == kind} for kind in {f.kind for f in drawn}
    }
    assert targets["power_cut"] == {"active", "passive", "both"}
    assert targets["disk_error"] == {"active", "passive"}
    assert targets["clock_step"] == {"active+", "active-", "passive+", "passive-"}
    # A drawn schedule reads back as itself (the JSON a run prints can be replayed).
    assert from_json([f.to_json() for f in drawn]) == sorted(drawn, key=lambda f: f.at)
