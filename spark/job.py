"""The failover report as a Spark job.

Owns: the Spark session (quiet, loopback-only and UI-less when local), reading the event logs
with an explicit schema, every metric as DataFrame operations, and writing the report (Parquet
and CSV tables, ``summary.json``, ``timeline.png``). The logs are read once, in one hash
aggregation that keeps every record but the bulk of redirects and refusals, which it reduces to
per-second spans and counts (see "the one pass"). Per-node state intervals then come from
window functions (lead/lag and running sums over a node's points in time order). No Python
UDFs, so executors run no Python. Only aggregates and the small tables (state runs, outages,
incidents, recoveries: their size follows the number of failovers, not of events) reach the
driver. The definitions are in ``spark.model``; the results are checked against
``spark.reference``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark import timeline
from spark.model import (
    CORRUPT_COLUMN,
    DOWN,
    FIELDS,
    MINUTE,
    PEER_EVENTS,
    RANK_MARKER,
    RANK_ORIGIN,
    RANK_RECORD,
    RANK_STARTED,
    RANK_STOPPED,
    RECOVER_COMMAND,
    RECOVERY_TRIGGERS,
    REPORT_STATES,
    SCHEMA_VERSION,
    STATES,
    TABLES,
    ClockEvidence,
    ReportError,
    UnknownVersionError,
    build_summary,
    crashed_at_tail,
    estimate_offsets,
    expand_paths,
    local_path,
    render_text,
    report_window,
    write_csv,
)

_TYPES = {"long": T.LongType(), "double": T.DoubleType(), "string": T.StringType()}
SCHEMA = T.StructType(
    [T.StructField(name, _TYPES[kind]) for name, kind in FIELDS]
    + [T.StructField(CORRUPT_COLUMN, T.StringType())]
)
_BULK = ("redirect", "refuse")
_ORDER = ("ts", "rank", "event", "state")  # a node's points, as in spark.reference
_INF = float("inf")

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    """Progress sink that prints nothing."""


# ---------------------------------------------------------------- session


def is_local(master: str) -> bool:
    return master.startswith("local")


@contextmanager
def _stderr_to(path: str):
    """Point file descriptor 2 at ``path`` while the JVM starts: it inherits it, so Spark's own
    console output (log4j, JVM warnings, progress bars) lands in the file for good."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def build_session(
    master: str | None = "local[*]",
    log_file: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A session for the report. ``master=None`` keeps the one spark-submit chose.

    Locally, Spark binds to 127.0.0.1 and the UI is off. ``log_file`` receives everything the
    JVM would print on the console; None leaves it on the console.
    """
    builder = SparkSession.builder.appName("amqha-report")
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }
    if master is not None:
        builder = builder.master(master)
        if is_local(master):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            settings.update(
                {
                    "spark.driver.host": "127.0.0.1",
                    "spark.driver.bindAddress": "127.0.0.1",
                    "spark.driver.memory": "4g",
                    # After the one pass every frame is small: a few partitions, and no
                    # adaptive re-planning, whose per-stage cost is larger than what it saves.
                    "spark.sql.shuffle.partitions": str(2 * (os.cpu_count() or 1)),
                    "spark.sql.adaptive.enabled": "false",
                }
            )
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    if log_file is None:
        session = builder.getOrCreate()
    else:
        with _stderr_to(log_file):
            session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


# ---------------------------------------------------------------- reading

_JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": CORRUPT_COLUMN,
    "allowSingleQuotes": "false",
}


def _uri(path: str) -> str:
    return Path(path).as_uri() if os.path.isabs(path) else path


def _good() -> Column:
    """Parsed, typed and complete: what ``spark.reference`` calls a good line."""
    ts, last_seen = F.col("ts"), F.col("last_seen")
    return F.coalesce(
        F.col(CORRUPT_COLUMN).isNull()
        & (F.col("v") == SCHEMA_VERSION)
        & (F.abs(ts) < _INF)  # also false for null and NaN
        & (F.length("node") > 0)
        & (F.length("event") > 0)
        & F.col("state").isin(*STATES)
        & (last_seen.isNull() | (F.abs(last_seen) < _INF)),
        F.lit(False),
    )


def read_events(spark: SparkSession, uris: Sequence[str]) -> DataFrame:
    """Every line as a row: the v1 fields (explicit schema, PERMISSIVE, corrupt-record column),
    ``file`` and ``good``."""
    if uris:
        raw = (
            spark.read.schema(SCHEMA)
            .options(**_JSON_OPTIONS)
            .json(list(uris))
            .withColumn("file", F.col("_metadata.file_path"))
        )
    else:
        raw = spark.createDataFrame([], SCHEMA).withColumn("file", F.lit(None).cast("string"))
    return raw.withColumn("good", _good())


def _rank(event: Column) -> Column:
    return (
        F.when(event == "started", RANK_STARTED)
        .when(event == "stopped", RANK_STOPPED)
        .otherwise(RANK_RECORD)
    )


def _lookup(values: Mapping[str, float], key: Column, default: float) -> Column:
    if not values:
        return F.lit(default)
    table = F.create_map(*[x for k, v in values.items() for x in (F.lit(k), F.lit(v))])
    return F.coalesce(table[key], F.lit(default))


def _running(order: Window) -> Window:
    return order.rowsBetween(Window.unboundedPreceding, Window.currentRow)


def _node_order() -> Window:
    """A node's points in time order (the same order as ``spark.reference``)."""
    return Window.partitionBy("node").orderBy(*_ORDER)


def _typed(name: str, df: DataFrame) -> DataFrame:
    columns, _ = TABLES[name]
    return df.select(*[F.col(c).cast(_TYPES[k]).alias(c) for c, k in columns])


def _sorted(name: str, df: DataFrame) -> DataFrame:
    """One partition in the table's order (tables are written and read back in that order)."""
    _, order = TABLES[name]
    return df.repartition(1).sortWithinPartitions(*order)


# ---------------------------------------------------------------- the one pass over events

# The bulk of a log is redirects and refusals. The pass keeps, per node, one-second bucket,
# minute and state, only their first and last time and their counts; every other record is
# kept whole. Between its first and last time a bucket's state holds, so the records in
# between add nothing to the state intervals, unless a record of another state or a start
# falls in that span too: such "mixed" buckets are read again in full (rare: it takes a state
# change in the middle of a stream of redirects within one second). The pass works on each
# node's own clock; offsets are estimated from its output and applied after.
BUCKET_SECONDS = 1
_SPECIAL_FIELDS = (
    "ts",
    "rank",
    "event",
    "state",
    "role",
    "epoch",
    "peer",
    "peer_state",
    "last_seen",
    "trigger",
    "from_state",
    "to_state",
    "user",
    "command",
    "result",
    "peer_epoch",
    "reason",
)
_BUCKET_KEY = ("node", "bucket", "minute", "state")


def _keyed(lines: DataFrame) -> DataFrame:
    """The fields the report uses, the order rank, and the bucket key of redirects and
    refusals (``bulk``), on the node's own clock."""
    good = F.col("good")
    bulk = good & F.col("event").isin(*_BULK)
    return lines.select(
        "file",
        "good",
        "v",
        F.when(good, F.col("node")).alias("node"),
        "ts",
        _rank(F.col("event")).alias("rank"),
        "event",
        "state",
        "role",
        "epoch",
        "peer",
        "peer_state",
        "last_seen",
        "trigger",
        F.col("`from`").alias("from_state"),
        F.col("`to`").alias("to_state"),
        "user",
        "command",
        "result",
        "peer_epoch",
        "reason",
        F.when(good, F.floor(F.col("ts") / BUCKET_SECONDS)).alias("bucket"),
        F.when(bulk, F.floor(F.col("ts") / MINUTE) * MINUTE).alias("minute"),
        bulk.alias("bulk"),
    )


def _one_pass(events: DataFrame) -> DataFrame:
    """The only full pass over the parsed events: a row per file, node, bucket, minute and
    state of redirects and refusals, and per distinct other record (``special``, with its
    count in ``events``), with bad-line counts, the version check, the first and last time and
    the bulk records' span and counts. Every aggregate is fixed-width, so this is a plain hash
    aggregation: the records with text go into the key."""
    good, bulk, event = F.col("good"), F.col("bulk"), F.col("event")
    version_error = F.col("v").isNotNull() & (F.col("v") != SCHEMA_VERSION)
    return events.groupBy(
        "file",
        "node",
        "bucket",
        "minute",
        F.when(bulk, F.col("state")).alias("state"),
        F.when(good & ~bulk, F.struct(*_SPECIAL_FIELDS)).alias("special"),
    ).agg(
        F.sum((~good & ~version_error).cast("long")).alias("bad"),
        F.min(F.when(version_error, F.col("v"))).alias("bad_version"),
        F.sum(good.cast("long")).alias("events"),
        F.min(F.when(good, F.col("ts"))).alias("first"),
        F.max(F.when(good, F.col("ts"))).alias("last"),
        F.min(F.when(bulk, F.col("ts"))).alias("start"),
        F.max(F.when(bulk, F.col("ts"))).alias("end"),
        F.sum((bulk & (event == "redirect")).cast("long")).alias("redirects"),
        F.sum((bulk & (event == "refuse")).cast("long")).alias("refusals"),
    )


def _clock_evidence(raw_specials: DataFrame) -> ClockEvidence:
    """The peer_up/peer_lost records' clock bounds (on the records' own clocks)."""
    evidence = ClockEvidence()
    peers = raw_specials.filter(F.col("event").isin(*PEER_EVENTS))
    about_peer = F.col("last_seen").isNotNull() & (F.col("peer") != F.col("node"))
    for r in (
        peers.groupBy("node", F.when(about_peer, F.col("peer")).alias("peer"))
        .agg(
            F.max(F.col("role") == "primary").alias("primary"),
            F.max(F.when(about_peer, F.col("last_seen") - F.col("ts"))).alias("bound"),
        )
        .collect()
    ):
        evidence.add(r["node"], bool(r["primary"]), r["peer"], r["bound"])
    return evidence


def _mixed_buckets(buckets: DataFrame, specials: DataFrame) -> DataFrame:
    """Bucket keys whose span also holds another state's bulk records, or a record of another
    state, or a start: there, dropping the records between first and last would change the
    intervals."""
    other = buckets.select(
        "node",
        "bucket",
        F.col("state").alias("other_state"),
        F.col("start").alias("other_start"),
        F.col("end").alias("other_end"),
    )
    by_state = (
        buckets.join(other, ["node", "bucket"])
        .filter(
            (F.col("state") != F.col("other_state"))
            & (F.col("start") <= F.col("other_end"))
            & (F.col("other_start") <= F.col("end"))
        )
        .select(*_BUCKET_KEY)
    )
    carried = F.when(F.col("event") == "stopped", F.lit(DOWN)).otherwise(F.col("state"))
    marks = specials.select(
        "node",
        "bucket",
        F.col("ts").alias("mark"),
        carried.alias("mark_state"),
        (F.col("event") == "started").alias("mark_start"),
    )
    by_record = (
        buckets.join(marks, ["node", "bucket"])
        .filter(
            F.col("mark").between(F.col("start"), F.col("end"))
            & ((F.col("mark_state") != F.col("state")) | F.col("mark_start"))
        )
        .select(*_BUCKET_KEY)
    )
    return by_state.unionByName(by_record).distinct()


# ---------------------------------------------------------------- metrics


def _crashed_at_tail(records: DataFrame, lost: DataFrame) -> list[str]:
    """The nodes ``spark.model.crashed_at_tail`` takes as dead after their last sign of
    life: one aggregation over each node's (compressed) records and its peers' peer_lost."""
    nothing = F.lit(None)
    facts = records.select(
        "node", *_ORDER, nothing.cast("double").alias("claim"), nothing.cast("double").alias("seen")
    ).unionByName(
        lost.select(
            F.col("peer").alias("node"),
            nothing.cast("double").alias("ts"),
            nothing.cast("int").alias("rank"),
            nothing.cast("string").alias("event"),
            nothing.cast("string").alias("state"),
            F.col("ts").alias("claim"),
            F.col("last_seen").alias("seen"),
        )
    )
    key = F.when(F.col("event").isNotNull(), F.struct(*_ORDER))
    is_peer = F.col("event").isin(*PEER_EVENTS)
    rows = (
        facts.groupBy("node")
        .agg(
            F.max("ts").alias("last"),
            F.max_by("event", key).alias("last_event"),
            F.max_by(F.when(is_peer, F.col("event")), F.when(is_peer, key)).alias("last_peer"),
            F.max("claim").alias("claim"),
            F.max("seen").alias("seen"),
        )
        .collect()
    )
    return [
        r["node"]
        for r in rows
        if r["last"] is not None
        and crashed_at_tail(
            r["last_event"],
            r["last"] if r["seen"] is None else max(r["last"], r["seen"]),
            r["claim"],
            r["last_peer"],
        )
    ]


def _state_intervals(
    records: DataFrame,
    lost: DataFrame,
    node_names: DataFrame,
    crashed: Sequence[str],
    window: tuple[float, float],
) -> DataFrame:
    """Each node's states as maximal runs clipped to the window.

    A node's points are its records, an origin before them all (DOWN), and the signs of life
    its peers' peer_lost records give (their last_seen: the state carries on to there). A
    point holds its state until the next point, except that the gap before a ``started``
    is DOWN (a crash leaves no ``stopped``) and so is the tail of a node that crashed at the
    end of its log.
    """
    lo, hi = window
    blank = F.lit("")
    points = (
        records.select(
            "node",
            *_ORDER,
            F.when(F.col("event") == "stopped", F.lit(DOWN))
            .otherwise(F.col("state"))
            .alias("carried"),
        )
        .unionByName(
            lost.filter(F.col("last_seen").isNotNull()).select(
                F.col("peer").alias("node"),
                F.col("last_seen").alias("ts"),
                F.lit(RANK_MARKER).alias("rank"),
                blank.alias("event"),
                blank.alias("state"),
                F.lit(None).cast("string").alias("carried"),
            )
        )
        .unionByName(
            node_names.select(
                "node",
                F.lit(-_INF).alias("ts"),
                F.lit(RANK_ORIGIN).alias("rank"),
                blank.alias("event"),
                blank.alias("state"),
                F.lit(DOWN).alias("carried"),
            )
        )
    )
    next_ts = F.lead("ts").over(_node_order())
    held = (
        F.when(F.lead("rank").over(_node_order()) == RANK_STARTED, F.lit(DOWN))
        .when(next_ts.isNull() & F.col("node").isin(*crashed), F.lit(DOWN))
        .otherwise(F.last("carried", ignorenulls=True).over(_running(_node_order())))
    )
    pieces = points.select(
        "node",
        *_ORDER,
        held.alias("state_held"),
        F.greatest("ts", F.lit(lo)).alias("start"),
        F.least(F.coalesce(next_ts, F.lit(hi)), F.lit(hi)).alias("end"),
    ).filter(F.col("end") > F.col("start"))
    held_before = F.lag("state_held").over(_node_order())
    changed = F.coalesce(held_before != F.col("state_held"), F.lit(True)).cast("int")
    return (
        pieces.withColumn("run", F.sum(changed).over(_running(_node_order())))
        .groupBy("node", "run")
        .agg(
            F.min("state_held").alias("state"),
            F.min("start").alias("start"),
            F.max("end").alias("end"),
        )
        .withColumn("duration_s", F.col("end") - F.col("start"))
    )


def _state_time(
    spark: SparkSession, intervals: DataFrame, node_names: DataFrame, window: tuple[float, float]
) -> DataFrame:
    lo, hi = window
    states = spark.range(1).select(
        F.explode(F.array(*[F.lit(s) for s in REPORT_STATES])).alias("state")
    )
    seconds = F.coalesce(F.col("seconds"), F.lit(0.0))
    return (
        node_names.crossJoin(states)
        .join(
            intervals.groupBy("node", "state").agg(F.sum("duration_s").alias("seconds")),
            ["node", "state"],
            "left",
        )
        .select(
            "node",
            "state",
            seconds.alias("seconds"),
            (seconds / F.lit(hi - lo) if hi > lo else F.lit(None)).alias("fraction"),
        )
    )


def _spells(spark: SparkSession, intervals: DataFrame, window: tuple[float, float]) -> DataFrame:
    """Outages (no node ACTIVE) and dual-active spells (two or more), as ``kind``, start,
    end: a sweep over the ACTIVE runs' edges with a running count, then consecutive segments
    of one kind merged. The edges are few (two per ACTIVE run): one partition is fine."""
    lo, hi = window
    active = intervals.filter(F.col("state") == "ACTIVE")
    edges = (
        active.select(F.col("start").alias("t"), F.lit(1).alias("d"))
        .unionByName(active.select(F.col("end").alias("t"), F.lit(-1).alias("d")))
        .unionByName(
            spark.range(1).select(
                F.explode(F.array(F.lit(lo), F.lit(hi))).alias("t"), F.lit(0).alias("d")
            )
        )
        .groupBy("t")
        .agg(F.sum("d").alias("d"))
    )
    sweep = Window.orderBy("t")
    count = F.sum("d").over(_running(sweep))
    segments = edges.select(
        F.col("t").alias("start"),
        F.lead("t").over(sweep).alias("end"),
        F.when(count == 0, F.lit("outage")).when(count >= 2, F.lit("dual")).alias("kind"),
    ).filter(F.col("end").isNotNull())
    by_start = Window.orderBy("start")
    changed = F.coalesce(~F.lag("kind").over(by_start).eqNullSafe(F.col("kind")), F.lit(True)).cast(
        "int"
    )
    return (
        segments.withColumn("spell", F.sum(changed).over(_running(by_start)))
        .filter(F.col("kind").isNotNull())
        .groupBy("kind", "spell")
        .agg(F.min("start").alias("start"), F.max("end").alias("end"))
        .withColumn("duration_s", F.col("end") - F.col("start"))
    )


def _incidents(specials: DataFrame, in_window: Column) -> DataFrame:
    """Each peer_lost and what the survivor did next: ACTIVE already, a transition to
    ACTIVE (takeover), a restart or stop (survivor down), or nothing yet (unresolved)."""
    resolvers = specials.filter(
        F.col("event").isin("peer_lost", "started", "stopped")
        | ((F.col("event") == "transition") & (F.col("state") == "ACTIVE"))
    )
    was_active = F.col("state") == "ACTIVE"
    took_over = ~was_active & (F.col("next_event") == "transition")
    return (
        resolvers.select(
            "*",
            F.lead("event").over(_node_order()).alias("next_event"),
            F.lead("ts").over(_node_order()).alias("next_ts"),
            F.lead("trigger").over(_node_order()).alias("next_trigger"),
        )
        .filter((F.col("event") == "peer_lost") & in_window)
        .select(
            "node",
            "peer",
            "peer_state",
            "epoch",
            "last_seen",
            F.col("ts").alias("lost_ts"),
            (F.col("ts") - F.col("last_seen")).alias("detection_delay_s"),
            F.when(was_active, F.col("ts")).when(took_over, F.col("next_ts")).alias("active_ts"),
            F.when(was_active, F.lit("already_active"))
            .when(took_over, F.lit("takeover"))
            .when(F.col("next_event").isin("started", "stopped"), F.lit("survivor_down"))
            .otherwise(F.lit("unresolved"))
            .alias("outcome"),
            F.when(took_over, F.col("next_trigger")).alias("trigger"),
        )
        .withColumn("takeover_delay_s", F.col("active_ts") - F.col("lost_ts"))
    )


@dataclass
class SparkReport:
    summary: dict
    tables: dict[str, DataFrame]  # typed as spark.model.TABLES says
    small: dict[str, list[dict[str, Any]]]  # every table but redirects_per_minute, collected
    activity: list[dict[str, Any]]  # redirects + refusals per node in at most ~1500 buckets


def compute(
    spark: SparkSession,
    paths: Iterable[str],
    since: float | None = None,
    until: float | None = None,
    skew: Mapping[str, float] | None = None,
    estimate_skew: bool = True,
    progress: Progress = _quiet,
) -> SparkReport:
    started = time.monotonic()

    def step(message: str) -> None:
        progress(f"[{time.monotonic() - started:7.1f}s] {message}")

    files = expand_paths(paths)
    step(f"reading {len(files)} file(s)")
    lines = read_events(spark, [_uri(f) for f in files])
    groups = _one_pass(_keyed(lines)).cache()
    per_file = (
        groups.groupBy("file")
        .agg(F.sum("bad").alias("bad"), F.min("bad_version").alias("bad_version"))
        .collect()
    )
    versions = sorted(
        (local_path(r["file"]), r["bad_version"]) for r in per_file if r["bad_version"] is not None
    )
    if versions:
        groups.unpersist()
        raise UnknownVersionError(*versions[0])
    bad_by_file = {local_path(r["file"]): r["bad"] for r in per_file if r["bad"]}
    per_node = (
        groups.filter(F.col("node").isNotNull())
        .groupBy("node")
        .agg(
            F.sum("events").alias("events"),
            F.min("first").alias("first"),
            F.max("last").alias("last"),
        )
        .collect()
    )
    nodes = sorted(r["node"] for r in per_node)
    count = sum(r["events"] for r in per_node)
    step(f"{count} events from {len(nodes)} node(s), {sum(bad_by_file.values())} bad line(s)")

    repeated = F.array_repeat("special", F.col("events").cast("int"))  # identical records
    raw_specials = (
        groups.filter(F.col("special").isNotNull())
        .select("node", "bucket", F.explode(repeated).alias("r"))
        .select("node", "bucket", "r.*")
    )
    given = dict(skew or {})
    evidence = _clock_evidence(raw_specials) if estimate_skew else ClockEvidence()
    offsets, warnings = estimate_offsets(nodes, evidence, given, estimate_skew)
    base = evidence.default_offset(given)
    shifts = {node: o.seconds for node, o in offsets.items()}
    if any(shifts.values()):
        step(
            "clock offsets: "
            + ", ".join(f"{n} {o.seconds:+.6f}s ({o.source})" for n, o in offsets.items())
        )
    window = report_window(
        since,
        until,
        min((r["first"] - shifts[r["node"]] for r in per_node), default=None),
        max((r["last"] - shifts[r["node"]] for r in per_node), default=None),
    )
    shift = _lookup(shifts, F.col("node"), base)

    # What follows works on small frames: few partitions keep the task count down.
    parallelism = spark.sparkContext.defaultParallelism
    specials = (
        raw_specials.withColumns(
            {
                "ts": F.col("ts") - shift,
                "last_seen": F.col("last_seen") - _lookup(shifts, F.col("peer"), base),
            }
        )
        .coalesce(parallelism)
        .cache()
    )
    buckets = (
        groups.filter(F.col("state").isNotNull())
        .groupBy(*_BUCKET_KEY)
        .agg(
            (F.min("start") - shift).alias("start"),
            (F.max("end") - shift).alias("end"),
            F.sum("redirects").alias("redirects"),
            F.sum("refusals").alias("refusals"),
        )
        .cache()
    )
    transient = [groups, specials, buckets]
    frames = {name: spark.createDataFrame([], _schema(name)) for name in TABLES}
    dual_events = spark.createDataFrame([], "ts double")

    if window is not None:
        lo, hi = window
        in_window = F.col("ts").between(lo, hi)
        step(f"window {lo:.3f} .. {hi:.3f} ({hi - lo:.3f}s)")
        # Minutes are the node's own; a minute is listed when it overlaps the window.
        minute_start = F.col("minute") - shift
        per_minute = (
            buckets.groupBy("node", "minute")
            .agg(F.sum("redirects").alias("redirects"), F.sum("refusals").alias("refusals"))
            .filter((minute_start <= hi) & (minute_start + MINUTE > lo))
            .select(
                "node",
                F.col("minute").alias("minute_start"),
                F.date_format(F.timestamp_seconds("minute"), "yyyy-MM-dd'T'HH:mm:00'Z'").alias(
                    "minute"
                ),
                "redirects",
                "refusals",
            )
        )
        mixed = _mixed_buckets(buckets, specials).cache()
        transient.append(mixed)
        edges = buckets.join(mixed, list(_BUCKET_KEY), "left_anti").select(
            "node",
            F.explode(F.array_distinct(F.array("start", "end"))).alias("ts"),
            F.lit(RANK_RECORD).alias("rank"),
            F.lit("redirect").alias("event"),
            "state",
        )
        records = specials.select("node", *_ORDER).unionByName(edges)
        if not mixed.isEmpty():
            step("reading mixed buckets again in full")
            records = records.unionByName(
                _keyed(lines)
                .filter("bulk")
                .join(F.broadcast(mixed), list(_BUCKET_KEY))
                .select("node", (F.col("ts") - shift).alias("ts"), *_ORDER[1:])
            )
        records = records.coalesce(parallelism).cache()
        transient.append(records)
        lost = specials.filter(
            (F.col("event") == "peer_lost")
            & F.col("peer").isin(*nodes)
            & (F.col("peer") != F.col("node"))
        )
        crashed = _crashed_at_tail(records, lost)
        node_names = spark.createDataFrame([(n,) for n in nodes], "node string")
        intervals = _typed(
            "state_intervals", _state_intervals(records, lost, node_names, crashed, window)
        ).cache()
        spells = _spells(spark, intervals, window).cache()  # both read by several tables
        transient += [intervals, spells]
        windowed = specials.filter(in_window)
        frames = {
            "incidents": _incidents(specials, in_window),
            "outages": spells.filter(F.col("kind") == "outage"),
            "dual_active": spells.filter(F.col("kind") == "dual"),
            "state_intervals": intervals,
            "state_time": _state_time(spark, intervals, node_names, window),
            "redirects_per_minute": per_minute,
            "recoveries": windowed.filter(
                ((F.col("event") == "console") & F.col("command").rlike(RECOVER_COMMAND))
                | ((F.col("event") == "transition") & F.col("trigger").isin(*RECOVERY_TRIGGERS))
            ),
            "misconfigurations": windowed.filter(F.col("event") == "misconfigured"),
        }
        frames = {name: _typed(name, df) for name, df in frames.items()}
        dual_events = windowed.filter(F.col("event") == "dual_active").select("ts")

    step("state intervals, outages, incidents, recoveries")
    small = _collect_small(
        {n: df for n, df in frames.items() if n != "redirects_per_minute"},
        dual_events,
    )
    n_dual_events = len(small.pop(_DUAL_EVENTS))
    step("redirects and refusals per minute")
    per_minute = frames["redirects_per_minute"].cache()
    activity = _activity(per_minute, window, shift)  # also fills per_minute's cache
    for df in transient:
        df.unpersist()
    tables = {
        name: per_minute
        if name == "redirects_per_minute"
        else spark.createDataFrame(
            [tuple(row[c] for c in frames[name].columns) for row in small[name]], _schema(name)
        )
        for name in TABLES
    }
    summary = build_summary(
        files=files,
        events=count,
        bad_lines_by_file=bad_by_file,
        nodes=nodes,
        offsets=offsets,
        warnings=warnings,
        window=window,
        tables=small,
        redirects=sum(a["redirects"] for a in activity),
        refusals=sum(a["refusals"] for a in activity),
        dual_active_events=n_dual_events,
    )
    step("computed")
    return SparkReport(summary, tables, small, activity)


_DUAL_EVENTS = "dual_active events"


def _collect_small(frames: Mapping[str, DataFrame], dual_events: DataFrame) -> dict[str, list]:
    """Every small table in one Spark job: rows as JSON, tagged with their table (one job
    instead of one per table; shuffles shared between tables are computed once)."""
    tagged = [
        df.select(F.lit(name).alias("table"), F.to_json(F.struct(*df.columns)).alias("row"))
        for name, df in {**frames, _DUAL_EVENTS: dual_events}.items()
    ]
    found: dict[str, list] = {name: [] for name in (*frames, _DUAL_EVENTS)}
    for row in functools.reduce(DataFrame.unionByName, tagged).collect():
        found[row["table"]].append(json.loads(row["row"]))
    for name, df in frames.items():
        _, order = TABLES[name]
        rows = [{c: r.get(c) for c in df.columns} for r in found[name]]  # to_json drops nulls
        found[name] = sorted(rows, key=lambda row: tuple(row[c] for c in order))
    return found


def _schema(name: str) -> T.StructType:
    columns, _ = TABLES[name]
    return T.StructType([T.StructField(c, _TYPES[k]) for c, k in columns])


def _activity(
    per_minute: DataFrame, window: tuple[float, float] | None, shift: Column
) -> list[dict[str, Any]]:
    """Redirects and refusals per node in buckets of whole minutes, few enough to plot;
    ``at`` is a bucket's start on the reference clock."""
    if window is None:
        return []
    width = max(1, math.ceil((window[1] - window[0]) / MINUTE / 1500)) * MINUTE
    buckets = [
        row.asDict()
        for row in per_minute.groupBy(
            "node", (F.floor(F.col("minute_start") / width) * width).alias("bucket")
        )
        .agg(F.sum("redirects").alias("redirects"), F.sum("refusals").alias("refusals"))
        .select("*", F.lit(width).alias("width"), (F.col("bucket") - shift).alias("at"))
        .collect()
    ]
    return sorted(buckets, key=lambda row: (row["node"], row["bucket"]))


# ---------------------------------------------------------------- output


def write_report(report: SparkReport, out: str, progress: Progress = _quiet) -> None:
    """Tables as ``<out>/<table>/parquet/`` (Spark) and ``<out>/<table>/<table>.csv``, then
    ``summary.json`` and ``timeline.png``. ``out`` is a directory on the driver; on a
    cluster it must be on a file system the executors share (they write the Parquet parts)."""
    os.makedirs(out, exist_ok=True)
    for name, df in report.tables.items():
        progress(f"writing {name}")
        folder = os.path.join(out, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        # Small tables were built on the driver in order: one partition keeps it.
        ordered = df.coalesce(1) if name in report.small else _sorted(name, df)
        ordered.write.parquet(_uri(os.path.abspath(os.path.join(folder, "parquet"))))
        rows = (
            ([r[c] for c in df.columns] for r in report.small[name])
            if name in report.small
            else (tuple(r) for r in ordered.toLocalIterator())
        )
        write_csv(os.path.join(folder, f"{name}.csv"), df.columns, rows)
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as stream:
        json.dump(report.summary, stream, indent=2, sort_keys=False)
        stream.write("\n")
    progress("drawing timeline.png")
    timeline.render(
        os.path.join(out, "timeline.png"),
        report.summary,
        report.small,
        report.activity,
    )


def run_report(
    paths: Iterable[str],
    out: str,
    master: str | None = "local[*]",
    since: float | None = None,
    until: float | None = None,
    skew: Mapping[str, float] | None = None,
    estimate_skew: bool = True,
    conf: Mapping[str, str] | None = None,
    progress: Progress = _quiet,
    echo: Callable[[str], None] | None = None,
) -> dict:
    """Compute the report, write it to ``out`` and return the summary.

    Reuses an active Spark session (a test's, spark-submit's) and leaves it running; otherwise
    starts one on ``master`` with Spark's console output in ``<out>/spark.log`` and stops it.
    ``echo`` receives the human summary.
    """
    paths = list(paths)
    if not paths:
        raise ReportError("no --events given")
    os.makedirs(out, exist_ok=True)
    spark = SparkSession.getActiveSession()
    owned = spark is None
    if spark is None:
        progress(f"starting Spark ({master or 'from spark-submit'}); its log: {out}/spark.log")
        spark = build_session(master, os.path.join(out, "spark.log"), conf)
    try:
        report = compute(spark, paths, since, until, skew, estimate_skew, progress)
        write_report(report, out, progress)
    finally:
        if owned:
            spark.stop()
    if echo is not None:
        echo(render_text(report.summary, report.small))
    return report.summary
