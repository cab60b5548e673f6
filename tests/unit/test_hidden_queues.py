"""Hidden queues and forwards in the pure core (docs/federation.md, "The link", 6): no
client route reaches a hidden queue, a forward copies what an exchange routes onto it
unless the path rule refuses, its copy is in the confirm path, it is stored and replicated
hidden, and an in-process consumer drains it."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands, exceptions
from pamqp.header import ContentHeader

from amqha.core import names
from amqha.core.apply import apply, snapshot
from amqha.core.arguments import REPLICATE
from amqha.core.changes import ChangeLog, QueueDeclared
from amqha.core.message import Message, MessageIds
from amqha.core.queue import Consumer, Queue
from amqha.core.reserved import HIDDEN
from amqha.core.vhost import VHost
from amqha.wire import address_of
from tests.unit.test_changes import Replica

WALL = 1_700_000_000.0
OWNER = object()
LOCAL, UPSTREAM = "london", "central"
FORWARD = names.forward_queue_name("rpc", UPSTREAM)


def message(exchange: str, key: str, body: bytes = b"m", path: list[str] | None = None) -> Message:
    headers = None if path is None else {names.PATH_HEADER: path}
    properties = commands.Basic.Properties(delivery_mode=2, headers=headers)
    header = ContentHeader(0, len(body), properties).marshal()
    return Message(address_of(exchange, key), header, body)


class Node:
    """A vhost that logs, with one forwarded exchange ``rpc`` and a bound queue ``app``."""

    def __init__(self, max_hops: int = 1) -> None:
        self.log = ChangeLog()
        self.vhost = VHost("/", lambda: WALL, self.log, MessageIds(), global_name=LOCAL)
        self.vhost.declare_exchange("rpc", "direct", durable=True)
        self.app = self.vhost.declare_queue("app", OWNER, WALL, durable=True)
        self.vhost.bind_queue("app", "rpc", "k", {}, OWNER)
        self.hidden = self.vhost.set_forward("rpc", FORWARD, UPSTREAM, LOCAL, max_hops, WALL)

    def publish(self, exchange: str, key: str, **kwargs: Any) -> tuple[Queue, ...]:
        sent = message(exchange, key, **kwargs)
        queues = self.vhost.route(self.vhost.get_exchange(exchange), key, sent)
        if queues:
            self.vhost.enqueue(sent, queues, WALL)
        return queues


@pytest.fixture
def node() -> Node:
    return Node()


class Drain(Consumer):
    """An in-process consumer (``core.queue.Consumer``), as a link's drain is: it takes
    what it has credit for and acks by id once the far side has it."""

    def __init__(self, credit: int) -> None:
        super().__init__("drain", exclusive=True)
        self.credit = credit
        self.got: list[tuple[int, bytes]] = []

    def ready(self) -> bool:
        return self.credit > 0

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        self.credit -= 1
        self.got.append((message.msg_id, message.body))


# -- names ------------------------------------------------------------------------------


def test_a_server_named_queue_carries_the_global_name() -> None:
    vhost = VHost("/", lambda: WALL, global_name="eu-1")
    queue = vhost.declare_queue("", OWNER, WALL, exclusive=True)
    prefix = "amq.gen-eu-1-"
    assert queue.name.startswith(prefix) and len(queue.name) > len(prefix) + 16
    assert vhost.declare_queue("", OWNER, WALL).name != queue.name


# -- no client route reaches a hidden queue ------------------------------------------------


def test_the_forward_queue_is_hidden_durable_and_replicated(node: Node) -> None:
    queue = node.hidden
    assert queue.name == FORWARD and queue.durable and queue.replicated
    assert queue.exclusive_owner is None
    assert node.vhost.hidden_queue(FORWARD) is queue
    assert node.vhost.hidden_queue("app") is None
    assert [q.name for q in node.vhost.visible_queues()] == ["app"]
    assert FORWARD in node.vhost.queues  # the server's own code finds it


@pytest.mark.parametrize(
    "route",
    [
        "declare",
        "declare_passive",
        "declare_durable",
        "get",
        "bind",
        "unbind",
        "delete",
        "delete_if_empty",
    ],
)
def test_every_client_route_to_a_hidden_queue_is_403(node: Node, route: str) -> None:
    vhost = node.vhost
    attempts = {
        "declare": lambda: vhost.declare_queue(FORWARD, OWNER, WALL),
        "declare_passive": lambda: vhost.declare_queue(FORWARD, OWNER, WALL, passive=True),
        "declare_durable": lambda: vhost.declare_queue(
            FORWARD, None, WALL, durable=True, arguments={HIDDEN: True, REPLICATE: True}
        ),
        "get": lambda: vhost.get_queue(FORWARD, OWNER),
        "bind": lambda: vhost.bind_queue(FORWARD, "amq.direct", "k", {}, OWNER),
        "unbind": lambda: vhost.unbind_queue(FORWARD, "rpc", "k", {}, OWNER),
        "delete": lambda: vhost.delete_queue(FORWARD, OWNER),
        "delete_if_empty": lambda: vhost.delete_queue(FORWARD, None, if_empty=True),
    }
    with pytest.raises(exceptions.AMQPAccessRefused, match="hidden"):
        attempts[route]()
    assert vhost.hidden_queue(FORWARD) is node.hidden
    assert not any(node.hidden in e.by_destination for e in vhost.exchanges.values())


def test_a_client_cannot_make_a_hidden_queue_of_its_own(node: Node) -> None:
    with pytest.raises(exceptions.AMQPAccessRefused, match=HIDDEN):
        node.vhost.declare_queue("mine", OWNER, WALL, durable=True, arguments={HIDDEN: True})
    assert "mine" not in node.vhost.queues


def test_the_default_exchange_and_dead_letters_do_not_reach_it(node: Node) -> None:
    vhost = node.vhost
    assert node.publish("", FORWARD) == ()
    # Queues whose dead letters go to the default exchange, keyed by the hidden name and,
    # to show the route works, by a visible one.
    for name, target in (("dies", FORWARD), ("dies-visibly", "app")):
        vhost.declare_queue(
            name,
            OWNER,
            WALL,
            arguments={
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": target,
                "x-message-ttl": 0,
            },
        )
        node.publish("", name)
        vhost.queues[name].expire(WALL + 1)
        assert vhost.queues[name].message_count == 0
    assert node.app.message_count == 1
    assert node.hidden.message_count == 0


def test_a_client_queue_holding_the_name_keeps_it_and_the_forward_is_refused() -> None:
    vhost = VHost("/", lambda: WALL, global_name=LOCAL)
    vhost.declare_exchange("rpc", "direct")
    # A client cannot take a federation name at all (docs/federation.md, "Buffer queues")...
    with pytest.raises(exceptions.AMQPAccessRefused, match="federation buffer queue"):
        vhost.declare_queue(FORWARD, OWNER, WALL, durable=True)
    # ...and one made otherwise (an import, an older version's) keeps it.
    squatter = vhost.declare_queue(FORWARD, None, WALL, durable=True)
    with pytest.raises(ValueError, match="not hidden"):
        vhost.set_forward("rpc", FORWARD, UPSTREAM, LOCAL, 1)
    assert vhost.queues[FORWARD] is squatter and not vhost.hidden and not vhost.forwards


# -- forwarding ---------------------------------------------------------------------------


def test_a_message_routed_through_the_exchange_is_also_forwarded(node: Node) -> None:
    assert set(node.publish("rpc", "k")) == {node.app, node.hidden}
    # Unmatched locally: it still goes upstream.
    assert node.publish("rpc", "other") == (node.hidden,)
    assert node.hidden.message_count == 2 and node.app.message_count == 1
    # Another exchange is not forwarded.
    assert node.publish("amq.direct", "k") == ()


def test_through_an_exchange_to_exchange_binding_too(node: Node) -> None:
    node.vhost.declare_exchange("front", "fanout")
    node.vhost.bind_exchange("rpc", "front", "", {})
    assert set(node.publish("front", "k")) == {node.app, node.hidden}


@pytest.mark.parametrize(
    ("path", "max_hops", "forwarded"),
    [
        (None, 1, True),
        ([], 1, True),
        ([UPSTREAM], 1, False),  # it came down from there: not sent back
        (["paris"], 1, False),  # paris -> london -> central is two hops
        (["paris"], 2, True),
        (["paris", UPSTREAM], 5, False),
    ],
)
def test_the_path_rule_decides(path: list[str] | None, max_hops: int, forwarded: bool) -> None:
    node = Node(max_hops=max_hops)
    queues = node.publish("rpc", "k", path=path)
    assert (node.hidden in queues) is forwarded
    assert node.app in queues


def test_removing_the_forward_keeps_the_queue_and_what_it_holds(node: Node) -> None:
    node.publish("rpc", "k")
    node.vhost.remove_forward("rpc", FORWARD)
    assert node.publish("rpc", "k") == (node.app,)
    assert node.vhost.hidden_queue(FORWARD) is node.hidden and node.hidden.message_count == 1
    assert node.vhost.remove_hidden_queue(FORWARD) == 1
    assert FORWARD not in node.vhost.queues and not node.vhost.hidden


def test_set_forward_again_replaces_and_finds_the_same_queue(node: Node) -> None:
    again = node.vhost.set_forward("rpc", FORWARD, UPSTREAM, LOCAL, 3)
    assert again is node.hidden and len(node.vhost.forwards["rpc"]) == 1
    assert node.vhost.forwards["rpc"][0].max_hops == 3


# -- confirms, the store, replication --------------------------------------------------------


def test_the_forwarded_copy_is_in_the_confirm_path(node: Node) -> None:
    """A publish reaching only the hidden queue still needs the store (sync_lsn moves), so
    its confirm waits for the copy to be safe, as for any durable queue."""
    node.log.take()
    before = node.log.sync_lsn
    assert node.publish("rpc", "unbound-key") == (node.hidden,)
    assert node.log.sync_lsn > before
    enqueued = [c for c in node.log.take()[1] if getattr(c, "queue", None) == FORWARD]
    assert len(enqueued) == 1


def test_stored_and_replicated_it_comes_back_hidden(node: Node) -> None:
    node.publish("rpc", "k")
    changes = node.log.take()[1]
    declared = [c for c in changes if isinstance(c, QueueDeclared) and c.name == FORWARD]
    assert declared and declared[0].arguments[HIDDEN] is True

    replica = Replica()
    for change in changes:
        apply(replica, change, WALL)
    copy = replica.vhosts["/"]
    assert copy.hidden == {FORWARD}
    assert copy.hidden_queue(FORWARD) is not None
    assert copy.hidden_queue(FORWARD).message_count == 1  # type: ignore[union-attr]
    with pytest.raises(exceptions.AMQPAccessRefused):
        copy.get_queue(FORWARD)
    assert snapshot(replica.vhosts) == snapshot({"/": node.vhost})


# -- an in-process consumer ------------------------------------------------------------------


def test_an_in_process_consumer_drains_it_and_acks_by_id(node: Node) -> None:
    for _ in range(3):
        node.publish("rpc", "k")
    drain: Consumer = Drain(credit=2)
    queue = node.hidden
    queue.add_consumer(drain, WALL)
    queue.drain(WALL)
    assert isinstance(drain, Drain) and len(drain.got) == 2
    assert queue.message_count == 1 and queue.unacked == 2
    queue.ack([msg_id for msg_id, _ in drain.got])
    drain.credit = 5
    queue.wake(drain)
    queue.drain(WALL)
    assert len(drain.got) == 3 and queue.message_count == 0
    node.publish("rpc", "k")  # a consumer with credit takes a new one as it arrives
    assert len(drain.got) == 4
    assert node.app.message_count == 4  # the local copies are untouched
