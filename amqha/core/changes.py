"""The change stream: every change of durable state, as one value.

Owns: the value types the core emits when durable state changes, and ``ChangeLog``,
the ordered list they are appended to until the host takes them (raft's ``Ready``:
the core says what must be persisted or sent, the host reports back what is safe).

A change carries resolved results, never the command that produced it: the chosen
``amq.gen-`` queue name, the rewritten bytes of a dead letter, a wall-clock deadline.
Applying the same changes in the same order to an empty state gives the same state
(``amqha.core.apply``), which is how a restart reads the store back and how the
PASSIVE follows the ACTIVE. See docs/durability.md.

What is logged: changes to durable exchanges, durable (non-exclusive) queues and the
bindings between durable ends, and every message on a durable queue (``persistent``
says whether the store keeps it). Transient queues log nothing: their speed is today's.

Must not know: the store, the loop, sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class ExchangeDeclared(NamedTuple):
    vhost: str
    name: str
    kind: str
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]


class ExchangeDeleted(NamedTuple):
    vhost: str
    name: str


class QueueDeclared(NamedTuple):
    vhost: str
    name: str
    auto_delete: bool
    arguments: dict[str, Any]


class QueueDeleted(NamedTuple):
    vhost: str
    name: str


class Bound(NamedTuple):
    """A binding from exchange ``source`` to a queue or (``to_exchange``) an exchange."""

    vhost: str
    source: str
    destination: str
    to_exchange: bool
    routing_key: str
    arguments: dict[str, Any]


class Unbound(NamedTuple):
    vhost: str
    source: str
    destination: str
    to_exchange: bool
    routing_key: str
    arguments: dict[str, Any]


class Enqueued(NamedTuple):
    """A message reached a queue. ``deadline``: wall-clock seconds when it expires, or None."""

    vhost: str
    queue: str
    msg_id: int
    address: bytes
    header: bytes
    body: bytes
    deadline: float | None
    persistent: bool


class Delivered(NamedTuple):
    """Message ``msg_id`` of the queue went to a consumer: up to it, a restart or a
    failover marks messages redelivered."""

    vhost: str
    queue: str
    msg_id: int


class Redelivered(NamedTuple):
    """Message ``msg_id`` of a quorum queue went to a consumer for the ``deliveries``-th time
    (2 and up: a first delivery is told by ``Delivered``). Its ``x-delivery-count`` and
    ``x-delivery-limit`` follow it through a restart or a failover."""

    vhost: str
    queue: str
    msg_id: int
    deliveries: int


class Settled(NamedTuple):
    """Messages left the queue for good: acked, rejected, expired, purged, dropped by a
    length limit, dead-lettered (``reason``)."""

    vhost: str
    queue: str
    msg_ids: tuple[int, ...]
    reason: str


class DedupSeen(NamedTuple):
    """A deduplication cache took ``key`` (``core.dedup``): the ``owner`` exchange
    (``kind`` "x") or queue ("q") drops a message with that key until ``expires``
    (wall-clock seconds, None: until evicted). ``seq`` numbers the owner's keys; the
    store keeps the last ``keep`` of them, and only when ``persistent``."""

    vhost: str
    kind: str
    owner: str
    key: bytes
    expires: float | None
    seq: int
    keep: int
    persistent: bool


class UserSet(NamedTuple):
    """A user made or changed at run time (``core.access``): its password as a hash in a
    format ``config.passwords`` reads, and its tags. The users of the config files are
    never changed this way."""

    name: str
    password_hash: str
    tags: tuple[str, ...]


class UserDeleted(NamedTuple):
    name: str


class VhostSet(NamedTuple):
    """A vhost made at run time."""

    vhost: str


class VhostDeleted(NamedTuple):
    """A vhost made at run time is gone (its queues and exchanges were deleted first)."""

    vhost: str


class PermissionSet(NamedTuple):
    """``user`` may use ``vhost`` (full rights: amqha has no narrower ones)."""

    vhost: str
    user: str


class PermissionDeleted(NamedTuple):
    vhost: str
    user: str


class PolicySet(NamedTuple):
    """A policy (``operator``: an operator policy) of ``vhost`` made or changed: RabbitMQ's
    pattern, apply-to, priority and definition (``core.policies``)."""

    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: dict[str, Any]
    operator: bool


class PolicyDeleted(NamedTuple):
    vhost: str
    name: str
    operator: bool


# The changes of who may log in where, applied by ``core.access``.
ACCESS_CHANGES = (UserSet, UserDeleted, VhostSet, VhostDeleted, PermissionSet, PermissionDeleted)
# The changes of a vhost's policies (``core.policies``).
POLICY_CHANGES = (PolicySet, PolicyDeleted)


class Reset(NamedTuple):
    """A snapshot starts: every durable exchange, queue, binding and message is dropped,
    and the changes that follow rebuild them (a PASSIVE joining its ACTIVE)."""

    vhost: str = ""


class Batch(NamedTuple):
    """A transaction's changes: applied all or none."""

    changes: tuple[Any, ...]


Change = (
    ExchangeDeclared
    | ExchangeDeleted
    | QueueDeclared
    | QueueDeleted
    | Bound
    | Unbound
    | Enqueued
    | Delivered
    | Redelivered
    | Settled
    | DedupSeen
    | UserSet
    | UserDeleted
    | VhostSet
    | VhostDeleted
    | PermissionSet
    | PermissionDeleted
    | PolicySet
    | PolicyDeleted
    | Reset
    | Batch
)

# Entries of the log that are not changes of state: a PASSIVE's records for its own
# store (docs/durability.md, section 5). The store writes them; nothing applies them, and
# the replication feed never carries them.


class PendingRun(NamedTuple):
    """A run from the ACTIVE (``core.codec`` bytes) kept as received: durable once its
    write commits, so the PASSIVE may ack it before decoding it. ``seq`` orders the runs
    kept at once."""

    seq: int
    data: bytes


class RunWritten(NamedTuple):
    """Ends the write of a pending run's changes: the run is removed in the same
    transaction. The run was on disk already, so that write commits without an fsync
    (a crash before the next fsync loses it whole, and the run is written again at open)."""

    seq: int


class SnapshotPart(NamedTuple):
    """Ends a snapshot's run before its last: its write commits without an fsync. Nothing
    confirmed waits for it: the snapshot's last run commits with one (``SnapshotEnd``),
    which makes every write before it durable too (the WAL is one file, written in
    order), and a server that crashes before that holds the data dir's ``incomplete``
    mark and takes a new snapshot (docs/durability.md, section 5)."""


class Unsynced(NamedTuple):
    """Ends a PASSIVE's live run that holds nothing a confirm waits for (settles, delivery
    marks, transient messages): its write commits without an fsync, as the ACTIVE writes
    such changes, and the next write with one makes it durable too (the WAL is one file,
    written in order). Lost in a power cut, the same run redelivers, never loses
    (docs/durability.md, section 5)."""


class SnapshotEnd(NamedTuple):
    """Ends a snapshot's last run: its write commits with an fsync whatever it holds (an
    empty run, transient messages or delivery marks alone), so the snapshot is on disk
    before its ack."""


# What the change log carries: changes of state, and the store's own records.
Entry = Change | PendingRun | RunWritten | SnapshotPart | SnapshotEnd | Unsynced

# The kinds a persistent store must have on disk before a confirm (Delivered, Redelivered
# and Settled are made safe by the next write: losing them redelivers, never loses).
WIRING = (ExchangeDeclared, ExchangeDeleted, QueueDeclared, QueueDeleted, Bound, Unbound, Reset)


class ChangeLog:
    """The ordered changes not yet taken by the host, and their sequence numbers.

    ``lsn`` is the sequence number of the last change appended (0: none yet).
    ``sync_lsn`` is that of the last change a confirm must wait for: a persistent
    message on a durable queue, or wiring. ``on_first`` is called when a change is
    appended to an empty log (the host schedules ``take`` once per turn of its loop).
    """

    __slots__ = (
        "pending",
        "lsn",
        "sync_lsn",
        "on_first",
        "_batch",
        "_batch_sync",
        "_marks",
        "_acking",
        "_acks_reason",
        "_acks",
    )

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self.pending: list[Entry] = []
        self.lsn = 0
        self.sync_lsn = 0
        self.on_first = on_first
        self._batch: list[Entry] | None = None
        self._batch_sync = False
        self._marks: dict[object, int] = {}  # a queue's Delivered in ``pending``: its index
        # The queue whose settles the last change in ``pending`` gathers, why, their ids.
        self._acking: object | None = None
        self._acks_reason = ""
        self._acks: list[int] = []

    def emit(self, change: Entry, sync: bool = False) -> None:
        batch = self._batch
        if batch is not None:
            batch.append(change)
            self._batch_sync = self._batch_sync or sync
            return
        if self._acking is not None:
            self._close_acks()
        pending = self.pending
        if not pending and self.on_first is not None:
            self.on_first()
        pending.append(change)
        self.lsn += 1
        if sync:
            self.sync_lsn = self.lsn

    def emit_delivered(self, queue: object, change: Delivered) -> None:
        """A delivery of ``queue``'s (``Delivered``): its mark is a maximum, read when a
        message is delivered again (docs/durability.md, section 1, "Redelivered"), so a turn
        needs one per queue. A later one of the same turn replaces the first in place,
        not appended: a consumer's every delivery is not a change of its own for the
        store and the PASSIVE. In a transaction's batch, appended."""
        at = self._marks.get(queue)
        if at is not None and self._batch is None:
            before: Any = self.pending[at]
            if change.msg_id > before.msg_id:
                self.pending[at] = change
            return
        if self._batch is None:
            self._marks[queue] = len(self.pending)
        self.emit(change)

    def emit_settled(self, queue: object, change: Settled) -> None:
        """One of ``queue``'s messages settled (``Settled`` of one id: an ack, a no-ack
        delivery). Right after another of the same queue for the same reason (nothing
        else emitted between, a delivery mark raised in place aside), it joins that
        change's ids: one ``Settled`` of many ids is what they would do one by one, in
        the same place of the order, and a consumer settling each message does not make
        a change of each for the store and the PASSIVE. The change is closed (its ids a
        tuple again) when anything else is emitted, or at ``take``. In a transaction's
        batch, appended."""
        if self._acking is queue and self._batch is None and change[3] == self._acks_reason:
            self._acks.append(change[2][0])
            return
        self.emit(change)
        if self._batch is None:
            self._acking = queue
            self._acks_reason = change[3]
            self._acks = [change[2][0]]

    def _close_acks(self) -> None:
        acks = self._acks
        if len(acks) > 1:
            last: Any = self.pending[-1]
            self.pending[-1] = Settled(last[0], last[1], tuple(acks), last[3])
        self._acking = None

    def extend(self, changes: list[Entry], sync: bool = False) -> None:
        """``emit`` each of ``changes``, in one step."""
        if self._batch is not None or not changes:
            for change in changes:
                self.emit(change, sync)
            return
        if self._acking is not None:
            self._close_acks()
        pending = self.pending
        if not pending and self.on_first is not None:
            self.on_first()
        pending += changes
        self.lsn += len(changes)
        if sync:
            self.sync_lsn = self.lsn

    def begin_batch(self) -> None:
        self._batch = []
        self._batch_sync = False

    def end_batch(self) -> int:
        """Close the transaction: its changes become one Batch (nothing if empty). The
        LSN its commit must wait for: the Batch's, if a change in it needs the disk (0:
        none does)."""
        batch, self._batch = self._batch, None
        if not batch:
            return 0
        self.emit(Batch(tuple(batch)), self._batch_sync)
        return self.lsn if self._batch_sync else 0

    def take(self) -> tuple[int, list[Entry]]:
        """The pending changes and the LSN of the first; the log is empty afterwards."""
        if self._acking is not None:
            self._close_acks()
        pending = self.pending
        self.pending = []
        if self._marks:
            self._marks = {}
        return self.lsn - len(pending) + 1, pending
