"""The replication feed's subscription on a channel, and its way out.

Owns: the Basic.Consume of ``amq.replication`` (only a login tagged peering, with proof of
the pair's secret bound to this connection's nonce: core/feedauth.py, docs/security.md),
and ``FeedOutlet``, through which the feed sends its runs as one consumer's deliveries.

Must not know: what the feed sends (replication.py), sockets. A mixin of ``channel.Channel``.
"""

from __future__ import annotations

from typing import Any

from pamqp import commands, exceptions

from . import wire
from .channel_state import OPEN
from .core import feedauth
from .core.reserved import FEED_QUEUE

# The pair's replication feed (see replication.py): only a peering login consumes it.
_FEED_ADDRESS = wire.address_of(FEED_QUEUE, "")


class FeedOutlet:
    """The replication feed's way out through a channel (``replication.Outlet``): the
    feed sends its runs as deliveries of one consumer, tagged by the channel, and never
    touches the channel otherwise."""

    __slots__ = ("channel", "consumer_tag", "tag_wire", "peer", "prefetch")

    def __init__(self, channel: Any, consumer_tag: str) -> None:
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


class FeedSubscription:
    """The replication feed's Basic.Consume: part of ``Channel``."""

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
