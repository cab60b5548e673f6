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
from spark.model import TABLES
from tests.spark import scenarios
from tests.spark.compare import same
from tests.spark.logs import T0
from tests.spark.test_report import future_logs


def logs(folder: Path) -> list[str]:
    """console_recovery, one directory per server as the servers keep them."""
    for server in scenarios.console_recovery():
        server.write(folder / "data")
    return [str(folder / "data" / "primary"), str(folder / "data" / "backup")]


def _csv_value(text: str, kind: str):
    if text == "":
        return None
    return {"double": float, "long": int, "string": str}[kind](text)


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


@pytest.mark.spark
def test_cli_writes_the_report(tmp_path: Path, spark_session) -> None:
    paths = logs(tmp_path)
    out = tmp_path / "out"
    args = [a for p in paths for a in ("--events", p)] + ["--out", str(out)]
    result = CliRunner().invoke(report, args)
    assert result.exit_code == 0, result.output
    assert "availability 90.7500%" in result.stdout
    assert "report: " in result.stderr  # progress

    expected = reference.compute(paths)
    same(json.loads((out / "summary.json").read_text()), expected.summary, "summary.json")
    for name, (columns, _) in TABLES.items():
        with open(out / name / f"{name}.csv", newline="") as stream:
            rows = list(csv.reader(stream))
        assert rows[0] == [c for c, _ in columns]
        typed = [
            {c: _csv_value(v, k) for (c, k), v in zip(columns, row, strict=True)}
            for row in rows[1:]
        ]
        same(typed, expected.tables[name], f"{name}.csv")
        parquet = spark_session.read.parquet(str(out / name / "parquet")).collect()
        same([r.asDict() for r in parquet], expected.tables[name], f"{name} parquet")
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.spark
def test_run_report_returns_the_summary(tmp_path: Path, spark_session) -> None:
    paths = logs(tmp_path)
    summary = run_report(paths, str(tmp_path / "out"), since=T0 + 10)
    same(summary, reference.compute(paths, since=T0 + 10).summary)


@pytest.mark.spark
def test_cli_unknown_version_exits_non_zero(tmp_path: Path, spark_session) -> None:
    paths, culprit = future_logs(tmp_path)
    args = [a for p in paths for a in ("--events", p)] + ["--out", str(tmp_path / "out")]
    result = CliRunner().invoke(report, args)
    assert result.exit_code == 1
    assert str(culprit) in result.stderr and "version 2" in result.stderr
