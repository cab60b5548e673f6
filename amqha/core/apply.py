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

from collections.abc import Callable
from typing import Any

from .changes import (
    Batch,
    Bound,
    Change,
    Delivered,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    QueueDeclared,
    QueueDeleted,
    Settled,
    Unbound,
)
from .message import Message
from .routing import Exchange
from .vhost import VHost


def apply(vhost_of: Callable[[str], VHost], change: Change, now: float) -> None:
    """Apply one change; ``vhost_of(name)`` gives (or makes) the vhost it names."""
    if isinstance(change, Batch):
        for inner in change.changes:
            apply(vhost_of, inner, now)
        return
    vhost = vhost_of(change.vhost)
    assert vhost.log is None, "apply() on a vhost that logs would emit the change again"
    match change:
        case Enqueued():
            queue = vhost.queues.get(change.queue)
            if queue is not None:
                message = Message(change.address, change.header, change.body, msg_id=change.msg_id)
                queue.restore(message, change.deadline)
            vhost.ids.seen(change.msg_id)
        case Settled():
            queue = vhost.queues.get(change.queue)
            if queue is not None:
                queue.discard(change.msg_ids)
        case Delivered():
            queue = vhost.queues.get(change.queue)
            if queue is not None and change.msg_id > queue.delivered_mark:
                queue.delivered_mark = change.msg_id
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
