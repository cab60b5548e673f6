"""The collector kept from long pauses (amqha/collector.py): the rule, and the real
collector frozen after a slow full collection and thawed once few frozen objects live."""

from __future__ import annotations

import gc

import pytest

from amqha import collector
from amqha.collector import COUNT_SPACING, SLOW, THAW_BELOW, Collector, count_due, decide


def test_the_rule() -> None:
    assert decide(SLOW * 2, 0) == "freeze"
    assert decide(SLOW / 2, 0) is None and decide(0, 0) is None
    # Many frozen: what came since the last look is frozen too, collection or not.
    assert decide(0, THAW_BELOW * 10) == "freeze"
    assert decide(SLOW / 2, THAW_BELOW - 1) == "thaw"


def test_the_frozen_objects_are_counted_again_only_once_a_hundred_times_the_last_count_passed() -> (
    None
):
    assert count_due(5.0, None, 0.0)  # never counted
    took = 0.125  # binary-exact times
    assert not count_due(10.0 + COUNT_SPACING * took - 0.0625, 10.0, took)
    assert count_due(10.0 + COUNT_SPACING * took, 10.0, took)
    assert count_due(10.0, 10.0, 0.0)  # a count that took nothing: at every look


class Held:
    __slots__ = ("body", "next")

    def __init__(self, n: int) -> None:
        self.body = b"%d" % n
        self.next = None


def test_a_slow_full_collection_freezes_its_survivors_and_few_left_thaw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert gc.get_freeze_count() == 0
    # A slow collection here is one over 300,000 objects at a threshold 100 times lower.
    monkeypatch.setattr(collector, "SLOW", SLOW / 100)
    monkeypatch.setattr(collector, "COUNT_SPACING", 0)  # counted at every look
    watch = Collector()
    watch.install()
    try:
        held = [Held(n) for n in range(300_000)]
        gc.collect()
        assert watch.last_full > SLOW / 100
        assert watch.check() == "freeze"
        assert gc.get_freeze_count() >= len(held)
        # The frozen objects are left out of full collections: not among what one walks
        # (not how long it takes: a loaded machine made a short one 0.53 ms, over 0.5).
        walked = {id(tracked) for tracked in gc.get_objects()}
        assert not any(id(one) in walked for one in held)
        # Few left: the test process's own objects and a quarter of these (the bound set
        # from what this process holds besides).
        others = gc.get_freeze_count() - len(held)
        monkeypatch.setattr(collector, "THAW_BELOW", others + len(held) // 2)
        assert watch.check() == "freeze"  # not thawed: most are alive
        del held[len(held) // 4 :]  # freed by reference counting, frozen or not
        # The status is the last look's count: it walks nothing of its own.
        assert watch.status()["frozen_objects"] >= others + 300_000
        # Until a count is due, a look keeps the last one (so freezes again).
        monkeypatch.setattr(collector, "COUNT_SPACING", 10**9)
        assert watch.check() == "freeze"
        monkeypatch.setattr(collector, "COUNT_SPACING", 0)
        assert watch.check() == "thaw" and gc.get_freeze_count() == 0
        assert watch.status()["frozen_objects"] == 0
        assert watch.status()["freezes"] == 3 and watch.status()["thaws"] == 1
    finally:
        watch.remove()
        gc.unfreeze()
