"""``amqha report`` end to end on files: options, outputs on disk, exit codes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from spark import reference
from spark.cli import report
from spark.job import run_report
from spark.model import TABLES, TIME_COLUMNS, csv_header, iso
from spark.output import table_schema as job_schema
from tests.spark import scenarios
from tests.spark.compare import same, written_summary
from tests.spark.logs import T0
from tests.spark.test_report import future_logs


def logs(folder: Path) -> list[str]:
    """console_recovery, one directory per server as the servers keep them."""
    for server in scenarios.console_recovery():
        server.write(folder / "data")
    return [str(folder / "data" / "primary"), str(folder / "data" / "backup")]


def test_help() -> None:
    result = CliRunner().invoke(report, ["--help"])
    assert result.exit_code == 0
    for option in ("--events", "--out", "--master", "--since", "--until", "--skew"):
        assert option in result.output
    assert "spark://" in result.output


def test_bad_skew_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        report, ["--events", str(tmp_path), "--out", str(tmp_path / "o"), "--skew", "x"]
    )
    assert result.exit_code == 1 and "NODE=SECONDS" in result.output


def _parquet_rows(spark_session, name: str, folder: Path) -> list[dict]:
    """A partitioned table read back with its schema (pair and day from the paths)."""
    frame = spark_session.read.schema(job_schema(name)).parquet(str(folder))
    return [r.asDict() for r in frame.collect()]


def _ordered(name: str, rows: list[dict]) -> list[dict]:
    columns, order = TABLES[name]
    return sorted(
        ({c: row[c] for c, _ in columns} for row in rows),
        key=lambda row: tuple(row[c] for c in order),
    )


@pytest.mark.spark
def test_cli_writes_the_report(tmp_path: Path, spark_session, read_as) -> None:
    paths = logs(tmp_path)
    out = tmp_path / "out"
    # The directory the servers write under, as `make run` lays it out: found recursively.
    args = ["--events", str(tmp_path / "data"), "--out", str(out), "--no-skew-estimate"]
    result = CliRunner().invoke(report, args)
    assert result.exit_code == 0, result.output
    assert "availability 90.7500%" in result.stdout
    for path in paths:  # the files read are listed
        assert str(Path(path) / "events.jsonl") in result.stdout
    assert "report: " in result.stderr  # progress

    expected = reference.compute([str(tmp_path / "data")], estimate_skew=False)
    same(json.loads((out / "summary.json").read_text()), written_summary(expected), "summary.json")
    for name, (columns, _) in TABLES.items():
        with open(out / name / f"{name}.csv", newline="") as stream:
            rows = list(csv.reader(stream))
        assert rows[0] == csv_header([c for c, _ in columns])
        # Each time column is followed by the same time in ISO 8601 UTC.
        for row in rows[1:]:
            cells = dict(zip(rows[0], row, strict=True))
            for c in TIME_COLUMNS & cells.keys():
                assert cells[f"{c}_iso"] == (iso(float(cells[c])) if cells[c] else "")
        plain = [i for i, h in enumerate(rows[0]) if not h.endswith("_iso")]
        typed = [
            {c: _csv_value(row[i], k) for (c, k), i in zip(columns, plain, strict=True)}
            for row in rows[1:]
        ]
        same(typed, expected.tables[name], f"{name}.csv")
        parquet = _parquet_rows(spark_session, name, out / name / "parquet")
        same(_ordered(name, parquet), expected.tables[name], f"{name} parquet")
        if expected.tables[name]:
            assert (out / name / "parquet" / "pair=backup+primary" / "day=2023-11-14").is_dir()
    for picture in ("timeline.png", "fleet.png"):
        assert (out / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "availability 90.7500%" in (out / "summary.md").read_text()
    assert 'src="data:image/png;base64,' in (out / "report.html").read_text()
    assert "amqha-report: " in (out / "spark.log").read_text()


def _csv_value(text: str, kind: str):
    if text == "":
        return None
    if kind == "boolean":
        return text == "True"
    return {"double": float, "long": int, "string": str}[kind](text)


@pytest.mark.parametrize("missing", ["nowhere", "nowhere/*.jsonl"])
def test_a_path_that_gives_no_file_exits_non_zero_naming_it(tmp_path: Path, missing) -> None:
    path = str(tmp_path / missing)
    result = CliRunner().invoke(report, ["--events", path, "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and path in result.stderr


def test_a_directory_without_logs_exits_non_zero(tmp_path: Path) -> None:
    (tmp_path / "var" / "primary").mkdir(parents=True)
    (tmp_path / "var" / "primary" / "epoch").write_text("3")
    result = CliRunner().invoke(report, ["--events", str(tmp_path / "var"), "--out", "o"])
    assert result.exit_code == 1 and "no event log" in result.stderr


@pytest.mark.spark
def test_run_report_returns_the_summary(tmp_path: Path, spark_session) -> None:
    paths = logs(tmp_path)
    summary = run_report(paths, str(tmp_path / "out"), since=T0 + 10)
    same(summary, written_summary(reference.compute(paths, since=T0 + 10)))


@pytest.mark.spark
def test_cli_unknown_version_exits_non_zero(tmp_path: Path, spark_session) -> None:
    paths, culprit = future_logs(tmp_path)
    args = [a for p in paths for a in ("--events", p)] + ["--out", str(tmp_path / "out")]
    result = CliRunner().invoke(report, args)
    assert result.exit_code == 1
    assert str(culprit) in result.stderr and "version 2" in result.stderr
