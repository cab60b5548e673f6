"""The broker process: the listening socket, the vhosts, and the timers around them.

Owns: the TCP listener and the amqps (TLS) listener beside it (the only socket code),
the set of connections and the limits on them (per node, vhost and user), users and
authentication (through ``auth``), server properties, the queue timers (message TTL and
x-expires: a heap keyed on each queue's next due time, so idle queues cost nothing),
the memory watermark that blocks publishers, the pair it belongs to (``Broker.pair``,
a ``gate.Pair``: standalone unless a failover controller attaches itself), the
receivers of the control exchanges, and clean shutdown (every connection closed with
320, files flushed).

Memory: what the process holds for its clients is counted as it changes, never by
walking queues or connections: message bytes plus a per-message overhead
(``Message.held``), arguments of bindings, exchanges and queues (``ArgumentBytes``),
partial frames and content being assembled, output held for sockets that do not drain,
a fixed cost per queue, connection, channel and priority lane in use, and each
binding's cost. When that passes ``limits.memory_high_watermark`` the alarm is on until
it falls below: a connection that publishes a message is told (Connection.Blocked) and
no longer read; consumers, requests to the control plane and the pair's own links never
are (docs/limits.md, "What the alarm holds").

Must not know: frames (``connection``), routing and queue rules (``core``), the
failover state machine (it only ever sees the ``gate.Pair`` interface).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import heapq
import itertools
import logging
import platform
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pamqp import exceptions

from config import ServerConfig, User
from config.schema import format_host_port
from config.tls import server_context
from failover import keys

from . import __version__, flow
from .auth import Authenticator, Refused
from .connection import CLOSED, OPEN, Connection
from .console_service import ConsoleService
from .core.apply import apply_run
from .core.changes import ChangeLog
from .core.message import Message, MessageIds
from .core.priority import Lane
from .core.queue import Queue
from .core.routing import ArgumentBytes
from .core.sync import Sink, watermark
from .core.vhost import VHost
from .federation.agent import Federation
from .federation.upstream import UpstreamService
from .gate import Pair, Standalone
from .logtext import escaped
from .quarantine import (
    clear_incomplete,
    clear_unprotected_mark,
    mark_incomplete,
    quarantine,
    read_unprotected_mark,
    write_unprotected_mark,
)
from .replication import Feed, Follower

if TYPE_CHECKING:
    from .store import Store, StoreFailure

log = logging.getLogger("amqha.server")

# How often the watermark is re-checked while nothing publishes (publishes check at once).
MEMORY_CHECK_INTERVAL = 0.1
# How often sockets not being read are looked at for their client's going, and the poll
# events that say it went: a FIN (POLLRDHUP, Linux; seen though unread bytes are ahead
# of it) or a reset (POLLHUP, POLLERR).
HANGUP_CHECK_INTERVAL = 0.5
HANGUP_EVENTS = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR
# Fixed costs counted against the watermark, measured with bench/memory_attacks.py:
# a queue with its limits, deques and dicts; a connection with its transport, buffers
# and handshake state; a channel with its maps.
QUEUE_COST = 2048
# A priority queue's lane (one per priority holding messages): its deque and heap with
# a first message, 896 B measured with tracemalloc.
LANE_COST = 1024
CONNECTION_COST = 16 * 1024
CHANNEL_COST = 1200
# While the pair says this server is not serving, held connections are looked at this often.
HOLD_RECHECK = 0.05
TLS_HANDSHAKE_TIMEOUT = 10.0
CLOSE_WAIT = 2.0
# Message ids of one ACTIVE term: a block of 2**40 per (epoch, role).
ID_BLOCK_BITS = 40
# After a store write fails (a full disk), publishers stay blocked this long before the
# next write is tried.
STORE_RETRY = 1.0
# Queued messages are many small long-lived objects: at the default thresholds (700,
# 10, 10) the collector walks them over and over while queues fill, a sixth of the
# publish path's CPU. Collecting young objects every 10000 allocations instead leaves
# too little of that to measure; the broker's own reference cycles are few and short-lived.
GC_THRESHOLDS = (10_000, 10, 10)
# How long a thread may hold the GIL while another waits for it. The store's writer thread
# returns from each SQLite call (and the heartbeat thread wakes) needing the GIL back
# from a busy loop thread: at Python's default 5 ms, every group commit waits that long.
SWITCH_INTERVAL = 0.0005
# Recovery applies the stored changes this many at a time (core.apply.apply_run).
RECOVER_RUN = 4096

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


class _StoreSink:
    """The store as a sink: it holds what its writer reported written (``_stored``)."""

    __slots__ = ("store", "broker")

    def __init__(self, store: Store, broker: Broker) -> None:
        self.store = store
        self.broker = broker

    def submit(self, first_lsn: int, changes: Sequence[Any]) -> None:
        self.store.submit(first_lsn, changes)

    def holds(self) -> int | None:
        return self.broker.store_lsn


class Broker:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.vhosts: dict[str, VHost] = {}
        # The control receivers set in every vhost (``receive_control`` with no vhost).
        self.control_everywhere: dict[str, Callable[[Message, Connection], None]] = {}
        self.ids = MessageIds()
        # The change stream and the store it feeds: attached by ``open_store`` once the
        # store is recovered (None: nothing is durable, as with store.enabled false).
        self.log: ChangeLog | None = None
        self.store: Store | None = None
        self.safe_lsn = 0  # confirms may go out for everything up to this LSN
        self.store_lsn = 0  # the store has everything up to this LSN on disk
        # Where each turn's changes go, and whose progress releases confirms (with a
        # store: the replication feed and the store; ``core.sync.Sink``).
        self.sinks: list[Sink] = []
        self.unsafe_channels: set[Any] = set()  # channels with confirms waiting for it
        self.waiting_safe: collections.deque[tuple[int, Callable[[bool], None]]] = (
            collections.deque()
        )
        self.store_failing = False
        self.store_failures = 0
        self.store_retry: asyncio.TimerHandle | None = None
        self.recovered: dict[str, Any] = {}
        # Replication (docs/durability.md, section 5). A standalone server leads; a pair
        # member leads while ACTIVE (``lead``) and follows its ACTIVE peer while PASSIVE
        # (``follow``): the pair tells it which.
        self.leading = config.failover.role is None
        self.feed = Feed(self, self._feed_sync, self._feed_unprotected)
        self.follower: Follower | None = None
        # (side, in_sync, reason) for the pair's event log: "active" (this server's feed)
        # or "passive" (this server following its peer).
        self.on_sync: Callable[[str, bool, str], None] | None = None
        self.on_quarantine: Callable[[dict[str, Any]], None] | None = None
        # The fields of a `federation` event record (a refused link's hello, say): the
        # pair's controller writes it to the event log; standalone, nothing does.
        self.on_federation: Callable[[dict[str, Any]], None] | None = None
        # What this server answers on amq.federation (``serve`` starts it).
        self.upstream: UpstreamService | None = None
        self.quarantined: list[dict[str, Any]] = []
        for user in config.users:
            for name in user.vhosts:
                self.vhost(name)
        self.connections: set[Connection] = set()
        self.timers = QueueTimers(self.loop, self._on_queue_due, time.time)
        # Publishers are blocked (Connection.Blocked, not read) while either holds.
        self.memory_over = False
        self.blocked = False
        # Memory counted against the watermark beyond Message.held (see the docstring).
        self.input_bytes = 0  # partial frames and multi-frame bodies being assembled
        self.paused_outputs = 0  # connections whose socket stopped draining
        # Connections not read for a reason that may last (blocked, say): asyncio would
        # see their client's FIN or reset only by reading, so ``_check_hangups`` polls them.
        self.unread: set[Connection] = set()
        self.hangup_timer: asyncio.TimerHandle | None = None
        self.channel_count = 0
        # What messages may hold before the watermark is reached, refreshed at each check:
        # a publish compares Message.held with it and checks at once when past it.
        self.message_budget = config.limits.memory_high_watermark
        self.input_at_check = 0  # input_bytes when message_budget was last computed
        # Open connections per vhost and per user, and channels per user, for the limits.
        self.vhost_connections: dict[str, int] = {}
        self.user_connections: dict[str, int] = {}
        self.user_channels: dict[str, int] = {}
        self.refused_sockets = 0
        self.started = time.time()
        self.server: asyncio.base_events.Server | None = None  # the first of ``servers``
        self.servers: list[asyncio.base_events.Server] = []
        self.memory_timer: asyncio.TimerHandle | None = None
        self.tls_server: asyncio.base_events.Server | None = None
        self.pair: Pair = Standalone(config.name, config.public_address)
        self.held: set[Connection] = set()
        # What reached each control exchange's receiver, by authenticated user.
        self.control_received: dict[str, dict[str, int]] = {}
        self._held_timer: asyncio.TimerHandle | None = None
        self.on_open: list[Callable[[Connection], None]] = []
        self.on_close: list[Callable[[Connection], None]] = []
        self._users = {user.name: user for user in config.users}
        self.auth = Authenticator(config.users, config.auth, time.monotonic)
        # Direct reply-to: the reply consumer behind each address handed out in reply_to.
        self.direct_replies: dict[str, Any] = {}
        # The federation links (amqha.federation.agent.Federation): run while this leads.
        self.federation: Any = None

    # -- model access ---------------------------------------------------------------------

    def now(self) -> float:
        """Wall-clock seconds: deadlines in the change stream mean the same after a
        restart and on the peer (timers convert to the loop's clock)."""
        return time.time()

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
            vhost = VHost(name, time.time, self.log, self.ids, self.config.global_name)
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

    def user_known(self, username: str) -> bool:
        return username in self._users

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

    def open_store(self) -> None:
        """Open the store, rebuild the durable state from it, then log every change to it.

        A store that cannot be read raises ``StoreError`` (one line naming the file)."""
        if not self.config.store.enabled:
            return
        from .store import Store

        started = time.monotonic()
        path = self.config.store_path
        store = Store.open(path, self.config.store.max_bytes)
        now = self.now()
        changes = store.recover()
        while run := list(itertools.islice(changes, RECOVER_RUN)):
            apply_run(self, run, now)
        self.ids.seen(store.max_msg_id())
        counts = store.counts()
        seconds = time.monotonic() - started
        pending = store.pending_runs_written
        self.recovered = dict(counts, seconds=round(seconds, 3), path=path, pending_runs=pending)
        if counts.get("queues") or counts.get("messages") or pending:
            # Runs a PASSIVE acked and had not written as rows yet: written at open.
            kept = f" ({pending} runs from the ACTIVE written first)" if pending else ""
            print(
                f"amqha {self.config.name}: recovered {counts.get('queues', 0)} durable "
                f"queues and {counts.get('messages', 0)} persistent messages from {path} "
                f"in {seconds:.2f} s{kept}",
                file=sys.stderr,
                flush=True,
            )
        self.log = ChangeLog(self._changes_pending)
        for vhost in self.vhosts.values():
            vhost.set_log(self.log)
            for queue in vhost.queues.values():
                self.watch_queue(queue)
        store.start(self._store_notified)
        self.store = store
        # The feed first: the PASSIVE's store is the longer way to the watermark.
        self.sinks = [self.feed, _StoreSink(store, self)]

    def _changes_pending(self) -> None:
        """The first change of this turn: they all go to the store when the turn ends."""
        self.loop.call_soon(self._take_changes)

    def _take_changes(self) -> None:
        if self.log is None or self.store is None:
            return
        first, changes = self.log.take()
        if changes:
            for sink in self.sinks:
                sink.submit(first, changes)

    def _store_notified(self, last_lsn: int, failed: StoreFailure | None) -> None:
        """Called on the store's writer thread: hand the news to the loop."""
        # A closed loop: the server is gone and nothing waits any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._stored, last_lsn, failed)

    def _stored(self, last_lsn: int, failed: StoreFailure | None) -> None:
        self.store_lsn = max(self.store_lsn, last_lsn)
        if failed is not None:
            self._refuse_range(failed.first_lsn, failed.last_lsn)
            self.store_failures += 1
            if not self.store_failing:
                log.warning(
                    "the store could not write (%s): publishes not stored are nacked and "
                    "publishers blocked; consumers are still served",
                    failed.error,
                )
                self.store_failing = True
                self._update_blocked()
            if self.store_retry is None:
                self.store_retry = self.loop.call_later(STORE_RETRY, self._retry_store)
        self._release_confirms()

    def _refuse_range(self, first: int, last: int) -> None:
        """The store could not write LSNs ``first``-``last``: what waits on them is
        refused now, whatever the watermark. Held back until the watermark passed the
        range (a PASSIVE behind it), such a publish was acked later, on the PASSIVE's
        copy alone, and lost if this server then led from its own store."""
        for channel in list(self.unsafe_channels):
            channel.store_failed(first, last)
        waiting = self.waiting_safe
        if any(first <= lsn <= last for lsn, _ in waiting):
            refused = [done for lsn, done in waiting if first <= lsn <= last]
            self.waiting_safe = collections.deque(
                (lsn, done) for lsn, done in waiting if not first <= lsn <= last
            )
            for done in refused:
                done(False)

    def _release_confirms(self) -> None:
        """Confirms may go out up to what the store has and, with an in-sync PASSIVE,
        what the PASSIVE has too (the watermark of docs/durability.md)."""
        safe = watermark([sink.holds() for sink in self.sinks])
        if safe <= self.safe_lsn:
            return
        self.safe_lsn = safe
        for channel in list(self.unsafe_channels):
            if not channel.store_progress(safe):
                self.unsafe_channels.discard(channel)
        waiting = self.waiting_safe
        while waiting and waiting[0][0] <= safe:
            _, done = waiting.popleft()
            done(True)

    # -- replication ----------------------------------------------------------------------

    def _feed_sync(self, in_sync: bool, reason: str) -> None:
        """The feed's subscriber became (or stopped being) an in-sync PASSIVE, or acked."""
        if reason:
            if in_sync:
                self._mark_unprotected(False)
            if self.on_sync is not None:
                self.on_sync("active", in_sync, reason)
        self._release_confirms()

    def _feed_unprotected(self, first_id: int) -> None:
        """The in-sync PASSIVE is gone: messages from ``first_id`` on may be on this
        server alone (those it was sent and had not acked included)."""
        self._mark_unprotected(True, first_id)

    def _follower_sync(self, in_sync: bool, reason: str) -> None:
        if in_sync:
            clear_incomplete(self.config.data_dir)
        if self.on_sync is not None:
            self.on_sync("passive", in_sync, reason)

    def lead(self, epoch: int, role_bit: int) -> None:
        """This server is ACTIVE: its changes are logged (and fed to a PASSIVE), its
        timers run, and new message ids come from its own block for this epoch (two
        ACTIVE servers of a split never give the same id)."""
        self.ids.seen(((epoch * 2 + role_bit) << ID_BLOCK_BITS) - 1)
        if self.leading:
            return
        self.leading = True
        if self.federation is not None:
            self.federation.set_leading(True)
        clear_incomplete(self.config.data_dir)  # what it leads with is the service now
        follower, self.follower = self.follower, None
        if follower is not None:
            follower.settle()  # every run received is in the state this server leads with
            follower.detach()  # and nothing that arrives or completes later is acked
            self.loop.create_task(follower.stop())
        for vhost in self.vhosts.values():
            vhost.set_log(self.log)
            for queue in vhost.queues.values():
                self.watch_queue(queue)
        if not self.feed.in_sync:
            self._mark_unprotected(True)
            if self.on_sync is not None and self.config.replication.enabled:
                self.on_sync("active", False, "ACTIVE with no in-sync passive")

    def follow(self, url: str, connect_options: dict[str, Any]) -> None:
        """This server is PASSIVE: it takes its state from the ACTIVE at ``url``."""
        if not self.leading and self.follower is not None:
            return
        self.leading = False
        if self.federation is not None:
            self.federation.set_leading(False)
        self.feed.drop("this server is no longer ACTIVE")
        for vhost in self.vhosts.values():
            vhost.set_log(None)
        if not self.config.replication.enabled or self.store is None:
            return
        self.follower = Follower(
            self,
            url,
            self._follower_sync,
            connect_options,
            self.config.name,
            self.config.failover.secret,
        )
        self.loop.create_task(self.follower.start())

    def passive_stalled(self, limit: float) -> None:
        if self.leading:
            self.feed.drop_if_stalled(limit)

    def following_in_sync(self) -> bool:
        follower = self.follower
        return follower.in_sync if follower is not None else True

    def replicated(self, changes: list[Any]) -> int:
        """Changes received from the ACTIVE (a kept run, or a kept run's changes): to the
        store, like ours. Returns the LSN the store must pass for them."""
        log_ = self.log
        assert log_ is not None
        log_.extend(changes, True)
        self._take_changes()  # now, not when the turn ends: the writer starts at once
        return log_.lsn

    def before_reset(self) -> None:
        """A snapshot from the ACTIVE is about to replace the durable state: messages the
        ACTIVE never had (accepted while this server had no in-sync PASSIVE, as a split
        brain's losing side, or on a queue left out of replication) are kept in a
        quarantine file first, and reported."""
        mark = read_unprotected_mark(self.config.data_dir)
        found = quarantine(self.vhosts, mark, self.config.data_dir, self.config.name)
        mark_incomplete(self.config.data_dir)
        if mark is not None:
            clear_unprotected_mark(self.config.data_dir)
        if found is not None:
            self.quarantined.append(found)
            log.warning(
                "quarantined %d messages the ACTIVE never had into %s",
                found["messages"],
                found["path"],
            )
            if self.on_quarantine is not None:
                self.on_quarantine(found)

    def _mark_unprotected(self, unprotected: bool, first_id: int | None = None) -> None:
        if not self.leading or self.store is None or not self.config.replication.enabled:
            return
        if unprotected:
            if read_unprotected_mark(self.config.data_dir) is None:
                mark = self.ids.next if first_id is None else first_id
                write_unprotected_mark(self.config.data_dir, mark)
        else:
            clear_unprotected_mark(self.config.data_dir)

    def replication_status(self) -> dict[str, Any]:
        if not self.config.replication.enabled:
            return {"enabled": False}
        status: dict[str, Any] = {"enabled": True, "leading": self.leading}
        if self.leading:
            status["feed"] = self.feed.status()
        if self.follower is not None:
            status["follower"] = self.follower.status()
        if self.quarantined:
            status["quarantined"] = self.quarantined
        return status

    def _retry_store(self) -> None:
        """Let publishers try again: a write that fails again blocks them again."""
        self.store_retry = None
        if self.store_failing:
            self.store_failing = False
            log.warning("retrying the store: publishers unblocked")
            self._update_blocked()

    # -- what connections and channels report (host.ChannelHost, host.ConnectionHost) -----

    def count_input(self, delta: int) -> None:
        """Bytes read and held in partial frames and bodies (``delta`` < 0 as they go).
        Past the budget they are checked at once, as a publish is: a body read faster
        than the timer ticks would otherwise run far past the watermark."""
        self.input_bytes += delta
        if (
            delta > 0
            and not self.memory_over
            and Message.held + self.input_bytes - self.input_at_check > self.message_budget
        ):
            self.check_memory()

    def output_paused(self, delta: int) -> None:
        self.paused_outputs += delta

    def wait_for_safe(self, channel: Any) -> None:
        self.unsafe_channels.add(channel)

    def done_waiting(self, channel: Any) -> None:
        self.unsafe_channels.discard(channel)

    def reply_consumer(self, address: str) -> Any:
        return self.direct_replies.get(address)

    def add_reply(self, address: str, consumer: Any) -> None:
        self.direct_replies[address] = consumer

    def forget_reply(self, address: str) -> None:
        self.direct_replies.pop(address, None)

    def when_safe(self, lsn: int, done: Callable[[bool], None]) -> None:
        """Call ``done(ok)`` once the store (and an in-sync PASSIVE) has up to ``lsn``."""
        if lsn <= self.safe_lsn or self.store is None:
            self.loop.call_soon(done, True)
        else:
            self.waiting_safe.append((lsn, done))

    def store_status(self) -> dict[str, Any]:
        if self.store is None:
            return {"enabled": False}
        return {
            "enabled": True,
            "path": self.config.store_path,
            "failing": self.store_failing,
            "failures": self.store_failures,
            "lsn": self.log.lsn if self.log is not None else 0,
            "safe_lsn": self.store_lsn,
            "recovered": self.recovered,
        }

    # -- delivery -------------------------------------------------------------------------

    def enqueue(self, message: Message, queues: tuple[Queue, ...], vhost: str = "/") -> bool:
        """Put a message on given queues (the console's answers); False if refused."""
        return self.vhost(vhost).enqueue(message, queues, self.now())

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

    def queued_bytes(self) -> int:
        return sum(q.bytes for vhost in self.vhosts.values() for q in vhost.queues.values())

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

    def memory_in_use(self) -> int:
        """The bytes counted against the watermark (see the module docstring)."""
        queues = sum(len(vhost.queues) for vhost in self.vhosts.values())
        return (
            Message.held
            + ArgumentBytes.held
            + self.input_bytes
            + self.paused_outputs * self.config.limits.output_buffer
            + queues * QUEUE_COST
            + Lane.held * LANE_COST
            + len(self.connections) * CONNECTION_COST
            + self.channel_count * CHANNEL_COST
        )

    def _memory_tick(self) -> None:
        self.memory_timer = self.loop.call_later(MEMORY_CHECK_INTERVAL, self._memory_tick)
        self.check_memory()

    def check_memory(self) -> None:
        limit = self.config.limits.memory_high_watermark
        in_use = self.memory_in_use()
        self.message_budget = limit - (in_use - Message.held)
        self.input_at_check = self.input_bytes
        over = in_use > limit
        if over == self.memory_over:
            return
        self.memory_over = over
        log.warning(
            "memory watermark %s: %d bytes in use %s %d",
            "reached, blocking publishers" if over else "cleared, unblocking publishers",
            in_use,
            ">" if over else "<=",
            limit,
        )
        self._update_blocked()

    def _update_blocked(self) -> None:
        blocked = self.memory_over or self.store_failing
        if blocked == self.blocked:
            return
        self.blocked = blocked
        for connection in list(self.connections):
            self._apply_block(connection)

    def block_reason(self) -> str:
        return "low on memory" if self.memory_over else "message store cannot write"

    def _apply_block(self, connection: Connection) -> None:
        """The alarm began or ended: ``flow`` says whom it tells and holds."""
        if connection.transport is not None and connection.state == OPEN:
            flow.alarm(connection, self.block_reason() if self.blocked else None)

    def watch_unread(self, connection: Connection, watch: bool) -> None:
        if not watch:
            self.unread.discard(connection)
            return
        self.unread.add(connection)
        if self.hangup_timer is None:
            self.hangup_timer = self.loop.call_later(HANGUP_CHECK_INTERVAL, self._check_hangups)

    def _check_hangups(self) -> None:
        """One poll(2) over every unread socket: those whose client closed or reset it
        are closed, which releases what they held (a partial body, their channels)."""
        self.hangup_timer = None
        poller = select.poll()
        by_fd: dict[int, Connection] = {}
        for connection in self.unread:
            transport = connection.transport
            # A closing transport's descriptor may already belong to a new socket.
            if connection.fileno >= 0 and transport is not None and not transport.is_closing():
                poller.register(connection.fileno, HANGUP_EVENTS)
                by_fd[connection.fileno] = connection
        for fd, events in poller.poll(0):
            if events & HANGUP_EVENTS:
                by_fd[fd].hung_up()
        if self.unread:
            self.hangup_timer = self.loop.call_later(HANGUP_CHECK_INTERVAL, self._check_hangups)

    # -- holding work while the pair says we are not serving ------------------------------

    def hold(self, connection: Connection) -> None:
        """Hold a client connection's work: not read, its confirms not sent, until the pair
        serves again (then ``release_held``) or steps down (then the connection is closed)."""
        if connection not in self.held:
            self.held.add(connection)
            connection.hold()
        if self._held_timer is None:
            self._held_timer = self.loop.call_later(HOLD_RECHECK, self._recheck_held)

    def hold_all(self) -> None:
        for connection in self.client_connections():
            self.hold(connection)

    def _recheck_held(self) -> None:
        self._held_timer = None
        if self.pair.serving():
            self.release_held()
        elif self.held:
            self._held_timer = self.loop.call_later(HOLD_RECHECK, self._recheck_held)

    def release_held(self) -> None:
        held, self.held = self.held, set()
        for connection in held:
            connection.release_hold()

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

    def connection_opened(self, connection: Connection) -> None:
        vhost, user = connection.vhost.name, connection.user.name
        self.vhost_connections[vhost] = self.vhost_connections.get(vhost, 0) + 1
        self.user_connections[user] = self.user_connections.get(user, 0) + 1
        connection.counted = True
        if self.blocked:
            self._apply_block(connection)
        for hook in self.on_open:
            hook(connection)

    def connection_closed(self, connection: Connection) -> None:
        self.connections.discard(connection)
        self.held.discard(connection)
        self.unread.discard(connection)
        if connection.counted:
            connection.counted = False
            vhost, user = connection.vhost.name, connection.user.name
            self.vhost_connections[vhost] -= 1
            self.user_connections[user] -= 1
        for hook in self.on_close:
            hook(connection)

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
        for host, port in self.config.addresses:
            self.servers.extend(await self._listen(host, port))
        self.server = self.servers[0]
        tls = self.config.tls
        if tls is not None:
            self.tls_server = await self.loop.create_server(
                lambda: Connection(self),
                tls.host,
                tls.port,
                ssl=server_context(tls, self.config.source),
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT,
                reuse_address=True,
                backlog=1024,
            )
        self.memory_timer = self.loop.call_later(MEMORY_CHECK_INTERVAL, self._memory_tick)

    async def _listen(self, host: str, port: int) -> list[asyncio.base_events.Server]:
        """One listener per address; ``::`` (all IPv6 addresses) serves IPv4 as well, on one
        dual-stack socket where the OS has them, else on a second socket bound to 0.0.0.0."""
        if host != "::":
            return [await self._serve(host=host, port=port)]
        if socket.has_dualstack_ipv6():
            sock = socket.create_server(
                ("::", port), family=socket.AF_INET6, backlog=1024, dualstack_ipv6=True
            )
            return [await self._serve(sock=sock)]
        return [
            await self._serve(host="::", port=port),
            await self._serve(host="0.0.0.0", port=port),
        ]

    async def _serve(self, **where: Any) -> asyncio.base_events.Server:
        if "sock" in where:
            return await self.loop.create_server(lambda: Connection(self), **where)
        return await self.loop.create_server(
            lambda: Connection(self), reuse_address=True, backlog=1024, **where
        )

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def stop(self, text: str = "CONNECTION_FORCED - broker shutdown") -> None:
        if self.memory_timer is not None:
            self.memory_timer.cancel()
        if self.hangup_timer is not None:
            self.hangup_timer.cancel()
        self.timers.close()
        try:
            for server in (*self.servers, self.tls_server):
                if server is not None:
                    server.close()
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

    def close_store(self) -> None:
        """Write what the store has not been given yet, then close it."""
        if self.store_retry is not None:
            self.store_retry.cancel()
            self.store_retry = None
        store, self.store = self.store, None
        if store is None:
            return
        if self.log is not None:
            first, changes = self.log.take()
            if changes:
                store.submit(first, changes)
        store.close()


class QueueTimers:
    """One loop timer for all queues: a heap of (due, queue), the earliest armed.

    A queue is pushed when its due time may have moved earlier (``schedule``); an entry
    that no longer matches the queue's ``timer_due`` is stale and skipped. Work is
    proportional to what falls due, never to the number of queues.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_due: Callable[[Queue, float], None],
        clock: Callable[[], float],
    ) -> None:
        self.loop = loop
        self.on_due = on_due
        # Due times are on this clock (the wall clock, as deadlines are); the loop's timer
        # is armed for the same moment on its own clock.
        self.clock = clock
        self.heap: list[tuple[float, int, Queue]] = []
        self.order = itertools.count()
        self.handle: asyncio.TimerHandle | None = None
        self.armed_for = 0.0

    def schedule(self, queue: Queue) -> None:
        due = queue.next_due()
        if due is None or queue.deleted:
            return
        if queue.timer_due is not None and queue.timer_due <= due:
            return
        queue.timer_due = due
        heapq.heappush(self.heap, (due, next(self.order), queue))
        if self.handle is None or due < self.armed_for:
            self._arm(due)

    def _arm(self, due: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed_for = due
        self.handle = self.loop.call_later(max(0.0, due - self.clock()), self._fire)

    def _fire(self) -> None:
        self.handle = None
        heap = self.heap
        now = self.clock()
        due_now = []
        while heap and heap[0][0] <= now:
            due, _, queue = heapq.heappop(heap)
            if queue.timer_due == due and not queue.deleted:
                queue.timer_due = None
                due_now.append(queue)
        # Rescheduled only after the pass: a message that expires strictly after ``now``
        # is due again at once, and must wait for the next turn of the loop.
        for queue in due_now:
            try:
                self.on_due(queue, now)
            except Exception:
                log.exception(
                    "timer of queue '%s' failed; it is retried in 1 s", escaped(queue.name)
                )
                queue.timer_due = now + 1.0
                heapq.heappush(heap, (now + 1.0, next(self.order), queue))
                continue
            self.schedule(queue)
        if heap and (self.handle is None or heap[0][0] < self.armed_for):
            self._arm(heap[0][0])

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


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
    await federation.close()
    for service in reversed(services):
        await service.stop()
    for endpoint in reversed(endpoints):
        await endpoint.stop()
    broker.upstream.stop()
    await broker.stop()
