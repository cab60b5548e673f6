"""The confirm pipeline, driven in memory (tests/memory_peer.py) against a broker with a
real store: a persistent publish's Basic.Ack and a transaction's Commit-Ok wait for the
store's writer, and come out through the connection; a channel closed first leaves nothing
waiting. And a consume of a name that is not a queue reaches its service's outlet, acks
and end included, the way the replication feed's does (channel_feed.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pamqp import commands

from amqha.server import Broker
from config import ServerConfig, User
from tests.memory_peer import MemoryPeer, solo_broker
from tests.unit.test_protocol_memory import content, open_channel

PERSISTENT = {"delivery_mode": 2}


async def until(condition: Any, seconds: float = 10.0) -> None:
    """Let the loop (and the store's writer thread) run until ``condition()``; bounded."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within the bound")


def stored_broker(tmp_path: Path) -> Broker:
    broker = Broker(ServerConfig(users=(User("guest", "guest"),), data_dir=str(tmp_path)))
    broker.open_store()
    return broker


async def test_a_persistent_publish_is_acked_once_the_store_wrote_it(tmp_path: Path) -> None:
    broker = stored_broker(tmp_path)
    try:
        peer = await MemoryPeer.open(broker)
        await open_channel(peer)
        await peer.send(
            1, commands.Confirm.Select(), commands.Queue.Declare(queue="q", durable=True)
        )
        assert peer.methods() == [(1, "Confirm.SelectOk"), (1, "Queue.DeclareOk")]
        await peer.send(
            1,
            commands.Basic.Publish(routing_key="q"),
            *content(b"kept", **PERSISTENT),
            commands.Basic.Publish(routing_key="nowhere"),
            *content(b"routed nowhere"),
        )
        acks: list[tuple[int, bool]] = []

        def acked() -> bool:
            acks.extend(
                (f.delivery_tag, f.multiple) for _, f in peer.take() if f.name == "Basic.Ack"
            )
            return bool(acks)

        await until(acked)
        # One multiple ack for both, once the first is on disk: never the second alone.
        assert acks == [(2, True)]
        assert broker.store_sink is not None and broker.store_sink.written >= 1
        assert broker.confirms.waiting.trackers == {}
    finally:
        broker.close_store()


async def test_a_commit_is_answered_once_the_store_wrote_it(tmp_path: Path) -> None:
    broker = stored_broker(tmp_path)
    try:
        peer = await MemoryPeer.open(broker)
        await open_channel(peer)
        await peer.send(1, commands.Tx.Select(), commands.Queue.Declare(queue="q", durable=True))
        assert peer.methods() == [(1, "Tx.SelectOk"), (1, "Queue.DeclareOk")]
        await peer.send(1, commands.Basic.Publish(routing_key="q"), *content(b"m", **PERSISTENT))
        await peer.send(1, commands.Tx.Commit())
        answered: list[tuple[int, str]] = []

        def committed() -> bool:
            answered.extend(peer.methods())
            return bool(answered)

        await until(committed)
        assert answered == [(1, "Tx.CommitOk")]
        assert broker.store_sink is not None and broker.store_sink.written >= 1
        assert not broker.confirms.waiting.commits
    finally:
        broker.close_store()


async def test_a_channel_closed_while_its_publishes_wait_leaves_nothing_waiting(
    tmp_path: Path,
) -> None:
    broker = stored_broker(tmp_path)
    store = broker.store
    assert store is not None
    try:
        peer = await MemoryPeer.open(broker)
        await open_channel(peer)
        await peer.send(
            1, commands.Confirm.Select(), commands.Queue.Declare(queue="q", durable=True)
        )
        peer.take()
        # The publish and the close in one read: the store cannot have written between.
        await peer.send(
            1,
            commands.Basic.Publish(routing_key="q"),
            *content(b"m", **PERSISTENT),
            commands.Channel.Close(200, "bye", 0, 0),
        )
        await until(lambda: broker.store_sink is not None and broker.store_sink.written >= 1)
        await asyncio.sleep(0.05)  # a turn for anything the write released to go out
        # Not safe by the close, so never confirmed: the publisher saw the channel close.
        assert peer.methods() == [(1, "Channel.CloseOk")]
        assert broker.confirms.waiting.trackers == {}
    finally:
        broker.close_store()


class Recording:
    """A consume service (host.ConsumeService) that records what its outlet is handed."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def open(self, channel: Any, tag: str, method: Any) -> Any:
        service = self

        class Outlet:
            consumer_tag = tag

            def start(self) -> None:
                service.events.append(("start", channel.next_tag()))

            def acked(self, tag_: int, multiple: bool) -> None:
                service.events.append(("acked", tag_, multiple))

            def ended(self) -> None:
                service.events.append(("ended",))

        self.events.append(("open", tag))
        return Outlet()


async def test_a_consume_service_gets_its_channels_acks_and_end() -> None:
    broker = solo_broker()
    service = Recording()
    broker.consume_services["amq.test-service"] = service
    peer = await MemoryPeer.open(broker)
    await open_channel(peer)
    await peer.send(1, commands.Basic.Consume(queue="amq.test-service", consumer_tag="t"))
    assert peer.methods() == [(1, "Basic.ConsumeOk")]
    await peer.send(1, commands.Basic.Ack(1, False), commands.Basic.Ack(3, True))
    # The channel carries the service alone: a second consume on it is refused.
    await peer.send(1, commands.Basic.Consume(queue="amq.test-service", consumer_tag="u"))
    assert peer.methods() == [(1, "Channel.Close")]
    assert service.events == [
        ("open", "t"),
        ("start", 1),
        ("acked", 1, False),
        ("acked", 3, True),
        ("ended",),
    ]


async def test_a_consume_service_needs_acks_on_a_channel_of_its_own() -> None:
    broker = solo_broker()
    service = Recording()
    broker.consume_services["amq.test-service"] = service
    peer = await MemoryPeer.open(broker)
    await open_channel(peer)
    await peer.send(1, commands.Basic.Consume(queue="amq.test-service", no_ack=True))
    frames = peer.take()
    assert [(c, f.name, getattr(f, "reply_code", None)) for c, f in frames] == [
        (1, "Channel.Close", 406)
    ]
    assert service.events == []  # refused before the service saw it
    await open_channel(peer, 2)
    await peer.send(2, commands.Basic.Consume(queue="amq.test-service", consumer_tag="t"))
    await peer.send(2, commands.Basic.Cancel("t"))
    assert peer.methods() == [(2, "Basic.ConsumeOk"), (2, "Basic.CancelOk")]
    assert service.events == [("open", "t"), ("start", 1), ("ended",)]
