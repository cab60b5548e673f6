"""The report's Spark session: how it starts, and its shuffle sized to the input.

Owns: the session's settings (quiet, loopback-only and UI-less when local, UTC, Spark's own
file listing, no DataFrame debugging), the JVM's console output sent to a file while it starts, the input's size
through Hadoop's file systems, and the shuffle partitions fitted to it. Must not know the
report: what is read or computed in the session.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import contextmanager

from pyspark.sql import SparkSession

# One shuffle partition per this much input, at most two per core: the frames after the pass
# are small, and every partition is a task in every stage.
BYTES_PER_PARTITION = 128 << 20
# The input is files already found (a month of one pair is 60, of a fleet thousands): Spark
# looks up this many paths itself rather than with a Spark job of its own, which costs a small
# run seconds (Spark's default is 32).
DRIVER_LISTING = 4096
# PySpark's DataFrame debugging records the Python caller of every DataFrame, Column and
# function call in the JVM (four more round trips through py4j each, and a walk of the
# Python stack): for Spark's error messages only. The report builds its plans itself, a few
# hundred calls a run; without it a report's Python takes 0.06 s of CPU instead of 0.17 s on
# a small input, 0.30 s instead of 0.53 s on a reduced one (warm session).
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"


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

    Locally, Spark binds to 127.0.0.1; the UI and PySpark's DataFrame debugging are off. ``log_file`` receives everything the
    JVM would print on the console; None leaves it on the console.
    """
    builder = SparkSession.builder.appName("amqha-report")
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.sources.parallelPartitionDiscovery.threshold": str(DRIVER_LISTING),
        DATAFRAME_DEBUGGING: "false",
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


def input_bytes(spark: SparkSession, uris: Sequence[str]) -> tuple[int, int]:
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
