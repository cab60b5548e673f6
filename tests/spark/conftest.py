"""Fixtures of the report's tests: one local Spark session for the whole run (starting Spark
costs seconds), and the scenarios' logs written to a temporary folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from spark.job import build_session

    log = tmp_path_factory.mktemp("spark") / "spark.log"
    session = build_session("local[2]", str(log), {"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
