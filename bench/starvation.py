"""The worst single-client CPU load we know against one broker, and the loop lag it causes.

    python -m bench.starvation [--seconds 10] [--kind all]   # starts its own broker
    from bench.starvation import run_load; run_load("127.0.0.1", 5672, 10.0, pid=None)

One attacker connection publishes, as fast as the broker reads, messages chosen to
cost the broker the most CPU each: content headers of ~60 KB made of thousands of
tiny fields (``table``), routed through amq.match so the table is matched against a
binding (``match``), tables nested as deep as allowed (``nested``), and a stream of
many small frames (``frames``: empty-bodied publishes of a few bytes each). A second
connection meanwhile measures the broker's responsiveness: round trips of a
Queue.Declare (passive) request, whose p50/p99/max is the loop lag other clients and
timers see. With ``pid`` the broker's CPU per attacking message is given too.

Prints one JSON document. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pamqp import commands, frame, header

from tests.integration.protocol_support import RawClient
from tests.support import ServerProcess

KINDS = ("table", "match", "nested", "frames")
QUEUE = "bench.starvation"


def _headers(kind: str) -> dict[str, Any]:
    if kind in ("table", "match"):
        # 3-4 bytes per field on the wire: the most fields (the most work) per byte.
        table: dict[str, Any] = {f"{n:x}": None for n in range(9_000)}
        table["x-kind"] = "starve"
        return table
    if kind == "nested":
        nested: dict[str, Any] = {"leaf": [1, 2, 3]}
        for _ in range(28):  # with the two outer levels, just under MAX_TABLE_DEPTH
            nested = {"n": nested, "a": [1, "two", {"three": 3}]}
        return {"x-kind": "starve", "deep": {"n": nested}}
    return {}


def attack_batch(kind: str) -> tuple[bytes, int]:
    """Pre-encoded publishes for one kind of load: (bytes, messages in them)."""
    exchange = "amq.match" if kind == "match" else ""
    properties = commands.Basic.Properties(headers=_headers(kind) or None)
    count = 200 if kind == "frames" else 4
    one = b"".join(
        frame.marshal(value, 1)
        for value in (
            commands.Basic.Publish(exchange=exchange, routing_key=QUEUE),
            header.ContentHeader(0, 0, properties),
        )
    )
    return one * count, count


def _prepare(port: int) -> None:
    with RawClient(port) as client:
        client.handshake()
        client.open_channel(1)
        client.call(
            1,
            commands.Queue.Declare(queue=QUEUE, arguments={"x-max-length": 100}),
            commands.Queue.DeclareOk,
        )
        client.call(
            1,
            commands.Queue.Bind(
                queue=QUEUE, exchange="amq.match", arguments={"x-match": "any", "x-kind": "starve"}
            ),
            commands.Queue.BindOk,
        )


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks


def run_load(
    host: str, port: int, seconds: float, kind: str = "table", pid: int | None = None
) -> dict[str, Any]:
    """Run one kind of attack for ``seconds`` against ``host:port``; lag and CPU figures."""
    assert host in ("127.0.0.1", "localhost", "::1"), "loopback only"
    _prepare(port)
    batch, per_batch = attack_batch(kind)
    stop = threading.Event()
    sent = [0]

    def attacker() -> None:
        with RawClient(port) as client:
            client.handshake()
            client.open_channel(1)
            client.sock.settimeout(0.5)
            while not stop.is_set():
                try:
                    client.sock.sendall(batch)
                except TimeoutError:
                    continue
                except OSError:
                    return  # refused: the figures say how far it got
                sent[0] += per_batch

    cpu_before = _cpu_seconds(pid) if pid else 0.0
    thread = threading.Thread(target=attacker, daemon=True)
    lags: list[float] = []
    with RawClient(port, timeout=30) as probe:
        probe.handshake()
        probe.open_channel(1)
        thread.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            probe.call(
                1, commands.Queue.Declare(queue=QUEUE, passive=True), commands.Queue.DeclareOk, 30
            )
            lags.append((time.perf_counter() - started) * 1000)
            time.sleep(0.01)
        stop.set()
        thread.join(timeout=30)
        # Once this answers, the broker has handled everything the attacker sent.
        probe.call(
            1, commands.Queue.Declare(queue=QUEUE, passive=True), commands.Queue.DeclareOk, 60
        )
    cpu = (_cpu_seconds(pid) - cpu_before) if pid else None
    lags.sort()
    return {
        "kind": kind,
        "seconds": seconds,
        "messages": sent[0],
        "message_bytes": len(batch) // per_batch,
        "broker_cpu_ms_per_msg": round(cpu * 1000 / sent[0], 3) if cpu and sent[0] else None,
        "probe_roundtrips": len(lags),
        "lag_p50_ms": round(statistics.median(lags), 2) if lags else None,
        "lag_p99_ms": round(lags[int(len(lags) * 0.99) - 1], 2) if len(lags) >= 100 else None,
        "lag_max_ms": round(lags[-1], 2) if lags else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--kind", choices=(*KINDS, "all"), default="all")
    options = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="amqha-starve-") as tmp:
        server = ServerProcess(Path(tmp), "starve").start()
        try:
            assert server.process is not None
            for kind in KINDS if options.kind == "all" else (options.kind,):
                results.append(
                    run_load("127.0.0.1", server.port, options.seconds, kind, server.process.pid)
                )
        finally:
            server.stop()
    print(json.dumps({"starvation": results}, indent=2))


if __name__ == "__main__":
    main()
