"""Fixtures of the report's tests: one local Spark session for the whole run (starting Spark
costs seconds), and both ways the job reads its input: every record to the driver (small
inputs) or the bulk of the records reduced in Spark first (large ones)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# The tests' session runs hundreds of reports of a few dozen events each. On inputs that
# small, compiling each query's generated Java, the JIT's optimising compiler and the
# parallel collector's threads all cost more CPU than they save: without them the in-process
# Spark tests take about a third less CPU (measured on test_report, test_failovers and
# test_fleet: 121 s -> 79 s, the same wall time). The results are the same (Spark evaluates
# an expression alike either way); the report's own runs (test_end_to_end, test_cluster:
# processes of their own) keep the report's settings. The session runs its tasks one at a
# time (local[1]) with the parallelism two cores would give it (two input and shuffle
# partitions: the same plans as local[2], so records split between partitions are still
# merged): on a machine whose two cores the other test workers share, a second task thread
# only added CPU (test_report and test_failovers: 145 s -> 131 s; make test 8:13 -> 7:47).
MASTER = "local[1]"
TEST_SETTINGS = {
    "spark.default.parallelism": "2",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
}


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from spark.session import build_session

    log = tmp_path_factory.mktemp("spark") / "spark.log"
    session = build_session(MASTER, str(log), TEST_SETTINGS)
    yield session
    session.stop()


@pytest.fixture(params=[True, False], ids=["whole", "reduced"])
def whole(request: pytest.FixtureRequest) -> bool:
    """``whole`` for ``spark.job.compute``: each test comparing it with the reference runs
    both ways."""
    return request.param


@pytest.fixture(params=["whole", "reduced"])
def read_as(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``spark.job.run_report`` reading its input both ways (it chooses by the input's size)."""
    from spark import job

    if request.param == "reduced":
        monkeypatch.setattr(job, "WHOLE_INPUT_BYTES", -1)
    return request.param
