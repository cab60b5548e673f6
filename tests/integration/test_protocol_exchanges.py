"""Exchanges: the four types and their matching, the standard exchanges, declare rules
(passive, durable, auto-delete, internal, reserved names, type changes), delete
if-unused, and exchange-to-exchange bindings. Errors are checked for their reply code
and their scope: a soft error closes one channel, a hard one the connection.
"""

from __future__ import annotations

import aio_pika
import aiormq
import pytest
from aio_pika import ExchangeType, Message

from tests.integration.protocol_support import channel_error, reply_code, unique


@pytest.fixture
async def connection(broker):
    connection = await aio_pika.connect(broker.url)
    yield connection
    await connection.close()


async def drain(queue: aio_pika.abc.AbstractQueue) -> list[bytes]:
    """Every message in the queue now, via Basic.Get (bounded by the queue's length)."""
    bodies = []
    for _ in range(1000):
        message = await queue.get(no_ack=True, fail=False)
        if message is None:
            return bodies
        bodies.append(message.body)
    raise AssertionError("queue never ran empty")


async def confirmed_channel(connection):
    return await connection.channel(publisher_confirms=True)


# -- types and matching ------------------------------------------------------------------


async def test_direct_exchange_routes_on_exact_key(connection) -> None:
    channel = await confirmed_channel(connection)
    exchange = await channel.declare_exchange(
        unique("direct"), ExchangeType.DIRECT, auto_delete=True
    )
    red = await channel.declare_queue(exclusive=True)
    both = await channel.declare_queue(exclusive=True)
    await red.bind(exchange, "red")
    await both.bind(exchange, "red")
    await both.bind(exchange, "blue")
    for key in ("red", "blue", "green", "RED", "red.x"):
        await exchange.publish(Message(key.encode()), routing_key=key)
    assert await drain(red) == [b"red"]
    assert await drain(both) == [b"red", b"blue"]


async def test_fanout_exchange_ignores_the_key_and_copies_to_every_queue(connection) -> None:
    channel = await confirmed_channel(connection)
    exchange = await channel.declare_exchange(
        unique("fanout"), ExchangeType.FANOUT, auto_delete=True
    )
    queues = [await channel.declare_queue(exclusive=True) for _ in range(3)]
    for queue, key in zip(queues, ("a", "b", ""), strict=True):
        await queue.bind(exchange, key)
    await exchange.publish(Message(b"to all"), routing_key="anything")
    assert [await drain(queue) for queue in queues] == [[b"to all"]] * 3


TOPIC_KEYS = ["a", "b", "ab", "a.b", "a.c", "x.a", "a.b.c", "a.x.b", "a.x.y.b", "a.b.b.c", "b.a.b"]
ALL_KEYS = set(TOPIC_KEYS)
TOPIC_MATCHES = {
    "#": ALL_KEYS,
    "#.#": ALL_KEYS,
    "*.#": ALL_KEYS,
    "*": {"a", "b", "ab"},
    "*.*": {"a.b", "a.c", "x.a"},
    "a.b": {"a.b"},
    "a.#": {"a", "a.b", "a.c", "a.b.c", "a.x.b", "a.x.y.b", "a.b.b.c"},
    "#.a": {"a", "x.a"},
    "#.b": {"b", "a.b", "a.x.b", "a.x.y.b", "b.a.b"},
    "a.#.b": {"a.b", "a.x.b", "a.x.y.b"},
    "a.*.c": {"a.b.c"},
    "a.*.#": {"a.b", "a.c", "a.b.c", "a.x.b", "a.x.y.b", "a.b.b.c"},
    "#.b.#": {"b", "a.b", "a.b.c", "a.x.b", "a.x.y.b", "a.b.b.c", "b.a.b"},
}


async def test_topic_exchange_wildcards(connection) -> None:
    channel = await confirmed_channel(connection)
    exchange = await channel.declare_exchange(unique("topic"), ExchangeType.TOPIC, auto_delete=True)
    queues = {}
    for pattern in TOPIC_MATCHES:
        queues[pattern] = await channel.declare_queue(exclusive=True)
        await queues[pattern].bind(exchange, pattern)
    for key in TOPIC_KEYS:
        await exchange.publish(Message(key.encode()), routing_key=key)
    got = {pattern: {b.decode() for b in await drain(queue)} for pattern, queue in queues.items()}
    assert got == TOPIC_MATCHES


async def test_topic_hash_alone_matches_the_empty_key_and_overlaps_deliver_once(connection) -> None:
    channel = await confirmed_channel(connection)
    exchange = await channel.declare_exchange(unique("topic"), ExchangeType.TOPIC, auto_delete=True)
    hash_only = await channel.declare_queue(exclusive=True)
    prefixed = await channel.declare_queue(exclusive=True)
    overlapping = await channel.declare_queue(exclusive=True)
    await hash_only.bind(exchange, "#")
    await prefixed.bind(exchange, "a.#")
    for pattern in ("a.*", "*.b", "#"):
        await overlapping.bind(exchange, pattern)
    await exchange.publish(Message(b"empty"), routing_key="")
    await exchange.publish(Message(b"a.b"), routing_key="a.b")
    assert await drain(hash_only) == [b"empty", b"a.b"]
    assert await drain(prefixed) == [b"a.b"]
    assert await drain(overlapping) == [b"empty", b"a.b"]


async def test_headers_exchange_all_and_any(connection) -> None:
    channel = await confirmed_channel(connection)
    exchange = await channel.declare_exchange(
        unique("headers"), ExchangeType.HEADERS, auto_delete=True
    )
    bindings = {
        "all": {"x-match": "all", "format": "pdf", "type": "report"},
        "any": {"x-match": "any", "format": "pdf", "type": "report"},
        "default-is-all": {"format": "pdf", "type": "report"},
        "x-keys-ignored": {"x-match": "all", "x-other": "ignored", "format": "pdf"},
        "integer": {"size": 3},
    }
    queues = {}
    for name, arguments in bindings.items():
        queues[name] = await channel.declare_queue(exclusive=True)
        await queues[name].bind(exchange, "ignored-key", arguments=arguments)
    messages = {
        "pdf-report": {"format": "pdf", "type": "report"},
        "pdf": {"format": "pdf"},
        "zip-report": {"format": "zip", "type": "report"},
        "none": {},
        "size-3": {"size": 3},
        "size-text-3": {"size": "3"},
    }
    for body, headers in messages.items():
        await exchange.publish(Message(body.encode(), headers=headers), routing_key="other-key")
    got = {name: [b.decode() for b in await drain(queue)] for name, queue in queues.items()}
    assert got == {
        "all": ["pdf-report"],
        "any": ["pdf-report", "pdf", "zip-report"],
        "default-is-all": ["pdf-report"],
        "x-keys-ignored": ["pdf-report", "pdf"],
        "integer": ["size-3"],
    }


async def test_headers_binding_with_a_bad_x_match_is_406(connection) -> None:
    channel = await connection.channel()
    exchange = await channel.declare_exchange(
        unique("headers"), ExchangeType.HEADERS, auto_delete=True
    )
    name = unique("q")
    await channel.declare_queue(name, auto_delete=True)

    async def bind(channel):
        await (await channel.get_underlay_channel()).queue_bind(
            name, exchange.name, arguments={"x-match": "some"}
        )

    assert await channel_error(connection, bind) == 406


# -- the default and standard exchanges ------------------------------------------------


async def test_default_exchange_routes_by_queue_name_and_cannot_be_touched(connection) -> None:
    channel = await confirmed_channel(connection)
    queue = await channel.declare_queue(exclusive=True)
    await channel.default_exchange.publish(Message(b"direct to queue"), routing_key=queue.name)
    assert await drain(queue) == [b"direct to queue"]

    async def bind(channel):
        await (await channel.get_underlay_channel()).queue_bind(queue.name, "", routing_key="x")

    async def delete(channel):
        await channel.exchange_delete("")

    async def declare(channel):
        await (await channel.get_underlay_channel()).exchange_declare("", exchange_type="direct")

    # The queue is exclusive to this connection: bind from it, on new channels.
    assert await channel_error(connection, bind) == 403
    assert await channel_error(connection, delete) == 403
    assert await channel_error(connection, declare) == 403


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.topic", "topic"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
        ("amq.peer", "fanout"),
    ],
)
async def test_standard_exchanges_exist_with_their_types(connection, name, kind) -> None:
    channel = await connection.channel()
    await channel.declare_exchange(name, passive=True)
    # An equivalent redeclare is allowed; a different type is not.
    await channel.declare_exchange(name, kind, durable=True)
    other = "direct" if kind != "direct" else "fanout"

    async def redeclare(channel):
        await channel.declare_exchange(name, other, durable=True)

    assert await channel_error(connection, redeclare) == 406


async def test_standard_exchanges_route(connection) -> None:
    channel = await confirmed_channel(connection)
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind("amq.direct", "k")
    await queue.bind("amq.topic", "t.*")
    await queue.bind("amq.fanout", "")
    await queue.bind("amq.match", arguments={"x-match": "any", "h": 1})
    direct = await channel.get_exchange("amq.direct")
    topic = await channel.get_exchange("amq.topic")
    fanout = await channel.get_exchange("amq.fanout")
    match = await channel.get_exchange("amq.match")
    await direct.publish(Message(b"direct"), routing_key="k")
    await topic.publish(Message(b"topic"), routing_key="t.1")
    await fanout.publish(Message(b"fanout"), routing_key="")
    await match.publish(Message(b"match", headers={"h": 1}), routing_key="")
    assert await drain(queue) == [b"direct", b"topic", b"fanout", b"match"]


# -- declare rules -------------------------------------------------------------------------


async def test_passive_declare_of_a_missing_exchange_is_404(connection) -> None:
    async def passive(channel):
        await channel.declare_exchange(unique("missing"), passive=True)

    assert await channel_error(connection, passive) == 404


async def test_durable_exchange_redeclare_must_match(connection) -> None:
    channel = await connection.channel()
    name = unique("durable")
    try:
        await channel.declare_exchange(name, ExchangeType.DIRECT, durable=True)
        await channel.declare_exchange(name, ExchangeType.DIRECT, durable=True)

        async def transient(channel):
            await channel.declare_exchange(name, ExchangeType.DIRECT, durable=False)

        assert await channel_error(connection, transient) == 406
    finally:
        await channel.exchange_delete(name)


async def test_redeclare_with_another_type_is_406(connection) -> None:
    channel = await connection.channel()
    name = unique("typed")
    await channel.declare_exchange(name, ExchangeType.DIRECT, auto_delete=True)

    async def as_topic(channel):
        await channel.declare_exchange(name, ExchangeType.TOPIC, auto_delete=True)

    assert await channel_error(connection, as_topic) == 406
    await channel.declare_exchange(name, passive=True)
    await channel.exchange_delete(name)


async def test_auto_delete_exchange_goes_with_its_last_binding(connection) -> None:
    channel = await connection.channel()
    exchange = await channel.declare_exchange(unique("auto"), ExchangeType.DIRECT, auto_delete=True)
    first = await channel.declare_queue(exclusive=True)
    second = await channel.declare_queue(exclusive=True)
    # Never bound yet: it stays.
    await channel.declare_exchange(exchange.name, passive=True)
    await first.bind(exchange, "a")
    await second.bind(exchange, "b")
    await first.unbind(exchange, "a")
    await channel.declare_exchange(exchange.name, passive=True)
    # Deleting the last bound queue removes the last binding.
    await second.delete()

    async def passive(channel):
        await channel.declare_exchange(exchange.name, passive=True)

    assert await channel_error(connection, passive) == 404


async def test_internal_exchange_refuses_publishes_but_takes_exchange_bindings(connection) -> None:
    channel = await confirmed_channel(connection)
    internal = await channel.declare_exchange(
        unique("internal"), ExchangeType.FANOUT, internal=True, auto_delete=True
    )
    front = await channel.declare_exchange(unique("front"), ExchangeType.DIRECT, auto_delete=True)
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(internal, "")
    await internal.bind(front, "in")
    await front.publish(Message(b"via front"), routing_key="in")
    assert await drain(queue) == [b"via front"]

    async def publish_to_internal(channel):
        exchange = await channel.get_exchange(internal.name, ensure=False)
        await exchange.publish(Message(b"refused"), routing_key="")

    async def confirmed(connection_):
        return await connection_.channel(publisher_confirms=True)

    publisher = await confirmed(connection)
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as refused:
        await publish_to_internal(publisher)
    assert reply_code(refused.value) == 403
    assert publisher.is_closed and not connection.is_closed
    assert await drain(queue) == []


async def test_amq_prefix_is_reserved(connection) -> None:
    async def declare(channel):
        await channel.declare_exchange(unique("amq.mine"), ExchangeType.DIRECT)

    async def delete(channel):
        await channel.exchange_delete("amq.direct")

    assert await channel_error(connection, declare) == 403
    assert await channel_error(connection, delete) == 403


async def test_unknown_exchange_type_closes_only_its_channel_with_406(connection) -> None:
    async def declare(channel):
        await channel.declare_exchange(unique("odd"), "x-no-such-type")

    # As RabbitMQ since 3.12: a channel error, the connection's other channels live on.
    survivor = await connection.channel()
    assert await channel_error(connection, declare) == 406
    await survivor.declare_exchange(unique("fine"), ExchangeType.DIRECT, auto_delete=True)


async def test_publish_to_a_missing_exchange_is_404(connection) -> None:
    async def publish(channel):
        exchange = await channel.get_exchange(unique("nowhere"), ensure=False)
        await exchange.publish(Message(b"lost"), routing_key="")

    channel = await connection.channel(publisher_confirms=True)
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as missing:
        await publish(channel)
    assert reply_code(missing.value) == 404
    assert not connection.is_closed


async def test_bind_to_missing_exchange_or_queue_is_404(connection) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(unique("bindable"), auto_delete=True)
    exchange = await channel.declare_exchange(
        unique("bindable"), ExchangeType.DIRECT, auto_delete=True
    )

    async def missing_exchange(channel):
        await (await channel.get_underlay_channel()).queue_bind(
            queue.name, unique("nowhere"), routing_key="k"
        )

    async def missing_queue(channel):
        await (await channel.get_underlay_channel()).queue_bind(
            unique("nobody"), exchange.name, routing_key="k"
        )

    assert await channel_error(connection, missing_exchange) == 404
    assert await channel_error(connection, missing_queue) == 404


# -- delete ------------------------------------------------------------------------------


async def test_delete_if_unused_refuses_a_bound_exchange(connection) -> None:
    channel = await connection.channel()
    exchange = await channel.declare_exchange(unique("used"), ExchangeType.DIRECT)
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(exchange, "k")

    async def delete_if_unused(channel):
        await channel.exchange_delete(exchange.name, if_unused=True)

    assert await channel_error(connection, delete_if_unused) == 406
    await channel.declare_exchange(exchange.name, passive=True)
    await queue.unbind(exchange, "k")
    await channel.exchange_delete(exchange.name, if_unused=True)

    async def passive(channel):
        await channel.declare_exchange(exchange.name, passive=True)

    assert await channel_error(connection, passive) == 404
    # Deleting what is not there succeeds (as RabbitMQ does).
    await channel.exchange_delete(exchange.name)


# -- exchange to exchange --------------------------------------------------------------


async def test_exchange_to_exchange_bind_and_unbind(connection) -> None:
    channel = await confirmed_channel(connection)
    source = await channel.declare_exchange(unique("source"), ExchangeType.TOPIC)
    destination = await channel.declare_exchange(unique("dest"), ExchangeType.FANOUT)
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(destination, "")
    await destination.bind(source, "orders.*")
    await source.publish(Message(b"routed"), routing_key="orders.new")
    await source.publish(Message(b"not routed"), routing_key="invoices.new")
    assert await drain(queue) == [b"routed"]
    await destination.unbind(source, "orders.*")
    await source.publish(Message(b"after unbind"), routing_key="orders.new", mandatory=False)
    assert await drain(queue) == []
    await channel.exchange_delete(destination.name)
    await channel.exchange_delete(source.name)


async def test_auto_delete_source_goes_with_its_last_exchange_binding(connection) -> None:
    channel = await connection.channel()
    source = await channel.declare_exchange(unique("source"), ExchangeType.DIRECT, auto_delete=True)
    destination = await channel.declare_exchange(
        unique("dest"), ExchangeType.FANOUT, auto_delete=True
    )
    await destination.bind(source, "k")
    await destination.unbind(source, "k")

    async def passive(channel):
        await channel.declare_exchange(source.name, passive=True)

    assert await channel_error(connection, passive) == 404


async def test_exchange_binding_cycles_deliver_each_message_once(connection) -> None:
    channel = await confirmed_channel(connection)
    first = await channel.declare_exchange(unique("ring-a"), ExchangeType.FANOUT, auto_delete=True)
    second = await channel.declare_exchange(unique("ring-b"), ExchangeType.FANOUT, auto_delete=True)
    queue = await channel.declare_queue(exclusive=True)
    await second.bind(first, "")
    await first.bind(second, "")
    await queue.bind(first, "")
    await queue.bind(second, "")
    await first.publish(Message(b"once"), routing_key="")
    assert await drain(queue) == [b"once"]


async def test_deleting_a_destination_exchange_removes_its_bindings(connection) -> None:
    channel = await confirmed_channel(connection)
    source = await channel.declare_exchange(unique("src"), ExchangeType.FANOUT)
    destination = await channel.declare_exchange(unique("dst"), ExchangeType.FANOUT)
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(destination, "")
    await destination.bind(source, "")
    await channel.exchange_delete(destination.name)
    # Recreate under the same name: the old binding from the source must not come back.
    destination = await channel.declare_exchange(destination.name, ExchangeType.FANOUT)
    await queue.bind(destination, "")
    await source.publish(Message(b"orphan"), routing_key="")
    assert await drain(queue) == []
    # The source lost its only binding but is not auto-delete: if-unused now succeeds.
    await channel.exchange_delete(source.name, if_unused=True)
    await channel.exchange_delete(destination.name)
