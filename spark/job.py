"""The failover report as a Spark job.

Owns: the Spark session (quiet, loopback-only and UI-less when local; started while Python
prepares the pictures, and ended with its JVM when the report is done), reading the event logs
with an explicit schema, reducing them to what the figures need, and writing the report
(Parquet tables partitioned by pair and day, CSV copies, ``summary.json``, pictures).

The logs are read once, in one hash aggregation that keeps every record but the bulk of
redirects and refusals, which it reduces to per-second spans and per-minute counts (see "the
one pass"). A window over each node's spans and records then keeps only the first and last
point of each run of bulk records. What reaches the driver is therefore the non-bulk records,
two points per run and aggregates: its size follows the number of failovers, not of events.
The figures are computed from it by ``spark.metrics``, the same code ``spark.reference`` runs
on every record, so the two must agree. A small input is read in one job instead, every
record to the driver, where the figures are computed as the reference computes them (see
``WHOLE_INPUT_BYTES``). No Python UDFs and no data made from Python objects: executors run no
Python. Shuffle partitions are sized to the input on every master. The tables on the driver
are written by the driver (``spark.parquet``). See docs/report.md.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark import jvm, pages, parquet, replayed, timeline
from spark.metrics import Collected, PairInput, pair_clocks, pair_report, report_of
from spark.model import (
    CORRUPT_COLUMN,
    DAY_SECONDS,
    DOWN,
    FIELDS,
    MINUTE,
    PAIR_DIRECTORY,
    RANK_RECORD,
    RANK_STARTED,
    RANK_STOPPED,
    SCHEMA_VERSION,
    STATES,
    TABLES,
    UNRECORDED_MAX,
    ReportError,
    UnknownVersionError,
    expand_paths,
    local_path,
    no_valid_record,
    unnamed_pair,
    write_csv,
)
from spark.runs import record_key
from spark.summary import build_summary
from spark.text import render_text

_TYPES = {
    "long": T.LongType(),
    "double": T.DoubleType(),
    "string": T.StringType(),
    "boolean": T.BooleanType(),
}
SCHEMA = T.StructType(
    [T.StructField(name, _TYPES[kind]) for name, kind in FIELDS]
    + [T.StructField(CORRUPT_COLUMN, T.StringType())]
)
_BULK = ("redirect", "refuse")
_ORDER = ("ts", "rank", "event", "state")  # a node's points, as in spark.reference
_NODE = ("pair", "node")
_INF = float("inf")
# One shuffle partition per this much input, at most two per core: the frames after the pass
# are small, and every partition is a task in every stage.
BYTES_PER_PARTITION = 128 << 20
ACTIVITY_BARS = 1500  # about this many bars of redirects over a timeline's window
# The input is files already found (a month of one pair is 60, of a fleet thousands): Spark
# looks up this many paths itself rather than with a Spark job of its own, which costs a small
# run seconds (Spark's default is 32).
DRIVER_LISTING = 4096

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
        "spark.sql.sources.parallelPartitionDiscovery.threshold": str(DRIVER_LISTING),
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


def _input_bytes(spark: SparkSession, uris: Sequence[str]) -> tuple[int, int]:
    """The input's size through Hadoop's file systems (local, hdfs://, s3a://, ...): bytes of
    plain files, and of gzip files."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    plain = packed = 0
    for uri in uris:
        path = jvm.org.apache.hadoop.fs.Path(uri)
        for status in path.getFileSystem(conf).globStatus(path) or []:
            if status.getPath().getName().endswith(".gz"):
                packed += status.getLen()
            else:
                plain += status.getLen()
    return plain, packed


def fit_partitions(spark: SparkSession, input_bytes: int, user: Mapping[str, str]) -> int:
    """Shuffle partitions sized to the input, on every master, unless ``--conf`` set them;
    no adaptive re-planning, whose cost per stage is above what it saves on small frames."""
    cores = spark.sparkContext.defaultParallelism
    partitions = max(1, min(2 * cores, math.ceil(input_bytes / BYTES_PER_PARTITION)))
    if "spark.sql.shuffle.partitions" not in user:
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    if "spark.sql.adaptive.enabled" not in user:
        spark.conf.set("spark.sql.adaptive.enabled", "false")
    return int(spark.conf.get("spark.sql.shuffle.partitions"))


# ---------------------------------------------------------------- reading

_JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": CORRUPT_COLUMN,
    "allowSingleQuotes": "false",
}


def _uri(path: str) -> str:
    # Unescaped: Hadoop's Path quotes what a URI needs itself (a pair=NAME directory keeps
    # its "=", a space its space).
    return f"file://{path}" if os.path.isabs(path) else path


def _good() -> Column:
    """Parsed, typed and complete: what ``spark.reference`` calls a good line."""
    ts, last_seen, unrecorded = F.col("ts"), F.col("last_seen"), F.col("unrecorded")
    return F.coalesce(
        F.col(CORRUPT_COLUMN).isNull()
        & (F.col("v") == SCHEMA_VERSION)
        & (F.abs(ts) < _INF)  # also false for null and NaN
        & (F.length("node") > 0)
        & (F.length("event") > 0)
        & F.col("state").isin(*STATES)
        & (last_seen.isNull() | (F.abs(last_seen) < _INF))
        & (unrecorded.isNull() | unrecorded.between(0, UNRECORDED_MAX)),
        F.lit(False),
    )


def read_events(spark: SparkSession, uris: Sequence[str]) -> DataFrame:
    """Every line as a row: the v1 fields (explicit schema, PERMISSIVE, corrupt-record column),
    ``file``, ``good`` and the pair named by the record or, failing that, by a ``pair=NAME``
    directory in the file's path (null when neither names one)."""
    raw = (
        spark.read.schema(SCHEMA)
        .options(**_JSON_OPTIONS)
        .json(list(uris))
        .withColumn("file", F.col("_metadata.file_path"))
    )
    from_path = F.regexp_extract("file", PAIR_DIRECTORY, 1)
    named = F.when(F.length("pair") > 0, F.col("pair")).when(
        F.length(from_path) > 0, F.expr(f"url_decode(regexp_extract(file, '{PAIR_DIRECTORY}', 1))")
    )
    return raw.withColumn("good", _good()).withColumn("pair", named)


def _rank(event: Column) -> Column:
    return (
        F.when(event == "started", RANK_STARTED)
        .when(event == "stopped", RANK_STOPPED)
        .otherwise(RANK_RECORD)
    )


def _lookup(values: Mapping[str, Any], key: Column) -> Column:
    table = F.create_map(*[x for k, v in values.items() for x in (F.lit(k), F.lit(v))])
    return table[key]


def _running(order: Window) -> Window:
    return order.rowsBetween(Window.unboundedPreceding, Window.currentRow)


# ---------------------------------------------------------------- the one pass over events

# The bulk of a log is redirects and refusals. The pass keeps, per node, one-second bucket,
# minute and state, only their first and last time and their counts; every other record is
# kept whole. Between its first and last time a bucket's state holds, so the records in
# between add nothing to the state runs, unless a record of another state or a start falls in
# that span too: such "mixed" buckets are read again in full (rare: it takes a state change
# in the middle of a stream of redirects within one second). Everything is on each node's
# own clock: offsets are estimated on the driver and applied there.
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
    "from",
    "to",
    "user",
    "command",
    "result",
    "peer_epoch",
    "reason",
    "side",
    "sync",
    "messages",
    "path",
    "evidence",
    "kind",
    "link",
    "upstream",
    "gap",
)
_BUCKET_KEY = ("pair", "node", "bucket", "minute", "state")


def _stands_for(bulk: Column) -> Column:
    """How many redirects or refusals a bulk record counts for: itself and the ones of its
    kind its server left out before it (``unrecorded``, null for none)."""
    return F.when(bulk, F.coalesce(F.col("unrecorded"), F.lit(0)) + 1)


def _keyed(lines: DataFrame) -> DataFrame:
    """The fields the report uses, the order rank, and the bucket key of redirects and
    refusals (``bulk``) with how many each counts for (``stands_for``), on the node's own
    clock."""
    good = F.col("good")
    bulk = good & F.col("event").isin(*_BULK)
    fields = [F.col(f"`{f}`") for f in _SPECIAL_FIELDS if f != "rank"]
    return lines.select(
        "file",
        "good",
        "v",
        "pair",
        F.when(good, F.col("node")).alias("node"),
        _rank(F.col("event")).alias("rank"),
        *fields,
        F.when(good, F.floor(F.col("ts") / BUCKET_SECONDS)).alias("bucket"),
        F.when(bulk, F.floor(F.col("ts") / MINUTE) * MINUTE).alias("minute"),
        bulk.alias("bulk"),
        _stands_for(bulk).alias("stands_for"),
    )


def _one_pass(events: DataFrame) -> DataFrame:
    """The only full pass over the parsed events: a row per file, pair, node, bucket, minute
    and state of redirects and refusals, and per distinct other record (``special``, with its
    count in ``events``), with bad-line counts, the version check and the bulk records' span
    and counts (of what they stand for: ``events`` counts records, ``redirects`` and
    ``refusals`` the ones left out too). Every aggregate is fixed-width, so this is a plain
    hash aggregation: the records with text go into the key."""
    good, bulk, event = F.col("good"), F.col("bulk"), F.col("event")
    stands_for = F.col("stands_for")
    version_error = F.col("v").isNotNull() & (F.col("v") != SCHEMA_VERSION)
    return events.groupBy(
        "file",
        F.when(good, F.col("pair")).alias("pair"),
        "node",
        "bucket",
        "minute",
        F.when(bulk, F.col("state")).alias("state"),
        F.when(good & ~bulk, F.struct(*[F.col(f"`{f}`") for f in _SPECIAL_FIELDS])).alias(
            "special"
        ),
    ).agg(
        F.sum((~good & ~version_error).cast("long")).alias("bad"),
        F.min(F.when(version_error, F.col("v"))).alias("bad_version"),
        F.sum(good.cast("long")).alias("events"),
        F.min(F.when(bulk, F.col("ts"))).alias("start"),
        F.max(F.when(bulk, F.col("ts"))).alias("end"),
        # Which event the first and last are (a tie orders "redirect" before "refuse"), so the
        # kept ends sort among other records exactly as the records they stand for.
        F.min(F.when(bulk & (event == "redirect"), F.col("ts"))).alias("first_redirect"),
        F.max(F.when(bulk & (event == "refuse"), F.col("ts"))).alias("last_refusal"),
        F.sum(F.when(bulk & (event == "redirect"), stands_for).otherwise(0)).alias("redirects"),
        F.sum(F.when(bulk & (event == "refuse"), stands_for).otherwise(0)).alias("refusals"),
    )


def _edges(buckets: DataFrame) -> DataFrame:
    """A bucket's first and last record as points, with the bucket's key."""
    first = F.struct(
        F.col("start").alias("ts"),
        F.when(F.col("first_redirect") == F.col("start"), F.lit("redirect"))
        .otherwise(F.lit("refuse"))
        .alias("event"),
    )
    last = F.struct(
        F.col("end").alias("ts"),
        F.when(F.col("last_refusal") == F.col("end"), F.lit("refuse"))
        .otherwise(F.lit("redirect"))
        .alias("event"),
    )
    return buckets.select(
        *_BUCKET_KEY, F.explode(F.array_distinct(F.array(first, last))).alias("p")
    ).select(
        *_BUCKET_KEY,
        "p.ts",
        F.lit(RANK_RECORD).alias("rank"),
        "p.event",
        F.lit(True).alias("bulk"),
    )


def _reduce(points: DataFrame) -> DataFrame:
    """One sort of each node's points (bulk buckets' ends, bulk records, other records) and
    two running counts over it:

    - ``run``: a run of bulk points is consecutive, of one state, with no other record
      between; only its first and last point are kept (``end`` rows), as the ones between
      change nothing;
    - ``phase``: a change of the state carried, or a start; a bucket whose two ends are not
      in one phase had something else happen inside its span, so its inside matters and is
      read again (``mixed`` rows, with the bucket's key).
    """
    order = Window.partitionBy(*_NODE).orderBy(*_ORDER)
    bulk = F.col("bulk")
    carried = F.when(F.col("event") == "stopped", F.lit(DOWN)).otherwise(F.col("state"))
    before = F.lag(F.struct(bulk.alias("bulk"), F.col("state"), carried.alias("carried"))).over(
        order
    )
    new_run = (
        ~bulk | ~F.coalesce(before["bulk"], F.lit(False)) | (before["state"] != F.col("state"))
    )
    new_phase = F.coalesce(before["carried"] != carried, F.lit(True)) | (
        F.col("event") == "started"
    )
    key = F.struct(*_ORDER)
    marked = points.select(
        "*",
        F.sum(new_run.cast("long")).over(_running(order)).alias("run"),
        F.sum(new_phase.cast("long")).over(_running(order)).alias("phase"),
    ).filter(bulk)
    ends = (
        marked.groupBy(*_NODE, "run")
        .agg(F.min(key).alias("first"), F.max(key).alias("last"))
        .select(*_NODE, F.explode(F.array_distinct(F.array("first", "last"))).alias("p"))
        .select(F.lit("end").alias("kind"), *_NODE, "p.*")
    )
    mixed = (
        marked.filter(F.col("bucket").isNotNull())
        .groupBy(*_BUCKET_KEY)
        .agg((F.min("phase") != F.max("phase")).alias("mixed"))
        .filter("mixed")
        .select(F.lit("mixed").alias("kind"), *_BUCKET_KEY)
    )
    return ends.unionByName(mixed, allowMissingColumns=True)


@dataclass
class SparkReport:
    summary: dict
    tables: dict[str, list[dict[str, Any]]]  # the tables on the driver, sorted
    # redirects_per_minute when it stays in Spark (large inputs), typed as spark.model.TABLES
    # says; None when it is in ``tables``
    per_minute: DataFrame | None
    activity: dict[str, list[dict[str, Any]]]  # the drawn pairs' redirects, few bars each
    single: bool = True  # one pair drawn as timeline.png (one pair read, or --pair)

    def release(self) -> None:
        if self.per_minute is not None:
            self.per_minute.unpersist()


def _collect_json(frames: Mapping[str, DataFrame]) -> dict[str, list[dict[str, Any]]]:
    """Several small frames in one Spark job: rows as JSON, tagged with their frame."""
    tagged = [
        df.select(F.lit(name).alias("frame"), F.to_json(F.struct(*df.columns)).alias("row"))
        for name, df in frames.items()
    ]
    union = tagged[0]
    for df in tagged[1:]:
        union = union.unionByName(df)
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in frames}
    for row in union.collect():
        found[row["frame"]].append(json.loads(row["row"]))
    return found


def compute(
    spark: SparkSession,
    paths: Iterable[str],
    since: float | None = None,
    until: float | None = None,
    skew: Mapping[str, float] | None = None,
    estimate_skew: bool = True,
    progress: Progress = _quiet,
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
    chosen = pair

    def step(message: str) -> None:
        progress(f"[{time.monotonic() - started:7.1f}s] {message}")

    files = expand_paths(paths)
    uris = [_uri(f) for f in files]
    plain, packed = _input_bytes(spark, uris)
    partitions = fit_partitions(spark, plain + packed, conf or {})
    lines = read_events(spark, uris)
    if whole is None:
        whole = plain + GZIP_RATIO * packed <= WHOLE_INPUT_BYTES
    if whole:
        step(f"reading {len(files)} file(s) in one job, every record to the driver")
        collected = _collect_whole(lines, files)
        step(f"{collected.count} events, {sum(collected.bad_by_file.values())} bad")
        summary, tables, clocks = report_of(collected, since, until, skew or {}, estimate_skew, slo)
        drawn = _drawn(chosen, summary)
        activity = {
            name: _bars(
                [r for r in tables["redirects_per_minute"] if r["pair"] == name],
                clocks[name].window,
            )
            for name in drawn
        }
        step("computed")
        return SparkReport(summary, tables, None, activity, chosen is not None or len(clocks) == 1)
    step(f"reading {len(files)} file(s), {partitions} shuffle partition(s)")
    groups = _one_pass(_keyed(lines)).cache()
    specials_df = groups.filter(F.col("special").isNotNull()).select(
        "pair", "node", "bucket", "events", "special.*"
    )
    buckets = groups.filter(F.col("state").isNotNull()).select(
        *_BUCKET_KEY, "start", "end", "first_redirect", "last_refusal", "redirects", "refusals"
    )
    special_points = specials_df.select(
        *_NODE,
        *_ORDER,
        F.lit(None).cast("long").alias("bucket"),
        F.lit(None).cast("long").alias("minute"),
        F.lit(False).alias("bulk"),
    )
    # The run ends need nothing from the driver: they come in the same job as the rest.
    head = _collect_json(
        {
            "files": groups.groupBy("file").agg(
                F.sum("bad").alias("bad"), F.min("bad_version").alias("bad_version")
            ),
            "nodes": groups.filter(F.col("node").isNotNull())
            .groupBy(*_NODE)
            .agg(F.sum("events").alias("events")),
            "specials": specials_df,
            "rows": _reduce(_edges(buckets).unionByName(special_points)),
        }
    )
    versions = sorted(
        (local_path(r["file"]), r["bad_version"])
        for r in head["files"]
        if r.get("bad_version") is not None
    )
    if versions:
        groups.unpersist()
        raise UnknownVersionError(*versions[0])
    bad_by_file = {local_path(r["file"]): r["bad"] for r in head["files"] if r["bad"]}
    count = sum(r["events"] for r in head["nodes"])
    if count == 0:
        groups.unpersist()
        raise no_valid_record(files, sum(bad_by_file.values()))
    unnamed = unnamed_pair(r["node"] for r in head["nodes"] if r.get("pair") is None)
    step(f"{count} events from {len(head['nodes'])} node(s), {sum(bad_by_file.values())} bad")

    # Runs of bulk points reduced to their ends, on the executors; buckets with something
    # else inside (rare) are read again and their records take the place of their ends.
    reduced = {"rows": head["rows"]}
    mixed = [r for r in reduced["rows"] if r["kind"] == "mixed"]
    if mixed:
        step(f"reading {len(mixed)} bucket(s) with a state change inside again in full")
        keys = F.concat_ws(
            "\u0000", *[F.coalesce(F.col(c).cast("string"), F.lit("")) for c in _BUCKET_KEY]
        )
        listed = [
            "\u0000".join(str(r[c]) if r.get(c) is not None else "" for c in _BUCKET_KEY)
            for r in mixed
        ]
        inside = keys.isin(listed)
        whole = (
            _keyed(lines)
            .filter(F.col("bulk") & inside)
            .select(*_BUCKET_KEY, "ts", "rank", "event", F.lit(True).alias("bulk"))
        )
        points = _edges(buckets.filter(~inside)).unionByName(whole).unionByName(special_points)
        reduced = _collect_json({"rows": _reduce(points)})
    reduced = [r for r in reduced["rows"] if r["kind"] == "end"]

    def pair_of(row: Mapping[str, Any]) -> str:
        return row.get("pair") or unnamed

    inputs: dict[str, PairInput] = {}
    for row in head["nodes"]:
        pair = inputs.setdefault(pair_of(row), PairInput(pair_of(row), {}, {}, 0))
        pair.points.setdefault(row["node"], [])
        pair.records.setdefault(row["node"], [])
        pair.events += row["events"]
    for row in head["specials"]:
        record = {k: row.get(k) for k in _SPECIAL_FIELDS if k != "rank"}
        point = (row["ts"], row["rank"], row["event"], row["state"])
        pair = inputs[pair_of(row)]
        for _ in range(row["events"]):  # identical records were counted, not kept
            pair.records[row["node"]].append(dict(record))
            pair.points[row["node"]].append(point)
    for row in reduced:
        inputs[pair_of(row)].points[row["node"]].append(
            (row["ts"], row["rank"], row["event"], row["state"])
        )
    for pair in inputs.values():
        for node in pair.points:
            pair.points[node].sort()
            pair.records[node].sort(key=record_key)
    step(f"{len(inputs)} pair(s), {len(reduced)} run end(s) of redirects and refusals")

    clocks = {
        name: pair_clocks(pair, since, until, skew or {}, estimate_skew)
        for name, pair in inputs.items()
    }
    shifts = {
        f"{name}\u0000{node}": o.seconds
        for name, c in clocks.items()
        for node, o in c.offsets.items()
    }
    windows_lo = {name: c.window[0] for name, c in clocks.items()}
    windows_hi = {name: c.window[1] for name, c in clocks.items()}
    named = F.coalesce(F.col("pair"), F.lit(unnamed))
    at = F.col("minute") - _lookup(shifts, F.concat_ws("\u0000", named, F.col("node")))
    per_minute = (
        buckets.groupBy("pair", "node", "minute")
        .agg(F.sum("redirects").alias("redirects"), F.sum("refusals").alias("refusals"))
        .withColumn("at", at)
        .withColumn("pair", named)
        .filter(
            (F.col("at") <= _lookup(windows_hi, F.col("pair")))
            & (F.col("at") + MINUTE > _lookup(windows_lo, F.col("pair")))
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
    if chosen is not None and chosen not in clocks:
        raise ReportError(f"--pair {chosen}: no such pair (pairs: {', '.join(sorted(clocks))})")
    by_day_rows = _collect_json(
        {
            "days": per_minute.groupBy("pair", "day").agg(
                F.sum("redirects").alias("redirects"), F.sum("refusals").alias("refusals")
            )
        }
    )["days"]
    by_day: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for row in by_day_rows:
        by_day[row["pair"]][row["day"]] = (row["redirects"], row["refusals"])
    groups.unpersist()

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
    summary = build_summary(
        files=files,
        events=count,
        bad_lines_by_file=bad_by_file,
        pairs=summaries,
        daily=small["daily"],
        takeover_delays=[
            f["takeover_delay_s"] for f in small["failovers"] if f["takeover_delay_s"] is not None
        ],
        slo=slo,
    )
    drawn = _drawn(chosen, summary)
    activity: dict[str, list[dict[str, Any]]] = {name: [] for name in drawn}
    if drawn:
        # The drawn pairs' redirects grouped into bars, each pair's from its window's start.
        starts = {name: clocks[name].window[0] for name in drawn}
        widths = {name: _bar_width(*clocks[name].window) for name in drawn}
        lo = _lookup(starts, F.col("pair"))
        width = _lookup(widths, F.col("pair"))
        bars = (
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
        for row in sorted(
            _collect_json({"bars": bars})["bars"], key=lambda r: (r["pair"], r["node"], r["at"])
        ):
            activity[row.pop("pair")].append(row)
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


def timeline_name(pair: str) -> str:
    """``timeline-PAIR.png``, the pair's name made safe for a file name."""
    return "timeline-" + re.sub(r"[^A-Za-z0-9._+=-]", "_", pair) + ".png"


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


# Inputs up to this size (plain text; gzip counted as GZIP_RATIO times its size) are read in
# one Spark job that brings every parsed record to the driver, about 100 bytes each there,
# and the figures are computed as the reference computes them: on a small input the fixed
# cost of Spark jobs and stages, not the records, is the time.
WHOLE_INPUT_BYTES = 16 << 20
GZIP_RATIO = 10
_WHOLE_FIELDS = [f for f in _SPECIAL_FIELDS if f not in ("ts", "rank", "event", "state")]


def _collect_whole(lines: DataFrame, files: Sequence[str]) -> Collected:
    """Every line in one job: bad lines as their file and version, good ones as their
    point, with their other fields when they are not redirects or refusals, and with what
    they left out (``unrecorded``) when they are."""
    good = F.col("good")
    bulk = good & F.col("event").isin(*_BULK)
    whole = good & ~bulk
    rows = lines.select(
        "file",
        "good",
        F.when(~good, F.col("v")).alias("v"),
        F.when(good, F.col("pair")).alias("pair"),
        *[F.when(good, F.col(c)).alias(c) for c in ("node", "ts", "event", "state")],
        *[F.when(whole, F.col(f"`{f}`")).alias(f) for f in _WHOLE_FIELDS],
        F.when(bulk, F.col("unrecorded")).alias("unrecorded"),
    ).collect()
    collected = Collected(list(files))
    bad: dict[str, int] = defaultdict(int)
    versions = []
    for row in rows:
        if not row[1]:
            version = row[2]
            if version is not None and version != SCHEMA_VERSION:
                versions.append((local_path(row[0]), version))
            else:
                bad[row[0]] += 1
            continue
        record = {"node": row[4], "ts": row[5], "event": row[6], "state": row[7]}
        if record["event"] in _BULK:
            record["unrecorded"] = row[-1]
        else:
            record.update(zip(_WHOLE_FIELDS, row[8:-1], strict=True))
        collected.add(row[3], row[4], record)
    if versions:
        raise UnknownVersionError(*min(versions))
    by_path = {local_path(uri): count for uri, count in bad.items()}
    collected.bad_by_file = {f: by_path[f] for f in files if f in by_path}
    if collected.count == 0:
        raise no_valid_record(files, sum(by_path.values()))
    return collected


# ---------------------------------------------------------------- output


def table_schema(name: str) -> T.StructType:
    columns, _ = TABLES[name]
    return T.StructType([T.StructField(c, _TYPES[k]) for c, k in columns])


def _clear_partitions(folder: str, windows: Mapping[str, Sequence[str]]) -> None:
    """Remove the ``pair=P/day=D`` partitions this run writes: re-running a window replaces
    exactly its partitions (Spark escapes partition values as %XX)."""
    if not os.path.isdir(folder):
        return
    for pair_dir in os.listdir(folder):
        if not pair_dir.startswith("pair="):
            continue
        days = windows.get(unquote(pair_dir[5:]))
        if days is None:
            continue
        for day in days:
            shutil.rmtree(os.path.join(folder, pair_dir, f"day={day}"), ignore_errors=True)


def _write_table(
    report: SparkReport,
    name: str,
    out: str,
    days: Mapping[str, Sequence[str]],
) -> None:
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    columns = [c for c, _ in TABLES[name][0]]
    csv_path = os.path.join(folder, f"{name}.csv")
    parquet_folder = os.path.join(folder, "parquet")
    _clear_partitions(parquet_folder, days)
    os.makedirs(parquet_folder, exist_ok=True)
    if name in report.tables:
        rows = report.tables[name]
        write_csv(csv_path, columns, ([r[c] for c in columns] for r in rows))
        parquet.write_partitioned(parquet_folder, TABLES[name][0], rows, ("pair", "day"))
        return
    assert report.per_minute is not None
    frame = report.per_minute.select(*columns)
    _, order = TABLES[name]
    ordered = frame.coalesce(1).sortWithinPartitions(*order)
    write_csv(csv_path, columns, (tuple(r) for r in ordered.toLocalIterator()))
    frame.write.mode("append").partitionBy("pair", "day").parquet(
        _uri(os.path.abspath(parquet_folder))
    )


def write_report(
    report: SparkReport,
    out: str,
    progress: Progress = _quiet,
) -> None:
    """Tables as ``<out>/<table>/parquet/pair=P/day=D/`` and ``<out>/<table>/<table>.csv`` (this
    run's rows), ``summary.json``, ``fleet.png`` and ``timeline.png`` (of the pair binned by
    ``compute``). ``out`` is a directory on the driver. The tables on the driver are written
    there by the driver (``spark.parquet``): a Spark job each would cost more than writing
    them. Only ``redirects_per_minute`` of a large input, which stays in Spark, is written
    by Spark (on a cluster the executors must share ``out``)."""
    os.makedirs(out, exist_ok=True)
    days: dict[str, list[str]] = defaultdict(list)
    for row in report.tables["daily"]:
        days[row["pair"]].append(row["day"])
    replayed.annotate(report.summary, report.tables)
    progress(f"writing {len(TABLES)} tables")
    for name in TABLES:
        _write_table(report, name, out, days)
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as stream:
        json.dump(report.summary, stream, indent=2, sort_keys=False)
        stream.write("\n")
    progress("drawing fleet.png")
    timeline.render_fleet(os.path.join(out, "fleet.png"), report.summary, report.tables["daily"])
    pictures = [("availability per pair per day", "fleet.png")]
    by_pair: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for table, rows in report.tables.items():
        if table != "redirects_per_minute":
            for row in rows:
                by_pair[row["pair"]][table].append(row)
    for pair, activity in report.activity.items():
        name = "timeline.png" if report.single else timeline_name(pair)
        timeline.render(
            os.path.join(out, name), report.summary["pairs"][pair], by_pair[pair], activity
        )
        pictures.append((f"timeline of {pair}", name))
    pairs = len(report.summary["pairs"])
    drawn = [name for _, name in pictures[1:]]
    if len(drawn) < pairs:
        progress(
            f"drew {', '.join(drawn)}: the {len(drawn)} worst of {pairs} pairs"
            " (--pair NAME draws another)"
        )
    else:
        progress(f"drew {', '.join(drawn)}")
    pages.write(out, report.summary, report.tables, pictures)
    with open(os.path.join(out, "summary.txt"), "w", encoding="utf-8") as stream:
        stream.write(render_text(report.summary, report.tables))
    progress("wrote summary.txt, summary.md and report.html")


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
    progress: Progress = _quiet,
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
