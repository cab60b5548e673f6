"""One write of the store: a transaction's worth of the change stream, as SQL.

Owns: the statements that write the change stream into the store's tables (messages in
multi-row INSERTs, settles and delivery counts as one statement per queue, delivery
marks, wiring, pending runs, a reset), what a write leaves out (a message settled in the
write that enqueued it never touches the disk), which writes need an fsync of their own
(``needs_sync``) and what a failed write keeps for the next (``without_enqueued``). See
docs/durability.md, section 4.

Must not know: the writer thread, transactions and their retries (``store.Store``), the
file's creation and checks (``store_file``), the core's objects (it sees change values
only).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any
from zlib import crc32

from amqha.core.changes import (
    ACCESS_CHANGES,
    POLICY_CHANGES,
    Batch,
    Bound,
    Change,
    DedupSeen,
    Delivered,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    PendingRun,
    PermissionDeleted,
    PermissionSet,
    PolicySet,
    QueueDeclared,
    QueueDeleted,
    Redelivered,
    Reset,
    RunWritten,
    Settled,
    SnapshotEnd,
    SnapshotPart,
    Unbound,
    Unsynced,
    UserDeleted,
    UserSet,
    VhostDeleted,
    VhostSet,
)
from amqha.wire import field_table

# Rows per INSERT statement.
INSERT_ROWS = 128

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
# One statement per queue per write (per SETTLE_IDS of its ids), the ids as one JSON array:
# one step, not one per id.
SETTLE_IDS = 10_000  # message ids one DELETE lists
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
_SETTLE_RANGE = f"DELETE FROM messages WHERE queue = {_QUEUE_ID} AND msg_id BETWEEN ? AND ?"
_SETTLE_COUNTS_RANGE = (
    f"DELETE FROM deliveries WHERE queue = {_QUEUE_ID} AND msg_id BETWEEN ? AND ?"
)
# Ids in a row from this many on are settled as a range.
RANGE_IDS = 8
_DELETE_COUNTS = f"DELETE FROM deliveries WHERE queue = {_QUEUE_ID}"
COUNTED_QUEUES = (
    "SELECT DISTINCT vhost, name FROM queues WHERE id IN (SELECT queue FROM deliveries)"
)
# A deduplication cache's keys (``DedupSeen``): an owner keeps its last ``keep`` by seq.
_ADD_KEY = "INSERT OR REPLACE INTO dedup VALUES (?, ?, ?, ?, ?, ?)"
_PRUNE_KEYS = "DELETE FROM dedup WHERE vhost = ? AND kind = ? AND owner = ? AND seq <= ?"
_DELETE_KEYS = "DELETE FROM dedup WHERE vhost = ? AND kind = ? AND owner = ?"
_ADD_RUN = "INSERT OR REPLACE INTO runs VALUES (?, ?)"
# The access table's kinds, in the order recovery gives them (a permission names both).
ACCESS_ORDER = ("vhost", "user", "permission", "policy", "operator-policy")
_PUT_ACCESS = "INSERT OR REPLACE INTO access (kind, a, b, value) VALUES (?, ?, ?, ?)"
_DELETE_ACCESS = "DELETE FROM access WHERE kind = ? AND a = ? AND b = ?"
_REMOVE_RUN = "DELETE FROM runs WHERE seq = ?"
_REMOVE_RUNS_BEFORE = "DELETE FROM runs WHERE seq < ?"


def settle_ranges(ids: Any) -> tuple[list[tuple[int, int]], list[int]]:
    """A queue's settled ids as (the ranges of RANGE_IDS or more ids in a row, low and
    high included; the other ids). Every id of a range is one of ``ids``: its DELETE
    takes no other message."""
    ordered = sorted(ids)
    ranges: list[tuple[int, int]] = []
    rest: list[int] = []
    count = len(ordered)
    at = 0
    while at < count:
        low = ordered[at]
        end = at + 1
        while end < count and ordered[end] == ordered[end - 1] + 1:
            end += 1
        if end - at >= RANGE_IDS:
            ranges.append((low, ordered[end - 1]))
        else:
            rest.extend(ordered[at:end])
        at = end
    return ranges, rest


def message_crc(address: bytes, header: bytes, body: bytes) -> int:
    """A stored message's checksum (CRC-32 of its address, header and body): a byte
    changed on disk inside a row, which no page check of SQLite's sees, is found when
    the row is read back (docs/durability.md, section 4, "A damaged store")."""
    return crc32(body, crc32(header, crc32(address)))


def _insert_sql(rows: int) -> str:
    """INSERT of ``rows`` messages, their columns bound as one flat list."""
    return "INSERT OR IGNORE INTO messages VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * rows)


# Statements of 128, 64, ..., 1 rows: a write of n messages runs n // 128 full ones and
# at most seven more, and the statement cache holds eight texts, whatever n is.
_INSERT_SIZES = tuple(INSERT_ROWS >> shift for shift in range(INSERT_ROWS.bit_length()))
_INSERTS = {size: _insert_sql(size) for size in _INSERT_SIZES}

_UNKNOWN = object()


def _arguments(table: dict[str, Any]) -> bytes:
    return field_table(table) if table else b""


def _binding_arguments(table: dict[str, Any]) -> bytes:
    # Keys sorted: a binding is the same binding whatever order its arguments came in
    # (as the core's own binding key), so Unbound finds the row Bound wrote.
    return field_table(dict(sorted(table.items()))) if table else b""


_NOT_KEPT = (Enqueued, PendingRun, RunWritten, SnapshotPart, SnapshotEnd, Unsynced)
# The last entry of a write that needs no fsync of its own (see ``needs_sync``).
_NO_SYNC = (RunWritten, SnapshotPart, Unsynced)


def without_enqueued(changes: Iterable[Change]) -> Iterator[Change]:
    """The changes a failed write keeps for the next one, Batches unpacked. Pending runs
    go like messages; so does a ``RunWritten``: a run whose changes were not all written
    stays, and is written again at open. The snapshot's markers go too: what is kept is
    written with an fsync."""
    for change in changes:
        if type(change) is Batch:
            yield from without_enqueued(change.changes)
        elif type(change) not in _NOT_KEPT:
            yield change


def needs_sync(changes: Iterable[Any]) -> bool:
    """Whether a write holding ``changes`` must be on disk when its commit returns: it
    holds wiring or a persistent message. Delivery marks and settles alone are made
    durable by the next such write (losing them redelivers, never loses: see
    docs/durability.md), so their commit skips the fsync (``synchronous=NORMAL``). So
    does a pending run's changes: the run itself is on disk (``RunWritten`` ends them);
    and a snapshot's run before its last (``SnapshotPart`` ends it): the last one's fsync
    covers it, and nothing waits for it before that; and a live run the follower found
    needs none (``Unsynced`` ends it). A ``SnapshotEnd`` always needs one."""
    if isinstance(changes, (list, tuple)) and changes and type(changes[-1]) in _NO_SYNC:
        return False
    for change in changes:
        kind = type(change)
        if kind is Settled or kind is Delivered or kind is Redelivered or kind is DedupSeen:
            continue
        if kind is Enqueued:
            if change.persistent:
                return True
        elif kind is Batch:
            if needs_sync(change.changes):
                return True
        else:
            return True
    return False


class Write:
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
        "keys",
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
        # Deduplication keys to keep, and per owner the last seq and how many it keeps.
        self.keys: dict[Any, list[DedupSeen]] = {}
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
            elif kind is DedupSeen:
                if change.persistent:
                    self.keys.setdefault(change[:3], []).append(change)
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
        # A queue's settled ids: the one change's tuple, or a set once there are more
        # (or enqueued messages to find in them).
        gone: dict[Any, Any] = {}
        for change in settled:
            key = change[:2]
            ids = gone.get(key)
            if ids is None:
                gone[key] = change.msg_ids
            else:
                if type(ids) is not set:
                    ids = gone[key] = set(ids)
                ids.update(change.msg_ids)
        if gone and enqueued:
            # Enqueued and settled in this write: neither inserted nor deleted.
            kept = []
            for message in enqueued:
                key = message[:2]
                ids = gone.get(key)
                if ids is not None and type(ids) is not set:
                    ids = gone[key] = set(ids)
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
                    address, header, body = message[3], message[4], message[5]
                    crc = crc32(body, crc32(header, crc32(address)))  # message_crc, inlined
                    add((queue_id, message[2], address, header, body, message[6], crc))
            at, count, size = 0, len(values) // 7, INSERT_ROWS
            while at < count:
                while size > count - at:
                    size >>= 1
                db.execute(_INSERTS[size], values[7 * at : 7 * (at + size)])
                at += size
        counted = self.counted
        for (vhost, name, msg_id), count in self.redelivered.items():
            db.execute(_COUNT_DELIVERY, (count, vhost, name, msg_id))
            counted.add((vhost, name))
        for (vhost, name), ids in gone.items():
            # Ids in a row (a consumer acks in the order it got them) go as ranges: a
            # range's DELETE walks the rows in key order, less than half the CPU of
            # finding each listed id. The rest are listed, SETTLE_IDS a statement:
            # listing them holds the GIL (this module is compiled and never yields it),
            # a DELETE's step lets it go. A purge of a million listed in one held it for
            # 0.3 s, and the loop's thread stood still.
            ranges, ids = settle_ranges(ids)
            both = (vhost, name) in counted
            for low, high in ranges:
                db.execute(_SETTLE_RANGE, (vhost, name, low, high))
                if both:
                    db.execute(_SETTLE_COUNTS_RANGE, (vhost, name, low, high))
            for at in range(0, len(ids), SETTLE_IDS):
                listed = "[" + ",".join(map(str, ids[at : at + SETTLE_IDS])) + "]"
                db.execute(_SETTLE, (vhost, name, listed))
                if both:
                    db.execute(_SETTLE_COUNTS, (vhost, name, listed))
        for (vhost, name), msg_id in self.delivered.items():
            db.execute(_MARK_DELIVERED, (msg_id, vhost, name))
        for owner, keys in self.keys.items():
            db.executemany(_ADD_KEY, [(*owner, k.seq, k.key, k.expires) for k in keys])
            last = keys[-1]
            db.execute(_PRUNE_KEYS, (*owner, last.seq - last.keep))
        # Emptied in place: ``add`` holds their bound methods across a flush.
        self.enqueued.clear()
        self.settled.clear()
        self.delivered.clear()
        self.redelivered.clear()
        self.keys.clear()

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
            db.execute(_DELETE_KEYS, (vhost, "q", name))
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
            db.execute(_DELETE_KEYS, (vhost, "x", name))
        elif kind in ACCESS_CHANGES or kind in POLICY_CHANGES:
            _write_access(db, change)
        elif kind is PendingRun:
            db.execute(_ADD_RUN, change)
        elif kind is RunWritten:
            db.execute(_REMOVE_RUN, change)
        elif kind is SnapshotPart or kind is SnapshotEnd or kind is Unsynced:
            pass  # they only say whether the write needs an fsync (``needs_sync``)
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
            db.execute("DELETE FROM dedup")
            db.execute("DELETE FROM access")
            db.execute("DELETE FROM bindings")
            db.execute("DELETE FROM queues")
            db.execute("DELETE FROM exchanges")
            self.queue_ids.clear()
        else:
            raise TypeError(f"not a change: {change!r}")


def _write_access(db: sqlite3.Connection, change: Any) -> None:
    """A run-time user's, vhost's, permission's or policy's row (``core.access``,
    ``core.policies``)."""
    kind = type(change)
    if kind is UserSet:
        value = json.dumps({"hash": change.password_hash, "tags": list(change.tags)})
        db.execute(_PUT_ACCESS, ("user", change.name, "", value))
    elif kind is UserDeleted:
        db.execute(_DELETE_ACCESS, ("user", change.name, ""))
        db.execute("DELETE FROM access WHERE kind = 'permission' AND b = ?", (change.name,))
    elif kind is VhostSet:
        db.execute(_PUT_ACCESS, ("vhost", change.vhost, "", None))
    elif kind is VhostDeleted:
        db.execute(_DELETE_ACCESS, ("vhost", change.vhost, ""))
        db.execute("DELETE FROM access WHERE kind <> 'user' AND a = ?", (change.vhost,))
    elif kind is PermissionSet:
        db.execute(_PUT_ACCESS, ("permission", change.vhost, change.user, None))
    elif kind is PermissionDeleted:
        db.execute(_DELETE_ACCESS, ("permission", change.vhost, change.user))
    elif kind is PolicySet:
        fields = {
            "pattern": change.pattern,
            "apply_to": change.apply_to,
            "priority": change.priority,
            "definition": change.definition,
        }
        kind_name = "operator-policy" if change.operator else "policy"
        db.execute(_PUT_ACCESS, (kind_name, change.vhost, change.name, json.dumps(fields)))
    else:
        kind_name = "operator-policy" if change.operator else "policy"
        db.execute(_DELETE_ACCESS, (kind_name, change.vhost, change.name))
