"""Each stored message carries a checksum (amqha/store_write.py ``message_crc``): a byte
changed inside a row on disk, which SQLite's own page check does not see, is found when
the store is read back at open (docs/durability.md, section 4, "A damaged store")."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from amqha.store import Store
from amqha.store_file import StoreDamaged
from tests.unit import store_support
from tests.unit.store_support import Writer, edit, message, queue, recovered, rows

path = store_support.path  # the store's file under tmp_path

MARK = b"a body to be damaged on disk " * 4


def flip_in_file(file: Path, needle: bytes) -> None:
    data = bytearray(file.read_bytes())
    at = data.find(needle)
    assert at >= 0, "the body is not in the file"
    data[at + 5] ^= 0x01
    file.write_bytes(bytes(data))


def test_a_byte_changed_in_a_body_is_found_at_open(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q"), message("q", 1), message("q", 2, body=MARK), message("q", 3))
    writer.close()  # the WAL written back: the row is in the main file
    flip_in_file(path, MARK)
    db = sqlite3.connect(path)
    try:  # SQLite's own check sees nothing wrong
        assert db.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    finally:
        db.close()
    with pytest.raises(StoreDamaged, match="message 2 of queue 'q' in vhost '/' does not match"):
        recovered(path)


def test_a_row_of_an_older_store_without_a_checksum_is_read_as_it_is(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q"), message("q", 1))
    writer.close()
    edit(path, "UPDATE messages SET crc = NULL")
    assert recovered(path) == [queue("q"), message("q", 1)]
    assert rows(path, "SELECT crc FROM messages") == [(None,)]


def test_every_row_written_has_its_checksum(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q"), *(message("q", n) for n in range(1, 300)))
    writer.close()
    assert rows(path, "SELECT count(*) FROM messages WHERE crc IS NULL") == [(0,)]
    store = Store.open(path)
    try:
        assert len([c for c in store.recover()]) == 300
    finally:
        store.close()
