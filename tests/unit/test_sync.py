"""The replication protocol's pure rules (amqha/core/sync.py): in sync at an LSN."""

from __future__ import annotations

from amqha.core.sync import Eligibility, Leader, Phase, SentRun, watermark


def run(last: int, end: bool = False, first_id: int | None = None) -> SentRun:
    return SentRun(last, end, first_id, 0.0, 10)


def test_confirms_go_on_the_store_alone_until_the_snapshot_is_acked() -> None:
    leader = Leader()
    assert leader.watermark(50) == 50
    leader.subscribe()
    leader.sent(1, run(40, end=True))
    assert leader.phase is Phase.SNAPSHOT
    assert leader.watermark(50) == 50  # catching up: the ACTIVE confirms alone


def test_in_sync_only_once_the_passive_holds_what_was_confirmed_alone() -> None:
    """The bug this replaces: in sync at the snapshot's end, while confirms given alone
    during the snapshot (LSNs 41-60 here) were still on their way to the PASSIVE."""
    leader = Leader()
    leader.subscribe()
    leader.sent(1, run(40, end=True))
    leader.sent(2, run(55, first_id=1000))
    leader.sent(3, run(60, first_id=1010))
    synced = leader.acked(1, False, confirmed_lsn=60)
    assert not synced.declared
    assert leader.phase is Phase.CLOSING
    assert leader.sync_lsn == 60
    assert not leader.in_sync
    # From the snapshot's ack on, no confirm goes out beyond what the PASSIVE holds.
    assert leader.watermark(70) == 40
    synced = leader.acked(2, False, confirmed_lsn=60)
    assert not synced.declared and synced.moved
    assert leader.watermark(70) == 55
    synced = leader.acked(3, False, confirmed_lsn=60)
    assert synced.declared
    assert leader.in_sync
    assert leader.watermark(70) == 60


def test_in_sync_at_once_when_nothing_was_confirmed_beyond_the_snapshot() -> None:
    leader = Leader()
    leader.subscribe()
    leader.sent(1, run(40, end=True))
    synced = leader.acked(1, False, confirmed_lsn=40)
    assert synced.declared and leader.in_sync


def test_multiple_acks_cover_every_tag_up_to_theirs() -> None:
    leader = Leader()
    leader.subscribe()
    leader.sent(1, run(10, end=True))
    leader.sent(2, run(20))
    leader.sent(3, run(30))
    synced = leader.acked(2, True, confirmed_lsn=20)
    assert synced.declared
    assert list(leader.unacked) == [3]
    assert leader.replicated_lsn == 20


def test_an_ack_of_an_unknown_tag_changes_nothing() -> None:
    leader = Leader()
    leader.subscribe()
    leader.sent(1, run(10, end=True))
    synced = leader.acked(7, False, confirmed_lsn=10)
    assert synced == (False, False)
    assert leader.phase is Phase.SNAPSHOT


def test_the_unprotected_mark_starts_at_the_oldest_message_not_acked() -> None:
    """A run sent and not acked when the in-sync PASSIVE goes may be on the ACTIVE alone:
    the mark must cover it, not start at the next id to be given out."""
    leader = Leader()
    leader.subscribe()
    leader.sent(1, run(10, end=True))
    leader.acked(1, False, confirmed_lsn=10)
    leader.sent(2, run(20))  # settles only: no message
    leader.sent(3, run(30, first_id=500))
    assert leader.unprotected_from(backlog_first_id=900, next_id=1000) == 500
    leader.acked(3, True, confirmed_lsn=30)
    assert leader.unprotected_from(backlog_first_id=900, next_id=1000) == 900
    assert leader.unprotected_from(backlog_first_id=None, next_id=1000) == 1000
    assert leader.drop() is True
    assert leader.phase is Phase.NONE and not leader.gating


def test_a_new_subscription_starts_over() -> None:
    leader = Leader()
    leader.subscribe()
    leader.sent(1, run(10, end=True))
    leader.acked(1, False, confirmed_lsn=10)
    assert leader.in_sync
    leader.subscribe()
    assert leader.phase is Phase.SNAPSHOT and leader.replicated_lsn == 0
    assert leader.watermark(99) == 99


def test_eligibility_comes_only_from_the_marker_and_goes_on_any_end() -> None:
    passive = Eligibility()
    assert not passive.in_sync
    assert passive.declared(60) is True
    assert passive.in_sync and passive.sync_lsn == 60
    assert passive.declared(60) is False  # already
    assert passive.ended() is True
    assert not passive.in_sync and passive.sync_lsn is None
    passive.declared(70)
    assert passive.subscribed() is True  # a new subscription: a new snapshot follows
    assert not passive.in_sync
    assert passive.subscribed() is False


def test_the_watermark_is_the_lowest_lsn_the_counting_sinks_hold() -> None:
    """Broker.sinks: the store always counts; the feed counts once its PASSIVE has
    acked the snapshot (closing, in sync), and not before."""
    leader = Leader()
    assert leader.holds() is None
    assert watermark([leader.holds(), 50]) == 50
    leader.subscribe()
    leader.sent(1, run(40, end=True))
    assert leader.holds() is None  # the snapshot: the ACTIVE confirms alone
    leader.acked(1, False, confirmed_lsn=60)
    assert leader.holds() == 40
    assert watermark([leader.holds(), 70]) == 40 == leader.watermark(70)
    assert watermark([]) == 0


def test_a_passive_is_stalled_only_while_confirms_wait_for_it() -> None:
    """Its oldest unacked run's wait, once at the limit; never while catching up (confirms
    do not wait for it then), nor with nothing unacked."""
    leader = Leader()
    leader.subscribe()
    leader.sent(1, SentRun(40, True, None, 10.0, 10))
    assert leader.stalled(100.0, 2.0) is None  # snapshot: the ACTIVE confirms alone
    leader.acked(1, False, confirmed_lsn=40)
    assert leader.in_sync and leader.stalled(100.0, 2.0) is None  # nothing unacked
    leader.sent(2, SentRun(50, False, 7, 20.0, 10))
    leader.sent(3, SentRun(60, False, 9, 21.5, 10))
    assert leader.stalled(21.9, 2.0) is None  # waited 1.9 s
    assert leader.stalled(22.0, 2.0) == 2.0  # the oldest counts
    leader.acked(2, False, confirmed_lsn=40)
    assert leader.stalled(22.0, 2.0) is None and leader.stalled(23.5, 2.0) == 2.0


def test_a_resume_waits_for_the_passive_at_once_and_is_in_sync_if_nothing_went_out_alone() -> None:
    """The server that handed over resumes holding everything up to the takeover (LSN 70):
    no snapshot. Nothing confirmed past 70 alone: in sync at once, and what comes after
    70 is confirmed only once the PASSIVE acks it."""
    leader = Leader()
    assert leader.resume(held_lsn=70, confirmed_lsn=65)
    assert leader.in_sync and leader.gating
    assert leader.watermark(90) == 70
    leader.sent(1, run(90))
    assert leader.acked(1, False, confirmed_lsn=70).moved
    assert leader.watermark(90) == 90


def test_a_resume_after_confirms_went_out_alone_is_in_sync_once_they_are_acked() -> None:
    """The takeover's wait ran out and LSNs up to 80 were confirmed alone: the resumed
    PASSIVE is not in sync until it acks through 80."""
    leader = Leader()
    assert not leader.resume(held_lsn=70, confirmed_lsn=80)
    assert leader.phase is Phase.CLOSING and leader.sync_lsn == 80
    assert leader.watermark(90) == 70  # from now on confirms wait for it
    leader.sent(1, run(75))
    assert not leader.acked(1, False, confirmed_lsn=80).declared
    leader.sent(2, run(85))
    assert leader.acked(2, False, confirmed_lsn=80).declared
