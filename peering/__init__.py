"""Peerings: robust, directed AMQP client connections from this server to another.

A peering is the low-level link of the OpenAMQ clustering design: this server
connects to the other as an ordinary AMQP client (user tagged ``peering``) and
publishes to its exchanges. Failover state rides on it now; replication and
federation can ride on it later.
"""

from .agent import Peering, PeeringStatus

__all__ = ["Peering", "PeeringStatus"]
