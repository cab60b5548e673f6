"""A channel's publishing: content assembly, routing and publisher confirms.

Owns: the Basic.Publish → content header → body sequence (sizes checked against the limits
before anything is decoded, ``user_id`` checked against the login, direct reply-to
addresses filled in, federation link headers stripped from anyone but a link), routing a
complete message to its queues, the control plane or a reply consumer, Basic.Return of a
mandatory message that reached nothing, and the channel's side of its confirms: each
publish's seq and what it waits for, handed down as values (due now to the connection,
waiting for the watermark to the confirm pipeline, ``core.confirms.Waiting``).

Must not know: sockets (frames go out through the connection), how exchanges match keys
or queues store messages (``core``). A part of ``channel.Channel`` (a mixin, compiled as
a trait: ``channel_parts.py``): it reads the channel's state and writes only its
publishing and confirm state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from mypy_extensions import trait
from pamqp import commands, exceptions

from . import flow, wire
from .channel_parts import ChannelParts
from .channel_state import control_only_text
from .channel_tx import TX_PUBLISH
from .core.message import HELD, Message
from .core.reserved import REPLY_TO, REPLY_TO_PREFIX
from .core.vhost import REFUSED
from .federation.model import LINK_HEADER_MARK, LINK_HEADERS

if TYPE_CHECKING:
    from .core.queue import Queue

# The user_id bit of the content header's property flags (low byte of the flag word).
_USER_ID_FLAG: Final = 0x10
# The reply_to bit (high byte of the flag word).
_REPLY_TO_FLAG: Final = 0x02
# The headers bit (high byte of the flag word).
_HEADERS_FLAG: Final = 0x20


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


class ReplyConsumer:
    """Direct reply-to's consumer (Basic.Consume of ``amq.rabbitmq.reply-to``): no queue,
    no acks; the replies to this channel's requests go straight to it (``Publishing._reply``,
    and the control plane's answers)."""

    __slots__ = ("tag", "tag_wire", "channel")

    def __init__(self, tag: str, channel: ChannelParts) -> None:
        self.tag = tag
        self.tag_wire = wire.shortstr(tag)
        self.channel = channel

    def deliver(self, queue: Queue | None, message: Message, redelivered: bool) -> None:
        channel = self.channel
        connection = channel.connection
        connection.send(
            wire.deliver_frames(
                channel.number,
                self.tag_wire,
                channel.next_tag(),
                redelivered,
                message.address,
                message.header,
                message.body,
                connection.frame_max,
            )
        )


@trait
class Publishing(ChannelParts):
    """Basic.Publish and its content, routing and confirms: part of ``Channel``."""

    pending: PendingPublish | None  # a publish whose content is being read
    # Direct reply-to: this channel's reply consumer and the address its requests carry.
    reply_consumer: ReplyConsumer | None
    reply_address: str

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
                raise exceptions.AMQPAccessRefused(
                    control_only_text(self.broker.pair, "Basic.Publish")
                )
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
        # Only a header with a headers table can hold the marker. ``find``, not ``in``:
        # bytes' ``in`` first tries its operand as an integer, and raises and clears a
        # TypeError, message formatted, on every publish.
        if (
            payload[12] & _HEADERS_FLAG
            and payload.find(LINK_HEADER_MARK) != -1
            and not self.connection.federation_linked
        ):
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
        self.broker.memory.count_input(len(payload))
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
            if pending.received:  # a body in many frames (``_on_body``)
                self.broker.memory.count_input(-pending.received)

    def _complete(self, pending: PendingPublish, body: bytes) -> None:
        self._drop_pending()
        publish, header = pending.publish, pending.header
        assert header is not None  # the body follows its header
        message = Message(publish.address, header, body, pending.decoded)
        broker = self.broker
        memory = broker.memory
        if not broker.blocked and HELD.count > memory.message_budget:
            memory.check()
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
        wait = (
            # The vhost's clock is the broker's (the pair's time), read without a call
            # through the broker's protocol.
            vhost.enqueue(message, queues, vhost.wall_clock())
            if queues
            else vhost.unrouted_wait(exchange)
        )
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
            # With something to wait for, confirmed once the watermark passes ``wait``: the
            # confirm pipeline hands the tracker to the connection then (broker_store.py).
            if wait <= 0 or not self.waiting.expect(confirms, seq, wait):
                if wait == REFUSED:
                    confirms.refuse(seq)
                connection.confirms_due(confirms)

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
        consumer.deliver(None, message, False)  # a ReplyConsumer: no queue
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
            self.connection.confirms_due(self.confirms)
