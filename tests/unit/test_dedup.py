"""Message deduplication in the core (``amqha.core.dedup``): the plugin's behaviours one by
one (an exchange's cache: a copy is not routed, TTL expiry and a message's own TTL let
one through again, a full cache evicts its oldest, no header no check; a queue's: a copy
is not enqueued while its first is in the queue, acked, rejected or dropped it passes;
every header type), amqha's ``x-deduplication-by: message-id`` (keys outlive the message),
bad arguments refused naming them with nothing made, and the keys going where the state
goes: a follower applying the change stream, a snapshot and the wire drop the same copies;
a copy's confirm waits for what came before it."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from pamqp import commands, exceptions
from pamqp.header import ContentHeader

from amqha.core import codec
from amqha.core.access import Access
from amqha.core.apply import apply_run, state_changes
from amqha.core.changes import ChangeLog, DedupSeen
from amqha.core.dedup import DedupBytes
from amqha.core.message import Message
from amqha.core.vhost import VHost
from amqha.wire import address_of

NOW = 1_700_000_000.0
OWNER = object()
DEDUP = "x-message-deduplication"


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class State:
    def __init__(self, clock: Clock) -> None:
        self.vhosts: dict[str, VHost] = {}
        self.access = Access()
        self.clock = clock

    def vhost(self, name: str) -> VHost:
        if name not in self.vhosts:
            self.vhosts[name] = VHost(name, self.clock)
        return self.vhosts[name]


def message(key: Any = None, message_id: str | None = None, **headers: Any) -> Message:
    if key is not None or "none" in headers:
        headers.pop("none", None)
        headers["x-deduplication-header"] = key
    props = commands.Basic.Properties(
        headers=headers or None, message_id=message_id, delivery_mode=2
    )
    header = ContentHeader(0, 1, props).marshal()
    return Message(address_of("", "q"), header, b"m")


class Pair:
    """A leading vhost that logs, and a following one that applies what it logs."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.log = ChangeLog()
        self.vhost = VHost("/", self.clock, self.log)
        self.follower = State(self.clock)

    def publish(self, exchange: str, msg: Message, routing_key: str = "q") -> int:
        vhost = self.vhost
        ex = vhost.get_exchange(exchange)
        queues = vhost.route(ex, routing_key, msg)
        return vhost.enqueue(msg, queues, self.clock.now) if queues else vhost.unrouted_wait(ex)

    def follow(self) -> VHost:
        _, changes = self.log.take()
        apply_run(self.follower, changes, self.clock.now)
        return self.follower.vhost("/")


@pytest.fixture
def pair() -> Pair:
    return Pair()


def count(vhost: VHost, name: str = "q") -> int:
    return vhost.queues[name].message_count


def dedup_exchange(pair: Pair, **arguments: Any) -> None:
    pair.vhost.declare_exchange(
        "dx", DEDUP, durable=True, arguments={"x-cache-size": 10, **arguments}
    )
    pair.vhost.declare_queue("q", None, NOW, durable=True)
    pair.vhost.bind_queue("q", "dx", "#", {}, None)


# -- the exchange ---------------------------------------------------------------------


def test_an_exchange_routes_a_header_once_and_a_message_without_one_always(pair: Pair) -> None:
    dedup_exchange(pair)
    for _ in range(5):
        pair.publish("dx", message("deduplicate-this"))
    assert count(pair.vhost) == 1
    pair.publish("dx", message())
    pair.publish("dx", message())
    assert count(pair.vhost) == 3
    assert pair.vhost.exchanges["dx"].dedup.counters.hits == 4


def test_the_exchange_ttl_and_a_messages_own_ttl_let_a_key_through_again(pair: Pair) -> None:
    dedup_exchange(pair, **{"x-cache-ttl": 1000})
    pair.publish("dx", message("this"))
    pair.clock.now += 0.5
    pair.publish("dx", message("this"))
    assert count(pair.vhost) == 1
    pair.clock.now += 0.6  # 1.1 s after the first
    pair.publish("dx", message("this"))
    assert count(pair.vhost) == 2
    pair.publish("dx", message("that", **{"x-cache-ttl": 200}))
    pair.clock.now += 0.3
    pair.publish("dx", message("that", **{"x-cache-ttl": 200}))
    assert count(pair.vhost) == 4


def test_a_full_cache_evicts_its_oldest_key(pair: Pair) -> None:
    dedup_exchange(pair, **{"x-cache-size": 1})
    for key in ("this", "that", "this"):
        pair.publish("dx", message(key))
    assert count(pair.vhost) == 3
    assert pair.vhost.exchanges["dx"].dedup.counters.evictions == 2


def test_the_exchange_is_a_fanout(pair: Pair) -> None:
    dedup_exchange(pair)
    pair.vhost.declare_queue("other", None, NOW, durable=True)
    pair.vhost.bind_queue("other", "dx", "some.key", {}, None)
    pair.publish("dx", message("k"), routing_key="unrelated")
    assert count(pair.vhost) == 1 and count(pair.vhost, "other") == 1


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({}, "x-cache-size"),
        ({"x-cache-size": 0}, "x-cache-size"),
        ({"x-cache-size": "foo"}, "x-cache-size"),
        ({"x-cache-size": 10, "x-cache-ttl": -1}, "x-cache-ttl"),
        ({"x-cache-size": 10, "x-cache-ttl": "bar"}, "x-cache-ttl"),
        ({"x-cache-size": 10, "x-cache-persistence": "tape"}, "x-cache-persistence"),
    ],
)
def test_a_bad_exchange_argument_is_refused_naming_it(arguments: dict, named: str) -> None:
    vhost = VHost("/", Clock())
    with pytest.raises(exceptions.AMQPPreconditionFailed, match=named):
        vhost.declare_exchange("dx", DEDUP, arguments=arguments)
    assert "dx" not in vhost.exchanges


def test_numeric_strings_and_both_persistences_are_taken_as_by_the_plugin() -> None:
    vhost = VHost("/", Clock())
    for i, persistence in enumerate(("memory", "disk")):
        arguments = {
            "x-cache-size": "10",
            "x-cache-ttl": "1000",
            "x-cache-persistence": persistence,
        }
        exchange = vhost.declare_exchange(f"dx{i}", DEDUP, arguments=arguments)
        assert exchange.dedup.settings.size == 10 and exchange.dedup.settings.ttl == 1.0
        assert exchange.dedup.settings.persistent is (persistence == "disk")


# -- the queue ------------------------------------------------------------------------


def dedup_queue(pair: Pair, **arguments: Any) -> Any:
    return pair.vhost.declare_queue(
        "q", None, NOW, durable=True, arguments={DEDUP: True, **arguments}
    )


@pytest.mark.parametrize("key", ["deduplicate-this", 42, 4.2, None])
def test_a_queue_holds_one_message_per_header_value_of_any_type(pair: Pair, key: Any) -> None:
    queue = dedup_queue(pair)
    pair.publish("", message(key, none=True) if key is None else message(key))
    pair.publish("", message(key, none=True) if key is None else message(key))
    assert queue.message_count == 1
    pair.publish("", message())
    pair.publish("", message())
    assert queue.message_count == 3


def test_42_and_the_string_42_are_different_keys(pair: Pair) -> None:
    queue = dedup_queue(pair)
    pair.publish("", message(42))
    pair.publish("", message("42"))
    assert queue.message_count == 2


def test_a_queue_takes_a_key_again_once_its_message_is_acked(pair: Pair) -> None:
    queue = dedup_queue(pair)
    pair.publish("", message("k"))
    fetched, _ = queue.get(NOW, no_ack=False)
    pair.publish("", message("k"))  # delivered, not acked: still in the queue
    assert queue.message_count == 0 and queue.unacked == 1
    queue.ack([fetched.msg_id])
    pair.publish("", message("k"))
    assert queue.message_count == 1


def test_a_rejected_or_dropped_message_lets_its_key_in_again(pair: Pair) -> None:
    queue = dedup_queue(pair, **{"x-max-length": 1})
    pair.publish("", message("this"))
    pair.publish("", message("that"))  # drops "this" (drop-head)
    pair.publish("", message("this"))
    assert queue.message_count == 1
    fetched, _ = queue.get(NOW, no_ack=False)
    assert fetched.headers()["x-deduplication-header"] == "this"
    queue.reject([fetched.msg_id])
    pair.publish("", message("this"))
    assert queue.message_count == 1


def test_stale_keys_do_not_pile_up(pair: Pair) -> None:
    queue = dedup_queue(pair)
    for i in range(5000):
        pair.publish("", message(f"k{i}"))
        fetched, _ = queue.get(NOW, no_ack=True)
    assert len(queue.dedup) <= 1025


def test_by_message_id_the_key_outlives_the_message_until_its_ttl(pair: Pair) -> None:
    queue = dedup_queue(
        pair, **{"x-deduplication-by": "message-id", "x-cache-size": 100, "x-cache-ttl": 1000}
    )
    pair.publish("", message(message_id="m1"))
    queue.get(NOW, no_ack=True)  # consumed
    pair.publish("", message(message_id="m1"))
    assert queue.message_count == 0
    pair.publish("", message("header-is-not-the-key", message_id="m2"))
    pair.publish("", message("header-is-not-the-key", message_id="m3"))
    assert queue.message_count == 2
    pair.clock.now += 1.5
    pair.publish("", message(message_id="m1"))
    assert queue.message_count == 3


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({DEDUP: "yes"}, DEDUP),
        ({DEDUP: True, "x-deduplication-by": "sender"}, "x-deduplication-by"),
        ({DEDUP: True, "x-cache-size": 10}, "x-cache-size"),
        ({"x-deduplication-by": "message-id"}, "x-cache-size"),
        ({"x-deduplication-by": "message-id", "x-cache-size": 0}, "x-cache-size"),
        ({"x-deduplication-by": "message-id", "x-cache-size": 5, "x-cache-ttl": -5}, "x-cache-ttl"),
        ({DEDUP: False, "x-deduplication-by": "message-id"}, "x-deduplication-by"),
    ],
)
def test_a_bad_queue_argument_is_refused_naming_it(arguments: dict, named: str) -> None:
    vhost = VHost("/", Clock())
    with pytest.raises(exceptions.AMQPPreconditionFailed, match=named):
        vhost.declare_queue("q", OWNER, NOW, durable=True, arguments=arguments)
    assert "q" not in vhost.queues


def test_the_cache_counts_against_memory() -> None:
    gc.collect()
    vhost = VHost("/", Clock())
    before = DedupBytes.held
    vhost.declare_exchange("dx", DEDUP, arguments={"x-cache-size": 1000})
    queues = ()
    for i in range(100):
        vhost.route(vhost.exchanges["dx"], "", message(f"key-{i}"))
    assert DedupBytes.held - before >= 100 * 160
    del vhost.exchanges["dx"], queues
    gc.collect()
    assert DedupBytes.held == before


# -- where the state goes ---------------------------------------------------------------


def test_a_follower_drops_the_copies_its_leader_would(pair: Pair) -> None:
    dedup_exchange(pair)
    pair.vhost.declare_queue(
        "qm",
        None,
        NOW,
        durable=True,
        arguments={"x-deduplication-by": "message-id", "x-cache-size": 10},
    )
    pair.vhost.declare_queue("qh", None, NOW, durable=True, arguments={DEDUP: True})
    pair.publish("dx", message("a"))
    pair.publish("", message(message_id="m"), routing_key="qm")
    pair.vhost.queues["qm"].get(NOW, no_ack=True)  # gone from the queue, not the cache
    pair.publish("", message("h"), routing_key="qh")
    follower = pair.follow()
    # The follower now leads: a copy sent again is dropped there too.
    follower.set_log(ChangeLog())
    for name, msg, key in (
        ("dx", message("a"), "q"),
        ("", message(message_id="m"), "qm"),
        ("", message("h"), "qh"),
    ):
        exchange = follower.get_exchange(name)
        queues = follower.route(exchange, key, msg)
        if queues:
            follower.enqueue(msg, queues, NOW)
    assert count(follower, "q") == 1 and count(follower, "qm") == 0 and count(follower, "qh") == 1


def test_a_snapshot_and_the_wire_carry_the_caches(pair: Pair) -> None:
    dedup_exchange(pair, **{"x-cache-ttl": 60_000})
    for key in ("a", "b", "c"):
        pair.publish("dx", message(key))
    changes = list(state_changes({"/": pair.vhost}))
    seen = [c for c in changes if type(c) is DedupSeen]
    assert [c.key for c in seen] == [b"sa", b"sb", b"sc"] and [c.seq for c in seen] == [1, 2, 3]
    assert all(c.expires == NOW + 60 for c in seen)
    _, decoded = codec.decode(codec.encode(1, changes))
    assert decoded == changes
    joined = State(pair.clock)
    apply_run(joined, decoded, NOW)
    assert list(joined.vhost("/").exchanges["dx"].dedup.entries) == [b"sa", b"sb", b"sc"]


def test_a_copys_confirm_waits_for_what_came_before_it(pair: Pair) -> None:
    dedup_queue(pair)
    first = pair.publish("", message("k"))
    assert first == pair.log.sync_lsn > 0
    pair.vhost.declare_queue("plain", None, NOW, durable=True)  # more wiring after it
    copy = pair.publish("", message("k"))
    assert copy == pair.log.sync_lsn > first
    other = Pair()
    dedup_exchange(other)
    other.publish("dx", message("x"))
    other.vhost.declare_queue("plain", None, NOW, durable=True)
    assert other.publish("dx", message("x")) == other.log.sync_lsn > 0


def test_the_store_keeps_persistent_keys_the_last_of_each_owner_only(tmp_path) -> None:
    from amqha.core.changes import ExchangeDeclared, ExchangeDeleted, QueueDeclared
    from amqha.store import Store

    path = tmp_path / "store" / "amqha.db"
    args = {"x-cache-size": 3, "x-cache-persistence": "disk"}
    store = Store.open(path)
    store.submit(1, [ExchangeDeclared("/", "dx", DEDUP, False, False, args)])
    store.submit(2, [QueueDeclared("/", "gone", False, {})])
    keys = [DedupSeen("/", "x", "dx", f"k{i}".encode(), None, i, 3, True) for i in range(1, 6)]
    store.submit(3, keys[:2])
    store.submit(5, keys[2:])
    store.submit(8, [DedupSeen("/", "x", "dx", b"memory-only", None, 6, 3, False)])
    store.submit(9, [DedupSeen("/", "q", "gone", b"g", None, 1, 3, True)])
    store.submit(10, [ExchangeDeclared("/", "other", DEDUP, False, False, args)])
    store.submit(11, [DedupSeen("/", "x", "other", b"o", None, 1, 3, True)])
    store.submit(12, [ExchangeDeleted("/", "other")])
    store.close()
    store = Store.open(path)
    try:
        got = [c for c in store.recover() if type(c) is DedupSeen]
    finally:
        store.close()
    # Kept: the last 3 of dx by seq (the memory-only key is not stored); a queue's keys
    # live with no queue row until it is deleted, a deleted exchange's go with it.
    assert [(c.owner, c.key, c.seq) for c in got] == [
        ("gone", b"g", 1),
        ("dx", b"k3", 3),
        ("dx", b"k4", 4),
        ("dx", b"k5", 5),
    ]


def test_a_version_3_store_gains_the_dedup_table_at_open(tmp_path) -> None:
    import sqlite3

    from amqha.core.changes import ExchangeDeclared
    from amqha.store import Store
    from amqha.store_file import SCHEMA_VERSION

    path = tmp_path / "amqha.db"
    declared = ExchangeDeclared("/", "dx", DEDUP, False, False, {"x-cache-size": 3})
    store = Store.open(path)
    store.submit(1, [declared])
    store.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE dedup")
    db.execute("UPDATE meta SET value = 3 WHERE key = 'version'")
    db.commit()
    db.close()
    key = DedupSeen("/", "x", "dx", b"k", None, 1, 3, True)
    store = Store.open(path)
    store.submit(2, [key])
    store.close()
    store = Store.open(path)
    try:
        assert list(store.recover()) == [declared, key._replace(keep=0)]
    finally:
        store.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key = 'version'").fetchall() == [
        (SCHEMA_VERSION,)
    ]
    db.close()
