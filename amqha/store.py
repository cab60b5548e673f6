"""The store: this server's durable state in one SQLite file, written from the change stream.

Owns: the one writer thread that turns the change stream into transactions (everything
submitted since its last write goes into one transaction and one commit: group commit;
what one write says in SQL is ``store_write``'s), what a failed write means
(``StoreFailure``: the messages of that LSN range were not stored; the rest is retried),
and reading the state back as change values for ``amqha.core.apply``. The file's
layout, version and opening checks are ``store_file``'s.

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
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any, NamedTuple

from amqha.core import codec
from amqha.core.changes import (
    Bound,
    Change,
    DedupSeen,
    Delivered,
    Enqueued,
    ExchangeDeclared,
    PermissionSet,
    PolicySet,
    QueueDeclared,
    Redelivered,
    RunWritten,
    UserSet,
    VhostSet,
)
from amqha.store_file import (
    MIN_BYTES,
    PRIVATE_DIRECTORY,
    StoreDamaged,
    StoreError,
    check_length,
    create,
    describe,
    error_for,
    make_private,
    mark_open,
    prepare,
)
from amqha.store_write import (
    ACCESS_ORDER,
    COUNTED_QUEUES,
    Write,
    message_crc,
    needs_sync,
    without_enqueued,
)
from amqha.wire import decode_field_table

log = logging.getLogger("amqha.store")


def _as_is(value: Any) -> Any:
    return value


# Binding a parameter of a type it does not take as is (bytes and None among them, in
# Python 3.11), the sqlite3 module looks for an adapter and, finding none, raises and
# clears an AttributeError, message formatted: a third of the CPU of binding a message's
# row. Adapters that hand the value back as it is skip that search; what SQLite stores
# is the same (docs/performance.md, "Binding a row").
sqlite3.register_adapter(bytes, bytes)  # bytes(b) is b itself, without a copy
sqlite3.register_adapter(type(None), _as_is)


# Rows read per fetchmany by recovery.
FETCH_ROWS = 2048
JOIN_TIMEOUT = 30.0
LOG_EVERY = 1.0  # seconds between two logged write failures

_STORE_HIGH_ID = "UPDATE meta SET value = max(value, ?) WHERE key = 'max_msg_id'"


class StoreFailure(NamedTuple):
    """A write failed: the Enqueued messages of LSNs ``first_lsn``..``last_lsn`` were
    not stored (their publishes are nacked). The range's other changes are kept and
    retried: a later successful write has them on disk. ``broken``: the disk failed (an
    I/O error), and the store writes nothing more (``Store.broken``)."""

    first_lsn: int
    last_lsn: int
    error: str
    broken: bool = False


Notify = Callable[[int, StoreFailure | None], None]

_STOP = object()

# Errors of the disk or the file (full, I/O, locked; and a plain DatabaseError, which is
# corruption): the changes of a write that met one are kept for a retry.
_TRANSIENT = (sqlite3.OperationalError, sqlite3.InternalError)


def _decode_arguments(data: bytes) -> dict[str, Any]:
    return decode_field_table(data) if data else {}


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
        self._counted: set[Any] = set(map(tuple, db.execute(COUNTED_QUEUES).fetchall()))
        (self._high_id,) = db.execute("SELECT value FROM meta WHERE key = 'max_msg_id'").fetchone()
        self._stored_high_id = self._high_id
        self._synchronous = "FULL"
        self._last_logged = -LOG_EVERY
        self._unlogged = 0
        self.commits = 0
        self.commit_seconds = 0.0
        self.failures = 0
        self.pending_runs_written = 0
        # The disk's I/O error that broke the store (docs/durability.md, section 9): no
        # write is tried after it; a retried fsync can say success for pages the kernel
        # dropped with the error.
        self.broken: str | None = None

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
                raise StoreDamaged(
                    f"{path}: not a readable store (an empty file, which no store ever is:"
                    " remove it if nothing was stored there)"
                )
        except FileNotFoundError:
            create(path)
        try:
            wal_there = check_length(path)
        except OSError as exc:
            raise StoreError(f"{path}: cannot read ({exc.strerror})") from None
        try:
            db = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise error_for(path, exc) from None
        try:
            prepare(db, path, max_bytes, wal_there)
            make_private(path)
            store = cls(path, db)
            store._write_pending_runs()
            try:
                mark_open(db, path, True)
            except sqlite3.OperationalError as exc:
                if not getattr(exc, "sqlite_errorname", "").startswith("SQLITE_FULL"):
                    raise
                # A full disk is waited out as in any write; only a missing WAL after
                # this run would go unnoticed.
                log.warning("%s: cannot mark the store open (%s)", path, exc)
            return store
        except sqlite3.Error as exc:
            db.close()
            raise error_for(path, exc) from None
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
                raise StoreDamaged(
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
            raise error_for(self.path, exc) from None
        except ValueError as exc:  # arguments that do not decode
            raise StoreDamaged(f"{self.path}: not a readable store ({exc})") from None

    def _recover(self) -> Iterator[Change]:
        db = self._db
        decode = _decode_arguments
        # Who may log in where first: vhosts, users, then permissions.
        access = db.execute("SELECT kind, a, b, value FROM access").fetchall()
        for kind, a, b, value in sorted(access, key=lambda row: ACCESS_ORDER.index(row[0])):
            if kind == "vhost":
                yield VhostSet(a)
            elif kind == "user":
                fields = json.loads(value)
                yield UserSet(a, fields["hash"], tuple(fields["tags"]))
            elif kind == "permission":
                yield PermissionSet(a, b)
            else:
                fields = json.loads(value)
                yield PolicySet(
                    a,
                    b,
                    fields["pattern"],
                    fields["apply_to"],
                    fields["priority"],
                    fields["definition"],
                    kind == "operator-policy",
                )
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
                "SELECT msg_id, address, header, body, deadline, crc FROM messages"
                " WHERE queue = ? ORDER BY msg_id",
                (queue_id,),
            )
            fetch = cursor.fetchmany
            while rows := fetch(FETCH_ROWS):
                for msg_id, address, header, body, deadline, crc in rows:
                    if crc is not None and crc != message_crc(address, header, body):
                        raise StoreDamaged(
                            f"{self.path}: message {msg_id} of queue '{name}' in vhost"
                            f" '{vhost}' does not match its checksum"
                        )
                    yield new(
                        Enqueued, (vhost, name, msg_id, address, header, body, deadline, True)
                    )
            for msg_id, count in db.execute(
                "SELECT msg_id, count FROM deliveries WHERE queue = ? ORDER BY msg_id",
                (queue_id,),
            ).fetchall():
                yield Redelivered(vhost, name, msg_id, count)
        # Deduplication keys last, their owners made: each owner's in the order taken.
        for vhost, kind, owner, seq, key, expires in db.execute(
            "SELECT vhost, kind, owner, seq, key, expires FROM dedup"
            " ORDER BY vhost, kind, owner, seq"
        ).fetchall():
            yield DedupSeen(vhost, kind, owner, key, expires, seq, 0, True)

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
            raise StoreError(describe(self.path, exc)) from None
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

    def abandon(self) -> None:
        """Close a store found damaged while read (before ``start``): nothing written."""
        self._closed = True
        self._db.close()

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
        # Even a broken store: SQLite's own close writes its log back whatever we do, and a
        # store whose log went that way must not read as one whose log was lost.
        if self.broken is not None:
            self._rollback()
        try:
            mark_open(self._db, self.path, False)  # with the checkpoint
        except (sqlite3.Error, OSError) as exc:
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
        if self.broken is not None:
            self.failures += 1
            return StoreFailure(first_lsn, last_lsn, self.broken, broken=True)
        retained = self._retained
        error, retry = self._attempt([retained, *batches])
        if error is None:
            self._retained = []
            return None
        self.failures += 1
        if self.broken is not None:
            log.error(
                "%s: the disk failed (%s): the write of LSN %d..%d and every later one are"
                " refused; restart the server once the disk is mended",
                self.path,
                error,
                first_lsn,
                last_lsn,
            )
            self._retained = []
            return StoreFailure(first_lsn, last_lsn, error, broken=True)
        if not retry:
            log.error(
                "%s: a write of LSN %d..%d was dropped: %s", self.path, first_lsn, last_lsn, error
            )
            self._retained = []
            return StoreFailure(first_lsn, last_lsn, error)
        # The wiring, delivery marks and settles of the failed write must still reach the
        # disk: tried again at once without the messages (settles free space), and at the
        # front of every later write while that fails.
        retained = [*retained, *without_enqueued(chain.from_iterable(batches))]
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
            if getattr(exc, "sqlite_errorname", "").startswith("SQLITE_IOERR"):
                # Not rolled back now: nothing more is asked of this connection until close.
                self.broken = f"{exc} ({exc.sqlite_errorname})"  # type: ignore[attr-defined]
                return self.broken, False
            self._rollback()
            if isinstance(exc, _TRANSIENT) or type(exc) is sqlite3.DatabaseError:
                return str(exc), True
            log.exception("%s: changes the store cannot write", self.path)
            return f"{type(exc).__name__}: {exc}", False

    def _transaction(self, batches: list[Sequence[Change]]) -> None:
        db = self._db
        synchronous = "FULL" if any(map(needs_sync, batches)) else "NORMAL"
        if synchronous != self._synchronous:
            db.execute(f"PRAGMA synchronous = {synchronous}")  # not allowed inside a transaction
            self._synchronous = synchronous
        write = Write(db, self._queue_ids, self._high_id, self._counted)
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
            self._counted.update(map(tuple, db.execute(COUNTED_QUEUES).fetchall()))

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
