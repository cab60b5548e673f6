"""A low-overhead AMQP 0-9-1 client for benchmarks: what a broker can do, not a client.

pamqp encodes and decodes the handshake and the synchronous methods; the hot frames are
pre-encoded (a publish is one ``bytes`` of method + header + body frames, written in
batches) and the hot replies are parsed by hand (Basic.Deliver: the delivery tag;
Basic.Ack/Nack from the broker: the confirmed sequence number; body frames: counted).
Acks for deliveries go out as one write per read.

Every wait is bounded: an operation that does not finish in ``limit`` seconds raises
``TimeoutError``. Not a general client: one consumer per connection, no heartbeats
(the benchmark asks for none), no content bigger than one frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from typing import Any

from pamqp import commands, frame, header
from pamqp.common import FieldTable

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY = 1, 2, 3

DELIVER = commands.Basic.Deliver.index
ACK = commands.Basic.Ack.index
NACK = commands.Basic.Nack.index

_head = struct.Struct(">BHI")
_index = struct.Struct(">I")
_tag_bits = struct.Struct(">QB")
_long_long = struct.Struct(">Q")
_ack_frame = struct.Struct(">BHIIQBB")

CLIENT_PROPERTIES: FieldTable = {
    "product": "amqha-bench-rawclient",
    "capabilities": {"publisher_confirms": True, "basic.nack": True},
}


class ServerClosed(Exception):
    """The broker closed the connection or a channel; the argument is its close method."""

    def __str__(self) -> str:
        method = self.args[0] if self.args else None
        code = getattr(method, "reply_code", None)
        if code is None:
            return super().__str__()
        return f"{code} {getattr(method, 'reply_text', '')}"  # as "403 ACCESS_REFUSED - ..."


def ack_frame(channel: int, tag: int, multiple: bool) -> bytes:
    return _ack_frame.pack(FRAME_METHOD, channel, 13, ACK, tag, multiple, 0xCE)


def publish_frames(
    channel: int,
    routing_key: str,
    body: bytes,
    exchange: str = "",
    persistent: bool = False,
    headers: FieldTable | None = None,
) -> bytes:
    """One Basic.Publish with its content, ready to write (pamqp-encoded once)."""
    properties = commands.Basic.Properties(delivery_mode=2 if persistent else None, headers=headers)
    return b"".join(
        (
            frame.marshal(
                commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel
            ),
            frame.marshal(header.ContentHeader(0, len(body), properties), channel),
            _head.pack(FRAME_BODY, channel, len(body)) + body + b"\xce",
        )
    )


class RawClient(asyncio.Protocol):
    """One connection with one channel (number 1) once ``open()`` has returned."""

    CHANNEL = 1

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.methods: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.server_properties: dict[str, Any] = {}
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self.error: BaseException | None = None
        self.write_resumed: asyncio.Future[None] | None = None
        # Publisher confirms: highest contiguous sequence confirmed, nacks seen.
        self.confirmed = 0
        self.nacked = 0
        self._confirm_singles: set[int] = set()
        self.window_waiter: asyncio.Future[None] | None = None
        # Consuming: deliveries seen, how to ack them, when to say we are done.
        self.delivered = 0
        self.bodies = 0
        self.ack_mode = ""  # "", "each" or "multiple" (every ACK_EVERY deliveries)
        self.ack_every = 100
        self.target = 0
        self.target_reached: asyncio.Future[None] | None = None
        self.body_waiter: asyncio.Future[None] | None = None

    # -- asyncio protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("connection closed"))
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.write_resumed = self.loop.create_future()

    def resume_writing(self) -> None:
        waiter, self.write_resumed = self.write_resumed, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        for waiter in (
            self.window_waiter,
            self.target_reached,
            self.body_waiter,
            self.write_resumed,
        ):
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)
        self.methods.put_nowait((-1, error))

    def data_received(self, data: bytes) -> None:
        if self.buffer:
            data = self.buffer + data
        position = 0
        available = len(data)
        unpack_head = _head.unpack_from
        acks: list[bytes] = []
        channel = self.CHANNEL
        while available - position >= 7:
            kind, number, size = unpack_head(data, position)
            end = position + 7 + size
            if end >= available:
                break
            if kind == FRAME_BODY:
                self.bodies += 1
                waiter = self.body_waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            elif kind == FRAME_METHOD:
                index = _index.unpack_from(data, position + 7)[0]
                if index == DELIVER:
                    tag_at = position + 12 + data[position + 11]
                    tag = _long_long.unpack_from(data, tag_at)[0]
                    self.delivered = delivered = self.delivered + 1
                    mode = self.ack_mode
                    if mode == "each" and delivered <= self.target:
                        acks.append(ack_frame(channel, tag, False))
                    elif mode == "multiple" and (
                        delivered % self.ack_every == 0 or delivered == self.target
                    ):
                        acks.append(ack_frame(channel, tag, True))
                elif index in (ACK, NACK):
                    tag, bits = _tag_bits.unpack_from(data, position + 11)
                    if index == NACK:
                        self.nacked += tag - self.confirmed if bits & 1 else 1
                    self._on_confirm(tag, bool(bits & 1))
                else:
                    self._on_method(data[position : end + 1])
            position = end + 1
        self.buffer = data[position:] if position < available else b""
        if acks and self.transport is not None:
            self.transport.write(b"".join(acks) if len(acks) > 1 else acks[0])
        if self.target and self.delivered >= self.target:
            waiter = self.target_reached
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _on_confirm(self, tag: int, multiple: bool) -> None:
        if multiple:
            if tag > self.confirmed:
                self.confirmed = tag
        elif tag == self.confirmed + 1:
            self.confirmed = tag
        else:
            self._confirm_singles.add(tag)
        singles = self._confirm_singles
        while singles and self.confirmed + 1 in singles:
            singles.discard(self.confirmed + 1)
            self.confirmed += 1
        if singles:
            self._confirm_singles = {t for t in singles if t > self.confirmed}
        waiter = self.window_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _on_method(self, raw: bytes) -> None:
        _, number, method = frame.unmarshal(raw)
        if isinstance(method, commands.Connection.Close):
            self._write(frame.marshal(commands.Connection.CloseOk(), 0))
            self._fail(ServerClosed(method))
            return
        if isinstance(method, commands.Channel.Close):
            self._write(frame.marshal(commands.Channel.CloseOk(), number))
            self._fail(ServerClosed(method))
            return
        self.methods.put_nowait((number, method))

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- handshake and synchronous methods -----------------------------------------------

    async def next_method(self, limit: float = 30.0) -> Any:
        async with asyncio.timeout(limit):
            _, method = await self.methods.get()
        if isinstance(method, BaseException):
            raise method
        return method

    async def rpc(self, method: Any, channel: int = CHANNEL, limit: float = 30.0) -> Any:
        if self.error is not None:
            raise self.error
        self._write(frame.marshal(method, channel))
        return await self.next_method(limit)

    async def handshake(
        self, user: str = "guest", password: str = "guest", vhost: str = "/", limit: float = 10.0
    ) -> None:
        """Protocol header → Start/StartOk → Tune/TuneOk → Open/OpenOk."""
        self._write(PROTOCOL_HEADER)
        start = await self.next_method(limit)
        self.server_properties = dict(start.server_properties or {})
        self._write(
            frame.marshal(
                commands.Connection.StartOk(
                    client_properties=CLIENT_PROPERTIES,
                    mechanism="PLAIN",
                    response=f"\0{user}\0{password}",
                    locale="en_US",
                ),
                0,
            )
        )
        tune = await self.next_method(limit)
        self._write(
            frame.marshal(
                commands.Connection.TuneOk(
                    channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
                ),
                0,
            )
        )
        await self.rpc(commands.Connection.Open(virtual_host=vhost), channel=0, limit=limit)

    async def open_channel(self, confirm: bool = False) -> None:
        await self.rpc(commands.Channel.Open())
        if confirm:
            await self.rpc(commands.Confirm.Select())

    async def close(self, limit: float = 5.0) -> None:
        """Connection.Close → CloseOk, then the socket; never waits longer than ``limit``."""
        if self.transport is None:
            return
        if self.error is None:
            with contextlib.suppress(Exception):
                await self.rpc(commands.Connection.Close(200, "bye", 0, 0), channel=0, limit=limit)
        self.transport.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(limit):
                await self.closed

    async def declare_queue(
        self,
        name: str,
        passive: bool = False,
        durable: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> int:
        ok = await self.rpc(
            commands.Queue.Declare(
                queue=name, passive=passive, durable=durable, arguments=arguments
            )
        )
        return int(ok.message_count)

    async def delete_queue(self, name: str) -> None:
        await self.rpc(commands.Queue.Delete(queue=name))

    async def purge_queue(self, name: str) -> None:
        await self.rpc(commands.Queue.Purge(queue=name))

    # -- hot loops ------------------------------------------------------------------------

    async def _writable(self) -> None:
        waiter = self.write_resumed
        if waiter is not None:
            await waiter
        elif self.error is not None:
            raise self.error

    async def publish(
        self, frames: bytes, count: int, batch: int = 200, limit: float = 120.0
    ) -> None:
        """Write ``count`` copies of ``frames`` in batches, yielding to the loop between them."""
        chunk = frames * batch
        sent = 0
        async with asyncio.timeout(limit):
            while sent < count:
                take = min(batch, count - sent)
                self._write(chunk if take == batch else frames * take)
                sent += take
                await self._writable()
                await asyncio.sleep(0)

    async def publish_confirmed(
        self, frames: bytes, count: int, window: int = 100, limit: float = 120.0
    ) -> int:
        """Publish with at most ``window`` unconfirmed; returns how many were nacked."""
        base = self.confirmed
        sent = 0
        chunks = {window: frames * window}
        async with asyncio.timeout(limit):
            while self.confirmed - base < count:
                room = window - (sent - (self.confirmed - base))
                if room > 0 and sent < count:
                    take = min(room, count - sent)
                    chunk = chunks.get(take)
                    if chunk is None:
                        chunk = chunks[take] = frames * take
                    self._write(chunk)
                    sent += take
                if self.error is not None:
                    raise self.error
                self.window_waiter = self.loop.create_future()
                await self.window_waiter
                self.window_waiter = None
        return self.nacked

    async def publish_confirmed_each(
        self, messages: list[bytes], window: int = 100, limit: float = 120.0
    ) -> int:
        """``publish_confirmed`` for messages that differ (each its own pre-encoded
        frames, in order); returns how many were nacked."""
        base = self.confirmed
        sent = 0
        count = len(messages)
        async with asyncio.timeout(limit):
            while self.confirmed - base < count:
                room = window - (sent - (self.confirmed - base))
                if room > 0 and sent < count:
                    take = min(room, count - sent)
                    self._write(b"".join(messages[sent : sent + take]))
                    sent += take
                if self.error is not None:
                    raise self.error
                self.window_waiter = self.loop.create_future()
                await self.window_waiter
                self.window_waiter = None
        return self.nacked

    async def consume(
        self, queue: str, count: int, ack: str, prefetch: int = 1000, limit: float = 120.0
    ) -> float:
        """Consume ``count`` deliveries, acking each (``ack="each"``) or every 100 with
        multiple=true (``ack="multiple"``); returns seconds from Basic.Consume to the last.
        """
        await self.rpc(commands.Basic.Qos(prefetch_count=prefetch))
        self.delivered = 0
        self.ack_mode = ack
        self.target = count
        self.target_reached = self.loop.create_future()
        started = time.perf_counter()
        self._write(
            frame.marshal(commands.Basic.Consume(queue=queue, consumer_tag="bench"), self.CHANNEL)
        )
        async with asyncio.timeout(limit):
            await self.target_reached
        elapsed = time.perf_counter() - started
        self.ack_mode = ""
        self.target = 0
        self.target_reached = None
        await self.next_method(limit)  # Basic.ConsumeOk
        await self.rpc(commands.Basic.Cancel(consumer_tag="bench"))
        return elapsed

    async def roundtrips(self, queue: str, count: int, limit: float = 60.0) -> list[float]:
        """Publish one message, wait for its delivery (no-ack consumer), repeat; seconds each."""
        await self.rpc(commands.Basic.Consume(queue=queue, consumer_tag="rtt", no_ack=True))
        frames = publish_frames(self.CHANNEL, queue, b"x" * 100)
        samples: list[float] = []
        clock = time.perf_counter
        async with asyncio.timeout(limit):
            for _ in range(count):
                waiter = self.body_waiter = self.loop.create_future()
                started = clock()
                self._write(frames)
                await waiter
                samples.append(clock() - started)
        self.body_waiter = None
        await self.rpc(commands.Basic.Cancel(consumer_tag="rtt"))
        return samples


async def connect(host: str, port: int, limit: float = 10.0, **login: Any) -> RawClient:
    """TCP connect plus the AMQP handshake; the client's channel is not open yet."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(limit):
        _, client = await loop.create_connection(RawClient, host, port)
    try:
        await client.handshake(limit=limit, **login)
    except BaseException:
        if client.transport is not None:
            client.transport.abort()
        raise
    return client


def ping(host: str, port: int, limit: float = 1.0) -> dict[str, Any] | None:
    """Blocking AMQP handshake with plain sockets: the server properties, or None if it
    does not serve AMQP yet (refused, reset, closed or slow)."""
    deadline = time.monotonic() + limit
    try:
        with socket.create_connection((host, port), timeout=limit) as sock:
            sock.sendall(PROTOCOL_HEADER)
            received = b""

            def read_method() -> Any:
                nonlocal received
                while True:
                    if len(received) >= 7:
                        size = _head.unpack_from(received)[2]
                        if len(received) >= size + 8:
                            used, _, method = frame.unmarshal(received[: size + 8])
                            received = received[used:]
                            return method
                    sock.settimeout(max(0.01, deadline - time.monotonic()))
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise ConnectionError("closed")
                    received += chunk

            start = read_method()
            if not isinstance(start, commands.Connection.Start):
                return None
            sock.sendall(
                frame.marshal(
                    commands.Connection.StartOk(
                        client_properties=CLIENT_PROPERTIES,
                        mechanism="PLAIN",
                        response="\0guest\0guest",
                        locale="en_US",
                    ),
                    0,
                )
            )
            tune = read_method()
            sock.sendall(
                frame.marshal(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0), 0)
                + frame.marshal(commands.Connection.Open(virtual_host="/"), 0)
            )
            if not isinstance(read_method(), commands.Connection.OpenOk):
                return None
            sock.sendall(frame.marshal(commands.Connection.Close(200, "bye", 0, 0), 0))
            with contextlib.suppress(Exception):
                read_method()
            return dict(start.server_properties or {})
    except Exception:  # refused, reset, timed out, garbage: not serving yet
        return None
