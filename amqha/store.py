"""The store: this server's durable state in one SQLite file, written from the change stream.

Owns: the file's layout and its version, the one writer thread that turns the change
stream into transactions (everything submitted since its last write goes into one
transaction and one commit: group commit), what a write leaves out (a message settled
in the write that enqueued it never touches the disk), what a failed write means
(``StoreFailure``: the messages of that LSN range were not stored; the rest is retried),
and reading the state back as change values for ``amqha.core.apply``.

The file is opened in WAL mode with ``synchronous=FULL`` (a write of settles and
delivery marks only commits without its own fsync: the next write's covers it) and an
exclusive lock, so a second server pointed at the same file is refused at open. See
docs/durability.md, section 4, for the layout, the rules and the measured figures.

A PASSIVE's store also keeps *pending runs* (``PendingRun``): a run from the ACTIVE,
as received, made durable before it is acked; its changes follow later in a write of
their own that ends with ``RunWritten``, removes the run and needs no fsync. Opening a
store first writes the changes of any run still pending (a crash came between the two),
so what ``recover`` reads is whole. See docs/durability.md, sections 4 and 5.

Must not know: the loop, sockets, frames, the core's objects (it sees change values
only), which publishes wait for which LSN (the host's business).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any, NamedTuple

from amqha.core import codec
from amqha.core.changes import (
    Batch,
    Bound,
    Change,
    Delivered,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    PendingRun,
    QueueDeclared,
    QueueDeleted,
    Redelivered,
    Reset,
    RunWritten,
    Settled,
    SnapshotEnd,
    SnapshotPart,
    Unbound,
)
from amqha.wire import decode_field_table, field_table

log = logging.getLogger("amqha.store")

# 2: the runs table; 3: the deliveries table (an older file gets what it lacks at open)
SCHEMA_VERSION = 3
APPLICATION_ID = 0x616D7168  # "amqh" in the SQLite header: the file is an amqha store
# The smallest disk budget that holds the empty schema with room to work.
MIN_BYTES = 64 * 1024
# After a checkpoint the WAL file is cut back to this (one large write leaves no large file).
WAL_LIMIT = 64 * 1024 * 1024
# Rows read per fetchmany by recovery; rows per INSERT statement by the writer.
FETCH_ROWS = 2048
INSERT_ROWS = 128
JOIN_TIMEOUT = 30.0
LOG_EVERY = 1.0  # seconds between two logged write failures
# Every message body is in the store: only this server's user may read it.
PRIVATE_FILE = 0o600
PRIVATE_DIRECTORY = 0o700

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE exchanges (
    vhost TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL,
    auto_delete INTEGER NOT NULL, internal INTEGER NOT NULL, arguments BLOB NOT NULL,
    PRIMARY KEY (vhost, name)
) WITHOUT ROWID;
CREATE TABLE queues (
    id INTEGER PRIMARY KEY, vhost TEXT NOT NULL, name TEXT NOT NULL,
    auto_delete INTEGER NOT NULL, arguments BLOB NOT NULL,
    delivered_upto INTEGER NOT NULL DEFAULT 0,
    UNIQUE (vhost, name)
);
CREATE TABLE bindings (
    vhost TEXT NOT NULL, source TEXT NOT NULL, destination TEXT NOT NULL,
    to_exchange INTEGER NOT NULL, routing_key TEXT NOT NULL, arguments BLOB NOT NULL,
    PRIMARY KEY (vhost, source, destination, to_exchange, routing_key, arguments)
) WITHOUT ROWID;
CREATE INDEX bindings_by_destination ON bindings (vhost, destination, to_exchange);
CREATE TABLE messages (
    queue INTEGER NOT NULL, msg_id INTEGER NOT NULL,
    address BLOB NOT NULL, header BLOB NOT NULL, body BLOB NOT NULL, deadline REAL,
    PRIMARY KEY (queue, msg_id)
) WITHOUT ROWID;
CREATE TABLE runs (seq INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE deliveries (
    queue INTEGER NOT NULL, msg_id INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (queue, msg_id)
) WITHOUT ROWID;
"""
_RUNS_TABLE = "CREATE TABLE runs (seq INTEGER PRIMARY KEY, data BLOB NOT NULL)"
# A quorum queue's delivery counts of 2 and more (``Redelivered``), for stored messages.
_DELIVERIES_TABLE = (
    "CREATE TABLE deliveries (queue INTEGER NOT NULL, msg_id INTEGER NOT NULL,"
    " count INTEGER NOT NULL, PRIMARY KEY (queue, msg_id)) WITHOUT ROWID"
)

_QUEUE_ID_OF = "SELECT id FROM queues WHERE vhost = ? AND name = ?"
_QUEUE_ID = f"({_QUEUE_ID_OF})"
_UPSERT_EXCHANGE = (
    "INSERT INTO exchanges VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (vhost, name) DO UPDATE SET"
    " kind = excluded.kind, auto_delete = excluded.auto_delete,"
    " internal = excluded.internal, arguments = excluded.arguments"
)
# An upsert, not a REPLACE: a redeclared queue keeps its id, its messages and its marks.
_UPSERT_QUEUE = (
    "INSERT INTO queues (vhost, name, auto_delete, arguments) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (vhost, name) DO UPDATE SET"
    " auto_delete = excluded.auto_delete, arguments = excluded.arguments"
)
_BIND = "INSERT OR IGNORE INTO bindings VALUES (?, ?, ?, ?, ?, ?)"
_UNBIND = (
    "DELETE FROM bindings WHERE vhost = ? AND source = ? AND destination = ?"
    " AND to_exchange = ? AND routing_key = ? AND arguments = ?"
)
_DELETE_MESSAGES = f"DELETE FROM messages WHERE queue = {_QUEUE_ID}"
_DELETE_QUEUE = "DELETE FROM queues WHERE vhost = ? AND name = ?"
_DELETE_BINDINGS_TO_QUEUE = (
    "DELETE FROM bindings WHERE vhost = ? AND destination = ? AND to_exchange = 0"
)
_DELETE_EXCHANGE = "DELETE FROM exchanges WHERE vhost = ? AND name = ?"
_DELETE_BINDINGS_FROM = "DELETE FROM bindings WHERE vhost = ? AND source = ?"
_DELETE_BINDINGS_TO_EXCHANGE = (
    "DELETE FROM bindings WHERE vhost = ? AND destination = ? AND to_exchange = 1"
)
_MARK_DELIVERED = (
    "UPDATE queues SET delivered_upto = max(delivered_upto, ?) WHERE vhost = ? AND name = ?"
)
# One statement per queue per write, the ids as one JSON array: one step, not one per id.
_SETTLE = (
    f"DELETE FROM messages WHERE queue = {_QUEUE_ID} AND msg_id IN (SELECT value FROM json_each(?))"
)
# Only for a message the store holds: a transient one's count goes with it.
_COUNT_DELIVERY = (
    "INSERT OR REPLACE INTO deliveries SELECT queue, msg_id, ? FROM messages"
    f" WHERE queue = {_QUEUE_ID} AND msg_id = ?"
)
_SETTLE_COUNTS = (
    f"DELETE FROM deliveries WHERE queue = {_QUEUE_ID}"
    " AND msg_id IN (SELECT value FROM json_each(?))"
)
_DELETE_COUNTS = f"DELETE FROM deliveries WHERE queue = {_QUEUE_ID}"
_COUNTED_QUEUES = (
    "SELECT DISTINCT vhost, name FROM queues WHERE id IN (SELECT queue FROM deliveries)"
)
_STORE_HIGH_ID = "UPDATE meta SET value = max(value, ?) WHERE key = 'max_msg_id'"
_ADD_RUN = "INSERT OR REPLACE INTO runs VALUES (?, ?)"
_REMOVE_RUN = "DELETE FROM runs WHERE seq = ?"
_REMOVE_RUNS_BEFORE = "DELETE FROM runs WHERE seq < ?"


def _insert_sql(rows: int) -> str:
    """INSERT of ``rows`` messages, their columns bound as one flat list."""
    return "INSERT OR IGNORE INTO messages VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?)"] * rows)


# Statements of 128, 64, ..., 1 rows: a write of n messages runs n // 128 full ones and
# at most seven more, and the statement cache holds eight texts, whatever n is.
_INSERT_SIZES = tuple(INSERT_ROWS >> shift for shift in range(INSERT_ROWS.bit_length()))
_INSERTS = {size: _insert_sql(size) for size in _INSERT_SIZES}


class StoreError(Exception):
    """The store cannot be used: one line naming the file and the problem."""


class StoreFailure(NamedTuple):
    """A write failed: the Enqueued messages of LSNs ``first_lsn``..``last_lsn`` were
    not stored (their publishes are nacked). The range's other changes are kept and
    retried: a later successful write has them on disk."""

    first_lsn: int
    last_lsn: int
    error: str


Notify = Callable[[int, StoreFailure | None], None]

_STOP = object()
_UNKNOWN = object()

# Errors of the disk or the file (full, I/O, locked; and a plain DatabaseError, which is
# corruption): the changes of a write that met one are kept for a retry.
_TRANSIENT = (sqlite3.OperationalError, sqlite3.InternalError)


def _arguments(table: dict[str, Any]) -> bytes:
    return field_table(table) if table else b""


def _binding_arguments(table: dict[str, Any]) -> bytes:
    # Keys sorted: a binding is the same binding whatever order its arguments came in
    # (as the core's own binding key), so Unbound finds the row Bound wrote.
    return field_table(dict(sorted(table.items()))) if table else b""


def _decode_arguments(data: bytes) -> dict[str, Any]:
    return decode_field_table(data) if data else {}


_NOT_KEPT = (Enqueued, PendingRun, RunWritten, SnapshotPart, SnapshotEnd)
# The last entry of a write that needs no fsync of its own (see ``_needs_sync``).
_NO_SYNC = (RunWritten, SnapshotPart)


def _without_enqueued(changes: Iterable[Change]) -> Iterator[Change]:
    """The changes a failed write keeps for the next one, Batches unpacked. Pending runs
    go like messages; so does a ``RunWritten``: a run whose changes were not all written
    stays, and is written again at open. The snapshot's markers go too: what is kept is
    written with an fsync."""
    for change in changes:
        if type(change) is Batch:
            yield from _without_enqueued(change.changes)
        elif type(change) not in _NOT_KEPT:
            yield change


def _needs_sync(changes: Iterable[Any]) -> bool:
    """Whether a write holding ``changes`` must be on disk when its commit returns: it
    holds wiring or a persistent message. Delivery marks and settles alone are made
    durable by the next such write (losing them redelivers, never loses: see
    docs/durability.md), so their commit skips the fsync (``synchronous=NORMAL``). So
    does a pending run's changes: the run itself is on disk (``RunWritten`` ends them);
    and a snapshot's run before its last (``SnapshotPart`` ends it): the last one's fsync
    covers it, and nothing waits for it before that. A ``SnapshotEnd`` always needs one."""
    if isinstance(changes, (list, tuple)) and changes and type(changes[-1]) in _NO_SYNC:
        return False
    for change in changes:
        kind = type(change)
        if kind is Settled or kind is Delivered or kind is Redelivered:
            continue
        if kind is Enqueued:
            if change.persistent:
                return True
        elif kind is Batch:
            if _needs_sync(change.changes):
                return True
        else:
            return True
    return False


def _describe(path: str, exc: sqlite3.Error) -> str:
    """One line for an error SQLite raised while opening or reading ``path``."""
    name = getattr(exc, "sqlite_errorname", "")
    if name == "SQLITE_BUSY" or name.startswith("SQLITE_BUSY_"):
        return f"{path}: in use by another process ({exc})"
    if name.startswith(("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_READONLY", "SQLITE_AUTH")):
        return f"{path}: cannot open for reading and writing ({exc})"
    if name.startswith("SQLITE_FULL"):
        return f"{path}: cannot write ({exc})"
    if isinstance(exc, sqlite3.OperationalError) and not name.startswith(
        ("SQLITE_NOTADB", "SQLITE_CORRUPT")
    ):
        return f"{path}: cannot use the store ({exc})"
    return f"{path}: not a readable store ({exc})"


class _Write:
    """One transaction's worth of changes, gathered in stream order.

    Messages, settles and delivery marks are collected and written together
    (``flush``); a wiring change first flushes what came before it, then runs, so
    the transaction's effect is the stream's order.
    """

    __slots__ = (
        "db",
        "queue_ids",
        "enqueued",
        "settled",
        "delivered",
        "redelivered",
        "counted",
        "high_id",
        "run",
    )

    def __init__(
        self,
        db: sqlite3.Connection,
        queue_ids: dict[Any, int | None],
        high_id: int,
        counted: set[Any] | None = None,
    ) -> None:
        self.db = db
        self.queue_ids = queue_ids  # (vhost, name) -> the queue's row id, None: not held
        self.enqueued: list[Enqueued] = []
        self.settled: list[Settled] = []
        self.delivered: dict[Any, int] = {}
        # (vhost, queue, msg_id) -> delivery count; ``counted``: the (vhost, queue) that
        # may have rows in the deliveries table (only their settles look there).
        self.redelivered: dict[Any, int] = {}
        self.counted = counted if counted is not None else set()
        self.high_id = high_id
        # The pending run whose changes ``add`` writes now (they end with its
        # ``RunWritten``), or None.
        self.run: int | None = None

    def add(self, changes: Iterable[Any]) -> None:
        enqueue = self.enqueued.append
        settle = self.settled.append
        delivered = self.delivered
        high_id = self.high_id
        for change in changes:
            kind = type(change)
            if kind is Enqueued:
                if change.persistent:
                    enqueue(change)
                if change.msg_id > high_id:
                    high_id = change.msg_id
            elif kind is Settled:
                settle(change)
            elif kind is Delivered:
                key = change[:2]
                msg_id = change.msg_id
                if msg_id > delivered.get(key, 0):
                    delivered[key] = msg_id
                if msg_id > high_id:
                    high_id = msg_id
            elif kind is Redelivered:
                self.redelivered[change[:3]] = change.deliveries
            elif kind is Batch:
                self.high_id = high_id
                self.add(change.changes)
                high_id = self.high_id
            else:
                self.flush()
                self.wiring(change)
        self.high_id = high_id

    def flush(self) -> None:
        db = self.db
        enqueued, settled = self.enqueued, self.settled
        gone: dict[Any, set[int]] = {}
        for change in settled:
            key = change[:2]
            ids = gone.get(key)
            if ids is None:
                gone[key] = set(change.msg_ids)
            else:
                ids.update(change.msg_ids)
        if gone and enqueued:
            # Enqueued and settled in this write: neither inserted nor deleted.
            kept = []
            for message in enqueued:
                ids = gone.get(message[:2])
                if ids is not None and message.msg_id in ids:
                    ids.discard(message.msg_id)
                else:
                    kept.append(message)
            enqueued = kept
        if enqueued:
            queue_ids = self.queue_ids
            # The rows' columns, one flat list; a queue's id looked up when the names
            # differ from the message before (most of a write goes to one queue).
            values: list[Any] = []
            add = values.extend
            vhost = name = None
            queue_id: Any = None
            for message in enqueued:
                if message[1] is not name or message[0] is not vhost:
                    vhost, name = key = message[:2]
                    queue_id = queue_ids.get(key, _UNKNOWN)
                    if queue_id is _UNKNOWN:
                        queue_id = self.queue_id(key)
                if queue_id is not None:
                    add((queue_id, message[2], message[3], message[4], message[5], message[6]))
            at, count, size = 0, len(values) // 6, INSERT_ROWS
            while at < count:
                while size > count - at:
                    size >>= 1
                db.execute(_INSERTS[size], values[6 * at : 6 * (at + size)])
                at += size
        counted = self.counted
        for (vhost, name, msg_id), count in self.redelivered.items():
            db.execute(_COUNT_DELIVERY, (count, vhost, name, msg_id))
            counted.add((vhost, name))
        for (vhost, name), ids in gone.items():
            if ids:
                listed = "[" + ",".join(map(str, ids)) + "]"
                db.execute(_SETTLE, (vhost, name, listed))
                if (vhost, name) in counted:
                    db.execute(_SETTLE_COUNTS, (vhost, name, listed))
        for (vhost, name), msg_id in self.delivered.items():
            db.execute(_MARK_DELIVERED, (msg_id, vhost, name))
        # Emptied in place: ``add`` holds their bound methods across a flush.
        self.enqueued.clear()
        self.settled.clear()
        self.delivered.clear()
        self.redelivered.clear()

    def queue_id(self, key: Any) -> int | None:
        row = self.db.execute(_QUEUE_ID_OF, key).fetchone()
        queue_id = self.queue_ids[key] = row[0] if row else None
        return queue_id

    def wiring(self, change: Any) -> None:
        db = self.db
        kind = type(change)
        if kind is QueueDeclared:
            vhost, name, auto_delete, arguments = change
            db.execute(_UPSERT_QUEUE, (vhost, name, auto_delete, _arguments(arguments)))
            self.queue_ids.pop((vhost, name), None)
        elif kind is QueueDeleted:
            vhost, name = change
            self.queue_ids.pop((vhost, name), None)
            self.counted.discard((vhost, name))
            db.execute(_DELETE_COUNTS, (vhost, name))
            db.execute(_DELETE_MESSAGES, (vhost, name))
            db.execute(_DELETE_BINDINGS_TO_QUEUE, (vhost, name))
            db.execute(_DELETE_QUEUE, (vhost, name))
        elif kind is Bound or kind is Unbound:
            vhost, source, destination, to_exchange, routing_key, arguments = change
            db.execute(
                _BIND if kind is Bound else _UNBIND,
                (
                    vhost,
                    source,
                    destination,
                    to_exchange,
                    routing_key,
                    _binding_arguments(arguments),
                ),
            )
        elif kind is ExchangeDeclared:
            vhost, name, exchange_kind, auto_delete, internal, arguments = change
            db.execute(
                _UPSERT_EXCHANGE,
                (vhost, name, exchange_kind, auto_delete, internal, _arguments(arguments)),
            )
        elif kind is ExchangeDeleted:
            vhost, name = change
            db.execute(_DELETE_BINDINGS_FROM, (vhost, name))
            db.execute(_DELETE_BINDINGS_TO_EXCHANGE, (vhost, name))
            db.execute(_DELETE_EXCHANGE, (vhost, name))
        elif kind is PendingRun:
            db.execute(_ADD_RUN, change)
        elif kind is RunWritten:
            db.execute(_REMOVE_RUN, change)
        elif kind is SnapshotPart or kind is SnapshotEnd:
            pass  # they only say whether the write needs an fsync (``_needs_sync``)
        elif kind is Reset:
            # A snapshot follows in this stream: what the store held is replaced. Written
            # with a pending run's changes, so are the runs kept before that one (whose
            # changes failed to write), not those after it: the snapshot's and what
            # followed, kept and acked, their changes still to write. A Reset written
            # again after a failed write keeps every run: its own is still there, and
            # opening the store writes them all in order.
            if self.run is not None:
                db.execute(_REMOVE_RUNS_BEFORE, (self.run,))
            db.execute("DELETE FROM deliveries")
            self.counted.clear()
            db.execute("DELETE FROM messages")
            db.execute("DELETE FROM bindings")
            db.execute("DELETE FROM queues")
            db.execute("DELETE FROM exchanges")
            self.queue_ids.clear()
        else:
            raise TypeError(f"not a change: {change!r}")


class Store:
    """One store file. ``open`` it, ``recover`` what it holds, ``start`` the writer,
    ``submit`` the change stream, ``close``.

    ``commits`` counts the transactions committed, ``commit_seconds`` the time spent
    committing them (the fsyncs), ``failures`` the writes that failed.
    """

    def __init__(self, path: str, db: sqlite3.Connection) -> None:
        self.path = path
        self._db = db
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._notify: Notify | None = None
        self._closed = False
        self._retained: list[Change] = []
        self._queue_ids: dict[Any, int | None] = {}
        self._counted: set[Any] = set(map(tuple, db.execute(_COUNTED_QUEUES).fetchall()))
        (self._high_id,) = db.execute("SELECT value FROM meta WHERE key = 'max_msg_id'").fetchone()
        self._stored_high_id = self._high_id
        self._synchronous = "FULL"
        self._last_logged = -LOG_EVERY
        self._unlogged = 0
        self.commits = 0
        self.commit_seconds = 0.0
        self.failures = 0
        self.pending_runs_written = 0

    @classmethod
    def open(cls, path: str | os.PathLike[str], max_bytes: int | None = None) -> Store:
        """Open the store at ``path``, creating it (and its directory) if missing.

        ``max_bytes`` is the store's disk budget: past it a write fails as on a full disk.
        Raises StoreError, one line naming the file and the problem.
        """
        path = os.fspath(path)
        if max_bytes is not None and max_bytes < MIN_BYTES:
            raise StoreError(
                f"{path}: a disk budget of {max_bytes} bytes is below the store's"
                f" minimum of {MIN_BYTES}"
            )
        directory = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(directory, mode=PRIVATE_DIRECTORY, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"{path}: cannot create its directory {directory} ({exc.strerror})"
            ) from None
        if os.path.isdir(path):
            raise StoreError(f"{path}: is a directory, not a store file")
        try:
            if os.path.getsize(path) == 0:
                # Never made by this code (a new store appears whole, below): whatever
                # left it, a new store in its place would hide that.
                raise StoreError(
                    f"{path}: not a readable store (an empty file, which no store ever is:"
                    " remove it if nothing was stored there)"
                )
        except FileNotFoundError:
            _create(path)
        try:
            db = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(_describe(path, exc)) from None
        try:
            _prepare(db, path, max_bytes)
            _make_private(path)
            store = cls(path, db)
            store._write_pending_runs()
            return store
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(_describe(path, exc)) from None
        except BaseException:
            db.close()
            raise

    def _write_pending_runs(self) -> None:
        """The changes of the runs still pending (a crash came between a run's two
        writes), in order, each run removed with them: one transaction."""
        rows = self._db.execute("SELECT seq, data FROM runs ORDER BY seq").fetchall()
        batches: list[Sequence[Any]] = []
        for seq, data in rows:
            try:
                _, changes = codec.decode(data)
            except ValueError as exc:
                raise StoreError(
                    f"{self.path}: not a readable store (pending run {seq}: {exc})"
                ) from None
            batches.append([*changes, RunWritten(seq)])
        if batches:
            self._transaction(batches)
            log.info("%s: wrote the changes of %d pending runs", self.path, len(batches))
        self.pending_runs_written = len(batches)

    # -- reading (before start) ------------------------------------------------------

    def recover(self) -> Iterator[Change]:
        """The stored state as changes, in an order ``apply`` accepts: exchanges,
        queues, bindings, then each queue's delivery mark and its messages in msg_id
        order, read a few thousand rows at a time."""
        self._check_reading()
        try:
            yield from self._recover()
        except sqlite3.Error as exc:
            raise StoreError(_describe(self.path, exc)) from None
        except ValueError as exc:  # arguments that do not decode
            raise StoreError(f"{self.path}: not a readable store ({exc})") from None

    def _recover(self) -> Iterator[Change]:
        db = self._db
        decode = _decode_arguments
        for vhost, name, kind, auto_delete, internal, arguments in db.execute(
            "SELECT vhost, name, kind, auto_delete, internal, arguments FROM exchanges"
        ).fetchall():
            yield ExchangeDeclared(
                vhost, name, kind, bool(auto_delete), bool(internal), decode(arguments)
            )
        queues = db.execute(
            "SELECT id, vhost, name, auto_delete, arguments, delivered_upto FROM queues ORDER BY id"
        ).fetchall()
        for _, vhost, name, auto_delete, arguments, _ in queues:
            yield QueueDeclared(vhost, name, bool(auto_delete), decode(arguments))
        for vhost, source, destination, to_exchange, routing_key, arguments in db.execute(
            "SELECT vhost, source, destination, to_exchange, routing_key, arguments FROM bindings"
        ).fetchall():
            yield Bound(
                vhost, source, destination, bool(to_exchange), routing_key, decode(arguments)
            )
        new = tuple.__new__
        for queue_id, vhost, name, _, _, delivered_upto in queues:
            if delivered_upto > 0:
                yield Delivered(vhost, name, delivered_upto)
            cursor = db.execute(
                "SELECT msg_id, address, header, body, deadline FROM messages"
                " WHERE queue = ? ORDER BY msg_id",
                (queue_id,),
            )
            fetch = cursor.fetchmany
            while rows := fetch(FETCH_ROWS):
                for msg_id, address, header, body, deadline in rows:
                    yield new(
                        Enqueued, (vhost, name, msg_id, address, header, body, deadline, True)
                    )
            for msg_id, count in db.execute(
                "SELECT msg_id, count FROM deliveries WHERE queue = ? ORDER BY msg_id",
                (queue_id,),
            ).fetchall():
                yield Redelivered(vhost, name, msg_id, count)

    def max_msg_id(self) -> int:
        """The highest msg_id the store has seen (0: none): new ids start above it."""
        self._check_reading()
        return int(self._high_id)

    def counts(self) -> dict[str, int]:
        """queues, messages, bytes (their headers and bodies), file_bytes (on disk)."""
        self._check_reading()
        db = self._db
        try:
            (queues,) = db.execute("SELECT count(*) FROM queues").fetchone()
            messages, size = db.execute(
                "SELECT count(*), coalesce(sum(length(header) + length(body)), 0) FROM messages"
            ).fetchone()
            (pages,) = db.execute("PRAGMA page_count").fetchone()
            (page_size,) = db.execute("PRAGMA page_size").fetchone()
        except sqlite3.Error as exc:
            raise StoreError(_describe(self.path, exc)) from None
        return {
            "queues": queues,
            "messages": messages,
            "bytes": size,
            "file_bytes": pages * page_size,
        }

    def _check_reading(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.path}: the store is closed")
        if self._thread is not None:
            raise RuntimeError(f"{self.path}: the store is read before start(), not after")

    # -- writing ---------------------------------------------------------------------

    def start(self, notify: Notify) -> None:
        """Start the writer thread. ``notify(last_lsn, failed)`` is called from it after
        each write: every change up to ``last_lsn`` has been written (``failed`` None),
        or ``failed`` names the range whose messages were not stored."""
        if self._closed or self._thread is not None:
            raise RuntimeError(f"{self.path}: the store's writer was already started")
        self._notify = notify
        self._thread = threading.Thread(target=self._run, name="amqha-store", daemon=True)
        self._thread.start()

    def submit(self, first_lsn: int, changes: Sequence[Change]) -> None:
        """Queue changes ``first_lsn``.. for the writer; never blocks."""
        if self._closed:
            raise RuntimeError(f"{self.path}: the store is closed")
        self._queue.put((first_lsn, changes))

    def close(self) -> None:
        """Write what was submitted, stop the writer, checkpoint the WAL, close the file."""
        if self._closed:
            return
        self._closed = True
        thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(JOIN_TIMEOUT)
            if thread.is_alive():
                log.error(
                    "%s: the writer did not finish within %.0f s; the file is left open",
                    self.path,
                    JOIN_TIMEOUT,
                )
                return
        else:
            items = self._take(None)
            if items:
                self._write(items)
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            log.warning("%s: checkpoint at close failed (%s)", self.path, exc)
        self._db.close()

    def _take(self, first: Any) -> list[tuple[int, Sequence[Change]]]:
        items = [] if first is None else [first]
        get = self._queue.get_nowait
        try:
            while True:
                items.append(get())
        except queue.Empty:
            pass
        return items

    def _run(self) -> None:
        get = self._queue.get
        while True:
            items = self._take(get())
            stop = any(item is _STOP for item in items)
            if stop:
                items = [item for item in items if item is not _STOP]
            if items:
                try:
                    self._write(items)
                except Exception:  # the writer thread must outlive any one write
                    log.exception("%s: a write went wrong", self.path)
            if stop:
                return

    def _write(self, items: list[tuple[int, Sequence[Change]]]) -> None:
        first_lsn = items[0][0]
        last_first, last_changes = items[-1]
        last_lsn = last_first + len(last_changes) - 1
        failed: StoreFailure | None = None
        if any(changes for _, changes in items) or self._retained:
            failed = self._write_changes(first_lsn, last_lsn, [changes for _, changes in items])
        notify = self._notify
        if notify is not None:
            try:
                notify(last_lsn, failed)
            except Exception:
                log.exception("%s: the store's notify callback failed", self.path)

    def _write_changes(
        self, first_lsn: int, last_lsn: int, batches: list[Sequence[Change]]
    ) -> StoreFailure | None:
        retained = self._retained
        error, retry = self._attempt([retained, *batches])
        if error is None:
            self._retained = []
            return None
        self.failures += 1
        if not retry:
            log.error(
                "%s: a write of LSN %d..%d was dropped: %s", self.path, first_lsn, last_lsn, error
            )
            self._retained = []
            return StoreFailure(first_lsn, last_lsn, error)
        # The wiring, delivery marks and settles of the failed write must still reach the
        # disk: tried again at once without the messages (settles free space), and at the
        # front of every later write while that fails.
        retained = [*retained, *_without_enqueued(chain.from_iterable(batches))]
        if retained:
            again, retry = self._attempt([retained])
            self._retained = retained if again is not None and retry else []
        self._log_failure(first_lsn, last_lsn, error)
        return StoreFailure(first_lsn, last_lsn, error)

    def _attempt(self, batches: list[Sequence[Change]]) -> tuple[str | None, bool]:
        """One transaction: (None, _) once committed, else (the error, whether the same
        changes may succeed later). A full disk, an I/O error, a lock may pass; a change
        SQLite cannot take at all (a value it cannot bind) would fail every retry."""
        try:
            self._transaction(batches)
            return None, False
        except Exception as exc:
            self._rollback()
            if isinstance(exc, _TRANSIENT) or type(exc) is sqlite3.DatabaseError:
                return str(exc), True
            log.exception("%s: changes the store cannot write", self.path)
            return f"{type(exc).__name__}: {exc}", False

    def _transaction(self, batches: list[Sequence[Change]]) -> None:
        db = self._db
        synchronous = "FULL" if any(map(_needs_sync, batches)) else "NORMAL"
        if synchronous != self._synchronous:
            db.execute(f"PRAGMA synchronous = {synchronous}")  # not allowed inside a transaction
            self._synchronous = synchronous
        write = _Write(db, self._queue_ids, self._high_id, self._counted)
        db.execute("BEGIN")
        changed = db.total_changes
        for changes in batches:
            last = changes[-1] if changes else None
            write.run = last.seq if type(last) is RunWritten else None
            write.add(changes)
        write.flush()
        high_id = write.high_id
        # Stored with the write's rows, never alone: a write that changes no row (transient
        # messages only) dirties no page, and its commit costs no disk write at all.
        stored_high_id = self._stored_high_id
        if high_id > stored_high_id and db.total_changes != changed:
            db.execute(_STORE_HIGH_ID, (high_id,))
            stored_high_id = high_id
        started = time.perf_counter()
        db.execute("COMMIT")
        self.commit_seconds += time.perf_counter() - started
        self.commits += 1
        self._high_id = high_id
        self._stored_high_id = stored_high_id

    def _rollback(self) -> None:
        self._queue_ids.clear()  # ids read or assigned in the transaction may be gone
        db = self._db
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error as exc:
                log.warning("%s: rollback failed (%s)", self.path, exc)
        # A queue the failed write counted or deleted keeps the rows it had: every queue
        # that may have one stays in the set (one more DELETE per settle at worst).
        with contextlib.suppress(sqlite3.Error):
            self._counted.update(map(tuple, db.execute(_COUNTED_QUEUES).fetchall()))

    def _log_failure(self, first_lsn: int, last_lsn: int, error: str) -> None:
        now = time.monotonic()
        if now - self._last_logged < LOG_EVERY:
            self._unlogged += 1
            return
        self._last_logged = now
        unlogged, self._unlogged = self._unlogged, 0
        more = f" ({unlogged} more failed writes not logged)" if unlogged else ""
        log.error(
            "%s: write of LSN %d..%d failed, its messages were not stored: %s%s",
            self.path,
            first_lsn,
            last_lsn,
            error,
            more,
        )


def _create(path: str) -> None:
    """A new, empty store at ``path``, which does not exist: the schema is written to
    ``PATH.new`` (mode 0600), synced, then linked to ``path``. A crash at any point leaves
    no file at ``path`` (the next start begins again) or a whole store, never a file
    half made; a leftover ``PATH.new`` is replaced."""
    making = path + ".new"
    for leftover in (making, making + "-journal"):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreError(f"{path}: cannot remove {leftover} ({exc.strerror})") from None
    try:
        os.close(os.open(making, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
        db = sqlite3.connect(making, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous = FULL")
            db.execute("BEGIN IMMEDIATE")
            # One statement at a time: executescript would commit the open transaction.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                (("version", SCHEMA_VERSION), ("max_msg_id", 0)),
            )
            db.execute("COMMIT")
        finally:
            db.close()
        # Fails if a file appeared at path meanwhile: that one is kept.
        with contextlib.suppress(FileExistsError):
            os.link(making, path)
        os.unlink(making)
        _sync_directory(os.path.dirname(os.path.abspath(path)))
    except sqlite3.Error as exc:
        raise StoreError(_describe(path, exc)) from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot create the store ({exc.strerror})") from None


def _sync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _make_private(path: str) -> None:
    """The store, its WAL and its shared-memory file readable by this server's user only,
    whatever the umask (SQLite makes the last two itself) and however an older version
    left them."""
    for name in (path, path + "-wal", path + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(name, PRIVATE_FILE)


def _prepare(db: sqlite3.Connection, path: str, max_bytes: int | None) -> None:
    """Settings and version check, under the exclusive lock the connection keeps until
    it closes."""
    db.execute("PRAGMA locking_mode = EXCLUSIVE")
    (mode,) = db.execute("PRAGMA journal_mode = WAL").fetchone()
    if mode != "wal":
        raise StoreError(f"{path}: cannot use write-ahead logging (journal mode stays {mode})")
    db.execute("PRAGMA synchronous = FULL")
    db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT}")
    db.execute("BEGIN IMMEDIATE")
    try:
        (application_id,) = db.execute("PRAGMA application_id").fetchone()
        tables = {
            name for (name,) in db.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
        }
        if not tables:
            raise StoreError(
                f"{path}: not an amqha store (a SQLite file without tables:"
                " remove it if nothing was stored there)"
            )
        if application_id != APPLICATION_ID or "meta" not in tables:
            raise StoreError(f"{path}: not an amqha store (a SQLite file of another program)")
        row = db.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        version = row[0] if row else None
        if not isinstance(version, int) or version < 1:
            raise StoreError(f"{path}: not a readable store (store version {version!r})")
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{path}: written by a newer amqha (store version {version},"
                f" this server reads up to {SCHEMA_VERSION})"
            )
        if version < 2:
            db.execute(_RUNS_TABLE)
        if version < 3:
            db.execute(_DELIVERIES_TABLE)
        if version < SCHEMA_VERSION:
            db.execute("UPDATE meta SET value = ? WHERE key = 'version'", (SCHEMA_VERSION,))
        db.execute("COMMIT")
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")
    if max_bytes is not None:
        (page_size,) = db.execute("PRAGMA page_size").fetchone()
        db.execute(f"PRAGMA max_page_count = {max_bytes // page_size}")
