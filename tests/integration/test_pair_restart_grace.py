"""A restarted primary must hear the ACTIVE backup before its start-up grace runs out.

The primary counts an unheard peer as alive for one timeout after it starts; a client
knocking after that makes it ACTIVE (and, epochs being equal, takes the service back
from the backup: an automatic failback with a dual active). So the backup's state has
to reach the restarted primary within that timeout, however long the backup's peering
had been retrying the dead primary. The backup's reconnect backoff is capped at a heartbeat
(0.1 s), well inside the primary's 1 s grace: a cap that grew past the grace would let the
knocking client in (a backoff doubling from 0.1 s passes 1 s by the fifth retry, before the
primary comes back); the grace leaves a loaded machine the time to start and connect (0.6 s
was once too short for it, with the suite's four workers on two cores).
"""

from __future__ import annotations

from tests.pairs import Knocker, MakePair, client_vote, hold, lifetime

RESTARTS = 6


async def test_restarted_primary_hears_the_backup_before_its_grace_ends(
    make_pair: MakePair,
) -> None:
    pair = make_pair(heartbeat=0.1, timeout=1.0).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    pair.kill(pair.primary)
    assert (await client_vote([pair.backup]))["name"] == "backup"
    for restart in range(RESTARTS):
        # Down long enough for the backup's reconnect backoff to reach its cap, and for
        # an uncapped one to have grown past the grace.
        await hold(lambda: not pair.primary.alive, 1.6, "primary down")
        with Knocker(pair.primary, interval=0.01) as knocker:
            pair.primary.start()
            await pair.wait_states("PASSIVE", "ACTIVE")
        assert knocker.let_in == 0, f"restart {restart}: a client got into the primary"
        moves = [
            (e["from"], e["to"])
            for e in lifetime(pair.events(pair.primary))
            if e["event"] == "transition"
        ]
        assert moves == [("PRIMARY", "PASSIVE")], f"restart {restart}"
        pair.kill(pair.primary)
    assert not [e for e in pair.events(pair.backup) if e["event"] == "dual_active"]
