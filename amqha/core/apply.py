"""Rebuilding state from the change stream: ``apply`` and ``snapshot``.

Owns: the one function that turns a change value back into state, used on restart
(the store's changes), by the PASSIVE (the ACTIVE's changes) and by tests (a scripted
workload's changes, replayed, give the same state); and ``snapshot``, the canonical
form of the durable state two servers compare.

Applying never emits: the vhosts it writes to must have no ``ChangeLog`` attached
(a server attaches its log once recovery is done). See docs/durability.md.

Must not know: the store, the loop, sockets.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from . import dedup, policies
from .access import Access
from .changes import (
    ACCESS_CHANGES,
    Batch,
    Bound,
    Change,
    DedupSeen,
    Delivered,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    PolicyDeleted,
    PolicySet,
    QueueDeclared,
    QueueDeleted,
    Redelivered,
    Reset,
    Settled,
    Unbound,
    VhostDeleted,
    VhostSet,
)
from .dedup import SeenCache
from .message import Message
from .queue import Queue
from .routing import Exchange
from .vhost import VHost

# A set, not the tuple: every Settled and Delivered a PASSIVE applies passes this test.
_ACCESS_KINDS = frozenset(ACCESS_CHANGES)


class State(Protocol):
    """Where changes are applied: the vhosts by name, made on first use (a broker), and
    the run-time users, vhosts and permissions (``access``)."""

    vhosts: dict[str, VHost]
    access: Access

    def vhost(self, name: str) -> VHost: ...


def apply(state: State, change: Change, now: float) -> None:
    """Apply one change to ``state``."""
    if isinstance(change, Batch):
        for inner in change.changes:
            apply(state, inner, now)
        return
    if isinstance(change, Reset):
        for vhost in state.vhosts.values():
            reset(vhost)
        state.access.reset()
        return
    if type(change) is Enqueued:
        apply_run(state, [change], now)  # the one place a message is put back
        return
    if type(change) in _ACCESS_KINDS:
        state.access.apply(change)
        if type(change) is VhostSet:
            state.vhost(change.vhost)  # type: ignore[union-attr]
        elif type(change) is VhostDeleted:
            # Its queues and exchanges were deleted by the changes before this one.
            state.vhosts.pop(change.vhost, None)  # type: ignore[union-attr]
        return
    vhost = state.vhost(change.vhost)  # type: ignore[union-attr]
    assert vhost.log is None, "apply() on a vhost that logs would emit the change again"
    match change:
        case Settled():
            queue = vhost.queues.get(change.queue)
            if queue is not None:
                queue.discard(change.msg_ids)
        case Delivered():
            queue = vhost.queues.get(change.queue)
            if queue is not None:
                queue.mark_delivered(change.msg_id)
        case PolicySet() | PolicyDeleted():
            policies.change(vhost, change)
        case DedupSeen():
            owner: Any = (
                vhost.exchanges.get(change.owner)
                if change.kind == "x"
                else vhost.queues.get(change.owner)
            )
            memory = owner.dedup if owner is not None else None
            if type(memory) is SeenCache:
                memory.take(change.key, change.expires, change.seq)
        case Redelivered():
            queue = vhost.queues.get(change.queue)
            if queue is not None and queue.counter is not None:
                queue.counter.count_delivery(queue, change.msg_id, change.deliveries)
        case QueueDeclared():
            vhost.restore_queue(change.name, change.auto_delete, change.arguments, now)
        case QueueDeleted():
            queue = vhost.queues.get(change.name)
            if queue is not None:
                vhost.remove_queue(queue)
        case ExchangeDeclared():
            vhost.restore_exchange(
                change.name, change.kind, change.auto_delete, change.internal, change.arguments
            )
        case ExchangeDeleted():
            exchange = vhost.exchanges.get(change.name)
            if exchange is not None:
                vhost.remove_exchange(exchange)
        case Bound():
            vhost.restore_binding(
                change.source,
                change.destination,
                change.to_exchange,
                change.routing_key,
                change.arguments,
            )
        case Unbound():
            vhost.restore_unbinding(
                change.source,
                change.destination,
                change.to_exchange,
                change.routing_key,
                change.arguments,
            )
        case _:
            raise ValueError(f"not a change: {change!r}")


def apply_run(state: State, changes: list[Change], now: float) -> None:
    """Apply a run of changes in order: the same state as ``apply`` on each, with the
    hot kind, ``Enqueued``, put on its queue without dispatch (the PASSIVE applies every
    message the ACTIVE takes; recovery every stored one), and ``Settled`` and
    ``Delivered`` without ``apply``'s dispatch either."""
    queues: dict[tuple[str, str], Any] = {}  # (vhost, queue) -> (queue or None, vhost)
    last_vhost = last_queue = None  # the names of the message before, and its found
    found: Any = None
    for change in changes:
        kind = type(change)
        if kind is not Enqueued and kind is not Settled and kind is not Delivered:
            apply(state, change, now)
            queues.clear()  # a declare or delete may have changed what a name means
            last_vhost = last_queue = None
            continue
        # The hot kinds: a message, a consumer's acks, its turns' delivery marks (none
        # changes what a name means), with the queue looked up once for a row of them.
        c: Any = change
        vhost_name, queue_name = c[0], c[1]
        if vhost_name is not last_vhost or queue_name is not last_queue:
            key = (vhost_name, queue_name)
            found = queues.get(key)
            if found is None:
                vhost = state.vhost(vhost_name)
                assert vhost.log is None, "apply() on a vhost that logs would emit the change again"
                found = queues[key] = (vhost.queues.get(queue_name), vhost.ids)
            last_vhost, last_queue = vhost_name, queue_name
        if kind is not Enqueued:
            if found[0] is not None:
                if kind is Settled:
                    found[0].discard(c[2])
                else:
                    found[0].mark_delivered(c[2])
            continue
        queue, ids = found
        if queue is not None:
            message = Message(c.address, c.header, c.body, None, c.msg_id)
            queue.restore(message, c.deadline)
            if queue.dedup is not None:
                dedup.restored(queue, message)
        if c.msg_id >= ids.next:
            ids.seen(c.msg_id)


def reset(vhost: VHost) -> None:
    """Drop the vhost's durable state: durable exchanges, durable queues (with their
    messages and bindings). What follows a ``Reset`` rebuilds it."""
    assert vhost.log is None, "reset() on a vhost that logs"
    vhost.policies.clear()
    for queue in list(vhost.queues.values()):
        if queue.durable and queue.exclusive_owner is None:
            vhost.remove_queue(queue)
    for exchange in list(vhost.exchanges.values()):
        if _stored_exchange(exchange):
            vhost.remove_exchange(exchange)


def _stored_exchange(exchange: Exchange) -> bool:
    return (
        exchange.durable
        and not exchange.control
        and bool(exchange.name)
        and not exchange.name.startswith("amq.")
    )


def state_changes(
    vhosts: dict[str, VHost], replicated_only: bool = True, access: Access | None = None
) -> Iterator[Change]:
    """The durable state as changes, from a ``Reset``: applied to any state, they give
    this one (the snapshot a joining PASSIVE receives), the run-time users, vhosts and
    permissions of ``access`` first. What it reads is fixed when the generator starts:
    later changes to the state do not leak into it."""
    wiring: list[Change] = [Reset()]
    if access is not None:
        wiring += access.changes()
    contents: list[
        tuple[str, str, int, Iterator[tuple[Message, float | None]], list[tuple[int, int]]]
    ] = []
    caches: list[DedupSeen] = []
    for name, vhost in vhosts.items():
        wiring += vhost.policies.changes()  # before the queues they give limits to
        wanted = {
            queue.name: queue
            for queue in vhost.queues.values()
            if queue.durable
            and queue.exclusive_owner is None
            and (queue.replicated or not replicated_only)
        }
        for exchange in vhost.exchanges.values():
            if _stored_exchange(exchange):
                wiring.append(
                    ExchangeDeclared(
                        name,
                        exchange.name,
                        exchange.kind,
                        exchange.auto_delete,
                        exchange.internal,
                        dict(exchange.arguments),
                    )
                )
        for queue in wanted.values():
            wiring.append(QueueDeclared(name, queue.name, queue.auto_delete, dict(queue.arguments)))
        for exchange in vhost.exchanges.values():
            if not (exchange.durable and not exchange.control and exchange.name):
                continue
            for binding in exchange.bindings.values():
                destination = binding.destination
                if isinstance(destination, Exchange):
                    if not _stored_exchange(destination):
                        continue
                elif getattr(destination, "name", None) not in wanted:
                    continue
                wiring.append(
                    Bound(
                        name,
                        exchange.name,
                        destination.name,  # type: ignore[attr-defined]
                        isinstance(destination, Exchange),
                        binding.routing_key,
                        dict(binding.arguments),
                    )
                )
        for queue in wanted.values():
            counts = list(_counts(queue).items())
            contents.append((name, queue.name, queue.delivered_mark, queue.messages(), counts))
        caches.extend(_cache_keys(name, vhost, wanted))
    yield from wiring
    new = tuple.__new__  # the fields in order, without NamedTuple's keyword handling
    for vhost_name, queue_name, mark, messages, counts in contents:
        if mark:
            yield Delivered(vhost_name, queue_name, mark)
        for message, deadline in messages:
            yield new(
                Enqueued,
                (
                    vhost_name,
                    queue_name,
                    message.msg_id,
                    message.address,
                    message.header,
                    message.body,
                    deadline,
                    message.is_persistent(),
                ),
            )
        for msg_id, count in counts:
            yield Redelivered(vhost_name, queue_name, msg_id, count)
    yield from caches


def _cache_keys(name: str, vhost: VHost, wanted: dict[str, Queue]) -> Iterator[DedupSeen]:
    """The keys of the vhost's stored deduplication caches, oldest first."""
    owners: list[tuple[str, Any]] = [
        ("x", e) for e in vhost.exchanges.values() if _stored_exchange(e) and e.dedup is not None
    ]
    owners += [("q", q) for q in wanted.values() if type(q.dedup) is SeenCache]
    for kind, owner in owners:
        cache = owner.dedup
        settings = cache.settings
        for key, (expires, seq) in list(cache.entries.items()):
            yield DedupSeen(
                name, kind, owner.name, key, expires, seq, settings.size, settings.persistent
            )


def snapshot(vhosts: dict[str, VHost]) -> dict[str, Any]:
    """The durable state in canonical form: durable exchanges, durable non-exclusive
    queues with every unsettled message (delivered or not, in id order) and their
    delivered mark, and the bindings between durable ends. Two servers with the same
    snapshot hold the same durable state."""
    out: dict[str, Any] = {}
    for name, vhost in sorted(vhosts.items()):
        exchanges = {
            e.name: (e.kind, e.auto_delete, e.internal, _canonical(e.arguments))
            for e in vhost.exchanges.values()
            if e.durable and not e.control and e.name and not e.name.startswith("amq.")
        }
        queues = {}
        for queue in vhost.queues.values():
            if not (queue.durable and queue.exclusive_owner is None):
                continue
            queues[queue.name] = {
                "auto_delete": queue.auto_delete,
                "arguments": _canonical(queue.arguments),
                "delivered_mark": queue.delivered_mark,
                "deliveries": sorted(_counts(queue).items()),
                "messages": [
                    (m.msg_id, m.address, m.header, m.body, deadline)
                    for m, deadline in queue.messages()
                ],
            }
        bindings = sorted(
            (
                e.name,
                getattr(b.destination, "name", ""),
                isinstance(b.destination, Exchange),
                b.routing_key,
                _canonical(b.arguments),
            )
            for e in vhost.exchanges.values()
            if e.durable and not e.control and e.name
            for b in e.bindings.values()
            if getattr(b.destination, "durable", False)
            and getattr(b.destination, "exclusive_owner", None) is None
        )
        out[name] = {"exchanges": exchanges, "queues": queues, "bindings": bindings}
    return out


def _canonical(arguments: dict[str, Any]) -> str:
    return repr(sorted(arguments.items()))


def _counts(queue: Queue) -> dict[int, int]:
    """A quorum queue's delivery counts of 2 and more (none on any other queue)."""
    return {} if queue.counter is None else queue.counter.deliveries
