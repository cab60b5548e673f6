"""Every file a server writes is 0600 and every folder it makes 0700, whatever the umask;
a new store appears whole or not at all, and an empty store file is refused.

Each test runs with a umask of 0, so a mode left to the umask would show as 0666 / 0777.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqha.core.changes import Enqueued, QueueDeclared
from amqha.quarantine import keep, write_unprotected_mark
from amqha.store import Store
from amqha.store_file import StoreError
from failover.epoch import EPOCH_FILE, store_epoch
from failover.events import EventLog


@pytest.fixture(autouse=True)
def no_umask() -> Iterator[None]:
    before = os.umask(0)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_store_its_wal_and_its_folder_are_private(tmp_path: Path) -> None:
    path = tmp_path / "data" / "store.sqlite"
    store = Store.open(path)
    try:
        store.start(lambda lsn, failed: None)
        store.submit(1, [QueueDeclared("/", "q", False, {})])
        store.submit(2, [Enqueued("/", "q", 1, b"", b"", b"body", None, True)])
    finally:
        store.close()
    store = Store.open(path)  # the WAL exists while the store is open
    try:
        assert mode(path.parent) == 0o700
        assert mode(path) == 0o600
        assert mode(Path(f"{path}-wal")) == 0o600
    finally:
        store.close()
    assert not Path(f"{path}.new").exists()


def test_an_existing_store_left_readable_by_others_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    Store.open(path).close()
    os.chmod(path, 0o644)
    Store.open(path).close()
    assert mode(path) == 0o600


def test_an_empty_store_file_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    path.write_bytes(b"")
    with pytest.raises(StoreError) as raised:
        Store.open(path)
    assert str(raised.value) == (
        f"{path}: not a readable store (an empty file, which no store ever is: remove it if"
        " nothing was stored there)"
    )
    assert path.stat().st_size == 0


def test_a_sqlite_file_without_tables_is_refused(tmp_path: Path) -> None:
    """What an older version left when it was killed while making a new store."""
    path = tmp_path / "store.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = WAL")
    db.close()
    with pytest.raises(StoreError) as raised:
        Store.open(path)
    assert str(raised.value) == (
        f"{path}: not an amqha store (a SQLite file without tables: remove it if nothing"
        " was stored there)"
    )


def test_a_store_half_made_by_a_crash_is_made_again(tmp_path: Path) -> None:
    """A crash while a new store was being made leaves only PATH.new (here: empty, as if
    killed before the schema); the next open makes the store from the start."""
    path = tmp_path / "store.sqlite"
    Path(f"{path}.new").write_bytes(b"")
    store = Store.open(path)
    try:
        assert store.max_msg_id() == 0
        assert list(store.recover()) == []
    finally:
        store.close()
    assert not Path(f"{path}.new").exists()
    assert mode(path) == 0o600


def test_the_event_log_is_private_even_one_an_older_version_made(tmp_path: Path) -> None:
    path = tmp_path / "events" / "events.jsonl"
    EventLog(path, "primary", "primary").close()
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    os.chmod(path, 0o644)
    EventLog(path, "primary", "primary").close()
    assert mode(path) == 0o600


def test_the_epoch_file_and_its_folder_are_private(tmp_path: Path) -> None:
    store_epoch(tmp_path / "data", 7)
    assert mode(tmp_path / "data") == 0o700
    assert mode(tmp_path / "data" / EPOCH_FILE) == 0o600


def test_the_unprotected_mark_and_the_quarantine_are_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    write_unprotected_mark(str(data_dir), 5)
    assert mode(data_dir) == 0o700 and mode(data_dir / "unprotected") == 0o600
    found = keep([("/", "q", 5, b"", b"", b"body")], str(data_dir), "primary", 5)
    assert mode(data_dir / "quarantine") == 0o700
    assert mode(Path(found["path"])) == 0o600
