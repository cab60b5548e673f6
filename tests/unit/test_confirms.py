"""Publisher confirms released by the store's watermark, in publish order."""

from __future__ import annotations

from amqha.core.confirms import Commit, Confirms, Waiting


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


# -- the confirm pipeline's book (core.confirms.Waiting) -----------------------------------


def test_the_watermark_releases_trackers_and_commits_as_values() -> None:
    """``advance`` answers what a new watermark frees, as values, and calls nobody: the
    trackers whose confirms are now due, the commits now done, each once."""
    waiting = Waiting()
    one, two = Confirms(1, "conn-a"), Confirms(2, "conn-b")
    waiting.expect(one, one.publish(), 5)
    waiting.expect(one, one.publish(), 9)
    waiting.expect(two, two.publish(), 7)
    commit = Commit(8, 3, "conn-a", object())
    waiting.expect_commit(commit)
    assert waiting.advance(4) == ([], [])
    due, done = waiting.advance(7)
    assert due == [one, two] and done == []
    assert one.due() == [(True, 1, False)] and two.due() == [(True, 1, False)]
    assert list(waiting.trackers) == [one]  # two has nothing left waiting
    due, done = waiting.advance(9)
    assert due == [one] and done == [commit]
    assert one.due() == [(True, 2, False)]
    assert waiting.trackers == {} and not waiting.commits
    assert waiting.advance(20) == ([], [])


def test_a_refused_range_releases_its_nacks_and_fails_its_commits() -> None:
    waiting = Waiting()
    confirms = Confirms(1, "conn")
    waiting.expect(confirms, confirms.publish(), 3)
    waiting.expect(confirms, confirms.publish(), 6)
    inside, after = Commit(5, 2, "conn", None), Commit(9, 2, "conn", None)
    waiting.expect_commit(inside)
    waiting.expect_commit(after)
    due, failed = waiting.refuse(4, 6)
    assert due == [confirms] and failed == [inside]
    assert confirms.due() == []  # publish 1 is not safe yet: the nack waits for it
    due, done = waiting.advance(9)
    assert due == [confirms] and done == [after]
    assert confirms.due() == [(True, 1, False), (False, 2, False)]


def test_a_closed_channels_tracker_is_forgotten() -> None:
    waiting = Waiting()
    confirms = Confirms(1, "conn")
    waiting.expect(confirms, confirms.publish(), 3)
    waiting.forget(confirms)
    assert waiting.trackers == {}
    assert waiting.advance(10) == ([], [])
    assert confirms.due() == []


def test_a_publish_whose_lsn_is_safe_already_waits_for_nothing() -> None:
    """A copy a deduplicating queue dropped waits for what came before it; when that is
    safe already, nothing will advance the watermark for it: ``expect`` says so."""
    waiting = Waiting()
    confirms = Confirms()
    waiting.advance(10)
    assert waiting.expect(confirms, confirms.publish(), 7) is False
    assert not confirms.unsafe and confirms not in waiting.trackers
    assert confirms.due() == [(True, 1, False)]
    assert waiting.expect(confirms, confirms.publish(), 11) is True
    assert confirms.due() == []
