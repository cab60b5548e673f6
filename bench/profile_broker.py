"""Profile the amqha server with pyinstrument under the raw client's publish or consume load.

    python -m bench.profile_broker publish|confirms|consume|aio-pika [--messages N] [--rounds R]

The server runs as ``python -m pyinstrument -r text -o FILE -m amqha start ...`` on a
free loopback port; after the load it gets SIGTERM, shuts down cleanly and pyinstrument
writes its text report, which is printed. Only the load's own time is of interest, so
the report shows the share of time under each call.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika
import yaml

from bench import rawclient
from bench.broker_bench import BODY, HOST, queue_name, run_async, wait_for_count
from tests.support import ROOT, USERS, free_port, wait_for_port


async def aio_pika_load(port: int, messages: int, rounds: int) -> None:
    """aio-pika publishing with confirms (100 in flight), then consuming acking each."""
    connection = await aio_pika.connect(f"amqp://guest:guest@{HOST}:{port}/")
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=1000)
        queue = await channel.declare_queue(queue_name("profile"))
        for _ in range(rounds):
            pending: set[asyncio.Future[Any]] = set()
            for _ in range(messages):
                if len(pending) >= 100:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                message = aio_pika.Message(BODY)
                publish = channel.default_exchange.publish(message, routing_key=queue.name)
                pending.add(asyncio.ensure_future(publish))
            await asyncio.gather(*pending)
            received = 0
            async with queue.iterator() as messages_in:
                async for message in messages_in:
                    await message.ack()
                    received += 1
                    if received == messages:
                        break


async def load(kind: str, port: int, messages: int, rounds: int) -> None:
    if kind == "aio-pika":
        await aio_pika_load(port, messages, rounds)
        return
    publisher = await rawclient.connect(HOST, port)
    await publisher.open_channel(confirm=kind != "publish")
    queue = queue_name("profile")
    await publisher.declare_queue(queue)
    frames = rawclient.publish_frames(1, queue, BODY)
    for _ in range(rounds):
        if kind == "publish":
            await publisher.publish(frames, messages)
            await wait_for_count(publisher, queue, messages)
            await publisher.purge_queue(queue)
        elif kind == "confirms":
            await publisher.publish_confirmed(frames, messages, window=100)
            await publisher.purge_queue(queue)
        else:
            await publisher.publish_confirmed(frames, messages, window=1000)
            for ack in ("each", "multiple"):
                consumer = await rawclient.connect(HOST, port)
                await consumer.open_channel()
                await consumer.consume(queue, messages // 2, ack=ack)
                await consumer.close()
    await publisher.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=("publish", "confirms", "consume", "aio-pika"))
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="amqha-profile-") as workdir:
        port = free_port()
        config = Path(workdir) / "profile.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "server": {
                        "name": "profile",
                        "listen": f"{HOST}:{port}",
                        "data_dir": str(Path(workdir) / "data"),
                    },
                    "users": USERS,
                }
            )
        )
        report = args.out or Path(workdir) / "profile.txt"
        command = [
            sys.executable,
            "-m",
            "pyinstrument",
            "-r",
            "text",
            "-o",
            str(report),
            "-m",
            "amqha",
            "start",
            "--config",
            str(config),
            "--log-level",
            "WARNING",
        ]
        server = subprocess.Popen(command, cwd=ROOT)
        try:
            wait_for_port(port, timeout=30)
            started = time.perf_counter()
            run_async(load(args.kind, port, args.messages, args.rounds))
            print(f"load took {time.perf_counter() - started:.2f} s", file=sys.stderr)
        finally:
            if server.poll() is None:
                os.kill(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(server.pid, signal.SIGKILL)
                server.wait(timeout=10)
        print(report.read_text() if report.exists() else "no report written")


if __name__ == "__main__":
    main()
