"""Queues: declare rules (passive, durable, exclusive, auto-delete, server-named),
bind/unbind, purge, delete if-unused/if-empty, and the x- arguments: message TTL,
per-message expiration, x-expires, length limits with each overflow mode, and
dead-lettering with x-death headers.
"""

from __future__ import annotations

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest
from aio_pika import ExchangeType, Message

from tests.integration.protocol_support import channel_error, eventually, unique


@pytest.fixture
async def connection(broker):
    connection = await aio_pika.connect(broker.url)
    yield connection
    await connection.close()


@pytest.fixture
async def other_connection(broker):
    connection = await aio_pika.connect(broker.url)
    yield connection
    await connection.close()


async def drain(queue) -> list[bytes]:
    bodies = []
    for _ in range(1000):
        message = await queue.get(no_ack=True, fail=False)
        if message is None:
            return bodies
        bodies.append(message.body)
    raise AssertionError("queue never ran empty")


async def ignore(message) -> None:
    """A consumer callback that leaves its deliveries unacknowledged."""


async def counts(channel, name: str) -> tuple[int, int]:
    result = (await channel.declare_queue(name, passive=True)).declaration_result
    return result.message_count, result.consumer_count


async def publish(channel, routing_key: str, *bodies: bytes, **properties) -> None:
    for body in bodies:
        await channel.default_exchange.publish(Message(body, **properties), routing_key=routing_key)


# -- declare ---------------------------------------------------------------------------


async def test_passive_declare_reports_counts_or_404(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(unique("passive"), auto_delete=True)
    await publish(channel, queue.name, b"1", b"2")
    assert await counts(channel, queue.name) == (2, 0)
    consumer_channel = await connection.channel()
    await consumer_channel.set_qos(prefetch_count=1)
    consumer_queue = await consumer_channel.get_queue(queue.name, ensure=False)
    await consumer_queue.consume(ignore)
    assert await counts(channel, queue.name) == (1, 1)

    async def missing(channel):
        await channel.declare_queue(unique("missing"), passive=True)

    assert await channel_error(connection, missing) == 404


@pytest.mark.parametrize(
    "change",
    [
        {"durable": True},
        {"exclusive": True},
        {"auto_delete": False},
        {"arguments": {"x-max-length": 5}},
        {"arguments": {"x-message-ttl": 1000}},
    ],
    ids=["durable", "exclusive", "auto_delete", "new-x-arg", "changed-x-arg"],
)
async def test_redeclare_with_different_properties_is_406(connection, change) -> None:
    original = {"durable": False, "exclusive": False, "auto_delete": True, "arguments": {}}
    if "x-message-ttl" in str(change):
        original["arguments"] = {"x-message-ttl": 5000}
    channel = await connection.channel()
    name = unique("equivalence")
    await channel.declare_queue(name, **original)
    await channel.declare_queue(name, **original)

    async def redeclare(channel):
        await channel.declare_queue(name, **{**original, **change})

    assert await channel_error(connection, redeclare) == 406
    await channel.queue_delete(name)


async def test_durable_queue_declares_and_redeclares(connection) -> None:
    channel = await connection.channel()
    name = unique("durable")
    await channel.declare_queue(name, durable=True)
    assert (await channel.declare_queue(name, durable=True)).declaration_result.queue == name
    assert (await channel.queue_delete(name)).message_count == 0


async def test_exclusive_queue_is_locked_to_its_connection(connection, other_connection) -> None:
    owner = await connection.channel()
    queue = await owner.declare_queue(unique("exclusive"), exclusive=True)
    name = queue.name

    async def declare(channel):
        await channel.declare_queue(name, exclusive=True)

    async def declare_shared(channel):
        await channel.declare_queue(name)

    async def passive(channel):
        await channel.declare_queue(name, passive=True)

    async def consume(channel):
        await (await channel.get_queue(name, ensure=False)).consume(ignore)

    async def get(channel):
        await (await channel.get_queue(name, ensure=False)).get(fail=False)

    async def bind(channel):
        await (await channel.get_queue(name, ensure=False)).bind("amq.direct", "k")

    async def purge(channel):
        await (await channel.get_queue(name, ensure=False)).purge()

    async def delete(channel):
        await channel.queue_delete(name)

    for action in (declare, declare_shared, passive, consume, get, bind, purge, delete):
        assert await channel_error(other_connection, action) == 405, action.__name__
    # The owner keeps full use of it.
    assert await counts(owner, name) == (0, 0)
    await connection.close()
    assert await channel_error(other_connection, passive) == 404


async def test_auto_delete_queue_goes_with_its_last_consumer(connection) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(unique("auto"), auto_delete=True)
    # Never consumed: it stays.
    assert await counts(channel, queue.name) == (0, 0)
    first = await queue.consume(ignore)
    second = await queue.consume(ignore)
    await queue.cancel(first)
    assert await counts(channel, queue.name) == (0, 1)
    await queue.cancel(second)

    async def passive(channel):
        await channel.declare_queue(queue.name, passive=True)

    assert await channel_error(connection, passive) == 404


async def test_auto_delete_queue_goes_when_its_consumer_channel_closes(connection) -> None:
    channel = await connection.channel()
    name = unique("auto-close")
    consumer_channel = await connection.channel()
    queue = await consumer_channel.declare_queue(name, auto_delete=True)
    await queue.consume(ignore)
    await consumer_channel.close()

    async def passive(channel):
        await channel.declare_queue(name, passive=True)

    assert await channel_error(connection, passive) == 404
    await channel.close()


async def test_server_named_queues_and_the_empty_name_shortcut(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    first = await channel.declare_queue(exclusive=True)
    second = await channel.declare_queue(exclusive=True)
    assert first.name.startswith("amq.gen-") and second.name.startswith("amq.gen-")
    assert first.name != second.name
    # Another channel declaring a queue in between does not change this channel's last one.
    other = await connection.channel()
    third = await other.declare_queue(exclusive=True)
    underlay = await channel.get_underlay_channel()
    # An empty queue name means the queue last declared on this channel (spec 0-9-1).
    await underlay.queue_bind("", "amq.direct", routing_key="to-last")
    direct = await channel.get_exchange("amq.direct")
    await direct.publish(Message(b"via last queue"), routing_key="to-last")
    await underlay.queue_unbind("", "amq.direct", routing_key="to-last")
    assert await drain(second) == [b"via last queue"]
    assert await drain(first) == [] and await drain(third) == []

    async def reserved(channel):
        await channel.declare_queue("amq.gen-mine")

    assert await channel_error(connection, reserved) == 403


# -- bind, purge, delete ----------------------------------------------------------------


async def test_bind_and_unbind(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.declare_exchange(unique("bind"), ExchangeType.DIRECT, auto_delete=True)
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(exchange, "k")
    await queue.bind(exchange, "k")  # binding twice is one binding
    await queue.bind(exchange, "j")
    await exchange.publish(Message(b"k1"), routing_key="k")
    await queue.unbind(exchange, "k")
    await queue.unbind(exchange, "never-bound")
    await exchange.publish(Message(b"k2"), routing_key="k")
    await exchange.publish(Message(b"j"), routing_key="j")
    assert await drain(queue) == [b"k1", b"j"]


async def test_purge_removes_ready_messages_but_not_unacked_ones(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(exclusive=True)
    await publish(channel, queue.name, b"1", b"2", b"3")
    held = await queue.get(no_ack=False)
    assert (await queue.purge()).message_count == 2
    assert await queue.get(fail=False) is None
    await held.reject(requeue=True)
    again = await queue.get(no_ack=True)
    assert (again.body, again.redelivered) == (b"1", True)


async def test_delete_if_unused_and_if_empty(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    name = unique("conditional")
    queue = await channel.declare_queue(name)
    tag = await queue.consume(ignore, no_ack=False)

    async def delete_if_unused(channel):
        await channel.queue_delete(name, if_unused=True)

    async def delete_if_empty(channel):
        await channel.queue_delete(name, if_empty=True)

    assert await channel_error(connection, delete_if_unused) == 406
    await queue.cancel(tag)
    await publish(channel, name, b"a", b"b")
    assert await channel_error(connection, delete_if_empty) == 406
    assert (await channel.queue_delete(name, if_unused=True)).message_count == 2
    assert (await channel.queue_delete(name)).message_count == 0


# -- TTL and expiry -----------------------------------------------------------------------


async def test_queue_message_ttl_expires_messages(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(exclusive=True, arguments={"x-message-ttl": 50})
    await publish(channel, queue.name, b"short-lived", b"also")

    async def expired():
        return (await counts(channel, queue.name))[0] == 0

    await eventually(expired)
    assert await queue.get(fail=False) is None


async def test_per_message_expiration_and_the_lower_ttl_wins(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(exclusive=True, arguments={"x-message-ttl": 600_000})
    await publish(channel, queue.name, b"expires", expiration=0.05)
    await publish(channel, queue.name, b"stays")

    async def first_expired():
        return (await counts(channel, queue.name))[0] == 1

    await eventually(first_expired)
    assert await drain(queue) == [b"stays"]


def test_invalid_expiration_is_406_with_pika(broker) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        name = channel.queue_declare("", exclusive=True).method.queue
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.basic_publish("", name, b"x", pika.BasicProperties(expiration="soon"))
        assert closed.value.reply_code == 406
        assert connection.is_open
        assert connection.channel().queue_declare(name, passive=True).method.message_count == 0
    finally:
        connection.close()


async def test_x_expires_deletes_an_unused_queue(connection) -> None:
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    name = unique("expires")
    await channel.declare_queue(name, arguments={"x-expires": 100})
    # Probing with a mandatory publish does not count as use (a passive declare would).

    async def returned():
        try:
            await channel.default_exchange.publish(Message(b"probe"), name, mandatory=True)
        except aio_pika.exceptions.PublishError as error:
            return error.frame.reply_code
        return None

    assert await eventually(returned) == 312

    async def passive(channel):
        await channel.declare_queue(name, passive=True)

    assert await channel_error(connection, passive) == 404


# -- length limits ----------------------------------------------------------------------


async def test_max_length_drop_head(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(exclusive=True, arguments={"x-max-length": 2})
    await publish(channel, queue.name, b"1", b"2", b"3", b"4")
    assert await drain(queue) == [b"3", b"4"]


async def test_max_length_bytes_drop_head(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(
        exclusive=True, arguments={"x-max-length-bytes": 10, "x-overflow": "drop-head"}
    )
    await publish(channel, queue.name, b"aaaa", b"bbbb", b"cccc")
    assert await drain(queue) == [b"bbbb", b"cccc"]


@pytest.mark.parametrize(
    "arguments",
    [{"x-max-length": 2}, {"x-max-length-bytes": 8}],
    ids=["max-length", "max-length-bytes"],
)
async def test_reject_publish_nacks_the_publisher(connection, arguments) -> None:
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(
        exclusive=True, arguments={**arguments, "x-overflow": "reject-publish"}
    )
    await publish(channel, queue.name, b"1111", b"2222")
    with pytest.raises(aio_pika.exceptions.DeliveryError) as nacked:
        await publish(channel, queue.name, b"3333")
    assert isinstance(nacked.value.frame, aiormq.spec.Basic.Nack)
    assert not channel.is_closed
    first = await queue.get(no_ack=True)
    await publish(channel, queue.name, b"4444")
    assert [first.body, *await drain(queue)] == [b"1111", b"2222", b"4444"]


def test_reject_publish_nack_with_pika(broker) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        arguments = {"x-max-length": 1, "x-overflow": "reject-publish"}
        name = channel.queue_declare("", exclusive=True, arguments=arguments).method.queue
        channel.basic_publish("", name, b"fits")
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", name, b"refused")
        assert channel.queue_declare(name, passive=True).method.message_count == 1
    finally:
        connection.close()


@pytest.mark.parametrize("value", ["abc", -1])
async def test_invalid_length_arguments_are_406(connection, value) -> None:
    async def declare(channel):
        await channel.declare_queue(exclusive=True, arguments={"x-max-length": value})

    assert await channel_error(connection, declare) == 406


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-message-ttl": "soon"},
        {"x-expires": 0},
        {"x-overflow": "explode"},
        {"x-dead-letter-routing-key": "no-exchange"},
    ],
)
async def test_invalid_queue_arguments_are_406(connection, arguments) -> None:
    async def declare(channel):
        await channel.declare_queue(exclusive=True, arguments=arguments)

    assert await channel_error(connection, declare) == 406


# -- dead letters -------------------------------------------------------------------------


async def dead_letter_setup(channel, **arguments):
    exchange = await channel.declare_exchange(unique("dlx"), ExchangeType.DIRECT, auto_delete=True)
    dead = await channel.declare_queue(exclusive=True)
    await dead.bind(exchange, "dead")
    source = await channel.declare_queue(
        exclusive=True,
        arguments={
            "x-dead-letter-exchange": exchange.name,
            "x-dead-letter-routing-key": "dead",
            **arguments,
        },
    )
    return exchange, source, dead


def death_of(message) -> dict:
    deaths = message.headers["x-death"]
    assert len(deaths) == 1
    return dict(deaths[0])


async def test_rejected_messages_are_dead_lettered_with_x_death(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    exchange, source, dead = await dead_letter_setup(channel)
    await publish(channel, source.name, b"reject me", headers={"app": "kept"})
    await publish(channel, source.name, b"nack me")
    await (await source.get(no_ack=False)).reject(requeue=False)
    await (await source.get(no_ack=False)).nack(requeue=False)
    first = await dead.get(no_ack=True)
    second = await dead.get(no_ack=True)
    assert (first.body, second.body) == (b"reject me", b"nack me")
    assert (first.exchange, first.routing_key) == (exchange.name, "dead")
    assert first.headers["app"] == "kept"
    death = death_of(first)
    assert death["reason"] == "rejected" and death["count"] == 1
    assert death["queue"] == source.name and death["exchange"] == ""
    assert list(death["routing-keys"]) == [source.name]
    assert "time" in death
    assert first.headers["x-first-death-reason"] == "rejected"
    assert first.headers["x-first-death-queue"] == source.name
    assert first.headers["x-first-death-exchange"] == ""
    assert death_of(second)["reason"] == "rejected"
    # Rejected with requeue: not dead-lettered.
    await publish(channel, source.name, b"requeued")
    await (await source.get(no_ack=False)).reject(requeue=True)
    assert await dead.get(fail=False) is None
    assert (await source.get(no_ack=True)).redelivered


async def test_expired_messages_are_dead_lettered_without_their_expiration(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    _, source, dead = await dead_letter_setup(channel, **{"x-message-ttl": 30})
    await publish(channel, source.name, b"queue ttl")
    await publish(channel, source.name, b"own ttl", expiration=0.01)
    got = []

    async def both_dead():
        message = await dead.get(no_ack=True, fail=False)
        if message is not None:
            got.append(message)
        return len(got) == 2

    await eventually(both_dead)
    assert [m.body for m in got] == [b"queue ttl", b"own ttl"]
    assert [death_of(m)["reason"] for m in got] == ["expired", "expired"]
    assert got[1].expiration is None


async def test_max_length_overflow_is_dead_lettered_as_maxlen(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    _, source, dead = await dead_letter_setup(channel, **{"x-max-length": 1})
    await publish(channel, source.name, b"dropped", b"kept")
    message = await dead.get(no_ack=True)
    assert message.body == b"dropped"
    assert death_of(message)["reason"] == "maxlen"
    assert await drain(source) == [b"kept"]


async def test_reject_publish_dlx_nacks_and_dead_letters_as_maxlen(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    _, source, dead = await dead_letter_setup(
        channel, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"}
    )
    await publish(channel, source.name, b"kept")
    with pytest.raises(aio_pika.exceptions.DeliveryError):
        await publish(channel, source.name, b"refused")
    message = await dead.get(no_ack=True)
    assert message.body == b"refused"
    assert death_of(message)["reason"] == "maxlen"
    assert await drain(source) == [b"kept"]


async def test_x_death_count_increments_on_each_cycle(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    name = unique("cycle")
    # Dead letters go back to the same queue through the default exchange.
    queue = await channel.declare_queue(
        name,
        exclusive=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": name},
    )
    await publish(channel, name, b"again and again")
    seen = []
    for _ in range(3):
        message = await queue.get(no_ack=False)
        seen.append(message.headers.get("x-death"))
        await message.reject(requeue=False)
    last = await queue.get(no_ack=True)
    assert seen[0] is None
    assert [d[0]["count"] for d in seen[1:]] == [1, 2]
    assert len(last.headers["x-death"]) == 1
    assert death_of(last)["count"] == 3 and death_of(last)["reason"] == "rejected"
    assert last.headers["x-first-death-reason"] == "rejected"


async def test_dead_letter_keeps_the_original_key_without_a_dlx_routing_key(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.declare_exchange(unique("dlx"), ExchangeType.TOPIC, auto_delete=True)
    dead = await channel.declare_queue(exclusive=True)
    await dead.bind(exchange, "#")
    source = await channel.declare_queue(
        exclusive=True, arguments={"x-dead-letter-exchange": exchange.name}
    )
    entry = await channel.declare_exchange(unique("entry"), ExchangeType.DIRECT, auto_delete=True)
    await source.bind(entry, "orders.created")
    await entry.publish(Message(b"order"), routing_key="orders.created")
    await (await source.get(no_ack=False)).reject(requeue=False)
    message = await dead.get(no_ack=True)
    assert message.routing_key == "orders.created"
    death = death_of(message)
    assert death["exchange"] == entry.name
    assert list(death["routing-keys"]) == ["orders.created"]


async def test_missing_dead_letter_exchange_drops_quietly(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(
        exclusive=True, arguments={"x-dead-letter-exchange": unique("not-there")}
    )
    await publish(channel, queue.name, b"gone")
    await (await queue.get(no_ack=False)).reject(requeue=False)
    assert await queue.get(fail=False) is None
    assert not channel.is_closed
