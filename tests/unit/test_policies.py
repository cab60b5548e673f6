"""Policies in the model (amqha/core/policies.py): which policy applies to a queue, what a
queue's arguments and its policies make together (RabbitMQ 3.10's rules), limits applied
to what a queue holds only where the vhost logs, the codec and the store carrying them,
a snapshot rebuilding them before the queues they limit."""

from __future__ import annotations

import pytest

from amqha.core import codec, policies
from amqha.core.apply import apply, state_changes
from amqha.core.changes import ChangeLog, PolicyDeleted, PolicySet, Settled
from amqha.core.reserved import HIDDEN
from amqha.core.vhost import VHost
from amqha.store import Store
from tests.unit.test_changes import Replica, make_message

WALL = 1_700_000_000.0


def policy(name: str, pattern: str, definition: dict, priority: int = 0, **kw) -> PolicySet:
    return PolicySet(
        kw.get("vhost", "/"), name, pattern, kw.get("apply_to", "all"), priority, definition,
        kw.get("operator", False),
    )  # fmt: skip


def test_the_highest_priority_that_matches_and_takes_the_queue_applies() -> None:
    vhost = VHost("/", lambda: WALL)
    for change in (
        policy("wide", ".*", {"max-length": 9}),
        policy("orders", "^orders", {"max-length": 4}, priority=2),
        policy("quorum-only", "^orders", {"max-length": 1}, priority=5, apply_to="quorum_queues"),
        policy("exchanges", ".*", {"max-length": 2}, priority=9, apply_to="exchanges"),
    ):
        policies.change(vhost, change)
    classic = vhost.declare_queue("orders.eu", None, WALL, durable=True)
    quorum = vhost.declare_queue(
        "orders.q", None, WALL, durable=True, arguments={"x-queue-type": "quorum"}
    )
    other = vhost.declare_queue("invoices", None, WALL, durable=True)
    assert (classic.limits.policy, classic.limits.max_length) == ("orders", 4)
    assert (quorum.limits.policy, quorum.limits.max_length) == ("quorum-only", 1)
    assert (other.limits.policy, other.limits.max_length) == ("wide", 9)
    hidden = vhost.declare_hidden_queue("server-own", WALL)
    assert hidden.arguments[HIDDEN] and hidden.limits.policy is None


def test_a_queues_arguments_and_its_policies_merge_as_rabbitmq_merges_them() -> None:
    vhost = VHost("/", lambda: WALL)
    own = {
        "x-max-length": 3,
        "x-message-ttl": 50_000,
        "x-dead-letter-exchange": "own",
        "x-overflow": "reject-publish",
    }
    queue = vhost.declare_queue("q", None, WALL, durable=True, arguments=own)
    policies.change(
        vhost,
        policy(
            "p",
            "^q$",
            {
                "max-length": 7,  # the queue's 3 is lower: kept
                "message-ttl": 1_000,  # lower than the queue's: taken
                "dead-letter-exchange": "policy",  # the queue's own wins
                "dead-letter-routing-key": "rk",  # the queue has none: taken
                "overflow": "drop-head",  # the queue's own wins
                "delivery-limit": 5,
            },
        ),
    )
    limits = queue.limits
    assert (limits.max_length, limits.message_ttl, limits.delivery_limit) == (3, 1.0, 5)
    assert (limits.dead_letter_exchange, limits.dead_letter_routing_key) == ("own", "rk")
    assert limits.overflow == "reject-publish"
    # An operator policy caps: the lower of it and everything else.
    cap = policy("cap", ".", {"max-length": 2, "message-ttl": 90_000}, operator=True)
    policies.change(vhost, cap)
    assert (queue.limits.max_length, queue.limits.message_ttl) == (2, 1.0)
    assert (queue.limits.policy, queue.limits.operator_policy) == ("p", "cap")
    # Gone: the queue's own arguments again.
    policies.change(vhost, PolicyDeleted("/", "p", False))
    policies.change(vhost, PolicyDeleted("/", "cap", True))
    assert (queue.limits.max_length, queue.limits.message_ttl) == (3, 50.0)
    assert queue.limits.policy is None and queue.limits.effective == own


def test_new_limits_drop_what_a_queue_holds_only_on_the_server_that_serves() -> None:
    log = ChangeLog()
    leading, following = VHost("/", lambda: WALL, log), VHost("/", lambda: WALL)
    storeless = VHost("/", lambda: WALL)  # a server that serves with no store (no log)
    for vhost in (leading, following, storeless):
        queue = vhost.declare_queue("q", None, WALL, durable=True)
        for _ in range(5):
            vhost.enqueue(make_message("", "q", b"m"), (queue,), WALL)
    log.take()
    change = policy("p", "^q$", {"max-length": 2})
    policies.change(leading, change, serving=True)
    policies.change(following, change)
    policies.change(storeless, change, serving=True)
    assert leading.queues["q"].message_count == 2
    assert storeless.queues["q"].message_count == 2
    _, changes = log.take()
    assert changes[0] == change and type(changes[1]) is Settled  # the policy, then the drops
    # A PASSIVE (or a restart) sets the limit; the ACTIVE's Settled drops the messages.
    assert following.queues["q"].message_count == 5
    assert following.queues["q"].limits.max_length == 2


def test_a_policy_that_would_reach_the_control_plane_is_refused_even_in_a_run() -> None:
    bad = policy("p", ".", {"dead-letter-exchange": "amq.peer"})
    with pytest.raises(policies.PolicyError) as refused:
        policies.check(bad)
    assert refused.value.status == 403
    with pytest.raises(ValueError, match="reserved"):
        codec.decode(codec.encode(1, [bad]))
    good = [policy("p", "^a", {"max-length": 1}), PolicyDeleted("/", "p", True)]
    assert codec.decode(codec.encode(4, good)) == (4, good)


def test_a_snapshot_and_the_store_give_policies_back_before_their_queues(tmp_path) -> None:
    source = Replica()
    vhost = source.vhost("/")
    vhost.declare_queue("q", None, WALL, durable=True)
    changes = [
        policy("p", "^q$", {"max-length": 1}),
        policy("cap", ".", {"expires": 5000}, operator=True),
    ]
    for change in changes:
        policies.change(vhost, change)
    rebuilt = Replica()
    for change in state_changes(source.vhosts, access=source.access):
        apply(rebuilt, change, WALL)
    queue = rebuilt.vhosts["/"].queues["q"]
    assert (queue.limits.max_length, queue.limits.expires) == (1, 5.0)
    path = tmp_path / "amqha.db"
    store = Store.open(path)
    store.submit(1, list(state_changes(source.vhosts, access=source.access)))
    store.close()
    store = Store.open(path)
    try:
        recovered = Replica()
        for change in store.recover():
            apply(recovered, change, WALL)
    finally:
        store.close()
    queue = recovered.vhosts["/"].queues["q"]
    assert (queue.limits.policy, queue.limits.operator_policy) == ("p", "cap")
