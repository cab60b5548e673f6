"""Peerings: robust, directed AMQP client connections from this server to another.

A peering is the low-level link of the OpenAMQ clustering design: this server
connects to the other as an ordinary AMQP client (user tagged ``peering``) and
publishes to its exchanges: failover state rides on ``Peering``. ``ConsumerLink`` is
the consuming kind, lean, that replication rides on: each delivery goes straight from
the socket to a callback.
"""

from .agent import Peering, PeeringStatus
from .consumer import ConsumerLink, Link, LinkClosed

__all__ = ["ConsumerLink", "Link", "LinkClosed", "Peering", "PeeringStatus"]
