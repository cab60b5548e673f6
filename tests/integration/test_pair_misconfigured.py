"""Misconfigured pairs are reported clearly and refuse to serve as a pair."""

from __future__ import annotations

import asyncio

import pytest
from pamqp import commands

from amqha.client import connect
from tests.pairs import (
    MakePair,
    hold,
    pika_open_error,
    poll,
    raw_open,
)

CASES = {
    "two primaries": (("primary", "primary"), ("north", "south"), "is also primary"),
    "two backups": (("backup", "backup"), ("north", "south"), "is also backup"),
    "same names": (("primary", "backup"), ("twin", "twin"), "peer has our name 'twin'"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_misconfigured_pair_is_reported_and_refuses_clients(
    make_pair: MakePair, case: str
) -> None:
    roles, names, reason = CASES[case]
    pair = make_pair(roles=roles, names=names).start()

    def reported(server) -> list[dict]:
        return [e for e in pair.events(server) if e["event"] == "misconfigured"]

    for server in pair.servers:
        await poll(lambda s=server: reported(s), 10, f"a misconfigured event from {server.name}")
        record = reported(server)[0]
        assert reason in record["reason"]
        assert record["state"] in ("PRIMARY", "BACKUP")
        await poll(
            lambda s=server: pair.log_lines(s, "ERROR amqha.failover: misconfigured pair:"),
            5,
            f"an ERROR line in {server.name}'s log",
        )
    # Past the start-up grace, the client vote would make a lone server ACTIVE: not here.
    for server in pair.servers:
        answer = await asyncio.to_thread(raw_open, server.port)
        assert isinstance(answer, commands.Connection.Close)
        assert answer.reply_code == 320
        assert answer.reply_text.startswith("NOT_ACTIVE - no active server: ")
        assert reason in answer.reply_text
        error = await asyncio.to_thread(pika_open_error, server.port)
        assert error is not None and reason in error
    with pytest.raises(ConnectionError, match="no ACTIVE server"):
        await connect([s.url for s in pair.servers], retry_for=1.0)
    await hold(lambda: "ACTIVE" not in pair.states(), 2 * pair.timeout, "nobody ACTIVE")

    for server in pair.servers:
        status = await pair.status(server)
        assert status["state"] in ("PRIMARY", "BACKUP")
        assert reason in status["misconfigured"]
        events = pair.events(server)
        # Reported once, not once per state message.
        assert len(reported(server)) == 1
        assert not [e for e in events if e["event"] in ("transition", "peer_up")]
        refusals = [e for e in events if e["event"] == "refuse"]
        assert refusals and all(reason in e.get("reason", "") for e in refusals)
