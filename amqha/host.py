"""What the broker's parts ask of the broker, and what a channel asks of its connection.

Owns only interfaces, so that the dependencies between the broker's modules point one
way (docs/architecture.md, "Layout"):

- ``ChannelOwner``: a channel's connection (``connection.Connection`` implements it);
- ``ChannelHost``: what a channel asks of the broker;
- ``ConnectionHost``: what a connection asks of the broker (``BrokerHost``: that and
  what its channels ask);
- ``ReplicationHost``: what the replication feed and follower ask of the broker;
- ``FeedPort``: the replication feed as its consume service sees it (``replication.Feed``),
  ``FeedServiceHost``: what that service asks of the broker;
- ``ConfirmBook``: the confirm pipeline, as a channel hands it what waits; ``Memory``
  and ``Watch``: the memory account and the hangup watch, as connections use them;
- ``ConsumeService``, ``Outlet``, ``OutletChannel``: a consume of a name that is not a
  queue, as the channel routes it without knowing what it is;
- ``MetricsSource``: what the metrics endpoint reads of the broker;
- ``ManagementSource``: what the management API reads of the broker and asks of it
  (``DefinitionsHost``: what a definitions import asks of it);
- ``FederationHost``: what federation (its links, their intake, the agent, the upstream
  service) asks of the broker;
- ``ConsoleHost``: what the console service reads of the broker and asks of it.

``server.Broker`` implements the hosts and the source. ``server`` imports ``connection``, ``replication``
and ``metrics``; ``connection`` imports ``channel``; none of them imports ``server``, and
``channel`` does not import ``connection``: each of them imports this module instead. The
broker's counters and registries are changed through its methods, never written into.

Must not know: any implementation (this module imports only pure ones).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pamqp import exceptions

    from config import ServerConfig

    from .auth import Refused, User
    from .core.access import Access
    from .core.changes import ChangeLog
    from .core.confirms import Commit, Confirms, Waiting
    from .core.message import MessageIds
    from .core.queue import Queue
    from .core.vhost import VHost
    from .gate import Pair


class FeedPort(Protocol):
    """The replication feed, as its consume service (``channel_feed.py``) sees it."""

    @property
    def live_subscriber(self) -> bool: ...

    def refused(self, peer: str, user: str) -> None: ...

    def subscribe(
        self, outlet: Any, key: bytes, speaks: int, resume: tuple[int, int] | None
    ) -> None: ...

    def acked(self, outlet: Any, tag: int, multiple: bool) -> None: ...

    def unsubscribed(self, outlet: Any) -> None: ...


class FeedServiceHost(Protocol):
    """What the replication feed's consume service (``channel_feed.FeedService``) asks of
    the broker."""

    config: ServerConfig
    log: ChangeLog | None
    leading: bool
    feed: FeedPort


class Outlet(Protocol):
    """A consumer that is not a queue's (``ConsumeService``), as its channel sees it:
    the channel hands it the acks of its deliveries and tells it when it ends."""

    consumer_tag: str

    def start(self) -> None:
        """After Consume-Ok: deliveries may begin."""

    def acked(self, tag: int, multiple: bool) -> None: ...

    def ended(self) -> None:
        """Cancelled by its client, or its channel is closing."""


class OutletChannel(Protocol):
    """A channel, as an outlet on it sees it: its number, its connection, its prefetch,
    its delivery tags and a way to tell its client a consumer was cancelled."""

    number: int
    connection: ChannelOwner
    consumer_prefetch: int

    def next_tag(self) -> int: ...

    def cancel_consumer(self, tag: str) -> None: ...


class ConsumeService(Protocol):
    """What answers a Basic.Consume of a name that is not a queue (the replication feed's
    ``amq.replication``): the channel routes the consume, its acks and its end here,
    knowing nothing of what the service is."""

    def open(self, channel: OutletChannel, tag: str, method: Any) -> Outlet:
        """Check the consume (raise the AMQP error that refuses it) and answer its
        outlet; nothing is delivered before ``Outlet.start``."""
        ...


class Memory(Protocol):
    """The memory account (``memory_account.MemoryAccount``), as what counts against it
    and what reads it see it."""

    over: bool  # the alarm is on
    message_budget: int  # what messages may hold before the next check

    def check(self) -> None: ...

    def in_use(self) -> int: ...

    def count_input(self, delta: int) -> None:
        """Bytes of partial frames and bodies being assembled, counted against the
        watermark (negative: released)."""
        ...

    def output_paused(self, delta: int) -> None:
        """One more (+1) or one fewer (-1) connection whose socket stopped draining."""
        ...


class Watch(Protocol):
    """The hangup watch (``held.HangupWatch``): a connection not read for a reason that
    may last is watched for its client's going."""

    def watch(self, connection: Any, watch: bool) -> None: ...


class ConfirmBook(Protocol):
    """The confirm pipeline (``confirm_pipeline.ConfirmPipeline``), as a channel hands it
    what waits for the watermark."""

    waiting: Waiting

    def expect_commit(self, commit: Commit) -> None:
        """A transaction's commit waits for its LSN (its connection answers it)."""
        ...


class ChannelHost(Protocol):
    """What a channel asks of the broker."""

    loop: asyncio.AbstractEventLoop
    config: ServerConfig
    pair: Pair
    confirms: ConfirmBook
    log: ChangeLog | None
    leading: bool
    blocked: bool
    memory: Memory
    switching: bool  # a planned switchover drains this ACTIVE (leadership.py)

    def now(self) -> float: ...

    def block_reason(self) -> str:
        """Why publishers are blocked, as Connection.Blocked says it."""
        ...

    def watch_queue(self, queue: Queue) -> None: ...

    def when_safe(self, lsn: int, done: Callable[[bool], None]) -> None: ...

    def consume_service(self, queue: str) -> ConsumeService | None:
        """The service behind a name consumed without a queue (``ConsumeService``), or
        None for a queue."""
        ...

    def reply_consumer(self, address: str) -> Any:
        """The direct reply-to consumer behind ``address``, or None."""
        ...

    def add_reply(self, address: str, consumer: Any) -> None: ...

    def forget_reply(self, address: str) -> None: ...


class ChannelOwner(Protocol):
    """A channel's connection, as the channel sees it."""

    @property
    def broker(self) -> ChannelHost: ...  # read only: the connection's is a BrokerHost

    loop: asyncio.AbstractEventLoop
    user: User
    vhost: VHost | None  # from Connection.Open on (a channel opens after it)
    peer: str
    nonce: bytes
    frame_max: int
    reading: bool  # handling a read's frames: an ack's wake waits for its end
    to_wake: list[Any]
    bypasses_gate: bool
    published: bool
    publishes_messages: bool  # to an exchange that is not a control exchange
    federation_linked: bool  # a federation link's own connection
    write_paused: bool
    turn_spent: bool  # this turn handed out its bytes (TURN_OUTPUT): deliveries wait a turn
    channels: dict[int, Any]
    exclusive_queues: dict[str, Queue]

    def send(self, data: bytes) -> None: ...

    def flush(self) -> None: ...

    def confirms_due(self, confirms: Confirms) -> None: ...

    def settle_confirms(self, confirms: Confirms) -> None: ...

    def drop_confirms(self, confirms: Confirms) -> None: ...

    def capability(self, name: str) -> bool: ...

    def mark_publisher(self) -> None: ...

    def hold_reading(self, reason: int, hold: bool) -> None: ...

    def fail(self, error: exceptions.AMQPError, class_id: int = 0, method_id: int = 0) -> None: ...

    def forget_channel(self, number: int) -> None: ...


class ConnectionHost(Protocol):
    """What a client connection asks of the broker."""

    config: ServerConfig
    pair: Pair

    def now(self) -> float: ...

    def admit(self, connection: Any) -> bool: ...

    async def authenticate(
        self, username: str, password: str, address: str, mechanism: str, nonce: bytes = b""
    ) -> User | Refused: ...

    def user_known(self, username: str) -> bool: ...

    def server_properties(self) -> dict[str, Any]: ...

    def vhost(self, name: str) -> VHost: ...

    def connection_refusal(self, user: User, vhost: str) -> str | None: ...

    def connection_opened(self, connection: Any) -> None: ...

    def connection_closed(self, connection: Any) -> None: ...

    def channel_opened(self, connection: Any) -> None: ...

    def channel_closed(self, connection: Any) -> None: ...

    memory: Memory
    hangups: Watch

    def hold(self, connection: Any) -> None: ...


class BrokerHost(ChannelHost, ConnectionHost, Protocol):
    """The broker as a connection holds it: for itself and for its channels."""


class MetricsSource(Protocol):
    """What the metrics endpoint reads of the broker, once per snapshot."""

    config: ServerConfig
    pair: Pair
    vhosts: dict[str, VHost]
    blocked: bool
    memory: Memory

    def open_connections(self) -> list[Any]: ...

    def store_status(self) -> dict[str, Any]: ...

    def replication_status(self) -> dict[str, Any]: ...


class DefinitionsHost(Protocol):
    """What a definitions import asks of the broker: a vhost made on demand, a new
    queue's timers, the users, vhosts and permissions it makes at run time."""

    config: ServerConfig
    access: Access

    def vhost(self, name: str) -> VHost: ...

    def watch_queue(self, queue: Queue) -> None: ...

    def record_access(self, change: Any) -> None: ...


class ManagementSource(MetricsSource, DefinitionsHost, Protocol):
    """What the management API reads of the broker and asks of it: logins checked as
    AMQP's, its start time, a vhost made on demand and a queue's timers (definitions)."""

    started: float
    auth: Any  # ``auth.Authenticator``: its ``lookup`` of a user as a login sees it

    async def authenticate(
        self, username: str, password: str, address: str, mechanism: str
    ) -> User | Refused: ...

    def enqueue(self, message: Any, queues: tuple[Queue, ...], vhost: str = "/") -> bool: ...

    def last_lsn(self) -> int: ...

    def when_safe(self, lsn: int, done: Callable[[bool], None]) -> None: ...

    def client_connections(self) -> list[Any]: ...


class ReplicationHost(Protocol):
    """What the replication feed (ACTIVE) and follower (PASSIVE) ask of the broker."""

    config: ServerConfig
    ids: MessageIds
    log: ChangeLog | None
    vhosts: dict[str, VHost]
    access: Access
    safe_lsn: int

    def now(self) -> float: ...

    def replicated(self, changes: list[Any]) -> int: ...

    def when_safe(self, lsn: int, done: Callable[[bool], None]) -> None: ...

    def before_reset(self) -> None: ...


class ControlPlane(Protocol):
    """A control exchange's service as it sees the broker: it takes the exchange's
    publishes and answers through the asker's reply address."""

    config: ServerConfig
    vhosts: dict[str, VHost]
    pair: Pair
    loop: asyncio.AbstractEventLoop

    def receive_control(
        self,
        exchange: str,
        receiver: Callable[[Any, Any], None],
        vhost: str | None = "/",
    ) -> None: ...

    def reply_consumer(self, address: str) -> Any: ...

    def enqueue(self, message: Any, queues: tuple[Queue, ...], vhost: str = "/") -> bool: ...


class FederationHost(ControlPlane, Protocol):
    """What federation asks of the broker: the links route into its vhosts once the
    memory alarm and the store allow, the upstream service answers on amq.federation
    and hears of connections that close, and either reports events for the pair's log."""

    blocked: bool
    leading: bool
    memory: Memory

    def now(self) -> float: ...

    def when_safe(self, lsn: int, done: Callable[[bool], None]) -> None: ...

    def when_closed(self, hook: Callable[[Any], None]) -> None: ...

    def federation_event(self, fields: dict[str, Any]) -> None: ...


class ConsoleHost(ControlPlane, Protocol):
    """What the console service reads of the broker and asks of it (amq.console)."""

    access: Access
    auth: Any  # ``auth.Authenticator``: its ``lookup`` of a user as a login sees it

    started: float
    connections: set[Any]
    control_received: dict[str, dict[str, int]]
    # The federation agent (``federation.agent.Federation``), or None without one.
    federation: Any

    def open_connections(self) -> list[Any]: ...

    def client_connections(self) -> list[Any]: ...

    def store_status(self) -> dict[str, Any]: ...

    def record_access(self, change: Any) -> None: ...

    def last_lsn(self) -> int: ...

    def when_safe(self, lsn: int, done: Callable[[bool], None]) -> None: ...
