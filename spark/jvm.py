"""The driver JVM of a report on a local master: the options it starts with, and its end.

Owns: the Java options of a JVM the report starts itself: its quick compiler alone for a small
input (the optimising compiler does not pay for itself in a job of seconds), and a class-data
archive (the JDK's application class-data sharing): the classes a report loads, parsed and
verified once and then mapped by every later JVM, which starts and runs its first job seconds
sooner. Writing one costs a run about half a minute more, so it is written only where it will
be used again: the first run in a cache directory leaves a mark there, the second (the
directory kept) has its JVM write the archive as it exits, later ones start from it. The
directory is ``$XDG_CACHE_HOME/amqha`` (else ``~/.cache/amqha``); the archive is named after
the Java runtime and the Spark jars it holds classes of; ``AMQHA_REPORT_CLASS_ARCHIVE=off``
does without. The JVM's own log lines go to its stderr (the report's ``spark.log``), never to
the report's stdout. Ending the JVM it started, so that it is gone, and its archive written,
when the report returns. Must not know the report. See docs/report.md ("Cold start").
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

ARCHIVE_ENV = "AMQHA_REPORT_CLASS_ARCHIVE"
# Below this much input on a local master, the JIT's optimising compiler is left out.
SMALL_INPUT_BYTES = 256 << 20
JVM_EXIT_S = 120.0  # the archive is written as the JVM exits: a few seconds, once
# Unified JVM logging: warnings and errors to stderr, and none from class-data sharing, which
# lists every class it leaves out of an archive.
LOG_OPTIONS = ("-Xlog:disable", "-Xlog:all=warning:stderr", "-Xlog:cds*=off:stderr")


@dataclass(frozen=True)
class ClassArchive:
    """Where the archive is kept, and where this run's JVM writes one if there is none yet."""

    path: str
    creating: str | None = None

    @property
    def option(self) -> str:
        if self.creating is not None:
            return f"-XX:ArchiveClassesAtExit={self.creating}"
        return f"-XX:SharedArchiveFile={self.path}"

    def finish(self, exited: bool) -> None:
        """After the JVM exited: keep the archive it wrote if it exited cleanly."""
        if self.creating is None:
            return
        try:
            if exited and os.path.getsize(self.creating) > 0:
                os.replace(self.creating, self.path)
                with contextlib.suppress(OSError):
                    os.remove(f"{self.path}.seen")
        except OSError:
            pass
        finally:
            if os.path.exists(self.creating):
                os.remove(self.creating)


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.isfile(java) else None


def _spark_jars() -> str | None:
    home = os.environ.get("SPARK_HOME")
    if not home:
        import pyspark

        home = os.path.dirname(pyspark.__file__)
    jars = os.path.join(home, "jars")
    return jars if os.path.isdir(jars) else None


def _fingerprint(paths: Sequence[str]) -> str:
    """The files an archive depends on: a new JDK or new jars make another name."""
    parts = []
    for path in paths:
        stat = os.stat(path)
        parts.append(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def class_archive() -> ClassArchive | None:
    """The archive to start with, or to write; None when it is turned off, the cache
    directory cannot be written, or this is the first run to see it."""
    if os.environ.get(ARCHIVE_ENV, "").lower() in ("off", "0", "no", "false"):
        return None
    java, jars = _java(), _spark_jars()
    if java is None or jars is None:
        return None
    runtime = [java, jars]
    modules = os.path.join(os.path.dirname(os.path.dirname(java)), "lib", "modules")
    if os.path.isfile(modules):
        runtime.append(modules)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(cache, "amqha")
    try:
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK):
            return None
        path = os.path.join(folder, f"spark-classes-{_fingerprint(runtime)}.jsa")
        if os.path.isfile(path):
            return ClassArchive(path)
        seen = f"{path}.seen"
        if not os.path.exists(seen):
            with open(seen, "w", encoding="ascii") as mark:
                mark.write("a report ran here; the next one writes the class archive\n")
            return None
    except OSError:
        return None
    return ClassArchive(path, f"{path}.{os.getpid()}.tmp")


def driver_options(files: Sequence[str], archive: ClassArchive | None) -> str:
    """``spark.driver.extraJavaOptions`` for a local master reading ``files``."""
    options = list(LOG_OPTIONS)
    if all(os.path.isfile(f) for f in files) and (
        sum(os.path.getsize(f) for f in files) <= SMALL_INPUT_BYTES
    ):
        options.append("-XX:TieredStopAtLevel=1")
    if archive is not None:
        options.append(archive.option)
    return " ".join(options)


def end_started_jvm(timeout: float = JVM_EXIT_S) -> bool:
    """End the JVM pyspark started in this process, once its SparkContext is stopped: close
    its stdin, which it takes as the end of its driver, and wait for it. True if it exited
    cleanly. A later session starts a new one."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None)
    if gateway is None or process is None or process.stdin is None:
        return False
    with contextlib.suppress(Exception):  # the JVM may be gone already; it is ended below
        gateway.shutdown()
    process.stdin.close()
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        code = None
    SparkContext._gateway = None
    SparkContext._jvm = None
    return code == 0
