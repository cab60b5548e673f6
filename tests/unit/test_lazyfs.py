"""The power-loss filesystem itself (tests/lazyfs.py): what a power cut keeps and loses,
and each fault, on a real FUSE mount."""

from __future__ import annotations

import errno
import os
import sqlite3

import pytest

from tests import lazyfs

REASON = lazyfs.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture
def disk(tmp_path):
    disk = lazyfs.LazyDisk(tmp_path).mount()
    yield disk
    disk.unmount()


def write(path, data, sync, mode="wb"):
    with open(path, mode) as file:
        file.write(data)
        file.flush()
        if sync:
            os.fsync(file.fileno())


def test_a_power_cut_keeps_what_was_fsynced_and_loses_the_rest(disk):
    write(disk.path / "kept", b"a" * 10_000, sync=True)
    write(disk.path / "lost", b"b" * 10_000, sync=False)
    write(disk.path / "kept", b"c" * 5, sync=False, mode="r+b")  # over synced bytes
    assert (disk.path / "kept").read_bytes()[:6] == b"ccccca"
    assert (disk.path / "lost").stat().st_size == 10_000
    disk.power_cut()
    assert (disk.path / "kept").read_bytes() == b"a" * 10_000
    # The name was written through; its data never was.
    assert (disk.path / "lost").read_bytes() == b""


def test_a_truncate_waits_for_the_fsync_and_zeros_what_it_cut(disk):
    write(disk.path / "f", bytes(range(256)) * 40, sync=True)
    with open(disk.path / "f", "r+b") as file:
        file.truncate(100)
        file.truncate(9000)  # grown again: the cut bytes read as zeros
        assert file.read() == bytes(range(100)) + bytes(8900)
    disk.power_cut()
    assert (disk.path / "f").read_bytes() == bytes(range(256)) * 40
    with open(disk.path / "f", "r+b") as file:
        file.truncate(100)
        file.truncate(9000)
        os.fsync(file.fileno())
    disk.power_cut()
    assert (disk.path / "f").read_bytes() == bytes(range(100)) + bytes(8900)


def test_a_rename_and_a_link_keep_the_unsynced_pages_of_their_file(disk):
    with open(disk.path / "new", "wb") as file:
        file.write(b"x" * 5000)
        os.rename(disk.path / "new", disk.path / "moved")
        os.link(disk.path / "moved", disk.path / "linked")
        file.flush()
        assert (disk.path / "linked").read_bytes() == b"x" * 5000
        os.fsync(file.fileno())
    disk.power_cut()
    assert (disk.path / "moved").read_bytes() == b"x" * 5000
    assert not (disk.path / "new").exists()


def test_sqlite_in_wal_mode_keeps_each_synced_commit_and_loses_the_unsynced(disk):
    db = sqlite3.connect(disk.path / "s.db", isolation_level=None)
    db.execute("PRAGMA locking_mode = EXCLUSIVE")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("CREATE TABLE t (n INTEGER)")
    db.execute("PRAGMA synchronous = FULL")
    for n in range(50):
        db.execute("INSERT INTO t VALUES (?)", (n,))
    db.execute("PRAGMA synchronous = NORMAL")  # commits with no fsync of their own
    for n in range(50, 80):
        db.execute("INSERT INTO t VALUES (?)", (n,))
    assert db.execute("SELECT count(*) FROM t").fetchone() == (80,)
    # A power cut: no clean close first.
    disk.power_cut()
    db2 = sqlite3.connect(disk.path / "s.db", isolation_level=None)
    assert db2.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert db2.execute("SELECT count(*) FROM t").fetchone() == (50,)
    db2.close()
    db.close()


def test_an_fsync_error_fails_the_fsync_and_its_pages_never_reach_the_disk(disk):
    with open(disk.path / "f", "wb") as file:
        file.write(b"y" * 3000)
        file.flush()
        disk.fault("fsync eio")
        with pytest.raises(OSError) as raised:
            os.fsync(file.fileno())
        assert raised.value.errno == errno.EIO
        disk.fault("clear")
        os.fsync(file.fileno())  # succeeds: nothing is left to write
    assert (disk.path / "f").read_bytes() == b"y" * 3000  # read from the cache, still
    disk.power_cut()
    # The size reached the disk with the later fsync; the data never did.
    assert b"y" not in (disk.path / "f").read_bytes()


def test_write_errors_and_a_fault_limited_to_some_files(disk):
    disk.fault("write enospc wal")
    write(disk.path / "store", b"ok", sync=True)
    with pytest.raises(OSError) as raised:
        write(disk.path / "store-wal", b"no", sync=True)
    assert raised.value.errno == errno.ENOSPC
    disk.fault("clear")
    disk.fault("write eio")
    with pytest.raises(OSError) as raised:
        write(disk.path / "store", b"no", sync=True)
    assert raised.value.errno == errno.EIO
    disk.fault("clear")
    with pytest.raises(OSError) as raised:
        disk.fault("fsync sometimes")
    assert raised.value.errno == errno.EINVAL
    assert sorted(os.listdir(disk.path)) == ["store", "store-wal"]
