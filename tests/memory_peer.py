"""A client of an in-process broker with no socket: bytes in, frames out.

``MemoryPeer.open(broker)`` gives a ``Connection`` a transport that keeps what the broker
writes, logs in as guest and hands back a peer that sends frames (``send``) and reads the
frames the broker wrote since the last read (``take``), decoded with pamqp. The broker's
loop is the test's: a turn or two of it runs what the broker defers (its flushes, the login
checked off the loop). For protocol tests that need neither a process nor a socket; what a
real client sees over one stays in tests/integration.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pamqp import commands, frame
from pamqp.base import Frame

from amqha.connection import OPEN, Connection
from amqha.server import Broker
from bench.hotpath import NullTransport
from config import ServerConfig, User

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
TURNS = 50  # loop turns a send is given to settle (each a sleep(0)); bounded


class KeepingTransport(NullTransport):
    """``bench.hotpath``'s null transport (a loopback peer: guest logs in from there), with
    what the broker writes kept."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data


def solo_broker(**limits: Any) -> Broker:
    """A standalone broker with guest/guest and no store (call it on a running loop)."""
    config = ServerConfig(users=(User("guest", "guest"),))
    if limits:
        from dataclasses import replace

        config = replace(config, limits=replace(config.limits, **limits))
    return Broker(config)


class MemoryPeer:
    def __init__(self, connection: Connection, transport: KeepingTransport) -> None:
        self.connection = connection
        self.transport = transport
        self._read = 0

    @classmethod
    async def open(cls, broker: Broker) -> MemoryPeer:
        connection = Connection(broker)
        transport = KeepingTransport()
        connection.connection_made(transport)
        peer = cls(connection, transport)
        connection.data_received(PROTOCOL_HEADER)
        await peer.send(
            0,
            commands.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response="\0guest\0guest"
            ),
            commands.Connection.TuneOk(2047, 131072, 0),
            commands.Connection.Open(),
        )
        # The login is checked off the loop: the frames behind Start-Ok wait for it.
        for _ in range(500):
            if connection.state == OPEN:
                break
            await asyncio.sleep(0.01)
        assert connection.state == OPEN, "the in-memory connection did not open"
        peer.take()  # Start, Tune, Open-Ok
        return peer

    async def send(self, channel: int, *frames: Frame | bytes) -> None:
        """Hand the broker ``frames`` on ``channel`` (bytes: already marshalled) in one
        read, and let its loop turn until what it deferred has run."""
        data = b"".join(f if isinstance(f, bytes) else frame.marshal(f, channel) for f in frames)
        self.connection.data_received(data)
        for _ in range(TURNS):
            await asyncio.sleep(0)

    def take(self) -> list[tuple[int, Any]]:
        """(channel, frame) for each frame the broker wrote since the last take."""
        data = bytes(self.transport.data[self._read :])
        self._read = len(self.transport.data)
        frames = []
        while data:
            used, channel, value = frame.unmarshal(data)
            frames.append((channel, value))
            data = data[used:]
        return frames

    def methods(self) -> list[tuple[int, str]]:
        """(channel, method name) of each method frame written since the last take."""
        return [(c, f.name) for c, f in self.take() if hasattr(f, "name") and "." in f.name]
