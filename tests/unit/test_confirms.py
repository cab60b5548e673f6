"""Publisher confirms released by the store's watermark, in publish order."""

from __future__ import annotations

from amqha.core.confirms import Confirms


def test_confirms_wait_for_the_store_and_go_out_as_one_multiple_ack() -> None:
    confirms = Confirms()
    for lsn in (10, 11, 12):
        confirms.wait_for(confirms.publish(), lsn)
    assert confirms.due() == []
    assert confirms.progress(11)
    assert confirms.due() == [(True, 2, True)]
    assert not confirms.progress(11)
    confirms.progress(12)
    assert confirms.due() == [(True, 3, False)]


def test_a_nack_of_a_later_publish_never_acks_earlier_ones_not_yet_safe() -> None:
    confirms = Confirms()
    confirms.wait_for(confirms.publish(), 5)  # 1: waits for the store
    confirms.refuse(confirms.publish())  # 2: refused (reject-publish)
    confirms.publish()  # 3: needs nothing
    assert confirms.due() == []  # nothing may go out before 1 is safe
    confirms.progress(5)
    assert confirms.due() == [(True, 1, False), (False, 2, False), (True, 3, False)]


def test_a_multiple_ack_never_covers_a_nack() -> None:
    confirms = Confirms()
    for _ in range(3):
        confirms.publish()
    confirms.refuse(confirms.publish())  # 4
    confirms.publish()  # 5
    assert confirms.due() == [(True, 3, True), (False, 4, False), (True, 5, False)]


def test_a_failed_write_nacks_exactly_its_publishes() -> None:
    confirms = Confirms()
    confirms.wait_for(confirms.publish(), 3)  # 1
    confirms.wait_for(confirms.publish(), 7)  # 2, in the failed write
    confirms.wait_for(confirms.publish(), 8)  # 3, in the failed write
    confirms.wait_for(confirms.publish(), 12)  # 4
    confirms.progress(3)
    assert confirms.refuse_range(4, 9)
    confirms.progress(9)
    assert confirms.due() == [(True, 1, False), (False, 2, False), (False, 3, False)]
    confirms.progress(12)
    assert confirms.due() == [(True, 4, False)]


def test_a_failed_write_is_nacked_before_the_watermark_reaches_it() -> None:
    """With confirms waiting for a PASSIVE behind the failed range, the failure still
    nacks its publishes at once: they are not on this server's disk, and acking them
    later, on the PASSIVE's copy alone, lost them if this server then led."""
    confirms = Confirms()
    confirms.wait_for(confirms.publish(), 3)  # 1
    confirms.wait_for(confirms.publish(), 7)  # 2, in the failed write
    confirms.wait_for(confirms.publish(), 12)  # 3
    assert confirms.refuse_range(4, 9)
    assert not confirms.refuse_range(4, 9)
    confirms.progress(2)  # the PASSIVE is behind: nothing is safe yet
    assert confirms.due() == []
    confirms.progress(12)
    assert confirms.due() == [(True, 1, False), (False, 2, False), (True, 3, False)]


def test_publishes_not_yet_safe_are_dropped_on_close() -> None:
    confirms = Confirms()
    confirms.publish()
    confirms.wait_for(confirms.publish(), 4)
    confirms.drop_unsafe()
    # Only what was safe before the close may still be confirmed.
    assert confirms.due() == [(True, 1, False)]
