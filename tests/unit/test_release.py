"""Big drops freed a slice at a time (amqha/core/release.py, docs/limits.md, "Big drops"):
a purge, a delete, and a PASSIVE applying a purge let go of a big queue's messages at
once, and the server frees them a slice a turn of its loop; with no server's loop (no
waker) they are freed at once, as any container."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pamqp import commands
from pamqp.header import ContentHeader

from amqha.core import release
from amqha.core.changes import ChangeLog, Settled
from amqha.core.kinds import new_queue
from amqha.core.message import HELD, Message
from amqha.core.priority import PriorityQueue
from amqha.core.queue import Queue
from amqha.wire import address_of


@pytest.fixture
def wakes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """A waker as a server sets one (counting its calls); small slices; unset after."""
    monkeypatch.setattr(release, "AT_ONCE", 10)
    calls: list[int] = []
    release.set_waker(lambda: calls.append(1))
    yield calls
    release.set_waker(None)


def filled(count: int, log: ChangeLog | None = None) -> Queue:
    queue = Queue("q", durable=True, log=log)
    for n in range(1, count + 1):
        queue.restore(Message(b"", b"", b"x" * 100, None, n), None)
    return queue


def test_without_a_waker_a_container_is_freed_at_once() -> None:
    items = [object() for _ in range(100_000)]
    release.later(items)
    assert items == [] and release.pending() == 0


def test_a_big_container_is_freed_a_slice_a_call(wakes: list[int]) -> None:
    release.later([1] * 25)
    release.later({n: n for n in range(5)})  # small: at once, never held
    release.later([2] * 15)
    assert wakes == [1] and release.pending() == 40  # woken for the first only
    assert release.some(30) and release.pending() == 10
    assert not release.some(30) and release.pending() == 0
    release.later([3] * 11)
    assert wakes == [1, 1]  # none held any more: woken again


def test_a_purge_empties_the_queue_at_once_and_frees_its_messages_later(
    wakes: list[int],
) -> None:
    log = ChangeLog()
    queue = filled(50, log)
    held = HELD.count
    assert queue.purge() == 50
    assert queue.message_count == 0 and not queue.ready and queue.bytes == 0
    (settled,) = log.take()[1]
    assert type(settled) is Settled and settled.msg_ids == tuple(range(1, 51))
    assert HELD.count == held  # not freed yet: handed over
    while release.some(20):
        pass
    assert HELD.count < held and release.pending() == 0
    queue.restore(Message(b"", b"", b"y", None, 51), None)  # the queue goes on as before
    assert [m.msg_id for m, _ in queue.messages()] == [51]


def test_a_passive_applying_a_purge_lets_go_of_the_whole_queue(wakes: list[int]) -> None:
    queue = filled(50)
    queue.discard(tuple(range(1, 51)))
    assert queue.message_count == 0 and queue.bytes == 0 and release.pending() == 50


def test_a_discard_of_most_but_not_all_keeps_the_rest_in_order(wakes: list[int]) -> None:
    queue = filled(50)
    queue.discard(tuple(n for n in range(1, 51) if n % 10))  # every tenth stays
    assert [m.msg_id for m, _ in queue.messages()] == [10, 20, 30, 40, 50]
    assert queue.bytes == 500
    while release.some(100):
        pass
    assert [m.msg_id for m, _ in queue.messages()] == [10, 20, 30, 40, 50]


def prioritised(count: int, log: ChangeLog | None = None) -> PriorityQueue:
    """A priority queue with messages in three lanes (priorities 0, 1 and 2)."""
    queue = new_queue("p", durable=True, arguments={"x-max-priority": 2}, log=log)
    assert isinstance(queue, PriorityQueue)
    for n in range(1, count + 1):
        properties = commands.Basic.Properties(priority=n % 3)
        header = ContentHeader(0, 100, properties).marshal()
        queue.restore(Message(address_of("", "p"), header, b"x" * 100, None, n), None)
    return queue


def test_a_priority_queues_purge_frees_its_lanes_later(wakes: list[int]) -> None:
    log = ChangeLog()
    queue = prioritised(60, log)
    held = HELD.count
    assert queue.purge() == 60
    assert queue.message_count == 0 and queue.bytes == 0 and not queue.lanes
    (settled,) = log.take()[1]
    assert sorted(settled.msg_ids) == list(range(1, 61))
    assert HELD.count == held and release.pending() == 60  # handed over, lane by lane
    while release.some(25):
        pass
    assert HELD.count < held and release.pending() == 0


def test_a_passive_applying_a_priority_queues_purge_lets_go_of_every_lane(
    wakes: list[int],
) -> None:
    queue = prioritised(60)
    queue.discard(tuple(range(1, 61)))
    assert queue.message_count == 0 and queue.bytes == 0 and not queue.lanes
    assert release.pending() == 60


def test_a_priority_queues_discard_of_all_but_one_keeps_it(wakes: list[int]) -> None:
    queue = prioritised(60)
    queue.discard(tuple(range(1, 60)))  # 60 stays
    assert [m.msg_id for m, _ in queue.messages()] == [60]
    assert queue.message_count == 1 and queue.bytes == 100
