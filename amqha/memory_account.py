"""The broker's memory account and the alarm it raises (docs/limits.md).

Owns: what the process holds for its clients, counted as it changes (never by walking
queues or connections): message bytes plus a per-message overhead (``Message.held``),
arguments of bindings, exchanges and queues (``ArgumentBytes``), partial frames and
content being assembled, output held for sockets that do not drain, a fixed cost per
queue, connection, channel and priority lane in use. When that passes
``limits.memory_high_watermark`` the alarm is on until it falls below: a connection that
publishes a message is told (Connection.Blocked) and no longer read; consumers, requests
to the control plane and the pair's own links never are ("What the alarm holds"). And
the connections held while the pair says this server is not serving, and the sockets not
being read, looked at for their client's going.

Must not know: frames, routing, the failover state machine. A part of ``server.Broker``.
"""

from __future__ import annotations

import logging
import select

from . import flow
from .connection import OPEN, Connection
from .core.message import Message
from .core.priority import Lane
from .core.routing import ArgumentBytes

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


class MemoryAccount:
    """The memory account, the alarm and the held connections: part of ``Broker``."""

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

    def queued_bytes(self) -> int:
        return sum(q.bytes for vhost in self.vhosts.values() for q in vhost.queues.values())

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
