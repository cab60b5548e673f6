"""The deterministic simulator of the replication protocol (tests/sim): the protocol in
amqha/core/sync.py keeps every confirmed message over thousands of schedules of kill -9,
dropped links and slow or failing disks; the rule it replaced does not."""

from __future__ import annotations

import pytest

from amqha.core.sync import Leader
from tests.sim.model import simulate
from tests.sim.old import OldLeader

# Found by the search below on the old rule: the snapshot (at LSN 0) is acked at tick 152,
# the ACTIVE declares in sync and clears its unprotected mark, is killed at tick 154, and
# the PASSIVE takes over without 0x60000000001, confirmed alone during the snapshot.
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
    assert "confirmed message 0x60000000001 (by primary in epoch 3) lost" in old.failures[0]
    assert simulate(OLD_RULE_LOSES, Leader).ok


def test_one_seed_is_one_schedule() -> None:
    for seed in (1, 77, 4242):
        first, again = simulate(seed), simulate(seed)
        assert first.trace == again.trace
        assert first.ticks == again.ticks and first.confirmed == again.confirmed
    assert simulate(1).trace != simulate(2).trace


@pytest.mark.xfail(
    strict=True,
    reason="open: a failed write on the ACTIVE while confirms wait for an in-sync PASSIVE "
    "is forgotten (Broker._release_confirms passes the failed range once, beyond the "
    "watermark); its publishes are acked later, though not on the ACTIVE's disk",
)
def test_a_failed_write_on_the_active_while_gating_is_nacked() -> None:
    assert simulate(62, active_write_failures=True).ok


@pytest.mark.xfail(
    strict=True,
    reason="open: with both servers down, a restarted primary leads by client vote on its "
    "own disk without having heard its peer: the epoch the backup served in is taken "
    "again; a server killed catching up leads on a partial snapshot (not in sync is "
    "not durable)",
)
def test_a_double_failure_never_gives_one_epoch_to_both_servers() -> None:
    assert simulate(68, double_failures=True).ok
