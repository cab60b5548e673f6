"""Failover report benchmark: the Spark job (local[2]) beside the plain-Python reference.

    python -m bench.report_bench [--sizes 1000000,10000000] [--cold 20000] [--pairs 20]

Owns: timing, on fleets written by ``bench.fleet`` (pairs x days, rotated gzip logs, incidents
and redirect storms), a cold ``amqha report`` run (a new process: JVM start and all) on a small
input, then the Spark job warm and the reference on the same files in one run, with the
driver's memory: the Python driver's peak RSS while Spark computes, and the reference's peak
RSS (measured in a child process, as it holds every record). The reference is skipped above
``--reference-max`` events, where it would not fit in memory. Figures only: nothing here
asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fleet import generate_fleet

DEFAULT_SIZES = (1_000_000, 10_000_000)
QUICK_SIZES = (100_000, 1_000_000)
DAYS = 7
REFERENCE_MAX = 30_000_000  # about 300 bytes an event: the reference needs ~10 GB beyond


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


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reference_in_child(folder: Path) -> dict[str, Any]:
    """The reference's summary, seconds and peak RSS, from a child process of its own."""
    code = (
        "import json, resource, sys, time\n"
        "from spark import reference\n"
        "clock = time.perf_counter()\n"
        "report = reference.compute([sys.argv[1]])\n"
        "seconds = time.perf_counter() - clock\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "json.dump({'summary': report.summary, 'seconds': seconds, 'rss_mib': peak},"
        " sys.stdout)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def cold(events: int, pairs: int, scratch: Path) -> dict[str, Any]:
    """``amqha report`` in a new process on ``events`` records of one pair (or ``pairs``)."""
    folder = scratch / f"cold-{events}"
    generate_fleet(folder, events, pairs=pairs, days=1)
    out = scratch / f"cold-{events}-out"
    command = [sys.executable, "-m", "amqha", "report", "--events", str(folder), "--out", str(out)]
    clock = time.perf_counter()
    subprocess.run([*command, "--master", "local[2]", "-q"], check=True, capture_output=True)
    seconds = time.perf_counter() - clock
    shutil.rmtree(folder)
    shutil.rmtree(out)
    return {"events": events, "pairs": pairs, "seconds": round(seconds, 2)}


def run(
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    cold_events: int = 20_000,
    pairs: int = 20,
    reference_max: int = REFERENCE_MAX,
) -> dict:
    from spark import job

    scratch = Path(tempfile.mkdtemp(prefix="amqha-report-bench-"))
    results: dict[str, Any] = {"spark_master": "local[2]", "cpus": os.cpu_count()}
    if cold_events:
        results["cold"] = cold(cold_events, 1, scratch)
        _log(f"cold: {results['cold']}")
    started = time.perf_counter()
    spark = job.build_session("local[2]", str(scratch / "spark.log"))
    results["spark_version"] = spark.version
    results["spark_startup_s"] = round(time.perf_counter() - started, 2)
    results["sizes"] = {}
    try:
        warm = scratch / "warm-up"
        generate_fleet(warm, 20_000, pairs=2, days=1)
        job.compute(spark, [str(warm)])  # JIT and codegen, not timed
        shutil.rmtree(warm)
        for size in sizes:
            folder = scratch / str(size)
            clock = time.perf_counter()
            written = generate_fleet(folder, size, pairs=pairs, days=DAYS)
            generated = time.perf_counter() - clock
            events = sum(written.values())
            _log(f"{events} events in {pairs} pairs x {DAYS} days generated in {generated:.1f}s")

            clock = time.perf_counter()
            spark_report = job.compute(spark, [str(folder)], progress=_log)
            spark_s = time.perf_counter() - clock
            driver_rss = _rss_mib()
            spark_report.per_minute.unpersist()
            _log(f"{events} events: spark {spark_s:.1f}s")
            row: dict[str, Any] = {
                "events": events,
                "bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
                "generate_s": round(generated, 2),
                "spark_s": round(spark_s, 2),
                "spark_events_per_s": round(events / spark_s),
                "driver_python_peak_rss_mib": round(driver_rss),
                "incidents": spark_report.summary["fleet"]["incidents"],
            }
            if events <= reference_max:
                found = _reference_in_child(folder)
                _log(f"{events} events: reference {found['seconds']:.1f}s")
                row.update(
                    {
                        "reference_s": round(found["seconds"], 2),
                        "reference_events_per_s": round(events / found["seconds"]),
                        "reference_peak_rss_mib": round(found["rss_mib"]),
                        "spark_over_reference": round(spark_s / found["seconds"], 3),
                        "agree": _agree(spark_report.summary, found["summary"]),
                    }
                )
            results["sizes"][str(size)] = row
            shutil.rmtree(folder)
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    if len(sizes) > 1:
        first, last = results["sizes"][str(sizes[0])], results["sizes"][str(sizes[-1])]
        results["growth"] = {
            "events": round(last["events"] / first["events"], 2),
            "spark": round(last["spark_s"] / first["spark_s"], 2),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default=",".join(str(s) for s in DEFAULT_SIZES),
        help="comma-separated event counts (default %(default)s)",
    )
    parser.add_argument("--cold", type=int, default=20_000, help="events of the cold run (0: none)")
    parser.add_argument("--pairs", type=int, default=20, help="pairs in each fleet")
    parser.add_argument("--reference-max", type=int, default=REFERENCE_MAX)
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(json.dumps(run(sizes, args.cold, args.pairs, args.reference_max), indent=2))


if __name__ == "__main__":
    main()
