"""The report on a real Spark standalone cluster: a master and one worker started from the
pyspark install on loopback, the job submitted with the spark-submit command docs/report-usage.md gives.
The executors are given a Python that does not exist: the job must not need one. Its figures
must be the same as on ``local[2]`` (the reference's). Skipped only where Java is missing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark import reference
from tests.spark import scenarios
from tests.spark.compare import same, written_summary
from tests.support import ROOT, wait_until

pytestmark = [
    pytest.mark.spark(child=True),  # Spark in child processes only
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java"),
]
SPARK_HOME = Path(__import__("pyspark").__file__).parent
START_TIMEOUT = 120.0
SUBMIT_TIMEOUT = 420.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# The cluster's daemons (master, worker) do seconds of work each here: the JIT's quick
# compiler alone and the serial collector spend less CPU on it (about 3 s of the test's 30).
# So do the driver and the executor, given the same options by the cluster's
# spark-defaults.conf (driver 30 s -> 18 s of CPU, executor 14 s -> 8 s). The cluster's
# settings, not the report's: the submitted command is the documented one.
CLUSTER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _conf_dir(folder: Path) -> Path:
    """The cluster's configuration directory (``SPARK_CONF_DIR``): its defaults for the
    applications submitted to it."""
    folder.mkdir(exist_ok=True)
    (folder / "spark-defaults.conf").write_text(
        f"spark.driver.extraJavaOptions {CLUSTER_JAVA_OPTIONS}\n"
        f"spark.executor.extraJavaOptions {CLUSTER_JAVA_OPTIONS}\n"
    )
    return folder


def _daemon(log: Path, *args: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_JAVA_OPTS": CLUSTER_JAVA_OPTIONS,
    }
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # spark-class execs java: its group is ours to stop
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    started = [
        _daemon(
            master_log,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(_free_port()),
        )
    ]
    try:
        wait_until(
            lambda: "I have been elected leader" in master_log.read_text(errors="replace"),
            timeout=START_TIMEOUT,
            interval=0.2,
            what="the master to start",
        )
        started.append(
            _daemon(
                worker_log,
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(_free_port()),
                "--work-dir",
                str(tmp_path / "work"),
                url,
            )
        )
        wait_until(
            lambda: "Successfully registered with master" in worker_log.read_text(errors="replace"),
            timeout=START_TIMEOUT,
            interval=0.2,
            what="the worker to register",
        )
        yield url
    finally:
        for process in reversed(started):
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def test_spark_submit_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:
    logs = tmp_path / "var"
    for server in scenarios.console_recovery():
        server.write(logs)
    package = tmp_path / "amqha-report.zip"
    with zipfile.ZipFile(package, "w") as archive:
        for source in (ROOT / "spark").glob("*.py"):
            archive.write(source, f"spark/{source.name}")
    out = tmp_path / "report"
    command = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--master",
        cluster,
        "--conf",
        f"spark.pyspark.driver.python={sys.executable}",
        "--conf",
        "spark.pyspark.python=/nonexistent/python3",  # executors: no Python
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.executor.memory=1g",
        "--py-files",
        str(package),
        str(ROOT / "spark" / "__main__.py"),
        "--events",
        str(logs),
        "--out",
        str(out),
    ]
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": str(_conf_dir(tmp_path / "conf")),
    }
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "availability" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    same(summary, written_summary(reference.compute([str(logs)])), "summary.json")
    assert f"master {cluster}" in (out / "spark.log").read_text()
    assert (out / "incidents" / "parquet").is_dir()


def test_a_driver_python_without_the_libraries_is_named(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    result = subprocess.run(
        [str(bare / "bin" / "python"), str(ROOT / "spark" / "__main__.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode != 0
    assert "PYSPARK_DRIVER_PYTHON" in result.stderr and "matplotlib" in result.stderr
