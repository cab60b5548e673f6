from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import lazyfs, xdist_groups
from tests.pairs import MakePair, pair_factory
from tests.support import ServerProcess

# -- pytest-xdist: which tests share a worker (tests/xdist_groups.py) ---------------------


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    return xdist_groups.make_scheduler(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    xdist_groups.configure_node(node)


def pytest_configure(config: pytest.Config) -> None:
    xdist_groups.record_durations(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    xdist_groups.write_groups(config, items)
    xdist_groups.longest_first(config, items)


def pytest_unconfigure(config: pytest.Config) -> None:
    xdist_groups.remove_groups_file(config)


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One standalone broker shared by the protocol tests (each test uses its own names)."""
    server = ServerProcess(tmp_path_factory.mktemp("broker"), "solo")
    server.start()
    yield server
    server.discard()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator:
    """Start extra servers for one test; all are killed -9 at the end, by pid."""
    started: list[ServerProcess] = []

    def make(name: str = "solo", **overrides: object) -> ServerProcess:
        server = ServerProcess(tmp_path, name, **overrides)
        started.append(server)
        return server

    yield make
    for server in started:
        server.discard()


@pytest.fixture
def make_pair(tmp_path: Path) -> Iterator[MakePair]:
    """Build primary/backup pairs of real processes for one test; all killed -9 at the end."""
    yield from pair_factory(tmp_path)


@pytest.fixture
def on_lazy_disks(tmp_path: Path) -> Iterator:
    """``on_lazy_disks(*servers)`` -> their disks: each server's data dir moved onto a disk
    of its own that forgets what was not fsynced and takes faults (tests/lazyfs.py), before
    it starts. Skips, saying why, where FUSE is missing. At the end each server is killed
    -9 (by pid), then its disk taken down."""
    reason = lazyfs.unavailable()
    if reason is not None:
        pytest.skip(reason)
    placed: list[tuple[ServerProcess, lazyfs.LazyDisk]] = []

    def place(*servers: ServerProcess) -> list[lazyfs.LazyDisk]:
        disks = []
        for server in servers:
            disk = lazyfs.LazyDisk(tmp_path / f"disk-{server.name}-{len(placed)}").mount()
            server.data_dir = disk.path / server.name
            server.config["server"]["data_dir"] = str(server.data_dir)
            placed.append((server, disk))
            disks.append(disk)
        return disks

    yield place
    for server, _ in placed:
        server.discard()
    for _, disk in placed:
        disk.unmount()
