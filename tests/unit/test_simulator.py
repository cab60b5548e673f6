"""The deterministic simulator of the replication protocol (tests/sim): the protocol in
amqha/core/sync.py keeps every confirmed message over thousands of schedules of kill -9,
dropped links and slow or failing disks; the rule it replaced does not."""

from __future__ import annotations

from amqha.core.sync import Leader
from tests.sim.model import simulate
from tests.sim.old import OldLeader

# Found by the search below on the old rule: the snapshot (at LSN 0) is acked at tick 152,
# the ACTIVE declares in sync and clears its unprotected mark, is killed at tick 154, and
# the PASSIVE takes over without 0xa0000000001, confirmed alone during the snapshot.
OLD_RULE_LOSES = 15


def test_the_protocol_keeps_every_confirmed_message_over_2000_schedules() -> None:
    failing = [(seed, simulate(seed).failures[:1]) for seed in range(2000)]
    assert [each for each in failing if each[1]] == []


def test_the_old_rule_loses_confirmed_messages_and_the_seed_replays_exactly() -> None:
    found = next(seed for seed in range(5000) if not simulate(seed, OldLeader).ok)
    first = simulate(found, OldLeader)
    again = simulate(found, OldLeader)
    assert first.lost > 0
    assert again.failures == first.failures
    assert again.trace == first.trace


def test_the_recorded_seed_fails_on_the_old_rule_and_passes_on_the_new() -> None:
    old = simulate(OLD_RULE_LOSES, OldLeader)
    assert old.lost > 0
    assert "confirmed message 0xa0000000001 (by primary in epoch 5) lost" in old.failures[0]
    assert simulate(OLD_RULE_LOSES, Leader).ok


def test_one_seed_is_one_schedule() -> None:
    for seed in (1, 77, 4242):
        first, again = simulate(seed), simulate(seed)
        assert first.trace == again.trace
        assert first.ticks == again.ticks and first.confirmed == again.confirmed
    assert simulate(1).trace != simulate(2).trace


def test_a_failed_write_on_the_active_while_gating_is_nacked() -> None:
    """Seed 62 lost a confirmed message: a failed write on the ACTIVE while confirms
    waited for a PASSIVE behind it was acked later, on the PASSIVE's copy alone. The
    broker refuses a failed range at once now (``ConfirmPipeline.refuse``)."""
    assert simulate(62, active_write_failures=True).ok


def test_failed_writes_on_the_active_lose_nothing() -> None:
    failing = [seed for seed in range(300) if not simulate(seed, active_write_failures=True).ok]
    assert not failing, f"failing seeds: {failing[:10]}"


def test_a_server_killed_taking_a_snapshot_never_leads_on_part_of_it() -> None:
    """Double failures: a PASSIVE killed while catching up, then its ACTIVE; a restarted
    server used to lead on the part of the snapshot it had stored and drop messages
    below the other's unprotected mark without quarantine. Its data dir now says it is
    incomplete until its ACTIVE declares it in sync: no schedule loses a message."""
    lost = [seed for seed in range(300) if simulate(seed, double_failures=True).lost]
    assert not lost, f"seeds losing confirmed messages: {lost[:10]}"


def test_a_double_failure_never_gives_one_epoch_to_both_servers() -> None:
    """Seed 68: with both servers down, the restarted primary led by client vote on its
    own disk, unheard of its peer, in the epoch the backup had served in. Each role has
    its own epochs now (failover/fsm.py, ``next_epoch``)."""
    assert simulate(68, double_failures=True).ok


def test_takeover_on_evidence_loses_nothing() -> None:
    """A killed server's peer counts it lost on the next tick (its port refuses) instead of
    after the timeout, single and double failures alike: no schedule loses a confirm or
    has two servers confirm in one epoch."""
    failing = [
        seed
        for seed in range(300)
        for double in (False, True)
        if not simulate(seed, double_failures=double, evidence=True).ok
    ]
    assert not failing, f"failing seeds: {failing[:10]}"
