"""Failover report benchmark: cold runs, a warm 10 M run, and fleets of growing size with the
Spark job (local[2]) beside the plain-Python reference.

    python -m bench.report_bench [--sizes 1000000,10000000,100000000] [--cold 20000]
                                 [--cold-repeat 3] [--warm 10000000] [--pairs 20]

Owns: timing ``amqha report`` from a cold start (a new process: JVM start and all) on a small
input laid out two ways (one pair's day: two plain files; one pair's month: 60 rotated gzip
files), with a class archive made for the occasion (as a user's second run writes it) and
without one; then, in one Spark session, the job warm on one pair's 10 M events in two plain
files, and on fleets written by ``bench.fleet`` (pairs x days, rotated gzip logs, incidents and redirect
storms) beside the reference on the same files. Memory: the Python driver's and the driver
JVM's peak RSS while Spark computes (sampled), and the reference's peak RSS (a child process of
its own, as it holds every record); the reference runs only where its records fit in memory.
The load average is given beside every timing: the machine may be shared. Logs are generated
in a child process, so that its memory is not counted as the driver's. Figures only: nothing
here asserts a speed.
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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_SIZES = (1_000_000, 10_000_000)
QUICK_SIZES = (100_000, 1_000_000)
DAYS = 7
REFERENCE_BYTES_PER_EVENT = 130  # measured: its points and records, names shared
REFERENCE_MEMORY_SHARE = 0.7  # of the memory available when it would start


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


def _load() -> float:
    return os.getloadavg()[0]


def _available_bytes() -> int:
    with open("/proc/meminfo", encoding="ascii") as stream:
        for line in stream:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_mib(pid: int | str = "self") -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as stream:
            for line in stream:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@contextmanager
def _peak_rss(pids: dict[str, int | str]) -> Iterator[dict[str, float]]:
    """The highest RSS of each process while the block runs, sampled every 0.1 s."""
    peaks = {name: _rss_mib(pid) for name, pid in pids.items()}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            for name, pid in pids.items():
                peaks[name] = max(peaks[name], _rss_mib(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peaks
    finally:
        done.set()
        sampler.join(5)
        for name, pid in pids.items():
            peaks[name] = round(max(peaks[name], _rss_mib(pid)))


def _generate(folder: Path, events: int, pairs: int, days: int) -> tuple[int, float]:
    """A fleet's logs, written by a child process; (events written, seconds)."""
    clock = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.fleet",
            str(folder),
            "--events",
            str(events),
            "--pairs",
            str(pairs),
            "--days",
            str(days),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)["events"], time.perf_counter() - clock


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


def _cold_run(folder: Path, out: Path, env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "amqha", "report", "--events", str(folder), "--out", str(out)]
    load = _load()
    clock = time.perf_counter()
    subprocess.run(
        [*command, "--master", "local[2]", "-q"],
        check=True,
        capture_output=True,
        env={**os.environ, **env},
    )
    seconds = time.perf_counter() - clock
    shutil.rmtree(out)
    return {"seconds": round(seconds, 2), "load": round(load, 2)}


def cold(events: int, repeat: int, scratch: Path) -> dict[str, Any]:
    """``amqha report`` in a new process, on one pair's ``events`` records laid out as a day
    (two plain files) and as a month (rotated daily: 60 gzip files). In a cache directory of
    its own: the first run only marks it, the second writes the class archive, the others
    start from it; then as many runs without it."""
    cache = scratch / "cache"
    with_archive = {"XDG_CACHE_HOME": str(cache)}
    without = {"AMQHA_REPORT_CLASS_ARCHIVE": "off"}
    found: dict[str, Any] = {"events": events}
    for layout, days in (("day", 1), ("month", 30)):
        folder = scratch / f"cold-{layout}"
        written, _ = _generate(folder, events, 1, days)
        runs: dict[str, Any] = {
            "events": written,
            "files": sum(1 for f in folder.rglob("*") if f.is_file()),
        }
        out = scratch / "cold-out"
        if layout == "day":
            runs["first (marks the cache)"] = _cold_run(folder, out, with_archive)
            runs["second (writes the class archive)"] = _cold_run(folder, out, with_archive)
        runs["class archive"] = [_cold_run(folder, out, with_archive) for _ in range(repeat)]
        runs["no class archive"] = [_cold_run(folder, out, without) for _ in range(repeat)]
        _log(f"cold, one pair's {layout}: {runs}")
        found[layout] = runs
        shutil.rmtree(folder)
    shutil.rmtree(cache, ignore_errors=True)
    return found


def _timed_compute(spark: Any, folder: Path, job: Any) -> tuple[Any, float, dict[str, float]]:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    jvm_pid = gateway.proc.pid if gateway is not None and gateway.proc is not None else "self"
    with _peak_rss({"driver_python": "self", "driver_jvm": jvm_pid}) as peaks:
        clock = time.perf_counter()
        report = job.compute(spark, [str(folder)], progress=_log)
        seconds = time.perf_counter() - clock
    return report, seconds, peaks


def warm(spark: Any, events: int, scratch: Path, job: Any) -> dict[str, Any]:
    """The job on one pair's ``events`` records of one day: two plain files."""
    folder = scratch / "warm"
    written, _ = _generate(folder, events, 1, 1)
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    load = _load()
    report, seconds, peaks = _timed_compute(spark, folder, job)
    report.release()
    shutil.rmtree(folder)
    found = {
        "events": written,
        "bytes": size,
        "spark_s": round(seconds, 2),
        "load": round(load, 2),
        "peak_rss_mib": peaks,
    }
    _log(f"warm: {found}")
    return found


def fleet(
    spark: Any, size: int, pairs: int, scratch: Path, job: Any, reference_max: int | None
) -> dict[str, Any]:
    folder = scratch / str(size)
    events, generated = _generate(folder, size, pairs, DAYS)
    _log(f"{events} events in {pairs} pairs x {DAYS} days generated in {generated:.1f}s")
    load = _load()
    report, spark_s, peaks = _timed_compute(spark, folder, job)
    report.release()
    _log(f"{events} events: spark {spark_s:.1f}s, peak RSS {peaks}")
    row: dict[str, Any] = {
        "events": events,
        "bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
        "generate_s": round(generated, 2),
        "spark_s": round(spark_s, 2),
        "spark_load": round(load, 2),
        "spark_s_per_million": round(spark_s / events * 1e6, 2),
        "peak_rss_mib": peaks,
        "incidents": report.summary["fleet"]["incidents"],
    }
    fits = events * REFERENCE_BYTES_PER_EVENT < REFERENCE_MEMORY_SHARE * _available_bytes()
    if reference_max is not None:
        fits = events <= reference_max
    if fits:
        load = _load()
        found = _reference_in_child(folder)
        _log(f"{events} events: reference {found['seconds']:.1f}s")
        row.update(
            {
                "reference_s": round(found["seconds"], 2),
                "reference_load": round(load, 2),
                "reference_s_per_million": round(found["seconds"] / events * 1e6, 2),
                "reference_peak_rss_mib": round(found["rss_mib"]),
                "spark_over_reference": round(spark_s / found["seconds"], 3),
                "agree": _agree(report.summary, found["summary"]),
            }
        )
    else:
        row["reference"] = "skipped: its records would not fit in the memory available"
    shutil.rmtree(folder)
    return row


def run(
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    cold_events: int = 20_000,
    cold_repeat: int = 3,
    warm_events: int = 10_000_000,
    pairs: int = 20,
    reference_max: int | None = None,
) -> dict:
    from spark import job, session

    scratch = Path(tempfile.mkdtemp(prefix="amqha-report-bench-"))
    results: dict[str, Any] = {"spark_master": "local[2]", "cpus": os.cpu_count()}
    try:
        if cold_events:
            results["cold"] = cold(cold_events, cold_repeat, scratch)
        started = time.perf_counter()
        spark = session.build_session("local[2]", str(scratch / "spark.log"))
        results["spark_version"] = spark.version
        results["spark_startup_s"] = round(time.perf_counter() - started, 2)
        try:
            _generate(scratch / "warm-up", 20_000, 2, 1)
            job.compute(spark, [str(scratch / "warm-up")], whole=False).release()  # not timed
            if warm_events:
                results["warm"] = warm(spark, warm_events, scratch, job)
            results["sizes"] = {
                str(size): fleet(spark, size, pairs, scratch, job, reference_max) for size in sizes
            }
        finally:
            spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results["driver_python_peak_rss_mib"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
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
        help="comma-separated fleet sizes in events (default %(default)s)",
    )
    parser.add_argument(
        "--cold", type=int, default=20_000, help="events of the cold runs (0: none)"
    )
    parser.add_argument("--cold-repeat", type=int, default=3, help="cold runs of each kind")
    parser.add_argument(
        "--warm", type=int, default=10_000_000, help="events of the warm one-pair run (0: none)"
    )
    parser.add_argument("--pairs", type=int, default=20, help="pairs in each fleet")
    parser.add_argument(
        "--reference-max",
        type=int,
        default=None,
        help="run the reference up to this many events (default: where it fits in memory)",
    )
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    found = run(sizes, args.cold, args.cold_repeat, args.warm, args.pairs, args.reference_max)
    print(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
