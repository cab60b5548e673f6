"""Quorum queues in the core: the declare rules RabbitMQ 3.10 has for them, the delivery
count (``x-delivery-count``), ``x-delivery-limit``, and the count as replicated state:
what the core emits, replayed on an empty state (a restart, a PASSIVE), gives the same
queue and the same next count (docs/compat.md, "Quorum queues")."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pamqp import exceptions

from amqha.core import codec
from amqha.core.apply import snapshot, state_changes
from amqha.core.changes import Delivered, Redelivered, Settled
from amqha.core.queue import Queue
from amqha.core.quorum import DeliveryCounter
from tests.unit.test_changes import OWNER, Logged, Taker, replay

QUORUM = {"x-queue-type": "quorum"}


def declare(h: Logged, name: str = "q", **arguments: Any) -> Queue:
    queue = h.vhost.declare_queue(
        name, OWNER, h.now, durable=True, arguments={**QUORUM, **arguments}
    )
    assert isinstance(queue.counter, DeliveryCounter)
    return queue


def deliveries(queue: Queue) -> dict[int, int]:
    """The delivery counts a quorum queue keeps (of 2 and more)."""
    assert isinstance(queue.counter, DeliveryCounter)
    return queue.counter.deliveries


def delivery_count(queue: Queue, msg_id: int) -> int:
    assert isinstance(queue.counter, DeliveryCounter)
    return queue.counter.count(queue, msg_id)


def count_header(got: tuple[Any, bool]) -> Any:
    return got[0].headers().get("x-delivery-count")


def test_a_consumer_sees_no_count_first_then_one_more_per_return() -> None:
    h = Logged()
    queue = declare(h)
    h.publish("", "q", b"m")
    taker = Taker()
    queue.add_consumer(taker, h.now)
    queue.drain(h.now)
    for expected in (1, 2, 3):
        queue.requeue([taker.got[-1][0].msg_id])
        queue.drain(h.now)
        assert count_header(taker.got[-1]) == expected
        assert taker.got[-1][1] is True
    assert count_header(taker.got[0]) is None and taker.got[0][1] is False
    # The queue keeps the message as published: only the delivered copy has the header.
    held = next(iter(queue.outstanding.values()))
    assert "x-delivery-count" not in held.headers()


def test_basic_get_shows_zero_on_the_first_delivery() -> None:
    h = Logged()
    queue = declare(h)
    h.publish("", "q", b"m")
    first = queue.get(h.now, no_ack=False)
    assert first is not None and count_header(first) == 0 and first[1] is False
    queue.requeue([first[0].msg_id])
    second = queue.get(h.now, no_ack=False)
    assert second is not None and count_header(second) == 1 and second[1] is True


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_the_delivery_limit_dead_letters_after_limit_plus_one_deliveries(limit: int) -> None:
    h = Logged()
    h.vhost.declare_exchange("dlx", "fanout", durable=True)
    dead = h.vhost.declare_queue("dead", OWNER, h.now, durable=True)
    h.vhost.bind_queue("dead", "dlx", "", {}, OWNER)
    queue = declare(h, **{"x-delivery-limit": limit, "x-dead-letter-exchange": "dlx"})
    h.publish("", "q", b"m")
    taker = Taker()
    queue.add_consumer(taker, h.now)
    queue.drain(h.now)
    while queue.outstanding:
        queue.requeue(list(queue.outstanding))
        queue.drain(h.now)
    assert len(taker.got) == limit + 1
    assert queue.message_count == 0 and not deliveries(queue)
    got = dead.get(h.now)
    assert got is not None
    death = got[0].headers()["x-death"][0]
    assert (death["reason"], death["queue"]) == ("delivery_limit", "q")
    assert got[0].headers()["x-first-death-reason"] == "delivery_limit"
    assert "x-delivery-count" not in got[0].headers()
    settled = [c for c in h.changes() if isinstance(c, Settled) and c.queue == "q"]
    assert settled[-1].reason == "delivery_limit"


def test_without_a_dead_letter_exchange_the_message_is_dropped() -> None:
    h = Logged()
    queue = declare(h, **{"x-delivery-limit": 0})
    h.publish("", "q", b"m")
    got = queue.get(h.now, no_ack=False)
    assert got is not None
    queue.requeue([got[0].msg_id])
    assert queue.message_count == 0 and not queue.outstanding


def test_only_redeliveries_emit_a_change_and_acks_forget_the_count() -> None:
    h = Logged()
    queue = declare(h)
    h.publish("", "q", b"m")
    h.changes()
    got = queue.get(h.now, no_ack=False)
    assert got is not None
    msg_id = got[0].msg_id
    assert [type(c) for c in h.changes()] == [Delivered]
    queue.requeue([msg_id])
    assert h.changes() == [], "a return alone emits nothing"
    queue.get(h.now, no_ack=False)
    assert h.changes() == [Delivered("/", "q", msg_id), Redelivered("/", "q", msg_id, 2)]
    queue.ack_one(msg_id)
    assert deliveries(queue) == {}


def test_a_no_ack_redelivery_settles_the_message_and_its_count() -> None:
    h = Logged()
    queue = declare(h)
    h.publish("", "q", b"m")
    got = queue.get(h.now, no_ack=False)
    assert got is not None
    queue.requeue([got[0].msg_id])
    again = queue.get(h.now, no_ack=True)
    assert again is not None and count_header(again) == 1
    assert deliveries(queue) == {} and queue.message_count == 0
    replica = replay(h.changes())
    assert snapshot(replica) == snapshot({"/": h.vhost})
    assert deliveries(replica["/"].queues["q"]) == {}


def test_replay_gives_the_same_counts_and_the_next_delivery_its_header() -> None:
    """What a restart or a PASSIVE rebuilds: the counts, then the header a consumer of the
    rebuilt queue sees (its held delivery went with the old server: one more)."""
    h = Logged()
    queue = declare(h, **{"x-delivery-limit": 5})
    for body in (b"a", b"b", b"c"):
        h.publish("", "q", body)
    taker = Taker()
    queue.add_consumer(taker, h.now)
    queue.drain(h.now)
    # a: returned twice, then held; b: held once; c: returned once, then acked.
    ids = {m.body: m.msg_id for m, _ in taker.got}
    queue.requeue([ids[b"a"], ids[b"c"]])
    queue.drain(h.now)
    queue.requeue([ids[b"a"]])
    queue.drain(h.now)
    queue.ack_one(ids[b"c"])
    changes = h.changes()
    replica = replay(changes)
    assert snapshot(replica) == snapshot({"/": h.vhost})
    rebuilt = replica["/"].queues["q"]
    assert isinstance(rebuilt.counter, DeliveryCounter)
    assert deliveries(rebuilt) == {ids[b"a"]: 3}
    # The snapshot a joining PASSIVE gets says the same, and crosses the wire.
    _, decoded = codec.decode(codec.encode(1, list(state_changes({"/": h.vhost}))))
    assert snapshot(replay(decoded)) == snapshot({"/": h.vhost})
    # After a failover the held deliveries come back: a was delivered 3 times, b once.
    again = Taker()
    rebuilt.add_consumer(again, h.now)
    rebuilt.drain(h.now)
    headers = {m.body: (m.headers().get("x-delivery-count"), r) for m, r in again.got}
    assert headers == {b"a": (3, True), b"b": (1, True)}


def test_a_replayed_count_over_the_limit_is_dead_lettered_at_the_next_delivery() -> None:
    h = Logged()
    queue = declare(h, **{"x-delivery-limit": 1})
    h.publish("", "q", b"a")
    h.publish("", "q", b"b")
    taker = Taker(credit=1)
    queue.add_consumer(taker, h.now)
    queue.drain(h.now)
    assert [m.body for m, _ in taker.got] == [b"a"]
    queue.requeue([taker.got[0][0].msg_id])
    taker.credit = 1
    queue.wake(taker)
    queue.drain(h.now)  # a's second delivery, held when the server goes
    assert [m.body for m, _ in taker.got] == [b"a", b"a"]
    rebuilt = replay(h.changes())["/"].queues["q"]
    again = Taker()
    rebuilt.add_consumer(again, h.now)
    rebuilt.drain(h.now)
    assert [m.body for m, _ in again.got] == [b"b"], "a was returned twice: over a limit of 1"


def test_expiry_and_purge_forget_the_counts_of_what_leaves() -> None:
    h = Logged()
    queue = declare(h, **{"x-message-ttl": 1000})
    h.publish("", "q", b"m")
    got = queue.get(h.now, no_ack=False)
    assert got is not None
    queue.requeue([got[0].msg_id])
    got = queue.get(h.now, no_ack=False)
    assert got is not None and deliveries(queue)
    queue.requeue([got[0].msg_id])
    h.now += 2
    queue.expire(h.now)
    assert queue.message_count == 0 and deliveries(queue) == {}
    assert snapshot(replay(h.changes())) == snapshot({"/": h.vhost})


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"x-max-priority": 10}, "invalid arg 'x-max-priority'"),
        ({"x-queue-mode": "lazy"}, "invalid arg 'x-queue-mode'"),
        ({"x-queue-version": 2}, "invalid arg 'x-queue-version'"),
        ({"x-queue-master-locator": "min-masters"}, "invalid arg 'x-queue-master-locator'"),
        ({"x-max-age": "1D"}, "invalid arg 'x-max-age'"),
        ({"x-delivery-limit": -1}, "invalid arg 'x-delivery-limit'"),
        ({"x-delivery-limit": "3"}, "invalid arg 'x-delivery-limit'"),
        ({"x-dead-letter-strategy": "twice"}, "invalid arg 'x-dead-letter-strategy'"),
        ({"x-quorum-initial-group-size": 0}, "invalid arg 'x-quorum-initial-group-size'"),
        ({"x-max-in-memory-length": -1}, "invalid arg 'x-max-in-memory-length'"),
    ],
)
def test_arguments_a_quorum_queue_does_not_take_are_a_406(
    arguments: dict[str, Any], problem: str
) -> None:
    h = Logged()
    with pytest.raises(exceptions.AMQPPreconditionFailed, match=problem):
        declare(h, **arguments)


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        ({"durable": True, "auto_delete": True}, "'auto-delete'"),
        ({"durable": True, "exclusive": True}, "'exclusive-owner'"),
        ({"durable": False}, "'non-durable'"),
    ],
)
def test_quorum_queue_properties_rabbitmq_refuses_are_a_406(
    flags: dict[str, bool], problem: str
) -> None:
    h = Logged()
    with pytest.raises(exceptions.AMQPPreconditionFailed, match=f"invalid property {problem}"):
        h.vhost.declare_queue("q", OWNER, h.now, arguments=dict(QUORUM), **flags)


@pytest.mark.parametrize(
    "argument", ["x-delivery-limit", "x-quorum-initial-group-size", "x-max-in-memory-length"]
)
def test_quorum_only_arguments_on_a_classic_queue_are_a_406(argument: str) -> None:
    h = Logged()
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="rabbit_classic_queue"):
        h.vhost.declare_queue("q", OWNER, h.now, durable=True, arguments={argument: 3})


def test_quorum_arguments_without_an_effect_here_are_taken() -> None:
    h = Logged()
    declare(
        h,
        **{
            "x-dead-letter-strategy": "at-least-once",
            "x-quorum-initial-group-size": 3,
            "x-max-in-memory-length": 10,
            "x-max-in-memory-bytes": 0,
            "x-queue-leader-locator": "balanced",
        },
    )


def test_reject_publish_dlx_on_a_quorum_queue_drops_the_head_as_in_rabbitmq() -> None:
    h = Logged()
    queue = declare(h, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    assert h.publish("", "q", b"old") and h.publish("", "q", b"new")
    assert [m.body for m, _ in queue.messages()] == [b"new"]


@pytest.mark.parametrize(
    "redeclared", [{}, {"x-queue-type": "classic"}, {"x-queue-type": "stream"}]
)
def test_a_quorum_queue_redeclared_as_another_type_is_inequivalent(
    redeclared: dict[str, Any],
) -> None:
    h = Logged()
    declare(h)
    with pytest.raises(exceptions.AMQPPreconditionFailed):
        h.vhost.declare_queue("q", OWNER, h.now, durable=True, arguments=redeclared)
    if not redeclared:
        with pytest.raises(
            exceptions.AMQPPreconditionFailed, match="inequivalent arg 'x-queue-type'"
        ):
            h.vhost.declare_queue("q", OWNER, h.now, durable=True, arguments=redeclared)
    assert declare(h) is h.vhost.queues["q"]


def test_a_classic_queue_is_equivalent_with_or_without_its_type_named() -> None:
    h = Logged()
    first = h.vhost.declare_queue("c", OWNER, h.now, durable=True)
    named = h.vhost.declare_queue(
        "c", OWNER, h.now, durable=True, arguments={"x-queue-type": "classic"}
    )
    assert named is first
    with pytest.raises(exceptions.AMQPPreconditionFailed, match="inequivalent arg 'x-queue-type'"):
        h.vhost.declare_queue("c", OWNER, h.now, durable=True, arguments=dict(QUORUM))


def test_redelivered_crosses_the_wire() -> None:
    change = Redelivered("/", "q", 2**40, 7)
    assert codec.decode(codec.encode(5, [change])) == (5, [change])


@pytest.mark.parametrize("seed", range(20))
def test_any_workload_replays_to_the_same_counts(seed: int) -> None:
    """Random publishes, gets, returns, acks, no-ack gets, expiries and purges on a quorum
    queue with a limit and a dead-letter queue: the replayed state, and the snapshot a
    PASSIVE would get, equal the original, counts included."""
    rng = random.Random(seed)
    h = Logged()
    h.vhost.declare_exchange("dlx", "fanout", durable=True)
    h.vhost.declare_queue("dead", OWNER, h.now, durable=True)
    h.vhost.bind_queue("dead", "dlx", "", {}, OWNER)
    queue = declare(
        h, **{"x-delivery-limit": 2, "x-dead-letter-exchange": "dlx", "x-message-ttl": 50_000}
    )
    held: list[int] = []
    for _ in range(300):
        step = rng.random()
        if step < 0.3:
            h.publish("", "q", b"m")
        elif step < 0.55:
            got = queue.get(h.now, no_ack=False)
            if got is not None:
                held.append(got[0].msg_id)
        elif step < 0.75 and held:
            queue.requeue([held.pop(rng.randrange(len(held)))])
        elif step < 0.85 and held:
            queue.ack_one(held.pop(rng.randrange(len(held))))
        elif step < 0.9:
            queue.get(h.now, no_ack=True)
        elif step < 0.97:
            h.now += 10
            queue.expire(h.now)
        else:
            queue.purge()
    ids = [m.msg_id for m, _ in queue.messages()]
    assert set(deliveries(queue)) <= set(ids)
    _, decoded = codec.decode(codec.encode(1, list(state_changes({"/": h.vhost}))))
    for changes in (h.changes(), decoded):
        replica = replay(changes)
        # The delivered mark may differ: a no-ack delivery moves it on the ACTIVE alone
        # (as for any queue); the messages, the counts and what they give must not.
        assert without_marks(snapshot(replica)) == without_marks(snapshot({"/": h.vhost}))
        rebuilt = replica["/"].queues["q"]
        assert isinstance(rebuilt.counter, DeliveryCounter)
        assert [delivery_count(rebuilt, i) for i in ids] == [delivery_count(queue, i) for i in ids]


def without_marks(state: dict[str, Any]) -> dict[str, Any]:
    for vhost in state.values():
        for queue in vhost["queues"].values():
            queue.pop("delivered_mark")
    return state
