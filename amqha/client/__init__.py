"""Client helper for the pair: aio-pika connections that find the ACTIVE server.

Owns: the public names of ``amqha.client`` (docs/client.md), imported from its modules:
``servers.py`` (the listed servers, redirects), ``failover_log.py`` (what is logged),
``connection.py`` (``connect``, ``connect_robust``), ``link.py`` (the loop under a
publisher or consumer), ``publisher.py``, ``consumer.py``.

Must not know: the broker (it speaks AMQP to servers like any client).

``connect(urls)`` and ``connect_robust(urls)`` announce the ``connection.redirect``
capability (keeping aio-pika's default capabilities), follow a server's
Connection.Redirect (or the ``NOT_ACTIVE - active server is HOST:PORT`` close that
plain clients get), and fail over between the listed servers. The robust
connection reconnects to whichever server is ACTIVE after a failover, and
aio-pika restores its channels, queues and consumers there.

``connect_robust``, ``Publisher`` and ``Consumer`` also leave a server that stops
answering (a frozen one keeps its connections open): amqha.client_watch owns that rule,
the heartbeat their URLs ask for by default, and ``silent_after``.

Each failover is logged once, at INFO on ``amqha.client``: which server was lost,
which one serves now and how long it took, from the last frame heard from the lost
one. The attempts in between are logged at
DEBUG with the address each one tried; what aio-pika and aiormq log about a
connection while it fails over is passed on at DEBUG only (see ``FailoverLog``), and a
failover that lasts is reported at WARNING, with the last error, after ``warn_after``
seconds and then at doubling intervals.

``Publisher`` keeps each message until its confirm and sends the unconfirmed ones
again on the new ACTIVE after a failover (at least once; each message has a message
id); ``Consumer`` consumes through failovers and never sends the new ACTIVE an ack of
a delivery from the lost server; ``Deduplicator`` remembers recent message ids.
See docs/client.md.

Connection.Redirect is AMQP 0-9 (class 10, method 42); 0-9-1 dropped it and pamqp
does not know it, so importing ``amqha.client`` registers it with pamqp's method table
(``servers.py``).

    connection = await amqha.client.connect_robust(
        ["amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:guest@127.0.0.1:5673/"]
    )
"""

from amqha.client_watch import DEFAULT_HEARTBEAT, DEFAULT_SILENT_AFTER
from amqha.gate import redirect_target

from .connection import (
    QUIETED_LOGGERS,
    FailoverRobustConnection,
    QuietDuringFailover,
    connect,
    connect_robust,
)
from .consumer import Consumer, Deduplicator
from .failover_log import FailoverLog
from .publisher import Publisher, PublisherClosed, PublisherFull, PublishFailed, PublishRefused
from .servers import (
    DEFAULT_CAPABILITIES,
    REDIRECT_CAPABILITY,
    ConnectionRedirect,
    ServerList,
    address_of,
    client_properties,
    watched_servers,
)

__all__ = [
    "DEFAULT_CAPABILITIES",
    "DEFAULT_HEARTBEAT",
    "DEFAULT_SILENT_AFTER",
    "QUIETED_LOGGERS",
    "REDIRECT_CAPABILITY",
    "ConnectionRedirect",
    "Consumer",
    "Deduplicator",
    "FailoverLog",
    "FailoverRobustConnection",
    "PublishFailed",
    "PublishRefused",
    "Publisher",
    "PublisherClosed",
    "PublisherFull",
    "QuietDuringFailover",
    "ServerList",
    "address_of",
    "client_properties",
    "connect",
    "connect_robust",
    "redirect_target",
    "watched_servers",
]
