"""An I/O error breaks the store for good (docs/durability.md, section 9): the write that
met it and every later one are refused without touching the disk, even once the disk
works again; a full disk is only waited out. On a real disk that fails on command
(tests/lazyfs.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import lazyfs
from tests.unit.store_support import Writer, message, queue, recovered

REASON = lazyfs.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[lazyfs.LazyDisk]:
    disk = lazyfs.LazyDisk(tmp_path).mount()
    yield disk
    disk.unmount()


@pytest.mark.parametrize("fault", ["fsync eio", "write eio"])
def test_an_io_error_refuses_every_later_write_even_on_a_mended_disk(
    disk: lazyfs.LazyDisk, fault: str
) -> None:
    path = disk.path / "store.sqlite"
    writer = Writer(path)
    assert writer.write(queue("q"), message("q", 1)) is None
    disk.fault(fault)
    failed = writer.write(message("q", 2))
    assert failed is not None and failed.broken and "SQLITE_IOERR" in failed.error
    assert writer.store.broken == failed.error
    disk.fault("clear")
    again = writer.write(message("q", 3))
    assert again is not None and again.broken and again.error == failed.error
    writer.close()
    # Opened again on the mended disk: what was written before the error, nothing after.
    assert [c for c in recovered(path) if type(c).__name__ == "Enqueued"] == [message("q", 1)]


def test_a_full_disk_is_only_waited_out(disk: lazyfs.LazyDisk) -> None:
    path = disk.path / "store.sqlite"
    writer = Writer(path)
    assert writer.write(queue("q"), message("q", 1)) is None
    disk.fault("write enospc")
    failed = writer.write(message("q", 2))
    assert failed is not None and not failed.broken
    disk.fault("clear")
    assert writer.write(message("q", 3)) is None
    writer.close()
