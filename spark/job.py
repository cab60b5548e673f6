"""The failover report as a Spark job: a run from the event logs to the written report.

Owns: a run's course (the session, ``spark.session``'s, started while Python prepares the
pictures, and ended with its JVM when the report is done), the choice of how the input is
read, each pair's input built from what the scan (``spark.scan``) brings to the driver, the
redirects_per_minute table kept in Spark for a large input, and the drawn pairs' bars of
redirects.

The logs are read once, in one hash aggregation that keeps every record but the bulk of
redirects and refusals, which it reduces to per-second spans and per-minute counts. A window
over each node's spans and records then keeps only the first and last point of each run of
bulk records. What reaches the driver is therefore the non-bulk records, two points per run
and aggregates: its size follows the number of failovers, not of events. The figures are
computed from it by ``spark.metrics``, the same code ``spark.reference`` runs on every
record, so the two must agree. A small input is read in one job instead, every record to the
driver, where the figures are computed as the reference computes them (see
``WHOLE_INPUT_BYTES``). Shuffle partitions are sized to the input on every master. See
docs/report.md. Must not know the figures' definitions, the session's settings or the
output's layout (``spark.output``).
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark import jvm, parquet, timeline
from spark.metrics import PairClocks, PairInput, pair_clocks, pair_report, report_of
from spark.model import (
    DAY_SECONDS,
    MINUTE,
    TABLES,
    ReportError,
    UnknownVersionError,
    expand_paths,
    local_path,
    no_valid_record,
    unnamed_pair,
)
from spark.output import Progress, SparkReport, quiet, write_report
from spark.runs import record_key
from spark.scan import (
    BUCKET_KEY,
    NODE,
    ORDER,
    SPECIAL_FIELDS,
    collect_json,
    collect_whole,
    edges,
    keyed,
    lookup,
    one_pass,
    read_events,
    reduce_runs,
    uri,
)
from spark.session import build_session, fit_partitions, input_bytes, is_local
from spark.summary import build_summary
from spark.text import render_text

ACTIVITY_BARS = 1500  # about this many bars of redirects over a timeline's window

# Inputs up to this size (plain text; gzip counted as GZIP_RATIO times its size) are read in
# one Spark job that brings every parsed record to the driver, about 100 bytes each there,
# and the figures are computed as the reference computes them: on a small input the fixed
# cost of Spark jobs and stages, not the records, is the time.
WHOLE_INPUT_BYTES = 16 << 20
GZIP_RATIO = 10


@dataclass(frozen=True)
class _Asked:
    """What the report was asked for: its window, clocks, SLO and the pair to draw."""

    since: float | None
    until: float | None
    skew: Mapping[str, float]
    estimate: bool
    slo: float | None
    chosen: str | None


def compute(
    spark: SparkSession,
    paths: Iterable[str],
    since: float | None = None,
    until: float | None = None,
    skew: Mapping[str, float] | None = None,
    estimate_skew: bool = True,
    progress: Progress = quiet,
    slo: float | None = None,
    conf: Mapping[str, str] | None = None,
    pair: str | None = None,
    whole: bool | None = None,
) -> SparkReport:
    """The report of the logs at ``paths``; ``pair`` is the one whose redirects are binned
    for its timeline (default: the only pair). ``whole``: bring every record to the driver
    (True), or reduce the bulk of the records in Spark first (False); by default, the first
    for inputs up to ``WHOLE_INPUT_BYTES``."""
    started = time.monotonic()
    asked = _Asked(since, until, skew or {}, estimate_skew, slo, pair)

    def step(message: str) -> None:
        progress(f"[{time.monotonic() - started:7.1f}s] {message}")

    files = expand_paths(paths)
    uris = [uri(f) for f in files]
    plain, packed = input_bytes(spark, uris)
    partitions = fit_partitions(spark, plain + packed, conf or {})
    lines = read_events(spark, uris)
    if whole is None:
        whole = plain + GZIP_RATIO * packed <= WHOLE_INPUT_BYTES
    if whole:
        step(f"reading {len(files)} file(s) in one job, every record to the driver")
        return _whole_report(lines, files, asked, step)
    step(f"reading {len(files)} file(s), {partitions} shuffle partition(s)")
    return _reduced_report(lines, files, asked, step)


def _whole_report(
    lines: DataFrame, files: Sequence[str], asked: _Asked, step: Progress
) -> SparkReport:
    """Every record to the driver, the figures computed there as the reference does."""
    collected = collect_whole(lines, files)
    step(f"{collected.count} events, {sum(collected.bad_by_file.values())} bad")
    summary, tables, clocks = report_of(
        collected, asked.since, asked.until, asked.skew, asked.estimate, asked.slo
    )
    drawn = _drawn(asked.chosen, summary)
    activity = {
        name: _bars(
            [r for r in tables["redirects_per_minute"] if r["pair"] == name],
            clocks[name].window,
        )
        for name in drawn
    }
    step("computed")
    return SparkReport(
        summary, tables, None, activity, asked.chosen is not None or len(clocks) == 1
    )


@dataclass
class _Pass:
    """The one pass's frames, and what its first job brought to the driver."""

    groups: DataFrame  # cached until the per-minute table is counted by day
    buckets: DataFrame
    special_points: DataFrame
    head: dict[str, list[dict[str, Any]]]


def _first_job(lines: DataFrame) -> _Pass:
    """The one pass, and in one job: each file's bad lines, each node's count, the non-bulk
    records and the run ends (which need nothing from the driver)."""
    groups = one_pass(keyed(lines)).cache()
    specials_df = groups.filter(F.col("special").isNotNull()).select(
        "pair", "node", "bucket", "events", "special.*"
    )
    buckets = groups.filter(F.col("state").isNotNull()).select(
        *BUCKET_KEY, "start", "end", "first_redirect", "last_refusal", "redirects", "refusals"
    )
    special_points = specials_df.select(
        *NODE,
        *ORDER,
        F.lit(None).cast("long").alias("bucket"),
        F.lit(None).cast("long").alias("minute"),
        F.lit(False).alias("bulk"),
    )
    head = collect_json(
        {
            "files": groups.groupBy("file").agg(
                F.sum("bad").alias("bad"), F.min("bad_version").alias("bad_version")
            ),
            "nodes": groups.filter(F.col("node").isNotNull())
            .groupBy(*NODE)
            .agg(F.sum("events").alias("events")),
            "specials": specials_df,
            "rows": reduce_runs(edges(buckets).unionByName(special_points)),
        }
    )
    return _Pass(groups, buckets, special_points, head)


def _checked(found: _Pass, files: Sequence[str]) -> tuple[dict[str, int], int]:
    """Each file's bad lines and the count of good ones; an unknown version or no good
    line at all is an error."""
    head = found.head
    versions = sorted(
        (local_path(r["file"]), r["bad_version"])
        for r in head["files"]
        if r.get("bad_version") is not None
    )
    if versions:
        found.groups.unpersist()
        raise UnknownVersionError(*versions[0])
    bad_by_file = {local_path(r["file"]): r["bad"] for r in head["files"] if r["bad"]}
    count = sum(r["events"] for r in head["nodes"])
    if count == 0:
        found.groups.unpersist()
        raise no_valid_record(files, sum(bad_by_file.values()))
    return bad_by_file, count


def _run_ends(found: _Pass, lines: DataFrame, step: Progress) -> list[dict[str, Any]]:
    """Runs of bulk points reduced to their ends, on the executors; buckets with something
    else inside (rare) are read again and their records take the place of their ends."""
    reduced = {"rows": found.head["rows"]}
    mixed = [r for r in reduced["rows"] if r["kind"] == "mixed"]
    if mixed:
        step(f"reading {len(mixed)} bucket(s) with a state change inside again in full")
        keys = F.concat_ws(
            "\u0000", *[F.coalesce(F.col(c).cast("string"), F.lit("")) for c in BUCKET_KEY]
        )
        listed = [
            "\u0000".join(str(r[c]) if r.get(c) is not None else "" for c in BUCKET_KEY)
            for r in mixed
        ]
        inside = keys.isin(listed)
        whole = (
            keyed(lines)
            .filter(F.col("bulk") & inside)
            .select(*BUCKET_KEY, "ts", "rank", "event", F.lit(True).alias("bulk"))
        )
        points = (
            edges(found.buckets.filter(~inside))
            .unionByName(whole)
            .unionByName(found.special_points)
        )
        reduced = collect_json({"rows": reduce_runs(points)})
    return [r for r in reduced["rows"] if r["kind"] == "end"]


def _pair_inputs(
    head: Mapping[str, list[dict[str, Any]]], ends: Sequence[Mapping[str, Any]], unnamed: str
) -> dict[str, PairInput]:
    """Each pair's input: its nodes' counts, non-bulk records (identical ones were counted,
    not kept) and points, in each node's order."""

    def pair_of(row: Mapping[str, Any]) -> str:
        return row.get("pair") or unnamed

    inputs: dict[str, PairInput] = {}
    for row in head["nodes"]:
        pair = inputs.setdefault(pair_of(row), PairInput(pair_of(row), {}, {}, 0))
        pair.points.setdefault(row["node"], [])
        pair.records.setdefault(row["node"], [])
        pair.events += row["events"]
    for row in head["specials"]:
        record = {k: row.get(k) for k in SPECIAL_FIELDS if k != "rank"}
        point = (row["ts"], row["rank"], row["event"], row["state"])
        pair = inputs[pair_of(row)]
        for _ in range(row["events"]):  # identical records were counted, not kept
            pair.records[row["node"]].append(dict(record))
            pair.points[row["node"]].append(point)
    for row in ends:
        inputs[pair_of(row)].points[row["node"]].append(
            (row["ts"], row["rank"], row["event"], row["state"])
        )
    for pair in inputs.values():
        for node in pair.points:
            pair.points[node].sort()
            pair.records[node].sort(key=record_key)
    return inputs


def _per_minute(buckets: DataFrame, clocks: Mapping[str, PairClocks], unnamed: str) -> DataFrame:
    """The redirects_per_minute table, in Spark: each node's minutes placed on its pair's
    reference clock, those that overlap the pair's window (cached)."""
    shifts = {
        f"{name}\u0000{node}": o.seconds
        for name, c in clocks.items()
        for node, o in c.offsets.items()
    }
    windows_lo = {name: c.window[0] for name, c in clocks.items()}
    windows_hi = {name: c.window[1] for name, c in clocks.items()}
    named = F.coalesce(F.col("pair"), F.lit(unnamed))
    at = F.col("minute") - lookup(shifts, F.concat_ws("\u0000", named, F.col("node")))
    return (
        buckets.groupBy("pair", "node", "minute")
        .agg(F.sum("redirects").alias("redirects"), F.sum("refusals").alias("refusals"))
        .withColumn("at", at)
        .withColumn("pair", named)
        .filter(
            (F.col("at") <= lookup(windows_hi, F.col("pair")))
            & (F.col("at") + MINUTE > lookup(windows_lo, F.col("pair")))
        )
        .select(
            "pair",
            F.date_format(
                F.timestamp_seconds(F.floor(F.col("at") / DAY_SECONDS) * DAY_SECONDS), "yyyy-MM-dd"
            ).alias("day"),
            "node",
            F.col("minute").cast("long").alias("minute_start"),
            F.date_format(F.timestamp_seconds("minute"), "yyyy-MM-dd'T'HH:mm:00'Z'").alias(
                "minute"
            ),
            "at",
            "redirects",
            "refusals",
        )
        .cache()
    )


def _days(per_minute: DataFrame) -> DataFrame:
    """Redirects and refusals per pair and day."""
    return per_minute.groupBy("pair", "day").agg(
        F.sum("redirects").alias("redirects"), F.sum("refusals").alias("refusals")
    )


def _bulk_by_day(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, tuple[int, int]]]:
    by_day: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for row in rows:
        by_day[row["pair"]][row["day"]] = (row["redirects"], row["refusals"])
    return by_day


def _pair_tables(
    inputs: Mapping[str, PairInput],
    clocks: Mapping[str, PairClocks],
    by_day: Mapping[str, Mapping[str, tuple[int, int]]],
) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Each pair's summary, and the tables on the driver (every one but redirects_per_minute),
    sorted."""
    small: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES if t != "redirects_per_minute"}
    summaries = {}
    for name in sorted(inputs):
        found = pair_report(inputs[name], clocks[name], by_day[name])
        summaries[name] = found.summary
        for table, rows in found.tables.items():
            small[table].extend(rows)
    for table, rows in small.items():
        _, order = TABLES[table]
        rows.sort(key=lambda row, order=order: tuple(row[c] for c in order))
    return summaries, small


def _known_drawn(chosen: str | None, clocks: Mapping[str, PairClocks]) -> list[str] | None:
    """The pairs drawn, when they are known before the figures: the one asked for, or every
    pair when there are no more than ``TIMELINE_PAIRS``; None when the worst must be chosen.
    (Their order, the worst first, comes from the figures: see ``_drawn``.)"""
    if chosen is not None:
        return [chosen]
    if len(clocks) <= TIMELINE_PAIRS:
        return sorted(clocks)
    return None


def _bars_frame(
    per_minute: DataFrame, drawn: Sequence[str], clocks: Mapping[str, PairClocks]
) -> DataFrame:
    """The drawn pairs' redirects grouped into bars, each pair's from its window's start."""
    starts = {name: clocks[name].window[0] for name in drawn}
    widths = {name: _bar_width(*clocks[name].window) for name in drawn}
    lo = lookup(starts, F.col("pair"))
    width = lookup(widths, F.col("pair"))
    return (
        per_minute.filter(F.col("pair").isin(list(drawn)))
        .groupBy("pair", "node", F.floor((F.col("at") - lo) / width).alias("bar"))
        .agg(
            F.min("at").alias("at"),  # the true start of its first minute
            F.sum("redirects").alias("redirects"),
            F.sum("refusals").alias("refusals"),
        )
        .withColumn("width", width.cast("long"))
        .drop("bar")
    )


def _activity(
    bars: Iterable[dict[str, Any]], drawn: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """The drawn pairs' bars, in the order they are drawn."""
    activity: dict[str, list[dict[str, Any]]] = {name: [] for name in drawn}
    for row in sorted(bars, key=lambda r: (r["pair"], r["node"], r["at"])):
        pair = row.pop("pair")
        if pair in activity:
            activity[pair].append(row)
    return activity


def _reduced_report(
    lines: DataFrame, files: Sequence[str], asked: _Asked, step: Progress
) -> SparkReport:
    """The bulk of the records reduced in Spark, the rest and the run ends to the driver."""
    found = _first_job(lines)
    bad_by_file, count = _checked(found, files)
    head = found.head
    unnamed = unnamed_pair(r["node"] for r in head["nodes"] if r.get("pair") is None)
    step(f"{count} events from {len(head['nodes'])} node(s), {sum(bad_by_file.values())} bad")
    ends = _run_ends(found, lines, step)
    inputs = _pair_inputs(head, ends, unnamed)
    step(f"{len(inputs)} pair(s), {len(ends)} run end(s) of redirects and refusals")
    clocks = {
        name: pair_clocks(pair, asked.since, asked.until, asked.skew, asked.estimate)
        for name, pair in inputs.items()
    }
    per_minute = _per_minute(found.buckets, clocks, unnamed)
    chosen = asked.chosen
    if chosen is not None and chosen not in clocks:
        raise ReportError(f"--pair {chosen}: no such pair (pairs: {', '.join(sorted(clocks))})")
    # The days' totals and, when the pairs drawn are known already, their bars: one job.
    known = _known_drawn(chosen, clocks)
    frames = {"days": _days(per_minute)}
    if known:
        frames["bars"] = _bars_frame(per_minute, known, clocks)
    totals = collect_json(frames)
    by_day = _bulk_by_day(totals["days"])
    found.groups.unpersist()
    summaries, small = _pair_tables(inputs, clocks, by_day)
    summary = build_summary(
        files=files,
        events=count,
        bad_lines_by_file=bad_by_file,
        pairs=summaries,
        daily=small["daily"],
        takeover_delays=[
            f["takeover_delay_s"] for f in small["failovers"] if f["takeover_delay_s"] is not None
        ],
        slo=asked.slo,
    )
    drawn = _drawn(chosen, summary)
    if known is None:  # the worst pairs of a fleet: their bars once the figures are in
        totals["bars"] = collect_json({"bars": _bars_frame(per_minute, drawn, clocks)})["bars"]
    activity = _activity(totals.get("bars", []), drawn)
    step("computed")
    return SparkReport(summary, small, per_minute, activity, chosen is not None or len(inputs) == 1)


TIMELINE_PAIRS = 20  # timelines drawn at most without --pair: the worst pairs'


def _drawn(chosen: str | None, summary: Mapping[str, Any]) -> list[str]:
    """The pairs whose timelines are drawn: the one asked for, else every pair up to
    ``TIMELINE_PAIRS``, the worst first (pairs without data last)."""
    pairs = summary["pairs"]
    if chosen is not None:
        if chosen not in pairs:
            raise ReportError(f"--pair {chosen}: no such pair (pairs: {', '.join(sorted(pairs))})")
        return [chosen]
    ranked = sorted(
        pairs, key=lambda n: (pairs[n]["availability"] is None, pairs[n]["availability"] or 0, n)
    )
    return ranked[:TIMELINE_PAIRS]


def _bar_width(lo: float, hi: float) -> int:
    return max(1, math.ceil((hi - lo) / MINUTE / ACTIVITY_BARS)) * MINUTE


def _bars(per_minute: Sequence[Mapping[str, Any]], window: tuple[float, float]) -> list[dict]:
    """A pair's minutes of redirects grouped into bars as the Spark path groups them: per node,
    ``width`` seconds from the window's start, each at the true start of its first minute."""
    lo, hi = window
    width = _bar_width(lo, hi)
    bars: dict[tuple[str, int], dict[str, Any]] = {}
    for row in per_minute:
        key = (row["node"], math.floor((row["at"] - lo) / width))
        bar = bars.get(key)
        if bar is None:
            bars[key] = {
                "node": row["node"],
                "at": row["at"],
                "redirects": row["redirects"],
                "refusals": row["refusals"],
                "width": width,
            }
        else:
            bar["at"] = min(bar["at"], row["at"])
            bar["redirects"] += row["redirects"]
            bar["refusals"] += row["refusals"]
    return sorted(bars.values(), key=lambda r: (r["node"], r["at"]))


def _end(spark: SparkSession, archive: jvm.ClassArchive | None) -> None:
    """Stop the session this run started, and its JVM."""
    spark.stop()
    exited = jvm.end_started_jvm()
    if archive is not None:
        archive.finish(exited)


JAVA_OPTIONS = "spark.driver.extraJavaOptions"  # given with --conf, they replace the report's


def run_report(
    paths: Iterable[str],
    out: str,
    master: str | None = "local[*]",
    since: float | None = None,
    until: float | None = None,
    skew: Mapping[str, float] | None = None,
    estimate_skew: bool = True,
    conf: Mapping[str, str] | None = None,
    progress: Progress = quiet,
    echo: Callable[[str], None] | None = None,
    slo: float | None = None,
    pair: str | None = None,
) -> dict:
    """Compute the report, write it to ``out`` and return the summary.

    Reuses an active Spark session (a test's, spark-submit's) and leaves it running; otherwise
    starts one on ``master`` with Spark's console output in ``<out>/spark.log`` and stops it.
    The progress lines go to ``<out>/spark.log`` too. ``echo`` receives the human summary.
    """
    paths = list(paths)
    if not paths:
        raise ReportError("no --events given")
    files = expand_paths(paths)  # a path that gives nothing fails before Spark starts
    os.makedirs(out, exist_ok=True)
    log_file = os.path.join(out, "spark.log")

    def logged(message: str) -> None:
        with open(log_file, "a", encoding="utf-8") as log:
            log.write(f"amqha-report: {message}\n")
        progress(message)

    spark = SparkSession.getActiveSession()
    owned = spark is None
    archive = None
    ending: Future | None = None
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        if spark is None:
            logged(f"starting Spark ({master or 'from spark-submit'}); its log: {log_file}")
            settings = dict(conf or {})
            if master is not None and is_local(master) and JAVA_OPTIONS not in settings:
                archive = jvm.class_archive()
                settings[JAVA_OPTIONS] = jvm.driver_options(files, archive)
            starting = pool.submit(build_session, master, log_file, settings)
            timeline.warm_up()  # while the JVM starts
            parquet.warm_up()
            spark = starting.result()
            if archive is not None and archive.creating is not None:
                logged(f"class archive: this JVM writes {archive.path} as it exits (once)")
            elif archive is not None:
                logged(f"class archive: {archive.path}")
        logged(f"Spark {spark.version}, master {spark.sparkContext.master}")
        report = compute(spark, paths, since, until, skew, estimate_skew, logged, slo, conf, pair)
        if owned and report.per_minute is None:
            ending = pool.submit(_end, spark, archive)  # Spark has nothing left to do
        write_report(report, out, logged)
        report.release()
    finally:
        if owned and spark is not None:
            if ending is None:
                _end(spark, archive)
            else:
                ending.result()
        pool.shutdown()
    if echo is not None:
        echo(render_text(report.summary, report.tables))
    return report.summary
