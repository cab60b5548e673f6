"""The scan of the event logs on Spark: reading them, the one pass, the reduction of runs of
redirects and refusals, and bringing what remains to the driver.

Owns: the read schema (from ``spark.model.FIELDS``) and what a good line is in Spark's terms
(as ``spark.reference`` reads one), the one hash aggregation over every record (bulk records
as per-second buckets and per-minute counts, every other record kept whole), the window that
keeps the first and last point of each run of bulk records, the buckets read again where a
state changed inside one, and the whole collect of a small input (docs/report.md, "One
definition, two scans"). No Python UDFs and no data made from Python objects: executors run
no Python. Must not know the figures' definitions (``spark.metrics``).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.metrics import Collected
from spark.model import (
    CORRUPT_COLUMN,
    DOWN,
    FIELDS,
    MINUTE,
    PAIR_DIRECTORY,
    RANK_RECORD,
    RANK_STARTED,
    RANK_STOPPED,
    SCHEMA_VERSION,
    STATES,
    UNRECORDED_MAX,
    UnknownVersionError,
    local_path,
    no_valid_record,
)

TYPES = {
    "long": T.LongType(),
    "double": T.DoubleType(),
    "string": T.StringType(),
    "boolean": T.BooleanType(),
}
SCHEMA = T.StructType(
    [T.StructField(name, TYPES[kind]) for name, kind in FIELDS]
    + [T.StructField(CORRUPT_COLUMN, T.StringType())]
)
_BULK = ("redirect", "refuse")
ORDER = ("ts", "rank", "event", "state")  # a node's points, as in spark.reference
NODE = ("pair", "node")
_INF = float("inf")


# ---------------------------------------------------------------- reading

_JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": CORRUPT_COLUMN,
    "allowSingleQuotes": "false",
}


def uri(path: str) -> str:
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


def lookup(values: Mapping[str, Any], key: Column) -> Column:
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
SPECIAL_FIELDS = (
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
    "server",
    "on",
)
BUCKET_KEY = ("pair", "node", "bucket", "minute", "state")


def _stands_for(bulk: Column) -> Column:
    """How many redirects or refusals a bulk record counts for: itself and the ones of its
    kind its server left out before it (``unrecorded``, null for none)."""
    return F.when(bulk, F.coalesce(F.col("unrecorded"), F.lit(0)) + 1)


def keyed(lines: DataFrame) -> DataFrame:
    """The fields the report uses, the order rank, and the bucket key of redirects and
    refusals (``bulk``) with how many each counts for (``stands_for``), on the node's own
    clock."""
    good = F.col("good")
    bulk = good & F.col("event").isin(*_BULK)
    fields = [F.col(f"`{f}`") for f in SPECIAL_FIELDS if f != "rank"]
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


def one_pass(events: DataFrame) -> DataFrame:
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
        F.when(good & ~bulk, F.struct(*[F.col(f"`{f}`") for f in SPECIAL_FIELDS])).alias("special"),
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


def edges(buckets: DataFrame) -> DataFrame:
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
        *BUCKET_KEY, F.explode(F.array_distinct(F.array(first, last))).alias("p")
    ).select(
        *BUCKET_KEY,
        "p.ts",
        F.lit(RANK_RECORD).alias("rank"),
        "p.event",
        F.lit(True).alias("bulk"),
    )


def reduce_runs(points: DataFrame) -> DataFrame:
    """One sort of each node's points (bulk buckets' ends, bulk records, other records) and
    two running counts over it:

    - ``run``: a run of bulk points is consecutive, of one state, with no other record
      between; only its first and last point are kept (``end`` rows), as the ones between
      change nothing;
    - ``phase``: a change of the state carried, or a start; a bucket whose two ends are not
      in one phase had something else happen inside its span, so its inside matters and is
      read again (``mixed`` rows, with the bucket's key).
    """
    order = Window.partitionBy(*NODE).orderBy(*ORDER)
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
    key = F.struct(*ORDER)
    marked = points.select(
        "*",
        F.sum(new_run.cast("long")).over(_running(order)).alias("run"),
        F.sum(new_phase.cast("long")).over(_running(order)).alias("phase"),
    ).filter(bulk)
    ends = (
        marked.groupBy(*NODE, "run")
        .agg(F.min(key).alias("first"), F.max(key).alias("last"))
        .select(*NODE, F.explode(F.array_distinct(F.array("first", "last"))).alias("p"))
        .select(F.lit("end").alias("kind"), *NODE, "p.*")
    )
    mixed = (
        marked.filter(F.col("bucket").isNotNull())
        .groupBy(*BUCKET_KEY)
        .agg((F.min("phase") != F.max("phase")).alias("mixed"))
        .filter("mixed")
        .select(F.lit("mixed").alias("kind"), *BUCKET_KEY)
    )
    return ends.unionByName(mixed, allowMissingColumns=True)


def collect_json(frames: Mapping[str, DataFrame]) -> dict[str, list[dict[str, Any]]]:
    """Several small frames in one Spark job: rows as JSON, tagged with their frame."""
    tagged = [
        df.select(F.lit(name).alias("frame"), F.to_json(F.struct(*df.columns)).alias("row"))
        for name, df in frames.items()
    ]
    union = tagged[0]
    for df in tagged[1:]:
        union = union.union(df)  # the same two columns
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in frames}
    for row in union.collect():
        found[row["frame"]].append(json.loads(row["row"]))
    return found


# ---------------------------------------------------------------- every record to the driver

_WHOLE_FIELDS = [f for f in SPECIAL_FIELDS if f not in ("ts", "rank", "event", "state")]


def collect_whole(lines: DataFrame, files: Sequence[str]) -> Collected:
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
