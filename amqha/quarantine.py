"""The quarantine: messages a server accepted while no in-sync PASSIVE held them.

Owns: the *unprotected mark* (a file in the data dir holding the first message id this
server gave out while ACTIVE without an in-sync PASSIVE; cleared once a PASSIVE is in
sync again), and the quarantine files. When a server is about to take a snapshot from
its peer, the messages it holds that were never replicated are written to
``DATA_DIR/quarantine/TIME-NAME.sqlite`` before the snapshot replaces them, and
reported: those at or above its mark, if it has one (it lost a split brain, or it was
killed while unprotected and its peer served meanwhile), and every message on a queue
left out of replication (``x-amqha-replicate: false``). ``amqha quarantine`` lists and
replays those files; a replay's progress (which messages were confirmed) is kept in the
file (``ReplayProgress``). See docs/durability.md, section 5.

Must not know: the loop, sockets, the failover state machine.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from .core.vhost import VHost
from .store_file import PRIVATE_DIRECTORY, PRIVATE_FILE

MARK = "unprotected"


def _mark_path(data_dir: str) -> Path:
    return Path(data_dir) / MARK


def read_unprotected_mark(data_dir: str) -> int | None:
    try:
        return int(_mark_path(data_dir).read_text().strip())
    except (OSError, ValueError):
        return None


def write_unprotected_mark(data_dir: str, first_id: int) -> None:
    path = _mark_path(data_dir)
    path.parent.mkdir(mode=PRIVATE_DIRECTORY, parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    os.fchmod(descriptor, PRIVATE_FILE)
    with open(descriptor, "w") as file:
        file.write(f"{first_id}\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def clear_unprotected_mark(data_dir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _mark_path(data_dir).unlink()


def _incomplete_path(data_dir: str) -> Path:
    return Path(data_dir) / "incomplete"


def mark_incomplete(data_dir: str) -> None:
    """This server's store is about to take its peer's snapshot: until its ACTIVE says it
    is in sync, the store may hold part of it, and a restart must not lead on it
    (docs/durability.md, section 5). On disk before the snapshot's first change."""
    path = _incomplete_path(data_dir)
    path.parent.mkdir(mode=PRIVATE_DIRECTORY, parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        os.fchmod(descriptor, PRIVATE_FILE)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def is_incomplete(data_dir: str) -> bool:
    return _incomplete_path(data_dir).exists()


def clear_incomplete(data_dir: str) -> None:
    """In sync again, or leading: this server's store is whole."""
    with contextlib.suppress(FileNotFoundError):
        _incomplete_path(data_dir).unlink()


_SCHEMA = """
CREATE TABLE messages (
    vhost TEXT, queue TEXT, msg_id INTEGER, address BLOB, header BLOB, body BLOB,
    PRIMARY KEY (vhost, queue, msg_id)
)
"""
# The messages a replay has had confirmed; a file written before it existed gets it at
# its first replay.
_REPLAYED = """
CREATE TABLE IF NOT EXISTS replayed (
    vhost TEXT, queue TEXT, msg_id INTEGER, PRIMARY KEY (vhost, queue, msg_id)
)
"""


def quarantine(
    vhosts: dict[str, VHost], first_id: int | None, data_dir: str, server: str
) -> dict[str, Any] | None:
    """Write to a new quarantine file every durable queue's message that the peer never
    had: an id at or above ``first_id`` (None: no mark), or on a queue that is not
    replicated. Returns what was kept (None when there was nothing)."""
    rows = [
        (vhost.name, queue.name, message.msg_id, message.address, message.header, message.body)
        for vhost in vhosts.values()
        for queue in vhost.queues.values()
        if queue.durable
        and queue.exclusive_owner is None
        # With no mark, a replicated queue keeps nothing: its messages are not listed.
        and (first_id is not None or queue.name in vhost.unreplicated)
        for message, _ in queue.messages()
        if queue.name in vhost.unreplicated or (first_id is not None and message.msg_id >= first_id)
    ]
    if not rows:
        return None
    return keep(rows, data_dir, server, first_id)


Row = tuple[str, str, int, bytes, bytes, bytes]  # vhost, queue, msg_id, address, header, body


def keep(rows: list[Row], data_dir: str, server: str, first_id: int | None) -> dict[str, Any]:
    """Write ``rows`` to a new quarantine file of ``data_dir``; returns what was kept."""
    folder = Path(data_dir) / "quarantine"
    folder.mkdir(mode=PRIVATE_DIRECTORY, parents=True, exist_ok=True)
    os.chmod(folder, PRIVATE_DIRECTORY)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = folder / f"{stamp}-{server}.sqlite"
    # Made here, 0600, so that SQLite opens it rather than creating it with the umask's
    # mode (its journal then takes the file's mode).
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE))
    os.chmod(path, PRIVATE_FILE)
    db = sqlite3.connect(path)
    try:
        db.execute(_SCHEMA)
        db.execute(_REPLAYED)
        db.executemany("INSERT OR IGNORE INTO messages VALUES (?, ?, ?, ?, ?, ?)", rows)
        db.commit()
    finally:
        db.close()
    queues = sorted({f"{vhost}/{queue}" for vhost, queue, *_ in rows})
    return {"path": str(path), "messages": len(rows), "queues": queues, "first_id": first_id}


def read_quarantine(path: str) -> list[Row]:
    """The messages of a quarantine file, in id order per queue."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(
            db.execute(
                "SELECT vhost, queue, msg_id, address, header, body FROM messages "
                "ORDER BY vhost, queue, msg_id"
            )
        )
    finally:
        db.close()


def replayed_count(path: str) -> int:
    """How many of a quarantine file's messages a replay has had confirmed."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        exists = db.execute(
            "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'replayed'"
        ).fetchone()
        return db.execute("SELECT count(*) FROM replayed").fetchone()[0] if exists else 0
    finally:
        db.close()


class ReplayProgress:
    """Which messages of a quarantine file are on the ACTIVE already, kept in the file
    itself: each is recorded, in a committed transaction, once its confirm arrives. A
    replay that stops (a refusal, a lost connection) leaves the rest, and the next one
    publishes only those. A message the server stored but whose confirm never arrived
    is published again: at least once, never left out."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA synchronous = FULL")
        self.db.execute(_REPLAYED)

    def total(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM messages").fetchone()[0])

    def left(self) -> list[Row]:
        """The messages not replayed yet, in id order per queue."""
        return list(
            self.db.execute(
                "SELECT vhost, queue, msg_id, address, header, body FROM messages AS m"
                " WHERE NOT EXISTS (SELECT 1 FROM replayed AS r WHERE r.vhost = m.vhost"
                " AND r.queue = m.queue AND r.msg_id = m.msg_id)"
                " ORDER BY vhost, queue, msg_id"
            )
        )

    def confirmed(self, rows: list[Row]) -> None:
        if not rows:
            return
        self.db.execute("BEGIN")
        self.db.executemany(
            "INSERT OR IGNORE INTO replayed VALUES (?, ?, ?)", (row[:3] for row in rows)
        )
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()
