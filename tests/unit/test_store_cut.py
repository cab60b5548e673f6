"""A store cut short, and one whose write-ahead log went missing, are found at open and
never served from (docs/durability.md, section 9). SQLite alone would read either as an
older, smaller store: the commits past the cut, or in the lost log, silently gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from amqha.store_file import StoreDamaged
from tests.support import ROOT
from tests.unit import store_support
from tests.unit.store_support import Writer, message, queue, recovered

path = store_support.path  # the store's file under tmp_path

BODY = b"x" * 3000


def stored(path: Path, count: int) -> None:
    writer = Writer(path)
    writer.write(queue("q"), *(message("q", n, body=BODY) for n in range(1, count + 1)))
    writer.close()


def cut(file: Path, by: int) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - by])


def test_a_store_cut_inside_a_page_is_refused(path: Path) -> None:
    stored(path, 100)
    cut(path, 100)
    with pytest.raises(StoreDamaged, match="cut short: .* not a whole number of its 4096-byte"):
        recovered(path)


def test_a_store_cut_at_a_page_boundary_is_refused(path: Path) -> None:
    stored(path, 100)
    cut(path, 4096 * 3)
    with pytest.raises(StoreDamaged, match=r"cut short: \d+ of the \d+ pages its header counts"):
        recovered(path)


def test_a_store_closed_cleanly_opens_without_its_log(path: Path) -> None:
    stored(path, 10)
    assert not Path(f"{path}-wal").exists()  # a clean close writes it back and removes it
    assert len(recovered(path)) == 11


def crash_after_writing(path: Path, count: int) -> None:
    """A process writes ``count`` messages to the store (each write reported, so on its
    disk) and dies without closing it."""
    script = (
        "import os, sys\n"
        "from tests.unit.store_support import Writer, message, queue\n"
        "w = Writer(sys.argv[1])\n"
        f"w.write(queue('q'), *(message('q', n, body=b'x' * 3000) for n in range(1, {count} + 1)))\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, check=True, timeout=60)


def test_a_crashed_stores_missing_log_is_found_at_open(path: Path) -> None:
    crash_after_writing(path, 50)
    wal = Path(f"{path}-wal")
    assert wal.exists() and wal.stat().st_size > 0  # the 50 messages are only there
    # With its log, everything is there.
    assert len(recovered(path)) == 51
    # Crashed again, and the log lost (deleted, or never written back by a restore):
    crash_after_writing(path, 60)
    os.unlink(wal)
    with pytest.raises(StoreDamaged, match=f"write-ahead log {path.name}-wal is missing"):
        recovered(path)
