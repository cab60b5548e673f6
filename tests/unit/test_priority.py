"""RabbitMQ's queue extensions in the core: priority queues (``x-max-priority``), consumer
priorities (``x-priority``) and single active consumer (``x-single-active-consumer``).

The expected orders are RabbitMQ 3.10's, observed side by side (docs/compat.md). Time is
a number passed in; nothing here sleeps.
"""

from __future__ import annotations

import gc
import itertools
import math
from collections import OrderedDict
from typing import Any

import pytest
from pamqp import commands
from pamqp.header import ContentHeader

from amqha.core.arguments import QueueArgumentError, consumer_priority
from amqha.core.changes import ChangeLog, Delivered, Enqueued, Settled
from amqha.core.kinds import new_queue
from amqha.core.message import Message
from amqha.core.priority import Lane, PriorityQueue
from amqha.core.queue import Consumer, Queue, RankedConsumers
from amqha.wire import address_of

_ids = itertools.count(1)


def message(body: str, priority: int | None = None, **properties: Any) -> Message:
    """A message with the next id (as the vhost gives one) and the given priority."""
    data = body.encode()
    if priority is not None:
        properties["priority"] = priority
    header = ContentHeader(0, len(data), commands.Basic.Properties(**properties)).marshal()
    return Message(address_of("", "q"), header, data, msg_id=next(_ids))


def priority_queue(maximum: int = 5, **arguments: Any) -> PriorityQueue:
    queue = new_queue("q", arguments={"x-max-priority": maximum, **arguments})
    assert isinstance(queue, PriorityQueue)
    return queue


def fill(queue: Queue, *items: tuple[str, int | None], now: float = 0.0) -> list[Message]:
    made = [message(body, priority) for body, priority in items]
    for each in made:
        queue.enqueue(each, now)
    return made


def take_all(queue: Queue, now: float = 0.0) -> list[tuple[str, bool]]:
    out = []
    while (got := queue.get(now)) is not None:
        out.append((got[0].body.decode(), got[1]))
    return out


def bodies(queue: Queue, now: float = 0.0) -> list[str]:
    return [body for body, _ in take_all(queue, now)]


class FakeConsumer(Consumer):
    def __init__(self, tag: str, credit: int = 10**6, no_ack: bool = True) -> None:
        super().__init__(tag, no_ack=no_ack)
        self.credit = credit
        self.got: list[str] = []

    def ready(self) -> bool:
        return self.credit > 0

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        self.credit -= 1
        self.got.append(message.body.decode())


class DeadLetters:
    def __init__(self) -> None:
        self.got: list[tuple[str, str]] = []

    def __call__(self, queue: Queue, message: Message, reason: str) -> None:
        self.got.append((message.body.decode(), reason))


# -- the priority property --------------------------------------------------------------


@pytest.mark.parametrize(
    "properties",
    [
        {},
        {"priority": 0},
        {"priority": 9},
        {"priority": 255, "delivery_mode": 2},
        {
            "content_type": "text/plain",
            "content_encoding": "gzip",
            "headers": {"a": 1, "b": "two", "nested": {"c": [1, 2]}},
            "delivery_mode": 1,
            "priority": 7,
            "expiration": "60000",
            "correlation_id": "x",
        },
        {"headers": {}, "priority": 3},
    ],
)
def test_the_priority_is_read_from_the_header_bytes_as_decoding_gives_it(
    properties: dict[str, Any],
) -> None:
    made = message("m", **properties)
    assert made.priority() == (made.properties().priority or 0)


# -- priority queues: order ---------------------------------------------------------------


def test_higher_priority_first_fifo_within_a_priority_none_is_0_above_the_max_is_the_max() -> None:
    queue = priority_queue(5)
    fill(
        queue,
        ("n0", None),
        ("a1", 1),
        ("b5", 5),
        ("c9", 9),
        ("d3", 3),
        ("e5", 5),
        ("f0", 0),
        ("g1", 1),
    )
    assert queue.message_count == 8 and queue.bytes == 16
    # The order RabbitMQ 3.10 gives for the same publishes.
    assert bodies(queue) == ["b5", "c9", "e5", "d3", "a1", "g1", "n0", "f0"]
    assert queue.message_count == 0 and queue.bytes == 0
    assert queue.get(0.0) is None


def test_requeue_goes_back_to_its_position_within_its_priority() -> None:
    queue = priority_queue(5)
    fill(queue, ("a", 1), ("b", 1), ("c", 1), ("x", 5), ("y", 5), ("z", 5))
    taken = [queue.get(0.0, no_ack=False) for _ in range(5)]
    ids = {got[0].body.decode(): got[0].msg_id for got in taken if got is not None}
    assert list(ids) == ["x", "y", "z", "a", "b"]
    # Returned in another order than delivered (as RabbitMQ's probe did), z acked.
    queue.requeue([ids["b"]])
    queue.requeue([ids["x"], ids["a"]])
    queue.requeue([ids["y"]])
    queue.ack([ids["z"]])
    assert queue.unacked == 0 and queue.message_count == 5
    assert take_all(queue) == [
        ("x", True),
        ("y", True),
        ("a", True),
        ("b", True),
        ("c", False),
    ]


def test_a_requeued_low_priority_message_waits_behind_higher_ones_that_arrived_later() -> None:
    queue = priority_queue(3)
    (low,) = fill(queue, ("low", 0))
    got = queue.get(0.0, no_ack=False)
    assert got is not None and got[0] is low
    fill(queue, ("high", 3), ("later-low", 0))
    queue.requeue([low.msg_id])
    assert take_all(queue) == [("high", False), ("low", True), ("later-low", False)]


def test_a_maximum_of_0_is_a_plain_queue_and_others_are_priority_queues() -> None:
    assert type(new_queue("q", arguments={"x-max-priority": 0})) is Queue
    assert type(new_queue("q")) is Queue
    queue = new_queue("q", arguments={"x-max-priority": 255})
    assert isinstance(queue, PriorityQueue) and queue.max_priority == 255
    fill(queue, ("low", 0), ("top", 255), ("mid", 7))
    # Lanes are made for the priorities in use only.
    assert sorted(queue.lanes) == [0, 7, 255]
    assert bodies(queue) == ["top", "mid", "low"]


@pytest.mark.parametrize("value", [256, -1, 10**6, "5", b"5", True, 2.5, None])
def test_x_max_priority_must_be_an_integer_from_0_to_255(value: Any) -> None:
    with pytest.raises(QueueArgumentError, match="x-max-priority.*from 0 to 255"):
        new_queue("q", arguments={"x-max-priority": value})


# -- priority queues: what works on the head ----------------------------------------------


def test_per_queue_ttl_expires_the_head_in_priority_order_and_dead_letters_it() -> None:
    queue = priority_queue(5, **{"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx"})
    dead = DeadLetters()
    queue.on_dead_letter = dead
    fill(queue, ("old-low", 0), now=0.0)
    fill(queue, ("new-high", 5), now=0.5)
    assert queue.next_expiry() == 1.5, "the head is the high-priority message"
    # At 1.2 the low one is past its deadline but not at the head: it waits.
    assert queue.expire(1.2) == 0 and queue.message_count == 2
    assert queue.expire(1.6) == 2
    assert dead.got == [("new-high", "expired"), ("old-low", "expired")]
    assert queue.message_count == 0 and queue.bytes == 0 and queue.next_expiry() is None


def test_per_message_ttl_is_honoured_at_the_head_only_as_in_rabbitmq() -> None:
    queue = priority_queue(5)
    queue.enqueue(message("low-short", 0), 0.0, expiration=0.1)
    queue.enqueue(message("high-long", 5), 0.0, expiration=100.0)
    assert queue.expire(0.5) == 0
    assert queue.message_count == 2
    # Once the high one is taken, the expired low one is the head: Basic.Get skips it.
    assert take_all(queue, 0.5) == [("high-long", False)]
    queue.enqueue(message("high-short", 5), 1.0, expiration=0.1)
    queue.enqueue(message("low-long", 0), 1.0)
    assert queue.next_expiry() == pytest.approx(1.1)
    assert queue.expire(1.5) == 1
    assert take_all(queue, 1.5) == [("low-long", False)]


def test_a_new_head_that_expires_sooner_asks_for_the_timer() -> None:
    queue = priority_queue(5)
    due: list[float | None] = []
    queue.on_due_changed = lambda q: due.append(q.next_due())
    queue.enqueue(message("low", 0), 0.0, expiration=60.0)
    queue.enqueue(message("high", 5), 0.0, expiration=1.0)
    assert due[-1] == 1.0
    got = queue.get(0.5, no_ack=False)
    assert got is not None and got[0].body == b"high"
    assert due[-1] == 60.0
    queue.requeue([got[0].msg_id])
    assert due[-1] == 1.0, "a requeued message keeps its deadline, at the head again"


def test_drop_head_drops_the_highest_priority_first_as_rabbitmq_does() -> None:
    queue = priority_queue(5, **{"x-max-length": 2, "x-dead-letter-exchange": "dlx"})
    dead = DeadLetters()
    queue.on_dead_letter = dead
    fill(queue, ("a0", 0), ("b5", 5), ("c0", 0))
    assert dead.got == [("b5", "maxlen")]
    assert bodies(queue) == ["a0", "c0"]
    fill(queue, ("a5", 5), ("b0", 0), ("c5", 5))
    assert dead.got[-1] == ("a5", "maxlen")
    assert bodies(queue) == ["c5", "b0"]


def test_max_length_bytes_and_reject_publish_count_every_priority() -> None:
    queue = priority_queue(3, **{"x-max-length-bytes": 6, "x-overflow": "reject-publish"})
    fill(queue, ("aa", 0), ("bb", 3))
    assert not queue.would_reject(message("cc", 1))
    fill(queue, ("cc", 1))
    assert queue.would_reject(message("d", 3))
    assert bodies(queue) == ["bb", "cc", "aa"]


def test_reject_dead_letters_and_purge_empties_every_priority() -> None:
    queue = priority_queue(2, **{"x-dead-letter-exchange": "dlx"})
    dead = DeadLetters()
    queue.on_dead_letter = dead
    fill(queue, ("a", 0), ("b", 2), ("c", 1), ("d", 2))
    got = queue.get(0.0, no_ack=False)
    assert got is not None and got[0].body == b"b"
    queue.reject([got[0].msg_id])
    assert dead.got == [("b", "rejected")]
    assert queue.purge() == 3
    assert queue.message_count == 0 and queue.bytes == 0 and queue.get(0.0) is None
    fill(queue, ("after", 1))
    assert bodies(queue) == ["after"]


def test_consumers_get_messages_in_priority_order_round_robin() -> None:
    queue = priority_queue(9)
    first, second = FakeConsumer("first"), FakeConsumer("second", credit=1)
    fill(queue, ("l1", 1), ("h1", 9), ("l2", 1), ("h2", 9))
    queue.add_consumer(first, 0.0)
    queue.add_consumer(second, 0.0)
    queue.drain(0.0)
    assert first.got == ["h1", "l1", "l2"] and second.got == ["h2"]
    assert queue.message_count == 0


def test_discard_removes_messages_wherever_they_are() -> None:
    queue = priority_queue(3)
    made = fill(queue, ("a", 0), ("b", 3), ("c", 0), ("d", 3), ("e", 1), ("f", 0))
    by_body = {m.body.decode(): m for m in made}
    got = queue.get(0.0, no_ack=False)  # b, outstanding
    assert got is not None and got[0].body == b"b"
    got = queue.get(0.0, no_ack=False)  # d, returned below
    assert got is not None
    queue.requeue([by_body["d"].msg_id])
    # Heads, a message in the middle of a lane, a returned one and an outstanding one.
    queue.discard([by_body[name].msg_id for name in ("a", "d", "f", "b")])
    assert queue.unacked == 0
    assert queue.message_count == 2 and queue.bytes == 2
    assert bodies(queue) == ["e", "c"]


def test_messages_lists_everything_unsettled_in_id_order_with_deadlines() -> None:
    queue = priority_queue(3)
    queue.enqueue(message("a", 0), 0.0)
    queue.enqueue(message("b", 3), 0.0, expiration=5.0)
    queue.enqueue(message("c", 1), 0.0)
    got = queue.get(0.0, no_ack=False)
    assert got is not None and got[0].body == b"b"
    assert [(m.body, d) for m, d in queue.messages()] == [(b"a", None), (b"b", 5.0), (b"c", None)]


# -- priority queues: the change stream -----------------------------------------------------


def test_a_durable_priority_queue_emits_what_a_plain_one_does() -> None:
    log = ChangeLog()
    queue = new_queue("q", durable=True, arguments={"x-max-priority": 3}, log=log)
    made = fill(queue, ("low", 0), ("high", 3))
    got = queue.get(0.0, no_ack=False)
    assert got is not None and got[0] is made[1]
    queue.ack([made[1].msg_id])
    assert queue.purge() == 1
    changes = log.take()[1]
    assert [type(c) for c in changes] == [Enqueued, Enqueued, Delivered, Settled, Settled]
    assert [c.msg_id for c in changes[:3]] == [made[0].msg_id, made[1].msg_id, made[1].msg_id]
    assert changes[3].reason == "ack" and changes[4] == Settled(
        "/", "q", (made[0].msg_id,), "purged"
    )


def test_restored_messages_land_in_their_priority() -> None:
    original = priority_queue(5)
    made = fill(original, ("a0", 0), ("b5", 5), ("c2", 2), ("d5", 5), ("e0", 0))
    restored = priority_queue(5)
    for each, deadline in original.messages():
        restored.restore(each, deadline)
    assert restored.message_count == 5 and restored.bytes == original.bytes
    assert bodies(restored) == bodies(original) == ["b5", "d5", "c2", "a0", "e0"]
    assert made


def test_redelivered_is_exact_live_and_never_missed_after_a_restore() -> None:
    queue = priority_queue(5)
    low, high = fill(queue, ("low", 0), ("high", 5))
    got = queue.get(0.0, no_ack=False)
    assert got is not None and got[0] is high
    # Delivery is not in id order here: the queue's own delivery of a later id says
    # nothing of the low message, still never delivered.
    assert queue.delivered_mark == high.msg_id
    assert take_all(queue) == [("low", False)]
    # After a restart, the stream's mark marks every message at or below it: the one
    # delivered (high) certainly, and the low one below it too (it may have been).
    restored = priority_queue(5)
    for each in (low, high):
        restored.restore(each, None)
    newer = message("newer", 0)
    restored.restore(newer, None)
    restored.mark_delivered(high.msg_id)
    assert take_all(restored) == [("high", True), ("low", True), ("newer", False)]


# -- consumer priorities --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [(None, 0), ({}, 0), ({"x-priority": 5}, 5), ({"x-priority": -3}, -3), ({"other": 1}, 0)],
)
def test_x_priority_is_any_integer_and_0_by_default(arguments: Any, expected: int) -> None:
    assert consumer_priority(arguments, "q") == expected


@pytest.mark.parametrize("value", ["5", True, 1.5, None])
def test_x_priority_must_be_an_integer(value: Any) -> None:
    with pytest.raises(QueueArgumentError, match="x-priority.*queue 'q'.*need an integer"):
        consumer_priority({"x-priority": value}, "q")


def test_the_highest_ready_consumers_get_everything_round_robin_among_equals() -> None:
    queue = Queue("q")
    low, high_a, high_b = FakeConsumer("low"), FakeConsumer("a"), FakeConsumer("b")
    queue.add_consumer(low, 0.0, 1)
    queue.add_consumer(high_a, 0.0, 10)
    queue.add_consumer(high_b, 0.0, 10)
    fill(queue, *((str(n), None) for n in range(6)))
    queue.drain(0.0)
    assert high_a.got == ["0", "2", "4"] and high_b.got == ["1", "3", "5"] and low.got == []


def test_lower_priority_consumers_get_messages_only_while_every_higher_one_is_blocked() -> None:
    queue = Queue("q")
    low, none, high = FakeConsumer("low"), FakeConsumer("none"), FakeConsumer("high", credit=2)
    queue.add_consumer(low, 0.0, -5)
    queue.add_consumer(none, 0.0)
    queue.add_consumer(high, 0.0, 10)
    fill(queue, *((str(n), None) for n in range(4)))
    queue.drain(0.0)
    # high takes two and blocks; priority 0 beats -5.
    assert high.got == ["0", "1"] and none.got == ["2", "3"] and low.got == []
    high.credit = 1
    queue.wake(high)
    fill(queue, ("4", None), ("5", None))
    queue.drain(0.0)
    assert high.got == ["0", "1", "4"] and none.got == ["2", "3", "5"]
    queue.remove_consumer(none, 0.0)
    fill(queue, ("6", None))
    queue.drain(0.0)
    assert low.got == ["6"]
    queue.remove_consumer(low, 0.0)
    queue.remove_consumer(high, 0.0)
    assert queue.consumer_count == 0 and not queue._ready


def test_a_queue_without_consumer_priorities_keeps_its_plain_round_robin() -> None:
    queue = Queue("q")
    queue.add_consumer(FakeConsumer("a"), 0.0)
    queue.add_consumer(FakeConsumer("b"), 0.0, 0)
    assert type(queue._ready) is OrderedDict
    queue.add_consumer(FakeConsumer("c"), 0.0, 3)
    assert isinstance(queue._ready, RankedConsumers)
    assert [c.tag for c in queue._ready] == ["c", "a", "b"]  # type: ignore[attr-defined]


def test_consumer_priorities_on_a_priority_queue() -> None:
    queue = priority_queue(5)
    low, high = FakeConsumer("low"), FakeConsumer("high", credit=1)
    queue.add_consumer(low, 0.0, 0)
    queue.add_consumer(high, 0.0, 1)
    fill(queue, ("m0", 0), ("m5", 5), ("m3", 3))
    queue.drain(0.0)
    assert high.got == ["m5"] and low.got == ["m3", "m0"]


# -- single active consumer ------------------------------------------------------------------


def sac_queue(**arguments: Any) -> Queue:
    return new_queue("q", arguments={"x-single-active-consumer": True, **arguments})


def test_only_the_first_consumer_receives_and_the_next_takes_over_when_it_leaves() -> None:
    queue = sac_queue()
    a, b, c = FakeConsumer("a"), FakeConsumer("b"), FakeConsumer("c")
    for consumer in (a, b, c):
        queue.add_consumer(consumer, 0.0)
    fill(queue, ("0", None), ("1", None))
    queue.drain(0.0)
    assert a.got == ["0", "1"] and b.got == c.got == []
    assert queue.consumer_count == 3 and queue.active_consumer is a
    # A waiting consumer leaving changes nothing.
    queue.remove_consumer(c, 0.0)
    assert queue.active_consumer is a
    queue.remove_consumer(a, 0.0)
    assert queue.active_consumer is b
    fill(queue, ("2", None))
    queue.drain(0.0)
    assert b.got == ["2"]
    queue.remove_consumer(b, 0.0)
    assert queue.active_consumer is None
    fill(queue, ("3", None))
    queue.drain(0.0)
    assert queue.message_count == 1


def test_the_next_active_consumer_is_the_highest_priority_then_the_earliest() -> None:
    """The order RabbitMQ 3.10 gives: A(0) active; B(0), C(5), D(5) wait. A leaves: C.
    C leaves: D. A later E(100) does not take over from D."""
    queue = sac_queue()
    consumers = {tag: FakeConsumer(tag) for tag in "ABCDE"}
    for tag, priority in (("A", 0), ("B", 0), ("C", 5), ("D", 5)):
        queue.add_consumer(consumers[tag], 0.0, priority)
    assert queue.active_consumer is consumers["A"]
    queue.remove_consumer(consumers["A"], 0.0)
    assert queue.active_consumer is consumers["C"]
    queue.remove_consumer(consumers["C"], 0.0)
    assert queue.active_consumer is consumers["D"]
    queue.add_consumer(consumers["E"], 0.0, 100)
    fill(queue, ("m", None))
    queue.drain(0.0)
    assert consumers["D"].got == ["m"] and consumers["E"].got == []
    queue.remove_consumer(consumers["D"], 0.0)
    assert queue.active_consumer is consumers["E"]


def test_a_blocked_active_consumer_holds_the_queue() -> None:
    queue = sac_queue()
    busy, idle = FakeConsumer("busy", credit=1), FakeConsumer("idle")
    queue.add_consumer(busy, 0.0)
    queue.add_consumer(idle, 0.0)
    fill(queue, ("0", None), ("1", None), ("2", None))
    queue.drain(0.0)
    assert busy.got == ["0"] and idle.got == [] and queue.message_count == 2
    queue.wake(idle)
    queue.drain(0.0)
    assert idle.got == []
    busy.credit = 5
    queue.wake(busy)
    queue.drain(0.0)
    assert busy.got == ["0", "1", "2"]


def test_single_active_consumer_with_a_priority_queue_and_basic_get() -> None:
    queue = sac_queue(**{"x-max-priority": 2})
    assert isinstance(queue, PriorityQueue) and queue.single_active
    first, second = FakeConsumer("first", credit=1), FakeConsumer("second")
    queue.add_consumer(first, 0.0)
    queue.add_consumer(second, 0.0)
    fill(queue, ("low", 0), ("high", 2), ("mid", 1))
    queue.drain(0.0)
    assert first.got == ["high"] and second.got == []
    got = queue.get(0.0)  # Basic.Get still works on such a queue
    assert got is not None and got[0].body == b"mid"


@pytest.mark.parametrize("value", ["true", 1, None])
def test_x_single_active_consumer_must_be_a_boolean(value: Any) -> None:
    with pytest.raises(QueueArgumentError, match="x-single-active-consumer.*true or false"):
        new_queue("q", arguments={"x-single-active-consumer": value})


def test_clearing_consumers_forgets_the_active_one() -> None:
    queue = sac_queue()
    queue.add_consumer(FakeConsumer("a"), 0.0)
    queue.clear_consumers()
    assert queue.active_consumer is None and queue.consumer_count == 0
    later = FakeConsumer("later")
    queue.add_consumer(later, 0.0)
    assert queue.active_consumer is later
    assert math.isinf(queue._head_deadline())


# -- lanes live while they hold messages ---------------------------------------------------


def test_an_empty_priority_queue_holds_no_lane() -> None:
    gc.collect()  # lanes of earlier tests freed now, not while this one counts
    held = Lane.held
    queue = priority_queue(255)
    assert queue.lanes == {} and Lane.held == held
    fill(queue, *((f"m{p}", p) for p in range(256)))
    assert len(queue.lanes) == 256 and Lane.held == held + 256
    assert queue.purge() == 256
    assert queue.lanes == {} and Lane.held == held
    # Drained by consumers, gets, expiry or settling, lanes go as they empty.
    fill(queue, ("a", 9), ("b", 3), ("c", 3))
    assert take_all(queue) == [("a", False), ("b", False), ("c", False)]
    assert queue.lanes == {} and Lane.held == held
    first, second = fill(queue, ("x", 5), ("y", 2))
    queue.discard([second.msg_id])
    assert sorted(queue.lanes) == [5]
    fill(queue, ("z", 200))
    assert bodies(queue) == ["z", "x"]
    assert queue.lanes == {} and Lane.held == held


def test_the_head_follows_lanes_as_they_come_and_go() -> None:
    queue = priority_queue(10)
    fill(queue, ("low", 1), ("high", 8))
    got = queue.get(0.0)
    assert got is not None and got[0].body == b"high"
    assert sorted(queue.lanes) == [1]
    fill(queue, ("mid", 4))
    assert bodies(queue) == ["mid", "low"]
    assert queue.lanes == {} and queue.message_count == 0
