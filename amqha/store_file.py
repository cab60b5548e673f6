"""The store's file: its layout, its version, and making and opening it safely.

Owns: the schema and the version it is at (an older file gets what it lacks at open),
the SQLite header's application id, a new store made whole or not at all (``create``),
the settings and checks at open under the exclusive lock (``prepare``: WAL,
``synchronous=FULL``, the disk budget), the files readable by this server's user only
(``make_private``), and one line for what SQLite said went wrong (``StoreError``,
``describe``). See docs/durability.md, section 4.

Must not know: the change stream, the writer thread, what is in the tables beyond
their shape (``store``, ``store_write``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time

# 2: the runs table; 3: the deliveries table; 4: the dedup table; 5: each message's
# checksum; 6: the access table (an older file gets what it lacks at open)
SCHEMA_VERSION = 6
APPLICATION_ID = 0x616D7168  # "amqh" in the SQLite header: the file is an amqha store
# The smallest disk budget that holds the empty schema with room to work.
MIN_BYTES = 80 * 1024
# After a checkpoint the WAL file is cut back to this (one large write leaves no large file).
WAL_LIMIT = 64 * 1024 * 1024
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
    crc INTEGER,
    PRIMARY KEY (queue, msg_id)
) WITHOUT ROWID;
CREATE TABLE runs (seq INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE deliveries (
    queue INTEGER NOT NULL, msg_id INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (queue, msg_id)
) WITHOUT ROWID;
CREATE TABLE dedup (
    vhost TEXT NOT NULL, kind TEXT NOT NULL, owner TEXT NOT NULL, seq INTEGER NOT NULL,
    key BLOB NOT NULL, expires REAL,
    PRIMARY KEY (vhost, kind, owner, seq)
) WITHOUT ROWID;
CREATE TABLE access (
    kind TEXT NOT NULL, a TEXT NOT NULL, b TEXT NOT NULL, value TEXT,
    PRIMARY KEY (kind, a, b)
) WITHOUT ROWID;
"""
_RUNS_TABLE = "CREATE TABLE runs (seq INTEGER PRIMARY KEY, data BLOB NOT NULL)"
# A quorum queue's delivery counts of 2 and more (``Redelivered``), for stored messages.
_DELIVERIES_TABLE = (
    "CREATE TABLE deliveries (queue INTEGER NOT NULL, msg_id INTEGER NOT NULL,"
    " count INTEGER NOT NULL, PRIMARY KEY (queue, msg_id)) WITHOUT ROWID"
)


# The run-time users ("user", name, "", their hash and tags as JSON), vhosts ("vhost",
# name, "") and permissions ("permission", vhost, user) of ``core.access``.
_ACCESS_TABLE = (
    "CREATE TABLE access (kind TEXT NOT NULL, a TEXT NOT NULL, b TEXT NOT NULL, value TEXT,"
    " PRIMARY KEY (kind, a, b)) WITHOUT ROWID"
)


# A deduplication cache's keys kept on disk (``changes.DedupSeen``).
_DEDUP_TABLE = (
    "CREATE TABLE dedup (vhost TEXT NOT NULL, kind TEXT NOT NULL, owner TEXT NOT NULL,"
    " seq INTEGER NOT NULL, key BLOB NOT NULL, expires REAL,"
    " PRIMARY KEY (vhost, kind, owner, seq)) WITHOUT ROWID"
)


class StoreError(Exception):
    """The store cannot be used: one line naming the file and the problem."""


class StoreDamaged(StoreError):
    """The store's file is damaged (pages SQLite finds corrupt, not a database, cut short,
    a row that does not decode): a pair's server sets it aside and takes its state from
    its peer (docs/durability.md, section 4, "A damaged store")."""


def error_for(path: str, exc: sqlite3.Error) -> StoreError:
    """The error to raise for what SQLite raised on ``path``: damage, or another problem."""
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return StoreDamaged(describe(path, exc))
    return StoreError(describe(path, exc))


def check_pages(db: sqlite3.Connection, path: str) -> None:
    """SQLite's own check of every page and index (``quick_check``): StoreDamaged with
    the first problems it names."""
    problems = [row[0] for row in db.execute("PRAGMA quick_check(3)").fetchall()]
    if problems != ["ok"]:
        raise StoreDamaged(f"{path}: damaged pages ({'; '.join(map(str, problems))})")


def describe(path: str, exc: sqlite3.Error) -> str:
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


def set_aside(path: str, now: float) -> str:
    """Move a damaged store (with its WAL and shared-memory files) into ``damaged/``
    beside it (0700), named by the time; returns its new path. Nothing is deleted: what
    it holds is the operator's to read (docs/durability.md, section 4, "A damaged store")."""
    folder = os.path.join(os.path.dirname(os.path.abspath(path)), "damaged")
    os.makedirs(folder, mode=PRIVATE_DIRECTORY, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    target = os.path.join(folder, f"{stamp}-{os.path.basename(path)}")
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + suffix, target + suffix)
    _sync_directory(folder)
    _sync_directory(os.path.dirname(os.path.abspath(path)))
    return target


def create(path: str) -> None:
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
        raise StoreError(describe(path, exc)) from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot create the store ({exc.strerror})") from None


def _sync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


_HEADER = b"SQLite format 3\0"


def check_length(path: str) -> bool:
    """A store cut short (or padded) is found before SQLite reads it, by what its own
    header says (StoreDamaged): a length that is not a whole number of its pages, or,
    with no write-ahead log to finish it, fewer pages than the header counts. Returns
    whether the file's WAL was there (``prepare`` needs to know before SQLite makes one)."""
    wal = path + "-wal"
    wal_there = os.path.exists(wal)
    with open(path, "rb") as file:
        header = file.read(100)
        size = file.seek(0, os.SEEK_END)
    if len(header) < 100 or not header.startswith(_HEADER):
        return wal_there  # not SQLite's: prepare says what it is
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    counted = header[24:28] == header[92:96]  # the header's page count is current
    if page_size < 512 or size % page_size:
        raise StoreDamaged(
            f"{path}: not a readable store (cut short: {size} bytes is not a whole number"
            f" of its {page_size}-byte pages)"
        )
    whole_wal = wal_there and os.path.getsize(wal) > 0
    if counted and not whole_wal and size < pages * page_size:
        raise StoreDamaged(
            f"{path}: not a readable store (cut short: {size // page_size} of the"
            f" {pages} pages its header counts)"
        )
    return wal_there


def check_closed_or_logged(db: sqlite3.Connection, path: str, wal_there: bool) -> None:
    """A store a process had open (``meta.open`` is 1 in the main file) and that was
    not closed cleanly has its write-ahead log beside it: its last commits may be only
    there. Without it they are gone, and the file is not served from (StoreDamaged)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'open'").fetchone()
    if row is not None and row[0] == 1 and not wal_there:
        raise StoreDamaged(
            f"{path}: not a readable store (its write-ahead log {os.path.basename(path)}-wal"
            " is missing, and the store was not closed cleanly: its last writes are gone)"
        )


def mark_open(db: sqlite3.Connection, path: str, is_open: bool) -> None:
    """``meta.open``, written through to the main file (a checkpoint) and synced with
    the folder: 1 from open until a clean close (``check_closed_or_logged``)."""
    db.execute("INSERT OR REPLACE INTO meta VALUES ('open', ?)", (int(is_open),))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _sync_directory(os.path.dirname(os.path.abspath(path)))


def make_private(path: str) -> None:
    """The store, its WAL and its shared-memory file readable by this server's user only,
    whatever the umask (SQLite makes the last two itself) and however an older version
    left them."""
    for name in (path, path + "-wal", path + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(name, PRIVATE_FILE)


def prepare(
    db: sqlite3.Connection, path: str, max_bytes: int | None, wal_there: bool = True
) -> None:
    """Settings and version check, under the exclusive lock the connection keeps until
    it closes; a store whose write-ahead log went missing is refused (``wal_there``:
    whether it was beside the file before SQLite opened it)."""
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
            raise StoreDamaged(
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
        if version < 4:
            db.execute(_DEDUP_TABLE)
        if "access" not in tables:
            db.execute(_ACCESS_TABLE)
        columns = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
        if "crc" not in columns:
            # Rows written before version 5 have none (NULL): read as they are.
            db.execute("ALTER TABLE messages ADD COLUMN crc INTEGER")
        check_closed_or_logged(db, path, wal_there)
        if version < SCHEMA_VERSION:
            db.execute("UPDATE meta SET value = ? WHERE key = 'version'", (SCHEMA_VERSION,))
        db.execute("COMMIT")
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")
    check_pages(db, path)
    if max_bytes is not None:
        (page_size,) = db.execute("PRAGMA page_size").fetchone()
        db.execute(f"PRAGMA max_page_count = {max_bytes // page_size}")
