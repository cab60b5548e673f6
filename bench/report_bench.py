"""Failover report benchmark: the Spark job (local[2]) beside the plain-Python reference.

    python -m bench.report_bench [--sizes 100000,1000000]

Owns: a fast generator of synthetic two-server event logs (a realistic mix: clients
redirected and refused by the PASSIVE server in bulk, crashes with client-vote takeovers
and restarts, console failbacks, peer-link cuts with dual active, a little garbage), and
timing both implementations on the same files in one run. ``run(sizes)`` returns events/s,
seconds, the spark/reference ratio, growth from the first size to the last, and whether the
two agreed. Figures only: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_SIZES = (1_000_000, 10_000_000)
QUICK_SIZES = (100_000, 1_000_000)
T0 = 1_700_000_000.0
CYCLE_REDIRECTS = 5_000  # redirects and refusals between two incidents
TIMEOUT = 3.0
LISTEN = {"primary": "10.0.0.1:5672", "backup": "10.0.0.2:5672"}
ROLE = {"primary": "primary", "backup": "backup"}
START_STATE = {"primary": "PRIMARY", "backup": "BACKUP"}


class _Log:
    """One server's events.jsonl, written with plain string formatting."""

    def __init__(self, folder: Path, node: str) -> None:
        (folder / node).mkdir(parents=True)
        self.path = folder / node / "events.jsonl"
        self.stream = open(self.path, "w", encoding="utf-8", buffering=1 << 20)  # noqa: SIM115
        self.node = node
        self.head = '{"v":1,"ts":%.6f,"node":"' + node + '","role":"' + ROLE[node] + '",'
        self.count = 0

    def write(self, ts: float, epoch: int, state: str, event: str, extra: str = "") -> None:
        self.stream.write(
            self.head % ts + f'"epoch":{epoch},"state":"{state}","event":"{event}"{extra}}}\n'
        )
        self.count += 1

    def transition(self, ts: float, epoch: int, old: str, new: str, trigger: str) -> None:
        extra = f',"from":"{old}","to":"{new}","trigger":"{trigger}","reason":"bench"'
        self.write(ts, epoch, new, "transition", extra)

    def heard(
        self, ts: float, epoch: int, state: str, event: str, peer: str, peer_state: str, sent: float
    ) -> None:
        extra = f',"peer":"{peer}","peer_state":"{peer_state}","last_seen":{sent:.6f}'
        self.write(ts, epoch, state, event, extra)

    def bulk(self, ts: float, epoch: int, count: int, to: str) -> float:
        """``count`` clients turned away by this PASSIVE server, 2 ms apart; one in 50 is
        refused instead of redirected. Returns the time after the last."""
        redirect = (
            self.head
            + '"epoch":%d,"state":"PASSIVE","event":"redirect","client":"10.1.%d.%d:%d",'
            + f'"to":"{to}"}}\n'
        )
        refuse = (
            self.head
            + '"epoch":%d,"state":"PASSIVE","event":"refuse","client":"10.1.%d.%d:%d",'
            + '"to":null,"reason":"no ACTIVE peer in sight"}\n'
        )
        write = self.stream.write
        for i in range(count):
            ts += 0.002
            write(
                (refuse if i % 50 == 49 else redirect)
                % (ts, epoch, i % 200, i % 250, 40000 + i % 20000)
            )
        self.count += count
        return ts

    def close(self) -> None:
        self.stream.close()


def generate(folder: Path, events: int) -> list[str]:
    """Write about ``events`` records for a primary/backup pair; returns the two files."""
    logs = {node: _Log(folder, node) for node in ("primary", "backup")}
    primary, backup = logs["primary"], logs["backup"]
    t, epoch = T0, 1
    primary.write(t, 0, "PRIMARY", "started")
    backup.write(t + 0.2, 0, "BACKUP", "started")
    backup.heard(t + 0.5, 0, "BACKUP", "peer_up", "primary", "PRIMARY", t + 0.4)
    primary.heard(t + 0.6, 0, "PRIMARY", "peer_up", "backup", "BACKUP", t + 0.5)
    primary.transition(t + 0.61, epoch, "PRIMARY", "ACTIVE", "PEER_BACKUP")
    backup.transition(t + 0.7, epoch, "BACKUP", "PASSIVE", "PEER_ACTIVE")
    active, passive = primary, backup
    t += 1.0
    cycle = 0
    while primary.count + backup.count < events:
        t = passive.bulk(t, epoch, CYCLE_REDIRECTS, LISTEN[active.node]) + 1.0
        kind = cycle % 4
        if kind == 1 and active is backup:
            # Console failback: the backup hands over, the primary takes ACTIVE.
            backup.write(
                t,
                epoch,
                "ACTIVE",
                "console",
                ',"user":"admin","command":"recover","result":"handed over to the primary"',
            )
            backup.transition(t + 0.01, epoch, "ACTIVE", "PASSIVE", "MANUAL_RECOVER")
            epoch += 1
            primary.transition(t + 0.05, epoch, "PASSIVE", "ACTIVE", "HANDOVER")
            active, passive = primary, backup
            t += 1.0
        elif kind == 3:
            # Peer link cut: both lose each other, a client vote makes the passive ACTIVE too;
            # when the link heals the older epoch steps down.
            active.heard(t + TIMEOUT, epoch, "ACTIVE", "peer_lost", passive.node, "PASSIVE", t)
            passive.heard(
                t + TIMEOUT + 0.1, epoch, "PASSIVE", "peer_lost", active.node, "ACTIVE", t
            )
            passive.transition(t + TIMEOUT + 2.0, epoch + 1, "PASSIVE", "ACTIVE", "CLIENT_REQUEST")
            heal = t + 20.0
            passive.heard(heal, epoch + 1, "ACTIVE", "peer_up", active.node, "ACTIVE", heal - 0.1)
            active.heard(
                heal + 0.05, epoch, "ACTIVE", "peer_up", passive.node, "ACTIVE", heal - 0.05
            )
            active.write(
                heal + 0.06,
                epoch,
                "ACTIVE",
                "dual_active",
                f',"peer":"{passive.node}","peer_epoch":{epoch + 1},'
                '"reason":"peer ACTIVE with a higher epoch"',
            )
            epoch += 1
            active.transition(heal + 0.07, epoch, "ACTIVE", "PASSIVE", "DUAL_ACTIVE")
            active, passive = passive, active
            t = heal + 1.0
        else:
            # kill -9 of the ACTIVE: the passive notices, a client votes, the dead one
            # restarts and follows.
            dead = active
            passive.heard(t + TIMEOUT, epoch, "PASSIVE", "peer_lost", dead.node, "ACTIVE", t - 0.5)
            epoch += 1
            passive.transition(t + TIMEOUT + 1.5, epoch, "PASSIVE", "ACTIVE", "CLIENT_REQUEST")
            back = t + 15.0
            dead.write(back, epoch - 1, START_STATE[dead.node], "started")
            passive.heard(
                back + 0.3,
                epoch,
                "ACTIVE",
                "peer_up",
                dead.node,
                START_STATE[dead.node],
                back + 0.2,
            )
            dead.heard(
                back + 0.4,
                epoch - 1,
                START_STATE[dead.node],
                "peer_up",
                passive.node,
                "ACTIVE",
                back + 0.3,
            )
            dead.transition(back + 0.41, epoch, START_STATE[dead.node], "PASSIVE", "PEER_ACTIVE")
            active, passive = passive, dead
            t = back + 1.0
        if cycle % 20 == 7:
            passive.stream.write("garbage left by a disk that lied\n")
        cycle += 1
    for log in logs.values():
        log.close()
    return [str(log.path) for log in logs.values()]


def _agree(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_agree(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_agree(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _log(message: str) -> None:
    print(f"report_bench: {message}", file=sys.stderr, flush=True)


def run(sizes: tuple[int, ...] = DEFAULT_SIZES) -> dict:
    from spark import job, reference

    scratch = Path(tempfile.mkdtemp(prefix="amqha-report-bench-"))
    started = time.perf_counter()
    spark = job.build_session("local[2]", str(scratch / "spark.log"))
    startup = time.perf_counter() - started
    results: dict[str, Any] = {
        "spark_master": "local[2]",
        "spark_version": spark.version,
        "cpus": os.cpu_count(),
        "spark_startup_s": round(startup, 2),
        "sizes": {},
    }
    try:
        warm = scratch / "warm-up"
        job.compute(spark, generate(warm, 20_000))  # JIT and codegen, not timed
        shutil.rmtree(warm)
        for size in sizes:
            folder = scratch / str(size)
            clock = time.perf_counter()
            paths = generate(folder, size)
            written = time.perf_counter() - clock
            _log(f"{size} events generated in {written:.1f}s")

            clock = time.perf_counter()
            spark_report = job.compute(spark, paths, progress=_log)
            spark_s = time.perf_counter() - clock
            _log(f"{size} events: spark {spark_s:.1f}s")

            clock = time.perf_counter()
            reference_report = reference.compute(paths)
            reference_s = time.perf_counter() - clock
            _log(f"{size} events: reference {reference_s:.1f}s")

            events = reference_report.summary["events"]
            results["sizes"][str(size)] = {
                "events": events,
                "bytes": sum(os.path.getsize(p) for p in paths),
                "generate_s": round(written, 2),
                "spark_s": round(spark_s, 2),
                "reference_s": round(reference_s, 2),
                "spark_events_per_s": round(events / spark_s),
                "reference_events_per_s": round(events / reference_s),
                "spark_over_reference": round(spark_s / reference_s, 3),
                "incidents": reference_report.summary["incidents"]["count"],
                "agree": _agree(spark_report.summary, reference_report.summary),
            }
            shutil.rmtree(folder)
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    if len(sizes) > 1:
        first, last = results["sizes"][str(sizes[0])], results["sizes"][str(sizes[-1])]
        scale = last["events"] / first["events"]
        results["growth"] = {
            "events": round(scale, 2),
            "spark": round(last["spark_s"] / first["spark_s"], 2),
            "reference": round(last["reference_s"] / first["reference_s"], 2),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default=",".join(str(s) for s in DEFAULT_SIZES),
        help="comma-separated event counts (default %(default)s)",
    )
    sizes = tuple(int(s) for s in parser.parse_args().sizes.split(","))
    print(json.dumps(run(sizes), indent=2))


if __name__ == "__main__":
    main()
