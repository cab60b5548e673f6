"""The change stream: what the core emits, apply() of every kind, and replay.

A scripted workload runs on a vhost that logs; its changes, applied in order to an
empty vhost, must give the same durable state (``snapshot``). That is what a restart
(from the store) and the PASSIVE (from the ACTIVE) rely on.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from pamqp import commands
from pamqp.header import ContentHeader

from amqha.core import codec
from amqha.core.access import Access
from amqha.core.apply import apply, apply_run, snapshot, state_changes
from amqha.core.changes import (
    Batch,
    Bound,
    ChangeLog,
    Delivered,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    QueueDeclared,
    QueueDeleted,
    Settled,
    Unbound,
)
from amqha.core.message import Message, MessageIds
from amqha.core.queue import Consumer, Queue
from amqha.core.vhost import REFUSED, VHost
from amqha.wire import address_of

WALL = 1_700_000_000.0
OWNER = object()


def make_message(
    exchange: str, key: str, body: bytes, persistent: bool = True, **props: Any
) -> Message:
    properties = commands.Basic.Properties(delivery_mode=2 if persistent else 1, **props)
    header = ContentHeader(0, len(body), properties).marshal()
    return Message(address_of(exchange, key), header, body)


class Logged:
    """A vhost that logs, with the clock the test moves."""

    def __init__(self) -> None:
        self.now = WALL
        self.log = ChangeLog()
        self.vhost = VHost("/", lambda: self.now, self.log, MessageIds())

    def publish(self, exchange: str, key: str, body: bytes, **kwargs: Any) -> int:
        """What the publish's confirm waits for (``VHost.enqueue``; 0 when unrouted)."""
        message = make_message(exchange, key, body, **kwargs)
        queues = self.vhost.route(self.vhost.get_exchange(exchange), key, message)
        return self.vhost.enqueue(message, queues, self.now) if queues else 0

    def changes(self) -> list[Any]:
        return self.log.take()[1]


class Replica:
    """An empty state to apply changes to (what a fresh server or a PASSIVE starts from)."""

    def __init__(self) -> None:
        self.vhosts: dict[str, VHost] = {}
        self.access = Access()

    def vhost(self, name: str) -> VHost:
        if name not in self.vhosts:
            self.vhosts[name] = VHost(name, lambda: WALL)
        return self.vhosts[name]


def replay(changes: list[Any], replica: Replica | None = None) -> dict[str, VHost]:
    replica = replica or Replica()
    for change in changes:
        apply(replica, change, WALL)
    return replica.vhosts


class Taker(Consumer):
    def __init__(self, no_ack: bool = False, credit: int = 10**9) -> None:
        super().__init__("taker", no_ack=no_ack)
        self.credit = credit
        self.got: list[tuple[Message, bool]] = []

    def ready(self) -> bool:
        return self.credit > 0

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        self.credit -= 1
        self.got.append((message, redelivered))


# -- what is emitted ---------------------------------------------------------------------


def test_durable_wiring_and_persistent_messages_are_emitted_resolved() -> None:
    h = Logged()
    h.vhost.declare_exchange("jobs", "topic", durable=True)
    queue = h.vhost.declare_queue("", OWNER, h.now, durable=True, arguments={"x-message-ttl": 5000})
    h.vhost.bind_queue(queue.name, "jobs", "a.*", {}, OWNER)
    assert h.publish("jobs", "a.b", b"hello") == 4  # its confirm waits for its Enqueued
    changes = h.changes()
    kinds = [type(c) for c in changes]
    assert kinds == [ExchangeDeclared, QueueDeclared, Bound, Enqueued]
    declared = changes[1]
    # The server-chosen name is in the change, not the empty name that asked for it.
    assert declared.name == queue.name and declared.name.startswith("amq.gen-")
    enqueued = changes[3]
    assert enqueued.body == b"hello" and enqueued.persistent
    # A wall-clock deadline: it means the same after a restart or on the peer.
    assert enqueued.deadline == pytest.approx(WALL + 5.0)
    assert h.log.sync_lsn == h.log.lsn == 4


def test_transient_things_emit_nothing() -> None:
    h = Logged()
    h.vhost.declare_exchange("fast", "fanout")
    h.vhost.declare_queue("t", OWNER, h.now)
    h.vhost.declare_queue("x", OWNER, h.now, durable=True, exclusive=True)
    h.vhost.bind_queue("t", "fast", "", {}, OWNER)
    assert h.publish("fast", "", b"m") == h.publish("", "x", b"m") == 0  # nothing to wait for
    assert h.changes() == []


def test_a_transient_message_on_a_durable_queue_is_logged_but_needs_no_sync() -> None:
    h = Logged()
    h.vhost.declare_queue("d", OWNER, h.now, durable=True)
    h.changes()
    sync = h.log.sync_lsn
    assert h.publish("", "d", b"m", persistent=False) == 0
    assert [type(c) for c in h.changes()] == [Enqueued]
    assert h.log.sync_lsn == sync


def test_a_message_a_queue_refuses_is_refused_whatever_else_took_it() -> None:
    h = Logged()
    h.vhost.declare_exchange("both", "fanout", durable=True)
    full = {"x-max-length": 1, "x-overflow": "reject-publish"}
    h.vhost.declare_queue("full", OWNER, h.now, durable=True, arguments=full)
    h.vhost.declare_queue("open", OWNER, h.now, durable=True)
    for name in ("full", "open"):
        h.vhost.bind_queue(name, "both", "", {}, OWNER)
    h.changes()
    assert h.publish("both", "", b"1") == h.log.lsn > 0
    assert h.publish("both", "", b"2") == REFUSED  # "open" took it; "full" did not


def test_extend_logs_what_emitting_each_change_logs() -> None:
    _, changes = run_workload(3, 200)
    firsts: list[int] = []
    each, whole = ChangeLog(lambda: firsts.append(1)), ChangeLog(lambda: firsts.append(2))
    for change in changes[:50]:
        each.emit(change)
    for change in changes[50:]:
        each.emit(change, True)
    whole.extend(changes[:50])
    whole.extend([])
    whole.extend(changes[50:], True)
    assert (whole.lsn, whole.sync_lsn, whole.pending) == (each.lsn, each.sync_lsn, each.pending)
    assert whole.take() == each.take() == (1, changes)
    assert firsts == [1, 2]  # the host is told once, on the first change of the turn
    whole.begin_batch()  # inside a transaction the changes join its batch
    whole.extend(changes[:3])
    whole.end_batch()
    assert whole.take() == (len(changes) + 1, [Batch(tuple(changes[:3]))])


def test_dead_lettering_is_a_settle_and_an_enqueue_of_the_rewritten_bytes() -> None:
    h = Logged()
    h.vhost.declare_exchange("dlx", "fanout", durable=True)
    work = h.vhost.declare_queue(
        "work", OWNER, h.now, durable=True, arguments={"x-dead-letter-exchange": "dlx"}
    )
    h.vhost.declare_queue("dead", OWNER, h.now, durable=True)
    h.vhost.bind_queue("dead", "dlx", "", {}, OWNER)
    h.publish("", "work", b"job")
    h.changes()
    got = work.get(h.now, no_ack=False)
    assert got is not None
    work.reject([got[0].msg_id])
    delivered, enqueued, settled = h.changes()
    assert isinstance(delivered, Delivered)
    assert isinstance(enqueued, Enqueued) and enqueued.queue == "dead"
    assert enqueued.msg_id != got[0].msg_id and b"x-death" in enqueued.header
    assert settled == Settled("/", "work", (got[0].msg_id,), "rejected")


def test_a_turn_emits_one_delivery_mark_per_queue_its_highest() -> None:
    """Deliveries of one turn (between two ``take``s): one ``Delivered`` per queue, where
    the first was, holding the highest id; acks keep their places. A replica applying the
    stream ends with the same mark, and a message delivered before comes back marked."""
    h = Logged()
    a = h.vhost.declare_queue("a", OWNER, h.now, durable=True)
    b = h.vhost.declare_queue("b", OWNER, h.now, durable=True)
    for n in range(4):
        h.publish("", "a", b"a%d" % n)
        h.publish("", "b", b"b%d" % n)
    replica = Replica()
    replay(h.changes(), replica)
    first = a.get(h.now, no_ack=False)
    second = a.get(h.now, no_ack=False)
    other = b.get(h.now, no_ack=False)
    assert first and second and other
    a.ack([first[0].msg_id])
    third = a.get(h.now, no_ack=False)
    assert third
    turn = h.changes()
    assert turn == [
        Delivered("/", "a", third[0].msg_id),
        Delivered("/", "b", other[0].msg_id),
        Settled("/", "a", (first[0].msg_id,), "ack"),
    ]
    replay(turn, replica)
    assert replica.vhosts["/"].queues["a"].delivered_mark == a.delivered_mark
    # The next turn starts its own mark.
    fourth = a.get(h.now, no_ack=False)
    assert fourth and h.changes() == [Delivered("/", "a", fourth[0].msg_id)]
    # What the replica would redeliver after a failover: the two delivered, not acked.
    taker = Taker()
    replica.vhosts["/"].queues["a"].add_consumer(taker, h.now)
    replica.vhosts["/"].queues["a"].drain(h.now)
    assert [(m.body, again) for m, again in taker.got] == [
        (b"a1", True),
        (b"a2", True),
        (b"a3", False),
    ]


def test_acks_one_by_one_in_a_row_are_one_settled_change() -> None:
    """A consumer acking each message: the acks of one queue, one after another (a
    delivery mark raised in place between them does not part them), are one ``Settled``
    of their ids, in the place of the first; anything else emitted closes it. A replica
    applying the stream holds what the server holds."""
    h = Logged()
    a = h.vhost.declare_queue("a", OWNER, h.now, durable=True)
    b = h.vhost.declare_queue("b", OWNER, h.now, durable=True)
    for n in range(7):
        h.publish("", "a", b"a%d" % n)
    h.publish("", "b", b"b0")
    replica = Replica()
    replay(h.changes(), replica)
    got = [a.get(h.now, no_ack=False) for _ in range(5)]
    other = b.get(h.now, no_ack=False)
    assert all(got) and other
    ids = [g[0].msg_id for g in got if g]
    h.changes()  # the delivery marks
    fifth = a.get(h.now, no_ack=False)  # the turn's first delivery of a: its mark
    a.ack_one(ids[0])
    a.ack_one(ids[1])
    sixth = a.get(h.now, no_ack=False)  # its mark raised in place: no parting
    assert fifth and sixth
    a.ack_one(ids[2])
    b.ack_one(other[0].msg_id)  # another queue's ack: a change of its own
    a.ack_one(ids[3])
    h.publish("", "a", b"a7")  # anything else emitted closes the gathered acks
    a.ack_one(ids[4])
    turn = h.changes()
    assert [type(c) for c in turn] == [Delivered, Settled, Settled, Settled, Enqueued, Settled]
    assert turn[0] == Delivered("/", "a", sixth[0].msg_id)
    assert turn[1] == Settled("/", "a", (ids[0], ids[1], ids[2]), "ack")
    assert turn[2] == Settled("/", "b", (other[0].msg_id,), "ack")
    assert turn[3] == Settled("/", "a", (ids[3],), "ack")
    assert turn[5] == Settled("/", "a", (ids[4],), "ack")
    assert h.log.lsn == 2 + 8 + 2 + 6  # declares and messages, the marks' turn, this turn
    replay(turn, replica)
    # The replica holds what is not acked: a5 and a6 (outstanding on the server, ready
    # on the replica, marked delivered) and a7.
    mirror = replica.vhosts["/"].queues["a"]
    assert [m.body for m, _ in mirror.messages()] == [b"a5", b"a6", b"a7"]
    assert mirror.delivered_mark == a.delivered_mark
    assert replica.vhosts["/"].queues["b"].message_count == 0
    # In a transaction, each ack is a change of its own in the batch.
    a.ack_one(fifth[0].msg_id)
    h.log.begin_batch()
    h.log.emit_settled(a, Settled("/", "a", (1,), "ack"))
    h.log.emit_settled(a, Settled("/", "a", (2,), "ack"))
    h.log.end_batch()
    gathered, batch = h.changes()
    assert gathered == Settled("/", "a", (fifth[0].msg_id,), "ack")
    assert isinstance(batch, Batch) and len(batch.changes) == 2


def test_no_ack_deliveries_in_a_row_are_one_settled_change_parted_by_reason() -> None:
    """A no-ack consumer's deliveries settle as ``consumed``: in a row, one change; an
    ack of the same queue between parts them (another reason)."""
    h = Logged()
    q = h.vhost.declare_queue("q", OWNER, h.now, durable=True)
    for n in range(4):
        h.publish("", "q", b"m%d" % n)
    h.changes()
    held = q.get(h.now, no_ack=False)
    h.changes()
    first = [q.get(h.now, no_ack=True) for _ in range(2)]
    assert held and all(first)
    q.ack_one(held[0].msg_id)
    last = q.get(h.now, no_ack=True)
    assert last
    assert h.changes() == [
        Settled("/", "q", tuple(g[0].msg_id for g in first if g), "consumed"),
        Settled("/", "q", (held[0].msg_id,), "ack"),
        Settled("/", "q", (last[0].msg_id,), "consumed"),
    ]
    assert q.message_count == 0


def test_a_transaction_is_one_batch() -> None:
    h = Logged()
    h.vhost.declare_queue("d", OWNER, h.now, durable=True)
    h.changes()
    h.log.begin_batch()
    # Inside the transaction a publish waits for nothing: its commit waits for the batch.
    assert h.publish("", "d", b"1") == h.publish("", "d", b"2") == 0
    assert h.log.end_batch() == h.log.lsn
    (batch,) = h.changes()
    assert isinstance(batch, Batch) and [c.body for c in batch.changes] == [b"1", b"2"]
    assert h.log.sync_lsn == h.log.lsn
    h.log.begin_batch()
    h.publish("", "d", b"3", persistent=False)
    assert h.log.end_batch() == 0  # a transient message: the commit waits for nothing
    (batch,) = h.changes()
    assert [c.body for c in batch.changes] == [b"3"]
    h.log.begin_batch()
    assert h.log.end_batch() == 0 and h.changes() == []  # an empty transaction


# -- apply() of every kind ----------------------------------------------------------------


def test_apply_every_kind() -> None:
    header = make_message("", "q", b"b").header
    changes: list[Any] = [
        ExchangeDeclared("/", "e", "direct", False, False, {"alternate-exchange": "ae"}),
        ExchangeDeclared("/", "e2", "fanout", True, False, {}),
        QueueDeclared("/", "q", False, {"x-max-length": 10}),
        QueueDeclared("/", "gone", False, {}),
        Bound("/", "e", "q", False, "k", {}),
        Bound("/", "e", "e2", True, "k2", {}),
        Bound("/", "e2", "gone", False, "", {}),
        Enqueued("/", "q", 7, address_of("", "q"), header, b"b", None, True),
        Enqueued("/", "q", 9, address_of("", "q"), header, b"c", WALL + 60, True),
        Enqueued("/", "q", 11, address_of("", "q"), header, b"d", None, True),
        Delivered("/", "q", 9),
        Settled("/", "q", (7,), "ack"),
        Batch((Unbound("/", "e", "q", False, "k", {}),)),
        QueueDeleted("/", "gone"),
        ExchangeDeleted("/", "e2"),
    ]
    vhosts = replay(changes)
    vhost = vhosts["/"]
    queue = vhost.queues["q"]
    assert "gone" not in vhost.queues and "e2" not in vhost.exchanges
    assert vhost.exchanges["e"].arguments == {"alternate-exchange": "ae"}
    assert vhost.exchanges["e"].bindings == {}
    assert [m.body for m, _ in queue.messages()] == [b"c", b"d"]
    assert [d for _, d in queue.messages()] == [WALL + 60, None]
    # Up to the delivered mark, a message comes back marked redelivered.
    first = queue.get(WALL)
    second = queue.get(WALL)
    assert first is not None and second is not None
    assert (first[0].body, first[1]) == (b"c", True)
    assert (second[0].body, second[1]) == (b"d", False)
    # New ids continue above every id seen.
    assert vhost.ids.next == 12


def test_apply_refuses_to_run_on_a_vhost_that_logs() -> None:
    replica = Replica()
    replica.vhosts["/"] = VHost("/", lambda: WALL, ChangeLog())
    with pytest.raises(AssertionError):
        apply(replica, QueueDeclared("/", "q", False, {}), WALL)


# -- a scripted workload, replayed --------------------------------------------------------


def run_workload(
    seed: int, steps: int, at_step: int | None = None, captured: list[Any] | None = None
) -> tuple[Logged, list[Any]]:
    """A random but repeatable workload on a logged vhost; its changes, in order. With
    ``at_step``, ``captured`` gets (LSN, the state as changes) taken before that step."""
    rng = random.Random(seed)
    h = Logged()
    v = h.vhost
    changes: list[Any] = []
    v.declare_exchange("dlx", "fanout", durable=True)
    v.declare_exchange("jobs", "topic", durable=True)
    v.declare_exchange("chain", "direct", durable=True)
    v.bind_exchange("chain", "jobs", "x.#", {})
    queue_args = [
        {},
        {"x-message-ttl": 2000, "x-dead-letter-exchange": "dlx"},
        {"x-max-length": 5, "x-dead-letter-exchange": "dlx"},
        {"x-max-length": 3, "x-overflow": "reject-publish"},
        {
            "x-max-priority": 3,
            "x-message-ttl": 60000,
            "x-max-length": 25,
            "x-dead-letter-exchange": "dlx",
        },
    ]
    names = []
    for index, arguments in enumerate(queue_args):
        queue = v.declare_queue(f"q{index}", OWNER, h.now, durable=True, arguments=arguments)
        names.append(queue.name)
        v.bind_queue(queue.name, "jobs", f"k{index}.*", {}, OWNER)
    v.declare_queue("dead", OWNER, h.now, durable=True)
    v.bind_queue("dead", "dlx", "", {}, OWNER)
    v.bind_queue("q0", "chain", "x.y", {}, OWNER)
    v.declare_queue("transient", OWNER, h.now)
    v.bind_queue("transient", "jobs", "#", {}, OWNER)
    takers = {name: Taker(credit=0) for name in names + ["dead"]}
    for name, taker in takers.items():
        v.queues[name].add_consumer(taker, h.now)
    outstanding: dict[str, list[int]] = {name: [] for name in takers}
    for step in range(steps):
        if step == at_step and captured is not None:
            captured.append((h.log.lsn, list(state_changes({"/": v}))))
        h.now += rng.choice((0.0, 0.1, 0.5, 1.5))
        op = rng.random()
        queue_name = rng.choice(list(takers))
        queue = v.queues.get(queue_name)
        if op < 0.45:
            key = rng.choice(("k0.a", "k1.a", "k2.a", "k3.a", "k4.a", "x.y", "none"))
            h.publish(
                "jobs",
                key,
                f"m{step}".encode(),
                persistent=rng.random() < 0.8,
                **({"expiration": "700"} if rng.random() < 0.1 else {}),
                **({"priority": rng.randint(0, 5)} if rng.random() < 0.7 else {}),
            )
        elif op < 0.6 and queue is not None:
            taker = takers[queue_name]
            taker.credit += rng.randint(1, 3)
            queue.wake(taker)
            queue.drain(h.now)
            outstanding[queue_name] = [
                m.msg_id for m, _ in taker.got if m.msg_id in queue.outstanding
            ]
        elif op < 0.72 and queue is not None and outstanding[queue_name]:
            ids = outstanding[queue_name][: rng.randint(1, 3)]
            queue.ack(ids)
        elif op < 0.8 and queue is not None and outstanding[queue_name]:
            ids = outstanding[queue_name][-rng.randint(1, 2) :]
            queue.requeue(ids)
        elif op < 0.86 and queue is not None and outstanding[queue_name]:
            ids = outstanding[queue_name][:1]
            queue.reject(ids)
        elif op < 0.9 and queue is not None:
            queue.expire(h.now)
        elif op < 0.92 and queue is not None:
            queue.purge()
        elif op < 0.95:
            h.log.begin_batch()
            h.publish("jobs", "k0.z", b"tx1")
            h.publish("jobs", "k2.z", b"tx2")
            h.log.end_batch()
        elif op < 0.96:
            v.unbind_queue("q0", "chain", "x.y", {}, OWNER)
            v.bind_queue("q0", "chain", "x.y", {}, OWNER)
        if queue is not None:
            outstanding[queue_name] = [i for i in outstanding[queue_name] if i in queue.outstanding]
        changes.extend(h.changes())
    return h, changes


@pytest.mark.parametrize("seed", range(6))
def test_a_scripted_workload_replayed_gives_the_same_state(seed: int) -> None:
    h, changes = run_workload(seed, 600)
    assert len(changes) > 300
    assert snapshot(replay(changes)) == snapshot({"/": h.vhost})


@pytest.mark.parametrize("seed", range(3))
def test_a_replayed_priority_queue_hands_out_in_the_same_order(seed: int) -> None:
    """Each restored message lands in its own priority: once the original's deliveries
    are returned, both queues give the same messages in the same order."""
    h, changes = run_workload(seed, 600)
    original = h.vhost.queues["q4"]
    replayed = replay(changes)["/"].queues["q4"]
    original.requeue(list(original.outstanding))
    assert original.message_count > 3
    # Taken at the workload's start: nothing has expired yet.
    order = [m.msg_id for m, _ in iter(lambda: original.get(WALL), None)]
    assert [m.msg_id for m, _ in iter(lambda: replayed.get(WALL), None)] == order
    assert order != sorted(order), "the workload's priorities reorder the queue"


def test_deleting_everything_replays_to_nothing() -> None:
    h, changes = run_workload(99, 200)
    for name in list(h.vhost.queues):
        h.vhost.delete_queue(name, OWNER)
    for name in ("chain", "jobs", "dlx"):
        h.vhost.delete_exchange(name)
    changes.extend(h.changes())
    replayed = snapshot(replay(changes))
    assert replayed == snapshot({"/": h.vhost})
    assert replayed["/"] == {"exchanges": {}, "queues": {}, "bindings": []}


# -- the PASSIVE's view: a snapshot, then the live changes, over the wire format ----------


def runs(changes: list[Any], first_lsn: int, size: int) -> list[bytes]:
    return [
        codec.encode(first_lsn + at, changes[at : at + size]) for at in range(0, len(changes), size)
    ]


@pytest.mark.parametrize("seed", range(4))
def test_a_snapshot_then_the_live_stream_gives_the_passive_the_actives_exact_state(
    seed: int,
) -> None:
    captured: list[Any] = []
    h, changes = run_workload(seed, 500, at_step=250, captured=captured)
    snapshot_lsn, snapshot_changes = captured[0]
    # The PASSIVE held something else before (a stale store): the snapshot's Reset clears it.
    stale, _ = run_workload(seed + 100, 50)
    passive = Replica()
    replay(changes[:40], passive)
    received = runs(snapshot_changes, 0, 37) + runs(changes[snapshot_lsn:], snapshot_lsn + 1, 53)
    for run in received:
        _, decoded = codec.decode(run)
        apply_run(passive, decoded, WALL)  # as the PASSIVE does: a run at a time
    assert snapshot(passive.vhosts) == snapshot({"/": h.vhost})


@pytest.mark.parametrize("seed", range(4))
def test_applying_a_run_at_a_time_gives_what_applying_each_change_gives(seed: int) -> None:
    h, changes = run_workload(seed, 600)
    whole, each = Replica(), Replica()
    apply_run(whole, changes, WALL)
    replay(changes, each)
    assert snapshot(whole.vhosts) == snapshot(each.vhosts) == snapshot({"/": h.vhost})
    # Ids resume above every logged one (transient messages took ids nobody logged).
    assert whole.vhost("/").ids.next == each.vhost("/").ids.next > 1


def assert_written_as_the_general_encoder_writes(data: bytes, changes: list[Any]) -> None:
    """The encoder's fast paths write exactly what the general one writes, change by change."""
    general: list[bytes] = [data[: codec._HEAD.size]]
    for change in changes:
        codec._encode(change, general)
    assert b"".join(general) == data


def test_the_wire_format_round_trips_every_kind_and_refuses_garbage() -> None:
    _, changes = run_workload(7, 300)
    data = codec.encode(41, changes)
    first, decoded = codec.decode(data)
    assert first == 41 and decoded == changes
    # The fast path for messages writes exactly what the general encoder writes.
    assert_written_as_the_general_encoder_writes(data, changes)
    assert any(isinstance(c, Enqueued) and c.deadline is not None for c in changes)
    for broken in (data[:-1], data + b"x", b"\x02" + data[1:], data[:20]):
        with pytest.raises(ValueError):
            codec.decode(broken)


def test_deliveries_and_acks_of_several_queues_round_trip_as_the_general_encoder_writes() -> None:
    """The fast paths for Delivered and Settled (names once per run) write what the
    general encoder writes, read back the same, and refuse a run cut at any byte."""
    changes: list[Any] = []
    for n in range(40):
        queue = ("orders", "é-queue", "x" * 255)[n % 3]
        vhost = "/" if n % 4 else "other"
        changes.append(Delivered(vhost, queue, 1000 + n))
        if n % 5 == 0:
            changes.append(Settled(vhost, queue, (), "purged"))
        elif n % 2:
            changes.append(Settled(vhost, queue, (1000 + n,), "acked"))
        else:
            changes.append(Settled(vhost, queue, tuple(range(n, n + 7)), "rejected"))
    changes.append(Enqueued("/", "orders", 7, b"a", b"h", b"body", None, True))
    changes.append(Delivered("/", "orders", 7))
    data = codec.encode(5, changes)
    assert_written_as_the_general_encoder_writes(data, changes)
    first, decoded = codec.decode(data)
    assert first == 5 and decoded == changes
    assert all(type(a) is type(b) for a, b in zip(decoded, changes, strict=True))
    for cut in range(codec._HEAD.size, len(data)):
        with pytest.raises(ValueError):
            codec.decode(data[:cut])


def test_messages_that_share_or_change_their_address_header_and_queue_round_trip() -> None:
    """The fast paths keep what the message before had (its prefix, address and header):
    every way of changing them, empty ones included, writes what the general encoder
    writes and reads back equal; equal bytes come back as one shared object."""
    shapes = [
        ("/", "q", b"", b"", None),
        ("/", "q", b"", b"", 1.5),
        ("/", "q", b"a", b"", None),
        ("/", "q", b"a", b"h", None),
        ("/", "q", b"a", b"h", None),
        ("/", "r", b"a", b"h", None),
        ("v", "r", b"a", b"h", None),
        ("v", "r", b"b", b"h", None),
        ("v", "r", b"b", b"hh", None),
        ("v", "r", b"", b"hh", None),
    ]
    changes: list[Any] = []
    for msg_id, (vhost, queue, address, header, deadline) in enumerate(shapes, 1):
        # Fresh objects each time: equal bytes, not the same object.
        changes.append(
            Enqueued(
                vhost,
                queue,
                msg_id,
                bytes(address),
                bytes(header),
                b"%d" % msg_id,
                deadline,
                msg_id % 2 == 0,
            )
        )
        if msg_id == 7:
            changes.append(Settled("v", "r", (1,), "ack"))
    data = codec.encode(5, changes)
    assert_written_as_the_general_encoder_writes(data, changes)
    first, decoded = codec.decode(data)
    assert first == 5 and decoded == changes
    assert decoded[3].header is decoded[4].header is decoded[5].header
    assert decoded[3].address is decoded[4].address


@pytest.mark.parametrize(
    "msg_id", [0, 1, 255, 256, 2**31, 2**32 + 7, 2**62, 2**63 - 1, -1, -(2**63)]
)
def test_message_ids_and_sizes_read_in_place_round_trip_and_refuse_a_cut_run(
    msg_id: int,
) -> None:
    """The message fast path reads its ids and sizes in place, and a message without
    a deadline without making a float: every id width, both persistence flags, a deadline
    beside none, and a run cut at any byte is refused."""
    changes: list[Any] = [
        Enqueued("/", "q", msg_id, b"ad", b"h" * 300, b"b" * 70_000, None, True),
        Enqueued("/", "q", msg_id, b"ad", b"h" * 300, b"", None, False),
        Enqueued("/", "q", msg_id, b"", b"", b"x", 1_700_000_000.25, True),
        Enqueued("/", "q", msg_id, b"", b"", b"x", float("inf"), False),
    ]
    data = codec.encode(9, changes)
    assert_written_as_the_general_encoder_writes(data, changes)
    assert codec.decode(data) == (9, changes)
    for cut in range(codec._HEAD.size, len(data), 97):
        with pytest.raises(ValueError):
            codec.decode(data[:cut])
    for cut in range(len(data) - 12, len(data)):
        with pytest.raises(ValueError):
            codec.decode(data[:cut])


def test_a_run_with_a_change_this_server_cannot_apply_is_refused_whole() -> None:
    """A forged exchange of an unknown type made a store unrecoverable (KeyError at every
    start); a declared control exchange would replace the control plane."""
    for name, kind in (("evil", "bogus"), ("amq.peer", "fanout"), ("", "direct")):
        data = codec.encode(1, [ExchangeDeclared("/", name, kind, True, False, {})])
        with pytest.raises(ValueError, match="exchange"):
            codec.decode(data)
    fine = codec.encode(1, [ExchangeDeclared("/", "orders", "topic", True, False, {})])
    assert codec.decode(fine)[1][0].kind == "topic"


def test_a_queues_messages_are_a_cut_taken_when_asked_in_id_order() -> None:
    """Queue.messages(): ready, requeued and delivered messages merged in id order with
    their deadlines; what happens to the queue after the call changes nothing of it."""
    header = make_message("", "q", b"m").header
    changes: list[Any] = [QueueDeclared("/", "q", False, {})] + [
        Enqueued("/", "q", n, address_of("", "q"), header, b"m%d" % n, deadline, True)
        for n, deadline in ((1, WALL + 60), (2, None), (3, WALL + 90), (4, None))
    ]
    queue = replay(changes)["/"].queues["q"]
    first = queue.get(WALL, no_ack=False)  # 1: delivered, outstanding
    second = queue.get(WALL, no_ack=False)  # 2: delivered, then requeued
    assert first is not None and second is not None
    queue.requeue([second[0].msg_id])
    cut = queue.messages()
    queue.get(WALL, no_ack=True)  # taken after the cut: still in it
    assert [(m.msg_id, d) for m, d in cut] == [(1, WALL + 60), (2, None), (3, WALL + 90), (4, None)]
