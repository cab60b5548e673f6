"""One AMQP channel of a connection: its methods, consumers and acks.

Owns: the channel's state (open / closing), consumers and their prefetch credit, the
unacknowledged deliveries and their tags, declarations, flow and close. Every method is
checked against the channel's state before it is dispatched, by a dict keyed on the pamqp
class. Its parts, mixed in: publishing and confirms (``channel_publish.py``), transactions
(``channel_tx.py``); what they read and call of it is declared in ``channel_parts.py``.
A consume of a name that is not a queue goes to the service the
broker names for it (``host.ConsumeService``), whose outlet then takes the channel's acks.

Must not know: sockets (frames go out through ``connection.send``), how exchanges
match keys or how queues store messages (that is ``core``), what a consume service is
(the replication feed's is ``channel_feed.py``).

Errors are raised as pamqp AMQP exceptions: a soft error closes this channel, a hard
one the whole connection; the connection decides which from the class.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from pamqp import commands, exceptions
from pamqp.base import Frame as Method

from . import wire
from .channel_parts import Counted, TxAction, Unacked
from .channel_publish import PendingPublish, Publishing, ReplyConsumer
from .channel_state import CLOSING, OPEN, control_only_text
from .channel_tx import TX_ACK, TX_RETURN, Transactions
from .core.arguments import QueueArgumentError, consumer_priority
from .core.confirms import Confirms
from .core.message import Message
from .core.queue import Consumer, Queue
from .core.reserved import REPLY_TO, REPLY_TO_PREFIX

if TYPE_CHECKING:
    from .host import ChannelHost, ChannelOwner, ConsumeService, Outlet


# Unacked deliveries put back in their queues in one turn of the loop (a close, a recover,
# a nack of many): about 20 ms of it.
REQUEUE_SLICE = 20_000  # not Final: a test makes it smaller
# The taken tags at the front of a channel's ``unacked_order`` are cut off once there
# are more than this many and they are more than half of it.
ORDER_CUT: Final = 4096
_CLOSE_INDEXES: Final = (
    wire.method_index_bytes(commands.Channel.Close),
    wire.method_index_bytes(commands.Channel.CloseOk),
)


def _by_queue(entries: list[Unacked]) -> dict[Queue, list[int]]:
    """The message ids of ``entries`` per queue, in delivery order (deleted queues skipped)."""
    by_queue: dict[Queue, list[int]] = {}
    for entry in entries:
        queue = entry.queue
        if not queue.deleted:
            by_queue.setdefault(queue, []).append(entry.message.msg_id)
    return by_queue


class ChannelConsumer(Consumer, Counted):
    """A Basic.Consume subscription: what the queue sees as a consumer."""

    __slots__ = ("tag_wire", "channel", "queue", "prefetch", "unacked")

    def __init__(
        self, tag: str, channel: Channel, queue: Queue, no_ack: bool, exclusive: bool, prefetch: int
    ) -> None:
        self.tag = tag
        self.tag_wire = wire.shortstr(tag)
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0

    def cancelled(self) -> None:
        """The queue went away under this consumer."""
        self.channel.consumer_gone(self)

    def ready(self) -> bool:
        channel = self.channel
        connection = channel.connection
        if not channel.can_deliver or connection.write_paused or connection.turn_spent:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return not channel.global_prefetch or len(channel.unacked) < channel.global_prefetch

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        channel = self.channel
        tag = channel.next_delivery_tag
        channel.next_delivery_tag = tag + 1
        if not self.no_ack:
            channel.unacked[tag] = Unacked(tag, self, queue, message)
            channel.unacked_order.append(tag)
            self.unacked += 1
        channel.connection.send(
            wire.deliver_frames(
                channel.number,
                self.tag_wire,
                tag,
                redelivered,
                message.address,
                message.header,
                message.body,
                channel.frame_max,
            )
        )


class Channel(Publishing, Transactions):
    """One channel: frames in, its methods dispatched, consumers and acks (docs/architecture.md);
    publishing and transactions are its parts'."""

    def __init__(self, connection: ChannelOwner, number: int) -> None:
        vhost = connection.vhost
        assert vhost is not None, "a channel is opened on an open connection"
        self.connection = connection
        self.broker: ChannelHost = connection.broker
        self.vhost = vhost
        self.number = number
        # Tuned before any channel opens: read here once, not through the connection's
        # protocol on every delivery.
        self.frame_max = connection.frame_max
        self.state = OPEN
        self.can_deliver = True  # Channel.Flow
        self.wake_due = False  # in the connection's ``to_wake`` until its read ends
        self.consumers: dict[str, ChannelConsumer] = {}
        # Unacked deliveries by tag; ``unacked_order`` keeps tags in delivery order so
        # a multiple ack settles from the front without scanning the dict: the tags
        # from ``order_head`` on (a list read from a moving head, compiled to plain
        # indexing, where a deque's were calls by name).
        self.unacked: dict[int, Unacked] = {}
        self.unacked_order: list[int] = []
        self.order_head = 0
        self.next_delivery_tag = 1
        self.consumer_prefetch = 0
        self.global_prefetch = 0
        self.confirm = False
        self.confirms = Confirms(number, connection)
        # The confirm pipeline's book: publishes waiting for the watermark go there.
        self.waiting = self.broker.confirms.waiting
        self.transaction: list[TxAction] | None = None
        # Deliveries acked inside the open transaction: a rollback makes them unacked again.
        self.transaction_acks: list[Unacked] = []
        self.transaction_bytes = 0  # message bodies published in the open transaction
        self.pending: PendingPublish | None = None
        # An empty queue name in a method means the queue last declared on this channel.
        self.last_queue = ""
        # Direct reply-to: this channel's reply consumer and the address its requests carry.
        self.reply_consumer: ReplyConsumer | None = None
        self.reply_address = ""
        # A consumer that is not a queue's (host.ConsumeService: the replication feed's),
        # when one consumes on this channel: it gets the channel's acks.
        self.outlet: Outlet | None = None
        self.handlers: dict[type, Callable[[Any], None]] = {
            commands.Channel.Open: self.on_channel_open,
            commands.Channel.Close: self.on_channel_close,
            commands.Channel.CloseOk: self.on_channel_close_ok,
            commands.Channel.Flow: self.on_channel_flow,
            commands.Channel.FlowOk: self.on_channel_flow_ok,
            commands.Exchange.Declare: self.on_exchange_declare,
            commands.Exchange.Delete: self.on_exchange_delete,
            commands.Exchange.Bind: self.on_exchange_bind,
            commands.Exchange.Unbind: self.on_exchange_unbind,
            commands.Queue.Declare: self.on_queue_declare,
            commands.Queue.Bind: self.on_queue_bind,
            commands.Queue.Unbind: self.on_queue_unbind,
            commands.Queue.Purge: self.on_queue_purge,
            commands.Queue.Delete: self.on_queue_delete,
            commands.Basic.Qos: self.on_basic_qos,
            commands.Basic.Consume: self.on_basic_consume,
            commands.Basic.Cancel: self.on_basic_cancel,
            commands.Basic.Get: self.on_basic_get,
            commands.Basic.Ack: self.on_basic_ack,
            commands.Basic.Nack: self.on_basic_nack,
            commands.Basic.Reject: self.on_basic_reject,
            commands.Basic.Recover: self.on_basic_recover,
            commands.Basic.RecoverAsync: self.on_basic_recover,
            commands.Confirm.Select: self.on_confirm_select,
            commands.Tx.Select: self.on_tx_select,
            commands.Tx.Commit: self.on_tx_commit,
            commands.Tx.Rollback: self.on_tx_rollback,
        }

    # -- frames in -----------------------------------------------------------------

    def takes_publish(self) -> bool:
        """Whether a Basic.Publish and its content may skip ``handle_frame``
        (``Connection._handle_publish``): an open channel with no content pending."""
        return self.pending is None and self.state is not CLOSING

    def handle_frame(self, frame: wire.RawFrame) -> None:
        if self.state is CLOSING:
            # After our Channel.Close, everything but Close/CloseOk is dropped unread (spec
            # 2.3.5): whatever the client had in flight, garbage included, is not an error.
            if frame.kind == wire.FRAME_METHOD and frame.payload[:4] in _CLOSE_INDEXES:
                method = wire.decode_method(frame.payload)
                self.handlers[type(method)](method)
            return
        kind = frame.kind
        pending = self.pending
        if pending is not None:
            if kind == wire.FRAME_BODY and pending.header is not None:
                self._on_body(pending, frame.payload)
            elif kind == wire.FRAME_HEADER and pending.header is None:
                self._on_header(pending, frame.payload)
            else:
                raise exceptions.AMQPUnexpectedFrame(
                    f"UNEXPECTED_FRAME - expected content "
                    f"{'body' if pending.header is not None else 'header'} "
                    f"for Basic.Publish on channel {self.number}, got a frame of type {kind}"
                )
            return
        if kind != wire.FRAME_METHOD:
            raise exceptions.AMQPUnexpectedFrame(
                f"UNEXPECTED_FRAME - content frame (type {kind}) on channel {self.number} "
                "without a Basic.Publish before it"
            )
        payload = frame.payload
        index = wire.method_index(payload) if len(payload) >= 4 else -1
        if index == wire.PUBLISH_INDEX:
            self.on_basic_publish(wire.decode_publish(payload))
            return
        if index == wire.ACK_INDEX:
            tag, multiple = wire.decode_ack(payload)
            self._ack(tag, multiple)
            return
        method = wire.decode_method(payload)
        handler = self.handlers.get(type(method))
        if handler is None:
            raise exceptions.AMQPCommandInvalid(
                f"COMMAND_INVALID - {method.name} is not allowed on channel {self.number}"
            )
        if self.connection.bypasses_gate and not self.broker.pair.serving():
            self._check_control_only(method)
        handler(method)

    def _check_control_only(self, method: Method) -> None:
        """A peering or administrator login on a server that is not serving: the control
        plane and a private reply queue only, nothing that touches application state."""
        kind = type(method)
        allowed = kind in _CONTROL_ONLY_METHODS
        if kind is commands.Queue.Declare:
            allowed = method.passive or (method.exclusive and not method.queue)  # type: ignore[attr-defined]
        elif kind is commands.Exchange.Declare:
            allowed = method.passive  # type: ignore[attr-defined]
        elif kind is commands.Basic.Consume and method.queue == REPLY_TO:  # type: ignore[attr-defined]
            allowed = True  # direct reply-to: this channel's own answers, no queue
        elif kind in (commands.Basic.Consume, commands.Basic.Get):
            allowed = (method.queue or self.last_queue) in self.connection.exclusive_queues  # type: ignore[attr-defined]
        if not allowed:
            raise exceptions.AMQPAccessRefused(control_only_text(self.broker.pair, method.name))

    def reply(self, method: Method) -> None:
        self.connection.send(wire.method_frame(self.number, method))

    # -- acks ----------------------------------------------------------------------

    def _take_unacked(self, tag: int, multiple: bool) -> list[Unacked]:
        unacked = self.unacked
        order = self.unacked_order
        head = self.order_head
        end = len(order)
        if multiple:
            taken = []
            while head < end:
                at = order[head]
                if tag and at > tag:
                    break
                head += 1
                entry = unacked.get(at)
                if entry is not None:
                    del unacked[at]
                    taken.append(entry)
            self._order_from(head)
            if not taken and tag:
                raise exceptions.AMQPPreconditionFailed(
                    f"PRECONDITION_FAILED - unknown delivery tag {tag}"
                )
            return taken
        entry = unacked.get(tag)
        if entry is None:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - unknown delivery tag {tag}"
            )
        del unacked[tag]
        while head < end and order[head] not in unacked:
            head += 1
        self._order_from(head)
        return [entry]

    def _order_from(self, head: int) -> None:
        """The unacked tags now start at ``head``: the list is emptied when all are
        taken, cut when the taken half is long."""
        order = self.unacked_order
        if head >= len(order):
            order.clear()
            head = 0
        elif head > ORDER_CUT and 2 * head > len(order):
            del order[:head]
            head = 0
        self.order_head = head

    @staticmethod
    def _release(entries: list[Unacked]) -> None:
        for entry in entries:
            consumer = entry.consumer
            if consumer is not None:
                consumer.unacked -= 1

    def _ack(self, tag: int, multiple: bool) -> None:
        if self.outlet is not None:
            self.outlet.acked(tag, multiple)
            return
        entries = self._take_unacked(tag, multiple)
        if self.transaction is not None:
            # Validated now (an unknown tag is an error at once), settled on commit.
            self.transaction_acks.extend(entries)
            self.transaction.append((TX_ACK, entries, False))
            return
        self._settle(entries)

    def _settle(self, entries: list[Unacked]) -> None:
        if len(entries) == 1:
            entry = entries[0]
            consumer = entry.consumer
            if consumer is not None:
                consumer.unacked -= 1
            queue = entry.queue
            if not queue.deleted:
                queue.ack_one(entry.message.msg_id)
        elif not entries:
            # Basic.Ack(0, multiple) with nothing outstanding, now or at Tx.Commit: legal,
            # and it settles nothing.
            return
        else:
            # A multiple ack: almost always of one queue's deliveries, settled in one call.
            first = entries[0].queue
            ids = []
            mixed = False
            for entry in entries:
                consumer = entry.consumer
                if consumer is not None:
                    consumer.unacked -= 1
                if entry.queue is not first:
                    mixed = True
                ids.append(entry.message.msg_id)
            if not mixed:
                if not first.deleted:
                    first.ack(ids)
            else:
                for each, queue_ids in _by_queue(entries).items():
                    each.ack(queue_ids)
        connection = self.connection
        if connection.reading:
            # Acks come many to a read: the consumers are woken once, after it
            # (``Connection._handle_frames``), and take what those acks made room for at once.
            if not self.wake_due:
                self.wake_due = True
                connection.to_wake.append(self)
        else:
            self._wake_consumers()

    def wake_after_read(self) -> None:
        """The wake an ack in a read put off (``_settle``), on a channel still open."""
        self.wake_due = False
        if self.state == OPEN:
            self._wake_consumers()

    def _wake_consumers(self) -> None:
        consumers = self.consumers
        if not consumers:
            return
        now = self.broker.now()
        if len(consumers) == 1:
            # The usual case, once per ack: no set of queues to build.
            for consumer in consumers.values():
                queue = consumer.queue
                queue.wake(consumer)
                queue.drain(now)
            return
        for consumer in consumers.values():
            consumer.queue.wake(consumer)
        for queue in {c.queue for c in consumers.values()}:
            queue.drain(now)

    def _return_to_queues(self, entries: list[Unacked], requeue: bool) -> None:
        """Nack, reject, recover, cancel or close: back to their positions, or settled as
        rejected (dead-lettered where the queue says). More than REQUEUE_SLICE put back
        go a slice a turn of the loop: a channel closed holding a million took the loop
        0.9 s in one callback, past a pair's failover timeout (docs/limits.md, "Big
        drops")."""
        if requeue and len(entries) > REQUEUE_SLICE:
            self._requeue_slices(entries, 0)
            return
        self._release(entries)
        by_queue = _by_queue(entries)
        now = self.broker.now()
        for queue, ids in by_queue.items():
            if requeue:
                queue.requeue(ids)
            else:
                queue.reject(ids)
        if requeue and not self.broker.switching:  # see release()
            for queue in by_queue:
                queue.drain(now)
        self._wake_consumers()

    def _requeue_slices(self, entries: list[Unacked], at: int) -> None:
        """``entries[at:]`` back to their queues, REQUEUE_SLICE now and the rest at the
        next turns; the messages not yet put back stay outstanding meanwhile."""
        part = entries[at : at + REQUEUE_SLICE]
        self._release(part)
        by_queue = _by_queue(part)  # a queue deleted meanwhile is skipped
        for queue, ids in by_queue.items():
            queue.requeue(ids)
        if not self.broker.switching:  # see release()
            now = self.broker.now()
            for queue in by_queue:
                queue.drain(now)
        at += REQUEUE_SLICE
        if at < len(entries):
            self.broker.loop.call_soon(self._requeue_slices, entries, at)
        else:
            self._wake_consumers()

    def on_basic_ack(self, method: commands.Basic.Ack) -> None:
        self._ack(method.delivery_tag, method.multiple)

    def on_basic_nack(self, method: commands.Basic.Nack) -> None:
        entries = self._take_unacked(method.delivery_tag or 0, method.multiple)
        self._return_or_later(entries, method.requeue)

    def on_basic_reject(self, method: commands.Basic.Reject) -> None:
        entries = self._take_unacked(method.delivery_tag or 0, False)
        self._return_or_later(entries, method.requeue)

    def _return_or_later(self, entries: list[Unacked], requeue: bool) -> None:
        if self.transaction is not None:
            self.transaction_acks.extend(entries)
            self.transaction.append((TX_RETURN, entries, requeue))
        else:
            self._return_to_queues(entries, requeue)

    def on_basic_recover(
        self, method: commands.Basic.Recover | commands.Basic.RecoverAsync
    ) -> None:
        if not method.requeue:
            # As RabbitMQ: redelivering to the same consumer only is not offered (540).
            raise exceptions.AMQPNotImplemented("NOT_IMPLEMENTED - requeue=false")
        self._requeue_all()
        if isinstance(method, commands.Basic.Recover):
            self.reply(commands.Basic.RecoverOk())

    def _requeue_all(self) -> None:
        unacked = self.unacked
        order = self.unacked_order
        entries = [unacked[tag] for tag in order[self.order_head :] if tag in unacked]
        unacked.clear()
        order.clear()
        self.order_head = 0
        if entries:
            self._return_to_queues(entries, True)

    # -- consumers -----------------------------------------------------------------

    def on_basic_qos(self, method: commands.Basic.Qos) -> None:
        if method.prefetch_size:
            raise exceptions.AMQPNotImplemented("NOT_IMPLEMENTED - prefetch_size!=0")
        if method.global_:
            self.global_prefetch = method.prefetch_count
        else:
            self.consumer_prefetch = method.prefetch_count
        self.reply(commands.Basic.QosOk())
        self._wake_consumers()

    def on_basic_consume(self, method: commands.Basic.Consume) -> None:
        tag = method.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        if tag in self.consumers or (self.reply_consumer and self.reply_consumer.tag == tag):
            raise exceptions.AMQPNotAllowed(f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'")
        limit = self.broker.config.limits.max_consumers_per_channel
        if limit and len(self.consumers) >= limit:
            raise exceptions.AMQPNotAllowed(
                f"NOT_ALLOWED - reached maximum ({limit}) of consumers per channel"
            )
        if method.queue == REPLY_TO:
            self._consume_replies(tag, method)
            return
        if self.outlet is not None:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - this channel carries '{self.outlet.consumer_tag}' alone"
            )
        service = self.broker.consume_service(method.queue)
        if service is not None:
            self._consume_service(service, tag, method)
            return
        queue = self.vhost.get_queue(method.queue or self.last_queue, self.connection, True)
        try:
            priority = consumer_priority(method.arguments, queue.name)
        except QueueArgumentError as error:
            raise exceptions.AMQPPreconditionFailed(f"PRECONDITION_FAILED - {error}") from error
        # As RabbitMQ: an exclusive consumer is refused on a single-active-consumer queue.
        if queue.has_exclusive_consumer() or (
            method.exclusive and (queue.consumers or queue.single_active)
        ):
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - queue '{queue.name}' in vhost '{self.vhost.name}' "
                "in exclusive use"
            )
        consumer = ChannelConsumer(
            tag, self, queue, method.no_ack, method.exclusive, self.consumer_prefetch
        )
        self.consumers[tag] = consumer
        now = self.broker.now()
        queue.add_consumer(consumer, now, priority)
        if not method.nowait:
            self.reply(commands.Basic.ConsumeOk(tag))
        queue.drain(now)

    def _consume_service(
        self, service: ConsumeService, tag: str, method: commands.Basic.Consume
    ) -> None:
        """A consume of a name that is not a queue: its service checks it and answers the
        outlet that takes this channel's acks (the replication feed's, channel_feed.py)."""
        if method.no_ack or self.consumers or self.reply_consumer is not None:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - '{method.queue}' needs acks, on a channel of its own"
            )
        outlet = service.open(self, tag, method)
        if not method.nowait:
            self.reply(commands.Basic.ConsumeOk(tag))
        self.outlet = outlet
        outlet.start()

    def next_tag(self) -> int:
        """The next delivery tag, for an outlet's delivery (queues' share the sequence)."""
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        return tag

    def cancel_consumer(self, tag: str) -> None:
        """Tell the client its consumer ``tag`` is cancelled (a server-side Basic.Cancel),
        if the channel is still open."""
        if self.state is OPEN:
            self.reply(commands.Basic.Cancel(tag, nowait=True))

    def _consume_replies(self, tag: str, method: commands.Basic.Consume) -> None:
        if not method.no_ack:
            raise exceptions.AMQPPreconditionFailed(
                "PRECONDITION_FAILED - reply consumer cannot acknowledge"
            )
        if self.reply_consumer is not None:
            raise exceptions.AMQPPreconditionFailed(
                "PRECONDITION_FAILED - reply consumer already set"
            )
        self.reply_consumer = ReplyConsumer(tag, self)
        self.reply_address = REPLY_TO_PREFIX + secrets.token_urlsafe(24)
        self.broker.add_reply(self.reply_address, self.reply_consumer)
        if not method.nowait:
            self.reply(commands.Basic.ConsumeOk(tag))

    def _stop_replies(self) -> None:
        if self.reply_consumer is not None:
            self.broker.forget_reply(self.reply_address)
            self.reply_consumer = None
            self.reply_address = ""

    def on_basic_cancel(self, method: commands.Basic.Cancel) -> None:
        if self.reply_consumer is not None and self.reply_consumer.tag == method.consumer_tag:
            self._stop_replies()
        outlet = self.outlet
        if outlet is not None and outlet.consumer_tag == method.consumer_tag:
            self.outlet = None
            outlet.ended()
        consumer = self.consumers.pop(method.consumer_tag or "", None)
        if consumer is not None:
            self._detach(consumer)
        if not method.nowait:
            self.reply(commands.Basic.CancelOk(method.consumer_tag))
        if consumer is not None and not consumer.unacked and not consumer.queue.deleted:
            # A single active consumer's successor starts now. If the old one still holds
            # deliveries, it starts when the queue next moves (they come back first when
            # the channel closes; RabbitMQ starts it at the next event too).
            consumer.queue.drain(self.broker.now())

    def _detach(self, consumer: ChannelConsumer) -> None:
        queue = consumer.queue
        if queue.remove_consumer(consumer, self.broker.now()):
            self.vhost.remove_queue(queue)

    def consumer_gone(self, consumer: ChannelConsumer) -> None:
        """The consumer's queue was deleted: tell the client if it asked to be told."""
        if self.consumers.pop(consumer.tag, None) is None or self.state is CLOSING:
            return
        if self.connection.capability("consumer_cancel_notify"):
            # As in RabbitMQ, the notice follows the reply to the method that deleted the
            # queue: py-amqp raises on a Basic.Cancel that arrives while it awaits that reply.
            self.connection.loop.call_soon(self._notify_cancelled, consumer.tag)

    def _notify_cancelled(self, tag: str) -> None:
        if self.state is OPEN and self.connection.channels.get(self.number) is self:
            self.reply(commands.Basic.Cancel(tag, nowait=True))

    def on_basic_get(self, method: commands.Basic.Get) -> None:
        queue = self.vhost.get_queue(method.queue or self.last_queue, self.connection, True)
        got = queue.get(self.broker.now(), method.no_ack)
        if got is None:
            self.reply(commands.Basic.GetEmpty())
            return
        message, redelivered = got
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        if not method.no_ack:
            self.unacked[tag] = Unacked(tag, None, queue, message)
            self.unacked_order.append(tag)
        connection = self.connection
        connection.send(
            wire.get_ok_frames(
                self.number,
                tag,
                redelivered,
                message.address,
                queue.message_count,
                message.header,
                message.body,
                connection.frame_max,
            )
        )

    # -- exchanges and queues --------------------------------------------------------

    def on_exchange_declare(self, method: commands.Exchange.Declare) -> None:
        self.vhost.declare_exchange(
            method.exchange,
            method.exchange_type,
            method.passive,
            method.durable,
            method.auto_delete,
            method.internal,
            dict(method.arguments or {}),
        )
        if not method.nowait:
            self.reply(commands.Exchange.DeclareOk())

    def on_exchange_delete(self, method: commands.Exchange.Delete) -> None:
        self.vhost.delete_exchange(method.exchange, method.if_unused)
        if not method.nowait:
            self.reply(commands.Exchange.DeleteOk())

    def on_exchange_bind(self, method: commands.Exchange.Bind) -> None:
        self.vhost.bind_exchange(
            method.destination, method.source, method.routing_key, dict(method.arguments or {})
        )
        if not method.nowait:
            self.reply(commands.Exchange.BindOk())

    def on_exchange_unbind(self, method: commands.Exchange.Unbind) -> None:
        self.vhost.unbind_exchange(
            method.destination, method.source, method.routing_key, dict(method.arguments or {})
        )
        if not method.nowait:
            self.reply(commands.Exchange.UnbindOk())

    def on_queue_declare(self, method: commands.Queue.Declare) -> None:
        connection = self.connection
        if method.queue == REPLY_TO or method.queue.startswith(REPLY_TO_PREFIX):
            self._declare_reply_to(method)
            return
        queue = self.vhost.declare_queue(
            method.queue,
            connection,
            self.broker.now(),
            method.passive,
            method.durable,
            method.exclusive,
            method.auto_delete,
            dict(method.arguments or {}),
        )
        if queue.exclusive_owner is connection:
            connection.exclusive_queues[queue.name] = queue
        self.broker.watch_queue(queue)
        self.last_queue = queue.name
        if not method.nowait:
            connection.send(
                wire.declare_ok_frame(
                    self.number, queue.name, queue.message_count, queue.consumer_count
                )
            )

    def _declare_reply_to(self, method: commands.Queue.Declare) -> None:
        """As RabbitMQ: the pseudo-queue, or a reply address whose consumer is still there,
        exists for a passive declare; nothing else can be done with those names."""
        if not method.passive:
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - queue name '{method.queue}' contains reserved prefix 'amq.'"
            )
        if method.queue != REPLY_TO and self.broker.reply_consumer(method.queue) is None:
            raise exceptions.AMQPNotFound(
                f"NOT_FOUND - no queue '{method.queue}' in vhost '{self.vhost.name}'"
            )
        if not method.nowait:
            self.connection.send(wire.declare_ok_frame(self.number, method.queue, 0, 0))

    def on_queue_bind(self, method: commands.Queue.Bind) -> None:
        self.vhost.bind_queue(
            method.queue or self.last_queue,
            method.exchange,
            method.routing_key,
            dict(method.arguments or {}),
            self.connection,
        )
        if not method.nowait:
            self.reply(commands.Queue.BindOk())

    def on_queue_unbind(self, method: commands.Queue.Unbind) -> None:
        self.vhost.unbind_queue(
            method.queue or self.last_queue,
            method.exchange,
            method.routing_key,
            dict(method.arguments or {}),
            self.connection,
        )
        self.reply(commands.Queue.UnbindOk())

    def on_queue_purge(self, method: commands.Queue.Purge) -> None:
        queue = self.vhost.get_queue(method.queue or self.last_queue, self.connection)
        count = queue.purge()
        if not method.nowait:
            self.reply(commands.Queue.PurgeOk(count))

    def on_queue_delete(self, method: commands.Queue.Delete) -> None:
        name = method.queue or self.last_queue
        count = self.vhost.delete_queue(name, self.connection, method.if_unused, method.if_empty)
        self.connection.exclusive_queues.pop(name, None)
        if not method.nowait:
            self.reply(commands.Queue.DeleteOk(count))

    # -- confirms and transactions --------------------------------------------------

    def on_confirm_select(self, method: commands.Confirm.Select) -> None:
        if self.transaction is not None:
            raise exceptions.AMQPPreconditionFailed(
                "PRECONDITION_FAILED - cannot switch from tx to confirm mode"
            )
        self.confirm = True
        if not method.nowait:
            self.reply(commands.Confirm.SelectOk())

    # -- flow and close -------------------------------------------------------------

    def on_channel_open(self, method: commands.Channel.Open) -> None:
        raise exceptions.AMQPChannelError(
            f"CHANNEL_ERROR - second 'channel.open' seen on channel {self.number}"
        )

    def on_channel_flow(self, method: commands.Channel.Flow) -> None:
        self.can_deliver = bool(method.active)
        self.reply(commands.Channel.FlowOk(method.active))
        if method.active:
            self._wake_consumers()

    def on_channel_flow_ok(self, method: commands.Channel.FlowOk) -> None:
        """We never send Channel.Flow, so a FlowOk is only acknowledged by ignoring it."""

    def on_channel_close(self, method: commands.Channel.Close) -> None:
        self.connection.settle_confirms(self.confirms)
        self.release()
        self.connection.send(wire.method_frame(self.number, commands.Channel.CloseOk()))
        self.connection.forget_channel(self.number)

    def on_channel_close_ok(self, method: commands.Channel.CloseOk) -> None:
        if self.state is CLOSING:
            self.connection.forget_channel(self.number)

    def close_with(
        self, error: exceptions.AMQPError, class_id: int = 0, method_id: int = 0
    ) -> None:
        """Server-initiated Channel.Close for a soft error."""
        self.connection.settle_confirms(self.confirms)
        self.release()
        self.state = CLOSING
        self.reply(
            commands.Channel.Close(
                error.value,  # type: ignore[attr-defined]  # each concrete error class's
                _reply_text(error),
                class_id=class_id,
                method_id=method_id,
            )
        )

    def release(self) -> None:
        """The channel is going away: requeue what it holds, drop its consumers. Publishes
        not yet safe stay unconfirmed (the publisher sees the channel close first)."""
        if self.state is CLOSING:
            return
        self.connection.drop_confirms(self.confirms)
        outlet, self.outlet = self.outlet, None
        if outlet is not None:
            outlet.ended()
        if self.confirms.unsafe:
            self.waiting.forget(self.confirms)
        self._stop_replies()
        self._drop_pending()
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            self._detach(consumer)
        self._requeue_all()
        self.transaction = None
        if self.broker.switching:
            # A switchover's last step closes every client: what this channel held stays
            # in its queue, not sent to a consumer about to be closed too (a delivery the
            # new ACTIVE would never hear of, after the drain).
            return
        # A single active consumer's successor starts once what this channel held is
        # back in the queue (it gets those first, as in RabbitMQ).
        now = self.broker.now()
        for queue in {consumer.queue: None for consumer in consumers}:
            if not queue.deleted:
                queue.drain(now)


# Methods a peering or administrator login may use on a server that is not serving (some
# only on their own exclusive reply queue: see Channel._check_control_only).
_CONTROL_ONLY_METHODS = frozenset(
    {
        commands.Channel.Open,
        commands.Channel.Close,
        commands.Channel.CloseOk,
        commands.Channel.Flow,
        commands.Channel.FlowOk,
        commands.Basic.Qos,
        commands.Basic.Cancel,
        commands.Basic.Nack,
        commands.Basic.Reject,
        commands.Basic.Recover,
        commands.Basic.RecoverAsync,
        commands.Confirm.Select,
    }
)


def _reply_text(error: exceptions.AMQPError) -> str:
    text = str(error.args[0]) if error.args else error.name.replace("-", "_")  # type: ignore[attr-defined]
    return wire.reply_text(text)
