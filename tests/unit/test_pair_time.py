"""The pair time a PASSIVE takes from its ACTIVE's state messages (amqha.clock)."""

from __future__ import annotations

from amqha.clock import offset_to_follow

SLACK = 0.25


def test_the_first_message_sets_the_time() -> None:
    assert offset_to_follow([3600.0], 0.0, SLACK) == 3600.0
    assert offset_to_follow([-3600.0], 0.0, SLACK) == -3600.0


def test_within_the_slack_nothing_moves() -> None:
    assert offset_to_follow([0.1, -0.2], 0.0, SLACK) is None


def test_a_message_held_up_does_not_set_the_time_back() -> None:
    # A busy machine: one message spent 0.3 s in flight; the others did not.
    assert offset_to_follow([0.0, 0.001, -0.3, 0.002], 0.0, SLACK) is None


def test_a_time_behind_is_taken_once_every_recent_message_says_so() -> None:
    assert offset_to_follow([-5.0, -5.001, -5.0], 0.0, SLACK) == -5.0


def test_nothing_heard_keeps_the_time() -> None:
    assert offset_to_follow([], 7.0, SLACK) is None
