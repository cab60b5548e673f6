"""The replication link trusts only the pair: real pairs, a spy with the peering password,
a fake ACTIVE on the peer's address (docs/security.md, "The replication link").

Every test that kills a server checks that no confirmed message went missing.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any
from urllib.parse import quote

import aiormq
import pytest
from pamqp import commands

from amqha.core import codec, feedauth
from amqha.core.changes import ExchangeDeclared, QueueDeclared, Reset
from amqha.replication import IN_SYNC, SNAPSHOT_END
from tests.durability import Ledger, publish_confirmed
from tests.fake_active import Delivery, FakeActive, signed
from tests.integration.test_replication import (
    assert_every_confirmed_message,
    declare,
    kill_the_primary_and_vote,
    replication,
    wait_in_sync,
)
from tests.pairs import PAIR_SECRET, PEERING, Pair, poll, url_of


async def try_to_subscribe(url: str, arguments: dict[str, Any] | None) -> Exception | None:
    """Subscribe to ``amq.replication`` as the peering user; the channel's error, if any."""
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=4)
        try:
            await channel.basic_consume(
                "amq.replication", lambda message: None, arguments=arguments
            )
        except aiormq.exceptions.AMQPError as error:
            return error
        return None
    finally:
        await connection.close()


async def nonce_of(url: str) -> tuple[aiormq.Connection, bytes]:
    connection = await aiormq.connect(url)
    nonce = feedauth.parse_nonce(connection.server_properties.get(feedauth.NONCE_PROPERTY))
    assert nonce is not None, connection.server_properties
    return connection, nonce


def proof(secret: bytes, server_nonce: bytes) -> dict[str, str]:
    client_nonce = secrets.token_bytes(feedauth.NONCE_BYTES)
    return {
        feedauth.NONCE_ARGUMENT: client_nonce.hex(),
        feedauth.PROOF_ARGUMENT: feedauth.subscribe_proof(secret, server_nonce, client_nonce),
    }


async def in_sync_then_primary_killed(make_pair: Any, count: int) -> tuple[Pair, Ledger]:
    """A pair in sync with ``count`` confirmed messages on 'orders'; then kill -9 of the
    primary, whose address a fake ACTIVE may take."""
    pair: Pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "orders")
    await wait_in_sync(pair, pair.primary)
    ledger = Ledger()
    await publish_confirmed(pair.primary.url, "orders", ledger, "o", asyncio.Event(), limit=count)
    pair.kill(pair.primary)
    return pair, ledger


async def primary_back_with_every_message(pair: Pair, ledger: Ledger, count: int) -> None:
    """The real primary returns and leads, the backup catches up, and after a kill -9 of
    the primary the backup serves every confirmed message."""
    pair.primary.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    await wait_in_sync(pair, pair.primary)
    await kill_the_primary_and_vote(pair)
    await assert_every_confirmed_message(pair, pair.backup.url, "orders", ledger, count)


async def test_a_login_with_the_peering_password_cannot_take_the_feed(make_pair: Any) -> None:
    """The audit's spy: a second subscriber with the peering password used to replace the
    PASSIVE, receive every message body, and let the ACTIVE confirm on its acks; kill -9
    of the ACTIVE then lost half the confirmed messages. Now it is refused by every route
    (no proof, a forged one, one made with the wrong secret, a replay of a proof made
    for another connection, and the right secret while the PASSIVE is subscribed), the
    PASSIVE stays in sync, and a kill -9 loses nothing."""
    pair: Pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "orders")
    await wait_in_sync(pair, pair.primary)
    spy_url = url_of(pair.primary, PEERING)

    refused = [await try_to_subscribe(spy_url, None)]
    refused.append(
        await try_to_subscribe(
            spy_url,
            {feedauth.NONCE_ARGUMENT: "00" * 16, feedauth.PROOF_ARGUMENT: "ab" * 32},
        )
    )
    other, other_nonce = await nonce_of(spy_url)
    await other.close()
    # A proof made with the right secret, but for another connection's nonce: a replay.
    replayed = proof(PAIR_SECRET.encode(), other_nonce)
    refused.append(await try_to_subscribe(spy_url, replayed))
    # The right construction with the wrong secret.
    connection, nonce = await nonce_of(spy_url)
    try:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="proof"):
            await channel.basic_consume(
                "amq.replication", lambda m: None, arguments=proof(b"not-the-secret", nonce)
            )
        # The right secret while the PASSIVE is subscribed: one subscriber at a time.
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelLockedResource):
            await channel.basic_consume(
                "amq.replication", lambda m: None, arguments=proof(PAIR_SECRET.encode(), nonce)
            )
    finally:
        await connection.close()
    for error in refused:
        assert isinstance(error, aiormq.exceptions.ChannelAccessRefused), error
        assert "proof of the pair's secret" in str(error)

    feed = (await replication(pair, pair.primary))["feed"]
    assert feed["refused_subscriptions"] >= 4
    assert feed["state"] == "in_sync"
    follower = (await replication(pair, pair.backup))["follower"]
    assert follower["in_sync"] and follower["state"] == "in_sync"

    ledger = Ledger()
    await publish_confirmed(pair.primary.url, "orders", ledger, "o", asyncio.Event(), limit=2000)
    assert len(ledger.confirmed) == 2000
    await kill_the_primary_and_vote(pair)
    await assert_every_confirmed_message(pair, pair.backup.url, "orders", ledger, 2000)


async def test_the_passive_follows_no_server_that_cannot_prove_the_secret(make_pair: Any) -> None:
    """The audit's fake ACTIVE: with the primary killed, a server on its address sent a
    forged snapshot (an exchange of an unknown type), and the backup acked it, took it as
    its state and could not restart; a delivery announcing 1 TiB grew it to 4 GB. Now
    a run without the pair's MAC is refused (never acked, stored or applied), a delivery
    larger than a run can be is refused at its header, the backup stays out of sync, and
    when the real primary returns the pair resumes with every confirmed message."""
    pair, ledger = await in_sync_then_primary_killed(make_pair, 500)
    forged = codec.encode(0, [Reset(), ExchangeDeclared("/", "evil", "bogus", True, False, {})])
    deliveries = [
        (
            commands.Basic.Properties(headers={SNAPSHOT_END: True, feedauth.MAC_HEADER: "00" * 16}),
            len(forged),
            forged,
        ),
    ]
    async with FakeActive(pair.primary.port, lambda key: deliveries) as fake:
        await poll(
            lambda: "Consume" in fake.received and fake.connections >= 2,
            30,
            "the backup subscribing to the fake twice",
        )
    assert "Ack" not in fake.received, fake.received
    follower = (await replication(pair, pair.backup))["follower"]
    assert follower["refused_runs"] >= 1
    assert not follower["in_sync"]
    assert "a run whose MAC does not hold" in pair.backup.log()

    huge = [(commands.Basic.Properties(headers={SNAPSHOT_END: True}), 1 << 40, b"")]
    async with FakeActive(pair.primary.port, lambda key: huge) as fake:
        await poll(lambda: "over the" in pair.backup.log(), 30, "the backup refusing the 1 TiB run")
    assert "Ack" not in fake.received

    await primary_back_with_every_message(pair, ledger, 500)


async def test_an_in_sync_passive_acks_no_live_run_that_does_not_validate(make_pair: Any) -> None:
    """In sync, a live run went to the PASSIVE's store as received and was acked before it
    was decoded: a run that authenticated (the pair's secret) and held a change the
    PASSIVE cannot apply (an exchange of an unknown type) was acked, so the ACTIVE counted
    it held. Every run is decoded before anything of it is stored or acked now: the
    snapshot and the in-sync marker are acked, the bad live run never is, the PASSIVE
    leaves in sync, and when the real primary returns every confirmed message is there."""
    pair, ledger = await in_sync_then_primary_killed(make_pair, 300)
    snapshot = codec.encode(0, [Reset(), QueueDeclared("/", "other", False, {})])
    marker = codec.encode(0, [])
    bad = codec.encode(7, [ExchangeDeclared("/", "evil", "bogus", False, False, {})])

    def script(key: bytes | None) -> list[Delivery]:
        assert key is not None, "the PASSIVE subscribed without a nonce"
        return [signed(key, 1, {SNAPSHOT_END: True}, snapshot)]

    def follow_up(key: bytes | None, acked: int, tag: int) -> list[Delivery]:
        # As the real ACTIVE: the marker once the snapshot's end is acked, then a live run.
        assert key is not None
        return [signed(key, 2, {IN_SYNC: 0}, marker), signed(key, 3, {}, bad)] if acked == 1 else []

    async with FakeActive(pair.primary.port, script, PAIR_SECRET.encode(), follow_up) as fake:
        await poll(
            lambda: fake.subscriptions >= 3 and any(tag == 2 for _, tag in fake.acked),
            30,
            "the backup in sync with the fake, refusing the bad run and subscribing again",
        )
    assert not [each for each in fake.acked if each[1] == 3], fake.acked[:20]
    follower = (await replication(pair, pair.backup))["follower"]
    assert follower["refused_runs"] >= 1
    assert not follower["in_sync"]
    assert "does not decode" in pair.backup.log()
    assert "Traceback" not in pair.backup.log()

    await primary_back_with_every_message(pair, ledger, 300)


async def test_no_server_on_the_peers_address_learns_the_peering_password(
    make_pair: Any,
) -> None:
    """The audit's listener: with peer TLS off, whatever listened on the peer's address got
    the peering password in clear from the PASSIVE's login. Now the primary killed and a
    fake server on its address, the backup's logins there (its peer link and its
    replication link) carry a proof bound to the fake's nonce, never the password; the
    proof, replayed to the real primary (another nonce), is refused; the pair resumes with
    every confirmed message."""
    pair, ledger = await in_sync_then_primary_killed(make_pair, 200)
    password = pair.primary.password("peering", "peering")
    async with FakeActive(pair.primary.port, lambda key: []) as fake:
        await poll(lambda: len(fake.logins) >= 3, 30, "the backup logging in to the fake")
    proofs = []
    for response in fake.logins:
        _, user, given = response.split("\0")
        assert user == "peering" and given != password, response
        assert given.startswith("amqha-proof:")
        proofs.append(given)
    pair.primary.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    for proof in proofs[:2]:
        with pytest.raises(aiormq.exceptions.AMQPConnectionError):
            connection = await aiormq.connect(
                f"amqp://peering:{quote(proof, safe='')}@{pair.primary.address}/"
            )
            await connection.close()
    await wait_in_sync(pair, pair.primary)
    await kill_the_primary_and_vote(pair)
    await assert_every_confirmed_message(pair, pair.backup.url, "orders", ledger, 200)
