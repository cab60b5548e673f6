"""A server that hangs can be asked where: SIGUSR1 writes every thread's stack to its stderr
(docs/operations.md, "A server that hangs"), and it goes on serving, then stops cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import aio_pika

from tests.support import wait_until


def test_sigusr1_writes_every_threads_stack_and_the_server_serves_on(make_server: Any) -> None:
    server = make_server()
    server.start()
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGUSR1)
    stacks = wait_until(
        lambda: "Current thread" in server.log() and server.log(), 20, what="the stacks"
    )
    # The loop's thread and the store's writer, by the file each waits in.
    assert 'File "' in stacks and "amqha/store.py" in stacks, stacks[-3000:]
    assert server.alive

    async def round_trip() -> bytes:
        connection = await aio_pika.connect(server.url, timeout=10)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(b"after"), queue.name)
            message = await queue.get(timeout=10)
            return message.body

    assert asyncio.run(round_trip()) == b"after"
    assert server.terminate() == 0
