"""The collector kept from long pauses (amqha/collector.py): the rule, and the real
collector frozen after a slow full collection and thawed once few frozen objects live."""

from __future__ import annotations

import gc

import pytest

from amqha import collector
from amqha.collector import SLOW, THAW_BELOW, Collector, decide


def test_the_rule() -> None:
    assert decide(SLOW * 2, 0) == "freeze"
    assert decide(SLOW / 2, 0) is None and decide(0, 0) is None
    # Many frozen: what came since the last look is frozen too, collection or not.
    assert decide(0, THAW_BELOW * 10) == "freeze"
    assert decide(SLOW / 2, THAW_BELOW - 1) == "thaw"


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
    watch = Collector()
    watch.install()
    try:
        held = [Held(n) for n in range(300_000)]
        gc.collect()
        assert watch.last_full > SLOW / 100
        assert watch.check() == "freeze"
        assert gc.get_freeze_count() >= len(held)
        gc.collect()
        assert watch.last_full < SLOW / 100  # the frozen objects are left out
        # Few left: the test process's own objects and a quarter of these (the bound set
        # from what this process holds besides).
        others = gc.get_freeze_count() - len(held)
        monkeypatch.setattr(collector, "THAW_BELOW", others + len(held) // 2)
        assert watch.check() == "freeze"  # not thawed: most are alive
        del held[len(held) // 4 :]  # freed by reference counting, frozen or not
        assert watch.check() == "thaw" and gc.get_freeze_count() == 0
        assert watch.status()["freezes"] == 2 and watch.status()["thaws"] == 1
    finally:
        watch.remove()
        gc.unfreeze()
