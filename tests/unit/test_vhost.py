"""VHost: declare/delete/bind rules with the exact pamqp exception for each refusal,
routing through exchange-to-exchange bindings (cycles included), and dead-lettering."""

from __future__ import annotations

import datetime
import gc
import struct
from typing import Any

import pytest
from pamqp import commands, exceptions
from pamqp.header import ContentHeader

from amqha.core.message import Message
from amqha.core.queue import Consumer, Queue
from amqha.core.routing import ArgumentBytes, Exchange
from amqha.core.vhost import VHost
from amqha.wire import address_of

WALL_CLOCK = 1_700_000_000.0
OWNER, OTHER = object(), object()


class Harness:
    """A vhost whose dead letters are enqueued the way the broker does it."""

    def __init__(self) -> None:
        self.vhost = VHost("/", lambda: WALL_CLOCK)
        self.now = 0.0
        self.deleted: list[str] = []
        self.vhost.on_queue_deleted = lambda queue: self.deleted.append(queue.name)

    def enqueue(self, message: Message, queues: tuple[Queue, ...]) -> None:
        self.vhost.enqueue(message, queues, self.now)

    def queue(self, name: str, **arguments: Any) -> Queue:
        return self.vhost.declare_queue(name, OWNER, self.now, arguments=arguments)

    def publish(
        self, exchange: str, routing_key: str, body: bytes = b"m", **properties: Any
    ) -> tuple[Queue, ...]:
        message = make_message(exchange, routing_key, body, **properties)
        queues = self.vhost.route(self.vhost.get_exchange(exchange), routing_key, message)
        self.enqueue(message, queues)
        return queues


def make_message(exchange: str, routing_key: str, body: bytes = b"m", **properties: Any) -> Message:
    header = ContentHeader(0, len(body), commands.Basic.Properties(**properties)).marshal()
    return Message(address_of(exchange, routing_key), header, body)


@pytest.fixture
def h() -> Harness:
    return Harness()


# -- exchanges --------------------------------------------------------------------------


def test_standard_exchanges_exist(h: Harness) -> None:
    kinds = {name: exchange.kind for name, exchange in h.vhost.exchanges.items()}
    assert kinds == {
        "": "direct",
        "amq.direct": "direct",
        "amq.fanout": "fanout",
        "amq.topic": "topic",
        "amq.headers": "headers",
        "amq.match": "headers",
        "amq.peer": "fanout",
        "amq.console": "direct",
        "amq.federation": "direct",
    }


def test_declare_exchange_and_redeclare_equivalent(h: Harness) -> None:
    first = h.vhost.declare_exchange("logs", "topic", durable=True)
    assert h.vhost.declare_exchange("logs", "topic", durable=True) is first
    assert h.vhost.declare_exchange("logs", "fanout", passive=True) is first


@pytest.mark.parametrize(
    ("changes", "arg"),
    [
        ({"kind": "direct"}, "type"),
        ({"durable": False}, "durable"),
        ({"auto_delete": True}, "auto_delete"),
        ({"internal": True}, "internal"),
    ],
)
def test_inequivalent_exchange_is_406(h: Harness, changes: dict, arg: str) -> None:
    h.vhost.declare_exchange("logs", "topic", durable=True)
    declared = {"kind": "topic", "durable": True, **changes}
    with pytest.raises(exceptions.AMQPPreconditionFailed, match=f"'{arg}'"):
        h.vhost.declare_exchange("logs", **declared)


def test_passive_declare_of_a_missing_exchange_is_404(h: Harness) -> None:
    with pytest.raises(exceptions.AMQPNotFound):
        h.vhost.declare_exchange("nope", "direct", passive=True)
    with pytest.raises(exceptions.AMQPNotFound):
        h.vhost.get_exchange("nope")


def test_amq_prefix_and_default_exchange_are_403(h: Harness) -> None:
    with pytest.raises(exceptions.AMQPAccessRefused, match="amq."):
        h.vhost.declare_exchange("amq.mine", "direct")
    with pytest.raises(exceptions.AMQPAccessRefused, match="default exchange"):
        h.vhost.declare_exchange("", "direct")
    # Redeclaring a standard exchange as it is is fine, differently is 406.
    assert h.vhost.declare_exchange("amq.topic", "topic", durable=True).kind == "topic"
    with pytest.raises(exceptions.AMQPPreconditionFailed):
        h.vhost.declare_exchange("amq.topic", "fanout", durable=True)


def test_unknown_exchange_type_is_406(h: Harness) -> None:
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="unknown exchange type"):
        h.vhost.declare_exchange("weird", "x-consistent-hash")
    assert "weird" not in h.vhost.exchanges


@pytest.mark.parametrize("name", ["", "amq.direct", "amq.peer", "amq.console", "amq.whatever"])
def test_reserved_exchanges_cannot_be_deleted(h: Harness, name: str) -> None:
    with pytest.raises(exceptions.AMQPAccessRefused):
        h.vhost.delete_exchange(name)


def test_delete_exchange_if_unused_and_missing(h: Harness) -> None:
    h.vhost.delete_exchange("never-declared")
    h.vhost.declare_exchange("x", "direct")
    h.queue("q")
    h.vhost.bind_queue("q", "x", "k", {}, OWNER)
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="in use"):
        h.vhost.delete_exchange("x", if_unused=True)
    h.vhost.delete_exchange("x")
    assert "x" not in h.vhost.exchanges


def test_deleting_an_exchange_removes_bindings_to_it(h: Harness) -> None:
    h.vhost.declare_exchange("src", "fanout")
    h.vhost.declare_exchange("mid", "fanout")
    h.queue("q")
    h.vhost.bind_exchange("mid", "src", "", {})
    h.vhost.bind_queue("q", "mid", "", {}, OWNER)
    assert h.publish("src", "k") == (h.vhost.queues["q"],)
    h.vhost.delete_exchange("mid")
    assert h.vhost.exchanges["src"].bindings == {}
    assert h.publish("src", "k") == ()


def test_auto_delete_exchange_goes_with_its_last_binding(h: Harness) -> None:
    h.vhost.declare_exchange("temp", "direct", auto_delete=True)
    h.queue("q")
    h.vhost.bind_queue("q", "temp", "a", {}, OWNER)
    h.vhost.bind_queue("q", "temp", "b", {}, OWNER)
    h.vhost.unbind_queue("q", "temp", "a", {}, OWNER)
    assert "temp" in h.vhost.exchanges
    h.vhost.unbind_queue("q", "temp", "b", {}, OWNER)
    assert "temp" not in h.vhost.exchanges


# -- queues -----------------------------------------------------------------------------


def test_declare_queue_server_named_and_redeclare(h: Harness) -> None:
    named = h.vhost.declare_queue("", OWNER, 0.0)
    assert named.name.startswith("amq.gen-") and named.name in h.vhost.queues
    queue = h.vhost.declare_queue("jobs", OWNER, 0.0, durable=True, arguments={"x-max-length": 5})
    again = h.vhost.declare_queue(
        "jobs", OTHER, 7.0, durable=True, arguments={"x-max-length": 5, "plain": 1}
    )
    assert again is queue and queue.last_used == 7.0


def test_passive_declare_of_a_missing_queue_is_404(h: Harness) -> None:
    with pytest.raises(exceptions.AMQPNotFound):
        h.vhost.declare_queue("nope", OWNER, 0.0, passive=True)


def test_passive_declare_touches_last_used(h: Harness) -> None:
    queue = h.queue("q")
    h.vhost.declare_queue("q", OWNER, 9.0, passive=True)
    assert queue.last_used == 9.0


def test_amq_prefixed_queue_is_403(h: Harness) -> None:
    with pytest.raises(exceptions.AMQPAccessRefused):
        h.vhost.declare_queue("amq.mine", OWNER, 0.0)


@pytest.mark.parametrize(
    ("redeclare", "arg"),
    [
        ({"durable": True}, "durable"),
        ({"auto_delete": True}, "auto_delete"),
        ({"arguments": {"x-max-length": 6}}, "x-max-length"),
        ({"arguments": {}}, "x-max-length"),
        ({"arguments": {"x-max-length": 5, "x-message-ttl": 1}}, "x-message-ttl"),
    ],
)
def test_inequivalent_queue_is_406(h: Harness, redeclare: dict, arg: str) -> None:
    h.vhost.declare_queue("q", OWNER, 0.0, arguments={"x-max-length": 5})
    with pytest.raises(exceptions.AMQPPreconditionFailed, match=f"'{arg}'"):
        h.vhost.declare_queue("q", OWNER, 0.0, **{"arguments": {"x-max-length": 5}, **redeclare})


def test_exclusive_mismatch_is_406_for_its_owner(h: Harness) -> None:
    h.vhost.declare_queue("q", OWNER, 0.0)
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="exclusive"):
        h.vhost.declare_queue("q", OWNER, 0.0, exclusive=True)


def test_exclusive_queue_of_another_connection_is_405(h: Harness) -> None:
    h.vhost.declare_queue("mine", OWNER, 0.0, exclusive=True)
    calls = [
        lambda: h.vhost.declare_queue("mine", OTHER, 0.0, exclusive=True),
        lambda: h.vhost.declare_queue("mine", OTHER, 0.0, passive=True),
        lambda: h.vhost.get_queue("mine", OTHER),
        lambda: h.vhost.delete_queue("mine", OTHER),
        lambda: h.vhost.bind_queue("mine", "amq.direct", "k", {}, OTHER),
        lambda: h.vhost.unbind_queue("mine", "amq.direct", "k", {}, OTHER),
    ]
    for call in calls:
        with pytest.raises(exceptions.AMQPResourceLocked):
            call()
    assert h.vhost.get_queue("mine", OWNER).exclusive_owner is OWNER


def test_bad_queue_argument_is_406(h: Harness) -> None:
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="x-overflow"):
        h.vhost.declare_queue("q", OWNER, 0.0, arguments={"x-overflow": "sideways"})
    assert "q" not in h.vhost.queues


def test_delete_queue_if_unused_if_empty(h: Harness) -> None:
    queue = h.queue("q")
    queue.add_consumer(Taker(), 0.0)
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="in use"):
        h.vhost.delete_queue("q", OWNER, if_unused=True)
    queue.consumers.clear()
    h.publish("", "q")
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="not empty"):
        h.vhost.delete_queue("q", OWNER, if_empty=True)
    assert h.vhost.delete_queue("q", OWNER, if_unused=True) == 1
    assert queue.deleted and h.deleted == ["q"]
    assert h.vhost.delete_queue("q", OWNER) == 0


def test_deleted_queue_loses_its_bindings(h: Harness) -> None:
    h.queue("q")
    h.vhost.bind_queue("q", "amq.topic", "#", {}, OWNER)
    h.vhost.delete_queue("q", OWNER)
    assert h.vhost.exchanges["amq.topic"].bindings == {}
    assert h.publish("amq.topic", "a") == ()


# -- bindings ---------------------------------------------------------------------------


def test_binding_to_or_from_the_default_exchange_is_403(h: Harness) -> None:
    h.queue("q")
    h.vhost.declare_exchange("x", "direct")
    with pytest.raises(exceptions.AMQPAccessRefused):
        h.vhost.bind_queue("q", "", "q", {}, OWNER)
    with pytest.raises(exceptions.AMQPAccessRefused):
        h.vhost.unbind_queue("q", "", "q", {}, OWNER)
    with pytest.raises(exceptions.AMQPAccessRefused):
        h.vhost.bind_exchange("x", "", "k", {})
    with pytest.raises(exceptions.AMQPAccessRefused):
        h.vhost.bind_exchange("", "x", "k", {})


def test_binding_missing_things_is_404(h: Harness) -> None:
    h.queue("q")
    with pytest.raises(exceptions.AMQPNotFound, match="exchange"):
        h.vhost.bind_queue("q", "nope", "k", {}, OWNER)
    with pytest.raises(exceptions.AMQPNotFound, match="queue"):
        h.vhost.bind_queue("nope", "amq.direct", "k", {}, OWNER)
    with pytest.raises(exceptions.AMQPNotFound):
        h.vhost.bind_exchange("nope", "amq.direct", "k", {})
    with pytest.raises(exceptions.AMQPNotFound):
        h.vhost.bind_exchange("amq.direct", "nope", "k", {})


def test_invalid_headers_binding_is_406(h: Harness) -> None:
    h.queue("q")
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="x-match"):
        h.vhost.bind_queue("q", "amq.headers", "", {"x-match": "most"}, OWNER)


def test_unbinding_what_is_not_bound_is_fine(h: Harness) -> None:
    h.queue("q")
    h.vhost.unbind_queue("q", "amq.direct", "k", {}, OWNER)
    h.vhost.unbind_exchange("amq.fanout", "amq.direct", "k", {})
    # Nothing is bound where the queue or an exchange is missing: also fine, as in RabbitMQ.
    h.vhost.unbind_queue("nope", "amq.direct", "k", {}, OWNER)
    h.vhost.unbind_queue("q", "nope", "k", {}, OWNER)
    h.vhost.unbind_exchange("amq.direct", "nope", "k", {})
    h.vhost.unbind_exchange("nope", "amq.direct", "k", {})
    with pytest.raises(exceptions.AMQPAccessRefused):
        h.vhost.unbind_queue("nope", "", "k", {}, OWNER)


def test_default_exchange_routes_by_queue_name(h: Harness) -> None:
    queue = h.queue("q")
    assert h.publish("", "q") == (queue,)
    assert h.publish("", "other") == ()


# -- exchange-to-exchange routing -----------------------------------------------------------


def test_exchange_chain_reaches_each_queue_once(h: Harness) -> None:
    for name in ("a", "b", "c"):
        h.vhost.declare_exchange(name, "topic")
    q1, q2 = h.queue("q1"), h.queue("q2")
    h.vhost.bind_exchange("b", "a", "x.#", {})
    h.vhost.bind_exchange("c", "a", "#", {})
    h.vhost.bind_exchange("c", "b", "*.y", {})
    h.vhost.bind_queue("q1", "b", "#", {}, OWNER)
    h.vhost.bind_queue("q1", "c", "#", {}, OWNER)
    h.vhost.bind_queue("q2", "c", "x.y", {}, OWNER)
    assert sorted(q.name for q in h.publish("a", "x.y")) == ["q1", "q2"]
    assert q1.message_count == 1 and q2.message_count == 1
    assert [q.name for q in h.publish("a", "z")] == ["q1"]


def test_exchange_cycles_terminate(h: Harness) -> None:
    for name in ("a", "b", "c"):
        h.vhost.declare_exchange(name, "fanout")
    h.vhost.bind_exchange("b", "a", "", {})
    h.vhost.bind_exchange("c", "b", "", {})
    h.vhost.bind_exchange("a", "c", "", {})
    h.vhost.bind_exchange("a", "a", "", {})
    queue = h.queue("q")
    h.vhost.bind_queue("q", "b", "", {}, OWNER)
    for start in ("a", "b", "c"):
        assert h.publish(start, "k") == (queue,)
    assert queue.message_count == 3


def test_unbinding_the_last_exchange_destination_restores_direct_routing(h: Harness) -> None:
    h.vhost.declare_exchange("a", "fanout")
    h.vhost.declare_exchange("b", "fanout")
    h.vhost.bind_exchange("b", "a", "", {})
    h.vhost.unbind_exchange("b", "a", "", {})
    queue = h.queue("q")
    h.vhost.bind_queue("q", "a", "", {}, OWNER)
    assert h.publish("a", "k") == (queue,)
    assert not any(
        isinstance(b.destination, Exchange) for b in h.vhost.exchanges["a"].bindings.values()
    )


# -- dead-lettering ---------------------------------------------------------------------


def dead_letter_setup(h: Harness, **arguments: Any) -> tuple[Queue, Queue]:
    h.vhost.declare_exchange("dlx", "direct")
    source = h.queue("work", **{"x-dead-letter-exchange": "dlx", **arguments})
    parking = h.queue("parked")
    h.vhost.bind_queue(
        "parked", "dlx", arguments.get("x-dead-letter-routing-key", "job"), {}, OWNER
    )
    return source, parking


class Taker(Consumer):
    """A consumer that is always ready and keeps what it gets."""

    def __init__(self) -> None:
        super().__init__("taker")
        self.got: list[Message] = []

    def ready(self) -> bool:
        return True

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        self.got.append(message)


def take(queue: Queue) -> Message:
    """The head message, delivered and outstanding (as to a consumer that acks)."""
    got = queue.get(0.0, no_ack=False)
    assert got is not None
    return got[0]


def test_rejected_message_gets_x_death(h: Harness) -> None:
    source, parking = dead_letter_setup(h)
    h.vhost.bind_queue("work", "amq.direct", "job", {}, OWNER)
    h.publish(
        "amq.direct",
        "job",
        b"payload",
        headers={"keep": "me"},
        expiration="60000",
        content_type="text/plain",
    )
    source.reject([take(source).msg_id])
    dead = take(parking)
    assert dead.body == b"payload"
    assert dead.exchange == "dlx" and dead.routing_key == "job"
    properties = dead.properties()
    assert properties.content_type == "text/plain"
    assert properties.expiration is None, "the original expiration is dropped"
    headers = dead.headers()
    assert headers["keep"] == "me"
    assert headers["x-death"] == [
        {
            "count": 1,
            "reason": "rejected",
            "queue": "work",
            "time": datetime.datetime.fromtimestamp(int(WALL_CLOCK), datetime.UTC),
            "exchange": "amq.direct",
            "routing-keys": ["job"],
            "original-expiration": "60000",
        }
    ]
    # The time is an AMQP timestamp ('T'), as RabbitMQ writes it, not an integer.
    assert b"\x04timeT" + struct.pack(">Q", int(WALL_CLOCK)) in dead.header
    assert headers["x-first-death-reason"] == "rejected"
    assert headers["x-first-death-queue"] == "work"
    assert headers["x-first-death-exchange"] == "amq.direct"


def test_dead_letter_routing_key_override(h: Harness) -> None:
    source, parking = dead_letter_setup(h, **{"x-dead-letter-routing-key": "parked-key"})
    h.publish("", "work", b"x")
    source.reject([take(source).msg_id])
    dead = take(parking)
    assert dead.routing_key == "parked-key"
    assert dead.headers()["x-death"][0]["routing-keys"] == ["work"]


def test_expired_and_maxlen_reasons(h: Harness) -> None:
    source, parking = dead_letter_setup(h, **{"x-message-ttl": 1000, "x-max-length": 1})
    h.vhost.bind_queue("work", "amq.direct", "job", {}, OWNER)
    h.publish("amq.direct", "job", b"first")
    h.publish("amq.direct", "job", b"second")
    source.expire(5.0)
    reasons = [take(parking).headers()["x-death"][0]["reason"] for _ in range(2)]
    assert reasons == ["maxlen", "expired"]


def test_dead_letter_cycle_counts_up_and_keeps_one_entry(h: Harness) -> None:
    h.vhost.declare_exchange("retry", "fanout")
    queue = h.queue("loop", **{"x-dead-letter-exchange": "retry"})
    h.vhost.bind_queue("loop", "retry", "", {}, OWNER)
    h.publish("", "loop", b"again")
    for _ in range(3):
        queue.reject([take(queue).msg_id])
    headers = take(queue).headers()
    deaths = headers["x-death"]
    assert len(deaths) == 1
    assert deaths[0]["count"] == 3
    assert deaths[0]["reason"] == "rejected"
    assert deaths[0]["exchange"] == "", "the first death's exchange stays"
    assert headers["x-first-death-exchange"] == ""


def test_new_reason_or_queue_is_a_new_entry_at_the_front(h: Harness) -> None:
    h.vhost.declare_exchange("retry", "fanout")
    first = h.queue("first", **{"x-dead-letter-exchange": "retry"})
    second = h.queue("second", **{"x-dead-letter-exchange": "retry"})
    h.vhost.bind_queue("second", "retry", "", {}, OWNER)
    h.publish("", "first", b"m")
    first.reject([take(first).msg_id])
    second.reject([take(second).msg_id])
    deaths = take(second).headers()["x-death"]
    assert [(d["queue"], d["count"]) for d in deaths] == [("second", 1), ("first", 1)]
    # Dying again in "first" for the same reason moves its entry to the front.
    h.vhost.unbind_queue("second", "retry", "", {}, OWNER)
    h.vhost.bind_queue("first", "retry", "", {}, OWNER)
    message = make_message("", "first", b"m", headers={"x-death": deaths})
    first.enqueue(message, 0.0)
    first.reject([take(first).msg_id])
    again = take(first).headers()["x-death"]
    assert [(d["queue"], d["count"]) for d in again] == [("first", 2), ("second", 1)]


def test_missing_dead_letter_exchange_drops_silently(h: Harness) -> None:
    queue = h.queue("q", **{"x-dead-letter-exchange": "not-there"})
    h.publish("", "q")
    queue.reject([take(queue).msg_id])
    assert all(q.message_count == 0 for q in h.vhost.queues.values())


def test_remove_queue_only_removes_that_queue(h: Harness) -> None:
    old = h.queue("q")
    h.vhost.delete_queue("q", OWNER)
    new = h.queue("q")
    assert h.vhost.remove_queue(old) == 0
    assert h.vhost.queues["q"] is new


def test_automatic_dead_letter_cycle_is_dropped(h: Harness) -> None:
    """Dead-lettering to the default exchange with no routing key loops back to the queue."""
    loop = h.queue("loop", **{"x-message-ttl": 1000, "x-dead-letter-exchange": ""})
    h.publish("", "loop")
    assert loop.expire(5.0) == 1
    assert loop.message_count == 0


def test_max_length_zero_self_loop_terminates(h: Harness) -> None:
    loop = h.queue("loop", **{"x-max-length": 0, "x-dead-letter-exchange": ""})
    h.publish("", "loop")
    assert loop.message_count == 0


def test_two_queue_cycle_is_dropped_on_the_second_visit(h: Harness) -> None:
    h.vhost.declare_exchange("to-a", "fanout")
    h.vhost.declare_exchange("to-b", "fanout")
    a = h.queue("a", **{"x-message-ttl": 1000, "x-dead-letter-exchange": "to-b"})
    b = h.queue("b", **{"x-message-ttl": 1000, "x-dead-letter-exchange": "to-a"})
    h.vhost.bind_queue("a", "to-a", "", {}, OWNER)
    h.vhost.bind_queue("b", "to-b", "", {}, OWNER)
    h.publish("", "a")
    a.expire(5.0)
    assert (a.message_count, b.message_count) == (0, 1)
    # A dead letter is enqueued at the wall-clock time it died.
    b.expire(WALL_CLOCK + 5.0)
    assert (a.message_count, b.message_count) == (0, 0)


def test_a_rejection_in_the_cycle_keeps_it_going(h: Harness) -> None:
    h.vhost.declare_exchange("to-a", "fanout")
    h.vhost.declare_exchange("to-b", "fanout")
    a = h.queue("a", **{"x-dead-letter-exchange": "to-b"})
    b = h.queue("b", **{"x-message-ttl": 1000, "x-dead-letter-exchange": "to-a"})
    h.vhost.bind_queue("a", "to-a", "", {}, OWNER)
    h.vhost.bind_queue("b", "to-b", "", {}, OWNER)
    h.publish("", "a")
    a.reject([take(a).msg_id])
    b.expire(WALL_CLOCK + 5.0)
    deaths = take(a).headers()["x-death"]
    assert [(d["queue"], d["reason"]) for d in deaths] == [("b", "expired"), ("a", "rejected")]


def test_ttl_zero_self_loop_with_a_consumer_terminates(h: Harness) -> None:
    """Enqueue drains at once; were the expired message routed back into the same drain
    forever, this would be a RecursionError."""
    loop = h.queue("loop", **{"x-message-ttl": 0, "x-dead-letter-exchange": ""})
    taker = Taker()
    loop.add_consumer(taker, 0.0)
    h.publish("", "loop", b"now")
    assert [m.body for m in taker.got] == [b"now"]
    taker.ready = lambda: False  # type: ignore[method-assign]
    h.publish("", "loop", b"later")
    h.now = 1.0
    loop.drain(h.now)
    assert loop.message_count == 0 and len(taker.got) == 1


@pytest.mark.parametrize("count", ["many", None, 2.5, True])
def test_x_death_count_from_a_publisher_that_is_not_an_integer(h: Harness, count: Any) -> None:
    source, parking = dead_letter_setup(h)
    h.vhost.bind_queue("work", "amq.direct", "job", {}, OWNER)
    forged = [{"queue": "work", "reason": "rejected", "count": count}]
    h.publish("amq.direct", "job", b"m", headers={"x-death": forged})
    source.reject([take(source).msg_id])
    assert take(parking).headers()["x-death"][0]["count"] == 1


def with_raw_headers(exchange: str, routing_key: str, table: bytes) -> Message:
    header = struct.pack(">HHQH", 60, 0, 1, 0x2000) + struct.pack(">I", len(table)) + table
    return Message(address_of(exchange, routing_key), header, b"m")


def test_binary_longstr_header_survives_dead_lettering(h: Harness) -> None:
    """A longstr that is not UTF-8 (any binary value from a Java client) decodes to bytes,
    which pamqp cannot encode back; dead-lettering used to raise TypeError."""
    source, parking = dead_letter_setup(h)
    h.vhost.bind_queue("work", "amq.direct", "job", {}, OWNER)
    source.enqueue(
        with_raw_headers("amq.direct", "job", b"\x03binS" + struct.pack(">I", 2) + b"\xff\xfe"), 0.0
    )
    source.reject([take(source).msg_id])
    headers = take(parking).headers()
    assert headers["bin"] == b"\xff\xfe"
    assert headers["x-death"][0]["reason"] == "rejected"


def test_doubles_stay_doubles_through_dead_lettering(h: Harness) -> None:
    """pamqp writes floats as single precision: a double header came back rounded, and one
    beyond single precision made the dead letter impossible to encode, so it was dropped."""
    source, parking = dead_letter_setup(h)
    h.vhost.bind_queue("work", "amq.direct", "job", {}, OWNER)
    doubles = b"\x03dbld" + struct.pack(">d", 1e300) + b"\x03tend" + struct.pack(">d", 0.1)
    source.enqueue(with_raw_headers("amq.direct", "job", doubles), 0.0)
    source.reject([take(source).msg_id])
    dead = take(parking)
    headers = dead.headers()
    assert headers["dbl"] == 1e300 and headers["ten"] == 0.1
    assert b"\x03tend" + struct.pack(">d", 0.1) in dead.header


def test_message_without_expiration_has_no_original_expiration(h: Harness) -> None:
    source, parking = dead_letter_setup(h)
    h.vhost.bind_queue("work", "amq.direct", "job", {}, OWNER)
    h.publish("amq.direct", "job", b"m")
    source.reject([take(source).msg_id])
    assert "original-expiration" not in take(parking).headers()["x-death"][0]


# -- the control plane: outside the routing graph ---------------------------------------


@pytest.mark.parametrize("control", ["amq.peer", "amq.console"])
def test_no_binding_reaches_into_or_out_of_a_control_exchange(h: Harness, control: str) -> None:
    h.queue("reader")
    h.vhost.declare_exchange("mine", "fanout")
    refusals = [
        lambda: h.vhost.bind_queue("reader", control, "", {}, OWNER),
        lambda: h.vhost.bind_exchange(control, "mine", "", {}),
        lambda: h.vhost.bind_exchange("mine", control, "", {}),
        lambda: h.vhost.bind_exchange(control, "amq.match", "", {"x-match": "any"}),
    ]
    for attempt in refusals:
        with pytest.raises(exceptions.AMQPAccessRefused, match="control plane"):
            attempt()
    assert not h.vhost.exchanges[control].bindings


@pytest.mark.parametrize("control", ["amq.peer", "amq.console"])
def test_a_control_exchange_is_no_dead_letter_or_alternate_target(h: Harness, control: str) -> None:
    with pytest.raises(exceptions.AMQPAccessRefused, match="dead-letter exchange"):
        h.queue("dying", **{"x-dead-letter-exchange": control})
    assert "dying" not in h.vhost.queues
    with pytest.raises(exceptions.AMQPAccessRefused, match="alternate-exchange"):
        h.vhost.declare_exchange("ae", "direct", arguments={"alternate-exchange": control})
    assert "ae" not in h.vhost.exchanges


def test_publishes_reach_the_receiver_only_and_no_queue(h: Harness) -> None:
    got: list[tuple[Message, object]] = []
    h.vhost.set_control_receiver("amq.peer", lambda message, who: got.append((message, who)))
    exchange = h.vhost.get_exchange("amq.peer")
    assert exchange.control and exchange.publish_tag == "peering"
    assert h.vhost.route(exchange, "", make_message("amq.peer", "")) == ()
    # The names of the old internal queues address nothing through the default exchange.
    for name in ("amq.internal.amq.peer", "amq.internal.amq.console", "amq.peer"):
        assert h.vhost.route(h.vhost.get_exchange(""), name, make_message("", name)) == ()
    exchange.receiver(make_message("amq.peer", ""), "conn")  # type: ignore[attr-defined]
    assert [who for _, who in got] == ["conn"]
    with pytest.raises(exceptions.AMQPAccessRefused):
        h.vhost.delete_exchange("amq.peer")


# -- alternate exchanges ----------------------------------------------------------------


def alternate(name: str) -> dict[str, Any]:
    return {"alternate-exchange": name}


def test_unroutable_message_goes_to_the_alternate_exchange(h: Harness) -> None:
    h.vhost.declare_exchange("unrouted", "fanout")
    h.vhost.declare_exchange("orders", "direct", arguments=alternate("unrouted"))
    routed, leftovers = h.queue("routed"), h.queue("leftovers")
    h.vhost.bind_queue("routed", "orders", "known", {}, OWNER)
    h.vhost.bind_queue("leftovers", "unrouted", "", {}, OWNER)
    assert h.publish("orders", "known") == (routed,)
    assert h.publish("orders", "unknown") == (leftovers,)
    assert take(leftovers).routing_key == "unknown", "the routing key is kept"


def test_alternates_chain_and_a_cycle_of_them_ends(h: Harness) -> None:
    h.vhost.declare_exchange("c", "direct")
    h.vhost.declare_exchange("b", "direct", arguments=alternate("c"))
    h.vhost.declare_exchange("a", "direct", arguments=alternate("b"))
    last = h.queue("last")
    assert h.publish("a", "k") == ()
    h.vhost.bind_queue("last", "c", "k", {}, OWNER)
    assert h.publish("a", "k") == (last,)
    h.vhost.declare_exchange("x", "direct", arguments=alternate("y"))
    h.vhost.declare_exchange("y", "direct", arguments=alternate("x"))
    assert h.publish("x", "k") == ()


def test_an_exchange_that_routes_to_an_exchange_does_not_use_its_alternate(h: Harness) -> None:
    """As in RabbitMQ: the alternate is taken by the exchange that had no destination."""
    h.vhost.declare_exchange("spare", "fanout")
    h.vhost.declare_exchange("inner", "direct", arguments=alternate("spare"))
    h.vhost.declare_exchange("outer", "fanout", arguments=alternate("spare"))
    h.vhost.bind_exchange("inner", "outer", "", {})
    spare = h.queue("spare-q")
    h.vhost.bind_queue("spare-q", "spare", "", {}, OWNER)
    assert h.publish("outer", "k") == (spare,), "reached through inner's alternate"
    assert spare.message_count == 1


def test_missing_alternate_drops_and_redeclare_must_name_the_same(h: Harness) -> None:
    h.vhost.declare_exchange("e", "direct", arguments=alternate("not-there"))
    assert h.publish("e", "k") == ()
    h.vhost.declare_exchange("e", "direct", arguments=alternate("not-there"))
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="alternate-exchange"):
        h.vhost.declare_exchange("e", "direct", arguments=alternate("other"))
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="alternate-exchange"):
        h.vhost.declare_exchange("e", "direct")


@pytest.mark.parametrize("kind", ["stream", "lazy"])
def test_queue_types_other_than_classic_and_quorum_are_a_406(h: Harness, kind: str) -> None:
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="x-queue-type"):
        h.queue("typed", **{"x-queue-type": kind})
    assert "typed" not in h.vhost.queues
    h.queue("typed", **{"x-queue-type": "classic"})
    h.queue("typed")


def test_durable_queues_are_replicated_unless_asked_otherwise(h: Harness) -> None:
    vhost = h.vhost
    plain = vhost.declare_queue("plain", OWNER, h.now, durable=True)
    off = vhost.declare_queue(
        "off", OWNER, h.now, durable=True, arguments={"x-amqha-replicate": False}
    )
    quorum = vhost.declare_queue(
        "quorum", OWNER, h.now, durable=True, arguments={"x-queue-type": "quorum"}
    )
    transient = vhost.declare_queue("transient", OWNER, h.now)
    assert (plain.replicated, off.replicated, quorum.replicated) == (True, False, True)
    assert not transient.replicated and vhost.unreplicated == {"off"}
    vhost.delete_queue("off", OWNER)
    assert vhost.unreplicated == set()


@pytest.mark.parametrize(
    ("durable", "exclusive", "arguments", "match"),
    [
        (False, False, {"x-queue-type": "quorum"}, "quorum"),
        (True, True, {"x-queue-type": "quorum"}, "quorum"),
        (False, False, {"x-amqha-replicate": True}, "durable"),
        (True, False, {"x-amqha-replicate": "yes"}, "true or false"),
        (True, False, {"x-queue-type": "quorum", "x-amqha-replicate": False}, "contradicts"),
    ],
)
def test_replication_needs_a_durable_shared_queue(
    h: Harness, durable: bool, exclusive: bool, arguments: dict, match: str
) -> None:
    with pytest.raises(exceptions.AMQPPreconditionFailed, match=match):
        h.vhost.declare_queue(
            "r", OWNER, h.now, durable=durable, exclusive=exclusive, arguments=arguments
        )
    assert "r" not in h.vhost.queues


def test_arguments_count_while_their_queue_exchange_or_binding_lives(h: Harness) -> None:
    gc.collect()
    before = ArgumentBytes.held
    big = {"x-note": "n" * 5000}
    h.vhost.declare_queue("q", OWNER, 0.0, arguments=dict(big))
    h.vhost.declare_exchange("e", "direct", arguments=dict(big))
    h.vhost.bind_queue("q", "e", "k", dict(big), OWNER)
    assert ArgumentBytes.held - before >= 3 * 5000
    h.vhost.delete_exchange("e")
    h.vhost.delete_queue("q", OWNER)
    gc.collect()
    assert ArgumentBytes.held == before


def test_arguments_past_the_limit_are_refused_with_406(h: Harness) -> None:
    h.vhost.max_arguments_size = 1000
    h.vhost.declare_queue("q", OWNER, 0.0, arguments={"x-note": "n" * 500})
    for attempt in (
        lambda: h.vhost.declare_queue("q2", OWNER, 0.0, arguments={"x-note": "n" * 2000}),
        lambda: h.vhost.declare_exchange("e", "direct", arguments={"a": "n" * 2000}),
        lambda: h.vhost.bind_queue("q", "amq.direct", "k", {"a": "n" * 2000}, OWNER),
        lambda: h.vhost.bind_exchange("amq.fanout", "amq.direct", "k", {"a": "n" * 2000}),
    ):
        with pytest.raises(exceptions.AMQPPreconditionFailed, match="max_arguments_size"):
            attempt()
    assert set(h.vhost.queues) == {"q"} and "e" not in h.vhost.exchanges
    assert not h.vhost.exchanges["amq.direct"].bindings
