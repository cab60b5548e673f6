"""One AMQP channel of a connection: its methods, content assembly, consumers and acks.

Owns: the channel's state (open / closing), the publish → header → body sequence,
consumers and their prefetch credit, the unacknowledged deliveries and their tags,
publisher confirms and transactions. Every method is checked against the channel's
state before it is dispatched, by a dict keyed on the pamqp class.

Must not know: sockets (frames go out through ``connection.send``), how exchanges
match keys or how queues store messages (that is ``core``).

Errors are raised as pamqp AMQP exceptions: a soft error closes this channel, a hard
one the whole connection; the connection decides which from the class.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands, exceptions
from pamqp.base import Frame as Method

from . import flow, wire
from .core import feedauth
from .core.arguments import QueueArgumentError, consumer_priority
from .core.confirms import Confirms
from .core.message import Message
from .core.queue import Queue
from .core.reserved import FEED_QUEUE
from .federation.model import LINK_HEADER_MARK, LINK_HEADERS

if TYPE_CHECKING:
    from .host import ChannelHost, ChannelOwner

OPEN, CLOSING = "open", "closing"

# A hold on reading a connection (see Connection.hold_reading): a transaction's
# Commit-Ok waits for the store.
READ_HELD_STORE = 32

_CLOSE_INDEXES = (
    wire.method_index_bytes(commands.Channel.Close),
    wire.method_index_bytes(commands.Channel.CloseOk),
)

# The user_id bit of the content header's property flags (low byte of the flag word).
_USER_ID_FLAG = 0x10
# The reply_to bit (high byte of the flag word).
_REPLY_TO_FLAG = 0x02

# Direct reply-to (RabbitMQ's extension): a consumer on this pseudo-queue receives, without
# any queue, the messages published to the default exchange with the routing key its
# channel's requests carry in reply_to (the name followed by a token naming the channel).
REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO + "."
# The pair's replication feed (see replication.py): only a peering login consumes it.
_FEED_ADDRESS = wire.address_of(FEED_QUEUE, "")

# An unacknowledged delivery: (delivery tag, consumer or None for Basic.Get, queue, message).
Unacked = tuple[int, "ChannelConsumer | None", Queue, Message]

# A transaction is data: the actions it will take on commit, in order.
TX_PUBLISH, TX_ACK, TX_RETURN = 0, 1, 2
TxAction = tuple[Any, ...]


def _by_queue(entries: list[Unacked]) -> dict[Queue, list[int]]:
    """The message ids of ``entries`` per queue, in delivery order (deleted queues skipped)."""
    by_queue: dict[Queue, list[int]] = {}
    for _tag, _consumer, queue, message in entries:
        if not queue.deleted:
            by_queue.setdefault(queue, []).append(message.msg_id)
    return by_queue


class ChannelConsumer:
    """A Basic.Consume subscription: what the queue sees as a consumer."""

    __slots__ = (
        "tag",
        "tag_wire",
        "channel",
        "queue",
        "no_ack",
        "exclusive",
        "prefetch",
        "unacked",
    )

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
        if not channel.can_deliver or channel.connection.write_paused:
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
        connection = channel.connection
        if not self.no_ack:
            channel.unacked[tag] = (tag, self, queue, message)
            channel.unacked_order.append(tag)
            self.unacked += 1
        connection.send(
            wire.deliver_frames(
                channel.number,
                self.tag_wire,
                tag,
                redelivered,
                message.address,
                message.header,
                message.body,
                connection.frame_max,
            )
        )


class PendingPublish:
    """A Basic.Publish waiting for its content header and body frames."""

    __slots__ = ("publish", "exchange", "header", "decoded", "body_size", "parts", "received")

    def __init__(self, publish: wire.Publish, exchange: Any) -> None:
        self.publish = publish
        self.exchange = exchange
        self.header: bytes | None = None
        self.decoded: commands.Basic.Properties | None = None
        self.body_size = 0
        self.parts: list[bytes] = []
        self.received = 0


class FeedOutlet:
    """The replication feed's way out through a channel (``replication.Outlet``): the
    feed sends its runs as deliveries of one consumer, tagged by the channel, and never
    touches the channel otherwise."""

    __slots__ = ("channel", "consumer_tag", "tag_wire", "peer", "prefetch")

    def __init__(self, channel: Channel, consumer_tag: str) -> None:
        self.channel = channel
        self.consumer_tag = consumer_tag
        self.tag_wire = wire.shortstr(consumer_tag)
        self.peer = channel.connection.peer
        self.prefetch = channel.consumer_prefetch

    def next_tag(self) -> int:
        channel = self.channel
        tag = channel.next_delivery_tag
        channel.next_delivery_tag = tag + 1
        return tag

    def deliver(self, tag: int, header: bytes, body: bytes) -> None:
        channel = self.channel
        connection = channel.connection
        connection.send(
            wire.deliver_frames(
                channel.number,
                self.tag_wire,
                tag,
                False,
                _FEED_ADDRESS,
                header,
                body,
                connection.frame_max,
            )
        )
        connection.flush()

    def cancel(self) -> None:
        channel = self.channel
        if channel.state is OPEN:
            channel.reply(commands.Basic.Cancel(self.consumer_tag, nowait=True))
            channel.connection.flush()

    def detach(self) -> None:
        if self.channel.feed_outlet is self:
            self.channel.feed_outlet = None


class Channel:
    def __init__(self, connection: ChannelOwner, number: int) -> None:
        self.connection = connection
        self.broker: ChannelHost = connection.broker
        self.vhost = connection.vhost
        self.number = number
        self.state = OPEN
        self.can_deliver = True  # Channel.Flow
        self.consumers: dict[str, ChannelConsumer] = {}
        # Unacked deliveries by tag; ``unacked_order`` keeps tags in delivery order so
        # a multiple ack settles from the front without scanning the dict.
        self.unacked: dict[int, Unacked] = {}
        self.unacked_order: deque[int] = deque()
        self.next_delivery_tag = 1
        self.consumer_prefetch = 0
        self.global_prefetch = 0
        self.confirm = False
        self.confirms = Confirms()
        self.transaction: list[TxAction] | None = None
        # Deliveries acked inside the open transaction: a rollback makes them unacked again.
        self.transaction_acks: list[Unacked] = []
        self.transaction_bytes = 0  # message bodies published in the open transaction
        self.pending: PendingPublish | None = None
        # An empty queue name in a method means the queue last declared on this channel.
        self.last_queue = ""
        # Direct reply-to: this channel's reply consumer and the address its requests carry.
        self.reply_consumer: ChannelConsumer | None = None
        self.reply_address = ""
        # The replication feed's outlet, when the PASSIVE's link subscribed on this channel.
        self.feed_outlet: FeedOutlet | None = None
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
            raise exceptions.AMQPAccessRefused(_control_only_text(self.broker, method.name))

    def reply(self, method: Method) -> None:
        self.connection.send(wire.method_frame(self.number, method))

    # -- publish -------------------------------------------------------------------

    def on_basic_publish(self, publish: wire.Publish) -> None:
        connection = self.connection
        if not connection.published:
            connection.mark_publisher()
        exchange = self.vhost.get_exchange(publish.exchange)
        if not exchange.control:
            connection.publishes_messages = True
            if self.broker.blocked:
                # Held after this publish, until the alarm clears; a request to the
                # control plane (console, federation, the pair) never is (docs/limits.md).
                flow.hold(connection, self.broker.block_reason())
            if connection.bypasses_gate and not self.broker.pair.serving():
                raise exceptions.AMQPAccessRefused(_control_only_text(self.broker, "Basic.Publish"))
        if exchange.internal:
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - cannot publish to internal exchange '{publish.exchange}'"
            )
        if (
            exchange.publish_tag is not None
            and exchange.publish_tag not in self.connection.user.tags
        ):
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - publishing to '{publish.exchange}' needs a user tagged "
                f"'{exchange.publish_tag}'"
            )
        if publish.immediate:
            raise exceptions.AMQPNotImplemented("NOT_IMPLEMENTED - immediate=true")
        self.pending = PendingPublish(publish, exchange)

    def _on_header(self, pending: PendingPublish, payload: bytes) -> None:
        body_size = wire.content_body_size(payload)
        limits = self.broker.config.limits
        if body_size > limits.max_message_size:
            self.pending = None
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - message size {body_size} is larger than "
                f"configured max size {limits.max_message_size}"
            )
        if len(payload) > limits.max_header_size:
            # Decoding properties costs time in proportion to their size: refused unread.
            self.pending = None
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - message properties of {len(payload)} bytes are "
                f"larger than configured max header size {limits.max_header_size}"
            )
        pending.decoded = wire.check_properties(payload)
        if payload[13] & _USER_ID_FLAG:
            self._check_user_id(payload, pending.decoded)
        if payload[12] & _REPLY_TO_FLAG:
            filled = self._fill_reply_to(payload)
            if filled is not payload:
                pending.decoded = None  # decoded from the header before it was rewritten
                payload = filled
        if LINK_HEADER_MARK in payload and not self.connection.federation_linked:
            # The path and probe headers a federation link acts on come only from a link's
            # own connection (docs/security.md, "Federation names").
            stripped = wire.without_headers(payload, LINK_HEADERS)
            if stripped is not payload:
                pending.decoded = None
                payload = stripped
        pending.header = payload
        pending.body_size = body_size
        if body_size == 0:
            self._complete(pending, b"")

    def _check_user_id(self, header: bytes, decoded: commands.Basic.Properties | None) -> None:
        """As in RabbitMQ, a user_id property must name the user who publishes."""
        user_id = (decoded or wire.decode_properties(header)).user_id
        if user_id != self.connection.user.name:
            self.pending = None
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - user_id property set to '{user_id}' but "
                f"authenticated user was '{self.connection.user.name}'"
            )

    def _fill_reply_to(self, header: bytes) -> bytes:
        """A request naming the direct reply-to pseudo-queue carries this channel's address."""
        message = Message(b"", header, b"")
        if message.reply_to() != REPLY_TO:
            return header
        if self.reply_consumer is None:
            self.pending = None
            raise exceptions.AMQPPreconditionFailed(
                "PRECONDITION_FAILED - fast reply consumer does not exist"
            )
        return message.with_reply_to(self.reply_address).header

    def _on_body(self, pending: PendingPublish, payload: bytes) -> None:
        received = pending.received + len(payload)
        if received > pending.body_size:
            raise exceptions.AMQPFrameError(
                f"FRAME_ERROR - body of {received} bytes or more, header said {pending.body_size}"
            )
        if received == pending.body_size and not pending.parts:
            self._complete(pending, payload)
            return
        pending.parts.append(payload)
        pending.received = received
        # A body in many frames is held here until complete: it counts against the watermark.
        self.broker.count_input(len(payload))
        if received == pending.body_size:
            self._complete(pending, b"".join(pending.parts))

    def publishing(self) -> bool:
        """A publish of a message whose content is still being read."""
        pending = self.pending
        return pending is not None and not pending.exchange.control

    def _drop_pending(self) -> None:
        pending = self.pending
        if pending is not None:
            self.pending = None
            self.broker.count_input(-pending.received)

    def _complete(self, pending: PendingPublish, body: bytes) -> None:
        self._drop_pending()
        publish = pending.publish
        message = Message(publish.address, pending.header, body, pending.decoded)  # type: ignore[arg-type]
        broker = self.broker
        if not broker.blocked and Message.held > broker.message_budget:
            broker.check_memory()
        if self.transaction is not None:
            self._hold_in_transaction(len(body))
            self.transaction.append((TX_PUBLISH, pending.exchange, publish, message))
            return
        self._route(pending.exchange, publish, message)

    def _route(self, exchange: Any, publish: wire.Publish, message: Message) -> None:
        if exchange.control:
            self._to_control_plane(exchange, publish, message)
            return
        vhost = self.vhost
        queues = vhost.route(exchange, publish.routing_key, message)
        log = vhost.log
        sync_before = log.sync_lsn if log is not None else 0
        accepted = vhost.enqueue(message, queues, self.broker.now()) if queues else True
        delivered = bool(queues) or (
            exchange.name == ""
            and publish.routing_key.startswith(REPLY_TO_PREFIX)
            and self._reply(publish.routing_key, message)
        )
        # Decoded for routing only: a queued message holds its wire bytes, not these.
        message.decoded = None
        connection = self.connection
        if not delivered and publish.mandatory:
            self._return_unroutable(message)
        if self.confirm:
            confirms = self.confirms
            seq = confirms.seq = confirms.seq + 1  # confirms.publish(), inlined: hot path
            if not accepted:
                confirms.refuse(seq)
                connection.confirms_due(self)
            elif log is not None and log.sync_lsn != sync_before:
                # Confirmed once the store has it on disk (``store_progress``).
                if not confirms.unsafe:
                    self.broker.wait_for_safe(self)
                confirms.wait_for(seq, log.sync_lsn)
            else:
                connection.confirms_due(self)

    def _return_unroutable(self, message: Message) -> None:
        """Basic.Return 312 NO_ROUTE of a mandatory publish that reached nothing."""
        self.connection.send(
            wire.return_frames(
                self.number,
                312,
                "NO_ROUTE",
                message.address,
                message.header,
                message.body,
                self.connection.frame_max,
            )
        )

    def _reply(self, address: str, message: Message) -> bool:
        """A reply to a direct reply-to address: straight to its consumer, if still there."""
        consumer = self.broker.reply_consumer(address)
        if consumer is None:
            return False
        consumer.deliver(None, message, False)  # type: ignore[arg-type]  # no_ack: no queue
        return True

    def _to_control_plane(self, exchange: Any, publish: wire.Publish, message: Message) -> None:
        """Straight to the exchange's receiver, with the connection that published it: the
        receiver reads who published from the login, never from a message property."""
        receiver = exchange.receiver
        if receiver is not None:
            receiver(message, self.connection)
        elif publish.mandatory:
            self._return_unroutable(message)
        if self.confirm:
            self.confirms.publish()
            self.connection.confirms_due(self)

    def flush_confirms(self) -> None:
        """Send the confirms that may go out (see core.confirms for the order)."""
        for ack, seq, multiple in self.confirms.due():
            self.connection.send(
                wire.ack_frame(self.number, seq, multiple)
                if ack
                else wire.nack_frame(self.number, seq, multiple)
            )

    def store_progress(self, safe_lsn: int) -> bool:
        """The store (and a PASSIVE) hold everything up to ``safe_lsn``. True while
        publishes still wait."""
        confirms = self.confirms
        if confirms.progress(safe_lsn) and self.state is OPEN:
            self.connection.confirms_due(self)
        return bool(confirms.unsafe)

    def store_failed(self, first: int, last: int) -> None:
        """The store could not write LSNs ``first``-``last``: their publishes are nacked."""
        confirms = self.confirms
        if confirms.refuse_range(first, last) and self.state is OPEN:
            self.connection.confirms_due(self)

    # -- acks ----------------------------------------------------------------------

    def _take_unacked(self, tag: int, multiple: bool) -> list[Unacked]:
        unacked = self.unacked
        if multiple:
            order = self.unacked_order
            taken = []
            while order and (tag == 0 or order[0] <= tag):
                entry = unacked.pop(order.popleft(), None)
                if entry is not None:
                    taken.append(entry)
            if not taken and tag:
                raise exceptions.AMQPPreconditionFailed(
                    f"PRECONDITION_FAILED - unknown delivery tag {tag}"
                )
            return taken
        entry = unacked.pop(tag, None)
        if entry is None:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - unknown delivery tag {tag}"
            )
        order = self.unacked_order
        while order and order[0] not in unacked:
            order.popleft()
        return [entry]

    @staticmethod
    def _release(entries: list[Unacked]) -> None:
        for entry in entries:
            consumer = entry[1]
            if consumer is not None:
                consumer.unacked -= 1

    def _ack(self, tag: int, multiple: bool) -> None:
        if self.feed_outlet is not None:
            self.broker.feed.acked(self.feed_outlet, tag, multiple)
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
            _tag, consumer, queue, message = entries[0]
            if consumer is not None:
                consumer.unacked -= 1
            if not queue.deleted:
                queue.ack_one(message.msg_id)
        elif not entries:
            # Basic.Ack(0, multiple) with nothing outstanding, now or at Tx.Commit: legal,
            # and it settles nothing.
            return
        else:
            # A multiple ack: almost always of one queue's deliveries, settled in one call.
            first = entries[0][2]
            ids = []
            mixed = False
            for _tag, consumer, queue, message in entries:
                if consumer is not None:
                    consumer.unacked -= 1
                if queue is not first:
                    mixed = True
                ids.append(message.msg_id)
            if not mixed:
                if not first.deleted:
                    first.ack(ids)
            else:
                for each, queue_ids in _by_queue(entries).items():
                    each.ack(queue_ids)
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
        rejected (dead-lettered where the queue says)."""
        self._release(entries)
        by_queue = _by_queue(entries)
        now = self.broker.now()
        for queue, ids in by_queue.items():
            if requeue:
                queue.requeue(ids)
            else:
                queue.reject(ids)
        if requeue:
            for queue in by_queue:
                queue.drain(now)
        self._wake_consumers()

    def on_basic_ack(self, method: commands.Basic.Ack) -> None:
        self._ack(method.delivery_tag, method.multiple)

    def on_basic_nack(self, method: commands.Basic.Nack) -> None:
        entries = self._take_unacked(method.delivery_tag, method.multiple)
        self._return_or_later(entries, method.requeue)

    def on_basic_reject(self, method: commands.Basic.Reject) -> None:
        entries = self._take_unacked(method.delivery_tag, False)
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
        entries = [self.unacked[tag] for tag in self.unacked_order if tag in self.unacked]
        self.unacked.clear()
        self.unacked_order.clear()
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
        if method.queue == FEED_QUEUE:
            self._consume_feed(tag, method)
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

    def _consume_replies(self, tag: str, method: commands.Basic.Consume) -> None:
        if not method.no_ack:
            raise exceptions.AMQPPreconditionFailed(
                "PRECONDITION_FAILED - reply consumer cannot acknowledge"
            )
        if self.reply_consumer is not None:
            raise exceptions.AMQPPreconditionFailed(
                "PRECONDITION_FAILED - reply consumer already set"
            )
        self.reply_consumer = ChannelConsumer(tag, self, None, True, False, 0)  # type: ignore[arg-type]
        self.reply_address = REPLY_TO_PREFIX + secrets.token_urlsafe(24)
        self.broker.add_reply(self.reply_address, self.reply_consumer)
        if not method.nowait:
            self.reply(commands.Basic.ConsumeOk(tag))

    def _consume_feed(self, tag: str, method: commands.Basic.Consume) -> None:
        """The PASSIVE's replication link subscribes to this server's change stream."""
        if "peering" not in self.connection.user.tags:
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - '{FEED_QUEUE}' is the pair's replication feed: it needs "
                "a user tagged 'peering'"
            )
        broker = self.broker
        if not broker.leading or broker.log is None or not broker.config.replication.enabled:
            raise exceptions.AMQPNotFound(
                "NOT_FOUND - no replication feed here: this server is not ACTIVE, or "
                "replication or the store is off"
            )
        if method.no_ack or self.consumers or self.reply_consumer is not None:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - '{FEED_QUEUE}' needs acks, on a channel of its own"
            )
        # Only the pair's peer: proof of the pair's secret bound to this connection's
        # nonce, not a password alone (core/feedauth.py, docs/security.md).
        arguments = method.arguments or {}
        secret = broker.config.failover.secret
        client_nonce = feedauth.parse_nonce(arguments.get(feedauth.NONCE_ARGUMENT))
        if client_nonce is None or not feedauth.proof_holds(
            secret, self.connection.nonce, client_nonce, arguments.get(feedauth.PROOF_ARGUMENT)
        ):
            broker.feed.refused(self.connection.peer, self.connection.user.name)
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - '{FEED_QUEUE}' needs proof of the pair's secret"
            )
        if broker.feed.live_subscriber:
            raise exceptions.AMQPResourceLocked(
                f"RESOURCE_LOCKED - '{FEED_QUEUE}' has a subscriber already"
            )
        if not method.nowait:
            self.reply(commands.Basic.ConsumeOk(tag))
        self.feed_outlet = FeedOutlet(self, tag)
        broker.feed.subscribe(
            self.feed_outlet, feedauth.session_key(secret, self.connection.nonce, client_nonce)
        )

    def _stop_replies(self) -> None:
        if self.reply_consumer is not None:
            self.broker.forget_reply(self.reply_address)
            self.reply_consumer = None
            self.reply_address = ""

    def on_basic_cancel(self, method: commands.Basic.Cancel) -> None:
        if self.reply_consumer is not None and self.reply_consumer.tag == method.consumer_tag:
            self._stop_replies()
        if self.feed_outlet is not None:
            self.broker.feed.unsubscribed(self.feed_outlet)
        consumer = self.consumers.pop(method.consumer_tag, None)
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
            self.unacked[tag] = (tag, None, queue, message)
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

    def on_tx_select(self, method: commands.Tx.Select) -> None:
        if self.confirm:
            raise exceptions.AMQPPreconditionFailed(
                "PRECONDITION_FAILED - cannot switch from confirm to tx mode"
            )
        if self.transaction is None:
            self.transaction = []
        self.reply(commands.Tx.SelectOk())

    def _hold_in_transaction(self, size: int) -> None:
        """A transaction commits as one change, replicated as one run: its bodies are
        bounded like one message's (``limits.max_message_size``), so the run, and what
        encoding it costs, are bounded too."""
        limit = self.broker.config.limits.max_message_size
        self.transaction_bytes += size
        if self.transaction_bytes > limit:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - the transaction holds more than {limit} bytes of "
                "message bodies (limits.max_message_size): commit in smaller transactions"
            )

    def _require_transaction(self) -> list[TxAction]:
        if self.transaction is None:
            raise exceptions.AMQPPreconditionFailed(
                "PRECONDITION_FAILED - channel is not transactional"
            )
        return self.transaction

    def on_tx_commit(self, method: commands.Tx.Commit) -> None:
        actions = self._require_transaction()
        self.transaction = None
        self.transaction_acks = []
        self.transaction_bytes = 0
        log = self.vhost.log
        sync_before = log.sync_lsn if log is not None else 0
        if log is not None:
            log.begin_batch()  # the transaction's changes leave as one Batch
        try:
            for action in actions:
                if action[0] == TX_PUBLISH:
                    self._route(action[1], action[2], action[3])
                elif action[0] == TX_ACK:
                    self._settle(action[1])
                else:
                    self._return_to_queues(action[1], action[2])
        finally:
            if log is not None:
                log.end_batch()
            self.transaction = []
        if log is not None and log.sync_lsn != sync_before:
            self._commit_when_safe(log.sync_lsn)
        else:
            self.reply(commands.Tx.CommitOk())

    def _commit_when_safe(self, lsn: int) -> None:
        """Commit-Ok once the store has the transaction on disk; the connection is not
        read meanwhile, so nothing overtakes it."""
        connection = self.connection
        connection.hold_reading(READ_HELD_STORE, True)

        def done(ok: bool) -> None:
            connection.hold_reading(READ_HELD_STORE, False)
            if self.state is not OPEN or connection.channels.get(self.number) is not self:
                return
            if ok:
                self.reply(commands.Tx.CommitOk())
            else:
                connection.fail(
                    exceptions.AMQPInternalError(
                        "INTERNAL_ERROR - the store could not write the transaction"
                    )
                )
            connection.flush()

        self.broker.when_safe(lsn, done)

    def on_tx_rollback(self, method: commands.Tx.Rollback) -> None:
        actions = self._require_transaction()
        actions.clear()
        self.transaction_bytes = 0
        # Deliveries acked, nacked or rejected inside the transaction are unacked again.
        for entry in self.transaction_acks:
            self.unacked[entry[0]] = entry
        if self.transaction_acks:
            self.unacked_order = deque(sorted(self.unacked))
        self.transaction_acks = []
        self.reply(commands.Tx.RollbackOk())

    # -- flow and close -------------------------------------------------------------

    def on_channel_open(self, method: commands.Channel.Open) -> None:
        raise exceptions.AMQPChannelError(
            f"CHANNEL_ERROR - second 'channel.open' seen on channel {self.number}"
        )

    def on_channel_flow(self, method: commands.Channel.Flow) -> None:
        self.can_deliver = method.active
        self.reply(commands.Channel.FlowOk(method.active))
        if method.active:
            self._wake_consumers()

    def on_channel_flow_ok(self, method: commands.Channel.FlowOk) -> None:
        """We never send Channel.Flow, so a FlowOk is only acknowledged by ignoring it."""

    def on_channel_close(self, method: commands.Channel.Close) -> None:
        self.settle_confirms()
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
        self.settle_confirms()
        self.release()
        self.state = CLOSING
        self.reply(
            commands.Channel.Close(
                error.value, _reply_text(error), class_id=class_id, method_id=method_id
            )
        )

    def settle_confirms(self) -> None:
        """Before the channel's last frame: the confirms it owes go out first (a client
        has released the channel once it reads Close-Ok). A server that is not serving
        keeps no promise: the publisher sees them unconfirmed."""
        connection = self.connection
        if self not in connection.confirm_channels:
            return
        connection.confirm_channels.discard(self)
        if connection.bypasses_gate or self.broker.pair.serving():
            self.flush_confirms()

    def release(self) -> None:
        """The channel is going away: requeue what it holds, drop its consumers. Publishes
        not yet safe stay unconfirmed (the publisher sees the channel close first)."""
        if self.state is CLOSING:
            return
        self.connection.confirm_channels.discard(self)
        if self.feed_outlet is not None:
            self.broker.feed.unsubscribed(self.feed_outlet)
        if self.confirms.unsafe:
            self.confirms.drop_unsafe()
            self.broker.done_waiting(self)
        self._stop_replies()
        self._drop_pending()
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            self._detach(consumer)
        self._requeue_all()
        # A single active consumer's successor starts once what this channel held is
        # back in the queue (it gets those first, as in RabbitMQ).
        now = self.broker.now()
        for queue in {consumer.queue: None for consumer in consumers}:
            if not queue.deleted:
                queue.drain(now)
        self.transaction = None


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


def _control_only_text(broker: Any, what: str) -> str:
    state = broker.pair.info().get("state", "not ACTIVE")
    return (
        f"ACCESS_REFUSED - {what} refused: this server is {state}, not serving; a peering or "
        "administrator login may only use the control plane here"
    )


def _reply_text(error: exceptions.AMQPError) -> str:
    text = str(error.args[0]) if error.args else error.name.replace("-", "_")
    return wire.reply_text(text)
