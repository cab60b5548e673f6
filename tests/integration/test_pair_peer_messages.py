"""amq.peer input the pair must survive: malformed state messages and unauthorised publishers."""

from __future__ import annotations

import json

import aio_pika
import aiormq.exceptions
import pytest

from tests.pairs import (
    PEERING,
    MakePair,
    client_vote,
    url_of,
)

# A message that, were it taken, would make the primary yield: the backup ACTIVE in epoch 99.
TAKEOVER = {
    "name": "backup",
    "role": "backup",
    "state": "ACTIVE",
    "epoch": 99,
    "seq": 1,
    "ts": 1.0,
    "listen": "127.0.0.1:1",
    "clients": 0,
    "version": "0",
}

MALFORMED: list[tuple[str, bytes, str | None]] = [
    ("garbage bytes", b"\x00\xff\xfe not json at all", "amqha.peer.state"),
    ("empty body", b"", "amqha.peer.state"),
    ("not an object", b"[1, 2, 3]", "amqha.peer.state"),
    (
        "missing listen",
        json.dumps({k: v for k, v in TAKEOVER.items() if k != "listen"}).encode(),
        None,
    ),
    ("missing state", json.dumps({"name": "backup", "role": "backup"}).encode(), None),
    ("epoch as text", json.dumps({**TAKEOVER, "epoch": "99"}).encode(), None),
    ("epoch as bool", json.dumps({**TAKEOVER, "epoch": True}).encode(), None),
    ("name as number", json.dumps({**TAKEOVER, "name": 7}).encode(), None),
    ("negative epoch", json.dumps({**TAKEOVER, "epoch": -1}).encode(), None),
    ("unknown state", json.dumps({**TAKEOVER, "state": "SLEEPING"}).encode(), None),
    ("unknown role", json.dumps({**TAKEOVER, "role": "tertiary"}).encode(), None),
    ("unknown message type", json.dumps(TAKEOVER).encode(), "amqha.peer.bogus"),
]


async def test_malformed_peer_messages_are_dropped_logged_and_harmless(
    make_pair: MakePair,
) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    before = {s.name: await pair.status(s) for s in pair.servers}
    assert all(status["malformed_peer_messages"] == 0 for status in before.values())

    for server in pair.servers:
        connection = await aio_pika.connect(url_of(server, PEERING))
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            exchange = await channel.get_exchange("amq.peer", ensure=False)
            for _, body, kind in MALFORMED:
                await exchange.publish(
                    aio_pika.Message(body, content_type="application/json", type=kind),
                    routing_key="",
                )

    for server in pair.servers:
        status = await pair.status(server)  # the server still answers
        assert status["malformed_peer_messages"] == len(MALFORMED), status
        assert status["state"] == before[server.name]["state"]
        assert status["epoch"] == before[server.name]["epoch"] == 1
        assert status["misconfigured"] is None
        assert status["peer"]["alive"]
        assert pair.log_lines(server, "dropped an amq.peer message")
        assert server.alive
    assert pair.states() == ("ACTIVE", "PASSIVE")
    # Only the two start-up transitions: nothing moved.
    assert len([e for s in pair.servers for e in pair.events(s) if e["event"] == "transition"]) == 2
    # The pair still works: a client reaching the passive is sent to the primary.
    assert (await client_vote([pair.backup]))["name"] == "primary"


@pytest.mark.parametrize("user", [("guest", "guest"), ("admin", "admin")])
async def test_only_peering_users_may_publish_to_amq_peer(
    make_pair: MakePair, user: tuple[str, str]
) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    connection = await aio_pika.connect(url_of(pair.primary, user))
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange("amq.peer", ensure=False)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="peering"):
            await exchange.publish(aio_pika.Message(json.dumps(TAKEOVER).encode()), routing_key="")
    status = await pair.status(pair.primary)
    assert status["state"] == "ACTIVE" and status["epoch"] == 1
    assert status["malformed_peer_messages"] == 0
