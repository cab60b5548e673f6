"""The broker process: the vhosts, the connections, and the wiring of its parts.

Owns: the set of connections and the limits on them (per node, vhost and user), users and
authentication (through ``auth``), server properties, the pair it belongs to
(``Broker.pair``, a ``gate.Pair``: standalone unless a failover controller attaches
itself), the receivers of the control exchanges, clean shutdown (every connection closed
with 320, files flushed), whether publishers are blocked (the memory alarm or a failing
store), and ``serve``, which builds a broker and its services. The parts it holds, each
its own object: the listening sockets (``Broker.listener``, ``listener.py``: the only
socket code), the memory account and its alarm (``Broker.memory``,
``memory_account.py``), the held connections and the hangup watch (``Broker.held``,
``Broker.hangups``, ``held.py``), the confirm pipeline (``Broker.confirms``,
``confirm_pipeline.py``), the queue timers (``Broker.timers``, ``queue_timers.py``). The
parts mixed in: leading and following (``leadership.py``), the store's side
(``broker_store.py``).

Must not know: frames (``connection``), routing and queue rules (``core``), the
failover state machine (it only ever sees the ``gate.Pair`` interface).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import platform
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import exceptions

from config import ServerConfig, User
from config.schema import format_host_port
from failover import keys

from . import __version__, clock, compiled, flow
from .auth import Authenticator, Refused
from .broker_store import StoreSide, StoreSink
from .channel_feed import FeedService
from .collector import Collector
from .confirm_pipeline import ConfirmPipeline
from .connection import CLOSED, OPEN, Connection
from .console_service import ConsoleService
from .core import release
from .core.access import Access
from .core.apply import apply
from .core.changes import ChangeLog
from .core.message import Message, MessageIds
from .core.queue import Queue
from .core.reserved import FEED_QUEUE
from .core.sync import Sink
from .core.vhost import REFUSED, VHost
from .federation.agent import Federation
from .federation.upstream import UpstreamService
from .follower import Follower
from .gate import Pair, PairEvents, Standalone
from .held import HangupWatch, HeldConnections
from .leadership import Leadership
from .listener import Listener
from .memory_account import MemoryAccount
from .queue_timers import QueueTimers
from .read_holds import READ_HELD_SWITCHOVER
from .replication import Feed

if TYPE_CHECKING:
    from .host import ConsumeService
    from .store import Store

log = logging.getLogger("amqha.server")

CLOSE_WAIT = 2.0
# Queued messages are many small long-lived objects: at the default thresholds (700,
# 10, 10) the collector walks them over and over while queues fill, a sixth of the
# publish path's CPU. Collecting young objects every 10000 allocations instead leaves
# too little of that to measure; the broker's own reference cycles are few and short-lived.
GC_THRESHOLDS = (10_000, 10, 10)
# How long a thread may hold the GIL while another waits for it. The store's writer thread
# returns from each SQLite call (and the heartbeat thread wakes) needing the GIL back
# from a busy loop thread: at Python's default 5 ms, every group commit waits that long.
SWITCH_INTERVAL = 0.0005
# How often the loop asks whether the last full collection was slow (collector.py).
COLLECTOR_CHECK = 1.0

CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "consumer_priorities": True,
    "connection.redirect": True,
    "direct_reply_to": True,
}


class Broker(Leadership, StoreSide):
    """A broker process's state and its wiring; its parts: the memory account
    (``memory_account.py``), leadership (``leadership.py``), the store's side
    (``broker_store.py``), the queue timers (``queue_timers.py``)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.vhosts: dict[str, VHost] = {}
        # The users, vhosts and permissions made at run time: replicated state
        # (``core.access``), applied as every other change.
        self.access = Access()
        # The control receivers set in every vhost (``receive_control`` with no vhost).
        self.control_everywhere: dict[str, Callable[[Message, Connection], None]] = {}
        self.ids = MessageIds()
        # The change stream and the store it feeds: attached by ``open_store`` once the
        # store is recovered (None: nothing is durable, as with store.enabled false).
        self.log: ChangeLog | None = None
        self.store: Store | None = None
        self.store_sink: StoreSink | None = None  # with a store: its progress
        # Where each turn's changes go (with a store: the replication feed and the store;
        # ``core.sync.Sink``), whose progress the confirm pipeline turns into confirms.
        self.sinks: list[Sink] = []
        self.confirms = ConfirmPipeline(self.loop)
        self.store_failing = False
        self.disk_failed: str | None = None  # the store's disk failed: why (broker_store)
        self.store_failures = 0
        self.store_retry: asyncio.TimerHandle | None = None
        self.recovered: dict[str, Any] = {}
        # A damaged store set aside at open (broker_store.py): its new path and why.
        self.store_damaged: dict[str, Any] | None = None
        # Replication (docs/durability.md, section 5). A standalone server leads; a pair
        # member leads while ACTIVE (``lead``) and follows its ACTIVE peer while PASSIVE
        # (``follow``): the pair tells it which.
        self.leading = config.failover.role is None
        # A planned switchover drains this ACTIVE: publishers are not read (leadership.py),
        # and hear a heartbeat at every tick of this timer meanwhile.
        self.switching = False
        self.drain_heartbeats: asyncio.TimerHandle | None = None
        self.feed = Feed(self, self._feed_sync, self._feed_unprotected)
        # Names consumed without a queue, and their services: the replication feed's.
        self.consume_services: dict[str, ConsumeService] = {FEED_QUEUE: FeedService(self)}
        self.follower: Follower | None = None
        # The epoch this server last led in, and (the last LSN of its ACTIVE's it had
        # received, its own LSN) when it last took over: the two ends of a resume after a
        # handover (leadership.py).
        self._led_epoch = 0
        self._took_over: tuple[int, int] | None = None
        # Who hears of sync, quarantine and federation events for the pair's event log:
        # the pair's controller, once it attaches itself; standalone, nobody.
        self.pair_events: PairEvents | None = None
        # What this server answers on amq.federation (``serve`` starts it).
        self.upstream: UpstreamService | None = None
        self.quarantined: list[dict[str, Any]] = []
        for user in config.users:
            for name in user.vhosts:
                self.vhost(name)
        self.connections: set[Connection] = set()
        self.timers = QueueTimers(self.loop, self._on_queue_due, clock.pair_now)
        self.channel_count = 0
        self.memory = MemoryAccount(
            self.loop,
            config.limits.memory_high_watermark,
            config.limits.output_buffer,
            self._census,
            self.update_blocked,
        )
        # Publishers are blocked (Connection.Blocked, not read) while the memory alarm is
        # on or the store fails.
        self.blocked = False
        # Full collections over millions of queued messages kept short (collector.py).
        self.collector = Collector()
        self._collector_check: asyncio.TimerHandle | None = None
        # Connections not read for a reason that may last (blocked, say): asyncio would
        # see their client's FIN or reset only by reading, so the watch polls them.
        self.hangups = HangupWatch(self.loop)
        # Open connections per vhost and per user, and channels per user, for the limits.
        self.vhost_connections: dict[str, int] = {}
        self.user_connections: dict[str, int] = {}
        self.user_channels: dict[str, int] = {}
        self.refused_sockets = 0
        self.started = clock.now()
        # The listening sockets (the only socket code): each accepted one a Connection.
        self.listener = Listener(self.loop, lambda: Connection(self))
        self.pair: Pair = Standalone(config.name, config.public_address)
        # Client connections held while the pair says this server is not serving.
        self.held = HeldConnections(self.loop, lambda: self.pair.serving())
        # What reached each control exchange's receiver, by authenticated user.
        self.control_received: dict[str, dict[str, int]] = {}
        self._on_close: list[Callable[[Connection], None]] = []
        self._users = {user.name: user for user in config.users}
        self.auth = Authenticator(config.users, config.auth, time.monotonic)
        self.auth.access = self.access
        # Direct reply-to: the reply consumer behind each address handed out in reply_to.
        self.direct_replies: dict[str, Any] = {}
        # The federation links (amqha.federation.agent.Federation): run while this leads.
        self.federation: Any = None

    # -- model access ---------------------------------------------------------------------

    def now(self) -> float:
        """The pair's time (``amqha.clock.pair_now``): epoch seconds on this process's steady
        wall clock, moved to its ACTIVE's when it follows one. Deadlines in the change
        stream mean the same after a restart and on the peer, and a step of the system
        clock while this runs moves none (timers convert to the loop's clock)."""
        return clock.pair_now()

    def _buffer_guard(self, queue: str, connection: object, reading: bool) -> str | None:
        """Why ``connection`` may not touch federation buffer queue ``queue``, or None: its
        messages (``reading``) are only for the link that proved the queue's downstream
        name; an administrator may also repair or remove it (docs/federation.md)."""
        user = getattr(connection, "user", None)
        if not reading and user is not None and "administrator" in user.tags:
            return None
        if self.upstream is None:
            return "only its own federation link may use it"
        return self.upstream.buffer_refusal(queue, connection)

    def vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            # Logged while this server leads (a PASSIVE applies, ``lead`` attaches the log).
            log_ = self.log if self.leading else None
            vhost = VHost(name, clock.pair_now, log_, self.ids, self.config.global_name)
            vhost.max_queues = self.config.limits.vhost.max_queues
            vhost.max_arguments_size = self.config.limits.max_arguments_size
            vhost.replicate_default = self.config.replication.default
            vhost.on_queue_deleted = self._queue_deleted
            vhost.guard = self._buffer_guard
            for exchange, receiver in self.control_everywhere.items():
                vhost.set_control_receiver(exchange, receiver)
            self.vhosts[name] = vhost
        return vhost

    async def authenticate(
        self, username: str, password: str, address: str, mechanism: str, nonce: bytes = b""
    ) -> User | Refused:
        """The user, or a refusal once its delay has passed (see ``auth``). A peering
        user may prove the pair's secret on this connection's ``nonce`` instead of sending
        its password (docs/security.md, "Logins")."""
        if password.startswith(keys.PROOF_PREFIX):
            user = self._users.get(username)
            if (
                user is not None
                and "peering" in user.tags
                and keys.peering_login_holds(self.config.failover.secret, nonce, username, password)
            ):
                return user
        return await self.auth.login(username, password, address, mechanism)

    def record_access(self, change: Any) -> None:
        """Apply a change of the run-time users, vhosts or permissions on this serving
        server and log it like wiring (docs/security.md, "Users at run time")."""
        apply(self, change, clock.pair_now())
        if self.leading and self.log is not None:
            self.log.emit(change, sync=True)

    def last_lsn(self) -> int:
        """The LSN of the last change this server logged as ACTIVE (0: none, or it does
        not lead): what a reply that must be safe waits for (``when_safe``)."""
        return self.log.lsn if self.leading and self.log is not None else 0

    def user_known(self, username: str) -> bool:
        return self.auth.lookup(username)[0] is not None

    def server_properties(self) -> dict[str, Any]:
        return {
            "product": "amqha",
            "version": __version__,
            "platform": f"Python {platform.python_version()}",
            "copyright": "amqha contributors",
            "information": "AMQP 0-9-1 broker, primary/backup pair",
            "cluster_name": self.config.name,
            # The name other places know this server by (docs/federation.md, "Names").
            "amqha-name": self.config.global_name,
            "capabilities": dict(CAPABILITIES),
            "amqha": self.pair.info(),
        }

    # -- delivery -------------------------------------------------------------------------

    # -- the store ------------------------------------------------------------------------

    # -- replication ----------------------------------------------------------------------

    # -- what connections and channels report (host.ChannelHost, host.ConnectionHost) -----

    def reply_consumer(self, address: str) -> Any:
        return self.direct_replies.get(address)

    @property
    def safe_lsn(self) -> int:
        """Confirms may go out for everything up to this LSN (the confirm pipeline's)."""
        return self.confirms.safe_lsn

    def consume_service(self, queue: str) -> ConsumeService | None:
        return self.consume_services.get(queue)

    def add_reply(self, address: str, consumer: Any) -> None:
        self.direct_replies[address] = consumer

    def forget_reply(self, address: str) -> None:
        self.direct_replies.pop(address, None)

    # -- delivery -------------------------------------------------------------------------

    def enqueue(self, message: Message, queues: tuple[Queue, ...], vhost: str = "/") -> bool:
        """Put a message on given queues (the console's answers); False if refused."""
        return self.vhost(vhost).enqueue(message, queues, self.now()) != REFUSED

    def watch_queue(self, queue: Queue) -> None:
        """A queue was declared (or redeclared): its timer follows its due time from now on."""
        if queue.on_due_changed is None:
            queue.on_due_changed = self.timers.schedule
        self.timers.schedule(queue)

    def _queue_deleted(self, queue: Queue) -> None:
        for consumer in queue.clear_consumers():
            consumer.cancelled()  # type: ignore[attr-defined]

    def receive_control(
        self,
        exchange: str,
        receiver: Callable[[Message, Connection], None],
        vhost: str | None = "/",
    ) -> None:
        """Hand publishes to control exchange ``exchange`` to ``receiver(message, connection)``
        in ``vhost`` (None: in every vhost, those made later included).

        ``connection`` is the one that published: its login, never a message property,
        says who asked. Only a user with the exchange's tag can publish there; nothing
        else reaches the receiver. What arrives is counted by user (console ``status``).
        """
        received = self.control_received.setdefault(exchange, {})

        def counted(message: Message, connection: Connection) -> None:
            user = connection.user.name
            received[user] = received.get(user, 0) + 1
            receiver(message, connection)

        if vhost is not None:
            self.vhost(vhost).set_control_receiver(exchange, counted)
            return
        self.control_everywhere[exchange] = counted
        for each in self.vhosts.values():
            each.set_control_receiver(exchange, counted)

    def _on_queue_due(self, queue: Queue, now: float) -> None:
        if not self.leading:
            return  # a PASSIVE's queues follow the ACTIVE's expiries, never their own
        queue.expire(now)
        if queue.is_idle_expired(now):
            vhost = self._vhost_of(queue)
            if vhost is not None:
                vhost.remove_queue(queue)

    def _vhost_of(self, queue: Queue) -> VHost | None:
        return next((v for v in self.vhosts.values() if v.queues.get(queue.name) is queue), None)

    # -- holding work while the pair says we are not serving ------------------------------

    # -- connections ----------------------------------------------------------------------

    def admit(self, connection: Connection) -> bool:
        """A new socket: False when the node already holds ``limits.max_connections``."""
        if len(self.connections) >= self.config.limits.max_connections:
            self.refused_sockets += 1
            if self.refused_sockets == 1 or self.refused_sockets % 1000 == 0:
                log.warning(
                    "connection limit (%d) reached: %s closed at once (%d so far)",
                    self.config.limits.max_connections,
                    connection.peer,
                    self.refused_sockets,
                )
            return False
        self.connections.add(connection)
        return True

    def connection_refusal(self, user: User, vhost: str) -> str | None:
        """Why Connection.Open must be refused (530) under the vhost or user limits, if so."""
        limits = self.config.limits
        vhost_limit = limits.vhost.max_connections
        if vhost_limit and self.vhost_connections.get(vhost, 0) >= vhost_limit:
            return (
                f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user.name}': "
                f"connection limit ({vhost_limit}) is reached"
            )
        user_limit = limits.user.max_connections
        if user_limit and self.user_connections.get(user.name, 0) >= user_limit:
            return (
                f"NOT_ALLOWED - Connection refused for user '{user.name}': "
                f"user connection limit ({user_limit}) is reached"
            )
        return None

    # -- publishers blocked, connections held --------------------------------------------

    def _census(self) -> tuple[int, int, int]:
        """What the memory account counts: queues, connections and channels in use."""
        queues = sum(len(vhost.queues) for vhost in self.vhosts.values())
        return queues, len(self.connections), self.channel_count

    def update_blocked(self) -> None:
        """The memory alarm or the store's state changed: publishers are blocked while
        either holds, and each connection is told (``flow.alarm``)."""
        blocked = self.memory.over or self.store_failing
        if blocked == self.blocked:
            return
        self.blocked = blocked
        for connection in list(self.connections):
            self._apply_block(connection)

    def block_reason(self) -> str:
        if self.memory.over:
            return "low on memory"
        if self.disk_failed is not None:
            return "the message store's disk failed"
        return "message store cannot write"

    def _apply_block(self, connection: Connection) -> None:
        """The alarm began or ended: ``flow`` says whom it tells and holds."""
        if connection.transport is not None and connection.state == OPEN:
            flow.alarm(connection, self.block_reason() if self.blocked else None)

    def hold(self, connection: Connection) -> None:
        """Hold a client connection's work until the pair serves again or steps down."""
        self.held.hold(connection)

    def hold_all(self) -> None:
        for connection in self.client_connections():
            self.held.hold(connection)

    def release_held(self) -> None:
        self.held.release()

    def connection_opened(self, connection: Connection) -> None:
        vhost, user = connection.vhost.name, connection.user.name
        self.vhost_connections[vhost] = self.vhost_connections.get(vhost, 0) + 1
        self.user_connections[user] = self.user_connections.get(user, 0) + 1
        connection.counted = True
        if self.switching and not connection.bypasses_gate:
            connection.hold_reading(READ_HELD_SWITCHOVER, True)
        if self.blocked:
            self._apply_block(connection)

    def connection_closed(self, connection: Connection) -> None:
        self.connections.discard(connection)
        self.held.forget(connection)
        self.hangups.watch(connection, False)
        if connection.counted:
            connection.counted = False
            vhost, user = connection.vhost.name, connection.user.name
            self.vhost_connections[vhost] -= 1
            self.user_connections[user] -= 1
        for hook in self._on_close:
            hook(connection)

    def when_closed(self, hook: Callable[[Connection], None]) -> None:
        """Call ``hook`` with each connection that closes from now on."""
        self._on_close.append(hook)

    def attach(self, events: PairEvents | None) -> None:
        """The pair's controller hears sync, quarantine and federation events from now on
        (None: nobody does any more)."""
        self.pair_events = events

    def federation_event(self, fields: dict[str, Any]) -> None:
        """A `federation` event record's fields (a refused link's hello, say), for the
        pair's event log; standalone, nothing records it."""
        events = self.pair_events
        if events is not None:
            events.federation_event(fields)

    def channel_opened(self, connection: Connection) -> None:
        """Count a channel against its user's limit; raises 530 past it."""
        user = connection.user.name
        limit = self.config.limits.user.max_channels
        count = self.user_channels.get(user, 0)
        if limit and count >= limit:
            raise exceptions.AMQPNotAllowed(
                f"NOT_ALLOWED - number of channels opened for user '{user}' has reached "
                f"the maximum allowed user limit of ({limit})"
            )
        self.user_channels[user] = count + 1
        self.channel_count += 1

    def channel_closed(self, connection: Connection) -> None:
        self.user_channels[connection.user.name] -= 1
        self.channel_count -= 1

    def open_connections(self) -> list[Connection]:
        """Connections whose AMQP close has not completed: one whose Close-Ok went out
        is closed, though its socket may wait a moment for the client to close it."""
        return [c for c in self.connections if c.state < CLOSED]

    def client_connections(self) -> list[Connection]:
        """Open connections that the failover gate governs (not peers, not admins)."""
        return [c for c in self.connections if c.state == OPEN and not c.bypasses_gate]

    def admin_connections(self) -> list[Connection]:
        """Open connections of administrators: admitted past the gate, closed on step-down."""
        return [
            c
            for c in self.connections
            if c.state == OPEN and c.bypasses_gate and "peering" not in c.user.tags
        ]

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.open_store()
        await self.listener.open(self.config.addresses, self.config.tls, self.config.source)
        self.memory.start()
        self.collector.install()
        self._check_collector()
        release.set_waker(self._release_soon)

    def _release_soon(self) -> None:
        """Big drops (a purge, a delete) are freed a slice a turn (core/release.py)."""
        try:
            self.loop.call_soon(self._release_some)
        except RuntimeError:  # the loop is closed: no turn comes, so all now
            while release.some():
                pass

    def _release_some(self) -> None:
        if release.some():
            self.loop.call_soon(self._release_some)

    def _check_collector(self) -> None:
        self.collector.check()
        self._collector_check = self.loop.call_later(COLLECTOR_CHECK, self._check_collector)

    @property
    def port(self) -> int:
        return self.listener.port

    async def stop(self, text: str = "CONNECTION_FORCED - broker shutdown") -> None:
        self.memory.stop()
        if self._collector_check is not None:
            self._collector_check.cancel()
        self.collector.remove()
        self.hangups.stop()
        self.timers.close()
        try:
            self.listener.close()
            for connection in list(self.connections):
                connection.close_forced(text)
            deadline = self.loop.time() + CLOSE_WAIT
            while self.connections and self.loop.time() < deadline:
                await asyncio.sleep(0.02)
            for connection in list(self.connections):
                if connection.transport is not None:
                    connection.transport.abort()
        finally:
            # Whatever went wrong above, what the store was given is written and closed.
            self.auth.close()
            self.close_store()
            release.set_waker(None)


def tune_gc() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL)


def install_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


async def serve(
    config: ServerConfig,
    ready: Callable[[Broker], None] | None = None,
    pair: Callable[[Broker, ServerConfig], Any] | None = None,
) -> None:
    """Run one broker until SIGTERM or SIGINT, then shut it down cleanly.

    ``pair`` builds the broker's ``gate.Pair`` service (a failover controller, with
    ``start``/``stop``); without it the server runs standalone.
    """
    tune_gc()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    broker = Broker(config)
    ConsoleService(broker).start()
    broker.upstream = UpstreamService(broker)
    broker.upstream.start()
    services = []
    if pair is not None:
        service = pair(broker, config)
        broker.pair = service
        services.append(service)
    # Before the broker starts: a run-time federations file it cannot read stops the start.
    federation = Federation(broker, getattr(broker.pair, "record", None))
    await broker.start()
    broker.federation = federation
    federation.set_leading(broker.leading)
    # The HTTP endpoints (aiohttp, prometheus_client, the report's timeline) are imported
    # only when configured: a server without them starts that much sooner.
    endpoints: list[Any] = []
    if config.metrics_listen is not None:
        from .metrics import MetricsEndpoint

        endpoints.append(MetricsEndpoint(broker))
    if config.management is not None:
        from .management.api import ManagementEndpoint

        endpoints.append(ManagementEndpoint(broker))
    for endpoint in endpoints:
        await endpoint.start()
    for service in services:
        await service.start()
    amqps = "" if config.tls is None else f", amqps on {config.tls.listen}"
    if config.management is not None:
        scheme = "https" if config.management.tls else "http"
        amqps += f", management on {scheme}://{config.management.listen}/"
    print(f"amqha {config.name}: hot path {compiled.describe()}", file=sys.stderr)
    print(
        f"amqha {config.name} ({config.failover.role or 'standalone'}) listening on "
        + ", ".join(format_host_port(host, port) for host, port in config.addresses)
        + amqps,
        file=sys.stderr,
        flush=True,
    )
    if ready is not None:
        ready(broker)
    await stop.wait()
    print(f"amqha {config.name}: shutting down", file=sys.stderr, flush=True)
    await broker.drain_before_stop()
    await federation.close()
    for service in reversed(services):
        await service.stop()
    for endpoint in reversed(endpoints):
        await endpoint.stop()
    broker.upstream.stop()
    await broker.stop()
