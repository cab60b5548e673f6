"""The replication feed as a consume service: ``amq.replication`` on any channel.

Owns: the checks on a Basic.Consume of ``amq.replication`` (only a login tagged peering,
with proof of the pair's secret bound to this connection's nonce: core/feedauth.py,
docs/security.md; only on an ACTIVE whose store and replication are on; one subscriber
at a time), and ``FeedOutlet``, through which the feed sends its runs as one consumer's
deliveries and hears their acks.

The channel knows none of this: it routes the consume, the acks and the end of this
outlet through ``host.ConsumeService`` and ``host.Outlet``, as it would any such service.

Must not know: what the feed sends (replication.py), sockets, a channel's insides.
"""

from __future__ import annotations

from pamqp import commands, exceptions

from . import wire
from .core import feedauth, protocol
from .core.protocol import PROTOCOL
from .core.reserved import FEED_QUEUE
from .host import FeedPort, FeedServiceHost, OutletChannel

# The pair's replication feed (see replication.py): only a peering login consumes it.
_FEED_ADDRESS = wire.address_of(FEED_QUEUE, "")


class FeedOutlet:
    """The replication feed's way out through a channel (``replication.Outlet`` to the
    feed, ``host.Outlet`` to the channel): the feed sends its runs as deliveries of one
    consumer, and the channel hands back their acks."""

    __slots__ = (
        "channel",
        "consumer_tag",
        "tag_wire",
        "peer",
        "prefetch",
        "feed",
        "key",
        "protocol",
        "resume",
    )

    def __init__(
        self,
        channel: OutletChannel,
        consumer_tag: str,
        feed: FeedPort,
        key: bytes,
        protocol: int = PROTOCOL,
        resume: tuple[int, int] | None = None,
    ) -> None:
        self.channel = channel
        self.consumer_tag = consumer_tag
        self.tag_wire = wire.shortstr(consumer_tag)
        self.peer = channel.connection.peer
        self.prefetch = channel.consumer_prefetch
        self.feed: FeedPort | None = feed
        self.key = key  # the session key of this subscription (core/feedauth.py)
        self.protocol = protocol  # what the feed speaks to this PASSIVE (core/protocol.py)
        self.resume = resume  # the point it asks to resume from, proven (core/feedauth.py)

    # -- as the channel sees it (host.Outlet) -------------------------------------------

    def start(self) -> None:
        if self.feed is not None:
            self.feed.subscribe(self, self.key, self.protocol, self.resume)

    def acked(self, tag: int, multiple: bool) -> None:
        if self.feed is not None:
            self.feed.acked(self, tag, multiple)

    def ended(self) -> None:
        if self.feed is not None:
            self.feed.unsubscribed(self)

    # -- as the feed sees it (replication.Outlet) ----------------------------------------

    def next_tag(self) -> int:
        return self.channel.next_tag()

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
        self.channel.cancel_consumer(self.consumer_tag)
        self.channel.connection.flush()

    def detach(self) -> None:
        """The feed is done with this outlet: what the channel still hands it is dropped."""
        self.feed = None


class FeedService:
    """``amq.replication``'s consume service (``host.ConsumeService``)."""

    def __init__(self, broker: FeedServiceHost) -> None:
        self.broker = broker

    def open(self, channel: OutletChannel, tag: str, method: commands.Basic.Consume) -> FeedOutlet:
        """The PASSIVE's replication link subscribes to this server's change stream."""
        connection = channel.connection
        if "peering" not in connection.user.tags:
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
        # Only the pair's peer: proof of the pair's secret bound to this connection's
        # nonce, not a password alone (core/feedauth.py, docs/security.md).
        arguments = method.arguments or {}
        secret = broker.config.failover.secret
        client_nonce = feedauth.parse_nonce(arguments.get(feedauth.NONCE_ARGUMENT))
        if client_nonce is None or not feedauth.proof_holds(
            secret, connection.nonce, client_nonce, arguments.get(feedauth.PROOF_ARGUMENT)
        ):
            broker.feed.refused(connection.peer, connection.user.name)
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - '{FEED_QUEUE}' needs proof of the pair's secret"
            )
        if broker.feed.live_subscriber:
            raise exceptions.AMQPResourceLocked(
                f"RESOURCE_LOCKED - '{FEED_QUEUE}' has a subscriber already"
            )
        try:
            speaks = protocol.parse(arguments.get(protocol.ARGUMENT))
        except ValueError as error:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - '{FEED_QUEUE}': {error}"
            ) from None
        key = feedauth.session_key(secret, connection.nonce, client_nonce)
        # A resume point whose MAC does not hold is no resume: a snapshot, as for any.
        resume = feedauth.parse_resume(key, arguments.get(feedauth.RESUME_ARGUMENT))
        return FeedOutlet(channel, tag, broker.feed, key, protocol.spoken(speaks), resume)
