"""What the metrics endpoint costs a broker with many queues.

    python -m bench.metrics_bench [--queues 10000] [--requests 100]

One broker with ``metrics.listen`` and that many queues, then:

- ``scrape_s``: one full scrape (request to last byte) that needs a new snapshot,
  the median of five taken 1.2 s apart (a page serves for a second);
- ``dropped_cpu_s``: the broker's CPU (process, all threads) for that many requests
  sent and dropped unread at once, less its idle CPU over the same 3 s;
- ``handshake_worst_ms``: the same again, and the slowest of AMQP handshakes made one
  after another meanwhile.

Prints one JSON document; nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from pamqp import commands

from tests.integration.protocol_support import RawClient
from tests.support import ServerProcess, free_port

SETTLE = 3.0


def cpu_seconds(server: ServerProcess) -> float:
    assert server.process is not None
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def declare(port: int, count: int) -> None:
    with RawClient(port, timeout=30) as client:
        client.handshake()
        client.open_channel(1)
        for index in range(count):
            client.call(1, commands.Queue.Declare(queue=f"q{index}"), commands.Queue.DeclareOk)


def scrape_seconds(metrics_port: int) -> float:
    began = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=60) as page:
        page.read()
    return time.monotonic() - began


def send_and_drop(metrics_port: int, requests: int) -> None:
    sockets = []
    for _ in range(requests):
        sock = socket.create_connection(("127.0.0.1", metrics_port), timeout=10)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sockets.append(sock)
    for sock in sockets:
        sock.close()


def handshakes(port: int, until: float, times: list[float]) -> None:
    while time.monotonic() < until:
        began = time.monotonic()
        with RawClient(port, timeout=30) as client:
            client.handshake()
        times.append(time.monotonic() - began)


def run(queues: int, requests: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workdir:
        metrics_port = free_port()
        server = ServerProcess(
            Path(workdir), "metered", metrics={"listen": f"127.0.0.1:{metrics_port}"}
        )
        server.start()
        try:
            declare(server.port, queues)
            scrape_seconds(metrics_port)
            scrapes = []
            for _ in range(5):
                time.sleep(1.2)
                scrapes.append(scrape_seconds(metrics_port))
            time.sleep(1.2)
            idle_before = cpu_seconds(server)
            time.sleep(SETTLE)
            idle = cpu_seconds(server) - idle_before
            before = cpu_seconds(server)
            send_and_drop(metrics_port, requests)
            time.sleep(SETTLE)
            used = cpu_seconds(server) - before
            # Again, with handshakes meanwhile (their own CPU kept out of the figure above).
            time.sleep(1.2)
            times: list[float] = []
            watcher = threading.Thread(
                target=handshakes, args=(server.port, time.monotonic() + SETTLE, times)
            )
            watcher.start()
            send_and_drop(metrics_port, requests)
            watcher.join()
            return {
                "queues": queues,
                "requests": requests,
                "scrape_s": round(statistics.median(scrapes), 3),
                "scrapes_s": [round(s, 3) for s in scrapes],
                "dropped_cpu_s": round(max(0.0, used - idle), 2),
                "idle_cpu_s": round(idle, 2),
                "handshake_worst_ms": round(max(times) * 1000, 1),
            }
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=100)
    options = parser.parse_args()
    print(json.dumps(run(options.queues, options.requests), indent=2))


if __name__ == "__main__":
    main()
