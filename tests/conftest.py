from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pairs import MakePair, pair_factory
from tests.support import ServerProcess


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One standalone broker shared by the protocol tests (each test uses its own names)."""
    server = ServerProcess(tmp_path_factory.mktemp("broker"), "solo")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator:
    """Start extra servers for one test; all are stopped at the end, by pid."""
    started: list[ServerProcess] = []

    def make(name: str = "solo", **overrides: object) -> ServerProcess:
        server = ServerProcess(tmp_path, name, **overrides)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def make_pair(tmp_path: Path) -> Iterator[MakePair]:
    """Build primary/backup pairs of real processes for one test; all stopped at the end."""
    yield from pair_factory(tmp_path)
