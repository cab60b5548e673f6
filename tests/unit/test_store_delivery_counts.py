"""Store, a quorum queue's delivery counts: kept for stored messages until they are settled,
none left by a count and its settle in one write, deleted with their queue or by a reset, and
the deliveries table a version 2 store gains at open. Real SQLite files in tmp_path, as in
test_store.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from amqha.core.changes import Delivered, QueueDeleted, Redelivered, Reset, Settled
from amqha.store_file import SCHEMA_VERSION
from tests.unit import store_support
from tests.unit.store_support import Writer, message, queue, recovered, rows

path = store_support.path  # the store's file under tmp_path

# -- a quorum queue's delivery counts ------------------------------------------------------


QUORUM = {"x-queue-type": "quorum"}


def test_delivery_counts_are_kept_for_stored_messages_until_they_are_settled(
    path: Path,
) -> None:
    writer = Writer(path)
    writer.write(queue("q", **QUORUM), *(message("q", i) for i in (1, 2, 3)))
    writer.write(
        Delivered("/", "q", 3),
        Redelivered("/", "q", 1, 2),
        Redelivered("/", "q", 2, 2),
        Redelivered("/", "q", 1, 3),
        # A transient message is not stored, nor is its count.
        message("q", 4, persistent=False),
        Redelivered("/", "q", 4, 2),
    )
    writer.write(Settled("/", "q", (2,), "ack"))
    writer.close()
    assert rows(path, "SELECT msg_id, count FROM deliveries") == [(1, 3)]
    assert recovered(path)[-2:] == [message("q", 3), Redelivered("/", "q", 1, 3)]


def test_a_count_and_its_settle_in_one_write_leave_no_row(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q", **QUORUM), message("q", 1))
    writer.write(Redelivered("/", "q", 1, 2), Settled("/", "q", (1,), "ack"))
    writer.close()
    assert rows(path, "SELECT * FROM deliveries") == []


def test_counts_recorded_before_a_restart_are_deleted_by_settles_after_it(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q", **QUORUM), message("q", 1), message("q", 2))
    writer.write(Redelivered("/", "q", 1, 2))
    writer.close()
    writer = Writer(path)
    writer.write(Settled("/", "q", (1,), "ack"))
    writer.close()
    assert rows(path, "SELECT * FROM deliveries") == []


def test_a_settle_of_ids_in_a_row_deletes_their_counts_and_no_other(path: Path) -> None:
    """Ids in a row are settled as a range (store_write.settle_ranges): the counts of the
    messages inside it go with them, and the count of one just past it stays."""
    writer = Writer(path)
    writer.write(queue("q", **QUORUM), *(message("q", i) for i in range(1, 31)))
    writer.write(*(Redelivered("/", "q", i, 2) for i in (1, 10, 20, 21)))
    writer.write(Settled("/", "q", tuple(range(1, 21)), "ack"))
    writer.close()
    assert rows(path, "SELECT msg_id, count FROM deliveries") == [(21, 2)]


def test_deleting_a_queue_or_a_reset_deletes_its_counts(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("a", **QUORUM), queue("b", **QUORUM), message("a", 1), message("b", 2))
    writer.write(Redelivered("/", "a", 1, 2), Redelivered("/", "b", 2, 4))
    writer.write(QueueDeleted("/", "a"))
    writer.close()
    assert rows(path, "SELECT msg_id, count FROM deliveries") == [(2, 4)]
    writer = Writer(path)
    writer.write(Reset())
    writer.close()
    assert rows(path, "SELECT * FROM deliveries") == []


def test_a_version_2_store_gains_the_deliveries_table_at_open(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q", **QUORUM), message("q", 1))
    writer.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE deliveries")
    db.execute("DROP TABLE dedup")
    db.execute("UPDATE meta SET value = 2 WHERE key = 'version'")
    db.commit()
    db.close()
    writer = Writer(path)
    writer.write(Redelivered("/", "q", 1, 2))
    writer.close()
    assert rows(path, "SELECT value FROM meta WHERE key = 'version'") == [(SCHEMA_VERSION,)]
    assert recovered(path) == [queue("q", **QUORUM), message("q", 1), Redelivered("/", "q", 1, 2)]
