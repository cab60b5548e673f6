"""``python -m tests.sim --schedules N [--seed S] [--old-protocol] [--evidence] [--jobs J]``: run N
schedules from seed S on, print JSON (schedules run, the first failing seeds,
schedules/s, wall seconds). ``--replay SEED`` prints one schedule's trace instead.
``--freezes`` runs the failover schedules of freezes (``tests/sim/freeze.py``) instead of the
replication ones; with ``--old-protocol``, the shell that came before the rule after a
freeze. ``--restarts`` runs its schedules of kills and fast restarts (no freezes: two
servers never serve at once); with ``--old-protocol``, a restarted primary leads on any
PASSIVE message, whether or not the backup has heard it (the rule before the echo)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from typing import Any

from .freeze import simulate_freezes
from .model import simulate
from .old import OldLeader

FAILURES_SHOWN = 10
PROGRESS_EVERY = 10.0  # seconds between progress lines on stderr


def run_range(args: tuple[int, int, bool, bool, bool, bool, bool]) -> dict[str, Any]:
    first, count, old, double, active_writes, evidence, _ = args
    leader = OldLeader if old else None
    failing: list[dict[str, Any]] = []
    totals: dict[str, int] = {}
    failed = 0
    for seed in range(first, first + count):
        result = simulate(
            seed,
            *(() if leader is None else (leader,)),
            double_failures=double,
            active_write_failures=active_writes,
            evidence=evidence,
        )
        for key in ("confirmed", "lost", "quarantined", "returned_in_flight", "kills"):
            totals[key] = totals.get(key, 0) + getattr(result, key)
        totals["returned_acked_alone"] = (
            totals.get("returned_acked_alone", 0) + result.returned_unprotected
        )
        totals["failovers"] = totals.get("failovers", 0) + result.failovers
        if result.failures:
            failed += 1
            if len(failing) < FAILURES_SHOWN:
                failing.append({"seed": seed, "failure": result.failures[0]})
    return {"failed": failed, "failing": failing, "totals": totals}


def run_freeze_range(args: tuple[int, int, bool, bool, bool, bool, bool]) -> dict[str, Any]:
    first, count, old, _, _, _, restarts = args
    failing: list[dict[str, Any]] = []
    totals: dict[str, int] = {}
    failed = 0
    for seed in range(first, first + count):
        result = simulate_freezes(
            seed, old=old and not restarts, restarts=restarts, old_start=old and restarts
        )
        for key in ("freezes", "kills", "takeovers", "fenced", "yields"):
            totals[key] = totals.get(key, 0) + getattr(result, key)
        if result.failures:
            failed += 1
            if len(failing) < FAILURES_SHOWN:
                failing.append({"seed": seed, "failure": result.failures[0]})
    return {"failed": failed, "failing": failing, "totals": totals}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="the first schedule's seed")
    parser.add_argument("--old-protocol", action="store_true", help="in sync at the snapshot's ack")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument(
        "--double-failures", action="store_true", help="kill one while the other is down"
    )
    parser.add_argument(
        "--active-write-failures", action="store_true", help="fail writes on the ACTIVE's disk too"
    )
    parser.add_argument(
        "--evidence",
        action="store_true",
        help="a killed server is lost at once (its port refuses), not after the timeout",
    )
    parser.add_argument(
        "--freezes",
        action="store_true",
        help="the failover schedules of freezes (the rule after a freeze), not replication",
    )
    parser.add_argument(
        "--restarts",
        action="store_true",
        help="the failover schedules of kills and fast restarts, no freezes (implies --freezes)",
    )
    parser.add_argument("--replay", type=int, help="print this seed's schedule, event by event")
    options = parser.parse_args(argv)
    options.freezes = options.freezes or options.restarts
    if options.replay is not None and options.freezes:
        frozen = simulate_freezes(
            options.replay,
            old=options.old_protocol and not options.restarts,
            log=True,
            restarts=options.restarts,
            old_start=options.old_protocol and options.restarts,
        )
        print("\n".join(frozen.log))
        print(json.dumps({"seed": frozen.seed, "trace": frozen.trace, "failures": frozen.failures}))
        return 1 if frozen.failures else 0
    if options.replay is not None:
        result = simulate(
            options.replay,
            *((OldLeader,) if options.old_protocol else ()),
            log=True,
            double_failures=options.double_failures,
            active_write_failures=options.active_write_failures,
            evidence=options.evidence,
        )
        print("\n".join(result.log))
        print(json.dumps({"seed": result.seed, "trace": result.trace, "failures": result.failures}))
        return 1 if result.failures else 0
    started = time.monotonic()
    jobs = max(1, options.jobs)
    chunk = max(1, min(2000, options.schedules // (jobs * 4) or 1))
    ranges = [
        (
            first,
            min(chunk, options.seed + options.schedules - first),
            options.old_protocol,
            options.double_failures,
            options.active_write_failures,
            options.evidence,
            options.restarts,
        )
        for first in range(options.seed, options.seed + options.schedules, chunk)
    ]
    parts: list[dict[str, Any]] = []
    done = 0
    said = started
    with multiprocessing.Pool(jobs) as pool:
        runner = run_freeze_range if options.freezes else run_range
        for part, (_, count, *_) in zip(pool.imap(runner, ranges), ranges, strict=True):
            parts.append(part)
            done += count
            now = time.monotonic()
            if now - said >= PROGRESS_EVERY or done == options.schedules:
                said = now
                failed = sum(each["failed"] for each in parts)
                print(
                    f"{done} of {options.schedules} schedules, "
                    f"{done / (now - started):.0f}/s, {failed} failing",
                    file=sys.stderr,
                    flush=True,
                )
    seconds = time.monotonic() - started
    totals: dict[str, int] = {}
    for part in parts:
        for key, value in part["totals"].items():
            totals[key] = totals.get(key, 0) + value
    failing = [each for part in parts for each in part["failing"]][:FAILURES_SHOWN]
    report = {
        "model": "restarts"
        if options.restarts
        else "freezes"
        if options.freezes
        else "replication",
        "protocol": "old" if options.old_protocol else "new",
        "schedules": options.schedules,
        "first_seed": options.seed,
        "failed": sum(part["failed"] for part in parts),
        "failing": failing,
        "schedules_per_second": round(options.schedules / seconds, 1),
        "wall_seconds": round(seconds, 1),
        **totals,
    }
    print(json.dumps(report, indent=1))
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
