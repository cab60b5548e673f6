"""Kill -9 / restart cycles (6 in ``make test``, 30 in ``make soak``): at no instant do
both servers accept clients.

The check is made afterwards from the two event logs: each server's ACTIVE intervals come
from its transition records, cut short by its kills (a killed server writes nothing), and
no interval of one may overlap an interval of the other. The peer link stays up all along,
so the dual-active rule allows no overlap at all.
"""

from __future__ import annotations

import time

import pytest

from tests.pairs import (
    MakePair,
    active_intervals,
    client_vote,
    overlaps,
)
from tests.support import soak_size

# Even: each server is taken over from as often as the other.
CYCLES = soak_size(6, 30)


def test_active_intervals_from_logs_and_kills() -> None:
    """The interval builder itself: transitions, kills, clean stops and a still-open one."""
    events = [
        {"event": "started", "ts": 0.0},
        {"event": "transition", "from": "PRIMARY", "to": "ACTIVE", "ts": 1.0},
        {"event": "started", "ts": 5.0},  # killed at 3.0 while ACTIVE
        {"event": "transition", "from": "PRIMARY", "to": "PASSIVE", "ts": 5.5},
        {"event": "transition", "from": "PASSIVE", "to": "ACTIVE", "ts": 7.0},
        {"event": "transition", "from": "ACTIVE", "to": "PASSIVE", "ts": 8.0},
        {"event": "transition", "from": "PASSIVE", "to": "ACTIVE", "ts": 9.0},
        {"event": "stopped", "ts": 9.5},
        {"event": "started", "ts": 10.0},
        {"event": "transition", "from": "PRIMARY", "to": "ACTIVE", "ts": 11.0},
    ]
    assert active_intervals(events, [3.0], now=20.0) == [
        (1.0, 3.0),
        (7.0, 8.0),
        (9.0, 9.5),
        (11.0, 20.0),
    ]
    assert overlaps([(1.0, 3.0)], [(3.0, 4.0)]) == []
    assert overlaps([(1.0, 3.0)], [(2.9, 4.0)]) == [((1.0, 3.0), (2.9, 4.0))]


@pytest.mark.soak
async def test_kill_restart_cycles_never_two_active(make_pair: MakePair) -> None:
    pair = make_pair(heartbeat=0.05, timeout=0.25, proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    active, passive = pair.primary, pair.backup
    for cycle in range(CYCLES):
        pair.kill(active)
        # A client's connect after the kill is the vote that makes the survivor ACTIVE.
        info = await client_vote([passive], retry_for=10)
        assert info["name"] == passive.name, f"cycle {cycle}: client landed on {info['name']}"
        await pair.wait_states(
            *(("ACTIVE", None) if passive is pair.primary else (None, "ACTIVE")), timeout=10
        )
        active.start()
        expected = ("PASSIVE", "ACTIVE") if active is pair.primary else ("ACTIVE", "PASSIVE")
        await pair.wait_states(*expected, timeout=10)
        # A PASSIVE takes over by client vote only once it holds what the ACTIVE holds.
        await pair.wait_in_sync(active)
        active, passive = passive, active

    end = time.time()
    intervals = pair.active_intervals(now=end)
    primary, backup = intervals["primary"], intervals["backup"]
    # The start-up ACTIVE of the primary, then one per cycle, alternating.
    assert len(primary) + len(backup) == CYCLES + 1
    assert len(primary) == CYCLES // 2 + 1 and len(backup) == CYCLES // 2
    assert overlaps(primary, backup) == []
    merged = sorted(primary + backup)
    gaps = [later[0] - earlier[1] for earlier, later in zip(merged, merged[1:], strict=False)]
    assert all(gap > 0 for gap in gaps)
    for server in pair.servers:
        events = pair.events(server)
        assert not [e for e in events if e["event"] in ("dual_active", "misconfigured")]
        assert sum(e["event"] == "started" for e in events) == 1 + CYCLES // 2
    # One new epoch per takeover, none skipped or repeated.
    epochs = [pair.epoch(s) for s in pair.servers]
    assert max(epochs) == CYCLES + 1
