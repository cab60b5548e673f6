"""Comparing the Spark job's report with the reference's, floats to a microsecond."""

from __future__ import annotations

import math
from typing import Any

from spark import replayed
from spark.model import TABLES

TOLERANCE = 1e-6


def same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, f"{where}: {a!r} != {b!r}"
        assert math.isclose(a, b, rel_tol=0, abs_tol=TOLERANCE), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        assert len(a) == len(b), f"{where}: {len(a)} rows != {len(b)} rows\n{a}\n{b}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def spark_tables(report) -> dict[str, list[dict[str, Any]]]:
    tables = dict(report.tables)
    if report.per_minute is not None:  # a large input's, left in Spark
        _, order = TABLES["redirects_per_minute"]
        rows = [r.asDict() for r in report.per_minute.collect()]
        tables["redirects_per_minute"] = sorted(rows, key=lambda r: tuple(r[c] for c in order))
    return tables


def assert_same_report(spark_report, reference_report) -> None:
    same(spark_tables(spark_report), reference_report.tables, "tables")
    same(spark_report.summary, reference_report.summary, "summary")


def written_summary(report) -> dict[str, Any]:
    """The reference report's summary as ``amqha report`` writes it to summary.json: each
    quarantine it lists with whether its file was replayed, as this host sees the file."""
    replayed.annotate(report.summary, report.tables)
    return report.summary
