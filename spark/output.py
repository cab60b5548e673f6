"""The report as Spark computed it, and its writing.

Owns: ``SparkReport`` (the tables on the driver, the per-minute table that stays in Spark for
a large input, the drawn pairs' activity), the output's layout (each table as Parquet
partitioned by pair and day, and a CSV copy; ``summary.json``, ``summary.txt``, the pages and
the pictures), replacing exactly the partitions a run writes, and the pictures' file names.
The tables on the driver are written by the driver (``spark.parquet``). Must not know how the
report was computed (docs/report.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from spark import pages, parquet, replayed, timeline
from spark.model import TABLES, write_csv
from spark.scan import TYPES, uri
from spark.text import render_text

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """Progress sink that prints nothing."""


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


def timeline_name(pair: str) -> str:
    """``timeline-PAIR.png``, the pair's name made safe for a file name."""
    return "timeline-" + re.sub(r"[^A-Za-z0-9._+=-]", "_", pair) + ".png"


def table_schema(name: str) -> T.StructType:
    columns, _ = TABLES[name]
    return T.StructType([T.StructField(c, TYPES[k]) for c, k in columns])


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
        uri(os.path.abspath(parquet_folder))
    )


def write_report(
    report: SparkReport,
    out: str,
    progress: Progress = quiet,
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
