"""What the Store tests share: a started store that waits for its own notifications
(``Writer``, every wait bounded), what a store file recovers, a query of its tables, the
changes most tests write (a queue, a message) and the store's file under tmp_path (``path``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from amqha.core.changes import Change, Enqueued, QueueDeclared
from amqha.store import Store, StoreFailure

WAIT = 20.0


class Writer:
    """A started store and the notifications it sent; ``write`` waits for its own."""

    def __init__(self, path: Path, max_bytes: int | None = None) -> None:
        self.store = Store.open(path, max_bytes)
        self.lsn = 0
        self.notes: list[tuple[int, StoreFailure | None]] = []
        self.changed = threading.Condition()
        self.store.start(self.notify)

    def notify(self, last_lsn: int, failed: StoreFailure | None) -> None:
        with self.changed:
            self.notes.append((last_lsn, failed))
            self.changed.notify_all()

    def submit(self, *changes: Change) -> int:
        """Submit; the LSN of the last change."""
        first = self.lsn + 1
        self.lsn += len(changes)
        self.store.submit(first, list(changes))
        return self.lsn

    def wait(self, lsn: int) -> StoreFailure | None:
        """Wait until a notification covers ``lsn``; the failure it reported, if any."""
        deadline = time.monotonic() + WAIT
        with self.changed:
            while True:
                # Writes cover consecutive ranges: the first reaching ``lsn`` holds it.
                for last, failed in self.notes:
                    if last >= lsn:
                        return failed
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no notification up to LSN {lsn} after {WAIT} s")
                self.changed.wait(left)

    def write(self, *changes: Change) -> StoreFailure | None:
        return self.wait(self.submit(*changes))

    def close(self) -> None:
        self.store.close()


def recovered(path: Path) -> list[Change]:
    store = Store.open(path)
    try:
        return list(store.recover())
    finally:
        store.close()


def edit(path: Path, *statements: str) -> None:
    """Change a closed store's file behind the store's back (an older version's file, a
    damaged one), one commit."""
    db = sqlite3.connect(path)
    try:
        for statement in statements:
            db.execute(statement)
        db.commit()
    finally:
        db.close()


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def message(queue: str, msg_id: int, persistent: bool = True, **fields: Any) -> Enqueued:
    values: dict[str, Any] = {
        "vhost": "/",
        "queue": queue,
        "msg_id": msg_id,
        "address": b"\x00\x01k",
        "header": b"header-%d" % msg_id,
        "body": b"body-%d" % msg_id,
        "deadline": None,
        "persistent": persistent,
    }
    values.update(fields)
    return Enqueued(**values)


def queue(name: str, **arguments: Any) -> QueueDeclared:
    return QueueDeclared("/", name, False, arguments)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store" / "amqha.db"
