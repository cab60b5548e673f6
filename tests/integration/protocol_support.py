"""Helpers for the protocol tests: a bare AMQP client on a socket, reply codes, names,
and one scrape of the Prometheus endpoint.

``RawClient`` sends exactly the frames a test tells it to, so tests can negotiate
odd limits, stay silent, or break the rules on purpose, and read every frame the
server sends (heartbeats included) with its size on the wire. Every read is bounded.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request
import uuid
from typing import Any

import aiormq
from pamqp import body, commands, frame, header, heartbeat
from pamqp import exceptions as pamqp_exceptions
from pamqp.base import Frame as Method
from prometheus_client.parser import text_string_to_metric_families

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
ALL_CLIENT_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}

_CHANNEL_CODES = {cls: code for code, cls in aiormq.channel.EXCEPTION_MAPPING.items()}
_CONNECTION_CODES = {cls: code for code, cls in aiormq.connection.EXCEPTION_MAPPING.items()}


def unique(prefix: str) -> str:
    """A queue or exchange name no other test uses (the session broker is shared)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def reply_code(error: BaseException) -> int:
    """The AMQP reply code behind an aiormq / aio-pika channel or connection close."""
    code = _CHANNEL_CODES.get(type(error)) or _CONNECTION_CODES.get(type(error))
    if code is not None:
        return code
    if (
        isinstance(error, aiormq.exceptions.ChannelClosed | aiormq.exceptions.ConnectionClosed)
        and error.args
        and isinstance(error.args[0], int)
    ):
        return error.args[0]
    raise AssertionError(f"no AMQP reply code in {error!r}")


class Closed(Exception):
    """The server closed the socket."""


class RawClient:
    """A blocking-socket AMQP 0-9-1 client with no opinions of its own."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""
        self.frame_sizes: list[int] = []

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # -- sending -----------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, channel: int, *frames: Any) -> None:
        self.sock.sendall(b"".join(frame.marshal(item, channel) for item in frames))

    def send_heartbeat(self) -> None:
        self.send(0, heartbeat.Heartbeat())

    def publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        payload: bytes,
        frame_max: int = 131072,
        properties: commands.Basic.Properties | None = None,
        **publish_args: Any,
    ) -> None:
        """Basic.Publish with its header and body frames cut to ``frame_max``."""
        frames: list[Any] = [
            commands.Basic.Publish(exchange=exchange, routing_key=routing_key, **publish_args),
            header.ContentHeader(0, len(payload), properties or commands.Basic.Properties()),
        ]
        step = frame_max - 8
        frames += [body.ContentBody(payload[i : i + step]) for i in range(0, len(payload), step)]
        self.send(channel, *frames)

    # -- reading -----------------------------------------------------------------

    def read(self, timeout: float = 5.0) -> tuple[int, Any]:
        """The next frame as (channel, frame); raises Closed at EOF, TimeoutError if none."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buffer) >= 7:
                try:
                    used, channel, value = frame.unmarshal(self.buffer)
                except pamqp_exceptions.UnmarshalingException as error:
                    if "Not all data" not in str(error):
                        raise
                else:
                    self.buffer = self.buffer[used:]
                    self.frame_sizes.append(used)
                    return channel, value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no frame from the server within {timeout} s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                raise Closed()
            self.buffer += data

    def expect(self, kind: type, channel: int | None = None, timeout: float = 5.0) -> Any:
        """Read frames, skipping heartbeats, until one arrives; it must be a ``kind``."""
        while True:
            number, value = self.read(timeout)
            if isinstance(value, heartbeat.Heartbeat):
                continue
            assert isinstance(value, kind), f"expected {kind}, got {value!r}"
            if channel is not None:
                assert number == channel, f"{value.name} on channel {number}, not {channel}"
            return value

    def expect_connection_close(self, code: int, timeout: float = 5.0) -> commands.Connection.Close:
        close = self.expect(commands.Connection.Close, 0, timeout)
        assert close.reply_code == code, (close.reply_code, close.reply_text)
        return close

    def wait_closed(self, timeout: float = 5.0) -> list[Any]:
        """Read until EOF (bounded); returns the frames read on the way."""
        deadline = time.monotonic() + timeout
        frames = []
        while True:
            try:
                frames.append(self.read(max(0.01, deadline - time.monotonic()))[1])
            except Closed:
                return frames

    # -- the handshake -------------------------------------------------------------

    def start(self) -> commands.Connection.Start:
        self.send_raw(PROTOCOL_HEADER)
        return self.expect(commands.Connection.Start, 0)

    def start_ok(
        self,
        user: str = "guest",
        password: str = "guest",
        mechanism: str = "PLAIN",
        capabilities: dict[str, bool] | None = None,
    ) -> None:
        response = f"\x00{user}\x00{password}"
        properties = {"product": "amqha raw test client", "capabilities": capabilities or {}}
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties=properties,
                mechanism=mechanism,
                response=response,
                locale="en_US",
            ),
        )

    def handshake(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        heartbeat: int = 0,
        frame_max: int | None = None,
        channel_max: int | None = None,
        capabilities: dict[str, bool] | None = None,
    ) -> commands.Connection.Tune:
        """Connect up to Open-Ok with the given TuneOk values (None: take the server's)."""
        self.start()
        self.start_ok(user, password, capabilities=capabilities)
        tune = self.expect(commands.Connection.Tune, 0)
        self.send(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max if channel_max is None else channel_max,
                frame_max=tune.frame_max if frame_max is None else frame_max,
                heartbeat=heartbeat,
            ),
            commands.Connection.Open(virtual_host=vhost),
        )
        self.expect(commands.Connection.OpenOk, 0)
        return tune

    def open_channel(self, number: int) -> None:
        self.send(number, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk, number)

    def call(self, channel: int, method: Method, reply: type, timeout: float = 5.0) -> Any:
        self.send(channel, method)
        return self.expect(reply, channel, timeout)


async def channel_error(connection: Any, action: Any) -> int:
    """Run ``action(channel)`` on a fresh aio-pika channel; it must close just that channel.

    Returns the reply code. The connection must stay open and usable.
    """
    channel = await connection.channel()
    try:
        await action(channel)
    except aiormq.exceptions.AMQPChannelError as error:
        code = reply_code(error)
    else:
        raise AssertionError("the broker accepted what it should have refused")
    assert channel.is_closed, "the channel should be closed by the error"
    assert not connection.is_closed, "a channel error must not close the connection"
    probe = await connection.channel()
    await probe.close()
    return code


async def wait_until_async(predicate: Any, timeout: float = 10.0) -> None:
    """Poll ``predicate`` on the event loop until it is true, at most ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


async def eventually(check: Any, timeout: float = 10.0) -> Any:
    """Await ``check()`` until it returns something truthy, at most ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.02)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One Prometheus scrape of 127.0.0.1:PORT/metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def fresh_scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A scrape of a snapshot taken after this call began (a page is reused for a second):
    scrapes until the snapshot count passes the first one's, at most 10 s."""
    first = scrape(port)[("amqha_metrics_snapshots_total", ())]
    deadline = time.monotonic() + 10
    while True:
        figures = scrape(port)
        if figures[("amqha_metrics_snapshots_total", ())] > first:
            return figures
        if time.monotonic() >= deadline:
            raise TimeoutError("no new metrics snapshot in 10 s")
        time.sleep(0.05)
