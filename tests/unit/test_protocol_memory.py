"""A connection and its channels driven in memory (tests/memory_peer.py): frames in, frames
out, no process and no socket. What a channel answers and which errors close what, with
the exact frames: the channel's rules as the broker applies them, a millisecond a case."""

from __future__ import annotations

import asyncio

import pytest
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqha import channel as channel_module
from amqha.connection import TURN_OUTPUT
from tests.memory_peer import MemoryPeer, solo_broker


def content(body: bytes, **properties: object) -> tuple[ContentHeader, ContentBody]:
    header = ContentHeader(0, len(body), commands.Basic.Properties(**properties))
    return header, ContentBody(body)


async def open_channel(peer: MemoryPeer, number: int = 1) -> None:
    await peer.send(number, commands.Channel.Open())
    assert peer.methods() == [(number, "Channel.OpenOk")]


async def test_a_confirmed_publish_is_acked_with_its_sequence_number() -> None:
    peer = await MemoryPeer.open(solo_broker())
    await open_channel(peer)
    await peer.send(1, commands.Confirm.Select(), commands.Queue.Declare(queue="q"))
    assert peer.methods() == [(1, "Confirm.SelectOk"), (1, "Queue.DeclareOk")]
    await peer.send(1, commands.Basic.Publish(routing_key="q"), *content(b"one"))
    await peer.send(1, commands.Basic.Publish(routing_key="nowhere"), *content(b"two"))
    frames = peer.take()
    acks = [(c, f.delivery_tag, f.multiple) for c, f in frames if f.name == "Basic.Ack"]
    assert acks == [(1, 1, False), (1, 2, False)]  # unroutable: confirmed all the same


async def test_a_soft_error_closes_its_channel_only() -> None:
    peer = await MemoryPeer.open(solo_broker())
    await open_channel(peer, 1)
    await open_channel(peer, 2)
    await peer.send(1, commands.Basic.Publish(exchange="missing", routing_key="k"))
    (closed,) = [f for c, f in peer.take() if c == 1]
    assert closed.name == "Channel.Close" and closed.reply_code == 404
    assert "missing" in closed.reply_text
    await peer.send(2, commands.Queue.Declare(queue="still-here"))
    assert peer.methods() == [(2, "Queue.DeclareOk")]
    assert not peer.transport.closing


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        # A content header with no Basic.Publish before it.
        (lambda: [content(b"x")[0]], 505),
        # A body longer than its header said.
        (
            lambda: [
                commands.Basic.Publish(routing_key="q"),
                *content(b"xy")[:1],
                ContentBody(b"xyz"),
            ],
            501,
        ),
        # A method on a channel that was never opened.
        (lambda: [commands.Queue.Declare(queue="q")], 504),
    ],
    ids=["header-without-publish", "body-too-long", "unopened-channel"],
)
async def test_a_hard_error_closes_the_connection_with_its_code(frames, code) -> None:
    peer = await MemoryPeer.open(solo_broker())
    number = 3 if code == 504 else 1
    if code != 504:
        await open_channel(peer)
    await peer.send(number, *frames())
    closes = [f for c, f in peer.take() if c == 0 and f.name == "Connection.Close"]
    assert [f.reply_code for f in closes] == [code]
    await peer.send(0, commands.Connection.CloseOk())
    assert peer.transport.closing


async def test_get_answers_empty_then_the_message_with_its_content() -> None:
    peer = await MemoryPeer.open(solo_broker())
    await open_channel(peer)
    await peer.send(1, commands.Queue.Declare(queue="q"), commands.Basic.Get(queue="q"))
    assert peer.methods() == [(1, "Queue.DeclareOk"), (1, "Basic.GetEmpty")]
    await peer.send(1, commands.Basic.Publish(routing_key="q"), *content(b"body", app_id="t"))
    await peer.send(1, commands.Basic.Get(queue="q", no_ack=True))
    (_, ok), (_, header), (_, body) = peer.take()
    assert ok.name == "Basic.GetOk" and ok.message_count == 0
    assert header.properties.app_id == "t" and body.value == b"body"


async def test_a_transaction_publishes_at_its_commit_and_not_after_a_rollback() -> None:
    peer = await MemoryPeer.open(solo_broker())
    await open_channel(peer)
    await peer.send(1, commands.Queue.Declare(queue="q"), commands.Tx.Select())
    await peer.send(1, commands.Basic.Publish(routing_key="q"), *content(b"kept"))
    await peer.send(1, commands.Queue.Declare(queue="q", passive=True))
    assert [f.message_count for _, f in peer.take() if f.name == "Queue.DeclareOk"] == [0, 0]
    await peer.send(1, commands.Tx.Commit())
    await peer.send(1, commands.Basic.Publish(routing_key="q"), *content(b"dropped"))
    await peer.send(1, commands.Tx.Rollback(), commands.Queue.Declare(queue="q", passive=True))
    frames = peer.take()
    assert [f.name for _, f in frames] == ["Tx.CommitOk", "Tx.RollbackOk", "Queue.DeclareOk"]
    assert frames[-1][1].message_count == 1


async def test_a_user_id_that_is_not_the_login_is_refused_on_its_channel() -> None:
    peer = await MemoryPeer.open(solo_broker())
    await open_channel(peer)
    await peer.send(1, commands.Basic.Publish(routing_key="q"), *content(b"x", user_id="admin"))
    (closed,) = [f for _, f in peer.take()]
    assert closed.name == "Channel.Close" and closed.reply_code == 406
    assert "user_id property set to 'admin'" in closed.reply_text


async def test_a_message_over_the_size_limit_is_refused_before_its_body() -> None:
    peer = await MemoryPeer.open(solo_broker(max_message_size=1024))
    await open_channel(peer)
    header = ContentHeader(0, 4096, commands.Basic.Properties())
    await peer.send(1, commands.Basic.Publish(routing_key="q"), header)
    (closed,) = [f for _, f in peer.take()]
    assert closed.name == "Channel.Close" and closed.reply_code == 406
    assert "larger than configured max size 1024" in closed.reply_text


@pytest.mark.parametrize("output_buffer", [64 * 1024, None])
async def test_one_turn_of_the_loop_hands_a_connection_a_bounded_output(
    output_buffer: int | None,
) -> None:
    """A socket that drains as fast as the broker writes (this transport) never pauses its
    deliveries: a no-ack consumer of a deep queue still takes them a turn of the loop at a
    time, TURN_OUTPUT bytes a turn (``limits.output_buffer`` if less), so whatever else is
    due (other clients, heartbeats, the pair's timers) runs in between (docs/limits.md,
    "Output")."""
    if output_buffer is None:
        peer = await MemoryPeer.open(solo_broker())
        limit = TURN_OUTPUT
    else:
        peer = await MemoryPeer.open(solo_broker(output_buffer=output_buffer))
        limit = output_buffer
    await open_channel(peer)
    await peer.send(1, commands.Queue.Declare(queue="deep"))
    assert peer.methods() == [(1, "Queue.DeclareOk")]
    count = 5000  # about 1.3 MB of deliveries: five turns' worth at least
    publish = b"".join(
        frame.marshal(f, 1)
        for f in (commands.Basic.Publish(routing_key="deep"), *content(b"x" * 200))
    )
    for _ in range(count // 500):
        await peer.send(1, publish * 500)
    await peer.send(1, commands.Queue.Declare(queue="deep", passive=True))
    (declared,) = [f for _, f in peer.take() if f.name == "Queue.DeclareOk"]
    assert declared.message_count == count
    one_delivery = len(frame.marshal(commands.Basic.Deliver("ctag", 1, False, "", "deep"), 1))
    one_delivery += len(publish)  # its header and body frames, and more
    connection, transport = peer.connection, peer.transport

    def handed_out() -> int:
        return len(transport.data) + connection.out_bytes

    before = handed_out()
    connection.data_received(
        frame.marshal(commands.Basic.Consume(queue="deep", no_ack=True, consumer_tag="c"), 1)
    )
    turns = [handed_out() - before]
    for _ in range(400):  # bounded: twenty turns at most are needed
        before = handed_out()
        await asyncio.sleep(0)
        turns.append(handed_out() - before)
        if not connection.vhost.queues["deep"].message_count and not turns[-1]:
            break
    assert max(turns) <= limit + one_delivery, turns
    delivered = [f for _, f in peer.take() if getattr(f, "name", "") == "Basic.Deliver"]
    assert len(delivered) == count
    assert sum(1 for size in turns if size) >= count * 200 // limit


async def test_a_close_holding_many_unacked_puts_them_back_a_slice_a_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A channel closed holding more unacked deliveries than REQUEUE_SLICE puts them back
    in their queue a slice a turn of the loop, not in the close's callback (docs/limits.md,
    "Big drops"); at the end every one is ready again, none lost, none twice."""
    monkeypatch.setattr(channel_module, "REQUEUE_SLICE", 100)
    peer = await MemoryPeer.open(solo_broker())
    await open_channel(peer)
    await peer.send(1, commands.Queue.Declare(queue="held"))
    count = 1000
    publish = b"".join(
        frame.marshal(f, 1)
        for f in (commands.Basic.Publish(routing_key="held"), *content(b"x" * 20))
    )
    await peer.send(1, publish * count)
    await peer.send(1, commands.Basic.Consume(queue="held", consumer_tag="c"))
    queue = peer.connection.vhost.queues["held"]
    assert len(queue.outstanding) == count and queue.message_count == 0
    peer.connection.data_received(frame.marshal(commands.Channel.Close(200, "bye", 0, 0), 1))
    back = [queue.message_count]  # after the close's own callback
    for _ in range(100):  # bounded: ten turns are needed
        await asyncio.sleep(0)
        back.append(queue.message_count)
        if back[-1] == count:
            break
    assert back[0] == 100 and back[-1] == count, back
    assert len(back) >= count // 100  # a slice a turn
    assert not queue.outstanding
    ids = [message.msg_id for message, _ in queue.messages()]
    assert len(set(ids)) == count


class SteppingLoop:
    """The test's loop with a clock that moves 1 ms at each read: every read of it finds
    the connection's frame budget spent."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.now = loop.time()

    def time(self) -> float:
        self.now += 0.001
        return self.now

    def __getattr__(self, name: str) -> object:
        return getattr(self._loop, name)


async def test_a_read_that_outlasts_the_frame_budget_goes_on_over_turns_in_order() -> None:
    """One read's frames past FRAME_BUDGET wait in the backlog, the socket unread; each
    later turn handles some and may leave a backlog again; once all are handled, in order,
    the socket is read again."""
    peer = await MemoryPeer.open(solo_broker())
    await open_channel(peer)
    await peer.send(1, commands.Queue.Declare(queue="q"))
    peer.take()
    connection = peer.connection
    connection.loop = SteppingLoop(connection.loop)  # type: ignore[assignment]
    count = 1000
    data = b"".join(
        frame.marshal(f, 1)
        for n in range(count)
        for f in (commands.Basic.Publish(routing_key="q"), *content(b"%04d" % n))
    )
    connection.data_received(data)
    queue = connection.vhost.queues["q"]
    turns = [queue.message_count]
    assert connection.backlog is not None and connection.read_holds  # not read meanwhile
    for _ in range(100):  # bounded: about 20 turns are needed
        await asyncio.sleep(0)
        turns.append(queue.message_count)
        if connection.backlog is None:
            break
    assert connection.backlog is None and not connection.read_holds, turns
    assert 0 < turns[0] < turns[1] < turns[2] < count == turns[-1], turns
    assert [message.body for message, _ in queue.messages()] == [b"%04d" % n for n in range(count)]
