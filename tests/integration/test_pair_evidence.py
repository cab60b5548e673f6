"""Takeover from evidence (docs/failover.md, "Evidence"): a killed ACTIVE's port refuses
connections, so its in-sync PASSIVE takes over on the first client's vote without waiting out
the failover timeout; a frozen ACTIVE gives no such evidence and still needs the timeout.

The pairs here are not proxied: the evidence is the kernel's answer for the peer's own port.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import aiormq

from tests.durability import Ledger, drain, publish_confirmed
from tests.pairs import MakePair, Pair, client_vote, poll

# Far longer than any test here waits: a takeover seen at all came from evidence.
LONG_TIMEOUT = 300.0
GONE_REASON = "the peer's process is gone (its link dropped, its port refuses): client vote"


def records(pair: Pair, server: Any, event: str) -> list[dict[str, Any]]:
    return [e for e in pair.events(server) if e["event"] == event]


async def test_a_killed_active_is_replaced_on_the_first_vote_without_its_timeout(
    make_pair: MakePair,
) -> None:
    """kill -9 of the in-sync ACTIVE: the backup logs the loss with `evidence: refused` and
    the next client makes it ACTIVE, long before a 300 s timeout could pass; every message
    confirmed before the kill is on it."""
    pair = make_pair(proxied=False, heartbeat=0.1, timeout=LONG_TIMEOUT).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    await pair.wait_in_sync(pair.backup)
    connection = await aiormq.connect(pair.primary.url)
    await (await connection.channel()).queue_declare("kept", durable=True)
    await connection.close()
    ledger = Ledger()
    await publish_confirmed(pair.primary.url, "kept", ledger, "k", asyncio.Event(), limit=300)
    assert len(ledger.confirmed) == 300

    pair.kill(pair.primary)
    lost = await poll(lambda: records(pair, pair.backup, "peer_lost"), 60, "a peer_lost record")
    assert lost[0]["evidence"] == "refused" and lost[0]["peer_state"] == "ACTIVE"
    assert (await client_vote([pair.backup], retry_for=60))["name"] == "backup"
    vote = records(pair, pair.backup, "transition")[-1]
    assert (vote["from"], vote["to"], vote["reason"]) == ("PASSIVE", "ACTIVE", GONE_REASON)
    assert vote["ts"] >= lost[0]["ts"]

    remaining = [body for body, _ in await drain(pair.backup.url, "kept")]
    lost_messages, invented = ledger.check(remaining)
    assert not lost_messages and not invented and len(remaining) == 300

    # The primary comes back and follows: hearing it again clears the evidence.
    pair.primary.start()
    await pair.wait_states("PASSIVE", "ACTIVE", timeout=60)
    assert not records(pair, pair.primary, "dual_active")
    assert not records(pair, pair.backup, "dual_active")


async def test_a_frozen_active_gives_no_evidence_and_waits_for_the_timeout(
    make_pair: MakePair,
) -> None:
    """SIGSTOP of the ACTIVE: its port still accepts (the kernel fills the listen backlog),
    so the backup, with a client knocking, records the loss as silence and takes over by the
    timeout's rule, not the evidence's."""
    pair = make_pair(proxied=False, heartbeat=0.1, timeout=3.0).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    await pair.wait_in_sync(pair.backup)
    assert pair.primary.process is not None
    pid = pair.primary.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        assert (await client_vote([pair.backup], retry_for=60))["name"] == "backup"
    finally:
        os.kill(pid, signal.SIGCONT)
    lost = records(pair, pair.backup, "peer_lost")
    assert lost and lost[0]["evidence"] == "silence"
    vote = records(pair, pair.backup, "transition")[-1]
    assert vote["reason"] == "no peer heard for a timeout: client vote"
    await pair.wait_states("PASSIVE", "ACTIVE", timeout=60)
