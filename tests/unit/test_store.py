"""Store: real SQLite files in tmp_path, written through submit/notify, read back by recover.

Every wait is bounded; the torn-tail test kills a writer process it started, by its pid. The
tables the store gained later: a PASSIVE's pending runs and snapshot in test_store_passive.py,
a quorum queue's delivery counts in test_store_delivery_counts.py.
"""

from __future__ import annotations

import datetime
import decimal
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from amqha.core.changes import (
    Batch,
    Bound,
    Delivered,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    QueueDeclared,
    QueueDeleted,
    Reset,
    Settled,
    Unbound,
)
from amqha.store import Store, StoreFailure
from amqha.store_file import MIN_BYTES, SCHEMA_VERSION, StoreError
from amqha.store_write import RANGE_IDS, SETTLE_IDS, settle_ranges
from tests.support import ROOT
from tests.unit import store_support
from tests.unit.store_support import WAIT, Writer, message, queue, recovered, rows

path = store_support.path  # the store's file under tmp_path

ARGUMENTS = {
    "x-max-length": 10,
    "x-message-ttl": 60000,
    "text": "é",
    "raw": b"\xff\xfe",
    "ratio": 0.25,
    "flag": True,
    "price": decimal.Decimal("1.25"),
    "when": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
    "nested": {"list": [1, "two", {"three": None}], "bytes": bytearray(b"\x00")},
    "big": 2**40,
}


def test_every_change_kind_round_trips(path: Path) -> None:
    writer = Writer(path)
    assert (
        writer.write(
            ExchangeDeclared("/", "orders", "topic", False, False, ARGUMENTS),
            ExchangeDeclared("other", "audit", "fanout", True, True, {}),
            ExchangeDeclared("/", "gone", "direct", False, False, {}),
            queue("q1", **ARGUMENTS),
            QueueDeclared("other", "q2", True, {}),
            Bound("/", "orders", "q1", False, "order.*", {"x-match": "any"}),
            Bound("/", "orders", "audit-copy", True, "#", {}),
            Bound("/", "orders", "q1", False, "drop.me", {}),
        )
        is None
    )
    assert (
        writer.write(
            Unbound("/", "orders", "q1", False, "drop.me", {}),
            ExchangeDeleted("/", "gone"),
            message("q1", 1, deadline=1893456000.5),
            message("q1", 2, body=b"\x00" * 70000),
            message("q1", 3),
            Enqueued("other", "q2", 4, b"a", b"h", b"b", None, True),
            Delivered("/", "q1", 2),
        )
        is None
    )
    assert writer.write(Settled("/", "q1", (1,), "ack"), Delivered("/", "q1", 1)) is None
    writer.close()

    assert recovered(path) == [
        ExchangeDeclared("/", "orders", "topic", False, False, ARGUMENTS),
        ExchangeDeclared("other", "audit", "fanout", True, True, {}),
        QueueDeclared("/", "q1", False, ARGUMENTS),
        QueueDeclared("other", "q2", True, {}),
        Bound("/", "orders", "audit-copy", True, "#", {}),
        Bound("/", "orders", "q1", False, "order.*", {"x-match": "any"}),
        Delivered("/", "q1", 2),
        message("q1", 2, body=b"\x00" * 70000),
        message("q1", 3),
        Enqueued("other", "q2", 4, b"a", b"h", b"b", None, True),
    ]


def test_redeclaring_a_queue_keeps_its_messages_and_marks(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q", **{"x-max-length": 5}), message("q", 1), Delivered("/", "q", 1))
    writer.write(queue("q", **{"x-max-length": 9}), message("q", 2))
    writer.close()
    assert recovered(path) == [
        queue("q", **{"x-max-length": 9}),
        Delivered("/", "q", 1),
        message("q", 1),
        message("q", 2),
    ]


def test_a_message_settled_in_the_write_that_enqueued_it_never_reaches_the_file(
    path: Path,
) -> None:
    store = Store.open(path)
    store.submit(1, [queue("q"), message("q", 1), message("q", 2)])
    store.submit(4, [Batch((message("q", 3), Settled("/", "q", (1, 3), "ack")))])
    store.submit(5, [Settled("/", "q", (2,), "ack"), message("q", 4)])
    store.close()  # never started: close writes what was submitted, in one transaction
    assert rows(path, "SELECT msg_id FROM messages") == [(4,)]


def test_a_settle_deletes_a_message_stored_by_an_earlier_write(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q"), message("q", 1), message("q", 2), message("q", 3))
    writer.write(Settled("/", "q", (1, 3), "ack"), message("q", 4))
    writer.close()
    assert rows(path, "SELECT msg_id FROM messages ORDER BY msg_id") == [(2,), (4,)]


def test_non_persistent_messages_are_not_stored_but_their_ids_are_not_reused(
    path: Path,
) -> None:
    writer = Writer(path)
    writer.write(queue("q"), message("q", 1, persistent=False), message("q", 2))
    writer.write(Settled("/", "q", (1,), "ack"), message("q", 7, persistent=False))
    writer.write(Delivered("/", "q", 7))
    writer.close()
    assert rows(path, "SELECT msg_id FROM messages") == [(2,)]
    store = Store.open(path)
    assert store.max_msg_id() == 7
    store.close()


def test_the_highest_msg_id_survives_settling_every_message(path: Path) -> None:
    store = Store.open(path)
    assert store.max_msg_id() == 0
    store.close()
    writer = Writer(path)
    writer.write(queue("q"), *(message("q", i) for i in range(1, 11)))
    writer.write(Settled("/", "q", tuple(range(1, 11)), "ack"))
    writer.close()
    store = Store.open(path)
    assert store.max_msg_id() == 10
    assert store.counts()["messages"] == 0
    store.close()


def test_a_queue_keeps_its_highest_delivery_mark(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("a"), queue("b"), *(message("a", i) for i in range(1, 6)))
    writer.write(Delivered("/", "a", 3), Delivered("/", "a", 4), Delivered("/", "a", 1))
    writer.write(Delivered("/", "a", 2), Delivered("/", "missing", 9))
    writer.close()
    assert rows(path, "SELECT name, delivered_upto FROM queues ORDER BY name") == [
        ("a", 4),
        ("b", 0),
    ]
    assert Delivered("/", "a", 4) in recovered(path)


def test_deleting_a_queue_deletes_its_messages_and_the_bindings_to_it(path: Path) -> None:
    writer = Writer(path)
    writer.write(
        ExchangeDeclared("/", "x", "direct", False, False, {}),
        queue("doomed"),
        queue("kept"),
        Bound("/", "x", "doomed", False, "k", {}),
        Bound("/", "x", "kept", False, "k", {}),
        Bound("/", "x", "doomed", True, "k", {}),  # an exchange of the same name stays bound
        message("doomed", 1),
        message("kept", 2),
    )
    # Deleted and declared again in one write: the new queue starts empty.
    writer.write(message("doomed", 3), QueueDeleted("/", "doomed"), queue("doomed"))
    writer.write(message("doomed", 4))
    writer.close()
    assert recovered(path) == [
        ExchangeDeclared("/", "x", "direct", False, False, {}),
        queue("kept"),
        queue("doomed"),
        Bound("/", "x", "doomed", True, "k", {}),
        Bound("/", "x", "kept", False, "k", {}),
        message("kept", 2),
        message("doomed", 4),
    ]
    assert rows(path, "SELECT count(*) FROM messages") == [(2,)]


def test_deleting_an_exchange_deletes_the_bindings_from_and_to_it(path: Path) -> None:
    writer = Writer(path)
    writer.write(
        ExchangeDeclared("/", "x", "topic", False, False, {}),
        ExchangeDeclared("/", "y", "fanout", False, False, {}),
        queue("q"),
        Bound("/", "x", "q", False, "a", {}),
        Bound("/", "x", "y", True, "b", {}),
        Bound("/", "y", "x", True, "", {}),
        Bound("/", "y", "q", False, "", {}),
    )
    writer.write(ExchangeDeleted("/", "x"))
    writer.close()
    assert recovered(path) == [
        ExchangeDeclared("/", "y", "fanout", False, False, {}),
        queue("q"),
        Bound("/", "y", "q", False, "", {}),
    ]


def test_a_binding_is_the_same_whatever_the_order_of_its_arguments(path: Path) -> None:
    writer = Writer(path)
    writer.write(
        ExchangeDeclared("/", "h", "headers", False, False, {}),
        queue("q"),
        Bound("/", "h", "q", False, "", {"x-match": "all", "a": 1}),
        Bound("/", "h", "q", False, "", {"a": 1, "x-match": "all"}),
        Bound("/", "h", "q", False, "", {"a": 2}),
    )
    writer.write(Unbound("/", "h", "q", False, "", {"a": 1, "x-match": "all"}))
    writer.close()
    assert [change for change in recovered(path) if type(change) is Bound] == [
        Bound("/", "h", "q", False, "", {"a": 2})
    ]


def test_changes_for_what_the_store_does_not_hold_are_harmless(path: Path) -> None:
    writer = Writer(path)
    assert (
        writer.write(
            message("nowhere", 1),
            Settled("/", "nowhere", (1, 2), "ack"),
            Delivered("/", "nowhere", 5),
            Unbound("/", "x", "nowhere", False, "", {}),
            QueueDeleted("/", "nowhere"),
            ExchangeDeleted("/", "x"),
        )
        is None
    )
    writer.close()
    assert recovered(path) == []


def test_everything_submitted_before_the_writer_wakes_is_one_commit(path: Path) -> None:
    store = Store.open(path)
    notes: list[tuple[int, StoreFailure | None]] = []
    done = threading.Event()
    store.submit(1, [queue("q")])
    for lsn in range(2, 202):
        store.submit(lsn, [message("q", lsn)])

    def notify(last_lsn: int, failed: StoreFailure | None) -> None:
        notes.append((last_lsn, failed))
        done.set()

    store.start(notify)
    assert done.wait(WAIT)
    store.close()
    assert notes == [(201, None)]
    assert store.commits == 1
    assert rows(path, "SELECT count(*) FROM messages") == [(200,)]


def test_later_submissions_are_written_by_later_commits(path: Path) -> None:
    writer = Writer(path)
    for lsn in range(1, 6):
        changes = [queue("q")] if lsn == 1 else [message("q", lsn)]
        assert writer.write(*changes) is None
    writer.close()
    assert writer.store.commits == 5
    assert [last for last, _ in writer.notes] == [1, 2, 3, 4, 5]


def test_a_full_store_fails_the_write_and_retries_its_other_changes(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = Writer(path, max_bytes=MIN_BYTES)
    writer.write(queue("q"))
    body = b"m" * 1000
    stored: list[int] = []
    failure = None
    msg_id = 0
    for _ in range(100):
        first = writer.lsn + 1
        batch = [message("q", msg_id + i, body=body) for i in range(1, 6)]
        msg_id += 5
        # The failing write also settles a stored message and marks a delivery.
        extra = [Settled("/", "q", (stored[0],), "ack"), Delivered("/", "q", 3)] if stored else []
        failure = writer.write(*batch, *extra)
        if failure is not None:
            assert failure.first_lsn == first
            assert failure.last_lsn == writer.lsn
            assert "full" in failure.error
            failed_ids = [change.msg_id for change in batch]
            break
        stored.extend(change.msg_id for change in batch)
    else:
        pytest.fail("a store of MIN_BYTES never filled up")
    assert writer.store.failures >= 1
    logged = [r.getMessage() for r in caplog.records if r.name == "amqha.store"]
    assert logged and logged[0].startswith(f"{path}: write of LSN {first}..{writer.lsn} failed")
    # A write that frees space (settles of stored rows) goes through, then messages again.
    assert writer.write(Settled("/", "q", tuple(stored[1:30]), "ack")) is None
    assert writer.write(message("q", msg_id + 1, body=body)) is None
    writer.close()

    on_disk = [msg_id for (msg_id,) in rows(path, "SELECT msg_id FROM messages ORDER BY 1")]
    assert on_disk == [*stored[30:], msg_id + 1]
    assert not set(failed_ids) & set(on_disk)
    # The failed write's settle and delivery mark were kept and written after all.
    assert stored[0] not in on_disk
    assert rows(path, "SELECT delivered_upto FROM queues") == [(3,)]


def test_a_garbage_file_is_refused_with_one_line_naming_it(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a store\n" * 400)
    with pytest.raises(StoreError) as raised:
        Store.open(path)
    assert str(raised.value) == f"{path}: not a readable store (file is not a database)"


def test_a_store_written_by_a_newer_version_is_refused(path: Path) -> None:
    Store.open(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = ? WHERE key = 'version'", (SCHEMA_VERSION + 41,))
    db.commit()
    db.close()
    with pytest.raises(StoreError) as raised:
        Store.open(path)
    assert str(raised.value) == (
        f"{path}: written by a newer amqha (store version {SCHEMA_VERSION + 41},"
        f" this server reads up to {SCHEMA_VERSION})"
    )


def test_another_programs_sqlite_file_is_refused(path: Path) -> None:
    path.parent.mkdir(parents=True)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (text TEXT)")
    db.commit()
    db.close()
    with pytest.raises(StoreError) as raised:
        Store.open(path)
    assert str(raised.value) == f"{path}: not an amqha store (a SQLite file of another program)"


def test_a_store_in_use_is_refused(path: Path) -> None:
    first = Store.open(path)
    try:
        with pytest.raises(StoreError) as raised:
            Store.open(path)
        assert str(raised.value).startswith(f"{path}: in use by another process")
    finally:
        first.close()
    Store.open(path).close()


def test_a_directory_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "amqha.db"
    with pytest.raises(StoreError) as raised:
        Store.open(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: cannot create its directory {tmp_path / 'file'}")
    assert "\n" not in message


def test_a_disk_budget_below_the_minimum_is_refused(path: Path) -> None:
    with pytest.raises(StoreError) as raised:
        Store.open(path, max_bytes=1000)
    assert str(raised.value) == (
        f"{path}: a disk budget of 1000 bytes is below the store's minimum of {MIN_BYTES}"
    )


def test_recovery_gives_every_queue_its_messages_in_id_order(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("b"), queue("a"))
    # Interleaved, more than one fetch of rows, ids not in submission order per queue.
    ids = list(range(1, 5001))
    writer.write(*(message("a" if i % 3 else "b", i) for i in reversed(ids)))
    writer.close()
    changes = recovered(path)
    assert changes[:2] == [queue("b"), queue("a")]
    assert changes[2:] == [
        *(message("b", i) for i in ids if not i % 3),
        *(message("a", i) for i in ids if i % 3),
    ]
    store = Store.open(path)
    counts = store.counts()
    store.close()
    assert counts["queues"] == 2
    assert counts["messages"] == 5000
    expected = sum(len(m.header) + len(m.body) for m in changes if type(m) is Enqueued)
    assert counts["bytes"] == expected
    assert counts["file_bytes"] >= expected


def test_close_writes_what_was_submitted_and_can_be_called_twice(path: Path) -> None:
    writer = Writer(path)
    writer.submit(queue("q"))
    writer.submit(*(message("q", i) for i in range(1, 101)))
    writer.close()
    writer.close()
    assert writer.notes[-1] == (101, None)
    assert rows(path, "SELECT count(*) FROM messages") == [(100,)]
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0


# A writer process: writes batches until killed, printing each LSN the store reported
# committed (after notify) on its own line.
WRITER = """
import sys, threading
from amqha.core.changes import Enqueued, QueueDeclared, Settled
from amqha.store import Store

store = Store.open(sys.argv[1])
written = 0
changed = threading.Condition()
def notify(last_lsn, failed):
    global written
    if failed is None:
        sys.stdout.write(f"{last_lsn}\\n")
        sys.stdout.flush()
    with changed:
        written = last_lsn
        changed.notify()
store.start(notify)
store.submit(1, [QueueDeclared("/", "q", False, {})])
lsn = 1
for batch in range(1, 1000000):
    with changed:  # at most about ten batches ahead of the disk
        changed.wait_for(lambda: written >= lsn - 500, timeout=10)
    changes = [
        Enqueued("/", "q", batch * 100 + i, b"a", b"h", b"x" * 200, None, True)
        for i in range(50)
    ]
    if batch > 2:
        changes.append(Settled("/", "q", tuple((batch - 2) * 100 + i for i in range(25)), "ack"))
    store.submit(lsn + 1, changes)
    lsn += len(changes)
"""


def test_a_killed_writer_loses_no_write_it_reported(path: Path) -> None:
    path.parent.mkdir(parents=True)
    errors = path.parent / "writer.stderr"  # what the store logged: a failed write says why
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=errors.open("wb"),
    )
    assert child.stdout is not None
    reported: list[int] = []
    deadline = time.monotonic() + 60
    try:
        while len(reported) < 30 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            reported.append(int(line))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(WAIT)
    tail = child.stdout.read()
    child.stdout.close()
    assert len(reported) == 30, "the writer process reported fewer than 30 writes"
    # A line cut by the kill (no newline after it) reports nothing.
    reported.extend(int(line) for line in tail.split(b"\n")[:-1])
    last = max(reported)

    # The batch that ends at the last reported LSN: the file must hold at least that far.
    lsn, reported_batch = 1, 0
    while lsn + 50 + (1 if reported_batch + 1 > 2 else 0) <= last:
        reported_batch += 1
        lsn += 50 + (1 if reported_batch > 2 else 0)
    assert reported_batch >= 30
    store = Store.open(path)
    stored = {change.msg_id for change in store.recover() if type(change) is Enqueued}
    # Writes that reached the disk after the last report (the kill cut the report) may be
    # there too, and settle messages of reported batches: the file holds the state after
    # a whole batch, at or after the last reported one, never a hole in the stream.
    held = max(stored) // 100 if stored else 0

    def after(batches: int) -> set[int]:
        enqueued = {b * 100 + i for b in range(1, batches + 1) for i in range(50)}
        return enqueued - {(b - 2) * 100 + i for b in range(3, batches + 1) for i in range(25)}

    expected = after(max(held, reported_batch))
    missing, extra = expected - stored, stored - expected
    assert not missing and not extra, (
        f"the file is not the state after batch {max(held, reported_batch)} (last reported "
        f"LSN {last}, batch {reported_batch}): {len(missing)} missing from id "
        f"{min(missing, default=None)}, {len(extra)} that should be gone from id "
        f"{min(extra, default=None)}; the writer said: {errors.read_text()[-2000:]!r}"
    )
    assert store.max_msg_id() >= max(expected)
    store.close()


def test_a_change_the_store_cannot_write_fails_its_own_write_only(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q"))
    first = writer.lsn + 1
    failure = writer.write(message("q", 1), queue("bad", **{"x-thing": object()}))
    assert failure is not None
    assert (failure.first_lsn, failure.last_lsn) == (first, first + 1)
    assert failure.error.startswith("TypeError: no AMQP field type for object")
    assert writer.write(message("q", 2)) is None
    writer.close()
    assert recovered(path) == [queue("q"), message("q", 2)]


def test_a_reset_replaces_everything_the_store_held(tmp_path: Path) -> None:
    """A PASSIVE's snapshot starts with Reset: what its store held before is gone, and
    what follows in the same stream is kept (the queue ids cached are not reused)."""
    path = tmp_path / "store.sqlite"
    store = Store.open(str(path))
    header = b"h" * 10
    first = [
        ExchangeDeclared("/", "old-x", "direct", False, False, {}),
        QueueDeclared("/", "q", False, {}),
        Bound("/", "old-x", "q", False, "k", {}),
        Enqueued("/", "q", 1, b"a", header, b"stale", None, True),
    ]
    after = [
        Reset(),
        QueueDeclared("/", "q", False, {}),
        Enqueued("/", "q", 5, b"a", header, b"fresh", None, True),
    ]
    done = threading.Event()
    store.start(lambda lsn, failed: done.set() if lsn == len(first) + len(after) else None)
    store.submit(1, first)
    store.submit(len(first) + 1, after)
    assert done.wait(10)
    store.close()
    again = Store.open(str(path))
    recovered = list(again.recover())
    again.close()
    assert [type(c).__name__ for c in recovered] == ["QueueDeclared", "Enqueued"]
    assert recovered[1].body == b"fresh"


def test_a_settle_of_more_ids_than_one_statement_lists_deletes_every_one(path: Path) -> None:
    """A purge of a big queue is one Settled: ids not in a row go to SQLite SETTLE_IDS a
    statement (the writer lists them with the GIL held), every one deleted; those in a
    row go as ranges."""
    count = 2 * SETTLE_IDS + 5
    writer = Writer(path)
    writer.write(queue("q"), *(message("q", n) for n in range(1, 2 * count + 2)))
    writer.write(Settled("/", "q", tuple(range(1, 2 * count + 1, 2)), "purged"))
    writer.write(Settled("/", "q", tuple(range(2, 2 * count + 2, 2)[:-1]), "purged"))
    writer.close()
    assert rows(path, "SELECT msg_id FROM messages") == [(2 * count,), (2 * count + 1,)]


def test_ids_in_a_row_are_settled_as_ranges_that_take_no_other_message(path: Path) -> None:
    """Runs of RANGE_IDS ids or more, out of order, beside single ids, in two queues: what
    was settled goes, and the messages between the ranges and in the other queue stay."""
    writer = Writer(path)
    writer.write(queue("q"), queue("r"), *(message(q, n) for q in "qr" for n in range(1, 61)))
    settled = [*range(31, 41), 3, *range(5, 5 + RANGE_IDS), 20, 21, 22, 45, *range(50, 61)]
    writer.write(Settled("/", "q", tuple(reversed(settled)), "ack"))
    writer.close()
    left = set(range(1, 61)) - set(settled)
    assert rows(path, "SELECT msg_id FROM messages WHERE queue = 1 ORDER BY msg_id") == [
        (n,) for n in sorted(left)
    ]
    assert len(rows(path, "SELECT msg_id FROM messages WHERE queue = 2")) == 60


def test_settle_ranges_keeps_runs_of_ids_and_lists_the_rest() -> None:
    ids = (9, *range(20, 20 + RANGE_IDS), 1, 2, 3, 100, *range(40, 40 + RANGE_IDS + 3), 7)
    assert settle_ranges(ids) == (
        [(20, 19 + RANGE_IDS), (40, 42 + RANGE_IDS)],
        [1, 2, 3, 7, 9, 100],
    )
    assert settle_ranges(set(range(5, 5 + RANGE_IDS - 1))) == ([], list(range(5, 4 + RANGE_IDS)))
    assert settle_ranges(()) == ([], [])
