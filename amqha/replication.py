"""Replication: the ACTIVE's change stream, pushed to the PASSIVE over the peering.

Owns: the ``Feed`` on the ACTIVE and the ``Follower`` on the PASSIVE.

- The feed has at most one subscriber: a ``peering`` login consuming the control queue
  ``amq.replication``. It sends a snapshot of the replicated state (from a ``Reset``),
  then every live change after it, in one ordered stream of deliveries: a change can
  never overtake the snapshot. Each delivery is a run of changes (``core.codec``). The
  subscriber's acks are the replication watermark ("the PASSIVE holds everything up to
  LSN n"), its prefetch the flow control. Once it has acked the snapshot's end it is
  *in sync*; confirms then wait for it as well as for the store.
- The follower keeps a lean consuming link (``peering.ConsumerLink``) to the ACTIVE
  subscribed to the feed. Each run is handled in the socket's read. While catching up:
  decoded and handed to its own store; applied with ``core.apply`` (the same function as
  recovery) once the store's writer waits for the disk; acked on the socket once the
  store has it. In sync, a live run is kept in the store as received (a pending run),
  acked once that is on disk, then decoded, applied and written (no fsync: the run was
  on disk first): the decode and the rows are off the confirm's way.

Must not know: the failover state machine (the pair tells the broker to lead or to
follow: see ``Broker.lead``/``Broker.follow``), the store's files. See
docs/durability.md, section 5.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.header import ContentHeader

from peering import ConsumerLink, Link

from . import wire
from .core import codec
from .core.apply import apply_run, state_changes
from .core.changes import Bound, Change, Enqueued, QueueDeclared, Reset, Settled, Unbound
from .store import PendingRun, RunWritten

if TYPE_CHECKING:
    from .channel import Channel
    from .server import Broker

log = logging.getLogger("amqha.replication")

FEED_QUEUE = "amq.replication"
# A delivery carries at most this many changes, or about this many bytes.
RUN_CHANGES = 2000
RUN_BYTES = 512 * 1024
# Deliveries the follower lets the feed have in flight.
FOLLOWER_PREFETCH = 16
# A subscriber this far behind (bytes of changes waiting for it) is dropped: it
# subscribes again and catches up from a new snapshot instead of holding memory.
MAX_BACKLOG_BYTES = 256 * 1024 * 1024
# The headers of a run: "snapshot_end" marks the snapshot's last run.
SNAPSHOT_END = "amqha-snapshot-end"

_EMPTY_PROPERTIES = commands.Basic.Properties()


def _size(changes: list[Change]) -> int:
    """About how many bytes ``changes`` hold (for the backlog limit and the lag)."""
    return 64 * len(changes) + sum(
        [len(c.body) + len(c.header) for c in changes if type(c) is Enqueued]  # type: ignore[union-attr]
    )


class _Subscriber:
    __slots__ = ("channel", "tag", "tag_wire", "unacked", "prefetch")

    def __init__(self, channel: Channel, tag: str, prefetch: int) -> None:
        self.channel = channel
        self.tag = tag
        self.tag_wire = wire.shortstr(tag)
        # Delivery tag -> (LSN covered, whether it ends the snapshot, when sent, bytes).
        self.unacked: collections.OrderedDict[int, tuple[int, bool, float, int]] = (
            collections.OrderedDict()
        )
        self.prefetch = prefetch or FOLLOWER_PREFETCH


class Feed:
    """The ACTIVE's side: one subscriber at a time (see the module docstring)."""

    def __init__(self, broker: Broker, on_sync: Callable[[bool, str], None]) -> None:
        self.broker = broker
        self.on_sync = on_sync  # (in_sync, reason): the broker re-checks its confirms
        self.subscriber: _Subscriber | None = None
        self.in_sync = False
        self.replicated_lsn = 0  # the subscriber holds every change up to this LSN
        self.sent_lsn = 0
        self._snapshot: Iterator[Change] | None = None
        self._snapshot_lsn = 0
        # Live changes not sent yet: (first LSN, changes, their size).
        self._pending: collections.deque[tuple[int, list[Change], int]] = collections.deque()
        self.backlog_bytes = 0
        self.snapshots = 0
        self.snapshot_changes = 0

    # -- subscribing --------------------------------------------------------------------

    def subscribe(self, channel: Channel, tag: str) -> None:
        if self.subscriber is not None:
            self.drop("a new subscription replaced it")
        log_ = self.broker.log
        self.subscriber = _Subscriber(channel, tag, channel.consumer_prefetch)
        channel.feed = self
        # The state already holds every change up to the log's last LSN, taken or not.
        self._snapshot_lsn = log_.lsn if log_ is not None else 0
        self._snapshot = state_changes(self.broker.vhosts)
        self._pending.clear()
        self.backlog_bytes = 0
        self.sent_lsn = self._snapshot_lsn
        self.snapshots += 1
        self.snapshot_changes = 0
        log.info("replication: %s subscribed, sending a snapshot", channel.connection.peer)
        self.push()

    def drop(self, reason: str) -> None:
        """Forget the subscriber (its channel closed, or it fell too far behind)."""
        subscriber, self.subscriber = self.subscriber, None
        self._snapshot = None
        self._pending.clear()
        self.backlog_bytes = 0
        if subscriber is None:
            return
        subscriber.channel.feed = None
        if self.in_sync:
            self.in_sync = False
            self.on_sync(False, reason)
        log.warning("replication: subscriber dropped: %s", reason)

    def unsubscribed(self, channel: Channel) -> None:
        if self.subscriber is not None and self.subscriber.channel is channel:
            self.drop("the passive's replication link closed")

    # -- the stream ---------------------------------------------------------------------

    def live(self, first_lsn: int, changes: list[Change]) -> None:
        """Changes the broker just took from its log (every turn of the loop)."""
        if self.subscriber is None:
            return
        last = first_lsn + len(changes) - 1
        if last <= self._snapshot_lsn:
            return
        if first_lsn <= self._snapshot_lsn:
            changes = changes[self._snapshot_lsn - first_lsn + 1 :]
            first_lsn = self._snapshot_lsn + 1
        size = _size(changes)
        self._pending.append((first_lsn, changes, size))
        self.backlog_bytes += size
        if self.backlog_bytes > MAX_BACKLOG_BYTES:
            self.drop(f"the passive fell behind by more than {MAX_BACKLOG_BYTES} bytes")
            return
        self.push()

    def push(self) -> None:
        subscriber = self.subscriber
        while subscriber is not None and len(subscriber.unacked) < subscriber.prefetch:
            if self._snapshot is not None:
                changes, end = self._snapshot_run()
                self._send(subscriber, 0, changes, self._snapshot_lsn, end)
            elif self._pending:
                first, changes, last = self._live_run()
                self._send(subscriber, first, changes, last, False)
            else:
                return
            subscriber = self.subscriber

    def _snapshot_run(self) -> tuple[list[Change], bool]:
        """The snapshot's next run, taken a few changes at a time until it is full; True
        with its last run."""
        assert self._snapshot is not None
        changes: list[Change] = []
        size = 0
        while len(changes) < RUN_CHANGES and size < RUN_BYTES:
            chunk = list(itertools.islice(self._snapshot, min(64, RUN_CHANGES - len(changes))))
            if not chunk:
                self._snapshot = None
                self.snapshot_changes += len(changes)
                return changes, True
            changes += chunk
            size += _size(chunk)
        self.snapshot_changes += len(changes)
        return changes, False

    def _live_run(self) -> tuple[int, list[Change], int]:
        first, changes, size = self._pending[0]
        if len(changes) > RUN_CHANGES:
            head, tail = changes[:RUN_CHANGES], changes[RUN_CHANGES:]
            head_size = _size(head)
            self._pending[0] = (first + RUN_CHANGES, tail, size - head_size)
            changes, size = head, head_size
        else:
            self._pending.popleft()
        self.backlog_bytes -= size
        last = first + len(changes) - 1
        unreplicated = self._unreplicated()
        if unreplicated:
            changes = [c for c in changes if not _leaves_out(c, unreplicated)]
        return first, changes, last

    def _unreplicated(self) -> set[tuple[str, str]]:
        return {
            (vhost.name, name)
            for vhost in self.broker.vhosts.values()
            for name in vhost.unreplicated
        }

    def _send(
        self, subscriber: _Subscriber, first: int, changes: list[Change], last: int, end: bool
    ) -> None:
        channel = subscriber.channel
        connection = channel.connection
        body = codec.encode(first, changes)
        properties = (
            commands.Basic.Properties(headers={SNAPSHOT_END: True}) if end else _EMPTY_PROPERTIES
        )
        header = ContentHeader(0, len(body), properties).marshal()
        tag = channel.next_delivery_tag
        channel.next_delivery_tag = tag + 1
        subscriber.unacked[tag] = (last, end, time.monotonic(), len(body))
        self.sent_lsn = max(self.sent_lsn, last)
        connection.send(
            wire.deliver_frames(
                channel.number,
                subscriber.tag_wire,
                tag,
                False,
                wire.address_of(FEED_QUEUE, ""),
                header,
                body,
                connection.frame_max,
            )
        )
        connection.flush()  # now: the PASSIVE's store is on the confirm's critical path

    def acked(self, channel: Channel, tag: int, multiple: bool) -> None:
        """The subscriber's Basic.Ack: it holds what those deliveries carried."""
        subscriber = self.subscriber
        if subscriber is None or subscriber.channel is not channel:
            return
        unacked = subscriber.unacked
        done = []
        if multiple:
            for each in unacked:
                if each > tag:
                    break
                done.append(each)
        elif tag in unacked:
            done.append(tag)
        moved = False
        for each in done:
            last, end, _, _ = unacked.pop(each)
            if last > self.replicated_lsn:
                self.replicated_lsn = last
                moved = True
            if end and not self.in_sync:
                self.in_sync = True
                self.on_sync(True, f"snapshot of {self.snapshot_changes} changes applied")
                moved = False  # on_sync re-checked the confirms
        if moved and self.in_sync:
            self.on_sync(True, "")
        self.push()

    def status(self) -> dict[str, Any]:
        subscriber = self.subscriber
        log_ = self.broker.log
        lsn = log_.lsn if log_ is not None else 0
        oldest = next(iter(subscriber.unacked.values()), None) if subscriber else None
        return {
            "subscriber": None if subscriber is None else subscriber.channel.connection.peer,
            "state": "in_sync"
            if self.in_sync
            else ("catching_up" if subscriber is not None else "none"),
            "lag_changes": max(0, lsn - self.replicated_lsn) if subscriber else None,
            "lag_bytes": (
                self.backlog_bytes + sum(entry[3] for entry in subscriber.unacked.values())
                if subscriber
                else None
            ),
            "lag_seconds": round(time.monotonic() - oldest[2], 3) if oldest else 0.0,
            "replicated_lsn": self.replicated_lsn,
            "snapshots": self.snapshots,
        }


def _leaves_out(change: Change, unreplicated: set[tuple[str, str]]) -> bool:
    """Whether a change concerns only a queue that is not replicated."""
    kind = type(change)
    if kind is Enqueued or kind is Settled:
        return (change.vhost, change.queue) in unreplicated  # type: ignore[union-attr]
    if kind is QueueDeclared:
        return (change.vhost, change.name) in unreplicated  # type: ignore[union-attr]
    if kind is Bound or kind is Unbound:
        return (not change.to_exchange) and (  # type: ignore[union-attr]
            change.vhost,  # type: ignore[union-attr]
            change.destination,  # type: ignore[union-attr]
        ) in unreplicated
    return False


class Follower:
    """The PASSIVE's side: subscribe to the ACTIVE's feed, apply, store, ack."""

    def __init__(
        self,
        broker: Broker,
        url: str,
        on_sync: Callable[[bool, str], None],
        connect_options: dict[str, Any],
        name: str,
    ) -> None:
        self.broker = broker
        self.on_sync = on_sync
        self.in_sync = False
        self.state = "connecting"
        self.applied = 0
        self.runs = 0
        self.snapshot_started = 0.0
        self.last_snapshot_seconds: float | None = None
        # Runs received and not applied yet, in order: (None, changes, now, link) for a
        # run handed to the store decoded, (seq, bytes, now, link) for one kept pending.
        self._unapplied: collections.deque[tuple[int | None, Any, float, Link]] = (
            collections.deque()
        )
        self._next_seq = 1
        self.pending_runs = 0  # runs kept as received, their changes not written yet
        self.link = ConsumerLink(
            url,
            FEED_QUEUE,
            self._on_run,
            name=f"{name}->replication",
            prefetch=FOLLOWER_PREFETCH,
            on_up=self._subscribed,
            client_properties={"product": "amqha replication", "amqha_node": name},
            **connect_options,
        )

    async def start(self) -> None:
        await self.link.start()

    async def stop(self) -> None:
        await self.link.stop()

    @property
    def unsettled(self) -> bool:
        """Whether a decoded run waits to be applied (read from the store's writer thread,
        while the loop may empty the deque: hence the IndexError)."""
        try:
            return self._unapplied[0][0] is None
        except IndexError:
            return False

    def settle(self, decoded_only: bool = False) -> None:
        """Apply, in order, the runs received and not applied yet; a pending run's
        changes go to the store too. ``decoded_only`` (the store's commit hook): stop at
        the first pending run, which is applied once its ack is written."""
        unapplied = self._unapplied
        broker = self.broker
        while unapplied:
            seq, run, now, link = unapplied[0]
            if seq is not None and decoded_only:
                return
            unapplied.popleft()
            if seq is None:
                apply_run(broker, run, now)
            else:
                self._write_pending(seq, run, now, link)

    def _write_pending(self, seq: int, data: bytes, now: float, link: Link) -> None:
        self.pending_runs -= 1
        broker = self.broker
        try:
            _, changes = codec.decode(data)
        except ValueError as error:
            # Its head was read on arrival: only a corrupt run gets here. The ACTIVE
            # counts it held, so this server stops counting as in sync.
            log.error("replication: pending run %d does not decode (%s): resubscribing", seq, error)
            broker.replicated([RunWritten(seq)])
            self._out_of_sync("a run from the ACTIVE that does not decode")
            link.close("a run that does not decode")
            return
        self.applied += len(changes)
        broker.replicated([*changes, RunWritten(seq)])
        apply_run(broker, changes, now)

    def _out_of_sync(self, reason: str) -> None:
        if self.in_sync:
            self.in_sync = False
            self.on_sync(False, reason)

    def _subscribed(self) -> None:
        self.state = "catching_up" if not self.in_sync else "subscribed"

    def _on_run(
        self, link: Link, tag: int, properties: commands.Basic.Properties, body: bytes
    ) -> None:
        """One run from the feed, in the socket's read (see the module docstring)."""
        broker = self.broker
        try:
            live = codec.first_lsn(body) > 0
            if self.in_sync and live:
                self._keep(link, tag, body)
                return
            _, changes = codec.decode(body)
        except ValueError as error:
            log.error("replication: a run that does not decode (%s): resubscribing", error)
            link.close("a run that does not decode")
            return
        self.settle()  # the runs before this one are applied first
        if changes and type(changes[0]) is Reset:  # a snapshot starts
            self._reset()
        # To the store first, applied once the store's writer has written the rows and
        # waits for the disk: the two share one interpreter lock, and the writer's part is
        # the one the ack waits for. Applied in any case before the ack, before the next
        # run, and before this server leads (``settle``).
        lsn = broker.replicated(changes)
        self._unapplied.append((None, changes, broker.now(), link))
        self.applied += len(changes)
        self.runs += 1
        end = bool((properties.headers or {}).get(SNAPSHOT_END))

        def stored(ok: bool) -> None:
            self.settle()
            if not ok:
                self._store_failed(link)
                return
            if end and not self.in_sync:
                self.in_sync = True
                self.state = "in_sync"
                self.last_snapshot_seconds = round(time.monotonic() - self.snapshot_started, 3)
                self.on_sync(True, f"snapshot applied in {self.last_snapshot_seconds} s")
            link.ack(tag)

        broker.when_safe(lsn, stored)

    def _keep(self, link: Link, tag: int, body: bytes) -> None:
        """A live run while in sync: kept as received, acked once on disk, then decoded."""
        broker = self.broker
        seq = self._next_seq
        self._next_seq = seq + 1
        lsn = broker.replicated([PendingRun(seq, body)])
        self._unapplied.append((seq, body, broker.now(), link))
        self.pending_runs += 1
        self.runs += 1

        def kept(ok: bool) -> None:
            if not ok:
                self._store_failed(link)
                return
            link.ack(tag)
            self.settle()  # this run's changes, and those before it, now

        broker.when_safe(lsn, kept)

    def _store_failed(self, link: Link) -> None:
        # Not on this disk: never acked. The link is dropped so the ACTIVE stops waiting
        # for us (it confirms on its own store, and says so); we subscribe again, from a
        # new snapshot, once writes work.
        self.state = "store_failing"
        self._out_of_sync("this server's store could not write the changes")
        link.close("this server's store could not write the changes")

    def _reset(self) -> None:
        self.snapshot_started = time.monotonic()
        self.state = "catching_up"
        if self.in_sync:
            self.in_sync = False
            self.on_sync(False, "a new snapshot from the ACTIVE")
        self.broker.before_reset()

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state if self.link.connected else "disconnected",
            "in_sync": self.in_sync,
            "applied_changes": self.applied,
            "runs": self.runs,
            "pending_runs": self.pending_runs,
            "last_snapshot_seconds": self.last_snapshot_seconds,
        }
