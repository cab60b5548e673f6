"""A busy ACTIVE is not a dead one: false failovers under the worst single-client load.

    python -m bench.busy_pair_bench [--seconds 60]

The pair runs with the shipped timings (config/primary.yaml: heartbeat 0.2 s, timeout
0.6 s) on free loopback ports. ``bench.starvation``'s worst single-client load (by
default ``match``: header tables of thousands of tiny fields through ``amq.match``) runs
against the ACTIVE, and measures its loop lag, while a knocker opens a client connection
to the PASSIVE every 50 ms: the moment the PASSIVE stops hearing the ACTIVE, that client's
vote would fail over.

Printed (JSON): false failovers (the PASSIVE becoming ACTIVE), peer_lost records on each
side, the knocker's answers, and the load's own figures (messages, the ACTIVE's CPU per
message, loop lag). Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.failover_bench import _quiet_clients, say, shipped_pair
from bench.starvation import KINDS, run_load
from tests.pairs import Knocker


def run(seconds: float = 60.0, kind: str = "match") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="amqha-busy-bench-") as workdir, _quiet_clients():
        return asyncio.run(_run(seconds, kind, Path(workdir)))


async def _run(seconds: float, kind: str, workdir: Path) -> dict[str, Any]:
    pair, timings = shipped_pair(workdir)
    try:
        pair.start()
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=20)
        active = pair.primary
        assert active.process is not None
        say(f"{kind} load for {seconds:.0f} s against the ACTIVE, a client knocking at the PASSIVE")
        with Knocker(pair.backup, interval=0.05, limit=seconds + 60) as knocker:
            try:
                load = await asyncio.to_thread(
                    run_load, "127.0.0.1", active.port, seconds, kind, active.process.pid
                )
            except (OSError, ConnectionError, AssertionError) as error:
                # A failover closes the load's connections (NOT_ACTIVE): that is the figure.
                load = {"kind": kind, "cut_short": f"{type(error).__name__}: {error}"}
        backup_events = pair.events(pair.backup)
        primary_events = pair.events(pair.primary)
    finally:
        pair.stop()
    answers = knocker.answers
    return {
        "seconds": seconds,
        "heartbeat_s": timings["heartbeat"],
        "timeout_s": timings["timeout"],
        "false_failovers": sum(
            1 for e in backup_events if e["event"] == "transition" and e["to"] == "ACTIVE"
        ),
        "peer_lost_on_passive": sum(1 for e in backup_events if e["event"] == "peer_lost"),
        "peer_lost_on_active": sum(1 for e in primary_events if e["event"] == "peer_lost"),
        "knocks": len(answers),
        "knocks_let_in": answers.count("open"),
        "load": load,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--kind", choices=KINDS, default="match")
    args = parser.parse_args()
    print(json.dumps(run(args.seconds, args.kind), indent=2))


if __name__ == "__main__":
    main()
