"""One client connection: the asyncio protocol that turns bytes into channel work.

Owns: the protocol header check, the Start/Tune/Open handshake, waiting, unread, while
``auth`` decides the login (the credentials are read by ``sasl``), the failover
gate (at StartOk for plain clients, at Connection.Open for those that take a redirect),
channel 0, heartbeats both ways with dead-peer detection, the mapping of AMQP
errors to Channel.Close or Connection.Close, and the write side: frames queued by
channels are coalesced and written once per turn of the loop.

Bounds: until Connection.TuneOk a frame may be at most 4096 bytes, so a client that
has not logged in can make us hold no more. Output is bounded: frames are written as
soon as ``limits.output_buffer`` bytes are queued, and once the socket holds that much
unwritten, deliveries to this connection stop and, if it publishes, it is no longer
read (its Basic.Returns and confirms are what backs up) until the socket drains (each
reason a socket is not read is a bit of ``read_holds``). One turn of the loop hands a
connection at most TURN_OUTPUT bytes however fast its socket drains: then its consumers
wait for the next turn (``turn_spent``), so a consumer of a deep queue cannot hold the
loop, and with it every other connection and the pair's timers.
While it is not read for such a reason, the broker polls its socket for the client's
FIN or reset (``hung_up``), which asyncio would only see by reading.
The memory alarm holds a connection at a publish of a message (``flow``); a held
connection's heartbeat clock waits while it is held.
Reading is bounded too: one read's frames are handled for at most FRAME_BUDGET
seconds; the rest waits for the next turn of the loop, with the socket unread, so
other connections and timers run in between.

Must not know: how queues, exchanges and routing work (``core``), what a method
does on a channel (``channel``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

from pamqp import commands, exceptions

from . import wire
from .auth import Refused
from .channel import Channel
from .channel_state import CLOSING as CHANNEL_CLOSING
from .core import feedauth
from .core.reserved import PEERING_PRODUCT
from .gate import ACCEPT, Redirect, not_active_text
from .logtext import escaped
from .netmark import mark_transport
from .read_holds import (
    HEARTBEAT_PAUSING,
    LASTING_HOLDS,
    READ_HELD_BACKLOG,
    READ_HELD_LOGIN,
    READ_HELD_OUTPUT,
    READ_HELD_PAIR,
    READ_HELD_STORE,
)
from .sasl import MECHANISMS, credentials

if TYPE_CHECKING:
    from .core.confirms import Commit, Confirms
    from .core.queue import Queue
    from .core.vhost import VHost
    from .host import BrokerHost

log = logging.getLogger("amqha.connection")

# Handshake states, in order. The constants here are Final: compiled, they are C values,
# not names looked up at each use (docs/performance.md, "The compiled modules").
AWAIT_HEADER: Final = 0
AWAIT_START_OK: Final = 1
AUTHENTICATING: Final = 2
AWAIT_TUNE_OK: Final = 3
AWAIT_OPEN: Final = 4
OPEN: Final = 5
CLOSING: Final = 6
CLOSED: Final = 7

KNOWN_FRAME_TYPES: Final = frozenset(
    (wire.FRAME_METHOD, wire.FRAME_HEADER, wire.FRAME_BODY, wire.FRAME_HEARTBEAT)
)
CLOSE_OK_TIMEOUT: Final = 3.0
HANDSHAKE_TIMEOUT: Final = 10.0
# AMQP's minimum frame size, the most a client may send before Connection.TuneOk.
FRAME_MIN_SIZE: Final = 4096
FRAME_BUDGET: Final = 0.005
# The clock is read after this many frames, or after any frame this large (a big header
# table is the costly one to handle).
FRAMES_PER_CLOCK_READ: Final = 64
LARGE_FRAME: Final = 1024
# Bytes one turn of the loop hands a connection at most (less if limits.output_buffer is):
# a few milliseconds of deliveries (docs/limits.md, "Output").
TURN_OUTPUT: Final = 256 * 1024


class Connection(asyncio.Protocol):
    def __init__(self, broker: BrokerHost) -> None:
        self.broker = broker
        limits = broker.config.limits
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.state = AWAIT_HEADER
        self.buffer = bytearray()
        # Until Tune-Ok the client has agreed to nothing: the protocol's minimum applies.
        self.frame_max = FRAME_MIN_SIZE
        self.output_limit = limits.output_buffer
        self.turn_limit = min(limits.output_buffer, TURN_OUTPUT)
        self.channel_max = limits.channel_max
        self.heartbeat = 0
        self.channels: dict[int, Channel] = {}
        self.exclusive_queues: dict[str, Queue] = {}
        # A federation link's connection (its proven hello accepted here): it alone may
        # publish the headers a link acts on (amqha/federation/upstream.py).
        self.federation_linked = False
        self.user: Any = None
        self.vhost: VHost | None = None  # from Connection.Open on
        self.client_properties: dict[str, Any] = {}
        self.peer = "?"
        self.nonce = b""  # this connection's nonce, sent in Connection.Start
        self.address = ""  # the client's IP address, as the loopback-only rule reads it
        self.fileno = -1  # the socket's, for the broker's hang-up check while unread
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.flush_scheduled = False
        self.write_paused = False
        # This turn of the loop has handed out turn_limit bytes: deliveries wait a turn.
        self.turn_spent = False
        self.read_holds = 0
        self.backlog: tuple[list[wire.RawFrame], int] | None = None
        # While frames of a read are handled: the channels whose acks put off waking their
        # consumers until the read ends (``Channel._settle``).
        self.reading = False
        self.to_wake: list[Any] = []
        self.buffered = 0  # len(self.buffer) as last counted by broker.memory.count_input
        self.counted = False  # counted in the broker's per-vhost and per-user connections
        self.published = False
        # The pair's own link (a peering login): never held by the alarm (docs/limits.md).
        self.pair_link = False
        # Has published a message (to an exchange that is not a control exchange): told
        # Connection.Blocked when the alarm begins; ``told_blocked`` until Unblocked.
        self.publishes_messages = False
        self.told_blocked = False
        # Channels' confirm trackers with confirms due, written at the next flush.
        self.due_confirms: set[Confirms] = set()
        self.last_received = self.loop.time()
        self.last_sent = self.last_received
        self.timer: asyncio.TimerHandle | None = None
        self._heartbeat_due = 0.0  # when the heartbeat check was due (a late one: a freeze)
        self.close_timer: asyncio.TimerHandle | None = None
        self.bypasses_gate = False
        # A plain client is admitted at StartOk, where a refusal still reaches its user.
        self.admitted = False
        self.login: asyncio.Task[None] | None = None
        # Frames a client pipelined behind its Start-Ok, handled once the login is decided.
        self.held_frames: list[wire.RawFrame] = []
        self.handlers: dict[type, Callable[[Any], None]] = {
            commands.Connection.StartOk: self.on_start_ok,
            commands.Connection.TuneOk: self.on_tune_ok,
            commands.Connection.Open: self.on_open,
            commands.Connection.Close: self.on_close,
            commands.Connection.CloseOk: self.on_close_ok,
            commands.Connection.Blocked: self.on_ignored,
            commands.Connection.Unblocked: self.on_ignored,
            commands.Connection.UpdateSecret: self.on_update_secret,
            commands.Connection.UpdateSecretOk: self.on_ignored,
        }

    # -- asyncio protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream's transport: asyncio's or uvloop's (which is not a subclass of
        # asyncio.Transport, so it is not checked as one).
        stream = cast(asyncio.Transport, transport)
        self.transport = stream
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
            self.address = str(peer[0])
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.fileno = sock.fileno()
        if not self.broker.admit(self):
            self.state = CLOSED
            stream.abort()
            return
        stream.set_write_buffer_limits(high=self.output_limit)
        self.timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = CLOSED
        if self.login is not None:
            self.login.cancel()
        for handle in (self.timer, self.close_timer):
            if handle is not None:
                handle.cancel()
        self._release_all()
        if self.write_paused:
            self.write_paused = False
            self.broker.memory.output_paused(-1)
        self.buffer = bytearray()
        self.backlog = None
        self._count_input()
        self.broker.connection_closed(self)

    def pause_writing(self) -> None:
        if not self.write_paused:
            self.write_paused = True
            self.broker.memory.output_paused(1)
        if self.published:
            self.hold_reading(READ_HELD_OUTPUT, True)

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            self.broker.memory.output_paused(-1)
        self.hold_reading(READ_HELD_OUTPUT, False)
        self.wake_consumers()

    def mark_publisher(self) -> None:
        """The first Basic.Publish: from now on this connection is read only while its
        socket drains (the memory alarm holds it at a publish: ``flow.hold``)."""
        self.published = True
        if self.write_paused:
            self.hold_reading(READ_HELD_OUTPUT, True)

    def hold_reading(self, reason: int, hold: bool) -> None:
        """Stop or restart reading the socket for one reason; it is read while none holds."""
        before = self.read_holds
        after = before | reason if hold else before & ~reason
        if after == before:
            return
        self.read_holds = after
        if self.transport is None or self.state >= CLOSED:
            return
        if bool(before & LASTING_HOLDS) != bool(after & LASTING_HOLDS):
            self.broker.hangups.watch(self, bool(after & LASTING_HOLDS))
        if not before:
            self.transport.pause_reading()
        elif not after:
            self.transport.resume_reading()

    def hung_up(self) -> None:
        """The client closed or reset its socket while we did not read it (a blocked
        publisher, say): what it sent and we never read, a partial body included, is
        dropped with the connection, as at any close without Connection.Close."""
        if self.transport is None or self.transport.is_closing():
            return
        log.info("%s: the client left while not read, closing", self.peer)
        self.transport.abort()

    def data_received(self, data: bytes | bytearray) -> None:
        self.last_received = self.loop.time()
        if self.state >= CLOSED:
            return
        if self.backlog is not None or self.state == AUTHENTICATING:
            # Read while a backlog or a login waits (the transport had bytes in hand when
            # reading was held): kept behind it, in order.
            self.buffer += data
            self._count_input()
            return
        if self.buffer:
            self.buffer += data
            data = self.buffer
        if self.state == AWAIT_HEADER:
            if len(data) < 8:
                self.buffer = bytearray(data)
                return
            if bytes(data[:8]) != wire.PROTOCOL_HEADER:
                # Spec 4.2.2: answer a bad header with ours, then close.
                self._write_now(wire.PROTOCOL_HEADER)
                self._drop()
                return
            data = data[8:]
            # The header is consumed: what the buffer still holds must not be parsed again.
            self.buffer = bytearray()
            self._send_start()
        try:
            frames, used = wire.split_frames(data, self.frame_max)
        except exceptions.AMQPError as error:
            # The stream is misaligned from here on: no Close-Ok could be read from it, so
            # the socket closes as soon as our Connection.Close is written.
            self.buffer = bytearray()
            self._count_input()
            self.fail(error)
            self.flush()
            self._drop()
            return
        if used == len(data):
            self.buffer = bytearray()
        elif used or not self.buffer:
            self.buffer = bytearray(data[used:])
        self._count_input()
        self._handle_frames(frames, 0)
        self.flush()

    def _handle_frames(self, frames: list[wire.RawFrame], start: int) -> bool:
        """``_handle_some``, then the consumers of the channels it acked on are woken
        once: each takes in one go what the read's acks made room for. True if frames
        were left in ``backlog``."""
        self.reading = True
        try:
            return self._handle_some(frames, start)
        finally:
            self.reading = False
            if self.to_wake:
                channels, self.to_wake = self.to_wake, []
                for channel in channels:
                    channel.wake_after_read()

    def _handle_some(self, frames: list[wire.RawFrame], start: int) -> bool:
        """Handle ``frames[start:]`` until done or FRAME_BUDGET is spent; then the rest
        waits in ``backlog`` for the next turn of the loop, the socket unread (True).

        The clock is read every FRAMES_PER_CLOCK_READ frames and after any large frame;
        an OPEN connection (the hot path) pays one state comparison per frame."""
        clock = self.loop.time
        deadline = clock() + FRAME_BUDGET
        count = len(frames)
        index = start
        next_check = start + FRAMES_PER_CLOCK_READ
        handle = self._handle
        publish_prefix = wire.PUBLISH_PREFIX
        FRAME_METHOD, FRAME_HEADER = wire.FRAME_METHOD, wire.FRAME_HEADER  # noqa: N806
        while index < count:
            frame = frames[index]
            index += 1
            state = self.state
            if state != OPEN and state >= CLOSING and not wire.is_connection_close(frame):
                continue
            if (
                index + 1 < count
                and frames[index].kind == FRAME_HEADER
                and frame.kind == FRAME_METHOD
                and state == OPEN
                and frame.payload[:4] == publish_prefix
            ):
                # The hot path: a publish whose header and body came in the same read.
                index += self._handle_publish(frame, frames[index], frames[index + 1])
                frame = frames[index - 1]
            else:
                handle(frame)
            if self.state != OPEN:
                if self.state >= CLOSED:
                    return False
                if self.state == AUTHENTICATING:
                    # Frames pipelined behind Start-Ok wait for the login's answer.
                    self.held_frames = frames[index:]
                    return False
            if index >= next_check or len(frame.payload) > LARGE_FRAME:
                next_check = index + FRAMES_PER_CLOCK_READ
                if index < count and clock() > deadline:
                    self.backlog = (frames, index)
                    self.hold_reading(READ_HELD_BACKLOG, True)
                    self.loop.call_soon(self._resume_backlog)
                    return True
        return False

    def _next_turn(self) -> None:
        self.turn_spent = False
        if not self.write_paused and self.state < CLOSED:
            self.wake_consumers()

    def _resume_backlog(self) -> None:
        if self.backlog is None or self.state >= CLOSED:
            return
        frames, start = self.backlog
        self.backlog = None
        # Told by the call, not read from ``self.backlog``: mypy would keep it narrowed to
        # the None above, and the compiled code would check what it reads against that.
        if not self._handle_frames(frames, start):
            self.hold_reading(READ_HELD_BACKLOG, False)
            if self.buffer and self.state < CLOSED:
                self.data_received(b"")
        self.flush()

    def _count_input(self) -> None:
        """Keep the broker's count of partial frames held for reading up to date."""
        buffered = len(self.buffer)
        if buffered != self.buffered:
            self.broker.memory.count_input(buffered - self.buffered)
            self.buffered = buffered

    # -- writing ----------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.out.append(data)
        self.out_bytes += len(data)
        if self.out_bytes >= self.turn_limit:
            # Written now, so that the transport sees it and pauses us when the socket
            # does not drain: nothing piles up here unbounded within one turn. A socket
            # that drains as fast as we write would never pause us: deliveries stop for
            # this turn all the same (docs/limits.md, "Output").
            self.flush()
            if not self.turn_spent:
                self.turn_spent = True
                self.loop.call_soon(self._next_turn)
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def confirms_due(self, confirms: Confirms) -> None:
        """``confirms`` (a channel's, handed here by the channel or by the confirm
        pipeline) has confirms that may go out: written at the next flush."""
        self.due_confirms.add(confirms)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def commit_done(self, commit: Commit, ok: bool) -> None:
        """A transaction's changes are safe (``ok``), or the store could not write them:
        Commit-Ok, or the connection fails. Until then the connection was not read, so
        nothing overtook the commit."""
        self.hold_reading(READ_HELD_STORE, False)
        channel = self.channels.get(commit.channel)
        if channel is None or channel is not commit.token or channel.state is CHANNEL_CLOSING:
            return
        if ok:
            self.send(wire.method_frame(commit.channel, commands.Tx.CommitOk()))
        else:
            self.fail(
                exceptions.AMQPInternalError(
                    "INTERNAL_ERROR - the store could not write the transaction"
                )
            )
        self.flush()

    def settle_confirms(self, confirms: Confirms) -> None:
        """Before a channel's last frame: the confirms it owes go out first (a client has
        released the channel once it reads Close-Ok). A server that is not serving keeps
        no promise: the publisher sees them unconfirmed."""
        if confirms in self.due_confirms:
            self.due_confirms.discard(confirms)
            if self.bypasses_gate or self.broker.pair.serving():
                self._write_confirms(confirms)

    def drop_confirms(self, confirms: Confirms) -> None:
        """A channel goes away: what it owes is not written (the publisher sees the
        channel close instead)."""
        self.due_confirms.discard(confirms)

    def _write_confirms(self, confirms: Confirms) -> None:
        """The confirms that may go out (see core.confirms for the order), queued."""
        number = confirms.channel
        out = self.out
        for ack, seq, multiple in confirms.due():
            frame = (
                wire.ack_frame(number, seq, multiple)
                if ack
                else wire.nack_frame(number, seq, multiple)
            )
            out.append(frame)
            self.out_bytes += len(frame)

    def flush(self) -> None:
        self.flush_scheduled = False
        due = self.due_confirms
        if due:
            if self.state >= CLOSING:
                due.clear()
            elif self.bypasses_gate or self.broker.pair.serving():
                for confirms in due:
                    self._write_confirms(confirms)
                due.clear()
            else:
                # A confirm is a promise: a server that may have lost the service (frozen,
                # stepping down) keeps it until the pair says it serves.
                self.broker.hold(self)
        if not self.out or self.transport is None or self.state == CLOSED:
            self.out.clear()
            self.out_bytes = 0
            return
        out = self.out
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self.out_bytes = 0
        self.transport.write(data)
        self.last_sent = self.loop.time()

    def hold(self) -> None:
        self.hold_reading(READ_HELD_PAIR, True)

    def release_hold(self) -> None:
        if self.state != OPEN:
            return
        self.hold_reading(READ_HELD_PAIR, False)
        self.flush()

    def heartbeat_now(self) -> None:
        """A heartbeat frame out of turn (a switchover's drain, which does not read us)."""
        if self.state == OPEN and self.heartbeat:
            self._write_now(wire.HEARTBEAT_FRAME)

    def _write_now(self, data: bytes) -> None:
        self.send(data)
        self.flush()

    def _drop(self) -> None:
        """Close the socket after what is queued has been written."""
        self.state = CLOSED
        if self.transport is not None:
            self.transport.close()

    def capability(self, name: str) -> bool:
        capabilities = self.client_properties.get("capabilities") or {}
        return bool(isinstance(capabilities, dict) and capabilities.get(name))

    # -- frames -------------------------------------------------------------------------

    def _handle(self, frame: wire.RawFrame) -> None:
        number = frame.channel
        try:
            if frame.kind not in KNOWN_FRAME_TYPES:
                raise exceptions.AMQPFrameError(f"FRAME_ERROR - unknown frame type {frame.kind}")
            if frame.kind == wire.FRAME_HEARTBEAT:
                if number != 0:
                    raise exceptions.AMQPFrameError(
                        f"FRAME_ERROR - heartbeat frame on channel {number}"
                    )
                return
            if number == 0:
                self._handle_channel_zero(frame)
                return
            if self.state != OPEN:
                raise exceptions.AMQPChannelError(
                    f"CHANNEL_ERROR - channel {number} used before the connection is open"
                )
            channel = self.channels.get(number)
            if channel is None:
                self._open_channel(frame)
                return
            try:
                channel.handle_frame(frame)
            except exceptions.AMQPSoftError as error:
                self._log_error(error, channel=number)
                channel.close_with(error, *wire.method_ids(frame))
        except exceptions.AMQPHardError as error:
            self._log_error(error)
            self.fail(error, *wire.method_ids(frame))
        except exceptions.AMQPSoftError as error:
            # A soft error outside a channel (channel 0) is a connection error.
            self._log_error(error)
            self.fail(error, *wire.method_ids(frame))

    def _handle_publish(
        self, method: wire.RawFrame, header: wire.RawFrame, body: wire.RawFrame
    ) -> int:
        """``_handle`` of a Basic.Publish method frame and the two frames after it, in one
        call where they are its content header and a body frame on the same open channel
        (the hot path: three frame dispatches made one); otherwise, and from the first
        frame that ends the publish early or fails, the rest goes frame by frame, as it
        would have. Returns how many frames after ``method`` it took (0 to 2)."""
        number = method.channel
        channel = self.channels.get(number)
        if (
            channel is None
            or header.channel != number
            or body.channel != number
            or header.kind != wire.FRAME_HEADER
            or body.kind != wire.FRAME_BODY
            or not channel.takes_publish()
        ):
            self._handle(method)
            return 0
        at = method
        try:
            try:
                channel.on_basic_publish(wire.decode_publish(method.payload))
                at = header
                pending = channel.pending
                assert pending is not None
                channel._on_header(pending, header.payload)
                if channel.pending is not pending:
                    return 1  # complete on its header (an empty body): the body frame is next
                at = body
                channel._on_body(pending, body.payload)
                return 2
            except exceptions.AMQPSoftError as error:
                self._log_error(error, channel=number)
                channel.close_with(error, *wire.method_ids(at))
        except exceptions.AMQPHardError as error:
            self._log_error(error)
            self.fail(error, *wire.method_ids(at))
        return 0 if at is method else 1 if at is header else 2

    def _log_error(self, error: exceptions.AMQPError, channel: int = 0) -> None:
        where = f" channel {channel}" if channel else ""
        # Reply texts name queues, exchanges, consumer tags, users and vhosts as the client
        # spelt them.
        text = escaped(error.args[0]) if error.args else ""
        log.info("%s%s: %s %s", self.peer, where, error.value, text)  # type: ignore[attr-defined]

    def _open_channel(self, frame: wire.RawFrame) -> None:
        number = frame.channel
        if frame.kind != wire.FRAME_METHOD or frame.payload[:4] != struct.pack(
            ">I", commands.Channel.Open.index
        ):
            raise exceptions.AMQPChannelError(
                f"CHANNEL_ERROR - expected 'channel.open' on channel {number}"
            )
        wire.decode_method(frame.payload)
        if number > self.channel_max:
            raise exceptions.AMQPNotAllowed(
                f"NOT_ALLOWED - channel {number} exceeds channel_max {self.channel_max}"
            )
        self.broker.channel_opened(self)
        self.channels[number] = Channel(self, number)
        self.send(wire.method_frame(number, commands.Channel.OpenOk()))

    def _handle_channel_zero(self, frame: wire.RawFrame) -> None:
        if frame.kind != wire.FRAME_METHOD:
            raise exceptions.AMQPUnexpectedFrame(
                f"UNEXPECTED_FRAME - content frame (type {frame.kind}) on channel 0"
            )
        method = wire.decode_method(frame.payload)
        handler = self.handlers.get(type(method))
        if handler is None:
            raise exceptions.AMQPCommandInvalid(
                f"COMMAND_INVALID - {method.name} is not allowed on channel 0"
            )
        handler(method)

    # -- handshake ----------------------------------------------------------------------

    def _send_start(self) -> None:
        self.state = AWAIT_START_OK
        properties = self.broker.server_properties()
        # Fresh on every connection: what the replication link's proof is bound to
        # (core/feedauth.py), so an old subscription cannot be replayed.
        self.nonce = secrets.token_bytes(feedauth.NONCE_BYTES)
        properties[feedauth.NONCE_PROPERTY] = self.nonce.hex()
        self.send(
            wire.method_frame(
                0,
                commands.Connection.Start(
                    server_properties=properties,
                    mechanisms=MECHANISMS,
                    locales="en_US",
                ),
            )
        )

    def _expect(self, state: int, method: str) -> None:
        if self.state != state:
            raise exceptions.AMQPCommandInvalid(f"COMMAND_INVALID - unexpected {method}")

    def on_start_ok(self, method: commands.Connection.StartOk) -> None:
        self._expect(AWAIT_START_OK, "Connection.StartOk")
        self.client_properties = dict(method.client_properties or {})
        username, password = credentials(method.mechanism, _longstr(method, "response"))
        # A password check may take a while (scrypt, or the delay of a refusal): nothing is
        # read from this client meanwhile, so it holds no more memory than it has sent.
        self.state = AUTHENTICATING
        self.hold_reading(READ_HELD_LOGIN, True)
        self.login = self.loop.create_task(self._login(username, password, method.mechanism))

    def _mark_control(self) -> None:
        """The peer's state messages ride this link: what this side sends on it (acks,
        heartbeats) goes ahead of bulk traffic too (docs/failover.md, "On a full link")."""
        problem = "no socket to mark" if self.transport is None else mark_transport(self.transport)
        if problem is not None:
            log.warning("%s: the peering link's %s", self.peer, problem)

    async def _login(self, username: str, password: str, mechanism: str) -> None:
        try:
            result = await self.broker.authenticate(
                username, password, self.address, mechanism, self.nonce
            )
        except Exception:
            # E.g. a check still queued when shutdown stopped the checking threads.
            log.exception(
                "%s: the login of '%s' could not be checked", self.peer, escaped(username[:64])
            )
            result = Refused("ACCESS_REFUSED - the login could not be checked", "error")
        self.login = None
        if self.state != AUTHENTICATING:
            return
        self.hold_reading(READ_HELD_LOGIN, False)
        if isinstance(result, Refused):
            self.fail(exceptions.AMQPAccessRefused(result.text))
            self.flush()
            return
        self.user = result
        self.bypasses_gate = bool({"peering", "administrator"} & set(result.tags))
        self.pair_link = "peering" in result.tags
        if self.pair_link and self.client_properties.get("product") == PEERING_PRODUCT:
            self._mark_control()
        if not self.bypasses_gate and not self.capability("connection.redirect"):
            # Clients read a Close sent in reply to Open as a framing error and lose its
            # text; a Close before Tune reaches their user as a plain 320 with the reason.
            decision = self.broker.pair.admit(self.peer)
            if isinstance(decision, Redirect):
                self.fail(
                    exceptions.AMQPConnectionForced(not_active_text(decision.to, decision.reason))
                )
                self.flush()
                return
            self.admitted = True
        limits = self.broker.config.limits
        self.state = AWAIT_TUNE_OK
        self.send(
            wire.method_frame(
                0,
                commands.Connection.Tune(
                    channel_max=limits.channel_max,
                    frame_max=limits.frame_max,
                    heartbeat=limits.heartbeat,
                ),
            )
        )
        held, self.held_frames = self.held_frames, []
        self._handle_frames(held, 0)
        if self.buffer and self.state < CLOSED:
            self.data_received(b"")
        self.flush()

    def on_tune_ok(self, method: commands.Connection.TuneOk) -> None:
        self._expect(AWAIT_TUNE_OK, "Connection.TuneOk")
        limits = self.broker.config.limits
        if method.frame_max and method.frame_max < 4096:
            raise exceptions.AMQPNotAllowed(
                f"NOT_ALLOWED - frame_max {method.frame_max} is below the minimum 4096"
            )
        if method.frame_max > limits.frame_max or method.channel_max > limits.channel_max:
            raise exceptions.AMQPNotAllowed(
                "NOT_ALLOWED - negotiated limits exceed the server's "
                f"(frame_max {limits.frame_max}, channel_max {limits.channel_max})"
            )
        self.frame_max = method.frame_max or limits.frame_max
        self.channel_max = method.channel_max or limits.channel_max
        self.heartbeat = method.heartbeat
        self.state = AWAIT_OPEN

    def on_open(self, method: commands.Connection.Open) -> None:
        self._expect(AWAIT_OPEN, "Connection.Open")
        vhost_name = method.virtual_host or "/"
        if vhost_name not in self.user.vhosts:
            raise exceptions.AMQPNotAllowed(
                f"NOT_ALLOWED - access to vhost '{vhost_name}' refused for user '{self.user.name}'"
            )
        # One vote per connection attempt: a client admitted at StartOk is not asked again.
        admitted = self.bypasses_gate or self.admitted
        decision = ACCEPT if admitted else self.broker.pair.admit(self.peer)
        if isinstance(decision, Redirect):
            self._redirect(decision)
            return
        refusal = self.broker.connection_refusal(self.user, vhost_name)
        if refusal is not None:
            raise exceptions.AMQPNotAllowed(refusal)
        self.vhost = self.broker.vhost(vhost_name)
        self.state = OPEN
        if self.timer is not None:
            self.timer.cancel()
        self._schedule_heartbeat()
        self.send(wire.method_frame(0, commands.Connection.OpenOk()))
        self.broker.connection_opened(self)

    def _redirect(self, decision: Redirect) -> None:
        if decision.to and self.capability("connection.redirect"):
            self.send(wire.redirect_frame(decision.to, decision.known_hosts))
            self.state = CLOSING
            self.flush()
            # The client closes on reading the redirect; if it does not, we do.
            self.close_timer = self.loop.call_later(CLOSE_OK_TIMEOUT, self._drop)
            return
        text = not_active_text(decision.to, decision.reason)
        self.fail(exceptions.AMQPConnectionForced(text))

    def on_close(self, method: commands.Connection.Close) -> None:
        for channel in self.channels.values():
            self.settle_confirms(channel.confirms)
        self._release_all()
        self.send(wire.method_frame(0, commands.Connection.CloseOk()))
        self.flush()
        # The client closes the socket once it reads Close-Ok; until then what it still
        # sends (publishes in flight) is read and dropped, so it never meets a reset.
        self.state = CLOSED
        for handle in (self.timer, self.close_timer):
            if handle is not None:
                handle.cancel()
        self.timer = None
        self.close_timer = self.loop.call_later(CLOSE_OK_TIMEOUT, self._close_transport)

    def _close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def on_update_secret(self, method: commands.Connection.UpdateSecret) -> None:
        """A client refreshes its credentials on a live connection (OAuth2 token renewal).

        Configured passwords never expire, so, as RabbitMQ's internal user database does,
        the login stays valid; the new secret must still be text and the user still known.
        """
        self._expect(OPEN, "Connection.UpdateSecret")
        secret = _longstr(method, "new_secret")
        if not isinstance(secret, str) or not secret or not self.broker.user_known(self.user.name):
            raise exceptions.AMQPNotAllowed(
                "NOT_ALLOWED - New secret was refused by one of the backends"
            )
        log.info(
            "%s: user '%s' updated secret, reason: %s",
            self.peer,
            escaped(self.user.name),
            escaped(method.reason),
        )
        self.send(wire.method_frame(0, commands.Connection.UpdateSecretOk()))

    def on_close_ok(self, method: commands.Connection.CloseOk) -> None:
        self._drop()

    def on_ignored(self, method: Any) -> None:
        """Methods a client may send that need no answer."""

    # -- closing --------------------------------------------------------------------------

    def fail(self, error: exceptions.AMQPError, class_id: int = 0, method_id: int = 0) -> None:
        """Server-initiated Connection.Close; the socket closes on Close-Ok or a timeout."""
        if self.state >= CLOSING:
            return
        self._release_all()
        self.state = CLOSING
        # pamqp names an error's code and name on each concrete class, not on AMQPError.
        text = str(error.args[0]) if error.args else error.name  # type: ignore[attr-defined]
        self.send(
            wire.method_frame(
                0,
                commands.Connection.Close(
                    error.value,  # type: ignore[attr-defined]
                    wire.reply_text(text),
                    class_id=class_id,
                    method_id=method_id,
                ),
            )
        )
        self.close_timer = self.loop.call_later(CLOSE_OK_TIMEOUT, self._drop)

    def close_forced(self, text: str) -> None:
        """Close with 320 CONNECTION_FORCED (shutdown, an admin, or a failover redirect)."""
        self.fail(exceptions.AMQPConnectionForced(text))
        self.flush()

    def forget_channel(self, number: int) -> None:
        """The channel is closed both ways: its number may be opened again."""
        if self.channels.pop(number, None) is not None:
            self.broker.channel_closed(self)

    def _release_all(self) -> None:
        channels = list(self.channels.values())
        for channel in channels:
            channel.release()
            channel.state = CHANNEL_CLOSING
            self.broker.channel_closed(self)
        self.channels.clear()
        vhost = self.vhost
        if vhost is not None:  # exclusive queues are declared on an open connection only
            for queue in list(self.exclusive_queues.values()):
                vhost.remove_queue(queue)
        self.exclusive_queues.clear()

    def _handshake_timeout(self) -> None:
        if self.state < OPEN:
            log.info("%s: handshake not finished in %.0f s, closing", self.peer, HANDSHAKE_TIMEOUT)
            self._drop()

    # -- heartbeats -----------------------------------------------------------------------

    def _schedule_heartbeat(self) -> None:
        if self.heartbeat:
            self._heartbeat_due = self.loop.time() + self.heartbeat / 2
            self.timer = self.loop.call_at(self._heartbeat_due, self._on_heartbeat_timer)

    def _on_heartbeat_timer(self) -> None:
        if self.state >= CLOSED:
            return
        now = self.loop.time()
        if now - self._heartbeat_due > self.heartbeat / 2 or self.read_holds & HEARTBEAT_PAUSING:
            # Silence we caused is no evidence against the peer (docs/failover.md,
            # "Freezes"): a timer this late means this process or its loop was stopped (a
            # freeze, a stall), and what the peer sent meanwhile waits unread in our socket;
            # a connection we stopped reading (the memory alarm, a pause of the pair) cannot
            # be heard either. Its clock restarts instead, as RabbitMQ pauses the heartbeat
            # monitor of a blocked connection.
            self.last_received = now
        if now - self.last_received > 2 * self.heartbeat:
            log.info("%s: no traffic for %d s, peer presumed dead", self.peer, 2 * self.heartbeat)
            if self.transport is not None:
                self.transport.abort()
            return
        if now - self.last_sent >= self.heartbeat / 2:
            self._write_now(wire.HEARTBEAT_FRAME)
        self._schedule_heartbeat()

    # -- delivery -------------------------------------------------------------------------

    def wake_consumers(self) -> None:
        now = self.broker.now()
        queues = set()
        for channel in self.channels.values():
            for consumer in channel.consumers.values():
                consumer.queue.wake(consumer)
                queues.add(consumer.queue)
        for queue in queues:
            queue.drain(now)

    def describe(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "user": getattr(self.user, "name", None),
            "vhost": getattr(self.vhost, "name", None),
            "channels": len(self.channels),
            "client": str(self.client_properties.get("product", "")),
        }


def _longstr(method: Any, name: str) -> Any:
    """A method's longstr argument as pamqp decodes it: text, or bytes where it is not
    UTF-8, though its classes declare str. Read untyped: compiled code checks what it
    reads as the type declared, and raised TypeError on those bytes."""
    return getattr(method, name)
