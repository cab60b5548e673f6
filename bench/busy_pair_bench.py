"""A busy ACTIVE is not a dead one: false failovers under the worst single-client load.

    python -m bench.busy_pair_bench [--seconds 60]

The pair runs with the shipped timings (config/primary.yaml: heartbeat 0.2 s, timeout
0.6 s) on free loopback ports. One load client, in its own process, publishes as fast as
its socket takes them messages whose header tables are ~100 KB (many small entries, the
costliest shape to decode) to ``amq.match``, where a headers binding makes routing read
them, and to the default exchange; frames are encoded once and replayed, so the load costs
the client almost nothing and the broker everything. Meanwhile a knocker opens a client
connection to the PASSIVE every 50 ms: the moment the PASSIVE stops hearing the ACTIVE,
that client's vote would fail over. A probe measures the ACTIVE's responsiveness (a
Queue.Declare round trip) every 0.25 s.

Printed (JSON): false failovers (the PASSIVE becoming ACTIVE), peer_lost records on each
side, the knocker's answers, the load's messages and the ACTIVE's CPU, the probe's round
trips (p50 / p99 / max). Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiormq
from pamqp import body as pamqp_body
from pamqp import commands, frame, header

from bench.failover_bench import _quiet_clients, say, shipped
from tests.pairs import Knocker, Pair

HEADER_ENTRIES = 4000  # ~100 KB of table: many small entries


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)] if ordered else float("nan")


# -- the load (runs in a process of its own) --------------------------------------------------


def run_load(port: int, seconds: float, user: str = "guest", password: str = "guest") -> int:
    """Publish heavy-header messages to 127.0.0.1:port for ``seconds``; returns the count."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(frame.marshal(header.ProtocolHeader(), 0))

    def read_method() -> Any:
        data = b""
        while True:
            try:
                used, _, value = frame.unmarshal(data)
                return value
            except Exception:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed during the handshake") from None
                data += chunk

    read_method()  # Start
    sock.sendall(
        frame.marshal(
            commands.Connection.StartOk(
                client_properties={"product": "busy-load"},
                mechanism="PLAIN",
                response=f"\0{user}\0{password}",
            ),
            0,
        )
    )
    read_method()  # Tune
    sock.sendall(frame.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0))
    sock.sendall(frame.marshal(commands.Connection.Open("/"), 0))
    read_method()  # OpenOk
    sock.sendall(frame.marshal(commands.Channel.Open(), 1))
    read_method()
    sock.sendall(
        frame.marshal(commands.Queue.Declare(queue="busy-load", arguments={"x-max-length": 50}), 1)
    )
    read_method()
    sock.sendall(
        frame.marshal(
            commands.Queue.Bind(
                queue="busy-load",
                exchange="amq.match",
                arguments={"x-match": "any", "kind": "load"},
            ),
            1,
        )
    )
    read_method()
    headers = {f"h{i:05d}": f"value-{i:06d}" for i in range(HEADER_ENTRIES)}
    headers["kind"] = "load"
    body = b"x" * 16
    batch = b""
    for exchange, key in (("amq.match", ""), ("", "busy-load")):
        batch += frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=key), 1)
        batch += frame.marshal(
            header.ContentHeader(0, len(body), commands.Basic.Properties(headers=headers)), 1
        )
        batch += frame.marshal(pamqp_body.ContentBody(body), 1)
    sent = 0
    deadline = time.monotonic() + seconds
    sock.settimeout(None)
    while time.monotonic() < deadline:
        sock.sendall(batch)
        sent += 2
    sock.close()
    return sent


# -- the bench ----------------------------------------------------------------------------------


def run(seconds: float = 60.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="amqha-busy-bench-") as workdir, _quiet_clients():
        return asyncio.run(_run(seconds, Path(workdir)))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(seconds: float, workdir: Path) -> dict[str, Any]:
    primary = shipped("primary")
    timings = {key: primary["failover"][key] for key in ("heartbeat", "timeout")}
    pair = Pair(
        workdir,
        heartbeat=timings["heartbeat"],
        timeout=timings["timeout"],
        proxied=False,
        users=primary["users"],
        limits=primary.get("limits", {}),
    )
    probes: list[float] = []
    try:
        pair.start()
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=20)
        active = pair.primary
        assert active.process is not None
        cpu_before = _cpu_seconds(active.process.pid)
        say(f"load for {seconds:.0f} s against the ACTIVE, a client knocking at the PASSIVE")
        load = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.busy_pair_bench",
                "--load",
                str(active.port),
                str(seconds),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        probe = await aiormq.connect(active.url)
        channel = await probe.channel()
        started = time.monotonic()
        probe_lost = None
        with Knocker(pair.backup, interval=0.05, limit=seconds + 30) as knocker:
            while load.poll() is None and time.monotonic() - started < seconds + 30:
                before = time.perf_counter()
                try:
                    await asyncio.wait_for(
                        channel.queue_declare("busy-probe", auto_delete=True), 30
                    )
                except (aiormq.exceptions.AMQPError, ConnectionError, TimeoutError) as error:
                    # A failover closes the probe (NOT_ACTIVE): that is the figure, not a crash.
                    probe_lost = f"{type(error).__name__}: {error}"
                    break
                probes.append(time.perf_counter() - before)
                await asyncio.sleep(0.25)
            load.wait(timeout=seconds + 30)
        out, _ = load.communicate(timeout=30)
        load_failed = load.returncode != 0
        cpu = _cpu_seconds(active.process.pid) - cpu_before
        with contextlib.suppress(Exception):
            await probe.close()
        backup_events = pair.events(pair.backup)
        primary_events = pair.events(pair.primary)
    finally:
        pair.stop()
    sent = int(out.strip()) if out.strip().isdigit() else 0
    answers = knocker.answers
    return {
        "seconds": seconds,
        "heartbeat_s": timings["heartbeat"],
        "timeout_s": timings["timeout"],
        "header_entries": HEADER_ENTRIES,
        "load_messages": sent,
        "load_cut_short": load_failed,  # the ACTIVE closed it: it stepped down
        "probe_closed": probe_lost,
        "active_cpu_s": round(cpu, 2),
        "active_cpu_per_message_ms": round(1000 * cpu / sent, 3) if sent else None,
        "false_failovers": sum(
            1 for e in backup_events if e["event"] == "transition" and e["to"] == "ACTIVE"
        ),
        "peer_lost_on_passive": sum(1 for e in backup_events if e["event"] == "peer_lost"),
        "peer_lost_on_active": sum(1 for e in primary_events if e["event"] == "peer_lost"),
        "knocks": len(answers),
        "knocks_let_in": answers.count("open"),
        "probe_rtt_p50_ms": round(1000 * percentile(probes, 0.5), 2),
        "probe_rtt_p99_ms": round(1000 * percentile(probes, 0.99), 2),
        "probe_rtt_max_ms": round(1000 * max(probes), 2) if probes else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--load", nargs=2, metavar=("PORT", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        print(run_load(int(args.load[0]), float(args.load[1])))
        return
    print(json.dumps(run(args.seconds), indent=2))


if __name__ == "__main__":
    main()
