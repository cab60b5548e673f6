"""When a PASSIVE acks what it kept (amqha/follower.py, docs/durability.md section 5)."""

from __future__ import annotations

from amqha.follower import acks_may_go
from amqha.replication import UNAPPLIED_BYTES, UNAPPLIED_CHANGES


def test_acks_go_while_little_is_left_to_apply() -> None:
    assert acks_may_go(0, 0, behind=False)
    assert acks_may_go(UNAPPLIED_CHANGES, UNAPPLIED_BYTES, behind=False)


def test_acks_wait_for_the_apply_past_either_bound() -> None:
    assert not acks_may_go(UNAPPLIED_CHANGES + 1, 0, behind=False)
    assert not acks_may_go(0, UNAPPLIED_BYTES + 1, behind=False)


def test_an_active_near_dropping_its_subscriber_gets_its_acks() -> None:
    assert acks_may_go(UNAPPLIED_CHANGES * 100, UNAPPLIED_BYTES * 100, behind=True)
