"""The control plane protects itself: on a real pair, as guest, peering and administrator.

Every route a client could use to reach the failover controller or the console is tried:
the default exchange with the names internal queues once had, bindings into and out of
amq.peer / amq.console, dead-lettering and alternate exchanges pointing there, and direct
publishes. The oracle is the servers' own count of what reached each control receiver, by
authenticated user (console ``status``), and the pair's states and epochs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import aiormq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from failover.peer_message import HANDOVER_TYPE, STATE_TYPE, encode
from tests.pairs import ADMIN, PAIR_SECRET, PEERING, Pair, pair_factory, url_of

GUEST = ("guest", "guest")
REFUSED = "closed ChannelAccessRefused"  # 403 ACCESS_REFUSED, on the channel only
CONTROL = ("amq.peer", "amq.console", "amq.federation")
# Names a client might try to address the control plane by.
ALIASES = (
    "amq.internal.amq.peer",
    "amq.internal.amq.console",
    "amq.peer",
    "amq.console",
    "amq.federation",
    "amq.internal.",
    "",
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    factory = pair_factory(tmp_path_factory.mktemp("control-plane"))
    make = next(factory)
    started = make(proxied=False).start()
    yield started
    with contextlib.suppress(StopIteration):
        next(factory)


async def settled(pair: Pair) -> None:
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=20)


async def received(pair: Pair) -> dict[str, dict[str, dict[str, int]]]:
    return {s.name: (await pair.status(s))["control_received"] for s in pair.servers}


async def outcome(action: Callable[[aiormq.abc.AbstractChannel], Awaitable[Any]], url: str) -> str:
    """Run ``action`` on a fresh channel: "ok", or "closed" and the error that closed it."""
    try:
        connection = await aiormq.connect(url)
    except aiormq.exceptions.AMQPError:
        return "not admitted"  # the gate: a PASSIVE server lets no ordinary client in
    try:
        channel = await connection.channel()
        try:
            await asyncio.wait_for(action(channel), 5)
        except aiormq.exceptions.AMQPError as error:
            return f"closed {type(error).__name__}"
        # A publish is refused asynchronously: a round trip tells whether the channel lives.
        try:
            await asyncio.wait_for(channel.basic_qos(prefetch_count=1), 5)
        except aiormq.exceptions.AMQPError as error:
            return f"closed {type(error).__name__}"
        return "ok"
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


def forged_state(state: str = "ACTIVE", epoch: int = 2**63, listen: str = "127.0.0.1:1") -> bytes:
    return json.dumps(
        {
            "name": "backup",
            "role": "backup",
            "state": state,
            "epoch": epoch,
            "boot": "forged",
            "seq": int(time.time() * 1000),
            "listen": listen,
        }
    ).encode()


# -- the routes ------------------------------------------------------------------------------


def publish(exchange: str, routing_key: str, body: bytes = b"x", **properties: Any):
    async def run(channel: aiormq.abc.AbstractChannel) -> Any:
        return await channel.basic_publish(
            body,
            exchange=exchange,
            routing_key=routing_key,
            properties=commands.Basic.Properties(**properties),
        )

    return run


def bind_exchange(destination: str, source: str):
    async def run(channel: aiormq.abc.AbstractChannel) -> Any:
        return await channel.exchange_bind(destination=destination, source=source)

    return run


def bind_queue_to(exchange: str):
    async def run(channel: aiormq.abc.AbstractChannel) -> Any:
        declared = await channel.queue_declare("", exclusive=True)
        return await channel.queue_bind(declared.queue, exchange)

    return run


def dead_letter_to(exchange: str):
    """A queue whose messages die at once into ``exchange``; one message is sent through."""

    async def run(channel: aiormq.abc.AbstractChannel) -> Any:
        declared = await channel.queue_declare(
            "",
            exclusive=True,
            arguments={"x-dead-letter-exchange": exchange, "x-message-ttl": 0},
        )
        await channel.basic_publish(forged_state(), routing_key=declared.queue)

    return run


def alternate_to(exchange: str):
    async def run(channel: aiormq.abc.AbstractChannel) -> Any:
        name = f"ae-{time.monotonic_ns()}"
        await channel.exchange_declare(
            name,
            exchange_type="direct",
            auto_delete=True,
            arguments={"alternate-exchange": exchange},
        )
        await channel.basic_publish(forged_state(), exchange=name, routing_key="nowhere")

    return run


def e2e_into(exchange: str):
    """An exchange of ours bound into the control exchange, then a publish through it."""

    async def run(channel: aiormq.abc.AbstractChannel) -> Any:
        name = f"e2e-{time.monotonic_ns()}"
        await channel.exchange_declare(name, exchange_type="fanout", auto_delete=True)
        await channel.exchange_bind(destination=exchange, source=name)
        await channel.basic_publish(forged_state(), exchange=name)

    return run


def e2e_out_of(exchange: str):
    """An exchange of ours bound from the control exchange: reading what goes there."""

    async def run(channel: aiormq.abc.AbstractChannel) -> Any:
        name = f"e2e-{time.monotonic_ns()}"
        await channel.exchange_declare(name, exchange_type="fanout", auto_delete=True)
        await channel.exchange_bind(destination=name, source=exchange)

    return run


ROUTES = {
    "default exchange": lambda name: publish("", name, forged_state()),
    "publish": lambda name: publish(name, "", forged_state(), message_type=STATE_TYPE),
    "e2e into": e2e_into,
    "e2e out of": lambda name: e2e_out_of(name),
    "queue bound to": bind_queue_to,
    "dead letter to": dead_letter_to,
    "alternate exchange": alternate_to,
    "headers binding": lambda name: bind_exchange(name, "amq.match"),
}


async def test_no_route_lets_guest_reach_the_control_plane(pair: Pair) -> None:
    await settled(pair)
    before = await received(pair)
    # The PASSIVE lets no guest in at all (the gate); the ACTIVE is where guest can try.
    for server in [pair.primary]:
        url = url_of(server, GUEST)
        for route, make in ROUTES.items():
            for name in ALIASES:
                result = await outcome(make(name), url)
                if name in CONTROL and route != "default exchange":
                    assert result == REFUSED, (server.name, route, name, result)
    after = await received(pair)
    for name, exchanges in after.items():
        # Only the pair's own heartbeats reached amq.peer, and only our status calls the
        # console: guest reached neither, by any route.
        assert set(exchanges.get("amq.peer", {})) <= {"peering"}, (name, exchanges)
        assert set(exchanges.get("amq.console", {})) <= {"admin"}, (name, exchanges)
        assert not exchanges.get("amq.federation"), (name, exchanges)
    assert before.keys() == after.keys()
    assert pair.states() == ("ACTIVE", "PASSIVE")


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    user=st.sampled_from([GUEST, PEERING, ADMIN]),
    route=st.sampled_from(sorted(ROUTES)),
    name=st.sampled_from(ALIASES),
    server=st.sampled_from([0, 1]),
)
async def test_property_a_route_reaches_a_control_receiver_only_as_its_tagged_user(
    pair: Pair, user: tuple[str, str], route: str, name: str, server: int
) -> None:
    await settled(pair)
    target = pair.servers[server]
    epochs = (pair.epoch(pair.primary), pair.epoch(pair.backup))
    before = (await pair.status(target))["control_received"]
    await outcome(ROUTES[route](name), url_of(target, user))
    after = (await pair.status(target))["control_received"]
    # No user of this pair has the tag federation.
    allowed = {"amq.peer": "peering", "amq.console": "admin", "amq.federation": None}
    for exchange, counts in after.items():
        grown = {u for u, n in counts.items() if n > before.get(exchange, {}).get(u, 0)}
        # The pair's own peering user sends heartbeats all along; the console's own status
        # call above is admin's.
        assert grown <= {allowed[exchange]}, (user, route, name, exchange, grown)
    # A direct publish by the tagged user reaches the receiver, and is still refused there:
    # it carries no valid signature. Nothing moved.
    assert pair.states() == ("ACTIVE", "PASSIVE")
    assert (pair.epoch(pair.primary), pair.epoch(pair.backup)) == epochs


async def test_forged_state_messages_are_refused_and_recorded(pair: Pair) -> None:
    await settled(pair)
    primary = pair.primary
    epoch = pair.epoch(primary)
    before = (await pair.status(primary))["malformed_peer_messages"]
    url = url_of(primary, PEERING)
    forgeries = [
        # No signature at all: a sniffed or guessed peering password is not enough.
        (forged_state(epoch=epoch + 1), {}),
        # Signed with the pair's secret, yet invalid as data:
        encode(PAIR_SECRET.encode(), STATE_TYPE, json.loads(forged_state(epoch=2**63)))[::2],
        encode(
            PAIR_SECRET.encode(),
            STATE_TYPE,
            json.loads(forged_state(epoch=epoch + 1, listen="127.0.0.1:1")),
        )[::2],
        encode(PAIR_SECRET.encode(), STATE_TYPE, json.loads(forged_state(epoch=epoch + 5000)))[::2],
        # A signature made for a state message does not make a handover.
        (
            encode(PAIR_SECRET.encode(), STATE_TYPE, json.loads(forged_state(epoch=epoch)))[0],
            encode(PAIR_SECRET.encode(), STATE_TYPE, json.loads(forged_state(epoch=epoch)))[2],
        ),
    ]
    kinds = [STATE_TYPE, STATE_TYPE, STATE_TYPE, STATE_TYPE, HANDOVER_TYPE]
    for (body, headers), kind in zip(forgeries, kinds, strict=True):
        assert (
            await outcome(publish("amq.peer", "", body, message_type=kind, headers=headers), url)
            == "ok"
        )
    status = await poll_status(pair, primary, lambda s: s["malformed_peer_messages"] >= before + 5)
    assert status["state"] == "ACTIVE"
    assert pair.epoch(primary) == epoch
    reasons = " ".join(e["reason"] for e in pair.events(primary) if e["event"] == "misconfigured")
    assert "signature" in reasons and "out of range" in reasons and "listen" in reasons
    assert "leaps" in reasons
    assert pair.states() == ("ACTIVE", "PASSIVE")


async def poll_status(pair: Pair, server: Any, predicate: Callable[[dict], bool]) -> dict:
    deadline = time.monotonic() + 10
    while True:
        status = await pair.status(server)
        if predicate(status) or time.monotonic() > deadline:
            assert predicate(status), status
            return status
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("user", [PEERING, ADMIN], ids=["peering", "admin"])
async def test_on_the_passive_privileged_logins_only_use_the_control_plane(
    pair: Pair, user: tuple[str, str]
) -> None:
    await settled(pair)
    url = url_of(pair.backup, user)
    refused = {
        "declare a named queue": lambda ch: ch.queue_declare("app-queue"),
        "declare a durable queue": lambda ch: ch.queue_declare("", durable=True),
        "publish to an application exchange": publish("amq.direct", "app", b"work"),
        "publish to the default exchange": publish("", "app-queue", b"work"),
        "declare an exchange": lambda ch: ch.exchange_declare("app-x", exchange_type="fanout"),
        "bind": bind_exchange("amq.fanout", "amq.direct"),
    }
    for what, action in refused.items():
        assert await outcome(action, url) == REFUSED, what
    # The refusal says where to go instead.
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as refusal:
            await asyncio.wait_for(channel.queue_declare("app-queue"), 5)
        assert f"do it on the ACTIVE (the ACTIVE: {pair.primary.address})" in str(refusal.value)
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
    # Its own private reply queue and passive declares stay possible.
    assert await outcome(lambda ch: ch.queue_declare("", exclusive=True), url) == "ok"
    assert await outcome(lambda ch: ch.exchange_declare("amq.direct", passive=True), url) == "ok"
    if user == ADMIN:
        assert (await pair.status(pair.backup))["state"] == "PASSIVE"
    # On the ACTIVE the same login is an ordinary user with a tag.
    active = url_of(pair.primary, user)
    assert (
        await outcome(lambda ch: ch.queue_declare("", durable=True, auto_delete=True), active)
        == "ok"
    )


async def test_guest_cannot_run_console_commands(pair: Pair) -> None:
    await settled(pair)
    connection = await aio_pika.connect(url_of(pair.primary, GUEST))
    try:
        channel = await connection.channel()
        replies = await channel.declare_queue(exclusive=True)
        exchange = await channel.get_exchange("amq.console", ensure=False)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await exchange.publish(
                aio_pika.Message(
                    json.dumps({"command": "controller", "args": {"action": "stop"}}).encode(),
                    reply_to=replies.name,
                ),
                routing_key="",
            )
            await asyncio.wait_for(channel.declare_queue(exclusive=True), 5)
    finally:
        await connection.close()
    status = await pair.status(pair.primary)
    assert status["controller"] == "running"
    assert "guest" not in status["control_received"].get("amq.console", {})


# -- the replication feed -------------------------------------------------------------------


async def test_only_a_peering_login_may_consume_the_replication_feed(broker: Any) -> None:
    """``amq.replication`` carries a server's whole durable state: guest and an
    administrator are refused by every route; a peering login needs acks, and even then
    is refused without proof of the pair's secret (test_replication_trust.py has the
    attacks on a real pair)."""
    for user in ("guest", "admin"):
        connection = await aiormq.connect(f"amqp://{user}:{user}@{broker.address}/")
        try:
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="peering"):
                await channel.basic_consume("amq.replication", lambda message: None)
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await channel.basic_get("amq.replication")
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
                await channel.queue_declare("amq.replication")
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await channel.queue_bind("amq.replication", "amq.direct", "x")
        finally:
            await connection.close()
    peering = await aiormq.connect(f"amqp://peering:peering@{broker.address}/")
    try:
        channel = await peering.channel()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="acks"):
            await channel.basic_consume("amq.replication", lambda message: None, no_ack=True)
        channel = await peering.channel()
        await channel.basic_qos(prefetch_count=4)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="proof"):
            await channel.basic_consume("amq.replication", lambda message: None)
    finally:
        await peering.close()
