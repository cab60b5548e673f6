"""How ``make test`` splits the suite between pytest-xdist workers (``--dist loadgroup``).

Owns: the group each test is sent in, and the scheduler that keeps a group on one worker.
A test whose fixtures include one shared by a module (a server started once for a file's
tests) goes with the rest of its module, so that server starts once; every test that
uses the Spark session goes to one worker (a session is a JVM of about 1 GB and seconds
to start: one is enough), and so does every test marked ``spark`` (it may start Spark in
its process), except one marked ``spark(child=True)`` (Spark in child processes only);
every other test is free to run on any worker. The work goes out longest first (each
group or test by its time in ``tests/durations.json``, written by ``make durations``):
the last minutes are not left to one worker running a long test while the others idle.

The groups come from the tests' fixtures, which only the workers collect: each worker
writes them (node id -> group) to a file the controller named, and the controller's
scheduler reads it once every worker has collected. (xdist's own ``loadgroup`` reads
``xdist_group`` marks through node ids that pytest 9 no longer lets it rewrite.) Knows
nothing of what the tests do.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

SPARK = "spark"
DURATIONS = Path(__file__).with_name("durations.json")
DURATIONS_OUT = "AMQHA_DURATIONS_OUT"  # where ``make durations`` has them written
UNKNOWN = 1.0  # seconds: a test not in the durations file yet
_SHARED_SCOPES = {"module", "package", "class"}
_FILE_KEY = "amqha_xdist_groups"
_file_key = pytest.StashKey[Path]()


def group_of(item: pytest.Item) -> str | None:
    """The group ``item`` must run in, or None if any worker may take it alone."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    scopes = {name: definitions[-1].scope for name, definitions in info.name2fixturedefs.items()}
    # Marked spark: it may start Spark in this process (``run_report`` reuses the active
    # session, or starts one and ends its JVM), so it runs beside the shared session;
    # unless marked ``spark(child=True)``: its Spark runs in child processes only.
    spark = item.get_closest_marker("spark")
    if "spark_session" in scopes or (spark is not None and not spark.kwargs.get("child")):
        return SPARK
    if any(scope in _SHARED_SCOPES for scope in scopes.values()):
        return item.nodeid.split("::", 1)[0]
    return None


def groups_file(config: pytest.Config) -> Path:
    """The controller's file for the groups (made on first use, removed at the end)."""
    if _file_key not in config.stash:
        handle, name = tempfile.mkstemp(prefix="amqha-xdist-groups-", suffix=".json")
        os.close(handle)
        config.stash[_file_key] = Path(name)
    return config.stash[_file_key]


def configure_node(node: Any) -> None:
    """Controller: tell a worker where to write the groups."""
    node.workerinput[_FILE_KEY] = str(groups_file(node.config))


def write_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Worker: write every grouped test's group (each worker writes the same content)."""
    target = getattr(config, "workerinput", {}).get(_FILE_KEY)
    if target is None:
        return
    groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
    partial = Path(f"{target}.{os.getpid()}")
    partial.write_text(json.dumps(groups))
    os.replace(partial, target)


def longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Worker: order the tests so that each group (or lone test) comes in the order of
    its expected time, longest first, a group's tests together. Every worker orders the
    same tests the same way, so the scheduler's queue follows it."""
    if not hasattr(config, "workerinput") or not DURATIONS.exists():
        return
    known: dict[str, float] = json.loads(DURATIONS.read_text())
    scopes = [group_of(item) or item.nodeid for item in items]
    totals: dict[str, float] = {}
    first: dict[str, int] = {}
    for index, (item, scope) in enumerate(zip(items, scopes, strict=True)):
        totals[scope] = totals.get(scope, 0.0) + known.get(item.nodeid, UNKNOWN)
        first.setdefault(scope, index)
    order = sorted(range(len(items)), key=lambda i: (-totals[scopes[i]], first[scopes[i]], i))
    items[:] = [items[i] for i in order]


class DurationRecorder:
    """Controller: each test's time (setup, call and teardown), written as JSON at the
    end of a run when ``AMQHA_DURATIONS_OUT`` names a file (``make durations``)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        rounded = {nodeid: round(seconds, 2) for nodeid, seconds in sorted(self.seconds.items())}
        self.path.write_text(json.dumps(rounded, indent=0) + "\n")


def record_durations(config: pytest.Config) -> None:
    path = os.environ.get(DURATIONS_OUT)
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(path), "amqha-durations")


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Controller: with ``--dist loadgroup``, a scheduler that sends each group to one
    worker as a whole and every other test on its own (largest groups first)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    path = groups_file(config)
    # The queue keeps the workers' order (longest first), not xdist's by group size.
    config.option.loadscopereorder = False

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            # Called once every worker has collected, so the file is complete.
            if self.groups is None:
                text = path.read_text() if path.exists() else ""
                self.groups = json.loads(text) if text else {}
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def remove_groups_file(config: pytest.Config) -> None:
    if _file_key in config.stash:
        config.stash[_file_key].unlink(missing_ok=True)
