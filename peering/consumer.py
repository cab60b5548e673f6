"""A lean consuming link: one queue on a remote server, each delivery handed to a callback
straight from the socket's read, each ack written straight to the socket.

Owns: connecting as a user (PLAIN) over TCP or TLS, the handshake (Start, Tune, Open, one
channel, Qos, Consume), AMQP heartbeats both ways with dead-peer detection, reading
Deliver + header + body frames into ``on_delivery``, writing acks, and reconnecting with
capped exponential backoff after any failure (refused, reset, cut, a handshake that
hangs, a certificate not trusted, the server closing the channel). No task is created
per delivery or per ack: this is the replication data path, where every hop between the
socket and the store is on a publisher's confirm (docs/durability.md, section 5).

Must not know: what the deliveries carry, the local broker, the failover state machine.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from pamqp import commands, exceptions, frame
from pamqp.base import Frame
from pamqp.header import ProtocolHeader
from pamqp.heartbeat import Heartbeat

from amqha import wire

from .agent import Reconnecting, _censor, bounded

log = logging.getLogger("amqha.peering")

PROTOCOL_HEADER = ProtocolHeader().marshal()
HEARTBEAT_FRAME = frame.marshal(Heartbeat(), 0)
CHANNEL = 1
# The largest frame this side accepts (the server may tune lower).
FRAME_MAX = 131072
_METHOD_INDEX = struct.Struct(">I")
_DELIVER_INDEX = commands.Basic.Deliver.index


class LinkClosed(ConnectionError):
    """The link went down; the message says why."""


# (delivery's link, delivery tag, properties, body)
OnDelivery = Callable[["Link", int, commands.Basic.Properties, bytes], None]


class Link(asyncio.Protocol):
    """One connection's worth of the link. ``ack`` writes to this connection only: a tag
    from a connection that has closed is never written to the next one."""

    def __init__(self, owner: ConsumerLink) -> None:
        self.owner = owner
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.closed: asyncio.Future[str] = self.loop.create_future()
        self.is_closed = False
        self.consuming = False
        self.frame_max = FRAME_MAX
        self.heartbeat = 0
        self.timer: asyncio.TimerHandle | None = None
        self._heartbeat_due = 0.0  # when the heartbeat check was due (a late one: a freeze)
        self.last_received = self.loop.time()
        self.last_sent = self.last_received
        # The delivery being read: [tag, properties, bytes expected, parts].
        self._delivery: list[Any] | None = None
        # Basic.Consume's arguments, from the owner's ``consume_arguments`` at Start.
        self.consume_arguments: dict[str, Any] | None = None
        # Whatever the owner keeps for this connection (set by ``consume_arguments``).
        self.context: Any = None

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._write(PROTOCOL_HEADER)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed(f"connection lost: {exc}" if exc else "connection closed")

    def data_received(self, data: bytes) -> None:
        self.last_received = self.loop.time()
        buffer = self.buffer + data if self.buffer else data
        try:
            frames, used = wire.split_frames(buffer, self.frame_max)
            for each in frames:
                if self.is_closed:
                    return
                kind = each.kind
                if kind == wire.FRAME_BODY:
                    self._on_body(each.payload)
                elif kind == wire.FRAME_METHOD:
                    self._on_method(each.channel, each.payload)
                elif kind == wire.FRAME_HEADER:
                    self._on_header(each.payload)
                elif kind != wire.FRAME_HEARTBEAT:
                    raise LinkClosed(f"unknown frame type {kind}")
        except (LinkClosed, exceptions.AMQPFrameError) as error:
            self.close(str(error))
            return
        except Exception as error:  # the callback's, or a frame pamqp cannot read
            log.exception("%s: closing the link", self.owner.name)
            self.close(f"{type(error).__name__}: {error}")
            return
        self.buffer = buffer[used:] if used < len(buffer) else b""

    # -- frames -----------------------------------------------------------------------------

    def _on_method(self, channel: int, payload: bytes) -> None:
        (index,) = _METHOD_INDEX.unpack_from(payload)
        if index == _DELIVER_INDEX:  # the data path: only its tag is needed
            self._delivery = [wire.deliver_tag(payload), None, 0, []]
            return
        kind = commands.INDEX_MAPPING.get(index)
        if kind is None:
            raise LinkClosed(f"unexpected method {index >> 16}.{index & 0xFFFF}")
        method = kind()
        method.unmarshal(payload[4:])
        if kind is commands.Connection.Start:
            self._on_start(method)  # type: ignore[arg-type]
        elif kind is commands.Connection.Tune:
            self._on_tune(method)  # type: ignore[arg-type]
        elif kind is commands.Connection.OpenOk:
            self._send(commands.Channel.Open(), CHANNEL)
        elif kind is commands.Channel.OpenOk:
            self._send(commands.Basic.Qos(prefetch_count=self.owner.prefetch), CHANNEL)
        elif kind is commands.Basic.QosOk:
            self._send(
                commands.Basic.Consume(queue=self.owner.queue, arguments=self.consume_arguments),
                CHANNEL,
            )
        elif kind is commands.Basic.ConsumeOk:
            self.consuming = True
            self.owner._subscribed(self)  # before any delivery of this read is handed on
            if not self.ready.done():
                self.ready.set_result(None)
        elif kind is commands.Connection.Close:
            self._send(commands.Connection.CloseOk(), 0)
            self.consuming = False  # closed by the server: no Close of ours follows
            raise LinkClosed(_reason("the server closed the connection", method))
        elif kind is commands.Channel.Close:
            self._send(commands.Channel.CloseOk(), channel)
            raise LinkClosed(_reason("the server closed the channel", method))
        elif kind is commands.Basic.Cancel:
            if self.owner.on_cancelled is not None:
                self.owner.on_cancelled()
            raise LinkClosed("the server cancelled the subscription")
        elif kind not in _IGNORED:
            raise LinkClosed(f"unexpected {kind.__name__}")

    def _on_header(self, payload: bytes) -> None:
        delivery = self._delivery
        if delivery is None or delivery[1] is not None:
            raise LinkClosed("a content header with no delivery")
        body_size = wire.content_body_size(payload)
        if body_size > self.owner.max_body:
            raise LinkClosed(
                f"a delivery of {body_size} bytes, over the {self.owner.max_body} allowed"
            )
        delivery[1] = wire.decode_properties(payload)
        delivery[2] = body_size
        if not body_size:
            self._deliver(delivery, b"")

    def _on_body(self, payload: bytes) -> None:
        delivery = self._delivery
        if delivery is None or delivery[1] is None:
            raise LinkClosed("a body frame with no delivery")
        parts = delivery[3]
        if not parts and len(payload) == delivery[2]:  # the whole body in one frame
            self._deliver(delivery, payload)
            return
        parts.append(payload)
        delivery[2] -= len(payload)
        if delivery[2] < 0:
            raise LinkClosed("a body longer than its header said")
        if not delivery[2]:
            self._deliver(delivery, b"".join(parts))

    def _deliver(self, delivery: list[Any], body: bytes) -> None:
        self._delivery = None
        self.owner.on_delivery(self, delivery[0], delivery[1], body)

    def _on_start(self, start: commands.Connection.Start) -> None:
        owner = self.owner
        mechanisms = (start.mechanisms or "").split()
        if "PLAIN" not in mechanisms:
            raise LinkClosed(f"the server offers no PLAIN login (only {mechanisms})")
        if owner.consume_arguments is not None:
            self.consume_arguments = owner.consume_arguments(self, start.server_properties or {})
        password = owner.password
        if owner.login_proof is not None:  # never the password: a proof on the server's nonce
            password = owner.login_proof(start.server_properties or {})
        self._send(
            commands.Connection.StartOk(
                client_properties=owner.client_properties,
                mechanism="PLAIN",
                response=f"\0{owner.user}\0{password}",
                locale="en_US",
            ),
            0,
        )

    def _on_tune(self, tune: commands.Connection.Tune) -> None:
        if tune.frame_max:
            self.frame_max = min(tune.frame_max, FRAME_MAX)
        wanted, offered = self.owner.heartbeat, tune.heartbeat
        self.heartbeat = min(wanted, offered) if wanted and offered else 0
        self._send(
            commands.Connection.TuneOk(
                channel_max=1, frame_max=self.frame_max, heartbeat=self.heartbeat
            ),
            0,
        )
        self._send(commands.Connection.Open(virtual_host=self.owner.vhost), 0)
        self._schedule_heartbeat()

    # -- writing ----------------------------------------------------------------------------

    def ack(self, tag: int, multiple: bool = False) -> bool:
        """Ack ``tag`` on this connection; False (nothing written) once it has closed."""
        if self.is_closed or not self.consuming:
            return False
        self._write(wire.ack_frame(CHANNEL, tag, multiple))
        return True

    def _send(self, method: Frame, channel: int) -> None:
        self._write(frame.marshal(method, channel))

    def _write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not self.is_closed:
            transport.write(data)
            self.last_sent = self.loop.time()

    # -- heartbeats and closing -------------------------------------------------------------

    def _schedule_heartbeat(self) -> None:
        if self.heartbeat and not self.is_closed:
            self._heartbeat_due = self.loop.time() + self.heartbeat / 2
            self.timer = self.loop.call_at(self._heartbeat_due, self._on_heartbeat_timer)

    def _on_heartbeat_timer(self) -> None:
        now = self.loop.time()
        if now - self._heartbeat_due > self.heartbeat / 2:
            # This process was stopped (a freeze): what the server sent meanwhile waits
            # unread in the socket. Our silence is no evidence against it; count from now.
            self.last_received = now
        if now - self.last_received > 2 * self.heartbeat:
            self.close(f"nothing heard for {2 * self.heartbeat} s (heartbeats)", abort=True)
            return
        if now - self.last_sent >= self.heartbeat / 2:
            self._write(HEARTBEAT_FRAME)
        self._schedule_heartbeat()

    def close(self, reason: str, abort: bool = False) -> None:
        """Close this connection (reconnecting is the owner's business)."""
        if self.is_closed:
            return
        if not abort and self.consuming:
            self._send(
                commands.Connection.Close(200, reason.encode()[:255].decode(errors="ignore"), 0, 0),
                0,
            )
        transport = self.transport
        self._closed(reason)
        if transport is not None:
            if abort:
                transport.abort()
            else:
                transport.close()

    def _closed(self, reason: str) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.is_closed:
            self.is_closed = True
            self.consuming = False
        if not self.ready.done():
            self.ready.set_exception(LinkClosed(reason))
            self.ready.exception()  # retrieved: the owner reads it from the handshake
        if not self.closed.done():
            self.closed.set_result(reason)


_IGNORED = (commands.Connection.CloseOk, commands.Connection.Blocked, commands.Connection.Unblocked)


def _reason(what: str, close: Any) -> str:
    return f"{what}: {close.reply_code} {close.reply_text}"


class ConsumerLink(Reconnecting):
    """Keep one subscription to ``queue`` on the server at ``url`` (amqp:// or amqps://,
    with user, password and virtual host), reconnecting after any failure.

    ``on_up()`` is called as each link is subscribed, before its first delivery;
    ``on_cancelled()`` when the server cancels the subscription (Basic.Cancel), before
    the link closes. ``consume_arguments(link, server_properties)``, called at
    Connection.Start, gives Basic.Consume's arguments (it may raise ``LinkClosed``).
    A delivery larger than ``max_body`` bytes closes the link before it is read.
    ``on_delivery(link, tag, properties, body)`` is called from the socket's read, in
    order; it acks with ``link.ack(tag)`` (at once or later) or drops the connection with
    ``link.close(reason)``. A callback that raises closes the connection too.
    """

    def __init__(
        self,
        url: str,
        queue: str,
        on_delivery: OnDelivery,
        name: str = "consumer",
        prefetch: int = 16,
        heartbeat: int = 5,
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
        connect_timeout: float = 5.0,
        client_properties: dict[str, Any] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        on_up: Callable[[], None] | None = None,
        on_cancelled: Callable[[], None] | None = None,
        consume_arguments: Callable[[Link, dict[str, Any]], dict[str, Any]] | None = None,
        max_body: int = 1 << 30,
        login_proof: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise ValueError(f"{_censor(url)}: not an amqp:// or amqps:// address")
        super().__init__(url, name, backoff_initial, backoff_max, connect_timeout, None, None)
        self.on_subscribed = on_up
        self.on_cancelled = on_cancelled
        self.consume_arguments = consume_arguments
        # ``login_proof(server_properties)``: what Start-Ok sends instead of the password
        # (it may raise ``LinkClosed``): the peering login (docs/security.md, "Logins").
        self.login_proof = login_proof
        self.max_body = max_body
        self.host = parts.hostname
        self.port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
        self.user = unquote(parts.username or "guest")
        self.password = unquote(parts.password or "guest")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        self.vhost = unquote(path) or "/"
        self.queue = queue
        self.on_delivery = on_delivery
        self.prefetch = prefetch
        self.heartbeat = heartbeat
        self.client_properties = {"connection_name": name, **(client_properties or {})}
        if ssl_context is None and parts.scheme == "amqps":
            ssl_context = ssl.create_default_context()
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname
        self.link: Link | None = None

    @property
    def connected(self) -> bool:
        return self.link is not None and self.link.consuming

    def _subscribed(self, link: Link) -> None:
        """From the link's read, at Consume-Ok: it is the link now, and ``on_up`` is called
        before the first delivery reaches ``on_delivery``."""
        self.link = link
        if self.on_subscribed is not None:
            self.on_subscribed()

    async def _open(self) -> None:
        try:
            self.link = await bounded(self._connect(), self.connect_timeout)
        except TimeoutError:
            raise TimeoutError(f"no subscription within {self.connect_timeout} s") from None

    async def _connect(self) -> Link:
        loop = asyncio.get_running_loop()
        options: dict[str, Any] = {}
        if self.ssl_context is not None:
            options["ssl"] = self.ssl_context
            options["server_hostname"] = self.server_hostname or self.host
        _, link = await loop.create_connection(lambda: Link(self), self.host, self.port, **options)
        try:
            await link.ready
        except BaseException:
            link.close("the handshake did not finish", abort=True)
            raise
        return link

    async def _wait_closed(self) -> str:
        link = self.link
        assert link is not None
        try:
            return await asyncio.shield(link.closed)
        except asyncio.CancelledError:
            link.close("stopping")
            raise

    async def _close(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            link.close("stopping")
