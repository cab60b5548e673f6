"""The peering agent on its own, against a real server: connect, publish, reconnect, heal."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from typing import Any

import aio_pika
import pytest

from amqha.console import ConsoleClient
from amqha.netmark import CONTROL_TOS
from peering import Peering
from tests.proxy import TcpProxy
from tests.support import ServerProcess, until

PEERING_URL = "amqp://peering:peering@127.0.0.1:{port}/"


class Sink:
    """A queue on the remote server that receives what the peering publishes to it."""

    def __init__(self, server: ServerProcess, name: str) -> None:
        self.server = server
        self.name = name
        self.connection: aio_pika.abc.AbstractConnection | None = None

    async def open(self) -> Sink:
        self.connection = await aio_pika.connect(self.server.url)
        channel = await self.connection.channel()
        self.queue = await channel.declare_queue(self.name)
        return self

    async def close(self) -> None:
        if self.connection is not None and not self.connection.is_closed:
            await self.connection.close()

    async def receive(self, body: bytes, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = await self.queue.get(fail=False, no_ack=True)
            if message is not None and message.body == body:
                return
            if message is None:
                await asyncio.sleep(0.02)
        raise TimeoutError(f"{body!r} not received on {self.name} within {timeout} s")


def make_peering(port: int, links: list[str], **kwargs: Any) -> Peering:
    """A peering to the server on ``port`` that records on_up / on_down in ``links``."""
    return Peering(
        PEERING_URL.format(port=port),
        name="test-peering",
        backoff_initial=0.02,
        backoff_max=0.2,
        on_up=lambda: links.append("up"),
        on_down=lambda reason: links.append(f"down: {reason}"),
        **kwargs,
    )


async def test_connects_publishes_and_stops(make_server) -> None:
    links: list[str] = []
    server = make_server("remote").start()
    sink = await Sink(server, "peering-basic").open()
    peering = make_peering(server.port, links)
    await peering.start()
    try:
        await until(lambda: peering.connected, 10, "link up")
        assert links == ["up"] and peering.status.connects == 1
        assert peering.publish("", b"one", routing_key=sink.name)
        await sink.receive(b"one")
        await until(lambda: peering.status.published == 1, 5, "publish counted")
        assert peering.status.dropped == 0
        async with ConsoleClient(f"amqp://admin:admin@127.0.0.1:{server.port}/") as console:
            connections = await console.call("connections")
        assert [c["user"] for c in connections].count("peering") == 1
    finally:
        await peering.stop()
        await sink.close()
    assert not peering.connected
    assert not peering.publish("", b"after stop", routing_key=sink.name)
    assert peering.status.dropped == 1


async def test_a_control_link_is_marked_and_an_ordinary_one_is_not(make_server) -> None:
    """The pair's own link (``control``) leaves marked ahead of bulk traffic
    (amqha.netmark), each of its connections (a reconnect too); another peering not."""
    server = make_server("remote").start()
    sink = await Sink(server, "peering-marked").open()
    control = make_peering(server.port, [], control=True)
    ordinary = make_peering(server.port, [])
    await control.start()
    await ordinary.start()
    try:
        seen = []
        for connects in (1, 2):
            await until(lambda: control.connected and ordinary.connected, 20, "links up")
            assert control.status.connects == connects
            assert control.transport is not None and control.transport.writer is not None
            sock = control.transport.writer.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == CONTROL_TOS
            assert control.transport.problem is None
            seen.append(control.transport.writer)
            if connects == 1:
                assert control.publish("", b"marked", routing_key=sink.name)
                await sink.receive(b"marked")
                await sink.close()
                server.kill()  # both links drop, and come back to the restarted server
                await until(lambda: not control.connected, 10, "the control link dropped")
                server.start()
        assert seen[0] is not seen[1]
        assert ordinary.transport is None
    finally:
        await control.stop()
        await ordinary.stop()
        await sink.close()


async def test_reconnects_after_the_remote_is_killed_and_restarted(
    make_server,
) -> None:
    links: list[str] = []
    server = make_server("remote").start()
    peering = make_peering(server.port, links)
    await peering.start()
    try:
        await until(lambda: peering.connected, 10, "link up")
        server.kill()
        await until(lambda: not peering.connected, 5, "link down after kill -9")
        assert links[-1].startswith("down: ")
        # While the remote is down every publish is dropped and counted.
        for number in range(5):
            assert not peering.publish("", f"lost {number}".encode(), routing_key="nowhere")
        assert peering.status.dropped == 5
        attempts = peering.status.attempts
        await until(lambda: peering.status.attempts >= attempts + 2, 5, "keeps retrying")
        assert not peering.connected

        server.start()  # same port
        await until(lambda: peering.connected, 10, "link up again")
        assert peering.status.connects == 2
        assert links.count("up") == 2
        sink = await Sink(server, "peering-restart").open()
        try:
            assert peering.publish("", b"back", routing_key=sink.name)
            await sink.receive(b"back")
        finally:
            await sink.close()
    finally:
        await peering.stop()


@pytest.mark.parametrize("mode", ["refuse", "blackhole"])
async def test_survives_a_link_cut_and_heals_through_the_proxy(make_server, mode: str) -> None:
    links: list[str] = []
    server = make_server("remote").start()
    sink = await Sink(server, f"peering-cut-{mode}").open()
    with TcpProxy(server.port) as proxy:
        # A blackholed connect hangs: the agent's own connect timeout must end it.
        peering = make_peering(proxy.port, links, connect_timeout=0.5)
        await peering.start()
        try:
            await until(lambda: peering.connected, 10, "link up")
            assert peering.publish("", b"before", routing_key=sink.name)
            await sink.receive(b"before")

            proxy.cut(mode)
            await until(lambda: not peering.connected, 5, "link down after the cut")
            dropped = peering.status.dropped
            for _ in range(3):
                assert not peering.publish("", b"cut", routing_key=sink.name)
            assert peering.status.dropped == dropped + 3
            attempts = peering.status.attempts
            await until(lambda: peering.status.attempts >= attempts + 2, 5, "retries while cut")
            assert not peering.connected and proxy.piped == 1

            proxy.heal()
            await until(lambda: peering.connected, 10, "link up after heal")
            assert peering.status.connects == 2 and proxy.piped == 2
            assert peering.publish("", b"after", routing_key=sink.name)
            await sink.receive(b"after")
            assert links.count("up") == 2 and sum(x.startswith("down") for x in links) == 1
        finally:
            await peering.stop()
            await sink.close()


async def test_delayed_link_still_delivers_in_order(make_server) -> None:
    links: list[str] = []
    server = make_server("remote").start()
    sink = await Sink(server, "peering-delay").open()
    with TcpProxy(server.port) as proxy:
        peering = make_peering(proxy.port, links)
        await peering.start()
        try:
            await until(lambda: peering.connected, 10, "link up")
            proxy.delay(0.2)
            sent = time.monotonic()
            for number in range(3):
                assert peering.publish("", str(number).encode(), routing_key=sink.name)
            for number in range(3):
                await sink.receive(str(number).encode())
            assert time.monotonic() - sent >= 0.2
            assert peering.connected and peering.status.connects == 1
        finally:
            await peering.stop()
            await sink.close()


async def test_a_link_declared_stuck_reconnects_after_the_remote_thaws(make_server) -> None:
    """aiormq calls a connection stuck after three heartbeats with no frame and ends it with
    a ``CancelledError``: a link that took that for its own stop never came back, and the
    pair stayed deaf after a freeze (docs/failover.md, "Freezes"). Frozen past that limit
    (heartbeat 1 s: stuck after 6 s), the remote is thawed: the link is up again and
    carries messages."""
    links: list[str] = []
    server = make_server("remote").start()
    peering = make_peering(server.port, links, heartbeat=1)
    await peering.start()
    frozen = False
    try:
        await until(lambda: peering.connected, 10, "link up")
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        frozen = True
        # aiormq's own stuck verdict, 3 x (1 + 1) s after the last frame: the link goes down
        # and keeps trying (each try times out against the frozen server).
        await until(lambda: any(e.startswith("down: ") for e in links), 20, "link down (stuck)")
        attempts = peering.status.attempts
        await until(lambda: peering.status.attempts > attempts, 10, "keeps retrying")
        os.kill(server.process.pid, signal.SIGCONT)
        frozen = False
        await until(lambda: peering.connected, 20, "link up again after the thaw")
        assert links.count("up") >= 2
        sink = await Sink(server, "peering-thaw").open()
        try:
            assert peering.publish("", b"thawed", routing_key=sink.name)
            await sink.receive(b"thawed")
        finally:
            await sink.close()
    finally:
        if frozen and server.process is not None:
            os.kill(server.process.pid, signal.SIGCONT)
        await peering.stop()
