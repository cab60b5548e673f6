"""Store, a PASSIVE's side: the pending runs it keeps until their changes are written
(written at open if they were not, refused at open if corrupt), which of a snapshot's writes
and of the live runs kept are fsynced, a Reset written with a run's changes, and the runs table a version 1 store gains
at open. Real SQLite files in tmp_path, as in test_store.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from amqha.core import codec
from amqha.core.changes import (
    Change,
    Delivered,
    PendingRun,
    Reset,
    RunWritten,
    Settled,
    SnapshotEnd,
    SnapshotPart,
    Unsynced,
)
from amqha.follower import keep_entries
from amqha.store import Store
from amqha.store_file import SCHEMA_VERSION, StoreError
from amqha.store_write import needs_sync, without_enqueued
from tests.unit import store_support
from tests.unit.store_support import Writer, edit, message, queue, recovered, rows

path = store_support.path  # the store's file under tmp_path

# -- a PASSIVE's pending runs --------------------------------------------------------------


def test_a_pending_run_whose_changes_were_never_written_is_written_at_open(path: Path) -> None:
    """The run is on disk, its rows are not (the server died between the two writes):
    opening the store writes them, so recovery reads the run's changes."""
    writer = Writer(path)
    writer.write(queue("q"), message("q", 1))
    run = codec.encode(7, [message("q", 2), Settled("/", "q", (1,), "ack"), message("q", 3)])
    assert writer.write(PendingRun(1, run)) is None
    writer.close()
    assert rows(path, "SELECT seq FROM runs") == [(1,)]
    assert [msg_id for (msg_id,) in rows(path, "SELECT msg_id FROM messages")] == [1]

    store = Store.open(path)
    assert store.pending_runs_written == 1
    assert list(store.recover()) == [queue("q"), message("q", 2), message("q", 3)]
    assert store.max_msg_id() == 3
    store.close()
    assert rows(path, "SELECT seq FROM runs") == []
    assert Store.open(path).pending_runs_written == 0


def test_a_pending_runs_changes_remove_it_in_a_write_without_an_fsync(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q"))
    changes = [message("q", 1), message("q", 2)]
    assert writer.write(PendingRun(1, codec.encode(3, changes))) is None
    assert writer.store._synchronous == "FULL"  # the run itself: on disk before its ack
    assert writer.write(*changes, RunWritten(1)) is None
    assert writer.store._synchronous == "NORMAL"  # its rows: the run was on disk first
    assert writer.write(message("q", 3)) is None
    assert writer.store._synchronous == "FULL"
    writer.close()
    assert rows(path, "SELECT seq FROM runs") == []
    assert recovered(path) == [queue("q"), *changes, message("q", 3)]


def test_a_pending_run_whose_changes_failed_to_write_stays_and_is_written_at_open(
    path: Path,
) -> None:
    writer = Writer(path)
    writer.write(queue("q"))
    changes = [message("q", 1)]
    assert writer.write(PendingRun(1, codec.encode(2, changes))) is None
    # The write of its changes fails (a change SQLite cannot take): the run is not removed.
    failure = writer.write(*changes, queue("bad", **{"x-thing": object()}), RunWritten(1))
    assert failure is not None
    writer.close()
    assert rows(path, "SELECT seq FROM runs") == [(1,)]
    assert recovered(path) == [queue("q"), message("q", 1)]


def test_a_corrupt_pending_run_is_refused_at_open_naming_the_file(path: Path) -> None:
    writer = Writer(path)
    writer.write(PendingRun(1, codec.encode(1, [queue("q")])[:-3]))
    writer.close()
    with pytest.raises(StoreError) as refused:
        Store.open(path)
    assert str(refused.value).startswith(f"{path}: not a readable store (pending run 1: ")


# -- a PASSIVE's snapshot --------------------------------------------------------------------


def test_a_snapshots_runs_before_its_last_commit_without_an_fsync_and_its_last_with_one(
    path: Path,
) -> None:
    """``SnapshotPart`` ends each run of a snapshot but the last: those commits skip the
    fsync; the last one's (``SnapshotEnd``) covers them all, and recovery reads the whole
    snapshot."""
    writer = Writer(path)
    writer.write(queue("old"), message("old", 1))
    assert writer.write(Reset(), queue("q"), message("q", 1), SnapshotPart()) is None
    assert writer.store._synchronous == "NORMAL"
    assert writer.write(message("q", 2), message("q", 3), SnapshotPart()) is None
    assert writer.store._synchronous == "NORMAL"
    assert writer.write(message("q", 4), SnapshotEnd()) is None
    assert writer.store._synchronous == "FULL"
    writer.close()
    assert recovered(path) == [queue("q"), *(message("q", i) for i in range(1, 5))]


@pytest.mark.parametrize(
    "last_run",
    [[], [Delivered("/", "q", 1)], [message("q", 2, persistent=False)]],
    ids=["empty", "a delivery mark", "a transient message"],
)
def test_a_snapshots_last_run_has_an_fsync_whatever_it_holds(
    path: Path, last_run: list[Change]
) -> None:
    """Alone, none of these would need one; after runs written without it, the last
    run's ack must mean the whole snapshot is on disk."""
    writer = Writer(path)
    assert writer.write(Reset(), queue("q"), message("q", 1), SnapshotPart()) is None
    assert writer.store._synchronous == "NORMAL"
    assert writer.write(*last_run, SnapshotEnd()) is None
    assert writer.store._synchronous == "FULL"
    writer.close()
    assert message("q", 1) in recovered(path)


def test_a_snapshot_part_in_a_write_with_other_changes_does_not_skip_their_fsync(
    path: Path,
) -> None:
    """The writer takes every submission queued into one transaction: one that needs an
    fsync gets it, whatever else the transaction holds."""
    writer = Writer(path)
    writer.store.submit(1, [Reset(), queue("q"), message("q", 1), SnapshotPart()])
    writer.store.submit(5, [message("q", 2)])
    writer.lsn = 5
    assert writer.wait(5) is None
    assert writer.store._synchronous == "FULL"
    writer.close()
    assert recovered(path) == [queue("q"), message("q", 1), message("q", 2)]


def test_what_a_failed_write_keeps_leaves_its_snapshot_part_out() -> None:
    """The wiring a failed write keeps is written again with an fsync, whatever run it
    came with."""
    kept = list(without_enqueued([queue("q"), message("q", 1), SnapshotPart(), SnapshotEnd()]))
    assert kept == [queue("q")]
    assert needs_sync(kept)


@pytest.mark.parametrize(
    ("changes", "fsync"),
    [
        ([message("q", 1)], True),
        ([Settled("/", "q", (1, 2), "ack"), message("q", 3)], True),
        ([queue("r")], True),
        ([Settled("/", "q", (1, 2), "ack"), Delivered("/", "q", 4)], False),
        ([message("q", 5, persistent=False), Delivered("/", "q", 5)], False),
        ([], False),
    ],
    ids=["a message", "settles and a message", "wiring", "settles", "transient", "empty"],
)
def test_a_live_run_is_kept_with_an_fsync_only_if_a_confirm_may_wait_for_it(
    path: Path, changes: list[Change], fsync: bool
) -> None:
    """A consumer's settles and delivery marks, or transient messages, are kept without
    an fsync, as the ACTIVE writes them: the next write with one covers them."""
    entries = keep_entries(7, codec.encode(3, changes), changes, snapshot=False, end=False)
    assert entries[0] == PendingRun(7, codec.encode(3, changes))
    assert (entries[1:] == []) is fsync
    writer = Writer(path)
    writer.write(queue("q"), message("q", 1), message("q", 2))
    assert writer.write(*entries) is None
    assert writer.store._synchronous == ("FULL" if fsync else "NORMAL")
    writer.close()
    assert rows(path, "SELECT seq FROM runs") == [(7,)]  # written with its changes at open


def test_a_snapshots_runs_are_kept_as_before_whatever_they_hold() -> None:
    run = [Settled("/", "q", (1,), "ack")]
    assert keep_entries(1, b"x", run, snapshot=True, end=False)[1:] == [SnapshotPart()]
    assert keep_entries(2, b"x", run, snapshot=True, end=True)[1:] == [SnapshotEnd()]


def test_an_unsynced_run_in_a_write_with_a_message_does_not_skip_its_fsync(path: Path) -> None:
    writer = Writer(path)
    writer.store.submit(1, [queue("q")])
    writer.store.submit(2, [PendingRun(1, codec.encode(9, [Delivered("/", "q", 1)])), Unsynced()])
    writer.store.submit(4, [message("q", 1)])
    writer.lsn = 4
    assert writer.wait(4) is None
    assert writer.store._synchronous == "FULL"
    writer.close()
    assert list(without_enqueued([Unsynced(), Delivered("/", "q", 1)])) == [Delivered("/", "q", 1)]


def test_a_reset_written_with_a_runs_changes_drops_the_runs_before_it_and_keeps_the_rest(
    path: Path,
) -> None:
    """Run 1's changes failed to write (still kept); runs 2 (a snapshot's first, with its
    Reset) and 3 were kept and acked. Run 2's changes drop run 1, never run 3, whose
    changes are still to write: opening the store writes them."""
    writer = Writer(path)
    writer.write(queue("q"), message("q", 1))
    writer.write(PendingRun(1, codec.encode(2, [message("q", 2)])))
    writer.write(PendingRun(2, codec.encode(0, [Reset(), queue("r"), message("r", 10)])))
    writer.write(PendingRun(3, codec.encode(5, [message("r", 11)])))
    writer.write(Reset(), queue("r"), message("r", 10), RunWritten(2))
    writer.close()
    assert rows(path, "SELECT seq FROM runs") == [(3,)]
    assert recovered(path) == [queue("r"), message("r", 10), message("r", 11)]


def test_a_reset_alone_keeps_every_pending_run(path: Path) -> None:
    """A Reset written again after a failed write (without its run's end) drops no run:
    its own run is still kept, and opening the store writes it and those after it."""
    writer = Writer(path)
    writer.write(PendingRun(4, codec.encode(0, [Reset(), queue("r")])))
    writer.write(PendingRun(5, codec.encode(3, [message("r", 1)])))
    writer.write(Reset(), queue("r"))
    writer.close()
    assert rows(path, "SELECT seq FROM runs") == [(4,), (5,)]
    assert recovered(path) == [queue("r"), message("r", 1)]


def test_a_version_1_store_gains_the_runs_table_at_open(path: Path) -> None:
    writer = Writer(path)
    writer.write(queue("q"), message("q", 1))
    writer.close()
    edit(
        path,
        "DROP TABLE runs",
        "DROP TABLE deliveries",
        "DROP TABLE dedup",
        "UPDATE meta SET value = 1 WHERE key = 'version'",
    )
    writer = Writer(path)
    writer.write(PendingRun(1, codec.encode(2, [message("q", 2)])))
    writer.close()
    assert rows(path, "SELECT value FROM meta WHERE key = 'version'") == [(SCHEMA_VERSION,)]
    assert recovered(path) == [queue("q"), message("q", 1), message("q", 2)]
