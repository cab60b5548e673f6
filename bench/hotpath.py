"""The broker's hot path in one process, without sockets: CPU microseconds per message.

    python -m bench.hotpath [--messages N] [--repeat R]

A ``Broker`` and one ``Connection`` run on an event loop; a null transport swallows
what the broker writes. Pre-encoded client bytes are fed to ``data_received`` in 64 KiB
reads cut at arbitrary points (as a socket delivers them), and the loop turns once
after each read so the broker's deferred flushes run as they would. Measured with the
process CPU clock, so the figures barely move with other load on the machine: this is
the bench for before/after figures of an optimisation. The best of ``repeat`` runs is
kept for each of:

- publish: Basic.Publish + header + body, no confirms,
- publish_confirms: the same on a channel in confirm mode,
- consume_ack_each: prefetch 1000, the client acking every delivery (100 acks per read),
- consume_ack_multiple: the same, acking every 100th with multiple=true.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from pamqp import commands, frame

from amqha.connection import OPEN, Connection
from amqha.server import Broker, tune_gc
from bench.broker_bench import new_loop
from bench.rawclient import PROTOCOL_HEADER, ack_frame, publish_frames
from config import ServerConfig, User

READ_SIZE = 65536
BODY = b"x" * 100


class NullTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        # A loopback client: guest may log in from loopback only.
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Nothing is ever buffered here."""

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def method(channel: int, value: Any) -> bytes:
    return frame.marshal(value, channel)


def handshake() -> bytes:
    return b"".join(
        (
            PROTOCOL_HEADER,
            method(
                0,
                commands.Connection.StartOk(
                    client_properties={}, mechanism="PLAIN", response="\0guest\0guest"
                ),
            ),
            method(0, commands.Connection.TuneOk(2047, 131072, 0)),
            method(0, commands.Connection.Open()),
        )
    )


async def feed(connection: Connection, data: bytes) -> float:
    """CPU seconds to hand ``data`` to the connection, one socket-sized read at a time."""
    started = time.process_time()
    for at in range(0, len(data), READ_SIZE):
        connection.data_received(data[at : at + READ_SIZE])
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    # A read whose frames outlast the connection's time budget leaves a backlog for later
    # turns of the loop (a slow or profiled run): the figure counts it all.
    for _ in range(1_000_000):
        if connection.backlog is None:
            break
        await asyncio.sleep(0)
    return time.process_time() - started


async def open_connection(broker: Broker) -> tuple[Connection, NullTransport]:
    connection = Connection(broker)
    transport = NullTransport()
    connection.connection_made(transport)
    await feed(connection, handshake())
    # The login is checked off the loop: the frames behind Start-Ok wait for its answer.
    for _ in range(500):
        if connection.state == OPEN:
            break
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError("the hot-path connection did not open")
    return connection, transport


async def one_run(count: int) -> dict[str, float]:
    broker = Broker(ServerConfig(users=(User("guest", "guest"),)))
    connection, _ = await open_connection(broker)
    queue = "hot"
    setup = method(1, commands.Channel.Open()) + method(1, commands.Queue.Declare(queue=queue))
    setup += method(2, commands.Channel.Open()) + method(2, commands.Confirm.Select())
    await feed(connection, setup)
    vhost = broker.vhost("/")
    figures: dict[str, float] = {}

    publishes = publish_frames(1, queue, BODY) * count
    figures["publish"] = await feed(connection, publishes) / count
    assert vhost.queues[queue].message_count == count
    vhost.queues[queue].purge()

    confirmed = publish_frames(2, queue, BODY) * count
    figures["publish_confirms"] = await feed(connection, confirmed) / count
    assert vhost.queues[queue].message_count == count

    for mode, channel in (("each", 3), ("multiple", 4)):
        held = vhost.queues[queue].message_count
        if held < count:
            await feed(connection, publish_frames(1, queue, BODY) * (count - held))
        consume = method(channel, commands.Channel.Open())
        consume += method(channel, commands.Basic.Qos(prefetch_count=1000))
        consume += method(channel, commands.Basic.Consume(queue=queue, consumer_tag=mode))
        await feed(connection, consume)
        if mode == "each":
            acks = [ack_frame(channel, tag, False) for tag in range(1, count + 1)]
        else:
            acks = [ack_frame(channel, tag, True) for tag in range(100, count + 1, 100)]
        per_read = 100 if mode == "each" else 1
        started = time.process_time()
        for at in range(0, len(acks), per_read):
            connection.data_received(b"".join(acks[at : at + per_read]))
            await asyncio.sleep(0)
        figures[f"consume_ack_{mode}"] = (time.process_time() - started) / count
        channel_state = connection.channels[channel]
        assert channel_state.next_delivery_tag > count, channel_state.next_delivery_tag
        await feed(connection, method(channel, commands.Channel.Close(200, "", 0, 0)))
    connection.connection_lost(None)
    return figures


def run(count: int = 200_000, repeat: int = 5) -> dict[str, Any]:
    best: dict[str, float] = {}
    tune_gc()  # as ``amqha start`` does
    with asyncio.Runner(loop_factory=new_loop) as runner:
        for _ in range(repeat):
            for key, value in runner.run(one_run(count)).items():
                best[key] = min(value, best.get(key, value))
    return {
        "messages": count,
        "repeat": repeat,
        "cpu_us_per_msg": {key: round(value * 1e6, 3) for key, value in best.items()},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    print(json.dumps(run(options.messages, options.repeat), indent=2))
