"""Queue: order, round-robin, requeue, TTL, length limits, overflow, x-expires, arguments.

Time is a number passed in; nothing here sleeps.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from pamqp import commands
from pamqp.header import ContentHeader

from amqha.core.arguments import QueueArgumentError
from amqha.core.message import Message
from amqha.core.queue import Consumer, Queue
from amqha.wire import address_of

_ids = itertools.count(1)


def message(body: bytes | str, **properties: Any) -> Message:
    """A message with the next id, as the vhost gives one on enqueue."""
    data = body.encode() if isinstance(body, str) else body
    header = ContentHeader(0, len(data), commands.Basic.Properties(**properties)).marshal()
    return Message(address_of("", "q"), header, data, msg_id=next(_ids))


class FakeConsumer(Consumer):
    def __init__(
        self, tag: str, credit: int = 10**6, exclusive: bool = False, no_ack: bool = True
    ) -> None:
        super().__init__(tag, exclusive, no_ack)
        self.credit = credit
        self.got: list[tuple[bytes, bool]] = []

    def ready(self) -> bool:
        return self.credit > 0

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        self.credit -= 1
        self.got.append((message.body, redelivered))

    @property
    def bodies(self) -> list[bytes]:
        return [body for body, _ in self.got]


class DeadLetters:
    def __init__(self) -> None:
        self.got: list[tuple[str, bytes, str]] = []

    def __call__(self, queue: Queue, message: Message, reason: str) -> None:
        self.got.append((queue.name, message.body, reason))


def dlx_queue(**arguments: Any) -> tuple[Queue, DeadLetters]:
    queue = Queue("q", arguments={"x-dead-letter-exchange": "dlx", **arguments})
    dead = DeadLetters()
    queue.on_dead_letter = dead
    return queue, dead


def bodies(queue: Queue, now: float = 0.0) -> list[bytes]:
    out = []
    while (got := queue.get(now)) is not None:
        out.append(got[0].body)
    return out


def test_fifo_and_counts() -> None:
    queue = Queue("q")
    for number in range(5):
        queue.enqueue(message(str(number)), 0.0)
    assert queue.message_count == 5
    assert queue.bytes == 5
    assert bodies(queue) == [b"0", b"1", b"2", b"3", b"4"]
    assert queue.message_count == 0 and queue.bytes == 0
    assert queue.get(0.0) is None


def test_round_robin_among_ready_consumers() -> None:
    queue = Queue("q")
    consumers = [FakeConsumer(tag) for tag in "abc"]
    for consumer in consumers:
        queue.add_consumer(consumer, 0.0)
    for number in range(7):
        queue.enqueue(message(str(number)), 0.0)
    queue.drain(0.0)
    assert [c.bodies for c in consumers] == [[b"0", b"3", b"6"], [b"1", b"4"], [b"2", b"5"]]
    assert queue.message_count == 0


def test_consumers_not_ready_are_skipped_and_the_rest_waits() -> None:
    queue = Queue("q")
    busy, free = FakeConsumer("busy", credit=0), FakeConsumer("free", credit=2)
    queue.add_consumer(busy, 0.0)
    queue.add_consumer(free, 0.0)
    for number in range(4):
        queue.enqueue(message(str(number)), 0.0)
    queue.drain(0.0)
    assert busy.got == [] and free.bodies == [b"0", b"1"]
    assert queue.message_count == 2
    busy.credit = 5
    queue.drain(0.0)
    assert busy.got == [], "a consumer found not ready waits until it is woken"
    queue.wake(busy)
    queue.drain(0.0)
    assert busy.bodies == [b"2", b"3"]


def test_single_consumer_not_ready_keeps_messages() -> None:
    queue = Queue("q")
    consumer = FakeConsumer("c", credit=1)
    queue.add_consumer(consumer, 0.0)
    queue.enqueue(message("a"), 0.0)
    queue.enqueue(message("b"), 0.0)
    queue.drain(0.0)
    assert consumer.bodies == [b"a"] and queue.message_count == 1


def test_requeue_goes_back_to_the_original_positions_marked_redelivered() -> None:
    queue = Queue("q")
    first, second, third, fourth = message("1"), message("2"), message("3"), message("4")
    for each in (first, second, third, fourth):
        queue.enqueue(each, 0.0)
    taken = [queue.get(0.0, no_ack=False) for _ in range(3)]
    assert queue.unacked == 3 and queue.message_count == 1
    # Returned out of order (the third first), they still come back in their order,
    # ahead of the one never delivered.
    queue.requeue([third.msg_id])
    queue.requeue([second.msg_id, first.msg_id])
    assert queue.bytes == 4 and queue.unacked == 0
    got = [queue.get(0.0) for _ in range(4)]
    assert [(m.body, redelivered) for m, redelivered in got] == [  # type: ignore[misc]
        (b"1", True),
        (b"2", True),
        (b"3", True),
        (b"4", False),
    ]
    assert taken[0] is not None


def test_remove_consumer_reports_auto_delete() -> None:
    queue = Queue("q", auto_delete=True)
    consumer = FakeConsumer("c")
    queue.add_consumer(consumer, 0.0)
    assert queue.remove_consumer(consumer, 1.0) is True
    assert queue.remove_consumer(consumer, 1.0) is False
    plain = Queue("p")
    plain.add_consumer(consumer, 0.0)
    assert plain.remove_consumer(consumer, 1.0) is False


def test_exclusive_consumer_flag() -> None:
    queue = Queue("q")
    queue.add_consumer(FakeConsumer("a"), 0.0)
    assert not queue.has_exclusive_consumer()
    queue.add_consumer(FakeConsumer("b", exclusive=True), 0.0)
    assert queue.has_exclusive_consumer()


# -- TTL --------------------------------------------------------------------------------


def test_per_queue_ttl_expires_once_past_the_deadline() -> None:
    queue, dead = dlx_queue(**{"x-message-ttl": 1000})
    queue.enqueue(message("a"), 10.0)
    queue.enqueue(message("b"), 10.5)
    assert queue.next_expiry() == 11.0
    assert queue.expire(11.0) == 0
    assert queue.expire(11.001) == 1
    assert dead.got == [("q", b"a", "expired")]
    assert queue.next_expiry() == 11.5
    assert bodies(queue, 11.2) == [b"b"]


def test_get_skips_expired_messages() -> None:
    queue = Queue("q", arguments={"x-message-ttl": 100})
    queue.enqueue(message("old"), 0.0)
    queue.enqueue(message("new"), 0.5)
    got = queue.get(0.3)
    assert got is not None and got[0].body == b"new"


def test_per_message_ttl_is_honoured_only_at_the_head() -> None:
    queue, dead = dlx_queue()
    queue.enqueue(message("long"), 0.0, expiration=10.0)
    queue.enqueue(message("short"), 0.0, expiration=1.0)
    # The short-lived one is behind a live message: it waits (as in RabbitMQ).
    assert queue.expire(5.0) == 0
    assert queue.message_count == 2
    assert queue.expire(10.5) == 2
    assert dead.got == [("q", b"long", "expired"), ("q", b"short", "expired")]


def test_the_smaller_of_queue_and_message_ttl_wins() -> None:
    queue = Queue("q", arguments={"x-message-ttl": 5000})
    queue.enqueue(message("a"), 0.0, expiration=1.0)
    queue.enqueue(message("b"), 0.0, expiration=60.0)
    assert queue.next_expiry() == 1.0
    queue.expire(1.5)
    assert queue.next_expiry() == 5.0


def test_ttl_zero_expires_as_soon_as_time_moves_when_nobody_takes_it() -> None:
    queue, dead = dlx_queue(**{"x-message-ttl": 0})
    queue.enqueue(message("a"), 3.0)
    assert queue.expire(3.0) == 0
    assert queue.get(3.001) is None
    assert dead.got == [("q", b"a", "expired")]


def test_ttl_zero_goes_to_a_consumer_ready_at_that_instant() -> None:
    queue, dead = dlx_queue(**{"x-message-ttl": 0})
    ready, busy = FakeConsumer("ready"), FakeConsumer("busy", credit=0)
    queue.add_consumer(ready, 0.0)
    queue.enqueue(message("a"), 3.0)
    queue.drain(3.0)
    assert ready.bodies == [b"a"] and dead.got == []
    queue.remove_consumer(ready, 3.0)
    queue.add_consumer(busy, 3.0)
    queue.enqueue(message("b"), 4.0)
    queue.drain(4.0)
    queue.drain(4.001)
    assert busy.got == [] and dead.got == [("q", b"b", "expired")]


def test_message_ttl_appearing_later_keeps_earlier_messages_forever() -> None:
    queue = Queue("q")
    queue.enqueue(message("forever"), 0.0)
    queue.enqueue(message("brief"), 0.0, expiration=1.0)
    assert queue.next_expiry() is None
    assert queue.expire(100.0) == 0
    assert queue.get(100.0)[0].body == b"forever"  # type: ignore[index]
    assert queue.next_expiry() == 1.0
    assert queue.get(100.0) is None


def test_requeued_messages_keep_their_deadline() -> None:
    queue = Queue("q", arguments={"x-message-ttl": 1000})
    queue.enqueue(message("a"), 0.0)
    got = queue.get(0.0, no_ack=False)
    assert got is not None
    queue.requeue([got[0].msg_id])
    assert queue.next_expiry() == 1.0
    assert queue.expire(0.5) == 0
    assert queue.expire(1.5) == 1
    assert queue.get(1.5) is None


def test_drain_expires_before_delivering() -> None:
    queue = Queue("q", arguments={"x-message-ttl": 1000})
    queue.enqueue(message("stale"), 0.0)
    queue.enqueue(message("fresh"), 5.0)
    consumer = FakeConsumer("c")
    queue.add_consumer(consumer, 5.5)
    queue.drain(5.5)
    assert consumer.bodies == [b"fresh"]


def test_expired_without_dead_letter_exchange_is_dropped() -> None:
    queue = Queue("q", arguments={"x-message-ttl": 10})
    called = []
    queue.on_dead_letter = lambda *args: called.append(args)
    queue.enqueue(message("a"), 0.0)
    assert queue.expire(1.0) == 1
    assert called == [] and queue.message_count == 0 and queue.bytes == 0


# -- length limits and overflow -----------------------------------------------------------


def test_max_length_drops_the_head_and_dead_letters_it_as_maxlen() -> None:
    queue, dead = dlx_queue(**{"x-max-length": 2})
    for body in "abcd":
        assert not queue.would_reject(message(body))
        queue.enqueue(message(body), 0.0)
    assert dead.got == [("q", b"a", "maxlen"), ("q", b"b", "maxlen")]
    assert bodies(queue) == [b"c", b"d"]


def test_max_length_zero_keeps_nothing() -> None:
    queue, dead = dlx_queue(**{"x-max-length": 0})
    queue.enqueue(message("a"), 0.0)
    assert queue.message_count == 0 and dead.got == [("q", b"a", "maxlen")]


def test_max_length_bytes_drops_until_it_fits() -> None:
    queue, dead = dlx_queue(**{"x-max-length-bytes": 10})
    queue.enqueue(message(b"x" * 4), 0.0)
    queue.enqueue(message(b"y" * 4), 0.0)
    queue.enqueue(message(b"z" * 5), 0.0)
    assert [body for _, body, _ in dead.got] == [b"x" * 4]
    assert queue.bytes == 9
    queue.enqueue(message(b"w" * 11), 0.0)
    assert queue.message_count == 0 and queue.bytes == 0
    assert [reason for _, _, reason in dead.got] == ["maxlen"] * 4


def test_drop_head_keeps_expiry_bookkeeping_in_step() -> None:
    queue = Queue("q", arguments={"x-max-length": 1, "x-message-ttl": 1000})
    queue.enqueue(message("a"), 0.0)
    queue.enqueue(message("b"), 0.5)
    assert queue.next_expiry() == 1.5


@pytest.mark.parametrize("mode", ["reject-publish", "reject-publish-dlx"])
def test_reject_publish_refuses_instead_of_dropping(mode: str) -> None:
    queue, dead = dlx_queue(**{"x-max-length": 2, "x-overflow": mode})
    for body in "ab":
        assert not queue.would_reject(message(body))
        queue.enqueue(message(body), 0.0)
    assert queue.would_reject(message("c"))
    assert dead.got == []
    queue.get(0.0)
    assert not queue.would_reject(message("c"))


def test_reject_publish_by_bytes() -> None:
    queue = Queue("q", arguments={"x-max-length-bytes": 5, "x-overflow": "reject-publish"})
    queue.enqueue(message(b"abc"), 0.0)
    assert not queue.would_reject(message(b"de"))
    assert queue.would_reject(message(b"def"))


def test_drop_head_never_rejects() -> None:
    queue = Queue("q", arguments={"x-max-length": 0})
    assert not queue.would_reject(message("a"))


def test_reject_dead_letters_as_rejected() -> None:
    queue, dead = dlx_queue()
    queue.enqueue(message("r"), 0.0)
    got = queue.get(0.0, no_ack=False)
    assert got is not None
    queue.reject([got[0].msg_id])
    assert dead.got == [("q", b"r", "rejected")]
    assert queue.unacked == 0 and queue.message_count == 0


def test_purge() -> None:
    queue = Queue("q", arguments={"x-message-ttl": 1000})
    for body in "abc":
        queue.enqueue(message(body), 0.0)
    assert queue.purge() == 3
    assert queue.message_count == 0 and queue.bytes == 0 and queue.next_expiry() is None


# -- x-expires -------------------------------------------------------------------------


def test_x_expires_counts_from_last_use() -> None:
    queue = Queue("q", arguments={"x-expires": 2000}, now=10.0)
    assert not queue.is_idle_expired(11.9)
    assert queue.is_idle_expired(12.0)
    queue.get(11.0)
    assert not queue.is_idle_expired(12.5)
    assert queue.is_idle_expired(13.0)


def test_x_expires_never_while_consumed() -> None:
    queue = Queue("q", arguments={"x-expires": 1000}, now=0.0)
    consumer = FakeConsumer("c")
    queue.add_consumer(consumer, 0.0)
    assert not queue.is_idle_expired(100.0)
    queue.remove_consumer(consumer, 100.0)
    assert not queue.is_idle_expired(100.5)
    assert queue.is_idle_expired(101.0)


def test_no_x_expires_never_expires() -> None:
    assert not Queue("q").is_idle_expired(10**9)


# -- arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"x-message-ttl": -1}, "x-message-ttl"),
        ({"x-message-ttl": "10"}, "x-message-ttl"),
        ({"x-message-ttl": True}, "x-message-ttl"),
        ({"x-message-ttl": 1.5}, "x-message-ttl"),
        ({"x-expires": 0}, "x-expires"),
        ({"x-max-length": -1}, "x-max-length"),
        ({"x-max-length-bytes": "big"}, "x-max-length-bytes"),
        ({"x-overflow": "drop-tail"}, "x-overflow"),
        ({"x-overflow": 3}, "x-overflow"),
        ({"x-overflow": b"\xffdrop"}, "x-overflow.*not UTF-8"),
        ({"x-dead-letter-exchange": b"\xc3("}, "x-dead-letter-exchange.*not UTF-8"),
        ({"x-dead-letter-exchange": 5}, "x-dead-letter-exchange"),
        ({"x-dead-letter-routing-key": "k"}, "x-dead-letter-routing-key"),
    ],
)
def test_invalid_arguments(arguments: dict, fragment: str) -> None:
    with pytest.raises(QueueArgumentError, match=fragment):
        Queue("q", arguments=arguments)


def test_valid_arguments_are_parsed() -> None:
    queue = Queue(
        "q",
        arguments={
            "x-message-ttl": 1500,
            "x-expires": 60000,
            "x-max-length": 10,
            "x-max-length-bytes": 1000,
            "x-overflow": b"reject-publish",
            "x-dead-letter-exchange": b"dlx",
            "x-dead-letter-routing-key": "dead",
            "x-unknown-is-ignored": object(),
        },
    )
    limits = queue.limits
    assert (limits.message_ttl, limits.expires) == (1.5, 60.0)
    assert (limits.max_length, limits.max_length_bytes) == (10, 1000)
    assert limits.overflow == "reject-publish"
    assert (limits.dead_letter_exchange, limits.dead_letter_routing_key) == ("dlx", "dead")


def test_consumers_add_and_remove_in_any_order_and_exclusivity_is_counted() -> None:
    queue = Queue("q")
    consumers = [FakeConsumer(str(n)) for n in range(2000)]
    for consumer in consumers:
        queue.add_consumer(consumer, 0.0)
    assert not queue.has_exclusive_consumer()
    for consumer in consumers[::2]:
        assert queue.remove_consumer(consumer, 0.0) is False
    assert queue.consumer_count == 1000
    assert queue.remove_consumer(consumers[0], 0.0) is False  # already gone
    exclusive = FakeConsumer("x", exclusive=True)
    queue.add_consumer(exclusive, 0.0)
    assert queue.has_exclusive_consumer()
    queue.remove_consumer(exclusive, 0.0)
    assert not queue.has_exclusive_consumer()
    for number in range(3):
        queue.enqueue(message(str(number)), 0.0)
    queue.drain(0.0)
    assert [c.bodies for c in consumers[1:7:2]] == [[b"0"], [b"1"], [b"2"]]


def test_busy_consumers_wait_aside_until_woken() -> None:
    queue = Queue("q")
    busy = [FakeConsumer(str(n), credit=0) for n in range(100)]
    free = FakeConsumer("free")
    for consumer in [*busy, free]:
        queue.add_consumer(consumer, 0.0)
    queue.enqueue(message("a"), 0.0)
    queue.drain(0.0)
    assert free.bodies == [b"a"]
    # The busy ones were set aside once; a woken one takes its turn again.
    busy[5].credit = 1
    queue.enqueue(message("b"), 0.0)
    queue.drain(0.0)
    assert free.bodies == [b"a", b"b"] and busy[5].got == []
    queue.wake(busy[5])
    queue.enqueue(message("c"), 0.0)
    queue.enqueue(message("d"), 0.0)
    queue.drain(0.0)
    assert free.bodies == [b"a", b"b", b"c"] and busy[5].bodies == [b"d"]


def test_next_due_follows_the_head_and_x_expires() -> None:
    queue = Queue("q", arguments={"x-message-ttl": 1000, "x-expires": 5000}, now=10.0)
    changes: list[float | None] = []
    queue.on_due_changed = lambda q: changes.append(q.next_due())
    assert queue.next_due() == 15.0
    queue.enqueue(message("a"), 11.0)
    assert queue.next_due() == 12.0 and changes == [12.0]
    consumer = FakeConsumer("c", credit=0)
    queue.add_consumer(consumer, 11.0)
    queue.get(11.5)
    assert queue.next_due() is None
    queue.remove_consumer(consumer, 13.0)
    assert queue.next_due() == 18.0 and changes[-1] == 18.0


@pytest.mark.parametrize("ttl", [None, 60_000])
def test_discard_out_of_order_takes_out_exactly_those_wherever_they_are(ttl: int | None) -> None:
    """A peer's acks applied out of id order (two consumers, a late one): each id leaves
    from where it is (the head, behind it, the returned, the outstanding) and the rest
    keep their order, deadlines and byte count, however deep the queue (a deep one finds
    them by id, a shallow one is rebuilt: both are checked)."""
    for count in (8, 2000):
        queue = Queue("q", arguments={} if ttl is None else {"x-message-ttl": ttl})
        messages = [message(f"m{n:04}") for n in range(count)]
        for each in messages:
            queue.enqueue(each, float(messages.index(each)) if ttl else 0.0)
        taken = [queue.get(0.0, no_ack=False) for _ in range(3)]
        assert all(taken)
        queue.requeue([messages[1].msg_id])  # returned; 0 and 2 stay outstanding
        gone = {messages[n].msg_id for n in (0, 1, 4, 6, count - 1)}
        queue.discard([messages[6].msg_id, messages[count - 1].msg_id])  # behind the head
        queue.discard([messages[4].msg_id])
        queue.discard([messages[1].msg_id, messages[0].msg_id])  # returned, outstanding
        left = [m for m in messages if m.msg_id not in gone]
        assert queue.unacked == 1  # message 2
        assert queue.message_count == len(left) - 1
        assert queue.bytes == sum(len(m.body) for m in left if m is not messages[2])
        assert [m for m, _ in queue.messages()] == left
        if ttl:
            deadlines = dict((m.msg_id, d) for m, d in queue.messages())
            assert deadlines[messages[3].msg_id] == pytest.approx(3.0 + ttl / 1000)
            assert deadlines[messages[5].msg_id] == pytest.approx(5.0 + ttl / 1000)
            # The expiries follow their messages: just past message 3's deadline, it
            # alone expires (0, 1 and 4 are gone, 2 is outstanding).
            queue.expire(3.0 + ttl / 1000 + 0.001)
            assert [m for m, _ in queue.messages()] == [m for m in left if m is not messages[3]]
