"""``amqha report`` started cold, as an operator runs it: a new process and JVM each time.

The class archive's life in a cache directory of the test's own: a run where a report ran
before has its JVM write the archive, the next starts from it; both give the report the
reference computes, and the report's stdout holds the summary alone (the JVM logs elsewhere).
Whether a run marks, writes, uses or does without the archive is decided before any JVM
starts: tests/unit/test_report_jvm.py. Skipped only where Java is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spark import jvm, reference
from tests.spark import scenarios
from tests.spark.compare import same
from tests.support import ROOT

pytestmark = [
    pytest.mark.spark(child=True),  # Spark in a child process only
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java"),
]
RUN_TIMEOUT = 600.0  # the run that writes the archive takes longest


def _run(logs: Path, out: Path, cache: Path) -> tuple[subprocess.CompletedProcess, str]:
    command = [sys.executable, "-m", "amqha", "report", "--events", str(logs), "--out", str(out)]
    done = subprocess.run(
        [*command, "--master", "local[2]"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done, (out / "spark.log").read_text()


def test_the_class_archive_is_written_once_then_used(tmp_path: Path, monkeypatch) -> None:
    logs = tmp_path / "logs"
    for server in scenarios.console_recovery():
        server.write(logs)
    cache = tmp_path / "cache"
    expected = reference.compute([str(logs)]).summary

    # A report ran here before: the mark it left, as its run decided (no JVM needed).
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    assert jvm.class_archive() is None
    assert [p.name for p in (cache / "amqha").iterdir()][0].endswith(".jsa.seen")

    second, log = _run(logs, tmp_path / "second", cache)
    (archive,) = (cache / "amqha").glob("*.jsa")
    assert f"class archive: this JVM writes {archive}" in log
    assert archive.stat().st_size > 0
    assert sorted(p.name for p in (cache / "amqha").iterdir()) == [archive.name]

    third, log = _run(logs, tmp_path / "third", cache)
    assert f"class archive: {archive}\n" in log

    for run, out in ((second, "second"), (third, "third")):
        same(json.loads((tmp_path / out / "summary.json").read_text()), expected, out)
        assert run.stdout.startswith("amqha failover report\n")
        assert "[warning]" not in run.stdout and "WARNING" not in run.stdout
    assert second.stdout == third.stdout
