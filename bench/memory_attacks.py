"""RSS of a broker under each memory attack, beside the configured limit.

    python -m bench.memory_attacks [--watermark 64MiB]

Each attack runs against a fresh broker (``memory_high_watermark`` as given, the
other limits at their defaults) and reports the process's RSS before and at its
peak (from /proc), and how far the attack got before the broker pushed back:

- ``one_byte``: one-byte messages until Connection.Blocked,
- ``big_headers``: empty-bodied messages with 60 KB headers until Connection.Blocked,
- ``unread_returns``: mandatory unroutable 10 KB publishes from a client that never
  reads, until the broker stops reading it,
- ``unread_consumer``: 40 MB queued, then a no-ack consumer that never reads,
- ``unauthenticated``: 900 sockets each sending half of a 128 KiB frame before Tune,
- ``queues``: 20,000 queues with a message TTL, then the broker's CPU while idle.

Prints one JSON document; nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pamqp import body, commands, frame, header

from config.reading import SIZE_UNITS
from tests.integration.protocol_support import RawClient
from tests.support import ServerProcess

MiB = 1024 * 1024


def rss(server: ServerProcess) -> int:
    assert server.process is not None
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(server: ServerProcess) -> float:
    assert server.process is not None
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def publishes(routing_key: str, payload: bytes, count: int, **options: Any) -> bytes:
    properties = options.pop("properties", commands.Basic.Properties())
    values: list[Any] = [
        commands.Basic.Publish(exchange="", routing_key=routing_key, **options),
        header.ContentHeader(0, len(payload), properties),
    ]
    if payload:
        values.append(body.ContentBody(payload))
    return b"".join(frame.marshal(value, 1) for value in values) * count


def declare(port: int, queue: str, **arguments: Any) -> None:
    with RawClient(port) as client:
        client.handshake()
        client.open_channel(1)
        client.call(
            1, commands.Queue.Declare(queue=queue, arguments=arguments), commands.Queue.DeclareOk
        )


def push_until_refused(client: RawClient, batch: bytes, most: int, seconds: float = 60) -> int:
    """Send until the broker stops reading (a send blocks 2 s) or ``most`` bytes went out."""
    client.sock.settimeout(2.0)
    sent, deadline = 0, time.monotonic() + seconds
    while sent < most and time.monotonic() < deadline:
        try:
            client.sock.sendall(batch)
        except (TimeoutError, OSError):
            break
        sent += len(batch)
    return sent


def one_byte(server: ServerProcess) -> dict[str, Any]:
    declare(server.port, "tiny")
    with RawClient(server.port) as client:
        client.handshake(capabilities={"connection.blocked": True})
        client.open_channel(1)
        batch = publishes("tiny", b"x", 2000)
        sent = push_until_refused(client, batch, len(batch) * 1500)
        return {"messages_sent": sent // (len(batch) // 2000)}


def big_headers(server: ServerProcess) -> dict[str, Any]:
    declare(server.port, "headers")
    properties = commands.Basic.Properties(headers={"h": "v" * 60_000})
    with RawClient(server.port) as client:
        client.handshake(capabilities={"connection.blocked": True})
        client.open_channel(1)
        batch = publishes("headers", b"", 10, properties=properties)
        sent = push_until_refused(client, batch, len(batch) * 1000)
        return {"messages_sent": sent // (len(batch) // 10)}


def unread_returns(server: ServerProcess) -> dict[str, Any]:
    with RawClient(server.port) as client:
        client.handshake()
        client.open_channel(1)
        batch = publishes("nowhere", b"r" * 10_000, 100, mandatory=True)
        return {"bytes_sent": push_until_refused(client, batch, 500 * MiB)}


def unread_consumer(server: ServerProcess) -> dict[str, Any]:
    declare(server.port, "backlog")
    with RawClient(server.port) as client:
        client.handshake()
        client.open_channel(1)
        client.send_raw(publishes("backlog", b"m" * 1000, 40_000))
        client.call(1, commands.Basic.Qos(), commands.Basic.QosOk, timeout=60)
    with RawClient(server.port) as consumer:
        consumer.handshake()
        consumer.open_channel(1)
        consumer.send(1, commands.Basic.Consume(queue="backlog", no_ack=True))
        time.sleep(2)
        with RawClient(server.port) as probe:
            probe.handshake()
            probe.open_channel(1)
            left = probe.call(
                1, commands.Queue.Declare(queue="backlog", passive=True), commands.Queue.DeclareOk
            ).message_count
        return {"queued": 40_000, "still_queued_while_consumer_stalls": left}


def unauthenticated(server: ServerProcess) -> dict[str, Any]:
    sockets = []
    refused = 0
    try:
        for _ in range(900):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sockets.append(sock)
            sock.sendall(
                b"AMQP\x00\x00\x09\x01" + struct.pack(">BHI", 1, 0, 131064) + b"\0" * 60_000
            )
        time.sleep(1)
        for sock in sockets:
            sock.settimeout(0.2)
            try:
                data = sock.recv(65536)
                refused += b"exceeds frame_max" in data or not data
            except OSError:
                pass
    finally:
        for sock in sockets:
            sock.close()
    return {"sockets": len(sockets), "refused_by_the_broker": refused}


def queues(server: ServerProcess) -> dict[str, Any]:
    with RawClient(server.port) as client:
        client.handshake()
        client.open_channel(1)
        for start in range(0, 20_000, 500):
            client.send(
                1,
                *(
                    commands.Queue.Declare(
                        queue=f"idle-{n}", nowait=True, arguments={"x-message-ttl": 60_000}
                    )
                    for n in range(start, start + 500)
                ),
            )
        client.call(
            1, commands.Queue.Declare(queue="idle-0", passive=True), commands.Queue.DeclareOk, 60
        )
    before = cpu_seconds(server)
    time.sleep(3)
    return {
        "queues": 20_000,
        "idle_cpu_percent": round((cpu_seconds(server) - before) / 3 * 100, 1),
    }


ATTACKS: dict[str, Callable[[ServerProcess], dict[str, Any]]] = {
    "one_byte": one_byte,
    "big_headers": big_headers,
    "unread_returns": unread_returns,
    "unread_consumer": unread_consumer,
    "unauthenticated": unauthenticated,
    "queues": queues,
}


def peak_rss_during(
    server: ServerProcess, attack: Callable[[ServerProcess], dict[str, Any]]
) -> tuple[dict[str, Any], int]:
    """Run ``attack``, sampling the broker's RSS every 50 ms: (its figures, the peak RSS)."""
    peak = [rss(server)]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], rss(server))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        figures = attack(server)
    finally:
        stop.set()
        sampler.join()
    return figures, max(peak[0], rss(server))


def run(watermark: int, only: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {"memory_high_watermark": watermark}
    for name in only:
        with tempfile.TemporaryDirectory(prefix="amqha-mem-") as tmp:
            server = ServerProcess(
                Path(tmp), name, limits={"memory_high_watermark": watermark}
            ).start()
            try:
                before = rss(server)
                figures, peak = peak_rss_during(server, ATTACKS[name])
                results[name] = {
                    **figures,
                    "rss_before_mib": round(before / MiB, 1),
                    "rss_peak_mib": round(peak / MiB, 1),
                    "rss_growth_mib": round((peak - before) / MiB, 1),
                    "growth_over_watermark": round((peak - before) / watermark, 2),
                }
            finally:
                server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--watermark", default="64MiB")
    parser.add_argument("--only", default=",".join(ATTACKS))
    options = parser.parse_args()
    text = options.watermark.lower()
    number = text.rstrip("kmgib")
    watermark = int(float(number) * SIZE_UNITS[text[len(number) :]])
    print(json.dumps(run(watermark, options.only.split(",")), indent=2))


if __name__ == "__main__":
    main()
